//! Read replica figures (issue 16 item 6, docs/performance/replicas.md), against a local `weed mini` with the release `spark-engine`
//! (`SPARK_ENGINE_BIN`, default `target/release/spark-engine`):
//!
//! 1. replica lag under the 64-connection create load: a writer with the
//!    default `ship_interval_ms` (1000) and a replica with the default
//!    `poll_interval_ms` (500); a monitor samples both heads every 10 ms,
//!    and the lag of a seq is the time from the writer first showing it to
//!    the replica first showing it (p50, p99, max);
//! 2. reads/s served by one replica: `SPARK_BENCH_READERS` (default 64)
//!    keep-alive clients GET `/api/moments/{id}` of random ids for 5 s;
//! 3. replica startup from a large archive: `SPARK_BENCH_REPLICA_OPS`
//!    (default 6,000,000, about 1 GiB) generated creates shipped with the
//!    engine's own shipper (with the checkpoint the engine writes at the
//!    head), then the time until a replica listens: on an empty cache with
//!    checkpoints off (the whole log folded) and on (from the archived
//!    checkpoint), interleaved, two rounds, then again on its cache.
//!
//! `SPARK_WEED=... cargo bench -p spark-replay-tools --bench replica`;
//! `SPARK_BENCH_PARTS=lag,reads,startup` picks parts. Without `weed` it
//! prints `skipped: ...`. No figure is asserted.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use spark_log_format::format::DEFAULT_SEGMENT_SIZE_BYTES;

use spark_test_support::s3::*;
use spark_test_support::weed::*;

fn engine_binary() -> PathBuf {
    std::env::var_os("SPARK_ENGINE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/spark-engine")
        })
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn seq_of(client: &reqwest::blocking::Client, base: &str) -> u64 {
    let head: Value = client
        .get(format!("{base}/api/log/head"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    head["seq"].as_u64().unwrap()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ulid(n: u64) -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    spark_engine::Id::from_parts(ms, u128::from(n) * 7919 + 1).to_string()
}

/// Part 1 and 2: a writer under 64 connections, a replica following.
fn lag_and_reads(weed: &Weed, engine: &Path, parts: &str) {
    let work = tempfile::tempdir().unwrap();
    let url = unique_prefix("bench-replica");
    let writer_toml = work.path().join("writer.toml");
    std::fs::write(
        &writer_toml,
        format!(
            "[archive]\nurl = \"{url}\"\nendpoint = \"{}\"\n",
            weed.endpoint()
        ),
    )
    .unwrap();
    let replica_toml = work.path().join("replica.toml");
    std::fs::write(&replica_toml, "[replica]\n").unwrap();
    let writer = EngineProcess::start(engine, &work.path().join("writer"), &writer_toml);
    let http = client();
    // One moment so the replica has something to start from.
    http.post(format!("{}/api/moments", writer.base))
        .json(&json!({"text": "first"}))
        .send()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let replica = EngineProcess::start_args(
        engine,
        &["replica", "--from", &url, "--endpoint", &weed.endpoint()],
        &work.path().join("replica"),
        &replica_toml,
    );
    let ids = Arc::new(Mutex::new(Vec::new()));
    if parts.contains("lag") {
        let connections = 64;
        let seconds = 10;
        let stop = Arc::new(AtomicBool::new(false));
        let created = Arc::new(AtomicU64::new(0));
        let loaders: Vec<_> = (0..connections)
            .map(|c| {
                let (stop, created, ids) = (stop.clone(), created.clone(), ids.clone());
                let base = writer.base.clone();
                std::thread::spawn(move || {
                    let http = client();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let id = ulid(c * 10_000_000 + n);
                        let r = http
                            .post(format!("{base}/api/moments"))
                            .json(&json!({"id": id, "client_request_id": format!("b-{c}-{n}"),
                                          "text": "Notausgang freihalten", "lang": "de"}))
                            .send()
                            .unwrap();
                        assert_eq!(r.status().as_u16(), 201);
                        created.fetch_add(1, Ordering::Relaxed);
                        if n.is_multiple_of(16) {
                            ids.lock().unwrap().push(id);
                        }
                    }
                })
            })
            .collect();
        // The monitor: (time, writer seq) and (time, replica seq) samples.
        let started = Instant::now();
        let mut writer_samples = Vec::new();
        let mut replica_samples = Vec::new();
        while started.elapsed() < Duration::from_secs(seconds) {
            let t = started.elapsed().as_secs_f64();
            writer_samples.push((t, seq_of(&http, &writer.base)));
            let t = started.elapsed().as_secs_f64();
            replica_samples.push((t, seq_of(&http, &replica.base)));
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        for loader in loaders {
            loader.join().unwrap();
        }
        let creates = created.load(Ordering::Relaxed);
        // Let the replica catch up with the last samples.
        let end = seq_of(&http, &writer.base);
        let deadline = Instant::now() + Duration::from_secs(30);
        while seq_of(&http, &replica.base) < end && Instant::now() < deadline {
            let t = started.elapsed().as_secs_f64();
            replica_samples.push((t, seq_of(&http, &replica.base)));
            std::thread::sleep(Duration::from_millis(10));
        }
        let t = started.elapsed().as_secs_f64();
        replica_samples.push((t, seq_of(&http, &replica.base)));
        let mut lags: Vec<f64> = writer_samples
            .iter()
            .filter_map(|&(tw, seq)| {
                replica_samples
                    .iter()
                    .find(|&&(tr, rs)| tr >= tw && rs >= seq)
                    .map(|&(tr, _)| tr - tw)
            })
            .collect();
        lags.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "replica lag under {connections} connections of creates for {seconds} s \
             ({creates} creates, {:.0}/s; ship_interval_ms 1000, poll_interval_ms 500): \
             p50 {:.2} s, p99 {:.2} s, max {:.2} s over {} samples (goal: p99 under 2 s)",
            creates as f64 / seconds as f64,
            percentile(&lags, 0.5),
            percentile(&lags, 0.99),
            lags.last().unwrap(),
            lags.len()
        );
    }
    if parts.contains("reads") {
        let mut ids = ids.lock().unwrap().clone();
        if ids.is_empty() {
            for n in 0..1000 {
                let id = ulid(n);
                http.post(format!("{}/api/moments", writer.base))
                    .json(&json!({"id": id, "text": "to read"}))
                    .send()
                    .unwrap();
                ids.push(id);
            }
        }
        let end = seq_of(&http, &writer.base);
        while seq_of(&http, &replica.base) < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        let ids = Arc::new(ids);
        let readers: u64 = std::env::var("SPARK_BENCH_READERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64);
        let seconds = 5.0;
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..readers)
            .map(|r| {
                let (stop, reads, ids) = (stop.clone(), reads.clone(), ids.clone());
                let base = replica.base.clone();
                std::thread::spawn(move || {
                    let http = client();
                    let mut i = r as usize * 7919;
                    while !stop.load(Ordering::Relaxed) {
                        i = (i + 104_729) % ids.len();
                        let r = http
                            .get(format!("{base}/api/moments/{}", ids[i]))
                            .send()
                            .unwrap();
                        assert_eq!(r.status().as_u16(), 200);
                        r.bytes().unwrap();
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        println!(
            "reads served by one replica: {:.0} GET /api/moments/{{id}} per s ({readers} \
             keep-alive clients on the same 2 cores, {} moments)",
            reads.load(Ordering::Relaxed) as f64 / seconds,
            ids.len()
        );
    }
    drop(replica);
    drop(writer);
}

/// Part 3: replica startup from a large archive, without and with its cache.
fn startup(weed: &Weed, engine: &Path) {
    let ops: u64 = std::env::var("SPARK_BENCH_REPLICA_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6_000_000);
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("original");
    let (code, out, err) = replay(
        &[
            "generate",
            "--json",
            "--data",
            data.to_str().unwrap(),
            "--ops",
            &ops.to_string(),
        ],
        "",
    );
    assert_eq!(code, 0, "{out}{err}");
    let log_bytes = json(&out)["log_bytes"].as_u64().unwrap();
    let url = unique_prefix("bench-replica-start");
    let endpoint = weed.endpoint();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let (engine, shipping) =
            open_archived_with(&data, &url, &endpoint, DEFAULT_SEGMENT_SIZE_BYTES).await;
        wait_shipped(&engine, &shipping, Duration::from_secs(1800)).await;
        if ops
            >= spark_engine::config::Settings::default()
                .log
                .checkpoint_interval_ops
        {
            // The checkpoint the engine writes at the head, shipped.
            wait_checkpoint_listed(&url, &endpoint, ops).await;
        }
        shipping.stop().await;
        engine.shutdown().await;
    });
    // With checkpoints off (`log.checkpoint_interval_ops = 0`) a replica
    // neither installs the archived checkpoint nor loads one: the whole
    // log is folded. Interleaved with the default (on), then a restart on
    // the last cache.
    let without = work.path().join("replica-without.toml");
    std::fs::write(
        &without,
        "[log]\ncheckpoint_interval_ops = 0\n\n[replica]\n",
    )
    .unwrap();
    let with = work.path().join("replica.toml");
    std::fs::write(&with, "[replica]\n").unwrap();
    let runs = [
        (
            "an empty cache, checkpoints off (the whole log folded)",
            &without,
            0,
        ),
        ("an empty cache, from the archived checkpoint", &with, 1),
        (
            "an empty cache, checkpoints off (the whole log folded)",
            &without,
            2,
        ),
        ("an empty cache, from the archived checkpoint", &with, 3),
        ("its cache (from its own checkpoint)", &with, 3),
    ];
    for (run, replica_toml, n) in runs {
        let cache = work.path().join(format!("replica-{n}"));
        let started = Instant::now();
        let mut replica = EngineProcess::start_args(
            engine,
            &["replica", "--from", &url, "--endpoint", &endpoint],
            &cache,
            replica_toml,
        );
        let elapsed = started.elapsed().as_secs_f64();
        assert_eq!(seq_of(&client(), &replica.base), ops);
        println!(
            "replica startup from an archive of {ops} ops ({:.0} MiB of log) on {run}: \
             {elapsed:.1} s until it listens",
            log_bytes as f64 / 1024.0 / 1024.0
        );
        replica.terminate();
        if n < 3 {
            std::fs::remove_dir_all(&cache).unwrap();
        }
    }
}

fn main() {
    let Some(weed_bin) = run_or_skip("bench replica") else {
        return;
    };
    let engine = engine_binary();
    if !engine.is_file() {
        eprintln!(
            "skipped: bench replica: {} is not built (cargo build --release --bin spark-engine)",
            engine.display()
        );
        return;
    }
    set_credentials();
    let parts = std::env::var("SPARK_BENCH_PARTS").unwrap_or_else(|_| "lag,reads,startup".into());
    let weed = Weed::start(weed_bin);
    if parts.contains("lag") || parts.contains("reads") {
        lag_and_reads(&weed, &engine, &parts);
    }
    if parts.contains("startup") {
        startup(&weed, &engine);
    }
}
