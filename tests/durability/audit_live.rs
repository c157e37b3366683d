//! `spark-replay audit damage` beside the real server under write load: it
//! reads the log as `verify` does beside a running engine (the live view:
//! a listing that raced with segment rolls is read again, and the active
//! segment is read only as far as it continues), so a roll or a batch
//! being copied in is never reported as damage (a break-test found false
//! reports in 9 of 686 runs with 64 KiB segments and frequent checkpoints:
//! "zero bytes where a record would start ... the batch was acknowledged",
//! and seq gaps from a listing that missed a segment).
//!
//! CI runs the audit [`RUNS`] times or for [`RUN_FOR`], whichever ends
//! first; `SPARK_AUDIT_LIVE_RUNS=1000` (with `-- --nocapture`) is the long
//! mode (a fresh server every [`CYCLE_RUNS`] audits, so that the log each
//! audit reads stays small), and prints how many runs saw a roll.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{ulid, ServerProcess};
use serde_json::json;

/// Audits run in CI (the long mode: `SPARK_AUDIT_LIVE_RUNS`).
const RUNS: usize = 60;
/// The longest the audits of one CI run may take together; past it the
/// test stops auditing (and passes if every audit so far was clean).
const RUN_FOR: Duration = Duration::from_secs(60);
/// Audits beside one server in the long mode, before a fresh one.
const CYCLE_RUNS: usize = 50;
/// A checkpoint every this many ops: frequent, as in the break-test.
const CHECKPOINT_INTERVAL_OPS: &str = "200";
/// Concurrent HTTP writers.
const WRITERS: usize = 8;
/// Segments of 64 KiB: with the writers' texts of about 4 KiB, the server
/// rolls one every 15 creates or so.
const SEGMENT_SIZE_BYTES: &str = "65536";
/// The longest a wait of this test may take before it is called a hang.
const HANG_GUARD: Duration = Duration::from_secs(300);

/// The segment files of the log under `data`, counted.
fn segments(data: &Path) -> usize {
    std::fs::read_dir(data.join("log"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
                .count()
        })
        .unwrap_or(0)
}

/// Creates moments back to back until `stop`; every answer must be `201`.
/// Counts the acknowledged ones in `acked`.
fn writer(base: String, n: usize, stop: Arc<AtomicBool>, acked: Arc<AtomicU64>) {
    let http = reqwest::blocking::Client::builder()
        .timeout(HANG_GUARD)
        .build()
        .unwrap();
    let mut k = 0u64;
    while !stop.load(Ordering::Relaxed) {
        k += 1;
        let body = json!({
            "id": ulid(),
            "client_request_id": format!("w{n}-{k}"),
            "text": format!("sign {k} of writer {n} {}", "x".repeat(4000)),
        });
        let response = http
            .post(format!("{base}/api/moments"))
            .json(&body)
            .send()
            .expect("the server answers");
        assert_eq!(response.status().as_u16(), 201, "create {n}-{k}");
        acked.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn audit_damage_beside_a_server_rolling_segments_reports_no_damage() {
    let Some(replay) = common::replay_or_skip("audit_live") else {
        return;
    };
    let long: Option<usize> = std::env::var("SPARK_AUDIT_LIVE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok());
    let (done, rolled_during, acked) = match long {
        None => cycle(&replay, RUNS, Some(RUN_FOR)),
        Some(runs) => {
            // A fresh server every CYCLE_RUNS audits: every audit reads the
            // whole log, which would otherwise grow without end.
            let mut total = (0, 0, 0);
            while total.0 < runs {
                let (d, r, a) = cycle(&replay, CYCLE_RUNS.min(runs - total.0), None);
                total = (total.0 + d, total.1 + r, total.2 + a);
                eprintln!(
                    "audit_live: {} audits, {} of them during a roll",
                    total.0, total.1
                );
            }
            total
        }
    };
    // The load really rolled segments while the audits read.
    assert!(rolled_during > 0, "no roll during {done} audits");
    eprintln!(
        "audit_live: {done} audits beside the server, none reporting damage; \
         {rolled_during} of them during a roll; {acked} creates acknowledged"
    );
}

/// One server on a fresh data directory under write load, and up to `runs`
/// audits beside it (or as many as `run_for` allows); each must report no
/// damage. Returns the audits run, how many of them saw a segment roll,
/// and the creates acknowledged.
fn cycle(replay: &Path, runs: usize, run_for: Option<Duration>) -> (usize, usize, u64) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = ServerProcess::start_with_env(
        &data,
        &[
            ("SPARK_LOG_SEGMENT_SIZE_BYTES", SEGMENT_SIZE_BYTES),
            ("SPARK_LOG_CHECKPOINT_INTERVAL_OPS", CHECKPOINT_INTERVAL_OPS),
        ],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|n| {
            let (base, stop, acked) = (server.base.clone(), stop.clone(), acked.clone());
            std::thread::spawn(move || writer(base, n, stop, acked))
        })
        .collect();
    // Load first: a few segments rolled.
    let deadline = Instant::now() + HANG_GUARD;
    while segments(&data) < 3 {
        assert!(Instant::now() < deadline, "no segment rolled under load");
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = Instant::now();
    let (mut done, mut rolled_during) = (0usize, 0usize);
    while done < runs && run_for.is_none_or(|limit| started.elapsed() < limit) {
        let before = segments(&data);
        let out = Command::new(replay)
            .args(["audit", "damage", "--json", "--data"])
            .arg(&data)
            .output()
            .expect("spark-replay runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "audit {done} beside the server reported damage: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
        assert_eq!(report["damaged"], false, "audit {done}: {report}");
        if segments(&data) > before {
            rolled_during += 1;
        }
        done += 1;
        assert!(
            writers.iter().all(|w| !w.is_finished()),
            "a writer stopped (see its panic)"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().expect("writer");
    }
    assert!(server.terminate().success());
    (done, rolled_during, acked.load(Ordering::Relaxed))
}
