//! The write path: [`Log`], the single appender that owns the active
//! segment, and [`GroupCommitAppender`], which lets many threads share one
//! `Log` with one write and one `fdatasync` per batch.
//!
//! Durability rule: a record is acknowledged (its seq returned) only after the
//! `fdatasync` covering it returned Ok. Any failed write, fsync, create or
//! truncate poisons the `Log`: it never writes again, because after a failed
//! fsync the kernel may have dropped the dirty pages and a retry could
//! "succeed" without the data (the PostgreSQL fsync lesson). Restart, and
//! recovery rebuilds the truth from disk.
//!
//! One exception: a *write* or *create* of the append path refused for want
//! of space (`ENOSPC`, `EDQUOT`) wrote nothing that was ever acknowledged
//! and left no fsync in doubt, so [`Log::heal`] may recover the tail in
//! process (zero what follows the acknowledged end, run recovery, check the
//! head) and lift the poison. A failed fsync stays fatal whatever its errno,
//! `ENOSPC` included: the kernel may have dropped the pages it could not
//! write, and nothing can tell which.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::compaction::{CompactionCommit, CompactionTicket, StagedCompaction};
use crate::compaction_journal::{self, Journal, JOURNAL_NAME};
use crate::compaction_record::{CompactionRecord, COMPACTION_KIND_VERSION, KIND_COMPACTION};
use crate::error::{FaultSeq, LogError, OpenError};
use crate::format::{
    chain_hasher, encode_commit, encode_record, encode_seal, record_fits, record_size,
    segment_file_name, CommitMark, RecordIn, RecordRef, SegmentHeader, Seq,
    DEFAULT_MAX_RECORD_BYTES, FORMAT_VERSION, HEADER_LEN, KIND_SEAL, RECORD_MIN_LEN,
    SEAL_RECORD_BYTES,
};
use crate::fs::Fs;
use crate::reader::LogReader;
use crate::recovery::{recover, LogPoint, RecoveryReport};
use crate::state::{ActiveSegment, Head, LogConfig};

/// The appender: owns the active segment. Not `Sync`; one writer per
/// directory (the caller holds a lock on the data directory).
pub struct Log {
    /// The log directory.
    dir: PathBuf,
    /// Settings, fixed at open.
    config: LogConfig,
    /// All file access.
    fs: Arc<dyn Fs>,
    /// Where the next batch goes; `None` before the first segment and after
    /// opening a log whose last segment is sealed.
    active: Option<ActiveSegment>,
    /// Seq, segment and chain after the last durable record.
    head: Head,
    /// Set by the first failed write-path call: the reason, for `Poisoned`,
    /// and whether [`Log::heal`] may lift it.
    poisoned: Option<Poison>,
    /// Encoding buffer, reused between batches.
    buf: Vec<u8>,
    /// The ticket id of a compaction begun and not finished: rolls are
    /// held meanwhile.
    compaction: Option<u64>,
}

/// The id of the next [`CompactionTicket`], unique in the process.
static NEXT_TICKET: AtomicU64 = AtomicU64::new(1);

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("dir", &self.dir)
            .field("head", &self.head)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

/// True when the log in `dir` holds, after seq `journal.head_seq`, a record
/// of kind [`KIND_COMPACTION`] with exactly the journal's payload (read
/// after recovery, so the log is whole).
fn record_present(
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

/// Refuses what a caller must not write: the seal's kind, the compaction
/// record's kind, a `len` over the limit.
fn check_record(record: &RecordIn<'_>, max_record_bytes: u32) -> Result<(), LogError> {
    if record.kind == KIND_COMPACTION {
        return Err(LogError::ReservedKind { kind: record.kind });
    }
    check_frame(record, max_record_bytes)
}

/// Refuses what the log must not write at all: the seal's kind, a `len`
/// over the limit.
fn check_frame(record: &RecordIn<'_>, max_record_bytes: u32) -> Result<(), LogError> {
    if record.kind == KIND_SEAL {
        return Err(LogError::ReservedKind { kind: record.kind });
    }
    // Cast: RECORD_MIN_LEN is 20.
    let len = record.payload.len().saturating_add(RECORD_MIN_LEN as usize);
    // Cast: u32 to usize is lossless on the 32- and 64-bit targets we build for.
    if len > max_record_bytes as usize {
        return Err(LogError::RecordTooLarge {
            bytes: len,
            limit: max_record_bytes,
        });
    }
    Ok(())
}

/// Why the write path stopped.
#[derive(Clone, Debug)]
struct Poison {
    /// The failed call, in words (for `Poisoned`).
    reason: String,
    /// True when the failure was a write or create of the append path
    /// refused for want of space: [`Log::heal`] may lift it.
    healable: bool,
}

/// Whether a write-path error for want of space may heal in process
/// ([`Log::heal`]) or poisons like any other.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnNoSpace {
    /// Any error poisons until a restart.
    Poison,
    /// A write or create of the append path (the batch's write, the seal's
    /// write, the next segment's create and header write): one refused for
    /// want of space leaves a poison that [`Log::heal`] lifts.
    Heal,
}

/// Turns a write-path error into `Io` and poisons: every later append
/// returns `Poisoned` with this reason, until a restart (or, for a refusal
/// for want of space with [`OnNoSpace::Heal`], until [`Log::heal`]).
fn poison<T>(
    poisoned: &mut Option<Poison>,
    op: &'static str,
    path: &Path,
    result: io::Result<T>,
    on_no_space: OnNoSpace,
) -> Result<T, LogError> {
    result.map_err(|source| {
        let error = LogError::io(op, path, source);
        let healable = on_no_space == OnNoSpace::Heal && error.is_no_space();
        if healable {
            tracing::warn!(%error, "log write refused for want of space; the tail is recovered in process once space is back");
        } else {
            tracing::error!(%error, "log write path poisoned; restart to recover");
        }
        *poisoned = Some(Poison {
            reason: error.to_string(),
            healable,
        });
        error
    })
}

/// Writes `bytes` at the active segment's end (`active.len`) and syncs
/// its data: the append path's one durable write (a batch, a seal). A
/// write refused for want of space heals ([`OnNoSpace::Heal`]); any
/// other error, and every `sync_data` error, poisons.
fn append_durably(
    poisoned: &mut Option<Poison>,
    active: &mut ActiveSegment,
    bytes: &[u8],
) -> Result<(), LogError> {
    poison(
        poisoned,
        "write",
        &active.path,
        active.file.write_all_at(active.len, bytes),
        OnNoSpace::Heal,
    )?;
    poison(
        poisoned,
        "sync_data",
        &active.path,
        active.file.sync_data(),
        OnNoSpace::Poison,
    )
}

impl Log {
    /// Opens (creating if missing, and syncing its parent) the log in `dir`,
    /// running recovery (FORMAT.md, "Recovery"). `visit` is called for every
    /// whole record in seq order (seals excluded) during that single pass, so
    /// the caller folds them without reading the log twice; its payload
    /// borrows the mapped segment.
    ///
    /// Errors: `OpenError::Visit` with the visitor's error (open stops at
    /// that record); `OpenError::Log` with `Corrupt` (segment, offset, seq),
    /// `UnsupportedVersion`, or `Io`. Recovery may truncate a torn tail or
    /// remove an interrupted roll's file; both are in the report.
    pub fn open<E>(
        dir: &Path,
        config: LogConfig,
        fs: Arc<dyn Fs>,
        visit: impl FnMut(RecordRef<'_>) -> Result<(), E>,
    ) -> Result<(Log, RecoveryReport), OpenError<E>> {
        Log::open_from(dir, config, fs, None, visit)
    }

    /// [`Log::open`] from a checkpoint standing at `from` (FORMAT.md,
    /// "Recovery" step 2a), a point the caller has checked against the log
    /// (the checkpoint's chain check): the sealed segments before the one
    /// holding it get only their links checked (header, seal, seqs, chain
    /// values), and are listed in [`RecoveryReport::deferred`] for
    /// [`scrub_segment`](crate::scrub_segment); everything from that
    /// segment on is checked as by `open`. `visit` sees only the records
    /// after `from.seq`.
    ///
    /// Errors: those of `open`, the ones of a deferred segment's links
    /// included (a missing or reordered segment is a seq gap or a broken
    /// chain, `Corrupt`), and `Corrupt` when the chain value at the point is
    /// not `from.chain` or its segment is missing (the log changed after
    /// the caller's check). A point past the end of the recovered log is no
    /// error: [`Log::head`] then ends before `from.seq`.
    pub fn open_from<E>(
        dir: &Path,
        config: LogConfig,
        fs: Arc<dyn Fs>,
        from: Option<&LogPoint>,
        visit: impl FnMut(RecordRef<'_>) -> Result<(), E>,
    ) -> Result<(Log, RecoveryReport), OpenError<E>> {
        let prelude = compaction_journal::before_recovery(fs.as_ref(), dir)?;
        let recovered = recover(dir, &config, &fs, from, visit)?;
        let mut log = Log {
            dir: dir.to_owned(),
            config,
            fs,
            active: recovered.active,
            head: recovered.head,
            poisoned: None,
            buf: Vec::new(),
            compaction: None,
        };
        let mut report = recovered.report;
        report.staged_removed = prelude.removed;
        if let Some(journal) = prelude.journal {
            let (record, appended) = log.finish_interrupted_compaction(&journal)?;
            report.staged_removed.extend(
                journal
                    .entries
                    .iter()
                    .map(|entry| entry.staged_name.clone()),
            );
            report.compaction_finished = Some(record);
            report.compaction_record_appended = appended;
        }
        Ok((log, report))
    }

    /// The end of a compaction whose commit a crash interrupted, after
    /// recovery (its segments and the active header already redone): appends
    /// its compaction record unless the log holds it after the journal's
    /// head seq, then removes the staged files and the journal. Returns the
    /// record and whether it was appended.
    fn finish_interrupted_compaction(
        &mut self,
        journal: &Journal,
    ) -> Result<(CompactionRecord, bool), LogError> {
        let record = CompactionRecord::decode(&journal.payload).map_err(|e| LogError::Corrupt {
            segment: JOURNAL_NAME.to_owned(),
            offset: 0,
            seq: FaultSeq::After(journal.head_seq),
            reason: e.to_string(),
        })?;
        let present = self.head.seq > journal.head_seq
            && record_present(
                Arc::clone(&self.fs),
                &self.dir,
                self.config.max_record_bytes,
                journal,
            )?;
        if !present {
            self.append_compaction_record(&journal.payload)?;
        }
        compaction_journal::finish_journal(self.fs.as_ref(), &self.dir, journal)?;
        tracing::info!(
            segments = record.segments.len(),
            appended = !present,
            "finished an interrupted compaction"
        );
        Ok((record, !present))
    }

    /// Appends the compaction record with `payload` as one batch (kind
    /// [`KIND_COMPACTION`], the clock's `ts_ms`). Returns its seq.
    fn append_compaction_record(&mut self, payload: &[u8]) -> Result<Seq, LogError> {
        let record = RecordIn {
            ts_ms: (self.config.now_ms)(),
            kind: KIND_COMPACTION,
            kind_version: COMPACTION_KIND_VERSION,
            payload,
        };
        self.append_frames(&[record])
    }

    /// Seals the active segment now, if it holds a record, and starts the
    /// next one (the roll's steps, FORMAT.md "Writing"), so that its
    /// records can be compacted. Nothing happens when the active segment
    /// holds no record or there is none (the last segment is sealed), and
    /// while a compaction is pending (begun, not finished: rolls are held).
    ///
    /// Errors: `Poisoned`; an I/O error of a roll step poisons as in
    /// [`append_batch`](Self::append_batch).
    pub fn seal_active(&mut self) -> Result<(), LogError> {
        if let Some(poison) = &self.poisoned {
            return Err(LogError::Poisoned(poison.reason.clone()));
        }
        if self.compaction.is_none() && self.active.as_ref().is_some_and(|a| a.records > 0) {
            self.roll()?;
        }
        Ok(())
    }

    /// Puts a compaction staged by
    /// [`stage_compaction`](crate::stage_compaction) in effect in one call:
    /// [`begin_compaction`](Self::begin_compaction),
    /// [`CompactionTicket::apply`] and
    /// [`finish_compaction`](Self::finish_compaction) on this thread (a
    /// writer that must go on appending meanwhile runs apply elsewhere).
    ///
    /// Errors: those of the three; an error of apply poisons the Log.
    pub fn commit_compaction(
        &mut self,
        staged: StagedCompaction,
        subjects: Vec<[u8; 16]>,
    ) -> Result<CompactionCommit, LogError> {
        let mut ticket = self.begin_compaction(staged, subjects)?;
        let applied = ticket.apply();
        self.finish_compaction(ticket, applied)
    }

    /// The commit's first part, on the writer, brief (FORMAT.md,
    /// "Compaction", commit step 1):
    ///
    /// 1. refuses a stale staging (`CompactionStale`: the last staged
    ///    segment is not the one right before the active segment, or not
    ///    the last segment when there is none, or its old seal is no longer
    ///    what follows it; or another compaction is begun and not finished),
    ///    removing the staged files;
    ///
    /// then starts the next segment when the last one is sealed (a
    /// compaction always has an active segment to re-chain), and **holds
    /// rolls**: until [`finish_compaction`](Self::finish_compaction) the
    /// active segment is never sealed, batches go on into it past
    /// `segment_size_bytes`, and [`seal_active`](Self::seal_active) does
    /// nothing. Returns the ticket for [`CompactionTicket::apply`], with the
    /// redo journal's contents: the staged files, the active segment's new
    /// header (its `chain_start` the last staged segment's new seal), the
    /// head seq, and the compaction record's payload ([`KIND_COMPACTION`],
    /// [`CompactionRecord`] with the staged segments and `subjects`).
    ///
    /// A version-1 active segment is made version 2 first when it holds no
    /// record (re-headed in place); when it holds records (only right after
    /// opening a log a version-1 build wrote, before any append: the next
    /// batch must seal it) the whole commit runs here, as
    /// [`commit_compaction`](Self::commit_compaction), and the ticket only
    /// carries its result to finish.
    ///
    /// Errors: `Poisoned` (nothing done); `CompactionStale`;
    /// `RecordTooLarge` when the compaction record would not fit (nothing
    /// done, staged files removed); an I/O error of the roll or re-heading
    /// poisons as in [`append_batch`](Self::append_batch).
    pub fn begin_compaction(
        &mut self,
        staged: StagedCompaction,
        subjects: Vec<[u8; 16]>,
    ) -> Result<CompactionTicket, LogError> {
        if let Some(poison) = &self.poisoned {
            return Err(LogError::Poisoned(poison.reason.clone()));
        }
        let refuse = |staged: StagedCompaction, fs: &dyn Fs, error: LogError| {
            if let Err(e) = staged.discard(fs) {
                tracing::warn!(error = %e, "removing the staged files of a refused compaction failed");
            }
            Err(error)
        };
        if self.compaction.is_some() {
            return refuse(staged, self.fs.as_ref(), LogError::CompactionStale);
        }
        // New batches go into version-2 segments only, and no roll may
        // come while the compaction is pending: a version-1 active segment
        // without records is re-headed now; one with records must be
        // sealed by the next batch, so the commit is done whole right away.
        self.upgrade_v1_segment()?;
        let whole = self
            .active
            .as_ref()
            .is_some_and(|active| active.format_version != FORMAT_VERSION);
        let Some((last_entry, last)) = staged.last() else {
            return refuse(staged, self.fs.as_ref(), LogError::CompactionStale);
        };
        let (last_name, last) = (last_entry.final_name.clone(), *last);
        let fresh = staged.dir == self.dir
            && match self.active_header()? {
                Some((header, _)) => {
                    header.first_seq == last.last_seq + 1 && header.chain_start == last.old_seal
                }
                None if self.active.is_some() => false,
                None => self.head.segment == last_name && self.head.chain == last.old_seal,
            };
        if !fresh {
            return refuse(staged, self.fs.as_ref(), LogError::CompactionStale);
        }
        let record = CompactionRecord {
            segments: staged.segments.clone(),
            subjects,
        };
        let payload = record.encode();
        if !record_fits(payload.len(), self.config.max_record_bytes) {
            let error = LogError::RecordTooLarge {
                bytes: payload.len().saturating_add(RECORD_MIN_LEN as usize),
                limit: self.config.max_record_bytes,
            };
            return refuse(staged, self.fs.as_ref(), error);
        }
        // The last segment is sealed: start the next one now (from the old
        // chain, as a roll would), so that the journal names it and its
        // header is re-chained with the rest.
        if self.active.is_none() {
            self.start_segment()?;
        }
        let header = self.active_header()?;
        let (Some((header, version)), Some(active)) = (header, &self.active) else {
            return self.poison_on(Err(LogError::Poisoned(
                "no active segment with a readable header to re-chain".to_owned(),
            )));
        };
        let new_chain = last.new_seal;
        let patched = SegmentHeader {
            chain_start: new_chain,
            ..header
        };
        let journal = Journal {
            entries: staged.entries.clone(),
            active: Some((active.name.clone(), patched.encode_version(version))),
            head_seq: self.head.seq,
            payload,
        };
        let id = NEXT_TICKET.fetch_add(1, Ordering::Relaxed);
        let mut ticket = CompactionTicket {
            id,
            dir: self.dir.clone(),
            fs: Arc::clone(&self.fs),
            journal,
            record,
            new_chain,
            active_len: active.len,
            prefix: None,
            done: None,
            // A whole commit runs on the writer: unpaced, as briefly as it
            // can.
            pace: if whole {
                None
            } else {
                self.config.compaction_pace
            },
        };
        self.compaction = Some(id);
        if whole {
            let applied = ticket.apply();
            let (journal, record) = (ticket.journal.clone(), ticket.record.clone());
            let commit = self.finish_compaction(ticket, applied)?;
            return Ok(CompactionTicket {
                id,
                dir: self.dir.clone(),
                fs: Arc::clone(&self.fs),
                journal,
                record,
                new_chain,
                active_len: 0,
                prefix: None,
                done: Some(commit),
                pace: None,
            });
        }
        tracing::info!(
            segments = ticket.record.segments.len(),
            head_seq = self.head.seq,
            "compaction begun; rolls are held until it is finished"
        );
        Ok(ticket)
    }

    /// The commit's last part, on the writer, brief (FORMAT.md,
    /// "Compaction", commit steps 4 to 6), after
    /// [`CompactionTicket::apply`] returned `applied`:
    ///
    /// 4. patches the active segment's header with the new chain start
    ///    and recomputes the head chain (apply hashed the bytes up to the
    ///    length at begin; this hashes the batches appended since);
    /// 5. appends the compaction record as one batch (its `fdatasync`
    ///    covers the header too);
    /// 6. removes the journal (directory synced; apply removed the staged
    ///    files);
    ///
    /// and releases the rolls [`begin_compaction`](Self::begin_compaction)
    /// held (the next batch rolls if the segment outgrew
    /// `segment_size_bytes`).
    ///
    /// Errors: `applied`'s error, or `Poisoned` when the Log was poisoned
    /// meanwhile (a failed append) or the ticket is not this Log's pending
    /// one or was not applied: either way the Log ends poisoned for good
    /// (the journal may be durable; the next [`Log::open`] redoes the
    /// compaction from it, or finds the old log without it). Any I/O error
    /// of steps 4 to 6 poisons likewise.
    pub fn finish_compaction(
        &mut self,
        ticket: CompactionTicket,
        applied: Result<(), LogError>,
    ) -> Result<CompactionCommit, LogError> {
        if let Some(commit) = ticket.done {
            // Committed whole by begin (a version-1 active segment).
            applied?;
            return Ok(commit);
        }
        if self.compaction != Some(ticket.id) {
            return self.poison_on(Err(LogError::Poisoned(
                "a compaction was finished that this log did not begin".to_owned(),
            )));
        }
        self.compaction = None;
        self.poison_on(applied)?;
        if let Some(poison) = self.poisoned.as_mut() {
            // A healable poison (a batch refused for want of space while the
            // compaction was pending) is not healed in process: the journal
            // may be durable, and only a restart's redo finishes the job.
            poison.healable = false;
            return Err(LogError::Poisoned(poison.reason.clone()));
        }
        let CompactionTicket {
            journal,
            record,
            new_chain,
            active_len,
            prefix,
            ..
        } = ticket;
        let Some(prefix) = prefix else {
            return self.poison_on(Err(LogError::Poisoned(
                "a compaction was finished that was not applied".to_owned(),
            )));
        };
        // Step 4.
        let same_segment = matches!(
            (&self.active, &journal.active),
            (Some(active), Some((name, _))) if active.name == *name
        );
        if !same_segment {
            return self.poison_on(Err(LogError::Poisoned(
                "the active segment changed while a compaction was pending".to_owned(),
            )));
        }
        if let (Some(active), Some((_, header))) = (self.active.as_mut(), &journal.active) {
            // Made durable by the compaction record's `fdatasync` (the same
            // file, or its seal's when the record's batch rolls): until the
            // journal is removed, redo writes it again anyway.
            poison(
                &mut self.poisoned,
                "write",
                &active.path,
                active.file.write_all_at(0, header),
                OnNoSpace::Poison,
            )?;
            let mut hasher = prefix;
            if active.len > active_len {
                let bytes = self.fs.map(&active.path);
                let bytes = poison(
                    &mut self.poisoned,
                    "map",
                    &active.path,
                    bytes,
                    OnNoSpace::Poison,
                )?;
                let bytes: &[u8] = (*bytes).as_ref();
                // Cast: both lengths are at most the file's length.
                let Some(tail) = bytes.get(active_len as usize..active.len as usize) else {
                    let error = LogError::Poisoned(format!(
                        "the active segment {} is shorter than its acknowledged {} bytes",
                        active.name, active.len
                    ));
                    return self.poison_on(Err(error));
                };
                hasher.update(tail);
            }
            debug_assert_eq!(
                hasher.finalize(),
                self.fs
                    .map(&active.path)
                    .map(|bytes| {
                        let bytes: &[u8] = (*bytes).as_ref();
                        let mut full = chain_hasher(&new_chain);
                        // Cast: `len` is at most the file's length.
                        full.update(&bytes[..active.len as usize]);
                        full.finalize()
                    })
                    .unwrap_or_else(|_| hasher.finalize()),
                "the chain hashed in two parts differs from the one over the file"
            );
            self.head.chain = if active.records == 0 {
                new_chain
            } else {
                hasher.finalize().into()
            };
            *active.hasher = hasher;
        }
        // Step 5.
        let record_seq = self.append_compaction_record(&journal.payload)?;
        // Step 6 (apply removed the staged files).
        let finished = compaction_journal::remove_journal(self.fs.as_ref(), &self.dir);
        self.poison_on(finished)?;
        tracing::info!(
            segments = record.segments.len(),
            record_seq,
            "compaction committed"
        );
        Ok(CompactionCommit { record_seq, record })
    }

    /// The active segment's header and version as the file holds it;
    /// `None` when there is no active segment or its header does not
    /// decode. A failed map poisons.
    fn active_header(&mut self) -> Result<Option<(SegmentHeader, u16)>, LogError> {
        let Some(active) = &self.active else {
            return Ok(None);
        };
        let bytes = self.fs.map(&active.path);
        let bytes = poison(
            &mut self.poisoned,
            "map",
            &active.path,
            bytes,
            OnNoSpace::Poison,
        )?;
        Ok(SegmentHeader::decode_versioned((*bytes).as_ref()).ok())
    }

    /// Poisons (not healable) when `result` is an error.
    fn poison_on<T>(&mut self, result: Result<T, LogError>) -> Result<T, LogError> {
        result.map_err(|error| {
            tracing::error!(%error, "log write path poisoned; restart to recover");
            self.poisoned = Some(Poison {
                reason: error.to_string(),
                healable: false,
            });
            error
        })
    }

    /// Appends every record of `batch` with consecutive seqs, then the
    /// batch's commit mark (FORMAT.md, "Commit mark"): one write call and one
    /// `fdatasync` for the batch, after a roll if one is due (see
    /// [`LogConfig::segment_size_bytes`]). Returns the seq of the last record.
    ///
    /// Errors without writing (and without poisoning): `RecordTooLarge`,
    /// `ReservedKind`. After any write, fsync, create or directory-sync error
    /// the Log is poisoned: that call returns the `Io` error, every later one
    /// `Poisoned`, and nothing is written again; but a write or create
    /// refused for want of space ([`LogError::is_no_space`]) can be lifted
    /// by [`Log::heal`]. An empty batch returns the current last seq without
    /// I/O.
    pub fn append_batch(&mut self, batch: &[RecordIn<'_>]) -> Result<Seq, LogError> {
        for record in batch {
            check_record(record, self.config.max_record_bytes)?;
        }
        self.append_frames(batch)
    }

    /// [`append_batch`](Self::append_batch) for the log's own records too
    /// (the compaction record): only the seal's kind and the size are
    /// refused.
    fn append_frames(&mut self, batch: &[RecordIn<'_>]) -> Result<Seq, LogError> {
        if let Some(poison) = &self.poisoned {
            return Err(LogError::Poisoned(poison.reason.clone()));
        }
        if batch.is_empty() {
            return Ok(self.head.seq);
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let first = self.head.seq + 1;
        for (seq, record) in (first..).zip(batch) {
            check_frame(record, self.config.max_record_bytes)?;
            encode_record(&mut buf, seq, record)?;
        }
        debug_assert!(frames_match(
            &buf,
            first,
            batch,
            self.config.max_record_bytes
        ));
        // Cast: usize is at most 64 bits on every target Rust supports.
        let count = batch.len() as u64;
        let last = self.head.seq + count;
        let mark = CommitMark::for_batch(&buf, count);
        encode_commit(&mut buf, last, (self.config.now_ms)(), &mark);
        // Cast: as above.
        let batch_bytes = buf.len() as u64;

        self.upgrade_v1_segment()?;
        self.roll_if_due(batch_bytes)?;
        let Some(active) = self.active.as_mut() else {
            return Err(LogError::Poisoned(
                "no active segment after a roll".to_owned(),
            ));
        };
        let end = active.len + batch_bytes;
        let fill_to = fill_target(&self.config, end, active.allocated);
        if fill_to > end {
            // Cast: at most `preallocate_bytes` more than a batch in memory.
            buf.resize(buf.len() + (fill_to - end) as usize, 0);
        }
        append_durably(&mut self.poisoned, active, &buf)?;
        // The chain covers the records and the commit mark, not the zero
        // fill after them. Cast: `batch_bytes` is `buf.len()` before the
        // fill.
        active.hasher.update(&buf[..batch_bytes as usize]);
        active.len = end;
        active.allocated = active.allocated.max(fill_to);
        active.records += count;
        self.head.seq = last;
        self.head.chain = active.hasher.finalize().into();
        // Do not keep a huge buffer alive after one huge batch. Cast: u32 to
        // usize is lossless on the 32- and 64-bit targets we build for.
        if buf.capacity() > 2 * (DEFAULT_MAX_RECORD_BYTES as usize) {
            buf = Vec::new();
        }
        self.buf = buf;
        Ok(last)
    }

    /// New batches are written in the current format only: a version-1
    /// active segment found at open is sealed by the roll that
    /// [`roll_if_due`](Self::roll_if_due) then makes due, or, when it holds
    /// no record (nothing to seal), gets a version-2 header in place (the
    /// same 64 bytes but the version and checksum; `fsync`ed before any
    /// record; a torn header there is an interrupted roll, FORMAT.md).
    fn upgrade_v1_segment(&mut self) -> Result<(), LogError> {
        let Some(active) = self.active.as_mut() else {
            return Ok(());
        };
        if active.format_version == FORMAT_VERSION || active.records > 0 {
            return Ok(());
        }
        let bytes = self.fs.map(&active.path);
        let bytes = poison(
            &mut self.poisoned,
            "map",
            &active.path,
            bytes,
            OnNoSpace::Poison,
        )?;
        let header = SegmentHeader::decode((*bytes).as_ref()).map_err(|e| {
            LogError::corrupt(
                &active.name,
                e.offset(),
                FaultSeq::Header(self.head.seq + 1),
                e.to_string(),
            )
        })?;
        drop(bytes);
        let encoded = header.encode();
        poison(
            &mut self.poisoned,
            "write",
            &active.path,
            active.file.write_all_at(0, &encoded),
            OnNoSpace::Poison,
        )?;
        poison(
            &mut self.poisoned,
            "sync_all",
            &active.path,
            active.file.sync_all(),
            OnNoSpace::Poison,
        )?;
        let mut hasher = chain_hasher(&header.chain_start);
        hasher.update(&encoded);
        *active.hasher = hasher;
        active.format_version = FORMAT_VERSION;
        tracing::info!(segment = %active.name, "version-1 segment without records re-headed as version 2");
        Ok(())
    }

    /// Seals the active segment and starts the next one when the batch would
    /// push it past `segment_size_bytes`, or when it is a version-1 segment
    /// (new records go into version-2 segments only); starts one when there
    /// is none. While a compaction is pending no roll is due (begin made
    /// sure there is a version-2 active segment).
    fn roll_if_due(&mut self, batch_bytes: u64) -> Result<(), LogError> {
        let due = match &self.active {
            None => true,
            // A compaction is pending: the active segment stays active
            // (FORMAT.md, "Compaction").
            Some(_) if self.compaction.is_some() => false,
            Some(active) => {
                active.records > 0
                    && (active.len.saturating_add(batch_bytes) > self.config.segment_size_bytes
                        || active.format_version != FORMAT_VERSION)
            }
        };
        if !due {
            return Ok(());
        }
        self.roll()
    }

    /// Seals the active segment (if any) and starts the next one: the roll
    /// steps of FORMAT.md, "Writing".
    fn roll(&mut self) -> Result<(), LogError> {
        if let Some(active) = self.active.as_mut() {
            // Roll step 1: the seal, holding the chain value at its offset
            // (the head chain: the segment holds at least one record). The
            // segment stays active until its seal is durable, so that
            // [`Log::heal`] knows where its acknowledged bytes end.
            debug_assert_eq!(self.head.chain, <[u8; 32]>::from(active.hasher.finalize()));
            let mut seal = Vec::with_capacity(SEAL_RECORD_BYTES);
            encode_seal(
                &mut seal,
                self.head.seq,
                (self.config.now_ms)(),
                &self.head.chain,
            );
            append_durably(&mut self.poisoned, active, &seal)?;
            tracing::debug!(segment = %active.name, last_seq = self.head.seq, "sealed segment");
            self.active = None;
        }
        self.start_segment()
    }

    /// Roll steps 2 to 4: create the next file (named by the next seq), write
    /// its header, fsync it, fsync the directory. Only then may a record go
    /// into it.
    fn start_segment(&mut self) -> Result<(), LogError> {
        let first_seq = self.head.seq + 1;
        let name = segment_file_name(first_seq);
        let path = self.dir.join(&name);
        let header = SegmentHeader {
            first_seq,
            created_ms: (self.config.now_ms)(),
            chain_start: self.head.chain,
        }
        .encode();
        let created = self.fs.create_new(&path);
        let mut file = poison(
            &mut self.poisoned,
            "create_new",
            &path,
            created,
            OnNoSpace::Heal,
        )?;
        poison(
            &mut self.poisoned,
            "write",
            &path,
            file.write_all_at(0, &header),
            OnNoSpace::Heal,
        )?;
        poison(
            &mut self.poisoned,
            "sync_all",
            &path,
            file.sync_all(),
            OnNoSpace::Poison,
        )?;
        let synced = self.fs.sync_dir(&self.dir);
        poison(
            &mut self.poisoned,
            "sync_dir",
            &self.dir,
            synced,
            OnNoSpace::Poison,
        )?;
        let mut hasher = chain_hasher(&self.head.chain);
        hasher.update(&header);
        tracing::debug!(segment = %name, first_seq, "started segment");
        self.head.segment = name.clone();
        self.active = Some(ActiveSegment {
            name,
            path,
            file,
            // Cast: HEADER_LEN is 64.
            len: HEADER_LEN as u64,
            allocated: HEADER_LEN as u64,
            records: 0,
            format_version: FORMAT_VERSION,
            hasher: Box::new(hasher),
        });
        Ok(())
    }

    /// Seq, active segment and chain value after the last durable record.
    pub fn head(&self) -> Head {
        self.head.clone()
    }

    /// Seq of the last durable record; 0 for an empty log.
    pub fn last_seq(&self) -> Seq {
        self.head.seq
    }

    /// The log directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file system the log is on.
    pub fn fs(&self) -> Arc<dyn Fs> {
        Arc::clone(&self.fs)
    }

    /// The settings the log was opened with.
    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// True once a write-path call failed; every append then returns
    /// `Poisoned` (until [`Log::heal`] lifts a healable poison).
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    /// True when the write path is poisoned by a write or create refused
    /// for want of space, which [`Log::heal`] may lift; false when it is
    /// not poisoned, or poisoned for good (a failed fsync, any other error).
    pub fn is_healable(&self) -> bool {
        self.poisoned.as_ref().is_some_and(|p| p.healable)
    }

    /// Recovers the log's tail in process after a write or create refused
    /// for want of space, and lifts the poison: overwrites with
    /// zeros whatever the failed write left after the active segment's
    /// acknowledged end (the bytes of a batch or seal that was never
    /// acknowledged: with a zero tail the file ends where it did, and a
    /// reader mapping it never sees it shrink), `fdatasync`s that, then runs
    /// the same recovery as [`Log::open`] (it removes a next segment whose
    /// create or header write failed, and verifies every chain) and checks
    /// that the recovered head is exactly the head before the failure.
    ///
    /// Returns `Ok(None)` when the log is not poisoned. Errors: `Poisoned`
    /// when the poison is not healable (a failed fsync is never retried),
    /// or while a compaction is pending (the poison stays healable until
    /// [`finish_compaction`](Self::finish_compaction) makes it permanent);
    /// an `Io` error for want of space leaves the poison healable (call
    /// again once there is space); any other error, or a recovered head that
    /// differs, makes the poison permanent (restart).
    pub fn heal(&mut self) -> Result<Option<RecoveryReport>, LogError> {
        let Some(poison) = self.poisoned.clone() else {
            return Ok(None);
        };
        if !poison.healable {
            return Err(LogError::Poisoned(poison.reason));
        }
        if self.compaction.is_some() {
            // Recovery must not read the segments while apply replaces
            // them; finish makes this poison permanent.
            return Err(LogError::Poisoned(format!(
                "{}; the tail is not recovered while a compaction is pending",
                poison.reason
            )));
        }
        match self.recover_tail() {
            Ok(report) => {
                tracing::info!(
                    seq = self.head.seq,
                    segment = %self.head.segment,
                    was = %poison.reason,
                    "log tail recovered in process; writes resume"
                );
                self.poisoned = None;
                Ok(Some(report))
            }
            Err(e) => {
                let healable = e.is_no_space();
                if !healable {
                    tracing::error!(error = %e, "in-process recovery of the log failed; restart to recover");
                }
                self.poisoned = Some(Poison {
                    reason: format!("{}; recovering the tail failed: {e}", poison.reason),
                    healable,
                });
                Err(e)
            }
        }
    }

    /// [`Log::heal`]'s work: zero the unacknowledged tail, recover, compare.
    fn recover_tail(&mut self) -> Result<RecoveryReport, LogError> {
        if let Some(active) = self.active.as_mut() {
            let file_len = active
                .file
                .len()
                .map_err(|e| LogError::io("len", &active.path, e))?;
            if file_len > active.len {
                static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
                let mut at = active.len;
                while at < file_len {
                    // Cast: at most 64 KiB.
                    let n = (file_len - at).min(ZEROS.len() as u64) as usize;
                    active
                        .file
                        .write_all_at(at, &ZEROS[..n])
                        .map_err(|e| LogError::io("write", &active.path, e))?;
                    at += n as u64;
                }
                active
                    .file
                    .sync_data()
                    .map_err(|e| LogError::io("sync_data", &active.path, e))?;
            }
        }
        // The file handle is dropped before recovery maps and may cut files.
        self.active = None;
        let recovered = recover(&self.dir, &self.config, &self.fs, None, |_| {
            Ok::<(), std::convert::Infallible>(())
        })
        .map_err(LogError::from)?;
        if recovered.head != self.head {
            return Err(LogError::Poisoned(format!(
                "recovery found the log's head at seq {} in {} (chain {}), not the acknowledged seq {} in {} (chain {})",
                recovered.head.seq,
                recovered.head.segment,
                recovered.head.chain_hex(),
                self.head.seq,
                self.head.segment,
                self.head.chain_hex()
            )));
        }
        self.active = recovered.active;
        Ok(recovered.report)
    }
}

/// Where the zero fill of a batch ending at `end` stops: `end` itself (no
/// fill) when pre-allocation is off or the file already reaches `end`,
/// else the next multiple of `preallocate_bytes` at or after `end`, but not
/// past `segment_size_bytes` (the roll comes first).
fn fill_target(config: &LogConfig, end: u64, allocated: u64) -> u64 {
    let chunk = config.preallocate_bytes;
    if chunk == 0 || end <= allocated {
        return end;
    }
    let rounded = end.div_ceil(chunk).saturating_mul(chunk);
    rounded.min(config.segment_size_bytes).max(end)
}

/// The other side of the disk, before writing: the encoded batch decodes
/// back to the same records with the expected seqs.
fn frames_match(buf: &[u8], first: Seq, batch: &[RecordIn<'_>], max_record_bytes: u32) -> bool {
    let mut offset = 0;
    for (seq, record) in (first..).zip(batch) {
        match crate::format::decode_record(buf, offset, max_record_bytes) {
            crate::format::RecordDecode::Record { record: got, size } => {
                let same = got.seq == seq
                    && got.ts_ms == record.ts_ms
                    && got.kind == record.kind
                    && got.kind_version == record.kind_version
                    && got.payload == record.payload
                    && size == record_size(record.payload.len());
                if !same {
                    return false;
                }
                offset += size;
            }
            _ => return false,
        }
    }
    offset == buf.len()
}

// ---- Group commit ---------------------------------------------------------

/// Group commit for independent submitters: a writer thread owns a [`Log`];
/// each [`append`](GroupCommitAppender::append) blocks until its record is
/// durable. The writer takes whatever is queued (up to `max_batch_records`)
/// as one batch, so under load many records share one `fdatasync`; a lone
/// record is written at once, never held back waiting for company (there is
/// no timer).
pub struct GroupCommitAppender {
    /// Queue, wake-up and published head, shared with the writer thread.
    shared: Arc<Shared>,
    /// The writer thread; it hands the `Log` back when it ends.
    writer: Option<JoinHandle<Log>>,
    /// Checked on the submitter's thread, so one oversized record fails
    /// alone instead of failing its whole batch.
    max_record_bytes: u32,
    /// Why the writer thread could not start, if it could not.
    start_error: Option<String>,
}

/// State shared between submitters and the writer thread.
struct Shared {
    /// Records waiting for the writer.
    queue: Mutex<Queue>,
    /// Signals the writer: work queued or shutdown asked.
    wake: Condvar,
    /// The log's head after the last durable batch.
    head: Mutex<Head>,
}

/// The submission queue.
struct Queue {
    /// Records in arrival order.
    pending: VecDeque<Pending>,
    /// Set by shutdown: the writer drains `pending`, then ends.
    closing: bool,
}

/// One submitted record and where its answer goes.
struct Pending {
    ts_ms: u64,
    kind: u16,
    kind_version: u16,
    payload: Vec<u8>,
    reply: mpsc::SyncSender<Result<Seq, LogError>>,
}

/// Locks ignoring poisoning: the guarded data stays consistent because no
/// code panics while holding these locks.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl GroupCommitAppender {
    /// Starts the writer thread, which owns `log` until
    /// [`shutdown`](Self::shutdown). `max_batch_records` caps a batch (0 is
    /// taken as 1).
    pub fn spawn(log: Log, max_batch_records: usize) -> Self {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                pending: VecDeque::new(),
                closing: false,
            }),
            wake: Condvar::new(),
            head: Mutex::new(log.head()),
        });
        let max_record_bytes = log.config.max_record_bytes;
        let max_batch = max_batch_records.max(1);
        let for_writer = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("spark-log-writer".to_owned())
            .spawn(move || writer_loop(log, &for_writer, max_batch));
        let (writer, start_error) = match spawned {
            Ok(handle) => (Some(handle), None),
            Err(e) => (
                None,
                Some(format!("the log writer thread did not start: {e}")),
            ),
        };
        GroupCommitAppender {
            shared,
            writer,
            max_record_bytes,
            start_error,
        }
    }

    /// Appends one record and blocks until it is durable; returns its seq.
    /// Callable from many threads at once.
    ///
    /// Errors: `RecordTooLarge` / `ReservedKind` at once, for this record
    /// only; the batch's `Io` error for every record of the batch whose write
    /// or sync failed; `Poisoned` after that.
    pub fn append(
        &self,
        ts_ms: u64,
        kind: u16,
        kind_version: u16,
        payload: Vec<u8>,
    ) -> Result<Seq, LogError> {
        if let Some(reason) = &self.start_error {
            return Err(LogError::Poisoned(reason.clone()));
        }
        check_record(
            &RecordIn {
                ts_ms,
                kind,
                kind_version,
                payload: &payload,
            },
            self.max_record_bytes,
        )?;
        let (reply, answer) = mpsc::sync_channel(1);
        {
            let mut queue = lock(&self.shared.queue);
            if queue.closing {
                return Err(LogError::Poisoned(
                    "the appender is shutting down".to_owned(),
                ));
            }
            queue.pending.push_back(Pending {
                ts_ms,
                kind,
                kind_version,
                payload,
                reply,
            });
        }
        self.shared.wake.notify_one();
        answer.recv().unwrap_or_else(|_| {
            Err(LogError::Poisoned(
                "the log writer thread stopped before answering".to_owned(),
            ))
        })
    }

    /// The log's head after the last durable batch.
    pub fn head(&self) -> Head {
        lock(&self.shared.head).clone()
    }

    /// Lets the writer finish everything queued, stops it and returns the
    /// `Log` (poisoned or not: check [`Log::is_poisoned`]). Errors with
    /// `Poisoned` only if the writer thread never started or panicked.
    pub fn shutdown(mut self) -> Result<Log, LogError> {
        if let Some(reason) = &self.start_error {
            return Err(LogError::Poisoned(reason.clone()));
        }
        self.close();
        match self.writer.take().map(JoinHandle::join) {
            Some(Ok(log)) => Ok(log),
            _ => Err(LogError::Poisoned(
                "the log writer thread panicked".to_owned(),
            )),
        }
    }

    /// Asks the writer to drain the queue and end.
    fn close(&self) {
        lock(&self.shared.queue).closing = true;
        self.shared.wake.notify_all();
    }
}

impl Drop for GroupCommitAppender {
    fn drop(&mut self) {
        if let Some(writer) = self.writer.take() {
            self.close();
            // The Log is dropped with the thread's result; nothing to report.
            let _ = writer.join();
        }
    }
}

impl std::fmt::Debug for GroupCommitAppender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommitAppender")
            .field("head", &self.head())
            .finish_non_exhaustive()
    }
}

/// The writer thread: take everything queued (up to `max_batch`), append it
/// as one batch, answer each submitter; until shutdown drains the queue.
fn writer_loop(mut log: Log, shared: &Shared, max_batch: usize) -> Log {
    let mut batch: Vec<Pending> = Vec::new();
    loop {
        {
            let mut queue = lock(&shared.queue);
            while queue.pending.is_empty() && !queue.closing {
                queue = shared
                    .wake
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if queue.pending.is_empty() {
                break;
            }
            let take = queue.pending.len().min(max_batch);
            batch.extend(queue.pending.drain(..take));
        }
        let records: Vec<RecordIn<'_>> = batch
            .iter()
            .map(|p| RecordIn {
                ts_ms: p.ts_ms,
                kind: p.kind,
                kind_version: p.kind_version,
                payload: &p.payload,
            })
            .collect();
        let result = log.append_batch(&records);
        drop(records);
        match result {
            Ok(last) => {
                *lock(&shared.head) = log.head();
                // Cast: usize is at most 64 bits on every target Rust supports.
                let first = last + 1 - batch.len() as u64;
                for (seq, pending) in (first..).zip(batch.drain(..)) {
                    // A submitter that went away no longer needs its answer.
                    let _ = pending.reply.send(Ok(seq));
                }
            }
            Err(error) => {
                for pending in batch.drain(..) {
                    let _ = pending.reply.send(Err(error.duplicate()));
                }
            }
        }
    }
    log
}
