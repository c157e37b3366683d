//! Recovery: what [`Log::open`](crate::Log::open) does before the first
//! append. It walks every segment once with the shared decoder, feeding each
//! whole record to the caller's visitor, and then repairs only the two
//! states a crash can leave behind: a torn tail in the last segment
//! (truncated) and a roll interrupted before its header was durable (the
//! file removed). Everything else that does not verify is refused.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use crate::error::{LogError, OpenError};
use crate::format::{chain_hex, RecordRef};
use crate::fs::Fs;
use crate::segment::{
    decode_segment, parent_dir, segment_files, DecodeOptions, Decoded, Expect, Role, SegmentEnd,
};
use crate::writer::{ActiveSegment, Head, LogConfig};

/// What recovery found and did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// Segment files kept (a removed interrupted roll is not counted).
    pub segments: usize,
    /// Whole records found (seals excluded); the visitor saw exactly these.
    pub records: u64,
    /// Valid bytes over all kept segments (headers, records, seals).
    pub bytes: u64,
    /// The torn tail cut off the last segment, if any.
    pub truncated: Option<TornTail>,
    /// File name of an interrupted roll's segment that was removed, if any.
    pub removed_segment: Option<String>,
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
    /// True when a whole frame (its `len` fits the file) fails its checksum:
    /// a torn write cannot be told apart from damage to the last record, so
    /// `spark-replay verify` reports it as a fault, not a note.
    pub whole_frame: bool,
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

/// Runs recovery on `dir` (see FORMAT.md, "Recovery").
pub(crate) fn recover<E>(
    dir: &Path,
    config: &LogConfig,
    fs: &Arc<dyn Fs>,
    mut visit: impl FnMut(RecordRef<'_>) -> Result<(), E>,
) -> Result<Recovered, OpenError<E>> {
    let listing = match fs.list(dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Every directory this creates is made durable in its parent,
            // top down: a fresh data directory must survive power loss too.
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
            Vec::new()
        }
        Err(e) => return Err(LogError::io("list", dir, e).into()),
    };
    let files = segment_files(listing)?;

    let mut report = RecoveryReport::default();
    let mut head = Head::empty();
    let mut active = None;
    let mut expect = Expect::FIRST;
    let mut refused: Option<E> = None;
    for (index, file) in files.iter().enumerate() {
        let is_last = index + 1 == files.len();
        let map = fs
            .map(&file.path)
            .map_err(|e| LogError::io("map", &file.path, e))?;
        let bytes: &[u8] = (*map).as_ref();
        // usize is at most 64 bits on every target Rust supports.
        let file_len = bytes.len() as u64;
        let opts = DecodeOptions {
            role: if is_last { Role::Last } else { Role::Sealed },
            max_record_bytes: config.max_record_bytes,
            verify_seal: true,
        };
        let decoded = decode_segment(&file.name, bytes, expect, opts, |record| {
            match visit(record) {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => {
                    refused = Some(e);
                    ControlFlow::Break(())
                }
            }
        })?;
        // Keep what recovery is about to cut, unless it is all zeros.
        let cut_bytes: Option<Vec<u8>> = match &decoded {
            Decoded::InterruptedRoll { .. } => Some(bytes.to_vec()),
            Decoded::Segment(segment) => segment
                .torn
                .and_then(|t| usize::try_from(t.offset).ok())
                .and_then(|offset| bytes.get(offset..))
                .map(<[u8]>::to_vec),
        }
        .filter(|cut| cut.iter().any(|&b| b != 0));
        drop(map);
        if let Some(e) = refused.take() {
            return Err(OpenError::Visit(e));
        }
        let segment = match decoded {
            Decoded::InterruptedRoll { reason } => {
                if let Some(cut) = &cut_bytes {
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
                report.removed_segment = Some(file.name.clone());
                continue;
            }
            Decoded::Segment(segment) => segment,
        };
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
                let mut handle = fs
                    .open_rw(&file.path)
                    .map_err(|e| LogError::io("open_rw", &file.path, e))?;
                if let Some(torn) = segment.torn {
                    let kept = match &cut_bytes {
                        Some(cut) => {
                            let name = format!("{}.torn-{:012}", file.name, torn.offset);
                            Some(quarantine(fs, dir, &name, cut)?)
                        }
                        None => None,
                    };
                    handle
                        .set_len(torn.offset)
                        .map_err(|e| LogError::io("set_len", &file.path, e))?;
                    handle
                        .sync_all()
                        .map_err(|e| LogError::io("sync_all", &file.path, e))?;
                    let dropped = file_len - torn.offset;
                    tracing::warn!(
                        segment = %file.name,
                        offset = torn.offset,
                        bytes_dropped = dropped,
                        damage = %torn.damage,
                        last_seq = segment.last_seq,
                        "truncated a torn tail"
                    );
                    report.truncated = Some(TornTail {
                        segment: file.name.clone(),
                        offset: torn.offset,
                        bytes_dropped: dropped,
                        damage: torn.describe(),
                        whole_frame: torn.damage == crate::format::Damage::BadCrc,
                        quarantine: kept,
                    });
                }
                // After a cut the file ends at the last whole record; else
                // it keeps any zero fill after it (pre-allocated space).
                let allocated = segment.torn.map_or(file_len, |torn| torn.offset);
                active = Some(ActiveSegment {
                    name: file.name.clone(),
                    path: file.path.clone(),
                    file: handle,
                    len: segment.end,
                    allocated,
                    records: segment.records,
                    hasher,
                });
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
