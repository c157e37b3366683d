//! `[archive] mode = "sync"` against a real S3-compatible server (SPEC
//! section 11, `archive/ARCHIVE.md` "Sync mode"): a write is
//! acknowledged only once a manifest naming its op is stored. Uses the
//! `weed mini` helpers of `spark-test-support` (`test-support/src/s3.rs`;
//! skipped without a `weed` binary unless `SPARK_REQUIRE_S3=1`; the tests
//! that restore or verify with `spark-replay` are skipped without it unless
//! `SPARK_REQUIRE_REPLAY=1`).
//!
//! No timing asserts: waits are hang guards of minutes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spark_engine::clock::SystemClock;
use spark_engine::config::{ArchiveMode, ArchiveSettings, Settings};
use spark_engine::{Engine, Id};
use spark_log_format::OsFs;

use crate::common::replay_or_skip;
use crate::s3_common::{
    create, digest_of, json, open_archived_in, restore, set_credentials, unique_prefix,
    wait_shipped, weed_or_skip as weed_for, weed_up,
};

/// Hang guard: a wait expected to end (never a speed check).
const HANG_GUARD: Duration = Duration::from_secs(180);

/// The child process of [`sync_kill9_loses_no_acknowledged_write`]: set, it
/// holds `DATA URL ENDPOINT` separated by newlines.
const CHILD_ENV: &str = "SPARK_SYNC_KILL9_CHILD";

fn moment_id(n: u64) -> Id {
    Id::from_parts(1_767_225_600_000 + n, n.into())
}

/// The moments of `ns` missing from the engine on `data` (opened without an
/// archive, read, shut down).
async fn missing_from(data: &Path, ns: impl IntoIterator<Item = u64>) -> Vec<u64> {
    let settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    let engine = Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
    let missing = engine.read(|m| {
        ns.into_iter()
            .filter(|n| !m.moments.contains_key(&moment_id(*n)))
            .collect()
    });
    engine.shutdown().await;
    missing
}

/// Not a test on its own: the engine process that
/// [`sync_kill9_loses_no_acknowledged_write`] starts (this test binary run
/// again with [`CHILD_ENV`]) and kills with SIGKILL. It writes creates from
/// 16 tasks in `sync` mode and prints `ack N` once create N is
/// acknowledged. Without [`CHILD_ENV`] it returns at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_kill9_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.lines();
    let (data, url, endpoint) = (
        parts.next().unwrap().to_owned(),
        parts.next().unwrap().to_owned(),
        parts.next().unwrap().to_owned(),
    );
    set_credentials();
    let (engine, _shipping) =
        open_archived_in(Path::new(&data), &url, &endpoint, ArchiveMode::Sync, 4096).await;
    println!("started");
    let writers: Vec<_> = (0..16u64)
        .map(|w| {
            let engine = Arc::clone(&engine);
            tokio::spawn(async move {
                for i in 0.. {
                    let n = 1 + w + 16 * i;
                    engine.submit(create(n)).await.unwrap();
                    // One write call per line: the parent reads whole lines.
                    let line = format!("ack {n}\n");
                    std::io::stdout().write_all(line.as_bytes()).unwrap();
                    std::io::stdout().flush().unwrap();
                }
            })
        })
        .collect();
    // The parent kills this process long before; a guard if it does not.
    tokio::time::sleep(HANG_GUARD).await;
    for w in writers {
        w.abort();
    }
}

/// Kill -9 of the engine under load, then the machine's disk is
/// lost; a restore from the archive holds every acknowledged write (in
/// `sync` mode none is missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_kill9_loses_no_acknowledged_write() {
    let test = "sync_kill9_loses_no_acknowledged_write";
    if replay_or_skip(test).is_none() {
        return;
    }
    let Some(weed) = weed_for(test).await else {
        return;
    };
    let endpoint = weed.endpoint();
    let url = unique_prefix("sync-kill9");
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("original");
    let spec = format!("{}\n{url}\n{endpoint}", data.display());
    let acked = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "archive_sync::sync_kill9_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, spec)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut lines = stdout.lines();
        let mut acked = Vec::new();
        // Kill at a moment that varies from run to run, under load.
        let kill_after = 150 + (super_random() % 250) as usize;
        let deadline = Instant::now() + HANG_GUARD;
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(n) = line.strip_prefix("ack ") {
                acked.push(n.parse::<u64>().unwrap());
            }
            if acked.len() >= kill_after {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the child acknowledged too little"
            );
        }
        assert!(
            acked.len() >= kill_after,
            "the child ended after {} acknowledgments",
            acked.len()
        );
        // SIGKILL: no final ship, no shutdown.
        child.kill().unwrap();
        // Lines written before the kill are acknowledged writes too.
        for line in lines {
            let Ok(line) = line else { break };
            if let Some(n) = line.strip_prefix("ack ") {
                if let Ok(n) = n.parse::<u64>() {
                    acked.push(n);
                }
            }
        }
        child.wait().unwrap();
        acked
    })
    .await
    .unwrap();
    let (local_seq, _) = digest_of(&data, None);

    // The machine's disk is lost.
    std::fs::remove_dir_all(&data).unwrap();
    let restored = work.path().join("restored");
    let (code, out, err) = restore(&url, &restored, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let archived_seq = json(&out)["seq"].as_u64().unwrap();
    let missing = missing_from(&restored, acked.iter().copied()).await;
    eprintln!(
        "{test}: {} writes acknowledged before the kill; local log at seq {local_seq}, archive at seq {archived_seq}; {} acknowledged writes missing from the restore",
        acked.len(),
        missing.len()
    );
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
    assert!(archived_seq <= local_seq);
    drop(weed);
}

/// A number that differs between runs (no rand dependency here).
fn super_random() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    u64::from(nanos ^ std::process::id())
}

/// While the store is down a write is durable
/// locally but not acknowledged; once the store is back it is, and it is
/// in the archive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_a_write_waits_for_the_store_and_completes_after_it_is_back() {
    let test = "sync_a_write_waits_for_the_store_and_completes_after_it_is_back";
    if replay_or_skip(test).is_none() {
        return;
    }
    let Some(weed) = weed_for(test).await else {
        return;
    };
    let endpoint = weed.endpoint();
    let url = unique_prefix("sync-outage");
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("original");
    // 1 MiB segments and one write at a time: a chunk per ship in one open
    // segment, merged 16 at a time, which restore reads like any other.
    let (engine, shipping) =
        open_archived_in(&data, &url, &endpoint, ArchiveMode::Sync, 1 << 20).await;
    for n in 1..40 {
        engine.submit(create(n)).await.unwrap();
    }
    assert_eq!(shipping.status.shipped_seq(), engine.head().seq);

    let weed = weed_up(weed, false).await;
    let waiting = tokio::spawn({
        let engine = Arc::clone(&engine);
        async move { engine.submit(create(40)).await }
    });
    let deadline = Instant::now() + HANG_GUARD;
    while shipping.status.failing().is_none() {
        assert!(Instant::now() < deadline, "no ship failure seen");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Committed locally (readers see it), not acknowledged.
    assert_eq!(engine.head().seq, 40);
    assert!(engine.read(|m| m.moments.contains_key(&moment_id(40))));
    assert!(
        !waiting.is_finished(),
        "acknowledged while the store is down"
    );
    assert_eq!(engine.archive_gate().unwrap().waiting_answers(), 1);
    assert!(shipping.status.shipped_seq() < 40);

    let weed = weed_up(weed, true).await;
    let answer = tokio::time::timeout(HANG_GUARD, waiting)
        .await
        .expect("the write was not answered after the store came back")
        .unwrap();
    assert!(answer.is_ok(), "{answer:?}");
    assert!(shipping.status.shipped_seq() >= 40);
    wait_shipped(&engine, &shipping, HANG_GUARD).await;
    let (seq, digest) = digest_of(&data, None);
    shipping.stop().await;
    engine.shutdown().await;

    let restored = work.path().join("restored");
    let (code, out, err) = restore(&url, &restored, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json(&out)["seq"], seq);
    assert_eq!(json(&out)["digest"], digest.as_str());
    assert!(missing_from(&restored, 1..=40).await.is_empty());
    let (code, out, err) = crate::s3_common::replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 0, "{out}{err}");
    drop(weed);
}

/// Settings of a server in `sync` mode on `url`, data in `work/data`,
/// listening on a port of its own.
fn server_settings(work: &Path, url: &str, endpoint: &str) -> Settings {
    Settings {
        data_dir: work.join("data"),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        archive: Some(ArchiveSettings {
            url: url.to_owned(),
            endpoint: Some(endpoint.to_owned()),
            region: "us-east-1".into(),
            ship_interval_ms: 1000,
            mode: ArchiveMode::Sync,
            lease_ms: 0,
            retention_ms: spark_engine::config::ARCHIVE_RETENTION_MS_DEFAULT,
        }),
        ..Settings::default()
    }
}

/// Unix ms now: moment ids sent over HTTP must be within the clock window.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// One HTTP/1.1 request (`Connection: close`); the status and the whole
/// answer (head and body).
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(HANG_GUARD)).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status: {answer}"));
    (status, answer)
}

/// The HTTP side of `sync` mode with the store down: the write answers
/// `503 timeout` with `Retry-After` once `limits.request_timeout_ms` runs
/// out, `/readyz` answers `503`, and a retry with the same request id once
/// the store is back is acknowledged, the write archived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_http_write_answers_503_timeout_while_the_store_is_down() {
    let test = "sync_http_write_answers_503_timeout_while_the_store_is_down";
    if replay_or_skip(test).is_none() {
        return;
    }
    let Some(weed) = weed_for(test).await else {
        return;
    };
    let endpoint = weed.endpoint();
    let url = unique_prefix("sync-http");
    let work = tempfile::tempdir().unwrap();
    let mut settings = server_settings(work.path(), &url, &endpoint);
    settings.brains.turn_wait_max_s = 1;
    settings.limits.request_timeout_ms = 3_000;
    let server = spark_engine::server::start(settings).await.unwrap();
    let addr = server.addr;
    let now_ms = now_ms();
    let post = move |n: u64| {
        let body = format!(
            r#"{{"id": "{}", "client_request_id": "http-{n}", "text": "moment {n}"}}"#,
            Id::from_parts(now_ms, n.into())
        );
        tokio::task::spawn_blocking(move || http(addr, "POST", "/api/moments", &body))
    };
    let (status, answer) = post(1).await.unwrap();
    assert_eq!(status, 201, "{answer}");

    let weed = weed_up(weed, false).await;
    let (status, answer) = post(2).await.unwrap();
    assert_eq!(status, 503, "{answer}");
    assert!(answer.contains("\"timeout\""), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after:"),
        "{answer}"
    );
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let (status, answer) =
            tokio::task::spawn_blocking(move || http(addr, "GET", "/readyz", ""))
                .await
                .unwrap();
        if status == 503 {
            assert!(answer.contains("archive"), "{answer}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz stayed {status}: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let weed = weed_up(weed, true).await;
    // The retry (same request id) is acknowledged once the original is
    // archived; a request may time out again while shipping backs off.
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let (status, answer) = post(2).await.unwrap();
        if status == 200 || status == 201 {
            break;
        }
        assert_eq!(status, 503, "{answer}");
        assert!(
            Instant::now() < deadline,
            "the retry never succeeded: {answer}"
        );
    }
    let (status, answer) = tokio::task::spawn_blocking(move || http(addr, "GET", "/readyz", ""))
        .await
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    let engine = Arc::clone(server.engine());
    let head = engine.head().seq;
    assert_eq!(head, 2, "the retry wrote nothing");
    assert!(engine.archive_gate().unwrap().archived_seq() >= 2);
    server.shutdown().await;
    drop(engine);

    let restored = work.path().join("restored");
    let (code, out, err) = restore(&url, &restored, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json(&out)["seq"], 2);
    drop(weed);
}

/// `sync` mode, the store down and a server shutting down with a write
/// waiting for the archive: the write is answered `503 unavailable` (durable
/// locally, archived after the restart) and the shutdown ends; after a
/// restart with the store back, a retry with the same request id is
/// acknowledged and the write is in the archive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_shutdown_answers_a_write_waiting_for_the_archive() {
    let test = "sync_shutdown_answers_a_write_waiting_for_the_archive";
    if replay_or_skip(test).is_none() {
        return;
    }
    let Some(weed) = weed_for(test).await else {
        return;
    };
    let endpoint = weed.endpoint();
    let url = unique_prefix("sync-shutdown");
    let work = tempfile::tempdir().unwrap();
    let settings = server_settings(work.path(), &url, &endpoint);
    let server = spark_engine::server::start(settings.clone()).await.unwrap();
    let addr = server.addr;
    let now_ms = now_ms();
    let body = format!(
        r#"{{"id": "{}", "client_request_id": "shutdown-1", "text": "waits"}}"#,
        Id::from_parts(now_ms, 1)
    );
    let weed = weed_up(weed, false).await;
    let waiting = tokio::task::spawn_blocking({
        let body = body.clone();
        move || http(addr, "POST", "/api/moments", &body)
    });
    let engine = Arc::clone(server.engine());
    let deadline = Instant::now() + HANG_GUARD;
    while engine.archive_gate().unwrap().waiting_answers() == 0 {
        assert!(
            Instant::now() < deadline,
            "the write never reached the gate"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::timeout(HANG_GUARD, server.shutdown())
        .await
        .expect("the shutdown hung on a write waiting for the archive");
    let (status, answer) = tokio::time::timeout(HANG_GUARD, waiting)
        .await
        .expect("the waiting write was never answered")
        .unwrap();
    assert_eq!(status, 503, "{answer}");
    assert!(answer.contains("archived after the restart"), "{answer}");
    assert_eq!(engine.head().seq, 1, "durable locally");
    drop(engine);

    let weed = weed_up(weed, true).await;
    let server = spark_engine::server::start(settings).await.unwrap();
    let addr = server.addr;
    let (status, answer) =
        tokio::task::spawn_blocking(move || http(addr, "POST", "/api/moments", &body))
            .await
            .unwrap();
    assert_eq!(status, 200, "the retry is a replay: {answer}");
    assert!(server.engine().archive_gate().unwrap().archived_seq() >= 1);
    server.shutdown().await;
    let restored = work.path().join("restored");
    let (code, out, err) = restore(&url, &restored, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json(&out)["seq"], 1);
    drop(weed);
}

/// Writes creates from 8 tasks on one engine until stopped or refused (a
/// fenced engine refuses everything): each acknowledged number is kept.
struct Load {
    stop: Arc<std::sync::atomic::AtomicBool>,
    acked: Arc<std::sync::Mutex<Vec<u64>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(engine: &Arc<Engine>, next: &Arc<std::sync::atomic::AtomicU64>) -> Load {
        use std::sync::atomic::Ordering;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let tasks = (0..8)
            .map(|_| {
                let (engine, next) = (Arc::clone(engine), Arc::clone(next));
                let (stop, acked) = (Arc::clone(&stop), Arc::clone(&acked));
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if engine.submit(create(n)).await.is_err() {
                            return;
                        }
                        acked.lock().unwrap().push(n);
                    }
                })
            })
            .collect();
        Load { stop, acked, tasks }
    }

    fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Waits until `more` writes beyond those acknowledged now are.
    async fn wait_for(&self, more: usize) {
        let target = self.acked() + more;
        let deadline = Instant::now() + HANG_GUARD;
        while self.acked() < target {
            assert!(Instant::now() < deadline, "the load stalled");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops it (a task waiting for its answer gets it first): the numbers
    /// acknowledged.
    async fn finish(self) -> Vec<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for task in self.tasks {
            tokio::time::timeout(HANG_GUARD, task)
                .await
                .expect("a write was never answered")
                .unwrap();
        }
        let acked = self.acked.lock().unwrap().clone();
        acked
    }
}

/// A `sync`-mode writer under concurrent load merges runs of
/// chunks, so a directory's local tail (fetched or restored a moment ago)
/// often ends inside a chunk of a later manifest. Each kind of take-over
/// must start anyway, with no acknowledged write lost: into an empty
/// directory while the old writer writes, from a directory restored a
/// while before (the documented move), a lease take-over of a live writer
/// by a standby whose clock runs ahead, and a lease take-over of a writer
/// gone quiet from a directory restored before its last writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_take_overs_under_load_start_over_merged_chunks() {
    let test = "sync_take_overs_under_load_start_over_merged_chunks";
    if replay_or_skip(test).is_none() {
        return;
    }
    let Some(weed) = weed_for(test).await else {
        return;
    };
    let endpoint = weed.endpoint();
    let url = unique_prefix("sync-takeover");
    let work = tempfile::tempdir().unwrap();
    let archive = ArchiveSettings {
        url: url.clone(),
        endpoint: Some(endpoint.clone()),
        region: "us-east-1".into(),
        ship_interval_ms: 50,
        mode: ArchiveMode::Sync,
        lease_ms: 1_500,
        retention_ms: spark_engine::config::ARCHIVE_RETENTION_MS_DEFAULT,
    };
    let settings_of = |data: &Path| {
        let mut settings = Settings {
            data_dir: data.to_owned(),
            archive: Some(archive.clone()),
            ..Settings::default()
        };
        // One open segment all along: every ship is a chunk of it, and
        // runs of 16 are merged.
        settings.log.segment_size_bytes = 1 << 20;
        settings.validate().unwrap();
        settings
    };
    let max_record_bytes = settings_of(work.path()).log.max_record_bytes;
    let open_taken = |data: std::path::PathBuf, taken: spark_engine::archive::TakenOver| {
        let settings = settings_of(&data);
        let archive = archive.clone();
        async move {
            let engine =
                Arc::new(Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap());
            taken.fetch_missing_blobs(&engine, &data).await.unwrap();
            let shipping = taken
                .start(&archive, &data, Arc::clone(&engine), max_record_bytes)
                .await
                .unwrap_or_else(|e| panic!("start after the take-over: {e}"));
            (engine, shipping)
        }
    };
    let restore_now = |name: &str| {
        let (url, endpoint) = (url.clone(), endpoint.clone());
        let data = work.path().join(name);
        async move {
            tokio::task::spawn_blocking(move || {
                let (code, out, err) = restore(&url, &data, &endpoint, &[]);
                assert_eq!(code, 0, "{out}{err}");
                data
            })
            .await
            .unwrap()
        }
    };
    let next = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let mut acked = Vec::new();

    // The first writer, under load; a directory restored early on.
    let first = work.path().join("first");
    let (engine, shipping) = {
        let settings = settings_of(&first);
        let engine =
            Arc::new(Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap());
        let shipping =
            spark_engine::archive::start(&archive, &first, Arc::clone(&engine), max_record_bytes)
                .await
                .unwrap();
        (engine, shipping)
    };
    let load = Load::start(&engine, &next);
    load.wait_for(150).await;
    let restored = restore_now("restored-early").await;
    load.wait_for(300).await;

    // 1. Into an empty directory, the old writer writing all along.
    let second = work.path().join("second");
    let taken = spark_engine::archive::take_over(&archive, &second, max_record_bytes)
        .await
        .unwrap_or_else(|e| panic!("take-over into an empty directory: {e}"));
    acked.extend(load.finish().await);
    shipping.stop().await;
    engine.shutdown().await;
    let (engine, shipping) = open_taken(second, taken).await;
    let load = Load::start(&engine, &next);
    load.wait_for(300).await;

    // 2. The documented move: a directory restored a while ago (its tail
    //    since merged into a larger chunk) takes over.
    let taken = spark_engine::archive::take_over(&archive, &restored, max_record_bytes)
        .await
        .unwrap_or_else(|e| panic!("take-over after a restore: {e}"));
    acked.extend(load.finish().await);
    shipping.stop().await;
    engine.shutdown().await;
    let (engine, shipping) = open_taken(restored, taken).await;
    let load = Load::start(&engine, &next);
    load.wait_for(150).await;
    let ahead = restore_now("clock-ahead").await;
    load.wait_for(300).await;

    // 3. A standby whose clock runs ahead (by ten leases) finds the lease
    //    of the live writer expired and takes the prefix over while that
    //    writer renews it and writes: the live writer is fenced, and the
    //    standby starts (before, it fenced the writer and then failed its
    //    catch-up for good, leaving the prefix with no writer). Clocks
    //    decide when a take-over starts, never what is acknowledged.
    let fast = spark_engine::clock::OffsetClock::default();
    fast.set_offset_ms(10 * archive.lease_ms as i64);
    let taken = match spark_engine::archive::take_over_if_expired(
        &archive,
        &ahead,
        max_record_bytes,
        &fast,
    )
    .await
    {
        Ok(Some(taken)) => taken,
        other => panic!("lease take-over by a fast clock: {other:?}"),
    };
    // The live writer learns it was taken over at its next ship: every
    // write it was asked after that is refused, none acknowledged.
    acked.extend(load.finish().await);
    shipping.stop().await;
    engine.shutdown().await;
    let (engine, shipping) = open_taken(ahead, taken).await;
    let load = Load::start(&engine, &next);
    load.wait_for(150).await;
    let standby = restore_now("standby").await;
    load.wait_for(300).await;

    // 4. The writer goes quiet (stopped) and its lease expires; the
    //    standby, restored before its last writes, takes over by itself.
    acked.extend(load.finish().await);
    shipping.stop().await;
    engine.shutdown().await;
    let deadline = Instant::now() + HANG_GUARD;
    let taken = loop {
        match spark_engine::archive::take_over_if_expired(
            &archive,
            &standby,
            max_record_bytes,
            &SystemClock,
        )
        .await
        {
            Ok(Some(taken)) => break taken,
            Err(spark_engine::archive::ArchiveStartError::Held { .. }) => {
                assert!(Instant::now() < deadline, "the lease never expired");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("lease take-over: {other:?}"),
        }
    };
    let (engine, shipping) = open_taken(standby, taken).await;
    let load = Load::start(&engine, &next);
    load.wait_for(50).await;
    acked.extend(load.finish().await);
    shipping.stop().await;
    engine.shutdown().await;

    let last = work.path().join("last");
    let (code, out, err) = restore(&url, &last, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let missing = missing_from(&last, acked.iter().copied()).await;
    eprintln!(
        "{test}: {} writes acknowledged over five writers, {} missing from the restore",
        acked.len(),
        missing.len()
    );
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
    let (code, out, err) = crate::s3_common::replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 0, "{out}{err}");
    drop(weed);
}

/// `restore --at` then `--take-over` had two outcomes by where
/// the cut fell in a chunk (accepted, the ops past the cut fetched back
/// without a word, or refused with advice to do what was just done). Now
/// one, wherever the cut falls: refused before anything is taken, saying
/// why and what to do instead; the writer goes on. A restore without
/// `--at` takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_refuses_a_restore_cut_by_at_wherever_the_cut_falls() {
    let test = "a_take_over_refuses_a_restore_cut_by_at_wherever_the_cut_falls";
    if replay_or_skip(test).is_none() {
        return;
    }
    let Some(weed) = weed_for(test).await else {
        return;
    };
    let endpoint = weed.endpoint();
    let url = unique_prefix("sync-at-takeover");
    let work = tempfile::tempdir().unwrap();
    // One write at a time: every seq a batch's end, a chunk per ship, runs
    // of 16 merged, so cuts fall at chunk ends and inside merged chunks.
    let (engine, shipping) = open_archived_in(
        &work.path().join("original"),
        &url,
        &endpoint,
        ArchiveMode::Sync,
        1 << 20,
    )
    .await;
    for n in 1..=60 {
        engine.submit(create(n)).await.unwrap();
    }
    let archive = ArchiveSettings {
        url: url.clone(),
        endpoint: Some(endpoint.clone()),
        region: "us-east-1".into(),
        ship_interval_ms: 50,
        mode: ArchiveMode::Sync,
        lease_ms: 0,
        retention_ms: spark_engine::config::ARCHIVE_RETENTION_MS_DEFAULT,
    };
    let store = spark_archive::ArchiveStore::connect(&spark_archive::StoreConfig {
        url: url.clone(),
        endpoint: Some(endpoint.clone()),
        region: "us-east-1".into(),
    })
    .unwrap();
    let max_record_bytes = Settings::default().log.max_record_bytes;
    for at in [1u64, 7, 16, 17, 33, 48, 59] {
        let data = work.path().join(format!("at-{at}"));
        let (code, out, err) = {
            let (url, endpoint, data) = (url.clone(), endpoint.clone(), data.clone());
            tokio::task::spawn_blocking(move || {
                restore(&url, &data, &endpoint, &["--at", &at.to_string()])
            })
            .await
            .unwrap()
        };
        assert_eq!(code, 0, "--at {at}: {out}{err}");
        let refusal = spark_engine::archive::take_over(&archive, &data, max_record_bytes)
            .await
            .map(|taken| taken.shipped_seq)
            .expect_err("a take-over of a directory restored with --at");
        let message = refusal.to_string();
        assert!(
            message.contains(&format!("restored with `--at` to seq {at}"))
                && message.contains("restore without `--at`"),
            "--at {at}: {message}"
        );
        assert_eq!(store.latest_epoch().await.unwrap().unwrap().epoch, 1);
        engine.submit(create(100 + at)).await.unwrap();
    }
    let data = work.path().join("whole");
    let (code, out, err) = {
        let (url, endpoint, data) = (url.clone(), endpoint.clone(), data.clone());
        tokio::task::spawn_blocking(move || restore(&url, &data, &endpoint, &[]))
            .await
            .unwrap()
    };
    assert_eq!(code, 0, "{out}{err}");
    assert!(!spark_core::layout::restored_at_file(&data).exists());
    let taken = spark_engine::archive::take_over(&archive, &data, max_record_bytes)
        .await
        .unwrap();
    assert_eq!(taken.epoch, 2);
    shipping.stop().await;
    engine.shutdown().await;
    drop(weed);
}

/// `sync` mode with a store that hangs (SIGSTOPped: connections
/// open, nothing answered). `/readyz` answered `200 ready` for about 30 s
/// (until a request to the store timed out) while every write waited. It
/// answers `503` once a write has waited longer than a few ship intervals
/// (3 x 1 s here), naming the wait, and `200` again once the store answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_readyz_is_not_ready_while_the_store_hangs() {
    let test = "sync_readyz_is_not_ready_while_the_store_hangs";
    let Some(weed) = weed_for(test).await else {
        return;
    };
    let endpoint = weed.endpoint();
    let url = unique_prefix("sync-hung");
    let work = tempfile::tempdir().unwrap();
    let settings = server_settings(work.path(), &url, &endpoint);
    let server = spark_engine::server::start(settings).await.unwrap();
    let addr = server.addr;
    let now_ms = now_ms();
    let post = move |n: u64| {
        let body = format!(
            r#"{{"id": "{}", "client_request_id": "hung-{n}", "text": "moment {n}"}}"#,
            Id::from_parts(now_ms, n.into())
        );
        tokio::task::spawn_blocking(move || http(addr, "POST", "/api/moments", &body))
    };
    let readyz = move || tokio::task::spawn_blocking(move || http(addr, "GET", "/readyz", ""));
    let (status, answer) = post(1).await.unwrap();
    assert_eq!(status, 201, "{answer}");

    let pid = weed.pid().unwrap().to_string();
    let signal = |name: &str| {
        let ok = Command::new("kill")
            .args([name, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {name} {pid}");
    };
    signal("-STOP");
    let waiting = post(2);
    let stopped = Instant::now();
    // Well under the store requests' 30 s timeout, well over 3 intervals.
    let deadline = stopped + Duration::from_secs(20);
    let answer = loop {
        let (status, answer) = readyz().await.unwrap();
        if status == 503 {
            break answer;
        }
        assert_eq!(status, 200, "{answer}");
        if Instant::now() > deadline {
            signal("-CONT");
            panic!(
                "/readyz still said ready {:?} after the store hung: {answer}",
                stopped.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "{test}: not ready {:?} after the store hung",
        stopped.elapsed()
    );
    assert!(answer.contains("waited"), "{answer}");
    signal("-CONT");
    let (status, answer) = tokio::time::timeout(HANG_GUARD, waiting)
        .await
        .expect("the waiting write was never answered")
        .unwrap();
    assert!(
        status == 201 || status == 503,
        "the write answers when archived, or 503 timeout: {answer}"
    );
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let (status, answer) = readyz().await.unwrap();
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "never ready again: {answer}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.shutdown().await;
    drop(weed);
}
