//! The compaction record (kind [`KIND_COMPACTION`]; FORMAT.md,
//! "Compaction"): the payload the log appends at the end of a compaction's
//! commit, naming every segment the compaction rewrote (seqs, old and new
//! seal) and what it was for. Its encoding and decoding, and the
//! little-endian [`Cursor`] and `put_*` helpers the redo journal
//! (`compaction_journal`) reuses for its own bytes.
//!
//! Sits below the reader, recovery, the writer and staging: it imports none
//! of them.

use crate::error::{FaultSeq, LogError};
use crate::format::{le_u16, le_u32, le_u64, ChainValue, RecordRef, Seq};

/// The kind of the compaction record, which the log writes itself at the
/// end of a compaction's commit; appenders may not use it
/// ([`LogError::ReservedKind`]).
pub const KIND_COMPACTION: u16 = 0xFFFF;
/// The `kind_version` of the compaction record's payload
/// ([`CompactionRecord::encode`]).
pub const COMPACTION_KIND_VERSION: u16 = 1;

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
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8], at: usize) -> Cursor<'a> {
        Cursor { bytes, at }
    }

    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], CompactionDecodeError> {
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

    pub(crate) fn u16(&mut self, what: &str) -> Result<u16, CompactionDecodeError> {
        let b = self.take(2, what)?;
        Ok(le_u16(b, 0).unwrap_or(0))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, CompactionDecodeError> {
        let b = self.take(4, what)?;
        Ok(le_u32(b, 0).unwrap_or(0))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, CompactionDecodeError> {
        let b = self.take(8, what)?;
        Ok(le_u64(b, 0).unwrap_or(0))
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        what: &str,
    ) -> Result<[u8; N], CompactionDecodeError> {
        let b = self.take(N, what)?;
        Ok(b.first_chunk::<N>().copied().unwrap_or([0; N]))
    }

    /// A count whose items take at least `item_bytes` each: refused when
    /// the bytes left cannot hold them (nothing is allocated from it).
    pub(crate) fn count(
        &mut self,
        item_bytes: usize,
        what: &str,
    ) -> Result<usize, CompactionDecodeError> {
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

    pub(crate) fn name(&mut self, what: &str) -> Result<String, CompactionDecodeError> {
        let len = self.u16(what)?;
        let bytes = self.take(usize::from(len), what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| CompactionDecodeError(format!("{what} is not UTF-8")))
    }

    pub(crate) fn finish(&self) -> Result<(), CompactionDecodeError> {
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
pub(crate) fn put_name(out: &mut Vec<u8>, name: &str) {
    let len = u16::try_from(name.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&name.as_bytes()[..usize::from(len)]);
}

/// A u32 count (counts of segments and subjects fit: each entry is bytes of
/// a record of at most 4 GiB).
pub(crate) fn put_count(out: &mut Vec<u8>, count: usize) {
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

/// The compaction record `record` of segment `name`, or `Corrupt`.
pub(crate) fn decode_in(name: &str, record: &RecordRef<'_>) -> Result<CompactionRecord, LogError> {
    CompactionRecord::decode(record.payload).map_err(|e| LogError::Corrupt {
        segment: name.to_owned(),
        offset: record.offset,
        seq: FaultSeq::Record(record.seq),
        reason: e.to_string(),
    })
}
