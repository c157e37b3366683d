//! Archived checkpoints (ARCHIVE.md "Checkpoint") against
//! a `weed mini` of the test's own ([`crate::weed`]):
//!
//! - [`checkpoints_ship_and_restore_starts_from_them`]: an engine with
//!   `[archive]` and checkpoints on ships its checkpoints create-only, the
//!   manifest lists them; `spark-replay restore` loads the newest and folds
//!   only the ops after it (`ops_folded`), writes it into the restored
//!   `checkpoint/`, and gives the digest of the original's log folded
//!   whole (also with `--at`). A missing, a stale (chain value not the
//!   log's) and a damaged (a flipped byte in the stored object) archived
//!   checkpoint are each ignored with a warning naming the object, and the
//!   restore gives the same digest; `verify --from` still passes.
//! - [`a_replica_on_an_empty_cache_starts_from_the_archived_checkpoint`]:
//!   the real `spark-engine replica` on an empty cache installs the
//!   archived checkpoint and its engine starts from it; restarted on its
//!   cache it does not fetch it again; a fresh replica after the object was
//!   damaged warns, naming it, and serves the same state.
//!
//! Without `weed` the tests print `skipped: ...`; `SPARK_REQUIRE_S3=1`
//! makes them fail instead.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use spark_archive::layout::{manifest_key, CheckpointEntry, Manifest};
use spark_archive::{ArchiveStore, StoreConfig};
use spark_engine::archive::Shipping;
use spark_engine::config::{ArchiveMode, Settings};
use spark_engine::Engine;
use spark_log_format::format::chain_hex;

use crate::s3_common::{
    digest_of, engine_or_skip, json, open_archived_from, restore, set_credentials, unique_prefix,
    wait_shipped, weed_or_skip, write, EngineProcess,
};
use crate::weed::{raw_store, Weed, BUCKET};

/// Ops between two checkpoints in these tests.
const INTERVAL_OPS: u64 = 150;

/// An engine on `data` with checkpoints every [`INTERVAL_OPS`] ops, 16 KiB
/// segments, shipping to `url` every 50 ms.
async fn open_checkpointed(data: &Path, url: &str, endpoint: &str) -> (Arc<Engine>, Shipping) {
    let mut settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    settings.log.segment_size_bytes = 16 << 10;
    settings.log.checkpoint_interval_ops = INTERVAL_OPS;
    open_archived_from(settings, url, endpoint, ArchiveMode::Async).await
}

fn store_of(url: &str, endpoint: &str) -> ArchiveStore {
    ArchiveStore::connect(&StoreConfig {
        url: url.to_owned(),
        endpoint: Some(endpoint.to_owned()),
        region: "us-east-1".into(),
    })
    .unwrap()
}

/// Waits until the latest manifest lists a checkpoint at or past `seq`.
async fn wait_listed(store: &ArchiveStore, seq: u64) -> Manifest {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(m) = store.latest_manifest().await.unwrap() {
            if m.checkpoints.last().is_some_and(|c| c.seq >= seq) {
                return m;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no archived checkpoint at seq {seq}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The object key under the bucket (what the raw store addresses).
fn raw_path(key: &str) -> object_store::path::Path {
    object_store::path::Path::from(key)
}

async fn raw_get(endpoint: &str, key: &str) -> Vec<u8> {
    use object_store::ObjectStore as _;
    raw_store(endpoint)
        .get(&raw_path(key))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec()
}

async fn raw_put(endpoint: &str, key: &str, bytes: Vec<u8>) {
    use object_store::ObjectStore as _;
    raw_store(endpoint)
        .put(&raw_path(key), bytes.into())
        .await
        .unwrap();
}

/// Stores manifest `base.number + 1`: `base`'s entries listing
/// `checkpoints` instead (as a writer would; the history still extends).
async fn put_manifest(
    store: &ArchiveStore,
    base: &Manifest,
    checkpoints: Vec<CheckpointEntry>,
) -> Manifest {
    let next = Manifest {
        number: base.number + 1,
        written_ms: spark_log_format::system_now_ms(),
        checkpoints,
        ..base.clone()
    };
    store
        .put_create(
            &manifest_key(store.prefix(), next.number),
            Bytes::from(next.encode()),
        )
        .await
        .unwrap();
    next
}

fn restored_checkpoint(out: &str) -> (Option<String>, u64, u64, String) {
    let v = json(out);
    (
        v["checkpoint"]["key"].as_str().map(str::to_owned),
        v["ops_folded"].as_u64().unwrap(),
        v["seq"].as_u64().unwrap(),
        v["digest"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_ship_and_restore_starts_from_them() {
    let test = "checkpoints_ship_and_restore_starts_from_them";
    let Some(weed) = weed_or_skip(test).await else {
        return;
    };
    let endpoint = weed.endpoint();
    let url = unique_prefix("ckpt");
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("original");
    let store = store_of(&url, &endpoint);
    let (engine, shipping) = open_checkpointed(&data, &url, &endpoint).await;
    write(&engine, 0, 400, true).await;
    wait_shipped(&engine, &shipping, Duration::from_secs(60)).await;
    wait_listed(&store, INTERVAL_OPS).await;
    // A tail after the checkpoint, one op per batch (every seq a batch end).
    write(&engine, 400, 440, false).await;
    wait_shipped(&engine, &shipping, Duration::from_secs(60)).await;
    shipping.stop().await;
    let base = store.latest_manifest().await.unwrap().unwrap();
    let ck = base.checkpoints.last().unwrap().clone();
    let prefix = url
        .trim_start_matches(&format!("s3://{BUCKET}/"))
        .to_owned();
    assert!(
        ck.key.starts_with(&format!("{prefix}/checkpoint/"))
            && ck.key.ends_with("-00000000000000000001.ckpt"),
        "{ck:?}"
    );
    // Shipped verbatim: the object is the engine's file (while it keeps it).
    let local = spark_core::checkpoint::checkpoint_dir(&data)
        .join(spark_core::checkpoint::file_name(ck.seq));
    let object = raw_get(&endpoint, &ck.key).await;
    if let Ok(file) = std::fs::read(&local) {
        assert_eq!(file, object);
    }
    assert_eq!(*blake3::hash(&object).as_bytes(), ck.blake3);
    let head = engine.head().seq;
    assert!(ck.seq < head, "{} {head}", ck.seq);
    let (seq, digest) = digest_of(&data, None);
    assert_eq!(seq, head);

    // Restore starts from it: it folds only the tail, and the restored
    // directory holds the checkpoint for the engine's first start.
    let r1 = work.path().join("r1");
    let (code, out, err) = restore(&url, &r1, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let (key, folded, rseq, rdigest) = restored_checkpoint(&out);
    assert_eq!(key.as_deref(), Some(ck.key.as_str()), "{out}");
    assert_eq!((rseq, folded), (head, head - ck.seq), "{out}");
    assert_eq!(rdigest, digest);
    assert!(spark_core::checkpoint::checkpoint_dir(&r1)
        .join(spark_core::checkpoint::file_name(ck.seq))
        .is_file());
    // The restored log folded whole gives the same digest.
    assert_eq!(digest_of(&r1, None), (head, digest.clone()));
    // --at: the checkpoint is used when --at keeps it.
    let at_seq = head - 10;
    let r_at = work.path().join("r_at");
    let (code, out, err) = restore(&url, &r_at, &endpoint, &["--at", &at_seq.to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    let (key, folded, rseq, rdigest) = restored_checkpoint(&out);
    assert_eq!(key.as_deref(), Some(ck.key.as_str()));
    assert_eq!((rseq, folded), (at_seq, at_seq - ck.seq));
    assert_eq!(rdigest, digest_of(&data, Some(&at_seq.to_string())).1);

    // Missing: the manifest names an object that is not there.
    let missing = CheckpointEntry {
        key: format!("{prefix}/checkpoint/{:020}-{:020}.ckpt", ck.seq, 99),
        ..ck.clone()
    };
    let m = put_manifest(&store, &base, vec![missing.clone()]).await;
    let r2 = work.path().join("r2");
    let (code, out, err) = restore(&url, &r2, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains(&missing.key) && err.contains("missing"),
        "{err}"
    );
    assert_eq!(
        restored_checkpoint(&out),
        (None, head, head, digest.clone())
    );

    // Stale: a well-formed checkpoint whose chain value is not the log's.
    let mut stale = object.clone();
    stale[48] ^= 0x01;
    let trailer = stale.len() - 32;
    let sum = blake3::hash(&stale[..trailer]);
    stale[trailer..].copy_from_slice(sum.as_bytes());
    let stale_entry = CheckpointEntry {
        key: format!("{prefix}/checkpoint/{:020}-{:020}.ckpt", ck.seq, 98),
        blake3: *blake3::hash(&stale).as_bytes(),
        chain: stale[48..80].try_into().unwrap(),
        ..ck.clone()
    };
    store
        .put_create(&stale_entry.key, Bytes::from(stale))
        .await
        .unwrap();
    let m = put_manifest(&store, &m, vec![stale_entry.clone()]).await;
    let r3 = work.path().join("r3");
    let (code, out, err) = restore(&url, &r3, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains(&stale_entry.key) && err.contains("stale"),
        "{err}"
    );
    assert_eq!(
        restored_checkpoint(&out),
        (None, head, head, digest.clone())
    );
    assert!(spark_core::checkpoint::list(&r3).is_empty());

    // Damaged: a flipped byte in the stored object (a rotten disk).
    let mut damaged = object.clone();
    damaged[200] ^= 0x01;
    raw_put(&endpoint, &ck.key, damaged).await;
    put_manifest(&store, &m, vec![ck.clone()]).await;
    let r4 = work.path().join("r4");
    let (code, out, err) = restore(&url, &r4, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains(&ck.key) && err.contains("damaged"), "{err}");
    assert_eq!(
        restored_checkpoint(&out),
        (None, head, head, digest.clone())
    );

    // The history still extends (checkpoints are not part of it).
    let (code, out, err) = crate::s3_common::replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 0, "{out}{err}");
    drop(engine);
    drop(weed);
}

/// Reads `path` (a replica's log) once it holds `line`, within 60 s.
fn wait_line(path: &Path, line: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(line) {
            return text;
        }
        assert!(Instant::now() < deadline, "no {line:?} in {text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn head_of(base: &str) -> serde_json::Value {
    let text = reqwest::blocking::get(format!("{base}/api/log/head"))
        .unwrap()
        .text()
        .unwrap();
    json(&text)
}

/// Waits until the replica at `base` serves `seq`.
fn wait_seq(base: &str, seq: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let head = head_of(base);
        if head["seq"].as_u64() == Some(seq) {
            return head;
        }
        assert!(Instant::now() < deadline, "replica at {head}, not {seq}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_replica_on_an_empty_cache_starts_from_the_archived_checkpoint() {
    let test = "a_replica_on_an_empty_cache_starts_from_the_archived_checkpoint";
    let Some((weed_bin, engine_bin)) = engine_or_skip(test) else {
        return;
    };
    set_credentials();
    let weed = Weed::start(weed_bin);
    let endpoint = weed.endpoint();
    let url = unique_prefix("ckpt-replica");
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("writer");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = store_of(&url, &endpoint);
    let (engine, shipping, ck) = rt.block_on(async {
        let (engine, shipping) = open_checkpointed(&data, &url, &endpoint).await;
        write(&engine, 0, 400, true).await;
        wait_shipped(&engine, &shipping, Duration::from_secs(60)).await;
        wait_listed(&store, INTERVAL_OPS).await;
        write(&engine, 400, 430, false).await;
        wait_shipped(&engine, &shipping, Duration::from_secs(60)).await;
        // The newest checkpoint the writer makes of these writes (the worker
        // makes one once INTERVAL_OPS ops follow the newest, so the last one
        // has fewer after it): on a loaded machine the worker may still be
        // behind here, and a replica starts from the newest listed.
        let head = engine.head().seq;
        let m = wait_listed(&store, head + 1 - INTERVAL_OPS).await;
        (engine, shipping, m.checkpoints.last().unwrap().clone())
    });
    let writer_seq = engine.head().seq;
    let writer_chain = chain_hex(&engine.head().chain);
    let writer_digest = engine.read(|m| m.digest());
    let config = work.path().join("replica.toml");
    std::fs::write(&config, "[replica]\npoll_interval_ms = 100\n").unwrap();
    let args = [
        "replica",
        "--from",
        url.as_str(),
        "--endpoint",
        endpoint.as_str(),
    ];

    // An empty cache: the archived checkpoint is installed and the engine
    // starts from it, folding only the ops after it.
    let a = work.path().join("replica-a");
    let mut replica = EngineProcess::start_args(&engine_bin, &args, &a, &config);
    let head = wait_seq(&replica.base, writer_seq);
    assert_eq!(head["chain"].as_str(), Some(writer_chain.as_str()));
    let log = wait_line(&a.with_extension("log"), "started from checkpoint");
    assert!(
        log.contains("starting from the archived checkpoint") && log.contains(&ck.key),
        "{log}"
    );
    assert!(spark_core::checkpoint::checkpoint_dir(&a)
        .join(spark_core::checkpoint::file_name(ck.seq))
        .is_file());
    replica.terminate();
    let (seq, digest) = digest_of(&a, None);
    assert_eq!((seq, digest.as_str()), (writer_seq, writer_digest.as_str()));

    // Restarted on its cache: its own checkpoints, nothing fetched again.
    let mut replica = EngineProcess::start_args(&engine_bin, &args, &a, &config);
    wait_seq(&replica.base, writer_seq);
    let log = wait_line(&a.with_extension("log"), "started from checkpoint");
    assert!(!log.contains("archived checkpoint"), "{log}");
    replica.terminate();

    // The archived object damaged: a fresh replica warns, naming it, and
    // serves the same state from the log folded without it.
    let object = rt.block_on(raw_get(&endpoint, &ck.key));
    let mut damaged = object;
    damaged[100] ^= 0x01;
    rt.block_on(raw_put(&endpoint, &ck.key, damaged));
    let b = work.path().join("replica-b");
    let mut replica = EngineProcess::start_args(&engine_bin, &args, &b, &config);
    let head = wait_seq(&replica.base, writer_seq);
    assert_eq!(head["chain"].as_str(), Some(writer_chain.as_str()));
    let log = wait_line(&b.with_extension("log"), "archived checkpoint ignored");
    assert!(log.contains(&ck.key) && log.contains("damaged"), "{log}");
    replica.terminate();
    assert_eq!(digest_of(&b, None), (writer_seq, writer_digest));
    rt.block_on(shipping.stop());
    drop(engine);
    drop(weed);
}
