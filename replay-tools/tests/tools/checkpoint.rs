//! Checkpoints: written by the engine in the background, loaded
//! at startup, checked by `spark-replay verify`, and never trusted when
//! damaged, of another version, stale, foreign or beyond the log; `rebuild`
//! from the log alone and from the checkpoint give one digest, also after
//! kill -9 of the real server during checkpoint writes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use spark_core::checkpoint;
use spark_engine::clock::SystemClock;
use spark_engine::config::Settings;
use spark_engine::engine::{Command as EngineCommand, EditMoment};
use spark_engine::{Engine, Id};
use spark_log_format::OsFs;

use crate::s3_common::EngineProcess;
use crate::{create, json as parse, run};

fn settings(data: &Path, interval_ops: u64) -> Settings {
    let mut settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    settings.log.checkpoint_interval_ops = interval_ops;
    settings.log.segment_size_bytes = 64 << 10;
    settings
}

/// Creates `n` moments (ids from `first`) and edits every third.
async fn write_ops(engine: &Engine, first: u64, n: u64) {
    for k in first..first + n {
        let id = Id::from_parts(1_767_225_600_000 + k, k.into());
        engine
            .submit(create(id, &format!("r-{k}"), &format!("sign {k}")))
            .await
            .unwrap();
        if k % 3 == 0 {
            engine
                .submit(EngineCommand::EditMoment(EditMoment {
                    id,
                    request_id: Some(format!("e-{k}")),
                    if_match: None,
                    text: Some(Some(format!("sign {k}, edited"))),
                    caption: None,
                    lang: None,
                    device: "test-phone".into(),
                }))
                .await
                .unwrap();
        }
    }
}

/// Waits until a checkpoint at or past `seq` exists; its path.
fn wait_for_checkpoint(data: &Path, seq: u64) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((at, file)) = checkpoint::list(data).into_iter().next() {
            if at >= seq {
                return file;
            }
        }
        assert!(Instant::now() < deadline, "no checkpoint at seq {seq}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `rebuild --json` from the log alone and `--from-checkpoint`: (digest,
/// seq, checkpoint used).
fn rebuild_both(data: &Path) -> ((String, u64), (String, u64, Value)) {
    let (code, out, err) = run(&["rebuild", "--json"], data);
    assert_eq!(code, 0, "{out}{err}");
    let alone = parse(&out);
    let (code, out, err) = run(&["rebuild", "--json", "--from-checkpoint"], data);
    assert_eq!(code, 0, "{out}{err}");
    let from = parse(&out);
    (
        (
            alone["digest"].as_str().unwrap().to_owned(),
            alone["seq"].as_u64().unwrap(),
        ),
        (
            from["digest"].as_str().unwrap().to_owned(),
            from["seq"].as_u64().unwrap(),
            from["checkpoint"].clone(),
        ),
    )
}

/// `verify --json`'s checkpoint entries.
fn verified_checkpoints(data: &Path) -> Vec<Value> {
    let (code, out, err) = run(&["verify", "--json"], data);
    assert_eq!(code, 0, "{out}{err}");
    parse(&out)["checkpoints"].as_array().unwrap().clone()
}

/// Rewrites a checkpoint's BLAKE3 trailer after an edit, so only the
/// edited field is wrong.
fn reseal(bytes: &mut [u8]) {
    let trailer = bytes.len() - checkpoint::TRAILER_BYTES;
    let hash = blake3::hash(&bytes[..trailer]);
    bytes[trailer..].copy_from_slice(hash.as_bytes());
}

async fn open_digest(settings: &Settings) -> String {
    let engine = Engine::open(settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
    let digest = engine.read(|m| m.digest());
    engine.shutdown().await;
    digest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_are_written_loaded_and_never_trusted_when_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let settings = settings(&data, 50);
    let engine = Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
    write_ops(&engine, 0, 120).await;
    let file = wait_for_checkpoint(&data, 100);
    write_ops(&engine, 1000, 10).await;
    let live = engine.read(|m| m.digest());
    let head = engine.head().seq;
    engine.shutdown().await;

    // The tools: one digest from the log alone and from the checkpoint.
    let ((alone, seq), (from, from_seq, used)) = rebuild_both(&data);
    assert_eq!((seq, from_seq), (head, head));
    assert_eq!(alone, live);
    assert_eq!(from, alone);
    assert!(used.is_string(), "the checkpoint was not used: {used}");
    let checks = verified_checkpoints(&data);
    assert!(!checks.is_empty() && checks.len() <= 2, "{checks:?}");
    assert!(checks.iter().all(|c| c["status"] == "valid"), "{checks:?}");

    // A restart from the checkpoint gives the same mirror; so does one
    // with checkpoints deleted.
    assert_eq!(open_digest(&settings).await, live);
    let saved = std::fs::read(&file).unwrap();
    for (_, f) in checkpoint::list(&data) {
        std::fs::remove_file(f).unwrap();
    }
    assert_eq!(open_digest(&settings).await, live);

    // Damaged, another version, a name that lies: ignored, named, same
    // mirror.
    let mut damaged = saved.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x20;
    let mut version = saved.clone();
    version[8] = 9;
    reseal(&mut version);
    let cases: [(&str, Vec<u8>, &str); 2] = [
        ("damaged", damaged, "checksum"),
        ("version", version, "format version 9"),
    ];
    for (what, bytes, why) in cases {
        std::fs::write(&file, &bytes).unwrap();
        let checks = verified_checkpoints(&data);
        assert_eq!(checks.len(), 1, "{what}: {checks:?}");
        assert_eq!(checks[0]["status"], "ignored", "{what}");
        assert!(
            checks[0]["why"].as_str().unwrap().contains(why),
            "{what}: {checks:?}"
        );
        let ((alone, _), (from, _, used)) = rebuild_both(&data);
        assert_eq!((&from, &alone), (&live, &live), "{what}");
        assert!(used.is_null(), "{what}: a bad checkpoint was used");
        assert_eq!(open_digest(&settings).await, live, "{what}");
    }
    std::fs::remove_file(&file).unwrap();

    // A file named for another seq than its header's.
    let renamed = checkpoint::checkpoint_dir(&data).join(checkpoint::file_name(head + 1));
    std::fs::write(&renamed, &saved).unwrap();
    let checks = verified_checkpoints(&data);
    assert!(
        checks[0]["why"].as_str().unwrap().contains("file name"),
        "{checks:?}"
    );
    std::fs::remove_file(&renamed).unwrap();

    // Foreign: a checkpoint of another log at the same seq (other ids).
    let other = dir.path().join("other");
    let other_settings = self::settings(&other, 50);
    let engine = Engine::open(&other_settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
    write_ops(&engine, 5000, 120).await;
    let foreign = wait_for_checkpoint(&other, 100);
    engine.shutdown().await;
    std::fs::copy(
        &foreign,
        checkpoint::checkpoint_dir(&data).join(foreign.file_name().unwrap()),
    )
    .unwrap();
    let checks = verified_checkpoints(&data);
    assert_eq!(checks[0]["status"], "ignored", "{checks:?}");
    let why = checks[0]["why"].as_str().unwrap();
    assert!(
        why.contains("chain value") || why.contains("beyond the log"),
        "{why}"
    );
    assert_eq!(open_digest(&settings).await, live);
    for (_, f) in checkpoint::list(&data) {
        std::fs::remove_file(f).unwrap();
    }

    // Beyond the log: a checkpoint of a longer copy of this very log (its
    // point lies in bytes this log has not written: zero fill or past the
    // file's end).
    let longer = dir.path().join("longer");
    copy_dir(&data, &longer);
    let longer_settings = self::settings(&longer, 50);
    let engine = Engine::open(&longer_settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
    write_ops(&engine, 9000, 200).await;
    let ahead = wait_for_checkpoint(&longer, head + 100);
    engine.shutdown().await;
    std::fs::copy(
        &ahead,
        checkpoint::checkpoint_dir(&data).join(ahead.file_name().unwrap()),
    )
    .unwrap();
    // A whole checkpoint past the log's end shows the log lost committed
    // records (or, as here, that it came from a longer copy): `verify` and
    // `audit damage` report it as damage, the engine refuses to start, and
    // moving the file away is how an operator accepts the log as it is.
    let (code, out, err) = run(&["verify", "--json"], &data);
    assert_eq!(code, 1, "{out}{err}");
    let doc = parse(&out);
    assert_eq!(doc["ok"], false, "{doc}");
    assert!(
        doc["committed_seq"].as_u64().unwrap() > doc["seq"].as_u64().unwrap(),
        "{doc}"
    );
    let why = doc["error"].as_str().unwrap();
    assert!(
        why.contains("lost acknowledged records")
            && why.contains(&ahead.file_name().unwrap().to_string_lossy().into_owned()),
        "{why}"
    );
    let (code, out, err) = run(&["audit", "damage", "--json"], &data);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(parse(&out)["kind"], "lost_committed", "{out}");
    let refused = Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock))
        .err()
        .expect("refused");
    assert!(
        refused.to_string().contains("lost acknowledged records"),
        "{refused}"
    );
    let ((alone, _), (from, _, used)) = rebuild_both(&data);
    assert_eq!((&from, &alone, used), (&live, &live, Value::Null));
    std::fs::remove_file(checkpoint::checkpoint_dir(&data).join(ahead.file_name().unwrap()))
        .unwrap();
    assert_eq!(open_digest(&settings).await, live);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The real server, killed -9 while it writes checkpoints (the kill comes
/// as soon as a `.ckpt.tmp` file is seen, or after a random time), over
/// several cycles: every start succeeds, `verify` passes with every
/// checkpoint valid, and `rebuild` gives one digest from the log alone and
/// from the checkpoint.
#[test]
fn kill_9_during_checkpoint_writes_changes_no_digest() {
    let engine_binary =
        PathBuf::from(env!("CARGO_BIN_EXE_spark-replay")).with_file_name("spark-engine");
    assert!(
        engine_binary.is_file(),
        "{} is not built: `cargo build --bin spark-engine` first",
        engine_binary.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("spark.toml");
    std::fs::write(
        &config,
        "[log]\ncheckpoint_interval_ops = 300\ncheckpoints_kept = 3\nsegment_size_bytes = 262144\n",
    )
    .unwrap();
    let mut during_write = 0;
    let mut last_seq = 0;
    for cycle in 0..4 {
        let mut server = EngineProcess::start(&engine_binary, &data, &config);
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..4)
            .map(|n| {
                let (base, stop) = (server.base.clone(), Arc::clone(&stop));
                std::thread::spawn(move || load(&base, cycle, n, &stop))
            })
            .collect();
        let deadline = Instant::now() + Duration::from_millis(1500 + rand::random::<u64>() % 2500);
        let tmp_dir = checkpoint::checkpoint_dir(&data);
        loop {
            let writing = std::fs::read_dir(&tmp_dir)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .ends_with(checkpoint::TMP_SUFFIX)
                });
            if writing {
                during_write += 1;
                break;
            }
            if Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        server.kill();
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.join().unwrap();
        }
        let ((alone, seq), (from, from_seq, _)) = rebuild_both(&data);
        assert_eq!(seq, from_seq, "cycle {cycle}");
        assert_eq!(from, alone, "cycle {cycle}: checkpoint and log disagree");
        assert!(seq >= last_seq, "cycle {cycle}: seq went back");
        last_seq = seq;
        for c in verified_checkpoints(&data) {
            assert_eq!(c["status"], "valid", "cycle {cycle}: {c}");
        }
    }
    assert!(last_seq > 300, "too few ops for a checkpoint: {last_seq}");
    // Not an assertion (timing): how often the kill met a write.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("kill -9 met a checkpoint write in {during_write} of 4 cycles\n").as_bytes(),
    );
}

/// Creates moments over HTTP until `stop` or the server goes away.
fn load(base: &str, cycle: u64, n: u64, stop: &AtomicBool) {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut k = 0u64;
    while !stop.load(Ordering::Relaxed) {
        k += 1;
        let id = Id::from_parts(1_767_225_600_000 + k, rand::random::<u128>() >> 48);
        let body = json!({
            "id": id.to_string(),
            "client_request_id": format!("c{cycle}-{n}-{k}"),
            "text": format!("sign {k} of client {n} in cycle {cycle}"),
        });
        match http.post(format!("{base}/api/moments")).json(&body).send() {
            Ok(r) if r.status().as_u16() == 201 => {}
            Ok(r) => panic!("create answered {}", r.status()),
            Err(_) => return,
        }
    }
}

/// Retention counts only valid checkpoints: a bogus file named after a
/// later seq neither pushes the good one out nor is removed (found by a
/// newcomer's run: two copies under later names deleted every good file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_the_newest_valid_checkpoints_not_the_newest_names() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let engine = Engine::open(&settings(&data, 50), Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
    write_ops(&engine, 1, 120).await;
    let good = wait_for_checkpoint(&data, 100);
    engine.shutdown().await;
    drop(engine);
    let bogus = checkpoint::checkpoint_dir(&data).join(checkpoint::file_name(99_999_999));
    std::fs::copy(&good, &bogus).unwrap();
    let newest_valid = checkpoint::list(&data)
        .into_iter()
        .map(|(_, file)| file)
        .find(|file| checkpoint::peek(file, &data.join("log")).is_ok())
        .unwrap();
    let removed = checkpoint::prune(&data, &data.join("log"), 1);
    assert!(!removed.contains(&bogus), "{removed:?}");
    assert!(!removed.contains(&newest_valid), "{removed:?}");
    assert!(newest_valid.exists() && bogus.exists());
    let valid_left = checkpoint::list(&data)
        .into_iter()
        .filter(|(_, file)| checkpoint::peek(file, &data.join("log")).is_ok())
        .count();
    assert_eq!(valid_left, 1);
}
