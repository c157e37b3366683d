//! Replay and startup on a big log, in one run: the raw
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
//!
//! Checkpoints, in the same run: the big log's `Engine::open`
//! again from a checkpoint; then a log of `SPARK_BENCH_HISTORY_CREATES`
//! creates (default 2,000,000) followed by `SPARK_BENCH_HISTORY_TAIL_OPS`
//! edits and deletes (default 9x the creates) beside a log of its creates
//! alone, each opened without and with a checkpoint. `SPARK_BENCH_REPLAY_OPS=0`
//! skips the big log; `SPARK_BENCH_HISTORY_CREATES=0` the history part.
//! The history part then starts the real server on each log in turn,
//! `SPARK_BENCH_HISTORY_STARTS` times (default 5; erasure off so that the
//! logs stay as written), and compares the median start times.
//!
//! `SPARK_BENCH_REPLAY_ONLY=N`: only the big log's `Engine::open` without a
//! checkpoint, N times, each with the process's CPU seconds and the load
//! average (for interleaved A/B rounds of two builds on a shared machine).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spark_engine::clock::SystemClock;
use spark_engine::config::{log_dir, Settings};
use spark_engine::Engine;
use spark_log_format::{LogConfig, LogReader, OsFs, ScanOptions};

use spark_test_support::server as common;

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

/// Environment variables for a server start.
type ServerEnv<'a> = [(&'a str, &'a str)];

/// User and system CPU seconds of this process so far (all threads).
fn cpu_seconds() -> (f64, f64) {
    // SAFETY: getrusage writes the struct it is given, nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(usage.ru_utime), secs(usage.ru_stime))
}

/// The one-minute load average (`/proc/loadavg`), or 0.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// `SPARK_BENCH_REPLAY_ONLY=N`: `Engine::open` of `data` without a
/// checkpoint, `rounds` times, each with its CPU seconds and the load.
fn replay_only(data: &Path, rounds: u32) {
    for (_, file) in spark_core::checkpoint::list(data) {
        let _ = std::fs::remove_file(file);
    }
    for round in 1..=rounds {
        let load = load_average();
        let (user, system) = cpu_seconds();
        let started = Instant::now();
        let engine = Engine::open(
            &open_settings(data, false),
            Arc::new(OsFs),
            Arc::new(SystemClock),
        )
        .expect("the engine opens");
        let elapsed = started.elapsed();
        let (user_after, system_after) = cpu_seconds();
        let seq = engine.head().seq;
        let digest = engine.read(|m| m.digest());
        drop(engine);
        let ops_per_s = seq as f64 / elapsed.as_secs_f64();
        println!(
            "replay round {round}: {seq} ops in {:.3} s, {:.2} M ops/s (target >= 3 M ops/s: {}), CPU {:.2} user + {:.2} system s, load {load:.1}, mirror digest {digest}",
            elapsed.as_secs_f64(),
            ops_per_s / 1e6,
            if ops_per_s >= 3e6 { "PASS" } else { "MISS" },
            user_after - user,
            system_after - system,
        );
    }
}

/// Starts the real server on `data` (the tests' [`common::ServerProcess`]:
/// it returns once the server printed its "listening" line), and returns
/// the time that took and the server's RSS then. Stops it after.
fn server_startup(data: &Path) -> (Duration, u64) {
    let (elapsed, rss, _) = server_startup_with(data, &[]);
    (elapsed, rss)
}

/// [`server_startup`] with `env` set for the server; also its user +
/// system CPU seconds until it listened (`/proc/PID/stat`).
fn server_startup_with(data: &Path, env: &[(&str, &str)]) -> (Duration, u64, f64) {
    let started = Instant::now();
    let server = common::ServerProcess::start_with_env(data, env);
    let elapsed = started.elapsed();
    let pid = server.child.id().to_string();
    let rss = rss_bytes(&pid);
    let cpu = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let fields: Vec<f64> = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .map(|f| f.parse().unwrap_or(0.0))
                .collect();
            Some((fields.get(11)? + fields.get(12)?) / 100.0)
        })
        .unwrap_or(0.0);
    server.terminate();
    (elapsed, rss, cpu)
}

/// The median of `values` (the middle one, or the mean of the two).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Settings for `data` with checkpoints on (`true`: loaded at open) or off.
fn open_settings(data: &Path, checkpoints: bool) -> Settings {
    let mut settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    if !checkpoints {
        settings.log.checkpoint_interval_ops = 0;
    }
    settings
}

/// `Engine::open` on `data`, timed; (time, head seq, digest).
fn timed_open(data: &Path, checkpoints: bool) -> (Duration, u64, String) {
    let started = Instant::now();
    let engine = Engine::open(
        &open_settings(data, checkpoints),
        Arc::new(OsFs),
        Arc::new(SystemClock),
    )
    .expect("the engine opens");
    let elapsed = started.elapsed();
    let seq = engine.head().seq;
    // The checkpoint worker stops with the engine (drop).
    let digest = engine.read(|m| m.digest());
    drop(engine);
    (elapsed, seq, digest)
}

/// Writes a checkpoint of `data` at its head (what the engine's worker
/// does); (time, file bytes).
fn write_checkpoint(data: &Path) -> (Duration, u64) {
    let started = Instant::now();
    let built = spark_core::checkpoint::build(
        &spark_log_format::OsFs,
        data,
        &log_dir(data),
        spark_log_format::DEFAULT_MAX_RECORD_BYTES,
        2,
        u64::MAX,
        &|| false,
    )
    .expect("the checkpoint is written");
    let bytes = built.map_or(0, |b| b.bytes);
    (started.elapsed(), bytes)
}

/// A log of `creates` creates then `tail` edits and deletes in `data`,
/// unless one is there.
fn ensure_log(data: &Path, creates: u64, tail: u64) {
    let log = log_dir(data);
    if LogReader::open(&log).map_or(true, |r| r.segments().is_empty()) {
        let started = Instant::now();
        eprintln!(
            "writing {creates} creates and {tail} edits/deletes into {}",
            log.display()
        );
        spark_core::synth::generate_with_tail(&log, creates, tail, LogConfig::default(), |_| {})
            .expect("the synthetic log is written");
        eprintln!("written in {:.1} s", started.elapsed().as_secs_f64());
    }
}

/// The history part: startup of creates + edits/deletes beside the creates
/// alone, each without and with a checkpoint.
fn history_figures(root: &Path) {
    let creates: u64 = std::env::var("SPARK_BENCH_HISTORY_CREATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    if creates == 0 {
        return;
    }
    let tail: u64 = std::env::var("SPARK_BENCH_HISTORY_TAIL_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9 * creates);
    let alone = root.join("creates");
    let history = root.join("history");
    ensure_log(&alone, creates, 0);
    ensure_log(&history, creates, tail);
    for data in [&alone, &history] {
        for (_, file) in spark_core::checkpoint::list(data) {
            let _ = std::fs::remove_file(file);
        }
    }
    // Side by side: both without checkpoints, then a checkpoint of each,
    // then both with.
    let (alone_plain, alone_seq, alone_digest) = timed_open(&alone, false);
    let (history_plain, history_seq, history_digest) = timed_open(&history, false);
    let (alone_write, alone_bytes) = write_checkpoint(&alone);
    let (history_write, history_bytes) = write_checkpoint(&history);
    let (alone_ckpt, _, alone_digest_ckpt) = timed_open(&alone, true);
    let (history_ckpt, _, history_digest_ckpt) = timed_open(&history, true);
    assert_eq!(
        alone_digest, alone_digest_ckpt,
        "a checkpoint changed the mirror"
    );
    assert_eq!(
        history_digest, history_digest_ckpt,
        "a checkpoint changed the mirror"
    );
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    println!();
    println!(
        "history: {creates} creates + {tail} edits/deletes ({history_seq} ops) beside the {alone_seq} creates alone"
    );
    println!("| log | `Engine::open` without checkpoint | checkpoint write (bytes) | `Engine::open` with checkpoint |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| creates alone | {:.2} s | {:.2} s ({:.0} MiB) | {:.2} s |",
        alone_plain.as_secs_f64(),
        alone_write.as_secs_f64(),
        alone_bytes as f64 / MIB,
        alone_ckpt.as_secs_f64()
    );
    println!(
        "| creates + edits/deletes | {:.2} s | {:.2} s ({:.0} MiB) | {:.2} s |",
        history_plain.as_secs_f64(),
        history_write.as_secs_f64(),
        history_bytes as f64 / MIB,
        history_ckpt.as_secs_f64()
    );
    let ratio = history_ckpt.as_secs_f64() / alone_plain.as_secs_f64();
    println!(
        "`Engine::open`, history with checkpoint / creates alone without: {ratio:.2}x (target <= 1.5x) {}",
        verdict(ratio <= 1.5)
    );
    println!(
        "`Engine::open`, history with checkpoint / creates alone with: {:.2}x (for reference)",
        history_ckpt.as_secs_f64() / alone_ckpt.as_secs_f64()
    );
    // One open per log moves by 2x with the machine's load: the real
    // server's starts, alternated, the medians compared.
    let starts: usize = std::env::var("SPARK_BENCH_HISTORY_STARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    if starts == 0 {
        return;
    }
    // No erasure during the starts (the synthetic deletes are long due):
    // the compactor would rewrite the logs the next start reads.
    let no_erasure = ("SPARK_RETENTION_ERASE_AFTER_MS", "1000000000000000");
    let off = [no_erasure, ("SPARK_LOG_CHECKPOINT_INTERVAL_OPS", "0")];
    let on = [no_erasure];
    let kinds: [(&str, &Path, &ServerEnv); 3] = [
        ("creates alone, without checkpoint", &alone, &off),
        ("creates alone, from its checkpoint", &alone, &on),
        (
            "creates + edits/deletes, from its checkpoint",
            &history,
            &on,
        ),
    ];
    let mut walls: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    let mut cpus: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for round in 0..starts {
        for (k, (_, data, env)) in kinds.iter().enumerate() {
            eprintln!("server start {} of {starts}: {} ...", round + 1, kinds[k].0);
            let (wall, _, cpu) = server_startup_with(data, env);
            walls[k].push(wall.as_secs_f64());
            cpus[k].push(cpu);
        }
    }
    println!();
    println!("server starts until listening, {starts} of each, alternated (medians; min..max):");
    println!("| start | wall | min..max | user + system CPU |");
    println!("| --- | ---: | ---: | ---: |");
    for (k, (name, _, _)) in kinds.iter().enumerate() {
        let w = &walls[k];
        println!(
            "| {name} | {:.2} s | {:.2}..{:.2} s | {:.2} s |",
            median(w.clone()),
            w.iter().copied().fold(f64::INFINITY, f64::min),
            w.iter().copied().fold(0.0, f64::max),
            median(cpus[k].clone())
        );
    }
    let history_wall = median(walls[2].clone());
    let alone_without = median(walls[0].clone());
    let alone_with = median(walls[1].clone());
    println!(
        "server start, history from its checkpoint / creates alone without: {:.2}x (target <= 1.5x) {}",
        history_wall / alone_without,
        verdict(history_wall <= 1.5 * alone_without)
    );
    println!(
        "server start, history from its checkpoint / creates alone from its checkpoint: {:.2}x (for reference)",
        history_wall / alone_with
    );
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
    if let Some(rounds) = std::env::var("SPARK_BENCH_REPLAY_ONLY")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        replay_only(&data, rounds);
        return;
    }
    if ops == 0 {
        history_figures(&data);
        return;
    }
    if LogReader::open(&log).map_or(true, |r| r.segments().is_empty()) {
        let started = Instant::now();
        eprintln!("writing {ops} moment creates into {}", log.display());
        spark_core::synth::generate(&log, ops, LogConfig::default(), |_| {})
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
    for (_, file) in spark_core::checkpoint::list(&data) {
        let _ = std::fs::remove_file(file);
    }
    let settings = open_settings(&data, false);
    let rss_before = rss_bytes("self");
    let started = Instant::now();
    let engine =
        Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).expect("the engine opens");
    let replay = started.elapsed();
    let rss_after = rss_bytes("self");
    let moments = engine.read(|mirror| mirror.moments.len() as u64);
    assert_eq!(engine.head().seq, records);
    drop(engine);

    // The same log from a checkpoint at its head.
    let (checkpoint_write, checkpoint_bytes) = write_checkpoint(&data);
    let (with_checkpoint, _, _) = timed_open(&data, true);

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
        "| `Engine::open` from a checkpoint at the head (written in {:.2} s, {:.0} MiB) | {:.2} s | < 4 s | {} |",
        checkpoint_write.as_secs_f64(),
        checkpoint_bytes as f64 / MIB,
        with_checkpoint.as_secs_f64(),
        verdict(with_checkpoint < Duration::from_secs(4))
    );
    println!(
        "| server startup until listening (from the checkpoint) | {:.2} s | < 4 s | {} |",
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
    history_figures(&data);
}
