//! Errors on the wire: RFC 9457 `application/problem+json` with a stable
//! `code` member (SPEC section 10).

use serde_json::{Map, Value};
use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::Response;

use crate::engine::EngineError;
use crate::ids::{IdError, RequestIdError};

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
    /// `Retry-After` in seconds, for `503` answers.
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    /// An error with no extra members.
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            detail: detail.into(),
            extra: Map::new(),
            retry_after_s: None,
        }
    }

    /// `400 invalid_request`: malformed JSON, unknown members, wrong types.
    pub fn invalid_request(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", detail)
    }

    /// `400 invalid_id`: not a ULID.
    pub fn invalid_id(what: &str, error: IdError) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_id",
            format!("{what} is not a ULID: {error}"),
        )
    }

    /// `404 not_found`.
    pub fn not_found(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", detail)
    }

    /// `413 too_large`, naming the limit.
    pub fn too_large(limit_bytes: u64) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the body is over the limit of {limit_bytes} bytes"),
        )
    }

    /// `405`, for a route that exists with other methods.
    pub fn method_not_allowed(allowed: &str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request",
            format!("this route takes {allowed}"),
        );
        e.extra
            .insert("allow".into(), Value::String(allowed.into()));
        e
    }

    fn title(&self) -> &'static str {
        match self.code {
            "invalid_id" => "Invalid id",
            "request_id_too_long" => "Request id too long",
            "invalid_request" => "Invalid request",
            "not_found" => "Not found",
            "deleted" => "Deleted",
            "conflict" => "Conflict",
            "digest_mismatch" => "Digest mismatch",
            "too_large" => "Too large",
            "clock_skew" => "Clock skew",
            "precondition_failed" => "Precondition failed",
            "unauthorized" => "Unauthorized",
            "request_timeout" => "Request timeout",
            "timeout" => "Timeout",
            "unavailable" => "Unavailable",
            _ => self.status.canonical_reason().unwrap_or("Error"),
        }
    }

    /// The problem+json response.
    pub fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert(
            "type".into(),
            Value::String(format!("urn:spark:problem:{}", self.code)),
        );
        body.insert("title".into(), Value::String(self.title().into()));
        body.insert("status".into(), Value::from(self.status.as_u16()));
        body.insert("detail".into(), Value::String(self.detail));
        body.insert("code".into(), Value::String(self.code.into()));
        let allow = self
            .extra
            .get("allow")
            .and_then(Value::as_str)
            .map(str::to_owned);
        for (k, v) in self.extra {
            body.insert(k, v);
        }
        let bytes = serde_json::to_vec(&Value::Object(body)).unwrap_or_default();
        let mut response = Response::new(bytes.into());
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = self.retry_after_s {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(allow) = allow.and_then(|a| HeaderValue::from_str(&a).ok()) {
            headers.insert(header::ALLOW, allow);
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
                    "request_id_too_long",
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
            EngineError::NotFound(_) | EngineError::Missing(_) => ApiError::not_found(detail),
            EngineError::Invalid(_) => ApiError::invalid_request(detail),
            EngineError::ClockSkew {
                server_time_ms,
                id_time_ms,
                skew_ms,
            } => {
                let mut error = ApiError::new(StatusCode::BAD_REQUEST, "clock_skew", detail);
                error
                    .extra
                    .insert("server_time_ms".into(), Value::from(server_time_ms));
                error
                    .extra
                    .insert("id_time_ms".into(), Value::from(id_time_ms));
                error.extra.insert("skew_ms".into(), Value::from(skew_ms));
                error
            }
            EngineError::Deleted(_) => ApiError::new(StatusCode::GONE, "deleted", detail),
            EngineError::Conflict(_) => ApiError::new(StatusCode::CONFLICT, "conflict", detail),
            EngineError::PreconditionFailed { current, .. } => {
                let mut error = ApiError::new(
                    StatusCode::PRECONDITION_FAILED,
                    "precondition_failed",
                    detail,
                );
                error.extra.insert("version".into(), Value::from(current));
                error
            }
            EngineError::Unavailable(_) => {
                let mut error =
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail);
                error.retry_after_s = Some(5);
                error
            }
        }
    }
}
