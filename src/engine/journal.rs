//! The journal: the one writer thread. It owns the [`Log`] and is the only
//! code that appends to it or applies ops to the published mirror.
//!
//! Each turn of the loop takes the commands queued right now (at least one,
//! at most `group_commit_max_ops`), decides them, appends the ops with one
//! write call and one fdatasync (group commit), applies them with the one
//! fold, publishes the new head, and answers. An append error poisons the
//! write path: nothing of that batch is acknowledged, and every later command
//! is answered `Unavailable` until a restart recovers from what is on disk.
//! The failed fsync is never retried (DESIGN.md, "The write path", step 5).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;

use spark_log_format::{Log, LogError, RecordIn};
use tokio::sync::{mpsc, oneshot};

use crate::clock::Clock;
use crate::ids::Id;
use crate::op::{Op, OpBody};

use super::sequencer::{decide, Decision, Key, Plan};
use super::{EngineError, Job, Outcome, Shared};

type Reply = oneshot::Sender<Result<Outcome, EngineError>>;

/// Starts the writer thread (named `spark-journal`).
pub(super) fn spawn(
    log: Log,
    shared: Arc<Shared>,
    queue: mpsc::Receiver<Job>,
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
    /// Most ops per group-commit batch.
    max_batch_ops: usize,
    /// Commands that shared a key with an op of the previous batch; they go
    /// first in the next one, in arrival order.
    deferred: VecDeque<(super::Command, Reply)>,
}

impl Journal {
    fn run(mut self, mut queue: mpsc::Receiver<Job>) {
        let mut stopping = false;
        loop {
            let mut batch: Vec<(super::Command, Reply)> = self.deferred.drain(..).collect();
            if batch.is_empty() {
                if stopping {
                    break;
                }
                match queue.blocking_recv() {
                    Some(Job::Command { command, reply }) => batch.push((command, reply)),
                    Some(Job::Stop) | None => stopping = true,
                }
            }
            while !stopping && batch.len() < self.max_batch_ops {
                match queue.try_recv() {
                    Ok(Job::Command { command, reply }) => batch.push((command, reply)),
                    Ok(Job::Stop) => stopping = true,
                    Err(_) => break,
                }
            }
            if !batch.is_empty() {
                self.commit_batch(batch);
            }
        }
        // Anything queued after the stop is refused, never dropped silently.
        queue.close();
        while let Ok(job) = queue.try_recv() {
            if let Job::Command { reply, .. } = job {
                let _ = reply.send(Err(EngineError::Unavailable(
                    "the engine is shutting down".into(),
                )));
            }
        }
        tracing::info!(seq = self.log.last_seq(), "journal stopped");
    }

    fn commit_batch(&mut self, batch: Vec<(super::Command, Reply)>) {
        if let Some(reason) = self.shared.poison.lock().clone() {
            for (_, reply) in batch {
                let _ = reply.send(Err(EngineError::Unavailable(reason.clone())));
            }
            return;
        }
        let mut touched: HashSet<Key> = HashSet::new();
        let mut writes: Vec<(Vec<OpBody>, Plan, Reply)> = Vec::new();
        let ts_ms;
        {
            let mirror = self.shared.mirror.read();
            // Time never runs backwards in the log, whatever the wall clock does.
            ts_ms = self.clock.now_ms().max(mirror.ts_ms);
            let mut mint = || Id::from_parts(ts_ms, rand::random::<u128>());
            for (command, reply) in batch {
                let keys = command.keys();
                if keys.iter().any(|k| touched.contains(k)) {
                    self.deferred.push_back((command, reply));
                    continue;
                }
                touched.extend(keys);
                match decide(&mirror, command, ts_ms, &mut mint) {
                    Decision::Answer(answer) => {
                        let _ = reply.send(answer);
                    }
                    Decision::Write(ops, plan) => writes.push((ops, plan, reply)),
                }
            }
        }
        if writes.is_empty() {
            return;
        }
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
                    return;
                }
            }
        }
        let writes = fitting;
        if writes.is_empty() {
            return;
        }
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
                for (_, _, reply) in writes {
                    let _ = reply.send(Err(EngineError::Invalid(e.to_string())));
                }
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, "append failed; the write path is stopped until restart");
                self.poison_and_refuse(e.to_string(), writes);
                return;
            }
        };
        drop(records);
        // `encoded.len()` ops end at `last_seq`, so the first is this many back.
        let first_seq = last_seq + 1 - encoded.len() as u64;
        drop(encoded);
        let mut started_turns = Vec::new();
        let mut notices = Vec::new();
        // Ops by kind, counted into the metrics once per kind after the
        // mirror's write lock is released (a labelled counter costs a few
        // allocations and a hash lookup).
        let mut appended: Vec<(&'static str, u64)> = Vec::new();
        let count_appended = |appended: &[(&'static str, u64)]| {
            for (kind, n) in appended {
                metrics
                    .ops_appended
                    .get_or_create(&crate::metrics::label("kind", kind))
                    .inc_by(*n);
            }
        };
        let mut answers: Vec<(Result<Outcome, EngineError>, Reply)> =
            Vec::with_capacity(writes.len());
        {
            let mut mirror = self.shared.mirror.write();
            let mut seq = first_seq;
            for (ops, plan, reply) in writes {
                for body in ops {
                    if let OpBody::TurnStart(t) = &body {
                        started_turns.push(t.id);
                    }
                    let op = Op { seq, ts_ms, body };
                    seq += 1;
                    notices.push(super::ChangeNotice::of(&op));
                    let kind = op.body.kind().name();
                    match appended.iter_mut().find(|(k, _)| *k == kind) {
                        Some((_, n)) => *n += 1,
                        None => appended.push((kind, 1)),
                    }
                    if let Err(e) = mirror.apply(op) {
                        // The sequencer decided an op the fold refuses: a bug.
                        // The op is durable but its effect is not published;
                        // restart replays it and reports the same refusal.
                        drop(mirror);
                        count_appended(&appended);
                        let reason = format!("the fold refused a committed op: {e}");
                        tracing::error!(%reason);
                        *self.shared.poison.lock() = Some(reason.clone());
                        let _ = reply.send(Err(EngineError::Unavailable(reason.clone())));
                        for (_, reply) in answers {
                            let _ = reply.send(Err(EngineError::Unavailable(reason.clone())));
                        }
                        return;
                    }
                }
                answers.push((plan.outcome(&mirror), reply));
            }
            *self.shared.head.lock() = self.log.head();
        }
        count_appended(&appended);
        self.shared.committed.send_replace(last_seq);
        // No subscriber is fine; a slow one lags, the writer never waits.
        let _ = self.shared.changes.send(Arc::new(notices));
        if !started_turns.is_empty() {
            if let Some(sink) = self.shared.turn_sink.lock().as_ref() {
                for id in started_turns {
                    let _ = sink.send(id);
                }
            }
        }
        for (answer, reply) in answers {
            let _ = reply.send(answer);
        }
    }

    fn poison_and_refuse(&mut self, reason: String, writes: Vec<(Vec<OpBody>, Plan, Reply)>) {
        *self.shared.poison.lock() = Some(reason.clone());
        for (_, _, reply) in writes {
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
