//! The archive gate: `sync` mode's acknowledgments (SPEC section 11,
//! `archive/ARCHIVE.md` "Sync mode").
//!
//! In `sync` mode the journal writes and fdatasyncs a batch and applies it
//! to the mirror as in `async` mode, but instead of answering the batch's
//! writers it hands their answers to the gate with the batch's last seq
//! ([`ArchiveGate::hold`]) and wakes the shipper. The shipper ships as soon
//! as something is unshipped and no ship is in flight (so batches that
//! commit during a ship go in the next one: group commit over the archive),
//! and once a manifest naming seq S is stored it calls
//! [`ArchiveGate::archived`]`(S)`, which answers every held answer of a seq
//! up to S. A known answer (a retry of a write already committed, answered
//! from the mirror) is held at the committed seq it was read at, so a retry
//! is never acknowledged before the original's op is archived.
//!
//! Refusals (4xx, `507`, `503 unavailable`) are not held: they acknowledge
//! nothing.
//!
//! When shipping stops for good (the writer is fenced, or the engine shuts
//! down) the gate is closed with a reason ([`ArchiveGate::close`]): every
//! held answer, and every answer handed to it later, is replaced by that
//! error. A closed gate stays closed (the engine must be restarted); the
//! first reason wins. Nothing held is ever dropped without an answer.

use std::collections::VecDeque;

use parking_lot::Mutex;
use tokio::sync::{oneshot, Notify};

use spark_core::error::EngineError;
use spark_core::outcome::Outcome;

/// Where a writer waits for its answer.
pub type Reply = oneshot::Sender<Result<Outcome, EngineError>>;

/// An answer and where it goes.
pub type Held = (Result<Outcome, EngineError>, Reply);

/// Holds acknowledgments until the archive stores what they acknowledge
/// (see the module doc). One per engine opened in `sync` mode
/// ([`crate::engine::Engine::archive_gate`]).
#[derive(Debug, Default)]
pub struct ArchiveGate {
    state: Mutex<GateState>,
    /// Wakes the shipper: something was held that is not archived yet.
    wake: Notify,
}

#[derive(Debug, Default)]
struct GateState {
    /// The last seq a stored manifest names, as far as the gate was told.
    archived_seq: u64,
    /// Held answers by the seq they wait for, in increasing seq order (one
    /// entry per seq; [`ArchiveGate::hold`] inserts in place).
    waiting: VecDeque<(u64, Vec<Held>)>,
    /// Answers held right now (the sum over `waiting`).
    waiting_answers: usize,
    /// Set once shipping stopped for good: the error every answer gets.
    closed: Option<EngineError>,
}

impl ArchiveGate {
    /// An open gate that knows of nothing archived yet (the shipper tells it
    /// the latest manifest's seq when it starts).
    pub fn new() -> ArchiveGate {
        ArchiveGate::default()
    }

    /// Answers `answers` once the op at `seq` (and all before it) is named
    /// by a stored manifest: at once when it already is, with the gate's
    /// error when it is closed, else later from [`ArchiveGate::archived`]
    /// or [`ArchiveGate::close`]. Wakes the shipper when they wait.
    pub fn hold(&self, seq: u64, answers: Vec<Held>) {
        if answers.is_empty() {
            return;
        }
        let mut state = self.state.lock();
        if let Some(error) = state.closed.clone() {
            drop(state);
            answer_all(answers, Some(&error));
            return;
        }
        if seq <= state.archived_seq {
            drop(state);
            answer_all(answers, None);
            return;
        }
        state.waiting_answers += answers.len();
        // Holds come from more than one thread (the journal with each
        // batch's seq and the committed seq it read a known answer at,
        // handlers through `Engine::acknowledge` with the seq they read),
        // so a seq may be lower than the last one held: it goes in its
        // place, not behind a later seq it need not wait for.
        let at = state
            .waiting
            .partition_point(|(held_seq, _)| *held_seq < seq);
        match state.waiting.get_mut(at) {
            Some((held_seq, held)) if *held_seq == seq => held.extend(answers),
            _ => state.waiting.insert(at, (seq, answers)),
        }
        super::metrics::get()
            .waiting_writes
            .set(state.waiting_answers as i64);
        drop(state);
        self.wake.notify_one();
    }

    /// A manifest naming everything up to `seq` is stored: answers every
    /// held answer of a seq up to it. Called by the shipper; a lower seq
    /// than before changes nothing.
    pub fn archived(&self, seq: u64) {
        let mut released = Vec::new();
        {
            let mut state = self.state.lock();
            state.archived_seq = state.archived_seq.max(seq);
            while state
                .waiting
                .front()
                .is_some_and(|(held_seq, _)| *held_seq <= seq)
            {
                let (_, held) = state.waiting.pop_front().expect("front checked");
                state.waiting_answers -= held.len();
                released.push(held);
            }
            if !released.is_empty() {
                super::metrics::get()
                    .waiting_writes
                    .set(state.waiting_answers as i64);
            }
        }
        for held in released {
            answer_all(held, None);
        }
    }

    /// Closes the gate for good: every held answer, and every one handed to
    /// it later, is answered with `error` instead (their ops may be durable
    /// locally; they are not acknowledged). For the shipper when it stops
    /// (shutdown: `503 unavailable`) and for fencing (`503 fenced`). The
    /// first reason wins; later calls only answer what is held.
    pub fn close(&self, error: EngineError) {
        let (held, error) = {
            let mut state = self.state.lock();
            let error = state.closed.get_or_insert(error).clone();
            state.waiting_answers = 0;
            super::metrics::get().waiting_writes.set(0);
            (std::mem::take(&mut state.waiting), error)
        };
        for (_, answers) in held {
            answer_all(answers, Some(&error));
        }
        // A shipper waiting for work has none left here.
        self.wake.notify_one();
    }

    /// Why the gate is closed, if it is.
    pub fn closed(&self) -> Option<EngineError> {
        self.state.lock().closed.clone()
    }

    /// The last seq the gate was told is archived.
    pub fn archived_seq(&self) -> u64 {
        self.state.lock().archived_seq
    }

    /// Answers held right now, waiting for the archive.
    pub fn waiting_answers(&self) -> usize {
        self.state.lock().waiting_answers
    }

    /// Resolves once something was held since the last call (a permit is
    /// kept when nobody waits): what the shipper waits on in `sync` mode.
    pub(crate) async fn wanted(&self) {
        self.wake.notified().await;
    }
}

/// What a write still waiting for the archive is answered when shipping
/// stops at shutdown (`503 unavailable`): its op is durable on this
/// machine, and archived after the restart, when a retry with the same ids
/// is acknowledged.
pub fn shutting_down() -> EngineError {
    EngineError::Unavailable(
        "the engine shut down before the archive stored this write: it is durable on this machine and is archived after the restart; retry with the same ids".into(),
    )
}

/// Sends each answer, or `error` in place of each when given.
fn answer_all(answers: Vec<Held>, error: Option<&EngineError>) {
    for (answer, reply) in answers {
        let _ = reply.send(match error {
            Some(error) => Err(error.clone()),
            None => answer,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held() -> (Held, oneshot::Receiver<Result<Outcome, EngineError>>) {
        let (reply, answer) = oneshot::channel();
        (
            (Err(EngineError::Invalid("the answer".into())), reply),
            answer,
        )
    }

    fn answer_of(
        answer: &mut oneshot::Receiver<Result<Outcome, EngineError>>,
    ) -> Option<Result<Outcome, EngineError>> {
        answer.try_recv().ok()
    }

    #[test]
    fn answers_wait_for_their_seq_and_a_closed_gate_fails_them() {
        let gate = ArchiveGate::new();
        let (a, mut a_answer) = held();
        let (b, mut b_answer) = held();
        let (c, mut c_answer) = held();
        gate.hold(3, vec![a]);
        gate.hold(5, vec![b]);
        gate.hold(5, vec![c]);
        assert_eq!(gate.waiting_answers(), 3);
        gate.archived(4);
        assert_eq!(
            answer_of(&mut a_answer),
            Some(Err(EngineError::Invalid("the answer".into())))
        );
        assert_eq!(answer_of(&mut b_answer), None);
        assert_eq!(gate.waiting_answers(), 2);
        // Lower seqs never move it back.
        gate.archived(2);
        assert_eq!(gate.archived_seq(), 4);
        // Already archived: answered at once.
        let (d, mut d_answer) = held();
        gate.hold(4, vec![d]);
        assert!(answer_of(&mut d_answer).is_some());
        gate.close(EngineError::Unavailable("fenced".into()));
        gate.close(EngineError::Unavailable("second reason".into()));
        let fenced = Some(Err(EngineError::Unavailable("fenced".into())));
        assert_eq!(answer_of(&mut b_answer), fenced);
        assert_eq!(answer_of(&mut c_answer), fenced);
        let (e, mut e_answer) = held();
        gate.hold(9, vec![e]);
        assert_eq!(answer_of(&mut e_answer), fenced);
        assert_eq!(gate.waiting_answers(), 0);
    }

    #[test]
    fn a_lower_seq_held_after_a_higher_one_waits_only_for_its_own() {
        let gate = ArchiveGate::new();
        let (batch, mut batch_answer) = held();
        let (retry, mut retry_answer) = held();
        let (same, mut same_answer) = held();
        // The journal holds a batch at 7, then a handler an answer it
        // read at the committed seq 4 (`Engine::acknowledge`).
        gate.hold(7, vec![batch]);
        gate.hold(4, vec![retry]);
        gate.hold(7, vec![same]);
        gate.archived(5);
        assert!(answer_of(&mut retry_answer).is_some());
        assert_eq!(answer_of(&mut batch_answer), None);
        assert_eq!(gate.waiting_answers(), 2);
        gate.archived(7);
        assert!(answer_of(&mut batch_answer).is_some());
        assert!(answer_of(&mut same_answer).is_some());
        assert_eq!(gate.waiting_answers(), 0);
    }
}
