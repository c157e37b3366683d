//! The bytes of format versions 1 and 2: constants, the segment header, the
//! record frame, the seal and (version 2) the commit mark. FORMAT.md holds the same tables; the test vectors pin
//! them.
//!
//! Little-endian everywhere. Every offset constant is built from the one
//! before it with `size_of`, so a table and its code cannot drift apart.
//!
//! Nothing here allocates while decoding: [`decode_record`] returns a
//! [`RecordRef`] borrowed from the segment bytes.

use std::mem::size_of;

use crate::error::LogError;

/// A record's sequence number: gapless, starting at 1. 0 means "no record".
pub type Seq = u64;

/// A BLAKE3 chain value (32 bytes). See [`chain_hasher`].
pub type ChainValue = [u8; 32];

/// The format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u16 = 2;
/// The oldest format version this build reads (FORMAT.md, "Versions").
pub const FORMAT_VERSION_V1: u16 = 1;

/// The first 8 bytes of every segment file.
pub const MAGIC: [u8; 8] = *b"SPARKLOG";

// ---- Segment header ----------------------------------------------------

/// Header: `magic` (8 bytes, [`MAGIC`]).
pub const HEADER_MAGIC_OFFSET: usize = 0;
/// Header: `format_version` (u16).
pub const HEADER_VERSION_OFFSET: usize = HEADER_MAGIC_OFFSET + size_of::<[u8; 8]>();
/// Header: `header_len` (u16), the header size in bytes (64 in versions 1
/// and 2).
pub const HEADER_LEN_OFFSET: usize = HEADER_VERSION_OFFSET + size_of::<u16>();
/// Header: `header_crc` (u32), CRC32 of the `header_len` header bytes with
/// this field zeroed.
pub const HEADER_CRC_OFFSET: usize = HEADER_LEN_OFFSET + size_of::<u16>();
/// Header: `first_seq` (u64), the seq of the first record the segment holds.
pub const HEADER_FIRST_SEQ_OFFSET: usize = HEADER_CRC_OFFSET + size_of::<u32>();
/// Header: `created_ms` (u64), Unix time in ms when the segment was created.
pub const HEADER_CREATED_MS_OFFSET: usize = HEADER_FIRST_SEQ_OFFSET + size_of::<u64>();
/// Header: `chain_start` (32 bytes), the previous segment's final chain value.
pub const HEADER_CHAIN_START_OFFSET: usize = HEADER_CREATED_MS_OFFSET + size_of::<u64>();
/// Size of the segment header in bytes (64).
pub const HEADER_LEN: usize = HEADER_CHAIN_START_OFFSET + size_of::<ChainValue>();
const _: () = assert!(HEADER_LEN == 64);

/// The bytes every format version keeps in place (magic, version,
/// header_len, header_crc), so a reader can tell "newer version" from
/// "damage".
pub const HEADER_STABLE_PREFIX_LEN: usize = HEADER_FIRST_SEQ_OFFSET;

// ---- Record frame --------------------------------------------------------

/// Record: `len` (u32), bytes from `seq` to the end of the payload.
pub const RECORD_LEN_OFFSET: usize = 0;
/// Record: `crc` (u32), CRC32 of the 4 `len` bytes then the `len` bytes from
/// `seq` on.
pub const RECORD_CRC_OFFSET: usize = RECORD_LEN_OFFSET + size_of::<u32>();
/// Record: `seq` (u64). The first byte covered by `len`.
pub const RECORD_SEQ_OFFSET: usize = RECORD_CRC_OFFSET + size_of::<u32>();
/// Record: `ts_ms` (u64), server time in Unix ms.
pub const RECORD_TS_OFFSET: usize = RECORD_SEQ_OFFSET + size_of::<u64>();
/// Record: `kind` (u16); [`KIND_SEAL`] is reserved.
pub const RECORD_KIND_OFFSET: usize = RECORD_TS_OFFSET + size_of::<u64>();
/// Record: `kind_version` (u16).
pub const RECORD_KIND_VERSION_OFFSET: usize = RECORD_KIND_OFFSET + size_of::<u16>();
/// Record: the payload, `len - 20` bytes.
pub const RECORD_PAYLOAD_OFFSET: usize = RECORD_KIND_VERSION_OFFSET + size_of::<u16>();
/// Bytes of a record before its payload (28): len + crc + seq + ts + kind +
/// kind_version.
pub const RECORD_HEADER_LEN: usize = RECORD_PAYLOAD_OFFSET;
const _: () = assert!(RECORD_HEADER_LEN == 28);

/// The smallest valid `len` (20: a record with an empty payload).
// Cast: 20 fits in u32.
pub const RECORD_MIN_LEN: u32 = (RECORD_HEADER_LEN - RECORD_SEQ_OFFSET) as u32;

/// The kind of the log's own frames (the seal and, in version 2, the commit
/// mark, told apart by `kind_version`); appenders may not use it.
pub const KIND_SEAL: u16 = 0;
/// The `kind_version` of a seal (kind [`KIND_SEAL`]).
pub const SEAL_KIND_VERSION: u16 = 1;
/// The `kind_version` of a commit mark (kind [`KIND_SEAL`]; version-2
/// segments only).
pub const COMMIT_KIND_VERSION: u16 = 2;
/// Payload bytes of a seal: the segment's final chain value.
pub const SEAL_PAYLOAD_LEN: usize = size_of::<ChainValue>();
/// On-disk size of a seal record (60).
pub const SEAL_RECORD_BYTES: usize = RECORD_HEADER_LEN + SEAL_PAYLOAD_LEN;

/// Commit mark payload: `record_count` (u64), the records of its batch.
pub const COMMIT_COUNT_OFFSET: usize = 0;
/// Commit mark payload: `batch_bytes` (u64), the bytes of its batch's
/// records: from the first record's `len` field to the mark's own.
pub const COMMIT_BYTES_OFFSET: usize = COMMIT_COUNT_OFFSET + size_of::<u64>();
/// Commit mark payload: `batch_crc` (u32), CRC32 of those `batch_bytes`.
pub const COMMIT_CRC_OFFSET: usize = COMMIT_BYTES_OFFSET + size_of::<u64>();
/// Payload bytes of a commit mark (20).
pub const COMMIT_PAYLOAD_LEN: usize = COMMIT_CRC_OFFSET + size_of::<u32>();
/// On-disk size of a commit mark (48).
pub const COMMIT_RECORD_BYTES: usize = RECORD_HEADER_LEN + COMMIT_PAYLOAD_LEN;
const _: () = assert!(COMMIT_RECORD_BYTES == 48);

/// Default largest `len` a record may have (4 MiB).
pub const DEFAULT_MAX_RECORD_BYTES: u32 = 4 << 20;
/// Default segment size at which the appender rolls (64 MiB).
pub const DEFAULT_SEGMENT_SIZE_BYTES: u64 = 64 << 20;

// ---- Segment file names --------------------------------------------------

/// Digits of the zero-padded first seq in a segment file name.
pub const SEGMENT_NAME_DIGITS: usize = 20;
/// Extension of segment files.
pub const SEGMENT_SUFFIX: &str = ".seg";

/// The file name of the segment whose first record has `first_seq`:
/// 20 zero-padded digits then `.seg`, e.g. `00000000000000000001.seg`.
pub fn segment_file_name(first_seq: Seq) -> String {
    format!(
        "{first_seq:0width$}{SEGMENT_SUFFIX}",
        width = SEGMENT_NAME_DIGITS
    )
}

/// The first seq a segment file name declares, or `None` when the name is
/// not exactly 20 ASCII digits followed by `.seg` (or overflows u64).
pub fn parse_segment_file_name(name: &str) -> Option<Seq> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != SEGMENT_NAME_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

// ---- Little-endian readers -----------------------------------------------

/// The u16 at `offset`, or `None` past the end.
pub(crate) fn le_u16(bytes: &[u8], offset: usize) -> Option<u16> {
    bytes
        .get(offset..)?
        .first_chunk::<2>()
        .map(|b| u16::from_le_bytes(*b))
}

/// The u32 at `offset`, or `None` past the end.
pub(crate) fn le_u32(bytes: &[u8], offset: usize) -> Option<u32> {
    bytes
        .get(offset..)?
        .first_chunk::<4>()
        .map(|b| u32::from_le_bytes(*b))
}

/// The u64 at `offset`, or `None` past the end.
pub(crate) fn le_u64(bytes: &[u8], offset: usize) -> Option<u64> {
    bytes
        .get(offset..)?
        .first_chunk::<8>()
        .map(|b| u64::from_le_bytes(*b))
}

/// The 32 bytes at `offset`, or `None` past the end.
pub(crate) fn chain_at(bytes: &[u8], offset: usize) -> Option<ChainValue> {
    bytes.get(offset..)?.first_chunk::<32>().copied()
}

// ---- Header --------------------------------------------------------------

/// The decoded fields of a segment header, the same in versions 1 and 2
/// (see FORMAT.md for the table). `magic`, `format_version` and `header_len` are implied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Seq of the first record this segment holds; equals the file name.
    pub first_seq: Seq,
    /// Unix time in ms when the segment file was created.
    pub created_ms: u64,
    /// The previous segment's final chain value ([0; 32] for the first).
    pub chain_start: ChainValue,
}

/// Why a segment header does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// The file is shorter than a header (`len` bytes).
    Short {
        /// File length in bytes.
        len: usize,
    },
    /// The first 8 bytes are not [`MAGIC`].
    BadMagic,
    /// The header checksum does not match.
    BadChecksum {
        /// The CRC stored in the header.
        stored: u32,
        /// The CRC of the bytes.
        computed: u32,
    },
    /// Checksum valid, but `format_version` is 0.
    VersionZero,
    /// Checksum valid, version 1 or 2, but `header_len` is not 64.
    BadHeaderLen(u16),
    /// A newer format whose own header checksum (over its `header_len`
    /// bytes) is valid.
    Unsupported {
        /// The version found.
        found: u16,
    },
}

impl HeaderError {
    /// Byte offset of the field that failed.
    pub fn offset(&self) -> usize {
        match self {
            HeaderError::Short { .. } | HeaderError::BadMagic => HEADER_MAGIC_OFFSET,
            HeaderError::BadChecksum { .. } => HEADER_CRC_OFFSET,
            HeaderError::VersionZero | HeaderError::Unsupported { .. } => HEADER_VERSION_OFFSET,
            HeaderError::BadHeaderLen(_) => HEADER_LEN_OFFSET,
        }
    }
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::Short { len } => {
                write!(
                    f,
                    "file of {len} bytes is shorter than a {HEADER_LEN}-byte header"
                )
            }
            HeaderError::BadMagic => write!(f, "bad magic (not a segment file)"),
            HeaderError::BadChecksum { stored, computed } => write!(
                f,
                "header checksum {stored:#010x} does not match the bytes ({computed:#010x})"
            ),
            HeaderError::VersionZero => write!(f, "format version 0"),
            HeaderError::BadHeaderLen(len) => {
                write!(
                    f,
                    "header_len {len}, format versions 1 and 2 have {HEADER_LEN}"
                )
            }
            HeaderError::Unsupported { found } => write!(f, "format version {found}"),
        }
    }
}

/// CRC32 of `header` (the first `header_len` bytes of a segment) with the
/// `header_crc` field taken as zero. `header` must be at least
/// [`HEADER_STABLE_PREFIX_LEN`] bytes.
pub fn header_crc(header: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(header.get(..HEADER_CRC_OFFSET).unwrap_or(header));
    crc.update(&[0; size_of::<u32>()]);
    crc.update(header.get(HEADER_FIRST_SEQ_OFFSET..).unwrap_or(&[]));
    crc.finalize()
}

impl SegmentHeader {
    /// The 64 header bytes of the current format version
    /// ([`FORMAT_VERSION`]), checksum included.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        self.encode_version(FORMAT_VERSION)
    }

    /// The 64 header bytes declaring `format_version` (1 or 2: both have
    /// the same header), checksum included. Version 1 is for tests and
    /// tools that build old segments.
    pub fn encode_version(&self, format_version: u16) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[HEADER_MAGIC_OFFSET..HEADER_VERSION_OFFSET].copy_from_slice(&MAGIC);
        out[HEADER_VERSION_OFFSET..HEADER_LEN_OFFSET]
            .copy_from_slice(&format_version.to_le_bytes());
        // Cast: HEADER_LEN is 64 (asserted above), which fits in u16.
        out[HEADER_LEN_OFFSET..HEADER_CRC_OFFSET]
            .copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        out[HEADER_FIRST_SEQ_OFFSET..HEADER_CREATED_MS_OFFSET]
            .copy_from_slice(&self.first_seq.to_le_bytes());
        out[HEADER_CREATED_MS_OFFSET..HEADER_CHAIN_START_OFFSET]
            .copy_from_slice(&self.created_ms.to_le_bytes());
        out[HEADER_CHAIN_START_OFFSET..HEADER_LEN].copy_from_slice(&self.chain_start);
        let crc = header_crc(&out);
        out[HEADER_CRC_OFFSET..HEADER_FIRST_SEQ_OFFSET].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes the header at the start of `segment` (the whole file may be
    /// passed). Checks, in order: length, magic, version (a newer version is
    /// `Unsupported` only if its own checksum over its `header_len` bytes
    /// holds, else it is damage), checksum, version 0, `header_len`.
    pub fn decode(segment: &[u8]) -> Result<SegmentHeader, HeaderError> {
        SegmentHeader::decode_versioned(segment).map(|(header, _)| header)
    }

    /// [`decode`](Self::decode), with the header's `format_version` (1 or
    /// 2).
    pub fn decode_versioned(segment: &[u8]) -> Result<(SegmentHeader, u16), HeaderError> {
        let short = HeaderError::Short { len: segment.len() };
        if segment.get(HEADER_MAGIC_OFFSET..HEADER_VERSION_OFFSET) != Some(&MAGIC[..]) {
            return Err(if segment.len() < HEADER_LEN {
                short
            } else {
                HeaderError::BadMagic
            });
        }
        let version = le_u16(segment, HEADER_VERSION_OFFSET).ok_or(short)?;
        let header_len = le_u16(segment, HEADER_LEN_OFFSET).ok_or(short)?;
        let stored = le_u32(segment, HEADER_CRC_OFFSET).ok_or(short)?;
        if version > FORMAT_VERSION {
            let own = usize::from(header_len);
            if own >= HEADER_STABLE_PREFIX_LEN {
                if let Some(bytes) = segment.get(..own) {
                    if header_crc(bytes) == stored {
                        return Err(HeaderError::Unsupported { found: version });
                    }
                }
            }
        }
        let bytes = segment.get(..HEADER_LEN).ok_or(short)?;
        let computed = header_crc(bytes);
        if computed != stored {
            return Err(HeaderError::BadChecksum { stored, computed });
        }
        if version == 0 {
            return Err(HeaderError::VersionZero);
        }
        if usize::from(header_len) != HEADER_LEN {
            return Err(HeaderError::BadHeaderLen(header_len));
        }
        let header = SegmentHeader {
            first_seq: le_u64(bytes, HEADER_FIRST_SEQ_OFFSET).ok_or(short)?,
            created_ms: le_u64(bytes, HEADER_CREATED_MS_OFFSET).ok_or(short)?,
            chain_start: chain_at(bytes, HEADER_CHAIN_START_OFFSET).ok_or(short)?,
        };
        Ok((header, version))
    }
}

// ---- Records -------------------------------------------------------------

/// A record handed to the appender. The log assigns its seq.
#[derive(Clone, Copy, Debug)]
pub struct RecordIn<'a> {
    /// Server time in Unix ms; stored as is.
    pub ts_ms: u64,
    /// The payload's type; must not be [`KIND_SEAL`].
    pub kind: u16,
    /// The version of that type's encoding.
    pub kind_version: u16,
    /// Opaque bytes; `20 + payload.len()` must be at most `max_record_bytes`.
    pub payload: &'a [u8],
}

/// A record decoded from a segment, borrowed from the mapped bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// Its sequence number.
    pub seq: Seq,
    /// Server time in Unix ms.
    pub ts_ms: u64,
    /// The payload's type ([`KIND_SEAL`] only for a seal).
    pub kind: u16,
    /// The version of that type's encoding.
    pub kind_version: u16,
    /// The payload bytes.
    pub payload: &'a [u8],
    /// Byte offset of the record (its `len` field) in its segment file.
    pub offset: u64,
}

/// Why the bytes at an offset are not a whole record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    /// Fewer bytes remain than the frame needs (a torn write, or a `len`
    /// damaged upward).
    Truncated,
    /// `len` is 0: zero bytes where a record would start. The end of the
    /// log only when every later byte of the file is zero too (a zero-filled
    /// tail); zeros followed by non-zero bytes are a torn tail or damage.
    Zeros,
    /// `len` is below [`RECORD_MIN_LEN`].
    LenTooSmall(u32),
    /// `len` is above `max_record_bytes` (never allocated, never trusted).
    LenOverLimit(u32),
    /// The CRC does not match.
    BadCrc,
    /// Version 2: records that no commit mark closes (the file ends, or
    /// zeros start, after them): a batch whose write did not finish.
    Uncommitted,
    /// Version 2: a checksum-valid commit mark that does not close the
    /// records before it (their count, bytes or batch checksum differ).
    CommitMismatch,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::Truncated => write!(f, "truncated record"),
            Damage::Zeros => write!(f, "len 0 (zero bytes where a record would start)"),
            Damage::LenTooSmall(len) => write!(f, "len {len} below the minimum {RECORD_MIN_LEN}"),
            Damage::LenOverLimit(len) => write!(f, "len {len} over max_record_bytes"),
            Damage::BadCrc => write!(f, "record checksum mismatch"),
            Damage::Uncommitted => write!(f, "records without a commit mark"),
            Damage::CommitMismatch => write!(
                f,
                "commit mark that does not match the batch before it (count, bytes or checksum)"
            ),
        }
    }
}

/// What [`decode_record`] found at an offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordDecode<'a> {
    /// A whole record with a valid CRC, `size` bytes on disk (8 + len).
    /// Its seq is not checked here.
    Record {
        /// The record, borrowed from the input.
        record: RecordRef<'a>,
        /// Bytes it occupies (8 + len).
        size: usize,
    },
    /// The offset is exactly the end of the bytes.
    End,
    /// Something that is not a whole record starts here.
    Damaged(Damage),
}

/// CRC32 of a record frame: its 4 `len` bytes, then the `len` bytes from
/// `seq` on. `frame` starts at the `len` field and holds at least 8 + len
/// bytes; shorter input hashes what there is.
pub(crate) fn record_crc(frame: &[u8], len: usize) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(
        frame
            .get(RECORD_LEN_OFFSET..RECORD_CRC_OFFSET)
            .unwrap_or(&[]),
    );
    let end = RECORD_SEQ_OFFSET.saturating_add(len);
    crc.update(frame.get(RECORD_SEQ_OFFSET..end).unwrap_or(&[]));
    crc.finalize()
}

/// Decodes the record frame at `offset` of `segment` without allocating.
///
/// Checks `len` against [`RECORD_MIN_LEN`] and `max_record_bytes` before
/// looking at the bytes it covers, then the CRC. The seq and the kind are the
/// caller's business.
pub fn decode_record(segment: &[u8], offset: usize, max_record_bytes: u32) -> RecordDecode<'_> {
    let Some(rest) = segment.get(offset..) else {
        return RecordDecode::Damaged(Damage::Truncated);
    };
    if rest.is_empty() {
        return RecordDecode::End;
    }
    let Some(len) = le_u32(rest, RECORD_LEN_OFFSET) else {
        return RecordDecode::Damaged(Damage::Truncated);
    };
    if len == 0 {
        return RecordDecode::Damaged(Damage::Zeros);
    }
    if len < RECORD_MIN_LEN {
        return RecordDecode::Damaged(Damage::LenTooSmall(len));
    }
    if len > max_record_bytes {
        return RecordDecode::Damaged(Damage::LenOverLimit(len));
    }
    // Cast: u32 to usize is lossless on the 32- and 64-bit targets we build for.
    let len = len as usize;
    let size = RECORD_SEQ_OFFSET + len;
    let Some(frame) = rest.get(..size) else {
        return RecordDecode::Damaged(Damage::Truncated);
    };
    if le_u32(frame, RECORD_CRC_OFFSET) != Some(record_crc(frame, len)) {
        return RecordDecode::Damaged(Damage::BadCrc);
    }
    // The frame is at least 28 bytes (len >= 20), so every field is present.
    let (Some(seq), Some(ts_ms), Some(kind), Some(kind_version), Some(payload)) = (
        le_u64(frame, RECORD_SEQ_OFFSET),
        le_u64(frame, RECORD_TS_OFFSET),
        le_u16(frame, RECORD_KIND_OFFSET),
        le_u16(frame, RECORD_KIND_VERSION_OFFSET),
        frame.get(RECORD_PAYLOAD_OFFSET..),
    ) else {
        return RecordDecode::Damaged(Damage::Truncated);
    };
    RecordDecode::Record {
        record: RecordRef {
            seq,
            ts_ms,
            kind,
            kind_version,
            payload,
            // usize is at most 64 bits on every target Rust supports.
            offset: offset as u64,
        },
        size,
    }
}

/// The `len` field for a payload of `payload_len` bytes (20 + payload), or
/// `None` when it does not fit in u32.
pub fn record_len(payload_len: usize) -> Option<u32> {
    u32::try_from(payload_len).ok()?.checked_add(RECORD_MIN_LEN)
}

/// True if a record with `payload_bytes` of payload fits `max_record_bytes`
/// (the frame's `len` covers the payload and 20 bytes of header); what
/// [`Log::append_batch`](crate::Log::append_batch) refuses with
/// `RecordTooLarge` otherwise.
pub fn record_fits(payload_bytes: usize, max_record_bytes: u32) -> bool {
    // Cast: u32 to usize is lossless on the 32- and 64-bit targets we build for.
    payload_bytes.saturating_add(RECORD_MIN_LEN as usize) <= max_record_bytes as usize
}

/// On-disk bytes of a record with a payload of `payload_len` bytes.
pub fn record_size(payload_len: usize) -> usize {
    RECORD_HEADER_LEN.saturating_add(payload_len)
}

/// Appends the frame of `record` with `seq` to `out` and returns its size.
///
/// Raw framing: the kind is not checked (the [`Log`](crate::Log) refuses
/// [`KIND_SEAL`]; tests and tools may build any frame). Errors with
/// `RecordTooLarge` only when `len` would not fit in u32.
pub fn encode_record(
    out: &mut Vec<u8>,
    seq: Seq,
    record: &RecordIn<'_>,
) -> Result<usize, LogError> {
    let len = record_len(record.payload.len()).ok_or(LogError::RecordTooLarge {
        // Cast: RECORD_MIN_LEN is 20.
        bytes: record.payload.len().saturating_add(RECORD_MIN_LEN as usize),
        limit: u32::MAX,
    })?;
    Ok(encode_frame(out, len, seq, record))
}

/// Appends a seal to `out`: kind [`KIND_SEAL`], kind_version
/// [`SEAL_KIND_VERSION`], `seq` = the segment's last record seq, payload =
/// `chain`, the chain value at the seal's offset. Returns its size (60).
pub fn encode_seal(out: &mut Vec<u8>, seq: Seq, ts_ms: u64, chain: &ChainValue) -> usize {
    let seal = RecordIn {
        ts_ms,
        kind: KIND_SEAL,
        kind_version: SEAL_KIND_VERSION,
        payload: chain,
    };
    // Cast: SEAL_PAYLOAD_LEN is 32, so len is 52.
    encode_frame(out, RECORD_MIN_LEN + SEAL_PAYLOAD_LEN as u32, seq, &seal)
}

/// What a version-2 commit mark says about the batch it closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitMark {
    /// Records in the batch (at least 1).
    pub record_count: u64,
    /// Bytes of the batch's records, from the first record's `len` field to
    /// the mark's own `len` field.
    pub batch_bytes: u64,
    /// CRC32 of those bytes.
    pub batch_crc: u32,
}

impl CommitMark {
    /// The mark that closes `batch` (the encoded records, back to back)
    /// holding `record_count` records.
    pub fn for_batch(batch: &[u8], record_count: u64) -> CommitMark {
        CommitMark {
            record_count,
            // usize is at most 64 bits on every target Rust supports.
            batch_bytes: batch.len() as u64,
            batch_crc: crc32fast::hash(batch),
        }
    }

    /// Reads the payload of a checksum-valid frame of kind [`KIND_SEAL`]
    /// and kind_version [`COMMIT_KIND_VERSION`]; `None` when it is not
    /// [`COMMIT_PAYLOAD_LEN`] bytes.
    pub fn decode(payload: &[u8]) -> Option<CommitMark> {
        if payload.len() != COMMIT_PAYLOAD_LEN {
            return None;
        }
        Some(CommitMark {
            record_count: le_u64(payload, COMMIT_COUNT_OFFSET)?,
            batch_bytes: le_u64(payload, COMMIT_BYTES_OFFSET)?,
            batch_crc: le_u32(payload, COMMIT_CRC_OFFSET)?,
        })
    }

    /// True when this mark closes exactly `batch` (the bytes from its first
    /// record to the mark) holding `record_count` records.
    pub fn closes(&self, batch: &[u8], record_count: u64) -> bool {
        *self == CommitMark::for_batch(batch, record_count)
    }
}

/// Appends a commit mark to `out`: kind [`KIND_SEAL`], kind_version
/// [`COMMIT_KIND_VERSION`], `seq` = the batch's last seq, `ts_ms` = the
/// clock at the write, payload = `mark`. Returns its size (48).
pub fn encode_commit(out: &mut Vec<u8>, seq: Seq, ts_ms: u64, mark: &CommitMark) -> usize {
    let mut payload = [0u8; COMMIT_PAYLOAD_LEN];
    payload[COMMIT_COUNT_OFFSET..COMMIT_BYTES_OFFSET]
        .copy_from_slice(&mark.record_count.to_le_bytes());
    payload[COMMIT_BYTES_OFFSET..COMMIT_CRC_OFFSET]
        .copy_from_slice(&mark.batch_bytes.to_le_bytes());
    payload[COMMIT_CRC_OFFSET..COMMIT_PAYLOAD_LEN].copy_from_slice(&mark.batch_crc.to_le_bytes());
    let commit = RecordIn {
        ts_ms,
        kind: KIND_SEAL,
        kind_version: COMMIT_KIND_VERSION,
        payload: &payload,
    };
    // Cast: COMMIT_PAYLOAD_LEN is 20, so len is 40.
    encode_frame(
        out,
        RECORD_MIN_LEN + COMMIT_PAYLOAD_LEN as u32,
        seq,
        &commit,
    )
}

/// Appends one frame whose `len` field the caller computed from the payload.
fn encode_frame(out: &mut Vec<u8>, len: u32, seq: Seq, record: &RecordIn<'_>) -> usize {
    let start = out.len();
    out.reserve(record_size(record.payload.len()));
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&[0; size_of::<u32>()]);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&record.ts_ms.to_le_bytes());
    out.extend_from_slice(&record.kind.to_le_bytes());
    out.extend_from_slice(&record.kind_version.to_le_bytes());
    out.extend_from_slice(record.payload);
    // Cast: u32 to usize is lossless on the 32- and 64-bit targets we build for.
    let crc = record_crc(&out[start..], len as usize);
    out[start + RECORD_CRC_OFFSET..start + RECORD_SEQ_OFFSET].copy_from_slice(&crc.to_le_bytes());
    out.len() - start
}

// ---- Chain ---------------------------------------------------------------

/// A BLAKE3 hasher at offset 0 of a segment whose header carries
/// `chain_start`: feed it the segment's bytes from offset 0 (header
/// included); `finalize()` at any offset is the chain value there.
pub fn chain_hasher(chain_start: &ChainValue) -> blake3::Hasher {
    let mut hasher = blake3::Hasher::new();
    hasher.update(chain_start);
    hasher
}

/// The chain value after `segment_prefix` (bytes from offset 0) of a segment
/// whose header carries `chain_start`, in one pass.
pub fn chain_value(chain_start: &ChainValue, segment_prefix: &[u8]) -> ChainValue {
    let mut hasher = chain_hasher(chain_start);
    hasher.update(segment_prefix);
    hasher.finalize().into()
}

/// Lowercase hex of a chain value (64 characters).
pub fn chain_hex(chain: &ChainValue) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * chain.len());
    for byte in chain {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_each_flip() {
        let header = SegmentHeader {
            first_seq: 7,
            created_ms: 1_700_000_000_000,
            chain_start: [9; 32],
        };
        let bytes = header.encode();
        assert_eq!(SegmentHeader::decode(&bytes), Ok(header));
        for i in 0..HEADER_LEN {
            let mut bad = bytes;
            bad[i] ^= 0x40;
            assert!(SegmentHeader::decode(&bad).is_err(), "flip at {i} accepted");
        }
        assert_eq!(
            SegmentHeader::decode(&bytes[..30]),
            Err(HeaderError::Short { len: 30 })
        );
    }

    #[test]
    fn record_round_trips() {
        let mut out = vec![0xAA; 3];
        let rec = RecordIn {
            ts_ms: 5,
            kind: 2,
            kind_version: 3,
            payload: b"abc",
        };
        let size = encode_record(&mut out, 42, &rec).unwrap();
        assert_eq!(size, 31);
        match decode_record(&out, 3, DEFAULT_MAX_RECORD_BYTES) {
            RecordDecode::Record { record, size } => {
                assert_eq!(size, 31);
                assert_eq!((record.seq, record.ts_ms, record.kind), (42, 5, 2));
                assert_eq!(
                    (record.kind_version, record.payload, record.offset),
                    (3, &b"abc"[..], 3)
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(decode_record(&out, out.len(), 100), RecordDecode::End);
        assert_eq!(
            decode_record(&out, 3, 22),
            RecordDecode::Damaged(Damage::LenOverLimit(23))
        );
    }

    #[test]
    fn names() {
        assert_eq!(segment_file_name(1), "00000000000000000001.seg");
        assert_eq!(parse_segment_file_name("00000000000000000001.seg"), Some(1));
        assert_eq!(parse_segment_file_name("0000000000000000001.seg"), None);
        assert_eq!(parse_segment_file_name("99999999999999999999.seg"), None);
        assert_eq!(parse_segment_file_name("0000000000000000000a.seg"), None);
    }
}
