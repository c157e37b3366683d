//! The engine: the sequencer (the journal's decide step, which asks
//! `spark_core::rules`), the journal and the published mirror.
//!
//! ```text
//!  handlers --Command--> [queue] --> writer thread: sequencer decides ops,
//!                                      journal appends a batch (one write,
//!                                      one fdatasync), fold applies it to
//!                                      the published mirror, replies go out
//!  readers <------------ published mirror (RwLock): durable state only
//! ```
//!
//! One writer thread owns every decision (DESIGN.md, "The write path"). It
//! takes whatever commands are queued as one batch (a lone command is not
//! held back), decides each against the committed mirror, writes the
//! resulting ops with one write call and one fdatasync, applies them with the
//! one fold, and only then answers. A command that touches a key (request id
//! or entity id) already touched by an op of the batch in progress is
//! deferred to the next batch: a duplicate of an in-flight op waits for that
//! op's commit and then gets the same answer as any later retry.

mod checkpoint;
mod journal;
mod scrub;

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Mutex, RwLock};
use spark_log_format::{Fs, Head, Log, LogError, LogPoint, OpenError, RecoveryReport};
use tokio::sync::{mpsc, oneshot};

use crate::archive::gate::ArchiveGate;
use crate::clock::Clock;
use crate::config::{ArchiveMode, Settings};
use spark_core::ids::Id;
use spark_core::mirror::{Mirror, PreparedOp};
use spark_core::op::Op;
pub use spark_core::replay::{replay_record, ReplayError};

pub use scrub::ScrubStatus;
pub use spark_core::command::{
    Command, CreateMoment, DeleteMoment, DropPhrase, EditMoment, EndTurn, FieldChange, KeepPhrase,
    PostMessage, PutMedia, StartJob, StartRecall, StartTurn,
};
pub use spark_core::error::{Conflict, EngineError};
pub use spark_core::ids::{job_turn_request_id, mark_id, recall_turn_request_id};
pub use spark_core::outcome::Outcome;

/// Why the engine could not open its data directory.
#[derive(Debug, thiserror::Error)]
pub enum EngineOpenError {
    /// Another process holds the data directory.
    #[error("data directory {0} is in use by another spark-engine process")]
    Locked(String),
    /// The data directory or its lock file could not be used.
    #[error("cannot use data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The log is damaged or unreadable (names segment, offset and seq).
    #[error(transparent)]
    Log(#[from] LogError),
    /// The log is corrupt: the damaged seq range and what the damaged
    /// records were about, where they still decode (see [`spark_core::damage`]).
    #[error("refusing to start on a damaged log: {0}")]
    Damaged(String),
    /// A checkpoint shows that ops past the end of the log were committed:
    /// the log lost acknowledged records (a truncated or deleted segment).
    /// Refused before recovery changes anything ("never silently
    /// drop valid data"); [`spark_core::checkpoint::PastTheLog`] says
    /// which file, seq and segment.
    #[error("refusing to start on a log that lost acknowledged records: {0}")]
    LostCommitted(String),
    /// A record did not replay into the mirror.
    #[error("replay stopped at segment {segment} offset {offset}: {source}")]
    Replay {
        /// The segment file holding the record.
        segment: String,
        /// The record's byte offset in it.
        offset: u64,
        /// What the decoder or the fold said (it names the seq).
        #[source]
        source: ReplayError,
    },
}

/// State shared between the writer thread and the readers.
struct Shared {
    /// Held while the checkpoint worker builds a checkpoint, and while a
    /// compactor removes the checkpoints its compaction makes stale and
    /// commits it ([`Engine::hold_checkpoints`]): a checkpoint built from
    /// the segments before a compaction never lands after that removal (it
    /// would keep erased content, SPEC section 13).
    checkpoints_held: tokio::sync::Mutex<()>,
    /// The published mirror: only durable ops are ever applied to it.
    mirror: RwLock<Mirror>,
    /// The log's head after the last committed batch.
    head: Mutex<Head>,
    /// Set once the write path is stopped by an I/O error; the reason.
    poison: Mutex<Option<String>>,
    /// Set while the log waits for disk space to recover its tail after a
    /// write failed for want of space (writes answer `507` meanwhile); the
    /// reason. Cleared by the in-process recovery.
    heal_pending: Mutex<Option<String>>,
    /// The disk reserve check (`log.disk_reserve_bytes`).
    disk: Arc<crate::disk::DiskSpace>,
    /// With `[archive]`: set once another engine took the prefix over and
    /// the shipper found out; the reason. Never cleared (SPEC section 11).
    fenced: Mutex<Option<String>>,
    /// The last committed seq, for long polls that wait for a change.
    committed: tokio::sync::watch::Sender<u64>,
    /// Where the ids of committed `turn.start` ops go (the brain runner),
    /// once one is attached.
    turn_sink: Mutex<Option<mpsc::UnboundedSender<Id>>>,
    /// Change notices of every committed batch, for `/api/events`. A
    /// subscriber that falls behind the buffer loses notices (it is told
    /// where to resume); the writer never waits for one.
    changes: tokio::sync::broadcast::Sender<Arc<Vec<Change>>>,
    /// `[archive] mode = "sync"`: where acknowledgments wait for the
    /// archive ([`crate::archive::gate`]). `None`: answered at the local
    /// fdatasync.
    gate: Option<Arc<ArchiveGate>>,
}

/// What one committed op changed, as `/api/events` tells it (SPEC section
/// 4); the shape lives with the other wire shapes.
pub use spark_core::wire::events::ChangeNotice;
use spark_core::wire::events::EventCursor;

/// A committed op's change notice and its event cursor (the `id:` of its
/// event, [`crate::history`]), as the engine publishes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// What the op changed.
    pub notice: ChangeNotice,
    /// Its seq and the chain value at the end of its batch.
    pub cursor: EventCursor,
}

/// A command on its way to the writer thread, with where to answer.
enum WriterRequest {
    /// Decide, write and answer this command.
    Command {
        command: Command,
        reply: oneshot::Sender<Result<Outcome, EngineError>>,
    },
    /// Seal the active segment now, so that a compaction can rewrite its
    /// records (SPEC section 13: an erasure never waits for a segment to
    /// fill). Answers the head after the roll.
    SealActive {
        reply: oneshot::Sender<Result<Head, EngineError>>,
    },
    /// Put a staged compaction into effect and fold its record (which
    /// erases `subjects` from the mirror) and publish it: the writer begins
    /// it ([`Log::begin_compaction`]), a thread of its own applies it
    /// (the journal and the segment copies) while the writer goes on with
    /// batches, and the writer finishes it ([`Log::finish_compaction`]) on
    /// [`WriterRequest::CompactionApplied`]. Answers the commit, or `None`
    /// when the log rolled since staging (stale: nothing changed, stage
    /// again).
    CommitCompaction {
        staged: spark_log_format::StagedCompaction,
        subjects: Vec<Id>,
        reply: oneshot::Sender<Result<Option<spark_log_format::CompactionCommit>, EngineError>>,
    },
    /// Sent by the thread that applies a begun compaction when it is done:
    /// the writer finishes that compaction and answers its
    /// [`WriterRequest::CommitCompaction`].
    CompactionApplied,
    /// Finish what came before, then stop the writer thread.
    Stop,
}

/// The running engine: a handle to the writer thread and the published
/// mirror. Cheap to share behind an `Arc`.
pub struct Engine {
    queue: mpsc::Sender<WriterRequest>,
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// The checkpoint worker, when `log.checkpoint_interval_ops` is above 0:
    /// stopped before the lock is released.
    checkpoints: Mutex<Option<checkpoint::CheckpointWorker>>,
    /// The exclusive lock on `<data>/LOCK`: held until shutdown (or drop).
    lock: Mutex<Option<File>>,
    recovery: RecoveryReport,
    /// The background check of the segments recovery deferred.
    scrub: scrub::Scrub,
}

impl Engine {
    /// Opens the data directory: takes its lock, replays the log into the
    /// mirror (recovery truncates a torn tail and refuses corruption, naming
    /// segment, offset and seq), and starts the writer thread. From a valid
    /// checkpoint, the sealed segments before the one holding its point are
    /// checked by their links only ([`RecoveryReport::deferred`]) until
    /// [`Engine::start_scrub`] reads them.
    pub fn open(
        settings: &Settings,
        fs: Arc<dyn Fs>,
        clock: Arc<dyn Clock>,
    ) -> Result<Engine, EngineOpenError> {
        let lock = lock_data_dir(&settings.data_dir)?;
        let replay_started = std::time::Instant::now();
        let (log, recovery, mirror, checkpoint_seq) = replay_log(settings, Arc::clone(&fs))?;
        let scrub = scrub::Scrub::new(
            settings.log_dir(),
            Arc::clone(&fs),
            recovery.deferred.clone(),
            settings.log.max_record_bytes,
        );
        crate::metrics::get()
            .replay_seconds
            .set(replay_started.elapsed().as_secs_f64());
        let (committed, _) = tokio::sync::watch::channel(mirror.seq);
        let (changes, _) = tokio::sync::broadcast::channel(settings.log.change_buffer_batches);
        let shared = Arc::new(Shared {
            checkpoints_held: tokio::sync::Mutex::new(()),
            mirror: RwLock::new(mirror),
            head: Mutex::new(log.head()),
            poison: Mutex::new(None),
            heal_pending: Mutex::new(None),
            fenced: Mutex::new(None),
            disk: Arc::new(crate::disk::DiskSpace::new(
                &settings.data_dir,
                settings.log.disk_reserve_bytes,
                settings.log.disk_check_interval_ms,
            )),
            committed,
            turn_sink: Mutex::new(None),
            changes,
            gate: settings
                .archive
                .as_ref()
                .filter(|archive| archive.mode == ArchiveMode::Sync)
                .map(|_| Arc::new(ArchiveGate::new())),
        });
        let (queue, receiver) = mpsc::channel(settings.log.queue_depth_commands);
        let writer = journal::spawn(
            log,
            Arc::clone(&shared),
            receiver,
            queue.downgrade(),
            clock,
            settings.log.group_commit_max_ops,
        )
        .map_err(|source| EngineOpenError::DataDir {
            path: settings.data_dir.display().to_string(),
            source,
        })?;
        let checkpoints = (settings.log.checkpoint_interval_ops > 0)
            .then(|| {
                checkpoint::CheckpointWorker::spawn(
                    checkpoint::WorkerConfig {
                        fs,
                        data_dir: settings.data_dir.clone(),
                        log_dir: settings.log_dir(),
                        max_record_bytes: settings.log.max_record_bytes,
                        interval_ops: settings.log.checkpoint_interval_ops,
                        kept: settings.log.checkpoints_kept,
                        last_seq: checkpoint_seq,
                    },
                    Arc::clone(&shared),
                )
            })
            .transpose()
            .map_err(|source| EngineOpenError::DataDir {
                path: settings.data_dir.display().to_string(),
                source,
            })?;
        Ok(Engine {
            queue,
            shared,
            checkpoints: Mutex::new(checkpoints),
            writer: Mutex::new(Some(writer)),
            lock: Mutex::new(Some(lock)),
            recovery,
            scrub,
        })
    }

    /// Starts the scrub (once): a thread at the lowest CPU priority that
    /// reads the sealed segments recovery checked by their links only
    /// ([`RecoveryReport::deferred`]) with the full decoder, and reports
    /// damage (an ERROR line, `spark_log_scrub_damaged_segments`,
    /// [`Engine::scrub_status`]). The server calls it once it listens.
    /// Errors: the thread could not be spawned.
    pub fn start_scrub(&self) -> std::io::Result<()> {
        self.scrub.start()
    }

    /// What the scrub found so far (for `/readyz`).
    pub fn scrub_status(&self) -> &Arc<ScrubStatus> {
        self.scrub.status()
    }

    /// Sends a command to the sequencer and waits until its op is durable
    /// (or until it is answered from what is already known). In `sync`
    /// mode durable means stored in the archive: a success waits until a
    /// manifest naming its op (for a known answer: the committed seq it
    /// was read at) is stored ([`crate::archive::gate`]).
    ///
    ///
    /// Once the engine is fenced ([`Engine::fence`]) every answer is
    /// `Fenced`: a command is refused before it is queued, and one whose
    /// batch was already queued or written is not acknowledged if the fence
    /// is known when its answer comes back (ARCHIVE.md "Epoch": no
    /// acknowledgment after the fence).
    pub async fn submit(&self, command: Command) -> Result<Outcome, EngineError> {
        self.refuse_if_fenced()?;
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(WriterRequest::Command { command, reply })
            .await
            .map_err(|_| EngineError::Unavailable("the engine is shutting down".into()))?;
        let answer = answer.await.unwrap_or_else(|_| {
            Err(EngineError::Unavailable(
                "the writer stopped before answering".into(),
            ))
        });
        self.refuse_if_fenced()?;
        answer
    }

    /// Seals the active segment now (the compactor's first step when it
    /// holds content due for erasure, SPEC section 13) and returns the head
    /// after the roll. Errors: `Unavailable` when the write path is stopped
    /// or the roll failed (which stops it).
    pub async fn seal_active(&self) -> Result<Head, EngineError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(WriterRequest::SealActive { reply })
            .await
            .map_err(|_| EngineError::Unavailable("the engine is shutting down".into()))?;
        answer.await.unwrap_or_else(|_| {
            Err(EngineError::Unavailable(
                "the writer stopped before answering".into(),
            ))
        })
    }

    /// Puts a staged compaction into effect and folds its record, which
    /// erases `subjects` (deleted moments) from the mirror. The writer
    /// thread only begins and finishes it (both brief); the slow part (the
    /// redo journal, copying the staged segments over the old ones) runs on
    /// a thread of its own while the writer goes on with batches, which
    /// meanwhile never roll the active segment. `Ok(None)` when the log rolled since staging: nothing
    /// changed, the staged files are gone, stage again. Errors:
    /// `Unavailable` when the write path is stopped or a step failed
    /// (which stops it; recovery at the next start finishes the commit or
    /// leaves the old segments).
    pub async fn commit_compaction(
        &self,
        staged: spark_log_format::StagedCompaction,
        subjects: Vec<Id>,
    ) -> Result<Option<spark_log_format::CompactionCommit>, EngineError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(WriterRequest::CommitCompaction {
                staged,
                subjects,
                reply,
            })
            .await
            .map_err(|_| EngineError::Unavailable("the engine is shutting down".into()))?;
        answer.await.unwrap_or_else(|_| {
            Err(EngineError::Unavailable(
                "the writer stopped before answering".into(),
            ))
        })
    }

    /// Keeps the checkpoint worker from building a checkpoint while the
    /// guard lives (it waits, then builds from what is on disk after). The
    /// compactor holds it from before it removes the checkpoints that hold
    /// the content to erase until its commit is done.
    pub async fn hold_checkpoints(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.shared.checkpoints_held.lock().await
    }

    fn refuse_if_fenced(&self) -> Result<(), EngineError> {
        match self.fenced() {
            Some(reason) => Err(EngineError::Fenced(reason)),
            None => Ok(()),
        }
    }

    /// Fences the write path (SPEC section 11): another engine took the
    /// archive's prefix over. From the return of this call on, no
    /// [`Engine::submit`] answers with success. Called by the archive
    /// shipper; the first reason is kept.
    pub fn fence(&self, reason: String) {
        self.shared.fenced.lock().get_or_insert(reason);
    }

    /// Why the engine is fenced, if it is (`503 fenced`).
    pub fn fenced(&self) -> Option<String> {
        self.shared.fenced.lock().clone()
    }

    /// Acknowledges `outcome`, an answer a handler read from the mirror
    /// without a command (a replayed upload): at once without `sync` mode;
    /// in `sync` mode once everything committed when it was read is in the
    /// archive, so a retry is never acknowledged before its original. The
    /// error is the archive gate's when it closes first (`503`).
    pub async fn acknowledge(&self, outcome: Outcome) -> Result<Outcome, EngineError> {
        let Some(gate) = &self.shared.gate else {
            return Ok(outcome);
        };
        let (reply, answer) = oneshot::channel();
        let seq = self.shared.mirror.read().seq;
        gate.hold(seq, vec![(Ok(outcome), reply)]);
        answer.await.unwrap_or_else(|_| {
            Err(EngineError::Unavailable(
                "the archive gate dropped an answer".into(),
            ))
        })
    }

    /// The archive gate, when the engine was opened with `[archive] mode =
    /// "sync"` (the shipper answers through it; fencing closes it).
    pub fn archive_gate(&self) -> Option<&Arc<ArchiveGate>> {
        self.shared.gate.as_ref()
    }

    /// Stops using the request index rows of the checkpoint the engine
    /// started from in place (`log-format/CHECKPOINT.md`, "Request
    /// index"): copies them into memory, without holding the mirror's lock
    /// meanwhile, then swaps the copy in under a brief write lock. Answers
    /// do not change. Until then the file's blocks stay allocated even once
    /// it is removed, so the compactor (and a replica following a
    /// compaction) calls this after removing checkpoints that hold content
    /// it erases (SPEC section 13). True if the index was detached.
    pub fn detach_request_index(&self) -> bool {
        let Some(rows) = self.shared.mirror.read().requests.mapped_rows() else {
            return false;
        };
        let copy = rows.copy();
        self.shared.mirror.write().requests.detach(copy)
    }

    /// Runs `f` over the published mirror (durable state only), under a
    /// read lock: keep `f` short.
    pub fn read<R>(&self, f: impl FnOnce(&Mirror) -> R) -> R {
        f(&self.shared.mirror.read())
    }

    /// A receiver that changes whenever a batch commits (its value is the
    /// last committed seq): what long polls wait on.
    pub fn watch_commits(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.committed.subscribe()
    }

    /// Attaches the brain runner: the id of every `turn.start` committed from
    /// now on is sent to `sink`. Returns the ids of the turns that are
    /// running now (left running by a crash or a stop, or started before the
    /// sink was attached), so the runner can ask them again.
    pub fn attach_turn_sink(&self, sink: mpsc::UnboundedSender<Id>) -> Vec<Id> {
        // Hold the mirror lock so that no batch commits between the scan and
        // the attach: every running turn is in exactly one of the two.
        let mirror = self.shared.mirror.read();
        *self.shared.turn_sink.lock() = Some(sink);
        let mut running: Vec<(u64, Id)> = mirror
            .turns
            .values()
            .filter(|t| t.status == spark_core::mirror::TurnStatus::Running)
            .map(|t| (t.seq, t.id))
            .collect();
        running.sort_unstable();
        running.into_iter().map(|(_, id)| id).collect()
    }

    /// A read replica's commit (SPEC section 11, [`crate::replica`]): folds
    /// `ops`, which the replica has verified and written to its local log
    /// (ending at `head`), each with its cursor ([`crate::history`]), into
    /// the published mirror with the one fold,
    /// then publishes exactly what the journal publishes after a batch:
    /// the head, the committed seq (long polls, `min_seq` waits) and one
    /// change notice per op (`/api/events`). The journal of a replica
    /// takes no command (every write answers `421 read_only`), so this is
    /// the only code that changes its mirror.
    ///
    /// Errors (nothing is published then): the first op does not follow
    /// the mirror's seq, the ops do not end at `head.seq`, or the fold
    /// refuses an op (the message names its seq); the mirror may then hold
    /// the ops before the refused one, and the replica stops following.
    pub fn apply_replicated(&self, ops: Vec<(Op, EventCursor)>, head: Head) -> Result<(), String> {
        let mut notices = Vec::with_capacity(ops.len());
        {
            let mut mirror = self.shared.mirror.write();
            if let Some((first, _)) = ops.first() {
                if first.seq != mirror.seq + 1 {
                    return Err(format!(
                        "replicated ops start at seq {}, the mirror is at seq {}",
                        first.seq, mirror.seq
                    ));
                }
            }
            for (op, cursor) in ops {
                notices.push(Change {
                    notice: ChangeNotice::of(&op),
                    cursor,
                });
                let seq = op.seq;
                mirror
                    .apply(op)
                    .map_err(|e| format!("the fold refused replicated op seq {seq}: {e}"))?;
            }
            if mirror.seq != head.seq {
                return Err(format!(
                    "replicated ops end at seq {}, the log's head is seq {}",
                    mirror.seq, head.seq
                ));
            }
            *self.shared.head.lock() = head;
        }
        let seq = self.shared.mirror.read().seq;
        self.shared.committed.send_replace(seq);
        if !notices.is_empty() {
            let _ = self.shared.changes.send(Arc::new(notices));
        }
        Ok(())
    }

    /// Change notices from now on, one message per committed batch.
    pub fn subscribe_changes(&self) -> tokio::sync::broadcast::Receiver<Arc<Vec<Change>>> {
        self.shared.changes.subscribe()
    }

    /// The log's head as of the last committed batch.
    pub fn head(&self) -> Head {
        self.shared.head.lock().clone()
    }

    /// Why the write path is stopped (until a restart), if it is: an I/O
    /// error stopped it, or the checkpoint file whose request index the
    /// engine reads in place was written to since the start
    /// ([`spark_core::request_index::RequestIndex::mapped_file_changed`]; the next batch
    /// is refused and stops it), so `/readyz` says `503` before the next
    /// write finds out.
    pub fn poisoned(&self) -> Option<String> {
        if let Some(reason) = self.shared.poison.lock().clone() {
            return Some(reason);
        }
        self.read(|mirror| mirror.requests.mapped_file_changed())
    }

    /// Why writes are refused for want of disk space right now, if they are
    /// (`507 insufficient_storage`): free space below the reserve, or the
    /// log waiting for space to recover its tail after a full disk. Measures
    /// free space now ([`crate::disk::DiskSpace::check_now`]).
    pub fn short_of_space(&self) -> Option<EngineError> {
        if let Some(reason) = self.shared.heal_pending.lock().clone() {
            return Some(EngineError::InsufficientStorage(format!(
                "the log waits for disk space to recover its tail: {reason}"
            )));
        }
        self.shared.disk.check_now().err()
    }

    /// The disk reserve check, for writes outside the journal (uploads).
    pub fn disk(&self) -> &crate::disk::DiskSpace {
        &self.shared.disk
    }

    /// What recovery found when the engine opened.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Stops the writer thread after every command queued before this call
    /// is answered, then releases the data directory's lock; later commands
    /// get `Unavailable`. Idempotent.
    pub async fn shutdown(&self) {
        let _ = self.queue.send(WriterRequest::Stop).await;
        let handle = self.writer.lock().take();
        if let Some(handle) = handle {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
        let worker = self.checkpoints.lock().take();
        if let Some(mut worker) = worker {
            let _ = tokio::task::spawn_blocking(move || worker.stop()).await;
        }
        if let Some(scrub) = self.scrub.halt() {
            let _ = tokio::task::spawn_blocking(move || scrub.join()).await;
        }
        self.lock.lock().take();
    }
}

/// Ops handed from the recovery thread to the fold thread at a time.
const REPLAY_BATCH_OPS: usize = 4096;

/// How many ops ahead of the one being folded the replay's fold thread
/// asks for the request index slot (a cache miss takes about as long as
/// folding a dozen ops).
const REPLAY_PREFETCH_AHEAD: usize = 16;

/// Batches in flight between the two threads (bounds the memory of ops
/// decoded but not yet folded).
const REPLAY_BATCHES_IN_FLIGHT: usize = 8;

/// The first batch of records, measured to size the request index ahead of
/// the fold: growing a 10-million-entry table rehashes every request id
/// (reading each key) about twice, and first-touches twice the memory
///.
#[derive(Default)]
struct RequestIdSample {
    frame_bytes: u64,
    request_ids: u64,
    /// Set once the estimate was handed out.
    done: bool,
}

impl RequestIdSample {
    fn count(&mut self, record: &spark_log_format::RecordRef<'_>, op: &PreparedOp) {
        self.frame_bytes += (spark_log_format::RECORD_HEADER_LEN + record.payload.len()) as u64;
        self.request_ids += u64::from(op.carries_request_id());
    }

    /// Request ids expected in `log_bytes` of segments, at the sample's
    /// rate; 0 after the first call.
    fn take_estimate(&mut self, log_bytes: u64) -> usize {
        if std::mem::replace(&mut self.done, true) || self.frame_bytes == 0 {
            return 0;
        }
        let expected =
            u128::from(log_bytes) * u128::from(self.request_ids) / u128::from(self.frame_bytes);
        usize::try_from(expected).unwrap_or(usize::MAX)
    }
}

/// Bytes in the segment files of `log_dir` (0 if it cannot be read).
fn segment_bytes(log_dir: &Path) -> u64 {
    std::fs::read_dir(log_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .ends_with(spark_log_format::SEGMENT_SUFFIX)
        })
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// Why the recovery thread stopped visiting records.
enum ReplayStop {
    /// A record did not decode (at the visitor's position).
    Decode(ReplayError),
    /// The fold thread stopped (its error says where).
    FoldStopped,
}

/// Startup replay on two threads: this thread runs recovery
/// (read, CRC, chain) and decodes each record into an op; a second thread
/// applies the ops with the one fold, in seq order, batch by batch. The
/// result is the same as folding inline: the first error in seq order wins
/// (a fold error is always at a seq before anything recovery found later).
/// One difference: recovery may finish its repairs of the last segment (cut
/// a torn tail, keeping a copy) before a fold refusal earlier in the log is
/// seen; those repairs are what any later start would do first.
/// A batch of prepared ops with their offsets, and how many more request
/// ids the fold should make room for (set on the first batch only).
type ReplayBatch = (Vec<(PreparedOp, u64)>, usize);

/// What the replay's fold thread ends with: the mirror, or the seq, offset
/// and error of the first op it refused.
type FoldResult = Result<Mirror, FoldStop>;

/// Why the replay's fold thread stopped early.
enum FoldStop {
    /// It refused the op at this seq and offset.
    Op(u64, u64, ReplayError),
    /// The checkpoint it started from did not load (its file and why):
    /// the log is replayed again without it.
    Checkpoint(std::path::PathBuf, String),
}

/// Where the replay starts: the checkpoint file to load (checked by
/// [`spark_core::checkpoint::peek`]; loading checks its checksum and body),
/// its point in the log and its request index's seed, or nothing (an empty
/// mirror, the whole log).
type ReplayStart = Option<(std::path::PathBuf, LogPoint, u64)>;

/// Starts the replay's fold thread: it folds the batches it receives, in
/// order, and sends each emptied buffer back to be filled again.
/// With a checkpoint to start from, the thread first loads it into the
/// (empty) `mirror`, while recovery reads the log up to it on the other
/// thread.
fn spawn_replay_fold(
    settings: &Settings,
    mut mirror: Mirror,
    start: ReplayStart,
    received: std::sync::mpsc::Receiver<ReplayBatch>,
    recycle: std::sync::mpsc::Sender<Vec<(PreparedOp, u64)>>,
) -> Result<JoinHandle<FoldResult>, EngineOpenError> {
    let log_dir = settings.log_dir();
    std::thread::Builder::new()
        .name("spark-replay-fold".into())
        .spawn(move || {
            if let Some((file, point, _)) = start {
                match spark_core::checkpoint::load(&file, &log_dir, mirror) {
                    Ok((_, loaded)) if loaded.seq == point.seq => mirror = loaded,
                    Ok(_) => {
                        return Err(FoldStop::Checkpoint(file, "changed while loading".into()))
                    }
                    Err(why) => return Err(FoldStop::Checkpoint(file, why.to_string())),
                }
            }
            for (mut batch, reserve_request_ids) in received {
                mirror.requests.reserve(reserve_request_ids);
                let mut ops = batch.drain(..);
                loop {
                    // The request index slot of an op a few ahead, asked
                    // for now, is in cache when that op is folded.
                    if let Some((ahead, _)) = ops.as_slice().get(REPLAY_PREFETCH_AHEAD) {
                        mirror.prefetch_prepared(ahead);
                    }
                    let Some((op, offset)) = ops.next() else {
                        break;
                    };
                    let seq = op.seq();
                    if let Err(e) = mirror.apply_prepared(op) {
                        return Err(FoldStop::Op(seq, offset, ReplayError::Fold(e)));
                    }
                }
                drop(ops);
                // The recovery thread may have finished: nothing to refill.
                let _ = recycle.send(batch);
            }
            Ok(mirror)
        })
        .map_err(|source| EngineOpenError::DataDir {
            path: settings.data_dir.display().to_string(),
            source,
        })
}

/// Why opening the log failed: a corrupt log names its damage (see
/// [`spark_core::damage`]); a record that does not decode names its segment and
/// offset (`at`: the seq and offset of the last record visited).
fn open_error(settings: &Settings, e: OpenError<ReplayStop>, at: (u64, u64)) -> EngineOpenError {
    match e {
        OpenError::Log(e @ LogError::Corrupt { .. }) => {
            match spark_log_format::damage_report(
                &settings.log_dir(),
                settings.log.max_record_bytes,
            ) {
                Ok(Some(report)) => EngineOpenError::Damaged(format!(
                    "{}\nrun `spark-replay audit damage` for the full report",
                    spark_core::damage::summary(&report)
                )),
                _ => EngineOpenError::Log(e),
            }
        }
        OpenError::Log(e) => EngineOpenError::Log(e),
        OpenError::Visit(ReplayStop::Decode(source)) => EngineOpenError::Replay {
            segment: segment_of(&settings.log_dir(), at.0),
            offset: at.1,
            source,
        },
        // The fold thread stopped without an error: cannot happen (it
        // stops only on an error or when the sender is dropped).
        OpenError::Visit(ReplayStop::FoldStopped) => EngineOpenError::DataDir {
            path: settings.data_dir.display().to_string(),
            source: std::io::Error::other("the replay fold thread stopped early"),
        },
    }
}

/// Startup replay: the newest valid checkpoint (when checkpoints are on),
/// then the log's ops after it; a checkpoint that is not valid is ignored
/// with a warning naming the file. Returns the log, what recovery did, the
/// mirror and the seq of the checkpoint used (0 for none). A checkpoint
/// that fails to load once picked (its checksum or body), or that lies past
/// the end of the recovered log (which only a log that lost acknowledged
/// records could give), is dropped with a warning and the whole log
/// replayed.
fn replay_log(
    settings: &Settings,
    fs: Arc<dyn Fs>,
) -> Result<(Log, RecoveryReport, Mirror, u64), EngineOpenError> {
    // A checkpoint write a crash cut short leaves `*.ckpt.tmp`: never read,
    // and it may hold content a later delete erases (SPEC section 13), so
    // it goes now, whether or not checkpoints are on.
    spark_core::checkpoint::remove_temp_files(&*fs, &settings.data_dir);
    // Something else in the checkpoints' place: said now, not only at each
    // checkpoint the worker fails to write (startups replay the whole log
    // until it is moved away).
    let checkpoints = spark_core::checkpoint::checkpoint_dir(&settings.data_dir);
    if std::fs::metadata(&checkpoints).is_ok_and(|meta| !meta.is_dir()) {
        tracing::warn!(
            path = %checkpoints.display(),
            "the checkpoint directory is not a directory: no checkpoint can be read or \
             written (every start replays the whole log); move it away"
        );
    }
    // Before recovery cuts anything: a whole checkpoint past the log's end
    // proves acknowledged records are gone; starting would hand their seqs
    // out again.
    if let Some(past) =
        spark_core::checkpoint::past_the_log(&settings.data_dir, &settings.log_dir())
    {
        return Err(EngineOpenError::LostCommitted(format!(
            "{past} (nothing in the data directory was changed)"
        )));
    }
    let start = if settings.log.checkpoint_interval_ops > 0 {
        let (candidate, ignored) =
            spark_core::checkpoint::newest_candidate(&settings.data_dir, &settings.log_dir());
        // Each newer file that fails its checks; an older one that passes
        // may still be used (the start then says which).
        for ignored in ignored {
            tracing::warn!(file = %ignored.file.display(), why = %ignored.why, "checkpoint ignored");
        }
        candidate.map(|(file, header)| (file, header.at, header.request_seed))
    } else {
        None
    };
    let Some((file, point, seed)) = start else {
        let (log, recovery, mirror) =
            replay_log_from(settings, Arc::clone(&fs), None)?.map_err(|(_, why)| {
                EngineOpenError::DataDir {
                    path: settings.data_dir.display().to_string(),
                    source: std::io::Error::other(why),
                }
            })?;
        return refuse_if_committed_past(settings, (log, recovery, mirror, 0));
    };
    let checkpoint_seq = point.seq;
    match replay_log_from(settings, Arc::clone(&fs), Some((file.clone(), point, seed)))? {
        Ok((log, recovery, mirror)) if log.head().seq >= checkpoint_seq => {
            // A newer whole checkpoint that was ignored (its chain value no
            // longer matches: zeros or damage where its records were) may
            // still stand past the recovered log.
            let replayed =
                refuse_if_committed_past(settings, (log, recovery, mirror, checkpoint_seq))?;
            tracing::info!(file = %file.display(), seq = checkpoint_seq, "started from checkpoint");
            return Ok(replayed);
        }
        // The checkpoint's chain value matched the log's bytes, yet
        // recovery ended before its seq: it cut records the checkpoint
        // shows were committed (a copy of what it cut is kept beside the
        // segment, see the recovery report).
        Ok((log, recovery, _)) => {
            let past = spark_core::checkpoint::PastTheLog {
                file,
                seq: checkpoint_seq,
                why: format!("the recovered log ends at seq {}", log.head().seq),
            };
            return Err(lost_committed(past, &recovery));
        }
        Err((file, why)) => {
            tracing::warn!(file = %file.display(), %why, "checkpoint ignored; replaying the log instead");
        }
    }
    let (log, recovery, mirror) =
        replay_log_from(settings, fs, None)?.map_err(|(_, why)| EngineOpenError::DataDir {
            path: settings.data_dir.display().to_string(),
            source: std::io::Error::other(why),
        })?;
    refuse_if_committed_past(settings, (log, recovery, mirror, 0))
}

/// `replayed`, unless a whole checkpoint's seq is past the recovered log's
/// last seq ([`spark_core::checkpoint::committed_past`]): then the log lost
/// acknowledged records, and the start is refused (a torn tail recovery
/// cut is kept beside its segment, as always).
fn refuse_if_committed_past(
    settings: &Settings,
    replayed: (Log, RecoveryReport, Mirror, u64),
) -> Result<(Log, RecoveryReport, Mirror, u64), EngineOpenError> {
    match spark_core::checkpoint::committed_past(&settings.data_dir, replayed.0.head().seq) {
        Some(past) => Err(lost_committed(past, &replayed.1)),
        None => Ok(replayed),
    }
}

/// The refusal of a recovered log that ends before a checkpoint's seq,
/// naming the torn tail recovery cut, if it cut one (a copy of it is kept
/// beside the segment).
fn lost_committed(
    mut past: spark_core::checkpoint::PastTheLog,
    recovery: &RecoveryReport,
) -> EngineOpenError {
    if let Some(tail) = &recovery.truncated {
        past.why = format!("{} (recovery: {})", past.why, tail.summary());
    }
    EngineOpenError::LostCommitted(past.to_string())
}

/// What [`replay_log_from`] gives: the log, recovery's report and the
/// mirror, or (inner `Err`) the checkpoint that did not load and why.
type Replayed = Result<(Log, RecoveryReport, Mirror), (std::path::PathBuf, String)>;

/// Replays the log into a mirror, from the checkpoint `start` when given:
/// recovery then checks the sealed segments before the one holding the
/// checkpoint's point by their links only (FORMAT.md, "Recovery" step 2a;
/// the scrub reads them later), and hands over only the records after it.
fn replay_log_from(
    settings: &Settings,
    fs: Arc<dyn Fs>,
    start: ReplayStart,
) -> Result<Replayed, EngineOpenError> {
    let point = start.as_ref().map(|(_, point, _)| *point);
    let from_checkpoint = point.is_some();
    let (batches, received) =
        std::sync::mpsc::sync_channel::<ReplayBatch>(REPLAY_BATCHES_IN_FLIGHT);
    // Emptied batch buffers go back to be filled again: a fresh 0.5 MB
    // buffer per batch, freed on the other thread, goes back to the kernel,
    // and faulting it in again (zeroed pages) is the largest cost of replay
    // on a VM.
    let (recycle, recycled) = std::sync::mpsc::channel::<Vec<(PreparedOp, u64)>>();
    // From a checkpoint, the mirror hashes request ids with the seed of the
    // checkpoint's stored table, so that the ids prepared here are hashed
    // once.
    let mirror = match &start {
        Some((_, _, seed)) => Mirror::with_request_seed(*seed),
        None => Mirror::new(),
    };
    // Ops are decoded and prepared (creates built and boxed, request ids
    // hashed) on this thread, and folded on the fold thread.
    let preparer = mirror.preparer();
    let fold = spawn_replay_fold(settings, mirror, start, received, recycle)?;
    let log_bytes = segment_bytes(&settings.log_dir());
    let mut sample = RequestIdSample::default();
    let mut at = (0, 0);
    let mut batch = Vec::with_capacity(REPLAY_BATCH_OPS);
    let log_config = settings.log_config();
    let opened = Log::open_from(
        &settings.log_dir(),
        log_config,
        Arc::clone(&fs),
        point.as_ref(),
        |record| {
            at = (record.seq, record.offset);
            let op = Op::decode(&record).map_err(|e| ReplayStop::Decode(e.into()))?;
            let op = preparer.prepare(op);
            sample.count(&record, &op);
            batch.push((op, record.offset));
            if batch.len() == REPLAY_BATCH_OPS {
                let empty = recycled
                    .try_recv()
                    .unwrap_or_else(|_| Vec::with_capacity(REPLAY_BATCH_OPS));
                let full = std::mem::replace(&mut batch, empty);
                // From a checkpoint, the index grows by the tail's ids only.
                let reserve = if from_checkpoint {
                    0
                } else {
                    sample.take_estimate(log_bytes)
                };
                batches
                    .send((full, reserve))
                    .map_err(|_| ReplayStop::FoldStopped)?;
            }
            Ok(())
        },
    );
    if !batch.is_empty() {
        // Also after an error: these records come before it, and folding
        // them first keeps "the first refusal in seq order" (inline
        // replay would have folded them). A send fails only when the fold
        // thread stopped: its error follows.
        let _ = batches.send((batch, 0));
    }
    drop(batches);
    let folded = fold.join().map_err(|_| EngineOpenError::DataDir {
        path: settings.data_dir.display().to_string(),
        source: std::io::Error::other("the replay fold thread panicked"),
    })?;
    let replay_error = |seq: u64, offset: u64, source: ReplayError| EngineOpenError::Replay {
        segment: segment_of(&settings.log_dir(), seq),
        offset,
        source,
    };
    // The fold's error is the earliest in seq order: report it first.
    let mirror = match folded {
        Ok(mirror) => mirror,
        Err(FoldStop::Op(seq, offset, source)) => return Err(replay_error(seq, offset, source)),
        Err(FoldStop::Checkpoint(file, why)) => {
            // The log's own damage still wins: it would stop a replay
            // without the checkpoint too.
            if let Err(e @ OpenError::Log(_)) = opened {
                return Err(open_error(settings, e, at));
            }
            return Ok(Err((file, why)));
        }
    };
    let (log, recovery) = opened.map_err(|e| open_error(settings, e, at))?;
    let mut mirror = mirror;
    if recovery.compaction_record_appended {
        fold_appended_compaction(settings, fs, &log, &mut mirror)?;
    }
    Ok(Ok((log, recovery, mirror)))
}

/// Folds the compaction record that recovery appended after the visitor's
/// pass, when it finished a compaction whose commit a crash interrupted
/// (FORMAT.md, "Recovery's redo": the visitor sees the log as recovery
/// found it, the appended record is the last one). Unfolded, the mirror
/// would lag the log by that record (the fold of the next op, whose seq
/// would not follow, is refused and stops the write path) and keep the
/// content of the moments it erased.
///
/// Errors: `Log` when the record cannot be read back, `Replay` when it
/// does not decode or the fold refuses it.
fn fold_appended_compaction(
    settings: &Settings,
    fs: Arc<dyn Fs>,
    log: &Log,
    mirror: &mut Mirror,
) -> Result<(), EngineOpenError> {
    let seq = log.head().seq;
    let max_record_bytes = settings.log.max_record_bytes;
    let reader =
        spark_log_format::LogReader::open_live_from(&settings.log_dir(), fs, max_record_bytes, seq)
            .map_err(EngineOpenError::Log)?;
    let mut folded = None;
    let options = spark_log_format::ScanOptions {
        verify_chain: false,
        max_record_bytes,
    };
    reader
        .scan(options, |_, record| {
            if record.seq != seq || record.kind != spark_log_format::KIND_COMPACTION {
                return std::ops::ControlFlow::Continue(());
            }
            folded =
                Some(
                    replay_record(mirror, &record).map_err(|source| EngineOpenError::Replay {
                        segment: segment_of(&settings.log_dir(), seq),
                        offset: record.offset,
                        source,
                    }),
                );
            std::ops::ControlFlow::Break(())
        })
        .map_err(EngineOpenError::Log)?;
    folded.unwrap_or_else(|| {
        Err(EngineOpenError::Log(LogError::Corrupt {
            segment: segment_of(&settings.log_dir(), seq),
            offset: 0,
            seq: spark_log_format::FaultSeq::Record(seq),
            reason: "the compaction record recovery appended is not the log's last record".into(),
        }))
    })
}

/// The name of the segment file that holds `seq`: the one with the largest
/// first seq not above it (segment files are named by their first seq).
fn segment_of(log_dir: &Path, seq: u64) -> String {
    std::fs::read_dir(log_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|name| {
            let first = name.strip_suffix(".seg")?.parse::<u64>().ok()?;
            (first <= seq).then_some((first, name))
        })
        .max()
        .map(|(_, name)| name)
        .unwrap_or_else(|| "(unknown)".into())
}

/// Lowers the calling thread's CPU priority to `nice` (Linux: nice is per
/// thread), for background workers that must yield to the write path and
/// the HTTP workers. Elsewhere, does nothing.
pub(crate) fn lower_thread_priority(nice: i32) {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's own id; no memory is passed.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

/// Creates `dir` and its missing parents, and makes each new directory
/// durable in its parent (fsync of the parent, top down).
pub fn create_dir_durably(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = vec![dir.to_path_buf()];
    let mut at = dir;
    while let Some(parent) = at
        .parent()
        .filter(|p| !p.as_os_str().is_empty() && !p.is_dir())
    {
        missing.push(parent.to_path_buf());
        at = parent;
    }
    std::fs::create_dir_all(dir)?;
    for created in missing.iter().rev() {
        let parent = created
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        spark_log_format::OsFs.sync_dir(parent)?;
    }
    Ok(())
}

pub(crate) fn lock_data_dir(data_dir: &Path) -> Result<File, EngineOpenError> {
    let io_error = |source| EngineOpenError::DataDir {
        path: data_dir.display().to_string(),
        source,
    };
    create_dir_durably(data_dir).map_err(io_error)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(data_dir.join("LOCK"))
        .map_err(io_error)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => {
            Err(EngineOpenError::Locked(data_dir.display().to_string()))
        }
        Err(std::fs::TryLockError::Error(e)) => Err(io_error(e)),
    }
}
