//! Replay throughput (ops/s and MB/s) over a log of one million moment
//! creates of about 200 bytes: the engine's startup replay (recovery, CRC,
//! chain, decode, fold) and, beside it, the raw read-plus-CRC scan of the
//! same files.
//!
//! `cargo bench --bench replay`. Set `SPARK_BENCH_REPLAY_OPS` for another size.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use spark_engine::clock::SystemClock;
use spark_engine::config::Settings;
use spark_engine::Engine;
use spark_log_format::{LogConfig, LogReader, OsFs, ScanOptions};

/// The same allocator as the server (mimalloc; see `src/main.rs`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn ops_wanted() -> u64 {
    std::env::var("SPARK_BENCH_REPLAY_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// Writes `count` synthetic moment creates into `<data>/log` (the same
/// generator as `spark-replay generate`); returns the bytes of the log.
fn generate(data: &Path, count: u64) -> u64 {
    let log = data.join("log");
    spark_core::synth::generate(&log, count, LogConfig::default(), |_| {})
        .expect("the synthetic log is written");
    std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

fn replay(c: &mut Criterion) {
    let count = ops_wanted();
    let dir = tempfile::tempdir().unwrap();
    let bytes = generate(dir.path(), count);
    eprintln!("replay bench: {count} ops, {bytes} bytes of log");
    let settings = Settings {
        data_dir: dir.path().to_owned(),
        ..Settings::default()
    };

    let mut group = c.benchmark_group("replay");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Elements(count));
    group.bench_function("engine_startup_ops", |b| {
        b.iter(|| {
            let engine = Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
            assert_eq!(engine.head().seq, count);
        })
    });
    group.throughput(Throughput::Bytes(bytes));
    group.bench_function("engine_startup_bytes", |b| {
        b.iter(|| {
            let engine = Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
            assert_eq!(engine.head().seq, count);
        })
    });
    group.bench_function("raw_read_crc_bytes", |b| {
        b.iter(|| {
            let reader = LogReader::open(&dir.path().join("log")).unwrap();
            let options = ScanOptions {
                verify_chain: false,
                ..ScanOptions::default()
            };
            let report = reader
                .scan(options, |_, _| ControlFlow::Continue(()))
                .unwrap();
            assert_eq!(report.records, count);
        })
    });
    group.finish();
}

criterion_group!(benches, replay);
criterion_main!(benches);
