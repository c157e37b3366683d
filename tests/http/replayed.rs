//! Answers say when they are replays: every route that answers
//! from a known identity (`created: false`) sends `Idempotent-Replayed:
//! true` and names, in `replayed`, the seq, server time and request id of
//! the op that first produced the answer; a new write sends no such header
//! and `replayed: null`.

use crate::common;

use std::sync::Arc;

use common::{settings, ulid, TestServer};
use reqwest::header::HeaderMap;
use serde_json::{json, Value};
use spark_engine::brain::scripted::ScriptedBrain;

/// The log's head seq now: the seq of the op a write just made.
async fn head(server: &TestServer) -> u64 {
    let (s, v) = server.get("/api/log/head").await;
    assert_eq!(s, 200);
    v["seq"].as_u64().unwrap()
}

/// Waits until the turn `id` has ended, so that its `turn.finish` (written
/// by the brain in the background) is not the next op the test counts on.
async fn wait_turn(server: &TestServer, id: &Value) {
    let id = id.as_str().expect("a turn id");
    let (s, v) = server.get(&format!("/api/turns/{id}?wait=10")).await;
    assert_eq!(s, 200);
    assert_ne!(v["status"], json!("running"), "{v}");
}

/// A new write: no header, `replayed: null`, the member present.
fn assert_new(what: &str, headers: &HeaderMap, body: &Value) {
    assert_eq!(body["created"], json!(true), "{what}: {body}");
    assert!(
        headers.get("idempotent-replayed").is_none(),
        "{what}: {headers:?}"
    );
    let members = body.as_object().unwrap();
    assert_eq!(
        members.get("replayed"),
        Some(&Value::Null),
        "{what}: {body}"
    );
}

/// A replay of the op at `seq` that carried `request_id`.
fn assert_replay(
    what: &str,
    headers: &HeaderMap,
    body: &Value,
    seq: u64,
    request_id: Option<&str>,
) {
    assert_eq!(body["created"], json!(false), "{what}: {body}");
    assert_eq!(
        headers
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true"),
        "{what}: {headers:?}"
    );
    let replayed = &body["replayed"];
    assert_eq!(replayed["seq"], json!(seq), "{what}: {body}");
    assert_eq!(replayed["request_id"], json!(request_id), "{what}: {body}");
    let ts_ms = replayed["ts_ms"].as_u64().expect("ts_ms");
    let ts = replayed["ts"].as_str().expect("ts");
    assert_eq!(
        spark_core::time::parse_rfc3339_ms(ts).unwrap(),
        i64::try_from(ts_ms).unwrap(),
        "{what}: {body}"
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        ts_ms <= now_ms && now_ms - ts_ms < 120_000,
        "{what}: {body}"
    );
}

#[tokio::test]
async fn creates_turns_phrases_recalls_jobs_and_messages_say_when_they_are_replays() {
    let dir = tempfile::tempdir().unwrap();
    let brain: Arc<dyn spark_engine::brain::Brain> = Arc::new(ScriptedBrain::echo());
    let server = TestServer::start_with_brains(settings(dir.path()), vec![("pippa", brain)]).await;

    // A moment: by its request id, then by its id under another request id.
    let moment = ulid();
    let create = json!({"id": moment, "client_request_id": "create-1", "text": "Ausgang"});
    let (s, body, headers) = server
        .call("POST", "/api/moments", Some(create.clone()), &[])
        .await;
    assert_eq!(s, 201);
    assert_new("create", &headers, &body);
    let created_seq = head(&server).await;
    let created_at = body["moment"]["created_at"].clone();
    let (s, body, headers) = server.call("POST", "/api/moments", Some(create), &[]).await;
    assert_eq!(s, 200);
    assert_replay(
        "create again",
        &headers,
        &body,
        created_seq,
        Some("create-1"),
    );
    assert_eq!(body["replayed"]["ts"], created_at, "{body}");
    let by_id = json!({"id": moment, "client_request_id": "create-2"});
    let (s, body, headers) = server.call("POST", "/api/moments", Some(by_id), &[]).await;
    assert_eq!(s, 200);
    assert_replay(
        "create by id",
        &headers,
        &body,
        created_seq,
        Some("create-1"),
    );
    // The same through the Idempotency-Key header.
    let (s, body, headers) = server
        .call(
            "POST",
            "/api/moments",
            Some(json!({})),
            &[("idempotency-key", "create-1")],
        )
        .await;
    assert_eq!(s, 200);
    assert_replay(
        "create by key",
        &headers,
        &body,
        created_seq,
        Some("create-1"),
    );
    // A moment made with no request id: replayed by id, request id null.
    let bare = ulid();
    let (s, body, headers) = server
        .call("POST", "/api/moments", Some(json!({"id": bare})), &[])
        .await;
    assert_eq!(s, 201);
    assert_new("bare create", &headers, &body);
    let bare_seq = head(&server).await;
    let (s, body, headers) = server
        .call("POST", "/api/moments", Some(json!({"id": bare})), &[])
        .await;
    assert_eq!(s, 200);
    assert_replay("bare create again", &headers, &body, bare_seq, None);

    // A turn. (The brain ends it in the background: each turn is waited
    // for before the next head is read.)
    let path = format!("/api/moments/{moment}/turns");
    let turn = json!({"client_request_id": "turn-1", "mode": "practical"});
    let before = head(&server).await;
    let (s, body, headers) = server.call("POST", &path, Some(turn.clone()), &[]).await;
    assert_eq!(s, 202);
    assert_new("turn", &headers, &body);
    let (s, body, headers) = server.call("POST", &path, Some(turn), &[]).await;
    assert_eq!(s, 200);
    assert_replay("turn again", &headers, &body, before + 1, Some("turn-1"));
    wait_turn(&server, &body["turn"]["id"]).await;

    // A kept phrase (no request id: the phrase is the key).
    let keep = json!({"phrase": "Bitte nicht rauchen"});
    let (s, body, headers) = server
        .call("POST", "/api/phrases", Some(keep.clone()), &[])
        .await;
    assert_eq!(s, 201);
    assert_new("keep", &headers, &body);
    let keep_seq = head(&server).await;
    let (s, body, headers) = server.call("POST", "/api/phrases", Some(keep), &[]).await;
    assert_eq!(s, 200);
    assert_replay("keep again", &headers, &body, keep_seq, None);

    // A quick recall: its recall.start carries no request id (the recall id
    // is its own key, and the request id of the moment it assembles).
    let before = head(&server).await;
    let recall = json!({"id": "recall-1"});
    let (s, body, headers) = server
        .call("POST", "/api/recall", Some(recall.clone()), &[])
        .await;
    assert_eq!(s, 202, "{body}");
    assert_new("recall", &headers, &body);
    let (s, body, headers) = server.call("POST", "/api/recall", Some(recall), &[]).await;
    assert_eq!(s, 200);
    assert_replay("recall again", &headers, &body, before + 1, None);
    wait_turn(&server, &body["recall"]["turn"]["id"]).await;

    // A job: its job.start carried the job id.
    let before = head(&server).await;
    let job = json!({"job_id": "job-1", "moment_id": moment});
    let (s, body, headers) = server
        .call("POST", "/api/jobs", Some(job.clone()), &[])
        .await;
    assert_eq!(s, 202, "{body}");
    assert_new("job", &headers, &body);
    let (s, body, headers) = server.call("POST", "/api/jobs", Some(job), &[]).await;
    assert_eq!(s, 200);
    assert_replay("job again", &headers, &body, before + 1, Some("job-1"));
    for turn in body["job"]["turns"].as_array().expect("the job's turns") {
        wait_turn(&server, &turn["id"]).await;
    }

    // A message: 202 either way; only the header and member tell.
    let message = json!({"id": ulid(), "thread_id": moment, "body": "hallo"});
    let (s, body, headers) = server
        .call("POST", "/api/messages", Some(message.clone()), &[])
        .await;
    assert_eq!(s, 202);
    assert_new("message", &headers, &body);
    let message_seq = head(&server).await;
    let (s, body, headers) = server
        .call("POST", "/api/messages", Some(message), &[])
        .await;
    assert_eq!(s, 202);
    assert_replay("message again", &headers, &body, message_seq, None);

    // Writes that are not creates carry neither.
    let edit = format!("/api/moments/{moment}");
    let (s, body, headers) = server
        .call("PATCH", &edit, Some(json!({"caption": "c"})), &[])
        .await;
    assert_eq!(s, 200);
    assert!(headers.get("idempotent-replayed").is_none(), "{headers:?}");
    assert!(body.get("replayed").is_none(), "{body}");
    server.stop().await;
}

#[tokio::test]
async fn an_upload_replayed_with_the_same_bytes_says_so_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let moment = ulid();
    let (s, _) = server.post("/api/moments", json!({"id": moment})).await;
    assert_eq!(s, 201);
    let media = ulid();
    let put = |server: &TestServer| {
        server
            .client
            .put(server.url(&format!("/api/media/{media}")))
            .header("x-moment-id", moment.as_str())
            .header("x-media-role", "copy")
            .header("content-type", "image/jpeg")
            .body(vec![7u8; 1000])
            .send()
    };
    let response = put(&server).await.unwrap();
    assert_eq!(response.status(), 201);
    let headers = response.headers().clone();
    let body: Value = response.json().await.unwrap();
    assert_new("upload", &headers, &body);
    let put_seq = head(&server).await;
    let response = put(&server).await.unwrap();
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    let first: Value = response.json().await.unwrap();
    assert_replay("upload again", &headers, &first, put_seq, None);
    server.stop().await;

    // The mirror rebuilt by replay names the same op at the same time.
    let server = TestServer::start(dir.path()).await;
    let response = put(&server).await.unwrap();
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    let again: Value = response.json().await.unwrap();
    assert_replay("upload after restart", &headers, &again, put_seq, None);
    assert_eq!(again["replayed"], first["replayed"]);
    let (s, body, _) = server
        .call("POST", "/api/moments", Some(json!({"id": moment})), &[])
        .await;
    assert_eq!(s, 200);
    assert_eq!(body["replayed"]["seq"], json!(1), "{body}");
    server.stop().await;
}
