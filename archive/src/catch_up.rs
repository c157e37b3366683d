//! Bringing a local log directory up to a manifest (ARCHIVE.md "Epoch",
//! step 1, "Restore", "Replicas"): the one catch-up that `spark-replay
//! restore` / `verify --from` (into an empty directory, optionally cut at
//! a point), the engine's take-over and a read replica (at start and at
//! every manifest it follows) run.
//!
//! The local log must be a prefix of what the manifest names: every local
//! segment the archive holds sealed is equal to it (length and BLAKE3); the
//! local tail ends where an archived chunk ends, with that chunk's chain,
//! or inside one (a `sync`-mode writer merges runs of chunks), or is a
//! prefix of an archived sealed segment, or holds no op. Anything else is
//! refused ([`CatchUpError::Diverged`], naming the file and the object)
//! before anything is fetched or written. What the archive holds past it
//! is fetched, [`FETCH_CONCURRENCY`] objects at a time on the runtime's
//! threads (each checked against its entry's length and BLAKE3 there),
//! then, in log order, checked against the chain ([`verify_sealed`],
//! [`verify_chunk`]) and written durably ([`Fs::write_file_durably`]:
//! temporary file, fsync, rename, fsync of the directory): a sealed
//! segment as one file, the unsealed segment once its chunks are all
//! fetched (its local bytes, then the chunks' bodies).
//!
//! A read replica also follows a compaction in place
//! ([`Options::follow_compactions`], ARCHIVE.md "Replicas"): a local
//! segment that a compaction of the manifest lists (`compactions`) and
//! that still holds the listed old chain (its seal's, or for a segment the
//! local log held unsealed, the old chain it starts from) is replaced by
//! the rewritten object, fetched and checked as any other; a local tail
//! whose header names the old chain start is written anew from the
//! manifest's chunks, which must hold its records. Without the option
//! (restore, take-over) such a log is not a prefix and is refused.
//!
//! What each caller adds stays its own: the take-over's epoch claim, the
//! replica's fold, the restore's `--at` cut (a [`Keep`] answer from the
//! callback of [`Options::keep`], which sees every object once it is
//! checked, before it is written).

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures_util::StreamExt;
use spark_log_format::format::{
    chain_hex, decode_record, parse_segment_file_name, segment_file_name, ChainValue, RecordDecode,
    HEADER_CHAIN_START_OFFSET, KIND_SEAL, SEAL_RECORD_BYTES,
};
use spark_log_format::{Fs, DEFAULT_MAX_RECORD_BYTES, HEADER_LEN};

use crate::layout::{
    acknowledged_end, manifest_key, ChunkEntry, Manifest, ObjectError, SegmentEntry,
    CHUNK_HEADER_LEN,
};
use crate::verify::{verify_chunk, verify_sealed, SegmentChain};
use crate::{ArchiveStore, StoreError};

/// How many objects (sealed segments, chunks) are fetched at once. Bounded
/// because each may be a whole segment (64 MiB by default) held in memory
/// until it is written.
pub const FETCH_CONCURRENCY: usize = 6;

/// Why a local log is not a prefix of the manifest's history. Each names
/// the local file and, where there is one, the archive's object.
#[derive(Debug, thiserror::Error)]
pub enum Divergence {
    /// A local segment file starts where the archive has no segment start
    /// (before the archive's sealed segment `key`).
    #[error("the local log has segment {local} where the archive has {key}")]
    SegmentWhereArchiveHas {
        /// The local file name.
        local: String,
        /// The archive's sealed segment there.
        key: String,
    },
    /// A local segment file past everything the archive holds has ops.
    #[error("{} holds ops after the archive's last (seq {shipped_seq})", .path.display())]
    OpsAfterArchive {
        /// The local file.
        path: PathBuf,
        /// The manifest's last seq.
        shipped_seq: u64,
    },
    /// The local segment file where the archive's unsealed segment is
    /// starts at another seq.
    #[error("the local log has segment {local} where the archive's tail is segment {tail}")]
    SegmentWhereTail {
        /// The local file name.
        local: String,
        /// The file name of the archive's unsealed segment.
        tail: String,
    },
    /// The local log has a segment file after the archive's unsealed one.
    #[error("the local log has segment {local} after the archive's last")]
    SegmentAfterArchive {
        /// The local file name.
        local: String,
    },
    /// A local sealed segment is not the archive's (length or BLAKE3).
    #[error("the local sealed segment {} differs from the archive's {key}", .path.display())]
    SealedDiffers {
        /// The local file.
        path: PathBuf,
        /// The archive's object.
        key: String,
    },
    /// A local segment that is not sealed has later segment files.
    #[error("the local segment {} is not sealed, yet later segments follow it", .path.display())]
    UnsealedBeforeOthers {
        /// The local file.
        path: PathBuf,
    },
    /// A local unsealed segment is not a prefix of the archive's sealed one.
    #[error(
        "the local segment {} differs from the archive's {key} in its first {bytes} bytes",
        .path.display()
    )]
    PrefixDiffers {
        /// The local file.
        path: PathBuf,
        /// The archive's sealed segment.
        key: String,
        /// The local file's acknowledged bytes.
        bytes: usize,
    },
    /// The local file of the archive's unsealed segment is sealed.
    #[error("the local segment {} is sealed; the archive holds only part of it", .path.display())]
    SealedTail {
        /// The local file.
        path: PathBuf,
    },
    /// The local tail segment's header names another `chain_start`.
    #[error("the local segment {} starts from another chain than the archive's", .path.display())]
    TailChainStart {
        /// The local file.
        path: PathBuf,
    },
    /// The local tail segment holds more bytes than the archive's chunks.
    #[error(
        "the local segment {} holds {end} bytes, the archive {archived_end} of it: it holds ops \
         after the archive's last",
        .path.display()
    )]
    TailLonger {
        /// The local file.
        path: PathBuf,
        /// Its acknowledged bytes.
        end: u64,
        /// The bytes the archive's chunks hold of that segment.
        archived_end: u64,
    },
    /// The local tail's bytes before the chunk they end in do not give the
    /// chain that chunk starts from.
    #[error(
        "the local segment {} differs from the archive before byte {before} (chain {}, \
         archived {})",
        .path.display(),
        chain_hex(.local_chain),
        chain_hex(.archived_chain)
    )]
    TailChainBefore {
        /// The local file.
        path: PathBuf,
        /// The offset where that chunk starts.
        before: usize,
        /// The local chain there.
        local_chain: ChainValue,
        /// The chain the chunk starts from.
        archived_chain: ChainValue,
    },
    /// The local tail ends where a chunk ends, and its chain there is not
    /// the chunk's `chain_after`: the same bytes' length with other ops.
    #[error(
        "the local segment {} differs from the archive's chunk {key}: its chain at byte {end} is \
         {}, the chunk's is {}",
        .path.display(),
        chain_hex(.local_chain),
        chain_hex(.archived_chain)
    )]
    TailChainAtEnd {
        /// The local file.
        path: PathBuf,
        /// The chunk the local tail ends with.
        key: String,
        /// The local file's acknowledged bytes (the chunk's end).
        end: u64,
        /// The local chain at `end`.
        local_chain: ChainValue,
        /// The chunk's `chain_after`.
        archived_chain: ChainValue,
    },
    /// A local segment a compaction of the manifest lists does not hold
    /// the chain the compaction says it had before
    /// ([`Options::follow_compactions`]).
    #[error(
        "the local segment {} is not the one the archive's compaction at seq {record_seq} \
         rewrote: it holds chain {}, the compaction lists {}",
        .path.display(),
        chain_hex(.local_chain),
        chain_hex(.listed_chain)
    )]
    NotTheCompacted {
        /// The local file.
        path: PathBuf,
        /// The seq of the `log.compact` record that lists it.
        record_seq: u64,
        /// The local chain value (its seal's, or its `chain_start`).
        local_chain: ChainValue,
        /// The chain the compaction lists for it.
        listed_chain: ChainValue,
    },
    /// The local tail segment, re-chained by a compaction, holds records
    /// that the archive's tail (fetched from its start) does not begin
    /// with ([`Options::follow_compactions`]).
    #[error(
        "the local segment {} holds {bytes} bytes of records that the archive's re-chained \
         segment does not begin with",
        .path.display()
    )]
    RechainedTailDiffers {
        /// The local file.
        path: PathBuf,
        /// The local record bytes (after the header).
        bytes: usize,
    },
    /// The local tail ends inside a chunk whose body does not start with
    /// the local bytes.
    #[error(
        "the local segment {} differs from the archive's chunk {key} in its {bytes} bytes from \
         offset {offset}",
        .path.display()
    )]
    InsideChunkDiffers {
        /// The local file.
        path: PathBuf,
        /// The chunk.
        key: String,
        /// How many local bytes lie in the chunk.
        bytes: usize,
        /// The chunk's offset in its segment.
        offset: u64,
    },
}

/// Why [`catch_up`] failed.
#[derive(Debug, thiserror::Error)]
pub enum CatchUpError {
    /// The store could not be read, an object the manifest names is
    /// missing, or an object failed its check ([`StoreError::Damaged`],
    /// naming its key: its length or BLAKE3 against the entry, or
    /// [`verify_sealed`] / [`verify_chunk`] against the chain).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The manifest lists an object whose first seq is not the one after
    /// the object before it (checked for every object fetched).
    #[error("manifest {manifest}: {what} {key} starts at seq {first_seq}, expected {expected}")]
    OutOfOrder {
        /// The manifest's number.
        manifest: u64,
        /// The manifest's key.
        manifest_key: String,
        /// `segment` or `chunk`.
        what: &'static str,
        /// The object's key.
        key: String,
        /// Its first seq, as listed.
        first_seq: u64,
        /// The seq after the object before it (1 for the first).
        expected: u64,
    },
    /// The local log is not a prefix of the manifest's history; found
    /// before anything is fetched or written, but for what only the
    /// fetched object shows ([`Divergence::PrefixDiffers`],
    /// [`Divergence::InsideChunkDiffers`],
    /// [`Divergence::RechainedTailDiffers`]: the file it names is left as
    /// it was).
    #[error(transparent)]
    Diverged(#[from] Divergence),
    /// A local file or directory could not be read or written.
    #[error("{}: {source}", .path.display())]
    Local {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// An object [`catch_up`] fetched and checked, as [`Options::keep`] sees it
/// before it is written.
#[derive(Debug)]
pub struct Fetched<'a> {
    /// Its key.
    pub key: &'a str,
    /// The object's length in bytes, as fetched.
    pub object_bytes: u64,
    /// Seq of its first record.
    pub first_seq: u64,
    /// The segment bytes it adds: a sealed segment's whole object (header
    /// included), a chunk's body (which holds the segment header when its
    /// offset is 0).
    pub bytes: &'a [u8],
    /// Where its records start in `bytes`: [`HEADER_LEN`] for a sealed
    /// segment or a chunk at offset 0, else 0.
    pub records_from: usize,
}

/// What [`Options::keep`] answers for an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Write all of it and go on.
    All,
    /// Write its first `n` bytes ([`Fetched::bytes`]) and stop: nothing
    /// after is fetched or written. A segment file that would hold no
    /// record (`n` at most [`Fetched::records_from`], no local bytes before
    /// it) is not written.
    Upto(usize),
}

/// The callback of [`Options::keep`].
pub type KeepFn<'a> = dyn FnMut(&Fetched<'_>) -> Keep + Send + 'a;

/// How [`catch_up`] runs.
#[derive(Default)]
pub struct Options<'a> {
    /// Accept a local log that holds more than the manifest after a prefix
    /// of it (its own ops, not shipped yet: the shipper's start checks
    /// them); without it such a log is [`CatchUpError::Diverged`].
    pub allow_more: bool,
    /// Called with every object fetched, once checked and before it is
    /// written (in log order); its answer may stop the catch-up at a point
    /// ([`Keep::Upto`]). Meant for an empty local log (a restore `--at`).
    pub keep: Option<&'a mut KeepFn<'a>>,
    /// Follow the compactions the manifest applies (its `compactions`,
    /// relative to the manifest the local log was brought to before): a
    /// local segment they list that holds the listed old chain is replaced
    /// by the rewritten object, and a local tail they re-chained is
    /// written anew from the manifest's chunks (see the module doc). Only
    /// a read replica sets it: its cache follows the archive manifest by
    /// manifest. Without it such a log is [`CatchUpError::Diverged`].
    pub follow_compactions: bool,
}

/// One segment file [`catch_up`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenSegment {
    /// Its file name in the log directory.
    pub name: String,
    /// The objects its bytes came from, in order: key, and the offset in
    /// the segment where the object's bytes start.
    pub objects: Vec<(String, u64)>,
}

/// What [`catch_up`] did.
#[derive(Debug, Default)]
pub struct CaughtUp {
    /// The segment files written, in log order.
    pub segments: Vec<WrittenSegment>,
    /// How many objects were fetched and checked.
    pub objects: usize,
    /// Their bytes.
    pub object_bytes: u64,
    /// Whether [`Options::keep`] stopped it.
    pub stopped: bool,
    /// The merged chunk the local tail ended inside, fetched whole, if any
    /// (the callers log it).
    pub merged_chunk: Option<String>,
    /// The local segment files replaced because a compaction the manifest
    /// applies rewrote or re-chained them (their file names, in log order;
    /// [`Options::follow_compactions`]).
    pub compacted: Vec<String>,
}

/// Brings the local log in `log_dir` (which must exist) to what `manifest`
/// names (`None`: an empty archive), as the module doc says; records in
/// local files are read with `max_record_bytes`.
///
/// Errors: [`CatchUpError`]. On an error, the files written before it
/// stay (each whole); a refusal ([`CatchUpError::Diverged`]) writes
/// nothing.
pub async fn catch_up(
    store: &ArchiveStore,
    fs: &dyn Fs,
    log_dir: &Path,
    manifest: Option<&Manifest>,
    max_record_bytes: u32,
    options: Options<'_>,
) -> Result<CaughtUp, CatchUpError> {
    let empty = Manifest::empty();
    let manifest = manifest.unwrap_or(&empty);
    let compacted = if options.follow_compactions {
        Compacted::of(manifest)
    } else {
        Compacted::default()
    };
    let plan = plan(
        fs,
        log_dir,
        manifest,
        max_record_bytes,
        options.allow_more,
        &compacted,
    )?;
    let mut wanted: Vec<(String, u64, [u8; 32])> = plan
        .sealed
        .iter()
        .map(|s| (s.entry.key.clone(), s.entry.bytes, s.entry.blake3))
        .collect();
    if let Some(tail) = &plan.tail {
        wanted.extend(
            tail.fetch()
                .map(|(c, _)| (c.key.clone(), c.bytes, c.blake3)),
        );
    }
    let mut run = Run {
        fs,
        log_dir,
        manifest,
        manifest_key: manifest_key(store.prefix(), manifest.number),
        keep: options.keep,
        fetched: Box::pin(fetch_in_order(store, wanted)),
        report: CaughtUp::default(),
    };
    for step in plan.sealed {
        if run.sealed(step).await? {
            return Ok(run.report);
        }
    }
    if let Some(tail) = plan.tail {
        run.tail(tail).await?;
    }
    Ok(run.report)
}

/// Fetches the objects `(key, bytes, blake3)` (checked against their
/// length and BLAKE3), each on its own task, at most [`FETCH_CONCURRENCY`]
/// at once, yielding them in order. A task still running when the stream
/// is dropped is aborted.
fn fetch_in_order(
    store: &ArchiveStore,
    wanted: Vec<(String, u64, [u8; 32])>,
) -> impl futures_util::Stream<Item = Result<Bytes, StoreError>> + Send + 'static {
    let store = store.clone();
    futures_util::stream::iter(wanted)
        .map(move |(key, bytes, blake3)| {
            let store = store.clone();
            let task = AbortOnDrop(tokio::spawn({
                let key = key.clone();
                async move { store.get_listed(&key, bytes, &blake3).await }
            }));
            async move {
                let mut task = task;
                (&mut task.0).await.unwrap_or_else(|e| {
                    Err(StoreError::Unreachable {
                        key,
                        message: format!("a fetch did not finish: {e}"),
                    })
                })
            }
        })
        .buffered(FETCH_CONCURRENCY)
}

/// A fetch task, aborted when dropped unfinished.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A local segment's acknowledged bytes, its first seq, whether it is
/// sealed, and whether it holds any record.
struct LocalSegment {
    path: PathBuf,
    bytes: Vec<u8>,
    end: usize,
    sealed: bool,
    has_records: bool,
}

fn local(path: &Path, source: std::io::Error) -> CatchUpError {
    CatchUpError::Local {
        path: path.to_owned(),
        source,
    }
}

/// The segment files of the local log, by first seq.
fn local_segments(fs: &dyn Fs, log_dir: &Path) -> Result<Vec<u64>, CatchUpError> {
    let mut firsts: Vec<u64> = fs
        .list(log_dir)
        .map_err(|e| local(log_dir, e))?
        .iter()
        .filter_map(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .and_then(parse_segment_file_name)
        })
        .collect();
    firsts.sort_unstable();
    Ok(firsts)
}

fn read_local(
    fs: &dyn Fs,
    log_dir: &Path,
    first: u64,
    max_record_bytes: u32,
) -> Result<LocalSegment, CatchUpError> {
    let path = log_dir.join(segment_file_name(first));
    let bytes = fs
        .map(&path)
        .map(|view| (*view).as_ref().to_vec())
        .map_err(|e| local(&path, e))?;
    if bytes.len() < HEADER_LEN {
        return Ok(LocalSegment {
            path,
            bytes,
            end: 0,
            sealed: false,
            has_records: false,
        });
    }
    let end = acknowledged_end(&bytes, HEADER_LEN, first - 1, u64::MAX, max_record_bytes);
    Ok(LocalSegment {
        path,
        bytes,
        end: end.offset,
        sealed: end.sealed,
        has_records: end.last_seq >= first,
    })
}

/// The segments the compactions of a manifest list
/// ([`Options::follow_compactions`]), composed in log order: by first seq,
/// the chain the first compaction listing it says it had before (the chain
/// a local copy made before them holds) and that compaction's record seq.
#[derive(Default)]
struct Compacted {
    old: std::collections::HashMap<u64, (ChainValue, u64)>,
}

impl Compacted {
    fn of(manifest: &Manifest) -> Compacted {
        let mut old = std::collections::HashMap::new();
        for compaction in &manifest.compactions {
            for segment in &compaction.segments {
                old.entry(segment.first_seq)
                    .or_insert((segment.old_chain_end, compaction.record_seq));
            }
        }
        Compacted { old }
    }

    /// The chain segment `first_seq` had before the compactions, and the
    /// first one's record seq; `None` when none lists it.
    fn old(&self, first_seq: u64) -> Option<(ChainValue, u64)> {
        self.old.get(&first_seq).copied()
    }

    fn any(&self) -> bool {
        !self.old.is_empty()
    }
}

/// The chain value a local sealed segment's seal holds (its last record),
/// `None` when its last bytes are not a seal.
fn seal_chain(local: &LocalSegment) -> Option<ChainValue> {
    let at = local.end.checked_sub(SEAL_RECORD_BYTES)?;
    match decode_record(&local.bytes[..local.end], at, DEFAULT_MAX_RECORD_BYTES) {
        RecordDecode::Record { record, .. } if record.kind == KIND_SEAL => {
            record.payload.try_into().ok()
        }
        _ => None,
    }
}

/// The `chain_start` a local segment's header names (zeros when it holds
/// less than a header).
fn chain_start_of(local: &LocalSegment) -> ChainValue {
    local
        .bytes
        .get(HEADER_CHAIN_START_OFFSET..HEADER_LEN)
        .and_then(|b| b.try_into().ok())
        .unwrap_or([0; 32])
}

/// What the local log lacks, found before anything is fetched.
struct Plan<'m> {
    sealed: Vec<SealedStep<'m>>,
    tail: Option<TailStep<'m>>,
}

/// A sealed segment of the archive to fetch: missing locally, or a local
/// prefix of it (`here`) to complete.
struct SealedStep<'m> {
    entry: &'m SegmentEntry,
    chain_before: ChainValue,
    here: Option<LocalSegment>,
    /// The seq after the entry before it.
    expected_seq: u64,
    /// The local file a compaction rewrote or re-chained is replaced
    /// ([`Options::follow_compactions`]); with `here`, only its records
    /// (the bytes after the header) must be a prefix of the archive's.
    compacted: bool,
}

/// The archive's chunks to append to the local tail segment.
struct TailStep<'m> {
    chunks: &'m [ChunkEntry],
    /// The seq the first chunk fetched must start at (see
    /// [`TailStep::fetch`]).
    expected_seq: u64,
    chain_start: ChainValue,
    path: PathBuf,
    /// The local bytes kept, up to where the first chunk fetched starts.
    bytes: Vec<u8>,
    /// The chunk the local bytes end inside, and the local bytes in it.
    inside: Option<(String, Vec<u8>)>,
    /// A local tail a compaction re-chained (its header names the old
    /// chain start): its records (the bytes after the header), which the
    /// archive's tail, fetched from offset 0, must begin with.
    rechained: Option<Vec<u8>>,
}

impl<'m> TailStep<'m> {
    /// The chunks to fetch, each with the seq it must start at.
    fn fetch(&self) -> impl Iterator<Item = (&'m ChunkEntry, u64)> + '_ {
        let have = self.bytes.len() as u64;
        let mut expected = self.expected_seq;
        self.chunks.iter().filter_map(move |c| {
            let this = expected;
            expected = c.last_seq + 1;
            (c.offset >= have).then_some((c, this))
        })
    }
}

/// Compares the local log with `manifest` (reading only local files) and
/// finds what to fetch; refuses a local log that is not a prefix.
fn plan<'m>(
    fs: &dyn Fs,
    log_dir: &Path,
    manifest: &'m Manifest,
    max_record_bytes: u32,
    allow_more: bool,
    compacted: &Compacted,
) -> Result<Plan<'m>, CatchUpError> {
    let locals = local_segments(fs, log_dir)?;
    let mut locals = locals.iter().copied().peekable();
    let mut chain: ChainValue = [0; 32];
    // The chain before the compactions the manifest applies (the chain a
    // local copy made before them holds): `chain` but where they changed it.
    let mut old_chain: ChainValue = [0; 32];
    let mut next_seq = 1;
    let mut sealed = Vec::new();
    for entry in &manifest.segments {
        let expected_seq = next_seq;
        next_seq = entry.last_seq + 1;
        let chain_before = chain;
        chain = entry.chain_end;
        let old_chain_before = old_chain;
        let listed = compacted.old(entry.first_seq);
        old_chain = listed.map_or(entry.chain_end, |(old, _)| old);
        let here = match locals.peek() {
            Some(&first) if first == entry.first_seq => {
                locals.next();
                Some(read_local(fs, log_dir, first, max_record_bytes)?)
            }
            Some(&first) if first < entry.first_seq => {
                return Err(Divergence::SegmentWhereArchiveHas {
                    local: segment_file_name(first),
                    key: entry.key.clone(),
                }
                .into())
            }
            _ => None,
        };
        if let Some(local) = &here {
            if local.sealed {
                let same = local.end as u64 == entry.bytes
                    && *blake3::hash(&local.bytes[..local.end]).as_bytes() == entry.blake3;
                if same {
                    continue;
                }
                // Rewritten by a compaction the manifest applies: the
                // local copy must be the one it rewrote.
                let Some((listed_chain, record_seq)) = listed else {
                    return Err(Divergence::SealedDiffers {
                        path: local.path.clone(),
                        key: entry.key.clone(),
                    }
                    .into());
                };
                let local_chain = seal_chain(local).unwrap_or([0; 32]);
                if local_chain != listed_chain {
                    return Err(Divergence::NotTheCompacted {
                        path: local.path.clone(),
                        record_seq,
                        local_chain,
                        listed_chain,
                    }
                    .into());
                }
                sealed.push(SealedStep {
                    entry,
                    chain_before,
                    here: None,
                    expected_seq,
                    compacted: true,
                });
                continue;
            }
            if locals.peek().is_some() {
                return Err(Divergence::UnsealedBeforeOthers {
                    path: local.path.clone(),
                }
                .into());
            }
        }
        // A local prefix of a segment a compaction sealed and rewrote
        // (listed: its records may have changed, so it is replaced whole,
        // as the archive checks it), or one that starts from the chain
        // before the compactions (re-chained: its records must be a prefix
        // of the archive's).
        let start = here
            .as_ref()
            .filter(|local| local.has_records)
            .map(chain_start_of);
        let rechained = compacted.any()
            && start.is_some_and(|start| start != chain_before && start == old_chain_before);
        let (here, compacted_here) = match (here, listed) {
            (Some(_), Some(_)) if start == Some(chain_before) || rechained => (None, true),
            (Some(local), None) if rechained => (Some(local), true),
            (here, _) => (here, false),
        };
        sealed.push(SealedStep {
            entry,
            chain_before,
            here,
            expected_seq,
            compacted: compacted_here,
        });
    }
    let Some(first_chunk) = manifest.chunks.first() else {
        // Past the archive: only the engine's next segment, still empty.
        for first in locals {
            let rest = read_local(fs, log_dir, first, max_record_bytes)?;
            if rest.has_records && !allow_more {
                return Err(Divergence::OpsAfterArchive {
                    path: rest.path,
                    shipped_seq: manifest.shipped_seq,
                }
                .into());
            }
        }
        return Ok(Plan { sealed, tail: None });
    };
    let segment = first_chunk.segment_first_seq;
    let here = match locals.next() {
        Some(first) if first == segment => Some(read_local(fs, log_dir, first, max_record_bytes)?),
        Some(first) => {
            return Err(Divergence::SegmentWhereTail {
                local: segment_file_name(first),
                tail: segment_file_name(segment),
            }
            .into())
        }
        None => None,
    };
    if let Some(after) = locals.next() {
        if allow_more {
            return Ok(Plan { sealed, tail: None });
        }
        return Err(Divergence::SegmentAfterArchive {
            local: segment_file_name(after),
        }
        .into());
    }
    let old_chain_start = compacted.any().then_some(old_chain);
    let tail = plan_tail(
        log_dir,
        &manifest.chunks,
        (chain, old_chain_start),
        next_seq,
        here,
        allow_more,
    )?;
    Ok(Plan { sealed, tail })
}

/// The archive's tail chunks against the local tail segment (`here`, when
/// the local log has it): the local bytes must end where a chunk ends, with
/// that chunk's chain, or inside a chunk (one a `sync`-mode writer merged),
/// whose start they reach with the chain before it and whose body starts
/// with the local bytes after that (checked once it is fetched); the
/// chunks after (and that one) are to be fetched. `None`: nothing to do
/// (with `allow_more`, a local tail that is sealed or longer). A local
/// tail whose header names `old_chain_start` (the chain start before the
/// compactions the manifest applies, when it applies some that are
/// followed) is re-chained: the chunks are fetched from offset 0 and must
/// begin with its records.
fn plan_tail<'m>(
    log_dir: &Path,
    chunks: &'m [ChunkEntry],
    (chain_start, old_chain_start): (ChainValue, Option<ChainValue>),
    expected_seq: u64,
    here: Option<LocalSegment>,
    allow_more: bool,
) -> Result<Option<TailStep<'m>>, CatchUpError> {
    let first = &chunks[0];
    let archived_end = chunks.last().map_or(0, |c| c.offset + body_bytes(c));
    if allow_more
        && here
            .as_ref()
            .is_some_and(|l| l.sealed || l.end as u64 > archived_end)
    {
        return Ok(None);
    }
    let mut step = TailStep {
        chunks,
        expected_seq,
        chain_start,
        path: log_dir.join(segment_file_name(first.segment_first_seq)),
        bytes: Vec::new(),
        inside: None,
        rechained: None,
    };
    let Some(local) = here.filter(|l| l.has_records || l.sealed) else {
        return Ok(Some(step));
    };
    if local.sealed {
        return Err(Divergence::SealedTail { path: local.path }.into());
    }
    let local_start = chain_start_of(&local);
    let rechained = local_start != chain_start && Some(local_start) == old_chain_start;
    if local_start != chain_start && !rechained {
        return Err(Divergence::TailChainStart { path: local.path }.into());
    }
    let end = local.end as u64;
    if end > archived_end {
        return Err(Divergence::TailLonger {
            path: local.path,
            end,
            archived_end,
        }
        .into());
    }
    if rechained {
        // Written anew from the archive's chunks, all of them.
        step.rechained = Some(local.bytes[HEADER_LEN..local.end].to_vec());
        return Ok(Some(step));
    }
    // The listed chunk the local bytes end in (or at the end of): a
    // `sync`-mode writer merges runs of chunks (ARCHIVE.md "Sync mode"), so
    // the local tail may end inside one. The local bytes before it must
    // give the chain it starts from; it is fetched (checked like any other)
    // and must start with the local bytes after that.
    let at = chunks
        .iter()
        .position(|c| c.offset + body_bytes(c) >= end)
        .expect("end is within the archived bytes");
    let chunk = &chunks[at];
    let before = chunk.offset as usize;
    let chain_before = match at {
        0 => chain_start,
        _ => chunks[at - 1].chain_after,
    };
    let local_chain =
        SegmentChain::after(chain_start, &local.bytes[..before.min(local.end)]).chain();
    if local_chain != chain_before || before > local.end {
        return Err(Divergence::TailChainBefore {
            path: local.path,
            before,
            local_chain,
            archived_chain: chain_before,
        }
        .into());
    }
    if end == chunk.offset + body_bytes(chunk) {
        // Ending where the chunk ends, the local bytes in it must give its
        // `chain_after` (ARCHIVE.md "Chunk"): the same length with other
        // ops is another history, even when it is the archive's last chunk.
        let local_chain = SegmentChain::after(chain_start, &local.bytes[..local.end]).chain();
        if local_chain != chunk.chain_after {
            return Err(Divergence::TailChainAtEnd {
                path: local.path,
                key: chunk.key.clone(),
                end,
                local_chain,
                archived_chain: chunk.chain_after,
            }
            .into());
        }
        step.bytes = local.bytes[..local.end].to_vec();
    } else {
        step.bytes = local.bytes[..before].to_vec();
        step.inside = Some((chunk.key.clone(), local.bytes[before..local.end].to_vec()));
    }
    Ok(Some(step))
}

/// The body bytes of a chunk: its object less the header.
fn body_bytes(chunk: &ChunkEntry) -> u64 {
    chunk.bytes - CHUNK_HEADER_LEN as u64
}

/// The fetch-check-write part of a catch-up.
struct Run<'a, 'k, S> {
    fs: &'a dyn Fs,
    log_dir: &'a Path,
    manifest: &'a Manifest,
    manifest_key: String,
    keep: Option<&'k mut KeepFn<'k>>,
    fetched: std::pin::Pin<Box<S>>,
    report: CaughtUp,
}

impl<S: futures_util::Stream<Item = Result<Bytes, StoreError>>> Run<'_, '_, S> {
    /// The next object fetched, counted.
    async fn next(&mut self) -> Result<Bytes, CatchUpError> {
        let object = self
            .fetched
            .next()
            .await
            .expect("one fetch per object to fetch")?;
        self.report.objects += 1;
        self.report.object_bytes += object.len() as u64;
        Ok(object)
    }

    fn in_order(
        &self,
        what: &'static str,
        key: &str,
        first_seq: u64,
        expected: u64,
    ) -> Result<(), CatchUpError> {
        if first_seq == expected {
            return Ok(());
        }
        Err(CatchUpError::OutOfOrder {
            manifest: self.manifest.number,
            manifest_key: self.manifest_key.clone(),
            what,
            key: key.to_owned(),
            first_seq,
            expected,
        })
    }

    fn keep(&mut self, fetched: &Fetched<'_>) -> Keep {
        self.keep.as_mut().map_or(Keep::All, |keep| keep(fetched))
    }

    fn write(&self, name: &str, bytes: &[u8]) -> Result<(), CatchUpError> {
        let path = self.log_dir.join(name);
        self.fs
            .write_file_durably(&path, bytes)
            .map_err(|e| local(&path, e))
    }

    /// Fetches, checks and writes one sealed segment (completing a local
    /// prefix of it, if `here`). Returns whether [`Options::keep`] stopped
    /// the catch-up.
    async fn sealed(&mut self, step: SealedStep<'_>) -> Result<bool, CatchUpError> {
        let entry = step.entry;
        let archived = self.next().await?;
        self.in_order("segment", &entry.key, entry.first_seq, step.expected_seq)?;
        verify_sealed(entry, &archived, &step.chain_before).map_err(|e| damaged(&entry.key, e))?;
        if let Some(local) = &step.here {
            // A re-chained segment's header changed; its records did not.
            let from = if step.compacted { HEADER_LEN } else { 0 };
            if local.has_records
                && archived.get(from..local.end) != local.bytes.get(from..local.end)
            {
                return Err(Divergence::PrefixDiffers {
                    path: local.path.clone(),
                    key: entry.key.clone(),
                    bytes: local.end,
                }
                .into());
            }
        }
        let keep = self.keep(&Fetched {
            key: &entry.key,
            object_bytes: archived.len() as u64,
            first_seq: entry.first_seq,
            bytes: &archived,
            records_from: HEADER_LEN,
        });
        let kept = match keep {
            Keep::All => archived.len(),
            Keep::Upto(n) => n.min(archived.len()),
        };
        let stopped = keep != Keep::All;
        self.report.stopped = stopped;
        if stopped && kept <= HEADER_LEN && step.here.is_none() {
            return Ok(true);
        }
        let name = segment_file_name(entry.first_seq);
        self.write(&name, &archived[..kept])?;
        if step.compacted {
            self.report.compacted.push(name.clone());
        }
        self.report.segments.push(WrittenSegment {
            name,
            objects: vec![(entry.key.clone(), 0)],
        });
        Ok(stopped)
    }

    /// Fetches, checks and appends the tail's chunks, then writes the
    /// segment file once.
    async fn tail(&mut self, step: TailStep<'_>) -> Result<(), CatchUpError> {
        let local_bytes = step.bytes.len();
        let mut running = SegmentChain::after(step.chain_start, &step.bytes);
        let fetch: Vec<(&ChunkEntry, u64)> = step.fetch().collect();
        let segment_first_seq = step.chunks[0].segment_first_seq;
        let TailStep {
            path,
            mut bytes,
            mut inside,
            rechained,
            ..
        } = step;
        let mut objects = Vec::new();
        for (entry, expected_seq) in fetch {
            let object = self.next().await?;
            self.in_order("chunk", &entry.key, entry.first_seq, expected_seq)?;
            let checked =
                verify_chunk(entry, &object, &running).map_err(|e| damaged(&entry.key, e))?;
            let body = checked.body;
            if let Some((key, local_part)) = inside.take() {
                if key != entry.key || !body.starts_with(&local_part) {
                    return Err(Divergence::InsideChunkDiffers {
                        path,
                        key: entry.key.clone(),
                        bytes: local_part.len(),
                        offset: checked.header.offset,
                    }
                    .into());
                }
                self.report.merged_chunk = Some(entry.key.clone());
            }
            let keep = self.keep(&Fetched {
                key: &entry.key,
                object_bytes: object.len() as u64,
                first_seq: entry.first_seq,
                bytes: body,
                records_from: if checked.header.offset == 0 {
                    HEADER_LEN
                } else {
                    0
                },
            });
            running = checked.after;
            objects.push((entry.key.clone(), checked.header.offset));
            match keep {
                Keep::All => bytes.extend_from_slice(body),
                Keep::Upto(n) => {
                    bytes.extend_from_slice(&body[..n.min(body.len())]);
                    self.report.stopped = true;
                    break;
                }
            }
        }
        if objects.is_empty()
            || (self.report.stopped && local_bytes == 0 && bytes.len() <= HEADER_LEN)
        {
            return Ok(());
        }
        let name = segment_file_name(segment_first_seq);
        if let Some(records) = &rechained {
            if bytes.get(HEADER_LEN..HEADER_LEN + records.len()) != Some(&records[..]) {
                return Err(Divergence::RechainedTailDiffers {
                    path,
                    bytes: records.len(),
                }
                .into());
            }
            self.report.compacted.push(name.clone());
        }
        self.write(&name, &bytes)?;
        self.report.segments.push(WrittenSegment { name, objects });
        Ok(())
    }
}

/// An object that failed its check, naming its key.
fn damaged(key: &str, source: ObjectError) -> CatchUpError {
    CatchUpError::Store(StoreError::Damaged {
        key: key.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;
    use spark_log_format::format::{
        encode_commit, encode_record, encode_seal, CommitMark, RecordIn, SegmentHeader,
    };
    use spark_log_format::MemFs;

    use super::*;
    use crate::layout::{chunk_key, segment_key, ChunkHeader};

    const LOG: &str = "/data/log";

    /// A segment's bytes from `chain_start`: its header, then one op per
    /// seq of `first..=last`, each in a batch of its own (op, commit mark),
    /// with `payload`. Returns the bytes and the offset after each batch.
    fn segment(
        first: u64,
        last: u64,
        chain_start: ChainValue,
        payload: &[u8],
    ) -> (Vec<u8>, Vec<usize>) {
        let mut bytes = SegmentHeader {
            first_seq: first,
            created_ms: 1,
            chain_start,
        }
        .encode()
        .to_vec();
        let mut ends = Vec::new();
        for seq in first..=last {
            let start = bytes.len();
            let record = RecordIn {
                ts_ms: seq,
                kind: 1,
                kind_version: 1,
                payload,
            };
            encode_record(&mut bytes, seq, &record).unwrap();
            let mark = CommitMark::for_batch(&bytes[start..], 1);
            encode_commit(&mut bytes, seq, seq, &mark);
            ends.push(bytes.len());
        }
        (bytes, ends)
    }

    /// A sealed segment of seqs `first..=last` after `chain_start`: its
    /// entry and bytes.
    fn sealed(first: u64, last: u64, chain_start: ChainValue) -> (SegmentEntry, Vec<u8>) {
        sealed_with(first, last, chain_start, b"an op")
    }

    /// [`sealed`] with each op's `payload`.
    fn sealed_with(
        first: u64,
        last: u64,
        chain_start: ChainValue,
        payload: &[u8],
    ) -> (SegmentEntry, Vec<u8>) {
        let (mut bytes, _) = segment(first, last, chain_start, payload);
        let end = SegmentChain::after(chain_start, &bytes).chain();
        encode_seal(&mut bytes, last, 9, &end);
        let entry = SegmentEntry {
            key: segment_key("p", first, 1),
            first_seq: first,
            last_seq: last,
            bytes: bytes.len() as u64,
            blake3: *blake3::hash(&bytes).as_bytes(),
            chain_end: end,
        };
        (entry, bytes)
    }

    /// What [`archive`] stored: the manifest and each segment file's whole
    /// bytes, by first seq.
    struct Archived {
        store: ArchiveStore,
        manifest: Manifest,
        files: Vec<(u64, Vec<u8>)>,
    }

    /// An archive of seqs 1..=12: sealed segments 1..=4 and 5..=8, then the
    /// unsealed segment 9 in two chunks (9..=10, 11..=12).
    async fn archive() -> Archived {
        let store = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
        let (first, first_bytes) = sealed(1, 4, [0; 32]);
        let (second, second_bytes) = sealed(5, 8, first.chain_end);
        let (tail, ends) = segment(9, 12, second.chain_end, b"an op");
        let mut chain = SegmentChain::start(second.chain_end);
        let mut chunks = Vec::new();
        let mut objects = Vec::new();
        for (from, to, end) in [(9, 10, ends[1]), (11, 12, ends[3])] {
            let offset = chain.offset();
            let body = &tail[offset as usize..end];
            let before = chain.chain();
            chain = SegmentChain::after(second.chain_end, &tail[..end]);
            let object = ChunkHeader {
                epoch: 1,
                first_seq: from,
                last_seq: to,
                segment_first_seq: 9,
                offset,
                body_bytes: body.len() as u64,
                body_crc: crc32fast::hash(body),
                chain_before: before,
                chain_after: chain.chain(),
            }
            .encode(body);
            chunks.push(ChunkEntry {
                key: chunk_key("p", from, to, 1),
                epoch: 1,
                segment_first_seq: 9,
                first_seq: from,
                last_seq: to,
                offset,
                bytes: object.len() as u64,
                blake3: *blake3::hash(&object).as_bytes(),
                chain_after: chain.chain(),
            });
            objects.push(object);
        }
        for (key, bytes) in [
            (&first.key, &first_bytes),
            (&second.key, &second_bytes),
            (&chunks[0].key, &objects[0]),
            (&chunks[1].key, &objects[1]),
        ] {
            store
                .put_create(key, Bytes::from(bytes.clone()))
                .await
                .unwrap();
        }
        let manifest = Manifest {
            number: 1,
            epoch: 1,
            written_ms: 1,
            shipped_seq: 12,
            shipped_chain: chain.chain(),
            segments: vec![first, second],
            chunks,
            ..Manifest::empty()
        };
        Archived {
            store,
            manifest,
            files: vec![(1, first_bytes), (5, second_bytes), (9, tail)],
        }
    }

    fn log_fs() -> MemFs {
        let fs = MemFs::new();
        fs.create_dir_all(Path::new(LOG)).unwrap();
        fs
    }

    fn read(fs: &MemFs, first: u64) -> Vec<u8> {
        let path = Path::new(LOG).join(segment_file_name(first));
        (*fs.map(&path).unwrap()).as_ref().to_vec()
    }

    fn files(fs: &MemFs) -> Vec<u64> {
        local_segments(fs, Path::new(LOG)).unwrap()
    }

    async fn run(
        archived: &Archived,
        fs: &MemFs,
        manifest: &Manifest,
        options: Options<'_>,
    ) -> Result<CaughtUp, CatchUpError> {
        catch_up(
            &archived.store,
            fs,
            Path::new(LOG),
            Some(manifest),
            spark_log_format::DEFAULT_MAX_RECORD_BYTES,
            options,
        )
        .await
    }

    #[tokio::test]
    async fn an_empty_local_log_catches_up_fully() {
        let archived = archive().await;
        let fs = log_fs();
        let caught = run(&archived, &fs, &archived.manifest, Options::default())
            .await
            .unwrap();
        for (first, bytes) in &archived.files {
            assert_eq!(&read(&fs, *first), bytes, "segment {first}");
        }
        assert_eq!(files(&fs), vec![1, 5, 9]);
        assert_eq!(caught.objects, 4);
        assert!(!caught.stopped);
        let names: Vec<&str> = caught.segments.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [1, 5, 9]
                .map(segment_file_name)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
        );
        let tail = &caught.segments[2].objects;
        assert_eq!(tail.len(), 2);
        assert_eq!(tail[0], (archived.manifest.chunks[0].key.clone(), 0));
        // Again: nothing left to fetch.
        let again = run(&archived, &fs, &archived.manifest, Options::default())
            .await
            .unwrap();
        assert_eq!(again.objects, 0);
        assert!(again.segments.is_empty());
    }

    #[tokio::test]
    async fn a_local_prefix_is_completed_from_the_archive() {
        let archived = archive().await;
        let fs = log_fs();
        let log = Path::new(LOG);
        // Segment 1 whole, segment 5 up to seq 6 (not sealed yet).
        let (_, second) = &archived.files[1];
        let (_, ends) = segment(5, 8, archived.manifest.segments[0].chain_end, b"an op");
        fs.insert_durable(&log.join(segment_file_name(1)), &archived.files[0].1);
        fs.insert_durable(&log.join(segment_file_name(5)), &second[..ends[1]]);
        let caught = run(&archived, &fs, &archived.manifest, Options::default())
            .await
            .unwrap();
        // Segment 5 and both chunks; segment 1 is not fetched.
        assert_eq!(caught.objects, 3);
        for (first, bytes) in &archived.files {
            assert_eq!(&read(&fs, *first), bytes, "segment {first}");
        }
    }

    #[tokio::test]
    async fn a_local_log_that_is_not_a_prefix_is_refused_and_nothing_is_written() {
        let archived = archive().await;
        let log = Path::new(LOG);
        // A sealed segment 1 of other ops.
        let fs = log_fs();
        let (other, _) = segment(1, 4, [0; 32], b"another op");
        let mut other_sealed = other.clone();
        let end = SegmentChain::after([0; 32], &other).chain();
        encode_seal(&mut other_sealed, 4, 9, &end);
        fs.insert_durable(&log.join(segment_file_name(1)), &other_sealed);
        let err = run(&archived, &fs, &archived.manifest, Options::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CatchUpError::Diverged(Divergence::SealedDiffers { key, .. })
                if *key == archived.manifest.segments[0].key),
            "{err}"
        );
        assert!(
            err.to_string().contains("differs from the archive's"),
            "{err}"
        );
        assert_eq!(files(&fs), vec![1]);

        // A local tail past the archive's last op.
        let fs = log_fs();
        fs.insert_durable(&log.join(segment_file_name(1)), &archived.files[0].1);
        fs.insert_durable(&log.join(segment_file_name(5)), &archived.files[1].1);
        let (longer, _) = segment(9, 13, archived.manifest.segments[1].chain_end, b"an op");
        fs.insert_durable(&log.join(segment_file_name(9)), &longer);
        let err = run(&archived, &fs, &archived.manifest, Options::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CatchUpError::Diverged(Divergence::TailLonger { .. })),
            "{err}"
        );
        assert_eq!(read(&fs, 9), longer);
        // With `allow_more` (its own ops, not shipped yet) it is left as it is.
        let caught = run(
            &archived,
            &fs,
            &archived.manifest,
            Options {
                allow_more: true,
                keep: None,
                follow_compactions: false,
            },
        )
        .await
        .unwrap();
        assert_eq!(caught.objects, 0);
        assert_eq!(read(&fs, 9), longer);

        // The local tail differs before the chunk it ends inside (seq 9
        // is another op of the same length): refused before anything is
        // fetched or written, naming the file.
        let fs = log_fs();
        let (other_tail, ends) = segment(9, 11, archived.manifest.segments[1].chain_end, b"an Op");
        fs.insert_durable(&log.join(segment_file_name(9)), &other_tail);
        let err = run(&archived, &fs, &archived.manifest, Options::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CatchUpError::Diverged(Divergence::TailChainBefore { before, .. })
                if *before == ends[1]),
            "{err}"
        );
        assert!(err.to_string().contains(&segment_file_name(9)), "{err}");
        assert_eq!(files(&fs), vec![9]);
    }

    #[tokio::test]
    async fn a_local_tail_of_the_same_length_with_other_ops_is_refused() {
        // The archive holds seqs 9-10 of the tail segment in one chunk; the
        // local tail ends where that chunk ends, with other ops of the
        // same length. The chain before the chunk (the segment's start)
        // agrees; only the chain at its end tells them apart.
        let archived = archive().await;
        let first_chunk = archived.manifest.chunks[0].clone();
        let manifest = Manifest {
            shipped_seq: first_chunk.last_seq,
            shipped_chain: first_chunk.chain_after,
            chunks: vec![first_chunk.clone()],
            ..archived.manifest.clone()
        };
        let log = Path::new(LOG);
        let fs = log_fs();
        fs.insert_durable(&log.join(segment_file_name(1)), &archived.files[0].1);
        fs.insert_durable(&log.join(segment_file_name(5)), &archived.files[1].1);
        let (other, ends) = segment(9, 10, archived.manifest.segments[1].chain_end, b"an Op");
        assert_eq!(
            ends[1] as u64,
            first_chunk.offset + body_bytes(&first_chunk)
        );
        fs.insert_durable(&log.join(segment_file_name(9)), &other);
        let err = run(&archived, &fs, &manifest, Options::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CatchUpError::Diverged(Divergence::TailChainAtEnd { key, .. })
                if *key == first_chunk.key),
            "{err}"
        );
        assert!(err.to_string().contains(&segment_file_name(9)), "{err}");
        assert_eq!(read(&fs, 9), other);

        // The archive's own bytes there are its prefix: nothing to fetch.
        let fs = log_fs();
        for (first, bytes) in &archived.files[..2] {
            fs.insert_durable(&log.join(segment_file_name(*first)), bytes);
        }
        let own = &archived.files[2].1[..ends[1]];
        fs.insert_durable(&log.join(segment_file_name(9)), own);
        run(&archived, &fs, &manifest, Options::default())
            .await
            .unwrap();
        assert_eq!(read(&fs, 9), own);
    }

    #[tokio::test]
    async fn a_damaged_chunk_is_refused_and_named() {
        let archived = archive().await;
        let key = archived.manifest.chunks[1].key.clone();
        let good = archived.store.get_required(&key).await.unwrap();
        // Another body under the same key, listed with its own length and
        // BLAKE3, so that only the chunk's check finds it.
        let mut bad = good.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let raw = ArchiveStore::new(Arc::new(InMemory::new()), "p".into());
        let mut manifest = archived.manifest.clone();
        for entry in manifest.segments.iter() {
            let bytes = archived.store.get_required(&entry.key).await.unwrap();
            raw.put_create(&entry.key, bytes).await.unwrap();
        }
        let first = &manifest.chunks[0].key;
        let bytes = archived.store.get_required(first).await.unwrap();
        raw.put_create(first, bytes).await.unwrap();
        raw.put_create(&key, Bytes::from(bad.clone()))
            .await
            .unwrap();
        manifest.chunks[1].blake3 = *blake3::hash(&bad).as_bytes();
        let damaged = Archived {
            store: raw,
            manifest: manifest.clone(),
            files: Vec::new(),
        };
        let fs = log_fs();
        let err = run(&damaged, &fs, &manifest, Options::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CatchUpError::Store(StoreError::Damaged { key: k, .. }) if *k == key),
            "{err}"
        );
        assert!(err.to_string().contains(&key), "{err}");
        // The sealed segments before it were written; the tail was not.
        assert_eq!(files(&fs), vec![1, 5]);

        // Listed with the good BLAKE3: the length and digest check names it.
        let mut listed = manifest.clone();
        listed.chunks[1].blake3 = archived.manifest.chunks[1].blake3;
        let err = run(&damaged, &log_fs(), &listed, Options::default())
            .await
            .unwrap_err();
        assert!(err.to_string().contains(&key), "{err}");
    }

    #[tokio::test]
    async fn an_object_out_of_seq_order_is_refused() {
        let archived = archive().await;
        let mut manifest = archived.manifest.clone();
        manifest.segments[1].first_seq = 6;
        let err = run(&archived, &log_fs(), &manifest, Options::default())
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "manifest 1: segment {} starts at seq 6, expected 5",
                manifest.segments[1].key
            )
        );
    }

    #[tokio::test]
    async fn keep_cuts_the_log_and_stops() {
        let archived = archive().await;
        // Inside the first chunk, after seq 9's batch.
        let (_, ends) = segment(9, 12, archived.manifest.segments[1].chain_end, b"an op");
        let mut seen = Vec::new();
        let mut keep = |fetched: &Fetched<'_>| {
            seen.push(fetched.key.to_owned());
            if fetched.first_seq == 9 {
                Keep::Upto(ends[0])
            } else {
                Keep::All
            }
        };
        let fs = log_fs();
        let caught = run(
            &archived,
            &fs,
            &archived.manifest,
            Options {
                allow_more: false,
                keep: Some(&mut keep),
                follow_compactions: false,
            },
        )
        .await
        .unwrap();
        assert!(caught.stopped);
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(read(&fs, 9), archived.files[2].1[..ends[0]]);
        assert_eq!(caught.segments.len(), 3);

        // A cut before the first op of a segment writes no file for it.
        let mut keep = |fetched: &Fetched<'_>| {
            if fetched.first_seq == 5 {
                Keep::Upto(fetched.records_from)
            } else {
                Keep::All
            }
        };
        let fs = log_fs();
        let caught = run(
            &archived,
            &fs,
            &archived.manifest,
            Options {
                allow_more: false,
                keep: Some(&mut keep),
                follow_compactions: false,
            },
        )
        .await
        .unwrap();
        assert!(caught.stopped);
        assert_eq!(files(&fs), vec![1]);
        assert_eq!(caught.segments.len(), 1);
    }

    /// A one-chunk object of `bytes[..end]` of tail segment `segment`
    /// (from offset 0, after `chain_start`), stored: its entry.
    async fn store_chunk(
        store: &ArchiveStore,
        bytes: &[u8],
        end: usize,
        (segment, last): (u64, u64),
        chain_start: ChainValue,
    ) -> ChunkEntry {
        let body = &bytes[..end];
        let after = SegmentChain::after(chain_start, body).chain();
        let object = ChunkHeader {
            epoch: 1,
            first_seq: segment,
            last_seq: last,
            segment_first_seq: segment,
            offset: 0,
            body_bytes: body.len() as u64,
            body_crc: crc32fast::hash(body),
            chain_before: chain_start,
            chain_after: after,
        }
        .encode(body);
        let entry = ChunkEntry {
            key: chunk_key("p", segment, last, 1),
            epoch: 1,
            segment_first_seq: segment,
            first_seq: segment,
            last_seq: last,
            offset: 0,
            bytes: object.len() as u64,
            blake3: *blake3::hash(&object).as_bytes(),
            chain_after: after,
        };
        let _ = store.put_create(&entry.key, Bytes::from(object)).await;
        entry
    }

    /// A replica's cache of [`archive`] (segments 1, 5 and the tail 9 up
    /// to seq 10) meets a manifest whose compaction at seq 13 rewrote
    /// segment 5 (other ops of the same length) and so re-chained the tail
    /// 9 (now up to seq 13). Without `follow_compactions` (restore, a
    /// take-over) the cache is refused; with it, segment 5 is replaced by
    /// the rewritten object and the tail written anew from the chunks,
    /// and the log is the archive's, byte for byte. A cached segment
    /// without the listed old chain is refused with nothing written.
    #[tokio::test]
    async fn a_compaction_is_followed_in_place_only_when_asked() {
        let archived = archive().await;
        let log = Path::new(LOG);
        let (_, tail_ends) = segment(9, 12, archived.manifest.segments[1].chain_end, b"an op");
        let cache = |fs: &MemFs| {
            fs.insert_durable(&log.join(segment_file_name(1)), &archived.files[0].1);
            fs.insert_durable(&log.join(segment_file_name(5)), &archived.files[1].1);
            fs.insert_durable(
                &log.join(segment_file_name(9)),
                &archived.files[2].1[..tail_ends[1]],
            );
        };
        let first = archived.manifest.segments[0].clone();
        let old = archived.manifest.segments[1].clone();
        let (mut rewritten, rewritten_bytes) = sealed_with(5, 8, first.chain_end, b"an Op");
        rewritten.key = crate::layout::compacted_segment_key("p", 5, 1, 13);
        archived
            .store
            .put_create(&rewritten.key, Bytes::from(rewritten_bytes.clone()))
            .await
            .unwrap();
        let (new_tail, new_ends) = segment(9, 13, rewritten.chain_end, b"an op");
        let chunk = store_chunk(
            &archived.store,
            &new_tail,
            new_ends[4],
            (9, 13),
            rewritten.chain_end,
        )
        .await;
        let manifest = Manifest {
            number: 2,
            shipped_seq: 13,
            shipped_chain: chunk.chain_after,
            segments: vec![first.clone(), rewritten.clone()],
            chunks: vec![chunk],
            compactions: vec![crate::layout::CompactionEntry {
                record_seq: 13,
                segments: vec![crate::layout::RewrittenSegment {
                    first_seq: 5,
                    last_seq: 8,
                    old_chain_end: old.chain_end,
                    new_chain_end: rewritten.chain_end,
                }],
            }],
            ..archived.manifest.clone()
        };
        let follow = || Options {
            follow_compactions: true,
            ..Options::default()
        };

        let fs = log_fs();
        cache(&fs);
        let err = run(&archived, &fs, &manifest, Options::default())
            .await
            .unwrap_err();
        assert!(matches!(&err, CatchUpError::Diverged(_)), "{err}");
        assert_eq!(read(&fs, 5), archived.files[1].1);

        let caught = run(&archived, &fs, &manifest, follow()).await.unwrap();
        assert_eq!(
            caught.compacted,
            vec![segment_file_name(5), segment_file_name(9)]
        );
        assert_eq!(read(&fs, 1), archived.files[0].1);
        assert_eq!(read(&fs, 5), rewritten_bytes);
        assert_eq!(read(&fs, 9), new_tail[..new_ends[4]]);
        // Again: the cache is the manifest's now; nothing to do.
        let again = run(&archived, &fs, &manifest, follow()).await.unwrap();
        assert_eq!(again.objects, 0);

        // A cached segment 5 that is not the one the compaction rewrote.
        let fs = log_fs();
        cache(&fs);
        let (_, other) = sealed_with(5, 8, first.chain_end, b"XX op");
        fs.insert_durable(&log.join(segment_file_name(5)), &other);
        let err = run(&archived, &fs, &manifest, follow()).await.unwrap_err();
        assert!(
            matches!(
                &err,
                CatchUpError::Diverged(Divergence::NotTheCompacted { record_seq: 13, .. })
            ),
            "{err}"
        );
        assert_eq!(read(&fs, 5), other);

        // A cached tail whose records the re-chained tail does not begin
        // with: refused, and the tail is left as it was.
        let fs = log_fs();
        cache(&fs);
        let (odd, odd_ends) = segment(9, 10, old.chain_end, b"an oP");
        fs.insert_durable(&log.join(segment_file_name(9)), &odd[..odd_ends[1]]);
        let err = run(&archived, &fs, &manifest, follow()).await.unwrap_err();
        assert!(
            matches!(
                &err,
                CatchUpError::Diverged(Divergence::RechainedTailDiffers { .. })
            ),
            "{err}"
        );
        assert_eq!(read(&fs, 9), odd[..odd_ends[1]]);
    }
}
