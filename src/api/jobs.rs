//! `POST /api/jobs`: a high-quality job (SPEC sections 2 and 4): one
//! practical turn per configured seat, request ids `<job id>:<index>` with
//! the index counting seats from 0 in configuration order. A retry returns
//! the same turns.

use std::sync::Arc;

use serde::Deserialize;
use warp::reply::Response;

use crate::engine::{Command, StartJob};
use spark_core::ids::Id;

use super::{ApiError, AppState, Request};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobBody {
    job_id: String,
    moment_id: String,
}

/// `POST /api/jobs`: `202` for a new job, `200` for a known job id. The
/// job id's cap is the core's rule (`spark_core::rules::jobs`), checked
/// for every caller of `Engine::submit`.
pub async fn start(state: Arc<AppState>, mut req: Request) -> Result<Response, ApiError> {
    let body: JobBody = req
        .json(state.settings.limits.json_body_limit_bytes)
        .await?
        .ok_or_else(|| {
            ApiError::invalid_request("a JSON object with job_id and moment_id is required")
        })?;
    let moment_id = Id::parse(&body.moment_id).map_err(|e| ApiError::invalid_id("moment_id", e))?;
    let command = Command::StartJob(StartJob {
        job_id: body.job_id,
        moment_id,
        seats: state.seats.clone(),
        device: req.device.clone(),
    });
    let outcome = state.engine.submit(command).await?;
    Ok(super::outcome_response(outcome))
}
