//! Committed ops read back from the local log with their event cursors
//! ([`EventCursor`]): what `/api/events` catches up from, checks
//! a client's cursor against, and what a read replica publishes.
//!
//! An op's cursor is its seq and the chain value at the end of the batch
//! that holds it (after its commit mark; in a format-version-1 segment,
//! which has no marks, after the op's own record). A log is only ever cut
//! at a batch's end (recovery, `restore --at`, the archive's chunks), so
//! two logs that share a batch have the same bytes up to its end and the
//! same cursors for its ops, and two that differ at or before an op's
//! batch have other cursors for it: a cursor names its history.

use std::ops::ControlFlow;
use std::path::Path;

use spark_core::wire::events::EventCursor;
use spark_log_format::format::{
    chain_hasher, parse_segment_file_name, segment_file_name, SegmentHeader,
};
use spark_log_format::{FrameKind, Frames, FORMAT_VERSION, HEADER_LEN};

use spark_core::op::Op;

/// The first seqs of the segment files in `log_dir`, in order.
pub fn segment_firsts(log_dir: &Path) -> Result<Vec<u64>, String> {
    let mut firsts: Vec<u64> = std::fs::read_dir(log_dir)
        .map_err(|e| format!("{}: {e}", log_dir.display()))?
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()
                .and_then(parse_segment_file_name)
        })
        .collect();
    firsts.sort_unstable();
    Ok(firsts)
}

/// Visits the committed ops with seqs in `(after, upto]` of the log in
/// `log_dir`, in seq order, each with its cursor, until `visit` breaks;
/// returns the seq of the last op visited (`after` when none was).
///
/// The ops of a batch are visited once its commit mark is read: `upto`
/// must be committed (the batch that holds it is read to its mark). Safe beside the writer: what it appends after `upto` is not read.
/// Each record's CRC is checked as it is decoded; the rest of the log was
/// checked when the engine opened it (or the replica's catch-up fetched
/// it). Only the segments that can hold the ops are read (each mapped,
/// hashed from its start).
///
/// Errors name the segment file: it cannot be read, its header does not
/// decode, an op does not decode, the seqs there do not follow `after`
/// one by one (a segment missing, as in a log started from a checkpoint
/// whose earlier segments are gone), or the log ends before `upto`.
pub fn committed_ops(
    log_dir: &Path,
    after: u64,
    upto: u64,
    max_record_bytes: u32,
    mut visit: impl FnMut(Op, EventCursor) -> ControlFlow<()>,
) -> Result<u64, String> {
    if upto <= after {
        return Ok(after);
    }
    let firsts = segment_firsts(log_dir)?;
    // The last segment starting at or before the first seq wanted, and
    // every later one.
    let start = firsts
        .iter()
        .rposition(|&first| first <= after + 1)
        .unwrap_or(0);
    let mut last = after;
    for &first in &firsts[start..] {
        if first > upto {
            break;
        }
        let path = log_dir.join(segment_file_name(first));
        let file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        // SAFETY: a segment's bytes are only appended after its last
        // committed batch (or cut there by recovery, under the data
        // directory's lock); the bytes up to `upto`'s commit mark do not
        // change while they are read, and each record's CRC is checked.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| format!("{} cannot be mapped: {e}", path.display()))?;
        let bytes: &[u8] = &map;
        let (header, version) = SegmentHeader::decode_versioned(bytes)
            .map_err(|e| format!("{}: the header does not decode: {e:?}", path.display()))?;
        let batched = version >= FORMAT_VERSION;
        let mut hasher = chain_hasher(&header.chain_start);
        let mut hashed = 0usize;
        let mut pending: Vec<Op> = Vec::new();
        for frame in Frames::new(bytes, HEADER_LEN, max_record_bytes) {
            let (record, offset, end) = (frame.record, frame.offset(), frame.end());
            let closes = if frame.kind != FrameKind::Op {
                if !(batched && frame.kind == FrameKind::CommitMark) {
                    // The seal: the segment ends here.
                    break;
                }
                true
            } else {
                if record.seq > upto && (pending.is_empty() || !batched) {
                    break;
                }
                // An op after `upto` in the batch that holds it (a cursor
                // asked of a seq inside a batch) is read past, to the mark.
                if record.seq > after && record.seq <= upto {
                    let op = Op::decode(&record)
                        .map_err(|e| format!("{} at offset {offset}: {e}", path.display()))?;
                    if op.seq != last + 1 + pending.len() as u64 {
                        return Err(format!(
                            "{} holds seq {} where seq {} was expected",
                            path.display(),
                            op.seq,
                            last + 1 + pending.len() as u64
                        ));
                    }
                    pending.push(op);
                }
                !batched
            };
            if !closes {
                continue;
            }
            if pending.is_empty() {
                continue;
            }
            hasher.update(&bytes[hashed..end]);
            hashed = end;
            let chain: [u8; 32] = hasher.finalize().into();
            for op in pending.drain(..) {
                let seq = op.seq;
                if visit(op, EventCursor::at(seq, &chain)).is_break() {
                    return Ok(seq);
                }
                last = seq;
            }
            if last >= upto {
                return Ok(last);
            }
        }
        if let (Some(first), Some(end)) = (pending.first(), pending.last()) {
            return Err(format!(
                "{}: ops {}..={} have no commit mark",
                path.display(),
                first.seq,
                end.seq
            ));
        }
    }
    if last < upto {
        return Err(format!(
            "the log in {} holds seqs up to {last} of {}..={upto}",
            log_dir.display(),
            after + 1
        ));
    }
    Ok(last)
}

/// The cursor of the op at `seq` (at least 1) in the log in `log_dir`;
/// errors as [`committed_ops`] (the op is not there, or cannot be read).
/// Hashes the segment holding it up to its batch's end.
pub fn cursor_of(log_dir: &Path, seq: u64, max_record_bytes: u32) -> Result<EventCursor, String> {
    let mut found = None;
    committed_ops(log_dir, seq - 1, seq, max_record_bytes, |_, cursor| {
        found = Some(cursor);
        ControlFlow::Break(())
    })?;
    found.ok_or_else(|| format!("seq {seq} is not in the log in {}", log_dir.display()))
}
