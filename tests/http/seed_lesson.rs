//! The two tests of the seed lesson ("Two meanings of replay"), over HTTP:
//! each idempotency key alone turns a retried create into one moment and
//! exactly one record in the log.

use crate::common;

use common::{log_records, ulid, TestServer};
use serde_json::json;

#[tokio::test]
async fn same_phone_minted_id_twice_gives_one_moment_and_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let id = ulid();
    // Two different request ids: only the entity key can catch the retry.
    let (s1, a1) = server
        .post(
            "/api/moments",
            json!({"id": id, "client_request_id": "first", "text": "Ausfahrt"}),
        )
        .await;
    let (s2, a2) = server
        .post(
            "/api/moments",
            json!({"id": id, "client_request_id": "second", "text": "Ausfahrt"}),
        )
        .await;
    assert_eq!((s1, s2), (201, 200));
    assert_eq!(a1["created"], true);
    assert_eq!(a2["created"], false);
    assert_eq!(a2["moment"]["id"], id.as_str());
    let (_, list) = server.get("/api/moments").await;
    assert_eq!(list["moments"].as_array().unwrap().len(), 1);
    server.stop().await;
    assert_eq!(
        log_records(dir.path()).len(),
        1,
        "exactly one record in the log"
    );
}

#[tokio::test]
async fn same_request_id_without_id_gives_the_first_minted_moment_and_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let (s1, a1) = server
        .post(
            "/api/moments",
            json!({"client_request_id": "outbox-7", "text": "Sortie"}),
        )
        .await;
    let (s2, a2) = server
        .post(
            "/api/moments",
            json!({"client_request_id": "outbox-7", "text": "Sortie"}),
        )
        .await;
    assert_eq!((s1, s2), (201, 200));
    let minted = a1["moment"]["id"].as_str().unwrap().to_owned();
    assert_eq!(minted.len(), 26);
    assert_eq!(a2["created"], false);
    assert_eq!(a2["moment"]["id"], minted.as_str());
    // The request key wins even when the retry now carries an id.
    let (s3, a3) = server
        .post(
            "/api/moments",
            json!({"id": ulid(), "client_request_id": "outbox-7", "text": "Sortie"}),
        )
        .await;
    assert_eq!(s3, 200);
    assert_eq!(a3["moment"]["id"], minted.as_str());
    server.stop().await;
    assert_eq!(
        log_records(dir.path()).len(),
        1,
        "exactly one record in the log"
    );
}
