//! A full disk never needs an operator: on a small file system
//! made by the test (a 24 MiB tmpfs; needs root, as CI has), the disk fills
//! and frees repeatedly under writes and uploads: writes answer `507
//! insufficient_storage` near the reserve, resume by themselves, nothing
//! acknowledged is lost, no restart is needed, and `spark-replay verify`
//! and `audit media` are clean. And a file that eats the space past the
//! reserve makes the log hit a real `ENOSPC`, which heals once the file is
//! removed. Without mount rights the tests print `skipped: ...`;
//! `SPARK_REQUIRE_SMALLFS=1` (set by `.ci/run`) makes them fail instead.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::common::{run_or_skip, settings, ulid, TestServer};

const REQUIRE_VAR: &str = "SPARK_REQUIRE_SMALLFS";
const MIB: u64 = 1024 * 1024;

/// A size-limited tmpfs mounted on a temporary directory; unmounted (and
/// the directory removed) when dropped.
struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    /// Mounts a tmpfs of `size_mib` MiB, or says why it cannot.
    fn mount(size_mib: u64) -> Result<SmallFs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("mount cannot run: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed (root is needed): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(SmallFs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        // Lazy: a file still open (a server being torn down) does not keep
        // the mount around.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// The `spark-replay` binary beside the server's, if built.
fn replay_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_spark-engine")).with_file_name("spark-replay")
}

/// Mounts the small file system, or skips (see the module doc).
fn small_fs_or_skip(test: &str) -> Option<SmallFs> {
    let replay = replay_binary();
    if !replay.is_file() {
        let why = format!(
            "{} is not built (`cargo test --workspace` builds it)",
            replay.display()
        );
        run_or_skip(test, Some(why), REQUIRE_VAR);
        return None;
    }
    match SmallFs::mount(24) {
        Ok(fs) => Some(fs),
        Err(why) => {
            run_or_skip(test, Some(why), REQUIRE_VAR);
            None
        }
    }
}

/// Runs `spark-replay ARGS --data DATA` and asserts it exits 0.
fn replay_clean(data: &Path, args: &[&str]) {
    let out = Command::new(replay_binary())
        .args(args)
        .arg("--data")
        .arg(data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "spark-replay {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Free bytes of the file system at `path`.
fn free_bytes(path: &Path) -> u64 {
    spark_engine::disk::free_bytes(path).unwrap()
}

/// A file that takes space on the small file system: `fill_to_free` grows
/// it until at most `free` bytes are left (or the disk is full).
struct Ballast {
    path: PathBuf,
}

impl Ballast {
    fn new(dir: &Path) -> Ballast {
        Ballast {
            path: dir.join("ballast"),
        }
    }

    /// Appends until the file system has at most `left_bytes` free; a full
    /// disk ends it too.
    fn fill_to_free(&self, left_bytes: u64) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .unwrap();
        let chunk = vec![0x5Au8; 64 * 1024];
        loop {
            let free = free_bytes(self.path.parent().unwrap());
            if free <= left_bytes {
                break;
            }
            let n = (free - left_bytes).min(chunk.len() as u64) as usize;
            match file.write_all(&chunk[..n.max(4096)]) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("ballast: {e}"),
            }
        }
    }

    fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What the load got acknowledged.
#[derive(Default)]
struct Acked {
    /// Moments answered 201.
    moments: Vec<String>,
    /// Uploads answered 201: media id and the bytes' SHA-256.
    media: Vec<(String, [u8; 32])>,
    /// 507 answers seen, by kind (create, upload).
    refused_creates: u64,
    refused_uploads: u64,
}

/// One create with a ~2 KB text: its id if acknowledged, else the status.
/// A broken connection is retried with the same ids (a create is
/// idempotent by them): an upload refused before its body was read may
/// leave the server closing a connection the client pool reuses.
async fn create(server: &TestServer) -> Result<String, (u16, serde_json::Value)> {
    let id = ulid();
    let body = json!({
        "id": id,
        "client_request_id": format!("r-{id}"),
        "text": "x".repeat(2000),
    });
    let mut tries = 0;
    let response = loop {
        tries += 1;
        match server
            .client
            .post(server.url("/api/moments"))
            .json(&body)
            .send()
            .await
        {
            Ok(response) => break response,
            Err(e) if tries < 5 => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("create {id}: {e}"),
        }
    };
    let s = response.status().as_u16();
    let retry = response.headers().contains_key("retry-after");
    let v: serde_json::Value = response.json().await.unwrap_or(json!(null));
    if s == 201 || (s == 200 && v["created"] == json!(false)) {
        return Ok(id);
    }
    if s == 507 {
        assert_eq!(v["code"], json!("insufficient_storage"), "{v}");
        assert!(retry, "507 carries Retry-After");
    }
    Err((s, v))
}

/// One upload of `bytes` as the original of a new moment.
async fn upload(
    server: &TestServer,
    moment_id: &str,
    bytes: Vec<u8>,
) -> Result<(String, [u8; 32]), (u16, String)> {
    let media_id = ulid();
    let sha: [u8; 32] = Sha256::digest(&bytes).into();
    let response = server
        .client
        .put(server.url(&format!("/api/media/{media_id}")))
        .header("X-Moment-Id", moment_id)
        .header("X-Media-Role", "original")
        .header("Content-Type", "application/octet-stream")
        // A refusal before the body is read ends the connection.
        .header("Connection", "close")
        .body(bytes)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let retry = response.headers().contains_key("retry-after");
    let text = response.text().await.unwrap();
    if status == StatusCode::CREATED {
        return Ok((media_id, sha));
    }
    if status.as_u16() == 507 {
        assert!(text.contains("insufficient_storage"), "{text}");
        assert!(retry, "507 carries Retry-After");
    }
    Err((status.as_u16(), text))
}

/// When the clients of one cycle stop: a second after the first of them
/// had a create refused (the log itself met the reserve) (no fixed time: a loaded machine writes slowly), or,
/// as a hang guard, after five minutes.
struct Cycle {
    started: Instant,
    first_refusal: parking_lot::Mutex<Option<Instant>>,
}

impl Cycle {
    fn new() -> Arc<Cycle> {
        Arc::new(Cycle {
            started: Instant::now(),
            first_refusal: parking_lot::Mutex::new(None),
        })
    }

    fn refused(&self) {
        self.first_refusal.lock().get_or_insert_with(Instant::now);
    }

    fn go_on(&self) -> bool {
        let after_refusal = self
            .first_refusal
            .lock()
            .is_none_or(|at| at.elapsed() < Duration::from_secs(1));
        after_refusal && self.started.elapsed() < Duration::from_secs(300)
    }
}

/// Writes and uploads until `cycle` says stop; every answer is 201 or 507.
async fn load(server: Arc<TestServer>, cycle: Arc<Cycle>, seed: u8) -> Acked {
    let mut acked = Acked::default();
    let mut n: u32 = 0;
    while cycle.go_on() {
        n += 1;
        match create(&server).await {
            Ok(id) => {
                if n.is_multiple_of(3) {
                    let bytes: Vec<u8> = (0..200 * 1024u32)
                        .map(|i| (i as u8) ^ seed ^ (n as u8))
                        .collect();
                    match upload(&server, &id, bytes).await {
                        Ok(media) => acked.media.push(media),
                        // An upload needs its 200 KiB above the reserve:
                        // it meets the reserve before creates do, while the
                        // log is not below it yet (and `/readyz` may say
                        // ready). The cycle ends on refused creates only.
                        Err((507, _)) => acked.refused_uploads += 1,
                        Err(other) => panic!("upload: {other:?}"),
                    }
                }
                acked.moments.push(id);
            }
            Err((507, _)) => {
                acked.refused_creates += 1;
                cycle.refused();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(other) => panic!("create: {other:?}"),
        }
    }
    acked
}

/// Every acknowledged moment and upload is served, bytes matching.
async fn check_acked(server: &TestServer, acked: &Acked) {
    for id in &acked.moments {
        let (s, _) = server.get(&format!("/api/moments/{id}")).await;
        assert_eq!(s, 200, "acknowledged moment {id} lost");
    }
    for (id, sha) in &acked.media {
        let response = server
            .client
            .get(server.url(&format!("/api/media/{id}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "media {id}");
        let bytes = response.bytes().await.unwrap();
        assert_eq!(
            <[u8; 32]>::from(Sha256::digest(&bytes)),
            *sha,
            "media {id} bytes"
        );
    }
}

fn small_settings(data: &Path) -> spark_engine::config::Settings {
    let mut s = settings(data);
    s.log.segment_size_bytes = MIB;
    s.log.preallocate_bytes = 256 * 1024;
    s.log.disk_reserve_bytes = 4 * MIB;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_disk_fills_and_frees_under_load_and_writes_resume_by_themselves() {
    let test = "disk_full::the_disk_fills_and_frees_under_load_and_writes_resume_by_themselves";
    let Some(small) = small_fs_or_skip(test) else {
        return;
    };
    let data = small.path().join("data");
    let server = Arc::new(TestServer::start_with(small_settings(&data)).await);
    let ballast = Ballast::new(small.path());
    let mut all = Acked::default();
    for cycle in 0..3u8 {
        // Leave a few MiB above the reserve: the load reaches it soon.
        ballast.fill_to_free(4 * MIB + 3 * MIB);
        let running = Cycle::new();
        let clients: Vec<_> = (0..4u8)
            .map(|c| tokio::spawn(load(server.clone(), running.clone(), cycle * 16 + c)))
            .collect();
        let mut refused = 0;
        for client in clients {
            let acked = client.await.unwrap();
            refused += acked.refused_creates + acked.refused_uploads;
            all.moments.extend(acked.moments);
            all.media.extend(acked.media);
            all.refused_creates += acked.refused_creates;
            all.refused_uploads += acked.refused_uploads;
        }
        assert!(refused > 0, "cycle {cycle}: the reserve was reached");
        // The load stops within a batch of the reserve, maybe just above
        // it (a batch of creates needs more than `/readyz`'s zero bytes):
        // take the free space half a MiB below it, where `/readyz` must
        // say why writes are refused.
        ballast.fill_to_free(4 * MIB - MIB / 2);
        let (s, v) = server.get("/readyz").await;
        assert_eq!((s, v["code"].clone()), (507, json!("insufficient_storage")));
        let (s, _) = server.get("/healthz").await;
        assert_eq!(s, 200);
        // Reads go on below the reserve.
        check_acked(&server, &all).await;
        // Free the space: writes resume by themselves, at once.
        ballast.remove();
        let id = create(&server)
            .await
            .expect("writes resume once space is back");
        all.moments.push(id);
        let (s, _) = server.get("/readyz").await;
        assert_eq!(s, 200, "cycle {cycle}: ready again");
    }
    println!(
        "acknowledged {} creates and {} uploads; refused {} creates and {} uploads with 507",
        all.moments.len(),
        all.media.len(),
        all.refused_creates,
        all.refused_uploads
    );
    assert!(all.refused_uploads > 0, "an upload met the reserve");
    assert!(all.media.len() > 3, "uploads were acknowledged");
    check_acked(&server, &all).await;
    let server = Arc::into_inner(server).unwrap();
    server.stop().await;
    replay_clean(&data, &["verify"]);
    replay_clean(&data, &["audit", "media"]);
    // And a restart (not needed to write, just to check) finds it all.
    let server = TestServer::start_with(small_settings(&data)).await;
    check_acked(&server, &all).await;
    server.stop().await;
    drop(small);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_eats_the_reserve_makes_enospc_which_heals_once_removed() {
    let test = "disk_full::a_file_that_eats_the_reserve_makes_enospc_which_heals_once_removed";
    let Some(small) = small_fs_or_skip(test) else {
        return;
    };
    let data = small.path().join("data");
    let mut cfg = small_settings(&data);
    // Trust a measure for a minute and grow the file with every batch: the
    // ballast below fills the disk between two measures, and the log's own
    // write meets ENOSPC.
    cfg.log.disk_check_interval_ms = 60_000;
    cfg.log.preallocate_bytes = 0;
    cfg.log.disk_reserve_bytes = 2 * MIB;
    let server = TestServer::start_with(cfg.clone()).await;
    let mut acked = Acked::default();
    for _ in 0..20 {
        acked.moments.push(create(&server).await.unwrap());
    }
    let ballast = Ballast::new(small.path());
    ballast.fill_to_free(0);
    let mut refused = None;
    for _ in 0..200 {
        match create(&server).await {
            Ok(id) => acked.moments.push(id),
            Err((507, v)) => {
                refused = Some(v);
                break;
            }
            Err(other) => panic!("create: {other:?}"),
        }
    }
    let refused = refused.expect("the full disk refused a write");
    assert!(
        refused["detail"].as_str().unwrap().contains("disk is full"),
        "a real ENOSPC, not the reserve: {refused}"
    );
    // Still refused while the disk is full; reads, health and events go on.
    assert!(create(&server).await.is_err());
    check_acked(&server, &acked).await;
    let (s, _) = server.get("/healthz").await;
    assert_eq!(s, 200);
    let (s, v) = server.get("/readyz").await;
    assert_eq!((s, v["code"].clone()), (507, json!("insufficient_storage")));
    let events = server
        .client
        .get(server.url("/api/events?after=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), StatusCode::OK, "the event stream serves");
    drop(events);
    let metrics = server.metrics_text().await;
    assert!(
        metrics.contains("spark_writes_refused_total{reason=\"disk_full\"}"),
        "{metrics}"
    );
    // The file goes: writes resume with no restart.
    ballast.remove();
    let mut resumed = None;
    for _ in 0..50 {
        if let Ok(id) = create(&server).await {
            resumed = Some(id);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    acked
        .moments
        .push(resumed.expect("writes resume once the file is removed"));
    for _ in 0..20 {
        acked.moments.push(create(&server).await.unwrap());
    }
    let (s, _) = server.get("/readyz").await;
    assert_eq!(s, 200);
    check_acked(&server, &acked).await;
    server.stop().await;
    replay_clean(&data, &["verify"]);
    replay_clean(&data, &["audit", "media"]);
    let server = TestServer::start_with(cfg).await;
    check_acked(&server, &acked).await;
    server.stop().await;
    drop(small);
}

/// The `spark_disk_free_bytes` gauge of a `/metrics` scrape.
async fn free_gauge(client: &reqwest::Client, base: &str) -> u64 {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("spark_disk_free_bytes "))
        .unwrap_or_else(|| panic!("no spark_disk_free_bytes in {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// With the reserve off (`log.disk_reserve_bytes = 0`), a write that meets
/// a real `ENOSPC` still makes `/readyz` say why writes fail (`507`, "disk
/// full") until space is back, and the free-space gauge follows the disk.
/// Before the fix `/readyz` checked for zero bytes, which always passes:
/// `200 ready` while every write failed, and the gauge was never measured.
/// The real binary: the gauge is process-wide, and other tests' servers in
/// this process would set it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_reserve_off_readyz_says_the_disk_is_full_and_the_gauge_follows() {
    let test = "disk_full::with_the_reserve_off_readyz_says_the_disk_is_full_and_the_gauge_follows";
    let Some(small) = small_fs_or_skip(test) else {
        return;
    };
    let data = small.path().join("data");
    // The server's own log is a file on the same small file system, and
    // verbose: once the disk is full its log lines cannot be written
    // either, which must cost those lines only (it once panicked the
    // thread that logged: the log's writer, and every write after it was
    // `503`), as a person running `spark-engine 2> spark.log` in the data
    // directory's file system would see.
    let log_path = small.path().join("server.log");
    let env = [
        ("SPARK_LOG_DISK_RESERVE_BYTES", "0"),
        ("SPARK_LOG_PREALLOCATE_BYTES", "0"),
        ("SPARK_LOG_SEGMENT_SIZE_BYTES", "1048576"),
        ("SPARK_LOG_DISK_CHECK_INTERVAL_MS", "60000"),
        ("SPARK_LOG", "debug"),
    ];
    let server = crate::common::ServerProcess::start_logging_to(
        &data,
        &env,
        std::fs::File::create(&log_path).unwrap(),
    );
    let client = reqwest::Client::new();
    let base = server.base.clone();
    let create = || {
        let client = client.clone();
        let url = format!("{base}/api/moments");
        async move {
            let response = client
                .post(url)
                .json(&json!({"id": ulid(), "text": "y".repeat(2000)}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (
                status,
                response
                    .json::<serde_json::Value>()
                    .await
                    .unwrap_or_default(),
            )
        }
    };
    let readyz = || {
        let client = client.clone();
        let url = format!("{base}/readyz");
        async move {
            let response = client.get(url).send().await.unwrap();
            let status = response.status().as_u16();
            (
                status,
                response
                    .json::<serde_json::Value>()
                    .await
                    .unwrap_or_default(),
            )
        }
    };
    for _ in 0..10 {
        assert_eq!(create().await.0, 201);
    }
    let free_before = free_gauge(&client, &base).await;
    assert!(free_before > 10 * MIB, "{free_before}");
    let ballast = Ballast::new(small.path());
    ballast.fill_to_free(0);
    let mut refused = None;
    for _ in 0..400 {
        match create().await {
            (201, _) => {}
            (507, v) => {
                refused = Some(v);
                break;
            }
            other => panic!("create: {other:?}"),
        }
    }
    let refused = refused.expect("the full disk refused a write");
    assert!(
        refused["detail"].as_str().unwrap().contains("disk is full"),
        "{refused}"
    );
    let (s, v) = readyz().await;
    assert_eq!(
        (s, v["code"].clone()),
        (507, json!("insufficient_storage")),
        "{v}"
    );
    assert!(
        v["detail"].as_str().unwrap().contains("disk full"),
        "says why: {v}"
    );
    let free_full = free_gauge(&client, &base).await;
    assert!(free_full < MIB, "the gauge follows the disk: {free_full}");
    // More writes on the full disk, each logged and refused: still 507,
    // never the stopped writer's 503.
    for _ in 0..20 {
        let (status, v) = create().await;
        assert_eq!(status, 507, "{v}");
    }
    ballast.remove();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, v) = readyz().await;
        if s == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ready again once space is back: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(free_gauge(&client, &base).await > 10 * MIB);
    assert_eq!(create().await.0, 201, "writes resume");
    assert!(server.terminate().success());
    // A start on the full disk, its log unwritable from the first line:
    // it serves, refuses writes with 507 (no panic, no 503) and says why.
    ballast.fill_to_free(0);
    let server = crate::common::ServerProcess::start_logging_to(
        &data,
        &env,
        std::fs::OpenOptions::new()
            .append(true)
            .open(&log_path)
            .unwrap(),
    );
    let mut refused = false;
    for _ in 0..400 {
        let response = client
            .post(server.url("/api/moments"))
            .json(&json!({"id": ulid(), "text": "z".repeat(2000)}))
            .send()
            .await
            .unwrap();
        match response.status().as_u16() {
            201 => {}
            507 => {
                refused = true;
                break;
            }
            other => panic!("create after a start on the full disk: {other}"),
        }
    }
    assert!(refused, "the full disk refused a write");
    let response = client.get(server.url("/readyz")).send().await.unwrap();
    let status = response.status().as_u16();
    let v: serde_json::Value = response.json().await.unwrap_or_default();
    assert_eq!(
        (status, v["code"].clone()),
        (507, json!("insufficient_storage")),
        "{v}"
    );
    assert!(server.terminate().success());
    ballast.remove();
    drop(small);
}
