//! Recovery: what [`Log::open`](crate::Log::open) does before the first
//! append. It walks every segment once with the shared decoder, feeding each
//! acknowledged record to the caller's visitor, and then repairs only the
//! two states a crash can leave behind: a torn or unacknowledged tail in the
//! last segment (truncated, a copy kept) and a roll interrupted before its
//! header was durable (the file removed). Everything else that does not
//! verify is refused.
//!
//! From a checkpoint's [`LogPoint`], the sealed segments before the one
//! holding it get only their links checked (header, seal, seqs, chain
//! values); their records are left to [`scrub_segment`], which the caller
//! runs later (FORMAT.md, "Recovery" step 2a).

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use crate::compaction_record::CompactionRecord;
use crate::error::{FaultSeq, LogError, OpenError};
use crate::format::{chain_hex, segment_file_name, ChainValue, RecordRef, Seq};
use crate::fs::Fs;
use crate::segment::{
    check_sealed_link, decode_segment, map_segment, parent_dir, segment_files, DecodeOptions,
    Decoded, Expect, Role, Segment, SegmentEnd, SegmentFile, Torn,
};
use crate::state::{ActiveSegment, Head, LogConfig};

/// What recovery found and did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// Segment files kept (a removed interrupted roll is not counted).
    pub segments: usize,
    /// Whole records found in the segments decoded record by record (seals
    /// excluded; not those of `deferred`); the visitor saw those after the
    /// checkpoint's seq, if one was given, else all of them.
    pub records: u64,
    /// Valid bytes over all kept segments (headers, records, seals).
    pub bytes: u64,
    /// From a checkpoint: the sealed segments before the one holding its
    /// point, whose links alone were checked (FORMAT.md, "Recovery" step
    /// 2a), in seq order. Their records are for [`scrub_segment`].
    pub deferred: Vec<DeferredSegment>,
    /// The torn tail cut off the last segment, if any.
    pub truncated: Option<TornTail>,
    /// File name of an interrupted roll's segment that was removed, if any.
    pub removed_segment: Option<String>,
    /// The compaction whose commit a crash interrupted and this open
    /// finished (its journal redone and removed; FORMAT.md, "Compaction"),
    /// if any.
    pub compaction_finished: Option<CompactionRecord>,
    /// True when finishing it appended its compaction record (the crash
    /// came before the record was durable).
    pub compaction_record_appended: bool,
    /// Files of compaction removed before recovery: a stale
    /// `COMPACTION.tmp`, the staged files of an interrupted staging, or
    /// those of the finished compaction.
    pub staged_removed: Vec<String>,
}

/// A point of the log a checkpoint stands at: the record at `seq` ends at
/// byte `frame_end_offset` of the segment whose first seq is
/// `segment_first_seq`, where the chain value is `chain` (FORMAT.md, "The
/// chain"; CHECKPOINT.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPoint {
    /// The last seq folded into the checkpoint.
    pub seq: Seq,
    /// First seq (the file name) of the segment holding that record.
    pub segment_first_seq: Seq,
    /// Byte offset just past that record's frame in its segment.
    pub frame_end_offset: u64,
    /// The chain value at that offset.
    pub chain: ChainValue,
}

/// A sealed segment whose records startup left unchecked (a checkpoint
/// covers it): what its links promised, for [`scrub_segment`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeferredSegment {
    /// Segment file name.
    pub name: String,
    /// Its first seq (name and header).
    pub first_seq: Seq,
    /// Its header's chain value (the previous seal's).
    pub chain_start: ChainValue,
    /// The seq its seal names: its last record's.
    pub last_seq: Seq,
    /// The chain value its seal holds, which the next segment's header
    /// repeats.
    pub seal_chain: ChainValue,
    /// Bytes up to the end of its seal.
    pub bytes: u64,
}

/// Checks every byte of `segment`, a sealed segment startup deferred
/// ([`RecoveryReport::deferred`]) in the log directory `dir`, with the
/// decoder recovery uses for every other segment (CRC and seq of every
/// record, commit marks, the seal's chain value over the bytes, only zeros
/// after it), and that it still ends where startup found its seal.
///
/// Errors: `Corrupt` naming the segment, the offset and the seq of the
/// damage ([`FaultSeq`]: the faulty record's own seq) that startup did not
/// see; `Io` when the file cannot be mapped
/// (a missing file included).
pub fn scrub_segment(
    dir: &Path,
    fs: &dyn Fs,
    segment: &DeferredSegment,
    max_record_bytes: u32,
) -> Result<(), LogError> {
    let file = SegmentFile {
        name: segment.name.clone(),
        first_seq: segment.first_seq,
        path: dir.join(&segment.name),
    };
    let (map, _) = map_segment(fs, &file)?;
    let expect = Expect {
        first_seq: segment.first_seq,
        chain_start: segment.chain_start,
    };
    let opts = DecodeOptions {
        role: Role::Sealed,
        max_record_bytes,
        verify_seal: true,
        chain_at: None,
    };
    let decoded = decode_segment(&segment.name, (*map).as_ref(), expect, opts, |_| {
        ControlFlow::Continue(())
    })?;
    match decoded {
        Decoded::Segment(found)
            if found.last_seq == segment.last_seq
                && found.tail.head_chain() == segment.seal_chain =>
        {
            Ok(())
        }
        // A sealed-role decode never reports an interrupted roll; a seal
        // other than the one startup linked means the file changed.
        _ => Err(LogError::Corrupt {
            segment: segment.name.clone(),
            offset: segment.bytes,
            seq: FaultSeq::After(segment.last_seq),
            reason: "the segment no longer ends with the seal startup checked".into(),
        }),
    }
}

/// A torn tail: bytes at the end of the last segment that are not whole
/// records and have no valid record after them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// Segment file name.
    pub segment: String,
    /// Offset of the first byte that is not part of a whole record (the new
    /// file length after recovery truncates).
    pub offset: u64,
    /// Bytes from `offset` to the end of the file (recovery removes them; the
    /// reader only skips them).
    pub bytes_dropped: u64,
    /// What was found at `offset`, e.g. "truncated record", "record
    /// checksum mismatch", or "100 zero bytes, then non-zero bytes from
    /// offset 900: not a clean end of written data".
    pub damage: String,
    /// True when a whole frame (its `len` fits the file) fails its checksum
    /// (in version 2, with no unwritten sector in it): a torn write cannot
    /// be told apart from damage to the last record or commit mark, so
    /// `spark-replay verify` reports it as a fault, not a note.
    pub whole_frame: bool,
    /// Version 2: the tail comes after the last valid commit mark, so none
    /// of its bytes was ever acknowledged: an "unacknowledged tail", reported
    /// as cut, not as damage (FORMAT.md, "Acknowledged bytes").
    pub unacknowledged: bool,
    /// Seqs (first, last) of the whole records or commit marks found in the
    /// dropped bytes (never acknowledged in version 2), if any.
    pub seqs: Option<(Seq, Seq)>,
    /// Offset of the first frame that is not valid (equal to `offset` in
    /// version 1; in version 2 whole records of the unacknowledged batch
    /// may come first).
    pub damage_offset: u64,
    /// Where recovery kept a copy of the dropped bytes before cutting them
    /// (a file name in the log directory), when any of them was not zero.
    pub quarantine: Option<String>,
}

/// The state recovery hands to the writer.
pub(crate) struct Recovered {
    pub report: RecoveryReport,
    pub head: Head,
    /// The last segment, open for appending, unless it is sealed or absent.
    pub active: Option<ActiveSegment>,
}

/// Most names [`quarantine`] tries (`name`, `name.1`, ...) before giving up.
const QUARANTINE_NAMES_MAX: usize = 1000;

/// Keeps `bytes` in a durable file in `dir` (file and directory fsynced): the
/// copy of what recovery cuts off, so that no byte is dropped without a
/// trace. Returns the file's name: `name` or, when a file of that name holds
/// other bytes (the copy of an earlier tail cut at the same offset, or a
/// copy an earlier recovery started but a crash interrupted), the first of
/// `name.1`, `name.2`, ... that is free or already holds exactly `bytes`.
/// A copy that already exists is fsynced again (a crash may have come
/// between its write and its fsync). Files not ending in `.seg` are not
/// segments.
fn quarantine(fs: &Arc<dyn Fs>, dir: &Path, name: &str, bytes: &[u8]) -> Result<String, LogError> {
    for attempt in 0..QUARANTINE_NAMES_MAX {
        let candidate = match attempt {
            0 => name.to_owned(),
            n => format!("{name}.{n}"),
        };
        let path = dir.join(&candidate);
        let mut file = match fs.create_new(&path) {
            Ok(mut file) => {
                file.write_all_at(0, bytes)
                    .map_err(|e| LogError::io("write", &path, e))?;
                tracing::warn!(file = %path.display(), bytes = bytes.len(), "kept a copy of the cut bytes");
                file
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let existing = fs.map(&path).map_err(|e| LogError::io("map", &path, e))?;
                if (*existing).as_ref() != bytes {
                    continue;
                }
                drop(existing);
                fs.open_rw(&path)
                    .map_err(|e| LogError::io("open_rw", &path, e))?
            }
            Err(e) => return Err(LogError::io("create_new", &path, e)),
        };
        file.sync_all()
            .map_err(|e| LogError::io("sync_all", &path, e))?;
        fs.sync_dir(dir)
            .map_err(|e| LogError::io("sync_dir", dir, e))?;
        return Ok(candidate);
    }
    Err(LogError::io(
        "create_new",
        dir.join(name),
        std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{QUARANTINE_NAMES_MAX} quarantine files of this name hold other bytes"),
        ),
    ))
}

impl TornTail {
    /// The report of the tail `torn` of segment `name`, a file of
    /// `file_len` bytes.
    pub(crate) fn new(name: &str, torn: &Torn, file_len: u64, quarantine: Option<String>) -> Self {
        TornTail {
            segment: name.to_owned(),
            offset: torn.offset,
            bytes_dropped: file_len.saturating_sub(torn.offset),
            damage: torn.describe(),
            whole_frame: torn.whole_frame,
            quarantine,
            unacknowledged: torn.after_commit_mark,
            seqs: torn.unacknowledged_seqs,
            damage_offset: torn.damage_offset,
        }
    }

    /// One line for logs and tools: "unacknowledged tail cut: ..." for a
    /// version-2 tail, "torn tail: ..." for a version-1 one; the segment,
    /// offset, bytes, seqs and what was found.
    pub fn summary(&self) -> String {
        let what = if self.unacknowledged {
            "unacknowledged tail cut"
        } else {
            "torn tail"
        };
        let seqs = match self.seqs {
            Some((first, last)) if first == last => format!("seq {first}"),
            Some((first, last)) => format!("seqs {first}..={last}"),
            None => "no whole record".to_owned(),
        };
        format!(
            "{what}: segment {} at offset {}, {} bytes, {seqs} ({})",
            self.segment, self.offset, self.bytes_dropped, self.damage
        )
    }
}

/// The log directory's listing; a missing directory is created, with every
/// missing parent, each made durable in its own parent, top down (a fresh
/// data directory must survive power loss too), and lists as empty.
fn list_or_create(dir: &Path, fs: &Arc<dyn Fs>) -> Result<Vec<std::path::PathBuf>, LogError> {
    match fs.list(dir) {
        Ok(listing) => Ok(listing),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut missing = vec![dir];
            let mut at = dir;
            loop {
                let parent = parent_dir(at);
                if parent == at || fs.list(parent).is_ok() {
                    break;
                }
                missing.push(parent);
                at = parent;
            }
            fs.create_dir_all(dir)
                .map_err(|e| LogError::io("create_dir_all", dir, e))?;
            for created in missing.iter().rev() {
                let parent = parent_dir(created);
                fs.sync_dir(parent)
                    .map_err(|e| LogError::io("sync_dir", parent, e))?;
            }
            Ok(Vec::new())
        }
        Err(e) => Err(LogError::io("list", dir, e)),
    }
}

/// Runs recovery on `dir` (see FORMAT.md, "Recovery"), from the
/// checkpoint point `from` when given (step 2a: the visitor then sees only
/// the records after `from.seq`).
pub(crate) fn recover<E>(
    dir: &Path,
    config: &LogConfig,
    fs: &Arc<dyn Fs>,
    from: Option<&LogPoint>,
    mut visit: impl FnMut(RecordRef<'_>) -> Result<(), E>,
) -> Result<Recovered, OpenError<E>> {
    let files = segment_files(list_or_create(dir, fs)?)?;
    if let Some(point) = from {
        if !files.iter().any(|f| f.first_seq == point.segment_first_seq) {
            return Err(point_mismatch(point, "no segment of the log has that name").into());
        }
    }
    let skip_through = from.map_or(0, |point| point.seq);
    let mut visit = |record: RecordRef<'_>| {
        if record.seq <= skip_through {
            Ok(())
        } else {
            visit(record)
        }
    };
    let mut report = RecoveryReport::default();
    let mut head = Head::empty();
    let mut active = None;
    let mut expect = Expect::FIRST;
    for (index, file) in files.iter().enumerate() {
        let role = if index + 1 == files.len() {
            Role::Last
        } else {
            Role::Sealed
        };
        let covered = from.is_some_and(|point| file.first_seq < point.segment_first_seq);
        if covered {
            if let Some(link) = check_link(fs, file, expect, config.max_record_bytes)? {
                report.segments += 1;
                report.bytes += link.bytes;
                head = Head {
                    seq: link.last_seq,
                    segment: file.name.clone(),
                    chain: link.seal_chain,
                };
                expect = Expect {
                    first_seq: link.last_seq + 1,
                    chain_start: link.seal_chain,
                };
                report.deferred.push(link);
                continue;
            }
        }
        let chain_at = from
            .filter(|point| point.segment_first_seq == file.first_seq)
            .map(|point| point.frame_end_offset);
        let Some((segment, cut, file_len)) = decode_and_keep_cut(
            dir,
            config,
            fs,
            file,
            (expect, chain_at),
            role,
            &mut visit,
            &mut report,
        )?
        else {
            continue;
        };
        if let (Some(point), Some(chain)) = (from, segment.chain_at) {
            if chain != point.chain {
                return Err(point_mismatch(
                    point,
                    &format!("the log's chain value there is {}", chain_hex(&chain)),
                )
                .into());
            }
        }
        report.segments += 1;
        report.records += segment.records;
        report.bytes += segment.end;
        head = Head {
            seq: segment.last_seq,
            segment: file.name.clone(),
            chain: segment.tail.head_chain(),
        };
        match segment.tail {
            SegmentEnd::Sealed { chain } => {
                expect = Expect {
                    first_seq: segment.last_seq + 1,
                    chain_start: chain,
                };
            }
            // Only the last segment may be open (the decoder refuses an
            // unsealed earlier one).
            SegmentEnd::Open { hasher, .. } => {
                let handle = fs
                    .open_rw(&file.path)
                    .map_err(|e| LogError::io("open_rw", &file.path, e))?;
                let mut segment = ActiveSegment {
                    name: file.name.clone(),
                    path: file.path.clone(),
                    file: handle,
                    len: segment.end,
                    // The file's size, zero fill after the last record
                    // (pre-allocated space) included, unless cut below.
                    allocated: file_len,
                    records: segment.records,
                    format_version: segment.format_version,
                    hasher,
                };
                if let Some((torn, cut)) = cut {
                    report.truncated = Some(cut_tail(fs, dir, &mut segment, &torn, cut)?);
                }
                active = Some(segment);
            }
        }
    }
    tracing::info!(
        segments = report.segments,
        records = report.records,
        bytes = report.bytes,
        head_seq = head.seq,
        head_chain = %chain_hex(&head.chain),
        "log recovered"
    );
    Ok(Recovered {
        report,
        head,
        active,
    })
}

/// The refusal of a checkpoint point that does not match the log: the
/// caller checked it against the log before (the checkpoint's own chain
/// check), so the log changed since, or was damaged where it stands.
fn point_mismatch(point: &LogPoint, why: &str) -> LogError {
    LogError::Corrupt {
        segment: segment_file_name(point.segment_first_seq),
        offset: point.frame_end_offset,
        seq: FaultSeq::After(point.seq),
        reason: format!(
            "the checkpoint's point (seq {}, chain value {}) does not match the log: {why}",
            point.seq,
            chain_hex(&point.chain)
        ),
    }
}

/// The cheap check of a sealed segment a checkpoint covers
/// ([`check_sealed_link`]); `None` when it does not end with a seal where
/// one should be (the caller decodes it in full, naming the damage).
fn check_link(
    fs: &Arc<dyn Fs>,
    file: &SegmentFile,
    expect: Expect,
    max_record_bytes: u32,
) -> Result<Option<DeferredSegment>, LogError> {
    let (map, _) = map_segment(fs.as_ref(), file)?;
    let link = check_sealed_link(&file.name, (*map).as_ref(), expect, max_record_bytes)?;
    Ok(link.map(|link| DeferredSegment {
        name: file.name.clone(),
        first_seq: expect.first_seq,
        chain_start: expect.chain_start,
        last_seq: link.last_seq,
        seal_chain: link.chain,
        bytes: link.end,
    }))
}

/// A decoded segment, with its tail to cut (if any: the tail and the bytes
/// to keep a copy of, `None` when they are all zero), and its file length.
type KeptSegment = (Segment, Option<(Torn, Option<Vec<u8>>)>, u64);

/// Decodes one segment file that must continue `expect`, feeding its
/// records to `visit` (and taking the chain value at `chain_at`, if
/// given). An interrupted roll's file is removed here (a copy
/// kept) and `None` returned. For a segment, the bytes of its tail to cut
/// are copied out of the map (the cut comes after the map is dropped).
#[allow(clippy::too_many_arguments)]
fn decode_and_keep_cut<E>(
    dir: &Path,
    config: &LogConfig,
    fs: &Arc<dyn Fs>,
    file: &SegmentFile,
    (expect, chain_at): (Expect, Option<u64>),
    role: Role,
    visit: &mut impl FnMut(RecordRef<'_>) -> Result<(), E>,
    report: &mut RecoveryReport,
) -> Result<Option<KeptSegment>, OpenError<E>> {
    let (map, file_len) = map_segment(fs.as_ref(), file)?;
    let bytes: &[u8] = (*map).as_ref();
    let opts = DecodeOptions {
        role,
        max_record_bytes: config.max_record_bytes,
        verify_seal: true,
        chain_at,
    };
    let mut refused: Option<E> = None;
    let decoded = decode_segment(&file.name, bytes, expect, opts, |record| {
        match visit(record) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                refused = Some(e);
                ControlFlow::Break(())
            }
        }
    })?;
    if let Some(e) = refused {
        return Err(OpenError::Visit(e));
    }
    let nonzero = |cut: &[u8]| cut.iter().any(|&b| b != 0).then(|| cut.to_vec());
    match decoded {
        Decoded::InterruptedRoll { reason } => {
            let cut = nonzero(bytes);
            drop(map);
            remove_interrupted_roll(fs, dir, file, cut.as_deref(), &reason, file_len)?;
            report.removed_segment = Some(file.name.clone());
            Ok(None)
        }
        Decoded::Segment(segment) => {
            let cut = segment.torn.map(|torn| {
                let from = usize::try_from(torn.offset).unwrap_or(usize::MAX);
                (torn, nonzero(bytes.get(from..).unwrap_or(&[])))
            });
            Ok(Some((segment, cut, file_len)))
        }
    }
}

/// Removes the file of an interrupted roll (FORMAT.md, "Recovery" step 4),
/// keeping a copy of its bytes first unless they are all zero (`cut` is
/// `None`), then syncs the directory.
fn remove_interrupted_roll(
    fs: &Arc<dyn Fs>,
    dir: &Path,
    file: &SegmentFile,
    cut: Option<&[u8]>,
    reason: &str,
    file_len: u64,
) -> Result<(), LogError> {
    if let Some(cut) = cut {
        quarantine(fs, dir, &format!("{}.torn-roll", file.name), cut)?;
    }
    fs.remove_file(&file.path)
        .map_err(|e| LogError::io("remove_file", &file.path, e))?;
    fs.sync_dir(dir)
        .map_err(|e| LogError::io("sync_dir", dir, e))?;
    tracing::warn!(
        segment = %file.name,
        %reason,
        bytes = file_len,
        "removed the segment of an interrupted roll (no valid header, no valid record)"
    );
    Ok(())
}

/// Cuts the tail `torn` off the active segment (FORMAT.md, "Recovery" step
/// 3): keeps a copy of `cut` (its bytes, unless all zero), truncates the
/// file to `torn.offset` and fsyncs it. Returns the report.
fn cut_tail(
    fs: &Arc<dyn Fs>,
    dir: &Path,
    segment: &mut ActiveSegment,
    torn: &Torn,
    cut: Option<Vec<u8>>,
) -> Result<TornTail, LogError> {
    let kept = match &cut {
        Some(cut) => {
            let name = format!("{}.torn-{:012}", segment.name, torn.offset);
            Some(quarantine(fs, dir, &name, cut)?)
        }
        None => None,
    };
    let path = &segment.path;
    segment
        .file
        .set_len(torn.offset)
        .map_err(|e| LogError::io("set_len", path, e))?;
    segment
        .file
        .sync_all()
        .map_err(|e| LogError::io("sync_all", path, e))?;
    let tail = TornTail::new(&segment.name, torn, segment.allocated, kept);
    // After the cut the file ends at the last acknowledged frame.
    segment.allocated = torn.offset;
    tracing::warn!(
        segment = %segment.name,
        offset = torn.offset,
        bytes_dropped = tail.bytes_dropped,
        damage = %tail.damage,
        "{}",
        tail.summary()
    );
    Ok(tail)
}
