//! `/api/moments` and `/api/moments/{id}` (SPEC sections 3, 4 and 10).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spark_core::wire::bodies::{
    CreateMomentBody as CreateBody, DeleteMomentBody as DeleteBody, EditMomentBody as EditBody,
};
use warp::http::{Method, StatusCode};
use warp::reply::Response;

use crate::engine::{Command, CreateMoment, DeleteMoment, EditMoment};
use crate::ids::Id;
use crate::mirror::MomentView;

use super::{json_response, ApiError, AppState, Request};

/// Query of `GET /api/moments`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    after: Option<String>,
    limit: Option<String>,
}

#[derive(Serialize)]
struct Page {
    moments: Vec<MomentView>,
    next: Option<Id>,
}

fn parse_id(text: &str, what: &str) -> Result<Id, ApiError> {
    Id::parse(text).map_err(|e| ApiError::invalid_id(what, e))
}

/// `ETag: "<version>"` (SPEC section 10), what `If-Match` takes.
/// Parses `If-Match`: `"<version>"`, `W/"<version>"` or a bare number;
/// `*` matches any existing moment.
fn if_match(req: &Request) -> Result<Option<u32>, ApiError> {
    let Some(value) = req.header("if-match")? else {
        return Ok(None);
    };
    if value == "*" {
        return Ok(None);
    }
    let bare = value.trim_start_matches("W/").trim_matches('"');
    bare.parse::<u32>().map(Some).map_err(|_| {
        ApiError::invalid_request(format!(
            "If-Match {value:?} is not a moment version (send the ETag of GET /api/moments/{{id}})"
        ))
    })
}

/// `GET` (list) and `POST` (create) on `/api/moments`.
pub async fn collection(state: Arc<AppState>, mut req: Request) -> Result<Response, ApiError> {
    match req.method {
        Method::GET => list(&state, &req),
        Method::POST => create(&state, &mut req).await,
        _ => Err(ApiError::method_not_allowed("GET, POST")),
    }
}

/// `GET`, `PATCH` and `DELETE` on `/api/moments/{id}`.
pub async fn item(
    state: Arc<AppState>,
    id: String,
    mut req: Request,
) -> Result<Response, ApiError> {
    let id = parse_id(&id, "the moment id in the path")?;
    match req.method {
        Method::GET => get(&state, id),
        Method::PATCH => edit(&state, id, &mut req).await,
        Method::DELETE => delete(&state, id, &mut req).await,
        _ => Err(ApiError::method_not_allowed("GET, PATCH, DELETE")),
    }
}

fn list(state: &AppState, req: &Request) -> Result<Response, ApiError> {
    let query: ListQuery = req.query()?;
    let after = query
        .after
        .as_deref()
        .map(|a| parse_id(a, "after"))
        .transpose()?;
    let limits = &state.settings.limits;
    let page_limit = super::page_limit(query.limit.as_deref(), limits)?;
    let limit = page_limit.items;
    let page = state.engine.read(|mirror| {
        let (moments, more) = mirror.live_page(after, limit);
        let next = if more {
            moments.last().map(|m| m.id)
        } else {
            None
        };
        Page {
            moments: moments.into_iter().map(|m| mirror.moment_view(m)).collect(),
            next,
        }
    });
    Ok(page_limit.mark(json_response(StatusCode::OK, &page)))
}

async fn create(state: &AppState, req: &mut Request) -> Result<Response, ApiError> {
    let body: CreateBody = req
        .json(state.settings.limits.json_body_limit_bytes)
        .await?
        .ok_or_else(|| ApiError::invalid_request("a JSON object is required"))?;
    let request_id = req.request_id(body.client_request_id)?;
    let id = body.id.as_deref().map(|t| parse_id(t, "id")).transpose()?;
    let captured_at_ms = body
        .captured_at
        .as_deref()
        .map(crate::time::parse_rfc3339_ms)
        .transpose()
        .map_err(ApiError::invalid_request)?;
    let command = Command::CreateMoment(CreateMoment {
        id,
        request_id,
        text: body.text,
        caption: body.caption,
        lang: body.lang,
        captured_at_ms,
        device: req.device.clone(),
    });
    let outcome = state.engine.submit(command).await?;
    Ok(super::outcome_response(outcome))
}

fn get(state: &AppState, id: Id) -> Result<Response, ApiError> {
    let view = state
        .engine
        .read(|mirror| mirror.moment(id).map(|m| mirror.moment_view(m)));
    match view {
        None => Err(ApiError::not_found(format!("moment {id} does not exist"))),
        Some(view) if view.deleted => Err(ApiError::from(crate::engine::EngineError::Deleted(id))),
        Some(view) => {
            let version = view.version;
            Ok(super::answer::with_etag(
                json_response(StatusCode::OK, &view),
                version,
            ))
        }
    }
}

async fn edit(state: &AppState, id: Id, req: &mut Request) -> Result<Response, ApiError> {
    let body: EditBody = req
        .json(state.settings.limits.json_body_limit_bytes)
        .await?
        .ok_or_else(|| ApiError::invalid_request("a JSON object is required"))?;
    let request_id = req.request_id(body.client_request_id)?;
    let command = Command::EditMoment(EditMoment {
        id,
        request_id,
        if_match: if_match(req)?,
        text: body.text,
        caption: body.caption,
        lang: body.lang,
        device: req.device.clone(),
    });
    let outcome = state.engine.submit(command).await?;
    Ok(super::outcome_response(outcome))
}

async fn delete(state: &AppState, id: Id, req: &mut Request) -> Result<Response, ApiError> {
    let body: DeleteBody = req
        .json(state.settings.limits.json_body_limit_bytes)
        .await?
        .unwrap_or_default();
    let request_id = req.request_id(body.client_request_id)?;
    let command = Command::DeleteMoment(DeleteMoment {
        id,
        request_id,
        if_match: if_match(req)?,
        device: req.device.clone(),
    });
    let outcome = state.engine.submit(command).await?;
    Ok(super::outcome_response(outcome))
}
