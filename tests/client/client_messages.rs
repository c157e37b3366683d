//! Messages from the outbox per ADR-036 (SPEC section 6) against a real
//! server whose clock window is ±5 minutes, with the phone's clock skewed
//! and the link going down or losing replies.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use spark_client::{
    Client, ClientClock, HttpRequest, HttpResponse, ManualClock, MessageAttempt, MessageState,
    Outbox, ReqwestTransport, Transport, TransportError, WaitCause,
};
use spark_core::ids::Id;
use spark_engine::clock::{Clock, OffsetClock, SystemClock};
use spark_log_format::OsFs;

use common::{settings, TestServer};

const MINUTE: Duration = Duration::from_secs(60);
const MINUTE_MS: u64 = 60_000;

/// How the test link behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Forward and answer.
    Up,
    /// Fail before forwarding (the server never sees the request).
    Down,
    /// Forward, then lose the reply.
    LoseReply,
}

/// The real transport with a switch, logging every message POST that
/// reached the server: (id, status).
struct Link {
    inner: ReqwestTransport,
    mode: Mutex<Mode>,
    reached: Mutex<Vec<(String, u16)>>,
}

impl Link {
    fn new(server: &TestServer) -> Arc<Link> {
        Arc::new(Link {
            inner: ReqwestTransport::new(&server.base).unwrap(),
            mode: Mutex::new(Mode::Up),
            reached: Mutex::default(),
        })
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    fn reached(&self) -> Vec<(String, u16)> {
        self.reached.lock().unwrap().clone()
    }
}

impl Transport for Link {
    fn send(&self, request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        Box::pin(async move {
            let mode = *self.mode.lock().unwrap();
            if mode == Mode::Down {
                return Err(TransportError::Network("no route to host".into()));
            }
            let id = serde_json::from_slice::<Value>(&request.body)
                .ok()
                .and_then(|v| v["id"].as_str().map(str::to_owned))
                .unwrap_or_default();
            let is_message = request.path == "/api/messages";
            let response = self.inner.send(request).await?;
            if is_message {
                self.reached.lock().unwrap().push((id, response.status));
            }
            if mode == Mode::LoseReply {
                return Err(TransportError::Network("connection reset by peer".into()));
            }
            Ok(response)
        })
    }
}

async fn server() -> (tempfile::TempDir, TestServer) {
    let dir = tempfile::tempdir().unwrap();
    let running = spark_engine::server::start_with(
        settings(dir.path()),
        Arc::new(OsFs),
        Arc::new(OffsetClock::default()),
    )
    .await
    .unwrap();
    let base = format!("http://{}", running.addr);
    let server = TestServer {
        running,
        base,
        client: reqwest::Client::new(),
    };
    (dir, server)
}

async fn thread(server: &TestServer) -> Id {
    let id = common::ulid();
    let (status, body) = server
        .post("/api/moments", json!({"id": id, "text": "Ausgang"}))
        .await;
    assert_eq!(status, 201, "{body}");
    Id::parse(&id).unwrap()
}

async fn thread_messages(server: &TestServer, thread: Id) -> Vec<Value> {
    let (status, page) = server.get(&format!("/api/messages?thread={thread}")).await;
    assert_eq!(status, 200, "{page}");
    page["messages"].as_array().unwrap().clone()
}

/// A phone clock `behind_ms` behind the (unskewed) server clock.
fn phone_clock(behind_ms: u64) -> ManualClock {
    ManualClock::at(SystemClock.now_ms() - behind_ms)
}

fn client(dir: &std::path::Path, link: &Arc<Link>, clock: &ManualClock) -> Client {
    Client::new(
        Outbox::open(dir).unwrap(),
        link.clone(),
        Arc::new(clock.clone()),
    )
}

fn message_files(outbox: &Outbox) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(outbox.root().join("messages"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn two_minutes_behind_and_pending_for_three_and_a_half_the_fresh_id_gets_through() {
    let (_data, server) = server().await;
    let thread = thread(&server).await;
    let link = Link::new(&server);
    let outbox_dir = tempfile::tempdir().unwrap();
    // The phone is 2 minutes behind; the message was first sent 3.5
    // minutes before now, while the link was down.
    let clock = phone_clock(2 * MINUTE_MS + 7 * MINUTE_MS / 2);
    let client = client(outbox_dir.path(), &link, &clock);
    link.set(Mode::Down);
    let first = client.send_message(thread, "Bin gleich da").await.unwrap();
    assert!(matches!(
        first.result,
        MessageAttempt::Wait(WaitCause::Link(_))
    ));
    assert_eq!(first.record.state, MessageState::Pending);
    let old_id = first.record.id;
    let old_file = message_files(client.outbox());

    clock.advance(MINUTE * 7 / 2);
    link.set(Mode::Up);
    let report = client.drain().await.unwrap();

    // The reused id (3.5 minutes old by the phone, 5.5 by the server) gets
    // clock_skew; the fresh one (2 minutes off) gets 202, at once.
    let reached = link.reached();
    assert_eq!(reached.len(), 2, "{reached:?}");
    assert_eq!(reached[0], (old_id.to_string(), 400));
    assert_eq!(reached[1].1, 202);
    assert_ne!(reached[1].0, old_id.to_string());
    assert!(report.waits.is_empty(), "the fresh id went at once");
    assert_eq!(report.messages_sent.len(), 1);
    let new_id = report.messages_sent[0];
    assert_eq!(new_id.to_string(), reached[1].0);
    assert_eq!(new_id.time_ms(), clock.now_ms());

    // The old record was removed and the new one written, in its place.
    let records = client.outbox().messages().unwrap();
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(
        (record.id, record.order, record.generation),
        (new_id, first.record.order, 1)
    );
    assert_eq!(record.state, MessageState::Sent);
    assert!(record.ts_from_server);
    assert_eq!(message_files(client.outbox()).len(), 1);
    assert_ne!(message_files(client.outbox()), old_file);

    // The server holds exactly one message: the fresh id, with its ts.
    let held = thread_messages(&server, thread).await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0]["id"], new_id.to_string().as_str());
    assert_eq!(held[0]["body"], "Bin gleich da");
    assert_eq!(held[0]["ts"], record.ts.as_str());
    server.stop().await;
}

#[tokio::test]
async fn ten_minutes_behind_fails_with_a_clock_error_after_exactly_two_attempts() {
    let (_data, server) = server().await;
    let thread = thread(&server).await;
    let link = Link::new(&server);
    let outbox_dir = tempfile::tempdir().unwrap();
    let clock = phone_clock(10 * MINUTE_MS);
    let client = client(outbox_dir.path(), &link, &clock);
    link.set(Mode::Down);
    let first = client.send_message(thread, "Wo bist du?").await.unwrap();
    assert_eq!(first.record.state, MessageState::Pending);

    // A minute later the link is back: the id is reused (1 minute old by
    // the phone), refused, replaced once, refused again: failed.
    clock.advance(MINUTE);
    link.set(Mode::Up);
    let report = client.drain().await.unwrap();
    let reached = link.reached();
    assert_eq!(reached.len(), 2, "exactly two attempts: {reached:?}");
    assert_eq!(reached[0], (first.record.id.to_string(), 400));
    assert_eq!(reached[1].1, 400);
    assert_ne!(
        reached[1].0, reached[0].0,
        "the second attempt used a fresh id"
    );
    assert_eq!(report.messages_failed.len(), 1);
    assert!(report.waits.is_empty());

    let record = client.outbox().message(report.messages_failed[0]).unwrap();
    assert_eq!(record.state, MessageState::Failed);
    let error = record.error.unwrap();
    assert_eq!(error.code, "clock_skew");
    assert!(error.detail.contains("clock"), "{}", error.detail);
    assert!(
        error.detail.contains("9."),
        "names the skew: {}",
        error.detail
    );

    // No second round: a failed message is not sent again by a drain.
    let again = client.drain().await.unwrap();
    assert_eq!(again.requests, 0);
    assert_eq!(link.reached().len(), 2);
    assert!(thread_messages(&server, thread).await.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn a_fresh_id_refused_for_its_clock_fails_at_once() {
    let (_data, server) = server().await;
    let thread = thread(&server).await;
    let link = Link::new(&server);
    let outbox_dir = tempfile::tempdir().unwrap();
    let clock = phone_clock(10 * MINUTE_MS);
    let client = client(outbox_dir.path(), &link, &clock);
    let outcome = client.send_message(thread, "Hallo").await.unwrap();
    assert_eq!(outcome.result, MessageAttempt::Failed);
    assert_eq!(outcome.attempts, 1);
    assert_eq!(link.reached().len(), 1);
    assert_eq!(outcome.record.error.unwrap().code, "clock_skew");

    // The person fixes the clock and retries: the old id is past the
    // 4-minute reuse window by the now-right clock, so a fresh one goes.
    clock.set_ms(SystemClock.now_ms());
    client.outbox().retry_message(outcome.record.id).unwrap();
    let report = client.drain().await.unwrap();
    assert_eq!(report.messages_sent.len(), 1);
    assert_eq!(link.reached().len(), 2);
    assert_eq!(thread_messages(&server, thread).await.len(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_lost_reply_is_retried_with_the_same_id_and_lands_once() {
    let (_data, server) = server().await;
    let thread = thread(&server).await;
    let link = Link::new(&server);
    let outbox_dir = tempfile::tempdir().unwrap();
    let clock = phone_clock(0);
    let client = client(outbox_dir.path(), &link, &clock);
    link.set(Mode::LoseReply);
    let first = client.send_message(thread, "Bin da").await.unwrap();
    assert!(matches!(first.result, MessageAttempt::Wait(_)));
    let files = message_files(client.outbox());

    clock.advance(MINUTE * 3);
    link.set(Mode::Up);
    let report = client.drain().await.unwrap();
    assert_eq!(report.messages_sent, vec![first.record.id]);
    let reached = link.reached();
    assert_eq!(reached.len(), 2);
    assert!(reached
        .iter()
        .all(|(id, status)| *id == first.record.id.to_string() && *status == 202));
    // The record was kept, not re-created.
    assert_eq!(message_files(client.outbox()), files);
    assert_eq!(thread_messages(&server, thread).await.len(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_kept_id_keeps_its_ts_and_a_retried_message_keeps_its_place() {
    let (_data, server) = server().await;
    let thread = thread(&server).await;
    let link = Link::new(&server);
    let outbox_dir = tempfile::tempdir().unwrap();
    let clock = phone_clock(6 * MINUTE_MS);
    let client = client(outbox_dir.path(), &link, &clock);
    link.set(Mode::Down);
    let one = client.send_message(thread, "eins").await.unwrap().record;
    clock.advance(MINUTE);
    let two = client.send_message(thread, "zwei").await.unwrap().record;
    assert!(one.order < two.order);
    // The display time follows the id while it is kept.
    assert!(!one.ts_from_server);
    assert_eq!(
        spark_core::time::parse_rfc3339_ms(&one.ts).unwrap() as u64,
        one.id.time_ms()
    );

    // Retried within 4 minutes on a link still down: same id, same ts,
    // same record file.
    clock.advance(MINUTE);
    let files = message_files(client.outbox());
    let report = client
        .clone()
        .with_options(spark_client::DrainOptions {
            max_passes: Some(1),
            ..Default::default()
        })
        .drain()
        .await
        .unwrap();
    assert!(report.gave_up);
    assert_eq!(message_files(client.outbox()), files);
    let kept = client.outbox().message(one.id).unwrap();
    assert_eq!((kept.id, &kept.ts, kept.attempts), (one.id, &one.ts, 2));

    // Six minutes after the first send: "eins" gets a fresh id (newer than
    // "zwei"'s) but stays first in the outgoing order; "zwei" (5 minutes
    // old) gets a fresh one too. Both land once, "eins" first.
    clock.set_ms(SystemClock.now_ms());
    link.set(Mode::Up);
    let report = client.drain().await.unwrap();
    assert_eq!(report.messages_sent.len(), 2);
    let records = client.outbox().messages().unwrap();
    let bodies: Vec<&str> = records.iter().map(|r| r.body.as_str()).collect();
    assert_eq!(bodies, vec!["eins", "zwei"]);
    assert_eq!(
        records.iter().map(|r| r.order).collect::<Vec<_>>(),
        vec![one.order, two.order]
    );
    let reached = link.reached();
    assert_eq!(reached.len(), 2, "{reached:?}");
    assert_eq!(reached[0].0, records[0].id.to_string());
    assert_eq!(reached[1].0, records[1].id.to_string());
    assert!(records
        .iter()
        .all(|r| r.ts_from_server && r.generation == 1));
    assert_eq!(thread_messages(&server, thread).await.len(), 2);
    server.stop().await;
}

#[tokio::test]
async fn an_unknown_thread_fails_the_message() {
    let (_data, server) = server().await;
    let link = Link::new(&server);
    let outbox_dir = tempfile::tempdir().unwrap();
    let clock = phone_clock(0);
    let client = client(outbox_dir.path(), &link, &clock);
    let missing = Id::parse(&common::ulid()).unwrap();
    let outcome = client.send_message(missing, "Hallo?").await.unwrap();
    assert_eq!(outcome.result, MessageAttempt::Failed);
    let error = outcome.record.error.unwrap();
    assert_eq!(error.code, "not_found");
    server.stop().await;
}

#[tokio::test]
async fn a_message_to_a_moment_still_in_the_outbox_waits_for_it() {
    let (_data, server) = server().await;
    let link = Link::new(&server);
    let outbox_dir = tempfile::tempdir().unwrap();
    let clock = phone_clock(0);
    let client = client(outbox_dir.path(), &link, &clock);
    let entry = client
        .capture(spark_client::Capture {
            copy: spark_client::MediaBytes {
                bytes: b"copy".to_vec(),
                content_type: "image/jpeg".into(),
            },
            original: spark_client::MediaBytes {
                bytes: b"original".to_vec(),
                content_type: "image/jpeg".into(),
            },
            more_photos: Vec::new(),
            text: Some("Ausgang".into()),
            caption: None,
            lang: None,
            captured_at_ms: None,
        })
        .unwrap();
    let outcome = client
        .send_message(entry.moment_id, "Schau mal")
        .await
        .unwrap();
    assert_eq!(
        outcome.result,
        MessageAttempt::Wait(WaitCause::MomentInOutbox(entry.moment_id))
    );
    assert_eq!(outcome.attempts, 0);
    assert!(link.reached().is_empty());

    clock.advance(MINUTE);
    let report = client.drain().await.unwrap();
    assert_eq!(report.entries_done, vec![entry.id]);
    assert_eq!(report.messages_sent, vec![outcome.record.id]);
    let held = thread_messages(&server, entry.moment_id).await;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["id"], outcome.record.id.to_string().as_str());
    server.stop().await;
}
