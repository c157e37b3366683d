//! The one routine that decodes a segment file, shared by recovery
//! ([`Log::open`](crate::Log::open)) and [`LogReader`](crate::LogReader), so
//! both accept and refuse exactly the same bytes.
//!
//! One call walks the frames once (CRC, seq continuity, the commit marks of
//! version 2, the seal), calls the visitor for each acknowledged record,
//! judges what follows the last acknowledged frame of the last segment, then
//! hashes the segment once with BLAKE3's streaming hasher in a single large
//! update. Nothing is allocated per record (version 2 keeps the records of
//! the open batch in one vector, reused for the whole segment).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use crate::error::{FaultSeq, LogError};
use crate::format::{
    chain_hasher, chain_hex, decode_record, le_u16, le_u32, le_u64, parse_segment_file_name,
    record_crc, ChainValue, CommitMark, Damage, HeaderError, RecordDecode, RecordRef,
    SegmentHeader, Seq, COMMIT_KIND_VERSION, COMMIT_RECORD_BYTES, FORMAT_VERSION,
    HEADER_CHAIN_START_OFFSET, HEADER_FIRST_SEQ_OFFSET, HEADER_LEN, KIND_SEAL, RECORD_CRC_OFFSET,
    RECORD_HEADER_LEN, RECORD_KIND_OFFSET, RECORD_KIND_VERSION_OFFSET, RECORD_MIN_LEN,
    RECORD_PAYLOAD_OFFSET, RECORD_SEQ_OFFSET, SEAL_KIND_VERSION, SEAL_PAYLOAD_LEN,
    SEAL_RECORD_BYTES, SEGMENT_SUFFIX,
};
use crate::fs::Fs;

/// A segment file found in the log directory.
#[derive(Clone, Debug)]
pub(crate) struct SegmentFile {
    /// File name, e.g. `00000000000000000001.seg`.
    pub name: String,
    /// The first seq the name declares.
    pub first_seq: Seq,
    /// Full path.
    pub path: PathBuf,
}

/// The segment files among `paths` (a directory listing), in seq order.
/// Files not ending in `.seg` are ignored; a `.seg` file whose name is not
/// 20 digits is [`LogError::StrayFile`], named (no seq is damaged).
pub(crate) fn segment_files(paths: Vec<PathBuf>) -> Result<Vec<SegmentFile>, LogError> {
    let mut files = Vec::new();
    for path in paths {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !name.ends_with(SEGMENT_SUFFIX) {
            continue;
        }
        let Some(first_seq) = parse_segment_file_name(name) else {
            return Err(LogError::StrayFile {
                name: name.to_owned(),
            });
        };
        files.push(SegmentFile {
            name: name.to_owned(),
            first_seq,
            path: path.clone(),
        });
    }
    files.sort_by_key(|f| f.first_seq);
    Ok(files)
}

/// A segment file's bytes, mapped read-only (see [`Fs::map`]).
pub(crate) type SegmentMap = Box<dyn AsRef<[u8]> + Send + Sync>;

/// The bytes of segment `file`, mapped read-only, and their length.
pub(crate) fn map_segment(fs: &dyn Fs, file: &SegmentFile) -> Result<(SegmentMap, u64), LogError> {
    let map = fs
        .map(&file.path)
        .map_err(|e| LogError::io("map", &file.path, e))?;
    // usize is at most 64 bits on every target Rust supports.
    let len = (*map).as_ref().len() as u64;
    Ok((map, len))
}

/// The parent directory of `dir`, for syncing after creating `dir`.
pub(crate) fn parent_dir(dir: &Path) -> &Path {
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// How the segment's tail is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Every segment but the last: must be whole and sealed.
    Sealed,
    /// The last segment: may end in a torn tail, may be unsealed, may be an
    /// interrupted roll.
    Last,
    /// The last segment of a log that a writer may be appending to right
    /// now: it ends where the log stops continuing (the first frame after
    /// the last valid commit mark that does not decode), and nothing past
    /// that is judged. A batch may be half copied in there (with
    /// pre-allocated segments a reader maps those bytes), so what follows is
    /// neither a torn tail nor damage to this reader (FORMAT.md, "Reading a
    /// live log").
    Live,
}

/// What the previous segments promise about this one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expect {
    /// The seq its first record must have (1 for the first segment).
    pub first_seq: Seq,
    /// The chain value its header must start from ([0; 32] for the first).
    pub chain_start: ChainValue,
}

impl Expect {
    /// What the first segment of a log must look like.
    pub const FIRST: Expect = Expect {
        first_seq: 1,
        chain_start: [0; 32],
    };
}

/// Knobs of one decode.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DecodeOptions {
    /// Tail policy.
    pub role: Role,
    /// Largest `len` accepted.
    pub max_record_bytes: u32,
    /// Hash a sealed segment and check its seal. (An unsealed segment is
    /// always hashed: its chain value is the head.)
    pub verify_seal: bool,
    /// Also take the chain value at this offset on the way (returned in
    /// [`Segment::chain_at`]): the point a checkpoint names, checked by
    /// recovery without a second pass over the segment.
    pub chain_at: Option<u64>,
}

/// How a decoded segment ends, with its chain value.
#[derive(Clone, Debug)]
pub(crate) enum SegmentEnd {
    /// It ends with a seal that holds this chain value (checked against the
    /// bytes when `verify_seal` was set).
    Sealed {
        /// The seal's chain value: the segment's final chain value.
        chain: ChainValue,
    },
    /// No seal: `head_chain` is the chain value at the end of the last whole
    /// record (the header's `chain_start` when it holds none), and `hasher`
    /// holds the streaming state at `end` (header and records fed), ready
    /// for appending.
    Open {
        /// The chain value at the last whole record.
        head_chain: ChainValue,
        /// BLAKE3 state after `chain_start` and the bytes `0..end`.
        hasher: Box<blake3::Hasher>,
    },
}

impl SegmentEnd {
    /// The chain value after the last whole record of the segment.
    pub fn head_chain(&self) -> ChainValue {
        match self {
            SegmentEnd::Sealed { chain } => *chain,
            SegmentEnd::Open { head_chain, .. } => *head_chain,
        }
    }
}

/// Where the last segment stops being acknowledged: the bytes from `offset`
/// on are cut by recovery (and reported by the reader).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Torn {
    /// Offset of the first byte after the last acknowledged frame: the last
    /// whole record (version 1) or the last valid commit mark (version 2).
    pub offset: u64,
    /// Offset of the first frame that is not valid (at or after `offset`:
    /// in version 2, whole records of a batch without a valid commit mark
    /// may come first).
    pub damage_offset: u64,
    /// What was found at `damage_offset`.
    pub damage: Damage,
    /// Offset of the first non-zero byte at or after `offset` (a torn tail
    /// always holds one: an all-zero rest is the end of the log).
    pub first_nonzero: u64,
    /// Version 2: the tail comes after the last valid commit mark, so no
    /// byte of it was acknowledged ("unacknowledged tail").
    pub after_commit_mark: bool,
    /// Seqs of the whole records found in the tail (first, last), if any.
    pub unacknowledged_seqs: Option<(Seq, Seq)>,
    /// The frame at `damage_offset` is whole but fails its checksum, and
    /// nothing in it looks like unwritten sectors: a torn write or a damaged
    /// acknowledged frame, which the bytes cannot tell apart (FORMAT.md,
    /// "Torn and corrupt, exactly").
    pub whole_frame: bool,
}

impl Torn {
    /// What was found at `damage_offset`, in words (`TornTail::damage`). A
    /// `len` of 0 there is never the end of written data, since the rest is
    /// not all zero: it is said as zeros, then non-zero bytes, and where.
    pub fn describe(&self) -> String {
        match self.damage {
            Damage::Zeros if self.first_nonzero > self.damage_offset => format!(
                "{} zero bytes, then non-zero bytes from offset {}: not a clean end of \
                 written data",
                self.first_nonzero.saturating_sub(self.damage_offset),
                self.first_nonzero
            ),
            damage if self.damage_offset > self.offset => {
                format!("{damage} at offset {}", self.damage_offset)
            }
            damage => damage.to_string(),
        }
    }
}

/// A segment with a valid header, decoded.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    /// Its header.
    pub header: SegmentHeader,
    /// Its header's `format_version` (1 or 2).
    pub format_version: u16,
    /// Acknowledged whole records visited (seal excluded).
    pub records: u64,
    /// Seq of the last acknowledged record, `first_seq - 1` when none.
    pub last_seq: Seq,
    /// Offset just past the last acknowledged frame (the last whole record
    /// in version 1, the last valid commit mark in version 2), or past the
    /// seal.
    pub end: u64,
    /// Seal or open end, with the chain.
    pub tail: SegmentEnd,
    /// Last segment only: bytes from `torn.offset` on are cut.
    pub torn: Option<Torn>,
    /// The visitor stopped the walk; `records`, `last_seq`, `end` and the
    /// chain describe the stopping point, nothing after it was checked.
    pub stopped: bool,
    /// The chain value at [`DecodeOptions::chain_at`], when asked for and
    /// the offset lies within the bytes hashed (the header's end up to
    /// `end`, or the seal's offset).
    pub chain_at: Option<ChainValue>,
}

/// What [`decode_segment`] found.
#[derive(Clone, Debug)]
pub(crate) enum Decoded {
    /// A segment with a valid header.
    Segment(Segment),
    /// The last segment has a torn or invalid header and holds no valid
    /// record: a roll interrupted before its header was durable.
    InterruptedRoll {
        /// Why the header is not valid.
        reason: String,
    },
}

/// Decodes segment `name` (its whole file in `bytes`), calling `visit` for
/// each acknowledged whole record in order (seals and commit marks
/// excluded; in version 2 a batch's records are visited once its commit
/// mark verified).
///
/// Errors: `UnsupportedVersion` for a newer header; `Corrupt` for anything
/// that is neither a valid record nor, in the last segment, a torn or
/// unacknowledged tail (see FORMAT.md, "Torn and corrupt"). Records already
/// visited when an error is found were whole and in order, but the caller
/// must discard what it built from them.
pub(crate) fn decode_segment<'a>(
    name: &str,
    bytes: &'a [u8],
    expect: Expect,
    opts: DecodeOptions,
    visit: impl FnMut(RecordRef<'a>) -> ControlFlow<()>,
) -> Result<Decoded, LogError> {
    let (header, format_version) = match check_header(name, bytes, expect, opts)? {
        Ok(found) => found,
        Err(roll) => return Ok(roll),
    };
    let walk = walk_records(name, bytes, format_version, expect, opts, visit)?;
    if let Some((seal_offset, chain)) = walk.seal {
        let (tail, chain_at) =
            check_sealed_end(name, bytes, &header, &walk, seal_offset, chain, opts)?;
        return Ok(Decoded::Segment(Segment {
            header,
            format_version,
            records: walk.ack_records,
            last_seq: walk.ack_seq,
            // usize is at most 64 bits on every target Rust supports.
            end: walk.offset as u64,
            tail,
            torn: None,
            stopped: false,
            chain_at,
        }));
    }
    let torn = if walk.stopped {
        None
    } else {
        judge_tail(name, bytes, format_version, &walk, opts)?
    };
    let end = walk.ack_end;
    let mut hasher = chain_hasher(&header.chain_start);
    let chain_at = hash_prefix(&mut hasher, bytes, end, opts.chain_at);
    let head_chain = if walk.ack_records == 0 {
        header.chain_start
    } else {
        hasher.finalize().into()
    };
    Ok(Decoded::Segment(Segment {
        header,
        format_version,
        records: walk.ack_records,
        last_seq: walk.ack_seq,
        // usize is at most 64 bits on every target Rust supports.
        end: end as u64,
        tail: SegmentEnd::Open {
            head_chain,
            hasher: Box::new(hasher),
        },
        torn,
        stopped: walk.stopped,
        chain_at,
    }))
}

/// What the cheap check of a sealed segment found ([`check_sealed_link`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SealedLink {
    /// Seq of its last record: the seal's seq.
    pub last_seq: Seq,
    /// The chain value its seal holds (not recomputed).
    pub chain: ChainValue,
    /// Offset just past the seal.
    pub end: u64,
}

/// The cheap check of a sealed segment that a checkpoint covers (FORMAT.md,
/// "Recovery" step 2a): its header continues `expect` (name, `first_seq`,
/// `chain_start`: the same checks and errors as [`decode_segment`]), and
/// its last non-zero bytes are a checksum-valid seal (only zeros after it)
/// whose seq is not before the header's `first_seq - 1`. Neither the
/// records nor the chain are read. `Ok(None)` when no such seal ends the
/// file: the caller decodes the segment in full, which names the damage
/// (so this check never refuses a segment the full decoder accepts).
pub(crate) fn check_sealed_link(
    name: &str,
    bytes: &[u8],
    expect: Expect,
    max_record_bytes: u32,
) -> Result<Option<SealedLink>, LogError> {
    let opts = DecodeOptions {
        role: Role::Sealed,
        max_record_bytes,
        verify_seal: false,
        chain_at: None,
    };
    let (header, _) = match check_header(name, bytes, expect, opts)? {
        Ok(found) => found,
        Err(_) => return Ok(None),
    };
    let Some(last_nonzero) = bytes.iter().rposition(|&b| b != 0) else {
        return Ok(None);
    };
    // The seal's chain value may end in zero bytes, which look like the
    // zero fill after it: try each end the seal can have.
    let ends = last_nonzero + 1..=(last_nonzero + 1 + SEAL_PAYLOAD_LEN).min(bytes.len());
    for end in ends {
        let Some(start) = end
            .checked_sub(SEAL_RECORD_BYTES)
            .filter(|&start| start >= HEADER_LEN)
        else {
            continue;
        };
        if let RecordDecode::Record { record, size } = decode_record(bytes, start, max_record_bytes)
        {
            let is_seal = size == SEAL_RECORD_BYTES
                && record.kind == KIND_SEAL
                && record.kind_version == SEAL_KIND_VERSION
                && record.seq >= header.first_seq.saturating_sub(1);
            if let (true, Some(chain)) = (is_seal, record.payload.first_chunk::<SEAL_PAYLOAD_LEN>())
            {
                return Ok(Some(SealedLink {
                    last_seq: record.seq,
                    chain: *chain,
                    // usize is at most 64 bits on every target Rust supports.
                    end: end as u64,
                }));
            }
        }
    }
    Ok(None)
}

/// Feeds `bytes[..end]` to `hasher` (a chain hasher at offset 0), and
/// returns the chain value at offset `at` on the way when `at` lies in
/// `HEADER_LEN..=end`: one pass for both.
fn hash_prefix(
    hasher: &mut blake3::Hasher,
    bytes: &[u8],
    end: usize,
    at: Option<u64>,
) -> Option<ChainValue> {
    let prefix = bytes.get(..end).unwrap_or(bytes);
    let at = at
        .and_then(|at| usize::try_from(at).ok())
        .filter(|at| (HEADER_LEN..=prefix.len()).contains(at));
    let Some(at) = at else {
        hasher.update(prefix);
        return None;
    };
    let (before, after) = prefix.split_at(at);
    hasher.update(before);
    let chain: ChainValue = hasher.finalize().into();
    hasher.update(after);
    Some(chain)
}

/// The header checks: a valid header (else, in the last segment without a
/// valid record, an interrupted roll: the inner `Err`), its `first_seq`
/// agreeing with the file name and the previous segment, its `chain_start`
/// with the previous seal. Returns the header and its format version.
#[allow(clippy::type_complexity)]
fn check_header(
    name: &str,
    bytes: &[u8],
    expect: Expect,
    opts: DecodeOptions,
) -> Result<Result<(SegmentHeader, u16), Decoded>, LogError> {
    let last_good = expect.first_seq.saturating_sub(1);
    let (header, version) = match SegmentHeader::decode_versioned(bytes) {
        Ok(found) => found,
        Err(HeaderError::Unsupported { found }) => {
            return Err(LogError::UnsupportedVersion {
                segment: name.to_owned(),
                found,
                supported: FORMAT_VERSION,
            })
        }
        Err(e) if opts.role == Role::Sealed => {
            return Err(LogError::corrupt(
                name,
                e.offset(),
                FaultSeq::Header(expect.first_seq),
                format!("bad segment header: {e}"),
            ))
        }
        Err(e) => {
            return match find_valid_record(bytes, 0, last_good, opts.max_record_bytes) {
                None => Ok(Err(Decoded::InterruptedRoll {
                    reason: e.to_string(),
                })),
                Some((offset, seq)) => Err(LogError::corrupt(
                    name,
                    e.offset(),
                    FaultSeq::Header(expect.first_seq),
                    format!(
                        "bad segment header ({e}) in a file that holds a valid record \
                         (seq {seq} at offset {offset})"
                    ),
                )),
            };
        }
    };
    if parse_segment_file_name(name) != Some(header.first_seq) {
        return Err(LogError::corrupt(
            name,
            HEADER_FIRST_SEQ_OFFSET,
            FaultSeq::Header(expect.first_seq),
            format!(
                "header first_seq {} disagrees with the file name",
                header.first_seq
            ),
        ));
    }
    if header.first_seq != expect.first_seq {
        return Err(LogError::corrupt(
            name,
            HEADER_FIRST_SEQ_OFFSET,
            FaultSeq::Header(expect.first_seq),
            format!(
                "seq gap: segment starts at seq {}, expected {}",
                header.first_seq, expect.first_seq
            ),
        ));
    }
    if header.chain_start != expect.chain_start {
        return Err(LogError::corrupt(
            name,
            HEADER_CHAIN_START_OFFSET,
            FaultSeq::Header(expect.first_seq),
            format!(
                "chain broken: header chain_start {} is not the previous segment's final chain {}",
                chain_hex(&header.chain_start),
                chain_hex(&expect.chain_start),
            ),
        ));
    }
    Ok(Ok((header, version)))
}

/// Where one walk over a segment's frames stopped.
struct Walk {
    /// Offset where the walk stopped (past the seal when there is one).
    offset: usize,
    /// Offset just past the last acknowledged frame: every record in
    /// version 1, a valid commit mark in version 2.
    ack_end: usize,
    /// Seq of the last acknowledged record.
    ack_seq: Seq,
    /// Acknowledged records (the ones visited).
    ack_records: u64,
    /// Seq of the last whole record walked, acknowledged or not.
    last_seq: Seq,
    /// The seal's offset and chain value, when the walk ended at one.
    seal: Option<(usize, ChainValue)>,
    /// What stopped the walk short of the end of the file or a seal.
    stop: Option<Damage>,
    /// The visitor stopped the walk.
    stopped: bool,
}

/// Walks the frames after the header: CRC and seq continuity of every
/// record, the commit marks (version 2), up to the seal, the end, or the
/// first frame that is not valid. Visits acknowledged records in order.
fn walk_records<'a>(
    name: &str,
    bytes: &'a [u8],
    format_version: u16,
    expect: Expect,
    opts: DecodeOptions,
    mut visit: impl FnMut(RecordRef<'a>) -> ControlFlow<()>,
) -> Result<Walk, LogError> {
    let last_good = expect.first_seq.saturating_sub(1);
    let committed = format_version >= FORMAT_VERSION;
    let mut w = Walk {
        offset: HEADER_LEN,
        ack_end: HEADER_LEN,
        ack_seq: last_good,
        ack_records: 0,
        last_seq: last_good,
        seal: None,
        stop: None,
        stopped: false,
    };
    // Version 2: the records of the batch not closed by a mark yet.
    let mut batch: Vec<RecordRef<'a>> = Vec::new();
    loop {
        let (record, size) = match next_frame(bytes, w.offset, !batch.is_empty(), opts) {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(damage) => {
                w.stop = Some(damage);
                break;
            }
        };
        if committed && record.kind == KIND_SEAL && record.kind_version == COMMIT_KIND_VERSION {
            close_batch(name, bytes, &mut w, &mut batch, size, opts, &mut visit)?;
            if w.stopped {
                break;
            }
            continue;
        }
        if record.kind == KIND_SEAL {
            if !batch.is_empty() {
                return Err(LogError::corrupt(
                    name,
                    w.offset,
                    FaultSeq::Batch {
                        first: w.ack_seq + 1,
                        last: w.last_seq,
                    },
                    "seal after records that no commit mark closes",
                ));
            }
            w.seal = Some((w.offset, check_seal(name, w.offset, &record, w.last_seq)?));
            w.offset += size;
            break;
        }
        if record.seq != w.last_seq.wrapping_add(1) {
            return Err(LogError::corrupt(
                name,
                w.offset,
                FaultSeq::Record(w.last_seq.wrapping_add(1)),
                format!(
                    "seq gap: expected seq {}, found {}",
                    w.last_seq.wrapping_add(1),
                    record.seq
                ),
            ));
        }
        w.last_seq = record.seq;
        w.offset += size;
        if committed {
            batch.push(record);
            continue;
        }
        w.ack_records += 1;
        w.ack_seq = record.seq;
        w.ack_end = w.offset;
        if visit(record).is_break() {
            w.stopped = true;
            break;
        }
    }
    Ok(w)
}

/// The whole, checksum-valid frame at `offset` and its size; `None` at the
/// end of the bytes with no open batch; else what stops the walk there
/// (records of an open batch followed by the end or only zeros:
/// `Uncommitted`).
fn next_frame(
    bytes: &[u8],
    offset: usize,
    open_batch: bool,
    opts: DecodeOptions,
) -> Result<Option<(RecordRef<'_>, usize)>, Damage> {
    match decode_record(bytes, offset, opts.max_record_bytes) {
        RecordDecode::Record { record, size } => Ok(Some((record, size))),
        RecordDecode::End if !open_batch => Ok(None),
        RecordDecode::End => Err(Damage::Uncommitted),
        RecordDecode::Damaged(damage) => {
            let zeros_only = bytes.get(offset..).unwrap_or(&[]).iter().all(|&b| b == 0);
            Err(if zeros_only && open_batch {
                Damage::Uncommitted
            } else {
                damage
            })
        }
    }
}

/// The commit mark at `w.offset` (`size` bytes) must close `batch`, the
/// records walked since the last mark (`Corrupt` otherwise); then they are
/// acknowledged: visited in order, and the walk's acknowledged end moves
/// past the mark (or to where the visitor stopped).
fn close_batch<'a>(
    name: &str,
    bytes: &[u8],
    w: &mut Walk,
    batch: &mut Vec<RecordRef<'a>>,
    size: usize,
    opts: DecodeOptions,
    visit: &mut impl FnMut(RecordRef<'a>) -> ControlFlow<()>,
) -> Result<(), LogError> {
    let mark_seq = le_u64(bytes, w.offset + RECORD_SEQ_OFFSET);
    let payload = bytes
        .get(w.offset + RECORD_PAYLOAD_OFFSET..w.offset + size)
        .unwrap_or(&[]);
    // Cast: usize is at most 64 bits on every target Rust supports.
    let count = batch.len() as u64;
    let closes = mark_seq == Some(w.last_seq)
        && count > 0
        && CommitMark::decode(payload)
            .is_some_and(|mark| mark.closes(bytes.get(w.ack_end..w.offset).unwrap_or(&[]), count));
    if !closes {
        // The records walked since the last mark, which this one does not
        // vouch for; a mark with none before it lies after the last mark.
        let seq = if count > 0 {
            FaultSeq::Batch {
                first: w.ack_seq + 1,
                last: w.last_seq,
            }
        } else {
            FaultSeq::After(w.last_seq)
        };
        return Err(LogError::corrupt(
            name,
            w.offset,
            seq,
            format!(
                "{} (seq {}, {count} records since the last mark)",
                Damage::CommitMismatch,
                mark_seq.unwrap_or(0)
            ),
        ));
    }
    for (at, record) in batch.drain(..).enumerate() {
        if visit(record).is_break() {
            w.stopped = true;
            // Cast: usize is at most 64 bits.
            w.ack_records += at as u64 + 1;
            w.ack_seq = record.seq;
            // Stopped at the batch's last record: the head the log had
            // then, its commit mark included.
            w.ack_end = if record.seq == w.last_seq {
                w.offset + size
            } else {
                record_end(&record, bytes, opts)
            };
            return Ok(());
        }
    }
    w.ack_records += count;
    w.ack_seq = w.last_seq;
    w.offset += size;
    w.ack_end = w.offset;
    Ok(())
}

/// The offset just past `record`, a whole record decoded from `bytes`.
fn record_end(record: &RecordRef<'_>, bytes: &[u8], opts: DecodeOptions) -> usize {
    let at = usize::try_from(record.offset).unwrap_or(usize::MAX);
    match decode_record(bytes, at, opts.max_record_bytes) {
        RecordDecode::Record { size, .. } => at + size,
        _ => at,
    }
}

/// The checks after a seal: only zero bytes follow it, and (with
/// `verify_seal`) its chain value is the one computed over the bytes before
/// it; then also the chain value at `opts.chain_at`, if asked for.
fn check_sealed_end(
    name: &str,
    bytes: &[u8],
    header: &SegmentHeader,
    walk: &Walk,
    seal_offset: usize,
    chain: ChainValue,
    opts: DecodeOptions,
) -> Result<(SegmentEnd, Option<ChainValue>), LogError> {
    let after = bytes.get(walk.offset..).unwrap_or(&[]);
    if let Some(i) = after.iter().position(|&b| b != 0) {
        return Err(LogError::corrupt(
            name,
            walk.offset + i,
            FaultSeq::After(walk.last_seq),
            "non-zero bytes after the seal",
        ));
    }
    let mut chain_at = None;
    if opts.verify_seal {
        let mut hasher = chain_hasher(&header.chain_start);
        chain_at = hash_prefix(&mut hasher, bytes, seal_offset, opts.chain_at);
        let computed: ChainValue = hasher.finalize().into();
        if computed != chain {
            return Err(LogError::corrupt(
                name,
                seal_offset,
                FaultSeq::After(walk.last_seq),
                format!(
                    "chain mismatch: the seal holds {}, the bytes hash to {}",
                    chain_hex(&chain),
                    chain_hex(&computed)
                ),
            ));
        }
    }
    Ok((SegmentEnd::Sealed { chain }, chain_at))
}

/// Judges what follows the last acknowledged frame of a segment that ends
/// without a seal (FORMAT.md, "Torn and corrupt, exactly"): nothing or only
/// zeros (the end of the log: `None`), a torn or unacknowledged tail to cut
/// (`Some`), or damage (`Corrupt`). A sealed-role segment may only end at
/// its seal.
fn judge_tail(
    name: &str,
    bytes: &[u8],
    format_version: u16,
    walk: &Walk,
    opts: DecodeOptions,
) -> Result<Option<Torn>, LogError> {
    if opts.role == Role::Live {
        return Ok(None);
    }
    let committed = format_version >= FORMAT_VERSION;
    if opts.role == Role::Sealed {
        let (seq, reason) = match walk.stop {
            Some(damage) => {
                let (seq, what) = damaged_frame(bytes, walk, committed, damage);
                (seq, format!("{what} in a sealed segment"))
            }
            None => (
                FaultSeq::After(walk.last_seq),
                "the segment ends without a seal".to_owned(),
            ),
        };
        return Err(LogError::corrupt(name, walk.offset, seq, reason));
    }
    // Nothing but zeros from the last acknowledged frame to the end of the
    // file: the end of the log, not a torn tail. The writer's zero fill
    // ahead (pre-allocation) leaves exactly this, and so does a size made
    // durable before the data it was extended for; neither holds a byte of
    // data.
    let rest = bytes.get(walk.ack_end..).unwrap_or(&[]);
    let Some(first_nonzero) = rest.iter().position(|&b| b != 0) else {
        return Ok(None);
    };
    let Some(damage) = walk.stop else {
        return Ok(None);
    };
    let at = walk.offset;
    if let RecordDecode::Record { record, .. } = decode_record(bytes, at, u32::MAX) {
        if matches!(damage, Damage::LenOverLimit(_)) {
            // A whole, checksum-valid frame is data, not a torn write: only
            // the limit refused it.
            return Err(LogError::corrupt(
                name,
                at,
                FaultSeq::Record(walk.last_seq.wrapping_add(1)),
                format!(
                    "whole record (seq {}) with {damage} {}; raise the limit to read it",
                    record.seq, opts.max_record_bytes
                ),
            ));
        }
    }
    let last_seen = if committed {
        check_uncommitted_tail(name, bytes, walk, damage, opts)?
    } else {
        if let Some((found, seq)) =
            find_valid_record(bytes, at + 1, walk.last_seq, opts.max_record_bytes)
        {
            let (fault, what) = damaged_frame(bytes, walk, committed, damage);
            return Err(LogError::corrupt(
                name,
                at,
                fault,
                format!("{what}, but a valid record (seq {seq}) follows at offset {found}"),
            ));
        }
        walk.last_seq
    };
    let frame_end = frame_end(bytes, at);
    // Casts: usize is at most 64 bits on every target Rust supports.
    Ok(Some(Torn {
        offset: walk.ack_end as u64,
        damage_offset: at as u64,
        damage,
        first_nonzero: (walk.ack_end + first_nonzero) as u64,
        after_commit_mark: committed,
        unacknowledged_seqs: (last_seen > walk.ack_seq).then_some((walk.ack_seq + 1, last_seen)),
        whole_frame: damage == Damage::BadCrc
            && !(committed && reaches_unwritten_sector(bytes, at, frame_end)),
    }))
}

/// Where in seq terms the frame at `walk.offset`, which does not decode
/// (`damage`), is damaged, and the damage in words (FORMAT.md, "Torn and
/// corrupt, exactly"). The log expects there the record `L + 1` (`L` the
/// last record walked) or one frame of its own: in version 2 after the
/// records of a batch no mark closed yet, that batch's commit mark, else a
/// seal. The frame is read as that frame of the log's own by
/// [`reads_as_own_frame`]; then nothing is damaged but that frame, which
/// lies after seq `L` ([`FaultSeq::After`]). Else it is record `L + 1`
/// ([`FaultSeq::Record`]). Records without a commit mark where the segment
/// ends lie before a missing mark, after seq `L`.
fn damaged_frame(bytes: &[u8], walk: &Walk, committed: bool, damage: Damage) -> (FaultSeq, String) {
    let last = walk.last_seq;
    if damage == Damage::Uncommitted {
        return (FaultSeq::After(last), damage.to_string());
    }
    let open_batch = committed && walk.last_seq > walk.ack_seq;
    let (own, what) = if open_batch {
        (OwnFrame::commit_mark(last), "commit mark")
    } else {
        (OwnFrame::seal(last), "seal")
    };
    if reads_as_own_frame(bytes, walk.offset, own) {
        (
            FaultSeq::After(last),
            format!("{damage} (the damaged frame reads as the {what} after seq {last})"),
        )
    } else {
        (FaultSeq::Record(last.wrapping_add(1)), damage.to_string())
    }
}

/// A frame of the log's own (kind 0) as it would stand at some place: its
/// size on disk, its `kind_version` and the seq it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OwnFrame {
    /// Bytes on disk: 60 for a seal, 48 for a commit mark.
    pub size: usize,
    /// 1 for a seal, 2 for a commit mark.
    pub kind_version: u16,
    /// The seq it repeats: a seal's the segment's last record, a commit
    /// mark's its batch's last record.
    pub seq: Seq,
}

impl OwnFrame {
    /// The seal after seq `last`.
    pub(crate) fn seal(last: Seq) -> OwnFrame {
        OwnFrame {
            size: SEAL_RECORD_BYTES,
            kind_version: SEAL_KIND_VERSION,
            seq: last,
        }
    }

    /// The commit mark of the batch whose last record is `batch_last`.
    pub(crate) fn commit_mark(batch_last: Seq) -> OwnFrame {
        OwnFrame {
            size: COMMIT_RECORD_BYTES,
            kind_version: COMMIT_KIND_VERSION,
            seq: batch_last,
        }
    }
}

/// Whether the frame at `at`, which fails its checksum, reads as `own`, the
/// one frame of the log's own that may stand there, rather than as a
/// record (FORMAT.md, "Reading a damaged frame"). Its four identifying
/// fields are `len` (own's size - 8), `kind` (0), `kind_version` and `seq`
/// (own's seq). A record never has `kind` 0, and its seq is after own's, so
/// a record with one damaged field holds at most one of those two; an own
/// frame with one damaged field holds at least three of the four. So:
/// - all four hold, or three with `kind` and `seq` among them: own;
/// - three, with one of `kind` and `seq` among them: a record of own's
///   length and `kind_version` whose `kind` or `seq` was damaged into own's
///   value reads the same as own with the other of the two damaged, so the
///   frame's own checksum decides: it is own when the frame, with that
///   field set to own's value, passes its checksum (a single damaged field
///   restored), else a record;
/// - fewer: a record.
pub(crate) fn reads_as_own_frame(bytes: &[u8], at: usize, own: OwnFrame) -> bool {
    // Cast: an own frame is 48 or 60 bytes.
    let own_len = (own.size - RECORD_SEQ_OFFSET) as u32;
    let len = le_u32(bytes, at) == Some(own_len);
    let kind = le_u16(bytes, at + RECORD_KIND_OFFSET) == Some(KIND_SEAL);
    let kind_version = le_u16(bytes, at + RECORD_KIND_VERSION_OFFSET) == Some(own.kind_version);
    let seq = le_u64(bytes, at + RECORD_SEQ_OFFSET) == Some(own.seq);
    match [len, kind, kind_version, seq]
        .iter()
        .filter(|&&h| h)
        .count()
    {
        4 => true,
        3 if kind && seq => true,
        3 => restored_checksum_holds(bytes, at, own),
        _ => false,
    }
}

/// Whether the `own.size` bytes at `at`, with their identifying fields set
/// to `own`'s values, pass the frame checksum they hold.
fn restored_checksum_holds(bytes: &[u8], at: usize, own: OwnFrame) -> bool {
    let Some(frame) = at.checked_add(own.size).and_then(|end| bytes.get(at..end)) else {
        return false;
    };
    let mut frame = frame.to_vec();
    let own_len = own.size - RECORD_SEQ_OFFSET;
    // Cast: an own frame is 48 or 60 bytes.
    frame[..RECORD_CRC_OFFSET].copy_from_slice(&(own_len as u32).to_le_bytes());
    frame[RECORD_SEQ_OFFSET..RECORD_SEQ_OFFSET + 8].copy_from_slice(&own.seq.to_le_bytes());
    frame[RECORD_KIND_OFFSET..RECORD_KIND_OFFSET + 2].copy_from_slice(&KIND_SEAL.to_le_bytes());
    frame[RECORD_KIND_VERSION_OFFSET..RECORD_KIND_VERSION_OFFSET + 2]
        .copy_from_slice(&own.kind_version.to_le_bytes());
    le_u32(&frame, RECORD_CRC_OFFSET) == Some(record_crc(&frame, own_len))
}

/// Version 2: the tail after the last valid commit mark is a batch whose
/// write did not finish unless it shows that the batch was acknowledged:
/// a valid commit mark of a later batch, or non-zero bytes after the mark
/// that closes it (a later write: the writer starts a batch only after the
/// one before is durable), or, when valid frames follow the damage, damage
/// that is not a hole of unwritten (zero) sectors. Returns the last seq of
/// a whole record or commit mark seen in the tail (the walk's last seq when
/// there is none after the damage); `Corrupt` when the batch was
/// acknowledged.
fn check_uncommitted_tail(
    name: &str,
    bytes: &[u8],
    walk: &Walk,
    damage: Damage,
    opts: DecodeOptions,
) -> Result<Seq, LogError> {
    let at = walk.offset;
    let (fault, damage) = damaged_frame(bytes, walk, true, damage);
    let refuse = |reason: String| LogError::corrupt(name, at, fault, reason);
    // From the walk's last seq on: a seal after the damage repeats it.
    let Some((next, next_seq)) = find_valid_record(
        bytes,
        at + 1,
        walk.last_seq.saturating_sub(1),
        opts.max_record_bytes,
    ) else {
        return Ok(walk.last_seq);
    };
    if let RecordDecode::Record { record, .. } = decode_record(bytes, next, opts.max_record_bytes) {
        if record.kind == KIND_SEAL && record.kind_version == SEAL_KIND_VERSION {
            return Err(refuse(format!(
                "{damage}, but a seal (seq {}) follows at offset {next}: the segment was \
                 rolled after this batch, so it was acknowledged",
                record.seq
            )));
        }
    }
    let mut last_seen = walk.last_seq.max(next_seq);
    if let Some((mark_at, mark_seq, mark)) =
        find_commit_mark(bytes, next, walk.last_seq, opts.max_record_bytes)
    {
        last_seen = last_seen.max(mark_seq);
        let start = usize::try_from(mark.batch_bytes)
            .ok()
            .and_then(|len| mark_at.checked_sub(len));
        if start != Some(walk.ack_end) {
            return Err(refuse(format!(
                "{damage}, but the commit mark of a later batch (seq {mark_seq}) follows at \
                 offset {mark_at}: the damaged batch was acknowledged"
            )));
        }
        let after = bytes.get(mark_at + COMMIT_RECORD_BYTES..).unwrap_or(&[]);
        if let Some(i) = after.iter().position(|&b| b != 0) {
            return Err(refuse(format!(
                "{damage} in the batch committed at offset {mark_at} (seq {mark_seq}), and \
                 a later write follows at offset {}: the batch was acknowledged",
                mark_at + COMMIT_RECORD_BYTES + i
            )));
        }
    }
    if !holds_unwritten_sector(bytes, walk.ack_end, at, next) {
        return Err(refuse(format!(
            "{damage}, but a valid frame (seq {next_seq}) follows at offset {next} and the \
             bytes between are no hole of unwritten sectors"
        )));
    }
    Ok(last_seen)
}

/// The first checksum-valid commit mark at or after `from` that the writer
/// could have written after seq `last_good` (the search of
/// [`find_valid_record`], stepping over whole records): its offset, seq and
/// contents.
fn find_commit_mark(
    bytes: &[u8],
    mut from: usize,
    mut last_good: Seq,
    max_record_bytes: u32,
) -> Option<(usize, Seq, CommitMark)> {
    loop {
        let (at, seq) = find_valid_record(bytes, from, last_good, max_record_bytes)?;
        let RecordDecode::Record { record, size } = decode_record(bytes, at, max_record_bytes)
        else {
            return None;
        };
        if record.kind == KIND_SEAL && record.kind_version == COMMIT_KIND_VERSION {
            if let Some(mark) = CommitMark::decode(record.payload) {
                return Some((at, seq, mark));
            }
        }
        // The mark closing this record's batch carries a seq of at least
        // this one.
        last_good = seq.saturating_sub(1).max(last_good);
        from = at + size;
    }
}

/// The offset just past the frame whose `len` field is at `at` (`at` when
/// the field cannot be read).
fn frame_end(bytes: &[u8], at: usize) -> usize {
    le_u32(bytes, at)
        .and_then(|len| usize::try_from(len).ok())
        .and_then(|len| at.checked_add(RECORD_SEQ_OFFSET)?.checked_add(len))
        .unwrap_or(at)
}

/// True when the frame `at..frame_end` runs into a sector that reads as
/// unwritten: from some sector boundary inside it, its bytes up to the end
/// of that sector (or of the frame) are all zero. A frame whose write was
/// torn by a missing page fails its checksum this way; a flipped bit does
/// not.
fn reaches_unwritten_sector(bytes: &[u8], at: usize, frame_end: usize) -> bool {
    let frame_end = frame_end.min(bytes.len());
    let mut boundary = (at / SECTOR_BYTES + 1) * SECTOR_BYTES;
    while boundary < frame_end {
        let end = (boundary + SECTOR_BYTES).min(frame_end);
        if bytes
            .get(boundary..end)
            .is_some_and(|s| s.iter().all(|&b| b == 0))
        {
            return true;
        }
        boundary += SECTOR_BYTES;
    }
    false
}

/// Sector size of the hole test: the smallest unit a disk writes at once.
/// A page of any larger size is a run of whole sectors.
pub(crate) const SECTOR_BYTES: usize = 512;

/// True when some 512-byte-aligned sector, taken from `ack_end` on (the
/// bytes before are durable data), lies inside `from..to` and holds only
/// zeros: a hole where a write's sector never reached the disk (unwritten
/// space reads as zeros), which bit rot does not leave.
fn holds_unwritten_sector(bytes: &[u8], ack_end: usize, from: usize, to: usize) -> bool {
    let to = to.min(bytes.len());
    let mut sector = from / SECTOR_BYTES * SECTOR_BYTES;
    while sector < to {
        let start = sector.max(ack_end);
        let end = (sector + SECTOR_BYTES).min(bytes.len());
        if start < end
            && start >= from
            && end <= to
            && bytes
                .get(start..end)
                .is_some_and(|s| s.iter().all(|&b| b == 0))
        {
            return true;
        }
        sector += SECTOR_BYTES;
    }
    false
}

/// Checks a checksum-valid record of kind [`KIND_SEAL`] at `offset` and
/// returns the chain value it holds.
fn check_seal(
    name: &str,
    offset: usize,
    seal: &RecordRef<'_>,
    last_seq: Seq,
) -> Result<ChainValue, LogError> {
    let after = FaultSeq::After(last_seq);
    if seal.kind_version != SEAL_KIND_VERSION {
        return Err(LogError::corrupt(
            name,
            offset,
            after,
            format!("seal with kind_version {}", seal.kind_version),
        ));
    }
    if seal.seq != last_seq {
        return Err(LogError::corrupt(
            name,
            offset,
            after,
            format!("seal names seq {}, the last record is {last_seq}", seal.seq),
        ));
    }
    match seal.payload.first_chunk::<SEAL_PAYLOAD_LEN>() {
        Some(chain) if seal.payload.len() == SEAL_PAYLOAD_LEN => Ok(*chain),
        _ => Err(LogError::corrupt(
            name,
            offset,
            after,
            format!(
                "seal payload of {} bytes, expected {SEAL_PAYLOAD_LEN}",
                seal.payload.len()
            ),
        )),
    }
}

/// The first offset at or after `from` where a valid record starts that the
/// writer could have written after seq `last_good`: `len` in
/// `[20, max_record_bytes]`, CRC valid, and seq in
/// `(last_good, last_good + 1 + (offset - from) / 28]` (each record between
/// `from` and it takes at least 28 bytes and one seq; a seal may repeat a
/// seq). The seq bound makes the search cheap on garbage. Returns the offset
/// and the seq.
pub(crate) fn find_valid_record(
    bytes: &[u8],
    from: usize,
    last_good: Seq,
    max_record_bytes: u32,
) -> Option<(usize, Seq)> {
    // A record starts with a non-zero len, so none starts after the last
    // non-zero byte: zero-filled tails cost one backward scan.
    let last_nonzero = bytes.iter().rposition(|&b| b != 0)?;
    for at in from..=last_nonzero {
        let Some(len) = le_u32(bytes, at) else { break };
        if !(RECORD_MIN_LEN..=max_record_bytes).contains(&len) {
            continue;
        }
        let Some(seq) = le_u64(bytes, at + RECORD_SEQ_OFFSET) else {
            break;
        };
        // Cast: usize is at most 64 bits on every target Rust supports.
        let reach = ((at - from) / RECORD_HEADER_LEN) as u64;
        if seq <= last_good || seq > last_good.saturating_add(1).saturating_add(reach) {
            continue;
        }
        if let RecordDecode::Record { record, .. } = decode_record(bytes, at, max_record_bytes) {
            return Some((at, record.seq));
        }
    }
    None
}
