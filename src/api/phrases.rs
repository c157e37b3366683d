//! `/api/phrases` and `/api/phrases/{mark id}`: kept phrases (SPEC section 4).
//!
//! A phrase is normalised (Unicode NFKC, lower case, trimmed, runs of white
//! space to one space; 1 to 200 characters) and its mark id is
//! `keep:<phrase>`, so keeping it twice finds the active mark and writes
//! nothing.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use unicode_normalization::UnicodeNormalization;
use warp::http::{Method, StatusCode};
use warp::reply::Response;

use crate::engine::{Command, DropPhrase, KeepPhrase, Outcome};
use crate::ids::Id;
use crate::mirror::MarkView;

use super::{json_response, ApiError, AppState, Request};

/// Longest normalised phrase, in characters (SPEC section 4).
pub const PHRASE_MAX_CHARS: usize = 200;

/// Normalises a phrase: NFKC, lower case, trimmed, white space runs to one
/// space. Errors when the result is empty or over [`PHRASE_MAX_CHARS`].
pub fn normalise_phrase(text: &str) -> Result<String, String> {
    let folded: String = text.nfkc().collect::<String>().to_lowercase();
    let phrase = folded.split_whitespace().collect::<Vec<_>>().join(" ");
    let chars = phrase.chars().count();
    if chars == 0 {
        return Err("the phrase is empty once normalised".into());
    }
    if chars > PHRASE_MAX_CHARS {
        return Err(format!(
            "the phrase is {chars} characters once normalised; the limit is {PHRASE_MAX_CHARS}"
        ));
    }
    Ok(phrase)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeepBody {
    phrase: String,
    moment_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    after: Option<String>,
    limit: Option<String>,
}

#[derive(Serialize)]
struct KeepAnswer<'a> {
    created: bool,
    mark: &'a MarkView,
}

#[derive(Serialize)]
struct DropAnswer<'a> {
    dropped: bool,
    mark: &'a MarkView,
}

#[derive(Serialize)]
struct Page {
    marks: Vec<MarkView>,
    next: Option<String>,
}

/// `POST` (keep) and `GET` (list the active ones) on `/api/phrases`.
pub async fn collection(state: Arc<AppState>, mut req: Request) -> Result<Response, ApiError> {
    match req.method {
        Method::POST => keep(&state, &mut req).await,
        Method::GET => list(&state, &req),
        _ => Err(ApiError::method_not_allowed("GET, POST")),
    }
}

/// `DELETE /api/phrases/{mark id}` (the mark id percent-encoded in the path).
pub async fn item(state: Arc<AppState>, id: String, req: Request) -> Result<Response, ApiError> {
    if req.method != Method::DELETE {
        return Err(ApiError::method_not_allowed("DELETE"));
    }
    let mark_id = percent_encoding::percent_decode_str(&id)
        .decode_utf8()
        .map_err(|_| ApiError::invalid_request("the mark id in the path is not UTF-8"))?
        .into_owned();
    let Some(phrase) = mark_id.strip_prefix("keep:") else {
        return Err(ApiError::invalid_request(format!(
            "{mark_id:?} is not a mark id (keep:<phrase>)"
        )));
    };
    // The id must be the canonical form of its phrase.
    let canonical = normalise_phrase(phrase).map_err(ApiError::invalid_request)?;
    let command = Command::DropPhrase(DropPhrase {
        mark_id: crate::engine::mark_id(&canonical),
        device: req.device.clone(),
    });
    match state.engine.submit(command).await? {
        Outcome::PhraseDropped { dropped, mark } => Ok(json_response(
            StatusCode::OK,
            &DropAnswer {
                dropped,
                mark: &mark,
            },
        )),
        other => Err(super::unexpected(other)),
    }
}

async fn keep(state: &AppState, req: &mut Request) -> Result<Response, ApiError> {
    let body: KeepBody = req
        .json(state.settings.limits.json_body_limit_bytes)
        .await?
        .ok_or_else(|| ApiError::invalid_request("a JSON object with a phrase is required"))?;
    let phrase = normalise_phrase(&body.phrase).map_err(ApiError::invalid_request)?;
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
    match state.engine.submit(command).await? {
        Outcome::PhraseKept { created, mark } => {
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(json_response(
                status,
                &KeepAnswer {
                    created,
                    mark: &mark,
                },
            ))
        }
        other => Err(super::unexpected(other)),
    }
}

fn list(state: &AppState, req: &Request) -> Result<Response, ApiError> {
    let query: ListQuery = req.query()?;
    let limits = &state.settings.limits;
    let limit = super::page_limit(query.limit.as_deref(), limits)?;
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
    Ok(json_response(StatusCode::OK, &page))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phrases_normalise() {
        assert_eq!(
            normalise_phrase("  Bitte   NICHT rauchen ").unwrap(),
            "bitte nicht rauchen"
        );
        // NFKC folds compatibility forms: full-width letters, the "ﬁ" ligature.
        assert_eq!(normalise_phrase("ＡＵＳＧＡＮＧ").unwrap(), "ausgang");
        assert_eq!(normalise_phrase("ﬁre exit").unwrap(), "fire exit");
        assert_eq!(normalise_phrase("Straße\t\nfrei").unwrap(), "straße frei");
        assert!(normalise_phrase(" \t ").is_err());
        assert!(normalise_phrase(&"a".repeat(201)).is_err());
        assert!(normalise_phrase(&"a".repeat(200)).is_ok());
    }
}
