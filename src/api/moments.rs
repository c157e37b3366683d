//! `/api/moments` and `/api/moments/{id}` (SPEC sections 3, 4 and 10).

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize};
use warp::http::{header, HeaderValue, Method, StatusCode};
use warp::reply::Response;

use crate::engine::{Command, CreateMoment, DeleteMoment, EditMoment, FieldChange, Outcome};
use crate::ids::Id;
use crate::mirror::MomentView;

use super::{json_response, ApiError, AppState, Request};

/// Body of `POST /api/moments`. Unknown members are refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    id: Option<String>,
    client_request_id: Option<String>,
    text: Option<String>,
    caption: Option<String>,
    lang: Option<String>,
    captured_at: Option<String>,
}

/// Body of `PATCH /api/moments/{id}`: a member left out is left alone, a
/// member set to `null` is cleared (JSON merge patch).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EditBody {
    #[serde(default, deserialize_with = "present")]
    text: FieldChange,
    #[serde(default, deserialize_with = "present")]
    caption: FieldChange,
    #[serde(default, deserialize_with = "present")]
    lang: FieldChange,
    client_request_id: Option<String>,
}

/// Optional body of `DELETE /api/moments/{id}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteBody {
    client_request_id: Option<String>,
}

/// Query of `GET /api/moments`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    after: Option<String>,
    limit: Option<String>,
}

/// Marks a member that was sent (even as `null`) as `Some`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<FieldChange, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

#[derive(Serialize)]
struct CreatedAnswer<'a> {
    created: bool,
    moment: &'a MomentView,
}

#[derive(Serialize)]
struct ChangedAnswer<'a> {
    changed: bool,
    moment: &'a MomentView,
}

#[derive(Serialize)]
struct DeletedAnswer<'a> {
    deleted: bool,
    moment: &'a MomentView,
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
fn with_etag(mut response: Response, version: u32) -> Response {
    if let Ok(value) = HeaderValue::from_str(&format!("\"{version}\"")) {
        response.headers_mut().insert(header::ETAG, value);
    }
    response
}

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
    let limit = super::page_limit(query.limit.as_deref(), limits)?;
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
    Ok(json_response(StatusCode::OK, &page))
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
    match state.engine.submit(command).await? {
        Outcome::MomentCreated { created, moment } => {
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            let version = moment.version;
            Ok(with_etag(
                json_response(
                    status,
                    &CreatedAnswer {
                        created,
                        moment: &moment,
                    },
                ),
                version,
            ))
        }
        other => Err(super::unexpected(other)),
    }
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
            Ok(with_etag(json_response(StatusCode::OK, &view), version))
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
    match state.engine.submit(command).await? {
        Outcome::MomentEdited { changed, moment } => {
            let version = moment.version;
            Ok(with_etag(
                json_response(
                    StatusCode::OK,
                    &ChangedAnswer {
                        changed,
                        moment: &moment,
                    },
                ),
                version,
            ))
        }
        other => Err(super::unexpected(other)),
    }
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
    match state.engine.submit(command).await? {
        Outcome::MomentDeleted { deleted, moment } => Ok(json_response(
            StatusCode::OK,
            &DeletedAnswer {
                deleted,
                moment: &moment,
            },
        )),
        other => Err(super::unexpected(other)),
    }
}
