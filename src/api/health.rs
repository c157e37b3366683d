//! `/healthz` (the process is alive) and `/readyz` (the log is replayed and
//! writes are accepted): the two routes that need no token (SPEC section 9);
//! and `/metrics`, in the Prometheus text format.

use std::sync::Arc;

use serde_json::json;
use warp::http::StatusCode;
use warp::reply::Response;

use super::{json_response, ApiError, AppState, Request};

/// `GET /healthz`: `200 {"status":"ok"}` while the process serves.
pub async fn healthz(_state: Arc<AppState>, _req: Request) -> Result<Response, ApiError> {
    Ok(json_response(StatusCode::OK, &json!({"status": "ok"})))
}

/// `GET /readyz`: `200 {"status":"ready"}` once the log is replayed (the
/// server only listens after that) and while writes are accepted;
/// `503 unavailable` once the write path is stopped by an I/O error or
/// by a checkpoint file the request index reads in place written to (it
/// stays so until a restart; [`crate::engine::Engine::poisoned`]); `507 insufficient_storage` while writes are
/// refused for want of disk space, saying why (below the reserve, or the
/// log waiting for space to recover its tail); ready again by itself once
/// space is back. With `[archive]`, the body has an `archive`
/// member: `status` (`shipping`, `behind`, `failing` or `fenced`), `epoch`,
/// `shipped_seq`, `lag_seconds`, the last `error`, and the blobs recorded
/// lost (`blobs_missing`, `missing_blobs`) (SPEC section 11; see
/// [`crate::archive::ArchiveStatus::to_json`]); once another engine took
/// the prefix over, `503 fenced` (not ready, until a restart).
/// In `sync` mode a failing archive (writes wait for it), a write that has
/// waited for the archive longer than a few ship intervals (a store that
/// hangs: [`crate::archive::ArchiveStatus::writes_waiting_too_long`]) or a
/// closed archive gate answers `503 unavailable`, saying why. On a read replica
/// the body has a `replica` member ([`crate::replica::ReplicaStatus::to_json`]),
/// and the answer is `503 unavailable` while it cannot follow the archive
/// (the store unreachable, a damaged object, named) or lags more than
/// `replica.ready_lag_max_ms` (SPEC section 11).
/// After a start from a checkpoint that covered sealed segments, the body
/// has a `scrub` member ([`crate::engine::ScrubStatus::to_json`]): damage
/// the scrub finds there (`"status": "damaged"`, each segment named with
/// offset and seq) leaves the answer `200`, since the running state and
/// every write are unaffected; it is for the operator to restore the
/// segment before a start without the checkpoint (docs/guarantees.md).
pub async fn readyz(state: Arc<AppState>, _req: Request) -> Result<Response, ApiError> {
    if let Some(reason) = state.engine.poisoned() {
        return Err(ApiError::from(crate::engine::EngineError::Unavailable(
            reason,
        )));
    }
    if let Some(reason) = state.engine.fenced() {
        return Err(ApiError::from(crate::engine::EngineError::Fenced(reason)));
    }
    if let Some(short) = state.engine.short_of_space() {
        return Err(ApiError::from(short));
    }
    if let Some(gate) = state.engine.archive_gate() {
        if let Some(closed) = gate.closed() {
            return Err(ApiError::from(closed));
        }
        if let Some(failing) = state.archive.as_ref().and_then(|a| a.failing()) {
            return Err(ApiError::from(crate::engine::EngineError::Unavailable(
                format!("archive mode \"sync\": writes wait for the archive, whose shipping fails: {failing}"),
            )));
        }
        if let Some(waiting) = state
            .archive
            .as_ref()
            .and_then(|a| a.writes_waiting_too_long())
        {
            return Err(ApiError::from(crate::engine::EngineError::Unavailable(
                waiting,
            )));
        }
    }
    if let Some(replica) = &state.replica {
        if let Some(reason) = replica.not_ready() {
            let mut error = ApiError::from(crate::engine::EngineError::Unavailable(reason));
            error.extra.insert("replica".into(), replica.to_json());
            return Err(error);
        }
    }
    let mut body = json!({"status": "ready"});
    if let Some(scrub) = state.engine.scrub_status().to_json() {
        body["scrub"] = scrub;
    }
    if let Some(replica) = &state.replica {
        body["replica"] = replica.to_json();
    }
    if let Some(archive) = &state.archive {
        body["archive"] = archive.to_json();
    }
    Ok(json_response(StatusCode::OK, &body))
}

/// `GET /metrics`: every metric of [`crate::metrics`], mirror sizes as of
/// now, in the OpenMetrics 1.0 text format (what `prometheus-client`
/// writes: `_total` samples, `# EOF`), which Prometheus scrapes.
pub async fn metrics(state: Arc<AppState>, _req: Request) -> Result<Response, ApiError> {
    let metrics = crate::metrics::get();
    state.engine.read(|mirror| metrics.observe_mirror(mirror));
    state.engine.disk().refresh();
    // The engine's metrics, then the archive's and a replica's where this
    // process runs one (each module appends its own registry).
    let mut text = metrics.render();
    crate::archive::metrics::render_into(&mut text);
    crate::replica::metrics::render_into(&mut text);
    let mut response = Response::new(text.into());
    response.headers_mut().insert(
        warp::http::header::CONTENT_TYPE,
        warp::http::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    Ok(response)
}
