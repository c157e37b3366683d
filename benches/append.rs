//! Append throughput with fsync on, at 1, 16 and 64 concurrent submitters:
//! the raw group-commit appender of `spark-log-format`, and the engine's
//! whole write path (sequencer, journal, fold) with durable moment creates.
//!
//! `cargo bench --bench append`. Each element is one durable op.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use spark_engine::clock::SystemClock;
use spark_engine::config::Settings;
use spark_engine::engine::{Command, CreateMoment};
use spark_engine::{Engine, Id};
use spark_log_format::{GroupCommitAppender, Log, LogConfig, OsFs};

const SUBMITTERS: [usize; 3] = [1, 16, 64];

/// A ~200-byte payload, like an encoded moment create.
fn payload() -> Vec<u8> {
    vec![0x5a; 200]
}

fn raw_appender(c: &mut Criterion) {
    let mut group = c.benchmark_group("log_append_fsync");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(1));
    for submitters in SUBMITTERS {
        group.bench_with_input(
            BenchmarkId::from_parameter(submitters),
            &submitters,
            |b, &n| {
                let dir = tempfile::tempdir().unwrap();
                let (log, _) = Log::open(dir.path(), LogConfig::default(), Arc::new(OsFs), |_| {
                    Ok::<(), ()>(())
                })
                .unwrap_or_else(|_| panic!("log opens"));
                let appender = Arc::new(GroupCommitAppender::spawn(log, 1024));
                b.iter_custom(|iters| {
                    let per_thread = iters.div_ceil(n as u64);
                    let start = Instant::now();
                    std::thread::scope(|s| {
                        for _ in 0..n {
                            let appender = Arc::clone(&appender);
                            s.spawn(move || {
                                for _ in 0..per_thread {
                                    appender.append(1, 1, 1, payload()).unwrap();
                                }
                            });
                        }
                    });
                    // Scale to the requested count (threads may do a few more).
                    start
                        .elapsed()
                        .mul_f64(iters as f64 / (per_thread * n as u64) as f64)
                });
            },
        );
    }
    group.finish();
}

fn engine_creates(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("engine_create_fsync");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(1));
    for submitters in SUBMITTERS {
        group.bench_with_input(
            BenchmarkId::from_parameter(submitters),
            &submitters,
            |b, &n| {
                let dir = tempfile::tempdir().unwrap();
                let settings = Settings {
                    data_dir: dir.path().to_owned(),
                    ..Settings::default()
                };
                let engine = Arc::new(
                    Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap(),
                );
                b.iter_custom(|iters| {
                    let per_task = iters.div_ceil(n as u64);
                    let start = Instant::now();
                    runtime.block_on(async {
                        let mut tasks = Vec::new();
                        for _ in 0..n {
                            let engine = Arc::clone(&engine);
                            tasks.push(tokio::spawn(async move {
                                for _ in 0..per_task {
                                    let command = Command::CreateMoment(CreateMoment {
                                        id: Some(Id::from_parts(1_767_225_600_000, rand::random())),
                                        request_id: Some(format!(
                                            "bench-{}",
                                            rand::random::<u64>()
                                        )),
                                        text: Some("Ausfahrt freihalten, auch nachts".into()),
                                        caption: Some("near the station".into()),
                                        lang: Some("de".into()),
                                        captured_at_ms: Some(1_767_225_600_000),
                                        device: "bench".into(),
                                    });
                                    engine.submit(command).await.unwrap();
                                }
                            }));
                        }
                        for t in tasks {
                            t.await.unwrap();
                        }
                    });
                    start
                        .elapsed()
                        .mul_f64(iters as f64 / (per_task * n as u64) as f64)
                });
                runtime.block_on(engine.shutdown());
            },
        );
    }
    group.finish();
}

criterion_group!(benches, raw_appender, engine_creates);
criterion_main!(benches);
