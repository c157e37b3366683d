//! The sequencer: turns a command into either an answer from what is known
//! or the ops to write. It reads only the committed mirror; the journal keeps
//! commands that share a key with an op in flight out of the same batch.
//!
//! The two keys of a create (SPEC section 3), in this order: the request id
//! (if an earlier op carried it, answer with what that op produced), then the
//! entity id (if the moment exists, deleted or not, answer with it). Only a
//! command that passes both becomes an op.

use crate::ids::Id;
use crate::mirror::{Mirror, Moment};
use crate::op::{
    Entity, JobStart, MarkDrop, MarkKeep, MediaPut, MediaRole, MessagePost, MomentCreate,
    MomentDelete, MomentEdit, OpBody, OpKind, RecallStart, Sha256, TurnFail, TurnFinish, TurnMode,
    TurnStart,
};

use super::{EngineError, Outcome};

/// `POST /api/moments`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateMoment {
    /// The phone-minted id, if any; the sequencer mints one otherwise.
    pub id: Option<Id>,
    /// The request id, if any.
    pub request_id: Option<String>,
    /// What the sign says.
    pub text: Option<String>,
    /// The caption.
    pub caption: Option<String>,
    /// Language tag.
    pub lang: Option<String>,
    /// When the photo was taken, Unix milliseconds.
    pub captured_at_ms: Option<i64>,
    /// Who sent it.
    pub device: String,
}

/// A field of an edit: left alone, cleared, or set.
pub type FieldChange = Option<Option<String>>;

/// `PATCH /api/moments/{id}`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EditMoment {
    /// The moment.
    pub id: Id,
    /// The request id, if any.
    pub request_id: Option<String>,
    /// `If-Match`: the version the client last saw, if sent.
    pub if_match: Option<u32>,
    /// New text.
    pub text: FieldChange,
    /// New caption.
    pub caption: FieldChange,
    /// New language tag.
    pub lang: FieldChange,
    /// Who sent it.
    pub device: String,
}

/// `DELETE /api/moments/{id}`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeleteMoment {
    /// The moment.
    pub id: Id,
    /// The request id, if any.
    pub request_id: Option<String>,
    /// `If-Match`: the version the client last saw, if sent.
    pub if_match: Option<u32>,
    /// Who sent it.
    pub device: String,
}

/// `PUT /api/media/{id}`, after the blob is durable under its digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutMedia {
    /// The phone-minted media id.
    pub id: Id,
    /// The moment it belongs to.
    pub moment_id: Id,
    /// Copy or original.
    pub role: MediaRole,
    /// SHA-256 of the bytes.
    pub sha256: [u8; 32],
    /// Number of bytes.
    pub size_bytes: u64,
    /// `Content-Type` as uploaded.
    pub content_type: String,
    /// Who sent it.
    pub device: String,
}

/// `POST /api/moments/{id}/turns`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartTurn {
    /// The moment to read.
    pub moment_id: Id,
    /// The request id, if any: a known one answers with its turn.
    pub request_id: Option<String>,
    /// The seat to ask (a configured one).
    pub seat: String,
    /// Who sent it.
    pub device: String,
}

/// The brain runner's report of a turn's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndTurn {
    /// The turn.
    pub turn_id: Id,
    /// `(answer, adapter, source)` when the brain answered, else the error.
    pub outcome: Result<(String, String, String), String>,
    /// How long the brain took, in milliseconds.
    pub elapsed_ms: u64,
}

/// `POST /api/phrases`, validated and normalised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeepPhrase {
    /// The normalised phrase (its mark id is `keep:<phrase>`).
    pub phrase: String,
    /// The moment it was kept from, if any.
    pub moment_id: Option<Id>,
    /// Who sent it.
    pub device: String,
}

/// `DELETE /api/phrases/{mark id}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DropPhrase {
    /// `keep:<phrase>`.
    pub mark_id: String,
    /// Who sent it.
    pub device: String,
}

/// `POST /api/recall`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartRecall {
    /// The client's recall id (at most 70 bytes), or `None` to mint one.
    pub recall_id: Option<String>,
    /// The seat that runs the session.
    pub seat: String,
    /// Most phrases in one session.
    pub phrases_max: usize,
    /// Who sent it.
    pub device: String,
}

/// `POST /api/jobs`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartJob {
    /// The client's job id (at most 64 bytes).
    pub job_id: String,
    /// The moment to read.
    pub moment_id: Id,
    /// Every configured seat, in configuration order.
    pub seats: Vec<String>,
    /// Who sent it.
    pub device: String,
}

/// `POST /api/messages`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostMessage {
    /// The ULID minted at the send attempt.
    pub id: Id,
    /// The thread (a moment id).
    pub thread_id: Id,
    /// The text.
    pub body: String,
    /// The clock window, in milliseconds: the id's time must be within this
    /// of the server clock, inclusive (SPEC section 5: 5 minutes).
    pub window_ms: u64,
    /// Who sent it.
    pub device: String,
}

/// A write request, validated by the API layer, on its way to the sequencer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Create a moment.
    CreateMoment(CreateMoment),
    /// Edit a moment.
    EditMoment(EditMoment),
    /// Delete a moment.
    DeleteMoment(DeleteMoment),
    /// Record a stored blob.
    PutMedia(PutMedia),
    /// Start a practical turn.
    StartTurn(StartTurn),
    /// Record a turn's outcome.
    EndTurn(EndTurn),
    /// Keep a phrase.
    KeepPhrase(KeepPhrase),
    /// Drop a kept phrase.
    DropPhrase(DropPhrase),
    /// Start a quick-recall session.
    StartRecall(StartRecall),
    /// Start a high-quality job.
    StartJob(StartJob),
    /// Post a message to a thread.
    PostMessage(PostMessage),
}

/// The mark id of a normalised phrase.
pub fn mark_id(phrase: &str) -> String {
    format!("keep:{phrase}")
}

/// The request id of a recall's turn (SPEC section 2).
pub fn recall_turn_request_id(recall_id: &str) -> String {
    format!("{recall_id}:turn")
}

/// The request id of a job's turn for seat `index` (SPEC section 2).
pub fn job_turn_request_id(job_id: &str, index: usize) -> String {
    format!("{job_id}:{index}")
}

/// A key two commands may share; two commands with a common key are never
/// decided in the same batch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Key {
    Request(String),
    Entity(Id),
    Name(String),
}

impl Command {
    /// The keys this command reads or writes.
    pub(super) fn keys(&self) -> Vec<Key> {
        let (request_id, entity) = match self {
            Command::CreateMoment(c) => (&c.request_id, c.id),
            Command::EditMoment(c) => (&c.request_id, Some(c.id)),
            Command::DeleteMoment(c) => (&c.request_id, Some(c.id)),
            Command::StartTurn(c) => (&c.request_id, Some(c.moment_id)),
            // The media id and its moment (whose role slots it fills).
            Command::PutMedia(c) => return vec![Key::Entity(c.id), Key::Entity(c.moment_id)],
            Command::EndTurn(c) => return vec![Key::Entity(c.turn_id)],
            Command::KeepPhrase(c) => return vec![Key::Name(mark_id(&c.phrase))],
            Command::DropPhrase(c) => return vec![Key::Name(c.mark_id.clone())],
            Command::StartRecall(c) => {
                return match &c.recall_id {
                    Some(r) => vec![
                        Key::Request(r.clone()),
                        Key::Request(recall_turn_request_id(r)),
                    ],
                    // A minted recall id is new; only the marks are read.
                    None => Vec::new(),
                };
            }
            Command::PostMessage(c) => return vec![Key::Entity(c.id), Key::Entity(c.thread_id)],
            Command::StartJob(c) => {
                let mut keys = vec![Key::Request(c.job_id.clone()), Key::Entity(c.moment_id)];
                keys.extend(
                    (0..c.seats.len()).map(|i| Key::Request(job_turn_request_id(&c.job_id, i))),
                );
                return keys;
            }
        };
        let mut keys = Vec::with_capacity(2);
        if let Some(r) = request_id {
            keys.push(Key::Request(r.clone()));
        }
        if let Some(id) = entity {
            keys.push(Key::Entity(id));
        }
        keys
    }
}

/// How to answer once the op is durable and applied.
#[derive(Clone, Debug)]
pub(super) enum Plan {
    Created(Id),
    Edited(Id),
    Deleted(Id),
    MediaPut(Id),
    TurnStarted(Id),
    TurnEnded(Id),
    Kept(String),
    Dropped(String),
    Recall(String),
    Job(String),
    Message(Id),
}

impl Plan {
    /// The answer, read from the mirror after the op was applied.
    pub(super) fn outcome(self, mirror: &Mirror) -> Result<Outcome, EngineError> {
        let view = |id| {
            mirror
                .moment(id)
                .map(|m| mirror.moment_view(m))
                .ok_or(EngineError::NotFound(id))
        };
        Ok(match self {
            Plan::Created(id) => Outcome::MomentCreated {
                created: true,
                moment: view(id)?,
            },
            Plan::Edited(id) => Outcome::MomentEdited {
                changed: true,
                moment: view(id)?,
            },
            Plan::Deleted(id) => Outcome::MomentDeleted {
                deleted: true,
                moment: view(id)?,
            },
            Plan::MediaPut(id) => Outcome::MediaPut {
                created: true,
                media: mirror
                    .media
                    .get(&id)
                    .map(|m| mirror.media_view(m))
                    .ok_or(EngineError::NotFound(id))?,
            },
            Plan::TurnStarted(id) | Plan::TurnEnded(id) => {
                let turn = mirror
                    .turns
                    .get(&id)
                    .map(|t| t.view())
                    .ok_or_else(|| EngineError::Missing(format!("turn {id}")))?;
                match self {
                    Plan::TurnStarted(_) => Outcome::TurnStarted {
                        created: true,
                        turn,
                    },
                    _ => Outcome::TurnEnded { turn },
                }
            }
            Plan::Kept(ref id) | Plan::Dropped(ref id) => {
                let mark = mirror
                    .marks
                    .get(id)
                    .map(|m| m.view())
                    .ok_or_else(|| EngineError::Missing(format!("mark {id}")))?;
                match self {
                    Plan::Kept(_) => Outcome::PhraseKept {
                        created: true,
                        mark,
                    },
                    _ => Outcome::PhraseDropped {
                        dropped: true,
                        mark,
                    },
                }
            }
            Plan::Recall(id) => Outcome::RecallStarted {
                created: true,
                recall: Box::new(
                    mirror
                        .recalls
                        .get(&id)
                        .and_then(|r| mirror.recall_view(r))
                        .ok_or_else(|| EngineError::Missing(format!("recall {id}")))?,
                ),
            },
            Plan::Message(id) => Outcome::MessagePosted {
                created: true,
                message: mirror
                    .messages
                    .get(&id)
                    .map(|m| m.view())
                    .ok_or_else(|| EngineError::Missing(format!("message {id}")))?,
            },
            Plan::Job(id) => Outcome::JobStarted {
                created: true,
                job: mirror
                    .jobs
                    .get(&id)
                    .map(|j| mirror.job_view(j))
                    .ok_or_else(|| EngineError::Missing(format!("job {id}")))?,
            },
        })
    }
}

/// What the sequencer made of a command.
// One Decision lives per command for the length of a batch; boxing the
// answer would cost an allocation per command for nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Decision {
    /// Answer now; nothing to write.
    Answer(Result<Outcome, EngineError>),
    /// Write these ops (in this order, in one batch), then answer by the plan.
    Write(Vec<OpBody>, Plan),
}

/// Decides one command against the committed mirror. `now_ms` is the
/// server clock (the batch's time); `mint` gives a fresh ULID for creates
/// without an id.
pub(super) fn decide(
    mirror: &Mirror,
    command: Command,
    now_ms: u64,
    mint: &mut dyn FnMut() -> Id,
) -> Decision {
    match command {
        Command::CreateMoment(c) => decide_create(mirror, c, mint),
        Command::EditMoment(c) => decide_edit(mirror, c),
        Command::DeleteMoment(c) => decide_delete(mirror, c),
        Command::PutMedia(c) => decide_put_media(mirror, c),
        Command::StartTurn(c) => decide_start_turn(mirror, c, mint),
        Command::EndTurn(c) => decide_end_turn(mirror, c),
        Command::KeepPhrase(c) => decide_keep(mirror, c),
        Command::DropPhrase(c) => decide_drop(mirror, c),
        Command::StartRecall(c) => decide_recall(mirror, c, mint),
        Command::StartJob(c) => decide_job(mirror, c, mint),
        Command::PostMessage(c) => decide_message(mirror, c, now_ms),
    }
}

/// Looks up a request id: `Ok(None)` when unknown, `Ok(Some(row entity))`
/// when it was produced by an op of `kind` (on `entity`, when given),
/// `Err(conflict)` when it belongs to another kind of request or entity.
fn known_request(
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
        return Err(EngineError::Conflict(format!(
            "request id {request_id:?} was already used by a {} of {}",
            row.kind.name(),
            row.entity
        )));
    }
    Ok(Some(row.entity.clone()))
}

/// The moment a known request produced, for the moment routes.
fn known_moment<'m>(
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

fn answer(outcome: Outcome) -> Decision {
    Decision::Answer(Ok(outcome))
}

fn refuse(error: EngineError) -> Decision {
    Decision::Answer(Err(error))
}

fn decide_create(mirror: &Mirror, c: CreateMoment, mint: &mut dyn FnMut() -> Id) -> Decision {
    // A recall's id is the request id of the moment it assembled, but it was
    // used by a recall request, not a create (SPEC section 3: another kind
    // of request is a conflict).
    if let Some(rid) = c.request_id.as_deref() {
        if mirror.recalls.contains_key(rid) {
            return refuse(EngineError::Conflict(format!(
                "request id {rid:?} was already used by a recall.start of {rid}"
            )));
        }
    }
    // Key 1: the request id, whatever `id` the request carries now.
    match known_moment(mirror, c.request_id.as_deref(), OpKind::MomentCreate, None) {
        Err(e) => return refuse(e),
        Ok(Some(moment)) => {
            return answer(Outcome::MomentCreated {
                created: false,
                moment: mirror.moment_view(moment),
            })
        }
        Ok(None) => {}
    }
    // Key 2: the entity id, deleted or not.
    if let Some(moment) = c.id.and_then(|id| mirror.moment(id)) {
        return answer(Outcome::MomentCreated {
            created: false,
            moment: mirror.moment_view(moment),
        });
    }
    let id = match c.id {
        Some(id) => id,
        None => loop {
            let id = mint();
            if mirror.moment(id).is_none() {
                break id;
            }
        },
    };
    Decision::Write(
        vec![OpBody::MomentCreate(MomentCreate {
            id,
            request_id: c.request_id,
            device: c.device,
            text: c.text,
            caption: c.caption,
            lang: c.lang,
            captured_at_ms: c.captured_at_ms,
        })],
        Plan::Created(id),
    )
}

fn check_if_match(moment: &Moment, if_match: Option<u32>) -> Result<(), EngineError> {
    match if_match {
        Some(expected) if expected != moment.version => Err(EngineError::PreconditionFailed {
            current: moment.version,
            expected,
        }),
        _ => Ok(()),
    }
}

/// The change of one field: `None` when the edit leaves it as it is.
fn field_change(current: Option<&str>, wanted: FieldChange) -> FieldChange {
    match wanted {
        Some(value) if value.as_deref() != current => Some(value),
        _ => None,
    }
}

fn decide_edit(mirror: &Mirror, c: EditMoment) -> Decision {
    match known_moment(
        mirror,
        c.request_id.as_deref(),
        OpKind::MomentEdit,
        Some(c.id),
    ) {
        Err(e) => return refuse(e),
        Ok(Some(moment)) => {
            return answer(Outcome::MomentEdited {
                changed: false,
                moment: mirror.moment_view(moment),
            })
        }
        Ok(None) => {}
    }
    let moment = match mirror.moment(c.id) {
        None => return refuse(EngineError::NotFound(c.id)),
        Some(m) if m.deleted => return refuse(EngineError::Deleted(c.id)),
        Some(m) => m,
    };
    if let Err(e) = check_if_match(moment, c.if_match) {
        return refuse(e);
    }
    let text = field_change(moment.text(), c.text);
    let caption = field_change(moment.caption(), c.caption);
    let lang = field_change(moment.lang(), c.lang);
    if text.is_none() && caption.is_none() && lang.is_none() {
        return answer(Outcome::MomentEdited {
            changed: false,
            moment: mirror.moment_view(moment),
        });
    }
    Decision::Write(
        vec![OpBody::MomentEdit(MomentEdit {
            id: c.id,
            request_id: c.request_id,
            device: c.device,
            text,
            caption,
            lang,
        })],
        Plan::Edited(c.id),
    )
}

fn decide_delete(mirror: &Mirror, c: DeleteMoment) -> Decision {
    match known_moment(
        mirror,
        c.request_id.as_deref(),
        OpKind::MomentDelete,
        Some(c.id),
    ) {
        Err(e) => return refuse(e),
        Ok(Some(moment)) => {
            return answer(Outcome::MomentDeleted {
                deleted: false,
                moment: mirror.moment_view(moment),
            })
        }
        Ok(None) => {}
    }
    let moment = match mirror.moment(c.id) {
        None => return refuse(EngineError::NotFound(c.id)),
        Some(m) => m,
    };
    if moment.deleted {
        return answer(Outcome::MomentDeleted {
            deleted: false,
            moment: mirror.moment_view(moment),
        });
    }
    if let Err(e) = check_if_match(moment, c.if_match) {
        return refuse(e);
    }
    Decision::Write(
        vec![OpBody::MomentDelete(MomentDelete {
            id: c.id,
            request_id: c.request_id,
            device: c.device,
        })],
        Plan::Deleted(c.id),
    )
}

fn decide_put_media(mirror: &Mirror, c: PutMedia) -> Decision {
    // The media id: a replay must carry the same bytes for the same moment
    // and role; anything else is a client bug, never a guess.
    if let Some(existing) = mirror.media.get(&c.id) {
        if existing.sha256.0 != c.sha256 {
            return refuse(EngineError::Conflict(format!(
                "media {} was uploaded with sha256 {}; these bytes hash to {}",
                c.id,
                hex::encode(existing.sha256.0),
                hex::encode(c.sha256)
            )));
        }
        if existing.moment_id != c.moment_id || existing.role != c.role {
            return refuse(EngineError::Conflict(format!(
                "media {} belongs to moment {} as its {}",
                c.id,
                existing.moment_id,
                existing.role.name()
            )));
        }
        return answer(Outcome::MediaPut {
            created: false,
            media: mirror.media_view(existing),
        });
    }
    let moment = match mirror.moment(c.moment_id) {
        None => return refuse(EngineError::NotFound(c.moment_id)),
        Some(m) if m.deleted => return refuse(EngineError::Deleted(c.moment_id)),
        Some(m) => m,
    };
    if let Some(other) = moment
        .media()
        .iter()
        .filter_map(|id| mirror.media.get(id))
        .find(|m| m.role == c.role)
    {
        return refuse(EngineError::Conflict(format!(
            "moment {} already has its {}: media {}",
            c.moment_id,
            c.role.name(),
            other.id
        )));
    }
    Decision::Write(
        vec![OpBody::MediaPut(MediaPut {
            id: c.id,
            moment_id: c.moment_id,
            role: c.role,
            sha256: Sha256(c.sha256),
            size_bytes: c.size_bytes,
            content_type: c.content_type,
            device: c.device,
        })],
        Plan::MediaPut(c.id),
    )
}

/// Checks that a moment exists and is not deleted.
fn live(mirror: &Mirror, id: Id) -> Result<&Moment, EngineError> {
    match mirror.moment(id) {
        None => Err(EngineError::NotFound(id)),
        Some(m) if m.deleted => Err(EngineError::Deleted(id)),
        Some(m) => Ok(m),
    }
}

fn turn_start(
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

fn decide_start_turn(mirror: &Mirror, c: StartTurn, mint: &mut dyn FnMut() -> Id) -> Decision {
    // A known request id answers with its turn, running or finished; no
    // brain is asked again (the seed lesson).
    match known_request(mirror, c.request_id.as_deref(), OpKind::TurnStart, None) {
        Err(e) => return refuse(e),
        Ok(Some(entity)) => {
            return match entity.id().and_then(|id| mirror.turns.get(&id)) {
                Some(turn) if turn.moment_id != c.moment_id => {
                    refuse(EngineError::Conflict(format!(
                        "request id {:?} started turn {} of moment {}",
                        c.request_id.unwrap_or_default(),
                        turn.id,
                        turn.moment_id
                    )))
                }
                Some(turn) => answer(Outcome::TurnStarted {
                    created: false,
                    turn: turn.view(),
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

/// A fresh id that no moment or turn has.
fn mint_new(mirror: &Mirror, mint: &mut dyn FnMut() -> Id) -> Id {
    loop {
        let id = mint();
        if mirror.moment(id).is_none() && !mirror.turns.contains_key(&id) {
            return id;
        }
    }
}

fn decide_end_turn(mirror: &Mirror, c: EndTurn) -> Decision {
    let Some(turn) = mirror.turns.get(&c.turn_id) else {
        return refuse(EngineError::Missing(format!("turn {}", c.turn_id)));
    };
    if turn.status != crate::mirror::TurnStatus::Running {
        // Already ended: the first outcome stands.
        return answer(Outcome::TurnEnded { turn: turn.view() });
    }
    let op = match c.outcome {
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

fn decide_keep(mirror: &Mirror, c: KeepPhrase) -> Decision {
    let id = mark_id(&c.phrase);
    if let Some(mark) = mirror.marks.get(&id).filter(|m| m.active) {
        // Keeping an active phrase again writes nothing.
        return answer(Outcome::PhraseKept {
            created: false,
            mark: mark.view(),
        });
    }
    if let Some(moment_id) = c.moment_id {
        if mirror.moment(moment_id).is_none() {
            return refuse(EngineError::NotFound(moment_id));
        }
    }
    Decision::Write(
        vec![OpBody::MarkKeep(MarkKeep {
            id: id.clone(),
            phrase: c.phrase,
            moment_id: c.moment_id,
            device: c.device,
        })],
        Plan::Kept(id),
    )
}

fn decide_drop(mirror: &Mirror, c: DropPhrase) -> Decision {
    match mirror.marks.get(&c.mark_id) {
        None => refuse(EngineError::Missing(format!("mark {:?}", c.mark_id))),
        Some(mark) if !mark.active => answer(Outcome::PhraseDropped {
            dropped: false,
            mark: mark.view(),
        }),
        Some(_) => Decision::Write(
            vec![OpBody::MarkDrop(MarkDrop {
                id: c.mark_id.clone(),
                device: c.device,
            })],
            Plan::Dropped(c.mark_id),
        ),
    }
}

fn decide_recall(mirror: &Mirror, c: StartRecall, mint: &mut dyn FnMut() -> Id) -> Decision {
    let recall_id = match c.recall_id {
        Some(id) => id,
        None => loop {
            let id = mint().to_string();
            if !mirror.recalls.contains_key(&id) && !mirror.requests.contains_key(id.as_str()) {
                break id;
            }
        },
    };
    let turn_request = recall_turn_request_id(&recall_id);
    let mut ops = Vec::new();
    let recall = match mirror.recalls.get(&recall_id) {
        Some(recall) => recall.clone(),
        None => {
            // The recall id is the moment's request id: it must be unused.
            if let Err(e) = known_request(mirror, Some(&recall_id), OpKind::RecallStart, None) {
                return refuse(e);
            }
            if mirror.requests.contains_key(turn_request.as_str()) {
                return refuse(EngineError::Conflict(format!(
                    "request id {turn_request:?} is already used"
                )));
            }
            let marks = mirror.recent_marks(c.phrases_max);
            if marks.is_empty() {
                return refuse(EngineError::Invalid(
                    "no phrase is kept: keep phrases (POST /api/phrases) before a quick recall"
                        .into(),
                ));
            }
            let recall = RecallStart {
                id: recall_id.clone(),
                moment_id: mint_new(mirror, mint),
                turn_id: mint_new(mirror, mint),
                marks: marks.iter().map(|m| m.id.clone()).collect(),
                device: c.device.clone(),
            };
            ops.push(OpBody::RecallStart(recall.clone()));
            crate::mirror::Recall {
                id: recall.id,
                moment_id: recall.moment_id,
                turn_id: recall.turn_id,
                marks: recall.marks,
                seq: 0,
            }
        }
    };
    // Each part is written unless it already is (a retry after a torn batch
    // completes what is missing, with the ids the recall.start holds).
    if mirror.moment(recall.moment_id).is_none() {
        let phrases: Vec<String> = recall
            .marks
            .iter()
            .map(|id| {
                mirror
                    .marks
                    .get(id)
                    .map(|m| m.phrase.clone())
                    .unwrap_or_else(|| id.trim_start_matches("keep:").to_owned())
            })
            .collect();
        ops.push(OpBody::MomentCreate(MomentCreate {
            id: recall.moment_id,
            request_id: Some(recall_id.clone()),
            device: c.device.clone(),
            text: Some(phrases.join("\n")),
            caption: Some("quick recall".into()),
            lang: None,
            captured_at_ms: None,
        }));
    }
    if !mirror.turns.contains_key(&recall.turn_id) {
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
                recall: Box::new(view),
            }),
            None => refuse(EngineError::Missing(format!("recall {recall_id}"))),
        };
    }
    Decision::Write(ops, Plan::Recall(recall_id))
}

fn decide_job(mirror: &Mirror, c: StartJob, mint: &mut dyn FnMut() -> Id) -> Decision {
    let mut ops = Vec::new();
    let (moment_id, seats) = match mirror.jobs.get(&c.job_id) {
        Some(job) if job.moment_id != c.moment_id => {
            return refuse(EngineError::Conflict(format!(
                "job {:?} reads moment {}",
                c.job_id, job.moment_id
            )))
        }
        Some(job) => (job.moment_id, job.seats.clone()),
        None => {
            if let Err(e) = known_request(mirror, Some(&c.job_id), OpKind::JobStart, None) {
                return refuse(e);
            }
            if let Err(e) = live(mirror, c.moment_id) {
                return refuse(e);
            }
            if c.seats.is_empty() {
                return refuse(EngineError::Invalid("no brain seat is configured".into()));
            }
            ops.push(OpBody::JobStart(JobStart {
                job_id: c.job_id.clone(),
                moment_id: c.moment_id,
                seats: c.seats.clone(),
                device: c.device.clone(),
            }));
            (c.moment_id, c.seats.clone())
        }
    };
    let mut minted = Vec::new();
    for (index, seat) in seats.iter().enumerate() {
        let request_id = job_turn_request_id(&c.job_id, index);
        match known_request(mirror, Some(&request_id), OpKind::TurnStart, None) {
            Err(e) => return refuse(e),
            Ok(Some(_)) => continue,
            Ok(None) => {}
        }
        let id = loop {
            let id = mint_new(mirror, mint);
            if !minted.contains(&id) {
                break id;
            }
        };
        minted.push(id);
        ops.push(turn_start(
            id,
            moment_id,
            seat,
            TurnMode::Practical,
            request_id,
            &c.device,
        ));
    }
    if ops.is_empty() {
        return match mirror.jobs.get(&c.job_id) {
            Some(job) => answer(Outcome::JobStarted {
                created: false,
                job: mirror.job_view(job),
            }),
            None => refuse(EngineError::Missing(format!("job {}", c.job_id))),
        };
    }
    Decision::Write(ops, Plan::Job(c.job_id))
}

fn decide_message(mirror: &Mirror, c: PostMessage, now_ms: u64) -> Decision {
    // A known id is answered with the stored message whatever the clock
    // says now: the receiver ignores what it already has (ADR-036).
    if let Some(known) = mirror.messages.get(&c.id) {
        if known.body != c.body || known.thread_id != c.thread_id {
            return refuse(EngineError::Conflict(format!(
                "message {} was posted with another body or thread",
                c.id
            )));
        }
        return answer(Outcome::MessagePosted {
            created: false,
            message: known.view(),
        });
    }
    let id_time_ms = c.id.time_ms();
    let skew_ms = i128::from(id_time_ms) - i128::from(now_ms);
    if skew_ms.unsigned_abs() > u128::from(c.window_ms) {
        return refuse(EngineError::ClockSkew {
            server_time_ms: now_ms,
            id_time_ms,
            // The difference of two u64 fits an i128; clamp to i64 for the wire.
            skew_ms: i64::try_from(skew_ms).unwrap_or(if skew_ms > 0 {
                i64::MAX
            } else {
                i64::MIN
            }),
        });
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
