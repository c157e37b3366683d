//! `GET /api/openapi.json`: the API description (OpenAPI 3.1).
//!
//! The document is hand-written in `src/api/openapi.json` and compiled into
//! the binary. `tests/http/openapi.rs` keeps it in step with
//! [`crate::api::route_table::routes`]: the document's operations must equal the
//! table, and every entry of the table must reach a handler on a live
//! server; CI runs schemathesis against a live server with the document
//! (`.ci/run`).

use std::sync::Arc;

use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::Response;

use super::{ApiError, AppState, Request};

/// The OpenAPI 3.1 document, as JSON text.
const DOCUMENT: &str = include_str!("openapi.json");

/// The OpenAPI 3.1 document of the API, as JSON text (what
/// `GET /api/openapi.json` answers).
pub fn document() -> &'static str {
    DOCUMENT
}

/// `GET /api/openapi.json`: the document, `application/json`.
pub async fn get(_state: Arc<AppState>, _req: Request) -> Result<Response, ApiError> {
    let mut response = Response::new(document().into());
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}
