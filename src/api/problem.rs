//! Errors on the wire: RFC 9457 `application/problem+json` with a stable
//! `code` member (SPEC section 10).

use serde_json::{Map, Value};
use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::Response;

use spark_core::wire::problem as wire;

use crate::engine::{Conflict, EngineError};
use spark_core::ids::{IdError, RequestIdError};

/// `Retry-After` of a `507 insufficient_storage`, in seconds: space comes
/// back when someone frees it, so a client should not hammer.
pub const INSUFFICIENT_STORAGE_RETRY_AFTER_S: u64 = 10;

/// One error answer: status, stable code, a sentence for people, and any
/// extra members (e.g. the times of `clock_skew`).
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code (`invalid_id`, `not_found`, ...).
    pub code: &'static str,
    /// What went wrong, for a person; never an internal path or a panic.
    pub detail: String,
    /// Members added to the problem object.
    pub extra: Map<String, Value>,
    /// `Retry-After` in seconds, for `503` and `507` answers.
    pub retry_after_s: Option<u64>,
    /// Answer with `Connection: close`: the refusal comes before the
    /// request's body was read (an upload refused on its headers or its
    /// declared length), so the connection cannot carry another request and
    /// the client is told so rather than finding a closed socket; or a
    /// refusal at a cap of connections held open (an event stream past
    /// `limits.event_streams_max`), whose connection would otherwise keep a
    /// place of `limits.connections_max` with nothing on it.
    pub close_connection: bool,
}

impl ApiError {
    /// An error with no extra members.
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> ApiError {
        debug_assert!(
            wire::title(code).is_some(),
            "code {code} is not in spark_core::wire::problem::CODES (nor in the API description)"
        );
        ApiError {
            status,
            code,
            detail: detail.into(),
            extra: Map::new(),
            retry_after_s: None,
            close_connection: false,
        }
    }

    /// The same error, answered with `Connection: close` (see
    /// [`ApiError::close_connection`]).
    pub fn closing(mut self) -> ApiError {
        self.close_connection = true;
        self
    }

    /// `400 invalid_request`: malformed JSON, unknown members, wrong types.
    pub fn invalid_request(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, wire::INVALID_REQUEST, detail)
    }

    /// `400 invalid_id`: not a ULID.
    pub fn invalid_id(what: &str, error: IdError) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            wire::INVALID_ID,
            format!("{what} is not a ULID: {error}"),
        )
    }

    /// `404 not_found`.
    pub fn not_found(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, wire::NOT_FOUND, detail)
    }

    /// `413 too_large`, naming the limit.
    pub fn too_large(limit_bytes: u64) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            wire::TOO_LARGE,
            format!("the body is over the limit of {limit_bytes} bytes"),
        )
    }

    /// `405`, for a route that exists with other methods (`allowed`, the
    /// `Allow` header's value: what the route table lists for the path,
    /// [`crate::api::route_table::Resource::allow`]).
    pub fn method_not_allowed(allowed: &str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            wire::INVALID_REQUEST,
            format!("this route takes {allowed}"),
        );
        e.extra
            .insert("allow".into(), Value::String(allowed.into()));
        e
    }

    fn title(&self) -> &'static str {
        wire::title(self.code).unwrap_or_else(|| self.status.canonical_reason().unwrap_or("Error"))
    }

    /// The problem+json response.
    pub fn into_response(self) -> Response {
        let allow = self
            .extra
            .get("allow")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let bytes = wire::Problem {
            type_uri: format!("{}{}", wire::PROBLEM_TYPE_PREFIX, self.code),
            title: self.title().into(),
            status: self.status.as_u16(),
            detail: self.detail,
            code: self.code.into(),
            extra: self.extra,
        }
        .to_json_bytes();
        let mut response = Response::new(bytes.into());
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(wire::PROBLEM_CONTENT_TYPE),
        );
        if let Some(seconds) = self.retry_after_s {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(allow) = allow.and_then(|a| HeaderValue::from_str(&a).ok()) {
            headers.insert(header::ALLOW, allow);
        }
        if self.close_connection {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl From<RequestIdError> for ApiError {
    fn from(e: RequestIdError) -> ApiError {
        match e {
            RequestIdError::TooLong { max_bytes, .. } => {
                let mut error = ApiError::new(
                    StatusCode::BAD_REQUEST,
                    wire::REQUEST_ID_TOO_LONG,
                    e.to_string(),
                );
                error
                    .extra
                    .insert("limit_bytes".into(), Value::from(max_bytes));
                error
            }
            RequestIdError::Invalid(why) => ApiError::invalid_request(why),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        let detail = e.to_string();
        match e {
            EngineError::MomentNotFound(_) | EngineError::Missing(_) => ApiError::not_found(detail),
            EngineError::Invalid(_) => ApiError::invalid_request(detail),
            EngineError::ClockSkew {
                server_time_ms,
                id_time_ms,
                skew_ms,
            } => {
                let mut error = ApiError::new(StatusCode::BAD_REQUEST, wire::CLOCK_SKEW, detail);
                let members = wire::ClockSkewMembers {
                    server_time_ms,
                    id_time_ms,
                    skew_ms,
                };
                if let Ok(Value::Object(members)) = serde_json::to_value(members) {
                    error.extra.extend(members);
                }
                error
            }
            EngineError::Deleted(_) => ApiError::new(StatusCode::GONE, wire::DELETED, detail),
            EngineError::Conflict(conflict) => {
                let mut error = ApiError::new(StatusCode::CONFLICT, wire::CONFLICT, detail);
                error.extra = conflict_members(&conflict);
                error
            }
            EngineError::RequestId(e) => ApiError::from(e),
            EngineError::PreconditionFailed { current, .. } => {
                let mut error = ApiError::new(
                    StatusCode::PRECONDITION_FAILED,
                    wire::PRECONDITION_FAILED,
                    detail,
                );
                error.extra.insert("version".into(), Value::from(current));
                error
            }
            EngineError::Unavailable(_) => {
                let mut error =
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, wire::UNAVAILABLE, detail);
                error.retry_after_s = Some(5);
                error
            }
            EngineError::InsufficientStorage(_) => {
                let mut error = ApiError::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    wire::INSUFFICIENT_STORAGE,
                    detail,
                );
                error.retry_after_s = Some(INSUFFICIENT_STORAGE_RETRY_AFTER_S);
                error
            }
            // No Retry-After: this engine never takes writes again.
            EngineError::Fenced(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, wire::FENCED, detail)
            }
        }
    }
}

/// The members of a `409 conflict` that name what conflicted: `conflict`
/// (the kind) and the kind's fields (documented in `openapi.json`,
/// `Conflict`).
fn conflict_members(conflict: &Conflict) -> Map<String, Value> {
    let mut members = Map::new();
    members.insert("conflict".into(), Value::from(conflict.kind()));
    let mut put = |name: &str, value: String| {
        members.insert(name.into(), Value::String(value));
    };
    match conflict {
        Conflict::RequestId {
            request_id,
            used_by_kind,
            used_by,
        } => {
            put("request_id", request_id.clone());
            put("used_by_kind", (*used_by_kind).into());
            put("used_by", used_by.clone());
        }
        Conflict::DerivedRequestId { request_id } => put("request_id", request_id.clone()),
        Conflict::TurnRequest {
            request_id,
            turn_id,
            moment_id,
        } => {
            put("request_id", request_id.clone());
            put("turn_id", turn_id.to_string());
            put("moment_id", moment_id.to_string());
        }
        Conflict::MediaBytes {
            media_id,
            stored_sha256,
            offered_sha256,
        } => {
            put("media_id", media_id.to_string());
            put("stored_sha256", hex::encode(stored_sha256));
            put("offered_sha256", hex::encode(offered_sha256));
        }
        Conflict::MediaOwner {
            media_id,
            moment_id,
            photo,
            role,
        }
        | Conflict::RoleTaken {
            moment_id,
            photo,
            role,
            media_id,
        } => {
            put("media_id", media_id.to_string());
            put("moment_id", moment_id.to_string());
            put("role", role.name().into());
            members.insert("photo".into(), Value::from(*photo));
        }
        Conflict::JobMoment { job_id, moment_id } => {
            put("job_id", job_id.clone());
            put("moment_id", moment_id.to_string());
        }
        Conflict::Message { message_id } => put("message_id", message_id.to_string()),
    }
    members
}

#[cfg(test)]
mod tests {
    use super::*;
    use spark_core::ids::Id;

    #[test]
    fn a_conflict_names_what_conflicted() {
        let media_id = Id::from_parts(1_767_225_600_000, 7);
        let error = ApiError::from(EngineError::Conflict(Conflict::MediaBytes {
            media_id,
            stored_sha256: [1; 32],
            offered_sha256: [2; 32],
        }));
        assert_eq!(
            (error.status, error.code),
            (StatusCode::CONFLICT, "conflict")
        );
        assert_eq!(
            error.detail,
            format!(
                "media {media_id} was uploaded with sha256 {}; these bytes hash to {}",
                "01".repeat(32),
                "02".repeat(32)
            )
        );
        let members: Vec<(&str, &str)> = error
            .extra
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or_default()))
            .collect();
        let id = media_id.to_string();
        let stored = "01".repeat(32);
        let offered = "02".repeat(32);
        assert_eq!(
            members,
            vec![
                ("conflict", "media_bytes"),
                ("media_id", id.as_str()),
                ("offered_sha256", offered.as_str()),
                ("stored_sha256", stored.as_str()),
            ]
        );
    }
}
