//! What the rules' and the fold's unit tests share: a mirror built by
//! folding ops, commands decided against it, and their ops folded in.

use super::{decide, Decision};
use crate::command::{Command, CreateMoment, PutMedia};
use crate::error::EngineError;
use crate::ids::Id;
use crate::mirror::Mirror;
use crate::op::{MediaRole, MomentCreate, Op, OpBody};
use crate::outcome::Outcome;

/// The server clock of every test, Unix ms (2026-01-01).
pub(crate) const NOW_MS: u64 = 1_767_225_600_000;

/// The device every test command names.
pub(crate) const DEVICE: &str = "test";

/// The id minted at `NOW_MS` with random part `n`.
pub(crate) fn id(n: u128) -> Id {
    Id::from_parts(NOW_MS, n)
}

/// Folds `body` as the op after the mirror's (seq + 1, server time
/// `NOW_MS + seq`); panics if the fold refuses it.
pub(crate) fn apply(mirror: &mut Mirror, body: OpBody) {
    let seq = mirror.seq + 1;
    mirror
        .apply(Op {
            erased: false,
            seq,
            ts_ms: NOW_MS + seq,
            body,
        })
        .unwrap();
}

/// A mirror built by folding `bodies` from seq 1.
pub(crate) fn folded(bodies: impl IntoIterator<Item = OpBody>) -> Mirror {
    let mut mirror = Mirror::new();
    for body in bodies {
        apply(&mut mirror, body);
    }
    mirror
}

/// The `moment.create` of moment `id(n)` with an optional request id.
pub(crate) fn create_op(n: u128, request_id: Option<&str>) -> OpBody {
    OpBody::MomentCreate(MomentCreate {
        id: id(n),
        request_id: request_id.map(str::to_owned),
        device: DEVICE.into(),
        text: None,
        caption: None,
        lang: None,
        captured_at_ms: None,
    })
}

/// Folds the create of moment `id(n)` (no request id) and returns its id.
pub(crate) fn moment(mirror: &mut Mirror, n: u128) -> Id {
    apply(mirror, create_op(n, None));
    id(n)
}

/// Folds a `moment.delete` of `moment` (no request id, device [`DEVICE`]).
pub(crate) fn delete_moment(mirror: &mut Mirror, moment: Id) {
    apply(
        mirror,
        OpBody::MomentDelete(crate::op::MomentDelete {
            id: moment,
            request_id: None,
            device: DEVICE.into(),
        }),
    );
}

/// A `moment.create` command for `id` with `request_id`.
pub(crate) fn create(id: Option<Id>, request_id: Option<&str>) -> Command {
    Command::CreateMoment(CreateMoment {
        id,
        request_id: request_id.map(str::to_owned),
        text: None,
        caption: None,
        lang: None,
        captured_at_ms: None,
        device: DEVICE.into(),
    })
}

/// A `media.put` of one byte whose sha256 is `[byte; 32]`.
pub(crate) fn put(id: Id, moment_id: Id, role: MediaRole, byte: u8) -> PutMedia {
    PutMedia {
        id,
        moment_id,
        role,
        photo: 0,
        sha256: [byte; 32],
        size_bytes: 1,
        content_type: "image/jpeg".into(),
        device: DEVICE.into(),
    }
}

/// What a rule decided, without folding anything.
#[derive(Debug)]
pub(crate) enum Decided {
    /// Answered now.
    Answer(Outcome),
    /// Refused now.
    Refused(EngineError),
    /// Would write these ops.
    Write(Vec<OpBody>),
}

/// The minter every test uses: ids `id(1001)`, `id(1002)`, ... per call.
fn minter() -> impl FnMut() -> Id {
    let mut n = 1000;
    move || {
        n += 1;
        id(n)
    }
}

/// Decides `command` at `now_ms` against `mirror`; folds nothing.
pub(crate) fn decide_at(mirror: &Mirror, command: Command, now_ms: u64) -> Decided {
    match decide(mirror, command, now_ms, &mut minter()) {
        Decision::Answer(Ok(outcome)) => Decided::Answer(outcome),
        Decision::Answer(Err(e)) => Decided::Refused(e),
        Decision::Write(ops, _) => Decided::Write(ops),
    }
}

/// Decides `command` at `NOW_MS`; folds nothing.
pub(crate) fn decide_now(mirror: &Mirror, command: Command) -> Decided {
    decide_at(mirror, command, NOW_MS)
}

/// Decides `command` at `now_ms`, folds the ops it writes and answers as
/// the sequencer would.
pub(crate) fn decided_at(
    mirror: &mut Mirror,
    command: Command,
    now_ms: u64,
) -> Result<Outcome, EngineError> {
    match decide(mirror, command, now_ms, &mut minter()) {
        Decision::Answer(answer) => answer,
        Decision::Write(ops, plan) => {
            for body in ops {
                apply(mirror, body);
            }
            plan.outcome(mirror)
        }
    }
}

/// Decides `command` at `NOW_MS`, folds the ops it writes and answers.
pub(crate) fn decided(mirror: &mut Mirror, command: Command) -> Result<Outcome, EngineError> {
    decided_at(mirror, command, NOW_MS)
}

/// The refusal of `command`; panics when it would write or answer.
pub(crate) fn refusal(mirror: &Mirror, command: Command) -> EngineError {
    match decide_now(mirror, command) {
        Decided::Refused(e) => e,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The answer to `command`, which must write nothing.
pub(crate) fn answered(mirror: &Mirror, command: Command) -> Outcome {
    match decide_now(mirror, command) {
        Decided::Answer(outcome) => outcome,
        other => panic!("expected an answer, got {other:?}"),
    }
}

/// The ops `command` would write; panics on an answer or a refusal.
pub(crate) fn writes(mirror: &Mirror, command: Command) -> Vec<OpBody> {
    match decide_now(mirror, command) {
        Decided::Write(ops) => ops,
        other => panic!("expected ops, got {other:?}"),
    }
}
