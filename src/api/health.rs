//! `/healthz` (the process is alive) and `/readyz` (the log is replayed and
//! writes are accepted): the two routes that need no token (SPEC section 9);
//! and `/metrics`, in the Prometheus text format.

use std::sync::Arc;

use serde_json::json;
use warp::http::{Method, StatusCode};
use warp::reply::Response;

use super::{json_response, ApiError, AppState, Request};

/// `GET /healthz`: `200 {"status":"ok"}` while the process serves.
pub async fn healthz(_state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    if req.method != Method::GET && req.method != Method::HEAD {
        return Err(ApiError::method_not_allowed("GET, HEAD"));
    }
    Ok(json_response(StatusCode::OK, &json!({"status": "ok"})))
}

/// `GET /readyz`: `200 {"status":"ready"}` once the log is replayed (the
/// server only listens after that) and while writes are accepted;
/// `503 unavailable` once the write path is stopped by an I/O error (it
/// stays so until a restart).
pub async fn readyz(state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    if req.method != Method::GET && req.method != Method::HEAD {
        return Err(ApiError::method_not_allowed("GET, HEAD"));
    }
    match state.engine.poisoned() {
        None => Ok(json_response(StatusCode::OK, &json!({"status": "ready"}))),
        Some(reason) => Err(ApiError::from(crate::engine::EngineError::Unavailable(
            reason,
        ))),
    }
}

/// `GET /metrics`: every metric of [`crate::metrics`], mirror sizes as of
/// now, in the OpenMetrics 1.0 text format (what `prometheus-client`
/// writes: `_total` samples, `# EOF`), which Prometheus scrapes.
pub async fn metrics(state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    if req.method != Method::GET {
        return Err(ApiError::method_not_allowed("GET"));
    }
    let metrics = crate::metrics::get();
    state.engine.read(|mirror| metrics.observe_mirror(mirror));
    let mut response = Response::new(metrics.render().into());
    response.headers_mut().insert(
        warp::http::header::CONTENT_TYPE,
        warp::http::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    Ok(response)
}
