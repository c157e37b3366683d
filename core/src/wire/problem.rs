//! Errors on the wire: RFC 9457 `application/problem+json` with a stable
//! `code` member (SPEC section 10), and the codes this server sends.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The media type of an error answer.
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// The prefix of a problem's `type`: `urn:spark:problem:<code>`.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:spark:problem:";

/// `400`: not a ULID.
pub const INVALID_ID: &str = "invalid_id";
/// `400`: a request id over its byte cap (adds `limit_bytes`).
pub const REQUEST_ID_TOO_LONG: &str = "request_id_too_long";
/// `400` (and `405`, `416`): malformed JSON, unknown members, wrong types, a
/// bad header or query.
pub const INVALID_REQUEST: &str = "invalid_request";
/// `404`: no such record or route.
pub const NOT_FOUND: &str = "not_found";
/// `410`: the moment is deleted.
pub const DELETED: &str = "deleted";
/// `409`: the same id or request id with other content.
pub const CONFLICT: &str = "conflict";
/// `400`: `X-Content-SHA256` differs from the bytes' hash (adds
/// `declared_sha256` and `actual_sha256`).
pub const DIGEST_MISMATCH: &str = "digest_mismatch";
/// `413`: over a size limit.
pub const TOO_LARGE: &str = "too_large";
/// `400`: a message id outside the clock window (SPEC section 5; adds the
/// members of [`ClockSkewMembers`]).
pub const CLOCK_SKEW: &str = "clock_skew";
/// `412`: `If-Match` names another version (adds `version`).
pub const PRECONDITION_FAILED: &str = "precondition_failed";
/// `401`: no valid bearer token or session (SPEC section 9).
pub const UNAUTHORIZED: &str = "unauthorized";
/// `403`: a write from another site: an `Origin` that is not this
/// engine's own (`null` included), with no token configured or without a
/// bearer token; or a write authenticated by the session cookie with
/// neither `Origin` nor the client header (SPEC section 12). Nothing
/// written.
pub const FORBIDDEN: &str = "forbidden";
/// `415`: a body the route reads as JSON that is not declared
/// `Content-Type: application/json` (or `application/*+json`); nothing
/// written.
pub const UNSUPPORTED_MEDIA_TYPE: &str = "unsupported_media_type";
/// `408`: the request did not arrive within the request time limit.
pub const REQUEST_TIMEOUT: &str = "request_timeout";
/// `409` on `GET /api/events`: the cursor (`after` or `Last-Event-ID`) is
/// beyond the log's head, as after a restore from an archive that was
/// behind what the client saw; members
/// [`CursorAheadMembers`]. The client resynchronises from `head_seq`.
pub const CURSOR_AHEAD: &str = "cursor_ahead";
/// `409` on `GET /api/events`: the cursor (`after` or `Last-Event-ID`) is
/// not known to name a point of this server's history: its chain value is
/// not this log's at its seq (another history shares the seq: a restore
/// and a take-over, another server's log), or it is a bare seq above 0,
/// which cannot be checked. Members [`CursorAheadMembers`] (the
/// cursor refused and the head). The client resynchronises: it refetches
/// what it derived from the stream and follows after `head_cursor`.
pub const CURSOR_UNKNOWN: &str = "cursor_unknown";
/// `503`: no answer within the request time limit (a write already
/// accepted still commits).
pub const TIMEOUT: &str = "timeout";
/// `503` (with `Retry-After`) or `500`: the server cannot serve this now.
pub const UNAVAILABLE: &str = "unavailable";
/// `507` (with `Retry-After`): the disk's free space is below the reserve,
/// or the disk is full; writes resume by themselves once space is back.
pub const INSUFFICIENT_STORAGE: &str = "insufficient_storage";
/// `503`: with an archive, another engine took the prefix over
/// (`--take-over`); this one acknowledges no write any more (SPEC section
/// 11). Not worth retrying here: send writes to the engine that took over.
pub const FENCED: &str = "fenced";
/// `421`: a write sent to a read replica (`spark-engine replica`, SPEC
/// section 11); member `writer_url` names the writer when the replica
/// knows it (`replica.writer_url`), else `null`. Send the write there.
pub const READ_ONLY: &str = "read_only";
/// `403`: with no access token configured, a request whose `Host` is not a
/// loopback name or address nor one of `access.allowed_hosts` (a page that
/// made its own name resolve to the engine: DNS rebinding). Address the
/// engine as `localhost` or `127.0.0.1`, list the name, or use a token.
pub const HOST_NOT_ALLOWED: &str = "host_not_allowed";

/// Every code this server sends, each with its `title`: the one list that
/// [`title`] reads and the API description's `ProblemCode` must equal
/// (`tests/http/openapi.rs`).
pub const CODES: &[(&str, &str)] = &[
    (INVALID_ID, "Invalid id"),
    (REQUEST_ID_TOO_LONG, "Request id too long"),
    (INVALID_REQUEST, "Invalid request"),
    (NOT_FOUND, "Not found"),
    (DELETED, "Deleted"),
    (CONFLICT, "Conflict"),
    (DIGEST_MISMATCH, "Digest mismatch"),
    (TOO_LARGE, "Too large"),
    (CLOCK_SKEW, "Clock skew"),
    (PRECONDITION_FAILED, "Precondition failed"),
    (UNAUTHORIZED, "Unauthorized"),
    (FORBIDDEN, "Forbidden"),
    (UNSUPPORTED_MEDIA_TYPE, "Unsupported media type"),
    (REQUEST_TIMEOUT, "Request timeout"),
    (TIMEOUT, "Timeout"),
    (UNAVAILABLE, "Unavailable"),
    (INSUFFICIENT_STORAGE, "Insufficient storage"),
    (CURSOR_AHEAD, "Cursor ahead of the log"),
    (CURSOR_UNKNOWN, "Cursor of another history"),
    (FENCED, "Fenced"),
    (READ_ONLY, "Read-only replica"),
    (HOST_NOT_ALLOWED, "Host not allowed"),
];

/// The problem's `title` for a code this server sends, `None` for another.
pub fn title(code: &str) -> Option<&'static str> {
    CODES
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, title)| *title)
}

/// An error answer's body. Members a body leaves out read as empty (so a
/// client can read what a proxy sent too); the server always sends all.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Problem {
    /// `urn:spark:problem:<code>` ([`PROBLEM_TYPE_PREFIX`]).
    #[serde(rename = "type")]
    pub type_uri: String,
    /// A short title for the code ([`title`]).
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong, for a person.
    pub detail: String,
    /// The stable machine-readable code (one of the constants above).
    pub code: String,
    /// Members the code adds (e.g. [`ClockSkewMembers`]); one named like a
    /// member above replaces it.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Problem {
    /// The body as the server sends it: a JSON object whose members are in
    /// `serde_json`'s map order (by name).
    pub fn to_json_bytes(&self) -> Vec<u8> {
        serde_json::to_value(self)
            .and_then(|value| serde_json::to_vec(&value))
            .unwrap_or_default()
    }
}

/// The members `clock_skew` adds (SPEC section 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockSkewMembers {
    /// The server clock, Unix ms.
    pub server_time_ms: u64,
    /// The time in the message id, Unix ms.
    pub id_time_ms: u64,
    /// `id_time_ms - server_time_ms`, in ms.
    pub skew_ms: i64,
}

/// The members `cursor_ahead` and `cursor_unknown` add.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorAheadMembers {
    /// The seq the client asked to follow after.
    pub after: u64,
    /// The log's head: the last committed seq the server has.
    pub head_seq: u64,
    /// The head's cursor (`SEQ.CHAIN`, or `0` for an empty log): follow
    /// after it once resynchronised.
    #[serde(default)]
    pub head_cursor: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_serializes_its_members_by_name_with_extras() {
        let mut extra = Map::new();
        let skew = ClockSkewMembers {
            server_time_ms: 10,
            id_time_ms: 4,
            skew_ms: -6,
        };
        if let Value::Object(members) = serde_json::to_value(skew).unwrap() {
            extra = members;
        }
        let problem = Problem {
            type_uri: format!("{PROBLEM_TYPE_PREFIX}{CLOCK_SKEW}"),
            title: title(CLOCK_SKEW).unwrap().into(),
            status: 400,
            detail: "off".into(),
            code: CLOCK_SKEW.into(),
            extra,
        };
        let text = String::from_utf8(problem.to_json_bytes()).unwrap();
        assert_eq!(
            text,
            r#"{"code":"clock_skew","detail":"off","id_time_ms":4,"server_time_ms":10,"skew_ms":-6,"status":400,"title":"Clock skew","type":"urn:spark:problem:clock_skew"}"#
        );
        let back: Problem = serde_json::from_str(&text).unwrap();
        assert_eq!(back, problem);
        let members: ClockSkewMembers = serde_json::from_value(Value::Object(back.extra)).unwrap();
        assert_eq!(members, skew);
        assert_eq!(title("other"), None);
    }
}
