//! The crate's errors: what went wrong and where.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Everything the log can fail with.
///
/// `Corrupt` and `UnsupportedVersion` come from reading (recovery or the
/// reader) and mean the bytes on disk are not what this build accepts: the
/// caller must refuse to start rather than guess. `Io` from the write path
/// poisons the [`Log`](crate::Log); every later append then returns
/// `Poisoned`, because after a failed write or fsync the state of the file is
/// unknown and retrying the fsync could acknowledge data the disk dropped.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// An operating-system call failed. `op` names the call (`"sync_data"`,
    /// `"write"`, `"create_new"`, ...), `path` the file or directory.
    #[error("i/o error {op} on {path}: {source}")]
    Io {
        /// The failed call.
        op: &'static str,
        /// The file or directory it was made on.
        path: PathBuf,
        /// The error the operating system returned.
        #[source]
        source: io::Error,
    },
    /// Bytes on disk that are not a torn tail and do not verify.
    ///
    /// `segment` is the segment file name, `offset` the byte offset in that
    /// file where the damage starts (0 for a bad header or name), `seq` the
    /// seq of the damaged frame ([`FaultSeq`]: the faulty record's own seq,
    /// the one expected there; or, where the fault is no record, what it
    /// lies after, the batch it fails to close, or the header's segment),
    /// `reason` says which rule failed.
    #[error("corrupt log: segment {segment} at offset {offset} ({seq}): {reason}")]
    Corrupt {
        /// Segment file name, e.g. `00000000000000000001.seg`.
        segment: String,
        /// Byte offset in the segment file.
        offset: u64,
        /// Which seq the damage is at, and what it is.
        seq: FaultSeq,
        /// The rule that failed, in words.
        reason: String,
    },
    /// A segment whose header (checksum valid) declares a newer format.
    #[error(
        "segment {segment}: format version {found} is newer than this build reads ({supported})"
    )]
    UnsupportedVersion {
        /// Segment file name.
        segment: String,
        /// The version in the header.
        found: u16,
        /// [`FORMAT_VERSION`](crate::FORMAT_VERSION) of this build.
        supported: u16,
    },
    /// A `.seg` file in the log directory whose name is not exactly 20
    /// decimal digits followed by `.seg` (FORMAT.md, "Files"): a stray file,
    /// not a segment, so no seq is damaged; the log is refused until it is
    /// moved out, because it may be a renamed segment. Nothing is changed.
    #[error(
        "stray file {name} in the log directory: a .seg file whose name is not 20 decimal \
         digits followed by .seg is no segment; move it out of the log directory (nothing \
         was read or changed)"
    )]
    StrayFile {
        /// The file's name, e.g. `backup.seg`.
        name: String,
    },
    /// A record handed to the appender whose `len` field (20 + payload bytes)
    /// would exceed `max_record_bytes`. Nothing was written; not poisoning.
    #[error("record of {bytes} bytes is over the limit of {limit} bytes")]
    RecordTooLarge {
        /// The record's `len` field: 20 + payload length.
        bytes: usize,
        /// The configured `max_record_bytes`.
        limit: u32,
    },
    /// A record handed to the appender with kind
    /// [`KIND_SEAL`](crate::KIND_SEAL) or
    /// [`KIND_COMPACTION`](crate::KIND_COMPACTION), which only the log
    /// itself writes (or a compaction asked to replace a compaction
    /// record). Nothing was written; not poisoning.
    #[error("kind {kind} is reserved for the log's own frames and records")]
    ReservedKind {
        /// The refused kind.
        kind: u16,
    },
    /// [`Log::begin_compaction`](crate::Log::begin_compaction) (or
    /// [`Log::commit_compaction`](crate::Log::commit_compaction)) was handed
    /// a compaction staged before the set of sealed segments changed (a
    /// roll, or another compaction, came in between), or while another
    /// compaction is begun and not finished. Nothing was changed, the
    /// staged files were removed; not poisoning. Stage again.
    #[error("the staged compaction is stale: the sealed segments changed since it was staged (stage again)")]
    CompactionStale,
    /// A read-only view ([`LogReader`](crate::LogReader), not live) found
    /// the journal of a compaction whose commit a crash interrupted
    /// (`COMPACTION` in the log directory): the segments may be half
    /// replaced, and only the writer finishes the job. Nothing was read or
    /// changed; start the engine ([`Log::open`](crate::Log::open)) once.
    #[error("an interrupted compaction must be finished first ({journal} exists): start the engine (spark-engine serve) on this data directory once, which finishes it, then read again")]
    CompactionPending {
        /// The journal's path.
        journal: PathBuf,
    },
    /// [`Log::open`](crate::Log::open) found a compaction journal
    /// (`COMPACTION`) that does not verify. It is written whole (temporary
    /// file, fsync, rename) before any segment is replaced, so this is
    /// damage from outside the engine; what it recorded cannot be redone.
    /// Nothing was changed. The way out is in the message: move the file
    /// out of the log directory and start again; recovery then checks
    /// every segment's chain and refuses a log the compaction left half
    /// replaced (restore from the archive then).
    #[error("the compaction journal {journal} is damaged ({reason}); nothing was changed. Move it out of the log directory (`mv {journal} {aside}`) and start again: the start checks every segment and its chain, and refuses a log the interrupted compaction left half replaced; then restore from the archive (docs/operations.md, \"A damaged log\")")]
    CompactionJournalDamaged {
        /// The journal's path.
        journal: PathBuf,
        /// Where the message suggests moving it: `COMPACTION.damaged` in
        /// the log directory's parent (the data directory).
        aside: PathBuf,
        /// Why it does not verify.
        reason: String,
    },
    /// The write path failed earlier (the message says how) and refuses to
    /// write again. Restart: recovery rebuilds the truth from disk.
    #[error("the write path is poisoned by an earlier failed write or fsync: {0}; restart to recover from disk")]
    Poisoned(String),
}

/// Where a [`LogError::Corrupt`] lies in seq terms (FORMAT.md, "Torn and
/// corrupt, exactly"): the seq it names and what that seq is. Printed in
/// the error's parentheses: `seq 1023`, `after seq 1022`, `batch of seqs
/// 5..=7`, `header of the segment expected to start at seq 677`.
///
/// Seqs are spelled `u64`, the type [`Seq`](crate::Seq) names: this module
/// is the leaf every other one reports through (the format's encoder
/// included), so it imports none of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultSeq {
    /// A record: the seq of the faulty record, which is the seq expected
    /// at the offset (the last good seq + 1; a record whose own seq field
    /// is damaged or wrong is named by the seq it should have).
    Record(u64),
    /// No record: a seal, a commit mark, a missing seal, bytes after a seal
    /// or a checkpoint's point, right after the record with this seq (0:
    /// before the log's first record). No record is damaged there.
    After(u64),
    /// The records `first..=last`, walked whole, whose batch the frame at
    /// the offset (a commit mark that does not match them, or a seal) does
    /// not close as a valid commit mark would: none of them is vouched for.
    Batch {
        /// The batch's first seq.
        first: u64,
        /// The batch's last seq.
        last: u64,
    },
    /// A segment header (or a segment file that should be one): the seq
    /// the segment was expected to start at.
    Header(u64),
}

impl FaultSeq {
    /// The seq of the last record before the damage that the walk read
    /// whole: the record before the faulty one, the one the fault lies
    /// after, the one before the batch; `None` for a header, whose walk
    /// stopped in an earlier segment.
    pub fn last_walked(&self) -> Option<u64> {
        match *self {
            FaultSeq::Record(seq) => Some(seq.saturating_sub(1)),
            FaultSeq::After(seq) => Some(seq),
            FaultSeq::Batch { first, .. } => Some(first.saturating_sub(1)),
            FaultSeq::Header(_) => None,
        }
    }
}

impl fmt::Display for FaultSeq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FaultSeq::Record(seq) => write!(f, "seq {seq}"),
            FaultSeq::After(seq) => write!(f, "after seq {seq}"),
            FaultSeq::Batch { first, last } if first == last => write!(f, "batch of seq {first}"),
            FaultSeq::Batch { first, last } => write!(f, "batch of seqs {first}..={last}"),
            FaultSeq::Header(seq) => {
                write!(f, "header of the segment expected to start at seq {seq}")
            }
        }
    }
}

/// `ENOSPC` on Linux and the BSDs (macOS included).
const ENOSPC: i32 = 28;
/// `EDQUOT` on Linux (a disk quota is used up: no space for this user).
const EDQUOT: i32 = 122;

/// True when `error` says the disk is full or a quota is used up
/// (`ENOSPC`, `EDQUOT`, [`io::ErrorKind::StorageFull`],
/// [`io::ErrorKind::QuotaExceeded`]): the one rule for "no space", used by
/// the log and the media store.
pub fn is_no_space_error(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(ENOSPC | EDQUOT))
        || matches!(
            error.kind(),
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
        )
}

impl LogError {
    /// True when this is an `Io` error for a full disk or a used-up quota
    /// ([`is_no_space_error`]), so the engine can say "disk full" instead
    /// of a generic failure, and [`Log::heal`](crate::Log::heal) knows a
    /// refused write from any other failure.
    pub fn is_no_space(&self) -> bool {
        match self {
            LogError::Io { source, .. } => is_no_space_error(source),
            _ => false,
        }
    }

    /// A `Corrupt` error; `offset` is a position in a mapped segment.
    pub(crate) fn corrupt(
        segment: &str,
        offset: usize,
        seq: FaultSeq,
        reason: impl Into<String>,
    ) -> LogError {
        LogError::Corrupt {
            segment: segment.to_owned(),
            // usize is at most 64 bits on every target Rust supports.
            offset: offset as u64,
            seq,
            reason: reason.into(),
        }
    }

    /// An `Io` error for `op` on `path`.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> LogError {
        LogError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// A copy of this error for every submitter of a failed group-commit
    /// batch (`io::Error` is not `Clone`; the copy keeps the OS error code or
    /// the kind, and the message).
    pub(crate) fn duplicate(&self) -> LogError {
        match self {
            LogError::Io { op, path, source } => LogError::Io {
                op,
                path: path.clone(),
                source: match source.raw_os_error() {
                    Some(code) => io::Error::from_raw_os_error(code),
                    None => io::Error::new(source.kind(), source.to_string()),
                },
            },
            LogError::Corrupt {
                segment,
                offset,
                seq,
                reason,
            } => LogError::Corrupt {
                segment: segment.clone(),
                offset: *offset,
                seq: *seq,
                reason: reason.clone(),
            },
            LogError::UnsupportedVersion {
                segment,
                found,
                supported,
            } => LogError::UnsupportedVersion {
                segment: segment.clone(),
                found: *found,
                supported: *supported,
            },
            LogError::StrayFile { name } => LogError::StrayFile { name: name.clone() },
            LogError::RecordTooLarge { bytes, limit } => LogError::RecordTooLarge {
                bytes: *bytes,
                limit: *limit,
            },
            LogError::ReservedKind { kind } => LogError::ReservedKind { kind: *kind },
            LogError::Poisoned(message) => LogError::Poisoned(message.clone()),
            LogError::CompactionStale => LogError::CompactionStale,
            LogError::CompactionPending { journal } => LogError::CompactionPending {
                journal: journal.clone(),
            },
            LogError::CompactionJournalDamaged {
                journal,
                aside,
                reason,
            } => LogError::CompactionJournalDamaged {
                journal: journal.clone(),
                aside: aside.clone(),
                reason: reason.clone(),
            },
        }
    }
}

/// Why [`Log::open`](crate::Log::open) failed: the log itself, or the
/// caller's visitor refused a record (its error is handed back untouched).
#[derive(Debug)]
pub enum OpenError<E> {
    /// Recovery failed: corruption, an unsupported version, or I/O.
    Log(LogError),
    /// The visitor returned this error; open stopped at that record.
    Visit(E),
}

impl<E> From<LogError> for OpenError<E> {
    fn from(e: LogError) -> Self {
        OpenError::Log(e)
    }
}

impl From<OpenError<std::convert::Infallible>> for LogError {
    fn from(e: OpenError<std::convert::Infallible>) -> Self {
        match e {
            OpenError::Log(e) => e,
            OpenError::Visit(never) => match never {},
        }
    }
}

impl<E: fmt::Display> fmt::Display for OpenError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Log(e) => fmt::Display::fmt(e, f),
            OpenError::Visit(e) => write!(f, "replaying the log failed: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for OpenError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Log(e) => e.source(),
            OpenError::Visit(e) => Some(e),
        }
    }
}
