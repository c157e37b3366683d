//! Outgoing messages with the retry rules of ADR-036 (SPEC section 6).
//!
//! - The first send mints the ULID, from the client clock, at the send.
//! - A retry reuses it while its time is within [`REUSE_MARGIN_MS`] (4
//!   minutes) of the client clock: the record stays, only its state
//!   changes, and it keeps its `ts` (display time follows the id).
//! - Past that, a fresh ULID is minted: the old record is removed and a new
//!   one written, with the same place (`order`) in the outgoing order.
//! - `clock_skew` on a reused id drops it and tries once more at once with
//!   a fresh one; `clock_skew` on a fresh id makes the message `failed`
//!   with a clock error, with no second round.
//! - `202` brings the server's `ts`.
//!
//! Each message is one file, `messages/<order>-<id>.json`, written
//! durably. A crash between writing a renewed record and removing the old
//! one leaves two files with the same order; the one with the higher
//! `generation` wins and the other is removed on the next renewal or
//! ignored when listing.

use std::fmt;
use std::fs;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::answers::{classify, Refusal, Verdict, WaitCause};
use crate::client::Client;
use crate::fsio::{io_error, remove_file_durably, write_file_durably};
use crate::outbox::{mint, Outbox};
use crate::requests::json_request;
use crate::transport::{HttpResponse, Method};
use crate::ClientError;
use spark_core::ids::Id;
use spark_core::time::format_rfc3339_ms;
use spark_core::wire::bodies::{MessagePosted, PostMessageBody};
use spark_core::wire::problem::{ClockSkewMembers, CLOCK_SKEW};
use spark_core::wire::REUSE_MARGIN_MS;

/// Version of the message record layout this build writes and reads.
pub const MESSAGE_FORMAT: u32 = 1;

/// Where a message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageState {
    /// Not yet acknowledged; the next drain sends it.
    Pending,
    /// The server answered `202`.
    Sent,
    /// Refused for good (a clock error, an unknown thread, ...); see
    /// [`MessageRecord::error`]. [`Outbox::retry_message`] makes it pending
    /// again.
    Failed,
}

impl fmt::Display for MessageState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MessageState::Pending => "pending",
            MessageState::Sent => "sent",
            MessageState::Failed => "failed",
        })
    }
}

/// Why a message failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageError {
    /// `clock_skew` for a clock error; otherwise the server's problem code
    /// (or `http_<status>`).
    pub code: String,
    /// In words, for the person.
    pub detail: String,
}

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

/// One outgoing message, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageRecord {
    /// Layout version ([`MESSAGE_FORMAT`]).
    pub format: u32,
    /// Its place in the outgoing order; kept across fresh ids.
    pub order: u64,
    /// How many times a fresh id replaced the first one.
    pub generation: u32,
    /// The message id (ULID minted at a send attempt).
    pub id: Id,
    /// The moment whose thread it goes to.
    pub thread_id: Id,
    /// The text.
    pub body: String,
    /// Display time: the id's time until `202` brings the server's `ts`.
    pub ts: String,
    /// Whether `ts` is the server's.
    pub ts_from_server: bool,
    /// Where it stands.
    pub state: MessageState,
    /// Why it failed (only when `failed`).
    pub error: Option<MessageError>,
    /// The last passing trouble while pending (a dropped link, a `503`).
    pub last_error: Option<String>,
    /// Requests sent for it, over all ids.
    pub attempts: u32,
}

impl MessageRecord {
    fn file_name(&self) -> String {
        format!("{:020}-{}.json", self.order, self.id)
    }
}

/// How one send of a message ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageAttempt {
    /// `202`: the server holds it.
    Sent,
    /// Refused for good; the record says why.
    Failed,
    /// No usable answer: still pending, for the next drain.
    Wait(WaitCause),
}

/// The result of [`Client::send_message`] (and of each message a drain
/// sends).
#[derive(Debug, Clone)]
pub struct MessageOutcome {
    /// The record as stored after the send.
    pub record: MessageRecord,
    /// How it ended.
    pub result: MessageAttempt,
    /// Requests sent in this send: 1, or 2 when `clock_skew` on a reused id
    /// led to the one retry with a fresh id.
    pub attempts: u32,
}

impl Outbox {
    /// Every outgoing message, in outgoing order. Records that cannot be
    /// read are skipped (and logged).
    pub fn messages(&self) -> Result<Vec<MessageRecord>, ClientError> {
        let dir = self.messages_dir();
        let mut records: Vec<MessageRecord> = Vec::new();
        for item in fs::read_dir(&dir).map_err(|e| io_error(&dir, e))? {
            let item = item.map_err(|e| io_error(&dir, e))?;
            let name = item.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let path = item.path();
            let parsed = fs::read(&path).map_err(|e| e.to_string()).and_then(|b| {
                serde_json::from_slice::<MessageRecord>(&b).map_err(|e| e.to_string())
            });
            match parsed {
                Ok(record) if record.format <= MESSAGE_FORMAT => records.push(record),
                Ok(record) => tracing::warn!(
                    path = %path.display(),
                    format = record.format,
                    "message record is newer than this build reads"
                ),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "unreadable message record")
                }
            }
        }
        records.sort_by(|a, b| a.order.cmp(&b.order).then(b.generation.cmp(&a.generation)));
        // A renewal interrupted by a crash leaves the older generation too.
        records.dedup_by_key(|r| r.order);
        Ok(records)
    }

    /// The message with this id.
    pub fn message(&self, id: Id) -> Result<MessageRecord, ClientError> {
        self.messages()?
            .into_iter()
            .find(|m| m.id == id)
            .ok_or_else(|| ClientError::Invalid(format!("no message {id} in the outbox")))
    }

    fn message_path(&self, record: &MessageRecord) -> PathBuf {
        self.messages_dir().join(record.file_name())
    }

    /// Writes a message record durably (atomic replace).
    pub fn save_message(&self, record: &MessageRecord) -> Result<(), ClientError> {
        let bytes =
            serde_json::to_vec_pretty(record).map_err(|e| ClientError::Invalid(e.to_string()))?;
        write_file_durably(&self.message_path(record), &bytes)
    }

    /// Gives the message a fresh id from `now_ms`: the new record is
    /// written, then the old one removed; `order` stays.
    fn renew_message_id(&self, record: &mut MessageRecord, id: Id) -> Result<(), ClientError> {
        let old = self.message_path(record);
        record.id = id;
        record.generation = record.generation.saturating_add(1);
        record.ts = id_ts(id);
        record.ts_from_server = false;
        self.save_message(record)?;
        remove_file_durably(&old)
    }

    /// Makes a `failed` message pending again, without its error (the next
    /// drain sends it, with the same id while that is within
    /// [`REUSE_MARGIN_MS`]).
    pub fn retry_message(&self, id: Id) -> Result<MessageRecord, ClientError> {
        let mut record = self.message(id)?;
        if record.state == MessageState::Failed {
            record.state = MessageState::Pending;
            record.error = None;
            self.save_message(&record)?;
        }
        Ok(record)
    }

    fn next_order(&self) -> Result<u64, ClientError> {
        Ok(self
            .messages()?
            .last()
            .map_or(1, |m| m.order.saturating_add(1)))
    }
}

fn id_ts(id: Id) -> String {
    format_rfc3339_ms(i64::try_from(id.time_ms()).unwrap_or(i64::MAX))
}

/// The clock error of a message refused with `clock_skew`, from the
/// problem's [`ClockSkewMembers`] when it has them.
fn clock_error(refusal: &Refusal) -> MessageError {
    let members = ClockSkewMembers::deserialize(&refusal.body).ok();
    let detail = match members {
        Some(ClockSkewMembers {
            skew_ms,
            server_time_ms,
            ..
        }) => format!(
            "this device's clock is off by about {:.1} minutes from the server's \
             (server time {}); set the clock, then send again",
            skew_ms.unsigned_abs() as f64 / 60_000.0,
            format_rfc3339_ms(i64::try_from(server_time_ms).unwrap_or(i64::MAX))
        ),
        None => format!(
            "this device's clock is off from the server's ({}); set the clock, then send again",
            refusal.detail
        ),
    };
    MessageError {
        code: CLOCK_SKEW.into(),
        detail,
    }
}

/// The server's `ts` in a `202` answer ([`MessagePosted`]), when it has one.
fn posted_ts(response: &HttpResponse) -> Option<String> {
    let answer: MessagePosted<serde_json::Value> = serde_json::from_slice(&response.body).ok()?;
    answer.message.get("ts")?.as_str().map(str::to_owned)
}

/// Marks the record sent after a `202`, with the server's `ts` when the
/// answer carries one.
fn record_sent(record: &mut MessageRecord, response: &HttpResponse) -> MessageAttempt {
    if let Some(ts) = posted_ts(response) {
        record.ts = ts;
        record.ts_from_server = true;
    }
    record.state = MessageState::Sent;
    record.last_error = None;
    MessageAttempt::Sent
}

/// Marks the record failed for good, with why.
fn record_failed(record: &mut MessageRecord, error: MessageError) -> MessageAttempt {
    record.state = MessageState::Failed;
    record.error = Some(error);
    MessageAttempt::Failed
}

impl Client {
    /// Sends a message to a moment's thread now: mints its id from the
    /// client clock, stores it as `pending` (durably), and sends it (per
    /// ADR-036, with at most one immediate retry under a fresh id). When
    /// the link is down, or the thread's moment is itself still in the
    /// outbox, the message stays pending and a later [`Client::drain`]
    /// sends it.
    pub async fn send_message(
        &self,
        thread_id: Id,
        body: &str,
    ) -> Result<MessageOutcome, ClientError> {
        if body.trim().is_empty() {
            return Err(ClientError::Invalid("a message needs a body".into()));
        }
        let id = mint(self.clock.as_ref());
        let record = MessageRecord {
            format: MESSAGE_FORMAT,
            order: self.outbox.next_order()?,
            generation: 0,
            id,
            thread_id,
            body: body.to_owned(),
            ts: id_ts(id),
            ts_from_server: false,
            state: MessageState::Pending,
            error: None,
            last_error: None,
            attempts: 0,
        };
        self.outbox.save_message(&record)?;
        if self.moment_in_outbox(thread_id)? {
            // The thread's moment is not on the server yet: the message
            // waits, and a drain sends it after the capture.
            return Ok(MessageOutcome {
                record,
                result: MessageAttempt::Wait(WaitCause::MomentInOutbox(thread_id)),
                attempts: 0,
            });
        }
        self.send_record(record, true).await
    }

    /// Sends a pending message again (what a drain does for each).
    pub(crate) async fn attempt_message(
        &self,
        record: MessageRecord,
    ) -> Result<MessageOutcome, ClientError> {
        self.send_record(record, false).await
    }

    /// One send. `minted_now` says the id was minted for this very send
    /// (a first send): it is fresh, not reused.
    async fn send_record(
        &self,
        mut record: MessageRecord,
        minted_now: bool,
    ) -> Result<MessageOutcome, ClientError> {
        let now_ms = self.clock.now_ms();
        let mut reused = !minted_now;
        if reused && now_ms.abs_diff(record.id.time_ms()) > REUSE_MARGIN_MS {
            let id = mint(self.clock.as_ref());
            self.outbox.renew_message_id(&mut record, id)?;
            reused = false;
        }
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            record.attempts = record.attempts.saturating_add(1);
            record.error = None;
            let request = json_request(
                Method::Post,
                "/api/messages".to_owned(),
                &PostMessageBody {
                    id: record.id.to_string(),
                    thread_id: record.thread_id.to_string(),
                    body: record.body.clone(),
                },
            )?;
            let result = self.transport.send(request).await;
            let result = match classify(result, self.clock.now_ms()) {
                Verdict::Done(response) => {
                    crate::answers::log_replay(&response, &format_args!("message {}", record.id));
                    record_sent(&mut record, &response)
                }
                Verdict::Refused(refusal) if refusal.code.as_deref() == Some(CLOCK_SKEW) => {
                    if reused {
                        // The skew may come from the id's age alone: drop it
                        // and try once more, at once, with a fresh one.
                        tracing::info!(id = %record.id, "clock_skew on a reused id; minting a fresh one");
                        let id = mint(self.clock.as_ref());
                        self.outbox.renew_message_id(&mut record, id)?;
                        reused = false;
                        continue;
                    }
                    record_failed(&mut record, clock_error(&refusal))
                }
                Verdict::Refused(refusal) => {
                    let error = MessageError {
                        code: refusal.code.clone().unwrap_or_else(|| {
                            format!("http_{}", refusal.status.unwrap_or_default())
                        }),
                        detail: refusal.detail.clone(),
                    };
                    record_failed(&mut record, error)
                }
                Verdict::Wait(cause) => {
                    record.last_error = Some(cause.to_string());
                    MessageAttempt::Wait(cause)
                }
            };
            self.outbox.save_message(&record)?;
            return Ok(MessageOutcome {
                record,
                result,
                attempts,
            });
        }
    }
}
