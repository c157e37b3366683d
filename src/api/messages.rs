//! `/api/messages`: a moment's thread (SPEC sections 4 and 5).
//!
//! Message ids are minted at the send attempt, so the server accepts one
//! only when the time in its ULID is within the clock window of the server
//! clock, inclusive (`400 clock_skew` otherwise, with the server time, the
//! id time and the skew); the rule and its value live in
//! `spark_core::rules::messages`. A known id is answered `202` with the stored message and
//! writes nothing; the same id with another body is `409`.

use spark_core::wire::problem as wire;

use serde::{Deserialize, Serialize};
use spark_core::wire::bodies::PostMessageBody as PostBody;
use warp::http::StatusCode;
use warp::reply::Response;

use crate::engine::{Command, PostMessage};
use spark_core::ids::Id;
use spark_core::mirror::MessageView;

use super::{json_response, ApiError, AppState, Request};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    thread: String,
    after: Option<String>,
    limit: Option<String>,
}

#[derive(Serialize)]
struct Page {
    messages: Vec<MessageView>,
    next: Option<Id>,
}

/// `POST /api/messages`: posts a message.
pub(crate) async fn post(state: &AppState, req: &mut Request) -> Result<Response, ApiError> {
    let body: PostBody = req
        .json(state.settings.limits.json_body_limit_bytes)
        .await?
        .ok_or_else(|| {
            ApiError::invalid_request("a JSON object with id, thread_id and body is required")
        })?;
    let id = Id::parse(&body.id).map_err(|e| ApiError::invalid_id("id", e))?;
    let thread_id = Id::parse(&body.thread_id).map_err(|e| ApiError::invalid_id("thread_id", e))?;
    let limit = state.settings.limits.message_body_limit_chars;
    let chars = body.body.chars().count();
    if chars > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            wire::TOO_LARGE,
            format!("the message body is {chars} characters; the limit is {limit}"),
        ));
    }
    let command = Command::PostMessage(PostMessage {
        id,
        thread_id,
        body: body.body,
        device: req.device.clone(),
    });
    let outcome = state.engine.submit(command).await?;
    Ok(super::outcome_response(outcome))
}

/// `GET /api/messages`: a page of a thread.
pub(crate) fn list(state: &AppState, req: &Request) -> Result<Response, ApiError> {
    let query: ListQuery = req.query()?;
    let thread = Id::parse(&query.thread).map_err(|e| ApiError::invalid_id("thread", e))?;
    let after = query
        .after
        .as_deref()
        .map(|a| Id::parse(a).map_err(|e| ApiError::invalid_id("after", e)))
        .transpose()?;
    let limits = &state.settings.limits;
    let page_limit = super::page_limit(query.limit.as_deref(), limits)?;
    let limit = page_limit.items;
    let page = state.engine.read(|mirror| {
        if mirror.moment(thread).is_none() {
            return Err(ApiError::not_found(format!(
                "thread {thread} does not exist"
            )));
        }
        let Some(ids) = mirror.threads.get(&thread) else {
            return Ok(Page {
                messages: Vec::new(),
                next: None,
            });
        };
        use std::ops::Bound;
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut ids = ids.range((start, Bound::Unbounded));
        let messages: Vec<MessageView> = ids
            .by_ref()
            .take(limit)
            .filter_map(|id| mirror.messages.get(id))
            .map(|m| mirror.message_view(m))
            .collect();
        let next = if ids.next().is_some() {
            messages.last().map(|m| m.id)
        } else {
            None
        };
        Ok(Page { messages, next })
    })?;
    Ok(page_limit.mark(json_response(StatusCode::OK, &page)))
}
