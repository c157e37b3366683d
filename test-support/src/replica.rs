//! What the replica tests of `spark-engine` (`tests/archive/replica.rs`)
//! and the archive-gap tests of `spark-replay-tools`
//! (`replay-tools/tests/tools/archive_gaps.rs`) share: a blocking HTTP
//! client, a replica's settings file, the real `spark-engine replica`
//! process, and waits on its answers.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::s3::EngineProcess;

/// The writer's address as the replica's `421` names it (its
/// `[replica] writer_url` in [`replica_config`]).
pub const WRITER_URL: &str = "http://writer.example:8080";

/// A blocking HTTP client with a 30 s timeout per request.
pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A replica's settings: polls every 100 ms, `min_seq` waits 700 ms,
/// `/readyz` says not ready past 3 s of lag. Written to `replica.toml` in
/// `dir`; returns its path.
pub fn replica_config(dir: &Path) -> PathBuf {
    let path = dir.join("replica.toml");
    std::fs::write(
        &path,
        format!(
            "[replica]\npoll_interval_ms = 100\nwriter_url = \"{WRITER_URL}\"\n\
             min_seq_wait_ms = 700\nready_lag_max_ms = 3000\n"
        ),
    )
    .unwrap();
    path
}

/// The real `engine` as `replica --from URL --endpoint ENDPOINT` on `data`
/// with the settings file `config` (see [`EngineProcess::start_args`]).
pub fn start_replica(
    engine: &Path,
    data: &Path,
    config: &Path,
    url: &str,
    endpoint: &str,
) -> EngineProcess {
    EngineProcess::start_args(
        engine,
        &["replica", "--from", url, "--endpoint", endpoint],
        data,
        config,
    )
}

/// `GET url`: the status, the `ETag` if any, and the body's bytes.
pub fn get(http: &reqwest::blocking::Client, url: &str) -> (u16, Option<String>, Vec<u8>) {
    let r = http.get(url).send().unwrap();
    let status = r.status().as_u16();
    let etag = r
        .headers()
        .get("etag")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, etag, r.bytes().unwrap().to_vec())
}

/// Waits until `check` holds for the JSON `/readyz` of `base` answers
/// (status, body), polling every 100 ms; returns that body, or panics with
/// the last answer after `within`.
pub fn wait_ready(
    http: &reqwest::blocking::Client,
    base: &str,
    within: Duration,
    check: impl Fn(u16, &Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let (status, _, body) = get(http, &format!("{base}/readyz"));
        let body: Value = serde_json::from_slice(&body).unwrap();
        if check(status, &body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz of {base} after {within:?}: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
