//! Leases against a real S3-compatible server (SPEC section 11;
//! ARCHIVE.md "Lease"): a writer with `[archive] lease_ms` renews
//! its lease while idle; the real `spark-engine` started without
//! `--take-over` on the same prefix refuses while the lease is live, saying
//! when it expires, and takes the prefix over by itself once the writer
//! stopped and the lease expired; the old directory is then refused; and
//! `verify --from` and `restore` accept the archive with its renewals.
//! Skipped (`skipped: ...`) without `weed`, the `spark-engine` binary or
//! the `spark-replay` binary, unless `SPARK_REQUIRE_S3=1` (the first two)
//! or `SPARK_REQUIRE_REPLAY=1` (the last).

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spark_archive::layout::Manifest;
use spark_archive::{ArchiveStore, StoreConfig};
use spark_engine::archive::ArchiveStartError;
use spark_engine::clock::SystemClock;
use spark_engine::config::{ArchiveMode, ArchiveSettings, Settings};
use spark_engine::Engine;
use spark_log_format::OsFs;

use crate::common::replay_or_skip;
use crate::s3_common::*;
use crate::weed::Weed;

const SHIP_INTERVAL_MS: u64 = 100;
/// Long enough that a writer on a busy machine (its renewal, a PUT to the
/// store, starved of CPU for a while) still renews in time: the standby
/// below must find the lease live.
const LEASE_MS: u64 = 3_000;
/// The longest a wait of these tests may take before it is called a hang.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// Runs `spark-engine` on `data` with `config`, expecting it to refuse to
/// start: its exit code and its stderr (panics if it serves instead).
fn refused_start(binary: &Path, data: &Path, config: &Path) -> (i32, String) {
    let log = config.with_file_name("refused.log");
    let mut child = engine_command(binary, &[], data, config)
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .expect("spark-engine runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "spark-engine started on a prefix with a live lease: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.code().unwrap_or(-1),
        std::fs::read_to_string(&log).unwrap_or_default(),
    )
}

fn same_entries(a: &Manifest, b: &Manifest) -> bool {
    (&a.segments, &a.chunks, a.shipped_seq, &a.shipped_chain)
        == (&b.segments, &b.chunks, b.shipped_seq, &b.shipped_chain)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_lease_a_standby_takes_over_by_itself_once_the_lease_expired() {
    let test = "archive_lease_a_standby_takes_over_by_itself_once_the_lease_expired";
    if replay_or_skip(test).is_none() {
        return;
    }
    let Some((weed_binary, engine_binary)) = engine_or_skip(test) else {
        return;
    };
    set_credentials();
    let weed = tokio::task::spawn_blocking(move || Weed::start(weed_binary))
        .await
        .unwrap();
    let endpoint = weed.endpoint();
    let url = unique_prefix("lease");
    let work = tempfile::tempdir().unwrap();

    // The writer: an engine in this process with a lease.
    let data_a = work.path().join("a");
    let mut settings = Settings {
        data_dir: data_a.clone(),
        ..Settings::default()
    };
    settings.log.segment_size_bytes = 4096;
    let archive = ArchiveSettings {
        url: url.clone(),
        endpoint: Some(endpoint.clone()),
        region: "us-east-1".into(),
        ship_interval_ms: SHIP_INTERVAL_MS,
        mode: ArchiveMode::Async,
        lease_ms: LEASE_MS,
        retention_ms: spark_engine::config::ARCHIVE_RETENTION_MS_DEFAULT,
    };
    settings.archive = Some(archive.clone());
    settings.validate().unwrap();
    let max = settings.log.max_record_bytes;
    let engine = Arc::new(Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap());
    let shipping = spark_engine::archive::start(&archive, &data_a, Arc::clone(&engine), max)
        .await
        .unwrap();
    write(&engine, 1, 80, false).await;
    wait_shipped(&engine, &shipping, Duration::from_secs(30)).await;
    let head = engine.head();
    let store = ArchiveStore::connect(&StoreConfig {
        url: url.clone(),
        endpoint: Some(endpoint.clone()),
        region: "us-east-1".into(),
    })
    .unwrap();
    let shipped = store.latest_manifest().await.unwrap().unwrap();
    assert!(!shipped.segments.is_empty(), "4 KiB segments sealed");

    // Idle: a renewal about every lease_ms / 3, never more often (a busy
    // machine may make them later, so the count is waited for).
    let idle = Instant::now();
    let renewed = loop {
        let renewed = store.latest_manifest().await.unwrap().unwrap();
        if renewed.number - shipped.number >= 4 {
            break renewed;
        }
        assert!(idle.elapsed() < HANG_GUARD, "no 4 renewals: {renewed:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let renewals = renewed.number - shipped.number;
    // Cast: the elapsed ms fit in u64.
    let most = idle.elapsed().as_millis() as u64 / (LEASE_MS / 3) + 2;
    assert!(
        renewals <= most,
        "{renewals} renewals in {:?} with a {LEASE_MS} ms lease",
        idle.elapsed()
    );
    assert!(same_entries(&renewed, &shipped));
    assert_eq!((renewed.epoch, renewed.lease_ms), (1, LEASE_MS));
    assert_eq!(engine.head(), head);

    // A standby, the real server without --take-over on an empty
    // directory: refused while the lease is live, told when it expires.
    let config_dir = work.path().join("b-config");
    std::fs::create_dir_all(&config_dir).unwrap();
    let config = config_dir.join("spark.toml");
    write_archive_config(&config, 4096, &url, &endpoint, SHIP_INTERVAL_MS, "async");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("lease_ms = {LEASE_MS}\n"));
    std::fs::write(&config, text).unwrap();
    let data_b = work.path().join("b");
    let (binary, data, cfg) = (engine_binary.clone(), data_b.clone(), config.clone());
    let (code, said) = tokio::task::spawn_blocking(move || refused_start(&binary, &data, &cfg))
        .await
        .unwrap();
    assert_ne!(code, 0, "{said}");
    assert!(
        said.contains("is held by writer") && said.contains("expires in"),
        "{said}"
    );
    assert_eq!(store.latest_epoch().await.unwrap().unwrap().epoch, 1);

    // The writer stops renewing (as a lost machine would); once its lease
    // expired, the standby started again takes the prefix over by itself.
    shipping.stop().await;
    let stopped = store.latest_manifest().await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 300)).await;
    let mut standby = {
        let (binary, data, cfg) = (engine_binary.clone(), data_b.clone(), config.clone());
        tokio::task::spawn_blocking(move || EngineProcess::start(&binary, &data, &cfg))
            .await
            .unwrap()
    };
    let log = std::fs::read_to_string(config_dir.join("server.log")).unwrap();
    let writer_a: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data_a.join("archive-writer")).unwrap()).unwrap();
    assert!(
        log.contains("expired") && log.contains(writer_a["writer"].as_str().unwrap()),
        "{log}"
    );
    let base = standby.base.clone();
    let served: serde_json::Value = tokio::task::spawn_blocking(move || {
        reqwest::blocking::get(format!("{base}/api/log/head"))
            .unwrap()
            .json()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(served["seq"], head.seq, "{served}");
    let epoch = store.latest_epoch().await.unwrap().unwrap();
    assert_eq!((epoch.epoch, epoch.lease_ms), (2, LEASE_MS));
    let taken = store.manifest(stopped.number + 1).await.unwrap();
    assert_eq!(taken.epoch, 2);
    assert!(same_entries(&taken, &shipped), "the take-over point");

    // The old directory is refused at its next start: the standby's lease
    // is live (it renews too).
    let again = spark_engine::archive::take_over_if_expired(
        &archive,
        &data_a,
        max,
        &spark_engine::clock::SystemClock,
    )
    .await;
    match again {
        Err(ArchiveStartError::Held {
            epoch: 2, lease, ..
        }) => {
            assert!(lease.contains("expires in"), "{lease}")
        }
        other => panic!("{:?}", other.map(|t| t.map(|t| t.epoch))),
    }
    let before = store.latest_manifest().await.unwrap().unwrap().number;
    let waiting = Instant::now();
    loop {
        let after = store.latest_manifest().await.unwrap().unwrap();
        if after.number > before {
            assert_eq!(after.epoch, 2, "{after:?}");
            break;
        }
        assert!(waiting.elapsed() < HANG_GUARD, "the standby never renewed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::task::spawn_blocking(move || standby.terminate())
        .await
        .unwrap();
    engine.shutdown().await;

    // The archive with renewals of both epochs: verify --from walks the
    // history (each manifest extends the one before), restore gives the
    // log back.
    let (code, out, err) = replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 0, "{out}{err}");
    let restored = work.path().join("restored");
    let (code, out, err) = restore(&url, &restored, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let report = json(&out);
    assert_eq!(report["seq"], head.seq, "{report}");
    assert_eq!(report["chain"], head.chain_hex(), "{report}");
    assert_eq!(report["epoch"], 2, "{report}");
    drop(weed);
}
