//! Guards the torn-tail rule: a last segment cut anywhere inside its last
//! batch (its record and commit mark), or followed by garbage or zeros,
//! recovers every committed record (and only those), truncates the rest,
//! and appends continue without a gap.

use crate::common;

use std::fs::OpenOptions;

use common::*;
use spark_log_format::format::COMMIT_RECORD_BYTES;
use spark_log_format::{LogReader, RECORD_HEADER_LEN};

/// Segment size of the built logs: three or four single-record batches
/// (each record followed by its 48-byte commit mark) per segment.
const SEGMENT_BYTES: u64 = 430;

/// Builds a log of `n` records, one batch each, with segments of ~430 bytes
/// so that several are sealed and the last holds several records.
fn build(n: u64) -> (tempfile::TempDir, Vec<Owned>, Vec<spark_log_format::Head>) {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<Owned> = (1..=n).map(sample).collect();
    let (mut log, _, _) = open_collect(dir.path(), config(SEGMENT_BYTES), os()).unwrap();
    let heads = append_each(&mut log, &records);
    drop(log);
    (dir, records, heads)
}

/// A copy of the log in `dir` with `tail` appended to segment `name`: the
/// copy, the segment's path in it and its bytes now.
fn with_tail(
    dir: &std::path::Path,
    name: &str,
    tail: &[u8],
) -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>) {
    let copy = copy_dir(dir);
    let path = copy.path().join(name);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(tail);
    std::fs::write(&path, &bytes).unwrap();
    (copy, path, bytes)
}

#[test]
fn cut_at_every_offset_inside_the_last_record() {
    let (dir, records, heads) = build(14);
    let reader = LogReader::open(dir.path()).unwrap();
    let segments = reader.segments().to_vec();
    assert!(
        segments.len() >= 3,
        "want sealed segments before the last: {segments:?}"
    );
    let last_segment = segments.last().unwrap().clone();
    assert!(
        last_segment.last_seq - last_segment.first_seq >= 1,
        "the last segment must hold at least two records"
    );
    let last = records.last().unwrap();
    // The last batch: the record and its commit mark.
    let size = (RECORD_HEADER_LEN + last.payload.len() + COMMIT_RECORD_BYTES) as u64;
    let end = last_segment.bytes;
    let start = end - size;
    let n = records.len();

    for cut in start..=end {
        let copy = copy_dir(dir.path());
        let path = copy.path().join(&last_segment.name);
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(cut)
            .unwrap();

        let whole = if cut == end { n } else { n - 1 };
        let (mut log, report, seen) =
            open_collect(copy.path(), config(SEGMENT_BYTES), os()).unwrap();
        assert_eq!(seen, records[..whole], "cut at {cut}");
        assert_eq!(log.head(), heads[whole - 1], "cut at {cut}");
        assert_eq!(report.records, whole as u64);
        match &report.truncated {
            Some(torn) => {
                assert!(cut > start && cut < end, "cut at {cut} reported torn");
                assert_eq!(torn.segment, last_segment.name);
                assert_eq!(torn.offset, start);
                assert_eq!(torn.bytes_dropped, cut - start);
            }
            None => assert!(cut == start || cut == end, "cut at {cut} not reported"),
        }
        let kept = if cut == end { end } else { start };
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            kept,
            "cut at {cut}"
        );

        // Appending continues gapless, and the result reopens and verifies.
        let next = sample(whole as u64 + 1);
        assert_eq!(log.append_batch(&[next.as_in()]).unwrap(), whole as u64 + 1);
        let head = log.head();
        drop(log);
        let (log, report, seen) = open_collect(copy.path(), config(SEGMENT_BYTES), os()).unwrap();
        assert!(report.truncated.is_none());
        assert_eq!(seen.len(), whole + 1);
        assert_eq!(seen[..whole], records[..whole]);
        assert_eq!(seen[whole], next);
        assert_eq!(log.head(), head);
        let (scan, scanned) = scan_collect(copy.path()).unwrap();
        assert_eq!(scanned, seen);
        assert_eq!(scan.head, head);
    }
}

#[test]
fn garbage_at_the_tail_is_truncated() {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    };
    let mut partial_frame = 50u32.to_le_bytes().to_vec();
    partial_frame.extend_from_slice(&[0xAB; 20]);
    let mut zeros_then_garbage = vec![0; 100];
    zeros_then_garbage.extend_from_slice(&noise(3));
    let tails: Vec<(&str, Vec<u8>)> = vec![
        ("3 bytes of garbage", noise(3)),
        ("100 bytes of garbage", noise(100)),
        ("64 KiB of garbage", noise(64 << 10)),
        ("a frame start without its body", partial_frame),
        ("len 0xFFFFFFFF", vec![0xFF; 40]),
        ("zeros, then garbage", zeros_then_garbage),
    ];
    for single_segment in [true, false] {
        let n = if single_segment { 3 } else { 12 };
        let (dir, records, heads) = build(n);
        let before = LogReader::open(dir.path()).unwrap().segments().to_vec();
        assert_eq!(before.len() == 1, single_segment);
        let last = before.last().unwrap().clone();
        for (what, tail) in &tails {
            let (copy, path, _) = with_tail(dir.path(), &last.name, tail);

            let reader = LogReader::open(copy.path()).unwrap();
            let torn = reader
                .torn_tail()
                .cloned()
                .expect("reader reports the tail");
            assert_eq!(
                (torn.offset, torn.bytes_dropped),
                (last.bytes, tail.len() as u64),
                "{what}"
            );

            let (mut log, report, seen) =
                open_collect(copy.path(), config(SEGMENT_BYTES), os()).unwrap();
            assert_eq!(seen, records, "{what}");
            assert_eq!(log.head(), *heads.last().unwrap(), "{what}");
            let truncated = report.truncated.expect(what);
            assert_eq!(truncated.segment, last.name, "{what}");
            assert_eq!(truncated.offset, last.bytes, "{what}");
            assert_eq!(truncated.bytes_dropped, tail.len() as u64, "{what}");
            assert_eq!(
                std::fs::metadata(&path).unwrap().len(),
                last.bytes,
                "{what}"
            );

            let next = sample(n + 1);
            assert_eq!(log.append_batch(&[next.as_in()]).unwrap(), n + 1);
            drop(log);
            let (scan, seen) = scan_collect(copy.path()).unwrap();
            assert_eq!(seen.len() as u64, n + 1, "{what}");
            assert!(scan.torn_tail.is_none(), "{what}");
        }
    }
}

/// Zeros after the last record (the writer's zero fill ahead, or a size
/// made durable before its data) are the end of the log: nothing is
/// reported or cut, the reader and recovery agree, and the next append
/// overwrites the zeros from the old end on.
#[test]
fn zeros_at_the_tail_are_the_end_of_the_log() {
    let tails: Vec<(&str, Vec<u8>)> = vec![
        ("1 zero", vec![0]),
        ("7 zeros", vec![0; 7]),
        ("8 zeros", vec![0; 8]),
        ("4096 zeros", vec![0; 4096]),
    ];
    for single_segment in [true, false] {
        let n = if single_segment { 3 } else { 12 };
        let (dir, records, heads) = build(n);
        let before = LogReader::open(dir.path()).unwrap().segments().to_vec();
        assert_eq!(before.len() == 1, single_segment);
        let last = before.last().unwrap().clone();
        for (what, tail) in &tails {
            let (copy, path, bytes) = with_tail(dir.path(), &last.name, tail);
            let file_len = bytes.len() as u64;

            let (scan, scanned) = scan_collect(copy.path()).unwrap();
            assert!(scan.torn_tail.is_none(), "{what}");
            assert_eq!(scanned, records, "{what}");
            assert_eq!(scan.head, *heads.last().unwrap(), "{what}");
            let reader = LogReader::open(copy.path()).unwrap();
            assert_eq!(reader.segments().last().unwrap().bytes, last.bytes);

            let (mut log, report, seen) =
                open_collect(copy.path(), config(SEGMENT_BYTES), os()).unwrap();
            assert_eq!(seen, records, "{what}");
            assert_eq!(log.head(), *heads.last().unwrap(), "{what}");
            assert!(report.truncated.is_none(), "{what}");
            assert_eq!(std::fs::metadata(&path).unwrap().len(), file_len, "{what}");

            let next = sample(n + 1);
            assert_eq!(log.append_batch(&[next.as_in()]).unwrap(), n + 1);
            let head = log.head();
            drop(log);
            let (scan, seen) = scan_collect(copy.path()).unwrap();
            assert_eq!(seen.len() as u64, n + 1, "{what}");
            assert_eq!(seen[..n as usize], records[..], "{what}");
            assert_eq!(seen[n as usize], next, "{what}");
            assert!(scan.torn_tail.is_none(), "{what}");
            assert_eq!(scan.head, head, "{what}");
            // The batch went where the zeros began, in the same segment
            // unless it had to roll.
            let after = LogReader::open(copy.path()).unwrap().segments().to_vec();
            if after.len() == before.len() {
                let grown = after.last().unwrap().bytes;
                assert_eq!(
                    grown,
                    last.bytes
                        + (RECORD_HEADER_LEN + next.payload.len() + COMMIT_RECORD_BYTES) as u64,
                    "{what}"
                );
            }
            let (_, report, seen) = open_collect(copy.path(), config(SEGMENT_BYTES), os()).unwrap();
            assert!(report.truncated.is_none(), "{what}");
            assert_eq!(seen.len() as u64, n + 1, "{what}");
        }
    }
}

/// Zeros followed by a stray non-zero byte are not the end of written data:
/// recovery cuts them as a torn tail (keeping a copy, since a byte is not
/// zero), and both recovery and the reader say so, naming where the
/// non-zero bytes start.
#[test]
fn zeros_then_a_stray_byte_are_described_as_what_they_are() {
    let (dir, records, heads) = build(3);
    let last = LogReader::open(dir.path()).unwrap().segments().to_vec()[0].clone();
    let mut tail = vec![0; 100];
    tail.push(0x01);
    let (copy, _, _) = with_tail(dir.path(), &last.name, &tail);
    let stray = last.bytes + 100;

    let reader = LogReader::open(copy.path()).unwrap();
    let torn = reader
        .torn_tail()
        .cloned()
        .expect("the reader sees the tail");
    let (log, report, seen) = open_collect(copy.path(), config(SEGMENT_BYTES), os()).unwrap();
    let cut = report.truncated.expect("recovery cuts the tail");
    assert_eq!(seen, records);
    assert_eq!(log.head(), *heads.last().unwrap());
    assert!(
        cut.quarantine.is_some(),
        "a copy of the non-zero tail is kept"
    );
    for damage in [&torn.damage, &cut.damage] {
        assert!(!damage.contains("(end of written data)"), "{damage}");
        assert!(
            damage.contains("not a clean end of written data"),
            "{damage}"
        );
        assert!(damage.contains("zero bytes"), "{damage}");
        assert!(damage.contains("non-zero"), "{damage}");
        assert!(damage.contains(&format!("offset {stray}")), "{damage}");
    }
    assert_eq!(torn.damage, cut.damage);
    assert!(!torn.whole_frame && !cut.whole_frame);
}
