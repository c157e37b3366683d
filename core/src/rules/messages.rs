//! Messages in a moment's thread (SPEC section 5, seed ADR-036). Message ids
//! are minted at the send attempt, so a new one is accepted only when the
//! time in its ULID is within [`CLOCK_WINDOW_MS`] of the server clock,
//! inclusive.

use super::{answer, live, refuse, Decision, Plan};
use crate::command::PostMessage;
use crate::error::{Conflict, EngineError};
use crate::ids::Id;
use crate::mirror::Mirror;
use crate::op::{MessagePost, OpBody};
use crate::outcome::{Outcome, Replay};
use crate::wire::CLOCK_WINDOW_MS;

/// Checks that the time in a message id is within [`CLOCK_WINDOW_MS`] of
/// the server clock `now_ms` (Unix ms), inclusive.
///
/// Errors: [`EngineError::ClockSkew`] with both times and the skew.
pub fn check_clock_window(id: Id, now_ms: u64) -> Result<(), EngineError> {
    let id_time_ms = id.time_ms();
    let skew_ms = i128::from(id_time_ms) - i128::from(now_ms);
    if skew_ms.unsigned_abs() <= u128::from(CLOCK_WINDOW_MS) {
        return Ok(());
    }
    Err(EngineError::ClockSkew {
        server_time_ms: now_ms,
        id_time_ms,
        // The difference of two u64 fits an i128; clamp to i64 for the wire.
        skew_ms: i64::try_from(skew_ms).unwrap_or(if skew_ms > 0 { i64::MAX } else { i64::MIN }),
    })
}

/// `message.post`: a known id answers with the stored message whatever the
/// clock says now; a new one must be within the clock window.
pub fn decide_message(mirror: &Mirror, c: PostMessage, now_ms: u64) -> Decision {
    // A known id is answered with the stored message whatever the clock
    // says now: the receiver ignores what it already has (ADR-036).
    if let Some(known) = mirror.messages.get(&c.id) {
        // An erased body (SPEC section 13) cannot be compared: the id and
        // thread decide, and the answer shows no body.
        let body_differs = known.body != c.body && !mirror.is_erased(known.thread_id);
        if body_differs || known.thread_id != c.thread_id {
            return refuse(Conflict::Message { message_id: c.id }.into());
        }
        return answer(Outcome::MessagePosted {
            created: false,
            replayed: Some(Replay::of(mirror, known.seq, known.ts_ms)),
            message: mirror.message_view(known),
        });
    }
    if let Err(e) = check_clock_window(c.id, now_ms) {
        return refuse(e);
    }
    if let Err(e) = live(mirror, c.thread_id) {
        return refuse(e);
    }
    Decision::Write(
        vec![OpBody::MessagePost(MessagePost {
            id: c.id,
            thread_id: c.thread_id,
            body: c.body,
            device: c.device,
        })],
        Plan::Message(c.id),
    )
}

#[cfg(test)]
mod tests;
