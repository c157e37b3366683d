//! Compaction: rewriting sealed segments so that some records' payloads are
//! replaced (an erased op keeps its seq, `ts_ms` and `kind` but gets a new
//! `kind_version` and a smaller payload), re-chaining every segment from the
//! first rewritten one to the end of the log (FORMAT.md, "Compaction").
//!
//! Three steps, so that the expensive part never blocks the writer:
//!
//! 1. [`stage_compaction`] (off the writer thread, beside a live
//!    [`Log`](crate::Log)) reads the sealed segments, asks the caller what to
//!    do with each record, and writes the rewritten segments beside the log
//!    as `<name>.seg.compact` files (ignored by recovery and readers),
//!    fsynced.
//! 2. [`Log::commit_compaction`](crate::Log::commit_compaction) (on the
//!    writer, briefly) writes the redo journal `COMPACTION` (the commit
//!    point), puts the staged bytes in place of the segments, patches the
//!    active segment's header, appends the compaction record (kind
//!    [`KIND_COMPACTION`]) and removes the journal.
//! 3. Recovery ([`Log::open`](crate::Log::open)) finishes a commit a crash
//!    interrupted (the journal exists) or removes the staged files of an
//!    interrupted staging (it does not).
//!
//! [`link_head`] tells whether a head recorded before a compaction (seq and
//! chain value) still links to the log.

use std::io;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{FaultSeq, LogError};
use crate::format::{
    chain_hasher, chain_value, encode_commit, encode_record, encode_seal, le_u16, le_u32, le_u64,
    parse_segment_file_name, ChainValue, CommitMark, RecordIn, RecordRef, SegmentHeader, Seq,
    HEADER_LEN,
};
use crate::frames::{FrameKind, Frames};
use crate::fs::Fs;
use crate::reader::LogReader;
use crate::segment::{
    decode_segment, map_segment, segment_files, DecodeOptions, Decoded, Expect, Role, SegmentEnd,
};
use crate::state::LogConfig;
use crate::writer::record_fits;

/// The kind of the compaction record, which the log writes itself at the
/// end of a compaction's commit; appenders may not use it
/// ([`LogError::ReservedKind`]).
pub const KIND_COMPACTION: u16 = 0xFFFF;
/// The `kind_version` of the compaction record's payload
/// ([`CompactionRecord::encode`]).
pub const COMPACTION_KIND_VERSION: u16 = 1;
/// What a staged segment's file name adds to the segment's: a staged copy of
/// `00000000000000000001.seg` is `00000000000000000001.seg.compact`. Not
/// ending in `.seg`, it is no segment to recovery and readers.
pub const STAGED_SUFFIX: &str = ".compact";
/// The file name of the redo journal in the log directory.
pub const JOURNAL_NAME: &str = "COMPACTION";
/// The first 8 bytes of the redo journal.
pub const JOURNAL_MAGIC: [u8; 8] = *b"SPARKCMP";
/// The redo journal's format version.
pub const JOURNAL_VERSION: u16 = 1;
/// Journal: offset of the CRC32 over every byte after it.
const JOURNAL_CRC_OFFSET: usize = 12;
/// Journal: offset of the first byte the CRC covers (the entry count).
const JOURNAL_BODY_OFFSET: usize = 16;

/// What the caller of [`stage_compaction`] wants in place of one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rewrite {
    /// The record stays as it is, byte for byte.
    Keep,
    /// The record keeps its seq, `ts_ms` and `kind`, and gets this
    /// `kind_version` and payload (at most `max_record_bytes - 20` bytes).
    Replace {
        /// The new `kind_version`.
        kind_version: u16,
        /// The new payload.
        payload: Vec<u8>,
    },
}

/// One segment's rewrite as the compaction record keeps it: the segment
/// holding seqs `first_seq..=last_seq`, whose seal held `old_seal` before
/// and holds `new_seal` after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentRewrite {
    /// The segment's first seq (its file name).
    pub first_seq: Seq,
    /// The segment's last seq (its seal's).
    pub last_seq: Seq,
    /// Its seal's chain value before the compaction.
    pub old_seal: ChainValue,
    /// Its seal's chain value after.
    pub new_seal: ChainValue,
}

/// The compaction record's payload (kind [`KIND_COMPACTION`], kind_version
/// [`COMPACTION_KIND_VERSION`]; FORMAT.md, "Compaction").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactionRecord {
    /// Every segment the compaction rewrote (its records, or only its
    /// chain), in seq order.
    pub segments: Vec<SegmentRewrite>,
    /// What the compaction was for (e.g. the ids of erased subjects), as the
    /// caller gave them; opaque to the log.
    pub subjects: Vec<[u8; 16]>,
}

/// Why a compaction record's payload (or a journal) does not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("compaction record payload does not decode: {0}")]
pub struct CompactionDecodeError(pub String);

/// Bytes of one segment entry of the payload: first_seq, last_seq, old and
/// new seal.
const SEGMENT_ENTRY_BYTES: usize = 8 + 8 + 32 + 32;

/// Reads little-endian fields one after the other, refusing to read past the
/// end.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8], at: usize) -> Cursor<'a> {
        Cursor { bytes, at }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], CompactionDecodeError> {
        let end = self.at.checked_add(n);
        let slice = end.and_then(|end| self.bytes.get(self.at..end));
        let Some(slice) = slice else {
            return Err(CompactionDecodeError(format!(
                "{} bytes end at offset {}, before the {what} ({n} bytes)",
                self.bytes.len(),
                self.at
            )));
        };
        self.at += n;
        Ok(slice)
    }

    fn u16(&mut self, what: &str) -> Result<u16, CompactionDecodeError> {
        let b = self.take(2, what)?;
        Ok(le_u16(b, 0).unwrap_or(0))
    }

    fn u32(&mut self, what: &str) -> Result<u32, CompactionDecodeError> {
        let b = self.take(4, what)?;
        Ok(le_u32(b, 0).unwrap_or(0))
    }

    fn u64(&mut self, what: &str) -> Result<u64, CompactionDecodeError> {
        let b = self.take(8, what)?;
        Ok(le_u64(b, 0).unwrap_or(0))
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], CompactionDecodeError> {
        let b = self.take(N, what)?;
        Ok(b.first_chunk::<N>().copied().unwrap_or([0; N]))
    }

    /// A count whose items take at least `item_bytes` each: refused when
    /// the bytes left cannot hold them (nothing is allocated from it).
    fn count(&mut self, item_bytes: usize, what: &str) -> Result<usize, CompactionDecodeError> {
        let count = self.u32(what)?;
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        let left = self.bytes.len().saturating_sub(self.at);
        if count.saturating_mul(item_bytes) > left {
            return Err(CompactionDecodeError(format!(
                "{what} {count} needs at least {} bytes, {left} left",
                count.saturating_mul(item_bytes)
            )));
        }
        Ok(count)
    }

    fn name(&mut self, what: &str) -> Result<String, CompactionDecodeError> {
        let len = self.u16(what)?;
        let bytes = self.take(usize::from(len), what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| CompactionDecodeError(format!("{what} is not UTF-8")))
    }

    fn finish(&self) -> Result<(), CompactionDecodeError> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(CompactionDecodeError(format!(
                "{} trailing bytes after offset {}",
                self.bytes.len() - self.at,
                self.at
            )))
        }
    }
}

/// Appends a u16 length and the bytes of `name` (names are short file names).
fn put_name(out: &mut Vec<u8>, name: &str) {
    let len = u16::try_from(name.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&name.as_bytes()[..usize::from(len)]);
}

/// A u32 count (counts of segments and subjects fit: each entry is bytes of
/// a record of at most 4 GiB).
fn put_count(out: &mut Vec<u8>, count: usize) {
    out.extend_from_slice(&u32::try_from(count).unwrap_or(u32::MAX).to_le_bytes());
}

impl CompactionRecord {
    /// The payload bytes: u32 segment count, then per segment u64
    /// `first_seq`, u64 `last_seq`, 32-byte old seal, 32-byte new seal; u32
    /// subject count, then the 16-byte subjects; nothing after. All
    /// little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            8 + self.segments.len() * SEGMENT_ENTRY_BYTES + self.subjects.len() * 16,
        );
        put_count(&mut out, self.segments.len());
        for segment in &self.segments {
            out.extend_from_slice(&segment.first_seq.to_le_bytes());
            out.extend_from_slice(&segment.last_seq.to_le_bytes());
            out.extend_from_slice(&segment.old_seal);
            out.extend_from_slice(&segment.new_seal);
        }
        put_count(&mut out, self.subjects.len());
        for subject in &self.subjects {
            out.extend_from_slice(subject);
        }
        out
    }

    /// Decodes [`encode`](Self::encode)'s bytes. Errors when the bytes end
    /// before a field, a count promises more than the bytes hold, or bytes
    /// follow the last subject.
    pub fn decode(payload: &[u8]) -> Result<CompactionRecord, CompactionDecodeError> {
        let mut cursor = Cursor::new(payload, 0);
        let count = cursor.count(SEGMENT_ENTRY_BYTES, "segment count")?;
        let mut segments = Vec::with_capacity(count);
        for _ in 0..count {
            segments.push(SegmentRewrite {
                first_seq: cursor.u64("first_seq")?,
                last_seq: cursor.u64("last_seq")?,
                old_seal: cursor.array("old seal")?,
                new_seal: cursor.array("new seal")?,
            });
        }
        let count = cursor.count(16, "subject count")?;
        let mut subjects = Vec::with_capacity(count);
        for _ in 0..count {
            subjects.push(cursor.array("subject")?);
        }
        cursor.finish()?;
        Ok(CompactionRecord { segments, subjects })
    }
}

/// What a commit did: the seq of the compaction record it appended, and
/// that record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactionCommit {
    /// Seq of the compaction record (kind [`KIND_COMPACTION`]).
    pub record_seq: Seq,
    /// Its payload, decoded.
    pub record: CompactionRecord,
}

/// One staged segment: where its bytes are, where they go, and what they
/// are (length and BLAKE3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StagedEntry {
    /// `<final_name>.compact`.
    pub staged_name: String,
    /// The segment's file name.
    pub final_name: String,
    /// Bytes of the staged file.
    pub len: u64,
    /// BLAKE3 of the staged file's bytes.
    pub hash: [u8; 32],
}

/// A compaction staged by [`stage_compaction`]: the rewritten segments
/// written and fsynced beside the log, not yet in effect. Hand it to
/// [`Log::commit_compaction`](crate::Log::commit_compaction), or
/// [`discard`](Self::discard) it.
#[derive(Debug)]
pub struct StagedCompaction {
    /// The log directory.
    pub(crate) dir: PathBuf,
    /// The staged files, in seq order.
    pub(crate) entries: Vec<StagedEntry>,
    /// The segments' seqs and seals, in the same order.
    pub(crate) segments: Vec<SegmentRewrite>,
    /// Records replaced.
    rewritten_records: u64,
    /// Bytes of the staged files.
    bytes_written: u64,
}

impl StagedCompaction {
    /// Every segment staged (the first one with a replaced record and every
    /// sealed one after it), in seq order, with old and new seals.
    pub fn segments(&self) -> &[SegmentRewrite] {
        &self.segments
    }

    /// Records whose payload the staged segments replace.
    pub fn rewritten_records(&self) -> u64 {
        self.rewritten_records
    }

    /// Bytes written to staged files.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Removes the staged files (those already gone are skipped) and syncs
    /// the directory. Errors: the first failed removal or the directory
    /// sync.
    pub fn discard(self, fs: &dyn Fs) -> io::Result<()> {
        remove_staged(fs, &self.dir, &self.entries)
    }

    /// The last staged segment's seqs and seals (a staged compaction holds
    /// at least one).
    pub(crate) fn last(&self) -> Option<(&StagedEntry, &SegmentRewrite)> {
        Some((self.entries.last()?, self.segments.last()?))
    }
}

/// Removes the staged files of `entries` in `dir` (skipping missing ones)
/// and syncs the directory.
fn remove_staged(fs: &dyn Fs, dir: &Path, entries: &[StagedEntry]) -> io::Result<()> {
    for entry in entries {
        match fs.remove_file(&dir.join(&entry.staged_name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    fs.sync_dir(dir)
}

/// Stages a compaction of the log in `dir`, beside a live
/// [`Log`](crate::Log) that may be appending to its active segment (run it
/// off the writer thread; one compaction at a time).
///
/// Reads every sealed segment (all but the last file, and the last one too
/// when it is sealed) in seq order with recovery's decoder (every check,
/// the chain included), calls `rewrite` on every record in seq order, and
/// from the first segment where a record is replaced on, writes every
/// sealed segment again as `<name>.seg.compact`: the same header but the
/// chain start (the new seal of the segment before, or the unchanged seal
/// for the first one), the records (kept byte for byte, or replaced with
/// the same seq, `ts_ms` and `kind`), in a version-2 segment each batch
/// closed by a commit mark with the same record count and `ts_ms` (its
/// byte count and CRC32 recomputed), then the seal (same `ts_ms`, the new
/// chain value), no zero fill. Each file is fsynced, then the directory
/// once. Returns `None` (nothing written) when no record is replaced.
///
/// Errors: what recovery reports for damage (`Corrupt`, ...); `Io`;
/// `RecordTooLarge` for a replacement over `config.max_record_bytes`;
/// `ReservedKind` for a replacement of a compaction record. On an error
/// the files staged so far are removed (best effort).
pub fn stage_compaction(
    dir: &Path,
    fs: Arc<dyn Fs>,
    config: &LogConfig,
    mut rewrite: impl FnMut(RecordRef<'_>) -> Rewrite,
) -> Result<Option<StagedCompaction>, LogError> {
    let mut staged = StagedCompaction {
        dir: dir.to_owned(),
        entries: Vec::new(),
        segments: Vec::new(),
        rewritten_records: 0,
        bytes_written: 0,
    };
    match stage_into(&mut staged, fs.as_ref(), config, &mut rewrite) {
        Ok(()) if staged.entries.is_empty() => Ok(None),
        Ok(()) => match fs.sync_dir(dir) {
            Ok(()) => Ok(Some(staged)),
            Err(e) => {
                let _ = staged.discard(fs.as_ref());
                Err(LogError::io("sync_dir", dir, e))
            }
        },
        Err(e) => {
            let _ = staged.discard(fs.as_ref());
            Err(e)
        }
    }
}

/// A replaced record: its seq, new kind version, new payload.
type Replacement = (Seq, u16, Vec<u8>);

/// [`stage_compaction`]'s walk, adding each staged file to `staged`.
fn stage_into(
    staged: &mut StagedCompaction,
    fs: &dyn Fs,
    config: &LogConfig,
    rewrite: &mut dyn FnMut(RecordRef<'_>) -> Rewrite,
) -> Result<(), LogError> {
    let dir = staged.dir.clone();
    let listing = fs.list(&dir).map_err(|e| LogError::io("list", &dir, e))?;
    let files = segment_files(listing)?;
    let max = config.max_record_bytes;
    let mut expect = Expect::FIRST;
    // The new seal of the last staged segment, once staging started.
    let mut new_chain: Option<ChainValue> = None;
    for (index, file) in files.iter().enumerate() {
        let is_last = index + 1 == files.len();
        let (map, _) = map_segment(fs, file)?;
        let bytes: &[u8] = (*map).as_ref();
        let opts = DecodeOptions {
            // The last file is the writer's: read only as far as it
            // continues, and staged only when it is sealed.
            role: if is_last { Role::Live } else { Role::Sealed },
            max_record_bytes: max,
            verify_seal: true,
            chain_at: None,
        };
        let decoded = decode_segment(&file.name, bytes, expect, opts, |_| {
            ControlFlow::Continue(())
        })?;
        let Decoded::Segment(segment) = decoded else {
            break;
        };
        let SegmentEnd::Sealed { chain: old_seal } = segment.tail else {
            break;
        };
        // Cast: the end lies within the mapped bytes.
        let end = segment.end as usize;
        let mut replaced: Vec<Replacement> = Vec::new();
        for frame in Frames::new(&bytes[..end], HEADER_LEN, max) {
            if frame.kind != FrameKind::Op {
                continue;
            }
            if let Rewrite::Replace {
                kind_version,
                payload,
            } = rewrite(frame.record)
            {
                if frame.record.kind == KIND_COMPACTION {
                    return Err(LogError::ReservedKind {
                        kind: KIND_COMPACTION,
                    });
                }
                if !record_fits(payload.len(), max) {
                    return Err(LogError::RecordTooLarge {
                        bytes: payload.len().saturating_add(20),
                        limit: max,
                    });
                }
                replaced.push((frame.seq(), kind_version, payload));
            }
        }
        expect = Expect {
            first_seq: segment.last_seq + 1,
            chain_start: old_seal,
        };
        if new_chain.is_none() && replaced.is_empty() {
            continue;
        }
        let chain_start = new_chain.unwrap_or(segment.header.chain_start);
        let header = SegmentHeader {
            chain_start,
            ..segment.header
        }
        .encode_version(segment.format_version);
        let (out, new_seal) = rebuild(&file.name, &bytes[..end], header, &replaced, max)?;
        drop(map);
        let entry = write_staged(fs, &dir, &file.name, &out)?;
        staged.rewritten_records += replaced.len() as u64;
        staged.bytes_written += entry.len;
        staged.entries.push(entry);
        staged.segments.push(SegmentRewrite {
            first_seq: segment.header.first_seq,
            last_seq: segment.last_seq,
            old_seal,
            new_seal,
        });
        new_chain = Some(new_seal);
    }
    Ok(())
}

/// The bytes of sealed segment `name` (`bytes`, up to the end of its seal)
/// with `header` in place of its header and the records of `replaced`
/// replaced; commit marks and the seal recomputed. Returns them and the new
/// seal value.
fn rebuild(
    name: &str,
    bytes: &[u8],
    header: [u8; HEADER_LEN],
    replaced: &[Replacement],
    max: u32,
) -> Result<(Vec<u8>, ChainValue), LogError> {
    let chain_start: ChainValue = header[HEADER_LEN - 32..].try_into().unwrap_or([0; 32]);
    let mut out = Vec::with_capacity(bytes.len());
    out.extend_from_slice(&header);
    let mut replaced = replaced.iter().peekable();
    let mut batch_start = out.len();
    let mut batch_records = 0u64;
    for frame in Frames::new(bytes, HEADER_LEN, max) {
        match frame.kind {
            FrameKind::Op => {
                match replaced.next_if(|(seq, _, _)| *seq == frame.seq()) {
                    Some((_, kind_version, payload)) => {
                        let record = RecordIn {
                            ts_ms: frame.record.ts_ms,
                            kind: frame.record.kind,
                            kind_version: *kind_version,
                            payload,
                        };
                        encode_record(&mut out, frame.seq(), &record)?;
                    }
                    None => out.extend_from_slice(&bytes[frame.offset()..frame.end()]),
                }
                batch_records += 1;
            }
            FrameKind::CommitMark => {
                let mark = CommitMark::for_batch(&out[batch_start..], batch_records);
                encode_commit(&mut out, frame.seq(), frame.record.ts_ms, &mark);
                batch_start = out.len();
                batch_records = 0;
            }
            FrameKind::Seal => {
                let chain = chain_value(&chain_start, &out);
                encode_seal(&mut out, frame.seq(), frame.record.ts_ms, &chain);
                return Ok((out, chain));
            }
            FrameKind::UnknownMarker(version) => {
                return Err(LogError::corrupt(
                    name,
                    frame.offset(),
                    FaultSeq::After(frame.seq()),
                    format!("a frame of the log's own with unknown kind_version {version}"),
                ))
            }
        }
    }
    Err(LogError::corrupt(
        name,
        bytes.len(),
        FaultSeq::After(0),
        "no seal where the decoder found one",
    ))
}

/// Writes `bytes` as the staged copy of segment `final_name` (a stale copy
/// removed first), fsynced.
fn write_staged(
    fs: &dyn Fs,
    dir: &Path,
    final_name: &str,
    bytes: &[u8],
) -> Result<StagedEntry, LogError> {
    let staged_name = format!("{final_name}{STAGED_SUFFIX}");
    let path = dir.join(&staged_name);
    match fs.remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(LogError::io("remove_file", &path, e))
        }
        _ => {}
    }
    let mut file = fs
        .create_new(&path)
        .map_err(|e| LogError::io("create_new", &path, e))?;
    file.write_all_at(0, bytes)
        .map_err(|e| LogError::io("write", &path, e))?;
    file.sync_all()
        .map_err(|e| LogError::io("sync_all", &path, e))?;
    Ok(StagedEntry {
        staged_name,
        final_name: final_name.to_owned(),
        // usize is at most 64 bits on every target Rust supports.
        len: bytes.len() as u64,
        hash: blake3::hash(bytes).into(),
    })
}

// ---- The redo journal -----------------------------------------------------

/// The redo journal (`COMPACTION`; FORMAT.md, "Compaction"): what a commit
/// does, so that recovery can finish it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Journal {
    /// The staged files and the segments they replace.
    pub entries: Vec<StagedEntry>,
    /// The active segment's name and its new 64-byte header, if there is an
    /// active segment.
    pub active: Option<(String, [u8; HEADER_LEN])>,
    /// The log's last seq at the commit.
    pub head_seq: Seq,
    /// The compaction record's payload.
    pub payload: Vec<u8>,
}

impl Journal {
    /// The journal's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&JOURNAL_MAGIC);
        out.extend_from_slice(&JOURNAL_VERSION.to_le_bytes());
        out.extend_from_slice(&[0; 2]);
        out.extend_from_slice(&[0; 4]);
        put_count(&mut out, self.entries.len());
        for entry in &self.entries {
            put_name(&mut out, &entry.staged_name);
            put_name(&mut out, &entry.final_name);
            out.extend_from_slice(&entry.len.to_le_bytes());
            out.extend_from_slice(&entry.hash);
        }
        match &self.active {
            Some((name, header)) => {
                put_name(&mut out, name);
                out.extend_from_slice(header);
            }
            None => put_name(&mut out, ""),
        }
        out.extend_from_slice(&self.head_seq.to_le_bytes());
        put_count(&mut out, self.payload.len());
        out.extend_from_slice(&self.payload);
        let crc = crc32fast::hash(&out[JOURNAL_BODY_OFFSET..]);
        out[JOURNAL_CRC_OFFSET..JOURNAL_BODY_OFFSET].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a journal: magic, version, reserved bytes, CRC, then every
    /// field (names must be segment names and their staged names), nothing
    /// after; the payload must decode as a [`CompactionRecord`].
    pub fn decode(bytes: &[u8]) -> Result<Journal, CompactionDecodeError> {
        let bad = |why: String| Err(CompactionDecodeError(why));
        if bytes.get(..8) != Some(&JOURNAL_MAGIC[..]) {
            return bad("bad magic (not a compaction journal)".into());
        }
        let stored = le_u32(bytes, JOURNAL_CRC_OFFSET);
        let computed = bytes.get(JOURNAL_BODY_OFFSET..).map(crc32fast::hash);
        if stored.is_none() || stored != computed {
            return bad(format!(
                "checksum {stored:#010x?} does not match the bytes ({computed:#010x?})"
            ));
        }
        let version = le_u16(bytes, 8).unwrap_or(0);
        if version != JOURNAL_VERSION || le_u16(bytes, 10) != Some(0) {
            return bad(format!(
                "journal version {version} (this build reads {JOURNAL_VERSION})"
            ));
        }
        let mut cursor = Cursor::new(bytes, JOURNAL_BODY_OFFSET);
        let count = cursor.count(2 + 2 + 8 + 32, "entry count")?;
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let staged_name = cursor.name("staged file name")?;
            let final_name = cursor.name("segment file name")?;
            if parse_segment_file_name(&final_name).is_none()
                || staged_name != format!("{final_name}{STAGED_SUFFIX}")
            {
                return bad(format!(
                    "entry names {staged_name:?} -> {final_name:?} are no staged segment"
                ));
            }
            entries.push(StagedEntry {
                staged_name,
                final_name,
                len: cursor.u64("length")?,
                hash: cursor.array("BLAKE3")?,
            });
        }
        let name = cursor.name("active segment name")?;
        let active = if name.is_empty() {
            None
        } else {
            if parse_segment_file_name(&name).is_none() {
                return bad(format!("active segment name {name:?} is no segment name"));
            }
            Some((name, cursor.array::<HEADER_LEN>("active segment header")?))
        };
        let head_seq = cursor.u64("head seq")?;
        let len = cursor.count(1, "payload length")?;
        let payload = cursor.take(len, "payload")?.to_vec();
        cursor.finish()?;
        CompactionRecord::decode(&payload)?;
        Ok(Journal {
            entries,
            active,
            head_seq,
            payload,
        })
    }
}

/// A `Corrupt` error about the journal file (not a segment: `segment`
/// names the journal).
fn journal_corrupt(offset: u64, reason: String) -> LogError {
    LogError::Corrupt {
        segment: JOURNAL_NAME.to_owned(),
        offset,
        seq: FaultSeq::After(0),
        reason,
    }
}

/// True when the file at `path` exists with `len` bytes whose BLAKE3 is
/// `hash`.
fn file_matches(fs: &dyn Fs, path: &Path, len: u64, hash: &[u8; 32]) -> Result<bool, LogError> {
    match fs.map(path) {
        Ok(map) => {
            let bytes: &[u8] = (*map).as_ref();
            // usize is at most 64 bits on every target Rust supports.
            Ok(bytes.len() as u64 == len && blake3::hash(bytes) == *hash)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(LogError::io("map", path, e)),
    }
}

/// Commit step 3 and its redo: puts each staged file's bytes in place of
/// its segment, unless the segment already holds them. The staged file
/// stays (it is removed with the journal): its bytes are written to the
/// segment's name with [`Fs::write_file_durably`] (a copy, renamed over the
/// segment, the directory synced), so that no power cut can lose both the
/// staged name and the new segment (a rename's two directory entries need
/// not change together before the directory sync).
///
/// Errors: `Corrupt` when neither the segment nor the staged file holds
/// the bytes the journal names (damage: both were made durable before);
/// `Io`.
pub(crate) fn put_in_place(
    fs: &dyn Fs,
    dir: &Path,
    entries: &[StagedEntry],
) -> Result<(), LogError> {
    for entry in entries {
        let final_path = dir.join(&entry.final_name);
        if file_matches(fs, &final_path, entry.len, &entry.hash)? {
            continue;
        }
        let staged_path = dir.join(&entry.staged_name);
        let map = match fs.map(&staged_path) {
            Ok(map) => map,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(LogError::corrupt(
                    &entry.final_name,
                    0,
                    FaultSeq::After(0),
                    format!(
                        "an interrupted compaction (journal {JOURNAL_NAME}) left neither this \
                         segment's new bytes nor their staged copy {}",
                        entry.staged_name
                    ),
                ))
            }
            Err(e) => return Err(LogError::io("map", &staged_path, e)),
        };
        let bytes: &[u8] = (*map).as_ref();
        // usize is at most 64 bits on every target Rust supports.
        if bytes.len() as u64 != entry.len || blake3::hash(bytes) != entry.hash {
            return Err(LogError::corrupt(
                &entry.final_name,
                0,
                FaultSeq::After(0),
                format!(
                    "the staged copy {} of an interrupted compaction does not hold the bytes \
                     its journal {JOURNAL_NAME} names ({} bytes, BLAKE3 {}), nor does the segment",
                    entry.staged_name,
                    entry.len,
                    crate::format::chain_hex(&entry.hash)
                ),
            ));
        }
        fs.write_file_durably(&final_path, bytes)
            .map_err(|e| LogError::io("write_file_durably", &final_path, e))?;
    }
    Ok(())
}

/// Commit step 4's redo: writes the active segment's new header when the
/// file does not start with it, and fsyncs it. A missing file is left to
/// recovery.
fn patch_active_header(
    fs: &dyn Fs,
    dir: &Path,
    name: &str,
    header: &[u8; HEADER_LEN],
) -> Result<(), LogError> {
    let path = dir.join(name);
    let current = match fs.map(&path) {
        Ok(map) => (*map).as_ref().get(..HEADER_LEN).map(<[u8]>::to_vec),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LogError::io("map", &path, e)),
    };
    if current.as_deref() == Some(&header[..]) {
        return Ok(());
    }
    let mut file = fs
        .open_rw(&path)
        .map_err(|e| LogError::io("open_rw", &path, e))?;
    file.write_all_at(0, header)
        .map_err(|e| LogError::io("write", &path, e))?;
    file.sync_all()
        .map_err(|e| LogError::io("sync_all", &path, e))?;
    tracing::info!(segment = %name, "re-chained the active segment's header (compaction redo)");
    Ok(())
}

/// What [`before_recovery`] found and did.
#[derive(Debug, Default)]
pub(crate) struct Prelude {
    /// The journal of a commit that a crash interrupted, its files and
    /// header already redone; the compaction record and the journal's
    /// removal are left to [`finish_journal`].
    pub journal: Option<Journal>,
    /// Files removed: a stale `COMPACTION.tmp`, or (without a journal) the
    /// staged files of an interrupted staging.
    pub removed: Vec<String>,
}

/// What [`Log::open`](crate::Log::open) does before recovery (FORMAT.md,
/// "Compaction"): removes a stale `COMPACTION.tmp`; with a journal, redoes
/// the commit's steps 3 and 4 (segments in place, the active header
/// patched); without one, removes every staged file (`*.seg.compact`, and
/// a `*.seg.tmp` of an interrupted copy). A missing directory is left to
/// recovery.
///
/// Errors: `Corrupt` naming `COMPACTION` when its checksum (or any field)
/// does not hold (it was written atomically, so that is damage), or naming
/// a segment that cannot be redone; `Io`.
pub(crate) fn before_recovery(fs: &dyn Fs, dir: &Path) -> Result<Prelude, LogError> {
    let listing = match fs.list(dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Prelude::default()),
        Err(e) => return Err(LogError::io("list", dir, e)),
    };
    let mut names: Vec<String> = listing
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .collect();
    names.sort();
    let mut prelude = Prelude::default();
    let temp = format!("{JOURNAL_NAME}.tmp");
    let remove = |name: &str, prelude: &mut Prelude| -> Result<(), LogError> {
        let path = dir.join(name);
        match fs.remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(LogError::io("remove_file", &path, e))
            }
            _ => {
                prelude.removed.push(name.to_owned());
                Ok(())
            }
        }
    };
    if names.contains(&temp) {
        remove(&temp, &mut prelude)?;
    }
    if names.iter().any(|n| n == JOURNAL_NAME) {
        let path = dir.join(JOURNAL_NAME);
        let map = fs.map(&path).map_err(|e| LogError::io("map", &path, e))?;
        let journal = Journal::decode((*map).as_ref()).map_err(|e| {
            journal_corrupt(
                JOURNAL_CRC_OFFSET as u64,
                format!(
                    "the compaction journal does not verify ({}); it was written atomically, \
                     so this is damage",
                    e.0
                ),
            )
        })?;
        drop(map);
        tracing::warn!(
            segments = journal.entries.len(),
            "finishing a compaction a crash interrupted"
        );
        put_in_place(fs, dir, &journal.entries)?;
        if let Some((name, header)) = &journal.active {
            patch_active_header(fs, dir, name, header)?;
        }
        prelude.journal = Some(journal);
    } else {
        for name in &names {
            let staged = name
                .strip_suffix(STAGED_SUFFIX)
                .or_else(|| name.strip_suffix(".tmp"))
                .is_some_and(|base| parse_segment_file_name(base).is_some());
            if staged {
                remove(name, &mut prelude)?;
            }
        }
        if !prelude.removed.is_empty() {
            tracing::warn!(files = ?prelude.removed, "removed the files of an interrupted compaction staging");
        }
    }
    if !prelude.removed.is_empty() {
        fs.sync_dir(dir)
            .map_err(|e| LogError::io("sync_dir", dir, e))?;
    }
    Ok(prelude)
}

/// True when the log in `dir` holds, after seq `journal.head_seq`, a record
/// of kind [`KIND_COMPACTION`] with exactly the journal's payload (read
/// after recovery, so the log is whole).
pub(crate) fn record_present(
    fs: Arc<dyn Fs>,
    dir: &Path,
    max_record_bytes: u32,
    journal: &Journal,
) -> Result<bool, LogError> {
    let mut found = false;
    LogReader::open_from_seq(dir, fs, max_record_bytes, journal.head_seq + 1, |record| {
        if record.seq > journal.head_seq
            && record.kind == KIND_COMPACTION
            && record.payload == journal.payload.as_slice()
        {
            found = true;
        }
    })?;
    Ok(found)
}

/// Commit step 6 (and its redo): removes the staged files, syncs the
/// directory, removes the journal, syncs the directory.
pub(crate) fn finish_journal(fs: &dyn Fs, dir: &Path, journal: &Journal) -> Result<(), LogError> {
    remove_staged(fs, dir, &journal.entries).map_err(|e| LogError::io("remove_file", dir, e))?;
    let path = dir.join(JOURNAL_NAME);
    match fs.remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(LogError::io("remove_file", &path, e))
        }
        _ => {}
    }
    fs.sync_dir(dir)
        .map_err(|e| LogError::io("sync_dir", dir, e))
}

/// True when a journal exists in `dir` (what [`LogReader`] refuses outside
/// a live read).
pub(crate) fn journal_exists(fs: &dyn Fs, dir: &Path) -> Result<bool, LogError> {
    match fs.list(dir) {
        Ok(listing) => Ok(listing
            .iter()
            .any(|p| p.file_name().is_some_and(|n| n == JOURNAL_NAME))),
        // The reader reports a missing directory itself.
        Err(_) => Ok(false),
    }
}

// ---- Linking old heads ----------------------------------------------------

/// How a head recorded earlier (a seq and the chain value there) links to
/// the log now ([`link_head`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadLink {
    /// The log's chain value at the end of the batch whose last record is
    /// the seq equals the head's.
    Direct,
    /// The head's chain value is one a compaction replaced: the old seal of
    /// a segment it rewrote that ends at the seq, or the chain over the
    /// current bytes of the segment holding the seq computed from an old
    /// chain start (its records were not rewritten, only re-chained). The
    /// compaction record at `record_seq` vouches for the link.
    ThroughCompaction {
        /// Seq of the compaction record that links it.
        record_seq: Seq,
    },
    /// The seq lies in a segment a compaction rewrote (its records, or
    /// only its chain) and no chain value above matches: the head saw bytes
    /// that are gone.
    SegmentRewritten {
        /// First seq of that segment.
        first_seq: Seq,
        /// Seq of the (latest) compaction record that rewrote it.
        record_seq: Seq,
    },
    /// None of the above (the seq is past the log's end, or the chain
    /// value matches nothing).
    NotLinked,
}

/// How the head (`seq`, `chain`) links to the log `reader` views
/// ([`HeadLink`]). Reads the compaction records of the whole view (one
/// frame walk, no hashing) and hashes the segment holding `seq` up to it
/// once per candidate chain start.
///
/// Errors: `Corrupt` when a compaction record's payload does not decode,
/// or a segment's header does not (the reader checked both at open).
pub fn link_head(reader: &LogReader, seq: Seq, chain: ChainValue) -> Result<HeadLink, LogError> {
    let mut compactions: Vec<(Seq, CompactionRecord)> = Vec::new();
    for (info, bytes) in reader.mapped() {
        // Cast: `info.bytes` is at most the map's length.
        let bytes = &bytes[..(info.bytes as usize).min(bytes.len())];
        for frame in Frames::new(bytes, HEADER_LEN, u32::MAX) {
            if frame.kind == FrameKind::Op && frame.record.kind == KIND_COMPACTION {
                compactions.push((frame.seq(), decode_in(&info.name, &frame.record)?));
            }
        }
    }
    if seq == 0 {
        return Ok(if chain == [0; 32] {
            HeadLink::Direct
        } else {
            HeadLink::NotLinked
        });
    }
    let holding = reader
        .mapped()
        .find(|(info, _)| info.first_seq <= seq && seq <= info.last_seq);
    if let Some((info, bytes)) = holding {
        let (header, version) = SegmentHeader::decode_versioned(bytes).map_err(|e| {
            LogError::corrupt(
                &info.name,
                e.offset(),
                FaultSeq::Header(info.first_seq),
                e.to_string(),
            )
        })?;
        let end = batch_end(bytes, info.bytes, version, seq);
        if let Some(end) = end {
            if chain_value(&header.chain_start, &bytes[..end]) == chain {
                return Ok(HeadLink::Direct);
            }
        }
        for (record_seq, record) in &compactions {
            if record
                .segments
                .iter()
                .any(|s| s.last_seq == seq && s.old_seal == chain)
            {
                return Ok(HeadLink::ThroughCompaction {
                    record_seq: *record_seq,
                });
            }
        }
        if let Some(end) = end {
            for (record_seq, record) in &compactions {
                for before in record
                    .segments
                    .iter()
                    .filter(|s| s.last_seq + 1 == info.first_seq)
                {
                    let old_header = SegmentHeader {
                        chain_start: before.old_seal,
                        ..header
                    }
                    .encode_version(version);
                    let mut hasher = chain_hasher(&before.old_seal);
                    hasher.update(&old_header);
                    hasher.update(&bytes[HEADER_LEN..end]);
                    if ChainValue::from(hasher.finalize()) == chain {
                        return Ok(HeadLink::ThroughCompaction {
                            record_seq: *record_seq,
                        });
                    }
                }
            }
        }
    }
    for (record_seq, record) in compactions.iter().rev() {
        if let Some(s) = record
            .segments
            .iter()
            .find(|s| s.first_seq <= seq && seq <= s.last_seq)
        {
            return Ok(HeadLink::SegmentRewritten {
                first_seq: s.first_seq,
                record_seq: *record_seq,
            });
        }
    }
    Ok(HeadLink::NotLinked)
}

/// The compaction record `record` of segment `name`, or `Corrupt`.
pub(crate) fn decode_in(name: &str, record: &RecordRef<'_>) -> Result<CompactionRecord, LogError> {
    CompactionRecord::decode(record.payload).map_err(|e| LogError::Corrupt {
        segment: name.to_owned(),
        offset: record.offset,
        seq: FaultSeq::Record(record.seq),
        reason: e.to_string(),
    })
}

/// The offset just past the batch whose last record is `seq` in a segment
/// (`bytes`, valid up to `valid`) of `version`: past its commit mark
/// (version 2) or the record itself (version 1); `None` when `seq` ends no
/// batch there.
fn batch_end(bytes: &[u8], valid: u64, version: u16, seq: Seq) -> Option<usize> {
    // Cast: `valid` is at most the map's length.
    let bytes = &bytes[..(valid as usize).min(bytes.len())];
    for frame in Frames::new(bytes, HEADER_LEN, u32::MAX) {
        let ends = match frame.kind {
            FrameKind::CommitMark => version >= 2,
            FrameKind::Op => version < 2,
            _ => false,
        };
        if ends && frame.seq() == seq {
            return Some(frame.end());
        }
        if frame.seq() > seq {
            break;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_round_trips_and_refuses_a_flip() {
        let record = CompactionRecord {
            segments: vec![SegmentRewrite {
                first_seq: 1,
                last_seq: 9,
                old_seal: [1; 32],
                new_seal: [2; 32],
            }],
            subjects: vec![[7; 16]],
        };
        let journal = Journal {
            entries: vec![StagedEntry {
                staged_name: "00000000000000000001.seg.compact".into(),
                final_name: "00000000000000000001.seg".into(),
                len: 300,
                hash: [3; 32],
            }],
            active: Some(("00000000000000000010.seg".into(), [4; HEADER_LEN])),
            head_seq: 12,
            payload: record.encode(),
        };
        let bytes = journal.encode();
        assert_eq!(Journal::decode(&bytes), Ok(journal.clone()));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(Journal::decode(&bad).is_err(), "flip at {i} accepted");
        }
        let none = Journal {
            active: None,
            ..journal
        };
        assert_eq!(Journal::decode(&none.encode()), Ok(none));
    }
}
