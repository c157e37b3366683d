//! `/api/phrases` and `/api/phrases/{mark id}`: kept phrases (SPEC section 4).
//!
//! A phrase is normalised (Unicode NFKC, lower case, trimmed, runs of white
//! space to one space; 1 to 200 characters) and its mark id is
//! `keep:<phrase>`, so keeping it twice finds the active mark and writes
//! nothing.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use warp::http::StatusCode;
use warp::reply::Response;

use crate::engine::{Command, DropPhrase, KeepPhrase};
use spark_core::ids::Id;
use spark_core::mirror::MarkView;

use super::{json_response, ApiError, AppState, Request};

pub use spark_core::rules::phrases::{normalise_phrase, PHRASE_MAX_CHARS};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeepBody {
    phrase: String,
    moment_id: Option<String>,
}

#[derive(Serialize)]
struct Page {
    marks: Vec<MarkView>,
    next: Option<String>,
}

/// `DELETE /api/phrases/{mark id}` (the mark id percent-encoded in the path).
pub async fn forget(state: Arc<AppState>, id: String, req: Request) -> Result<Response, ApiError> {
    let mark_id = percent_encoding::percent_decode_str(&id)
        .decode_utf8()
        .map_err(|_| ApiError::invalid_request("the mark id in the path is not UTF-8"))?
        .into_owned();
    let Some(phrase) = spark_core::ids::mark_phrase(&mark_id) else {
        return Err(ApiError::invalid_request(format!(
            "{mark_id:?} is not a mark id (keep:<phrase>)"
        )));
    };
    // The id must be the canonical form of its phrase.
    let canonical =
        normalise_phrase(phrase).map_err(|e| ApiError::invalid_request(e.to_string()))?;
    let command = Command::DropPhrase(DropPhrase {
        mark_id: crate::engine::mark_id(&canonical),
        device: req.device.clone(),
    });
    let outcome = state.engine.submit(command).await?;
    Ok(super::outcome_response(outcome))
}

/// `POST /api/phrases`: keeps a phrase.
pub(crate) async fn keep(state: &AppState, req: &mut Request) -> Result<Response, ApiError> {
    let body: KeepBody = req
        .json(state.settings.limits.json_body_limit_bytes)
        .await?
        .ok_or_else(|| ApiError::invalid_request("a JSON object with a phrase is required"))?;
    let phrase =
        normalise_phrase(&body.phrase).map_err(|e| ApiError::invalid_request(e.to_string()))?;
    let moment_id = body
        .moment_id
        .as_deref()
        .map(|m| Id::parse(m).map_err(|e| ApiError::invalid_id("moment_id", e)))
        .transpose()?;
    let command = Command::KeepPhrase(KeepPhrase {
        phrase,
        moment_id,
        device: req.device.clone(),
    });
    let outcome = state.engine.submit(command).await?;
    Ok(super::outcome_response(outcome))
}

/// `GET /api/phrases`: the active marks.
pub(crate) fn list(state: &AppState, req: &Request) -> Result<Response, ApiError> {
    let query: super::PageQuery = req.query()?;
    let limits = &state.settings.limits;
    let page_limit = super::page_limit(query.limit.as_deref(), limits)?;
    let limit = page_limit.items;
    let page = state.engine.read(|mirror| {
        use std::ops::Bound;
        let start = match &query.after {
            Some(after) => Bound::Excluded(after.clone()),
            None => Bound::Unbounded,
        };
        let mut active = mirror
            .marks
            .range((start, Bound::Unbounded))
            .map(|(_, m)| m)
            .filter(|m| m.active);
        let marks: Vec<MarkView> = active.by_ref().take(limit).map(|m| m.view()).collect();
        let next = if active.next().is_some() {
            marks.last().map(|m| m.id.clone())
        } else {
            None
        };
        Page { marks, next }
    });
    Ok(page_limit.mark(json_response(StatusCode::OK, &page)))
}
