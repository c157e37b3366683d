//! What recovery and the write path share: the appender's settings
//! ([`LogConfig`]), where the log ends ([`Head`]) and the segment appends go
//! to (`ActiveSegment`). Recovery builds the last two at open and hands them
//! to the [`Log`](crate::Log), which owns them from then on; the reader
//! reports a [`Head`] too.

use std::path::PathBuf;

use crate::format::{
    chain_hex, ChainValue, Seq, DEFAULT_MAX_RECORD_BYTES, DEFAULT_SEGMENT_SIZE_BYTES,
};
use crate::fs::LogFile;

/// The current Unix time in ms (the default [`LogConfig::now_ms`]); 0 if the
/// system clock is before 1970.
pub fn system_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Settings of the appender.
#[derive(Clone, Debug)]
pub struct LogConfig {
    /// The appender rolls to a new segment when the active one holds at
    /// least one record and its size plus the next batch would exceed this.
    /// A segment can therefore end up larger by one seal (60 bytes), or
    /// hold a single batch larger than this. Default 64 MiB; any value is
    /// accepted (0 rolls before every batch).
    pub segment_size_bytes: u64,
    /// Largest `len` field (20 + payload bytes) a record may have, on append
    /// and when reading. Default 4 MiB. Lowering it below records already in
    /// the log makes them unreadable (`Corrupt`, never silently dropped).
    pub max_record_bytes: u32,
    /// The clock for `created_ms` in segment headers and `ts_ms` of seals,
    /// in Unix ms. Default [`system_now_ms`]; tests and the format's test
    /// vectors pin it to make files byte-for-byte reproducible.
    pub now_ms: fn() -> u64,
    /// Zero-fill ahead, in bytes. When a batch would end past the bytes the
    /// active segment file already has, the batch's one write also carries
    /// zeros up to the next multiple of this (never past
    /// `segment_size_bytes`), so that the following appends overwrite
    /// blocks that are already allocated and inside the file's size, and
    /// their `fdatasync` has no size or allocation change to write (on ext4
    /// a growing file costs tens of µs more per sync). Recovery and the
    /// reader take an all-zero tail as the end of the log (FORMAT.md).
    /// 0, the default, writes nothing but records: every file then ends at
    /// its last record or seal.
    pub preallocate_bytes: u64,
    /// The pace of a compaction's writes (its staged segments, and the
    /// commit's copies of them over the old ones): in small steps, each
    /// written back before the next, at a bounded rate
    /// ([`WritePace`](crate::WritePace)), so that the appender's syncs
    /// never wait behind a large writeback. `None`, the default, writes
    /// unpaced (a recovery's redo always does).
    pub compaction_pace: Option<crate::WritePace>,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_size_bytes: DEFAULT_SEGMENT_SIZE_BYTES,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            now_ms: system_now_ms,
            preallocate_bytes: 0,
            compaction_pace: None,
        }
    }
}

/// Where the log ends: what `GET /api/log/head` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// Seq of the last whole record; 0 for an empty log.
    pub seq: Seq,
    /// File name of the active segment (the last segment file), "" when the
    /// log has no segment yet.
    pub segment: String,
    /// The chain value at the end of the last whole record: BLAKE3 over the
    /// active segment's `chain_start` and its bytes up to there (the
    /// segment's `chain_start` when it holds no record yet; [0; 32] for an
    /// empty log).
    pub chain: ChainValue,
}

impl Head {
    /// The head of an empty log.
    pub(crate) fn empty() -> Head {
        Head {
            seq: 0,
            segment: String::new(),
            chain: [0; 32],
        }
    }

    /// The chain value as 64 lowercase hex digits.
    pub fn chain_hex(&self) -> String {
        chain_hex(&self.chain)
    }
}

/// The segment appends go to.
pub(crate) struct ActiveSegment {
    /// File name.
    pub name: String,
    /// Full path, for errors.
    pub path: PathBuf,
    /// The open file.
    pub file: Box<dyn LogFile>,
    /// Bytes written and synced: the offset of the next record.
    pub len: u64,
    /// The file's size: `len` plus the zero fill after it (see
    /// [`LogConfig::preallocate_bytes`]).
    pub allocated: u64,
    /// Records in it (seal excluded); a segment is rolled only if non-zero.
    pub records: u64,
    /// Its header's `format_version`: [`FORMAT_VERSION`](crate::FORMAT_VERSION), or 1 for a
    /// version-1 segment found at open, which the first append seals (or,
    /// holding no record, re-heads as version 2) before writing.
    pub format_version: u16,
    /// BLAKE3 state after `chain_start` and bytes `0..len`.
    pub hasher: Box<blake3::Hasher>,
}
