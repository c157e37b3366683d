//! Quick recall (SPEC section 4): a session reads the most recently kept
//! phrases. Its id (at most [`crate::ids::RECALL_ID_MAX_BYTES`], checked
//! here for every caller) is the request id of the moment it assembles, and
//! `<recall id>:turn` the request id of its turn.

use super::{answer, known_request, mint_new, refuse, turn_start, Decision, Plan};
use crate::command::StartRecall;
use crate::error::{Conflict, EngineError};
use crate::ids::{check_recall_id, mark_phrase, recall_turn_request_id, Id};
use crate::mirror::{Mirror, Recall};
use crate::op::{MomentCreate, OpBody, OpKind, RecallStart, TurnMode};
use crate::outcome::{Outcome, Replay};

/// `recall.start` with its moment and turn: each part is written unless it
/// already is, so a retry completes a torn batch.
pub fn decide_recall(
    mirror: &Mirror,
    mut c: StartRecall,
    mint: &mut dyn FnMut() -> Id,
) -> Decision {
    let recall_id = match recall_id(mirror, c.recall_id.take(), mint) {
        Ok(id) => id,
        Err(e) => return refuse(e),
    };
    let turn_request = recall_turn_request_id(&recall_id);
    let mut ops = Vec::new();
    let recall = match mirror.recalls.get(&recall_id) {
        Some(recall) => recall.clone(),
        None => match new_recall(mirror, &recall_id, &turn_request, &c, mint) {
            Ok(start) => {
                ops.push(OpBody::RecallStart(start.clone()));
                Recall {
                    id: start.id,
                    moment_id: start.moment_id,
                    turn_id: start.turn_id,
                    marks: start.marks,
                    seq: 0,
                    ts_ms: 0,
                }
            }
            Err(e) => return refuse(e),
        },
    };
    // Each part is written unless it already is (a retry after a torn batch
    // completes what is missing, with the ids the recall.start holds).
    if mirror.moment(recall.moment_id).is_none() {
        ops.push(recall_moment(mirror, &recall, &c.device));
    }
    if !mirror.turns.contains_key(&recall.turn_id) {
        // A turn needs a live moment (the fold refuses one on a tombstone,
        // after the op is durable): a torn recall's retry whose moment was
        // deleted since is refused.
        if mirror.moment(recall.moment_id).is_some_and(|m| m.deleted) {
            return refuse(EngineError::Deleted(recall.moment_id));
        }
        ops.push(turn_start(
            recall.turn_id,
            recall.moment_id,
            &c.seat,
            TurnMode::Recall,
            turn_request,
            &c.device,
        ));
    }
    if ops.is_empty() {
        return match mirror.recall_view(&recall) {
            Some(view) => answer(Outcome::RecallStarted {
                created: false,
                replayed: Some(Replay::of(mirror, recall.seq, recall.ts_ms)),
                recall: Box::new(view),
            }),
            None => refuse(EngineError::Missing(format!("recall {recall_id}"))),
        };
    }
    Decision::Write(ops, Plan::Recall(recall_id))
}

/// The client's recall id within its cap, or a fresh one that no recall
/// and no request has.
fn recall_id(
    mirror: &Mirror,
    given: Option<String>,
    mint: &mut dyn FnMut() -> Id,
) -> Result<String, EngineError> {
    if let Some(id) = given {
        check_recall_id(&id)?;
        return Ok(id);
    }
    loop {
        let id = mint().to_string();
        if !mirror.recalls.contains_key(&id) && !mirror.requests.contains_key(id.as_str()) {
            return Ok(id);
        }
    }
}

/// The `recall.start` of a new recall: its id (the moment's request id)
/// and its turn's request id must be unused, and a phrase must be kept.
fn new_recall(
    mirror: &Mirror,
    recall_id: &str,
    turn_request: &str,
    c: &StartRecall,
    mint: &mut dyn FnMut() -> Id,
) -> Result<RecallStart, EngineError> {
    known_request(mirror, Some(recall_id), OpKind::RecallStart, None)?;
    if mirror.requests.contains_key(turn_request) {
        return Err(Conflict::DerivedRequestId {
            request_id: turn_request.to_owned(),
        }
        .into());
    }
    let marks = mirror.recent_marks(c.phrases_max);
    if marks.is_empty() {
        return Err(EngineError::Invalid(
            "no phrase is kept: keep phrases (POST /api/phrases) before a quick recall".into(),
        ));
    }
    Ok(RecallStart {
        id: recall_id.to_owned(),
        moment_id: mint_new(mirror, mint),
        turn_id: mint_new(mirror, mint),
        marks: marks.iter().map(|m| m.id.clone()).collect(),
        device: c.device.clone(),
    })
}

/// The `moment.create` a recall assembles from its phrases, one a line.
fn recall_moment(mirror: &Mirror, recall: &Recall, device: &str) -> OpBody {
    let phrases: Vec<String> = recall
        .marks
        .iter()
        .map(|id| {
            mirror
                .marks
                .get(id)
                .map(|m| m.phrase.clone())
                .unwrap_or_else(|| mark_phrase(id).unwrap_or(id).to_owned())
        })
        .collect();
    OpBody::MomentCreate(MomentCreate {
        id: recall.moment_id,
        request_id: Some(recall.id.clone()),
        device: device.to_owned(),
        text: Some(phrases.join("\n")),
        caption: Some("quick recall".into()),
        lang: None,
        captured_at_ms: None,
    })
}

#[cfg(test)]
mod tests;
