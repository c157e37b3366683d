//! What a damaged log held: the damaged seq range and, for the damaged
//! records that still decode, their op kind, entity id, request id and
//! device, so the clients that still hold those captures can send them
//! again ("Damage reports"). The server's refusal to start and
//! `spark-replay audit damage` both print it.

use serde::Serialize;
use spark_log_format::{DamageKind, DamageReport, RecordRef};

use crate::op::Op;

/// One damaged record, as far as it still decodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DamagedOp {
    /// Its seq, as written.
    pub seq: u64,
    /// Byte offset in its segment.
    pub offset: u64,
    /// The op kind name, or `unknown(<code>)`.
    pub kind: String,
    /// The entity it was about, when the payload still decodes.
    pub entity_id: Option<String>,
    /// Its request id, when the payload still decodes and carries one.
    pub request_id: Option<String>,
    /// The device that sent it, when the payload still decodes.
    pub device: Option<String>,
}

/// The damaged records of a report, decoded where they still decode.
pub fn salvage(report: &DamageReport) -> Vec<DamagedOp> {
    report
        .salvaged
        .iter()
        .map(|s| {
            let record = RecordRef {
                seq: s.seq,
                ts_ms: s.ts_ms,
                kind: s.kind,
                kind_version: s.kind_version,
                payload: &s.payload,
                offset: s.offset,
            };
            let kind = crate::op::OpKind::from_code(s.kind)
                .map(|k| k.name().to_owned())
                .unwrap_or_else(|| format!("unknown({})", s.kind));
            match Op::decode(&record) {
                Ok(op) => DamagedOp {
                    seq: s.seq,
                    offset: s.offset,
                    kind,
                    entity_id: Some(op.body.entity().to_string()),
                    request_id: op.body.request_id().map(str::to_owned),
                    device: Some(op.body.device().to_owned()),
                },
                Err(_) => DamagedOp {
                    seq: s.seq,
                    offset: s.offset,
                    kind,
                    entity_id: None,
                    request_id: None,
                    device: None,
                },
            }
        })
        .collect()
}

/// The damaged range as text: `seq 5..=7`, `seq 5 and later`, or, when
/// the damaged frame holds no op (a batch's commit mark, a segment header
/// or a seal: the next valid record is the next seq), `no op: the damaged
/// frame lies between seq 4 and seq 5 (a commit mark, a segment header or
/// a seal)`.
pub fn range_text(report: &DamageReport) -> String {
    match report.damaged_seqs() {
        None => format!(
            "no op: the damaged frame lies between seq {} and seq {} (a commit mark, a segment header or a seal)",
            report.last_good_seq,
            report.last_good_seq.saturating_add(1)
        ),
        Some((first, Some(last))) if first == last => format!("seq {first}"),
        Some((first, Some(last))) => format!("seq {first}..={last}"),
        Some((first, None)) => format!("seq {first} and later"),
    }
}

/// One paragraph for people: the error, the damaged range, what the
/// damaged records were about where they still decode, and what to do
/// (the devices named may send their captures again; when none is named,
/// only a restore brings the records back, and when no record is damaged,
/// no capture is missing).
pub fn summary(report: &DamageReport) -> String {
    let mut text = format!(
        "{}\ndamaged: {} (segment {} from offset {})",
        report.error,
        range_text(report),
        report.segment,
        report.offset
    );
    let ops = salvage(report);
    let devices_named = ops.iter().any(|op| op.device.is_some());
    if !ops.is_empty() {
        // The names come from bytes that failed their checksum: the flipped
        // byte may be inside one of them.
        text.push_str(
            "\nas decoded from the damaged bytes (they failed their checksum, so a name \
             below may hold the damage itself):",
        );
    }
    for op in ops {
        text.push_str(&format!(
            "\n  seq {} {}: entity {}, request {}, device {}",
            op.seq,
            op.kind,
            op.entity_id.as_deref().unwrap_or("(does not decode)"),
            op.request_id.as_deref().unwrap_or("-"),
            op.device.as_deref().unwrap_or("-"),
        ));
    }
    match report.kind {
        DamageKind::Corrupt if devices_named => text.push_str("\nthe devices named can send these captures again with the same ids once the engine runs on a restored log (docs/operations.md, \"A damaged log\")"),
        DamageKind::Corrupt if report.damaged_seqs().is_some() => text.push_str("\nno damaged record still decodes far enough to name its device: restore the log from an archive or a replica (docs/operations.md, \"A damaged log\"); without one, the log does not say which devices sent these captures"),
        DamageKind::Corrupt => text.push_str("\nno record is damaged, so no capture needs sending again; the engine still refuses the log until the segment is restored from an archive or a replica (docs/operations.md, \"A damaged log\")"),
        DamageKind::DamagedOrTornLastFrame { seal: true, .. } => {}
        DamageKind::DamagedOrTornLastFrame { seal: false, .. } => text.push_str("\nif it was acknowledged, the client holding that capture can send it again once the engine has cut it"),
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use spark_log_format::SalvagedRecord;

    /// A corrupt-log report on `damaged` (its records) after seq 4, whose
    /// next good seq is `next`.
    fn report(salvaged: Vec<SalvagedRecord>, next: Option<u64>) -> DamageReport {
        DamageReport {
            kind: DamageKind::Corrupt,
            error: "corrupt log: segment 00000000000000000001.seg at offset 900 (seq 5): \
                    record checksum mismatch"
                .into(),
            segment: "00000000000000000001.seg".into(),
            offset: 900,
            last_good_seq: 4,
            next_good_seq: next,
            salvaged,
        }
    }

    /// Seq 5 as a damaged record: a `moment.create` from `phone-1` when
    /// `decodes`, else bytes that decode to no op.
    fn record(decodes: bool) -> SalvagedRecord {
        let (kind, kind_version, payload) = crate::synth::moment_create(5).encode().unwrap();
        SalvagedRecord {
            seq: 5,
            offset: 900,
            ts_ms: 1,
            kind,
            kind_version,
            payload: if decodes { payload } else { vec![0xff; 3] },
        }
    }

    const DEVICES_NAMED: &str = "the devices named can send these captures again";

    #[test]
    fn the_devices_are_asked_to_send_again_only_when_named() {
        let named = summary(&report(vec![record(true)], Some(6)));
        assert!(named.contains("device phone-1"), "{named}");
        assert!(named.contains(DEVICES_NAMED), "{named}");
        // The names are said to come from damaged bytes.
        assert!(
            named.contains("as decoded from the damaged bytes"),
            "{named}"
        );

        // Damaged records, none of which decodes (or none salvaged, as
        // for a missing segment file): no device is named.
        for salvaged in [vec![record(false)], vec![]] {
            let unnamed = summary(&report(salvaged, Some(6)));
            assert!(unnamed.contains("damaged: seq 5"), "{unnamed}");
            assert!(!unnamed.contains(DEVICES_NAMED), "{unnamed}");
            assert!(
                unnamed.contains("no damaged record still decodes far enough to name its device"),
                "{unnamed}"
            );
        }

        // No record damaged (a commit mark, a header, a seal): no capture
        // is missing.
        let none = summary(&report(vec![], Some(5)));
        assert!(none.contains("damaged: no op"), "{none}");
        assert!(!none.contains(DEVICES_NAMED), "{none}");
        assert!(
            none.contains("no record is damaged, so no capture needs sending again"),
            "{none}"
        );
    }
}
