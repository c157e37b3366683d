//! `spark_client::events` against real servers: every change once, in
//! order, across a server restart, and `409 cursor_ahead` after the server
//! came back with a log shorter than what the client saw (a restore from an
//! archive that was behind), and `409 cursor_unknown`
//! after it came back with another history under the seqs it saw (issue
//! 24).

use crate::common;

use std::time::Duration;

use common::{copy_dir, settings, TestServer};
use serde_json::json;
use spark_client::events::{EventsFollower, Followed};
use spark_core::wire::events::EventCursor;

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
    let mut follower = EventsFollower::new(&first.base, EventCursor::START).unwrap();
    let mut seqs = Vec::new();
    for _ in 0..3 {
        seqs.push(seq_of(next(&mut follower).await));
    }
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(follower.cursor().seq, 3);
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
    assert_eq!(follower.cursor().seq, 1);
    // It follows after the head from now on: the next op, not a gap.
    create(&second, "d").await;
    assert_eq!(seq_of(next(&mut follower).await), 2);
    second.stop().await;
}

/// The server comes back at the same address with another history that
/// shares the seqs the follower saw (a copy of the log at seq 2, as a
/// restore gives, then other ops: a take-over): the follower gives
/// `Resync` naming the new head and goes on after it, instead of
/// continuing after its seq in the other history (which skipped the new
/// ops under seqs it had seen and kept the lost ones in its view).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_resyncs_when_the_server_comes_back_with_another_history() {
    let root = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (root.path().join("a"), root.path().join("b"));
    let first = TestServer::start(&a_dir).await;
    for text in ["a", "b"] {
        create(&first, text).await;
    }
    first.stop().await;
    copy_dir(&a_dir, &b_dir);
    let first = TestServer::start(&a_dir).await;
    let addr = first.running.addr;
    for text in ["lost 3", "lost 4"] {
        create(&first, text).await;
    }
    let mut follower = EventsFollower::new(&first.base, EventCursor::START).unwrap();
    let mut seqs = Vec::new();
    for _ in 0..4 {
        seqs.push(seq_of(next(&mut follower).await));
    }
    assert_eq!(seqs, [1, 2, 3, 4]);
    let seen = follower.cursor();
    first.stop().await;

    let mut second_settings = settings(&b_dir);
    second_settings.listen = addr;
    let second = TestServer::start_with(second_settings).await;
    for text in ["new 3", "new 4", "new 5"] {
        create(&second, text).await;
    }
    let (_, head) = second.get("/api/log/head").await;
    let head_cursor = EventCursor::parse(head["cursor"].as_str().unwrap()).unwrap();
    assert_eq!(head_cursor.seq, 5);
    assert_eq!(
        next(&mut follower).await,
        Followed::Resync {
            after: seen,
            head: head_cursor
        }
    );
    assert_eq!(follower.cursor(), head_cursor);
    // It follows after the head from now on.
    create(&second, "new 6").await;
    assert_eq!(seq_of(next(&mut follower).await), 6);
    second.stop().await;
}
