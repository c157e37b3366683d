//! Drain: send every pending entry's steps in order (the requests are in
//! `requests`), then the pending messages, with the answer rules of SPEC
//! section 6 (in [`crate::answers`], re-exported here).
//!
//! A wait ends the pass (the link is what is in trouble, not one entry):
//! the drain sleeps on its clock and starts the next pass from the first
//! entry still pending. Every step is idempotent on the server (minted
//! ids, request ids, media hashes), so a step whose reply was lost is
//! simply sent again.

use std::path::PathBuf;
use std::time::Duration;

use spark_core::ids::Id;

pub use crate::answers::{
    backoff_delay, classify, parse_retry_after, refusal, status_class, Refusal, StatusClass,
    Verdict, WaitCause,
};
use crate::client::{Client, WaitRecord};
use crate::messages::{MessageAttempt, MessageState};
use crate::outbox::{Entry, EntryState, Parked, Step};
use crate::requests::started_turn_id;
use crate::ClientError;

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
    /// True when the drain was stopped from outside (see
    /// [`Client::drain_until`]) before it was done.
    pub stopped: bool,
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

impl Client {
    /// Sends everything pending (captures in capture order, then messages
    /// in their outgoing order) until nothing is pending or the options'
    /// limits are reached. Errors only for the outbox's own storage.
    pub async fn drain(&self) -> Result<DrainReport, ClientError> {
        self.drain_until(std::future::pending()).await
    }

    /// [`drain`](Self::drain), stopped early when `stop` completes (a
    /// signal): the request in flight is dropped (every step is
    /// idempotent, so it is simply sent again next time), and the report
    /// counts what was done and what is left, with `stopped` set.
    pub async fn drain_until(
        &self,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<DrainReport, ClientError> {
        use futures_util::future::{select, Either};
        let mut stop = std::pin::pin!(stop);
        let started_ms = self.clock.now_ms();
        let mut report = DrainReport::default();
        let mut failures = 0u32;
        loop {
            report.passes += 1;
            let steps_before = report.steps_done;
            let sent_before = report.messages_sent.len();
            let end = {
                let pass = std::pin::pin!(self.pass(&mut report));
                match select(pass, stop.as_mut()).await {
                    Either::Left((end, _)) => Some(end?),
                    Either::Right(_) => None,
                }
            };
            let Some(end) = end else {
                report.stopped = true;
                break;
            };
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
            // The clock reads whole ms: up to 1 ms more may have passed.
            let elapsed = self.clock.now_ms().saturating_sub(started_ms) + 1;
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
            let wait = WaitRecord { cause, delay };
            if let Some(hook) = &self.on_wait {
                hook(&wait);
            }
            report.waits.push(wait);
            if let Either::Right(_) = select(self.clock.sleep(delay), stop.as_mut()).await {
                report.stopped = true;
                break;
            }
        }
        self.tally_what_is_left(&mut report)?;
        Ok(report)
    }

    /// Fills the report's counts of what the outbox holds when a drain
    /// stops: entries pending and parked, unreadable records, messages
    /// pending.
    fn tally_what_is_left(&self, report: &mut DrainReport) -> Result<(), ClientError> {
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
        Ok(())
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
                        crate::answers::log_replay(
                            &response,
                            &format_args!("entry {} step {step}", entry.id),
                        );
                        entry.done.push(step);
                        if step == Step::StartTurn {
                            entry.turn_id = started_turn_id(&response);
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
}
