//! The journal: the one writer thread. It owns the [`Log`] and is the only
//! code that appends to it or applies ops to the published mirror.
//!
//! Each turn of the loop takes the commands queued right now (at least one),
//! decides them until the batch holds `group_commit_max_ops` ops (the rest
//! wait for the next batch), appends the ops with one
//! write call and one fdatasync (group commit), applies them with the one
//! fold, publishes the new head, and answers. An append error poisons the
//! write path: nothing of that batch is acknowledged, and every later command
//! is answered `Unavailable` until a restart recovers from what is on disk.
//! The failed fsync is never retried (DESIGN.md, "The write path", step 5).
//!
//! Disk space: a batch is refused with `InsufficientStorage`
//! (507) when the free space after it would be below the reserve
//! (`log.disk_reserve_bytes`, [`crate::disk`]). A batch whose *write* fails
//! for want of space anyway (another program filled the disk) is answered
//! `InsufficientStorage`, never acknowledged; the log's tail is then
//! recovered in process ([`Log::heal`]: the same recovery as at startup,
//! after zeroing what the failed write left) and writes resume with no
//! restart, the mirror untouched (it only ever holds acknowledged ops).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;

use spark_log_format::{CompactionCommit, CompactionTicket, Log, LogError, RecordIn};
use tokio::sync::{mpsc, oneshot};

use crate::clock::Clock;
use spark_core::ids::Id;
use spark_core::mirror::MomentView;
use spark_core::op::{Op, OpBody};

use super::{EngineError, Outcome, Shared, WriterRequest};
use spark_core::command::Key;
use spark_core::rules::{decide, Decision, Plan};

type Reply = oneshot::Sender<Result<Outcome, EngineError>>;

/// A decided command: its ops, how to answer, and where.
type Write = (Vec<OpBody>, Plan, Reply);

/// Ops by kind, counted into the metrics once per kind after the mirror's
/// write lock is released (a labelled counter costs a few allocations and a
/// hash lookup).
#[derive(Default)]
struct KindTally(Vec<(&'static str, u64)>);

impl KindTally {
    /// One more op of `kind`.
    fn add(&mut self, kind: &'static str) {
        match self.0.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => self.0.push((kind, 1)),
        }
    }

    /// Adds the tally to the ops-appended counter of each kind.
    fn count(&self) {
        let metrics = crate::metrics::get();
        for (kind, n) in &self.0 {
            metrics
                .ops_appended
                .get_or_create(&crate::metrics::label("kind", kind))
                .inc_by(*n);
        }
    }
}

/// A batch after the fold: what to answer, announce and run.
struct Folded {
    /// Each write's answer and where it goes.
    answers: Vec<(Result<Outcome, EngineError>, Reply)>,
    /// One change notice per op, for `/api/events`.
    notices: Vec<super::ChangeNotice>,
    /// The turns the batch started, for the brain runner.
    started_turns: Vec<Id>,
}

/// Where a compaction's answer goes.
type CompactionReply = oneshot::Sender<Result<Option<CompactionCommit>, EngineError>>;

/// A compaction begun on the writer whose apply step runs on a thread of
/// its own; the writer finishes it once that thread is done.
struct Applying {
    /// The apply thread; it hands back the ticket and apply's result.
    thread: JoinHandle<(CompactionTicket, Result<(), LogError>)>,
    /// Where the commit's answer goes.
    reply: CompactionReply,
}

/// Starts the writer thread (named `spark-journal`). `wake` reaches its own
/// queue (weakly: it does not keep the queue open), for a compaction's
/// apply thread to say it is done.
pub(super) fn spawn(
    log: Log,
    shared: Arc<Shared>,
    queue: mpsc::Receiver<WriterRequest>,
    wake: mpsc::WeakSender<WriterRequest>,
    clock: Arc<dyn Clock>,
    max_batch_ops: usize,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("spark-journal".into())
        .spawn(move || {
            Journal {
                log,
                shared,
                clock,
                max_batch_ops,
                deferred: VecDeque::new(),
                wake,
                applying: None,
            }
            .run(queue)
        })
}

struct Journal {
    /// The appender; nothing else writes the log.
    log: Log,
    /// The published mirror, head and poison flag.
    shared: Arc<Shared>,
    /// Stamps ops (`ts_ms`) and mints ids.
    clock: Arc<dyn Clock>,
    /// Most ops per group-commit batch (`log.group_commit_max_ops`): a
    /// batch takes no more commands once it holds this many ops.
    max_batch_ops: usize,
    /// Commands that shared a key with an op of the previous batch; they go
    /// first in the next one, in arrival order.
    deferred: VecDeque<(super::Command, Reply)>,
    /// The writer's own queue, for the apply thread's wake-up.
    wake: mpsc::WeakSender<WriterRequest>,
    /// The compaction being applied off this thread, if any.
    applying: Option<Applying>,
}

impl Journal {
    fn run(mut self, mut queue: mpsc::Receiver<WriterRequest>) {
        let mut stopping = false;
        loop {
            let mut batch: Vec<(super::Command, Reply)> = self.deferred.drain(..).collect();
            if batch.is_empty() {
                if stopping {
                    break;
                }
                match queue.blocking_recv() {
                    Some(WriterRequest::Command { command, reply }) => batch.push((command, reply)),
                    Some(WriterRequest::Stop) | None => stopping = true,
                    Some(other) => self.compaction_request(other),
                }
            }
            while !stopping && batch.len() < self.max_batch_ops {
                match queue.try_recv() {
                    Ok(WriterRequest::Command { command, reply }) => batch.push((command, reply)),
                    Ok(WriterRequest::Stop) => stopping = true,
                    // The batch so far goes first: requests are served in
                    // arrival order.
                    Ok(other) => {
                        if !batch.is_empty() {
                            self.commit_batch(std::mem::take(&mut batch));
                        }
                        self.compaction_request(other);
                    }
                    Err(_) => break,
                }
            }
            if !batch.is_empty() {
                self.commit_batch(batch);
            }
        }
        // Anything queued after the stop is refused, never dropped silently.
        // A compaction being applied is finished first (its thread's
        // wake-up now fails at once: the queue is closed).
        queue.close();
        self.finish_applied();
        let stopped = || EngineError::Unavailable("the engine is shutting down".into());
        while let Ok(job) = queue.try_recv() {
            match job {
                WriterRequest::Command { reply, .. } => {
                    let _ = reply.send(Err(stopped()));
                }
                WriterRequest::SealActive { reply } => {
                    let _ = reply.send(Err(stopped()));
                }
                WriterRequest::CommitCompaction { staged, reply, .. } => {
                    let _ = staged.discard(self.log_fs().as_ref());
                    let _ = reply.send(Err(stopped()));
                }
                WriterRequest::CompactionApplied | WriterRequest::Stop => {}
            }
        }
        tracing::info!(seq = self.log.last_seq(), "journal stopped");
    }

    /// The file system the log is on (for discarding staged files).
    fn log_fs(&self) -> Arc<dyn spark_log_format::Fs> {
        self.log.fs()
    }

    /// Serves a compaction's request to the writer (SPEC section 13): seal
    /// the active segment; begin a staged compaction and start its apply
    /// thread; finish it once that thread is done. A failure of the log's
    /// calls poisons the write path like a failed append.
    fn compaction_request(&mut self, request: WriterRequest) {
        let poisoned = |journal: &Self| journal.shared.poison.lock().clone();
        match request {
            WriterRequest::SealActive { reply } => {
                if let Some(reason) = poisoned(self) {
                    let _ = reply.send(Err(EngineError::Unavailable(reason)));
                    return;
                }
                let sealed = self.log.seal_active();
                *self.shared.head.lock() = self.log.head();
                let _ = reply.send(match sealed {
                    Ok(()) => Ok(self.log.head()),
                    Err(e) => Err(self.poison_compaction("sealing the active segment", &e)),
                });
            }
            WriterRequest::CommitCompaction {
                staged,
                subjects,
                reply,
            } => {
                if let Some(reason) = poisoned(self) {
                    let _ = staged.discard(self.log_fs().as_ref());
                    let _ = reply.send(Err(EngineError::Unavailable(reason)));
                    return;
                }
                let subject_bytes = subjects.iter().map(|id| id.0.to_be_bytes()).collect();
                let begun = self.log.begin_compaction(staged, subject_bytes);
                // Begin may have started a segment (the last one was sealed).
                *self.shared.head.lock() = self.log.head();
                match begun {
                    Ok(ticket) => self.start_apply(ticket, reply),
                    Err(LogError::CompactionStale) => {
                        let _ = reply.send(Ok(None));
                    }
                    Err(e) => {
                        let _ =
                            reply.send(Err(self.poison_compaction("beginning a compaction", &e)));
                    }
                }
            }
            WriterRequest::CompactionApplied => self.finish_applied(),
            WriterRequest::Command { .. } | WriterRequest::Stop => {
                unreachable!("only compaction requests come here")
            }
        }
    }

    /// Runs a begun compaction's apply step ([`CompactionTicket::apply`]:
    /// the redo journal, the segment copies) on a thread of its own, which
    /// sends [`WriterRequest::CompactionApplied`] when it is done; the
    /// writer goes on with batches meanwhile.
    fn start_apply(&mut self, ticket: CompactionTicket, reply: CompactionReply) {
        let wake = self.wake.clone();
        let spawned = std::thread::Builder::new()
            .name("spark-compaction".into())
            .spawn(move || {
                // Background work: the writer's batches and the HTTP
                // workers come first.
                super::lower_thread_priority(crate::retention::COMPACTOR_NICE);
                let mut ticket = ticket;
                let applied = ticket.apply();
                // The queue is gone or closed: the engine is stopping, and
                // the writer joins this thread.
                if let Some(queue) = wake.upgrade() {
                    let _ = queue.blocking_send(WriterRequest::CompactionApplied);
                }
                (ticket, applied)
            });
        match spawned {
            Ok(thread) => self.applying = Some(Applying { thread, reply }),
            // The ticket is gone with the closure: the log holds its rolls
            // and nothing may be written (the journal was never written, so
            // a restart finds the old log).
            Err(e) => {
                let e = LogError::Poisoned(format!("the compaction's thread did not start: {e}"));
                let _ = reply.send(Err(self.poison_compaction("beginning a compaction", &e)));
            }
        }
    }

    /// Finishes the compaction being applied, if any, once its apply thread
    /// ends (joining it): [`Log::finish_compaction`], then the fold of its
    /// record, then the answer. With the write path stopped meanwhile, or
    /// apply failed, the log is poisoned for good instead (a restart's
    /// recovery redoes the compaction from its journal, or finds the old
    /// log).
    fn finish_applied(&mut self) {
        let Some(Applying { thread, reply }) = self.applying.take() else {
            return;
        };
        let answer = match thread.join() {
            Ok((ticket, applied)) => {
                let poisoned = self.shared.poison.lock().clone();
                let applied = match poisoned {
                    Some(reason) => applied.and(Err(LogError::Poisoned(reason))),
                    None => applied,
                };
                match self.log.finish_compaction(ticket, applied) {
                    Ok(commit) => self.fold_compaction(&commit).map(|()| Some(commit)),
                    Err(e) => Err(self.poison_compaction("committing a compaction", &e)),
                }
            }
            Err(_) => {
                let e = LogError::Poisoned("the compaction's thread panicked".into());
                Err(self.poison_compaction("applying a compaction", &e))
            }
        };
        let _ = reply.send(answer);
    }

    /// Stops the write path after a failed compaction step (the log is
    /// poisoned; a restart's recovery finishes or rolls back the
    /// compaction) and returns the refusal.
    fn poison_compaction(&self, step: &str, e: &LogError) -> EngineError {
        let reason = format!("{step} failed: {e}");
        tracing::error!(%reason, "the write path is stopped until restart");
        *self.shared.poison.lock() = Some(reason.clone());
        EngineError::Unavailable(reason)
    }

    /// Folds a committed compaction's record into the mirror (it erases its
    /// moments) and publishes the new head and the change.
    fn fold_compaction(
        &mut self,
        commit: &spark_log_format::CompactionCommit,
    ) -> Result<(), EngineError> {
        let op = Op::new(
            commit.record_seq,
            self.clock.now_ms(),
            OpBody::LogCompact(commit.record.clone()),
        );
        let notice = super::ChangeNotice::of(&op);
        {
            let mut mirror = self.shared.mirror.write();
            if let Err(e) = mirror.apply(op) {
                drop(mirror);
                let reason = format!("the fold refused the compaction record: {e}");
                tracing::error!(%reason);
                *self.shared.poison.lock() = Some(reason.clone());
                return Err(EngineError::Unavailable(reason));
            }
            *self.shared.head.lock() = self.log.head();
        }
        self.publish(
            commit.record_seq,
            Folded {
                answers: Vec::new(),
                notices: vec![notice],
                started_turns: Vec::new(),
            },
        );
        Ok(())
    }

    fn commit_batch(&mut self, batch: Vec<(super::Command, Reply)>) {
        if let Some(reason) = self.shared.poison.lock().clone() {
            for (_, reply) in batch {
                let _ = reply.send(Err(EngineError::Unavailable(reason.clone())));
            }
            return;
        }
        let (ts_ms, writes) = self.decide_batch(batch);
        if writes.is_empty() {
            return;
        }
        let Some((encoded, mut writes)) = self.encode_batch(writes) else {
            return;
        };
        if let Err(refusal) = self.space_for(&encoded, writes.len() as u64) {
            for (_, _, reply) in writes {
                let _ = reply.send(Err(refusal.clone()));
            }
            return;
        }
        let Some((first_seq, last_seq)) = self.append(ts_ms, encoded, &mut writes) else {
            return;
        };
        let Some(folded) = self.fold_batch(first_seq, last_seq, ts_ms, writes) else {
            return;
        };
        self.publish(last_seq, folded);
    }

    /// Appends the encoded ops as one batch (one write, one fdatasync) and
    /// returns the first and last seq it got. On a refusal the writes are
    /// answered `Invalid`; on an I/O error the write path is poisoned and
    /// they are answered `Unavailable` (`writes` is left empty either way).
    fn append(
        &mut self,
        ts_ms: u64,
        encoded: Vec<Encoded>,
        writes: &mut Vec<Write>,
    ) -> Option<(u64, u64)> {
        let records: Vec<RecordIn<'_>> = encoded
            .iter()
            .map(|(kind, kind_version, payload)| RecordIn {
                ts_ms,
                kind: *kind,
                kind_version: *kind_version,
                payload,
            })
            .collect();
        let started = std::time::Instant::now();
        let appended = self.log.append_batch(&records);
        let metrics = crate::metrics::get();
        metrics
            .fsync_seconds
            .observe(started.elapsed().as_secs_f64());
        metrics.batch_ops.observe(records.len() as f64);
        let last_seq = match appended {
            Ok(seq) => seq,
            // Refused before anything was written (checked above, so not
            // expected): the batch fails, the write path goes on.
            Err(e @ (LogError::RecordTooLarge { .. } | LogError::ReservedKind { .. })) => {
                for (_, _, reply) in writes.drain(..) {
                    let _ = reply.send(Err(EngineError::Invalid(e.to_string())));
                }
                return None;
            }
            // A write or create refused for want of space: nothing was
            // acknowledged; recover the tail now (it needs no space: it
            // zeroes bytes already allocated), so the next batch only waits
            // for the reserve.
            Err(e) if self.log.is_healable() => {
                tracing::warn!(error = %e, "append failed for want of space; answering 507 and recovering the log's tail in process");
                let refusal = self.shared.disk.refuse_full(
                    "a log append",
                    &e,
                    writes.len() as u64,
                    "nothing of this write was kept, and writes resume by themselves once space is freed",
                );
                for (_, _, reply) in writes.drain(..) {
                    let _ = reply.send(Err(refusal.clone()));
                }
                let _ = self.heal();
                return None;
            }
            Err(e) => {
                tracing::error!(error = %e, "append failed; the write path is stopped until restart");
                self.poison_and_refuse(e.to_string(), std::mem::take(writes));
                return None;
            }
        };
        // `encoded.len()` ops end at `last_seq`, so the first is this many back.
        Some((last_seq + 1 - encoded.len() as u64, last_seq))
    }

    /// Applies a committed batch's ops with the one fold and answers from
    /// the mirror after it; asserts that the batch continues the mirror's
    /// seq and ends at the log's last seq. A fold refusal (a bug) poisons
    /// the write path and answers `Unavailable`: `None`.
    fn fold_batch(
        &mut self,
        first_seq: u64,
        last_seq: u64,
        ts_ms: u64,
        writes: Vec<Write>,
    ) -> Option<Folded> {
        let mut started_turns = Vec::new();
        let mut notices = Vec::new();
        let mut appended = KindTally::default();
        let mut answers: Vec<(Result<Outcome, EngineError>, Reply)> =
            Vec::with_capacity(writes.len());
        {
            let mut mirror = self.shared.mirror.write();
            // The batch continues the committed state: its first op follows
            // the mirror's seq, with no gap and no overlap.
            assert_eq!(
                first_seq,
                mirror.seq + 1,
                "a batch's first seq must follow the mirror's seq"
            );
            let mut seq = first_seq;
            for (ops, plan, reply) in writes {
                // A create's payload, handed back by the fold: its answer is
                // built from it (the strings moved, not copied back out of
                // the mirror).
                let mut created = None;
                for body in ops {
                    if let OpBody::TurnStart(t) = &body {
                        started_turns.push(t.id);
                    }
                    let op = Op {
                        erased: false,
                        seq,
                        ts_ms,
                        body,
                    };
                    seq += 1;
                    notices.push(super::ChangeNotice::of(&op));
                    appended.add(op.body.kind().name());
                    let applied = if matches!(plan, Plan::Created(_)) {
                        mirror.apply_keeping_create(op).map(|kept| {
                            if kept.is_some() {
                                created = kept;
                            }
                        })
                    } else {
                        mirror.apply(op)
                    };
                    if let Err(e) = applied {
                        // The sequencer decided an op the fold refuses: a bug.
                        // The op is durable but its effect is not published;
                        // restart replays it and reports the same refusal.
                        drop(mirror);
                        appended.count();
                        let reason = format!("the fold refused a committed op: {e}");
                        tracing::error!(%reason);
                        *self.shared.poison.lock() = Some(reason.clone());
                        let _ = reply.send(Err(EngineError::Unavailable(reason.clone())));
                        for (_, reply) in answers {
                            let _ = reply.send(Err(EngineError::Unavailable(reason.clone())));
                        }
                        return None;
                    }
                }
                let outcome = match (plan, created) {
                    (Plan::Created(id), Some(p)) if p.id == id => {
                        let moment = MomentView::of_create(p, ts_ms);
                        debug_assert_eq!(
                            Some(&moment),
                            mirror.moment(id).map(|m| mirror.moment_view(m)).as_ref(),
                            "a create's answer is the mirror's view of the moment it made"
                        );
                        Ok(Outcome::MomentCreated {
                            created: true,
                            replayed: None,
                            moment,
                        })
                    }
                    (plan, _) => plan.outcome(&mirror),
                };
                answers.push((outcome, reply));
            }
            // The fold applied exactly the ops the log appended, in order.
            assert_eq!(
                mirror.seq, last_seq,
                "after a batch's fold the mirror's seq must be the log's last seq"
            );
            *self.shared.head.lock() = self.log.head();
        }
        appended.count();
        Some(Folded {
            answers,
            notices,
            started_turns,
        })
    }

    /// Publishes a folded batch: the committed seq, the change notices, the
    /// started turns, then the answers.
    fn publish(&mut self, last_seq: u64, folded: Folded) {
        let Folded {
            answers,
            notices,
            started_turns,
        } = folded;
        self.shared.committed.send_replace(last_seq);
        // Every op of the batch has the chain value at its end (after the
        // commit mark) in its cursor: the log's head now.
        let chain = self.log.head().chain;
        let changes = notices
            .into_iter()
            .map(|notice| super::Change {
                cursor: spark_core::wire::events::EventCursor::at(notice.seq, &chain),
                notice,
            })
            .collect();
        // No subscriber is fine; a slow one lags, the writer never waits.
        let _ = self.shared.changes.send(Arc::new(changes));
        if !started_turns.is_empty() {
            if let Some(sink) = self.shared.turn_sink.lock().as_ref() {
                for id in started_turns {
                    let _ = sink.send(id);
                }
            }
        }
        self.answer(last_seq, answers);
    }

    /// Sends answers that depend on the committed state up to `seq`: at
    /// once, or in `sync` mode (an archive gate) the successes once `seq`
    /// is archived; refusals acknowledge nothing and go at once.
    fn answer(&self, seq: u64, answers: Vec<(Result<Outcome, EngineError>, Reply)>) {
        let Some(gate) = &self.shared.gate else {
            for (answer, reply) in answers {
                let _ = reply.send(answer);
            }
            return;
        };
        let mut held = Vec::with_capacity(answers.len());
        for (answer, reply) in answers {
            if answer.is_ok() {
                held.push((answer, reply));
            } else {
                let _ = reply.send(answer);
            }
        }
        gate.hold(seq, held);
    }

    /// Encodes the writes' ops, each checked against the log's record
    /// limit (see [`encode_fitting`]): refuses a command whose op cannot be
    /// a record, and poisons the write path on an op that does not encode.
    /// `None` when nothing is left to append.
    fn encode_batch(&mut self, writes: Vec<Write>) -> Option<(Vec<Encoded>, Vec<Write>)> {
        let max_record_bytes = self.log.config().max_record_bytes;
        let mut encoded = Vec::with_capacity(writes.len());
        let mut fitting = Vec::with_capacity(writes.len());
        for (mut ops, plan, reply) in writes {
            match encode_fitting(&mut ops, max_record_bytes) {
                Ok(Ok(mut ops_encoded)) => {
                    encoded.append(&mut ops_encoded);
                    fitting.push((ops, plan, reply));
                }
                // Too large for one record: this command is refused alone;
                // the write path goes on (the log refuses such a record
                // without writing, so it must not poison anything).
                Ok(Err(refusal)) => {
                    let _ = reply.send(Err(refusal));
                }
                Err(e) => {
                    // An op that does not encode is a bug; stop rather than
                    // acknowledge something the log does not hold.
                    fitting.push((ops, plan, reply));
                    self.poison_and_refuse(format!("op does not encode: {e}"), fitting);
                    return None;
                }
            }
        }
        if fitting.is_empty() {
            return None;
        }
        Some((encoded, fitting))
    }

    /// Decides a batch's commands against the committed mirror at one time
    /// `ts_ms`: answers what needs no write, and returns the writes. A
    /// command is deferred to the next batch when it shares a key with a
    /// command decided before it, or when the batch already holds
    /// `max_batch_ops` ops (a command's ops are never split, so a batch
    /// ends at most one command's ops past the cap).
    fn decide_batch(&mut self, batch: Vec<(super::Command, Reply)>) -> (u64, Vec<Write>) {
        // foldhash, not SipHash: still seeded at random per process, and the
        // set lives for one batch's decisions (at most `max_batch_ops`
        // commands), so request ids chosen to collide cannot build a chain.
        let mut touched: HashSet<Key, foldhash::fast::RandomState> =
            HashSet::with_capacity_and_hasher(batch.len() * 2, Default::default());
        let mut writes: Vec<Write> = Vec::new();
        let mut batch_ops = 0;
        let mirror = self.shared.mirror.read();
        // A checkpoint file the request index reads in place that was
        // written to (an operator's `cp` over it) could answer a retry with
        // another record, or miss it and write a duplicate: checked before
        // the first probe, and again below before anything is answered or
        // written (a file cut short is seen here, before a probe could read
        // past its end).
        if let Some(reason) = mirror.requests.mapped_file_changed() {
            drop(mirror);
            self.stop_for_changed_index(reason, batch.into_iter().map(|(_, reply)| reply));
            return (0, Vec::new());
        }
        // A known answer (a retry) is acknowledged once what it was read
        // from is: in `sync` mode, archived.
        let mut known = Vec::new();
        // Time never runs backwards in the log, whatever the wall clock does.
        let ts_ms = self.clock.now_ms().max(mirror.ts_ms);
        let mut mint = || Id::from_parts(ts_ms, rand::random::<u128>());
        for (command, reply) in batch {
            let keys = command.keys();
            if batch_ops >= self.max_batch_ops || keys.iter().any(|k| touched.contains(k)) {
                self.deferred.push_back((command, reply));
                continue;
            }
            touched.extend(keys);
            match decide(&mirror, command, ts_ms, &mut mint) {
                Decision::Answer(answer) => known.push((answer, reply)),
                Decision::Write(ops, plan) => {
                    batch_ops += ops.len();
                    writes.push((ops, plan, reply));
                }
            }
        }
        let committed_seq = mirror.seq;
        let changed = mirror.requests.mapped_file_changed();
        drop(mirror);
        if let Some(reason) = changed {
            let replies = known.into_iter().map(|(_, reply)| reply);
            let replies = replies.chain(writes.into_iter().map(|(_, _, reply)| reply));
            self.stop_for_changed_index(reason, replies);
            return (ts_ms, Vec::new());
        }
        self.answer(committed_seq, known);
        (ts_ms, writes)
    }

    /// Room for a batch of `writes` ops: the reserve admits its bytes
    /// ([`crate::disk::DiskSpace::admit_writes`]), and a log tail left by a
    /// write that failed for want of space is recovered first.
    /// Errors: `InsufficientStorage` (507) below the reserve or while the
    /// recovery itself lacks space (both counted as `disk_reserve`
    /// refusals); `Unavailable` when the recovery failed for good (the write
    /// path is then poisoned).
    fn space_for(&mut self, encoded: &[Encoded], writes: u64) -> Result<(), EngineError> {
        let bytes: u64 = encoded
            .iter()
            .map(|(_, _, payload)| payload.len() as u64 + RECORD_FRAME_BYTES)
            .sum();
        self.shared
            .disk
            .admit_writes(bytes + RECORD_FRAME_BYTES, writes)?;
        self.heal().inspect_err(|refusal| {
            if matches!(refusal, EngineError::InsufficientStorage(_)) {
                self.shared.disk.count_refused_for_reserve(writes);
            }
        })
    }

    /// Recovers the log's tail if a write failed for want of space
    /// ([`Log::heal`]); `Ok` when there is nothing to recover. Afterwards
    /// the log's head is the published head, which the mirror matches.
    fn heal(&mut self) -> Result<(), EngineError> {
        match self.log.heal() {
            Ok(None) => Ok(()),
            Ok(Some(report)) => {
                let head = self.log.head();
                let published = self.shared.head.lock().clone();
                let mirror_seq = self.shared.mirror.read().seq;
                if head.seq != mirror_seq || head.chain != published.chain {
                    // Log::heal checked the head against its own; this is a
                    // bug, and no write may follow it.
                    let reason = format!(
                        "after recovering the log's tail its head is seq {} (chain {}), but the mirror is at seq {mirror_seq} (chain {})",
                        head.seq,
                        head.chain_hex(),
                        published.chain_hex()
                    );
                    tracing::error!(%reason);
                    *self.shared.poison.lock() = Some(reason.clone());
                    return Err(EngineError::Unavailable(reason));
                }
                *self.shared.head.lock() = head;
                *self.shared.heal_pending.lock() = None;
                crate::metrics::get().log_heals.inc();
                tracing::info!(
                    seq = mirror_seq,
                    removed_segment = ?report.removed_segment,
                    "the log's tail is recovered after a full disk; the mirror matches it"
                );
                Ok(())
            }
            Err(e) if self.log.is_healable() => {
                let reason = e.to_string();
                *self.shared.heal_pending.lock() = Some(reason.clone());
                Err(EngineError::InsufficientStorage(format!(
                    "the log waits for disk space to recover its tail: {reason}"
                )))
            }
            Err(e) => {
                let reason = e.to_string();
                *self.shared.heal_pending.lock() = None;
                self.poison_and_refuse(reason.clone(), Vec::new());
                Err(EngineError::Unavailable(reason))
            }
        }
    }

    fn poison_and_refuse(&mut self, reason: String, writes: Vec<Write>) {
        self.poison_and_refuse_replies(reason, writes.into_iter().map(|(_, _, reply)| reply));
    }

    /// Stops the write path because the checkpoint file the request index
    /// reads in place changed (`reason`, from
    /// [`spark_core::request_index::RequestIndex::mapped_file_changed`]),
    /// refusing `replies` and every deferred command.
    fn stop_for_changed_index(&mut self, reason: String, replies: impl IntoIterator<Item = Reply>) {
        tracing::error!(%reason, "the write path is stopped until restart");
        self.poison_and_refuse_replies(reason, replies);
    }

    /// [`Self::poison_and_refuse`] for the replies alone.
    fn poison_and_refuse_replies(
        &mut self,
        reason: String,
        replies: impl IntoIterator<Item = Reply>,
    ) {
        *self.shared.poison.lock() = Some(reason.clone());
        for reply in replies {
            let _ = reply.send(Err(EngineError::Unavailable(reason.clone())));
        }
        let deferred: Vec<_> = self.deferred.drain(..).collect();
        for (_, reply) in deferred {
            let _ = reply.send(Err(EngineError::Unavailable(reason.clone())));
        }
    }
}

/// One encoded op: `(kind code, kind version, payload)`.
type Encoded = (u16, u16, Vec<u8>);

/// Bytes a record or commit mark adds to its payload in the log, rounded
/// up (frame header and checksum), for the reserve's estimate of a batch.
const RECORD_FRAME_BYTES: u64 = 64;

/// Encodes a command's ops, each checked against the log's record limit.
/// A brain's answer too large for one record becomes a `turn.fail` that
/// says so (the turn ends, and is not asked again after every restart); any
/// other op too large refuses the command with `Invalid` (400). The outer
/// error is an op that does not encode at all (a bug).
fn encode_fitting(
    ops: &mut [OpBody],
    max_record_bytes: u32,
) -> Result<Result<Vec<Encoded>, EngineError>, spark_core::codec::CodecError> {
    let mut encoded = Vec::with_capacity(ops.len());
    for body in ops.iter_mut() {
        let mut op = body.encode()?;
        if !spark_log_format::record_fits(op.2.len(), max_record_bytes) {
            let why = format!(
                "{} is {} bytes encoded, over the log's record limit of {max_record_bytes} bytes (log.max_record_bytes)",
                body.kind().name(),
                op.2.len()
            );
            let OpBody::TurnFinish(finish) = body else {
                return Ok(Err(EngineError::Invalid(why)));
            };
            *body = OpBody::TurnFail(spark_core::op::TurnFail {
                id: finish.id,
                error: format!("the brain's answer does not fit the log: {why}"),
                elapsed_ms: finish.elapsed_ms,
            });
            op = body.encode()?;
        }
        encoded.push(op);
    }
    Ok(Ok(encoded))
}

#[cfg(test)]
mod tests;
