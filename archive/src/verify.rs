//! The checks of an archived sealed segment or tail chunk against its
//! manifest entry and the chain before it (ARCHIVE.md "Sealed segment",
//! "Tail chunk"): the one place where take-over (and with it a replica's
//! catch-up), restore and `audit archive` learn whether an object's bytes
//! go on from the chain, so that all of them accept and refuse the same
//! objects.
//!
//! No I/O: the caller fetches the object (its length and BLAKE3 against the
//! entry are [`ArchiveStore::get_listed`](crate::ArchiveStore::get_listed)'s
//! check) and names the object's key in its own error.

use spark_log_format::format::{
    chain_hasher, decode_record, ChainValue, RecordDecode, SegmentHeader, KIND_SEAL,
    SEAL_KIND_VERSION, SEAL_PAYLOAD_LEN, SEAL_RECORD_BYTES,
};
use spark_log_format::{DEFAULT_MAX_RECORD_BYTES, HEADER_LEN};

use crate::layout::{ChunkEntry, ChunkHeader, ObjectError, SegmentEntry};

/// Where the bytes of one segment stand while its objects are checked in
/// order: the offset reached, the chain value there, and the hasher that
/// goes on from it. The chain at an offset is the BLAKE3 of the segment's
/// `chain_start` followed by its bytes up to there (FORMAT.md "The chain");
/// at offset 0 it is `chain_start` itself, the chain before the segment.
#[derive(Clone, Debug)]
pub struct SegmentChain {
    /// Fed with `chain_start` and the segment's bytes up to `offset`.
    hasher: blake3::Hasher,
    /// Bytes of the segment covered so far (its header included).
    offset: u64,
    /// The chain value at `offset`.
    chain: ChainValue,
}

impl SegmentChain {
    /// At offset 0 of a segment whose header carries `chain_start`.
    pub fn start(chain_start: ChainValue) -> SegmentChain {
        SegmentChain {
            hasher: chain_hasher(&chain_start),
            offset: 0,
            chain: chain_start,
        }
    }

    /// After `prefix`, the segment's bytes from offset 0, of a segment
    /// whose header carries `chain_start`.
    pub fn after(chain_start: ChainValue, prefix: &[u8]) -> SegmentChain {
        let mut chain = SegmentChain::start(chain_start);
        chain.extend(prefix);
        chain
    }

    /// Bytes of the segment covered so far, in bytes from its start.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The chain value at [`offset`](Self::offset).
    pub fn chain(&self) -> ChainValue {
        self.chain
    }

    /// Goes on over `bytes`, the segment's next ones.
    fn extend(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.hasher.update(bytes);
        // Cast: usize to u64 is lossless on the targets we build for.
        self.offset += bytes.len() as u64;
        self.chain = self.hasher.finalize().into();
    }
}

/// Checks the bytes of a sealed segment object against its manifest
/// `entry` and `chain_before` (the chain the segment before it ended with,
/// zeros for the first): its length; its header (magic, version, checksum,
/// `first_seq` = the entry's, `chain_start` = `chain_before`); its last
/// record a whole seal whose seq is the entry's `last_seq` and whose value
/// is the chain of the bytes before it; and that value the entry's
/// `chain_end`. Returns that chain value, the one the next object goes on
/// from (ARCHIVE.md "Sealed segment"; FORMAT.md "The chain").
///
/// The records between header and seal are not walked: a changed byte
/// there changes the chain, which the seal then does not hold; their
/// framing is the full decoder's check once the log is written.
pub fn verify_sealed(
    entry: &SegmentEntry,
    bytes: &[u8],
    chain_before: &ChainValue,
) -> Result<ChainValue, ObjectError> {
    // Cast: usize to u64 is lossless on the targets we build for.
    if bytes.len() as u64 != entry.bytes {
        return Err(ObjectError::Mismatch(format!(
            "{} bytes, the manifest says {}",
            bytes.len(),
            entry.bytes
        )));
    }
    if bytes.len() < HEADER_LEN + SEAL_RECORD_BYTES {
        return Err(ObjectError::Truncated(bytes.len()));
    }
    let header = SegmentHeader::decode(bytes)
        .map_err(|e| ObjectError::Mismatch(format!("its segment header: {e}")))?;
    if header.first_seq != entry.first_seq {
        return Err(ObjectError::Mismatch(format!(
            "its header says first seq {}, the manifest {}",
            header.first_seq, entry.first_seq
        )));
    }
    if header.chain_start != *chain_before {
        return Err(ObjectError::ChainBefore {
            field: "chain_start",
            found: header.chain_start,
            expected: *chain_before,
        });
    }
    let seal_at = bytes.len() - SEAL_RECORD_BYTES;
    let seal = match decode_record(bytes, seal_at, DEFAULT_MAX_RECORD_BYTES) {
        RecordDecode::Record { record, size }
            if size == SEAL_RECORD_BYTES
                && record.kind == KIND_SEAL
                && record.kind_version == SEAL_KIND_VERSION
                && record.payload.len() == SEAL_PAYLOAD_LEN =>
        {
            record
        }
        _ => {
            return Err(ObjectError::Mismatch(format!(
                "its last {SEAL_RECORD_BYTES} bytes are not a whole seal"
            )))
        }
    };
    if seal.seq != entry.last_seq {
        return Err(ObjectError::Mismatch(format!(
            "its seal says last seq {}, the manifest {}",
            seal.seq, entry.last_seq
        )));
    }
    let end = SegmentChain::after(*chain_before, &bytes[..seal_at]).chain();
    let sealed: ChainValue = seal.payload.try_into().expect("checked: 32 bytes");
    if sealed != end {
        return Err(ObjectError::ChainAfter {
            said_by: "its seal",
            computed: end,
            said: sealed,
        });
    }
    if entry.chain_end != end {
        return Err(ObjectError::ChainAfter {
            said_by: "the manifest's chain_end",
            computed: end,
            said: entry.chain_end,
        });
    }
    Ok(end)
}

/// A tail chunk that passed [`verify_chunk`].
#[derive(Clone, Debug)]
pub struct CheckedChunk<'a> {
    /// Its header.
    pub header: ChunkHeader,
    /// Its body: the segment's bytes from `header.offset`.
    pub body: &'a [u8],
    /// The segment's chain after the body, for the next chunk.
    pub after: SegmentChain,
}

/// Checks the bytes of a tail chunk object against its manifest `entry`
/// and `before`, where the bytes of its segment stand before it: its
/// length; its frame (magic, version, header checksum, body length and
/// CRC: [`ChunkHeader::decode`]); its header's epoch, seqs, segment and
/// offset against the entry; its offset where `before` ends; its
/// `chain_before` the chain there; and the chain of its body, going on
/// from there, its header's `chain_after` and the entry's (ARCHIVE.md
/// "Tail chunk").
pub fn verify_chunk<'a>(
    entry: &ChunkEntry,
    object: &'a [u8],
    before: &SegmentChain,
) -> Result<CheckedChunk<'a>, ObjectError> {
    // Cast: usize to u64 is lossless on the targets we build for.
    if object.len() as u64 != entry.bytes {
        return Err(ObjectError::Mismatch(format!(
            "{} bytes, the manifest says {}",
            object.len(),
            entry.bytes
        )));
    }
    let (header, body) = ChunkHeader::decode(object)?;
    let fields = [
        ("epoch", header.epoch, entry.epoch),
        ("first_seq", header.first_seq, entry.first_seq),
        ("last_seq", header.last_seq, entry.last_seq),
        (
            "segment_first_seq",
            header.segment_first_seq,
            entry.segment_first_seq,
        ),
        ("offset", header.offset, entry.offset),
    ];
    if let Some((field, found, listed)) = fields.into_iter().find(|(_, a, b)| a != b) {
        return Err(ObjectError::Mismatch(format!(
            "its header says {field} {found}, the manifest {listed}"
        )));
    }
    if header.offset != before.offset() {
        return Err(ObjectError::Offset {
            offset: header.offset,
            expected: before.offset(),
        });
    }
    if header.chain_before != before.chain() {
        return Err(ObjectError::ChainBefore {
            field: "chain_before",
            found: header.chain_before,
            expected: before.chain(),
        });
    }
    let mut after = before.clone();
    after.extend(body);
    if after.chain() != header.chain_after {
        return Err(ObjectError::ChainAfter {
            said_by: "its header's chain_after",
            computed: after.chain(),
            said: header.chain_after,
        });
    }
    if after.chain() != entry.chain_after {
        return Err(ObjectError::ChainAfter {
            said_by: "the manifest's chain_after",
            computed: after.chain(),
            said: entry.chain_after,
        });
    }
    Ok(CheckedChunk {
        header,
        body,
        after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{chunk_key, segment_key};
    use spark_log_format::format::{encode_record, encode_seal, RecordIn};

    /// A sealed segment holding seqs `first..=last`, after `chain_start`.
    fn sealed(first: u64, last: u64, chain_start: ChainValue) -> (SegmentEntry, Vec<u8>) {
        let mut bytes = SegmentHeader {
            first_seq: first,
            created_ms: 1,
            chain_start,
        }
        .encode()
        .to_vec();
        for seq in first..=last {
            let record = RecordIn {
                ts_ms: seq,
                kind: 1,
                kind_version: 1,
                payload: b"an op",
            };
            encode_record(&mut bytes, seq, &record).unwrap();
        }
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

    /// A segment's bytes from `chain_start` cut into chunks of seqs
    /// `first..=last`, each `(entry, object)`.
    fn chunks(chain_start: ChainValue, cuts: &[(u64, u64)]) -> Vec<(ChunkEntry, Vec<u8>)> {
        let first = cuts[0].0;
        let mut segment = SegmentHeader {
            first_seq: first,
            created_ms: 1,
            chain_start,
        }
        .encode()
        .to_vec();
        let mut chain = SegmentChain::start(chain_start);
        let mut out = Vec::new();
        for &(from, to) in cuts {
            let offset = chain.offset();
            for seq in from..=to {
                let record = RecordIn {
                    ts_ms: seq,
                    kind: 1,
                    kind_version: 1,
                    payload: b"an op",
                };
                encode_record(&mut segment, seq, &record).unwrap();
            }
            let before = chain.chain();
            let body = &segment[offset as usize..];
            chain.extend(body);
            let header = ChunkHeader {
                epoch: 1,
                first_seq: from,
                last_seq: to,
                segment_first_seq: first,
                offset,
                body_bytes: body.len() as u64,
                body_crc: crc32fast::hash(body),
                chain_before: before,
                chain_after: chain.chain(),
            };
            let object = header.encode(body);
            let entry = ChunkEntry {
                key: chunk_key("p", from, to, 1),
                epoch: 1,
                segment_first_seq: first,
                first_seq: from,
                last_seq: to,
                offset,
                bytes: object.len() as u64,
                blake3: *blake3::hash(&object).as_bytes(),
                chain_after: chain.chain(),
            };
            out.push((entry, object));
        }
        out
    }

    #[test]
    fn sealed_segments_chain_one_after_another() {
        let (first, first_bytes) = sealed(1, 5, [0; 32]);
        let end = verify_sealed(&first, &first_bytes, &[0; 32]).unwrap();
        assert_eq!(end, first.chain_end);
        let (second, second_bytes) = sealed(6, 9, end);
        assert_eq!(
            verify_sealed(&second, &second_bytes, &end).unwrap(),
            second.chain_end
        );
    }

    #[test]
    fn a_sealed_segment_with_a_flipped_byte_is_refused() {
        let (entry, bytes) = sealed(1, 5, [0; 32]);
        // Every byte of the header, the records and the seal.
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(
                verify_sealed(&entry, &bad, &[0; 32]).is_err(),
                "flip at {at} accepted"
            );
        }
        // A record byte: the seal no longer holds the chain.
        let mut bad = bytes.clone();
        bad[HEADER_LEN + 30] ^= 1;
        assert!(matches!(
            verify_sealed(&entry, &bad, &[0; 32]),
            Err(ObjectError::ChainAfter {
                said_by: "its seal",
                ..
            })
        ));
    }

    #[test]
    fn a_sealed_segment_of_another_chain_is_a_fork() {
        let (entry, bytes) = sealed(6, 9, [7; 32]);
        assert!(matches!(
            verify_sealed(&entry, &bytes, &[8; 32]),
            Err(ObjectError::ChainBefore {
                field: "chain_start",
                found,
                expected,
            }) if found == [7; 32] && expected == [8; 32]
        ));
    }

    #[test]
    fn a_wrong_seal_or_chain_end_is_refused() {
        let (entry, bytes) = sealed(1, 5, [0; 32]);
        let seal_at = bytes.len() - SEAL_RECORD_BYTES;
        // A whole seal (its CRC right) over another chain value.
        let mut forged = bytes[..seal_at].to_vec();
        encode_seal(&mut forged, 5, 9, &[3; 32]);
        let entry_forged = SegmentEntry {
            blake3: *blake3::hash(&forged).as_bytes(),
            ..entry.clone()
        };
        assert!(matches!(
            verify_sealed(&entry_forged, &forged, &[0; 32]),
            Err(ObjectError::ChainAfter { said_by: "its seal", said, .. }) if said == [3; 32]
        ));
        // A seal that names another last seq.
        let mut forged = bytes[..seal_at].to_vec();
        encode_seal(&mut forged, 4, 9, &entry.chain_end);
        let err = verify_sealed(&entry, &forged, &[0; 32]).unwrap_err();
        assert!(err.to_string().contains("last seq 4"), "{err}");
        // No seal at all: the bytes end with a record.
        let (open, _) = sealed(1, 6, [0; 32]);
        let unsealed = &bytes[..seal_at];
        let short = SegmentEntry {
            bytes: unsealed.len() as u64,
            ..open
        };
        assert!(verify_sealed(&short, unsealed, &[0; 32]).is_err());
        // The manifest's chain_end is another one.
        let listed = SegmentEntry {
            chain_end: [4; 32],
            ..entry
        };
        assert!(matches!(
            verify_sealed(&listed, &bytes, &[0; 32]),
            Err(ObjectError::ChainAfter {
                said_by: "the manifest's chain_end",
                ..
            })
        ));
    }

    #[test]
    fn chunks_chain_one_after_another() {
        let listed = chunks([5; 32], &[(10, 12), (13, 13), (14, 20)]);
        let mut at = SegmentChain::start([5; 32]);
        for (entry, object) in &listed {
            let checked = verify_chunk(entry, object, &at).unwrap();
            assert_eq!(checked.header.first_seq, entry.first_seq);
            assert_eq!(checked.after.chain(), entry.chain_after);
            at = checked.after;
        }
        // The same chain as the whole segment's bytes in one pass.
        let whole: Vec<u8> = listed
            .iter()
            .flat_map(|(_, o)| o[crate::layout::CHUNK_HEADER_LEN..].to_vec())
            .collect();
        assert_eq!(SegmentChain::after([5; 32], &whole).chain(), at.chain());
        assert_eq!(at.offset(), whole.len() as u64);
    }

    #[test]
    fn a_chunk_with_a_flipped_byte_is_refused() {
        let listed = chunks([5; 32], &[(10, 12), (13, 15)]);
        let (entry, object) = &listed[1];
        let before = verify_chunk(&listed[0].0, &listed[0].1, &SegmentChain::start([5; 32]))
            .unwrap()
            .after;
        for at in 0..object.len() {
            let mut bad = object.clone();
            bad[at] ^= 0x04;
            assert!(
                verify_chunk(entry, &bad, &before).is_err(),
                "flip at {at} accepted"
            );
        }
    }

    #[test]
    fn a_chunk_at_a_wrong_offset_is_refused() {
        let listed = chunks([5; 32], &[(10, 12), (13, 15)]);
        let (entry, object) = &listed[1];
        // The chunk before it left out: its segment's bytes end earlier.
        assert!(matches!(
            verify_chunk(entry, object, &SegmentChain::start([5; 32])),
            Err(ObjectError::Offset { expected: 0, .. })
        ));
        // The manifest lists it at another offset.
        let moved = ChunkEntry {
            offset: entry.offset + 1,
            ..entry.clone()
        };
        let before = SegmentChain::after([5; 32], &listed[0].1[crate::layout::CHUNK_HEADER_LEN..]);
        let err = verify_chunk(&moved, object, &before).unwrap_err();
        assert!(err.to_string().contains("offset"), "{err}");
        assert!(verify_chunk(entry, object, &before).is_ok());
    }

    #[test]
    fn a_chunk_of_another_history_is_a_fork() {
        // The same seqs and offsets, written after another chain.
        let ours = chunks([5; 32], &[(10, 12), (13, 15)]);
        let theirs = chunks([6; 32], &[(10, 12), (13, 15)]);
        let before = verify_chunk(&ours[0].0, &ours[0].1, &SegmentChain::start([5; 32]))
            .unwrap()
            .after;
        let (entry, object) = &theirs[1];
        assert!(matches!(
            verify_chunk(entry, object, &before),
            Err(ObjectError::ChainBefore {
                field: "chain_before",
                ..
            })
        ));
        // A chunk whose header says another chain_after than its bytes give.
        let (entry, object) = &ours[1];
        let (mut header, body) = ChunkHeader::decode(object).unwrap();
        header.chain_after = [1; 32];
        let forged = header.encode(body);
        let listed = ChunkEntry {
            chain_after: [1; 32],
            ..entry.clone()
        };
        assert!(matches!(
            verify_chunk(&listed, &forged, &before),
            Err(ObjectError::ChainAfter {
                said_by: "its header's chain_after",
                ..
            })
        ));
        // A manifest entry whose chain_after is not the chunk's.
        let listed = ChunkEntry {
            chain_after: [1; 32],
            ..entry.clone()
        };
        assert!(matches!(
            verify_chunk(&listed, object, &before),
            Err(ObjectError::ChainAfter {
                said_by: "the manifest's chain_after",
                ..
            })
        ));
    }
}
