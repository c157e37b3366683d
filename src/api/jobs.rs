//! `POST /api/jobs`: a high-quality job (SPEC sections 2 and 4): one
//! practical turn per configured seat, request ids `<job id>:<index>` with
//! the index counting seats from 0 in configuration order. A retry returns
//! the same turns.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use warp::http::{Method, StatusCode};
use warp::reply::Response;

use crate::engine::{Command, Outcome, StartJob};
use crate::ids::{check_request_id, Id};
use crate::mirror::JobView;

use super::{json_response, ApiError, AppState, Request};

/// Longest job id, in bytes: `<job id>:<index>` stays within 80.
pub const JOB_ID_MAX_BYTES: usize = 64;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobBody {
    job_id: String,
    moment_id: String,
}

#[derive(Serialize)]
struct JobAnswer<'a> {
    created: bool,
    job: &'a JobView,
}

/// `POST /api/jobs`: `202` for a new job, `200` for a known job id.
pub async fn start(state: Arc<AppState>, mut req: Request) -> Result<Response, ApiError> {
    if req.method != Method::POST {
        return Err(ApiError::method_not_allowed("POST"));
    }
    let body: JobBody = req
        .json(state.settings.limits.json_body_limit_bytes)
        .await?
        .ok_or_else(|| {
            ApiError::invalid_request("a JSON object with job_id and moment_id is required")
        })?;
    check_request_id(&body.job_id, JOB_ID_MAX_BYTES)?;
    let moment_id = Id::parse(&body.moment_id).map_err(|e| ApiError::invalid_id("moment_id", e))?;
    let command = Command::StartJob(StartJob {
        job_id: body.job_id,
        moment_id,
        seats: state.seats.clone(),
        device: req.device.clone(),
    });
    match state.engine.submit(command).await? {
        Outcome::JobStarted { created, job } => {
            let status = if created {
                StatusCode::ACCEPTED
            } else {
                StatusCode::OK
            };
            Ok(json_response(status, &JobAnswer { created, job: &job }))
        }
        other => Err(super::unexpected(other)),
    }
}
