//! Replay and startup on a big log, in one run (issue 7): the raw
//! read-plus-CRC speed of the segment files, the engine's replay (recovery,
//! CRC, chain, decode, fold) over the same files, the real server's startup
//! time until it listens, and the mirror's memory per moment.
//!
//! `cargo bench --bench startup` (10,000,000 moment creates, about 1.8 GB
//! of log in a temporary directory, written first with the engine's log
//! writer). `SPARK_BENCH_REPLAY_OPS=N` for another size;
//! `SPARK_BENCH_DATA=DIR` to keep (or reuse) the data directory, e.g. one
//! made by `spark-replay generate --data DIR --ops N`. Figures are with the
//! files in the page cache (they were just written or read).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spark_engine::clock::SystemClock;
use spark_engine::config::{log_dir, Settings};
use spark_engine::Engine;
use spark_log_format::{LogConfig, LogReader, OsFs, ScanOptions};

#[path = "../tests/common/mod.rs"]
mod common;

/// The same allocator as the server (mimalloc; see `src/main.rs`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MIB: f64 = 1024.0 * 1024.0;

/// Resident set size of a process, in bytes (`/proc/PID/status`, `VmRSS`).
fn rss_bytes(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Starts the real server on `data` (the tests' [`common::ServerProcess`]:
/// it returns once the server printed its "listening" line), and returns
/// the time that took and the server's RSS then. Stops it after.
fn server_startup(data: &Path) -> (Duration, u64) {
    let started = Instant::now();
    let server = common::ServerProcess::start(data);
    let elapsed = started.elapsed();
    let rss = rss_bytes(&server.child.id().to_string());
    server.terminate();
    (elapsed, rss)
}

fn main() {
    // `cargo bench` passes `--bench`; this target takes no arguments.
    let ops: u64 = std::env::var("SPARK_BENCH_REPLAY_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let temp;
    let data: PathBuf = match std::env::var_os("SPARK_BENCH_DATA") {
        Some(dir) => PathBuf::from(dir),
        None => {
            temp = tempfile::tempdir().expect("a temporary directory");
            temp.path().to_owned()
        }
    };
    let log = log_dir(&data);
    if LogReader::open(&log).map_or(true, |r| r.segments().is_empty()) {
        let started = Instant::now();
        eprintln!("writing {ops} moment creates into {}", log.display());
        spark_engine::synth::generate(&log, ops, LogConfig::default(), |_| {})
            .expect("the synthetic log is written");
        eprintln!("written in {:.1} s", started.elapsed().as_secs_f64());
    }

    // Raw: map every segment, check every record's CRC, sum payload bytes.
    let started = Instant::now();
    let reader = LogReader::open(&log).expect("the log opens");
    let raw = started.elapsed();
    let bytes: u64 = reader.segments().iter().map(|s| s.bytes).sum();
    let mut payload_bytes = 0u64;
    let report = reader
        .scan(
            ScanOptions {
                verify_chain: false,
                ..ScanOptions::default()
            },
            |_, record| {
                payload_bytes += record.payload.len() as u64;
                ControlFlow::Continue(())
            },
        )
        .expect("the log scans");
    let records = report.records;
    drop(reader);

    // The engine's replay, in this process: the mirror and its memory.
    let settings = Settings {
        data_dir: data.clone(),
        ..Settings::default()
    };
    let rss_before = rss_bytes("self");
    let started = Instant::now();
    let engine =
        Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).expect("the engine opens");
    let replay = started.elapsed();
    let rss_after = rss_bytes("self");
    let moments = engine.read(|mirror| mirror.moments.len() as u64);
    assert_eq!(engine.head().seq, records);
    drop(engine);

    // The real server: time until it listens, and its memory then.
    let empty = tempfile::tempdir().expect("a temporary directory");
    let (_, rss_empty) = server_startup(empty.path());
    let (startup, rss_server) = server_startup(&data);

    let per_moment_engine = (rss_after.saturating_sub(rss_before)) as f64 / moments.max(1) as f64;
    let per_moment_server = (rss_server.saturating_sub(rss_empty)) as f64 / moments.max(1) as f64;
    let payload_per_moment = payload_bytes as f64 / moments.max(1) as f64;
    let ops_per_s = records as f64 / replay.as_secs_f64();
    let replay_mib_s = bytes as f64 / MIB / replay.as_secs_f64();
    let raw_mib_s = bytes as f64 / MIB / raw.as_secs_f64();
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };

    println!(
        "log: {records} ops, {:.0} MiB in {} segments; payload {:.0} B per op",
        bytes as f64 / MIB,
        report.segments,
        payload_per_moment
    );
    println!("| measure | figure | target | |");
    println!("| --- | ---: | --- | --- |");
    println!(
        "| raw read + CRC (`LogReader::open`) | {:.3} s, {raw_mib_s:.0} MiB/s | | |",
        raw.as_secs_f64()
    );
    println!(
        "| engine replay (`Engine::open`: recovery, CRC, chain, decode, fold) | {:.3} s, {:.2} M ops/s, {replay_mib_s:.0} MiB/s | >= 3 M ops/s | {} |",
        replay.as_secs_f64(),
        ops_per_s / 1e6,
        verdict(ops_per_s >= 3e6)
    );
    println!(
        "| replay / raw speed | 1/{:.1} | >= 1/10 | {} |",
        raw_mib_s / replay_mib_s,
        verdict(replay_mib_s * 10.0 >= raw_mib_s)
    );
    println!(
        "| server startup until listening | {:.2} s | < 4 s | {} |",
        startup.as_secs_f64(),
        verdict(startup < Duration::from_secs(4))
    );
    println!(
        "| mirror memory per moment (server RSS over an empty server's) | {per_moment_server:.0} B ({:.1}x the payload) | <= 2x | {} |",
        per_moment_server / payload_per_moment,
        verdict(per_moment_server <= 2.0 * payload_per_moment)
    );
    println!(
        "| mirror memory per moment (in-process RSS growth during replay) | {per_moment_engine:.0} B ({:.1}x the payload) | | |",
        per_moment_engine / payload_per_moment
    );
}
