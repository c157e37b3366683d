//! `spark-replay restore --at` on an archive with retention (ARCHIVE.md
//! "Retention", "Restore"): the real `spark-engine` ships to a `weed mini`
//! store with a short `[archive] retention_ms` and erases a deleted
//! moment at once. Within the window, `--at` a point before the erasure
//! restores the state at that point exactly (the digest `rebuild --at`
//! gives on a copy of the original log taken then), read from a manifest
//! before the compaction; once the window has passed that point, the same
//! `--at` is refused (exit 2) naming the horizon and the setting, while
//! `verify --from` and a plain restore still pass.

use std::time::{Duration, Instant};

use spark_archive::{ArchiveStore, StoreConfig};
use spark_test_support::weed::{KEY_ID, SECRET};

use crate::archive_erasure::{get, json_of, plant, wait_archived};
use crate::common::{copy_dir, replay_or_skip, ServerProcess};
use crate::s3_common::{digest_of, json, replay, restore, unique_prefix, weed_or_skip};

/// `[archive] retention_ms` of the test's engine: long enough for the
/// steps before the window passes, short enough to wait for.
const RETENTION_MS: u64 = 12_000;

/// A hang guard on top of the retention window.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn start(data: &std::path::Path, env: &[(&str, String)]) -> ServerProcess {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    ServerProcess::start_with_env(data, &env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_at_is_exact_within_the_window_and_refused_before_the_horizon() {
    let test = "restore_at_is_exact_within_the_window_and_refused_before_the_horizon";
    if replay_or_skip(test).is_none() {
        return;
    }
    let Some(weed) = weed_or_skip(test).await else {
        return;
    };
    let endpoint = weed.endpoint();
    let url = unique_prefix("retention");
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("original");
    let env: Vec<(&str, String)> = vec![
        ("SPARK_ARCHIVE_URL", url.clone()),
        ("SPARK_ARCHIVE_ENDPOINT", endpoint.clone()),
        ("SPARK_ARCHIVE_SHIP_INTERVAL_MS", "50".into()),
        ("SPARK_ARCHIVE_RETENTION_MS", RETENTION_MS.to_string()),
        ("SPARK_RETENTION_ERASE_AFTER_MS", "0".into()),
        ("SPARK_RETENTION_CHECK_INTERVAL_MS", "200".into()),
        ("SPARK_LOG_SEGMENT_SIZE_BYTES", "4096".into()),
        ("SPARK_LOG_CHECKPOINT_INTERVAL_OPS", "4".into()),
        ("AWS_ACCESS_KEY_ID", KEY_ID.into()),
        ("AWS_SECRET_ACCESS_KEY", SECRET.into()),
    ];
    let server = {
        let (data, env) = (data.clone(), env.clone());
        tokio::task::spawn_blocking(move || start(&data, &env))
            .await
            .unwrap()
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let marker = format!("RETAINME{}", crate::common::ulid());
    for n in 0..2 {
        plant(&client, &server.base, &format!("KEPT{n}")).await;
    }
    let gone = plant(&client, &server.base, &marker).await;
    let point = wait_archived(&client, &server.base).await;
    // A copy of the original log as it is at `point` (stopped, so that
    // the copy is whole), then the same directory goes on.
    assert!(server.terminate().success());
    let copy = work.path().join("copy");
    copy_dir(&data, &copy);
    let (point_seq, point_digest) = digest_of(&copy, Some(&point.to_string()));
    assert_eq!(point_seq, point);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let point_time = spark_core::time::format_rfc3339_ms(spark_log_format::system_now_ms() as i64);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let server = {
        let (data, env) = (data.clone(), env.clone());
        tokio::task::spawn_blocking(move || start(&data, &env))
            .await
            .unwrap()
    };
    // An op after the point first, so that the manifests after it that
    // reach past the point's time hold it before the compaction.
    plant(&client, &server.base, "BETWEEN").await;
    wait_archived(&client, &server.base).await;
    let r = client
        .delete(format!("{}/api/moments/{}", server.base, gone.0))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let (_, body) = get(&client, &format!("{}/api/moments/{}", server.base, gone.0)).await;
        if json_of(&body)["moment"]["erased"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "never erased");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    plant(&client, &server.base, "AFTER").await;
    wait_archived(&client, &server.base).await;

    // Within the window: exact, read from a manifest before the
    // compaction (the latest one's log has the moment erased).
    for at in [point.to_string(), point_time.clone()] {
        let restored = work.path().join(format!("within-{}", at.len()));
        let (code, out, err) = restore(&url, &restored, &endpoint, &["--at", &at]);
        assert_eq!(code, 0, "--at {at} within the window: {out}{err}");
        let summary = json(&out);
        assert_eq!(summary["seq"], point, "--at {at}: {summary}");
        assert_eq!(
            summary["digest"],
            point_digest.as_str(),
            "--at {at}: {summary}"
        );
        assert_eq!(
            digest_of(&restored, None),
            (point_seq, point_digest.clone())
        );
    }

    // Once the window has passed the point: refused, naming the horizon.
    let store = ArchiveStore::connect(&StoreConfig {
        url: url.clone(),
        endpoint: Some(endpoint.clone()),
        region: "us-east-1".into(),
    })
    .unwrap();
    let deadline = Instant::now() + HANG_GUARD + Duration::from_millis(RETENTION_MS);
    let floor = loop {
        let latest = store.latest_manifest().await.unwrap().unwrap();
        let floor = store.manifest(latest.retained_from).await.unwrap();
        if floor.shipped_seq > point {
            break floor;
        }
        assert!(
            Instant::now() < deadline,
            "the horizon never passed seq {point}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    for at in [point.to_string(), point_time] {
        let refused = work.path().join(format!("refused-{}", at.len()));
        let (code, out, err) = restore(&url, &refused, &endpoint, &["--at", &at]);
        assert_eq!(code, 2, "--at {at} before the horizon: {out}{err}");
        for says in [
            "retention horizon",
            "retention_ms",
            &format!("seq {}", floor.shipped_seq),
            &format!("manifest {}", floor.number),
        ] {
            assert!(err.contains(says), "{says:?} in {err}");
        }
        assert!(!refused.exists());
    }
    let (code, out, err) = replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 0, "verify --from after retention: {out}{err}");
    let plain = work.path().join("plain");
    let (code, out, err) = restore(&url, &plain, &endpoint, &[]);
    assert_eq!(code, 0, "restore after retention: {out}{err}");
    assert!(server.terminate().success());
    drop(weed);
}
