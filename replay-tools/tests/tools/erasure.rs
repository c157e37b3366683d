//! Forgetting (SPEC section 13) through the tools: on a log the engine's
//! compactor rewrote, `verify` passes, `verify --head` links a head taken
//! before the compaction (and refuses a made-up one), `dump` prints erased
//! ops without content and the compaction record with its segments and
//! erased ids, and `audit erasure` tells an erased moment (nothing left)
//! from a deleted one that is due but not erased yet (its log seqs, its
//! blob, a checkpoint and a cut tail's copy that hold it: exit 1), until
//! that one is erased too (exit 0).

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use spark_core::op::MediaRole;
use spark_engine::clock::SystemClock;
use spark_engine::config::Settings;
use spark_engine::engine::{
    Command as EngineCommand, CreateMoment, DeleteMoment, EditMoment, PostMessage, PutMedia,
};
use spark_engine::media::MediaStore;
use spark_engine::retention::Compactor;
use spark_engine::{Engine, Id};
use spark_log_format::OsFs;

use super::{json, run};

/// Stores `bytes` as a blob, the way an upload does; returns its digest.
async fn store_blob(store: &MediaStore, bytes: &[u8]) -> [u8; 32] {
    let body = futures_util::stream::iter(vec![Ok(Bytes::copy_from_slice(bytes))]);
    let received = store.receive(Box::pin(body), 1 << 20).await.unwrap();
    store.commit(&received).await.unwrap();
    received.sha256
}

/// A moment with content in a create, an edit, a message and a photo.
async fn plant(engine: &Engine, store: &MediaStore, n: u64, marker: &str) -> Id {
    // Ids minted now: the engine refuses ids far from its clock.
    let now = spark_log_format::system_now_ms();
    let id = Id::from_parts(now, 10 * n as u128);
    let submit = |command| async move { engine.submit(command).await.unwrap() };
    submit(EngineCommand::CreateMoment(CreateMoment {
        id: Some(id),
        request_id: Some(format!("create-{n}")),
        text: Some(format!("{marker}-TEXT")),
        caption: Some(format!("{marker}-CAPTION")),
        lang: Some("en".into()),
        captured_at_ms: None,
        device: "phone".into(),
    }))
    .await;
    submit(EngineCommand::EditMoment(EditMoment {
        id,
        request_id: None,
        if_match: None,
        text: Some(Some(format!("{marker}-EDIT"))),
        caption: None,
        lang: None,
        device: "phone".into(),
    }))
    .await;
    submit(EngineCommand::PostMessage(PostMessage {
        id: Id::from_parts(now, 10 * n as u128 + 1),
        thread_id: id,
        body: format!("{marker}-MESSAGE"),
        device: "phone".into(),
    }))
    .await;
    let photo = format!("photo {marker}-PHOTO");
    let sha256 = store_blob(store, photo.as_bytes()).await;
    submit(EngineCommand::PutMedia(PutMedia {
        id: Id::from_parts(now, 10 * n as u128 + 2),
        moment_id: id,
        role: MediaRole::Copy,
        photo: 0,
        sha256,
        size_bytes: photo.len() as u64,
        content_type: "image/jpeg".into(),
        device: "phone".into(),
    }))
    .await;
    id
}

async fn delete(engine: &Engine, id: Id) {
    engine
        .submit(EngineCommand::DeleteMoment(DeleteMoment {
            id,
            request_id: None,
            if_match: None,
            device: "phone".into(),
        }))
        .await
        .unwrap();
}

/// `audit erasure --json` with `extra`: exit code and document.
fn audit(data: &Path, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["audit", "erasure", "--json"];
    args.extend_from_slice(extra);
    let (code, out, err) = run(&args, data);
    assert!(code == 0 || code == 1, "{code}: {out}{err}");
    (code, json(&out))
}

/// The entry of `id` in an `audit erasure` document.
fn entry(doc: &Value, id: Id) -> Value {
    doc["moments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id.to_string())
        .unwrap_or_else(|| panic!("{id} not listed: {doc}"))
        .clone()
}

#[tokio::test]
async fn audit_erasure_verify_head_and_dump_on_a_compacted_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let mut settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    // Small segments: the moments' ops spread over several.
    settings.log.segment_size_bytes = 4096;
    settings.retention.erase_after_ms = 0;
    let engine = Arc::new(Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap());
    let store = MediaStore::open(data, Arc::new(OsFs)).unwrap();
    let compactor = Compactor::new(
        &settings,
        Arc::clone(&engine),
        store.clone(),
        Arc::new(OsFs),
        Arc::new(SystemClock),
    );
    let first = plant(&engine, &store, 1, "FIRST").await;
    // A head inside the segment the compaction will rewrite.
    let early = engine.head();
    let second = plant(&engine, &store, 2, "SECOND").await;
    let kept = plant(&engine, &store, 3, "KEPT").await;
    for n in 0..40u64 {
        // Filler, so that the planted ops end up in sealed segments.
        plant(&engine, &store, 100 + n, "FILLER").await;
    }
    delete(&engine, first).await;
    // The head before the compaction, in the active segment (which the
    // compaction re-chains, not rewrites).
    let before = engine.head();

    // Nothing erased yet: the first moment is due (erase after 0 ms) and
    // every place of it is listed.
    let (code, doc) = audit(data, &["--erase-after-ms", "0"]);
    assert_eq!(code, 1, "{doc}");
    let gone = entry(&doc, first);
    assert_eq!(gone["erased"], false, "{gone}");
    assert_eq!(gone["overdue"], true, "{gone}");
    let log: Vec<&str> = gone["remaining"]["log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        log,
        ["moment.create", "moment.edit", "message.post"],
        "{gone}"
    );
    assert_eq!(gone["remaining"]["blobs"].as_array().unwrap().len(), 1);
    // With the engine's default (a day) nothing is due yet.
    let (code, doc) = audit(data, &[]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(
        (doc["deleted"].clone(), doc["due"].clone()),
        (1.into(), 0.into())
    );
    assert_eq!(entry(&doc, first)["remaining"], Value::Null);

    let report = compactor.pass().await.unwrap();
    assert_eq!(report.erased, vec![first], "{report:?}");
    // The erased moment's blob is gone on purpose: `audit media` counts
    // its media apart and finds no damage (it once reported "blob
    // missing" after every erasure: a newcomer's break test, 2026-12-04).
    let (code, out, err) = run(&["audit", "media", "--json"], data);
    assert_eq!(code, 0, "{out}{err}");
    let media: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (media["erased"].clone(), media["damaged"].clone()),
        (1.into(), serde_json::json!([])),
        "{media}"
    );
    assert_eq!(media["ok"], media["media"].as_u64().unwrap() - 1, "{media}");
    assert_eq!(media["orphans"], serde_json::json!([]), "{media}");

    // The second moment is deleted after the pass: due by
    // `--erase-after-ms 0`, not erased.
    delete(&engine, second).await;
    // A checkpoint now holds it, and a copy of a cut tail with its create.
    let log_dir = settings.log_dir();
    let built = spark_core::checkpoint::build(
        &OsFs,
        data,
        &log_dir,
        spark_log_format::DEFAULT_MAX_RECORD_BYTES,
        5,
        engine.head().seq,
        &|| false,
    )
    .unwrap()
    .expect("a checkpoint is built");
    // And the temporary file of a later checkpoint write a crash cut
    // short before its rename, not yet removed by a restart: whole, it
    // decodes (one cut short would count as holding every due moment).
    let whole = std::fs::read(&built.file).unwrap();
    let temp = built.file.with_file_name(format!(
        "{:020}{}",
        engine.head().seq + 1,
        spark_core::checkpoint::TMP_SUFFIX
    ));
    std::fs::write(&temp, &whole).unwrap();
    let create_frame = create_frame_of(&log_dir, second);
    let cut_tail = log_dir.join("00000000000000000001.seg.torn-000000009999");
    std::fs::write(&cut_tail, &create_frame).unwrap();

    let (code, out, err) = run(&["verify"], data);
    assert_eq!(code, 0, "verify passes on a compacted log: {out}{err}");

    let (code, doc) = audit(data, &["--erase-after-ms", "0"]);
    assert_eq!(code, 1, "{doc}");
    assert_eq!(doc["deleted"], 2, "{doc}");
    assert_eq!(doc["due"], 2, "{doc}");
    assert_eq!(doc["erased"], 1, "{doc}");
    assert_eq!(doc["overdue"], 1, "{doc}");
    let erased = entry(&doc, first);
    assert_eq!(erased["erased"], true, "{erased}");
    assert_eq!(erased["overdue"], false, "{erased}");
    for place in ["log", "checkpoints", "blobs", "cut_tails"] {
        assert_eq!(
            erased["remaining"][place],
            serde_json::json!([]),
            "{erased}"
        );
    }
    let overdue = entry(&doc, second);
    assert_eq!(overdue["erased"], false, "{overdue}");
    assert_eq!(overdue["overdue"], true, "{overdue}");
    assert!(overdue["delete_seq"].as_u64().unwrap() > before.seq);
    let seqs: Vec<u64> = overdue["remaining"]["log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs.len(), 3, "create, edit, message: {overdue}");
    let blobs = overdue["remaining"]["blobs"].as_array().unwrap();
    assert_eq!(blobs.len(), 1, "{overdue}");
    assert!(Path::new(blobs[0]["file"].as_str().unwrap()).exists());
    assert_eq!(
        overdue["remaining"]["checkpoints"][0]["file"],
        built.file.display().to_string(),
        "{overdue}"
    );
    assert_eq!(
        overdue["remaining"]["checkpoints"][1]["file"],
        temp.display().to_string(),
        "the temporary file holds it too: {overdue}"
    );
    assert_eq!(
        overdue["remaining"]["cut_tails"],
        serde_json::json!([{"file": cut_tail.display().to_string(), "seq": seqs[0]}]),
        "{overdue}"
    );
    assert!(
        !doc["moments"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == kept.to_string()),
        "a live moment is not listed: {doc}"
    );

    // The text: one line per moment, one per place.
    let (code, out, _) = run(&["audit", "erasure", "--erase-after-ms", "0"], data);
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("2 deleted moments, 2 due"), "{out}");
    assert!(out.contains(&format!("deleted {first}: ")), "{out}");
    assert!(out.contains("; erased\n"), "{out}");
    assert!(out.contains("; not erased: overdue\n"), "{out}");
    assert!(
        out.contains(&format!(
            "remains: {second} log seq {} (moment.create)",
            seqs[0]
        )),
        "{out}"
    );
    assert!(out.contains(&format!("remains: {second} blob ")), "{out}");
    assert!(
        out.contains(&format!("remains: {second} checkpoint ")),
        "{out}"
    );
    assert!(
        out.contains(&format!("remains: {second} cut tail ")),
        "{out}"
    );

    // dump: the first moment's ops are erased, without content; the
    // compaction record names its segments and the erased moment.
    let (code, out, _) = run(&["dump", "--entity", &first.to_string()], data);
    assert_eq!(code, 0);
    let ops: Vec<Value> = out.lines().map(json).collect();
    let create = ops.iter().find(|op| op["kind"] == "moment.create").unwrap();
    assert_eq!(create["erased"], true, "{create}");
    assert_eq!(create["request_id"], "create-1", "{create}");
    for member in ["text", "caption", "lang"] {
        assert!(create["payload"].get(member).is_none(), "{create}");
    }
    let edit = ops.iter().find(|op| op["kind"] == "moment.edit").unwrap();
    assert_eq!(edit["erased"], true, "{edit}");
    assert!(edit["payload"].get("changes").is_none(), "{edit}");
    assert!(
        !out.contains("FIRST-"),
        "no content of the erased moment: {out}"
    );
    let delete_op = ops.iter().find(|op| op["kind"] == "moment.delete").unwrap();
    assert!(delete_op.get("erased").is_none(), "{delete_op}");
    let (_, out, _) = run(&["dump", "--kind", "log.compact"], data);
    let records: Vec<Value> = out.lines().map(json).collect();
    assert_eq!(records.len(), 1, "{out}");
    let record = &records[0];
    assert_eq!(
        record["payload"]["erased"],
        serde_json::json!([first.to_string()]),
        "{record}"
    );
    let segments = record["payload"]["segments"].as_array().unwrap();
    assert!(!segments.is_empty(), "{record}");
    for s in segments {
        assert!(s["first_seq"].as_u64().unwrap() <= s["last_seq"].as_u64().unwrap());
        assert_eq!(s["old_seal"].as_str().unwrap().len(), 64, "{s}");
        assert_eq!(s["new_seal"].as_str().unwrap().len(), 64, "{s}");
    }
    // The second moment's ops still show their content.
    let (_, out, _) = run(&["dump", "--entity", &second.to_string()], data);
    assert!(out.contains("SECOND-TEXT"), "{out}");

    // verify --head: the head before the compaction is linked through the
    // compaction record; one inside a rewritten segment is not (its bytes
    // are gone); a made-up chain is not linked; a malformed one is a usage
    // error.
    let compaction_seq = record["seq"].as_u64().unwrap();
    let head = format!("{}:{}", before.seq, hex::encode(before.chain));
    let (code, out, err) = run(&["verify", "--head", &head], data);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.ends_with(&format!(
            "{head}: linked through the compaction record at seq {compaction_seq}\n"
        )),
        "{out}"
    );
    let (code, out, _) = run(&["verify", "--head", &head, "--json"], data);
    assert_eq!(code, 0, "{out}");
    let doc = json(&out);
    assert_eq!(doc["ok"], true, "{doc}");
    assert_eq!(
        doc["head"],
        serde_json::json!({"seq": before.seq, "chain": hex::encode(before.chain), "linked": true,
                           "link": "through_compaction", "compaction_seq": compaction_seq,
                           "segment_first_seq": null}),
        "{doc}"
    );
    let head = format!("{}:{}", early.seq, hex::encode(early.chain));
    let (code, out, err) = run(&["verify", "--head", &head], data);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.ends_with(&format!(
            "{head}: not linked: the segment holding seq {} (from seq 1) was rewritten by the \
             compaction at seq {compaction_seq}, the first after it (content was erased)\n",
            early.seq
        )),
        "{out}"
    );
    let (code, out, _) = run(&["verify", "--head", &head, "--json"], data);
    assert_eq!(code, 1, "{out}");
    let doc = json(&out);
    assert_eq!(doc["ok"], true, "the log itself verifies: {doc}");
    assert_eq!(doc["head"]["link"], "segment_rewritten", "{doc}");
    assert_eq!(doc["head"]["linked"], false, "{doc}");
    assert_eq!(doc["head"]["segment_first_seq"], 1, "{doc}");
    let now = engine.head();
    let (code, out, err) = run(
        &[
            "verify",
            "--head",
            &format!("{}:{}", now.seq, hex::encode(now.chain)),
        ],
        data,
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.ends_with(": linked\n"), "{out}");
    let random = format!("{}:{}", now.seq, "ab".repeat(32));
    let (code, out, err) = run(&["verify", "--head", &random], data);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.ends_with(": not linked\n"), "{out}");
    for malformed in [
        "12",
        "x:00",
        &format!("5:{}", "0".repeat(63)),
        &format!("5:{}", "g".repeat(64)),
    ] {
        let (code, _, err) = run(&["verify", "--head", malformed], data);
        assert_eq!(code, 2, "{malformed}: {err}");
    }

    // The second moment erased too: the compactor also removes the cut
    // tail's copy that names it and the temporary file, so nothing is
    // overdue.
    let report = compactor.pass().await.unwrap();
    assert_eq!(report.erased, vec![second], "{report:?}");
    assert_eq!(report.cut_tails_removed, 1, "{report:?}");
    assert!(!cut_tail.exists(), "the cut tail's copy is removed");
    assert!(
        !temp.exists(),
        "the temporary file of a cut checkpoint write is removed with the checkpoints"
    );
    let (code, doc) = audit(data, &["--erase-after-ms", "0"]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(
        (doc["erased"].clone(), doc["overdue"].clone()),
        (2.into(), 0.into())
    );
    let (code, out, err) = run(&["verify"], data);
    assert_eq!(code, 0, "{out}{err}");
    engine.shutdown().await;
}

/// The bytes of the frame of `id`'s `moment.create` in the log.
fn create_frame_of(log_dir: &Path, id: Id) -> Vec<u8> {
    let mut files: Vec<_> = std::fs::read_dir(log_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    files.sort();
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        for frame in spark_log_format::Frames::new(&bytes, spark_log_format::HEADER_LEN, u32::MAX) {
            if frame.kind != spark_log_format::FrameKind::Op {
                continue;
            }
            let Ok(op) = spark_core::op::Op::decode(&frame.record) else {
                continue;
            };
            if let spark_core::op::OpBody::MomentCreate(p) = &op.body {
                if p.id == id {
                    return bytes[frame.offset()..frame.end()].to_vec();
                }
            }
        }
    }
    panic!("no create of {id}");
}
