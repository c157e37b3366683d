//! The journal: the write path's two threads. The decider
//! (`spark-journal`) takes commands off the queue and decides them against
//! the published mirror; the committer (`spark-commit`) owns the [`Log`],
//! the only code that appends to it or applies ops to the mirror.
//!
//! The cycle is a pipeline of depth two: while the committer appends batch
//! N (one write call and one fdatasync: group commit), applies it with the
//! one fold, publishes the new head and answers, the decider takes the
//! commands queued by then (woken by the first), decides and encodes them
//! into batch N+1, and waits for the committer. Once N is folded the
//! committer says so; the decider adds the commands queued meanwhile to
//! N+1 (up to `group_commit_max_ops` ops; the rest wait for the next
//! batch) and hands it over: at most one batch is with the committer, and
//! N+1's answers go after N's. The decider wakes twice per batch, not once
//! per command. A batch of one write with nothing else queued and nothing
//! in flight has nothing to overlap with: the decider commits it itself
//! (the same code, under the same lock), sparing a lone writer the
//! committer's wake-up.
//!
//! A decision reads only the state under its command's keys
//! ([`Command::keys`](spark_core::command::Command::keys)), so deciding N+1
//! against a mirror without N's ops is exact for every command that shares
//! no key with N: those that do (a retry of a create whose batch is being
//! synced, an edit of a moment it creates) are deferred to the next batch,
//! in arrival order, as are commands sharing a key with one of the batch
//! being filled or with a deferred one. A deferred command is decided once
//! the batch it waited for is in the mirror, so it sees that batch's
//! effects; nothing is answered before the fdatasync covering it returned.
//! `ts_ms` never runs backwards: each batch's time is at least the last
//! batch handed over.
//!
//! An append error poisons the write path: nothing of that batch is
//! acknowledged, the batch decided behind it is refused by the committer,
//! and every later command is answered `Unavailable` by the decider until a
//! restart recovers from what is on disk. The failed fsync is never retried
//! (DESIGN.md, "The write path", step 5).
//!
//! Disk space (issue 19): a batch is refused with `InsufficientStorage`
//! (507) when the free space after it would be below the reserve
//! (`log.disk_reserve_bytes`, [`crate::disk`]). A batch whose *write* fails
//! for want of space anyway (another program filled the disk) is answered
//! `InsufficientStorage`, never acknowledged; the log's tail is then
//! recovered in process ([`Log::heal`]: the same recovery as at startup,
//! after zeroing what the failed write left) and writes resume with no
//! restart, the mirror untouched (it only ever holds acknowledged ops). The
//! batch decided behind a refused one never depended on it (no shared key),
//! so it goes on.

use std::collections::{HashSet, VecDeque};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use spark_log_format::{Log, LogError, RecordIn};
use tokio::sync::{mpsc, oneshot};

use crate::clock::Clock;
use crate::ids::Id;
use crate::op::{Op, OpBody};

use super::{EngineError, Job, Outcome, Shared};
use spark_core::command::Key;
use spark_core::rules::{decide, Decision, Plan};

type Reply = oneshot::Sender<Result<Outcome, EngineError>>;

/// A decided command: its ops, how to answer, and where.
type Write = (Vec<OpBody>, Plan, Reply);

/// The keys of one batch's commands. foldhash, not SipHash: still seeded at
/// random per process, and a set lives for at most two batches' decisions
/// (at most `max_batch_ops` commands each), so request ids chosen to
/// collide cannot build a chain.
type KeySet = HashSet<Key, foldhash::fast::RandomState>;

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

/// A decided and encoded batch on its way from the decider to the
/// committer: every op is stamped `ts_ms`.
struct Batch {
    ts_ms: u64,
    encoded: Vec<Encoded>,
    writes: Vec<Write>,
}

/// The batch the decider is filling while the committer is busy.
struct Pending {
    /// The batch's time: every op of it is stamped with it.
    ts_ms: u64,
    /// Ops decided into it (`max_batch_ops` caps it).
    ops: usize,
    encoded: Vec<Encoded>,
    writes: Vec<Write>,
    /// The keys of its writes' commands.
    written: KeySet,
    /// The keys of its commands answered at once (no later command with
    /// one of them joins the batch).
    answered: KeySet,
}

/// Starts the write path's two threads: the decider (`spark-journal`,
/// whose handle this returns; it stops the committer and waits for it
/// before it ends) and the committer (`spark-commit`), which owns `log`.
pub(super) fn spawn(
    log: Log,
    shared: Arc<Shared>,
    queue: mpsc::Receiver<Job>,
    clock: Arc<dyn Clock>,
    max_batch_ops: usize,
) -> std::io::Result<JoinHandle<()>> {
    // Capacity 1: the decider hands a batch over only once the one before
    // it is folded, so the send never waits.
    let (batches, received) = std_mpsc::sync_channel::<Batch>(1);
    let (folded, committed) = std_mpsc::channel::<()>();
    let max_record_bytes = log.config().max_record_bytes;
    let committer = Arc::new(Mutex::new(Committer {
        log,
        shared: Arc::clone(&shared),
    }));
    let committer_thread = {
        let committer = Arc::clone(&committer);
        std::thread::Builder::new()
            .name("spark-commit".into())
            .spawn(move || commit_all(&committer, received, folded))?
    };
    std::thread::Builder::new()
        .name("spark-journal".into())
        .spawn(move || {
            Journal {
                shared,
                clock,
                max_batch_ops,
                max_record_bytes,
                deferred: VecDeque::new(),
                deferred_keys: KeySet::default(),
                pending: None,
                in_flight: None,
                last_ts_ms: 0,
                batches: Some(batches),
                committed,
                committer,
            }
            .run(queue);
            match committer_thread.join() {
                Ok(seq) => tracing::info!(seq, "journal stopped"),
                Err(_) => tracing::error!("the journal's committer thread panicked"),
            }
        })
}

/// The decider: decides and encodes commands as they arrive, and hands
/// each batch to the committer as soon as it is free.
struct Journal {
    /// The published mirror, head and poison flag.
    shared: Arc<Shared>,
    /// Stamps ops (`ts_ms`) and mints ids.
    clock: Arc<dyn Clock>,
    /// Most ops per group-commit batch (`log.group_commit_max_ops`): a
    /// batch takes no more commands once it holds this many ops.
    max_batch_ops: usize,
    /// The log's record limit (`log.max_record_bytes`), checked at encode.
    max_record_bytes: u32,
    /// Commands that shared a key with the batch in flight, the pending
    /// batch or an earlier deferred command, or came when the pending
    /// batch was full; decided again, in arrival order, once the batch in
    /// flight is done.
    deferred: VecDeque<(super::Command, Reply)>,
    /// The keys of the deferred commands: a later command sharing one is
    /// deferred too, so that it does not overtake.
    deferred_keys: KeySet,
    /// The batch being decided while the committer is busy.
    pending: Option<Pending>,
    /// The keys of the writes of the batch with the committer, until the
    /// decider knows it is folded (or refused).
    in_flight: Option<KeySet>,
    /// `ts_ms` of the last batch handed over: no later batch is older.
    last_ts_ms: u64,
    /// Where batches go; `None` once the committer is gone.
    batches: Option<std_mpsc::SyncSender<Batch>>,
    /// One message per batch the committer is done with: folded into the
    /// mirror, or refused.
    committed: std_mpsc::Receiver<()>,
    /// The committer's state, for a lone write committed on this thread
    /// (see [`Journal::hand_over`]).
    committer: Arc<Mutex<Committer>>,
}

impl Journal {
    fn run(mut self, mut queue: mpsc::Receiver<Job>) {
        let mut stopping = false;
        loop {
            self.settle(false);
            if self.in_flight.is_none() && (self.pending.is_some() || !self.deferred.is_empty()) {
                // The committer is free: the deferred commands, then what
                // queued meanwhile, join the pending batch before it goes.
                if !self.deferred.is_empty() {
                    let deferred: Vec<_> = self.deferred.drain(..).collect();
                    self.deferred_keys.clear();
                    self.decide(deferred);
                }
                let queued = self.gather(&mut queue, None, &mut stopping);
                if !queued.is_empty() {
                    self.decide(queued);
                }
                if let Some(pending) = self.pending.take() {
                    self.hand_over(pending, queue.is_empty());
                }
                continue;
            }
            if stopping {
                if self.in_flight.is_none() && self.pending.is_none() && self.deferred.is_empty() {
                    break;
                }
                self.settle(true);
                continue;
            }
            if self.in_flight.is_some() && (self.pending.is_some() || !self.deferred.is_empty()) {
                // Something waits for the committer: wait for it, rather
                // than wake for every command that arrives meanwhile (they
                // join at the hand-over).
                self.settle(true);
                continue;
            }
            let first = queue.blocking_recv();
            let arrived = self.gather(&mut queue, Some(first), &mut stopping);
            if !arrived.is_empty() {
                self.decide(arrived);
            }
        }
        self.batches = None;
        // Anything queued after the stop is refused, never dropped silently.
        queue.close();
        while let Ok(job) = queue.try_recv() {
            if let Job::Command { reply, .. } = job {
                let _ = reply.send(Err(EngineError::Unavailable(
                    "the engine is shutting down".into(),
                )));
            }
        }
    }

    /// The commands queued right now (after `first`, a job already
    /// received, if given; `None` in it means the queue closed), up to
    /// `max_batch_ops` of them; sets `stopping` at a stop.
    fn gather(
        &self,
        queue: &mut mpsc::Receiver<Job>,
        first: Option<Option<Job>>,
        stopping: &mut bool,
    ) -> Vec<(super::Command, Reply)> {
        let mut arrived = Vec::new();
        // After a stop, what is still queued is refused, not decided.
        if *stopping {
            return arrived;
        }
        let mut next = match first {
            Some(job) => Some(job),
            None => queue.try_recv().ok().map(Some),
        };
        while let Some(job) = next {
            match job {
                Some(Job::Command { command, reply }) => arrived.push((command, reply)),
                Some(Job::Stop) | None => *stopping = true,
            }
            if *stopping || arrived.len() >= self.max_batch_ops {
                break;
            }
            next = queue.try_recv().ok().map(Some);
        }
        arrived
    }

    /// Hands a decided batch to the free committer. A batch of one write
    /// with nothing else queued has nothing to overlap with: this thread
    /// commits it itself, which spares the committer's wake-up (a lone
    /// writer's latency).
    fn hand_over(&mut self, pending: Pending, queue_empty: bool) {
        let Pending {
            ts_ms,
            encoded,
            writes,
            written,
            ..
        } = pending;
        self.last_ts_ms = ts_ms;
        let batch = Batch {
            ts_ms,
            encoded,
            writes,
        };
        if batch.writes.len() == 1 && queue_empty {
            let mut committer = self.committer.lock();
            if let Some((last_seq, folded)) = committer.commit(batch) {
                publish(&self.shared, last_seq, folded);
            }
            return;
        }
        let Some(batches) = &self.batches else {
            refuse_writes(batch.writes, "the journal's committer stopped");
            return;
        };
        if let Err(std_mpsc::SendError(lost)) = batches.send(batch) {
            self.batches = None;
            refuse_writes(lost.writes, "the journal's committer stopped");
            return;
        }
        self.in_flight = Some(written);
    }

    /// Forgets the batch in flight once the committer is done with it:
    /// waits for that when `wait`, else only looks.
    fn settle(&mut self, wait: bool) {
        if self.in_flight.is_none() {
            return;
        }
        // A committer that is gone (it panicked) is done too.
        let done = match wait {
            true => {
                let _ = self.committed.recv();
                true
            }
            false => !matches!(
                self.committed.try_recv(),
                Err(std_mpsc::TryRecvError::Empty)
            ),
        };
        if done {
            self.in_flight = None;
        }
    }

    /// Decides `commands` into the pending batch against the committed
    /// mirror, at the pending batch's time: answers what needs no write at
    /// once and encodes the writes. A command is deferred when it shares a
    /// key with the batch in flight, a command of the pending batch or a
    /// deferred command, or when the pending batch already holds
    /// `max_batch_ops` ops (a command's ops are never split, so a batch
    /// ends at most one command's ops past the cap). On a poisoned write
    /// path everything waiting is refused.
    fn decide(&mut self, commands: Vec<(super::Command, Reply)>) {
        let poisoned = self.shared.poison.lock().clone();
        if let Some(reason) = poisoned {
            self.refuse_all(commands, &reason);
            return;
        }
        let mirror = self.shared.mirror.read();
        // A known answer (a retry) is acknowledged once what it was read
        // from is: in `sync` mode, archived.
        let mut known = Vec::new();
        // Time never runs backwards in the log, whatever the wall clock
        // does; the batch in flight is not in the mirror yet.
        let (clock, last_ts_ms) = (&self.clock, self.last_ts_ms);
        let pending = self.pending.get_or_insert_with(|| Pending {
            ts_ms: clock.now_ms().max(mirror.ts_ms).max(last_ts_ms),
            ops: 0,
            encoded: Vec::with_capacity(commands.len()),
            writes: Vec::with_capacity(commands.len()),
            written: KeySet::with_capacity_and_hasher(commands.len() * 2, Default::default()),
            answered: KeySet::default(),
        });
        let ts_ms = pending.ts_ms;
        let mut mint = || Id::from_parts(ts_ms, rand::random::<u128>());
        let in_flight = self.in_flight.as_ref();
        let mut unencodable = None;
        for (command, reply) in commands {
            let keys = command.keys();
            let taken = |k: &Key| {
                pending.written.contains(k)
                    || pending.answered.contains(k)
                    || self.deferred_keys.contains(k)
                    || in_flight.is_some_and(|keys| keys.contains(k))
            };
            if unencodable.is_some() || pending.ops >= self.max_batch_ops || keys.iter().any(taken)
            {
                self.deferred_keys.extend(keys);
                self.deferred.push_back((command, reply));
                continue;
            }
            let (mut ops, plan) = match decide(&mirror, command, ts_ms, &mut mint) {
                Decision::Answer(answer) => {
                    pending.answered.extend(keys);
                    known.push((answer, reply));
                    continue;
                }
                Decision::Write(ops, plan) => (ops, plan),
            };
            match encode_fitting(&mut ops, self.max_record_bytes) {
                Ok(Ok(mut encoded)) => {
                    pending.ops += ops.len();
                    pending.encoded.append(&mut encoded);
                    pending.writes.push((ops, plan, reply));
                    pending.written.extend(keys);
                }
                // Too large for one record: this command is refused alone;
                // the write path goes on (the log refuses such a record
                // without writing, so it must not poison anything).
                Ok(Err(refusal)) => {
                    let _ = reply.send(Err(refusal));
                }
                // An op that does not encode is a bug; stop rather than
                // acknowledge something the log does not hold.
                Err(e) => {
                    let _ = reply.send(Err(EngineError::Unavailable(format!(
                        "op does not encode: {e}"
                    ))));
                    unencodable = Some(format!("op does not encode: {e}"));
                }
            }
        }
        let committed_seq = mirror.seq;
        drop(mirror);
        answer(&self.shared, committed_seq, known);
        if let Some(reason) = unencodable {
            poison_and_refuse(&self.shared, reason.clone(), Vec::new());
            self.refuse_all(Vec::new(), &reason);
            return;
        }
        if self.pending.as_ref().is_some_and(|p| p.writes.is_empty()) {
            self.pending = None;
        }
    }

    /// Refuses `commands`, the pending batch and the deferred commands
    /// with `Unavailable`: the write path is poisoned.
    fn refuse_all(&mut self, commands: Vec<(super::Command, Reply)>, reason: &str) {
        if let Some(pending) = self.pending.take() {
            refuse_writes(pending.writes, reason);
        }
        self.deferred_keys.clear();
        for (_, reply) in commands.into_iter().chain(self.deferred.drain(..)) {
            let _ = reply.send(Err(EngineError::Unavailable(reason.to_owned())));
        }
    }
}

/// The committer thread: commits every batch received until the decider
/// drops its sender; tells the decider over `folded` when each is folded
/// (or refused), then publishes and answers it. Returns the log's last
/// seq.
fn commit_all(
    committer: &Mutex<Committer>,
    received: std_mpsc::Receiver<Batch>,
    folded: std_mpsc::Sender<()>,
) -> u64 {
    for batch in received {
        // Held through the answers: the decider's own commit of a lone
        // write waits for this batch's to be published first.
        let mut committer = committer.lock();
        let committed = committer.commit(batch);
        // The decider may hand the next batch over now: this one is in
        // the mirror. Its answers go before that batch's.
        let _ = folded.send(());
        if let Some((last_seq, folded)) = committed {
            publish(&committer.shared, last_seq, folded);
        }
    }
    committer.lock().log.last_seq()
}

/// The committer: appends, folds, publishes and answers each batch the
/// decider hands over, in order.
struct Committer {
    /// The appender; nothing else writes the log.
    log: Log,
    /// The published mirror, head and poison flag.
    shared: Arc<Shared>,
}

impl Committer {
    /// Appends and folds one batch; `None` when it was refused (every
    /// write answered).
    fn commit(&mut self, batch: Batch) -> Option<(u64, Folded)> {
        let Batch {
            ts_ms,
            encoded,
            mut writes,
        } = batch;
        // The batch before this one failed after it was decided.
        if let Some(reason) = self.shared.poison.lock().clone() {
            refuse_writes(writes, &reason);
            return None;
        }
        if let Err(refusal) = self.space_for(&encoded) {
            let metrics = crate::metrics::get();
            if matches!(refusal, EngineError::InsufficientStorage(_)) {
                metrics
                    .writes_refused
                    .get_or_create(&crate::metrics::label("reason", "disk_reserve"))
                    .inc_by(writes.len() as u64);
            }
            for (_, _, reply) in writes {
                let _ = reply.send(Err(refusal.clone()));
            }
            return None;
        }
        let (first_seq, last_seq) = self.append(ts_ms, encoded, &mut writes)?;
        let folded = self.fold_batch(first_seq, last_seq, ts_ms, writes)?;
        Some((last_seq, folded))
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
                let refusal = EngineError::InsufficientStorage(format!(
                    "the disk is full ({e}); nothing of this write was kept, and writes resume by themselves once space is freed"
                ));
                metrics
                    .writes_refused
                    .get_or_create(&crate::metrics::label("reason", "disk_full"))
                    .inc_by(writes.len() as u64);
                for (_, _, reply) in writes.drain(..) {
                    let _ = reply.send(Err(refusal.clone()));
                }
                self.shared.disk.note_full();
                let _ = self.heal();
                return None;
            }
            Err(e) => {
                tracing::error!(error = %e, "append failed; the write path is stopped until restart");
                poison_and_refuse(&self.shared, e.to_string(), std::mem::take(writes));
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
                for body in ops {
                    if let OpBody::TurnStart(t) = &body {
                        started_turns.push(t.id);
                    }
                    let op = Op { seq, ts_ms, body };
                    seq += 1;
                    notices.push(super::ChangeNotice::of(&op));
                    appended.add(op.body.kind().name());
                    if let Err(e) = mirror.apply(op) {
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
                answers.push((plan.outcome(&mirror), reply));
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

    /// Room for a batch: the reserve admits its bytes, and a log tail left
    /// by a write that failed for want of space is recovered first.
    /// Errors: `InsufficientStorage` (507) below the reserve or while the
    /// recovery itself lacks space; `Unavailable` when the recovery failed
    /// for good (the write path is then poisoned).
    fn space_for(&mut self, encoded: &[Encoded]) -> Result<(), EngineError> {
        let bytes: u64 = encoded
            .iter()
            .map(|(_, _, payload)| payload.len() as u64 + RECORD_FRAME_BYTES)
            .sum();
        self.shared.disk.admit(bytes + RECORD_FRAME_BYTES)?;
        self.heal()
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
                poison_and_refuse(&self.shared, reason.clone(), Vec::new());
                Err(EngineError::Unavailable(reason))
            }
        }
    }
}

/// Publishes a folded batch: the committed seq, the change notices, the
/// started turns, then the answers.
fn publish(shared: &Shared, last_seq: u64, folded: Folded) {
    let Folded {
        answers,
        notices,
        started_turns,
    } = folded;
    shared.committed.send_replace(last_seq);
    // No subscriber is fine; a slow one lags, the writer never waits.
    let _ = shared.changes.send(Arc::new(notices));
    if !started_turns.is_empty() {
        if let Some(sink) = shared.turn_sink.lock().as_ref() {
            for id in started_turns {
                let _ = sink.send(id);
            }
        }
    }
    answer(shared, last_seq, answers);
}

/// Sends answers that depend on the committed state up to `seq`: at once,
/// or in `sync` mode (an archive gate) the successes once `seq` is
/// archived; refusals acknowledge nothing and go at once.
fn answer(shared: &Shared, seq: u64, answers: Vec<(Result<Outcome, EngineError>, Reply)>) {
    let Some(gate) = &shared.gate else {
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

/// Answers every write `Unavailable` with `reason`.
fn refuse_writes(writes: Vec<Write>, reason: &str) {
    for (_, _, reply) in writes {
        let _ = reply.send(Err(EngineError::Unavailable(reason.to_owned())));
    }
}

/// Stops the write path for good with `reason` and refuses `writes`; the
/// decider refuses everything after (commands it deferred included).
fn poison_and_refuse(shared: &Shared, reason: String, writes: Vec<Write>) {
    *shared.poison.lock() = Some(reason.clone());
    refuse_writes(writes, &reason);
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
) -> Result<Result<Vec<Encoded>, EngineError>, crate::codec::CodecError> {
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
            *body = OpBody::TurnFail(crate::op::TurnFail {
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
