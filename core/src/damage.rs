//! What a damaged log held: the damaged seq range and, for the damaged
//! records that still decode, their op kind, entity id, request id and
//! device, so the clients that still hold those captures can send them
//! again (issue 6, "Damage reports"). The server's refusal to start and
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
/// damaged records were about where they still decode, and what to do.
pub fn summary(report: &DamageReport) -> String {
    let mut text = format!(
        "{}\ndamaged: {} (segment {} from offset {})",
        report.error,
        range_text(report),
        report.segment,
        report.offset
    );
    for op in salvage(report) {
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
        DamageKind::Corrupt => text.push_str("\nthe devices named can send these captures again with the same ids once the engine runs on a restored log (README \"A damaged log\")"),
        DamageKind::DamagedOrTornLastFrame { seal: true, .. } => {}
        DamageKind::DamagedOrTornLastFrame { seal: false, .. } => text.push_str("\nif it was acknowledged, the client holding that capture can send it again once the engine has cut it"),
    }
    text
}
