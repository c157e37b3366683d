//! Pins the payload bytes of every op kind at its current version (bincode
//! 2.0.1, standard configuration, behind `spark_engine::codec`). If this
//! test fails, the encoding changed: old logs would no longer read. Add a
//! new kind version instead, and keep the old vector here forever.

use spark_engine::ids::Id;
use spark_engine::op::{
    MediaPut, MediaRole, MomentCreate, MomentDelete, MomentEdit, Op, OpBody, OpKind, Sha256,
};
use spark_log_format::RecordRef;

fn id() -> Id {
    Id::parse("01M34QZRVNRE3CTR9Y63CF2TPZ").unwrap()
}

/// (kind, version, op, payload hex): the committed vectors of format v1.
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
            OpKind::MediaPut,
            1,
            OpBody::MediaPut(MediaPut {
                id: Id::parse("01M34QZRVNRE3CTR9Y63CF2TQ0").unwrap(),
                moment_id: id(),
                role: MediaRole::Original,
                sha256: Sha256([0xAB; 32]),
                size_bytes: 3_145_728,
                content_type: "image/jpeg".into(),
                device: "phone".into(),
            }),
            "fee06af1d8303e61cd86c375e37fc9a001fedf6af1d8303e61cd86c375e37fc9a00101ababababababababababababababababababababababababababababababababfc000030000a696d6167652f6a7065670570686f6e65",
        ),
    ]
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
