//! Messages with the clock window (SPEC section 5, seed ADR-036) and the
//! change stream (SPEC section 4), over HTTP against a server whose clock
//! the test holds.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{log_records, settings, TestServer};
use futures_util::StreamExt;
use serde_json::{json, Value};
use spark_core::ids::Id;
use spark_core::op::OpKind;
use spark_engine::clock::Clock;
use spark_log_format::OsFs;

/// A server clock the test sets.
#[derive(Default)]
struct FixedClock(AtomicU64);

impl Clock for FixedClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

const NOW_MS: u64 = 1_788_310_020_000;
const MINUTE_MS: u64 = 60_000;

fn id_at(ms: u64) -> String {
    Id::from_parts(ms, rand::random::<u128>()).to_string()
}

async fn server_at(dir: &std::path::Path, clock: Arc<FixedClock>) -> TestServer {
    let running = spark_engine::server::start_with(settings(dir), Arc::new(OsFs), clock)
        .await
        .unwrap();
    let base = format!("http://{}", running.addr);
    TestServer {
        running,
        base,
        client: reqwest::Client::new(),
    }
}

async fn thread(server: &TestServer) -> String {
    let id = id_at(NOW_MS - 3 * 3_600_000);
    let (s, _) = server
        .post("/api/moments", json!({"id": id, "text": "Ausgang"}))
        .await;
    assert_eq!(s, 201, "capture-time ids are exempt from the window");
    id
}

#[tokio::test]
async fn the_clock_window_is_five_minutes_inclusive() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(FixedClock(AtomicU64::new(NOW_MS)));
    let server = server_at(dir.path(), clock.clone()).await;
    let t = thread(&server).await;
    let post = |id: String, body: &str| {
        let server = &server;
        let t = t.clone();
        let body = body.to_owned();
        async move {
            server
                .post(
                    "/api/messages",
                    json!({"id": id, "thread_id": t, "body": body}),
                )
                .await
        }
    };
    for offset in [
        -5 * MINUTE_MS as i64,
        5 * MINUTE_MS as i64,
        -4 * MINUTE_MS as i64,
        0,
    ] {
        let (s, v) = post(id_at(NOW_MS.saturating_add_signed(offset)), "in the window").await;
        assert_eq!(s, 202, "offset {offset}: {v}");
    }
    for offset in [
        -(5 * MINUTE_MS as i64) - 1,
        5 * MINUTE_MS as i64 + 1,
        6 * MINUTE_MS as i64,
    ] {
        let id = id_at(NOW_MS.saturating_add_signed(offset));
        let (s, v) = post(id, "outside").await;
        assert_eq!(
            (s, v["code"].clone()),
            (400, json!("clock_skew")),
            "offset {offset}"
        );
        assert_eq!(v["server_time_ms"], NOW_MS);
        assert_eq!(v["id_time_ms"], NOW_MS.saturating_add_signed(offset));
        assert_eq!(v["skew_ms"], offset);
    }
    server.stop().await;
    assert_eq!(
        log_records(dir.path())
            .iter()
            .filter(|(_, k)| *k == OpKind::MessagePost.code())
            .count(),
        4
    );
}

#[tokio::test]
async fn a_known_id_is_answered_with_the_stored_message() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(FixedClock(AtomicU64::new(NOW_MS)));
    let server = server_at(dir.path(), clock.clone()).await;
    let t = thread(&server).await;
    let id = id_at(NOW_MS - 4 * MINUTE_MS);
    let body = json!({"id": id, "thread_id": t, "body": "what does it mean?"});
    let (s, first) = server.post("/api/messages", body.clone()).await;
    assert_eq!((s, first["created"].clone()), (202, json!(true)));
    assert_eq!(
        first["message"]["ts"], "2026-09-02T00:47:00Z",
        "the server's time, not the id's"
    );
    // Later, even outside the window, the same message answers as stored.
    clock.0.store(NOW_MS + 10 * MINUTE_MS, Ordering::SeqCst);
    let (s, again) = server.post("/api/messages", body.clone()).await;
    assert_eq!((s, again["created"].clone()), (202, json!(false)));
    assert_eq!(again["message"]["ts"], first["message"]["ts"]);
    let (s, v) = server
        .post(
            "/api/messages",
            json!({"id": id, "thread_id": t, "body": "something else"}),
        )
        .await;
    assert_eq!((s, v["code"].clone()), (409, json!("conflict")));
    // Unknown or deleted thread, too long, bad ids.
    clock.0.store(NOW_MS, Ordering::SeqCst);
    let (s, _) = server
        .post(
            "/api/messages",
            json!({"id": id_at(NOW_MS), "thread_id": id_at(NOW_MS), "body": "x"}),
        )
        .await;
    assert_eq!(s, 404);
    let (s, v) = server
        .post(
            "/api/messages",
            json!({"id": id_at(NOW_MS), "thread_id": t, "body": "é".repeat(4001)}),
        )
        .await;
    assert_eq!((s, v["code"].clone()), (413, json!("too_large")));
    let (s, _) = server
        .post(
            "/api/messages",
            json!({"id": id_at(NOW_MS), "thread_id": t, "body": "é".repeat(4000)}),
        )
        .await;
    assert_eq!(s, 202, "4,000 characters fit");
    let (s, v) = server
        .post(
            "/api/messages",
            json!({"id": "nope", "thread_id": t, "body": "x"}),
        )
        .await;
    assert_eq!((s, v["code"].clone()), (400, json!("invalid_id")));
    let (s, _) = server
        .post(
            "/api/messages",
            json!({"id": id_at(NOW_MS), "thread_id": t}),
        )
        .await;
    assert_eq!(s, 400);
    let dead = thread(&server).await;
    server
        .call("DELETE", &format!("/api/moments/{dead}"), None, &[])
        .await;
    let (s, _) = server
        .post(
            "/api/messages",
            json!({"id": id_at(NOW_MS), "thread_id": dead, "body": "x"}),
        )
        .await;
    assert_eq!(s, 410);
    server.stop().await;
}

#[tokio::test]
async fn threads_page_in_id_order() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(FixedClock(AtomicU64::new(NOW_MS)));
    let server = server_at(dir.path(), clock).await;
    let t = thread(&server).await;
    let other = thread(&server).await;
    let mut ids = Vec::new();
    for n in 0..7u64 {
        let id = id_at(NOW_MS - n * 1000);
        server
            .post(
                "/api/messages",
                json!({"id": id, "thread_id": t, "body": format!("m{n}")}),
            )
            .await;
        ids.push(id);
    }
    server
        .post(
            "/api/messages",
            json!({"id": id_at(NOW_MS), "thread_id": other, "body": "elsewhere"}),
        )
        .await;
    ids.sort();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("/api/messages?thread={t}&limit=3&after={a}"),
            None => format!("/api/messages?thread={t}&limit=3"),
        };
        let (s, v) = server.get(&path).await;
        assert_eq!(s, 200);
        seen.extend(
            v["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_owned()),
        );
        match v["next"].as_str() {
            Some(n) => after = Some(n.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, ids);
    let (s, _) = server
        .get(&format!("/api/messages?thread={}", id_at(NOW_MS)))
        .await;
    assert_eq!(s, 404);
    server.stop().await;
}

/// Reads server-sent events until `want` data events came (or 10 s).
pub(crate) async fn read_events(response: reqwest::Response, want: usize) -> Vec<(String, Value)> {
    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while events.len() < want {
        let chunk = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("events in time");
        let Some(Ok(chunk)) = chunk else { break };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let mut id = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim());
                }
            }
            if !data.is_empty() {
                events.push((
                    id,
                    serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {block:?}")),
                ));
            }
        }
    }
    events
}

#[tokio::test]
async fn the_change_stream_catches_up_then_follows_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(FixedClock(AtomicU64::new(NOW_MS)));
    let server = server_at(dir.path(), clock).await;
    let t = thread(&server).await; // seq 1
    server
        .call(
            "PATCH",
            &format!("/api/moments/{t}"),
            Some(json!({"caption": "c"})),
            &[],
        )
        .await; // 2
    let response = server
        .client
        .get(server.url("/api/events?after=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    // Live ops after the subscription.
    let m = id_at(NOW_MS);
    server
        .post(
            "/api/messages",
            json!({"id": m, "thread_id": t, "body": "hi"}),
        )
        .await; // 3
    server
        .call("DELETE", &format!("/api/moments/{t}"), None, &[])
        .await; // 4
    let events = read_events(response, 4).await;
    // Each id is the op's cursor: its seq, a dot and 16 hex digits of the
    // chain value at the end of its batch.
    let seqs: Vec<_> = events
        .iter()
        .map(|(id, v)| (id.split_once('.').unwrap().0.to_owned(), v["seq"].clone()))
        .collect();
    assert_eq!(
        seqs,
        vec![
            ("1".into(), json!(1)),
            ("2".into(), json!(2)),
            ("3".into(), json!(3)),
            ("4".into(), json!(4))
        ]
    );
    assert!(events
        .iter()
        .all(|(id, _)| id.split_once('.').unwrap().1.len() == 16));
    let ids: Vec<String> = events.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(events[0].1["kind"], "moment.create");
    assert_eq!(events[0].1["upserted"], json!([t]));
    assert_eq!(events[2].1["kind"], "message.post");
    assert_eq!(events[2].1["upserted"], json!([m, t]));
    assert_eq!(events[3].1["removed"], json!([t]));
    // Last-Event-ID resumes after that event.
    let response = server
        .client
        .get(server.url("/api/events"))
        .header("Last-Event-ID", ids[1].as_str())
        .send()
        .await
        .unwrap();
    let events = read_events(response, 2).await;
    assert_eq!(
        events.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        vec![ids[2].as_str(), ids[3].as_str()]
    );
    let (s, _) = server.get("/api/events?after=soon").await;
    assert_eq!(s, 400);
    // A bare Last-Event-ID names no history: refused, the head named to
    // resume.
    let response = server
        .client
        .get(server.url("/api/events"))
        .header("Last-Event-ID", "2")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 409);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["code"], "cursor_unknown");
    assert_eq!(body["head_cursor"], json!(ids[3]));
    // A bare `?after=2` (SPEC section 4) is this log's seq 2: the ops after it.
    let response = server
        .client
        .get(server.url("/api/events?after=2"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let events = read_events(response, 2).await;
    assert_eq!(
        events.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        vec![ids[2].as_str(), ids[3].as_str()]
    );
    // At the head: nothing to send yet, a stream all the same.
    let at_head = server
        .client
        .get(server.url(&format!("/api/events?after={}", ids[3])))
        .send()
        .await
        .unwrap();
    assert_eq!(at_head.status().as_u16(), 200);
    drop(at_head);
    // A cursor beyond the head (a client that saw more than this log holds,
    // as after a restore from an archive that was behind): 409 naming the
    // head, both ways of giving it.
    let (s, body) = server.get("/api/events?after=9").await;
    assert_eq!(s, 409, "{body}");
    assert_eq!(body["code"], "cursor_ahead");
    assert_eq!(body["head_seq"], 4);
    assert_eq!(body["after"], 9);
    let ahead = server
        .client
        .get(server.url("/api/events"))
        .header("Last-Event-ID", "5")
        .send()
        .await
        .unwrap();
    assert_eq!(ahead.status().as_u16(), 409);
    let body: serde_json::Value = ahead.json().await.unwrap();
    assert_eq!(
        (body["head_seq"].clone(), body["after"].clone()),
        (json!(4), json!(5))
    );
    // An open stream does not hold up a shutdown.
    let _open = server
        .client
        .get(server.url("/api/events"))
        .send()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), server.stop())
        .await
        .expect("stops with a stream open");
}
