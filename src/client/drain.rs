//! Drain: send every pending entry's steps in order, then the pending
//! messages, with the answer rules of SPEC section 6.
//!
//! | answer | what the drain does |
//! | --- | --- |
//! | `2xx` | the step is done: marked durably, skipped on every later pass |
//! | `401`, `403`, `408`, `425`, `429` | passing trouble: wait like a dropped link, for `Retry-After` when sent |
//! | any other `4xx` (and anything unexpected) | park the entry with its reason, for the person to see |
//! | `5xx`, a timeout, a network error | wait with exponential backoff and jitter (or `Retry-After` when a `5xx` sends one), then try again |
//!
//! A wait ends the pass (the link is what is in trouble, not one entry):
//! the drain sleeps on its clock and starts the next pass from the first
//! entry still pending. Every step is idempotent on the server (minted
//! ids, request ids, media hashes), so a step whose reply was lost is
//! simply sent again.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use serde_json::json;
use time::format_description::well_known::Rfc2822;
use time::OffsetDateTime;

use super::clock::ClientClock;
use super::messages::{MessageAttempt, MessageState};
use super::outbox::{Capture, Entry, EntryState, MediaFile, Outbox, Parked, Step};
use super::transport::{HttpRequest, HttpResponse, Method, Transport, TransportError};
use super::ClientError;
use crate::ids::Id;
use crate::time::format_rfc3339_ms;

/// How a drain waits and when it stops.
#[derive(Debug, Clone)]
pub struct DrainOptions {
    /// The first backoff step; doubled after each wait in a row.
    pub backoff_base: Duration,
    /// The longest backoff.
    pub backoff_max: Duration,
    /// The longest `Retry-After` honoured (a longer one is cut to this).
    pub retry_after_max: Duration,
    /// Stop (leaving entries pending) rather than start a wait that would
    /// end later than this after the drain began. `None`: keep going until
    /// nothing is pending.
    pub give_up_after: Option<Duration>,
    /// Stop after this many passes. `None`: no limit.
    pub max_passes: Option<u32>,
}

impl Default for DrainOptions {
    fn default() -> Self {
        DrainOptions {
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(60),
            retry_after_max: Duration::from_secs(3600),
            give_up_after: None,
            max_passes: None,
        }
    }
}

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
    },
    /// A `5xx`, with `Retry-After` if sent.
    Server {
        /// The status.
        status: u16,
        /// The parsed `Retry-After`.
        retry_after: Option<Duration>,
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
            }
            | WaitCause::Server {
                status,
                retry_after,
            } => {
                write!(f, "HTTP {status}")?;
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

/// Reads a problem+json answer into a refusal.
pub fn refusal(response: &HttpResponse) -> Refusal {
    let body = response.json();
    let text = |key: &str| body.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    let detail = text("detail").or_else(|| text("title")).unwrap_or_else(|| {
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
        code: text("code"),
        detail,
        body,
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
    match status_class(response.status) {
        StatusClass::Done => Verdict::Done(response),
        StatusClass::Passing => Verdict::Wait(WaitCause::Passing {
            status: response.status,
            retry_after: retry_after(),
        }),
        StatusClass::ServerError => Verdict::Wait(WaitCause::Server {
            status: response.status,
            retry_after: retry_after(),
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

/// One wait a drain made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitRecord {
    /// Why.
    pub cause: WaitCause,
    /// How long (zero when the drain gave up instead of waiting).
    pub delay: Duration,
}

/// What a drain did.
#[derive(Debug, Clone, Default)]
pub struct DrainReport {
    /// Passes over the outbox.
    pub passes: u32,
    /// Requests sent (answered or not).
    pub requests: u32,
    /// Steps that succeeded in this drain.
    pub steps_done: u32,
    /// Entries finished in this drain.
    pub entries_done: Vec<String>,
    /// Entries parked in this drain, with the reason.
    pub parked: Vec<(String, Parked)>,
    /// Messages sent (`202`) in this drain.
    pub messages_sent: Vec<Id>,
    /// Messages that became `failed` in this drain.
    pub messages_failed: Vec<Id>,
    /// Every wait, in order.
    pub waits: Vec<WaitRecord>,
    /// Entries still pending when the drain stopped.
    pub pending_entries: usize,
    /// Messages still pending when the drain stopped.
    pub pending_messages: usize,
    /// Entries parked in the outbox (from any drain) when it stopped.
    pub parked_entries: usize,
    /// True when the drain stopped on its limits with work still pending.
    pub gave_up: bool,
    /// Entry records that could not be read, with the reason.
    pub unreadable: Vec<(PathBuf, String)>,
}

/// How a pass ended.
pub(crate) enum PassEnd {
    /// Nothing pending is left to try in this pass.
    Clear,
    /// The link is in trouble: wait, then pass again.
    Wait(WaitCause),
}

/// The phone's outbox client: an outbox, a transport and a clock.
#[derive(Clone)]
pub struct Client {
    pub(crate) outbox: Outbox,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) clock: Arc<dyn ClientClock>,
    pub(crate) options: DrainOptions,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("outbox", &self.outbox)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client over `outbox`, sending with `transport`, reading `clock`,
    /// with the default [`DrainOptions`].
    pub fn new(outbox: Outbox, transport: Arc<dyn Transport>, clock: Arc<dyn ClientClock>) -> Self {
        Client {
            outbox,
            transport,
            clock,
            options: DrainOptions::default(),
        }
    }

    /// The same client with these drain options.
    pub fn with_options(mut self, options: DrainOptions) -> Self {
        self.options = options;
        self
    }

    /// The outbox.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// The client clock.
    pub fn clock(&self) -> &dyn ClientClock {
        self.clock.as_ref()
    }

    /// Stores a capture durably (see [`Outbox::capture`]); the returned
    /// entry's `moment_id` is final.
    pub fn capture(&self, capture: Capture) -> Result<Entry, ClientError> {
        self.outbox.capture(self.clock.as_ref(), capture)
    }

    /// Sends everything pending (captures in capture order, then messages
    /// in their outgoing order) until nothing is pending or the options'
    /// limits are reached. Errors only for the outbox's own storage.
    pub async fn drain(&self) -> Result<DrainReport, ClientError> {
        let started_ms = self.clock.now_ms();
        let mut report = DrainReport::default();
        let mut failures = 0u32;
        loop {
            report.passes += 1;
            let steps_before = report.steps_done;
            let sent_before = report.messages_sent.len();
            let end = self.pass(&mut report).await?;
            let PassEnd::Wait(cause) = end else {
                break;
            };
            if report.steps_done > steps_before || report.messages_sent.len() > sent_before {
                failures = 0;
            }
            let delay = match cause.retry_after() {
                Some(after) => after.min(self.options.retry_after_max),
                None => backoff_delay(
                    self.options.backoff_base,
                    self.options.backoff_max,
                    failures,
                ),
            };
            failures = failures.saturating_add(1);
            let out_of_passes = self
                .options
                .max_passes
                .is_some_and(|max| report.passes >= max);
            let elapsed = self.clock.now_ms().saturating_sub(started_ms);
            let out_of_time = self
                .options
                .give_up_after
                .is_some_and(|limit| Duration::from_millis(elapsed).saturating_add(delay) > limit);
            if out_of_passes || out_of_time {
                report.waits.push(WaitRecord {
                    cause,
                    delay: Duration::ZERO,
                });
                report.gave_up = true;
                break;
            }
            tracing::debug!(%cause, ?delay, "outbox drain waits");
            report.waits.push(WaitRecord { cause, delay });
            self.clock.sleep(delay).await;
        }
        let scan = self.outbox.scan()?;
        report.pending_entries = scan
            .entries
            .iter()
            .filter(|e| matches!(e.state(), EntryState::Pending(_)))
            .count();
        report.parked_entries = scan
            .entries
            .iter()
            .filter(|e| e.state() == EntryState::Parked)
            .count();
        report.unreadable = scan.unreadable;
        report.pending_messages = self
            .outbox
            .messages()?
            .iter()
            .filter(|m| m.state == MessageState::Pending)
            .count();
        Ok(report)
    }

    /// One pass: every pending entry's remaining steps, then every pending
    /// message, until the first wait.
    async fn pass(&self, report: &mut DrainReport) -> Result<PassEnd, ClientError> {
        let scan = self.outbox.scan()?;
        for mut entry in scan.entries {
            while let (None, Some(step)) = (&entry.parked, entry.next_step()) {
                report.requests += 1;
                match self.run_step(&entry, step).await {
                    Verdict::Done(response) => {
                        entry.done.push(step);
                        if step == Step::StartTurn {
                            entry.turn_id = response
                                .json()
                                .pointer("/turn/id")
                                .and_then(|v| v.as_str())
                                .map(str::to_owned);
                        }
                        entry.last_error = None;
                        self.outbox.save(&entry)?;
                        report.steps_done += 1;
                        if entry.state() == EntryState::Done {
                            report.entries_done.push(entry.id.clone());
                        }
                    }
                    Verdict::Refused(refusal) => {
                        let parked = Parked {
                            step,
                            status: refusal.status,
                            code: refusal.code,
                            detail: refusal.detail,
                            at: self.now_rfc3339(),
                        };
                        tracing::warn!(entry = %entry.id, reason = %parked, "outbox entry parked");
                        entry.parked = Some(parked.clone());
                        self.outbox.save(&entry)?;
                        report.parked.push((entry.id.clone(), parked));
                    }
                    Verdict::Wait(cause) => {
                        entry.failed_attempts = entry.failed_attempts.saturating_add(1);
                        entry.last_error = Some(format!("step {step}: {cause}"));
                        self.outbox.save(&entry)?;
                        return Ok(PassEnd::Wait(cause));
                    }
                }
            }
        }
        for record in self.outbox.messages()? {
            // A thread whose moment is still here (parked) waits for it.
            if record.state != MessageState::Pending || self.moment_in_outbox(record.thread_id)? {
                continue;
            }
            let outcome = self.attempt_message(record).await?;
            report.requests += outcome.attempts;
            match outcome.result {
                MessageAttempt::Sent => report.messages_sent.push(outcome.record.id),
                MessageAttempt::Failed => report.messages_failed.push(outcome.record.id),
                MessageAttempt::Wait(cause) => return Ok(PassEnd::Wait(cause)),
            }
        }
        Ok(PassEnd::Clear)
    }

    /// Whether `moment_id` belongs to an entry not yet done (pending or
    /// parked): the server does not know that moment yet.
    pub(crate) fn moment_in_outbox(&self, moment_id: Id) -> Result<bool, ClientError> {
        Ok(self
            .outbox
            .scan()?
            .entries
            .iter()
            .any(|e| e.moment_id == moment_id && e.state() != EntryState::Done))
    }

    pub(crate) fn now_rfc3339(&self) -> String {
        format_rfc3339_ms(i64::try_from(self.clock.now_ms()).unwrap_or(i64::MAX))
    }

    /// Sends one step and classifies the answer. A request the outbox
    /// cannot build (a media file gone) is refused without a status.
    async fn run_step(&self, entry: &Entry, step: Step) -> Verdict {
        let request = match self.step_request(entry, step) {
            Ok(request) => request,
            Err(e) => {
                return Verdict::Refused(Refusal {
                    status: None,
                    code: Some("local_file".into()),
                    detail: e.to_string(),
                    body: serde_json::Value::Null,
                })
            }
        };
        let result = self.transport.send(request).await;
        classify(result, self.clock.now_ms())
    }

    /// The request for one step of an entry.
    pub fn step_request(&self, entry: &Entry, step: Step) -> Result<HttpRequest, ClientError> {
        Ok(match step {
            Step::CreateMoment => HttpRequest::json(
                Method::Post,
                "/api/moments",
                &json!({
                    "id": entry.moment_id,
                    "client_request_id": entry.id,
                    "text": entry.text,
                    "caption": entry.caption,
                    "lang": entry.lang,
                    "captured_at": entry.captured_at,
                }),
            ),
            Step::UploadCopy => self.media_request(entry, entry.copy_id, "copy", &entry.copy)?,
            Step::StartTurn => HttpRequest::json(
                Method::Post,
                format!("/api/moments/{}/turns", entry.moment_id),
                &json!({
                    "client_request_id": entry.turn_request_id,
                    "mode": "practical",
                }),
            ),
            Step::UploadOriginal => {
                self.media_request(entry, entry.original_id, "original", &entry.original)?
            }
        })
    }

    fn media_request(
        &self,
        entry: &Entry,
        media_id: Id,
        role: &str,
        media: &MediaFile,
    ) -> Result<HttpRequest, ClientError> {
        let path = self.outbox.media_path(entry, media);
        let bytes = std::fs::read(&path).map_err(|e| super::fsio::io_error(&path, e))?;
        Ok(HttpRequest {
            method: Method::Put,
            path: format!("/api/media/{media_id}"),
            headers: vec![
                ("x-moment-id".into(), entry.moment_id.to_string()),
                ("x-media-role".into(), role.into()),
                ("content-type".into(), media.content_type.clone()),
                ("x-content-sha256".into(), media.sha256.clone()),
            ],
            body: Bytes::from(bytes),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
