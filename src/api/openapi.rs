//! `GET /api/openapi.json`: the API description (OpenAPI 3.1), and
//! [`ROUTES`], the list of what the router serves.
//!
//! The document is hand-written in `src/api/openapi.json` and compiled into
//! the binary. `tests/http/openapi.rs` keeps the three in step: the document's
//! operations must equal [`ROUTES`], and every entry of [`ROUTES`] must reach
//! a handler on a live server; CI runs schemathesis against a live server
//! with the document (`.ci/run`).

use std::sync::Arc;

use warp::http::{header, HeaderValue, Method, StatusCode};
use warp::reply::Response;

use super::{ApiError, AppState, Request};

/// The OpenAPI 3.1 document, as JSON text.
const DOCUMENT: &str = include_str!("openapi.json");

/// Every (method, path template) the router serves, in the spelling of the
/// document's `paths` (path parameters as `{id}`). A route added to
/// [`super::routes`] or a method added to a handler goes here and in
/// `openapi.json`; `tests/http/openapi.rs` fails while the three disagree.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/api/moments"),
    ("POST", "/api/moments"),
    ("GET", "/api/moments/{id}"),
    ("PATCH", "/api/moments/{id}"),
    ("DELETE", "/api/moments/{id}"),
    ("PUT", "/api/media/{id}"),
    ("GET", "/api/media/{id}"),
    ("HEAD", "/api/media/{id}"),
    ("POST", "/api/moments/{id}/turns"),
    ("GET", "/api/turns/{id}"),
    ("GET", "/api/phrases"),
    ("POST", "/api/phrases"),
    ("DELETE", "/api/phrases/{id}"),
    ("POST", "/api/recall"),
    ("POST", "/api/jobs"),
    ("GET", "/api/messages"),
    ("POST", "/api/messages"),
    ("GET", "/api/events"),
    ("GET", "/api/log/head"),
    ("GET", "/api/openapi.json"),
    ("GET", "/metrics"),
    ("GET", "/healthz"),
    ("HEAD", "/healthz"),
    ("GET", "/readyz"),
    ("HEAD", "/readyz"),
    ("POST", "/api/session"),
    ("DELETE", "/api/session"),
    ("GET", "/"),
    ("GET", "/assets/{id}"),
];

/// The OpenAPI 3.1 document of the API, as JSON text (what
/// `GET /api/openapi.json` answers).
pub fn document() -> &'static str {
    DOCUMENT
}

/// `GET /api/openapi.json`: the document, `application/json`.
pub async fn get(_state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    if req.method != Method::GET {
        return Err(ApiError::method_not_allowed("GET"));
    }
    let mut response = Response::new(document().into());
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}
