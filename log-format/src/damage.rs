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
//!
//! A whole last frame that fails its checksum is reported too
//! ([`last_frame_report`]): recovery cuts it as a torn tail, but it may be
//! an acknowledged record that was damaged, which the bytes cannot tell
//! from a torn write (FORMAT.md, "Torn and corrupt, exactly").

use std::path::Path;
use std::sync::Arc;

use crate::error::LogError;
use crate::format::{
    decode_record, le_u16, le_u32, le_u64, parse_segment_file_name, RecordDecode, SegmentHeader,
    Seq, COMMIT_KIND_VERSION, COMMIT_RECORD_BYTES, HEADER_LEN, KIND_SEAL, RECORD_KIND_OFFSET,
    RECORD_KIND_VERSION_OFFSET, RECORD_MIN_LEN, RECORD_PAYLOAD_OFFSET, RECORD_SEQ_OFFSET,
    RECORD_TS_OFFSET, SEAL_KIND_VERSION, SEAL_RECORD_BYTES,
};
use crate::fs::{Fs, OsFs};
use crate::reader::{LogReader, ScanOptions};
use crate::recovery::TornTail;
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

/// Which kind of damage a [`DamageReport`] describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DamageKind {
    /// Bytes that do not verify and are not a torn tail: the reader and
    /// recovery refuse the log with [`LogError::Corrupt`].
    Corrupt,
    /// The last frame of the log is whole (its `len` fits the file) but
    /// fails its checksum, and no valid record follows it: either a torn
    /// write (never acknowledged) or an acknowledged record (or seal)
    /// damaged since, which the bytes cannot tell apart (FORMAT.md, "Torn
    /// and corrupt, exactly"). Recovery cuts it as a torn tail and keeps a
    /// copy; `spark-replay verify` reports it as a fault.
    DamagedOrTornLastFrame {
        /// The frame reads as a seal by the rule of FORMAT.md, "Reading a
        /// damaged last frame" (a seal's `len`, and two of kind 0,
        /// kind_version 1, the last record's seq): it holds no record.
        seal: bool,
        /// Only zero bytes follow the frame, so its seq is the only one
        /// damaged; otherwise the non-zero bytes after it may be more
        /// records of the same torn batch.
        zeros_after: bool,
        /// Version 2: the frame is the commit mark of the last batch, whose
        /// records (the last good seq + 1 up to this seq) are cut with it.
        batch_last: Option<Seq>,
    },
}

/// What is known about the first corruption of a log, or about a damaged or
/// torn last frame (see [`DamageKind`]).
#[derive(Clone, Debug)]
pub struct DamageReport {
    /// Which kind of damage this is.
    pub kind: DamageKind,
    /// For [`DamageKind::Corrupt`], the error the reader refused the log
    /// with (segment, offset, seq, reason), word for word what `spark-replay
    /// verify` prints; for a damaged or torn last frame, the fault `verify`
    /// reports (segment, offset, the seq, and both possible causes).
    pub error: String,
    /// The damaged segment's file name.
    pub segment: String,
    /// Where the damage starts in it.
    pub offset: u64,
    /// The seq of the last record read before the damage (0 when none was):
    /// the damaged range starts right after it. (The reader's error names
    /// the damaged frame's seq, [`FaultSeq`](crate::FaultSeq): for a
    /// damaged record its own seq, this + 1; this is always the last record
    /// actually read.)
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
    /// hides no record (a batch's commit mark, a segment header or a seal). For a damaged or torn last
    /// frame: its seq (the last good one + 1), open-ended when non-zero
    /// bytes follow the frame, `None` when the frame is a seal.
    pub fn damaged_seqs(&self) -> Option<(Seq, Option<Seq>)> {
        let first = self.last_good_seq.saturating_add(1);
        if let DamageKind::DamagedOrTornLastFrame {
            seal,
            zeros_after,
            batch_last,
        } = self.kind
        {
            if let Some(last) = batch_last {
                return Some((first, Some(last)));
            }
            return (!seal).then_some((first, zeros_after.then_some(first)));
        }
        match self.next_good_seq {
            Some(next) if next <= first => None,
            Some(next) => Some((first, Some(next - 1))),
            None => Some((first, None)),
        }
    }
}

/// Checks the log in `dir` like `spark-replay verify` (checksums, seqs,
/// headers, seals, chain) and, at the first corruption, reports what it
/// can. A whole last frame that fails its checksum, which recovery cuts as a
/// torn tail but `verify` reports as a fault, is reported too
/// ([`DamageKind::DamagedOrTornLastFrame`]). `Ok(None)` when the log is
/// whole, or ends in a torn tail that is no whole frame (a torn write,
/// which `verify` only notes).
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
    let verdict = LogReader::open_visiting(dir, fs.clone(), max_record_bytes, false, |record| {
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
    let (segment, offset, error, fault) = match verdict {
        Ok(scan) => {
            return match &scan.torn_tail {
                Some(torn) => {
                    last_frame_report_with(dir, &fs, torn, scan.head.seq, max_record_bytes)
                }
                None => Ok(None),
            }
        }
        Err(e @ LogError::Corrupt { .. }) => {
            let LogError::Corrupt {
                segment,
                offset,
                seq,
                ..
            } = &e
            else {
                return Err(e);
            };
            (segment.clone(), *offset, e.to_string(), *seq)
        }
        Err(other) => return Err(other),
    };
    // Past a header, the error's seq says which whole record the walk read
    // last: in version 2 records of a batch are read (intact) before they
    // are visited, which waits for the batch's commit mark.
    let last_good_seq = match fault.last_walked() {
        Some(walked) => last_read.max(walked),
        None => last_read,
    };
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
        kind: DamageKind::Corrupt,
        error,
        segment,
        offset,
        last_good_seq,
        next_good_seq,
        salvaged,
    }))
}

/// The report on the torn tail `torn` of the log in `dir`, found after seq
/// `last_good_seq` (the head), when it is a whole frame that fails its
/// checksum ([`TornTail::whole_frame`]): a torn write or a damaged
/// acknowledged record (or seal), which the bytes cannot tell apart.
/// `Ok(None)` for any other torn tail (a torn write). `spark-replay verify`
/// reports the fault with this report's `error`.
pub fn last_frame_report(
    dir: &Path,
    torn: &TornTail,
    last_good_seq: Seq,
    max_record_bytes: u32,
) -> Result<Option<DamageReport>, LogError> {
    let fs: Arc<dyn Fs> = Arc::new(OsFs);
    last_frame_report_with(dir, &fs, torn, last_good_seq, max_record_bytes)
}

/// [`last_frame_report`] over another file seam.
fn last_frame_report_with(
    dir: &Path,
    fs: &Arc<dyn Fs>,
    torn: &TornTail,
    last_good_seq: Seq,
    max_record_bytes: u32,
) -> Result<Option<DamageReport>, LogError> {
    if !torn.whole_frame {
        return Ok(None);
    }
    let path = dir.join(&torn.segment);
    let map = fs.map(&path).map_err(|e| LogError::io("map", &path, e))?;
    let bytes: &[u8] = (*map).as_ref();
    // Out of range (the file shrank since it was read) reads as nothing.
    let at = usize::try_from(torn.damage_offset).unwrap_or(usize::MAX);
    let len = le_u32(bytes, at);
    let frame_end = len
        .and_then(|len| usize::try_from(len).ok())
        .and_then(|len| at.checked_add(RECORD_SEQ_OFFSET)?.checked_add(len))
        .unwrap_or(usize::MAX);
    let zeros_after = bytes
        .get(frame_end..)
        .unwrap_or(&[])
        .iter()
        .all(|&b| b == 0);
    let fields = FrameFields {
        len,
        seq: le_u64(bytes, at.saturating_add(RECORD_SEQ_OFFSET)),
        kind: le_u16(bytes, at.saturating_add(RECORD_KIND_OFFSET)),
        kind_version: le_u16(bytes, at.saturating_add(RECORD_KIND_VERSION_OFFSET)),
    };
    // The commit mark of the tail's batch carries the seq of its last whole
    // record (none: the tail holds no record, so no mark can close it).
    let batch_last = torn
        .seqs
        .map(|(_, last)| last)
        .filter(|_| torn.unacknowledged);
    let role = damaged_frame_role(fields, last_good_seq, batch_last);
    let seal = role == DamagedFrameRole::Seal;
    let batch_last = batch_last.filter(|_| role == DamagedFrameRole::CommitMark);
    let seq = last_good_seq.saturating_add(1);
    let place = format!(
        "segment {} at offset {} (after seq {last_good_seq})",
        torn.segment, torn.damage_offset
    );
    let cut = "The engine will cut it at its next start and keep a copy in the log directory";
    let (salvaged, error) = if seal {
        (
            Vec::new(),
            format!(
                "{place}: the last frame, a seal, is whole but fails its checksum ({}); it is \
                 either a torn write of the seal or a damaged seal (the bytes cannot tell \
                 which), and holds no record. {cut}",
                torn.damage
            ),
        )
    } else if let Some(last) = batch_last {
        (
            whole_records(bytes, torn.offset, at, max_record_bytes),
            format!(
                "{place}: the last frame, the commit mark of the batch of seqs {seq}..={last}, \
                 is whole but fails its checksum ({}); it is either a torn write of that batch \
                 (never acknowledged) or a damaged commit mark of an acknowledged batch (the \
                 bytes cannot tell which). {cut}, with the batch's records",
                torn.damage
            ),
        )
    } else {
        (
            walk(bytes, torn.offset, last_good_seq, max_record_bytes).0,
            format!(
                "{place}: the last record (seq {seq}) is whole but fails its checksum ({}); it \
                 is either a torn write (never acknowledged) or a damaged acknowledged record \
                 (the bytes cannot tell which). {cut}",
                torn.damage
            ),
        )
    };
    Ok(Some(DamageReport {
        kind: DamageKind::DamagedOrTornLastFrame {
            seal,
            zeros_after,
            batch_last,
        },
        error,
        segment: torn.segment.clone(),
        offset: torn.offset,
        last_good_seq,
        next_good_seq: None,
        salvaged,
    }))
}

/// The identifying fields of a frame that fails its checksum, as read
/// (any of them may be damaged; `None` past the end of the file).
#[derive(Clone, Copy, Debug)]
struct FrameFields {
    len: Option<u32>,
    seq: Option<Seq>,
    kind: Option<u16>,
    kind_version: Option<u16>,
}

/// What a whole last frame that fails its checksum is read as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DamagedFrameRole {
    /// A seal: it holds no record.
    Seal,
    /// The commit mark of the tail's batch.
    CommitMark,
    /// A record (seq `L + 1`).
    Record,
}

/// The rule of FORMAT.md, "Reading a damaged last frame": a frame is read
/// as a seal (or a commit mark) when its `len` field is a seal's, 52 (a
/// commit mark's, 40), and at least two of its three other identifying
/// fields hold a seal's values: `kind` 0, `kind_version` 1, `seq` = the
/// last good seq `L` (a commit mark's: `kind` 0, `kind_version` 2, `seq` =
/// `batch_last`, the last whole record of the tail's batch, when there is
/// one). So damage to any one of those three fields never changes what the
/// frame is read as; anything else is read as a record.
fn damaged_frame_role(
    fields: FrameFields,
    last_good_seq: Seq,
    batch_last: Option<Seq>,
) -> DamagedFrameRole {
    // Casts: a seal frame is 60 bytes, a commit mark 48.
    let seal_len = (SEAL_RECORD_BYTES - RECORD_SEQ_OFFSET) as u32;
    let commit_len = (COMMIT_RECORD_BYTES - RECORD_SEQ_OFFSET) as u32;
    let agree = |kind_version: u16, seq: Option<Seq>| {
        [
            fields.kind == Some(KIND_SEAL),
            fields.kind_version == Some(kind_version),
            seq.is_some() && fields.seq == seq,
        ]
        .iter()
        .filter(|&&holds| holds)
        .count()
            >= 2
    };
    if fields.len == Some(seal_len) && agree(SEAL_KIND_VERSION, Some(last_good_seq)) {
        DamagedFrameRole::Seal
    } else if batch_last.is_some()
        && fields.len == Some(commit_len)
        && agree(COMMIT_KIND_VERSION, batch_last)
    {
        DamagedFrameRole::CommitMark
    } else {
        DamagedFrameRole::Record
    }
}

/// The whole records from `from` up to `to` (a batch whose commit mark at
/// `to` fails its checksum: its records are intact, but cut with it).
fn whole_records(bytes: &[u8], from: u64, to: usize, max_record_bytes: u32) -> Vec<SalvagedRecord> {
    let mut records = Vec::new();
    let mut at = usize::try_from(from).unwrap_or(usize::MAX);
    while at < to {
        let RecordDecode::Record { record, size } = decode_record(bytes, at, max_record_bytes)
        else {
            break;
        };
        records.push(SalvagedRecord {
            seq: record.seq,
            offset: record.offset,
            ts_ms: record.ts_ms,
            kind: record.kind,
            kind_version: record.kind_version,
            payload: record.payload.to_vec(),
        });
        at += size;
    }
    records
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields of a seal after seq 7 (`len` 52, kind 0, kind_version 1).
    fn seal() -> FrameFields {
        FrameFields {
            len: Some(52),
            seq: Some(7),
            kind: Some(KIND_SEAL),
            kind_version: Some(SEAL_KIND_VERSION),
        }
    }

    /// The fields of the commit mark of a batch ending at seq 9.
    fn mark() -> FrameFields {
        FrameFields {
            len: Some(40),
            seq: Some(9),
            kind: Some(KIND_SEAL),
            kind_version: Some(COMMIT_KIND_VERSION),
        }
    }

    #[test]
    fn one_damaged_field_never_changes_what_a_frame_is_read_as() {
        use DamagedFrameRole::*;
        let role = |f: FrameFields| damaged_frame_role(f, 7, Some(9));
        assert_eq!(role(seal()), Seal);
        assert_eq!(
            role(FrameFields {
                kind: Some(4),
                ..seal()
            }),
            Seal
        );
        assert_eq!(
            role(FrameFields {
                kind_version: Some(9),
                ..seal()
            }),
            Seal
        );
        assert_eq!(
            role(FrameFields {
                seq: Some(1 << 40),
                ..seal()
            }),
            Seal
        );
        assert_eq!(role(mark()), CommitMark);
        assert_eq!(
            role(FrameFields {
                kind: Some(4),
                ..mark()
            }),
            CommitMark
        );
        assert_eq!(
            role(FrameFields {
                kind_version: Some(1),
                ..mark()
            }),
            CommitMark
        );
        assert_eq!(
            role(FrameFields {
                seq: Some(3),
                ..mark()
            }),
            CommitMark
        );
        // A mark needs a batch in the tail to close.
        assert_eq!(damaged_frame_role(mark(), 7, None), Record);
    }

    #[test]
    fn a_record_of_a_seals_or_marks_length_is_a_record() {
        use DamagedFrameRole::*;
        // A record (seq L + 1, a non-zero kind, kind_version 1) whose
        // payload happens to give it a seal's or a mark's length.
        let record = |len| FrameFields {
            len: Some(len),
            seq: Some(8),
            kind: Some(3),
            kind_version: Some(1),
        };
        assert_eq!(damaged_frame_role(record(52), 7, Some(9)), Record);
        assert_eq!(damaged_frame_role(record(40), 7, Some(9)), Record);
        // Two fields damaged into a seal's values: read as a seal.
        let two = FrameFields {
            kind: Some(KIND_SEAL),
            seq: Some(7),
            ..record(52)
        };
        assert_eq!(damaged_frame_role(two, 7, Some(9)), Seal);
        // A seal's fields with another length: not a seal.
        assert_eq!(
            damaged_frame_role(
                FrameFields {
                    len: Some(60),
                    ..seal()
                },
                7,
                None
            ),
            Record
        );
    }
}
