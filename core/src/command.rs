//! The write commands, validated by a caller (the HTTP layer, the turn
//! runner, a test) on their way to the sequencer, and the keys that keep two
//! commands on one entity out of the same batch.

use crate::ids::{job_turn_request_id, mark_id, recall_turn_request_id, Id};
use crate::op::MediaRole;

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
pub type FieldChange = crate::wire::bodies::PatchField;

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
    /// Which photo of the moment (`X-Photo`), `0 ..`
    /// [`crate::wire::PHOTOS_PER_MOMENT`]; the HTTP layer refuses others.
    pub photo: u8,
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

/// A key two commands may share; two commands with a common key are never
/// decided in the same batch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// A request id (given or derived).
    Request(String),
    /// An entity id (a moment, a media, a turn, a message).
    Entity(Id),
    /// A named entity (a mark id).
    Name(String),
}

impl Command {
    /// The keys this command reads or writes.
    pub fn keys(&self) -> Vec<Key> {
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
