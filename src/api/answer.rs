//! Write answers on the wire (SPEC section 10): every [`Outcome`] becomes
//! its status and JSON body here, in one place, so no handler matches on
//! outcomes of other routes.
//!
//! | outcome | new | known |
//! |---|---|---|
//! | moment created | `201` | `200` |
//! | moment edited, deleted; phrase dropped | `200` | `200` |
//! | media put, phrase kept | `201` | `200` |
//! | turn, recall, job started | `202` | `200` |
//! | message posted | `202` | `202` |
//!
//! A moment's create and edit carry its version as `ETag`.
//!
//! An answer from a known identity (`created: false`) says it is a replay
//! (after the IETF httpapi idempotency-key draft): the header
//! `Idempotent-Replayed: true`, and the body's `replayed` member names the
//! op that first produced it (`seq`, `ts`, `ts_ms`, `request_id`); on a new
//! write there is no header and `replayed` is `null`.

use serde::Serialize;
use spark_core::outcome::Replay;
use spark_core::wire::bodies::{
    JobStarted, MediaPut, MessagePosted, MomentChanged, MomentCreated, MomentDeleted,
    PhraseDropped, PhraseKept, RecallStarted, Replayed, TurnStarted,
};
use spark_core::wire::HEADER_IDEMPOTENT_REPLAYED;
use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::Response;

use crate::engine::Outcome;

use super::json_response;

/// `201`/`202` for something new (`new_status`), `200` for something known.
fn status(created: bool, new_status: StatusCode) -> StatusCode {
    if created {
        new_status
    } else {
        StatusCode::OK
    }
}

fn answer<T: Serialize>(status: StatusCode, body: T) -> Response {
    json_response(status, &body)
}

/// A create-or-known answer: `status`, the body `body` builds around the
/// `replayed` member, and `Idempotent-Replayed: true` when it is a replay.
fn create_or_known<T: Serialize>(
    status: StatusCode,
    replay: Option<Replay>,
    body: impl FnOnce(Option<Replayed>) -> T,
) -> Response {
    let replayed = replay.is_some();
    let mut response = answer(status, body(replay.map(Replayed::from)));
    if replayed {
        response.headers_mut().insert(
            header::HeaderName::from_static(HEADER_IDEMPOTENT_REPLAYED),
            HeaderValue::from_static("true"),
        );
    }
    response
}

/// Sets `ETag: "<version>"`, a moment's version.
pub(crate) fn with_etag(mut response: Response, version: u32) -> Response {
    response.headers_mut().insert(header::ETAG, etag(version));
    response
}

/// `"<version>"` as a header value: a create's version 1 without an
/// allocation, any other formatted by `itoa` on the stack.
fn etag(version: u32) -> HeaderValue {
    if version == 1 {
        return HeaderValue::from_static("\"1\"");
    }
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(version).as_bytes();
    // A quote, at most 10 digits, a quote.
    let mut text = [b'"'; 12];
    text[1..=digits.len()].copy_from_slice(digits);
    HeaderValue::from_bytes(&text[..digits.len() + 2])
        .expect("quotes and digits are a header value")
}

/// The response of a write command's outcome (see the table above).
pub(crate) fn outcome_response(outcome: Outcome) -> Response {
    match outcome {
        Outcome::MomentCreated {
            created,
            replayed,
            moment,
        } => {
            let version = moment.version;
            let status = status(created, StatusCode::CREATED);
            let response = create_or_known(status, replayed, |replayed| MomentCreated {
                created,
                replayed,
                moment,
            });
            with_etag(response, version)
        }
        Outcome::MomentEdited { changed, moment } => {
            let version = moment.version;
            with_etag(
                answer(StatusCode::OK, MomentChanged { changed, moment }),
                version,
            )
        }
        Outcome::MomentDeleted { deleted, moment } => {
            answer(StatusCode::OK, MomentDeleted { deleted, moment })
        }
        Outcome::MediaPut {
            created,
            replayed,
            media,
        } => create_or_known(status(created, StatusCode::CREATED), replayed, |replayed| {
            MediaPut {
                created,
                replayed,
                media,
            }
        }),
        Outcome::TurnStarted {
            created,
            replayed,
            turn,
        } => create_or_known(
            status(created, StatusCode::ACCEPTED),
            replayed,
            |replayed| TurnStarted {
                created,
                replayed,
                turn,
            },
        ),
        // Not an HTTP answer today (the turn runner ends turns); shaped
        // like a turn read.
        Outcome::TurnEnded { turn } => answer(StatusCode::OK, turn),
        Outcome::PhraseKept {
            created,
            replayed,
            mark,
        } => create_or_known(status(created, StatusCode::CREATED), replayed, |replayed| {
            PhraseKept {
                created,
                replayed,
                mark,
            }
        }),
        Outcome::PhraseDropped { dropped, mark } => {
            answer(StatusCode::OK, PhraseDropped { dropped, mark })
        }
        Outcome::RecallStarted {
            created,
            replayed,
            recall,
        } => create_or_known(
            status(created, StatusCode::ACCEPTED),
            replayed,
            |replayed| RecallStarted {
                created,
                replayed,
                recall,
            },
        ),
        Outcome::JobStarted {
            created,
            replayed,
            job,
        } => create_or_known(
            status(created, StatusCode::ACCEPTED),
            replayed,
            |replayed| JobStarted {
                created,
                replayed,
                job,
            },
        ),
        // New or known, a message is answered 202 with what is stored.
        Outcome::MessagePosted {
            created,
            replayed,
            message,
        } => create_or_known(StatusCode::ACCEPTED, replayed, |replayed| MessagePosted {
            created,
            replayed,
            message,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::etag;

    /// The ETag of a version is the version in quotes, as `format!` wrote it.
    #[test]
    fn etags_are_quoted_versions() {
        for version in [0, 1, 2, 9, 10, 11, 99, 100, 12_345, 999_999_999, u32::MAX] {
            assert_eq!(etag(version).to_str().unwrap(), format!("\"{version}\""));
        }
    }
}
