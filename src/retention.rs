//! Forgetting (SPEC section 13; DESIGN.md, "Forgetting"): the background
//! compactor that erases what a person deleted.
//!
//! Every `[retention] check_interval_ms` (and once right after start) a pass
//! looks for deleted moments whose delete was acknowledged at least
//! `erase_after_ms` ago and whose content is still there. For those it:
//!
//! 1. seals the active segment if it holds any of their content (an erasure
//!    never waits for a segment to fill);
//! 2. stages the sealed segments rewritten, each op with content about them
//!    in its erased form ([`spark_core::op::Op::encode_erased`]), off the
//!    writer thread ([`spark_log_format::stage_compaction`]);
//! 3. commits it ([`Engine::commit_compaction`]): the writer begins it, a
//!    thread of its own writes the redo journal and copies the staged
//!    segments over the old ones while the writer goes on with batches, and
//!    the writer finishes it with the compaction record, whose fold erases
//!    the moments from the mirror;
//! 4. removes their blobs (unless a moment that was not erased holds the
//!    same bytes, or an upload holds the digest), and the copies of cut
//!    tails that name them.
//!
//! The checkpoints taken at or after the first segment to rewrite (they
//! hold the content to erase, and their chain values go with the old
//! segments) are removed between 2 and 3, before the commit point, so that
//! no crash leaves one beside the rewritten log; no checkpoint is built
//! from then until the commit is done.
//!
//! A turn of a deleted moment never records the brain's reading (the rule
//! is in `spark_core::rules::turns`), so nothing about a due moment can be
//! written between the staging and the commit.
//!
//! The pass runs on a blocking thread, one at a time; the writer is busy
//! only for the commit's brief begin and finish. With an `[archive]` the
//! archive follows: the shipper finds the compaction record and ships the
//! rewritten segments as new objects (`archive/ARCHIVE.md`, "Compaction").
//! On a replica the compactor does not run (see [`Held`]): the replica
//! follows the archive's compaction ([`crate::replica`]) and removes the
//! same blobs and checkpoints with the same rules (`remove_erased_blobs`,
//! `remove_stale_checkpoints`, `remove_checkpoints_from`).

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use spark_core::ids::Id;
use spark_core::op::{Op, OpBody, OpKind};
use spark_log_format::{Fs, LogConfig, LogReader, Rewrite, ScanOptions};

use crate::clock::Clock;
use crate::config::Settings;
use crate::engine::Engine;
use crate::media::MediaStore;

/// Why the compactor does not run on this server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// A replica follows an archive and never writes its own log.
    Replica,
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Deleted moments whose content is still there, due or not.
    pub pending: usize,
    /// Of those, the ones due and erased by this pass.
    pub erased: Vec<Id>,
    /// Segments rewritten (content or chain).
    pub segments_rewritten: usize,
    /// Bytes of segment files written.
    pub bytes_written: u64,
    /// Blobs removed.
    pub blobs_removed: usize,
    /// Checkpoint files removed.
    pub checkpoints_removed: usize,
    /// Copies of cut tails (`<segment>.torn-*`, kept by recovery) removed.
    pub cut_tails_removed: usize,
    /// True when moments were due and the pass left them for the next
    /// one because the scrub had not yet read every segment startup
    /// deferred (see [`Compactor::pass`]).
    pub waiting_for_scrub: bool,
    /// The earliest time (Unix ms) a pending moment becomes due, if one is
    /// not due yet.
    pub next_due_ms: Option<u64>,
}

/// Nice value (Linux, per thread) of a compaction's threads: the pass's
/// staging and the commit's copies. Below the write path and the HTTP
/// workers (0), as the checkpoint worker; the scrub (19) yields to both.
pub const COMPACTOR_NICE: i32 = 10;

/// Why a pass failed. The next pass tries again; a failure of the writer's
/// part stops the write path (a restart's recovery finishes the job).
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// Reading or staging the log failed.
    #[error("compaction: {0}")]
    Log(#[from] spark_log_format::LogError),
    /// The writer refused or failed.
    #[error("compaction: {0}")]
    Engine(#[from] crate::engine::EngineError),
    /// Removing a blob or a checkpoint failed.
    #[error("compaction: {what}: {source}")]
    Io {
        /// What was being removed.
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The compactor's view of a data directory.
pub struct Compactor {
    engine: Arc<Engine>,
    media: MediaStore,
    fs: Arc<dyn Fs>,
    clock: Arc<dyn Clock>,
    data_dir: PathBuf,
    log_dir: PathBuf,
    log_config: LogConfig,
    erase_after_ms: u64,
}

/// Where a deleted moment's ops are: its delete's time and the seqs of its
/// ops with content.
#[derive(Clone, Debug, Default)]
struct Found {
    deleted_at_ms: Option<u64>,
    last_content_seq: u64,
}

impl Compactor {
    /// A compactor for the engine's data directory with the settings'
    /// `[retention]` and `[log]` values; `media` is the server's store (its
    /// upload holds are respected), `clock` the engine's.
    pub fn new(
        settings: &Settings,
        engine: Arc<Engine>,
        media: MediaStore,
        fs: Arc<dyn Fs>,
        clock: Arc<dyn Clock>,
    ) -> Compactor {
        Compactor {
            engine,
            media,
            fs,
            clock,
            data_dir: settings.data_dir.clone(),
            log_dir: settings.log_dir(),
            log_config: settings.log_config(),
            erase_after_ms: settings.retention.erase_after_ms,
        }
    }

    /// Why the compactor must not run with these settings, if it must not.
    pub fn held(settings: &Settings) -> Option<Held> {
        settings.replica_from.is_some().then_some(Held::Replica)
    }

    /// Runs passes every `interval` until `stop` turns true, each on a
    /// thread of its own at [`COMPACTOR_NICE`] (SPEC section 13: low
    /// priority). A failed pass is logged and retried at the next interval.
    pub async fn run(self, interval: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
        let this = Arc::new(self);
        loop {
            let result = this.pass_in_background().await;
            match result {
                Ok(Ok(report)) if !report.erased.is_empty() => tracing::info!(
                    erased = report.erased.len(),
                    segments = report.segments_rewritten,
                    bytes = report.bytes_written,
                    blobs = report.blobs_removed,
                    checkpoints = report.checkpoints_removed,
                    "erased the content of deleted moments"
                ),
                // Said at every check while it lasts: a scrub that never
                // ends (its thread failed to start) must not hold erasure
                // back unseen.
                Ok(Ok(report)) if report.waiting_for_scrub => tracing::warn!(
                    pending = report.pending,
                    "deleted moments are due for erasure, and wait until the scrub has read the \
                     segments a start from a checkpoint deferred (see /readyz, scrub)"
                ),
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::error!(%error, "an erasure pass failed; it is tried again at the next check")
                }
                Err(error) => tracing::error!(%error, "an erasure pass stopped"),
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.wait_for(|stop| *stop) => return,
            }
        }
    }

    /// [`pass`](Self::pass) on a thread of its own at [`COMPACTOR_NICE`],
    /// as [`run`](Self::run) does at each interval (a thread per pass, one
    /// a minute by default: the nice value of a pooled thread could not be
    /// raised again afterwards).
    ///
    /// Errors: the pass's own, inside; outside, a thread that did not
    /// start or ended without a report, in words.
    pub async fn pass_in_background(
        self: &Arc<Self>,
    ) -> Result<Result<PassReport, PassError>, String> {
        let pass = Arc::clone(self);
        let handle = tokio::runtime::Handle::current();
        let (done, result) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("spark-compactor".into())
            .spawn(move || {
                crate::engine::lower_thread_priority(COMPACTOR_NICE);
                let _ = done.send(handle.block_on(pass.pass()));
            })
            .map_err(|e| format!("its thread did not start: {e}"))?;
        result
            .await
            .map_err(|_| "its thread ended without a report".to_owned())
    }

    /// One pass: erases every deleted moment that is due (module docs),
    /// once the scrub has read every segment a checkpointed start deferred
    /// (until then the due moments wait: `waiting_for_scrub`).
    /// Errors: [`PassError`]; nothing is half done (the log's compaction is
    /// atomic; blobs and checkpoints are retried by the next pass through
    /// `spark-replay audit erasure`'s findings at the latest).
    // The checkpoint hold is taken across the writer's commit on purpose
    // (no checkpoint is built from the old segments meanwhile); the pass
    // runs on a blocking thread of its own.
    #[allow(clippy::await_holding_lock)]
    pub async fn pass(&self) -> Result<PassReport, PassError> {
        let mut report = PassReport::default();
        // Deleted moments whose content is still there, and the ids of
        // their turns and messages.
        let pending: Vec<(Id, u64)> = self.engine.read(|mirror| {
            mirror
                .moments
                .values()
                .filter(|m| m.deleted && !m.erased())
                .map(|m| (m.id, m.created_seq()))
                .collect()
        });
        report.pending = pending.len();
        // What an earlier pass may have left behind when it failed after
        // its commit (the moments are erased in the mirror then): their
        // blobs, and checkpoints whose chain value no segment holds any
        // more (taken before a compaction: they may hold erased content).
        {
            let _held = self.engine.hold_checkpoints().await;
            report.checkpoints_removed += self.remove_stale_checkpoints()?;
        }
        report.blobs_removed += self.remove_blobs(&HashSet::new())?;
        let Some(from_seq) = pending.iter().map(|(_, seq)| *seq).min() else {
            return Ok(report);
        };
        let owners = self.owners(pending.iter().map(|(id, _)| *id));
        let found = self.find(from_seq, &owners)?;
        let now_ms = self.clock.now_ms();
        let mut due: Vec<Id> = Vec::new();
        for (id, _) in &pending {
            match found.get(id).and_then(|f| f.deleted_at_ms) {
                Some(at) if at.saturating_add(self.erase_after_ms) <= now_ms => due.push(*id),
                Some(at) => {
                    let when = at.saturating_add(self.erase_after_ms);
                    report.next_due_ms = Some(report.next_due_ms.map_or(when, |n| n.min(when)));
                }
                // The delete is not in the log this pass read (it cannot be
                // before the create): try again next pass.
                None => {}
            }
        }
        if due.is_empty() {
            return Ok(report);
        }
        // The scrub checks each sealed segment a checkpointed start
        // deferred against the chain values startup linked; a rewrite
        // under it would show it damage that is not there. Erasure waits
        // for it (it runs once, right after the start).
        if !self.engine.scrub_status().finished() {
            report.waiting_for_scrub = true;
            return Ok(report);
        }
        due.sort_unstable();
        let due_set: HashSet<Id> = due.iter().copied().collect();
        let owners = self.owners(due.iter().copied());
        // 1. The active segment holds content of a due moment: seal it.
        let last_content_seq = due
            .iter()
            .filter_map(|id| found.get(id))
            .map(|f| f.last_content_seq)
            .max()
            .unwrap_or(0);
        let head = self.engine.head();
        let active_first_seq = head.segment.trim_end_matches(".seg").parse::<u64>().ok();
        if active_first_seq.is_some_and(|first| last_content_seq >= first) {
            self.engine.seal_active().await?;
        }
        // 2. Stage, 3. commit; a roll between the two makes the staging
        // stale: stage again (a few times, then leave it to the next pass).
        for _ in 0..3 {
            let staged = spark_log_format::stage_compaction(
                &self.log_dir,
                Arc::clone(&self.fs),
                &self.log_config,
                |record| erase_record(record, &owners),
            )?;
            let Some(staged) = staged else {
                break;
            };
            report.segments_rewritten = staged.segments().len();
            report.bytes_written = staged.bytes_written();
            // From here until the commit is done no checkpoint is built:
            // one built from the old segments would keep the erased content.
            let _held = self.engine.hold_checkpoints().await;
            // The checkpoints at or after the first segment to rewrite go
            // before the commit point: they hold the content to erase, and
            // once the segments are rewritten their chain values match no
            // log. A crash after the commit point must not leave them: the
            // next start would pick one (checked against the old segments
            // before recovery finishes the commit) and then refuse the
            // rewritten log as corrupt, or take one whose point lies past the
            // end of its shorter rewritten segment for proof of lost records.
            let first_rewritten = staged.segments().first().map_or(u64::MAX, |s| s.first_seq);
            report.checkpoints_removed += self.remove_checkpoints(first_rewritten)?;
            let Some(_commit) = self.engine.commit_compaction(staged, due.clone()).await? else {
                continue;
            };
            report.blobs_removed += self.remove_blobs(&due_set)?;
            report.cut_tails_removed += self.remove_cut_tails(&owners)?;
            report.erased = due;
            return Ok(report);
        }
        // Nothing staged, or the log rolled under every staging: the next
        // pass tries again.
        Ok(report)
    }

    /// The ids whose ops carry content about `moments`: the moments, their
    /// turns and their messages.
    fn owners(&self, moments: impl Iterator<Item = Id>) -> Owners {
        self.engine.read(|mirror| {
            let mut owners = Owners::default();
            for id in moments {
                owners.moments.insert(id);
                if let Some(moment) = mirror.moment(id) {
                    owners.turns.extend(moment.turns().iter().map(|t| (*t, id)));
                }
            }
            owners
        })
    }

    /// Reads the log from `from_seq` for the delete time and the last
    /// content op of each moment in `owners`.
    fn find(&self, from_seq: u64, owners: &Owners) -> Result<HashMap<Id, Found>, PassError> {
        let reader = LogReader::open_live_from(
            &self.log_dir,
            Arc::clone(&self.fs),
            self.log_config.max_record_bytes,
            from_seq,
        )?;
        let mut found: HashMap<Id, Found> = HashMap::new();
        let options = ScanOptions {
            verify_chain: false,
            max_record_bytes: self.log_config.max_record_bytes,
        };
        reader.scan(options, |_, record| {
            if record.seq < from_seq {
                return ControlFlow::Continue(());
            }
            let Some(kind) = OpKind::from_code(record.kind) else {
                return ControlFlow::Continue(());
            };
            if !matches!(kind, OpKind::MomentDelete) && !kind.has_content() {
                return ControlFlow::Continue(());
            }
            let Ok(op) = Op::decode(&record) else {
                return ControlFlow::Continue(());
            };
            if let OpBody::MomentDelete(p) = &op.body {
                if owners.moments.contains(&p.id) {
                    found.entry(p.id).or_default().deleted_at_ms = Some(op.ts_ms);
                }
            } else if !op.erased {
                if let Some(moment) = owners.moment_of(&op.body) {
                    let entry = found.entry(moment).or_default();
                    entry.last_content_seq = entry.last_content_seq.max(op.seq);
                }
            }
            ControlFlow::Continue(())
        })?;
        Ok(found)
    }

    /// Removes the blobs of the media of `erased` and of every moment the
    /// mirror holds as erased, unless a moment that is not erased names the
    /// same bytes, then fsyncs the blob directory. Returns how many.
    fn remove_blobs(&self, erased: &HashSet<Id>) -> Result<usize, PassError> {
        remove_erased_blobs(&self.engine, &self.media, erased).map_err(|source| PassError::Io {
            what: format!("removing the blobs of {} erased moments", erased.len()),
            source,
        })
    }

    /// Removes the copies recovery kept of cut tails (`<segment>.torn-*`
    /// in the log directory: bytes that were never acknowledged, but may
    /// hold a retried op of an erased moment) that hold an id of `owners`
    /// (a moment or one of its turns, as the codec writes a ULID: the tag
    /// byte of a 16-byte varint and its little-endian bytes, found even in
    /// a torn frame), then fsyncs the directory. Returns how many.
    fn remove_cut_tails(&self, owners: &Owners) -> Result<usize, PassError> {
        let io = |what: String| move |source| PassError::Io { what, source };
        let mut needles: Vec<[u8; 16]> =
            owners.moments.iter().map(|id| id.0.to_le_bytes()).collect();
        needles.extend(owners.turns.keys().map(|id| id.0.to_le_bytes()));
        let mut removed = 0;
        let files = self
            .fs
            .list(&self.log_dir)
            .map_err(io(format!("listing {}", self.log_dir.display())))?;
        for path in files {
            let is_cut_tail = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains(".torn-"));
            if !is_cut_tail {
                continue;
            }
            let bytes = self
                .fs
                .map(&path)
                .map_err(io(format!("reading {}", path.display())))?;
            let bytes: &[u8] = (*bytes).as_ref();
            let holds = needles
                .iter()
                .any(|needle| bytes.windows(needle.len()).any(|w| w == needle));
            if holds {
                self.fs
                    .remove_file(&path)
                    .map_err(io(format!("removing {}", path.display())))?;
                removed += 1;
            }
        }
        if removed > 0 {
            self.fs
                .sync_dir(&self.log_dir)
                .map_err(io(format!("syncing {}", self.log_dir.display())))?;
        }
        Ok(removed)
    }

    /// Removes the checkpoints whose chain value is not the log's at their
    /// seq any more (the log was compacted after them), then fsyncs their
    /// directory. Returns how many.
    fn remove_stale_checkpoints(&self) -> Result<usize, PassError> {
        remove_stale_checkpoints(
            &self.engine,
            self.fs.as_ref(),
            &self.data_dir,
            &self.log_dir,
        )
    }

    /// Removes the checkpoints at or after `first_seq`, the first seq of
    /// the first segment a compaction rewrites (they hold the content it
    /// erases, and their chain values name the old segments), then fsyncs
    /// their directory. Returns how many.
    fn remove_checkpoints(&self, first_seq: u64) -> Result<usize, PassError> {
        remove_checkpoints_from(&self.engine, self.fs.as_ref(), &self.data_dir, first_seq)
    }
}

/// Removes the blobs of the media of `erased` and of every moment the
/// mirror of `engine` holds as erased, unless a moment that is not erased
/// names the same bytes (or an upload of `media` holds the digest), then
/// fsyncs the blob directory. Returns how many. The one rule for the
/// compactor and for a replica that followed a compaction.
///
/// Errors: the first I/O error of a removal or of the directory sync.
pub(crate) fn remove_erased_blobs(
    engine: &Engine,
    media: &MediaStore,
    erased: &HashSet<Id>,
) -> std::io::Result<usize> {
    let unneeded = || {
        engine.read(|mirror| {
            let mut gone = HashSet::new();
            let mut kept = HashSet::new();
            for media in mirror.media.values() {
                if erased.contains(&media.moment_id) || mirror.is_erased(media.moment_id) {
                    gone.insert(media.sha256.0);
                } else {
                    kept.insert(media.sha256.0);
                }
            }
            gone.difference(&kept).copied().collect()
        })
    };
    media.remove_erased(unneeded)
}

/// Removes the checkpoints in `data_dir` whose chain value is not the log's
/// (in `log_dir`) at their seq any more (the log was compacted after them:
/// they may hold erased content), then fsyncs their directory. Returns how
/// many. Errors: [`PassError::Io`] naming the file or directory.
pub(crate) fn remove_stale_checkpoints(
    engine: &Engine,
    fs: &dyn Fs,
    data_dir: &Path,
    log_dir: &Path,
) -> Result<usize, PassError> {
    remove_checkpoints_where(engine, fs, data_dir, |_, path| {
        matches!(
            spark_core::checkpoint::peek(path, log_dir),
            Err(spark_core::checkpoint::CheckpointError::ChainMismatch { .. })
        )
    })
}

/// Removes the checkpoints in `data_dir` at or after `first_seq` (they
/// hold erased content, and their chain values name segments that were
/// rewritten), then fsyncs their directory. Returns how many. Errors:
/// [`PassError::Io`] naming the file or directory.
pub(crate) fn remove_checkpoints_from(
    engine: &Engine,
    fs: &dyn Fs,
    data_dir: &Path,
    first_seq: u64,
) -> Result<usize, PassError> {
    remove_checkpoints_where(engine, fs, data_dir, |seq, _| seq >= first_seq)
}

/// Removes the checkpoints `remove` picks (by seq and path), and every
/// temporary file a checkpoint write that was cut short left
/// (`<seq>.ckpt.tmp`: it may hold the content being erased), then fsyncs
/// their directory, and then detaches `engine`'s request index from the
/// checkpoint it reads in place ([`Engine::detach_request_index`]: a
/// removed file's blocks stay allocated while it is mapped, and it may hold
/// what is erased). Returns how many checkpoints and temporary files.
/// Called only while the checkpoint worker is held
/// ([`Engine::hold_checkpoints`]), so no temporary file is being written.
fn remove_checkpoints_where(
    engine: &Engine,
    fs: &dyn Fs,
    data_dir: &Path,
    remove: impl Fn(u64, &Path) -> bool,
) -> Result<usize, PassError> {
    let mut removed = 0;
    let picked = spark_core::checkpoint::list(data_dir)
        .into_iter()
        .filter(|(seq, path)| remove(*seq, path));
    for (_, path) in picked.chain(spark_core::checkpoint::list_temp_files(data_dir)) {
        fs.remove_file(&path).map_err(|source| PassError::Io {
            what: format!("removing checkpoint {}", path.display()),
            source,
        })?;
        removed += 1;
    }
    if removed > 0 {
        let dir = spark_core::checkpoint::checkpoint_dir(data_dir);
        fs.sync_dir(&dir).map_err(|source| PassError::Io {
            what: format!("syncing {}", dir.display()),
            source,
        })?;
        engine.detach_request_index();
    }
    Ok(removed)
}

/// The ids that carry content about a set of moments.
#[derive(Default)]
struct Owners {
    /// The moments (their creates, edits and threads).
    moments: HashSet<Id>,
    /// Their turns, each with its moment.
    turns: HashMap<Id, Id>,
}

impl Owners {
    /// The moment an op with content is about, when it is one of these.
    fn moment_of(&self, body: &OpBody) -> Option<Id> {
        let moment = match body {
            OpBody::MomentCreate(p) => p.id,
            OpBody::MomentEdit(p) => p.id,
            OpBody::MessagePost(p) => p.thread_id,
            OpBody::TurnFinish(p) => return self.turns.get(&p.id).copied(),
            OpBody::TurnFail(p) => return self.turns.get(&p.id).copied(),
            _ => return None,
        };
        self.moments.contains(&moment).then_some(moment)
    }
}

/// What a compaction writes in place of `record`: its erased form when it
/// is an op with content about one of `owners`, else the record unchanged.
fn erase_record(record: spark_log_format::RecordRef<'_>, owners: &Owners) -> Rewrite {
    let Some(kind) = OpKind::from_code(record.kind) else {
        return Rewrite::Keep;
    };
    if !kind.has_content() {
        return Rewrite::Keep;
    }
    let Ok(op) = Op::decode(&record) else {
        return Rewrite::Keep;
    };
    if op.erased || owners.moment_of(&op.body).is_none() {
        return Rewrite::Keep;
    }
    match op.encode_erased() {
        Ok((_, kind_version, payload)) => Rewrite::Replace {
            kind_version,
            payload,
        },
        Err(_) => Rewrite::Keep,
    }
}
