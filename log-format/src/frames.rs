//! [`Frames`]: the record frames of a segment's bytes, one after the other,
//! for code outside recovery that walks a segment (history reads, the
//! archive's shipper and its tools) instead of matching
//! [`RecordDecode`] by hand.
//!
//! This is the framing view only (FORMAT.md, "Record frame"): each frame's
//! `len` bounds and CRC are checked, its kind is named, and the walk stops
//! at the first frame that does not decode with a typed [`FramesEnd`]. The
//! seq continuity, the commit marks' counts and checksums and the verdict
//! on a damaged tail (cut it or refuse the log) are recovery's rules
//! ([`Log::open`](crate::Log::open), [`LogReader`](crate::LogReader)); a
//! caller that needs them runs the full decoder.

use crate::format::{
    decode_record, le_u32, Damage, RecordDecode, RecordRef, Seq, COMMIT_KIND_VERSION, KIND_SEAL,
    RECORD_SEQ_OFFSET, SEAL_KIND_VERSION,
};

/// What a frame holds, from its `kind` and `kind_version` (FORMAT.md,
/// "Seal" and "Commit mark").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// A record appended by the log's user: any `kind` but [`KIND_SEAL`].
    Op,
    /// Kind [`KIND_SEAL`], version [`COMMIT_KIND_VERSION`]: a version-2
    /// commit mark, closing the batch of records before it. A version-1
    /// segment has none; its reader decides what such a frame means there.
    CommitMark,
    /// Kind [`KIND_SEAL`], version [`SEAL_KIND_VERSION`]: the seal, the
    /// last frame of a sealed segment.
    Seal,
    /// Kind [`KIND_SEAL`] with any other version: a marker this build does
    /// not know (the version it carries).
    UnknownMarker(u16),
}

impl FrameKind {
    /// The kind of `record`, from its `kind` and `kind_version`.
    pub fn of(record: &RecordRef<'_>) -> FrameKind {
        if record.kind != KIND_SEAL {
            return FrameKind::Op;
        }
        match record.kind_version {
            COMMIT_KIND_VERSION => FrameKind::CommitMark,
            SEAL_KIND_VERSION => FrameKind::Seal,
            other => FrameKind::UnknownMarker(other),
        }
    }
}

/// One whole, checksum-valid frame, borrowed from the bytes walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// What the frame holds.
    pub kind: FrameKind,
    /// The decoded frame: seq, `ts_ms`, kind, kind version, payload, and
    /// its offset (of its `len` field) in the bytes walked.
    pub record: RecordRef<'a>,
    /// Bytes the frame occupies (8 + `len`).
    pub size: usize,
}

impl Frame<'_> {
    /// Its seq (for a seal, the segment's last record; for a commit mark,
    /// the last record of the batch it closes).
    pub fn seq(&self) -> Seq {
        self.record.seq
    }

    /// Offset of its `len` field in the bytes walked.
    pub fn offset(&self) -> usize {
        // Cast: the offset was a usize when it was decoded.
        self.record.offset as usize
    }

    /// Offset just past it: where the next frame starts.
    pub fn end(&self) -> usize {
        self.offset() + self.size
    }
}

/// Why a [`Frames`] walk stopped. Offsets are in the bytes walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FramesEnd {
    /// The bytes end at `offset`, just past the last frame, or only zero
    /// bytes follow it (the writer's zero-filled, pre-allocated tail).
    Clean {
        /// Where the frames end.
        offset: usize,
    },
    /// The frame at `offset` runs to or past the end of the bytes and does
    /// not decode (`damage` is [`Damage::Truncated`] or [`Damage::BadCrc`]):
    /// a write cut short, as a power cut leaves at the end of the last
    /// segment. Whether it may be cut is recovery's verdict, not this one.
    TornTail {
        /// Offset of the frame's `len` field.
        offset: usize,
        /// What is wrong with it.
        damage: Damage,
    },
    /// The frame at `offset` does not decode and bytes that are not all
    /// zero follow it: damage inside the bytes.
    Damaged {
        /// Offset of the frame's `len` field.
        offset: usize,
        /// What is wrong with it.
        damage: Damage,
    },
}

impl FramesEnd {
    /// Offset where the walk stopped: the end of the last whole frame.
    pub fn offset(&self) -> usize {
        match *self {
            FramesEnd::Clean { offset }
            | FramesEnd::TornTail { offset, .. }
            | FramesEnd::Damaged { offset, .. } => offset,
        }
    }
}

/// The whole, checksum-valid frames of `bytes` from an offset, in order
/// (FORMAT.md, "Record frame"); [`Frames::end`] says why the walk stopped.
///
/// Each frame's `len` is checked against the limit before the bytes it
/// covers are read, then its CRC; nothing is allocated. Frames after a
/// seal are still walked: a caller that stops at the seal says so.
#[derive(Clone, Debug)]
pub struct Frames<'a> {
    /// The bytes walked (a segment, or a range of one).
    bytes: &'a [u8],
    /// Where the next frame starts.
    offset: usize,
    /// Largest `len` accepted, as the log's `max_record_bytes`.
    max_record_bytes: u32,
    /// Why the walk stopped, once it has.
    end: Option<FramesEnd>,
}

impl<'a> Frames<'a> {
    /// The frames of `bytes` from `offset` (the end of a header or of a
    /// frame), refusing a `len` above `max_record_bytes`.
    pub fn new(bytes: &'a [u8], offset: usize, max_record_bytes: u32) -> Frames<'a> {
        Frames {
            bytes,
            offset,
            max_record_bytes,
            end: None,
        }
    }

    /// Where the next frame would start: past the last frame yielded.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Why the walk stopped; `None` while it has not.
    pub fn end(&self) -> Option<FramesEnd> {
        self.end
    }

    /// Classifies the frame at `offset`, which does not decode (`damage`).
    fn stop(&self, damage: Damage) -> FramesEnd {
        let offset = self.offset;
        let rest = self.bytes.get(offset..).unwrap_or(&[]);
        if rest.iter().all(|&b| b == 0) {
            return FramesEnd::Clean { offset };
        }
        // The frame's extent by its `len` field; an unreadable field is
        // itself at the end of the bytes.
        let reaches_end = le_u32(rest, 0)
            .and_then(|len| usize::try_from(len).ok())
            .and_then(|len| RECORD_SEQ_OFFSET.checked_add(len))
            .is_none_or(|size| size >= rest.len());
        if reaches_end && matches!(damage, Damage::Truncated | Damage::BadCrc) {
            FramesEnd::TornTail { offset, damage }
        } else {
            FramesEnd::Damaged { offset, damage }
        }
    }
}

impl<'a> Iterator for Frames<'a> {
    type Item = Frame<'a>;

    fn next(&mut self) -> Option<Frame<'a>> {
        if self.end.is_some() {
            return None;
        }
        match decode_record(self.bytes, self.offset, self.max_record_bytes) {
            RecordDecode::Record { record, size } => {
                self.offset += size;
                Some(Frame {
                    kind: FrameKind::of(&record),
                    record,
                    size,
                })
            }
            RecordDecode::End => {
                self.end = Some(FramesEnd::Clean {
                    offset: self.offset,
                });
                None
            }
            RecordDecode::Damaged(damage) => {
                self.end = Some(self.stop(damage));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{
        encode_commit, encode_record, encode_seal, CommitMark, RecordIn, DEFAULT_MAX_RECORD_BYTES,
        HEADER_LEN, RECORD_CRC_OFFSET,
    };

    fn op(seq: Seq, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_record(
            &mut out,
            seq,
            &RecordIn {
                ts_ms: 7,
                kind: 3,
                kind_version: 1,
                payload,
            },
        )
        .unwrap();
        out
    }

    /// A header's worth of filler, two ops closed by a commit mark, one
    /// more op and its mark: the frames' offsets.
    fn segment() -> (Vec<u8>, Vec<usize>) {
        let mut bytes = vec![0xEE; HEADER_LEN];
        let mut offsets = Vec::new();
        let batch_start = bytes.len();
        for (seq, payload) in [(1, &b"a"[..]), (2, b"bc")] {
            offsets.push(bytes.len());
            bytes.extend(op(seq, payload));
        }
        let mark = CommitMark::for_batch(&bytes[batch_start..], 2);
        offsets.push(bytes.len());
        encode_commit(&mut bytes, 2, 8, &mark);
        let batch_start = bytes.len();
        offsets.push(bytes.len());
        bytes.extend(op(3, b"def"));
        let mark = CommitMark::for_batch(&bytes[batch_start..], 1);
        offsets.push(bytes.len());
        encode_commit(&mut bytes, 3, 9, &mark);
        (bytes, offsets)
    }

    fn walk(bytes: &[u8]) -> (Vec<(FrameKind, Seq, usize)>, Option<FramesEnd>) {
        let mut frames = Frames::new(bytes, HEADER_LEN, DEFAULT_MAX_RECORD_BYTES);
        let seen = frames
            .by_ref()
            .map(|f| (f.kind, f.seq(), f.offset()))
            .collect();
        (seen, frames.end())
    }

    #[test]
    fn clean_segment_yields_every_frame_and_ends_clean() {
        let (bytes, offsets) = segment();
        let mut frames = Frames::new(&bytes, HEADER_LEN, DEFAULT_MAX_RECORD_BYTES);
        let first = frames.next().unwrap();
        assert_eq!(first.record.payload, b"a");
        assert_eq!((first.offset(), first.end()), (offsets[0], offsets[1]));
        assert_eq!(frames.offset(), offsets[1]);
        let (seen, end) = walk(&bytes);
        use FrameKind::{CommitMark as Mark, Op};
        let kinds: Vec<_> = seen.iter().map(|&(k, s, _)| (k, s)).collect();
        assert_eq!(kinds, [(Op, 1), (Op, 2), (Mark, 2), (Op, 3), (Mark, 3)]);
        let at: Vec<_> = seen.iter().map(|&(_, _, o)| o).collect();
        assert_eq!(at, offsets);
        assert_eq!(
            end,
            Some(FramesEnd::Clean {
                offset: bytes.len()
            })
        );
        // A zero-filled tail is the end too.
        let mut padded = bytes.clone();
        padded.resize(bytes.len() + 4096, 0);
        assert_eq!(
            walk(&padded).1,
            Some(FramesEnd::Clean {
                offset: bytes.len()
            })
        );
    }

    #[test]
    fn torn_tail_stops_at_the_last_whole_frame() {
        let (bytes, offsets) = segment();
        let last = *offsets.last().unwrap();
        for cut in [last + 2, last + 9, bytes.len() - 1] {
            let (seen, end) = walk(&bytes[..cut]);
            assert_eq!(seen.len(), 4, "cut at {cut}");
            assert_eq!(
                end,
                Some(FramesEnd::TornTail {
                    offset: last,
                    damage: Damage::Truncated
                }),
                "cut at {cut}"
            );
        }
        // The last frame whole in length but its checksum wrong (a page
        // that never reached the disk): torn too.
        let mut torn = bytes.clone();
        *torn.last_mut().unwrap() ^= 0xFF;
        assert_eq!(
            walk(&torn).1,
            Some(FramesEnd::TornTail {
                offset: last,
                damage: Damage::BadCrc
            })
        );
    }

    #[test]
    fn flipped_byte_is_damage_at_its_frame() {
        let (bytes, offsets) = segment();
        let mut flipped = bytes.clone();
        flipped[offsets[1] + RECORD_CRC_OFFSET + 6] ^= 0x01;
        let (seen, end) = walk(&flipped);
        assert_eq!(seen.len(), 1);
        assert_eq!(
            end,
            Some(FramesEnd::Damaged {
                offset: offsets[1],
                damage: Damage::BadCrc
            })
        );
        assert_eq!(end.unwrap().offset(), offsets[1]);
        // A `len` over the limit is refused before its bytes are read.
        let mut frames = Frames::new(&bytes, HEADER_LEN, 20);
        assert!(frames.next().is_none());
        assert_eq!(
            frames.end(),
            Some(FramesEnd::Damaged {
                offset: HEADER_LEN,
                damage: Damage::LenOverLimit(21)
            })
        );
    }

    #[test]
    fn seal_is_named_and_frames_after_it_are_still_walked() {
        let (mut bytes, _) = segment();
        let seal_at = bytes.len();
        encode_seal(&mut bytes, 3, 10, &[0x5A; 32]);
        let (seen, end) = walk(&bytes);
        assert_eq!(seen.last(), Some(&(FrameKind::Seal, 3, seal_at)));
        assert_eq!(
            end,
            Some(FramesEnd::Clean {
                offset: bytes.len()
            })
        );
        let unknown = RecordIn {
            ts_ms: 0,
            kind: KIND_SEAL,
            kind_version: 9,
            payload: b"",
        };
        let mut marker = Vec::new();
        encode_record(&mut marker, 1, &unknown).unwrap();
        let mut frames = Frames::new(&marker, 0, DEFAULT_MAX_RECORD_BYTES);
        assert_eq!(frames.next().unwrap().kind, FrameKind::UnknownMarker(9));
        assert!(frames.next().is_none());
        assert!(frames.next().is_none());
    }
}
