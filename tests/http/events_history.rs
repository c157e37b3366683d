//! Event cursors name their history: two logs that share seqs
//! but not ops (one data directory copied, as a restore does, then each
//! written on) give different ids to the same seq, and a follower that
//! comes back to the other log with its `Last-Event-ID` gets `409
//! cursor_unknown` naming the head, never the ops after its seq there.

use crate::common;
use crate::messages::read_events;

use common::{copy_dir, TestServer};
use serde_json::{json, Value};

async fn create(server: &TestServer, text: &str) {
    let (status, body) = server.post("/api/moments", json!({ "text": text })).await;
    assert_eq!(status, 201, "{body}");
}

/// The answer to `GET /api/events` with `Last-Event-ID: after`.
async fn events_answer(server: &TestServer, after: &str) -> reqwest::Response {
    server
        .client
        .get(server.url("/api/events"))
        .header("Last-Event-ID", after)
        .send()
        .await
        .unwrap()
}

/// The first `want` events after `after` (an id, or `0`), as (id, data).
async fn events_after(server: &TestServer, after: &str, want: usize) -> Vec<(String, Value)> {
    let response = events_answer(server, after).await;
    assert_eq!(response.status().as_u16(), 200, "after {after}");
    read_events(response, want).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_from_another_history_that_shares_its_seq_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (root.path().join("a"), root.path().join("b"));
    let a = TestServer::start(&a_dir).await;
    for text in ["one", "two", "three"] {
        create(&a, text).await;
    }
    a.stop().await;
    // B starts as a copy of A at seq 3 (what a restore gives), then each
    // log goes on with its own ops under the same seqs.
    copy_dir(&a_dir, &b_dir);
    let a = TestServer::start(&a_dir).await;
    for text in ["a4", "a5"] {
        create(&a, text).await;
    }
    let seen = events_after(&a, "0", 5).await;
    let a_ids: Vec<String> = seen.iter().map(|(id, _)| id.clone()).collect();
    a.stop().await;

    let b = TestServer::start(&b_dir).await;
    for text in ["b4", "b5", "b6"] {
        create(&b, text).await;
    }
    let b_all = events_after(&b, "0", 6).await;
    let b_ids: Vec<String> = b_all.iter().map(|(id, _)| id.clone()).collect();
    // The shared prefix has the same ids; the ops after it do not.
    assert_eq!(a_ids[..3], b_ids[..3]);
    assert_ne!(a_ids[3], b_ids[3]);
    assert_ne!(a_ids[4], b_ids[4]);

    // A's follower comes back to B (the same address after a restore and
    // a take-over, or a failover): 409, never b6 as if b4 and b5 were a4
    // and a5.
    for refused in [a_ids[4].as_str(), a_ids[3].as_str()] {
        let response = events_answer(&b, refused).await;
        assert_eq!(response.status().as_u16(), 409, "{refused}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["code"], "cursor_unknown", "{body}");
        assert_eq!(body["head_seq"], 6, "{body}");
        assert_eq!(body["head_cursor"], json!(b_ids[5]), "{body}");
        assert!(body["detail"].as_str().unwrap().contains(refused), "{body}");
        // The same by `after`.
        let (status, body) = b.get(&format!("/api/events?after={refused}")).await;
        assert_eq!(
            (status, body["code"].clone()),
            (409, json!("cursor_unknown"))
        );
    }
    // A bare seq as Last-Event-ID cannot be checked (this server only
    // hands out SEQ.CHAIN ids): refused too.
    let response = events_answer(&b, "5").await;
    assert_eq!(response.status().as_u16(), 409);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "cursor_unknown", "{body}");
    // A bare `?after=SEQ` (SPEC section 4) names a seq of B's log as it is
    // now: B's own op after it, whatever another log holds there.
    let response = b
        .client
        .get(b.url("/api/events?after=5"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let after_bare = read_events(response, 1).await;
    assert_eq!(after_bare[0].0, b_ids[5]);
    assert_eq!(after_bare[0].1["seq"], 6);
    // A cursor of the shared prefix is in both histories: B goes on from
    // there with its own ops.
    let rest = events_after(&b, &a_ids[2], 3).await;
    assert_eq!(
        rest.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(),
        b_ids[3..]
    );
    assert_eq!(rest[0].1["seq"], 4);
    // The head cursor /api/log/head gives is the last event's id.
    let (status, head) = b.get("/api/log/head").await;
    assert_eq!(status, 200);
    let chain = head["chain"].as_str().unwrap();
    assert_eq!(b_ids[5], format!("6.{}", &chain[..16]));
    b.stop().await;
}
