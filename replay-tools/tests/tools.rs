//! `spark-replay` end to end: every subcommand against a data directory
//! written by the real engine, beside a live engine, and on damaged copies;
//! its archive readers (`restore`, `verify --from`, `audit archive`)
//! against a `weed mini`, with archived checkpoints and gaps
//! (`tools/archive_*.rs`). The server's own archive tests (shipping under
//! kill -9, `sync` mode, leases, take-overs, replicas, the proxy) are the
//! root package's `tests/archive/`.

#[path = "tools/archive_checkpoint.rs"]
mod archive_checkpoint;
#[path = "tools/archive_gaps.rs"]
mod archive_gaps;
#[path = "tools/archive_s3.rs"]
mod archive_s3;
#[path = "tools/checkpoint.rs"]
mod checkpoint;
#[path = "tools/damage_header.rs"]
mod damage_header;
#[path = "tools/erasure.rs"]
mod erasure;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use serde_json::Value;
use spark_engine::clock::SystemClock;
use spark_engine::config::Settings;
use spark_engine::engine::{Command as EngineCommand, CreateMoment, DeleteMoment, EditMoment};
use spark_engine::{Engine, Id};
use spark_log_format::OsFs;
use spark_test_support::{s3 as s3_common, weed};

fn run(args: &[&str], data: &Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spark-replay"))
        .args(args)
        .arg("--data")
        .arg(data)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn create(id: Id, rid: &str, text: &str) -> EngineCommand {
    EngineCommand::CreateMoment(CreateMoment {
        id: Some(id),
        request_id: Some(rid.into()),
        text: Some(text.into()),
        caption: None,
        lang: Some("de".into()),
        captured_at_ms: None,
        device: "test-phone".into(),
    })
}

/// Writes: 3 creates (two with the same content), an edit, a delete.
/// Returns the engine (still open) and the ids.
async fn populate(data: &Path, segment_size_bytes: u64) -> (Engine, Vec<Id>) {
    let mut settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    settings.log.segment_size_bytes = segment_size_bytes;
    let engine = Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
    let ids: Vec<Id> = (1..=3)
        .map(|n| Id::from_parts(1_767_225_600_000 + n, n.into()))
        .collect();
    engine
        .submit(create(ids[0], "r-0", "Ausfahrt"))
        .await
        .unwrap();
    engine
        .submit(create(ids[1], "r-1", "Ausfahrt"))
        .await
        .unwrap();
    engine
        .submit(create(ids[2], "r-2", "Notausgang"))
        .await
        .unwrap();
    engine
        .submit(EngineCommand::EditMoment(EditMoment {
            id: ids[2],
            request_id: Some("e-2".into()),
            if_match: None,
            text: None,
            caption: Some(Some("bus stop".into())),
            lang: None,
            device: "test-phone".into(),
        }))
        .await
        .unwrap();
    engine
        .submit(EngineCommand::DeleteMoment(DeleteMoment {
            id: ids[2],
            request_id: None,
            if_match: None,
            device: "test-phone".into(),
        }))
        .await
        .unwrap();
    (engine, ids)
}

#[tokio::test]
async fn every_subcommand_beside_a_running_engine() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let (engine, ids) = populate(data, 64 << 20).await;
    let head = engine.head();

    let (code, out, err) = run(&["verify"], data);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("ok: 5 records"), "{out}");

    let (code, out, _) = run(&["dump"], data);
    assert_eq!(code, 0);
    let ops: Vec<Value> = out.lines().map(json).collect();
    assert_eq!(ops.len(), 5);
    assert_eq!(ops[0]["seq"], 1);
    assert_eq!(ops[0]["kind"], "moment.create");
    assert_eq!(ops[0]["request_id"], "r-0");
    assert_eq!(ops[0]["entity_id"], ids[0].to_string());
    assert_eq!(ops[0]["device"], "test-phone");
    assert_eq!(ops[4]["request_id"], Value::Null);

    // An edit shows only what it touched.
    assert_eq!(ops[3]["kind"], "moment.edit");
    assert_eq!(
        ops[3]["payload"]["changes"],
        serde_json::json!({"caption": "bus stop"})
    );

    let count = |args: &[&str]| run(args, data).1.lines().count();
    assert_eq!(count(&["dump", "--kind", "moment.create"]), 3);
    assert_eq!(
        count(&["dump", "--kind", "moment.edit", "--kind", "moment.delete"]),
        2
    );
    assert_eq!(count(&["dump", "--entity", &ids[2].to_string()]), 3);
    assert_eq!(
        count(&["dump", "--entity", &ids[2].to_string().to_lowercase()]),
        3
    );
    assert_eq!(count(&["dump", "--request", "r-1"]), 1);
    assert_eq!(count(&["dump", "--from-seq", "2", "--to-seq", "3"]), 2);
    let ts = ops[3]["ts_ms"].as_u64().unwrap().to_string();
    assert_eq!(
        count(&["dump", "--since", &ts]),
        ops.iter()
            .filter(|o| o["ts_ms"].as_u64() >= ops[3]["ts_ms"].as_u64())
            .count()
    );
    assert_eq!(count(&["dump", "--until", "1970-01-02T00:00:00Z"]), 0);
    assert_eq!(run(&["dump", "--kind", "moment.nope"], data).0, 2);

    let (code, out, _) = run(&["rebuild", "--json"], data);
    assert_eq!(code, 0);
    let rebuilt = json(&out);
    assert_eq!(rebuilt["seq"], 5);
    assert_eq!(
        rebuilt["moments"],
        serde_json::json!({"live": 2, "deleted": 1})
    );
    assert_eq!(rebuilt["requests"], 4);
    assert_eq!(rebuilt["digest"], engine.read(|m| m.digest()));

    let (_, out, _) = run(&["rebuild", "--json", "--at", "3"], data);
    let at3 = json(&out);
    assert_eq!(
        (at3["seq"].clone(), at3["moments"]["live"].clone()),
        (serde_json::json!(3), serde_json::json!(3))
    );
    let export = data.join("export.json");
    let (code, _, _) = run(
        &["rebuild", "--at", "4", "--export", export.to_str().unwrap()],
        data,
    );
    assert_eq!(code, 0);
    let exported = json(&std::fs::read_to_string(&export).unwrap());
    assert_eq!(exported["moments"].as_array().unwrap().len(), 3);
    assert_eq!(exported["moments"][2]["caption"], "bus stop");
    assert_eq!(exported["requests"]["e-2"]["kind"], "moment.edit");

    let (_, out, _) = run(&["stats", "--json"], data);
    let stats = json(&out);
    assert_eq!(stats["ops"], 5);
    assert_eq!(stats["segments"], 1);
    assert_eq!(stats["by_kind"]["moment.create"], 3);
    assert!(stats["bytes"].as_u64().unwrap() > 64);

    let (_, out, _) = run(&["audit", "chain", "--json"], data);
    let chain = json(&out);
    assert_eq!(chain["seq"], 5);
    assert_eq!(chain["chain"], head.chain_hex());

    let (_, out, _) = run(&["audit", "entity", &ids[2].to_string(), "--json"], data);
    let history = json(&out);
    let kinds: Vec<_> = history["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].clone())
        .collect();
    assert_eq!(kinds, vec!["moment.create", "moment.edit", "moment.delete"]);

    let (_, out, _) = run(&["audit", "request", "r-1", "--json"], data);
    let produced = json(&out);
    assert_eq!(produced["produced"]["entity_id"], ids[1].to_string());
    assert_eq!(produced["produced"]["kind"], "moment.create");

    let (code, out, _) = run(&["audit", "duplicates", "--json"], data);
    assert_eq!(code, 1, "two live moments share their content");
    let groups = json(&out);
    let ids_found = &groups["groups"][0]["ids"];
    assert_eq!(ids_found.as_array().unwrap().len(), 2);

    engine.shutdown().await;
}

/// Beside a running engine (its `LOCK` held), `audit damage` reads the log
/// as `verify` does there: the last batch as a reader may see it while the
/// writer copies it in (its first bytes still zero, its commit mark already
/// there) is a write in progress, not damage. A break-test found `audit
/// damage` reporting exactly this beside a server under load ("zero bytes
/// where a record would start, but a valid frame follows ... no hole of
/// unwritten sectors"). On the stopped server the same bytes are damage,
/// which the engine would refuse, and both tools say so.
#[tokio::test]
async fn audit_damage_beside_a_running_engine_reads_past_a_batch_being_written() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (segment, whole, end) = one_segment_log(&data).await;
    // The last batch is seq 5 and its commit mark: its first bytes not
    // written yet, as a reader racing the writer's copy sees them.
    let (offset5, _, _) = frames_by_the_tables(&whole)
        .into_iter()
        .find(|&(_, seq, kind)| seq == 5 && kind != 0)
        .unwrap();
    assert!(offset5 < end);
    let mut bytes = whole.clone();
    bytes[offset5..offset5 + 16].fill(0);
    std::fs::write(&segment, &bytes).unwrap();

    let lock = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(data.join("LOCK"))
        .unwrap();
    lock.lock().unwrap();
    for args in [&["verify"][..], &["audit", "damage"][..]] {
        let (code, out, err) = run(args, &data);
        assert_eq!(code, 0, "{args:?} beside a running engine: {out}{err}");
    }
    let (code, out, err) = run(&["audit", "damage", "--json"], &data);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json(&out)["damaged"], false, "{out}");

    // Stopped: read as recovery reads it.
    lock.unlock().unwrap();
    drop(lock);
    let (code, out, err) = run(&["audit", "damage"], &data);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("no hole of unwritten sectors"), "{out}");
    let (code, out, err) = run(&["verify"], &data);
    assert_eq!(code, 1, "{out}{err}");
}

#[tokio::test]
async fn verify_names_the_place_of_a_flipped_byte() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Small segments: the log spans several sealed segments.
    populate_segments(&data).await;
    let (code, out, err) = run(&["verify"], &data);
    assert_eq!(code, 0, "{out}{err}");
    let mut segments: Vec<_> = std::fs::read_dir(data.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segments.sort();
    assert!(segments.len() >= 3, "{segments:?}");
    for (index, segment) in segments.iter().enumerate() {
        let copy = dir.path().join(format!("copy-{index}"));
        std::fs::create_dir_all(copy.join("log")).unwrap();
        for s in &segments {
            std::fs::copy(s, copy.join("log").join(s.file_name().unwrap())).unwrap();
        }
        let target = copy.join("log").join(segment.file_name().unwrap());
        let mut bytes = std::fs::read(&target).unwrap();
        let pos = bytes.len() / 3;
        bytes[pos] ^= 0x10;
        std::fs::write(&target, &bytes).unwrap();
        let (code, out, err) = run(&["verify"], &copy);
        let name = segment.file_name().unwrap().to_str().unwrap();
        assert_eq!(code, 1, "segment {name}: {out}{err}");
        assert!(err.contains(name), "the error names {name}: {err}");
        assert!(err.contains("offset"), "{err}");
    }
}

#[test]
fn a_missing_data_directory_is_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = run(&["verify"], &dir.path().join("nothing"));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no log"), "{err}");
}

/// A segment of a newer format version (header whole, checksum valid) is
/// no damage: every subcommand that reads the log exits 3 (unreadable by
/// this build), naming the segment and the version, not 1 as before.
#[test]
fn a_segment_of_a_newer_format_is_exit_3_not_damage() {
    use spark_log_format::{FORMAT_VERSION, HEADER_LEN};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (code, _, err) = run(&["generate", "--ops", "20"], &data);
    assert_eq!(code, 0, "{err}");
    let log = data.join("log");
    let mut segments: Vec<_> = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segments.sort();
    let first = &segments[0];
    let mut bytes = std::fs::read(first).unwrap();
    // The header (FORMAT.md): magic (8), version (u16 LE), header length
    // (u16 LE), CRC-32 (u32 LE) of the header with the CRC field zeroed.
    bytes[8..10].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[..12]);
    crc.update(&[0; 4]);
    crc.update(&bytes[16..HEADER_LEN]);
    let crc = crc.finalize();
    bytes[12..16].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(first, &bytes).unwrap();
    let name = first.file_name().unwrap().to_str().unwrap().to_owned();
    let newer = format!("format version {}", FORMAT_VERSION + 1);
    for args in [
        &["verify"][..],
        &["rebuild"],
        &["dump"],
        &["stats"],
        &["audit", "damage"],
    ] {
        let (code, _, err) = run(args, &data);
        assert_eq!(code, 3, "{args:?}: {err}");
        assert!(
            err.contains(&name) && err.contains(&newer),
            "{args:?}: {err}"
        );
    }
}

#[tokio::test]
async fn verify_tells_a_torn_tail_from_a_damaged_last_record() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (segment, whole, end) = one_segment_log(&data).await;
    // Where the last record ends: the engine's zero fill ahead follows it.
    assert!(whole[end..].iter().all(|&b| b == 0));

    // A record cut short: a torn write. A note, exit 0.
    std::fs::write(&segment, &whole[..end - 5]).unwrap();
    let (code, out, err) = run(&["verify"], &data);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("ok: 4 records"), "{out}");
    assert!(out.contains("note:"), "{out}");

    // The last record whole but with a flipped payload byte: maybe a damaged
    // acknowledged record. A fault, exit 1, naming the place (the zero fill
    // after it kept).
    let mut flipped = whole.clone();
    let last = end - 3;
    flipped[last] ^= 0x01;
    std::fs::write(&segment, &flipped).unwrap();
    let (code, out, err) = run(&["verify"], &data);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("00000000000000000001.seg") && err.contains("checksum"),
        "{err}"
    );
    // The fault only: no `ok:` line before it.
    assert_eq!(out, "", "{err}");

    // The engine cuts it at its next start, and keeps a copy of what it cut.
    let settings = Settings {
        data_dir: data.clone(),
        ..Settings::default()
    };
    let engine = Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
    let torn = engine
        .recovery()
        .truncated
        .clone()
        .expect("a torn tail was cut");
    assert!(torn.whole_frame);
    let kept = data
        .join("log")
        .join(torn.quarantine.expect("a copy was kept"));
    let cut = std::fs::read(kept).unwrap();
    assert_eq!(cut, flipped[torn.offset as usize..].to_vec());
    assert_eq!(engine.head().seq, 4);
    drop(engine);
    let (code, out, err) = run(&["verify"], &data);
    assert_eq!(
        (code, out.starts_with("ok: 4 records")),
        (0, true),
        "{out}{err}"
    );
}

#[tokio::test]
async fn rebuild_at_a_seq_past_the_head_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = populate(dir.path(), 64 << 20).await;
    engine.shutdown().await;
    let (code, _, err) = run(&["rebuild", "--at", "6"], dir.path());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("past the head"), "{err}");
    assert_eq!(run(&["rebuild", "--at", "5"], dir.path()).0, 0);
}

#[tokio::test]
async fn audit_damage_names_the_damaged_seqs_and_what_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (engine, ids) = populate(&data, 64 << 20).await;
    engine.shutdown().await;
    drop(engine);
    let (code, out, _) = run(&["audit", "damage"], &data);
    assert_eq!(code, 0, "{out}");

    // Flip a bit in the time field of seq 2 (its payload still decodes),
    // with whole records after it: mid-log corruption.
    let segment = data.join("log/00000000000000000001.seg");
    let mut bytes = std::fs::read(&segment).unwrap();
    let reader = spark_log_format::LogReader::open(&data.join("log")).unwrap();
    let mut offset2 = 0;
    reader
        .scan(Default::default(), |_, r| {
            if r.seq == 2 {
                offset2 = r.offset as usize;
            }
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
    drop(reader);
    bytes[offset2 + 16] ^= 0x04;
    std::fs::write(&segment, &bytes).unwrap();

    let (code, out, err) = run(&["audit", "damage", "--json"], &data);
    assert_eq!(code, 1, "{out}{err}");
    let report = json(&out);
    assert_eq!(report["kind"], "corrupt");
    assert_eq!(
        report["damaged_seqs"],
        serde_json::json!({"first": 2, "last": 2})
    );
    assert_eq!(report["next_good_seq"], 3);
    assert_eq!(report["records"][0]["entity_id"], ids[1].to_string());
    assert_eq!(report["records"][0]["request_id"], "r-1");
    assert_eq!(report["records"][0]["kind"], "moment.create");

    // The server refuses to start, and says the same.
    let error = refused_open(&data);
    assert!(error.contains("damaged: seq 2"), "{error}");
    // The fault is named by the damaged record's own seq, and its device is
    // named, so the text asks it to send the capture again.
    assert!(error.contains("(seq 2): "), "{error}");
    assert!(
        error.contains("device test-phone")
            && error.contains("the devices named can send these captures again"),
        "{error}"
    );
    assert!(
        error.contains("request r-1") && error.contains(&ids[1].to_string()),
        "{error}"
    );
}

#[test]
fn generate_writes_a_verifiable_log_and_never_extends_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (code, out, err) = run(&["generate", "--ops", "2500", "--json"], &data);
    assert_eq!(code, 0, "{err}");
    let report = json(&out);
    assert_eq!(report["ops"], 2500);
    assert!(report["payload_bytes"].as_u64().unwrap() > 2500 * 100);
    let (code, _, err) = run(&["verify"], &data);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run(&["rebuild", "--json"], &data);
    assert_eq!(code, 0, "{err}");
    let rebuilt = json(&out);
    assert_eq!(rebuilt["seq"], 2500);
    assert_eq!(rebuilt["moments"]["live"], 2500);
    assert_eq!(rebuilt["requests"], 2500);
    // A second run refuses the directory, which now holds a log.
    let (code, _, err) = run(&["generate", "--ops", "10"], &data);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("not empty"), "{err}");
    let (_, out, _) = run(&["rebuild", "--json"], &data);
    assert_eq!(json(&out)["seq"], 2500);
}

/// Output into a pipe whose reader is gone (`spark-replay verify | head`)
/// ends the tool quietly, as any command-line tool, never with a panic
/// (a newcomer's run: "failed printing to stdout: Broken pipe", exit 101).
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (code, _, err) = run(&["generate", "--ops", "200"], &data);
    assert_eq!(code, 0, "{err}");
    for args in [&["verify"][..], &["stats"], &["dump"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_spark-replay"))
            .args(args)
            .arg("--data")
            .arg(&data)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before a byte is read: every write fails.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            out.status.success() || out.status.signal() == Some(SIGPIPE),
            "{args:?}: {:?} {stderr}",
            out.status
        );
    }
}

/// SIGPIPE's number on Linux.
const SIGPIPE: i32 = 13;

/// A log of several sealed segments: `populate` with small segments, then
/// 60 more creates. The engine is shut down.
async fn populate_segments(data: &Path) -> Vec<spark_log_format::SegmentInfo> {
    let (engine, _) = populate(data, 4096).await;
    for n in 0..60u64 {
        engine
            .submit(create(
                Id::from_parts(1_767_225_700_000 + n, n.into()),
                &format!("bulk-{n}"),
                &"x".repeat(150),
            ))
            .await
            .unwrap();
    }
    engine.shutdown().await;
    drop(engine);
    spark_log_format::LogReader::open(&data.join("log"))
        .unwrap()
        .segments()
        .to_vec()
}

#[tokio::test]
async fn audit_damage_and_verify_agree_on_a_missing_segment() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let segments = populate_segments(&data).await;
    assert!(segments.len() >= 3, "{segments:?}");
    let (before, missing, after) = (&segments[0], &segments[1], &segments[2]);
    std::fs::remove_file(data.join("log").join(&missing.name)).unwrap();

    let (code, out, verify_err) = run(&["verify"], &data);
    assert_eq!(code, 1, "{out}{verify_err}");
    assert!(
        verify_err.contains(&after.name) && verify_err.contains("seq gap"),
        "{verify_err}"
    );

    let (code, out, err) = run(&["audit", "damage", "--json"], &data);
    assert_eq!(code, 1, "{out}{err}");
    let report = json(&out);
    assert_eq!(report["kind"], "corrupt");
    // The damage starts at the first missing seq: the one after the last
    // record read (the end of the segment before the missing one).
    assert_eq!(report["last_good_seq"], before.last_seq);
    assert_eq!(report["next_good_seq"], after.first_seq);
    assert_eq!(
        report["damaged_seqs"],
        serde_json::json!({"first": missing.first_seq, "last": missing.last_seq})
    );
    assert_eq!(report["records"], serde_json::json!([]));
    // The same error verify names.
    let error = report["error"].as_str().unwrap();
    assert!(verify_err.contains(error), "{verify_err} / {error}");

    let range = format!("damaged: seq {}..={}", missing.first_seq, missing.last_seq);
    let (code, out, err) = run(&["audit", "damage"], &data);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains(&range), "{out}");

    // The server refuses to start, and says the same.
    let settings = Settings {
        data_dir: data.clone(),
        ..Settings::default()
    };
    let error = Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock))
        .err()
        .expect("a log with a missing segment is refused")
        .to_string();
    assert!(error.contains(&range), "{error}");
}

/// The frames of a segment file, parsed by FORMAT.md's tables alone (not
/// the crate's decoder): (offset, seq, kind) of each, from the end of the
/// 64-byte header up to the zero fill.
fn frames_by_the_tables(bytes: &[u8]) -> Vec<(usize, u64, u16)> {
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let u16_at = |at: usize| u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap());
    let mut frames = Vec::new();
    let mut at = 64;
    while at + 28 <= bytes.len() && u32_at(at) != 0 {
        frames.push((at, u64_at(at + 8), u16_at(at + 24)));
        at += 8 + u32_at(at) as usize;
    }
    frames
}

/// A flipped byte inside a record names that record's own seq (the one the
/// frame holds, by FORMAT.md's tables), never the last good one before it:
/// in `verify`'s fault, in `audit damage`'s error and range, and in the
/// engine's refusal; in a sealed segment and in the last one.
#[tokio::test]
async fn verify_and_audit_damage_name_the_seq_of_the_damaged_record() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let segments = populate_segments(&data).await;
    assert!(segments.len() >= 3, "{segments:?}");
    for (index, segment) in [&segments[1], segments.last().unwrap()]
        .into_iter()
        .enumerate()
    {
        let copy = dir.path().join(format!("copy-{index}"));
        std::fs::create_dir_all(copy.join("log")).unwrap();
        for s in &segments {
            let from = data.join("log").join(&s.name);
            std::fs::copy(from, copy.join("log").join(&s.name)).unwrap();
        }
        let path = copy.join("log").join(&segment.name);
        let mut bytes = std::fs::read(&path).unwrap();
        // A record (kind 0 is the log's own seal and commit mark) in the
        // middle of the segment, with valid frames after it.
        let records: Vec<_> = frames_by_the_tables(&bytes)
            .into_iter()
            .filter(|&(_, _, kind)| kind != 0)
            .collect();
        assert!(records.len() >= 3, "{}: {records:?}", segment.name);
        let (offset, seq, _) = records[records.len() / 2];
        // A byte of its payload, past the 28-byte frame header.
        bytes[offset + 30] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let place = format!("{} at offset {offset} (seq {seq}):", segment.name);

        let (code, out, err) = run(&["verify"], &copy);
        assert_eq!(code, 1, "{out}{err}");
        assert!(err.contains(&place), "{place}: {err}");

        let (code, out, err) = run(&["audit", "damage", "--json"], &copy);
        assert_eq!(code, 1, "{out}{err}");
        let report = json(&out);
        assert_eq!(report["kind"], "corrupt");
        assert_eq!(report["damaged_seqs"]["first"], seq, "{report}");
        assert_eq!(report["last_good_seq"], seq - 1, "{report}");
        assert!(
            report["error"].as_str().unwrap().contains(&place),
            "{place}: {report}"
        );
        let (code, out, err) = run(&["audit", "damage"], &copy);
        assert_eq!(code, 1, "{out}{err}");
        assert!(
            out.contains(&place) && out.contains(&format!("damaged: seq {seq} ")),
            "{place}: {out}"
        );

        let error = refused_open(&copy);
        assert!(
            error.contains(&place) && error.contains(&format!("damaged: seq {seq} ")),
            "{place}: {error}"
        );
    }
}

#[tokio::test]
async fn verify_describes_zeros_then_a_stray_byte_as_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (segment, whole, end) = one_segment_log(&data).await;
    let whole = whole[..end].to_vec();

    // Zeros, then a stray non-zero byte: a torn tail (the engine cuts it
    // and keeps a copy), not the end of written data.
    let mut stray = whole.clone();
    stray.extend_from_slice(&[0; 100]);
    stray.push(0x01);
    std::fs::write(&segment, &stray).unwrap();
    let (code, out, err) = run(&["verify"], &data);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("note:") && out.contains("non-zero"), "{out}");
    assert!(out.contains(&format!("from offset {}", end + 100)), "{out}");
    assert!(!out.contains("(end of written data)"), "{out}");
    let (code, out, err) = run(&["audit", "damage"], &data);
    assert_eq!(code, 0, "{out}{err}");
}

/// A damaged commit mark mid-log hides no op: both tools say which seqs
/// it lies between instead of naming a damaged range.
#[tokio::test]
async fn audit_damage_names_a_damaged_commit_mark_as_no_op() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (engine, _) = populate(&data, 64 << 20).await;
    engine.shutdown().await;
    drop(engine);
    // Each op of `populate` is its own batch, so the commit mark of seq 2's
    // batch ends right where seq 3's record starts.
    let segment = data.join("log/00000000000000000001.seg");
    let reader = spark_log_format::LogReader::open(&data.join("log")).unwrap();
    let mut offset3 = 0;
    reader
        .scan(Default::default(), |_, r| {
            if r.seq == 3 {
                offset3 = r.offset as usize;
            }
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
    drop(reader);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[offset3 - 1] ^= 0x10;
    std::fs::write(&segment, &bytes).unwrap();

    // No record is damaged: the fault lies after seq 2, the mark's batch.
    let place = format!("at offset {} (after seq 2):", offset3 - 48);
    let (code, out, err) = run(&["verify"], &data);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&place) && err.contains("reads as the commit mark after seq 2"),
        "{place}: {err}"
    );
    let (code, out, err) = run(&["audit", "damage", "--json"], &data);
    assert_eq!(code, 1, "{out}{err}");
    let report = json(&out);
    assert_eq!(report["kind"], "corrupt");
    assert!(
        report["error"].as_str().unwrap().contains(&place),
        "{report}"
    );
    assert_eq!(report["last_good_seq"], 2);
    assert_eq!(report["next_good_seq"], 3);
    assert_eq!(
        report["damaged_seqs"],
        serde_json::json!({"first": null, "last": null})
    );
    let (code, out, err) = run(&["audit", "damage"], &data);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains(
            "damaged: no op: the damaged frame lies between seq 2 and seq 3 (a commit mark"
        ),
        "{out}"
    );
    // No record is damaged, and no device is named: no device is asked to
    // send anything again.
    assert!(!out.contains("devices named"), "{out}");
    assert!(out.contains("no record is damaged"), "{out}");
}

#[tokio::test]
async fn audit_damage_and_verify_agree_on_the_last_record() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (segment, whole, end) = one_segment_log(&data).await;
    let whole = whole[..end].to_vec();

    // The last frame (the commit mark of the batch of seq 5) whole, its
    // checksum failing: verify says it may be the damaged mark of an
    // acknowledged batch; so does audit damage.
    let mut flipped = whole.clone();
    flipped[end - 3] ^= 0x01;
    std::fs::write(&segment, &flipped).unwrap();
    let (code, out, err) = run(&["verify"], &data);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("damaged commit mark of an acknowledged batch"),
        "{err}"
    );
    let (code, out, err) = run(&["audit", "damage", "--json"], &data);
    assert_eq!(code, 1, "{out}{err}");
    let report = json(&out);
    assert_eq!(report["damaged"], true);
    assert_eq!(report["kind"], "damaged_or_torn_last_frame");
    assert_eq!(report["last_good_seq"], 4);
    assert_eq!(report["next_good_seq"], Value::Null);
    assert_eq!(
        report["damaged_seqs"],
        serde_json::json!({"first": 5, "last": 5})
    );
    assert_eq!(report["records"][0]["seq"], 5);
    assert_eq!(report["records"][0]["kind"], "moment.delete");
    let (code, out, err) = run(&["audit", "damage"], &data);
    assert_eq!(code, 1, "{out}{err}");
    for words in [
        "damaged: seq 5",
        "00000000000000000001.seg",
        "torn write",
        "damaged commit mark of an acknowledged batch",
        "next start",
    ] {
        assert!(out.contains(words), "{words:?}: {out}");
    }
    assert!(!out.contains("no damage"), "{out}");

    // Cut short instead: a torn write, which verify only notes. No damage:
    // the batch after the last valid commit mark was never acknowledged,
    // and both tools name it so, with its seqs.
    std::fs::write(&segment, &whole[..end - 5]).unwrap();
    let (code, out, err) = run(&["verify"], &data);
    assert_eq!((code, out.contains("note:")), (0, true), "{out}{err}");
    assert!(
        out.contains("unacknowledged tail cut") && out.contains("seq 5"),
        "{out}"
    );
    assert!(out.starts_with("ok: 4 records"), "{out}");
    let (code, out, err) = run(&["verify", "--json"], &data);
    assert_eq!(code, 0, "{out}{err}");
    let report = json(&out);
    assert_eq!(report["ok"], true);
    assert_eq!(
        report["unacknowledged_tail"]["what"],
        "unacknowledged tail cut"
    );
    assert_eq!(
        report["unacknowledged_tail"]["seqs"],
        serde_json::json!({"first": 5, "last": 5})
    );
    let (code, out, err) = run(&["audit", "damage"], &data);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("no damage") && out.contains("unacknowledged tail cut"),
        "{out}"
    );
    let (code, out, err) = run(&["audit", "damage", "--json"], &data);
    assert_eq!(code, 0, "{out}{err}");
    let report = json(&out);
    assert_eq!(report["damaged"], false);
    assert_eq!(
        report["unacknowledged_tail"]["seqs"],
        serde_json::json!({"first": 5, "last": 5})
    );
}

/// A stopped engine's one-segment log of a few ops under `data`: the
/// segment's path, its bytes, and where its last record ends (the zero
/// fill, if any, follows).
async fn one_segment_log(data: &std::path::Path) -> (std::path::PathBuf, Vec<u8>, usize) {
    let (engine, _) = populate(data, 64 << 20).await;
    engine.shutdown().await;
    drop(engine);
    let segment = data.join("log/00000000000000000001.seg");
    let whole = std::fs::read(&segment).unwrap();
    let end = spark_log_format::LogReader::open(&data.join("log"))
        .unwrap()
        .segments()[0]
        .bytes as usize;
    (segment, whole, end)
}

#[tokio::test]
async fn audit_damage_and_verify_agree_on_an_op_that_does_not_replay() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (engine, _) = populate(&data, 64 << 20).await;
    engine.shutdown().await;
    drop(engine);
    // A record whose bytes verify (CRC, commit mark, chain) but whose
    // payload is no op: appended with the log's own writer.
    let (mut log, _) = spark_log_format::Log::open(
        &data.join("log"),
        spark_log_format::LogConfig::default(),
        Arc::new(OsFs),
        |_| Ok::<(), std::convert::Infallible>(()),
    )
    .unwrap();
    log.append_batch(&[spark_log_format::RecordIn {
        ts_ms: 1_767_225_700_000,
        kind: 1,
        kind_version: 1,
        payload: b"not an op",
    }])
    .unwrap();
    drop(log);

    let (code, out, err) = run(&["verify"], &data);
    assert_eq!(code, 1, "{out}{err}");
    let (code, out, err) = run(&["audit", "damage"], &data);
    assert_eq!(code, 1, "{out}{err}");
    assert!(!out.contains("no damage"), "{out}");
    assert!(
        out.contains("damaged:") && out.contains("00000000000000000001.seg"),
        "{out}"
    );
    let (code, out, err) = run(&["audit", "damage", "--json"], &data);
    assert_eq!(code, 1, "{out}{err}");
    let report = json(&out);
    assert_eq!(report["damaged"], true);
    assert_eq!(report["kind"], "op_does_not_replay");
}

/// A `.seg` file whose name is not 20 digits is named as a stray file, not
/// damage (docs/tools.md, `audit damage`): exit 3 (the log is not read until it is
/// moved out), never 1, the damage code. Any other stray file is ignored.
#[tokio::test]
async fn a_seg_file_with_a_bad_name_is_a_stray_file_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (engine, _) = populate(&data, 64 << 20).await;
    engine.shutdown().await;
    drop(engine);
    // A file not named like a segment at all is ignored.
    std::fs::write(data.join("log/notes.txt"), b"whatever").unwrap();
    for args in [&["verify"][..], &["audit", "damage"][..]] {
        let (code, out, err) = run(args, &data);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
    }
    for stray in ["backup.seg", "junk.seg"] {
        std::fs::write(data.join("log").join(stray), b"whatever").unwrap();
        for args in [
            &["verify"][..],
            &["audit", "damage"][..],
            &["audit", "damage", "--json"][..],
        ] {
            let (code, out, err) = run(args, &data);
            assert_eq!(code, 3, "{args:?}: {out}{err}");
            assert!(
                err.contains(&format!("stray file {stray}"))
                    && err.contains("not damage")
                    && !err.contains("seq 1"),
                "{args:?}: {err}"
            );
            assert!(!out.contains("damaged"), "{args:?}: {out}");
        }
        std::fs::remove_file(data.join("log").join(stray)).unwrap();
    }
    std::fs::write(data.join("log/backup.seg"), b"whatever").unwrap();
    // The engine refuses to start, naming the file.
    let error = refused_open(&data);
    assert!(error.contains("stray file backup.seg"), "{error}");
}

/// Why the engine refuses to open the data directory `data`.
fn refused_open(data: &Path) -> String {
    let settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock))
        .err()
        .expect("the engine refuses the data directory")
        .to_string()
}
