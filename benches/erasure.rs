//! Forgetting, measured (SPEC section 13): `cargo bench --bench erasure`.
//!
//! On one engine in this process (the real log on disk, the real
//! compactor of `spark_engine::retention`):
//!
//! 1. **Sizes and throughput**: `SPARK_ERASURE_MOMENTS` moments (default
//!    200,000) with a text and a caption are created, every other one
//!    deleted, and one compaction pass erases them all: the log's size
//!    before and after, and the pass's rate (MB of segment files written
//!    per second of the pass).
//! 2. **Creates while a compaction runs**: `CLIENTS` tasks create moments
//!    for `PHASE_SECS` seconds, in rounds that alternate between no
//!    compaction and passes running back to back (each round deletes a
//!    fresh batch first, so every pass has work and rewrites the log from
//!    the batch's segment on): p50 and p99 of a create's latency, side by
//!    side in one run (the machine is shared: compare the ratios).
//! 3. **Delete to gone**: with `check_interval_ms` 1,000 and
//!    `erase_after_ms` 0, the time from a delete's answer to its moment
//!    answering erased, over a few deletes.
//!
//! `SPARK_ERASURE_PACE_BYTES_PER_S` sets the pace of parts 2 and 3 (default
//! the server's, `[retention] compaction_write_bytes_per_s`; 0 unpaced).
//!
//! The archive's figures (its size before and after, delete to gone in
//! the archive) wait for the deletion of superseded archive objects (the
//! archive follows a compaction, but keeps the objects it held before).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spark_core::command::{Command, CreateMoment, DeleteMoment};
use spark_core::ids::Id;
use spark_engine::clock::{Clock, SystemClock};
use spark_engine::config::Settings;
use spark_engine::engine::{Engine, Outcome};
use spark_engine::media::MediaStore;
use spark_engine::retention::Compactor;
use spark_log_format::{Fs, OsFs};

/// Concurrent creators in part 2.
const CLIENTS: usize = 32;
/// Seconds of one round of part 2.
const PHASE_SECS: u64 = 3;
/// Rounds of part 2 (each: one without, one with compaction).
const ROUNDS: usize = 6;

fn moments() -> usize {
    std::env::var("SPARK_ERASURE_MOMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000)
}

/// Bytes of the log's segment files.
fn log_bytes(data: &Path) -> u64 {
    std::fs::read_dir(data.join("log"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "seg"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// The bench's settings: 8 MiB segments, no checkpoints, erasure at the
/// next check every `check_interval_ms`. `sizes` (part 1) writes whole
/// files, so that sizes compare (no zero fill ahead), and compacts unpaced
/// (the pass's full rate); otherwise the log and the compactor run as the
/// server's defaults run them (zero fill ahead, the default pace).
fn settings(data: &Path, check_interval_ms: u64, sizes: bool) -> Settings {
    let mut settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    if sizes {
        settings.log.preallocate_bytes = 0;
        settings.retention.compaction_write_bytes_per_s = 0;
    } else if let Some(pace) = std::env::var("SPARK_ERASURE_PACE_BYTES_PER_S")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        settings.retention.compaction_write_bytes_per_s = pace;
    }
    settings.log.segment_size_bytes = 8 << 20;
    settings.log.disk_reserve_bytes = 0;
    settings.log.checkpoint_interval_ops = 0;
    settings.retention.erase_after_ms = 0;
    settings.retention.check_interval_ms = check_interval_ms;
    settings
}

/// Opens the engine on `settings` (off the runtime's threads).
async fn open(settings: &Settings, fs: &Arc<dyn Fs>) -> Arc<Engine> {
    let settings = settings.clone();
    let fs = Arc::clone(fs);
    Arc::new(
        tokio::task::spawn_blocking(move || {
            Engine::open(&settings, fs, Arc::new(SystemClock) as Arc<dyn Clock>)
        })
        .await
        .unwrap()
        .unwrap(),
    )
}

fn create(n: usize) -> Command {
    Command::CreateMoment(CreateMoment {
        id: Some(Id::from_parts(SystemClock.now_ms(), rand::random::<u128>())),
        request_id: Some(format!("bench-{n}-{}", rand::random::<u64>())),
        text: Some(format!("Ausfahrt Tag und Nacht freihalten {n:08}")),
        caption: Some(format!("the gate by the bakery, photo {n:08}")),
        lang: Some("de".into()),
        captured_at_ms: None,
        device: "bench".into(),
    })
}

fn delete(id: Id) -> Command {
    Command::DeleteMoment(DeleteMoment {
        id,
        request_id: None,
        if_match: None,
        device: "bench".into(),
    })
}

fn created_id(outcome: Outcome) -> Id {
    match outcome {
        Outcome::MomentCreated { moment, .. } => moment.id,
        other => panic!("not a create: {other:?}"),
    }
}

/// Creates `count` moments from `CLIENTS` tasks; returns their ids.
async fn fill(engine: &Arc<Engine>, count: usize, offset: usize) -> Vec<Id> {
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let engine = Arc::clone(engine);
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            let mut n = offset + client;
            while n < offset + count {
                ids.push(created_id(engine.submit(create(n)).await.unwrap()));
                n += CLIENTS;
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.extend(task.await.unwrap());
    }
    ids
}

async fn delete_all(engine: &Arc<Engine>, ids: Vec<Id>) {
    let mut tasks = Vec::new();
    for chunk in ids.chunks(ids.len().div_ceil(CLIENTS).max(1)) {
        let engine = Arc::clone(engine);
        let chunk = chunk.to_vec();
        tasks.push(tokio::spawn(async move {
            for id in chunk {
                engine.submit(delete(id)).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

fn compactor(settings: &Settings, engine: &Arc<Engine>, fs: &Arc<dyn Fs>) -> Compactor {
    let media = MediaStore::open(&settings.data_dir, Arc::clone(fs)).unwrap();
    Compactor::new(
        settings,
        Arc::clone(engine),
        media,
        Arc::clone(fs),
        Arc::new(SystemClock),
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at]
}

/// Creates from `CLIENTS` tasks for `PHASE_SECS`; the latencies, sorted.
async fn load(engine: &Arc<Engine>, offset: usize) -> Vec<Duration> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let engine = Arc::clone(engine);
        let stop = Arc::clone(&stop);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = offset + client * 1_000_000;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                engine.submit(create(n)).await.unwrap();
                latencies.push(started.elapsed());
                n += 1;
            }
            latencies
        }));
    }
    tokio::time::sleep(Duration::from_secs(PHASE_SECS)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort_unstable();
    all
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());
}

async fn run() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sizing = settings(&data, 1_000, true);
    let fs: Arc<dyn Fs> = Arc::new(OsFs);
    let engine = open(&sizing, &fs).await;
    let shared = Arc::new(compactor(&sizing, &engine, &fs));
    let pass = |compactor: &Arc<Compactor>| {
        let compactor = Arc::clone(compactor);
        let handle = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || handle.block_on(compactor.pass()))
    };

    // 1. Sizes and throughput.
    let count = moments();
    let ids = fill(&engine, count, 0).await;
    let deleted: Vec<Id> = ids.iter().copied().step_by(2).collect();
    delete_all(&engine, deleted.clone()).await;
    let before = log_bytes(&data);
    let started = Instant::now();
    let report = pass(&shared).await.unwrap().unwrap();
    let took = started.elapsed();
    let after = log_bytes(&data);
    assert_eq!(
        report.erased.len(),
        deleted.len(),
        "every deleted moment erased"
    );
    println!(
        "erasure bench, {count} moments created, {} deleted (every other), segments of 8 MiB",
        deleted.len()
    );
    println!(
        "log: {:.1} MB before, {:.1} MB after ({:+.1} %); one unpaced pass rewrote {} segments, {:.1} MB written in {:.2} s: {:.0} MB/s",
        before as f64 / 1e6,
        after as f64 / 1e6,
        (after as f64 / before as f64 - 1.0) * 100.0,
        report.segments_rewritten,
        report.bytes_written as f64 / 1e6,
        took.as_secs_f64(),
        report.bytes_written as f64 / 1e6 / took.as_secs_f64()
    );

    // 2. Creates with and without compaction, side by side, on the
    // server's defaults: the same log reopened with zero fill ahead, and
    // the compactor's writes at the default pace.
    engine.shutdown().await;
    drop(shared);
    drop(engine);
    let settings = settings(&data, 1_000, false);
    let engine = open(&settings, &fs).await;
    let shared = Arc::new(compactor(&settings, &engine, &fs));
    let mut without = Vec::new();
    let mut with = Vec::new();
    let (mut passes, mut passed_bytes, mut passing_time) = (0, 0, Duration::ZERO);
    for round in 0..ROUNDS {
        without.extend(load(&engine, (round * 2 + 1) * 100_000_000).await);
        // A fresh batch to erase: every pass of this round has work.
        let batch = fill(&engine, 2_000, (round * 2 + 2) * 100_000_000).await;
        delete_all(&engine, batch).await;
        let stop = Arc::new(AtomicBool::new(false));
        let passing = {
            let stop = Arc::clone(&stop);
            let compactor = Arc::clone(&shared);
            tokio::spawn(async move {
                let (mut n, mut bytes, mut busy) = (0, 0, Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    // As the server runs it: on a thread of its own, niced.
                    let started = Instant::now();
                    let report = compactor.pass_in_background().await.unwrap().unwrap();
                    if report.erased.is_empty() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    } else {
                        n += 1;
                        bytes += report.bytes_written;
                        busy += started.elapsed();
                    }
                }
                (n, bytes, busy)
            })
        };
        // Deletes keep coming during the phase, so passes keep running.
        let deleting = {
            let engine = Arc::clone(&engine);
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut n = (round * 2 + 3) * 100_000_000;
                while !stop.load(Ordering::Relaxed) {
                    let id = created_id(engine.submit(create(n)).await.unwrap());
                    engine.submit(delete(id)).await.unwrap();
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        with.extend(load(&engine, (round * 2 + 4) * 100_000_000).await);
        stop.store(true, Ordering::Relaxed);
        deleting.await.unwrap();
        let (n, bytes, busy) = passing.await.unwrap();
        passes += n;
        passed_bytes += bytes;
        passing_time += busy;
    }
    without.sort_unstable();
    with.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (p50_without, p99_without) = (percentile(&without, 0.5), percentile(&without, 0.99));
    let (p50_with, p99_with) = (percentile(&with, 0.5), percentile(&with, 0.99));
    println!(
        "creates, {CLIENTS} clients, {ROUNDS} rounds of {PHASE_SECS} s each way: without compaction {} creates, p50 {:.2} ms, p99 {:.2} ms; while {passes} passes ran {} creates, p50 {:.2} ms, p99 {:.2} ms; p99 ratio {:.2} (goal: at most 1.10)",
        without.len(),
        ms(p50_without),
        ms(p99_without),
        with.len(),
        ms(p50_with),
        ms(p99_with),
        ms(p99_with) / ms(p99_without)
    );
    println!(
        "passes during the creates (zero fill ahead {} bytes, compaction paced at {} bytes/s in {} KiB steps): {:.1} MB written in {:.1} s of passes: {:.1} MB/s",
        settings.log.preallocate_bytes,
        settings.retention.compaction_write_bytes_per_s,
        spark_log_format::WritePace::DEFAULT_STEP_BYTES / 1024,
        passed_bytes as f64 / 1e6,
        passing_time.as_secs_f64(),
        passed_bytes as f64 / 1e6 / passing_time.as_secs_f64().max(1e-9)
    );

    // 3. Delete to gone, with the compactor running as the server runs it.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(compactor(&settings, &engine, &fs).run(
        Duration::from_millis(settings.retention.check_interval_ms),
        stop_rx,
    ));
    let mut gone = Vec::new();
    for n in 0..5 {
        let id = created_id(engine.submit(create(900_000_000 + n)).await.unwrap());
        engine.submit(delete(id)).await.unwrap();
        let deleted_at = Instant::now();
        while !engine.read(|m| m.is_erased(id)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        gone.push(deleted_at.elapsed());
    }
    stop_tx.send_replace(true);
    running.await.unwrap();
    gone.sort_unstable();
    println!(
        "delete to gone (erase_after_ms 0, check_interval_ms {}): min {:.0} ms, median {:.0} ms, max {:.0} ms over {} deletes",
        settings.retention.check_interval_ms,
        ms(gone[0]),
        ms(gone[gone.len() / 2]),
        ms(gone[gone.len() - 1]),
        gone.len()
    );
    engine.shutdown().await;
}
