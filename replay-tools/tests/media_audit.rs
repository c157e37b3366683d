//! `spark-replay audit media`: a crash between blob and op leaves an orphan
//! that the audit reports (and can remove); a missing or damaged blob fails
//! the audit, naming the media.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use spark_core::op::MediaRole;
use spark_engine::clock::SystemClock;
use spark_engine::config::Settings;
use spark_engine::engine::{Command as EngineCommand, CreateMoment, PutMedia};
use spark_engine::media::{hex_digest, MediaStore};
use spark_engine::{Engine, Id};
use spark_log_format::OsFs;

fn audit(data: &Path, extra: &[&str]) -> (i32, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_spark-replay"))
        .args(["audit", "media", "--json", "--data"])
        .arg(data)
        .args(extra)
        .output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), json)
}

async fn store_blob(store: &MediaStore, bytes: &[u8]) -> [u8; 32] {
    let body = futures_util::stream::iter(vec![Ok(Bytes::copy_from_slice(bytes))]);
    let received = store.receive(Box::pin(body), 1 << 20).await.unwrap();
    store.commit(&received).await.unwrap();
    received.sha256
}

#[tokio::test]
async fn orphans_are_reported_and_damage_fails_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    let engine = Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
    let store = MediaStore::open(data, Arc::new(OsFs)).unwrap();
    let moment = Id::from_parts(1_767_225_600_000, 1);
    engine
        .submit(EngineCommand::CreateMoment(CreateMoment {
            id: Some(moment),
            request_id: None,
            text: None,
            caption: None,
            lang: None,
            captured_at_ms: None,
            device: "t".into(),
        }))
        .await
        .unwrap();
    // A stored blob with its op: the path every upload takes.
    let media_id = Id::from_parts(1_767_225_600_000, 2);
    let digest = store_blob(&store, b"the small copy").await;
    engine
        .submit(EngineCommand::PutMedia(PutMedia {
            id: media_id,
            moment_id: moment,
            role: MediaRole::Copy,
            photo: 0,
            sha256: digest,
            size_bytes: 14,
            content_type: "image/jpeg".into(),
            device: "t".into(),
        }))
        .await
        .unwrap();
    let (code, report) = audit(data, &[]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(
        (report["media"].clone(), report["ok"].clone()),
        (1.into(), 1.into())
    );

    // A crash between the blob and its op: the blob is there, no op names it.
    let orphan = store_blob(&store, b"an upload whose op never came").await;
    let (code, report) = audit(data, &[]);
    assert_eq!(code, 0, "orphans alone are not damage");
    assert_eq!(report["orphans"][0]["file"], hex_digest(&orphan));
    // Inside the grace period it stays; past it, it goes.
    let (_, report) = audit(data, &["--remove-orphans"]);
    assert_eq!(report["removed"], serde_json::json!([]));
    let (_, report) = audit(data, &["--remove-orphans", "--grace-seconds", "0"]);
    assert_eq!(report["removed"][0], hex_digest(&orphan));
    assert!(!data.join("media/blobs").join(hex_digest(&orphan)).exists());
    assert!(
        data.join("media/blobs").join(hex_digest(&digest)).exists(),
        "referenced blobs stay"
    );

    // Damage: one flipped byte, then a missing blob.
    let blob = data.join("media/blobs").join(hex_digest(&digest));
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[3] ^= 0x20;
    std::fs::write(&blob, &bytes).unwrap();
    let (code, report) = audit(data, &[]);
    assert_eq!(code, 1);
    assert_eq!(report["damaged"][0]["media_id"], media_id.to_string());
    assert!(report["damaged"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("hashes to"));
    std::fs::remove_file(&blob).unwrap();
    let (code, report) = audit(data, &[]);
    assert_eq!(code, 1);
    assert_eq!(report["damaged"][0]["reason"], "blob missing");
    engine.shutdown().await;
}
