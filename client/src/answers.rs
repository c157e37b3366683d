//! How the client takes an answer, or its absence (SPEC section 6):
//!
//! | answer | what the drain does |
//! | --- | --- |
//! | `2xx` | the step is done: marked durably, skipped on every later pass |
//! | `401`, `403`, `408`, `425`, `429` | passing trouble: wait like a dropped link, for `Retry-After` when sent |
//! | any other `4xx` (and anything unexpected) | park the entry with its reason, for the person to see |
//! | `5xx`, a timeout, a network error | wait with exponential backoff and jitter (or `Retry-After` when a `5xx` sends one), then try again |

use std::fmt;
use std::time::Duration;

use rand::Rng;
use serde::Deserialize;
use spark_core::ids::Id;
use spark_core::wire::bodies::Replayed;
use spark_core::wire::problem::Problem;
use time::format_description::well_known::Rfc2822;
use time::OffsetDateTime;

use crate::transport::{HttpResponse, TransportError};

/// How the drain takes a status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    /// `2xx`: done.
    Done,
    /// `401`, `403`, `408`, `425`, `429`: wait like a dropped link.
    Passing,
    /// `5xx`: wait with backoff.
    ServerError,
    /// Any other status: park.
    Permanent,
}

/// Classifies a status code (SPEC section 6).
pub fn status_class(status: u16) -> StatusClass {
    match status {
        200..=299 => StatusClass::Done,
        401 | 403 | 408 | 425 | 429 => StatusClass::Passing,
        500..=599 => StatusClass::ServerError,
        _ => StatusClass::Permanent,
    }
}

/// Why a drain (or a message send) is waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitCause {
    /// No answer: a network error or a timeout.
    Link(TransportError),
    /// `401`, `403`, `408`, `425` or `429`, with `Retry-After` if sent.
    Passing {
        /// The status.
        status: u16,
        /// The parsed `Retry-After`.
        retry_after: Option<Duration>,
        /// The server's reason: the problem's `code` and `detail`.
        reason: String,
    },
    /// A `5xx`, with `Retry-After` if sent.
    Server {
        /// The status.
        status: u16,
        /// The parsed `Retry-After`.
        retry_after: Option<Duration>,
        /// The server's reason: the problem's `code` and `detail`.
        reason: String,
    },
    /// Not sent: the message's thread is a moment still waiting in the
    /// outbox (pending or parked), which the server does not know yet.
    MomentInOutbox(Id),
}

impl WaitCause {
    /// The `Retry-After` the server asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            WaitCause::Link(_) | WaitCause::MomentInOutbox(_) => None,
            WaitCause::Passing { retry_after, .. } | WaitCause::Server { retry_after, .. } => {
                *retry_after
            }
        }
    }

    /// The status, when there was an answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            WaitCause::Link(_) | WaitCause::MomentInOutbox(_) => None,
            WaitCause::Passing { status, .. } | WaitCause::Server { status, .. } => Some(*status),
        }
    }
}

impl fmt::Display for WaitCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitCause::Link(e) => write!(f, "{e}"),
            WaitCause::MomentInOutbox(id) => {
                write!(f, "moment {id} is still in the outbox, not yet sent")
            }
            WaitCause::Passing {
                status,
                retry_after,
                reason,
            }
            | WaitCause::Server {
                status,
                retry_after,
                reason,
            } => {
                write!(f, "HTTP {status} {reason}")?;
                if let Some(after) = retry_after {
                    write!(f, " (Retry-After {}s)", after.as_secs_f64())?;
                }
                Ok(())
            }
        }
    }
}

/// A refusal for good, from a problem+json answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The status (`None` for a local failure to build the request).
    pub status: Option<u16>,
    /// The problem's `code`.
    pub code: Option<String>,
    /// The problem's `detail` (or `title`, or the body).
    pub detail: String,
    /// The whole answer body as JSON (`Null` when none or not JSON).
    pub body: serde_json::Value,
}

/// How one answer (or its absence) is taken.
#[derive(Debug, Clone)]
pub enum Verdict {
    /// `2xx`: the answer.
    Done(HttpResponse),
    /// Try again later.
    Wait(WaitCause),
    /// Refused for good.
    Refused(Refusal),
}

/// Parses `Retry-After`: delta-seconds, or an HTTP date (measured against
/// `now_ms`, the client clock; a past date is no wait).
pub fn parse_retry_after(value: &str, now_ms: u64) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = OffsetDateTime::parse(value, &Rfc2822).ok()?;
    let at_ms = at.unix_timestamp_nanos() / 1_000_000;
    let wait_ms = at_ms - i128::from(now_ms);
    Some(Duration::from_millis(
        u64::try_from(wait_ms.max(0)).unwrap_or(u64::MAX),
    ))
}

/// Reads a problem+json answer ([`Problem`]) into a refusal: its `code`,
/// and its `detail` (or `title`, or the first 200 characters of the body
/// when it is no problem+json).
pub fn refusal(response: &HttpResponse) -> Refusal {
    let body = response.json();
    let problem = Problem::deserialize(&body).unwrap_or_default();
    let non_empty = |text: String| Some(text).filter(|t| !t.is_empty());
    let detail = non_empty(problem.detail)
        .or_else(|| non_empty(problem.title))
        .unwrap_or_else(|| {
            let raw = String::from_utf8_lossy(&response.body);
            let raw: String = raw.chars().take(200).collect();
            if raw.trim().is_empty() {
                "no details".to_owned()
            } else {
                raw
            }
        });
    Refusal {
        status: Some(response.status),
        code: non_empty(problem.code),
        detail,
        body,
    }
}

/// The op a replayed answer names: `Some` when the server marked the
/// answer `Idempotent-Replayed: true` (a write it had already made, issue
/// 19), with the body's `replayed` member when it is readable.
pub fn replay(response: &HttpResponse) -> Option<Option<Replayed>> {
    let marked = response
        .header(spark_core::wire::HEADER_IDEMPOTENT_REPLAYED)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    if !marked {
        return None;
    }
    let body = response.json();
    Some(
        body.get("replayed")
            .and_then(|r| Replayed::deserialize(r).ok()),
    )
}

/// Logs at info that `response` answered `what` as a replay, with the op
/// that first produced it; logs nothing for a new write.
pub fn log_replay(response: &HttpResponse, what: &dyn fmt::Display) {
    match replay(response) {
        None => {}
        Some(Some(op)) => tracing::info!(
            what = %what,
            seq = op.seq,
            ts = %op.ts,
            request_id = op.request_id.as_deref().unwrap_or("none"),
            "the server already had this write: answered as a replay"
        ),
        Some(None) => tracing::info!(
            what = %what,
            "the server already had this write: answered as a replay"
        ),
    }
}

/// Classifies an answer, or its absence (SPEC section 6).
pub fn classify(result: Result<HttpResponse, TransportError>, now_ms: u64) -> Verdict {
    let response = match result {
        Ok(response) => response,
        Err(e) => return Verdict::Wait(WaitCause::Link(e)),
    };
    let retry_after = || {
        response
            .header("retry-after")
            .and_then(|v| parse_retry_after(v, now_ms))
    };
    // The server's reason, as a person reads it: `code: detail`.
    let reason = || {
        let refusal = refusal(&response);
        match refusal.code {
            Some(code) => format!("{code}: {}", refusal.detail),
            None => refusal.detail,
        }
    };
    match status_class(response.status) {
        StatusClass::Done => Verdict::Done(response),
        StatusClass::Passing => Verdict::Wait(WaitCause::Passing {
            status: response.status,
            retry_after: retry_after(),
            reason: reason(),
        }),
        StatusClass::ServerError => Verdict::Wait(WaitCause::Server {
            status: response.status,
            retry_after: retry_after(),
            reason: reason(),
        }),
        StatusClass::Permanent => Verdict::Refused(refusal(&response)),
    }
}

/// The backoff before the next pass after `failures` waits in a row
/// (0 for the first): `base * 2^failures`, capped at `max`, with equal
/// jitter (half fixed, half random), so it lies in `[cap / 2, cap]`.
pub fn backoff_delay(base: Duration, max: Duration, failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.min(31));
    let cap = base.saturating_mul(factor).min(max);
    let half = cap / 2;
    let spread = u64::try_from((cap - half).as_micros()).unwrap_or(u64::MAX);
    half + Duration::from_micros(rand::thread_rng().gen_range(0..=spread))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn a_replay_is_read_from_its_header_and_body() {
        let response = |headers: Vec<(String, String)>, body: &str| HttpResponse {
            status: 200,
            headers,
            body: Bytes::from(body.to_owned()),
        };
        let marked = vec![("Idempotent-Replayed".to_owned(), "true".to_owned())];
        let body = r#"{"created":false,"replayed":{"seq":7,"ts":"2026-01-01T00:00:00Z","ts_ms":1767225600000,"request_id":"r1"},"moment":{}}"#;
        let op = replay(&response(marked.clone(), body)).unwrap().unwrap();
        assert_eq!((op.seq, op.request_id.as_deref()), (7, Some("r1")));
        assert_eq!(replay(&response(marked, "{}")), Some(None));
        assert_eq!(replay(&response(Vec::new(), body)), None);
    }

    fn answer(status: u16, headers: &[(&str, &str)]) -> Result<HttpResponse, TransportError> {
        Ok(HttpResponse {
            status,
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            body: Bytes::from_static(br#"{"code":"too_large","detail":"over the limit"}"#),
        })
    }

    #[test]
    fn status_classes() {
        for s in [200, 201, 202, 204] {
            assert_eq!(status_class(s), StatusClass::Done);
        }
        for s in [401, 403, 408, 425, 429] {
            assert_eq!(status_class(s), StatusClass::Passing);
        }
        for s in [500, 502, 503, 504] {
            assert_eq!(status_class(s), StatusClass::ServerError);
        }
        for s in [300, 400, 404, 405, 409, 410, 412, 413, 422] {
            assert_eq!(status_class(s), StatusClass::Permanent);
        }
    }

    #[test]
    fn retry_after_forms() {
        let now = 784_111_777_000; // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn classify_reads_retry_after_and_problems() {
        match classify(answer(429, &[("Retry-After", "3")]), 0) {
            Verdict::Wait(cause) => assert_eq!(cause.retry_after(), Some(Duration::from_secs(3))),
            other => panic!("{other:?}"),
        }
        match classify(answer(413, &[]), 0) {
            Verdict::Refused(r) => {
                assert_eq!(r.status, Some(413));
                assert_eq!(r.code.as_deref(), Some("too_large"));
                assert_eq!(r.detail, "over the limit");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            classify(Err(TransportError::Timeout("t".into())), 0),
            Verdict::Wait(WaitCause::Link(_))
        ));
    }

    #[test]
    fn backoff_doubles_within_jitter_and_caps() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        for failures in 0..10 {
            let cap = (base * 2u32.pow(failures)).min(max);
            for _ in 0..50 {
                let d = backoff_delay(base, max, failures);
                assert!(d >= cap / 2 && d <= cap, "{failures}: {d:?} vs {cap:?}");
            }
        }
        assert!(backoff_delay(base, max, u32::MAX) <= max);
    }
}
