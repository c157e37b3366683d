//! Ops: the typed, versioned changes that the log carries (SPEC section 7).
//!
//! Each op is one log record: the record header holds its seq, server time
//! (`ts_ms`), kind code and kind version; the payload is the op's struct
//! encoded by [`crate::codec`]. Every op carries the request id that caused
//! it (if any) and the device that sent it (SPEC section 9). Old versions stay
//! readable forever: `tests/op_vectors.rs` pins the bytes of every kind.

use serde::{Deserialize, Serialize};
use spark_log_format::RecordRef;

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
}

impl OpKind {
    /// Every kind this build reads, in code order.
    pub const ALL: [OpKind; 4] = [
        OpKind::MomentCreate,
        OpKind::MomentEdit,
        OpKind::MomentDelete,
        OpKind::MediaPut,
    ];

    /// The code written in the record header.
    pub fn code(self) -> u16 {
        match self {
            OpKind::MomentCreate => 1,
            OpKind::MomentEdit => 2,
            OpKind::MomentDelete => 3,
            OpKind::MediaPut => 4,
        }
    }

    /// The kind for a record header code, if this build knows it.
    pub fn from_code(code: u16) -> Option<OpKind> {
        match code {
            1 => Some(OpKind::MomentCreate),
            2 => Some(OpKind::MomentEdit),
            3 => Some(OpKind::MomentDelete),
            4 => Some(OpKind::MediaPut),
            _ => None,
        }
    }

    /// The newest payload version of this kind; this build writes it and
    /// reads it and every older one.
    pub fn current_version(self) -> u16 {
        1
    }

    /// The kind's name as SPEC section 7 spells it (`moment.create`, ...).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::MomentCreate => "moment.create",
            OpKind::MomentEdit => "moment.edit",
            OpKind::MomentDelete => "moment.delete",
            OpKind::MediaPut => "media.put",
        }
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

/// Payload of `media.put`, version 1: the blob is durable under its SHA-256
/// before this op is written. Uploads carry no request id: the phone-minted
/// media id plus the hash make a replay harmless.
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
}

impl OpBody {
    /// The op's kind.
    pub fn kind(&self) -> OpKind {
        match self {
            OpBody::MomentCreate(_) => OpKind::MomentCreate,
            OpBody::MomentEdit(_) => OpKind::MomentEdit,
            OpBody::MomentDelete(_) => OpKind::MomentDelete,
            OpBody::MediaPut(_) => OpKind::MediaPut,
        }
    }

    /// The request id the op carries, if any.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            OpBody::MomentCreate(p) => p.request_id.as_deref(),
            OpBody::MomentEdit(p) => p.request_id.as_deref(),
            OpBody::MomentDelete(p) => p.request_id.as_deref(),
            OpBody::MediaPut(_) => None,
        }
    }

    /// The device that caused the op.
    pub fn device(&self) -> &str {
        match self {
            OpBody::MomentCreate(p) => &p.device,
            OpBody::MomentEdit(p) => &p.device,
            OpBody::MomentDelete(p) => &p.device,
            OpBody::MediaPut(p) => &p.device,
        }
    }

    /// The entity the op is about (the moment id for moment ops, the media
    /// id for `media.put`).
    pub fn entity_id(&self) -> Id {
        match self {
            OpBody::MomentCreate(p) => p.id,
            OpBody::MomentEdit(p) => p.id,
            OpBody::MomentDelete(p) => p.id,
            OpBody::MediaPut(p) => p.id,
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
        if record.kind_version == 0 || record.kind_version > kind.current_version() {
            return Err(OpDecodeError::NewerVersion {
                seq,
                kind: kind.name(),
                version: record.kind_version,
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
            OpKind::MediaPut => OpBody::MediaPut(codec::decode(bytes).map_err(wrap)?),
        };
        Ok(Op {
            seq,
            ts_ms: record.ts_ms,
            body,
        })
    }

    /// The op as one JSON object, the line `spark-replay dump` prints: `seq`,
    /// `ts_ms`, `kind`, `request_id` (or null), `entity_id`, `device`, and the
    /// payload under `payload`.
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
        serde_json::json!({
            "seq": self.seq,
            "ts_ms": self.ts_ms,
            "kind": self.body.kind().name(),
            "request_id": self.body.request_id(),
            "entity_id": self.body.entity_id().to_string(),
            "device": self.body.device(),
            "payload": payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
