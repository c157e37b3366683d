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

use crate::error::{FaultSeq, LogError};
use crate::format::{
    decode_record, le_u16, le_u32, le_u64, parse_segment_file_name, RecordDecode, RecordRef,
    SegmentHeader, Seq, HEADER_LEN, KIND_SEAL, RECORD_KIND_OFFSET, RECORD_KIND_VERSION_OFFSET,
    RECORD_MIN_LEN, RECORD_PAYLOAD_OFFSET, RECORD_SEQ_OFFSET, RECORD_TS_OFFSET,
};
use crate::fs::{Fs, OsFs};
use crate::reader::{LogReader, ScanOptions};
use crate::recovery::TornTail;
use crate::segment::{find_valid_record, reads_as_own_frame, OwnFrame};

/// A frame inside the damaged range whose header still reads: it may be a
/// whole record with a flipped bit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SalvagedRecord {
    /// Its seq: the one the log expects there (the frame's own `seq` field
    /// is that seq, unless the field itself is the damaged one).
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
        /// damaged frame" (three of a seal's `len`, kind 0, kind_version 1
        /// and the last record's seq, the checksum deciding between a seal
        /// and a record where both read alike): it holds no record.
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
///
/// The log is read as recovery reads it: no writer may be appending (the
/// engine's own refusal at startup, a stopped server's data directory).
/// Beside a running writer use [`damage_report_live`].
pub fn damage_report(dir: &Path, max_record_bytes: u32) -> Result<Option<DamageReport>, LogError> {
    damage_report_with(dir, Arc::new(OsFs), max_record_bytes, false)
}

/// [`damage_report`] on a log a writer may be appending to right now (the
/// tools on a running server's data directory): the log is read as
/// [`LogReader::open_live`] reads it, the view `spark-replay verify` has
/// there. A listing that raced with segment rolls (a seq gap) is read
/// again, and the last segment is read only as far as it continues after
/// its last valid commit mark: a batch being copied in, a roll in
/// progress and the zero fill ahead are neither damage nor a torn tail
/// (FORMAT.md, "Reading a live log"). So no damaged last frame is
/// reported either: recovery judges the tail at the next start.
pub fn damage_report_live(
    dir: &Path,
    max_record_bytes: u32,
) -> Result<Option<DamageReport>, LogError> {
    damage_report_with(dir, Arc::new(OsFs), max_record_bytes, true)
}

/// [`damage_report`] (or, with `live`, [`damage_report_live`]) over
/// another file seam.
pub fn damage_report_with(
    dir: &Path,
    fs: Arc<dyn Fs>,
    max_record_bytes: u32,
    live: bool,
) -> Result<Option<DamageReport>, LogError> {
    // The last record read before the damage: the reader's error names the
    // seq *expected* where the damage is at a segment header, so the last
    // good seq is taken from what was actually read instead.
    let mut last_read: Seq = 0;
    let verdict = LogReader::open_visiting(dir, fs.clone(), max_record_bytes, live, |record| {
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
        None => walk(
            bytes,
            offset,
            last_good_seq,
            max_record_bytes,
            matches!(fault, FaultSeq::Record(_)),
        ),
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
    if let FaultSeq::Record(seq) = fault {
        // The reader names the damaged frame a record (FORMAT.md, "Reading
        // a damaged frame"): its seq is damaged, whatever follows it.
        next_good_seq = next_good_seq.map(|next| next.max(seq.saturating_add(1)));
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
    // The commit mark of the tail's batch carries the seq of its last whole
    // record (none: the tail holds no record, so no mark can close it).
    let batch_last = torn
        .seqs
        .map(|(_, last)| last)
        .filter(|_| torn.unacknowledged);
    let role = damaged_frame_role(bytes, at, last_good_seq, batch_last);
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
            walk(bytes, torn.offset, last_good_seq, max_record_bytes, true).0,
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

/// The rule of FORMAT.md, "Reading a damaged frame", for the frame at `at`
/// of `bytes`: a seal after the last good seq `L`, else (when the tail
/// holds whole records, the last of them `batch_last`) the commit mark of
/// that batch, else a record. The same rule the reader names damage by
/// ([`reads_as_own_frame`]), so damage to any one field never changes what
/// the frame is read as, and a record is never read as a frame of the
/// log's own.
fn damaged_frame_role(
    bytes: &[u8],
    at: usize,
    last_good_seq: Seq,
    batch_last: Option<Seq>,
) -> DamagedFrameRole {
    if reads_as_own_frame(bytes, at, OwnFrame::seal(last_good_seq)) {
        DamagedFrameRole::Seal
    } else if batch_last
        .is_some_and(|last| reads_as_own_frame(bytes, at, OwnFrame::commit_mark(last)))
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

/// Walks from `offset` up to the first valid frame after the damage,
/// searched byte by byte ([`find_valid_record`]), which bounds the damaged
/// seqs: frames whose `len` is plausible and whose `seq` is the next one are
/// salvaged (CRC or not) and stepped over. A frame whose `seq` is the next
/// one but whose `len` runs past that valid frame or is no length (its
/// `len` is the damaged field), or whose `len` ends right at it but whose
/// `seq` is not the next one (its `seq` is), is salvaged too, up to that
/// frame, as the next seq, when it is the frame at `offset` and
/// `record_at_offset` (the reader read it as a record, not as a frame of
/// the log's own: FORMAT.md, "Reading a damaged frame"); nothing is
/// salvaged when the frame at `offset` is no record. A valid frame of the
/// log's own (a commit mark or a seal) repeats the seq of the record before
/// it, so the next good seq is the one after it.
fn walk(
    bytes: &[u8],
    offset: u64,
    last_good: Seq,
    max_record_bytes: u32,
    record_at_offset: bool,
) -> (Vec<SalvagedRecord>, Option<Seq>) {
    let mut salvaged = Vec::new();
    let Ok(mut at) = usize::try_from(offset) else {
        return (salvaged, None);
    };
    let first = at;
    if let RecordDecode::Record { record, .. } = decode_record(bytes, at, max_record_bytes) {
        if record.seq > last_good || record.kind == KIND_SEAL {
            return (salvaged, Some(next_good_after(&record)));
        }
    }
    let found = find_valid_record(bytes, at.saturating_add(1), last_good, max_record_bytes);
    let limit = found.map_or(bytes.len(), |(found_at, _)| found_at);
    // The guard bounds a walk over a whole segment of garbage.
    for (expect, _guard) in (last_good + 1..).zip(0..1_000_000u32) {
        let header = (
            le_u32(bytes, at),
            le_u64(bytes, at.saturating_add(RECORD_SEQ_OFFSET)),
            le_u64(bytes, at.saturating_add(RECORD_TS_OFFSET)),
            le_u16(bytes, at.saturating_add(RECORD_KIND_OFFSET)),
            le_u16(bytes, at.saturating_add(RECORD_KIND_VERSION_OFFSET)),
        );
        let (Some(len), Some(seq), Some(ts_ms), Some(kind), Some(kind_version)) = header else {
            break;
        };
        if at >= limit || !record_at_offset {
            break;
        }
        if let RecordDecode::Record { record, .. } = decode_record(bytes, at, max_record_bytes) {
            // A valid frame right after the salvaged ones (the search's seq
            // bound may have passed it by).
            if record.seq > last_good || record.kind == KIND_SEAL {
                return (salvaged, Some(next_good_after(&record)));
            }
        }
        // Only the frame the reader read as a record may have a damaged
        // `len` or `seq` field; after it, frames are salvaged only whole.
        let named = at == first;
        // Cast: u32 to usize is lossless on the targets we build for.
        let end = at
            .saturating_add(RECORD_SEQ_OFFSET)
            .saturating_add(len as usize);
        let plausible = (RECORD_MIN_LEN..=max_record_bytes).contains(&len);
        let end = if seq == expect && plausible && end <= limit {
            end
        } else if named && found.is_some() && seq == expect {
            // The `len` field is the damaged one.
            limit
        } else if named && found.is_some() && plausible && end == limit {
            // The `seq` field is the damaged one.
            limit
        } else {
            break;
        };
        let payload = bytes
            .get(at + RECORD_PAYLOAD_OFFSET..end)
            .unwrap_or(&[])
            .to_vec();
        salvaged.push(SalvagedRecord {
            seq: expect,
            // Cast: usize is at most 64 bits.
            offset: at as u64,
            ts_ms,
            kind,
            kind_version,
            payload,
        });
        at = end;
    }
    let next =
        found.map(
            |(found_at, seq)| match decode_record(bytes, found_at, max_record_bytes) {
                RecordDecode::Record { record, .. } => next_good_after(&record),
                _ => seq,
            },
        );
    (salvaged, next)
}

/// The first good seq at a valid frame after damage: a record's own; after
/// a frame of the log's own (a seal, a commit mark), which repeats the seq
/// of the record before it, the next one.
fn next_good_after(frame: &RecordRef<'_>) -> Seq {
    if frame.kind == KIND_SEAL {
        frame.seq.saturating_add(1)
    } else {
        frame.seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{
        encode_commit, encode_record, encode_seal, CommitMark, RecordIn, COMMIT_KIND_VERSION,
        SEAL_KIND_VERSION,
    };

    /// A seal after seq 7.
    fn seal() -> Vec<u8> {
        let mut out = Vec::new();
        encode_seal(&mut out, 7, 1_000, &[0xAB; 32]);
        out
    }

    /// The commit mark of a batch ending at seq 9.
    fn mark() -> Vec<u8> {
        let mut out = Vec::new();
        let mark = CommitMark {
            record_count: 2,
            batch_bytes: 200,
            batch_crc: 0xDEAD_BEEF,
        };
        encode_commit(&mut out, 9, 1_000, &mark);
        out
    }

    /// A record of seq `seq`, kind 3, kind_version `kind_version`, with a
    /// payload of `payload` bytes.
    fn record(seq: Seq, kind_version: u16, payload: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let payload = vec![0x5A; payload];
        let record = RecordIn {
            ts_ms: 1_000,
            kind: 3,
            kind_version,
            payload: &payload,
        };
        encode_record(&mut out, seq, &record).unwrap();
        out
    }

    /// `frame` with `byte` of its 28-byte header XORed with `mask`.
    fn flipped(frame: &[u8], byte: usize, mask: u8) -> Vec<u8> {
        let mut frame = frame.to_vec();
        frame[byte] ^= mask;
        frame
    }

    /// Every byte of the header, flipped: the frame is read as what it is.
    #[test]
    fn one_damaged_header_byte_never_changes_what_a_frame_is_read_as() {
        use DamagedFrameRole::*;
        let role = |f: &[u8]| damaged_frame_role(f, 0, 7, Some(9));
        // Records of a seal's and a mark's length and kind_version: their
        // kind or seq damaged into a seal's or a mark's value reads the
        // same as a seal or mark whose other field was damaged, and the
        // checksum tells them apart.
        let seal_sized = record(8, SEAL_KIND_VERSION, 32);
        let mark_sized = record(10, COMMIT_KIND_VERSION, 20);
        for byte in 0..RECORD_PAYLOAD_OFFSET {
            for mask in [0x01, 0x03, 0x0F, 0x80, 0xFF] {
                assert_eq!(role(&flipped(&seal(), byte, mask)), Seal, "{byte} {mask}");
                assert_eq!(
                    role(&flipped(&mark(), byte, mask)),
                    CommitMark,
                    "{byte} {mask}"
                );
                assert_eq!(
                    role(&flipped(&seal_sized, byte, mask)),
                    Record,
                    "{byte} {mask}"
                );
                assert_eq!(
                    role(&flipped(&mark_sized, byte, mask)),
                    Record,
                    "{byte} {mask}"
                );
                assert_eq!(
                    role(&flipped(&record(8, 1, 100), byte, mask)),
                    Record,
                    "{byte} {mask}"
                );
            }
        }
        // A mark needs a batch in the tail to close.
        assert_eq!(
            damaged_frame_role(&flipped(&mark(), 30, 1), 0, 7, None),
            Record
        );
    }

    #[test]
    fn a_record_of_a_seals_or_marks_length_is_a_record() {
        use DamagedFrameRole::*;
        // Whole records that fail their checksum (a payload byte flipped)
        // whose payload gives them a seal's or a mark's length.
        let seal_sized = flipped(&record(8, SEAL_KIND_VERSION, 32), 40, 1);
        let mark_sized = flipped(&record(10, COMMIT_KIND_VERSION, 20), 40, 1);
        assert_eq!(damaged_frame_role(&seal_sized, 0, 7, Some(9)), Record);
        assert_eq!(damaged_frame_role(&mark_sized, 0, 7, Some(9)), Record);
        // Two fields damaged into a seal's values (kind 0, seq 7): read as
        // a seal.
        let mut two = seal_sized.clone();
        two[RECORD_KIND_OFFSET..RECORD_KIND_OFFSET + 2].copy_from_slice(&0u16.to_le_bytes());
        two[RECORD_SEQ_OFFSET..RECORD_SEQ_OFFSET + 8].copy_from_slice(&7u64.to_le_bytes());
        assert_eq!(damaged_frame_role(&two, 0, 7, Some(9)), Seal);
    }
}
