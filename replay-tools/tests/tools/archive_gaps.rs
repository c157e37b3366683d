//! A gap, a damaged or a forged manifest or epoch object in an archive
//! (ARCHIVE.md "Gaps"), with the real
//! `spark-engine` processes and `spark-replay` against a `weed mini` of
//! the test's own ([`crate::weed`]):
//!
//! - [`damage_at_a_random_point_is_refused_and_named_by_every_reader`]
//!   (randomized, seed printed on failure, `SPARK_GAPS_SEED=N` replays
//!   one): a writer (`async` or `sync` mode) ships a random number of
//!   creates while a replica follows; then one fault at a random point of
//!   that history: a manifest deleted below the latest, the latest or the
//!   one before it damaged, a well-formed manifest of the writer's epoch
//!   forged after the latest that does not extend it (it rolls back, or
//!   its chain does not go on), a later manifest forged with the one
//!   before it missing, the epoch object deleted or damaged. Every reader
//!   refuses and names the key: `restore` and `verify --from` (exit 1),
//!   `audit archive` (exit 1), the replica (a restart on its cache
//!   refuses to start; a fault after what it applied is named in its
//!   `/readyz`, `503`), and the writer restarted refuses to start. Before
//!   the fix a deleted manifest rolled every one of them back silently.
//! - [`a_replica_of_a_prefix_with_no_manifest_is_not_ready`]: `503` naming
//!   the prefix and a WARN at start, until a writer stores a first
//!   manifest; then ready.
//!
//! Without `weed` (or the `spark-engine` binary) the tests print
//! `skipped: ...`; `SPARK_REQUIRE_S3=1` makes them fail instead.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutPayload};
use rand::{Rng, SeedableRng};
use serde_json::json;
use spark_archive::layout::{epoch_key, manifest_key, Manifest};
use spark_archive::ArchiveStore;

use crate::s3_common::{
    engine_command, engine_or_skip, replay, set_credentials, unique_prefix, write_archive_config,
    EngineProcess,
};
use crate::weed::{raw_store, Weed};
use spark_test_support::replica::{client, get, replica_config, start_replica, wait_ready};

/// One fault the randomized test puts into a live history.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Manifest `k` deleted, `k` below the latest.
    DeleteManifest,
    /// The latest manifest, or the one before it, with a flipped byte.
    DamageManifest,
    /// Manifest N+1 of the writer's epoch, dropping N's last entry.
    ForgeRollback,
    /// Manifest N+1 of the writer's epoch, N's entries with another chain.
    ForgeChain,
    /// Manifest N+2 (N's entries), N+1 missing.
    ForgeAfterGap,
    /// `epoch/1` deleted.
    DeleteEpoch,
    /// `epoch/1` with a flipped byte.
    DamageEpoch,
}

const FAULTS: [Fault; 7] = [
    Fault::DeleteManifest,
    Fault::DamageManifest,
    Fault::ForgeRollback,
    Fault::ForgeChain,
    Fault::ForgeAfterGap,
    Fault::DeleteEpoch,
    Fault::DamageEpoch,
];

/// Prints the seed when the test fails, so that `SPARK_GAPS_SEED` replays
/// the run.
struct SeedOnFailure(u64, String);

impl Drop for SeedOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "damage_at_a_random_point: failed with SPARK_GAPS_SEED={} ({})",
                self.0, self.1
            );
        }
    }
}

/// Creates `count` moments over HTTP (each its own batch).
fn create_moments(http: &reqwest::blocking::Client, base: &str, from: u64, count: u64) {
    for n in from..from + count {
        let ms = 1_767_225_600_000 + n;
        let id = spark_engine::Id::from_parts(ms, u128::from(n) * 7919 + 13).to_string();
        let r = http
            .post(format!("{base}/api/moments"))
            .json(&json!({"id": id, "client_request_id": format!("g-{n}"),
                          "text": format!("moment {n} with words to fill small segments"),
                          "lang": "de"}))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
    }
}

/// `spark-engine ARGS` on `data` that must refuse to start: waits for its
/// exit (up to 60 s) and returns its stderr; panics if it serves.
fn refused_start(engine: &Path, args: &[&str], data: &Path, config: &Path) -> String {
    let log = data.with_extension("refused.log");
    let mut child = engine_command(engine, args, data, config)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(line) = rx.try_recv() {
            if line.contains("http://") {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "spark-engine {args:?} started ({line}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            assert!(!status.success(), "spark-engine {args:?} exited 0");
            return std::fs::read_to_string(&log).unwrap();
        }
        assert!(Instant::now() < deadline, "spark-engine {args:?} hangs");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the writer's archive holds its head and the replica serves
/// it.
fn wait_caught_up(http: &reqwest::blocking::Client, writer: &str, replica: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let w: serde_json::Value =
            serde_json::from_slice(&get(http, &format!("{writer}/api/log/head")).2).unwrap();
        let r: serde_json::Value =
            serde_json::from_slice(&get(http, &format!("{replica}/api/log/head")).2).unwrap();
        if w["seq"] == w["archived_seq"] && r["seq"] == w["seq"] {
            return;
        }
        assert!(Instant::now() < deadline, "not caught up: {w} {r}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Flips the last byte of the object under `key`.
async fn flip_last_byte(raw: &object_store::aws::AmazonS3, key: &str) {
    let path = StorePath::from(key);
    let mut bytes = raw
        .get(&path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    *bytes.last_mut().unwrap() ^= 0x20;
    raw.put(&path, PutPayload::from(bytes)).await.unwrap();
}

/// Puts `fault` into the archive at `prefix` whose latest manifest is
/// `latest`; returns the key every reader must name.
async fn put_fault(
    raw: &object_store::aws::AmazonS3,
    prefix: &str,
    latest: &Manifest,
    fault: Fault,
    rng: &mut rand::rngs::StdRng,
) -> String {
    let n = latest.number;
    let forge = |mut m: Manifest, number: u64| {
        m.number = number;
        m.written_ms += 1;
        (manifest_key(prefix, number), PutPayload::from(m.encode()))
    };
    match fault {
        Fault::DeleteManifest => {
            let key = manifest_key(prefix, rng.gen_range(1..n));
            raw.delete(&StorePath::from(key.as_str())).await.unwrap();
            key
        }
        Fault::DamageManifest => {
            let key = manifest_key(prefix, rng.gen_range(n - 1..=n));
            flip_last_byte(raw, &key).await;
            key
        }
        Fault::ForgeRollback | Fault::ForgeChain => {
            let mut m = latest.clone();
            if matches!(fault, Fault::ForgeChain) {
                m.shipped_chain = [0xab; 32];
            } else if m.chunks.pop().is_none() {
                m.segments.pop();
            }
            if matches!(fault, Fault::ForgeRollback) {
                // Well-formed: its head is where its entries end.
                let (seq, chain) = match (m.chunks.last(), m.segments.last()) {
                    (Some(c), _) => (c.last_seq, c.chain_after),
                    (None, Some(s)) => (s.last_seq, s.chain_end),
                    (None, None) => (0, [0; 32]),
                };
                m.shipped_seq = seq;
                m.shipped_chain = chain;
            }
            let (key, payload) = forge(m, n + 1);
            raw.put(&StorePath::from(key.as_str()), payload)
                .await
                .unwrap();
            key
        }
        Fault::ForgeAfterGap => {
            let (key, payload) = forge(latest.clone(), n + 2);
            raw.put(&StorePath::from(key.as_str()), payload)
                .await
                .unwrap();
            manifest_key(prefix, n + 1)
        }
        Fault::DeleteEpoch => {
            let key = epoch_key(prefix, 1);
            raw.delete(&StorePath::from(key.as_str())).await.unwrap();
            key
        }
        Fault::DamageEpoch => {
            let key = epoch_key(prefix, 1);
            flip_last_byte(raw, &key).await;
            key
        }
    }
}

#[test]
fn damage_at_a_random_point_is_refused_and_named_by_every_reader() {
    let test = "damage_at_a_random_point_is_refused_and_named_by_every_reader";
    let Some((weed_bin, engine)) = engine_or_skip(test) else {
        return;
    };
    let seed: u64 = std::env::var("SPARK_GAPS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let fault = FAULTS[rng.gen_range(0..FAULTS.len())];
    let mode = if rng.gen_bool(0.5) { "sync" } else { "async" };
    let writes = rng.gen_range(8..40);
    let mut guard = SeedOnFailure(seed, format!("{fault:?}, {mode}, {writes} writes"));
    println!("SPARK_GAPS_SEED={seed}: {}", guard.1);
    set_credentials();
    let weed = Weed::start(weed_bin);
    let endpoint = weed.endpoint();
    let url = unique_prefix("gaps");
    let prefix = url.strip_prefix("s3://spark/").unwrap().to_owned();
    let work = tempfile::tempdir().unwrap();
    let http = client();

    // A live history: the writer ships, the replica follows.
    let writer_toml = work.path().join("writer.toml");
    write_archive_config(&writer_toml, 4096, &url, &endpoint, 50, mode);
    let writer_data = work.path().join("writer");
    let mut writer = EngineProcess::start(&engine, &writer_data, &writer_toml);
    let replica_toml = replica_config(work.path());
    let replica_data = work.path().join("replica");
    let mut replica = start_replica(&engine, &replica_data, &replica_toml, &url, &endpoint);
    create_moments(&http, &writer.base, 1, writes);
    wait_caught_up(&http, &writer.base, &replica.base);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let raw = raw_store(&endpoint);
    let store = ArchiveStore::new(std::sync::Arc::new(raw_store(&endpoint)), prefix.clone());
    let mut latest = rt.block_on(store.latest_manifest()).unwrap().unwrap();
    if latest.number < 2 {
        // One more manifest, so that there is one below the latest.
        create_moments(&http, &writer.base, 1000, 1);
        wait_caught_up(&http, &writer.base, &replica.base);
        latest = rt.block_on(store.latest_manifest()).unwrap().unwrap();
    }
    let key = rt.block_on(put_fault(&raw, &prefix, &latest, fault, &mut rng));
    guard.1 += &format!(", manifest {} latest, {key}", latest.number);

    // The tools.
    let restored = work.path().join("restored");
    let (code, out, err) = replay(
        &[
            "restore",
            "--from",
            &url,
            "--data",
            restored.to_str().unwrap(),
        ],
        &endpoint,
    );
    assert_eq!(code, 1, "restore: {out}{err}");
    assert!(err.contains(&key), "restore: {err}");
    assert!(!restored.join("log").exists(), "restore left a log");
    let (code, out, err) = replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 1, "verify: {out}{err}");
    assert!(err.contains(&key), "verify: {err}");
    let (code, out, err) = replay(
        &[
            "audit",
            "archive",
            "--data",
            writer_data.to_str().unwrap(),
            "--from",
            &url,
        ],
        &endpoint,
    );
    assert_eq!(code, 1, "audit archive: {out}{err}");
    assert!(err.contains(&key), "audit archive: {err}");

    // The replica: a fault after what it applied is named in /readyz.
    if matches!(
        fault,
        Fault::ForgeRollback | Fault::ForgeChain | Fault::ForgeAfterGap
    ) {
        let answer = wait_ready(&http, &replica.base, Duration::from_secs(20), |s, b| {
            s == 503
                && b["replica"]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains(&key))
        });
        assert_eq!(answer["replica"]["manifest"], latest.number, "{answer}");
    }
    // Restarted on its cache, it refuses to start, naming the key.
    replica.terminate();
    let log = refused_start(
        &engine,
        &["replica", "--from", &url, "--endpoint", &endpoint],
        &replica_data,
        &replica_toml,
    );
    assert!(log.contains(&key), "replica restart: {log}");

    // The writer, restarted, refuses to start, naming the key.
    writer.terminate();
    let log = refused_start(&engine, &[], &writer_data, &writer_toml);
    assert!(log.contains(&key), "writer restart: {log}");
    // ... and stored nothing: no manifest after the fault, no epoch again.
    let stored_after = rt.block_on(async {
        let next = match fault {
            Fault::ForgeRollback | Fault::ForgeChain => latest.number + 2,
            Fault::ForgeAfterGap => latest.number + 3,
            _ => latest.number + 1,
        };
        store.exists(&manifest_key(&prefix, next)).await.unwrap()
    });
    assert!(!stored_after, "the writer shipped past the fault");
    if matches!(fault, Fault::DeleteEpoch) {
        assert!(!rt.block_on(store.exists(&key)).unwrap(), "{key} put again");
    }
    drop(weed);
}

#[test]
fn a_replica_of_a_prefix_with_no_manifest_is_not_ready() {
    let test = "a_replica_of_a_prefix_with_no_manifest_is_not_ready";
    let Some((weed_bin, engine)) = engine_or_skip(test) else {
        return;
    };
    set_credentials();
    let weed = Weed::start(weed_bin);
    let endpoint = weed.endpoint();
    let url = unique_prefix("never-written");
    let work = tempfile::tempdir().unwrap();
    let http = client();
    let replica_toml = replica_config(work.path());
    let replica_data = work.path().join("replica");
    let replica = start_replica(&engine, &replica_data, &replica_toml, &url, &endpoint);
    // Not ready, naming the prefix, for longer than the lag bound allows
    // a caught-up replica to be ready (ready_lag_max_ms = 3000).
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        let (status, _, body) = get(&http, &format!("{}/readyz", replica.base));
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, 503, "{body}");
        assert!(
            body.contains(&url) && body.contains("no manifest"),
            "{body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Its reads say so too: 503 naming the prefix, not an empty list (or a
    // 404) that looks like the writer's state.
    for path in ["/api/moments", "/api/log/head"] {
        let (status, _, body) = get(&http, &format!("{}{path}", replica.base));
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, 503, "{path}: {body}");
        assert!(
            body.contains(&url) && body.contains("\"unavailable\""),
            "{path}: {body}"
        );
    }
    let log = std::fs::read_to_string(replica_data.with_extension("log")).unwrap();
    assert!(
        log.contains("WARN") && log.contains("no manifest under this prefix"),
        "{log}"
    );
    // A writer stores a first manifest: the replica reads it and is ready.
    let writer_toml = work.path().join("writer.toml");
    write_archive_config(&writer_toml, 4096, &url, &endpoint, 50, "async");
    let writer = EngineProcess::start(&engine, &work.path().join("writer"), &writer_toml);
    create_moments(&http, &writer.base, 1, 3);
    let ready = wait_ready(&http, &replica.base, Duration::from_secs(30), |s, _| {
        s == 200
    });
    assert!(
        ready["replica"]["manifest"].as_u64().unwrap() >= 1,
        "{ready}"
    );
    let (status, _, body) = get(&http, &format!("{}/api/moments", replica.base));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    drop(weed);
}
