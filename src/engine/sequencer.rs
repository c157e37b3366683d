//! The sequencer: turns a command into either an answer from what is known
//! or one op to write. It reads only the committed mirror; the journal keeps
//! commands that share a key with an op in flight out of the same batch.
//!
//! The two keys of a create (SPEC section 3), in this order: the request id
//! (if an earlier op carried it, answer with what that op produced), then the
//! entity id (if the moment exists, deleted or not, answer with it). Only a
//! command that passes both becomes an op.

use crate::ids::Id;
use crate::mirror::{Mirror, Moment};
use crate::op::{
    MediaPut, MediaRole, MomentCreate, MomentDelete, MomentEdit, OpBody, OpKind, Sha256,
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
}

/// A key two commands may share; two commands with a common key are never
/// decided in the same batch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Key {
    Request(String),
    Entity(Id),
}

impl Command {
    /// The keys this command reads or writes.
    pub(super) fn keys(&self) -> Vec<Key> {
        let (request_id, entity) = match self {
            Command::CreateMoment(c) => (&c.request_id, c.id),
            Command::EditMoment(c) => (&c.request_id, Some(c.id)),
            Command::DeleteMoment(c) => (&c.request_id, Some(c.id)),
            // The media id and its moment (whose role slots it fills).
            Command::PutMedia(c) => return vec![Key::Entity(c.id), Key::Entity(c.moment_id)],
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
#[derive(Clone, Copy, Debug)]
pub(super) enum Plan {
    Created(Id),
    Edited(Id),
    Deleted(Id),
    MediaPut(Id),
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
        })
    }
}

/// What the sequencer made of a command.
pub(super) enum Decision {
    /// Answer now; nothing to write.
    Answer(Result<Outcome, EngineError>),
    /// Write this op, then answer by the plan.
    Write(OpBody, Plan),
}

/// Decides one command against the committed mirror. `mint` gives a fresh
/// ULID for creates without an id.
pub(super) fn decide(mirror: &Mirror, command: Command, mint: &mut dyn FnMut() -> Id) -> Decision {
    match command {
        Command::CreateMoment(c) => decide_create(mirror, c, mint),
        Command::EditMoment(c) => decide_edit(mirror, c),
        Command::DeleteMoment(c) => decide_delete(mirror, c),
        Command::PutMedia(c) => decide_put_media(mirror, c),
    }
}

/// Looks up a request id: `Ok(None)` when unknown, `Ok(Some(moment))` when
/// it was produced by an op of `kind` on `entity` (any entity when `None`),
/// `Err(conflict)` when it belongs to something else.
fn known_request<'m>(
    mirror: &'m Mirror,
    request_id: Option<&str>,
    kind: OpKind,
    entity: Option<Id>,
) -> Result<Option<&'m Moment>, EngineError> {
    let Some(request_id) = request_id else {
        return Ok(None);
    };
    let Some(row) = mirror.requests.get(request_id) else {
        return Ok(None);
    };
    if row.kind != kind || entity.is_some_and(|id| id != row.entity_id) {
        return Err(EngineError::Conflict(format!(
            "request id {request_id:?} was already used by a {} of moment {}",
            row.kind.name(),
            row.entity_id
        )));
    }
    Ok(mirror.moment(row.entity_id))
}

fn answer(outcome: Outcome) -> Decision {
    Decision::Answer(Ok(outcome))
}

fn refuse(error: EngineError) -> Decision {
    Decision::Answer(Err(error))
}

fn decide_create(mirror: &Mirror, c: CreateMoment, mint: &mut dyn FnMut() -> Id) -> Decision {
    // Key 1: the request id, whatever `id` the request carries now.
    match known_request(mirror, c.request_id.as_deref(), OpKind::MomentCreate, None) {
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
        OpBody::MomentCreate(MomentCreate {
            id,
            request_id: c.request_id,
            device: c.device,
            text: c.text,
            caption: c.caption,
            lang: c.lang,
            captured_at_ms: c.captured_at_ms,
        }),
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
fn field_change(current: &Option<String>, wanted: FieldChange) -> FieldChange {
    match wanted {
        Some(value) if value != *current => Some(value),
        _ => None,
    }
}

fn decide_edit(mirror: &Mirror, c: EditMoment) -> Decision {
    match known_request(
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
    let text = field_change(&moment.text, c.text);
    let caption = field_change(&moment.caption, c.caption);
    let lang = field_change(&moment.lang, c.lang);
    if text.is_none() && caption.is_none() && lang.is_none() {
        return answer(Outcome::MomentEdited {
            changed: false,
            moment: mirror.moment_view(moment),
        });
    }
    Decision::Write(
        OpBody::MomentEdit(MomentEdit {
            id: c.id,
            request_id: c.request_id,
            device: c.device,
            text,
            caption,
            lang,
        }),
        Plan::Edited(c.id),
    )
}

fn decide_delete(mirror: &Mirror, c: DeleteMoment) -> Decision {
    match known_request(
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
        OpBody::MomentDelete(MomentDelete {
            id: c.id,
            request_id: c.request_id,
            device: c.device,
        }),
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
        .media
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
        OpBody::MediaPut(MediaPut {
            id: c.id,
            moment_id: c.moment_id,
            role: c.role,
            sha256: Sha256(c.sha256),
            size_bytes: c.size_bytes,
            content_type: c.content_type,
            device: c.device,
        }),
        Plan::MediaPut(c.id),
    )
}
