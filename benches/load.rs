//! The side-by-side: durable moment creates over HTTP,
//! the engine beside the HTTP ceiling and SQLite and PostgreSQL glue, all
//! real HTTP servers in their own processes, driven by the same client with
//! the same body, interleaved in one run.
//!
//! `cargo bench --bench load`
//!
//! - **Systems**, each a process of its own on `127.0.0.1:0` over a fresh
//!   data directory for every row (the goals: the engine against the
//!   durable `floor`, issue 28; against `sqlite-group`, issue 18; the
//!   `ceiling` for reference):
//!   - `engine`: the release `spark-engine` (built by cargo for this bench,
//!     `CARGO_BIN_EXE_spark-engine`; `SPARK_LOAD_BIN` overrides), default
//!     settings: a create is answered only after the fdatasync covering it.
//!   - `floor`, `ceiling`, `sqlite-group`, `sqlite-txn`, `postgres`: this bench
//!     binary re-executed as a peer (`benches/load/peers.rs`), on the
//!     engine's warp, hyper, tokio runtime and allocator: the durable
//!     floor (body parsed, request ids in a hash map, one writer thread
//!     appending each batch's creates as lines to a file pre-allocated
//!     before it listens, one `pwrite` and one `fdatasync` per batch,
//!     then the answers); the HTTP ceiling
//!     (body parsed, nothing stored, `201`); warp + SQLite (WAL,
//!     `synchronous=FULL`) with one group-commit writer thread; warp +
//!     SQLite, one connection behind a mutex, a transaction per create;
//!     warp + PostgreSQL (deadpool pool of 16, `synchronous_commit=on`), a
//!     transaction per create, against a server the bench starts on
//!     loopback (`benches/load/postgres.rs`; without PostgreSQL installed
//!     its rows say `skipped: PostgreSQL not installed (...)`, and
//!     `SPARK_REQUIRE_POSTGRES=1` makes that a failure).
//! - **Load**: N keep-alive HTTP/1.1 connections (hyper client, one tokio
//!   thread) each send `POST /api/moments` back to back: a fresh ULID `id`
//!   and a unique `client_request_id` per create, ~300 bytes of JSON.
//!   Latency is from the request's send to its whole answer; every answer
//!   is checked (`201`, `created: true`, the id). A warm-up precedes each
//!   measured window.
//! - **Interleaving**: `SPARK_LOAD_ROUNDS` rounds; in each, every connection
//!   count runs every system in turn, the order rotated by one each round
//!   and connection count. Before each row the bench calls `sync(2)`, so
//!   the previous rows' writeback does not fall into the next one. The table gives medians across rounds (creates/s
//!   with its min..max), the server's CPU per create (user + system from
//!   `/proc/<pid>/stat` over the window; for `postgres` the peer plus the
//!   postmaster and all its children), the generator's CPU and, for the
//!   engine, ops per fdatasync from its `/metrics`. Then the goals of
//!   the engine against the others, with PASS/MISS.
//! - **fdatasync rows**: a 200-byte append to a growing file plus
//!   `fdatasync`, and a 200-byte write over zeros already synced (as into
//!   the engine's pre-allocated segments) plus `fdatasync`, in the same
//!   file system as the data directories, once per round each (medians),
//!   after a warm-up of up to a second, with this process's CPU per sync. The 1-connection goal adds the
//!   in-place one's p50 to the ceiling's.
//! - **Retries** (`SPARK_LOAD_RETRY_SHARE`, default 0): that share of the
//!   requests resend an earlier create of the same connection unchanged;
//!   each must answer `200` with `created: false` and the stored moment's
//!   id. Counted (and timed) apart from the fresh creates, which alone make
//!   creates/s. Not sent to the ceiling, which stores nothing.
//! - **Checkpoint rows** ("p99 during a checkpoint within
//!   10% of without"; on unless `SPARK_LOAD_CHECKPOINT=0`): the engine
//!   is pre-filled with `SPARK_LOAD_CHECKPOINT_PREFILL` creates (default
//!   300,000, checkpoints off), then copies of that data directory run at
//!   `SPARK_LOAD_CHECKPOINT_CONNECTIONS` (default 64) with checkpoints off
//!   (`SPARK_LOG_CHECKPOINT_INTERVAL_OPS=0`) and on
//!   (`SPARK_LOAD_CHECKPOINT_INTERVAL_OPS`, default 50,000: each checkpoint
//!   holds the whole pre-filled state), in turn, `SPARK_LOAD_ROUNDS` times.
//!   The checkpoint files that appeared inside each measured window are
//!   counted and their sizes printed; the p99 ratio is judged only when at
//!   least one was written inside a window.
//!
//! Settings (environment): `SPARK_LOAD_SECONDS` (measured seconds per row,
//! default 5), `SPARK_LOAD_WARMUP_SECONDS` (default 1), `SPARK_LOAD_CONNECTIONS`
//! (default `1,16,64`), `SPARK_LOAD_ROUNDS` (default 3), `SPARK_LOAD_SYSTEMS`
//! (default `engine,floor,ceiling,sqlite-group,sqlite-txn,postgres`; also
//! `engine-b`, the engine binary `SPARK_LOAD_BIN_B`, for an A/B of two
//! builds interleaved in one run),
//! `SPARK_LOAD_SKIP_SQLITE=1` (drops both SQLite systems),
//! `SPARK_LOAD_RETRY_SHARE` (0.0..1.0, default 0), `SPARK_LOAD_DIR` (where
//! the temporary data directories go; default the system temp dir;
//! PostgreSQL's goes there too, so the `postgres` user must reach it),
//! `SPARK_LOAD_BIN`, `SPARK_LOAD_BIN_B`, `SPARK_POSTGRES_BIN` (the directory of `initdb` and
//! `postgres`; default the newest `/usr/lib/postgresql/*/bin`, else `PATH`),
//! `SPARK_REQUIRE_POSTGRES=1`, the checkpoint ones above.
//!
//! - **Archive rows**, after the rest (or alone with
//!   `SPARK_LOAD_ARCHIVE_ONLY=1`; not at all with `SPARK_LOAD_ARCHIVE=0`):
//!   the bench starts its own `weed mini` (SeaweedFS, `SPARK_WEED` or `weed` on `PATH`; without it the rows are
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
//!   Then the RPO row: an `async` archive shipping every
//!   500 ms under 8 connections of creates, one in five followed by a media
//!   upload of 100 B to 60 KiB, for `SPARK_LOAD_SECONDS`: for every
//!   acknowledged write, the time from its answer until `GET /api/log/head`
//!   (polled every 5 ms from a thread of its own) says `archived_seq`
//!   covers its op (its seq learnt after the load by sending the write
//!   again: the replay names its op), with p50, p99, max and PASS/MISS of
//!   the max against 1000 ms (interval + 500 ms), and the mean time of each
//!   stage of a ship (`spark_archive_ship_seconds`). `SPARK_LOAD_ARCHIVE_ROUNDS=0`
//!   runs it alone.
//!
//! The generator shares the machine's cores with the server (one thread;
//! its CPU use is printed), so every figure is a lower bound on what a
//! server does with the machine to itself, the ceiling's most.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use rand::{Rng, SeedableRng};

/// The engine's allocator, for the peers too.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// The `weed mini` server of the archive tests (SeaweedFS), the store of
// the archive rows.
use spark_test_support::weed;

#[path = "load/archive.rs"]
mod archive;
#[path = "load/peers.rs"]
mod peers;
#[path = "load/postgres.rs"]
mod postgres;

/// The goals, at 64 connections: the engine's creates/s
/// against the ceiling's and the SQLite group-commit glue's.
const TARGET_VS_SQLITE_GROUP_64: f64 = 1.5;
/// The goals against the durable floor (issue 28 item 2): creates/s at 64
/// connections at least this share of the floor's (with a p99 no worse),
/// and the p50 at 1 connection at most this multiple of the floor's.
const TARGET_VS_FLOOR_64: f64 = 0.9;
const TARGET_P50_VS_FLOOR_1: f64 = 1.1;
/// The floor's file: this many bytes a second of the row (warm-up, window
/// and 2 s), per connection up to 16, pre-allocated before it listens.
const FLOOR_BYTES_PER_SECOND_PER_CONNECTION: f64 = 2.0 * (1 << 20) as f64;
/// P99 while checkpoints are written, against without.
const TARGET_CHECKPOINT_P99: f64 = 1.10;

/// The systems of the side-by-side, in the first round's order.
const SYSTEMS: [&str; 7] = [
    "engine",
    "engine-b",
    "floor",
    "ceiling",
    "sqlite-group",
    "sqlite-txn",
    "postgres",
];

struct Options {
    seconds: f64,
    warmup: f64,
    connections: Vec<usize>,
    rounds: usize,
    systems: Vec<&'static str>,
    retry_share: f64,
    dir: Option<PathBuf>,
    bin: PathBuf,
    /// The binary of the `engine-b` rows (`SPARK_LOAD_BIN_B`; default `bin`).
    bin_b: PathBuf,
    require_postgres: bool,
    checkpoint: bool,
    checkpoint_prefill: u64,
    checkpoint_interval_ops: u64,
    checkpoint_connections: usize,
    /// Only the archive rows (`SPARK_LOAD_ARCHIVE_ONLY=1`).
    archive_only: bool,
    /// The archive rows at all (`SPARK_LOAD_ARCHIVE=0`: not).
    archive: bool,
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

fn env_flag(name: &str, default: bool) -> bool {
    match std::env::var(name) {
        Ok(v) => v.trim() == "1",
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
        // `engine-b` only when asked for (an A/B of two builds).
        let wanted = std::env::var("SPARK_LOAD_SYSTEMS").unwrap_or_else(|_| {
            let default: Vec<&str> = SYSTEMS.into_iter().filter(|s| *s != "engine-b").collect();
            default.join(",")
        });
        let wanted: Vec<&str> = wanted.split(',').map(str::trim).collect();
        for w in &wanted {
            assert!(
                SYSTEMS.contains(w),
                "SPARK_LOAD_SYSTEMS: {w:?} is none of {SYSTEMS:?}"
            );
        }
        let skip_sqlite = env_flag("SPARK_LOAD_SKIP_SQLITE", false);
        let systems = SYSTEMS
            .into_iter()
            .filter(|s| wanted.contains(s))
            .filter(|s| !(skip_sqlite && s.starts_with("sqlite")))
            .collect();
        Options {
            seconds: env_or("SPARK_LOAD_SECONDS", 5.0),
            warmup: env_or("SPARK_LOAD_WARMUP_SECONDS", 1.0),
            connections,
            rounds: env_or::<usize>("SPARK_LOAD_ROUNDS", 3).max(1),
            systems,
            retry_share,
            dir: std::env::var_os("SPARK_LOAD_DIR").map(PathBuf::from),
            bin: std::env::var_os("SPARK_LOAD_BIN")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_spark-engine"))),
            bin_b: std::env::var_os("SPARK_LOAD_BIN_B")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_spark-engine"))),
            require_postgres: env_flag("SPARK_REQUIRE_POSTGRES", false),
            checkpoint: env_flag("SPARK_LOAD_CHECKPOINT", true),
            checkpoint_prefill: env_or("SPARK_LOAD_CHECKPOINT_PREFILL", 300_000),
            checkpoint_interval_ops: env_or("SPARK_LOAD_CHECKPOINT_INTERVAL_OPS", 50_000),
            checkpoint_connections: env_or("SPARK_LOAD_CHECKPOINT_CONNECTIONS", 64),
            archive_only: env_flag("SPARK_LOAD_ARCHIVE_ONLY", false),
            archive: env_flag("SPARK_LOAD_ARCHIVE", true),
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

    /// The load of one row at `connections`, with this run's retry share.
    fn load(&self, connections: usize) -> Load<'static> {
        Load {
            connections,
            retry_share: self.retry_share,
            warmup: self.warmup,
            seconds: self.seconds,
            store: None,
            checkpoint_dir: None,
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

/// One measured window of one system.
#[derive(Clone, Default)]
struct Row {
    name: String,
    /// Operations per second (creates, or syncs for the fdatasync row).
    rate: f64,
    p50: Option<u32>,
    p99: Option<u32>,
    p999: Option<u32>,
    /// Server CPU (user + system) per answered request, µs.
    server_us: Option<f64>,
    /// Server CPU over the window, in cores.
    server_cores: Option<f64>,
    /// The generator's CPU over warm-up and window, in cores.
    generator_cores: Option<f64>,
    /// Engine only: ops per fdatasync over the window.
    ops_per_sync: Option<f64>,
    /// Answers that were not what the request called for.
    errors: u64,
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
            ..Row::default()
        }
    }
}

fn us(v: Option<u32>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v >= 10_000 => format!("{:.1} ms", v as f64 / 1000.0),
        Some(v) if v >= 1_000 => format!("{:.2} ms", v as f64 / 1000.0),
        Some(v) => format!("{v} µs"),
    }
}

/// `12,345` for a rate.
fn thousands(v: f64) -> String {
    let s = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn median_f64(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn median_u32(v: Vec<Option<u32>>) -> Option<u32> {
    median_f64(v.into_iter().flatten().map(f64::from).collect()).map(|m| m.round() as u32)
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

/// A system under load: a process that printed `... http://ADDR` once it
/// served.
struct Server {
    child: Child,
    addr: SocketAddr,
    /// A process tree whose CPU counts as the server's too (the
    /// PostgreSQL postmaster of the `postgres` peer).
    also: Option<u32>,
}

impl Server {
    /// Starts `bin` on `data`, with the settings file `config` if given
    /// (and then the archive's credentials in its environment and its
    /// stderr in `server.log` beside the file). `Err` is what the server
    /// said when it exited instead of listening.
    fn try_start(bin: &Path, data: &Path, config: Option<&Path>) -> Result<Server, String> {
        Server::engine(bin, data, config, &[])
    }

    /// [`Server::try_start`] with `env` set for the engine.
    fn engine(
        bin: &Path,
        data: &Path,
        config: Option<&Path>,
        env: &[(&str, String)],
    ) -> Result<Server, String> {
        let mut command = Command::new(bin);
        command
            .args(["--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .stderr(Stdio::null());
        for (k, v) in env {
            command.env(k, v);
        }
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
        Server::spawn(command, bin, log.as_deref())
    }

    /// This bench binary as the peer `name` on `data` (`pg`: the
    /// PostgreSQL server of the `postgres` peer, whose CPU then counts
    /// as the peer's). Its stderr goes to `peer.log` beside `data`.
    fn peer(
        name: &str,
        data: &Path,
        pg: Option<&postgres::Postgres>,
        preallocate_bytes: Option<u64>,
    ) -> Result<Server, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let log = data.with_file_name("peer.log");
        let mut command = Command::new(&exe);
        command
            .args(["--peer", name, "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .stderr(Stdio::from(
                std::fs::File::create(&log).map_err(|e| e.to_string())?,
            ));
        if let Some(pg) = pg {
            command.arg("--pg").arg(pg.addr.to_string());
        }
        if let Some(bytes) = preallocate_bytes {
            command.arg("--preallocate").arg(bytes.to_string());
        }
        let mut server = Server::spawn(command, &exe, Some(&log))?;
        server.also = pg.map(postgres::Postgres::pid);
        Ok(server)
    }

    fn spawn(mut command: Command, bin: &Path, log: Option<&Path>) -> Result<Server, String> {
        command.stdout(Stdio::piped()).stdin(Stdio::null());
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
                .map(|text| {
                    // The last lines that say something (a panic's message,
                    // not its backtrace).
                    let said: Vec<&str> = text
                        .lines()
                        .filter(|l| {
                            !l.trim().is_empty()
                                && !l.starts_with(' ')
                                && !l.starts_with("note:")
                                && !l.starts_with("stack backtrace")
                        })
                        .collect();
                    said[said.len().saturating_sub(3)..].join(" / ")
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
        Ok(Server {
            child,
            addr,
            also: None,
        })
    }

    /// User + system CPU seconds the server used so far (Linux /proc),
    /// with the tree of [`Server::also`].
    fn cpu_seconds(&self) -> Option<f64> {
        let own = proc_cpu_seconds(&format!("/proc/{}/stat", self.child.id()))?;
        match self.also {
            None => Some(own),
            Some(root) => Some(own + tree_cpu_seconds(root)?),
        }
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

/// The fields after the command name of a /proc/<pid>/stat (the name is
/// in parentheses and may hold spaces): field 3 (state) is index 0.
fn stat_fields(path: &str) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(path).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    Some(rest.split(' ').map(str::to_owned).collect())
}

/// utime + stime of a /proc/<pid>/stat (or /proc/self/stat), in seconds.
fn proc_cpu_seconds(path: &str) -> Option<f64> {
    let fields = stat_fields(path)?;
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// CPU seconds of process `root` and all its descendants alive now, each
/// with its reaped children's (cutime + cstime), so a child that exits
/// moves its CPU into its parent's count instead of losing it.
fn tree_cpu_seconds(root: u32) -> Option<f64> {
    let mut parent: BTreeMap<u32, u32> = BTreeMap::new();
    let mut cpu: BTreeMap<u32, f64> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Some(f) = stat_fields(&format!("/proc/{pid}/stat")) else {
            continue;
        };
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        if let Some(ppid) = f.get(1).and_then(|v| v.parse().ok()) {
            parent.insert(pid, ppid);
        }
        cpu.insert(pid, (num(11) + num(12) + num(13) + num(14)) / 100.0);
    }
    cpu.get(&root)?;
    let in_tree = |mut pid: u32| loop {
        if pid == root {
            return true;
        }
        match parent.get(&pid) {
            Some(&p) if p != 0 && p != pid => pid = p,
            _ => return false,
        }
    };
    Some(
        cpu.iter()
            .filter(|(pid, _)| in_tree(**pid))
            .map(|(_, c)| c)
            .sum(),
    )
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

/// One keep-alive connection sending creates until `end` (or until
/// `budget`, shared by all connections, runs out); only answers to
/// requests sent after `measure_from` are counted. `tag` makes the
/// request ids unique across rows on the same data.
async fn drive_connection(
    addr: SocketAddr,
    conn: usize,
    tag: u32,
    measure_from: Instant,
    end: Instant,
    retry_share: f64,
    budget: Option<Arc<AtomicI64>>,
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
        if let Some(budget) = &budget {
            if budget.fetch_sub(1, Ordering::Relaxed) <= 0 {
                break;
            }
        }
        let retry = !sent.is_empty() && retry_share > 0.0 && rng.gen_bool(retry_share);
        let (id, body) = if retry {
            let (id, _, body) = &sent[rng.gen_range(0..sent.len())];
            (id.clone(), body.clone())
        } else {
            n += 1;
            let id = ulid::Ulid::new().to_string();
            let request_id = format!("load-{tag:08x}-{conn}-{n}");
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

/// The checkpoint files (`<data>/checkpoint/*.ckpt`) now: name and size.
fn checkpoint_files(data: &Path) -> BTreeMap<String, u64> {
    std::fs::read_dir(data.join("checkpoint"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            name.ends_with(".ckpt")
                .then(|| (name, e.metadata().map(|m| m.len()).unwrap_or(0)))
        })
        .collect()
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
    /// Checkpoint files that appeared during the window (name, bytes).
    checkpoints: Vec<(String, u64)>,
}

/// How to drive one row.
struct Load<'a> {
    connections: usize,
    retry_share: f64,
    warmup: f64,
    seconds: f64,
    /// The archive store's metrics address and process, whose `/metrics`
    /// and CPU are taken over the same window.
    store: Option<(SocketAddr, Option<u32>)>,
    /// The engine's data directory, to see which checkpoints the window
    /// saw written.
    checkpoint_dir: Option<&'a Path>,
}

/// Drives `load.connections` connections against the running `server`
/// (warm-up, then the measured window) and makes its row (and the
/// retries' row), named `name`. Returns the window's `/metrics` texts too.
fn load_row(server: &Server, load: &Load, name: &str) -> (Row, Option<Row>, Window) {
    let connections = load.connections;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let own_cpu_before = proc_cpu_seconds("/proc/self/stat");
    let store = load.store;
    let store_stat = store
        .and_then(|(_, pid)| pid)
        .map(|pid| format!("/proc/{pid}/stat"));
    let mut server_cpu_before = None;
    let mut store_cpu_before = None;
    let mut window = Window::default();
    let mut checkpoints_before = BTreeMap::new();
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(load.warmup);
    let end = measure_from + Duration::from_secs_f64(load.seconds);
    let tag: u32 = rand::random();
    let results: Vec<ConnResult> = runtime.block_on(async {
        let tasks: Vec<_> = (0..connections)
            .map(|c| {
                tokio::spawn(drive_connection(
                    server.addr,
                    c,
                    tag,
                    measure_from,
                    end,
                    load.retry_share,
                    None,
                ))
            })
            .collect();
        tokio::time::sleep_until(measure_from.into()).await;
        server_cpu_before = server.cpu_seconds();
        store_cpu_before = store_stat.as_deref().and_then(proc_cpu_seconds);
        if let Some(dir) = load.checkpoint_dir {
            checkpoints_before = checkpoint_files(dir);
        }
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
    let elapsed = Duration::from_secs_f64(load.seconds);
    let server_cpu = match (server_cpu_before, server.cpu_seconds()) {
        (Some(a), Some(b)) => Some((b - a) / load.seconds),
        _ => None,
    };
    if let Some(dir) = load.checkpoint_dir {
        window.checkpoints = checkpoint_files(dir)
            .into_iter()
            .filter(|(name, size)| checkpoints_before.get(name) != Some(size))
            .collect();
    }
    let store_cpu = match (
        store_cpu_before,
        store_stat.as_deref().and_then(proc_cpu_seconds),
    ) {
        (Some(a), Some(b)) => Some((b - a) / load.seconds),
        _ => None,
    };
    let own_cpu = match (own_cpu_before, proc_cpu_seconds("/proc/self/stat")) {
        (Some(a), Some(b)) => Some((b - a) / (load.warmup + load.seconds)),
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
    let mut server_us = None;
    if let Some(cpu) = server_cpu {
        note.push_str(&format!("server cpu {:.0}%", cpu * 100.0));
        if total.creates > 0 {
            // CPU per create holds up better than creates/s when other
            // work shares the cores.
            let per = cpu * load.seconds / (total.creates + total.retries) as f64;
            note.push_str(&format!(" ({:.0} us/create)", per * 1e6));
            window.server_cpu_us_per_create = Some(per * 1e6);
            server_us = Some(per * 1e6);
        }
    }
    window.store_cpu_cores = store_cpu;
    if let Some(cpu) = own_cpu {
        note.push_str(&format!(", generator cpu {:.0}%", cpu * 100.0));
    }
    if let Some(cpu) = store_cpu {
        note.push_str(&format!(", store (weed) cpu {:.0}%", cpu * 100.0));
    }
    let mut ops_per_sync = None;
    if let Some((count, ops, seconds)) = batches.filter(|b| b.0 > 0.0) {
        ops_per_sync = Some(ops / count);
        note.push_str(&format!(
            ", {:.0} batches/s of {:.1} ops, write+fdatasync {:.0} us",
            count / load.seconds,
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
    let mut row = Row::new(name, total.creates, elapsed, total.create_lat, note);
    row.server_us = server_us;
    row.server_cores = server_cpu;
    row.generator_cores = own_cpu;
    row.ops_per_sync = ops_per_sync;
    row.errors = total.errors;
    let retry_row = (load.retry_share > 0.0).then(|| {
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

/// Sends `count` creates over `connections` connections, as fast as the
/// server answers; panics on a wrong answer. Returns the creates/s.
fn prefill(server: &Server, connections: usize, count: u64) -> f64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let budget = Arc::new(AtomicI64::new(i64::try_from(count).unwrap_or(i64::MAX)));
    let started = Instant::now();
    let far = started + Duration::from_secs(24 * 3600);
    let tag: u32 = rand::random();
    let results: Vec<ConnResult> = runtime.block_on(async {
        let tasks: Vec<_> = (0..connections)
            .map(|c| {
                tokio::spawn(drive_connection(
                    server.addr,
                    c,
                    tag,
                    started,
                    far,
                    0.0,
                    Some(Arc::clone(&budget)),
                ))
            })
            .collect();
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.expect("connection task"));
        }
        results
    });
    let created: u64 = results.iter().map(|r| r.creates).sum();
    if let Some(e) = results.iter().find_map(|r| r.first_error.as_deref()) {
        panic!("pre-fill: {e}");
    }
    assert_eq!(created, count, "pre-fill: every create answered");
    created as f64 / started.elapsed().as_secs_f64()
}

// ---- The side-by-side ----------------------------------------------------------

/// Flushes every file system's dirty data (`sync(2)`) before a row, so
/// that the writeback of the previous rows' files (and of the deleted data
/// directories) does not land in this row's fdatasyncs.
fn settle() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// One row of `system` at `connections`, on a fresh data directory.
/// `Err`: the system did not start.
fn system_row(
    opts: &Options,
    system: &str,
    connections: usize,
    pg: Option<&postgres::Postgres>,
) -> Result<(Row, Option<Row>), String> {
    let dir = opts.tempdir();
    let data = dir.path().join("data");
    settle();
    let server = match system {
        "engine" => Server::engine(&opts.bin, &data, None, &[])?,
        "engine-b" => Server::engine(&opts.bin_b, &data, None, &[])?,
        "postgres" => Server::peer(system, &data, pg, None)?,
        "floor" => {
            // Cast: a row's seconds times a rate, far below 2^53.
            let bytes = (opts.warmup + opts.seconds + 2.0)
                * FLOOR_BYTES_PER_SECOND_PER_CONNECTION
                * connections.min(16) as f64;
            Server::peer(system, &data, None, Some(bytes as u64))?
        }
        _ => Server::peer(system, &data, None, None)?,
    };
    let mut load = opts.load(connections);
    if system == "ceiling" {
        // It stores nothing, so it cannot answer a retry.
        load.retry_share = 0.0;
    }
    let (row, retries, _) = load_row(&server, &load, &format!("{system} @{connections}"));
    server.stop();
    Ok((row, retries))
}

/// The medians of one system at one connection count across rounds.
struct Summary {
    rate: f64,
    min: f64,
    max: f64,
    p50: Option<u32>,
    p99: Option<u32>,
    p999: Option<u32>,
    server_us: Option<f64>,
    server_cores: Option<f64>,
    generator_cores: Option<f64>,
    ops_per_sync: Option<f64>,
    errors: u64,
    notes: Vec<String>,
}

fn summarize(rows: &[Row]) -> Summary {
    let rates: Vec<f64> = rows.iter().map(|r| r.rate).collect();
    let of = |f: fn(&Row) -> Option<f64>| median_f64(rows.iter().filter_map(f).collect());
    Summary {
        rate: median_f64(rates.clone()).unwrap_or(0.0),
        min: rates.iter().copied().fold(f64::INFINITY, f64::min),
        max: rates.iter().copied().fold(0.0, f64::max),
        p50: median_u32(rows.iter().map(|r| r.p50).collect()),
        p99: median_u32(rows.iter().map(|r| r.p99).collect()),
        p999: median_u32(rows.iter().map(|r| r.p999).collect()),
        server_us: of(|r| r.server_us),
        server_cores: of(|r| r.server_cores),
        generator_cores: of(|r| r.generator_cores),
        ops_per_sync: of(|r| r.ops_per_sync),
        errors: rows.iter().map(|r| r.errors).sum(),
        notes: rows
            .iter()
            .filter(|r| r.errors > 0)
            .map(|r| r.note.clone())
            .collect(),
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

/// Starts the PostgreSQL server of the `postgres` rows: `Ok(None)` with
/// the skip line when PostgreSQL is not installed (a panic instead under
/// `SPARK_REQUIRE_POSTGRES=1`).
fn start_postgres(opts: &Options) -> Option<postgres::Postgres> {
    let bin = match postgres::bin_dir() {
        Ok(bin) => bin,
        Err(why) => {
            let line = format!("skipped: PostgreSQL not installed ({why})");
            assert!(
                !opts.require_postgres,
                "SPARK_REQUIRE_POSTGRES=1 but {line}"
            );
            println!("{line}");
            return None;
        }
    };
    eprintln!("starting PostgreSQL from {} ...", bin.display());
    match postgres::Postgres::start(&bin, opts.dir.as_deref()) {
        Ok(pg) => {
            println!(
                "postgres: {} on {}, fsync=on, synchronous_commit=on, pool of {}",
                postgres::Postgres::version(&bin),
                pg.addr,
                peers::PG_POOL
            );
            Some(pg)
        }
        Err(why) => panic!("PostgreSQL is installed but did not start: {why}"),
    }
}

/// The side-by-side rows and goals; returns the number of wrong answers.
fn side_by_side(opts: &Options) -> u64 {
    let pg = opts
        .systems
        .contains(&"postgres")
        .then(|| start_postgres(opts))
        .flatten();
    let systems: Vec<&str> = opts
        .systems
        .iter()
        .copied()
        .filter(|s| *s != "postgres" || pg.is_some())
        .collect();
    let mut rows: BTreeMap<(usize, &str), Vec<Row>> = BTreeMap::new();
    let mut retry_rows: BTreeMap<(usize, &str), Vec<Row>> = BTreeMap::new();
    let mut syncs: Vec<Row> = Vec::new();
    let mut in_place: Vec<Row> = Vec::new();
    for round in 0..opts.rounds {
        eprintln!("round {} of {}: fdatasync ...", round + 1, opts.rounds);
        syncs.push(fdatasync_row(opts, SyncKind::Append));
        in_place.push(fdatasync_row(opts, SyncKind::InPlace));
        for (ci, &n) in opts.connections.iter().enumerate() {
            let mut order = systems.clone();
            if !order.is_empty() {
                let k = order.len();
                order.rotate_left((round + ci) % k);
            }
            for system in order {
                eprintln!("round {} of {}: {system} @{n} ...", round + 1, opts.rounds);
                let (row, retries) = system_row(opts, system, n, pg.as_ref())
                    .unwrap_or_else(|e| panic!("{system} did not start: {e}"));
                rows.entry((n, system)).or_default().push(row);
                if let Some(r) = retries {
                    retry_rows.entry((n, system)).or_default().push(r);
                }
            }
        }
    }
    drop(pg);

    let append_sync = summarize(&syncs);
    let sync = summarize(&in_place);
    println!();
    println!(
        "| system | conns | creates/s | min..max | p50 | p99 | p999 | server µs/create | server CPU | generator CPU | ops/fdatasync |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut summaries: BTreeMap<(usize, &str), Summary> = BTreeMap::new();
    for &n in &opts.connections {
        for system in SYSTEMS {
            let Some(r) = rows.get(&(n, system)) else {
                if system == "postgres" && opts.systems.contains(&"postgres") {
                    println!(
                        "| postgres | {n} | skipped: PostgreSQL not installed | | | | | | | | |"
                    );
                }
                continue;
            };
            let s = summarize(r);
            println!(
                "| {system} | {n} | {} | {}..{} | {} | {} | {} | {} | {} | {} | {} |",
                thousands(s.rate),
                thousands(s.min),
                thousands(s.max),
                us(s.p50),
                us(s.p99),
                us(s.p999),
                opt(s.server_us, |v| format!("{v:.1}")),
                opt(s.server_cores, |v| format!("{:.0}%", v * 100.0)),
                opt(s.generator_cores, |v| format!("{:.0}%", v * 100.0)),
                opt(s.ops_per_sync, |v| format!("{v:.1}")),
            );
            summaries.insert((n, system), s);
        }
    }
    for (name, sync) in [
        ("fdatasync, 200 B append (one thread)", &append_sync),
        ("fdatasync, 200 B in place (one thread)", &sync),
    ] {
        println!(
            "| {name} | - | {} syncs/s | {}..{} | {} | {} | {} | {} per sync | {} | | |",
            thousands(sync.rate),
            thousands(sync.min),
            thousands(sync.max),
            us(sync.p50),
            us(sync.p99),
            us(sync.p999),
            opt(sync.server_us, |v| format!("{v:.1}")),
            opt(sync.server_cores, |v| format!("{:.0}%", v * 100.0)),
        );
    }
    if !retry_rows.is_empty() {
        println!();
        println!("| retries (200, stored moment) | conns | answers/s | p50 | p99 | p999 |");
        println!("| --- | ---: | ---: | ---: | ---: | ---: |");
        for ((n, system), r) in &retry_rows {
            let s = summarize(r);
            println!(
                "| {system} | {n} | {} | {} | {} | {} |",
                thousands(s.rate),
                us(s.p50),
                us(s.p99),
                us(s.p999)
            );
        }
    }
    let mut wrong = 0;
    for ((n, system), s) in &summaries {
        wrong += s.errors;
        if s.errors > 0 {
            println!(
                "ERRORS: {system} @{n}: {} wrong answers; {}",
                s.errors,
                s.notes.join("; ")
            );
        }
    }

    // The goals, from the medians; round by round in parentheses (the
    // rows of one round ran minutes apart at most).
    let rounds_ratio = |n: usize, a: &str, b: &str| -> String {
        let (Some(x), Some(y)) = (rows.get(&(n, a)), rows.get(&(n, b))) else {
            return String::new();
        };
        let each: Vec<String> = x
            .iter()
            .zip(y)
            .map(|(x, y)| format!("{:.2}", x.rate / y.rate))
            .collect();
        format!(" (rounds: {})", each.join(" "))
    };
    let rate = |n: usize, s: &str| summaries.get(&(n, s)).map(|s| s.rate);
    println!();
    println!("| goal | measured | target | verdict |");
    println!("| --- | ---: | ---: | --- |");
    let ratio_line = |label: &str, n: usize, other: &str, target: Option<f64>| match (
        rate(n, "engine"),
        rate(n, other),
    ) {
        (Some(e), Some(o)) if o > 0.0 => println!(
            "| {label} | {:.2}x{} | {} | {} |",
            e / o,
            rounds_ratio(n, "engine", other),
            target.map_or("(for reference)".into(), |t| format!(">= {t}x")),
            target.map_or("", |t| verdict(e / o >= t))
        ),
        _ => println!("| {label} | not measured | | |"),
    };
    let p = |n: usize, s: &str, f: fn(&Summary) -> Option<u32>| summaries.get(&(n, s)).and_then(f);
    // The goal "engine p99 @64 no worse than the peer's".
    let p99_line = |peer: &str, issue: &str| {
        let label = format!("engine p99 @64 vs {peer} p99 @64 ({issue})");
        match (p(64, "engine", |s| s.p99), p(64, peer, |s| s.p99)) {
            (Some(e), Some(o)) => println!(
                "| {label} | {} vs {} | <= | {} |",
                us(Some(e)),
                us(Some(o)),
                verdict(e <= o)
            ),
            _ => println!("| {label} | not measured | | |"),
        }
    };
    // Issue 28 item 2: the engine at the durable floor.
    ratio_line(
        "engine / floor creates/s @64 (issue 28)",
        64,
        "floor",
        Some(TARGET_VS_FLOOR_64),
    );
    p99_line("floor", "issue 28");
    match (p(1, "engine", |s| s.p50), p(1, "floor", |s| s.p50)) {
        (Some(e), Some(f)) => println!(
            "| engine p50 @1 vs floor p50 @1 (issue 28) | {} vs {} = {:.2}x | <= {TARGET_P50_VS_FLOOR_1}x | {} |",
            us(Some(e)),
            us(Some(f)),
            f64::from(e) / f64::from(f.max(1)),
            verdict(f64::from(e) <= TARGET_P50_VS_FLOOR_1 * f64::from(f))
        ),
        _ => println!("| engine p50 @1 vs floor p50 @1 (issue 28) | not measured | | |"),
    }
    // Issue 18 item 2, against the ceiling (which no server that syncs
    // before it answers can reach: for reference) and the SQLite glue.
    ratio_line("engine / ceiling creates/s @64", 64, "ceiling", None);
    ratio_line(
        "engine / sqlite-group creates/s @64 (issue 18)",
        64,
        "sqlite-group",
        Some(TARGET_VS_SQLITE_GROUP_64),
    );
    p99_line("sqlite-group", "issue 18");
    match (
        p(1, "engine", |s| s.p50),
        p(1, "ceiling", |s| s.p50),
        sync.p50,
    ) {
        (Some(e), Some(c), Some(f)) => println!(
            "| engine p50 @1 vs ceiling p50 @1 + in-place fdatasync p50 (issue 18) | {} vs {} + {} = {} | <= | {} |",
            us(Some(e)),
            us(Some(c)),
            us(Some(f)),
            us(Some(c + f)),
            verdict(e <= c + f)
        ),
        _ => println!(
            "| engine p50 @1 vs ceiling p50 @1 + in-place fdatasync p50 (issue 18) | not measured | | |"
        ),
    }
    // An A/B of two builds: B against A at each connection count.
    for &n in &opts.connections {
        if let (Some(b), Some(a)) = (
            summaries.get(&(n, "engine-b")),
            summaries.get(&(n, "engine")),
        ) {
            println!(
                "| engine-b / engine creates/s @{n} | {:.2}x{}; p50 {} vs {}, p99 {} vs {} | (A/B) |  |",
                b.rate / a.rate,
                rounds_ratio(n, "engine-b", "engine"),
                us(b.p50),
                us(a.p50),
                us(b.p99),
                us(a.p99)
            );
        }
    }
    ratio_line("engine / sqlite-txn creates/s @64", 64, "sqlite-txn", None);
    ratio_line("engine / postgres creates/s @64", 64, "postgres", None);
    // What syncing before answering costs the same HTTP stack.
    for &n in &opts.connections {
        if let (Some(f), Some(c)) = (rate(n, "floor"), rate(n, "ceiling")) {
            println!(
                "| floor / ceiling creates/s @{n} | {:.2}x{} | (for reference) |  |",
                f / c,
                rounds_ratio(n, "floor", "ceiling")
            );
        }
    }
    for &n in opts.connections.iter().filter(|&&n| n != 64) {
        ratio_line(&format!("engine / floor creates/s @{n}"), n, "floor", None);
        ratio_line(
            &format!("engine / ceiling creates/s @{n}"),
            n,
            "ceiling",
            None,
        );
        ratio_line(
            &format!("engine / sqlite-group creates/s @{n}"),
            n,
            "sqlite-group",
            None,
        );
    }
    wrong
}

// ---- Checkpoints under load ------------------------------------------------------

/// The checkpoint rows: see the file's doc. Returns the
/// number of wrong answers.
fn checkpoint_section(opts: &Options) -> u64 {
    let n = opts.checkpoint_connections;
    let interval = opts.checkpoint_interval_ops;
    println!();
    println!(
        "checkpoints under load: engine @{n} on a log pre-filled with {} creates, checkpoints \
         off against every {interval} ops, {} round(s), interleaved",
        thousands(opts.checkpoint_prefill as f64),
        opts.rounds
    );
    let filled = opts.tempdir();
    let filled_data = filled.path().join("data");
    let off = [("SPARK_LOG_CHECKPOINT_INTERVAL_OPS", "0".to_owned())];
    let on = [("SPARK_LOG_CHECKPOINT_INTERVAL_OPS", interval.to_string())];
    eprintln!(
        "pre-filling {} creates at {n} connections ...",
        opts.checkpoint_prefill
    );
    let server = Server::engine(&opts.bin, &filled_data, None, &off)
        .unwrap_or_else(|e| panic!("the engine did not start: {e}"));
    let fill_rate = prefill(&server, n, opts.checkpoint_prefill);
    server.stop();
    let log_bytes: u64 = walk_bytes(&filled_data);
    println!(
        "pre-filled at {} creates/s; data directory {:.0} MiB",
        thousands(fill_rate),
        log_bytes as f64 / (1 << 20) as f64
    );
    let mut rows: BTreeMap<&str, Vec<Row>> = BTreeMap::new();
    let mut written: Vec<(usize, String, u64)> = Vec::new();
    let mut windows_with = 0;
    for round in 0..opts.rounds {
        let order: [&str; 2] = if round % 2 == 0 {
            ["off", "on"]
        } else {
            ["on", "off"]
        };
        for mode in order {
            let dir = opts.tempdir();
            let data = dir.path().join("data");
            let status = Command::new("cp")
                .arg("-a")
                .arg(&filled_data)
                .arg(&data)
                .status()
                .expect("cp runs");
            assert!(status.success(), "copying the pre-filled data directory");
            let env: &[(&str, String)] = if mode == "on" { &on } else { &off };
            settle();
            eprintln!(
                "round {} of {}: checkpoints {mode} @{n} ...",
                round + 1,
                opts.rounds
            );
            let server = Server::engine(&opts.bin, &data, None, env)
                .unwrap_or_else(|e| panic!("the engine did not start: {e}"));
            let mut load = opts.load(n);
            load.retry_share = 0.0;
            load.checkpoint_dir = Some(&data);
            let name = format!("engine @{n}, checkpoints {mode}");
            let (row, _, window) = load_row(&server, &load, &name);
            server.stop();
            if mode == "on" {
                if !window.checkpoints.is_empty() {
                    windows_with += 1;
                }
                written.extend(
                    window
                        .checkpoints
                        .into_iter()
                        .map(|(file, bytes)| (round + 1, file, bytes)),
                );
            } else {
                assert!(
                    window.checkpoints.is_empty(),
                    "a checkpoint was written with checkpoint_interval_ops = 0"
                );
            }
            rows.entry(mode).or_default().push(row);
        }
    }
    println!();
    println!("| row | creates/s | min..max | p50 | p99 | p999 | server µs/create | checkpoints written in the window |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    let mut summaries = BTreeMap::new();
    for mode in ["off", "on"] {
        let Some(r) = rows.get(mode) else { continue };
        let s = summarize(r);
        let files = if mode == "on" {
            let each: Vec<String> = written
                .iter()
                .map(|(round, file, bytes)| {
                    format!(
                        "#{round} {file} {:.1} MiB",
                        *bytes as f64 / (1 << 20) as f64
                    )
                })
                .collect();
            format!(
                "{} in {} of {} windows: {}",
                written.len(),
                windows_with,
                r.len(),
                each.join(", ")
            )
        } else {
            "none (interval 0)".into()
        };
        println!(
            "| engine @{n}, checkpoints {mode} | {} | {}..{} | {} | {} | {} | {} | {files} |",
            thousands(s.rate),
            thousands(s.min),
            thousands(s.max),
            us(s.p50),
            us(s.p99),
            us(s.p999),
            opt(s.server_us, |v| format!("{v:.1}")),
        );
        summaries.insert(mode, s);
    }
    let wrong: u64 = summaries.values().map(|s| s.errors).sum();
    if wrong > 0 {
        for r in rows.values().flatten().filter(|r| r.errors > 0) {
            println!("ERRORS: {}: {}", r.name, r.note);
        }
    }
    let (Some(off), Some(on)) = (summaries.get("off"), summaries.get("on")) else {
        return wrong;
    };
    let (Some(p_off), Some(p_on)) = (off.p99, on.p99) else {
        return wrong;
    };
    let ratio = f64::from(p_on) / f64::from(p_off);
    if written.is_empty() {
        println!(
            "p99 with checkpoints / without @{n}: {ratio:.2} (target <= {TARGET_CHECKPOINT_P99}): \
             NOT JUDGED: no checkpoint was written inside a measured window (raise \
             SPARK_LOAD_SECONDS or lower SPARK_LOAD_CHECKPOINT_INTERVAL_OPS)"
        );
    } else {
        println!(
            "p99 with checkpoints / without @{n}: {} / {} = {ratio:.2} (target <= \
             {TARGET_CHECKPOINT_P99})  {}; creates/s {:.2}x",
            us(Some(p_on)),
            us(Some(p_off)),
            verdict(ratio <= TARGET_CHECKPOINT_P99),
            on.rate / off.rate
        );
    }
    wrong
}

/// Bytes of the files under `dir`, recursively.
fn walk_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut seen = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if !seen.insert(d.clone()) {
            continue;
        }
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    total
}

// ---- fdatasync -------------------------------------------------------------------

/// How the fdatasync rows write.
#[derive(Clone, Copy, PartialEq)]
enum SyncKind {
    /// 200 bytes appended to a growing file: each fdatasync writes the
    /// data and the inode's new size.
    Append,
    /// 200 bytes written over zeros already written and synced (1 MiB,
    /// in turn), as the engine's pre-allocated segments are: the data
    /// only.
    InPlace,
}

fn fdatasync_row(opts: &Options, kind: SyncKind) -> Row {
    use std::os::unix::fs::FileExt;
    const SPAN: u64 = 1 << 20;
    settle();
    let dir = opts.tempdir();
    let path = dir.path().join("sync");
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&path)
        .expect("file");
    if kind == SyncKind::InPlace {
        file.write_all(&vec![0u8; SPAN as usize]).expect("zeros");
        file.sync_all().expect("fsync");
    }
    let record = [0x5au8; 200];
    let mut lat = Latencies::default();
    let mut count: u64 = 0;
    let seconds = opts.seconds.min(2.0);
    let mut written: u64 = 0;
    // A warm-up as the servers' rows have, outside the count.
    let start = Instant::now() + Duration::from_secs_f64(opts.warmup.min(1.0));
    let end = start + Duration::from_secs_f64(seconds);
    let mut cpu_before = None;
    let mut warming = true;
    while Instant::now() < end {
        if warming && Instant::now() >= start {
            warming = false;
            cpu_before = proc_cpu_seconds("/proc/self/stat");
        }
        let t = Instant::now();
        match kind {
            SyncKind::Append => file.write_all(&record).expect("write"),
            SyncKind::InPlace => {
                let at = (written * record.len() as u64) % (SPAN - record.len() as u64);
                file.write_all_at(&record, at).expect("write");
            }
        }
        file.sync_data().expect("fdatasync");
        if !warming {
            lat.record(t.elapsed());
            count += 1;
        }
        written += 1;
    }
    let (name, note) = match kind {
        SyncKind::Append => ("fdatasync, 200 B append", "to a growing file"),
        SyncKind::InPlace => ("fdatasync, 200 B in place", "over synced zeros"),
    };
    let mut row = Row::new(
        name,
        count,
        Duration::from_secs_f64(seconds),
        lat,
        note.into(),
    );
    // The CPU one write + fdatasync costs this process (mostly the
    // kernel's), beside the servers' CPU per create.
    if let (Some(a), Some(b)) = (cpu_before, proc_cpu_seconds("/proc/self/stat")) {
        row.server_us = (count > 0).then(|| (b - a) / count as f64 * 1e6);
        row.server_cores = Some((b - a) / seconds);
    }
    row
}

// ---- The table ---------------------------------------------------------------------

/// The archive rows' table.
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
    if let Some(peer) = peers::PeerArgs::from_args() {
        peers::run(peer);
        return;
    }
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let opts = Options::from_env();
    println!(
        "spark load: durable creates over HTTP/1.1 keep-alive on loopback, {} s per row after \
         {} s warm-up, {} round(s) interleaved; retry share {}; generator: 1 tokio thread on \
         the same {} cores as the servers",
        opts.seconds,
        opts.warmup,
        opts.rounds,
        opts.retry_share,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("engine: {}", opts.bin.display());
    // Other work on the cores or the disk moves every row: say how busy
    // the machine was.
    let loadavg = || {
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    println!("load average at start: {}", loadavg());
    if opts.archive_only {
        archive::archive_section(&opts);
        return;
    }
    let started = Instant::now();
    let mut wrong = 0;
    if !opts.systems.is_empty() {
        wrong += side_by_side(&opts);
    }
    if opts.checkpoint {
        wrong += checkpoint_section(&opts);
    }
    println!();
    println!(
        "load average at the end: {} ({:.0} s)",
        loadavg(),
        started.elapsed().as_secs_f64()
    );
    if opts.archive {
        archive::archive_section(&opts);
    }
    // A MISS is a figure; a wrong answer is a broken bench or server.
    if wrong > 0 {
        eprintln!("{wrong} wrong answers (see ERRORS above)");
        std::process::exit(1);
    }
}
