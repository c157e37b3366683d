//! Request and answer bodies (SPEC sections 4 and 10).
//!
//! Request bodies refuse unknown members (`400 invalid_request` on the
//! server). Answer envelopes are generic over the record they carry: the
//! server fills them with its views, a client reads them into what it
//! needs. Members serialize in the order they are declared here.

use serde::{Deserialize, Deserializer, Serialize};

/// Body of `POST /api/moments`: every member optional; a missing one is
/// `null` on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateMomentBody {
    /// The moment id the client minted (a ULID), or `None` for the server
    /// to mint one.
    pub id: Option<String>,
    /// The request id (the outbox entry's id; SPEC section 3).
    pub client_request_id: Option<String>,
    /// What the sign says.
    pub text: Option<String>,
    /// A caption.
    pub caption: Option<String>,
    /// The language of the text (e.g. `de`).
    pub lang: Option<String>,
    /// When the photo was taken (RFC 3339).
    pub captured_at: Option<String>,
}

/// One member of a JSON merge patch: `None` when left out (left alone),
/// `Some(None)` when sent as `null` (cleared), `Some(Some(v))` when set.
pub type PatchField = Option<Option<String>>;

/// Body of `PATCH /api/moments/{id}` (a JSON merge patch: a member left out
/// is left alone, a member set to `null` is cleared).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EditMomentBody {
    /// The new text.
    #[serde(default, deserialize_with = "present")]
    pub text: PatchField,
    /// The new caption.
    #[serde(default, deserialize_with = "present")]
    pub caption: PatchField,
    /// The new language.
    #[serde(default, deserialize_with = "present")]
    pub lang: PatchField,
    /// The request id.
    pub client_request_id: Option<String>,
}

/// Marks a member that was sent (even as `null`) as `Some`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<PatchField, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// Optional body of `DELETE /api/moments/{id}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteMomentBody {
    /// The request id.
    pub client_request_id: Option<String>,
}

/// Body of `POST /api/moments/{id}/turns`, all optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartTurnBody {
    /// The turn's request id.
    pub client_request_id: Option<String>,
    /// [`super::TURN_MODE_PRACTICAL`] (the default) is the only mode.
    pub mode: Option<String>,
    /// The brain seat to ask (default: the first configured); left out of
    /// the body when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seat: Option<String>,
}

/// Body of `POST /api/messages` (SPEC section 5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostMessageBody {
    /// The message id, a ULID minted at the send attempt.
    pub id: String,
    /// The moment whose thread it goes to (a ULID).
    pub thread_id: String,
    /// The text.
    pub body: String,
}

/// The `replayed` member of a create-or-known answer (after the
/// IETF httpapi idempotency-key draft): on an answer from a known identity
/// (`created: false`, sent with the header `Idempotent-Replayed: true`),
/// the op that first produced what the answer carries; `null` on a new
/// write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replayed {
    /// Seq of that op.
    pub seq: u64,
    /// Its server time, RFC 3339 UTC.
    pub ts: String,
    /// Its server time, Unix milliseconds.
    pub ts_ms: u64,
    /// The request id it carried, or `null` (a media put, a phrase keep, a
    /// message and a recall start carry none).
    pub request_id: Option<String>,
}

impl From<crate::outcome::Replay> for Replayed {
    fn from(replay: crate::outcome::Replay) -> Replayed {
        Replayed {
            seq: replay.seq,
            // Cast: server times are far below i64::MAX ms.
            ts: crate::time::format_rfc3339_ms(replay.ts_ms as i64),
            ts_ms: replay.ts_ms,
            request_id: replay.request_id,
        }
    }
}

/// Answer of `POST /api/moments`: `{"created": bool, "moment": Moment}`
/// (`201` when created, `200` for a known id or request id).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MomentCreated<M> {
    /// Whether this request wrote the moment.
    pub created: bool,
    /// The op that first produced it when `created` is false, else `null`
    /// (read as `None` from a server that does not send it).
    #[serde(default)]
    pub replayed: Option<Replayed>,
    /// The moment.
    pub moment: M,
}

/// Answer of `PATCH /api/moments/{id}`: `{"changed": bool, "moment": Moment}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MomentChanged<M> {
    /// Whether this request changed the moment.
    pub changed: bool,
    /// The moment after the edit.
    pub moment: M,
}

/// Answer of `DELETE /api/moments/{id}`: `{"deleted": bool, "moment": Moment}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MomentDeleted<M> {
    /// Whether this request deleted the moment (`false` once it was).
    pub deleted: bool,
    /// The moment's tombstone.
    pub moment: M,
}

/// Answer of `PUT /api/media/{media id}`: `{"created": bool, "media": Media}`
/// (`201` new, `200` the same id with the same bytes).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MediaPut<M> {
    /// Whether this request stored the media.
    pub created: bool,
    /// The op that first produced it when `created` is false, else `null`
    /// (read as `None` from a server that does not send it).
    #[serde(default)]
    pub replayed: Option<Replayed>,
    /// The media record.
    pub media: M,
}

/// Answer of `POST /api/moments/{id}/turns`: `{"created": bool, "turn":
/// Turn}` (`202` new, `200` a known request id).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TurnStarted<T> {
    /// Whether this request started the turn.
    pub created: bool,
    /// The op that first produced it when `created` is false, else `null`
    /// (read as `None` from a server that does not send it).
    #[serde(default)]
    pub replayed: Option<Replayed>,
    /// The turn.
    pub turn: T,
}

/// Answer of `POST /api/messages`: `{"created": bool, "message": Message}`
/// (`202` either way).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MessagePosted<M> {
    /// Whether this request stored the message.
    pub created: bool,
    /// The op that first produced it when `created` is false, else `null`
    /// (read as `None` from a server that does not send it).
    #[serde(default)]
    pub replayed: Option<Replayed>,
    /// The stored message, with the server's `ts`.
    pub message: M,
}

/// Answer of `POST /api/phrases`: `{"created": bool, "mark": Mark}` (`201`
/// kept now, `200` already active).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhraseKept<M> {
    /// Whether this request kept the phrase.
    pub created: bool,
    /// The op that first produced it when `created` is false, else `null`
    /// (read as `None` from a server that does not send it).
    #[serde(default)]
    pub replayed: Option<Replayed>,
    /// The mark.
    pub mark: M,
}

/// Answer of `DELETE /api/phrases/{mark id}`: `{"dropped": bool, "mark":
/// Mark}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhraseDropped<M> {
    /// Whether this request dropped the phrase (`false` once it was).
    pub dropped: bool,
    /// The mark.
    pub mark: M,
}

/// Answer of `POST /api/recall`: `{"created": bool, "recall": Recall}`
/// (`202` new, `200` a known recall id).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecallStarted<R> {
    /// Whether this request started the recall.
    pub created: bool,
    /// The op that first produced it when `created` is false, else `null`
    /// (read as `None` from a server that does not send it).
    #[serde(default)]
    pub replayed: Option<Replayed>,
    /// The recall: its id, its moment and its turn.
    pub recall: R,
}

/// Answer of `POST /api/jobs`: `{"created": bool, "job": Job}` (`202` new,
/// `200` a known job id).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobStarted<J> {
    /// Whether this request started the job.
    pub created: bool,
    /// The op that first produced it when `created` is false, else `null`
    /// (read as `None` from a server that does not send it).
    #[serde(default)]
    pub replayed: Option<Replayed>,
    /// The job with its turns.
    pub job: J,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_create_member_is_null_and_a_turn_body_leaves_out_its_seat() {
        let body = CreateMomentBody {
            id: Some("01JDQ3ZC9W4G8Y7E6QJ2KX5N3M".into()),
            ..CreateMomentBody::default()
        };
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"id":"01JDQ3ZC9W4G8Y7E6QJ2KX5N3M","client_request_id":null,"text":null,"caption":null,"lang":null,"captured_at":null}"#
        );
        let turn = StartTurnBody {
            client_request_id: Some("r".into()),
            mode: Some(super::super::TURN_MODE_PRACTICAL.into()),
            seat: None,
        };
        assert_eq!(
            serde_json::to_string(&turn).unwrap(),
            r#"{"client_request_id":"r","mode":"practical"}"#
        );
    }

    #[test]
    fn a_patch_tells_left_out_from_null() {
        let edit: EditMomentBody = serde_json::from_str(r#"{"text":null,"caption":"c"}"#).unwrap();
        assert_eq!(edit.text, Some(None));
        assert_eq!(edit.caption, Some(Some("c".into())));
        assert_eq!(edit.lang, None);
        assert!(serde_json::from_str::<PostMessageBody>(
            r#"{"id":"a","thread_id":"b","body":"c","x":1}"#
        )
        .is_err());
    }
}
