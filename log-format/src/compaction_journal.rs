//! The redo journal of a compaction's commit (`COMPACTION`; FORMAT.md,
//! "Compaction"), and the staged files it names: the journal's bytes
//! ([`Journal`]), putting staged bytes in place of their segments
//! ([`put_in_place`]), patching the active segment's header, what
//! [`Log::open`](crate::Log::open) does before recovery
//! ([`before_recovery`]: redo an interrupted commit, or remove the files of
//! an interrupted staging), and removing the journal once the compaction
//! record is in the log ([`finish_journal`]).
//!
//! Sits below the reader, the writer and staging (`compaction`): it imports
//! none of them, only the compaction record's module for the payload it
//! checks.

use std::io;
use std::path::Path;

use crate::compaction_record::{
    put_count, put_name, CompactionDecodeError, CompactionRecord, Cursor,
};
use crate::error::{FaultSeq, LogError};
use crate::format::{le_u16, le_u32, parse_segment_file_name, Seq, HEADER_LEN};
use crate::fs::{Fs, WritePace};

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

/// Removes the staged files of `entries` in `dir` (skipping missing ones)
/// and syncs the directory.
pub(crate) fn remove_staged(fs: &dyn Fs, dir: &Path, entries: &[StagedEntry]) -> io::Result<()> {
    for entry in entries {
        match fs.remove_file(&dir.join(&entry.staged_name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    fs.sync_dir(dir)
}

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
/// segment's name with [`Fs::write_file_durably_paced`] at `pace` (a copy,
/// renamed over the segment, the directory synced), so that no power cut can lose both the
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
    pace: Option<WritePace>,
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
        fs.write_file_durably_paced(&final_path, bytes, pace)
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
/// Errors: `CompactionJournalDamaged` when its checksum (or any field)
/// does not hold (it was written atomically, so that is damage);
/// `Corrupt` naming a segment that cannot be redone; `Io`.
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
        let journal =
            Journal::decode((*map).as_ref()).map_err(|e| LogError::CompactionJournalDamaged {
                journal: path.clone(),
                aside: dir
                    .parent()
                    .unwrap_or(dir)
                    .join(format!("{JOURNAL_NAME}.damaged")),
                reason: e.0,
            })?;
        drop(map);
        tracing::warn!(
            segments = journal.entries.len(),
            "finishing a compaction a crash interrupted"
        );
        // A recovery's redo: nothing else is writing, no pace.
        put_in_place(fs, dir, &journal.entries, None)?;
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

/// Commit step 6 (and its redo): removes the staged files, syncs the
/// directory, removes the journal, syncs the directory.
pub(crate) fn finish_journal(fs: &dyn Fs, dir: &Path, journal: &Journal) -> Result<(), LogError> {
    remove_staged(fs, dir, &journal.entries).map_err(|e| LogError::io("remove_file", dir, e))?;
    remove_journal(fs, dir)
}

/// Commit step 6 once apply removed the staged files: removes the journal,
/// syncs the directory.
pub(crate) fn remove_journal(fs: &dyn Fs, dir: &Path) -> Result<(), LogError> {
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

/// True when a journal exists in `dir` (what [`LogReader`](crate::LogReader) refuses outside
/// a live read).
pub(crate) fn journal_exists(fs: &dyn Fs, dir: &Path) -> Result<bool, LogError> {
    // One metadata call, no listing: a live reader asks before and after
    // each open.
    match fs.modified(&dir.join(JOURNAL_NAME)) {
        Ok(_) => Ok(true),
        // The reader reports a missing directory itself.
        Err(_) => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction_record::SegmentRewrite;

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
