//! Ops: the typed, versioned changes that the log carries (SPEC section 7).
//!
//! Each op is one log record: the record header holds its seq, server time
//! (`ts_ms`), kind code and kind version; the payload is the op's struct
//! encoded by [`crate::codec`]. Every op carries the request id that caused
//! it (if any) and the device that sent it (SPEC section 9). Old versions stay
//! readable forever: `tests/durability/op_vectors.rs` pins the bytes of every kind.

use serde::{Deserialize, Serialize};
use spark_log_format::{CompactionRecord, RecordRef};

use crate::codec::{self, CodecError};
use crate::ids::Id;

/// The kinds of op, with their stable codes in the record header. Code 0 is
/// the log's seal and never an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// `moment.create`: a new moment, with its id, request id and content.
    MomentCreate,
    /// `moment.edit`: new values for some of a moment's text fields.
    MomentEdit,
    /// `moment.delete`: the moment's tombstone.
    MomentDelete,
    /// `media.put`: a blob (copy or original) stored for a moment.
    MediaPut,
    /// `turn.start`: a brain is to give a reading of a moment.
    TurnStart,
    /// `turn.finish`: the brain's answer.
    TurnFinish,
    /// `turn.fail`: the brain gave no answer.
    TurnFail,
    /// `mark.keep`: a phrase kept for quick recall.
    MarkKeep,
    /// `mark.drop`: a kept phrase dropped.
    MarkDrop,
    /// `job.start`: a high-quality job, one practical turn per seat.
    JobStart,
    /// `recall.start`: a quick-recall session over the kept phrases.
    RecallStart,
    /// `message.post`: a message in a moment's thread.
    MessagePost,
    /// `log.compact`: the log's compaction record (FORMAT.md,
    /// "Compaction"), written by the log itself after it erased the content
    /// of deleted moments (SPEC section 13); never by the sequencer.
    LogCompact,
}

impl OpKind {
    /// Every kind this build reads, in code order.
    pub const ALL: [OpKind; 13] = [
        OpKind::MomentCreate,
        OpKind::MomentEdit,
        OpKind::MomentDelete,
        OpKind::MediaPut,
        OpKind::TurnStart,
        OpKind::TurnFinish,
        OpKind::TurnFail,
        OpKind::MarkKeep,
        OpKind::MarkDrop,
        OpKind::JobStart,
        OpKind::RecallStart,
        OpKind::MessagePost,
        OpKind::LogCompact,
    ];

    /// The code written in the record header.
    pub fn code(self) -> u16 {
        match self {
            OpKind::MomentCreate => 1,
            OpKind::MomentEdit => 2,
            OpKind::MomentDelete => 3,
            OpKind::MediaPut => 4,
            OpKind::TurnStart => 5,
            OpKind::TurnFinish => 6,
            OpKind::TurnFail => 7,
            OpKind::MarkKeep => 8,
            OpKind::MarkDrop => 9,
            OpKind::MessagePost => 10,
            OpKind::JobStart => 11,
            OpKind::RecallStart => 12,
            OpKind::LogCompact => spark_log_format::KIND_COMPACTION,
        }
    }

    /// The kind for a record header code, if this build knows it.
    pub fn from_code(code: u16) -> Option<OpKind> {
        match code {
            1 => Some(OpKind::MomentCreate),
            2 => Some(OpKind::MomentEdit),
            3 => Some(OpKind::MomentDelete),
            4 => Some(OpKind::MediaPut),
            5 => Some(OpKind::TurnStart),
            6 => Some(OpKind::TurnFinish),
            7 => Some(OpKind::TurnFail),
            8 => Some(OpKind::MarkKeep),
            9 => Some(OpKind::MarkDrop),
            10 => Some(OpKind::MessagePost),
            11 => Some(OpKind::JobStart),
            12 => Some(OpKind::RecallStart),
            spark_log_format::KIND_COMPACTION => Some(OpKind::LogCompact),
            _ => None,
        }
    }

    /// The newest payload version of this kind; this build writes it and
    /// reads it and every older one.
    pub fn current_version(self) -> u16 {
        match self {
            OpKind::LogCompact => spark_log_format::COMPACTION_KIND_VERSION,
            // Version 2 added the photo number (issue 27: several photos
            // per moment); version 1 reads as photo 0.
            OpKind::MediaPut => 2,
            _ => 1,
        }
    }

    /// The kind's name as SPEC section 7 spells it (`moment.create`, ...).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::MomentCreate => "moment.create",
            OpKind::MomentEdit => "moment.edit",
            OpKind::MomentDelete => "moment.delete",
            OpKind::MediaPut => "media.put",
            OpKind::TurnStart => "turn.start",
            OpKind::TurnFinish => "turn.finish",
            OpKind::TurnFail => "turn.fail",
            OpKind::MarkKeep => "mark.keep",
            OpKind::MarkDrop => "mark.drop",
            OpKind::JobStart => "job.start",
            OpKind::RecallStart => "recall.start",
            OpKind::MessagePost => "message.post",
            OpKind::LogCompact => "log.compact",
        }
    }

    /// True for the kinds whose ops carry content a deleted moment's
    /// erasure removes (SPEC section 13; see [`OpBody::erased`]): create,
    /// edit, turn finish and fail, message. Known from a record's header
    /// alone, so a reader skips the others without decoding them.
    pub fn has_content(self) -> bool {
        matches!(
            self,
            OpKind::MomentCreate
                | OpKind::MomentEdit
                | OpKind::TurnFinish
                | OpKind::TurnFail
                | OpKind::MessagePost
        )
    }

    /// The kind named `name` (as in [`OpKind::name`]).
    pub fn from_name(name: &str) -> Option<OpKind> {
        OpKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Payload of `moment.create`, version 1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MomentCreate {
    /// The moment's id: phone-minted, or minted by the sequencer when the
    /// request carried none (the fold never mints).
    pub id: Id,
    /// The request id that caused the create (`client_request_id` or
    /// `Idempotency-Key`), if any.
    pub request_id: Option<String>,
    /// The device that sent it (SPEC section 9).
    pub device: String,
    /// What the sign says, as typed or recognised on the phone.
    pub text: Option<String>,
    /// The person's caption.
    pub caption: Option<String>,
    /// Language tag of the text, as the client sent it.
    pub lang: Option<String>,
    /// When the photo was taken, Unix milliseconds.
    pub captured_at_ms: Option<i64>,
}

/// Payload of `moment.edit`, version 1. A field is `None` when the edit
/// leaves it alone, `Some(None)` when it clears it, `Some(Some(v))` when it
/// sets it. Only fields whose value changes are written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MomentEdit {
    /// The edited moment.
    pub id: Id,
    /// The edit's request id, if the client sent one.
    pub request_id: Option<String>,
    /// The device that sent it.
    pub device: String,
    /// New `text`, if changed.
    pub text: Option<Option<String>>,
    /// New `caption`, if changed.
    pub caption: Option<Option<String>>,
    /// New `lang`, if changed.
    pub lang: Option<Option<String>>,
}

/// Payload of `moment.delete`, version 1: the moment becomes a tombstone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MomentDelete {
    /// The deleted moment.
    pub id: Id,
    /// The delete's request id, if the client sent one.
    pub request_id: Option<String>,
    /// The device that sent it.
    pub device: String,
}

/// Which of a moment's two media a blob is (SPEC section 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MediaRole {
    /// The small copy the brain reads.
    Copy,
    /// The full-size original.
    Original,
}

impl MediaRole {
    /// `"copy"` or `"original"`, as on the wire.
    pub fn name(self) -> &'static str {
        match self {
            MediaRole::Copy => "copy",
            MediaRole::Original => "original",
        }
    }
}

/// A SHA-256 digest: 32 bytes in the log, 64 lower-case hex characters in
/// JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sha256(pub [u8; 32]);

impl Serialize for Sha256 {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.serialize_str(&hex::encode(self.0))
        } else {
            self.0.serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for Sha256 {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Sha256, D::Error> {
        if deserializer.is_human_readable() {
            let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
            let mut out = [0u8; 32];
            hex::decode_to_slice(text.as_bytes(), &mut out).map_err(serde::de::Error::custom)?;
            Ok(Sha256(out))
        } else {
            <[u8; 32]>::deserialize(deserializer).map(Sha256)
        }
    }
}

/// Payload of `media.put`, version 2: the blob is durable under its SHA-256
/// before this op is written. Uploads carry no request id: the phone-minted
/// media id plus the hash make a replay harmless. Version 2 is version 1
/// with `photo` added at the end; a version-1 record reads as photo 0
/// ([`MediaPutV1`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaPut {
    /// The phone-minted media id.
    pub id: Id,
    /// The moment it belongs to.
    pub moment_id: Id,
    /// Copy or original.
    pub role: MediaRole,
    /// SHA-256 of the bytes.
    pub sha256: Sha256,
    /// Number of bytes.
    pub size_bytes: u64,
    /// The `Content-Type` it was uploaded with.
    pub content_type: String,
    /// The device that sent it.
    pub device: String,
    /// Which photo of the moment it is, `0 ..`
    /// [`crate::wire::PHOTOS_PER_MOMENT`] (`X-Photo`, issue 27).
    pub photo: u8,
}

/// Payload of `media.put`, version 1 (before several photos per moment):
/// read only, as photo 0 of its moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaPutV1 {
    /// The phone-minted media id.
    pub id: Id,
    /// The moment it belongs to.
    pub moment_id: Id,
    /// Copy or original.
    pub role: MediaRole,
    /// SHA-256 of the bytes.
    pub sha256: Sha256,
    /// Number of bytes.
    pub size_bytes: u64,
    /// The `Content-Type` it was uploaded with.
    pub content_type: String,
    /// The device that sent it.
    pub device: String,
}

impl From<MediaPutV1> for MediaPut {
    fn from(v1: MediaPutV1) -> MediaPut {
        MediaPut {
            id: v1.id,
            moment_id: v1.moment_id,
            role: v1.role,
            sha256: v1.sha256,
            size_bytes: v1.size_bytes,
            content_type: v1.content_type,
            device: v1.device,
            photo: 0,
        }
    }
}

/// What a turn is for (SPEC section 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnMode {
    /// A practical reading of one photographed sign.
    Practical,
    /// A quick-recall session over kept phrases.
    Recall,
}

impl TurnMode {
    /// `"practical"` or `"recall"`, as on the wire.
    pub fn name(self) -> &'static str {
        match self {
            TurnMode::Practical => "practical",
            TurnMode::Recall => "recall",
        }
    }
}

/// Payload of `turn.start`, version 1. The brain is asked after this op is
/// durable; its outcome is a `turn.finish` or `turn.fail` of the same id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnStart {
    /// The engine-minted turn id.
    pub id: Id,
    /// The moment the turn reads.
    pub moment_id: Id,
    /// The seat (named brain configuration) that is asked.
    pub seat: String,
    /// Practical or recall.
    pub mode: TurnMode,
    /// The request id (a client's, or derived: `<recall id>:turn`,
    /// `<job id>:<index>`), if any.
    pub request_id: Option<String>,
    /// The device that caused it.
    pub device: String,
}

/// Payload of `turn.finish`, version 1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnFinish {
    /// The turn.
    pub id: Id,
    /// The brain's reading.
    pub answer: String,
    /// Which adapter answered (`local`, `openai`, ...).
    pub adapter: String,
    /// What the reading was made from (`ocr`, `text`, `model`, ...).
    pub source: String,
    /// How long the brain took, in milliseconds.
    pub elapsed_ms: u64,
}

/// Payload of `turn.fail`, version 1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnFail {
    /// The turn.
    pub id: Id,
    /// Why the brain gave no answer (an error, or the timeout).
    pub error: String,
    /// How long the attempt took, in milliseconds.
    pub elapsed_ms: u64,
}

/// Payload of `mark.keep`, version 1: a phrase kept (or kept again after a
/// drop). Its id is `keep:<normalised phrase>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkKeep {
    /// `keep:<phrase>`.
    pub id: String,
    /// The normalised phrase (NFKC, lower case, trimmed, single spaces).
    pub phrase: String,
    /// The moment it was kept from, if any.
    pub moment_id: Option<Id>,
    /// The device that kept it.
    pub device: String,
}

/// Payload of `mark.drop`, version 1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkDrop {
    /// `keep:<phrase>`.
    pub id: String,
    /// The device that dropped it.
    pub device: String,
}

/// Payload of `job.start`, version 1: a high-quality job over one moment.
/// Its turns follow as `turn.start` ops with request ids `<job id>:<index>`,
/// one per seat in this order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStart {
    /// The client's job id (at most 64 bytes; it is the job's request id).
    pub job_id: String,
    /// The moment the job reads.
    pub moment_id: Id,
    /// The seats asked, in configuration order at the time of the job.
    pub seats: Vec<String>,
    /// The device that started it.
    pub device: String,
}

/// Payload of `recall.start`, version 1: a quick-recall session. Its moment
/// follows as a `moment.create` with the recall id as request id, and its
/// turn as a `turn.start` with request id `<recall id>:turn`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecallStart {
    /// The recall id (the client's, at most 70 bytes, or engine-minted).
    pub id: String,
    /// The moment assembled from the kept phrases.
    pub moment_id: Id,
    /// The session's turn.
    pub turn_id: Id,
    /// The mark ids of the phrases used, most recent first.
    pub marks: Vec<String>,
    /// The device that started it.
    pub device: String,
}

/// Payload of `message.post`, version 1: a message in a moment's thread.
/// Its server time (`ts`) is the record's `ts_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessagePost {
    /// The ULID minted at the send attempt (its time was within the clock
    /// window when accepted: SPEC section 5).
    pub id: Id,
    /// The thread: a moment id.
    pub thread_id: Id,
    /// The text.
    pub body: String,
    /// The device that sent it.
    pub device: String,
}

/// The high bit of a record's `kind_version`: set on an **erased** op, one
/// whose content a compaction replaced (SPEC section 13). The low 15 bits are
/// the payload's version as before, and the payload is that version's
/// encoding with the content members emptied (see [`OpBody::erased`]): text,
/// caption and lang `None`, an edit's changes `None`, a turn's answer,
/// source and error and a message's body empty. Ids, request ids, devices,
/// times, sizes and digests stay.
pub const ERASED_BIT: u16 = 0x8000;

/// The default `[retention] erase_after_ms` (SPEC section 13): a day after
/// its delete, in milliseconds, a moment's content is due for erasure. The
/// one value the engine's setting and `spark-replay audit erasure` share.
pub const ERASE_AFTER_MS_DEFAULT: u64 = 86_400_000;

/// The payload members an erased op's JSON (`spark-replay dump`) leaves
/// out: the content [`OpBody::erased`] empties.
pub const ERASED_MEMBERS: &[&str] = &[
    "text", "caption", "lang", "changes", "answer", "source", "error", "body",
];

/// The device recorded on ops the engine writes on its own (turn outcomes).
pub const ENGINE_DEVICE: &str = "engine";

/// What an op is about: a ULID entity (moment, media, turn) or a named one
/// (mark, job, recall). `Display` gives the canonical text.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Entity {
    /// A moment, media or turn id.
    Id(Id),
    /// A mark id (`keep:<phrase>`), a job id or a recall id.
    Name(String),
}

impl std::fmt::Display for Entity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entity::Id(id) => write!(f, "{id}"),
            Entity::Name(name) => f.write_str(name),
        }
    }
}

impl Entity {
    /// The ULID, for id entities.
    pub fn id(&self) -> Option<Id> {
        match self {
            Entity::Id(id) => Some(*id),
            Entity::Name(_) => None,
        }
    }
}

/// An op's payload, by kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum OpBody {
    /// See [`MomentCreate`].
    MomentCreate(MomentCreate),
    /// See [`MomentEdit`].
    MomentEdit(MomentEdit),
    /// See [`MomentDelete`].
    MomentDelete(MomentDelete),
    /// See [`MediaPut`].
    MediaPut(MediaPut),
    /// See [`TurnStart`].
    TurnStart(TurnStart),
    /// See [`TurnFinish`].
    TurnFinish(TurnFinish),
    /// See [`TurnFail`].
    TurnFail(TurnFail),
    /// See [`MarkKeep`].
    MarkKeep(MarkKeep),
    /// See [`MarkDrop`].
    MarkDrop(MarkDrop),
    /// See [`JobStart`].
    JobStart(JobStart),
    /// See [`RecallStart`].
    RecallStart(RecallStart),
    /// See [`MessagePost`].
    MessagePost(MessagePost),
    /// The log's compaction record: the segments it rewrote (old and new
    /// seal chain values) and the moments it erased (their ids as the
    /// record's subjects).
    #[serde(serialize_with = "serialize_compaction")]
    LogCompact(CompactionRecord),
}

/// `log.compact`'s payload as JSON (`spark-replay dump`): `segments`, each
/// `first_seq`, `last_seq`, `old_seal` and `new_seal` (hex), and `erased`,
/// the moment ids.
fn serialize_compaction<S: serde::Serializer>(
    record: &CompactionRecord,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serde_json::json!({
        "segments": record.segments.iter().map(|s| serde_json::json!({
            "first_seq": s.first_seq,
            "last_seq": s.last_seq,
            "old_seal": hex::encode(s.old_seal),
            "new_seal": hex::encode(s.new_seal),
        })).collect::<Vec<_>>(),
        "erased": record.subjects.iter().map(|s| Id(u128::from_be_bytes(*s)).to_string()).collect::<Vec<_>>(),
    })
    .serialize(serializer)
}

impl OpBody {
    /// The op's kind.
    pub fn kind(&self) -> OpKind {
        match self {
            OpBody::MomentCreate(_) => OpKind::MomentCreate,
            OpBody::MomentEdit(_) => OpKind::MomentEdit,
            OpBody::MomentDelete(_) => OpKind::MomentDelete,
            OpBody::MediaPut(_) => OpKind::MediaPut,
            OpBody::TurnStart(_) => OpKind::TurnStart,
            OpBody::TurnFinish(_) => OpKind::TurnFinish,
            OpBody::TurnFail(_) => OpKind::TurnFail,
            OpBody::MarkKeep(_) => OpKind::MarkKeep,
            OpBody::MarkDrop(_) => OpKind::MarkDrop,
            OpBody::JobStart(_) => OpKind::JobStart,
            OpBody::RecallStart(_) => OpKind::RecallStart,
            OpBody::MessagePost(_) => OpKind::MessagePost,
            OpBody::LogCompact(_) => OpKind::LogCompact,
        }
    }

    /// The request id the op carries, if any.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            OpBody::MomentCreate(p) => p.request_id.as_deref(),
            OpBody::MomentEdit(p) => p.request_id.as_deref(),
            OpBody::MomentDelete(p) => p.request_id.as_deref(),
            OpBody::TurnStart(p) => p.request_id.as_deref(),
            // A job's id is its request id: a retried job lands on it.
            OpBody::JobStart(p) => Some(&p.job_id),
            OpBody::MediaPut(_)
            | OpBody::TurnFinish(_)
            | OpBody::TurnFail(_)
            | OpBody::MarkKeep(_)
            | OpBody::MarkDrop(_)
            | OpBody::RecallStart(_)
            | OpBody::MessagePost(_)
            | OpBody::LogCompact(_) => None,
        }
    }

    /// Takes the request id out of the payload (leaving `None` where the
    /// payload holds an `Option`), for the fold, which keeps it in the
    /// request index without copying it. A job's request id is its
    /// `job_id`, which stays in place: that one is copied.
    pub fn take_request_id(&mut self) -> Option<String> {
        match self {
            OpBody::MomentCreate(p) => p.request_id.take(),
            OpBody::MomentEdit(p) => p.request_id.take(),
            OpBody::MomentDelete(p) => p.request_id.take(),
            // A turn keeps its request id in place; a job's is its id.
            other => other.request_id().map(str::to_owned),
        }
    }

    /// The device that caused the op.
    pub fn device(&self) -> &str {
        match self {
            OpBody::MomentCreate(p) => &p.device,
            OpBody::MomentEdit(p) => &p.device,
            OpBody::MomentDelete(p) => &p.device,
            OpBody::MediaPut(p) => &p.device,
            OpBody::TurnStart(p) => &p.device,
            OpBody::MarkKeep(p) => &p.device,
            OpBody::MarkDrop(p) => &p.device,
            OpBody::JobStart(p) => &p.device,
            OpBody::RecallStart(p) => &p.device,
            OpBody::MessagePost(p) => &p.device,
            // Outcomes come from the engine's own brain runner, the
            // compaction record from its compactor.
            OpBody::TurnFinish(_) | OpBody::TurnFail(_) | OpBody::LogCompact(_) => ENGINE_DEVICE,
        }
    }

    /// The entity the op is about: the moment, media or turn id, the mark
    /// id (`keep:<phrase>`), the job id or the recall id.
    pub fn entity(&self) -> Entity {
        match self {
            OpBody::MomentCreate(p) => Entity::Id(p.id),
            OpBody::MomentEdit(p) => Entity::Id(p.id),
            OpBody::MomentDelete(p) => Entity::Id(p.id),
            OpBody::MediaPut(p) => Entity::Id(p.id),
            OpBody::TurnStart(p) => Entity::Id(p.id),
            OpBody::TurnFinish(p) => Entity::Id(p.id),
            OpBody::TurnFail(p) => Entity::Id(p.id),
            OpBody::MarkKeep(p) => Entity::Name(p.id.clone()),
            OpBody::MarkDrop(p) => Entity::Name(p.id.clone()),
            OpBody::JobStart(p) => Entity::Name(p.job_id.clone()),
            OpBody::RecallStart(p) => Entity::Name(p.id.clone()),
            OpBody::MessagePost(p) => Entity::Id(p.id),
            OpBody::LogCompact(_) => Entity::Name(OpKind::LogCompact.name().to_owned()),
        }
    }

    /// What the op changes, as the change stream tells it: the ids of the
    /// entities it creates or updates, and of those it removes.
    pub fn change(&self) -> (Vec<String>, Vec<String>) {
        let ids = |list: &[Id]| list.iter().map(Id::to_string).collect::<Vec<_>>();
        match self {
            OpBody::MomentCreate(p) => (ids(&[p.id]), Vec::new()),
            OpBody::MomentEdit(p) => (ids(&[p.id]), Vec::new()),
            OpBody::MomentDelete(p) => (Vec::new(), ids(&[p.id])),
            OpBody::MediaPut(p) => (ids(&[p.id, p.moment_id]), Vec::new()),
            OpBody::TurnStart(p) => (ids(&[p.id, p.moment_id]), Vec::new()),
            OpBody::TurnFinish(p) => (ids(&[p.id]), Vec::new()),
            OpBody::TurnFail(p) => (ids(&[p.id]), Vec::new()),
            OpBody::MarkKeep(p) => (vec![p.id.clone()], Vec::new()),
            OpBody::MarkDrop(p) => (Vec::new(), vec![p.id.clone()]),
            OpBody::JobStart(p) => (vec![p.job_id.clone()], Vec::new()),
            OpBody::RecallStart(p) => (vec![p.id.clone()], Vec::new()),
            OpBody::MessagePost(p) => (ids(&[p.id, p.thread_id]), Vec::new()),
            // The erased moments changed: their content is gone.
            OpBody::LogCompact(p) => (
                p.subjects
                    .iter()
                    .map(|s| Id(u128::from_be_bytes(*s)).to_string())
                    .collect(),
                Vec::new(),
            ),
        }
    }

    /// True when the op carries content a deleted moment's erasure removes
    /// (SPEC section 13): a create's or edit's texts, a turn's answer,
    /// source or error, a message's body. The other kinds hold ids, times,
    /// sizes and digests only, and stay as written.
    pub fn has_content(&self) -> bool {
        self.kind().has_content()
    }

    /// The op with its content removed, as a compaction writes it (SPEC
    /// section 13): a create's and an edit's text, caption and lang become
    /// `None` (an edit then changes nothing but the version), a turn's
    /// answer, source and error and a message's body become empty. Ids,
    /// request ids, devices, times, the adapter and elapsed times stay. Kinds
    /// without content ([`OpBody::has_content`] false) come back unchanged.
    pub fn erased(self) -> OpBody {
        match self {
            OpBody::MomentCreate(p) => OpBody::MomentCreate(MomentCreate {
                text: None,
                caption: None,
                lang: None,
                ..p
            }),
            OpBody::MomentEdit(p) => OpBody::MomentEdit(MomentEdit {
                text: None,
                caption: None,
                lang: None,
                ..p
            }),
            OpBody::TurnFinish(p) => OpBody::TurnFinish(TurnFinish {
                answer: String::new(),
                source: String::new(),
                ..p
            }),
            OpBody::TurnFail(p) => OpBody::TurnFail(TurnFail {
                error: String::new(),
                ..p
            }),
            OpBody::MessagePost(p) => OpBody::MessagePost(MessagePost {
                body: String::new(),
                ..p
            }),
            other => other,
        }
    }

    /// Encodes the payload at the kind's current version: `(kind code,
    /// kind version, payload bytes)`.
    pub fn encode(&self) -> Result<(u16, u16, Vec<u8>), CodecError> {
        let kind = self.kind();
        let payload = match self {
            OpBody::MomentCreate(p) => codec::encode(p)?,
            OpBody::MomentEdit(p) => codec::encode(p)?,
            OpBody::MomentDelete(p) => codec::encode(p)?,
            OpBody::MediaPut(p) => codec::encode(p)?,
            OpBody::TurnStart(p) => codec::encode(p)?,
            OpBody::TurnFinish(p) => codec::encode(p)?,
            OpBody::TurnFail(p) => codec::encode(p)?,
            OpBody::MarkKeep(p) => codec::encode(p)?,
            OpBody::MarkDrop(p) => codec::encode(p)?,
            OpBody::JobStart(p) => codec::encode(p)?,
            OpBody::RecallStart(p) => codec::encode(p)?,
            OpBody::MessagePost(p) => codec::encode(p)?,
            // Its own fixed layout (FORMAT.md, "Compaction"), not the codec's.
            OpBody::LogCompact(p) => p.encode(),
        };
        Ok((kind.code(), kind.current_version(), payload))
    }
}

/// One op as read from the log: seq and time from the record header, plus
/// the decoded payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// Position in the log, gapless from 1.
    pub seq: u64,
    /// Server time when the sequencer decided the op, Unix milliseconds.
    pub ts_ms: u64,
    /// The payload.
    pub body: OpBody,
    /// True when a compaction erased the op's content ([`ERASED_BIT`] set in
    /// the record's `kind_version`): `body` is then [`OpBody::erased`]'s
    /// form, and the fold marks its moment erased (SPEC section 13).
    pub erased: bool,
}

impl Op {
    /// A live (not erased) op: what the sequencer writes.
    pub fn new(seq: u64, ts_ms: u64, body: OpBody) -> Op {
        Op {
            seq,
            ts_ms,
            body,
            erased: false,
        }
    }

    /// The record a compaction writes in place of this op's: `(kind code,
    /// kind version with [`ERASED_BIT`], payload of [`OpBody::erased`])`.
    ///
    /// Errors: the codec's, as [`OpBody::encode`].
    pub fn encode_erased(&self) -> Result<(u16, u16, Vec<u8>), CodecError> {
        let (code, version, payload) = self.body.clone().erased().encode()?;
        Ok((code, version | ERASED_BIT, payload))
    }
}

/// Why a record does not decode into an op.
#[derive(Debug, thiserror::Error)]
pub enum OpDecodeError {
    /// The record's kind code is not one this build knows.
    #[error("seq {seq}: unknown op kind code {code}")]
    UnknownKind {
        /// The record's seq.
        seq: u64,
        /// The unknown kind code.
        code: u16,
    },
    /// The record is of a newer version than this build reads.
    #[error(
        "seq {seq}: {kind} version {version} is newer than this build reads (up to {supported})"
    )]
    NewerVersion {
        /// The record's seq.
        seq: u64,
        /// The kind's name.
        kind: &'static str,
        /// The version found.
        version: u16,
        /// The newest version this build reads.
        supported: u16,
    },
    /// A `log.compact` payload that does not decode (FORMAT.md,
    /// "Compaction").
    #[error("seq {seq}: log.compact payload: {reason}")]
    Compaction {
        /// The record's seq.
        seq: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// The payload is not a valid encoding of its kind.
    #[error("seq {seq}: {kind} payload: {source}")]
    Payload {
        /// The record's seq.
        seq: u64,
        /// The kind's name.
        kind: &'static str,
        /// What the codec said.
        #[source]
        source: CodecError,
    },
}

impl Op {
    /// Decodes one record of the log into an op. Errors, never panics, on an
    /// unknown kind, a newer version or a payload that does not decode.
    pub fn decode(record: &RecordRef<'_>) -> Result<Op, OpDecodeError> {
        let seq = record.seq;
        let kind = OpKind::from_code(record.kind).ok_or(OpDecodeError::UnknownKind {
            seq,
            code: record.kind,
        })?;
        let erased = record.kind_version & ERASED_BIT != 0;
        let version = record.kind_version & !ERASED_BIT;
        if version == 0 || version > kind.current_version() {
            return Err(OpDecodeError::NewerVersion {
                seq,
                kind: kind.name(),
                version,
                supported: kind.current_version(),
            });
        }
        let wrap = |source| OpDecodeError::Payload {
            seq,
            kind: kind.name(),
            source,
        };
        let bytes = record.payload;
        let body = match kind {
            OpKind::MomentCreate => OpBody::MomentCreate(codec::decode(bytes).map_err(wrap)?),
            OpKind::MomentEdit => OpBody::MomentEdit(codec::decode(bytes).map_err(wrap)?),
            OpKind::MomentDelete => OpBody::MomentDelete(codec::decode(bytes).map_err(wrap)?),
            OpKind::MediaPut if version == 1 => {
                OpBody::MediaPut(codec::decode::<MediaPutV1>(bytes).map_err(wrap)?.into())
            }
            OpKind::MediaPut => OpBody::MediaPut(codec::decode(bytes).map_err(wrap)?),
            OpKind::TurnStart => OpBody::TurnStart(codec::decode(bytes).map_err(wrap)?),
            OpKind::TurnFinish => OpBody::TurnFinish(codec::decode(bytes).map_err(wrap)?),
            OpKind::TurnFail => OpBody::TurnFail(codec::decode(bytes).map_err(wrap)?),
            OpKind::MarkKeep => OpBody::MarkKeep(codec::decode(bytes).map_err(wrap)?),
            OpKind::MarkDrop => OpBody::MarkDrop(codec::decode(bytes).map_err(wrap)?),
            OpKind::JobStart => OpBody::JobStart(codec::decode(bytes).map_err(wrap)?),
            OpKind::RecallStart => OpBody::RecallStart(codec::decode(bytes).map_err(wrap)?),
            OpKind::MessagePost => OpBody::MessagePost(codec::decode(bytes).map_err(wrap)?),
            OpKind::LogCompact => {
                OpBody::LogCompact(CompactionRecord::decode(bytes).map_err(|e| {
                    OpDecodeError::Compaction {
                        seq,
                        reason: e.to_string(),
                    }
                })?)
            }
        };
        Ok(Op {
            seq,
            ts_ms: record.ts_ms,
            body,
            erased,
        })
    }

    /// The op as one JSON object, the line `spark-replay dump` prints: `seq`,
    /// `ts_ms`, `kind`, `request_id` (or null), `entity_id`, `device`, and the
    /// payload under `payload`. An erased op also has `"erased": true`, and
    /// its payload none of the content members ([`ERASED_MEMBERS`]).
    ///
    /// An edit's payload shows only the fields it touched: a member set to
    /// `null` was cleared, an absent member was left alone.
    pub fn to_json(&self) -> serde_json::Value {
        let payload = match &self.body {
            OpBody::MomentEdit(p) => {
                let mut changes = serde_json::Map::new();
                for (name, change) in [
                    ("text", &p.text),
                    ("caption", &p.caption),
                    ("lang", &p.lang),
                ] {
                    if let Some(value) = change {
                        changes.insert(name.into(), serde_json::json!(value));
                    }
                }
                serde_json::json!({
                    "id": p.id,
                    "request_id": p.request_id,
                    "device": p.device,
                    "changes": changes,
                })
            }
            other => serde_json::to_value(other).unwrap_or(serde_json::Value::Null),
        };
        let mut payload = payload;
        if self.erased {
            if let serde_json::Value::Object(members) = &mut payload {
                for name in ERASED_MEMBERS {
                    members.remove(*name);
                }
            }
        }
        let mut line = serde_json::json!({
            "seq": self.seq,
            "ts_ms": self.ts_ms,
            "kind": self.body.kind().name(),
            "request_id": self.body.request_id(),
            "entity_id": self.body.entity().to_string(),
            "device": self.body.device(),
            "payload": payload,
        });
        if self.erased {
            line["erased"] = serde_json::Value::Bool(true);
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entity_is_24_bytes() {
        // An id is 16 bytes aligned to 8; the tag fits in the rest.
        assert_eq!(std::mem::size_of::<Entity>(), 24);
    }

    #[test]
    fn every_kind_round_trips_through_its_code_and_name() {
        let mut seen = 0;
        for code in 0..=u16::MAX {
            if let Some(kind) = OpKind::from_code(code) {
                assert_eq!(kind.code(), code);
                assert!(
                    OpKind::ALL.contains(&kind),
                    "{} missing from ALL",
                    kind.name()
                );
                assert_eq!(OpKind::from_name(kind.name()), Some(kind));
                seen += 1;
            }
        }
        assert_eq!(seen, OpKind::ALL.len());
        assert_eq!(OpKind::from_code(0), None, "0 is the seal");
    }
}
