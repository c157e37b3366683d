//! Startup replay refuses a log whose ops do not decode or do not fold,
//! naming the place, also now that decode and fold run on two threads
//!: the first refusal in seq order is the one reported, and
//! nothing past it is served.

use std::sync::Arc;

use spark_core::op::{MomentEdit, OpBody};
use spark_core::synth;
use spark_engine::clock::SystemClock;
use spark_engine::config::{log_dir, Settings};
use spark_engine::engine::EngineOpenError;
use spark_engine::{Engine, Id};
use spark_log_format::{Log, LogConfig, OsFs, RecordIn};

/// More creates than one replay batch holds (4,096), so that a refusal
/// comes while the fold thread is behind the decoding one.
const CREATES: u64 = 10_000;

fn settings(data: &std::path::Path) -> Settings {
    Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    }
}

/// A data directory holding [`CREATES`] synthetic creates, then `records`.
fn creates_then(records: &[(u16, u16, Vec<u8>)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    synth::generate(&log_dir(dir.path()), CREATES, LogConfig::default(), |_| {}).unwrap();
    if !records.is_empty() {
        append(dir.path(), records);
    }
    dir
}

/// Appends `records` (kind, version, payload) after the synthetic creates.
fn append(data: &std::path::Path, records: &[(u16, u16, Vec<u8>)]) {
    let (mut log, _) = Log::open(&log_dir(data), LogConfig::default(), Arc::new(OsFs), |_| {
        Ok::<(), ()>(())
    })
    .unwrap_or_else(|_| panic!("the log opens"));
    let batch: Vec<RecordIn<'_>> = records
        .iter()
        .map(|(kind, version, payload)| RecordIn {
            ts_ms: synth::BASE_MS + CREATES,
            kind: *kind,
            kind_version: *version,
            payload,
        })
        .collect();
    log.append_batch(&batch).unwrap();
}

/// An edit of a moment that was never created: decodes, but the fold
/// refuses it.
fn orphan_edit() -> (u16, u16, Vec<u8>) {
    OpBody::MomentEdit(MomentEdit {
        id: Id::from_parts(1, 1),
        request_id: None,
        device: "phone-1".into(),
        text: Some(Some("nobody made me".into())),
        caption: None,
        lang: None,
    })
    .encode()
    .unwrap()
}

/// A known kind whose payload is not a valid encoding of it.
fn garbage_create() -> (u16, u16, Vec<u8>) {
    let (kind, version, _) = synth::moment_create(0).encode().unwrap();
    (kind, version, vec![0xFF; 7])
}

fn open_error(data: &std::path::Path) -> String {
    match Engine::open(&settings(data), Arc::new(OsFs), Arc::new(SystemClock)) {
        Ok(_) => panic!("a log with a refused op was served"),
        Err(e @ EngineOpenError::Replay { .. }) => e.to_string(),
        Err(other) => panic!("not a replay refusal: {other}"),
    }
}

#[test]
fn an_op_the_fold_refuses_stops_startup_naming_its_seq() {
    let dir = creates_then(&[orphan_edit()]);
    let error = open_error(dir.path());
    assert!(error.contains(&format!("seq {}", CREATES + 1)), "{error}");
    assert!(error.contains(".seg offset "), "{error}");
}

#[test]
fn an_op_that_does_not_decode_stops_startup_naming_its_seq() {
    let dir = creates_then(&[garbage_create()]);
    let error = open_error(dir.path());
    assert!(error.contains(&format!("seq {}", CREATES + 1)), "{error}");
}

#[test]
fn the_first_refusal_in_seq_order_is_reported() {
    // A fold refusal first, then a record that does not decode: the
    // decoding thread meets the second before the fold thread reports the
    // first, but the report names the first.
    let dir = creates_then(&[orphan_edit(), garbage_create()]);
    let error = open_error(dir.path());
    assert!(error.contains(&format!("seq {}", CREATES + 1)), "{error}");
    assert!(!error.contains(&format!("seq {}", CREATES + 2)), "{error}");
}

#[test]
fn a_clean_log_of_several_batches_replays_whole() {
    let dir = creates_then(&[]);
    let engine =
        Engine::open(&settings(dir.path()), Arc::new(OsFs), Arc::new(SystemClock)).unwrap();
    assert_eq!(engine.head().seq, CREATES);
    let (moments, requests) = engine.read(|m| (m.moments.len(), m.requests.len()));
    assert_eq!(moments as u64, CREATES);
    assert_eq!(requests as u64, CREATES);
}
