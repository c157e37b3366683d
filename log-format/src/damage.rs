//! Damage reports: when the log is corrupt, what lies between the damaged
//! place and the next valid record, so the clients that still hold those
//! captures can send them again.
//!
//! [`damage_report`] runs the reader's checks, noting the last record they
//! read; at the first corruption it walks the damaged segment from the
//! damaged offset, salvaging every frame whose `len` and `seq` still fit
//! even though its CRC does not (its payload may still decode into an op
//! naming its entity and request id), and looks for the next valid record to
//! bound the damaged seq range. A seq gap at a segment header (whole segment
//! files missing) is bounded by that header's first seq instead.

use std::path::Path;
use std::sync::Arc;

use crate::error::LogError;
use crate::format::{
    decode_record, le_u16, le_u32, le_u64, parse_segment_file_name, RecordDecode, SegmentHeader,
    Seq, HEADER_LEN, KIND_SEAL, RECORD_KIND_OFFSET, RECORD_KIND_VERSION_OFFSET, RECORD_MIN_LEN,
    RECORD_PAYLOAD_OFFSET, RECORD_SEQ_OFFSET, RECORD_TS_OFFSET,
};
use crate::fs::{Fs, OsFs};
use crate::reader::{LogReader, ScanOptions};
use crate::segment::find_valid_record;

/// A frame inside the damaged range whose header still reads: it may be a
/// whole record with a flipped bit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SalvagedRecord {
    /// Its seq, as written.
    pub seq: Seq,
    /// Byte offset in the damaged segment.
    pub offset: u64,
    /// Its server time, as written (may itself be damaged).
    pub ts_ms: u64,
    /// Its kind code.
    pub kind: u16,
    /// Its kind version.
    pub kind_version: u16,
    /// Its payload bytes (the CRC does not vouch for them).
    pub payload: Vec<u8>,
}

/// What is known about the first corruption of a log.
#[derive(Clone, Debug)]
pub struct DamageReport {
    /// The error the reader refused the log with (segment, offset, seq, reason).
    pub error: String,
    /// The damaged segment's file name.
    pub segment: String,
    /// Where the damage starts in it.
    pub offset: u64,
    /// The seq of the last record read before the damage (0 when none was):
    /// the damaged range starts right after it. (The reader's error names
    /// the seq a segment was expected to start at where the damage is at
    /// its header; this is always the last record actually read.)
    pub last_good_seq: Seq,
    /// The first valid seq after the damage, if any (in this segment or a
    /// later one).
    pub next_good_seq: Option<Seq>,
    /// Frames in the damaged range whose headers still read.
    pub salvaged: Vec<SalvagedRecord>,
}

impl DamageReport {
    /// The damaged seqs: from the last good one + 1 to the next good one - 1
    /// (open-ended when no valid record follows). `None` when the damage
    /// hides no record (e.g. a header or a seal).
    pub fn damaged_seqs(&self) -> Option<(Seq, Option<Seq>)> {
        let first = self.last_good_seq + 1;
        match self.next_good_seq {
            Some(next) if next <= first => None,
            Some(next) => Some((first, Some(next - 1))),
            None => Some((first, None)),
        }
    }
}

/// Checks the log in `dir` like `spark-replay verify` (checksums, seqs,
/// headers, seals, chain) and, at the first corruption, reports what it
/// can. `Ok(None)` when the log is whole.
pub fn damage_report(dir: &Path, max_record_bytes: u32) -> Result<Option<DamageReport>, LogError> {
    damage_report_with(dir, Arc::new(OsFs), max_record_bytes)
}

/// [`damage_report`] over another file seam.
pub fn damage_report_with(
    dir: &Path,
    fs: Arc<dyn Fs>,
    max_record_bytes: u32,
) -> Result<Option<DamageReport>, LogError> {
    // The last record read before the damage: the reader's error names the
    // seq *expected* where the damage is at a segment header, so the last
    // good seq is taken from what was actually read instead.
    let mut last_read: Seq = 0;
    let verdict = LogReader::open_visiting(dir, fs.clone(), max_record_bytes, |record| {
        last_read = record.seq;
    })
    .and_then(|reader| {
        // The scan reads again from the first record.
        last_read = 0;
        let options = ScanOptions {
            verify_chain: true,
            max_record_bytes,
        };
        reader.scan(options, |_, record| {
            last_read = record.seq;
            std::ops::ControlFlow::Continue(())
        })
    });
    let (segment, offset, error) = match verdict {
        Ok(_) => return Ok(None),
        Err(e @ LogError::Corrupt { .. }) => {
            let LogError::Corrupt {
                segment, offset, ..
            } = &e
            else {
                return Err(e);
            };
            (segment.clone(), *offset, e.to_string())
        }
        Err(other) => return Err(other),
    };
    let last_good_seq = last_read;
    let map = fs
        .map(&dir.join(&segment))
        .map_err(|e| LogError::io("map", dir.join(&segment), e))?;
    let bytes: &[u8] = (*map).as_ref();
    let (salvaged, mut next_good_seq) = match header_gap(&segment, bytes, offset, last_good_seq) {
        // Whole segment files are missing: their records are nowhere to
        // salvage, and this segment's first record is the next good one.
        Some(first_seq) => (Vec::new(), Some(first_seq)),
        None => walk(bytes, offset, last_good_seq, max_record_bytes),
    };
    if next_good_seq.is_none() {
        // No valid record after the damage in this segment: the next
        // segment, if any, starts at a known seq.
        let this = parse_segment_file_name(&segment).unwrap_or(0);
        next_good_seq = fs
            .list(dir)
            .map_err(|e| LogError::io("list", dir, e))?
            .iter()
            .filter_map(|p| p.file_name()?.to_str().and_then(parse_segment_file_name))
            .filter(|&first| first > this)
            .min();
    }
    Ok(Some(DamageReport {
        error,
        segment,
        offset,
        last_good_seq,
        next_good_seq,
        salvaged,
    }))
}

/// When the damage at `offset` of segment `name` is a seq gap at its header
/// (a whole segment file missing before it, or a first segment that does
/// not start at seq 1): the header is valid, agrees with the file name and
/// starts after `last_good + 1`. Returns that first seq, the next good one.
fn header_gap(name: &str, bytes: &[u8], offset: u64, last_good: Seq) -> Option<Seq> {
    // Cast: usize is at most 64 bits.
    if offset >= HEADER_LEN as u64 {
        return None;
    }
    let header = SegmentHeader::decode(bytes).ok()?;
    let first_seq = header.first_seq;
    (parse_segment_file_name(name) == Some(first_seq) && first_seq > last_good.saturating_add(1))
        .then_some(first_seq)
}

/// Walks from `offset`: frames whose `len` is plausible and whose `seq` is
/// the next one are salvaged (CRC or not) and stepped over; at the first
/// frame that does not read, the next valid record is searched byte by byte.
fn walk(
    bytes: &[u8],
    offset: u64,
    last_good: Seq,
    max_record_bytes: u32,
) -> (Vec<SalvagedRecord>, Option<Seq>) {
    let mut salvaged = Vec::new();
    let Ok(mut at) = usize::try_from(offset) else {
        return (salvaged, None);
    };
    // The guard bounds a walk over a whole segment of garbage.
    for (expect, _guard) in (last_good + 1..).zip(0..1_000_000u32) {
        if let RecordDecode::Record { record, .. } = decode_record(bytes, at, max_record_bytes) {
            if record.kind == KIND_SEAL {
                // The seal names the segment's last seq: the next one is good.
                return (salvaged, Some(record.seq + 1));
            }
            if record.seq > last_good {
                return (salvaged, Some(record.seq));
            }
        }
        let header = (
            le_u32(bytes, at),
            le_u64(bytes, at + RECORD_SEQ_OFFSET),
            le_u64(bytes, at + RECORD_TS_OFFSET),
            le_u16(bytes, at + RECORD_KIND_OFFSET),
            le_u16(bytes, at + RECORD_KIND_VERSION_OFFSET),
        );
        let (Some(len), Some(seq), Some(ts_ms), Some(kind), Some(kind_version)) = header else {
            break;
        };
        // Cast: u32 to usize is lossless on the targets we build for.
        let end = at + RECORD_SEQ_OFFSET + len as usize;
        if seq != expect || !(RECORD_MIN_LEN..=max_record_bytes).contains(&len) || end > bytes.len()
        {
            break;
        }
        let payload = bytes
            .get(at + RECORD_PAYLOAD_OFFSET..end)
            .unwrap_or(&[])
            .to_vec();
        salvaged.push(SalvagedRecord {
            seq,
            // Cast: usize is at most 64 bits.
            offset: at as u64,
            ts_ms,
            kind,
            kind_version,
            payload,
        });
        at = end;
    }
    let next = find_valid_record(bytes, at + 1, last_good, max_record_bytes).map(|(_, seq)| seq);
    (salvaged, next)
}
