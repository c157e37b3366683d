//! `/api/moments` and `/api/moments/{id}` (SPEC sections 3, 4 and 10).

use serde::Serialize;
use spark_core::wire::bodies::{
    CreateMomentBody as CreateBody, DeleteMomentBody as DeleteBody, EditMomentBody as EditBody,
};
use warp::http::StatusCode;
use warp::reply::Response;

use crate::engine::{Command, CreateMoment, DeleteMoment, EditMoment};
use spark_core::ids::Id;
use spark_core::mirror::{MomentView, PageOrder};

use super::{json_response, ApiError, AppState, Request};

#[derive(Serialize)]
struct Page {
    moments: Vec<MomentView>,
    next: Option<Id>,
}

fn parse_id(text: &str, what: &str) -> Result<Id, ApiError> {
    Id::parse(text).map_err(|e| ApiError::invalid_id(what, e))
}

/// `ETag: "<version>"` (SPEC section 10), what `If-Match` takes.
/// Reads `If-Match` (RFC 9110 section 13.1.1) for moment `id`: `*`
/// (any existing moment) and no header are `None`; otherwise a list of
/// one or more versions, each `"<version>"`, `W/"<version>"` or a bare
/// number (the documented leniency), empty list elements skipped. The
/// condition holds when any listed version is the moment's current one:
/// that version is returned, for the engine to check again when it applies
/// the op (a moment changed in between is `412`, never a lost update); when
/// none is, the first listed is returned and the engine answers `412
/// precondition_failed` with the current version. Anything else (a `*`
/// inside a list, an entity-tag that is not a version) is `400
/// invalid_request`.
fn if_match(state: &AppState, id: Id, req: &Request) -> Result<Option<u32>, ApiError> {
    let Some(value) = req.header("if-match")? else {
        return Ok(None);
    };
    if value == "*" {
        return Ok(None);
    }
    let refused = || {
        ApiError::invalid_request(format!(
            "If-Match {value:?} is not a moment version or a list of them (send the ETag of \
             GET /api/moments/{{id}}, or *)"
        ))
    };
    let versions = value
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            let bare = item.strip_prefix("W/").unwrap_or(item).trim_matches('"');
            bare.parse::<u32>().map_err(|_| refused())
        })
        .collect::<Result<Vec<u32>, ApiError>>()?;
    let Some(&first) = versions.first() else {
        return Err(refused());
    };
    let current = state
        .engine
        .read(|mirror| mirror.moment(id).map(|m| m.version));
    Ok(Some(match current {
        Some(version) if versions.contains(&version) => version,
        _ => first,
    }))
}

/// The moment id of a `/api/moments/{id}` path: `400 invalid_id` when it
/// is not a ULID.
pub(crate) fn path_id(text: &str) -> Result<Id, ApiError> {
    parse_id(text, "the moment id in the path")
}

/// The query of `GET /api/moments`: `after` and `limit` as every list
/// route ([`super::PageQuery`]), and `order`: `oldest` (id order, the
/// default) or `newest` (highest id first; `after` is then the last id of
/// the page before in that order, as `next` gives it). Any other parameter
/// is `400 invalid_request`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct MomentPageQuery {
    /// The last id of the page before (absent: the first page).
    after: Option<String>,
    /// The page size as given, in items.
    limit: Option<String>,
    /// `oldest` or `newest`, as given.
    order: Option<String>,
}

/// `GET /api/moments`: a page of moments, in id order or newest first.
pub(crate) fn list(state: &AppState, req: &Request) -> Result<Response, ApiError> {
    let query: MomentPageQuery = req.query()?;
    let order = match query.order.as_deref() {
        None | Some("oldest") => PageOrder::Oldest,
        Some("newest") => PageOrder::Newest,
        Some(other) => {
            return Err(ApiError::invalid_request(format!(
                "order {other:?} is not an order: send oldest (id order, the default) or newest"
            )))
        }
    };
    let after = query
        .after
        .as_deref()
        .map(|a| parse_id(a, "after"))
        .transpose()?;
    let limits = &state.settings.limits;
    let page_limit = super::page_limit(query.limit.as_deref(), limits)?;
    let limit = page_limit.items;
    let page = state.engine.read(|mirror| {
        let (moments, more) = mirror.live_page(after, limit, order);
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

/// `POST /api/moments`: creates a moment.
pub(crate) async fn create(state: &AppState, req: &mut Request) -> Result<Response, ApiError> {
    let body: CreateBody = req
        .json(state.settings.limits.json_body_limit_bytes)
        .await?
        .ok_or_else(|| ApiError::invalid_request("a JSON object is required"))?;
    let request_id = req.request_id(body.client_request_id)?;
    let id = body.id.as_deref().map(|t| parse_id(t, "id")).transpose()?;
    let captured_at_ms = body
        .captured_at
        .as_deref()
        .map(spark_core::time::parse_rfc3339_ms)
        .transpose()
        .map_err(|e| ApiError::invalid_request(e.to_string()))?;
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

/// `GET /api/moments/{id}`.
pub(crate) fn get(state: &AppState, id: Id) -> Result<Response, ApiError> {
    let view = state
        .engine
        .read(|mirror| mirror.moment(id).map(|m| mirror.moment_view(m)));
    match view {
        None => Err(ApiError::not_found(format!("moment {id} does not exist"))),
        Some(view) if view.deleted => {
            // The tombstone (SPEC section 13): ids, version, times, media
            // records and turn ids; `moment_view` leaves out the texts.
            let mut error = ApiError::from(crate::engine::EngineError::Deleted(id));
            error.extra.insert(
                "moment".into(),
                serde_json::to_value(view).unwrap_or(serde_json::Value::Null),
            );
            Err(error)
        }
        Some(view) => {
            let version = view.version;
            Ok(super::answer::with_etag(
                json_response(StatusCode::OK, &view),
                version,
            ))
        }
    }
}

/// `PATCH /api/moments/{id}`.
pub(crate) async fn edit(
    state: &AppState,
    id: Id,
    req: &mut Request,
) -> Result<Response, ApiError> {
    let body: EditBody = req
        .json(state.settings.limits.json_body_limit_bytes)
        .await?
        .ok_or_else(|| ApiError::invalid_request("a JSON object is required"))?;
    let request_id = req.request_id(body.client_request_id)?;
    let command = Command::EditMoment(EditMoment {
        id,
        request_id,
        if_match: if_match(state, id, req)?,
        text: body.text,
        caption: body.caption,
        lang: body.lang,
        device: req.device.clone(),
    });
    let outcome = state.engine.submit(command).await?;
    Ok(super::outcome_response(outcome))
}

/// `DELETE /api/moments/{id}`.
pub(crate) async fn delete(
    state: &AppState,
    id: Id,
    req: &mut Request,
) -> Result<Response, ApiError> {
    let body: DeleteBody = req
        .json(state.settings.limits.json_body_limit_bytes)
        .await?
        .unwrap_or_default();
    let request_id = req.request_id(body.client_request_id)?;
    let command = Command::DeleteMoment(DeleteMoment {
        id,
        request_id,
        if_match: if_match(state, id, req)?,
        device: req.device.clone(),
    });
    let outcome = state.engine.submit(command).await?;
    Ok(super::outcome_response(outcome))
}
