//! Why a command was refused: [`EngineError`], with one variant per answer
//! and one [`Conflict`] per kind of conflict (SPEC section 10). The HTTP
//! layer maps each to problem+json in one place (`src/api/problem.rs`).

use crate::ids::{Id, RequestIdError};
use crate::op::MediaRole;
use crate::wire::CLOCK_WINDOW_MS;

/// Why a command was refused. Each maps to one problem `code` (SPEC 10).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The moment does not exist: `404 not_found`.
    #[error("moment {0} does not exist")]
    MomentNotFound(Id),
    /// The entity is a tombstone: `410 deleted`.
    #[error("moment {0} is deleted")]
    Deleted(Id),
    /// Something other than a moment does not exist (a turn, a mark, ...):
    /// `404 not_found`. The text names it.
    #[error("{0} does not exist")]
    Missing(String),
    /// A message id's time is outside the clock window
    /// ([`CLOCK_WINDOW_MS`]): `400 clock_skew` (SPEC section 5).
    #[error(
        "the message id's time is {skew_ms} ms from the server clock; the window is {} minutes",
        CLOCK_WINDOW_MS / 60_000
    )]
    ClockSkew {
        /// The server clock, Unix ms.
        server_time_ms: u64,
        /// The time in the id, Unix ms.
        id_time_ms: u64,
        /// `id_time_ms - server_time_ms`.
        skew_ms: i64,
    },
    /// A request id (or a recall or job id) breaks SPEC section 2:
    /// `400 request_id_too_long` or `400 invalid_request`.
    #[error("{0}")]
    RequestId(RequestIdError),
    /// The request cannot be carried out as it stands: `400 invalid_request`.
    #[error("{0}")]
    Invalid(String),
    /// What the request names is already something else: `409 conflict`.
    #[error("{0}")]
    Conflict(Conflict),
    /// `If-Match` named another version: `412 precondition_failed`.
    #[error("the moment is at version {current}, not {expected}")]
    PreconditionFailed {
        /// The moment's version now.
        current: u32,
        /// The version the client named.
        expected: u32,
    },
    /// The write path is stopped (poisoned by an I/O error, or shutting
    /// down): `503 unavailable`. Nothing was acknowledged.
    #[error("writes are unavailable: {0}")]
    Unavailable(String),
    /// The disk's free space is below the reserve (`log.disk_reserve_bytes`),
    /// or a write found the disk full: `507 insufficient_storage` with
    /// `Retry-After` (SPEC section 10). Nothing was acknowledged; writes
    /// resume by themselves once space is back.
    #[error("not enough free disk space: {0}")]
    InsufficientStorage(String),
    /// With `[archive]`: another engine took this archive's prefix over
    /// (`--take-over`) and this one found out (its manifest put met a newer
    /// epoch's): `503 fenced`. From then on it acknowledges nothing, until
    /// a restart, which refuses to start on a prefix held by another writer
    /// (SPEC section 11, ARCHIVE.md "Epoch").
    #[error("this engine is fenced: {0}; another engine holds the archive's prefix and takes the writes now")]
    Fenced(String),
}

impl From<Conflict> for EngineError {
    fn from(conflict: Conflict) -> EngineError {
        EngineError::Conflict(conflict)
    }
}

impl From<RequestIdError> for EngineError {
    fn from(error: RequestIdError) -> EngineError {
        EngineError::RequestId(error)
    }
}

/// One kind of `409 conflict`, with what conflicted (SPEC sections 3, 4
/// and 5). `Display` is the problem's `detail`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// The request id was already used by another kind of request or for
    /// another entity (SPEC section 3).
    #[error("request id {request_id:?} was already used by a {used_by_kind} of {used_by}")]
    RequestId {
        /// The request id.
        request_id: String,
        /// The kind name of the op that used it (`moment.create`, ...).
        used_by_kind: &'static str,
        /// The entity that op was about.
        used_by: String,
    },
    /// A derived request id (a recall's `<recall id>:turn`, a job's
    /// `<job id>:<index>`) is already used, or a client's `turn.start`
    /// carries one that a job or a recall derived (SPEC section 2).
    #[error("request id {request_id:?} is already used")]
    DerivedRequestId {
        /// The derived request id.
        request_id: String,
    },
    /// The request id started a turn of another moment.
    #[error("request id {request_id:?} started turn {turn_id} of moment {moment_id}")]
    TurnRequest {
        /// The request id.
        request_id: String,
        /// The turn it started.
        turn_id: Id,
        /// That turn's moment.
        moment_id: Id,
    },
    /// The media id was uploaded with other bytes (SPEC section 4).
    #[error(
        "media {media_id} was uploaded with sha256 {stored}; these bytes hash to {offered}",
        stored = hex::encode(stored_sha256),
        offered = hex::encode(offered_sha256)
    )]
    MediaBytes {
        /// The media id.
        media_id: Id,
        /// SHA-256 of the stored bytes.
        stored_sha256: [u8; 32],
        /// SHA-256 of the offered bytes.
        offered_sha256: [u8; 32],
    },
    /// The media id belongs to another moment, photo or role (SPEC section
    /// 4; the photo from issue 27).
    #[error("media {media_id} belongs to moment {moment_id} as the {} of its photo {photo}", role.name())]
    MediaOwner {
        /// The media id.
        media_id: Id,
        /// The moment it belongs to.
        moment_id: Id,
        /// Its photo there.
        photo: u8,
        /// Its role there.
        role: MediaRole,
    },
    /// The role of the moment's photo is filled by another media (SPEC
    /// section 4; each photo holds one copy and one original, issue 27).
    #[error("moment {moment_id} already has the {} of its photo {photo}: media {media_id}", role.name())]
    RoleTaken {
        /// The moment.
        moment_id: Id,
        /// The photo asked for.
        photo: u8,
        /// The role asked for.
        role: MediaRole,
        /// The media that fills it.
        media_id: Id,
    },
    /// The job id reads another moment.
    #[error("job {job_id:?} reads moment {moment_id}")]
    JobMoment {
        /// The job id.
        job_id: String,
        /// The moment it reads.
        moment_id: Id,
    },
    /// The message id was posted with another body or thread (SPEC
    /// section 5).
    #[error("message {message_id} was posted with another body or thread")]
    Message {
        /// The message id.
        message_id: Id,
    },
}

impl Conflict {
    /// The kind's stable name, the problem's `conflict` member.
    pub fn kind(&self) -> &'static str {
        match self {
            Conflict::RequestId { .. } => "request_id",
            Conflict::DerivedRequestId { .. } => "derived_request_id",
            Conflict::TurnRequest { .. } => "turn_request",
            Conflict::MediaBytes { .. } => "media_bytes",
            Conflict::MediaOwner { .. } => "media_owner",
            Conflict::RoleTaken { .. } => "media_role",
            Conflict::JobMoment { .. } => "job_moment",
            Conflict::Message { .. } => "message",
        }
    }
}
