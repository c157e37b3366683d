//! `spark_client::events` against real servers: every change once, in
//! order, across a server restart, and `409 cursor_ahead` after the server
//! came back with a log shorter than what the client saw (a restore from an
//! archive that was behind; issue 15 item 5).

use crate::common;

use std::time::Duration;

use common::{settings, TestServer};
use serde_json::json;
use spark_client::events::{EventsFollower, Followed};

async fn create(server: &TestServer, text: &str) {
    let (status, body) = server.post("/api/moments", json!({ "text": text })).await;
    assert_eq!(status, 201, "{body}");
}

async fn next(follower: &mut EventsFollower) -> Followed {
    tokio::time::timeout(Duration::from_secs(60), follower.next())
        .await
        .expect("an item within a minute")
        .expect("an item")
}

fn seq_of(item: Followed) -> u64 {
    match item {
        Followed::Change(notice) => notice.seq,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_resyncs_when_the_server_comes_back_behind_its_cursor() {
    let first_dir = tempfile::tempdir().unwrap();
    let first = TestServer::start(first_dir.path()).await;
    let addr = first.running.addr;
    for text in ["a", "b", "c"] {
        create(&first, text).await;
    }
    let mut follower = EventsFollower::new(&first.base, 0).unwrap();
    let mut seqs = Vec::new();
    for _ in 0..3 {
        seqs.push(seq_of(next(&mut follower).await));
    }
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(follower.cursor(), 3);
    first.stop().await;

    // The same address, a log of one op: the machine was replaced and its
    // log restored from an archive that had shipped only seq 1.
    let second_dir = tempfile::tempdir().unwrap();
    let mut second_settings = settings(second_dir.path());
    second_settings.listen = addr;
    let second = TestServer::start_with(second_settings).await;
    create(&second, "a again").await;
    assert_eq!(
        next(&mut follower).await,
        Followed::CursorAhead {
            after: 3,
            head_seq: 1
        }
    );
    assert_eq!(follower.cursor(), 1);
    // It follows after the head from now on: the next op, not a gap.
    create(&second, "d").await;
    assert_eq!(seq_of(next(&mut follower).await), 2);
    second.stop().await;
}
