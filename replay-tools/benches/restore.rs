//! Restore time of a ~1 GiB log from a local `weed mini` (issue 15 item 8:
//! "restore time of a 1 GiB log, goal: under 60 s here").
//!
//! `cargo bench -p spark-replay-tools --bench restore`: writes
//! `SPARK_BENCH_RESTORE_OPS` (default 6,000,000, about 1.0 GiB) synthetic
//! moment creates (then `SPARK_BENCH_RESTORE_EDITS` edits and deletes,
//! default 0) with `spark-replay generate`, ships them with the
//! engine's own shipper (an in-process engine with `[archive]` on a `weed
//! mini` of its own, 64 MiB segments), then times `spark-replay restore
//! --json` (the release binary) into an empty directory and checks its
//! digest against `spark-replay rebuild` on the original, side by side
//! from the archived checkpoint (the engine's checkpoint worker writes one
//! at the head and the shipper ships it) and with `--no-checkpoint`
//! (the whole log folded), interleaved, two rounds each, then times
//! `spark-replay verify` on the result (the share of restore's own full
//! check: decoder, chain and fold). Needs `weed`
//! (`SPARK_WEED` or `PATH`); without it the bench prints `skipped: ...`.
//! Everything lives in one temporary directory (about 3 GiB).

use std::time::{Duration, Instant};

use spark_log_format::format::DEFAULT_SEGMENT_SIZE_BYTES;

use spark_test_support::s3::*;
use spark_test_support::weed::*;

const MIB: f64 = 1024.0 * 1024.0;

fn main() {
    let Some(binary) = run_or_skip("bench restore") else {
        return;
    };
    let ops: u64 = std::env::var("SPARK_BENCH_RESTORE_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6_000_000);
    // `SPARK_BENCH_RESTORE_EDITS`: edits and deletes after the creates
    // (default 0), a log whose history outgrows its live state.
    let edits: u64 = std::env::var("SPARK_BENCH_RESTORE_EDITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    set_credentials();
    let work = tempfile::tempdir().expect("a temporary directory");
    let data = work.path().join("original");
    let data_arg = data.to_str().unwrap().to_owned();

    let started = Instant::now();
    let (code, out, err) = replay(
        &[
            "generate",
            "--json",
            "--data",
            &data_arg,
            "--ops",
            &ops.to_string(),
            "--edits",
            &edits.to_string(),
        ],
        "",
    );
    assert_eq!(code, 0, "{out}{err}");
    let log_bytes = json(&out)["log_bytes"].as_u64().unwrap();
    eprintln!(
        "generated {ops} creates and {edits} edits and deletes, {:.0} MiB of log, in {:.1} s",
        log_bytes as f64 / MIB,
        started.elapsed().as_secs_f64()
    );
    let (seq, digest) = digest_of(&data, None);

    let weed = Weed::start(binary);
    let endpoint = weed.endpoint();
    let url = unique_prefix("bench-restore");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let started = Instant::now();
    runtime.block_on(async {
        let (engine, shipping) =
            open_archived_with(&data, &url, &endpoint, DEFAULT_SEGMENT_SIZE_BYTES).await;
        wait_shipped(&engine, &shipping, Duration::from_secs(1800)).await;
        // The engine's checkpoint worker writes one at the head (the log
        // holds more than `log.checkpoint_interval_ops` ops past none);
        // the shipper ships it and a manifest lists it.
        if seq
            >= spark_engine::config::Settings::default()
                .log
                .checkpoint_interval_ops
        {
            wait_checkpoint_listed(&url, &endpoint, seq).await;
        }
        shipping.stop().await;
        engine.shutdown().await;
    });
    eprintln!(
        "shipped (engine start and ship) in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // Restore with the archived checkpoint (the default) and without it
    // (`--no-checkpoint`: the whole log folded), interleaved, two rounds
    // each: the same fetch and checks, the fold differs.
    let mut restored = work.path().join("restored");
    for round in 0..4 {
        let with_checkpoint = round % 2 == 1;
        let dir = work.path().join(format!("restored-{round}"));
        let extra: &[&str] = if with_checkpoint {
            &[]
        } else {
            &["--no-checkpoint"]
        };
        let started = Instant::now();
        let (code, out, err) = restore(&url, &dir, &endpoint, extra);
        let elapsed = started.elapsed().as_secs_f64();
        assert_eq!(code, 0, "{out}{err}");
        let summary = json(&out);
        assert_eq!(summary["seq"], seq, "{summary}");
        assert_eq!(summary["digest"], digest.as_str(), "{summary}");
        let object_bytes = summary["object_bytes"].as_u64().unwrap() as f64;
        println!(
            "restore of {seq} ops, {:.0} MiB in {} objects from weed mini, {}: \
             {elapsed:.1} s, {:.0} MiB/s, {:.2} M ops/s, {} ops folded (goal: under 60 s)",
            object_bytes / MIB,
            summary["objects"],
            match summary["checkpoint"]["seq"].as_u64() {
                Some(at) => format!("from the archived checkpoint at seq {at}"),
                None => "the whole log folded (--no-checkpoint)".to_owned(),
            },
            object_bytes / MIB / elapsed,
            seq as f64 / elapsed / 1e6,
            summary["ops_folded"]
        );
        if round < 3 {
            std::fs::remove_dir_all(&dir).unwrap();
        } else {
            restored = dir;
        }
    }
    // The share of the full check (decoder, chain, fold), which restore
    // runs over what it wrote: the same work as `verify` on the result.
    let started = Instant::now();
    let (code, out, err) = replay(&["verify", "--data", restored.to_str().unwrap()], "");
    assert_eq!(code, 0, "{out}{err}");
    println!(
        "  of which the full check of the result (as `spark-replay verify`): {:.1} s",
        started.elapsed().as_secs_f64()
    );
    drop(weed);
}
