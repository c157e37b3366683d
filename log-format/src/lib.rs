//! The append-only segment log under the Spark engine.
//!
//! The log moves opaque, typed payloads (`kind`, `kind_version`, bytes) and
//! guarantees their integrity and order: every record carries a gapless
//! sequence number and a CRC32, and every segment is covered by a BLAKE3 hash
//! chain that links it to the segment before. The byte-level format, the roll
//! steps, the recovery rules and the test vectors are specified in
//! `log-format/FORMAT.md`; this crate is that document in code.
//!
//! # Layout
//!
//! - [`format`](mod@format): the bytes of format versions 1 and 2. Constants, the segment
//!   header, the record frame, the seal and the commit mark, each offset built from the
//!   one before.
//! - [`fs`]: the file seam. All file access goes through [`Fs`] / [`LogFile`];
//!   [`OsFs`] is the real one (std + memmap2), [`FaultyFs`] injects faults.
//! - [`memfs`]: [`MemFs`], an in-memory [`Fs`] that keeps written bytes and
//!   directory entries apart from durable ones and simulates power cuts
//!   ([`CutMode`]), for crash tests and fuzzing.
//! - `frames`: [`Frames`], the record frames of a segment's bytes with their kind
//!   (op, commit mark, seal) and a typed [`FramesEnd`], for walks outside recovery.
//! - `segment`: the one routine that decodes a segment, shared by recovery and
//!   the reader, so both apply exactly the same rules.
//! - `recovery`: what [`Log::open`] does before the first append (torn tails,
//!   interrupted rolls, corruption).
//! - `state`: what recovery and the writer share: [`LogConfig`], [`Head`] and
//!   the active segment.
//! - `writer`: [`Log`], the single appender (batches, rolls, poisoning), and
//!   [`GroupCommitAppender`], which lets many threads share it.
//! - `reader`: [`LogReader`], a read-only mapped view for tools.
//! - `compaction_record`: the compaction record's payload ([`CompactionRecord`],
//!   kind [`KIND_COMPACTION`]), which the reader, recovery and the writer share.
//! - `compaction_journal`: the redo journal of a compaction's commit
//!   ([`JOURNAL_NAME`]), putting staged segments in place, and what
//!   [`Log::open`] does about an interrupted compaction before recovery.
//! - `compaction`: staging a compaction of the sealed segments
//!   ([`stage_compaction`], committed by [`Log::begin_compaction`],
//!   [`CompactionTicket::apply`] and [`Log::finish_compaction`], or
//!   [`Log::commit_compaction`] in one call) and
//!   [`link_head`].
//! - `error`: [`LogError`] and [`OpenError`].
//!
//! Integrity rules in one line: what follows the last valid commit mark of the
//! last segment was never acknowledged and is cut off (in a version-1
//! segment: an invalid record at its very end, a torn write), unless it shows
//! that it was acknowledged; anything else that does not verify is corruption
//! and is refused, naming segment, offset and seq.

#![warn(missing_docs)]

mod compaction;
mod compaction_journal;
mod compaction_record;
pub mod format;
pub mod fs;
pub mod memfs;

mod damage;
mod error;
mod frames;
mod reader;
mod recovery;
mod segment;
mod state;
mod writer;

pub use compaction::{
    link_head, stage_compaction, CompactionCommit, CompactionTicket, HeadLink, Rewrite,
    StagedCompaction,
};
pub use compaction_journal::{JOURNAL_NAME, STAGED_SUFFIX};
pub use compaction_record::{
    CompactionDecodeError, CompactionRecord, SegmentRewrite, COMPACTION_KIND_VERSION,
    KIND_COMPACTION,
};
pub use damage::{
    damage_report, damage_report_live, damage_report_with, last_frame_report, DamageKind,
    DamageReport, SalvagedRecord,
};
pub use error::{is_no_space_error, FaultSeq, LogError, OpenError};
pub use format::{
    record_fits, ChainValue, RecordIn, RecordRef, Seq, DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_SEGMENT_SIZE_BYTES, FORMAT_VERSION, HEADER_LEN, KIND_SEAL, RECORD_HEADER_LEN,
    SEGMENT_SUFFIX,
};
pub use frames::{Frame, FrameKind, Frames, FramesEnd};
pub use fs::{write_paced, Fault, FaultOp, FaultyFs, Fs, LogFile, OsFs, WritePace};
pub use memfs::{CutMode, MemFs, PAGE_BYTES};
pub use reader::{
    LogReader, ScanOptions, ScanReport, SegmentInfo, LIVE_COMPACTION_WAIT_MS, LIVE_OPEN_ATTEMPTS,
};
pub use recovery::{scrub_segment, DeferredSegment, LogPoint, RecoveryReport, TornTail};
pub use state::{system_now_ms, Head, LogConfig};
pub use writer::{GroupCommitAppender, Log};
