//! Racing uploads strand nothing (the scenarios that once lost a blob an
//! acknowledged op names): an upload whose request times out, or whose client goes away,
//! while its `media.put` is queued behind 900 edits keeps its blob when an
//! upload of the same bytes is refused meanwhile; uploads racing for one
//! role with the same bytes, and uploads to a moment being deleted, leave
//! exactly the blobs their ops name. Every acknowledged upload's bytes are
//! served and hash to their SHA-256, and `audit media` finds no orphan and
//! no lost blob.
//!
//! The log's fdatasync is slowed by 1 ms (a `FaultyFs` delay) so that a
//! queue of edits takes long enough to be raced against. Each test runs one
//! round; `SPARK_MEDIA_RACE_ROUNDS=N` runs N (the long mode).

use crate::common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::time::{Duration, Instant};

use common::{assert_media_whole, settings, ulid, TestServer};
use futures_util::future::{maybe_done, MaybeDone};
use sha2::{Digest, Sha256};
use spark_engine::clock::SystemClock;
use spark_engine::engine::{Command, CreateMoment, DeleteMoment, EditMoment};
use spark_engine::{Engine, EngineError, Id, Outcome};
use spark_log_format::{FaultOp, FaultyFs, OsFs};
use tokio::io::AsyncWriteExt;

/// Rounds per test: 1, or `SPARK_MEDIA_RACE_ROUNDS`.
fn rounds() -> usize {
    std::env::var("SPARK_MEDIA_RACE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// A server whose requests time out after 600 ms, whose log fdatasyncs take
/// at least 1 ms, and which removes every orphan at startup.
async fn start(dir: &std::path::Path) -> TestServer {
    let mut s = settings(dir);
    s.limits.request_timeout_ms = 600;
    s.brains.turn_wait_max_s = 0;
    s.media.orphan_grace_ms = 0;
    let fs = FaultyFs::new(Arc::new(OsFs));
    fs.set_delay(FaultOp::SyncData, Some(Duration::from_millis(1)));
    let running = spark_engine::server::start_with(s, Arc::new(fs), Arc::new(SystemClock))
        .await
        .expect("server starts");
    TestServer {
        base: format!("http://{}", running.addr),
        running,
        client: reqwest::Client::new(),
    }
}

fn new_id() -> Id {
    Id::parse(&ulid()).unwrap()
}

fn sha_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Bytes no other upload of the test has.
fn unique_bytes(len: usize) -> Vec<u8> {
    let seed = rand::random::<u64>().to_le_bytes();
    (0..len).map(|i| seed[i % 8] ^ (i as u8)).collect()
}

async fn create_moment(engine: &Engine) -> Id {
    let id = new_id();
    engine
        .submit(Command::CreateMoment(CreateMoment {
            id: Some(id),
            request_id: None,
            text: Some("a sign".into()),
            caption: None,
            lang: None,
            captured_at_ms: None,
            device: "race".into(),
        }))
        .await
        .unwrap();
    id
}

fn edits(moment: Id, n: usize) -> Vec<Command> {
    (0..n)
        .map(|i| {
            Command::EditMoment(EditMoment {
                id: moment,
                request_id: None,
                if_match: None,
                text: Some(Some(format!("edit {i} {}", rand::random::<u32>()))),
                caption: None,
                lang: None,
                device: "race".into(),
            })
        })
        .collect()
}

fn delete(moment: Id) -> Command {
    Command::DeleteMoment(DeleteMoment {
        id: moment,
        request_id: None,
        if_match: None,
        device: "race".into(),
    })
}

type Submitted =
    Pin<Box<MaybeDone<Pin<Box<dyn Future<Output = Result<Outcome, EngineError>> + Send>>>>>;

/// Hands `commands` to the sequencer's queue in this order before it
/// returns (each submit is polled once, which queues it); the task
/// returned waits for their answers and counts the ones that succeeded.
async fn enqueue(engine: &Arc<Engine>, commands: Vec<Command>) -> tokio::task::JoinHandle<usize> {
    let mut submitted: Vec<Submitted> = commands
        .into_iter()
        .map(|command| {
            let engine = Arc::clone(engine);
            let submit: Pin<Box<dyn Future<Output = _> + Send>> =
                Box::pin(async move { engine.submit(command).await });
            Box::pin(maybe_done(submit))
        })
        .collect();
    // Outside tokio's cooperative budget, which would make later sends
    // wait for a poll that comes only after the earlier answers.
    tokio::task::unconstrained(std::future::poll_fn(|_| {
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        for submit in &mut submitted {
            let _ = submit.as_mut().poll(&mut cx);
        }
        std::task::Poll::Ready(())
    }))
    .await;
    tokio::spawn(async move {
        let mut ok = 0;
        for mut submit in submitted {
            submit.as_mut().await;
            if let Some(Ok(_)) = submit.as_mut().take_output() {
                ok += 1;
            }
        }
        ok
    })
}

/// `PUT /api/media/{media}`; the status and the JSON answer.
async fn upload(
    server: &TestServer,
    media: Id,
    moment: Id,
    role: &str,
    bytes: Vec<u8>,
) -> (u16, serde_json::Value) {
    let response = server
        .client
        .put(server.url(&format!("/api/media/{media}")))
        .header("X-Moment-Id", moment.to_string())
        .header("X-Media-Role", role)
        .header("Content-Type", "image/jpeg")
        .body(bytes)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

/// Sends an upload's head and the first `sent` bytes of `bytes` on a raw
/// connection, waits `linger`, then closes the connection without reading.
async fn upload_then_hang_up(
    server: &TestServer,
    media: Id,
    moment: Id,
    bytes: &[u8],
    sent: usize,
    linger: Duration,
) {
    let mut stream = tokio::net::TcpStream::connect(server.running.addr)
        .await
        .unwrap();
    let head = format!(
        "PUT /api/media/{media} HTTP/1.1\r\nhost: localhost\r\nx-moment-id: {moment}\r\nx-media-role: copy\r\ncontent-type: image/jpeg\r\ncontent-length: {}\r\n\r\n",
        bytes.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&bytes[..sent]).await.unwrap();
    stream.flush().await.unwrap();
    tokio::time::sleep(linger).await;
    drop(stream);
}

/// Waits (up to 60 s) until the mirror has media `id`.
async fn committed(engine: &Engine, id: Id) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !engine.read(|m| m.media.contains_key(&id)) {
        assert!(Instant::now() < deadline, "media {id} never committed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET /api/media/{id}` serves bytes that hash to `sha256`.
async fn served(server: &TestServer, id: Id, sha256: &str) {
    let response = server
        .client
        .get(server.url(&format!("/api/media/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200, "GET media {id}");
    let bytes = response.bytes().await.unwrap();
    assert_eq!(sha_hex(&bytes), sha256, "media {id} serves other bytes");
}

/// How the first upload's request ends while its `media.put` is queued.
#[derive(Clone, Copy, Debug)]
enum FirstEnds {
    /// `limits.request_timeout_ms` runs out (`503 timeout`).
    Timeout,
    /// The client closes its connection after sending the whole body.
    HangUp,
}

/// Upload A of bytes X to moment M1 is queued behind 900 edits of M1 and
/// its request ends (timeout or hang-up); meanwhile upload B of the same
/// bytes to moment M2 passes admission, puts X in place, and is refused
/// by the sequencer because M2's delete was queued before it. B must not
/// remove X: A's put commits later, and its bytes must be served. Also a
/// client that hangs up mid-body leaves nothing behind.
async fn twin_refused_while_the_first_is_queued(first_ends: FirstEnds) {
    let dir = tempfile::tempdir().unwrap();
    let server = Arc::new(start(dir.path()).await);
    let engine = Arc::clone(server.running.engine());
    for round in 0..rounds() {
        let (m1, m2) = (create_moment(&engine).await, create_moment(&engine).await);
        let bytes = unique_bytes(20_000 + round);
        let sha = sha_hex(&bytes);
        let (a, b) = (new_id(), new_id());
        let edits_m1 = enqueue(&engine, edits(m1, 900)).await;
        let mut chain_m2 = edits(m2, 80);
        chain_m2.push(delete(m2));
        let chain_m2 = enqueue(&engine, chain_m2).await;
        let first = {
            let server = Arc::clone(&server);
            let bytes = bytes.clone();
            tokio::spawn(async move {
                match first_ends {
                    FirstEnds::Timeout => {
                        let (status, answer) = upload(&server, a, m1, "copy", bytes).await;
                        assert_eq!(
                            (status, answer["code"].as_str()),
                            (503, Some("timeout")),
                            "{answer}"
                        );
                    }
                    FirstEnds::HangUp => {
                        let linger = Duration::from_millis(100);
                        upload_then_hang_up(&server, a, m1, &bytes, bytes.len(), linger).await;
                    }
                }
            })
        };
        // A is queued behind the edits; B races M2's delete.
        tokio::time::sleep(Duration::from_millis(15)).await;
        // Refused: 410, or 503 timeout on a busy machine (its put still
        // goes through the sequencer, which refuses it all the same).
        let (status, answer) = upload(&server, b, m2, "copy", bytes.clone()).await;
        assert!(
            matches!(
                (status, answer["code"].as_str()),
                (410, Some("deleted")) | (503, Some("timeout"))
            ),
            "{status} {answer}"
        );
        first.await.unwrap();
        // A client that hangs up halfway through its body.
        let c = new_id();
        let other = unique_bytes(50_000);
        upload_then_hang_up(&server, c, m1, &other, 10_000, Duration::from_millis(20)).await;
        assert_eq!(edits_m1.await.unwrap(), 900);
        assert_eq!(chain_m2.await.unwrap(), 81);
        committed(&engine, a).await;
        served(&server, a, &sha).await;
        assert!(!engine.read(|m| m.media.contains_key(&b) || m.media.contains_key(&c)));
    }
    Arc::into_inner(server).unwrap().stop().await;
    assert_eq!(assert_media_whole(dir.path()), rounds());
    let temps = std::fs::read_dir(dir.path().join("media/tmp"))
        .unwrap()
        .count();
    assert_eq!(temps, 0, "temporary upload files left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timed_out_upload_keeps_its_blob_when_a_twin_is_refused() {
    twin_refused_while_the_first_is_queued(FirstEnds::Timeout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upload_whose_client_hung_up_keeps_its_blob_when_a_twin_is_refused() {
    twin_refused_while_the_first_is_queued(FirstEnds::HangUp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uploads_racing_for_one_role_with_the_same_bytes_leave_one_blob() {
    let dir = tempfile::tempdir().unwrap();
    let server = Arc::new(start(dir.path()).await);
    let engine = Arc::clone(server.running.engine());
    let mut winners = 0;
    for _ in 0..rounds() * 4 {
        let moment = create_moment(&engine).await;
        let same = unique_bytes(30_000);
        let other = unique_bytes(30_001);
        // Six ids for one role: four with the same bytes, two with others.
        let tasks: Vec<_> = (0..6)
            .map(|n| {
                let server = Arc::clone(&server);
                let bytes = if n < 4 { same.clone() } else { other.clone() };
                tokio::spawn(async move {
                    let id = new_id();
                    let sha = sha_hex(&bytes);
                    let (status, answer) = upload(&server, id, moment, "copy", bytes).await;
                    (id, sha, status, answer)
                })
            })
            .collect();
        let mut won = Vec::new();
        for task in tasks {
            let (id, sha, status, answer) = task.await.unwrap();
            match status {
                201 => won.push((id, sha)),
                409 => assert_eq!(answer["code"], "conflict", "{answer}"),
                _ => panic!("{status} {answer}"),
            }
        }
        assert_eq!(won.len(), 1, "one upload fills the role");
        for (id, sha) in won {
            served(&server, id, &sha).await;
            winners += 1;
        }
    }
    Arc::into_inner(server).unwrap().stop().await;
    // Exactly the winners' blobs: refused uploads removed theirs unless a
    // winner has the same bytes.
    assert_eq!(assert_media_whole(dir.path()), winners);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uploads_to_a_moment_being_deleted_leave_no_orphan() {
    let dir = tempfile::tempdir().unwrap();
    let server = Arc::new(start(dir.path()).await);
    let engine = Arc::clone(server.running.engine());
    let mut acked = Vec::new();
    for round in 0..rounds() * 4 {
        let moment = create_moment(&engine).await;
        let shared = unique_bytes(25_000);
        let tasks: Vec<_> = (0..6)
            .map(|n| {
                let server = Arc::clone(&server);
                let bytes = if n % 2 == 0 {
                    shared.clone()
                } else {
                    unique_bytes(25_001 + n)
                };
                let role = if n < 3 { "copy" } else { "original" };
                tokio::spawn(async move {
                    let id = new_id();
                    let sha = sha_hex(&bytes);
                    let (status, answer) = upload(&server, id, moment, role, bytes).await;
                    (id, sha, status, answer)
                })
            })
            .collect();
        // The delete lands among them (a little later in odd rounds).
        if round % 2 == 1 {
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        let (status, _, _) = server
            .call("DELETE", &format!("/api/moments/{moment}"), None, &[])
            .await;
        assert_eq!(status, 200);
        for task in tasks {
            let (id, sha, status, answer) = task.await.unwrap();
            match status {
                201 => acked.push((id, sha)),
                409 => assert_eq!(answer["code"], "conflict", "{answer}"),
                410 => assert_eq!(answer["code"], "deleted", "{answer}"),
                _ => panic!("{status} {answer}"),
            }
        }
    }
    Arc::into_inner(server).unwrap().stop().await;
    // The moments are deleted (their media answer 410): the blobs of the
    // acknowledged uploads are checked on disk against their ops.
    assert_eq!(assert_media_whole(dir.path()), acked.len());
    let blobs = spark_core::blob::blobs_dir(dir.path());
    for (id, sha) in &acked {
        let bytes = std::fs::read(blobs.join(sha)).unwrap_or_default();
        assert_eq!(&sha_hex(&bytes), sha, "media {id}");
    }
}

#[tokio::test]
async fn orphans_older_than_the_grace_period_are_removed_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.media.orphan_grace_ms = 60_000;
    let server = TestServer::start_with(s.clone()).await;
    let moment = create_moment(server.running.engine()).await;
    let kept = unique_bytes(1000);
    assert_eq!(
        upload(&server, new_id(), moment, "copy", kept.clone())
            .await
            .0,
        201
    );
    server.stop().await;
    // Two blobs no op names, as a crash between blob and op leaves them:
    // one older than the grace period, one younger.
    let blobs = spark_core::blob::blobs_dir(dir.path());
    let (old, young) = (unique_bytes(10), unique_bytes(11));
    for bytes in [&old, &young] {
        std::fs::write(blobs.join(sha_hex(bytes)), bytes).unwrap();
    }
    std::fs::File::options()
        .write(true)
        .open(blobs.join(sha_hex(&old)))
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(120))
        .unwrap();
    let server = TestServer::start_with(s).await;
    let metrics = server
        .client
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let removed: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("spark_media_orphans_removed_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no orphan metric in {metrics}"));
    // Other tests of this binary share the process-wide registry.
    assert!(removed >= 1, "{removed}");
    server.stop().await;
    assert!(
        !blobs.join(sha_hex(&old)).exists(),
        "the old orphan is removed"
    );
    assert!(
        blobs.join(sha_hex(&young)).exists(),
        "the young orphan is kept"
    );
    assert!(blobs.join(sha_hex(&kept)).exists(), "a named blob is kept");
}
