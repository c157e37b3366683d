//! Every product rule, as plain functions: each takes the committed mirror
//! and a command and returns a [`Decision`] (answer now, refuse, or write
//! these ops). One file per resource; the sequencer calls [`decide`] and no
//! HTTP handler repeats a rule.
//!
//! The two keys of a create (SPEC section 3), in this order: the request id
//! (if an earlier op carried it, answer with what that op produced), then the
//! entity id (if the moment exists, deleted or not, answer with it). Only a
//! command that passes both becomes an op.

pub mod jobs;
pub mod media;
pub mod messages;
pub mod moments;
pub mod phrases;
pub mod recall;
pub mod turns;

use crate::command::Command;
use crate::error::{Conflict, EngineError};
use crate::ids::{
    check_request_id, job_turn_request_id, Id, RECALL_TURN_SUFFIX, REQUEST_ID_MAX_BYTES,
};
use crate::mirror::{Mirror, Moment};
use crate::op::{Entity, OpBody, OpKind, TurnMode, TurnStart};
use crate::outcome::{Outcome, Replay};

/// How to answer once the op is durable and applied.
#[derive(Clone, Debug)]
pub enum Plan {
    /// A moment was created.
    Created(Id),
    /// A moment was edited.
    Edited(Id),
    /// A moment was deleted.
    Deleted(Id),
    /// A media record was put.
    MediaPut(Id),
    /// A turn was started.
    TurnStarted(Id),
    /// A turn ended.
    TurnEnded(Id),
    /// A phrase was kept (the mark id).
    Kept(String),
    /// A phrase was dropped (the mark id).
    Dropped(String),
    /// A recall was started (the recall id).
    Recall(String),
    /// A job was started (the job id).
    Job(String),
    /// A message was posted.
    Message(Id),
}

impl Plan {
    /// The answer, read from the mirror after the op was applied.
    ///
    /// Errors: [`EngineError::MomentNotFound`] or [`EngineError::Missing`] when
    /// the entity is not in the mirror (a bug: the op was just applied).
    pub fn outcome(self, mirror: &Mirror) -> Result<Outcome, EngineError> {
        let created = true;
        Ok(match self {
            Plan::Created(id) => Outcome::MomentCreated {
                created,
                replayed: None,
                moment: moment_view(mirror, id)?,
            },
            Plan::Edited(id) => Outcome::MomentEdited {
                changed: true,
                moment: moment_view(mirror, id)?,
            },
            Plan::Deleted(id) => Outcome::MomentDeleted {
                deleted: true,
                moment: moment_view(mirror, id)?,
            },
            Plan::MediaPut(id) => Outcome::MediaPut {
                created,
                replayed: None,
                media: found(
                    mirror.media.get(&id).map(|m| mirror.media_view(m)),
                    "media",
                    &id,
                )?,
            },
            Plan::TurnStarted(id) => Outcome::TurnStarted {
                created,
                replayed: None,
                turn: found(
                    mirror.turns.get(&id).map(|t| mirror.turn_view(t)),
                    "turn",
                    &id,
                )?,
            },
            Plan::TurnEnded(id) => Outcome::TurnEnded {
                turn: found(
                    mirror.turns.get(&id).map(|t| mirror.turn_view(t)),
                    "turn",
                    &id,
                )?,
            },
            Plan::Kept(id) => Outcome::PhraseKept {
                created,
                replayed: None,
                mark: found(mirror.marks.get(&id).map(|m| m.view()), "mark", &id)?,
            },
            Plan::Dropped(id) => Outcome::PhraseDropped {
                dropped: true,
                mark: found(mirror.marks.get(&id).map(|m| m.view()), "mark", &id)?,
            },
            Plan::Recall(id) => {
                let view = mirror.recalls.get(&id).and_then(|r| mirror.recall_view(r));
                Outcome::RecallStarted {
                    created,
                    replayed: None,
                    recall: Box::new(found(view, "recall", &id)?),
                }
            }
            Plan::Message(id) => Outcome::MessagePosted {
                created,
                replayed: None,
                message: found(
                    mirror.messages.get(&id).map(|m| mirror.message_view(m)),
                    "message",
                    &id,
                )?,
            },
            Plan::Job(id) => Outcome::JobStarted {
                created,
                replayed: None,
                job: found(mirror.jobs.get(&id).map(|j| mirror.job_view(j)), "job", &id)?,
            },
        })
    }
}

/// A moment's view; `MomentNotFound` when there is none.
fn moment_view(mirror: &Mirror, id: Id) -> Result<crate::mirror::MomentView, EngineError> {
    mirror
        .moment(id)
        .map(|m| mirror.moment_view(m))
        .ok_or(EngineError::MomentNotFound(id))
}

/// A view that must exist; `Missing("<what> <id>")` when it does not.
fn found<T>(view: Option<T>, what: &str, id: &dyn std::fmt::Display) -> Result<T, EngineError> {
    view.ok_or_else(|| EngineError::Missing(format!("{what} {id}")))
}

/// What the rules made of a command.
// One Decision lives per command for the length of a batch; boxing the
// answer would cost an allocation per command for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Decision {
    /// Answer now; nothing to write.
    Answer(Result<Outcome, EngineError>),
    /// Write these ops (in this order, in one batch), then answer by the plan.
    Write(Vec<OpBody>, Plan),
}

/// Decides one command against the committed mirror. `now_ms` is the
/// server clock (the batch's time); `mint` gives a fresh ULID for creates
/// without an id.
pub fn decide(
    mirror: &Mirror,
    command: Command,
    now_ms: u64,
    mint: &mut dyn FnMut() -> Id,
) -> Decision {
    match command {
        Command::CreateMoment(c) => moments::decide_create(mirror, c, mint),
        Command::EditMoment(c) => moments::decide_edit(mirror, c),
        Command::DeleteMoment(c) => moments::decide_delete(mirror, c),
        Command::PutMedia(c) => media::decide_put_media(mirror, c),
        Command::StartTurn(c) => turns::decide_start_turn(mirror, c, mint),
        Command::EndTurn(c) => turns::decide_end_turn(mirror, c),
        Command::KeepPhrase(c) => phrases::decide_keep(mirror, c),
        Command::DropPhrase(c) => phrases::decide_drop(mirror, c),
        Command::StartRecall(c) => recall::decide_recall(mirror, c, mint),
        Command::StartJob(c) => jobs::decide_job(mirror, c, mint),
        Command::PostMessage(c) => messages::decide_message(mirror, c, now_ms),
    }
}

/// Looks up a request id: `Ok(None)` when unknown, `Ok(Some(row entity))`
/// when it was produced by an op of `kind` (on `entity`, when given),
/// `Err(conflict)` when it belongs to another kind of request or entity.
pub(crate) fn known_request(
    mirror: &Mirror,
    request_id: Option<&str>,
    kind: OpKind,
    entity: Option<&Entity>,
) -> Result<Option<Entity>, EngineError> {
    let Some(request_id) = request_id else {
        return Ok(None);
    };
    let Some(row) = mirror.requests.get(request_id) else {
        return Ok(None);
    };
    if row.kind != kind || entity.is_some_and(|e| *e != row.entity) {
        return Err(Conflict::RequestId {
            request_id: request_id.to_owned(),
            used_by_kind: row.kind.name(),
            used_by: row.entity.to_string(),
        }
        .into());
    }
    Ok(Some(row.entity.clone()))
}

/// True when `request_id` is one a job or a recall of `mirror` derived for
/// its turns (`<job id>:<index>` for a seat index of the job,
/// `<recall id>:turn`; SPEC section 2): a key of another kind of request,
/// which a client's `turn.start` may not reuse.
pub(crate) fn derived_by_job_or_recall(mirror: &Mirror, request_id: &str) -> bool {
    if let Some(recall_id) = request_id.strip_suffix(RECALL_TURN_SUFFIX) {
        if mirror.recalls.contains_key(recall_id) {
            return true;
        }
    }
    request_id.rsplit_once(':').is_some_and(|(job_id, _)| {
        mirror.jobs.get(job_id).is_some_and(|job| {
            (0..job.seats.len()).any(|i| job_turn_request_id(job_id, i) == request_id)
        })
    })
}

/// The moment a known request produced, for the moment routes.
pub(crate) fn known_moment<'m>(
    mirror: &'m Mirror,
    request_id: Option<&str>,
    kind: OpKind,
    moment: Option<Id>,
) -> Result<Option<&'m Moment>, EngineError> {
    let entity = moment.map(Entity::Id);
    Ok(known_request(mirror, request_id, kind, entity.as_ref())?
        .and_then(|e| e.id())
        .and_then(|id| mirror.moment(id)))
}

/// The replay of a moment's create: its seq and server time.
pub(crate) fn moment_replay(mirror: &Mirror, moment: &Moment) -> Option<Replay> {
    let replay = Replay::of(mirror, moment.created_seq(), moment.created_at_ms);
    Some(replay)
}

/// Answers now with a known outcome.
pub(crate) fn answer(outcome: Outcome) -> Decision {
    Decision::Answer(Ok(outcome))
}

/// Refuses now.
pub(crate) fn refuse(error: EngineError) -> Decision {
    Decision::Answer(Err(error))
}

/// Checks that a moment exists and is not deleted.
pub(crate) fn live(mirror: &Mirror, id: Id) -> Result<&Moment, EngineError> {
    match mirror.moment(id) {
        None => Err(EngineError::MomentNotFound(id)),
        Some(m) if m.deleted => Err(EngineError::Deleted(id)),
        Some(m) => Ok(m),
    }
}

/// A fresh id that no moment or turn has.
pub(crate) fn mint_new(mirror: &Mirror, mint: &mut dyn FnMut() -> Id) -> Id {
    loop {
        let id = mint();
        if mirror.moment(id).is_none() && !mirror.turns.contains_key(&id) {
            return id;
        }
    }
}

/// The `turn.start` of a recall or a job.
pub(crate) fn turn_start(
    id: Id,
    moment_id: Id,
    seat: &str,
    mode: TurnMode,
    request_id: String,
    device: &str,
) -> OpBody {
    OpBody::TurnStart(TurnStart {
        id,
        moment_id,
        seat: seat.to_owned(),
        mode,
        request_id: Some(request_id),
        device: device.to_owned(),
    })
}

/// Checks a request id the client may send, if any (SPEC section 2).
pub(crate) fn check_optional_request_id(request_id: Option<&str>) -> Result<(), EngineError> {
    match request_id {
        Some(r) => Ok(check_request_id(r, REQUEST_ID_MAX_BYTES)?),
        None => Ok(()),
    }
}

#[cfg(test)]
pub(crate) mod test_support;
