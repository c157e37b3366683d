//! Turns: a practical turn started on a moment, and its outcome (SPEC
//! section 4).

use super::{
    answer, check_optional_request_id, derived_by_job_or_recall, known_request, live, mint_new,
    refuse, Decision, Plan,
};
use crate::command::{EndTurn, StartTurn};
use crate::error::{Conflict, EngineError};
use crate::ids::Id;
use crate::mirror::{Mirror, TurnStatus};
use crate::op::{OpBody, OpKind, TurnFail, TurnFinish, TurnMode, TurnStart};
use crate::outcome::{Outcome, Replay};

/// `turn.start` (practical): a known request id answers with its turn,
/// running or finished; no brain is asked again. A request id a job or a
/// recall derived for its turns is [`Conflict::DerivedRequestId`].
pub fn decide_start_turn(mirror: &Mirror, c: StartTurn, mint: &mut dyn FnMut() -> Id) -> Decision {
    if let Err(e) = check_optional_request_id(c.request_id.as_deref()) {
        return refuse(e);
    }
    // A request id a job or a recall derived for its turn is a key of
    // another kind of request: 409, like every key reused across kinds.
    if let Some(request_id) = c
        .request_id
        .as_deref()
        .filter(|r| derived_by_job_or_recall(mirror, r))
    {
        return refuse(
            Conflict::DerivedRequestId {
                request_id: request_id.to_owned(),
            }
            .into(),
        );
    }
    // A known request id answers with its turn, running or finished; no
    // brain is asked again (the seed lesson).
    match known_request(mirror, c.request_id.as_deref(), OpKind::TurnStart, None) {
        Err(e) => return refuse(e),
        Ok(Some(entity)) => {
            return match entity.id().and_then(|id| mirror.turns.get(&id)) {
                Some(turn) if turn.moment_id != c.moment_id => refuse(
                    Conflict::TurnRequest {
                        request_id: c.request_id.unwrap_or_default(),
                        turn_id: turn.id,
                        moment_id: turn.moment_id,
                    }
                    .into(),
                ),
                Some(turn) => answer(Outcome::TurnStarted {
                    created: false,
                    replayed: Some(Replay::of(mirror, turn.seq, turn.ts_ms)),
                    turn: mirror.turn_view(turn),
                }),
                None => refuse(EngineError::Missing(format!("turn {entity}"))),
            }
        }
        Ok(None) => {}
    }
    if let Err(e) = live(mirror, c.moment_id) {
        return refuse(e);
    }
    let id = mint_new(mirror, mint);
    Decision::Write(
        vec![OpBody::TurnStart(TurnStart {
            id,
            moment_id: c.moment_id,
            seat: c.seat,
            mode: TurnMode::Practical,
            request_id: c.request_id,
            device: c.device,
        })],
        Plan::TurnStarted(id),
    )
}

/// The error a turn of a deleted moment ends with, in place of the brain's
/// outcome (SPEC section 13: nothing derived from a deleted moment is
/// written).
pub const MOMENT_DELETED_ERROR: &str = "the moment was deleted before the brain answered";

/// `turn.finish` or `turn.fail`: the first outcome stands; a turn of a
/// deleted moment ends failed with [`MOMENT_DELETED_ERROR`].
pub fn decide_end_turn(mirror: &Mirror, c: EndTurn) -> Decision {
    let Some(turn) = mirror.turns.get(&c.turn_id) else {
        return refuse(EngineError::Missing(format!("turn {}", c.turn_id)));
    };
    if turn.status != TurnStatus::Running {
        // Already ended: the first outcome stands.
        return answer(Outcome::TurnEnded {
            turn: mirror.turn_view(turn),
        });
    }
    // A reading of a deleted moment is made of what the person deleted: it
    // is never written (SPEC section 13). The turn ends failed, with the
    // engine's words only, so nothing of it waits for an erasure.
    let deleted = mirror.moment(turn.moment_id).is_none_or(|m| m.deleted);
    let outcome = if deleted {
        Err(MOMENT_DELETED_ERROR.to_owned())
    } else {
        c.outcome
    };
    let op = match outcome {
        Ok((answer, adapter, source)) => OpBody::TurnFinish(TurnFinish {
            id: c.turn_id,
            answer,
            adapter,
            source,
            elapsed_ms: c.elapsed_ms,
        }),
        Err(error) => OpBody::TurnFail(TurnFail {
            id: c.turn_id,
            error,
            elapsed_ms: c.elapsed_ms,
        }),
    };
    Decision::Write(vec![op], Plan::TurnEnded(c.turn_id))
}

#[cfg(test)]
mod tests;
