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
//! 2. The commit, in three parts:
//!    [`Log::begin_compaction`](crate::Log::begin_compaction) (on the
//!    writer, briefly) checks that the staging is not stale, holds the
//!    log's rolls and hands out a [`CompactionTicket`];
//!    [`CompactionTicket::apply`] (off the writer, while it goes on
//!    appending) writes the redo journal `COMPACTION` (the commit point)
//!    and puts the staged bytes in place of the segments;
//!    [`Log::finish_compaction`](crate::Log::finish_compaction) (on the
//!    writer, briefly) patches the active segment's header, appends the
//!    compaction record (kind [`KIND_COMPACTION`]), removes the journal
//!    and releases the rolls.
//!    [`Log::commit_compaction`](crate::Log::commit_compaction) does the
//!    three in one call.
//! 3. Recovery ([`Log::open`](crate::Log::open)) finishes a commit a crash
//!    interrupted (the journal exists) or removes the staged files of an
//!    interrupted staging (it does not).
//!
//! This module holds step 1 (staging), the ticket and its apply step, and
//! what a commit returns ([`CompactionCommit`]); the compaction record's
//! payload lives in `compaction_record`, the redo journal and the redo of
//! the commit in `compaction_journal`, the writer's parts of the commit in
//! `writer`.
//!
//! [`link_head`] tells whether a head recorded before a compaction (seq and
//! chain value) still links to the log.

use std::io;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::compaction_journal::{
    put_in_place, remove_staged, Journal, StagedEntry, JOURNAL_NAME, STAGED_SUFFIX,
};
use crate::compaction_record::{decode_in, CompactionRecord, SegmentRewrite, KIND_COMPACTION};
use crate::error::{FaultSeq, LogError};
use crate::format::{
    chain_hasher, chain_value, encode_commit, encode_record, encode_seal, record_fits, ChainValue,
    CommitMark, RecordIn, RecordRef, SegmentHeader, Seq, HEADER_LEN,
};
use crate::frames::{FrameKind, Frames};
use crate::fs::{write_paced, Fs, WritePace};
use crate::reader::LogReader;
use crate::segment::{
    decode_segment, map_segment, segment_files, DecodeOptions, Decoded, Expect, Role, SegmentEnd,
};
use crate::state::LogConfig;

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

/// What a commit did: the seq of the compaction record it appended, and
/// that record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactionCommit {
    /// Seq of the compaction record (kind [`KIND_COMPACTION`]).
    pub record_seq: Seq,
    /// Its payload, decoded.
    pub record: CompactionRecord,
}

/// A compaction staged by [`stage_compaction`]: the rewritten segments
/// written and fsynced beside the log, not yet in effect. Hand it to
/// [`Log::begin_compaction`](crate::Log::begin_compaction) (or
/// [`Log::commit_compaction`](crate::Log::commit_compaction)), or
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

/// A compaction begun by [`Log::begin_compaction`](crate::Log::begin_compaction):
/// the staging was fresh, the log holds its rolls (its active segment is
/// not sealed, whatever its size) and the redo journal's contents are
/// fixed. Run [`apply`](Self::apply) off the writer thread, then hand the
/// ticket and apply's result to
/// [`Log::finish_compaction`](crate::Log::finish_compaction), which
/// releases the rolls: a ticket that is never finished keeps them held
/// until the `Log` is dropped (the next [`Log::open`](crate::Log::open)
/// then redoes the compaction if its journal was written, or removes the
/// staged files).
pub struct CompactionTicket {
    /// Which begin handed it out (checked by finish).
    pub(crate) id: u64,
    /// The log directory.
    pub(crate) dir: PathBuf,
    /// The file system the log is on.
    pub(crate) fs: Arc<dyn Fs>,
    /// What the redo journal holds: the staged files, the active segment's
    /// new header, the head seq at begin, the compaction record's payload.
    pub(crate) journal: Journal,
    /// The compaction record, decoded.
    pub(crate) record: CompactionRecord,
    /// The last staged segment's new seal: the active segment's new chain
    /// start.
    pub(crate) new_chain: ChainValue,
    /// The active segment's acknowledged length at begin (its bytes up to
    /// there do not change until finish, the header aside).
    pub(crate) active_len: u64,
    /// Set by a successful apply: the chain hasher over the new chain
    /// start, the new header and the active segment's bytes from the
    /// header's end to `active_len`.
    pub(crate) prefix: Option<blake3::Hasher>,
    /// Set when begin committed the compaction whole (a version-1 active
    /// segment): apply does nothing and finish returns it.
    pub(crate) done: Option<CompactionCommit>,
    /// The pace of apply's copies (the log's
    /// [`LogConfig::compaction_pace`]).
    pub(crate) pace: Option<WritePace>,
}

impl std::fmt::Debug for CompactionTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompactionTicket")
            .field("dir", &self.dir)
            .field("segments", &self.record.segments.len())
            .field("head_seq", &self.journal.head_seq)
            .field("applied", &self.prefix.is_some())
            .finish_non_exhaustive()
    }
}

impl CompactionTicket {
    /// The compaction record the commit appends at finish.
    pub fn record(&self) -> &CompactionRecord {
        &self.record
    }

    /// The commit's slow part, off the writer thread (FORMAT.md,
    /// "Compaction", commit steps 2 and 3), while the writer goes on
    /// appending to the active segment:
    ///
    /// 2. writes the redo journal `COMPACTION` durably
    ///    ([`Fs::write_file_durably`]): **the commit point**;
    /// 3. puts each staged file's bytes in place of its segment (each a
    ///    durable copy renamed over the segment, the directory synced,
    ///    written at the log's [`LogConfig::compaction_pace`]),
    ///    then removes the staged files (directory synced): the segments
    ///    now hold their bytes durably, and redo checks a segment before it
    ///    looks for its staged copy;
    ///
    /// then hashes the active segment as it will read once finish patched
    /// its header (the new chain start, the new header, its bytes up to
    /// the length at begin), so that finish only hashes what was appended
    /// since. Call it once. (A ticket whose commit begin did whole has
    /// nothing left to apply: Ok at once.)
    ///
    /// Errors: `Io`, or `Corrupt` when a staged file no longer holds the
    /// bytes staged. After an error the journal may be durable: hand the
    /// error to [`Log::finish_compaction`](crate::Log::finish_compaction),
    /// which poisons the log (the next [`Log::open`](crate::Log::open)
    /// redoes or drops the compaction, from its journal or its absence).
    pub fn apply(&mut self) -> Result<(), LogError> {
        if self.done.is_some() {
            return Ok(());
        }
        let fs = self.fs.as_ref();
        let journal_path = self.dir.join(JOURNAL_NAME);
        fs.write_file_durably(&journal_path, &self.journal.encode())
            .map_err(|e| LogError::io("write_file_durably", &journal_path, e))?;
        put_in_place(fs, &self.dir, &self.journal.entries, self.pace)?;
        // The segments hold the staged bytes durably: redo would not need
        // the staged copies any more (it checks the segment first).
        remove_staged(fs, &self.dir, &self.journal.entries)
            .map_err(|e| LogError::io("remove_file", &self.dir, e))?;
        if let Some((name, header)) = &self.journal.active {
            let path = self.dir.join(name);
            let map = fs.map(&path).map_err(|e| LogError::io("map", &path, e))?;
            let bytes: &[u8] = (*map).as_ref();
            // Cast: `active_len` is at most the file's length.
            let body = bytes
                .get(HEADER_LEN..self.active_len as usize)
                .ok_or_else(|| {
                    LogError::corrupt(
                        name,
                        bytes.len(),
                        FaultSeq::After(self.journal.head_seq),
                        format!(
                            "the active segment is shorter than its {} acknowledged bytes",
                            self.active_len
                        ),
                    )
                })?;
            let mut hasher = chain_hasher(&self.new_chain);
            hasher.update(header);
            hasher.update(body);
            self.prefix = Some(hasher);
        } else {
            self.prefix = Some(chain_hasher(&self.new_chain));
        }
        Ok(())
    }
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
/// chain value), no zero fill. Each file is written at
/// `config.compaction_pace` and fsynced, then the directory once. Returns `None` (nothing written) when no record is replaced.
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
        let entry = write_staged(fs, &dir, &file.name, &out, config.compaction_pace)?;
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
/// removed first) at `pace` ([`write_paced`]), fsynced.
fn write_staged(
    fs: &dyn Fs,
    dir: &Path,
    final_name: &str,
    bytes: &[u8],
    pace: Option<WritePace>,
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
    write_paced(file.as_mut(), 0, bytes, pace).map_err(|e| LogError::io("write", &path, e))?;
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
        /// Seq of the first compaction record that rewrote it (later ones
        /// may have re-chained it again): the first to change bytes the
        /// head may have seen.
        record_seq: Seq,
    },
    /// The seq is past the log's last record: the head saw records this
    /// log does not hold (lost, or another log's).
    PastEnd {
        /// The log's last seq (0 when it holds none).
        last_seq: Seq,
    },
    /// None of the above: the chain value matches nothing.
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
    let last_seq = reader
        .mapped()
        .map(|(info, _)| info.last_seq)
        .max()
        .unwrap_or(0);
    if seq > last_seq {
        return Ok(HeadLink::PastEnd { last_seq });
    }
    for (record_seq, record) in &compactions {
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
