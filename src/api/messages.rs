//! `/api/messages`: a moment's thread (SPEC sections 4 and 5).
//!
//! Message ids are minted at the send attempt, so the server accepts one
//! only when the time in its ULID is within 5 minutes of the server clock,
//! inclusive (`400 clock_skew` otherwise, with the server time, the id time
//! and the skew). A known id is answered `202` with the stored message and
//! writes nothing; the same id with another body is `409`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use warp::http::{Method, StatusCode};
use warp::reply::Response;

use crate::engine::{Command, Outcome, PostMessage};
use crate::ids::Id;
use crate::mirror::MessageView;

use super::{json_response, ApiError, AppState, Request};

/// The clock window of SPEC section 5 (seed ADR-036), in milliseconds.
pub const MESSAGE_CLOCK_WINDOW_MS: u64 = 5 * 60 * 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostBody {
    id: String,
    thread_id: String,
    body: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    thread: String,
    after: Option<String>,
    limit: Option<String>,
}

#[derive(Serialize)]
struct PostAnswer<'a> {
    created: bool,
    message: &'a MessageView,
}

#[derive(Serialize)]
struct Page {
    messages: Vec<MessageView>,
    next: Option<Id>,
}

/// `POST` (post) and `GET` (a thread's page) on `/api/messages`.
pub async fn collection(state: Arc<AppState>, mut req: Request) -> Result<Response, ApiError> {
    match req.method {
        Method::POST => post(&state, &mut req).await,
        Method::GET => list(&state, &req),
        _ => Err(ApiError::method_not_allowed("GET, POST")),
    }
}

async fn post(state: &AppState, req: &mut Request) -> Result<Response, ApiError> {
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
            "too_large",
            format!("the message body is {chars} characters; the limit is {limit}"),
        ));
    }
    let command = Command::PostMessage(PostMessage {
        id,
        thread_id,
        body: body.body,
        window_ms: MESSAGE_CLOCK_WINDOW_MS,
        device: req.device.clone(),
    });
    match state.engine.submit(command).await? {
        // New or known, the answer is 202 with the stored message.
        Outcome::MessagePosted { created, message } => Ok(json_response(
            StatusCode::ACCEPTED,
            &PostAnswer {
                created,
                message: &message,
            },
        )),
        other => Err(super::unexpected(other)),
    }
}

fn list(state: &AppState, req: &Request) -> Result<Response, ApiError> {
    let query: ListQuery = req.query()?;
    let thread = Id::parse(&query.thread).map_err(|e| ApiError::invalid_id("thread", e))?;
    let after = query
        .after
        .as_deref()
        .map(|a| Id::parse(a).map_err(|e| ApiError::invalid_id("after", e)))
        .transpose()?;
    let limits = &state.settings.limits;
    let limit = super::page_limit(query.limit.as_deref(), limits)?;
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
            .map(|m| m.view())
            .collect();
        let next = if ids.next().is_some() {
            messages.last().map(|m| m.id)
        } else {
            None
        };
        Ok(Page { messages, next })
    })?;
    Ok(json_response(StatusCode::OK, &page))
}
