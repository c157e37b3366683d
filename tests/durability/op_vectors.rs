//! Pins the payload bytes of every op kind at its current version (bincode
//! 2.0.1, standard configuration, behind `spark_core::codec`). If this
//! test fails, the encoding changed: old logs would no longer read. Add a
//! new kind version instead, and keep the old vector here forever.

use spark_core::ids::Id;
use spark_core::op::{
    JobStart, MarkDrop, MarkKeep, MediaPut, MediaRole, MessagePost, MomentCreate, MomentDelete,
    MomentEdit, Op, OpBody, OpKind, RecallStart, Sha256, TurnFail, TurnFinish, TurnMode, TurnStart,
};
use spark_log_format::RecordRef;

fn id() -> Id {
    Id::parse("01M34QZRVNRE3CTR9Y63CF2TPZ").unwrap()
}

fn turn() -> Id {
    Id::parse("01M34QZRVNRE3CTR9Y63CF2TQ1").unwrap()
}

/// The `media.put` of the vectors, as photo `photo` of its moment.
fn media_put(photo: u8) -> MediaPut {
    MediaPut {
        id: Id::parse("01M34QZRVNRE3CTR9Y63CF2TQ0").unwrap(),
        moment_id: id(),
        role: MediaRole::Original,
        sha256: Sha256([0xAB; 32]),
        size_bytes: 3_145_728,
        content_type: "image/jpeg".into(),
        device: "phone".into(),
        photo,
    }
}

/// (kind, version, op as read, payload hex): the committed vectors of the
/// versions before each kind's current one. This build never writes them
/// and reads them forever.
fn old_vectors() -> Vec<(OpKind, u16, OpBody, &'static str)> {
    vec![(
        // Before several photos per moment (issue 27): read as photo 0.
        OpKind::MediaPut,
        1,
        OpBody::MediaPut(media_put(0)),
        "fee06af1d8303e61cd86c375e37fc9a001fedf6af1d8303e61cd86c375e37fc9a00101ababababababababababababababababababababababababababababababababfc000030000a696d6167652f6a7065670570686f6e65",
    )]
}

#[test]
fn older_versions_still_read() {
    for (kind, version, body, hex_payload) in old_vectors() {
        assert!(version < kind.current_version(), "{}", kind.name());
        let bytes = hex::decode(hex_payload).unwrap();
        let record = RecordRef {
            seq: 7,
            ts_ms: 1_788_310_020_000,
            kind: kind.code(),
            kind_version: version,
            payload: &bytes,
            offset: 64,
        };
        assert_eq!(Op::decode(&record).unwrap().body, body, "{}", kind.name());
        // A current-version record with an old payload is refused, not
        // misread (the codec finds the photo missing).
        let current = RecordRef {
            kind_version: kind.current_version(),
            ..record
        };
        assert!(Op::decode(&current).is_err(), "{}", kind.name());
    }
}

/// (kind, version, op, payload hex): the committed vectors of each kind's
/// current version.
fn vectors() -> Vec<(OpKind, u16, OpBody, &'static str)> {
    vec![
        (
            OpKind::MomentCreate,
            1,
            OpBody::MomentCreate(MomentCreate {
                id: id(),
                request_id: Some("outbox-1".into()),
                device: "phone".into(),
                text: Some("Zákaz vstupu".into()),
                caption: None,
                lang: Some("cs".into()),
                captured_at_ms: Some(1_788_310_020_000),
            }),
            "fedf6af1d8303e61cd86c375e37fc9a00101086f7574626f782d310570686f6e65010d5ac3a16b617a20767374757075000102637301fd40bf2abf40030000",
        ),
        (
            OpKind::MomentEdit,
            1,
            OpBody::MomentEdit(MomentEdit {
                id: id(),
                request_id: None,
                device: "phone".into(),
                text: None,
                caption: Some(Some("bus stop".into())),
                lang: Some(None),
            }),
            "fedf6af1d8303e61cd86c375e37fc9a001000570686f6e65000101086275732073746f700100",
        ),
        (
            OpKind::MomentDelete,
            1,
            OpBody::MomentDelete(MomentDelete {
                id: id(),
                request_id: Some("del-1".into()),
                device: "phone".into(),
            }),
            "fedf6af1d8303e61cd86c375e37fc9a001010564656c2d310570686f6e65",
        ),
        (
            // Version 2: version 1's members, then the photo number.
            OpKind::MediaPut,
            2,
            OpBody::MediaPut(media_put(3)),
            "fee06af1d8303e61cd86c375e37fc9a001fedf6af1d8303e61cd86c375e37fc9a00101ababababababababababababababababababababababababababababababababfc000030000a696d6167652f6a7065670570686f6e6503",
        ),
        (
            OpKind::TurnStart,
            1,
            OpBody::TurnStart(TurnStart {
                id: turn(),
                moment_id: id(),
                seat: "pippa".into(),
                mode: TurnMode::Practical,
                request_id: Some("outbox-1:turn".into()),
                device: "phone".into(),
            }),
            "fee16af1d8303e61cd86c375e37fc9a001fedf6af1d8303e61cd86c375e37fc9a00105706970706100010d6f7574626f782d313a7475726e0570686f6e65",
        ),
        (
            OpKind::TurnFinish,
            1,
            OpBody::TurnFinish(TurnFinish {
                id: turn(),
                answer: "No entry.".into(),
                adapter: "local".into(),
                source: "ocr".into(),
                elapsed_ms: 812,
            }),
            "fee16af1d8303e61cd86c375e37fc9a001094e6f20656e7472792e056c6f63616c036f6372fb2c03",
        ),
        (
            OpKind::TurnFail,
            1,
            OpBody::TurnFail(TurnFail {
                id: turn(),
                error: "timeout".into(),
                elapsed_ms: 60_000,
            }),
            "fee16af1d8303e61cd86c375e37fc9a0010774696d656f7574fb60ea",
        ),
        (
            OpKind::MarkKeep,
            1,
            OpBody::MarkKeep(MarkKeep {
                id: "keep:zákaz vstupu".into(),
                phrase: "zákaz vstupu".into(),
                moment_id: Some(id()),
                device: "phone".into(),
            }),
            "126b6565703a7ac3a16b617a207673747570750d7ac3a16b617a2076737475707501fedf6af1d8303e61cd86c375e37fc9a0010570686f6e65",
        ),
        (
            OpKind::MarkDrop,
            1,
            OpBody::MarkDrop(MarkDrop {
                id: "keep:zákaz vstupu".into(),
                device: "phone".into(),
            }),
            "126b6565703a7ac3a16b617a207673747570750570686f6e65",
        ),
        (
            OpKind::JobStart,
            1,
            OpBody::JobStart(JobStart {
                job_id: "job-1".into(),
                moment_id: id(),
                seats: vec!["pippa".into(), "llava".into()],
                device: "phone".into(),
            }),
            "056a6f622d31fedf6af1d8303e61cd86c375e37fc9a00102057069707061056c6c6176610570686f6e65",
        ),
        (
            OpKind::RecallStart,
            1,
            OpBody::RecallStart(RecallStart {
                id: "recall-1".into(),
                moment_id: id(),
                turn_id: turn(),
                marks: vec!["keep:zákaz vstupu".into()],
                device: "phone".into(),
            }),
            "08726563616c6c2d31fedf6af1d8303e61cd86c375e37fc9a001fee16af1d8303e61cd86c375e37fc9a00101126b6565703a7ac3a16b617a207673747570750570686f6e65",
        ),
        (
            OpKind::MessagePost,
            1,
            OpBody::MessagePost(MessagePost {
                id: Id::parse("01M34QZRVNRE3CTR9Y63CF2TQ2").unwrap(),
                thread_id: id(),
                body: "Was heißt das?".into(),
                device: "phone".into(),
            }),
            "fee26af1d8303e61cd86c375e37fc9a001fedf6af1d8303e61cd86c375e37fc9a0010f57617320686569c39f74206461733f0570686f6e65",
        ),
        (
            // The log's compaction record (FORMAT.md, "Compaction"): its
            // own fixed layout, not the codec's.
            OpKind::LogCompact,
            1,
            OpBody::LogCompact(spark_log_format::CompactionRecord {
                segments: vec![spark_log_format::SegmentRewrite {
                    first_seq: 1,
                    last_seq: 42,
                    old_seal: [0xaa; 32],
                    new_seal: [0xbb; 32],
                }],
                subjects: vec![id().0.to_be_bytes()],
            }),
            "0100000001000000000000002a00000000000000aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaabbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb0100000001a0c97fe375c386cd613e30d8f16adf",
        ),
    ]
}

/// (kind, erased op as read): the vectors' ops with content, erased as a
/// compaction writes them (SPEC section 13), `kind_version` 1 with
/// `ERASED_BIT`.
fn erased_vectors() -> Vec<(OpKind, OpBody)> {
    vectors()
        .into_iter()
        .filter(|(kind, ..)| kind.has_content())
        .map(|(kind, _, body, _)| (kind, body.erased()))
        .collect()
}

#[test]
fn erased_ops_keep_their_ids_and_lose_their_content() {
    let pinned = [
        (
            OpKind::MomentCreate,
            "fedf6af1d8303e61cd86c375e37fc9a00101086f7574626f782d310570686f6e6500000001fd40bf2abf40030000",
        ),
        (
            OpKind::MomentEdit,
            "fedf6af1d8303e61cd86c375e37fc9a001000570686f6e65000000",
        ),
        (
            OpKind::MessagePost,
            "fee26af1d8303e61cd86c375e37fc9a001fedf6af1d8303e61cd86c375e37fc9a001000570686f6e65",
        ),
    ];
    for (kind, body) in erased_vectors() {
        let op = Op::new(7, 1_788_310_020_000, body.clone());
        let (code, version, payload) = op.encode_erased().unwrap();
        assert_eq!(
            (code, version),
            (kind.code(), 1 | spark_core::op::ERASED_BIT),
            "{}",
            kind.name()
        );
        if let Some((_, hex_payload)) = pinned.iter().find(|(k, _)| *k == kind) {
            assert_eq!(
                hex::encode(&payload),
                *hex_payload,
                "{} bytes changed",
                kind.name()
            );
        }
        let record = RecordRef {
            seq: 7,
            ts_ms: 1_788_310_020_000,
            kind: code,
            kind_version: version,
            payload: &payload,
            offset: 64,
        };
        let read = Op::decode(&record).unwrap();
        assert!(read.erased, "{}", kind.name());
        assert_eq!(read.body, body, "{}", kind.name());
        assert_eq!(read.body.entity(), body.entity());
        assert_eq!(read.body.device(), body.device());
    }
}

#[test]
fn every_kind_has_a_vector() {
    let covered: Vec<OpKind> = vectors().iter().map(|v| v.0).collect();
    for kind in OpKind::ALL {
        assert!(
            covered.contains(&kind),
            "{} has no pinned vector",
            kind.name()
        );
    }
}

#[test]
fn every_kind_encodes_to_its_pinned_bytes_and_back() {
    for (kind, version, body, hex_payload) in vectors() {
        let (code, v, payload) = body.encode().unwrap();
        assert_eq!((code, v), (kind.code(), version), "{}", kind.name());
        assert_eq!(
            hex::encode(&payload),
            hex_payload,
            "{} bytes changed",
            kind.name()
        );
        let bytes = hex::decode(hex_payload).unwrap();
        let record = RecordRef {
            seq: 7,
            ts_ms: 1_788_310_020_000,
            kind: code,
            kind_version: version,
            payload: &bytes,
            offset: 64,
        };
        let op = Op::decode(&record).unwrap();
        assert_eq!(op.body, body);
        assert_eq!(op.seq, 7);
    }
}

#[test]
fn unknown_kinds_newer_versions_and_bad_payloads_are_errors_not_panics() {
    let (_, _, payload) = vectors()[0].2.encode().unwrap();
    let record = |kind, kind_version, payload: &[u8]| {
        Op::decode(&RecordRef {
            seq: 1,
            ts_ms: 0,
            kind,
            kind_version,
            payload,
            offset: 64,
        })
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    assert!(record(999, 1, &payload)
        .unwrap_err()
        .contains("unknown op kind"));
    assert!(record(1, 2, &payload).unwrap_err().contains("newer"));
    assert!(record(1, 1, &payload[..payload.len() - 1]).is_err());
    let mut longer = payload.clone();
    longer.push(0);
    assert!(record(1, 1, &longer).unwrap_err().contains("trailing"));
    // A string length prefix claiming 2^60 bytes: refused without allocating.
    let mut huge = payload[..17].to_vec();
    huge.extend_from_slice(&[1, 0xFD]);
    huge.extend_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(record(1, 1, &huge).is_err());
}
