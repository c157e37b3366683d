//! `POST /api/recall`: a quick-recall session (SPEC sections 2 and 4).
//!
//! The engine assembles a moment from the active kept phrases (most recent
//! first, at most `brains.recall_phrases_max`), created with the recall id as
//! its request id, and starts a turn in mode `recall` whose request id is
//! `<recall id>:turn`. A retry lands on the same moment and turn.

use std::sync::Arc;

use serde::Deserialize;
use warp::reply::Response;

use crate::engine::{Command, StartRecall};

use super::{ApiError, AppState, Request};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecallBody {
    id: Option<String>,
}

/// `POST /api/recall`: `202` for a new session, `200` for a known recall id.
/// The recall id's cap is the core's rule (`spark_core::rules::recall`),
/// checked for every caller of `Engine::submit`.
pub async fn start(state: Arc<AppState>, mut req: Request) -> Result<Response, ApiError> {
    let body: RecallBody = req
        .json(state.settings.limits.json_body_limit_bytes)
        .await?
        .unwrap_or_default();
    let seat = state
        .seats
        .first()
        .cloned()
        .ok_or_else(|| ApiError::invalid_request("no brain seat is configured"))?;
    let command = Command::StartRecall(StartRecall {
        recall_id: body.id,
        seat,
        phrases_max: state.settings.brains.recall_phrases_max,
        device: req.device.clone(),
    });
    let outcome = state.engine.submit(command).await?;
    Ok(super::outcome_response(outcome))
}
