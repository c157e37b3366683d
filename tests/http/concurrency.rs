//! Concurrent duplicates collapse into one op; concurrent distinct writes
//! all land, gapless (SPEC section 3, DESIGN.md "The write path").

use crate::common;

use std::sync::Arc;

use common::{log_records, ulid, TestServer};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_identical_creates_make_one_op() {
    let dir = tempfile::tempdir().unwrap();
    let server = Arc::new(TestServer::start(dir.path()).await);
    let id = ulid();
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let server = Arc::clone(&server);
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            server
                .post(
                    "/api/moments",
                    json!({"id": id, "client_request_id": "same", "text": "Notausgang"}),
                )
                .await
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        let (s, v) = t.await.unwrap();
        assert_eq!(v["moment"]["id"], id.as_str());
        statuses.push(s);
    }
    assert_eq!(
        statuses.iter().filter(|&&s| s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        63,
        "{statuses:?}"
    );

    // The same race with a request id and no id: one engine-minted moment.
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let server = Arc::clone(&server);
        tasks.push(tokio::spawn(async move {
            server
                .post("/api/moments", json!({"client_request_id": "mint-race"}))
                .await
        }));
    }
    let mut ids = std::collections::HashSet::new();
    for t in tasks {
        let (s, v) = t.await.unwrap();
        assert!(s == 200 || s == 201);
        ids.insert(v["moment"]["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1);
    Arc::into_inner(server).unwrap().stop().await;
    assert_eq!(log_records(dir.path()).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_distinct_writes_all_land_gapless() {
    let dir = tempfile::tempdir().unwrap();
    let server = Arc::new(TestServer::start(dir.path()).await);
    let mut tasks = Vec::new();
    for client in 0..32 {
        let server = Arc::clone(&server);
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for n in 0..20 {
                let id = ulid();
                let (s, _) = server
                    .post(
                        "/api/moments",
                        json!({"id": id, "client_request_id": format!("c{client}-{n}")}),
                    )
                    .await;
                assert_eq!(s, 201);
                // Concurrent edits and deletes of our own moments.
                if n % 3 == 0 {
                    let (s, _, _) = server
                        .call(
                            "PATCH",
                            &format!("/api/moments/{id}"),
                            Some(json!({"caption": "edited"})),
                            &[],
                        )
                        .await;
                    assert_eq!(s, 200);
                }
                if n % 5 == 0 {
                    let (s, _, _) = server
                        .call("DELETE", &format!("/api/moments/{id}"), None, &[])
                        .await;
                    assert_eq!(s, 200);
                } else {
                    mine.push(id);
                }
            }
            mine
        }));
    }
    let mut live = Vec::new();
    for t in tasks {
        live.extend(t.await.unwrap());
    }
    let (_, page) = server.get("/api/moments?limit=1000").await;
    let mut listed: Vec<String> = page["moments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    live.sort();
    assert_eq!(listed, live);
    Arc::into_inner(server).unwrap().stop().await;
    let records = log_records(dir.path());
    // 640 creates, 32*7 edits, 32*4 deletes.
    assert_eq!(records.len(), 640 + 32 * 7 + 32 * 4);
    assert!(records
        .iter()
        .enumerate()
        .all(|(i, (seq, _))| *seq == i as u64 + 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_edits_of_one_moment_serialise() {
    let dir = tempfile::tempdir().unwrap();
    let server = Arc::new(TestServer::start(dir.path()).await);
    let id = ulid();
    server.post("/api/moments", json!({"id": id})).await;
    let mut tasks = Vec::new();
    for n in 0..40 {
        let server = Arc::clone(&server);
        let path = format!("/api/moments/{id}");
        tasks.push(tokio::spawn(async move {
            let (s, v, _) = server
                .call(
                    "PATCH",
                    &path,
                    Some(json!({"caption": format!("v{n}")})),
                    &[],
                )
                .await;
            assert_eq!(s, 200);
            v["moment"]["version"].as_u64().unwrap()
        }));
    }
    let mut versions = Vec::new();
    for t in tasks {
        versions.push(t.await.unwrap());
    }
    versions.sort();
    assert_eq!(
        versions,
        (2..=41).collect::<Vec<u64>>(),
        "every edit saw its own version"
    );
    Arc::into_inner(server).unwrap().stop().await;
}
