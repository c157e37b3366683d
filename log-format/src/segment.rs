//! The one routine that decodes a segment file, shared by recovery
//! ([`Log::open`](crate::Log::open)) and [`LogReader`](crate::LogReader), so
//! both accept and refuse exactly the same bytes.
//!
//! One call walks the records once (CRC, seq continuity, the seal), calls the
//! visitor for each whole record, then hashes the segment once with BLAKE3's
//! streaming hasher in a single large update. Nothing is allocated per
//! record.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use crate::error::LogError;
use crate::format::{
    chain_hasher, chain_hex, decode_record, le_u32, le_u64, parse_segment_file_name, ChainValue,
    Damage, HeaderError, RecordDecode, RecordRef, SegmentHeader, Seq, FORMAT_VERSION,
    HEADER_CHAIN_START_OFFSET, HEADER_FIRST_SEQ_OFFSET, HEADER_LEN, KIND_SEAL, RECORD_HEADER_LEN,
    RECORD_MIN_LEN, RECORD_SEQ_OFFSET, SEAL_KIND_VERSION, SEAL_PAYLOAD_LEN, SEGMENT_SUFFIX,
};

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
/// 20 digits is `Corrupt`.
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
            return Err(LogError::corrupt(
                name,
                0,
                0,
                "segment file name is not 20 decimal digits followed by .seg",
            ));
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

/// Where the last segment stops being whole records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Torn {
    /// Offset of the first byte that is not part of a whole record.
    pub offset: u64,
    /// What was found there.
    pub damage: Damage,
    /// Offset of the first non-zero byte at or after `offset` (a torn tail
    /// always holds one: an all-zero rest is the end of the log).
    pub first_nonzero: u64,
}

impl Torn {
    /// What was found at `offset`, in words (`TornTail::damage`). A `len`
    /// of 0 there is never the end of written data, since the rest is not
    /// all zero: it is said as zeros, then non-zero bytes, and where.
    pub fn describe(&self) -> String {
        match self.damage {
            Damage::Zeros => format!(
                "{} zero bytes, then non-zero bytes from offset {}: not a clean end of \
                 written data",
                self.first_nonzero.saturating_sub(self.offset),
                self.first_nonzero
            ),
            damage => damage.to_string(),
        }
    }
}

/// A segment with a valid header, decoded.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    /// Its header.
    pub header: SegmentHeader,
    /// Whole records visited (seal excluded).
    pub records: u64,
    /// Seq of the last whole record, `first_seq - 1` when none.
    pub last_seq: Seq,
    /// Offset just past the last whole record, or past the seal.
    pub end: u64,
    /// Seal or open end, with the chain.
    pub tail: SegmentEnd,
    /// Last segment only: bytes from `torn.offset` on are a torn tail.
    pub torn: Option<Torn>,
    /// The visitor stopped the walk; `records`, `last_seq`, `end` and the
    /// chain describe the stopping point, nothing after it was checked.
    pub stopped: bool,
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
/// each whole record in order (seals excluded).
///
/// Errors: `UnsupportedVersion` for a newer header; `Corrupt` for anything
/// that is neither a valid record nor, in the last segment, a torn tail (see
/// FORMAT.md, "Torn and corrupt"). Records already visited when an error is
/// found were whole and in order, but the caller must discard what it built
/// from them.
pub(crate) fn decode_segment<'a>(
    name: &str,
    bytes: &'a [u8],
    expect: Expect,
    opts: DecodeOptions,
    mut visit: impl FnMut(RecordRef<'a>) -> ControlFlow<()>,
) -> Result<Decoded, LogError> {
    let last_good = expect.first_seq.saturating_sub(1);
    let header = match SegmentHeader::decode(bytes) {
        Ok(header) => header,
        Err(HeaderError::Unsupported { found }) => {
            return Err(LogError::UnsupportedVersion {
                segment: name.to_owned(),
                found,
                supported: FORMAT_VERSION,
            })
        }
        Err(e) => {
            if opts.role == Role::Sealed {
                return Err(LogError::corrupt(
                    name,
                    e.offset(),
                    expect.first_seq,
                    format!("bad segment header: {e}"),
                ));
            }
            return match find_valid_record(bytes, 0, last_good, opts.max_record_bytes) {
                None => Ok(Decoded::InterruptedRoll {
                    reason: e.to_string(),
                }),
                Some((offset, seq)) => Err(LogError::corrupt(
                    name,
                    e.offset(),
                    expect.first_seq,
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
            expect.first_seq,
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
            expect.first_seq,
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
            last_good,
            format!(
                "chain broken: header chain_start {} is not the previous segment's final chain {}",
                chain_hex(&header.chain_start),
                chain_hex(&expect.chain_start)
            ),
        ));
    }

    // Walk the records.
    let mut offset = HEADER_LEN;
    let mut last_seq = last_good;
    let mut records: u64 = 0;
    let mut seal: Option<(usize, ChainValue)> = None;
    let mut stop: Option<Damage> = None;
    let mut stopped = false;
    loop {
        match decode_record(bytes, offset, opts.max_record_bytes) {
            RecordDecode::End => break,
            RecordDecode::Damaged(damage) => {
                stop = Some(damage);
                break;
            }
            RecordDecode::Record { record, size } => {
                if record.kind == KIND_SEAL {
                    seal = Some((offset, check_seal(name, offset, &record, last_seq)?));
                    offset += size;
                    break;
                }
                if record.seq != last_seq.wrapping_add(1) {
                    return Err(LogError::corrupt(
                        name,
                        offset,
                        last_seq,
                        format!(
                            "seq gap: expected seq {}, found {}",
                            last_seq.wrapping_add(1),
                            record.seq
                        ),
                    ));
                }
                records += 1;
                last_seq = record.seq;
                offset += size;
                if visit(record).is_break() {
                    stopped = true;
                    break;
                }
            }
        }
    }
    // usize is at most 64 bits on every target Rust supports.
    let end = offset as u64;

    if let Some((seal_offset, chain)) = seal {
        let after = bytes.get(offset..).unwrap_or(&[]);
        if let Some(i) = after.iter().position(|&b| b != 0) {
            return Err(LogError::corrupt(
                name,
                offset + i,
                last_seq,
                "non-zero bytes after the seal",
            ));
        }
        if opts.verify_seal {
            let mut hasher = chain_hasher(&header.chain_start);
            hasher.update(bytes.get(..seal_offset).unwrap_or(bytes));
            let computed: ChainValue = hasher.finalize().into();
            if computed != chain {
                return Err(LogError::corrupt(
                    name,
                    seal_offset,
                    last_seq,
                    format!(
                        "chain mismatch: the seal holds {}, the bytes hash to {}",
                        chain_hex(&chain),
                        chain_hex(&computed)
                    ),
                ));
            }
        }
        return Ok(Decoded::Segment(Segment {
            header,
            records,
            last_seq,
            end,
            tail: SegmentEnd::Sealed { chain },
            torn: None,
            stopped: false,
        }));
    }

    let mut torn = None;
    if !stopped {
        match (opts.role, stop) {
            (Role::Sealed, damage) => {
                let reason = match damage {
                    Some(damage) => format!("{damage} in a sealed segment"),
                    None => "the segment ends without a seal".to_owned(),
                };
                return Err(LogError::corrupt(name, offset, last_seq, reason));
            }
            (Role::Last, None) => {}
            // Nothing but zeros from here to the end of the file: the end of
            // the log, not a torn tail. The writer's zero fill ahead
            // (pre-allocation) leaves exactly this, and so does a size made
            // durable before the data it was extended for; neither holds a
            // byte of data.
            (Role::Last, Some(_)) if bytes.get(offset..).unwrap_or(&[]).iter().all(|&b| b == 0) => {
            }
            (Role::Last, Some(damage)) => {
                if let RecordDecode::Record { record, .. } = decode_record(bytes, offset, u32::MAX)
                {
                    // A whole, checksum-valid frame is data, not a torn write:
                    // only the limit refused it.
                    return Err(LogError::corrupt(
                        name,
                        offset,
                        last_seq,
                        format!(
                            "whole record (seq {}) with {damage} {}; raise the limit to read it",
                            record.seq, opts.max_record_bytes
                        ),
                    ));
                }
                if let Some((at, seq)) =
                    find_valid_record(bytes, offset + 1, last_seq, opts.max_record_bytes)
                {
                    return Err(LogError::corrupt(
                        name,
                        offset,
                        last_seq,
                        format!("{damage}, but a valid record (seq {seq}) follows at offset {at}"),
                    ));
                }
                let zeros = bytes
                    .get(offset..)
                    .and_then(|rest| rest.iter().position(|&b| b != 0))
                    .unwrap_or(0);
                torn = Some(Torn {
                    offset: end,
                    damage,
                    // Cast: usize is at most 64 bits on every target Rust
                    // supports.
                    first_nonzero: end + zeros as u64,
                });
            }
        }
    }

    let mut hasher = chain_hasher(&header.chain_start);
    hasher.update(bytes.get(..offset).unwrap_or(bytes));
    let head_chain = if records == 0 {
        header.chain_start
    } else {
        hasher.finalize().into()
    };
    Ok(Decoded::Segment(Segment {
        header,
        records,
        last_seq,
        end,
        tail: SegmentEnd::Open {
            head_chain,
            hasher: Box::new(hasher),
        },
        torn,
        stopped,
    }))
}

/// Checks a checksum-valid record of kind [`KIND_SEAL`] at `offset` and
/// returns the chain value it holds.
fn check_seal(
    name: &str,
    offset: usize,
    seal: &RecordRef<'_>,
    last_seq: Seq,
) -> Result<ChainValue, LogError> {
    if seal.kind_version != SEAL_KIND_VERSION {
        return Err(LogError::corrupt(
            name,
            offset,
            last_seq,
            format!("seal with kind_version {}", seal.kind_version),
        ));
    }
    if seal.seq != last_seq {
        return Err(LogError::corrupt(
            name,
            offset,
            last_seq,
            format!("seal names seq {}, the last record is {last_seq}", seal.seq),
        ));
    }
    match seal.payload.first_chunk::<SEAL_PAYLOAD_LEN>() {
        Some(chain) if seal.payload.len() == SEAL_PAYLOAD_LEN => Ok(*chain),
        _ => Err(LogError::corrupt(
            name,
            offset,
            last_seq,
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
