//! Guards the corruption rule: a damaged byte that is not a torn tail (an
//! earlier record of the last segment, anything in a sealed segment, a
//! rewritten record with a fixed-up CRC) is refused with its segment, offset
//! and seq, by Log::open and LogReader alike, and nothing is written.

use crate::common;

use std::ops::ControlFlow;

use common::*;
use spark_log_format::format::{
    header_crc, COMMIT_CRC_OFFSET, COMMIT_RECORD_BYTES, HEADER_CHAIN_START_OFFSET,
    HEADER_CRC_OFFSET, HEADER_FIRST_SEQ_OFFSET, RECORD_CRC_OFFSET, RECORD_PAYLOAD_OFFSET,
    RECORD_SEQ_OFFSET,
};
use spark_log_format::{FaultSeq, LogReader, ScanOptions, HEADER_LEN};

/// Segment size of the built logs: three or four single-record batches
/// (each record followed by its 48-byte commit mark) per segment.
const SEGMENT_BYTES: u64 = 430;

/// Recomputes the CRC of the frame at `at` (its `len` bytes and the `len`
/// bytes from `seq` on) after its bytes were changed.
fn fix_frame_crc(bytes: &mut [u8], at: usize) {
    let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[at..at + 4]);
    crc.update(&bytes[at + RECORD_SEQ_OFFSET..at + RECORD_SEQ_OFFSET + len]);
    bytes[at + RECORD_CRC_OFFSET..at + RECORD_SEQ_OFFSET]
        .copy_from_slice(&crc.finalize().to_le_bytes());
}

/// After the single-record batch at `at` (`size` bytes) was rewritten with
/// a fixed CRC, fixes its commit mark too (batch checksum and frame CRC),
/// as a forger would: only the chain can catch it then.
fn fix_commit_mark(bytes: &mut [u8], at: usize, size: usize) {
    let mark = at + size;
    let batch_crc = crc32fast::hash(&bytes[at..mark]);
    let field = mark + RECORD_PAYLOAD_OFFSET + COMMIT_CRC_OFFSET;
    bytes[field..field + 4].copy_from_slice(&batch_crc.to_le_bytes());
    fix_frame_crc(bytes, mark);
}

/// A log of `n` single-record batches in ~430-byte segments, with every
/// record's segment and offset.
struct Built {
    dir: tempfile::TempDir,
    /// (segment name, offset, record)
    records: Vec<(String, u64, Owned)>,
    heads: Vec<spark_log_format::Head>,
}

fn build(n: u64) -> Built {
    let dir = tempfile::tempdir().unwrap();
    let all: Vec<Owned> = (1..=n).map(sample).collect();
    let (mut log, _, _) = open_collect(dir.path(), config(SEGMENT_BYTES), os()).unwrap();
    let heads = append_each(&mut log, &all);
    drop(log);
    let mut records = Vec::new();
    LogReader::open(dir.path())
        .unwrap()
        .scan(ScanOptions::default(), |info, r| {
            records.push((info.name.clone(), r.offset, Owned::from_ref(&r)));
            ControlFlow::Continue(())
        })
        .unwrap();
    Built {
        dir,
        records,
        heads,
    }
}

/// Opens a damaged copy with Log::open and LogReader: both must refuse with
/// the same place, and Log::open must not touch the files.
fn refused(dir: &std::path::Path) -> (String, u64, FaultSeq) {
    let before: Vec<Vec<u8>> = segment_paths(dir)
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    let error = match open_collect(dir, config(SEGMENT_BYTES), os()) {
        Ok((_, _, seen)) => panic!("damaged log opened with {} records", seen.len()),
        Err(e) => e,
    };
    let fields = corrupt_fields(&error);
    assert_eq!(
        corrupt_fields(&reader_error(dir)),
        fields,
        "reader disagrees: {error}"
    );
    let after: Vec<Vec<u8>> = segment_paths(dir)
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert_eq!(before, after, "a refused open wrote to the log");
    fields
}

#[test]
fn flipped_byte_in_an_earlier_record_of_the_last_segment() {
    let built = build(14);
    let last_name = built.records.last().unwrap().0.clone();
    let in_last: Vec<_> = built
        .records
        .iter()
        .filter(|r| r.0 == last_name)
        .cloned()
        .collect();
    assert!(
        in_last.len() >= 3,
        "want several records in the last segment"
    );
    for (name, offset, record) in &in_last[..in_last.len() - 1] {
        let size = RECORD_PAYLOAD_OFFSET + record.payload.len();
        for byte in 0..size {
            for mask in [0x01, 0xFF] {
                let copy = copy_dir(built.dir.path());
                flip(&copy.path().join(name), *offset as usize + byte, mask);
                let (segment, at, seq) = refused(copy.path());
                // The faulty record's own seq, not the last good one.
                assert_eq!(
                    (segment.as_str(), at, seq),
                    (name.as_str(), *offset, FaultSeq::Record(record.seq)),
                    "byte {byte} of seq {} with mask {mask:#x}",
                    record.seq
                );
            }
        }
    }
}

#[test]
fn flipped_byte_anywhere_in_a_sealed_segment() {
    let built = build(14);
    let reader = LogReader::open(built.dir.path()).unwrap();
    let segments = reader.segments().to_vec();
    assert!(segments.len() >= 3);
    // The first and a middle sealed segment.
    for sealed in &segments[..2] {
        assert!(sealed.sealed);
        let path = built.dir.path().join(&sealed.name);
        let len = std::fs::metadata(&path).unwrap().len() as usize;
        let records: Vec<_> = built
            .records
            .iter()
            .filter(|r| r.0 == sealed.name)
            .collect();
        let seal_offset = len - 60;
        for byte in 0..len {
            let copy = copy_dir(built.dir.path());
            flip(&copy.path().join(&sealed.name), byte, 0x5A);
            let (segment, at, seq) = refused(copy.path());
            assert_eq!(segment, sealed.name, "byte {byte}");
            if byte < HEADER_LEN {
                assert!(
                    at < HEADER_LEN as u64,
                    "header byte {byte} reported at {at}"
                );
                assert_eq!(
                    seq,
                    FaultSeq::Header(sealed.first_seq),
                    "header byte {byte}"
                );
            } else if byte >= seal_offset {
                assert_eq!(
                    (at, seq),
                    (seal_offset as u64, FaultSeq::After(sealed.last_seq)),
                    "seal byte {byte}"
                );
            } else {
                let (_, offset, record) =
                    records.iter().rev().find(|r| r.1 as usize <= byte).unwrap();
                // Each record is followed by its batch's commit mark.
                let mark = *offset as usize + RECORD_PAYLOAD_OFFSET + record.payload.len();
                if byte < mark {
                    assert_eq!(
                        (at, seq),
                        (*offset, FaultSeq::Record(record.seq)),
                        "record byte {byte}"
                    );
                } else {
                    assert!(byte < mark + COMMIT_RECORD_BYTES);
                    assert_eq!(
                        (at, seq),
                        (mark as u64, FaultSeq::After(record.seq)),
                        "mark byte {byte}"
                    );
                }
            }
        }
    }
}

#[test]
fn rewritten_record_with_fixed_crc_is_caught_by_the_chain() {
    let built = build(14);
    let (name, offset, record) = built.records[1].clone();
    let copy = copy_dir(built.dir.path());
    let path = copy.path().join(&name);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = offset as usize;
    bytes[at + RECORD_PAYLOAD_OFFSET] ^= 0x10;
    fix_frame_crc(&mut bytes, at);
    std::fs::write(&path, &bytes).unwrap();
    // The batch's commit mark catches a rewrite that fixed only the CRC.
    let error = open_collect(copy.path(), config(SEGMENT_BYTES), os())
        .map(|_| ())
        .unwrap_err();
    assert!(error.to_string().contains("commit mark"), "{error}");
    // A forger who fixes the mark too is caught by the chain.
    fix_commit_mark(&mut bytes, at, RECORD_PAYLOAD_OFFSET + record.payload.len());
    std::fs::write(&path, &bytes).unwrap();

    let error = open_collect(copy.path(), config(SEGMENT_BYTES), os())
        .map(|_| ())
        .unwrap_err();
    assert!(error.to_string().contains("chain mismatch"), "{error}");
    let seal_offset = bytes.len() as u64 - 60;
    let fields = corrupt_fields(&error);
    assert_eq!((fields.0.as_str(), fields.1), (name.as_str(), seal_offset));
    // The reader finds it only when it verifies the chain.
    let reader = LogReader::open(copy.path()).unwrap();
    let scanned = reader.scan(ScanOptions::default(), |_, _| ControlFlow::Continue(()));
    assert_eq!(corrupt_fields(&scanned.unwrap_err()), fields);
    let unchecked = ScanOptions {
        verify_chain: false,
        ..ScanOptions::default()
    };
    assert!(reader
        .scan(unchecked, |_, _| ControlFlow::Continue(()))
        .is_ok());

    // In the unsealed last segment a rewrite has no seal to fail, but the
    // head chain changes: anyone who recorded the head sees it.
    let (name, offset, record) = built.records.last().unwrap().clone();
    let copy = copy_dir(built.dir.path());
    let path = copy.path().join(&name);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = offset as usize;
    bytes[at + RECORD_PAYLOAD_OFFSET] ^= 0x10;
    fix_frame_crc(&mut bytes, at);
    fix_commit_mark(&mut bytes, at, RECORD_PAYLOAD_OFFSET + record.payload.len());
    std::fs::write(&path, &bytes).unwrap();
    let (log, _, _) = open_collect(copy.path(), config(SEGMENT_BYTES), os()).unwrap();
    let original = built.heads.last().unwrap();
    assert_eq!(log.head().seq, original.seq);
    assert_ne!(log.head().chain, original.chain);
}

#[test]
fn broken_link_between_segments_is_refused() {
    let built = build(14);
    let reader = LogReader::open(built.dir.path()).unwrap();
    let second = reader.segments()[1].clone();
    let copy = copy_dir(built.dir.path());
    let path = copy.path().join(&second.name);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[HEADER_CHAIN_START_OFFSET] ^= 1;
    let crc = header_crc(&bytes[..HEADER_LEN]);
    bytes[HEADER_CRC_OFFSET..HEADER_FIRST_SEQ_OFFSET].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let (segment, offset, seq) = refused(copy.path());
    assert_eq!(segment, second.name);
    assert_eq!(offset, HEADER_CHAIN_START_OFFSET as u64);
    // A header fault names the seq the segment was expected to start at
    // (FORMAT.md, "Corrupt"), in the field and in the words.
    assert_eq!(seq, FaultSeq::Header(second.first_seq));
    let error = reader_error(copy.path()).to_string();
    assert!(
        error.contains(&format!("expected to start at seq {}", second.first_seq)),
        "{error}"
    );
}

#[test]
fn a_newer_format_version_is_unsupported_not_corrupt() {
    let built = build(3);
    let copy = copy_dir(built.dir.path());
    let path = segment_paths(copy.path()).remove(0);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = 3;
    let crc = header_crc(&bytes[..HEADER_LEN]);
    bytes[HEADER_CRC_OFFSET..HEADER_FIRST_SEQ_OFFSET].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    for error in [
        open_collect(copy.path(), config(SEGMENT_BYTES), os())
            .map(|_| ())
            .unwrap_err(),
        reader_error(copy.path()),
    ] {
        assert!(
            matches!(
                error,
                spark_log_format::LogError::UnsupportedVersion {
                    found: 3,
                    supported: 2,
                    ..
                }
            ),
            "{error:?}"
        );
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the unreadable segment was touched"
    );
}

#[test]
fn a_seg_file_whose_name_is_not_20_digits_is_a_stray_file() {
    let built = build(5);
    let copy = copy_dir(built.dir.path());
    std::fs::write(copy.path().join("1.seg"), b"not a segment").unwrap();
    let stray = |e: spark_log_format::LogError| match e {
        spark_log_format::LogError::StrayFile { name } => name,
        other => panic!("not reported as a stray file: {other}"),
    };
    let error = match open_collect(copy.path(), config(SEGMENT_BYTES), os()) {
        Ok(_) => panic!("a stray .seg file is refused"),
        Err(e) => stray(e),
    };
    assert_eq!(error, "1.seg");
    assert_eq!(stray(reader_error(copy.path())), "1.seg");
    // Moved out of the directory, the log opens whole.
    std::fs::remove_file(copy.path().join("1.seg")).unwrap();
    let (_, _, seen) = open_collect(copy.path(), config(SEGMENT_BYTES), os()).unwrap();
    assert_eq!(seen.len(), 5);
}
