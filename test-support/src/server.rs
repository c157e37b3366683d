//! Servers on ephemeral ports over temporary data directories, in-process
//! or as the real binary, and what the tests check on a stopped server's
//! data directory (the engine's tests in `tests/`, `benches/startup.rs`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use serde_json::Value;
use spark_engine::clock::SystemClock;
use spark_engine::config::Settings;
use spark_engine::server::{self, RunningServer};
use spark_log_format::{LogReader, OsFs, ScanOptions};

/// Settings for a test server: port 0 on loopback, the given data directory.
pub fn settings(data: &Path) -> Settings {
    Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data.to_owned(),
        ..Settings::default()
    }
}

/// An in-process server and an HTTP client for it.
pub struct TestServer {
    /// The server.
    pub running: RunningServer,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// A client for it.
    pub client: reqwest::Client,
}

impl TestServer {
    /// A server with the test [`settings`] over `data`.
    pub async fn start(data: &Path) -> TestServer {
        TestServer::start_with(settings(data)).await
    }

    /// The handle to a started server: its base URL and a client.
    fn around(running: RunningServer) -> TestServer {
        let base = format!("http://{}", running.addr);
        TestServer {
            running,
            base,
            client: reqwest::Client::new(),
        }
    }

    /// A server with `settings` (panics when it does not start).
    pub async fn start_with(settings: Settings) -> TestServer {
        let running = server::start_with(settings, Arc::new(OsFs), Arc::new(SystemClock))
            .await
            .expect("server starts");
        TestServer::around(running)
    }

    /// A server whose seats are these brains (named, in order).
    pub async fn start_with_brains(
        mut settings: Settings,
        brains: Vec<(&str, Arc<dyn spark_engine::brain::Brain>)>,
    ) -> TestServer {
        settings.brains.seats = brains
            .iter()
            .map(|(name, _)| spark_engine::brain::SeatConfig {
                name: (*name).to_owned(),
                adapter: spark_engine::brain::AdapterConfig::Local(Default::default()),
            })
            .collect();
        let brains = brains.into_iter().map(|(n, b)| (n.to_owned(), b)).collect();
        let running =
            server::start_with_brains(settings, Arc::new(OsFs), Arc::new(SystemClock), brains)
                .await
                .expect("server starts");
        TestServer::around(running)
    }

    /// `base` and `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Sends a request with an optional JSON body and headers; returns the
    /// status, the parsed JSON body (Null when none) and the headers.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.client.request(method, self.url(path));
        if let Some(body) = body {
            request = request.json(&body);
        }
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = request.send().await.expect("request is answered");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.unwrap();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        (status, value, headers)
    }

    /// POSTs `body` as JSON: the status and the JSON answer.
    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let (s, v, _) = self.call("POST", path, Some(body), &[]).await;
        (s, v)
    }

    /// GETs `path`: the status and the JSON answer.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let (s, v, _) = self.call("GET", path, None, &[]).await;
        (s, v)
    }

    /// The `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("metrics are served")
            .text()
            .await
            .expect("metrics text")
    }

    /// Shuts the server down and waits for it.
    pub async fn stop(self) {
        self.running.shutdown().await;
    }
}

/// A fresh ULID for now, as a string.
pub fn ulid() -> String {
    use spark_engine::clock::Clock;
    spark_core::ids::Id::from_parts(SystemClock.now_ms(), rand::random::<u128>()).to_string()
}

/// Every record of the log under `data`, as (seq, kind code) pairs, read
/// with the read-only reader.
pub fn log_records(data: &Path) -> Vec<(u64, u16)> {
    let reader = LogReader::open(&data.join("log")).expect("log opens");
    let mut records = Vec::new();
    reader
        .scan(ScanOptions::default(), |_, record| {
            records.push((record.seq, record.kind));
            std::ops::ControlFlow::Continue(())
        })
        .expect("log scans");
    records
}

/// The real `spark-engine` binary, started on port 0 over `data`.
pub struct ServerProcess {
    /// The process.
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its data directory.
    pub data: PathBuf,
}

impl ServerProcess {
    /// Starts the binary ([`crate::bin_path`]) on `data`; waits for the
    /// line naming its address (panics with its log if it exits first).
    pub fn start(data: &Path) -> ServerProcess {
        ServerProcess::start_with_env(data, &[])
    }

    /// [`ServerProcess::start`] with settings from environment variables
    /// (`SPARK_<SECTION>_<KEY>`).
    pub fn start_with_env(data: &Path, env: &[(&str, &str)]) -> ServerProcess {
        // Its log goes to an unnamed temporary file (a pipe nobody reads
        // would fill and stall it), read back only if it fails to start.
        let stderr = tempfile::tempfile().expect("a temporary file");
        ServerProcess::start_logging_to(data, env, stderr)
    }

    /// [`ServerProcess::start_with_env`] with the server's stderr (its log)
    /// written to `stderr` (a file on a small file system, say), read back
    /// only if it fails to start.
    pub fn start_logging_to(
        data: &Path,
        env: &[(&str, &str)],
        mut stderr: std::fs::File,
    ) -> ServerProcess {
        let mut command = Command::new(crate::bin_path("spark-engine"));
        // The test's own `SPARK_*` variables (long modes such as
        // `SPARK_MEDIA_KILL_CYCLES`, `SPARK_REQUIRE_*`) are not the
        // server's: it refuses a `SPARK_<SECTION>_` variable it does not
        // know. Only `env` reaches it.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SPARK_") {
                command.env_remove(name);
            }
        }
        let mut child = command
            .args(["--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(stderr.try_clone().expect("a second handle"))
            .spawn()
            .expect("binary starts");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|| {
                // Why it did not start: its exit status and what it logged.
                use std::io::{Read as _, Seek as _};
                let status = child.wait();
                let mut logged = String::new();
                let _ = stderr.rewind();
                let _ = stderr.take(8192).read_to_string(&mut logged);
                panic!("no address in {line:?}; the server exited ({status:?}) after logging:\n{logged}")
            });
        ServerProcess {
            child,
            base: format!("http://{addr}"),
            data: data.to_owned(),
        }
    }

    /// `base` and `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// kill -9.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for ServerProcess {
    /// A test that panics before `kill` or `terminate` leaves no server
    /// running (kill -9; a no-op once the child was waited for).
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The digest, seq and request count of the mirror replayed from `data`
/// with the engine's own open (the server must be stopped).
pub fn replayed_state(data: &Path) -> (String, u64, usize) {
    let engine = spark_engine::Engine::open(&settings(data), Arc::new(OsFs), Arc::new(SystemClock))
        .expect("engine opens");
    engine.read(|m| (m.digest(), m.seq, m.requests.len()))
}

/// Decides what a test does when a program it needs is missing (SPEC: none;
/// README.md "Tests, and what needs which program"). `missing` is `None` when everything is there, else why
/// not (for example "tesseract is not installed"). Returns `true` when the
/// test should run. When something is missing and the environment variable
/// `require_var` is `1` (as `.ci/run` sets it), the test fails naming what is
/// missing; otherwise it prints `skipped: <test>: <why> (set <require_var>=1
/// to make it mandatory)` straight to the process's stderr, so the line shows
/// in `cargo test`'s output even though the test passes, and returns `false`.
pub fn run_or_skip(test: &str, missing: Option<String>, require_var: &str) -> bool {
    let Some(why) = missing else { return true };
    if std::env::var(require_var).as_deref() == Ok("1") {
        panic!("{test}: {why}, and {require_var}=1 makes this test mandatory");
    }
    // Not `eprintln!`: the test harness captures that for passing tests.
    let _ = writeln!(
        std::io::stderr(),
        "skipped: {test}: {why} (set {require_var}=1 to make it mandatory)"
    );
    false
}

/// The `spark-replay` binary of the workspace ([`crate::bin_path`]) when
/// the test (or its part) named `test` that runs it should run, else
/// `None`. `spark-replay` belongs to `spark-replay-tools`, so cargo builds
/// it for `cargo test --workspace` but not for a test of `spark-engine`
/// alone: when it is missing, [`run_or_skip`] with `SPARK_REQUIRE_REPLAY`
/// decides (`skipped: ...`, or a failure when `SPARK_REQUIRE_REPLAY=1`).
pub fn replay_or_skip(test: &str) -> Option<PathBuf> {
    let replay = crate::bin_path("spark-replay");
    let missing = (!replay.is_file()).then(|| {
        format!(
            "{} is not built (`cargo test --workspace` or `cargo build -p spark-replay-tools` builds it)",
            replay.display()
        )
    });
    run_or_skip(test, missing, "SPARK_REQUIRE_REPLAY").then_some(replay)
}

/// What `spark-replay audit media` checks, on a stopped server's data
/// directory: every `media.put` has its blob with the op's size and
/// SHA-256 (no lost blob), and every blob is named by an op (no orphan).
/// When the `spark-replay` binary is built beside `spark-engine`, its
/// `audit media --grace-seconds 0` must agree (exit 0, no orphan past the
/// grace period); set `SPARK_REQUIRE_REPLAY=1` to make that part mandatory.
/// Returns how many media there are.
pub fn assert_media_whole(data: &Path) -> usize {
    // A child process another test forks (spark-replay, a server) holds a
    // copy of the stopped server's `LOCK` descriptor until it execs: wait
    // for that instead of failing.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let engine = loop {
        match spark_engine::Engine::open(&settings(data), Arc::new(OsFs), Arc::new(SystemClock)) {
            Err(spark_engine::engine::EngineOpenError::Locked(_))
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            opened => break opened.expect("engine opens"),
        }
    };
    let media: Vec<([u8; 32], u64)> = engine.read(|m| {
        m.media
            .values()
            .map(|m| (m.sha256.0, m.size_bytes))
            .collect()
    });
    drop(engine);
    let blobs_dir = spark_core::blob::blobs_dir(data);
    for (sha256, size_bytes) in &media {
        let path = spark_core::blob::blob_path(&blobs_dir, sha256);
        if let Err(fault) = spark_core::blob::verify(&path, sha256, *size_bytes) {
            panic!("blob {}: {fault}", hex::encode(sha256));
        }
    }
    let named: std::collections::BTreeSet<String> = media
        .iter()
        .map(|(sha256, _)| hex::encode(sha256))
        .collect();
    let blobs: std::collections::BTreeSet<String> = std::fs::read_dir(&blobs_dir)
        .expect("blob directory lists")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let orphans: Vec<&String> = blobs.difference(&named).collect();
    assert!(orphans.is_empty(), "orphan blobs: {orphans:?}");
    if let Some(replay) = replay_or_skip("audit media") {
        let out = Command::new(&replay)
            .args(["audit", "media", "--json", "--grace-seconds", "0", "--data"])
            .arg(data)
            .output()
            .expect("spark-replay runs");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        assert_eq!(out.status.code(), Some(0), "audit media: {report}");
        assert_eq!(report["orphans_past_grace"], 0, "audit media: {report}");
        assert_eq!(report["ok"], media.len(), "audit media: {report}");
    }
    media.len()
}

/// Copies the directory `from` to `to` (created), files and directories
/// below it: a second data directory with the same log, as a restore gives.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
