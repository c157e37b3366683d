//! `POST /api/moments/{id}/turns` and `GET /api/turns/{id}` (SPEC section 4).

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use spark_core::wire::bodies::StartTurnBody as StartBody;
use spark_core::wire::TURN_MODE_PRACTICAL;
use warp::http::StatusCode;
use warp::reply::Response;

use crate::engine::{Command, StartTurn};
use spark_core::ids::Id;

use super::{json_response, ApiError, AppState, Request};

/// Query of `GET /api/turns/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GetQuery {
    wait: Option<String>,
}

/// `POST /api/moments/{id}/turns`: `202` with a new turn, `200` with the
/// turn a known request id started (running or finished; no brain is asked).
pub async fn start(
    state: Arc<AppState>,
    id: String,
    mut req: Request,
) -> Result<Response, ApiError> {
    let moment_id =
        Id::parse(&id).map_err(|e| ApiError::invalid_id("the moment id in the path", e))?;
    let body: StartBody = req
        .json(state.settings.limits.json_body_limit_bytes)
        .await?
        .unwrap_or_default();
    let request_id = req.request_id(body.client_request_id)?;
    match body.mode.as_deref() {
        None | Some(TURN_MODE_PRACTICAL) => {}
        Some(other) => {
            return Err(ApiError::invalid_request(format!(
                "mode {other:?} is not practical (recall turns start with POST /api/recall)"
            )))
        }
    }
    let seat = match body.seat {
        None => state
            .seats
            .first()
            .cloned()
            .ok_or_else(|| ApiError::invalid_request("no brain seat is configured"))?,
        Some(seat) if state.seats.contains(&seat) => seat,
        Some(seat) => {
            return Err(ApiError::invalid_request(format!(
                "seat {seat:?} is not configured (seats: {})",
                state.seats.join(", ")
            )))
        }
    };
    let command = Command::StartTurn(StartTurn {
        moment_id,
        request_id,
        seat,
        device: req.device.clone(),
    });
    let outcome = state.engine.submit(command).await?;
    Ok(super::outcome_response(outcome))
}

/// `GET /api/turns/{id}[?wait=SECONDS]`: the turn; with `wait`, holds the
/// request until the turn ends or the wait (clamped to
/// `brains.turn_wait_max_s`) runs out, then answers with what there is.
pub async fn get(state: Arc<AppState>, id: String, req: Request) -> Result<Response, ApiError> {
    let turn_id = Id::parse(&id).map_err(|e| ApiError::invalid_id("the turn id in the path", e))?;
    let query: GetQuery = req.query()?;
    let wait_s = match query.wait.as_deref() {
        None => 0,
        Some(text) => text
            .parse::<u64>()
            .map_err(|_| {
                ApiError::invalid_request(format!("wait {text:?} is not a whole number of seconds"))
            })?
            .min(state.settings.brains.turn_wait_max_s),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(wait_s);
    let mut commits = state.engine.watch_commits();
    loop {
        // Mark the current value seen before reading, so a commit after the
        // read wakes the wait below.
        commits.borrow_and_update();
        let turn = state
            .engine
            .read(|mirror| mirror.turns.get(&turn_id).map(|t| mirror.turn_view(t)))
            .ok_or_else(|| ApiError::not_found(format!("turn {turn_id} does not exist")))?;
        if turn.status != "running" || tokio::time::Instant::now() >= deadline {
            return Ok(json_response(StatusCode::OK, &turn));
        }
        match tokio::time::timeout_at(deadline, commits.changed()).await {
            Ok(Ok(())) => continue,
            // The deadline passed, or the engine stopped: answer as it stands.
            Ok(Err(_)) | Err(_) => {
                let turn = state
                    .engine
                    .read(|mirror| mirror.turns.get(&turn_id).map(|t| mirror.turn_view(t)));
                return turn
                    .map(|t| json_response(StatusCode::OK, &t))
                    .ok_or_else(|| ApiError::not_found(format!("turn {turn_id} does not exist")));
            }
        }
    }
}
