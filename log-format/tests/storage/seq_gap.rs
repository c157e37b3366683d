//! Guards seq continuity: a gap or a repeat within a segment (sealed or
//! last), between segments, a missing segment, a file name that disagrees
//! with its header, or a log that does not start at seq 1 is refused.

use crate::common;

use common::*;
use spark_log_format::format::{segment_file_name, HEADER_FIRST_SEQ_OFFSET};
use spark_log_format::FaultSeq;

fn refused(dir: &std::path::Path) -> (String, u64, FaultSeq, String) {
    let error = match open_collect(dir, config(1 << 20), os()) {
        Ok((_, _, seen)) => panic!("log with a gap opened with {} records", seen.len()),
        Err(e) => e,
    };
    let (segment, offset, seq) = corrupt_fields(&error);
    assert_eq!(
        corrupt_fields(&reader_error(dir)),
        (segment.clone(), offset, seq)
    );
    (segment, offset, seq, error.to_string())
}

#[test]
fn gap_within_the_last_segment() {
    let dir = tempfile::tempdir().unwrap();
    let seg = SegmentBytes::new(1, [0; 32])
        .record(1)
        .record(2)
        .record(4)
        .record(5);
    seg.write(dir.path());
    let (segment, offset, seq, message) = refused(dir.path());
    assert_eq!(segment, segment_file_name(1));
    // The faulty record is the one where seq 3 belongs.
    assert_eq!((offset, seq), (seg.offsets[2] as u64, FaultSeq::Record(3)));
    assert!(
        message.contains("(seq 3): seq gap: expected seq 3, found 4"),
        "{message}"
    );
}

#[test]
fn gap_at_the_very_tail_is_not_a_torn_write() {
    // A whole, checksum-valid record with the wrong seq is data, not a tear.
    let dir = tempfile::tempdir().unwrap();
    let seg = SegmentBytes::new(1, [0; 32]).record(1).record(2).record(4);
    seg.write(dir.path());
    let (_, offset, seq, _) = refused(dir.path());
    assert_eq!((offset, seq), (seg.offsets[2] as u64, FaultSeq::Record(3)));
}

#[test]
fn repeated_seq_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let seg = SegmentBytes::new(1, [0; 32])
        .record(1)
        .record(2)
        .record(2)
        .record(3);
    seg.write(dir.path());
    let (_, offset, seq, _) = refused(dir.path());
    assert_eq!((offset, seq), (seg.offsets[2] as u64, FaultSeq::Record(3)));
}

#[test]
fn gap_within_a_sealed_segment() {
    let dir = tempfile::tempdir().unwrap();
    let first = SegmentBytes::new(1, [0; 32]).record(1).record(3);
    let chain = first.chain();
    let first = first.seal(3);
    first.write(dir.path());
    SegmentBytes::new(4, chain).record(4).write(dir.path());
    let (segment, offset, seq, _) = refused(dir.path());
    assert_eq!(segment, segment_file_name(1));
    assert_eq!(
        (offset, seq),
        (first.offsets[1] as u64, FaultSeq::Record(2))
    );
}

#[test]
fn gap_between_segments() {
    let dir = tempfile::tempdir().unwrap();
    let first = SegmentBytes::new(1, [0; 32]).record(1).record(2).record(3);
    let chain = first.chain();
    first.seal(3).write(dir.path());
    SegmentBytes::new(5, chain)
        .record(5)
        .record(6)
        .write(dir.path());
    let (segment, offset, seq, message) = refused(dir.path());
    assert_eq!(segment, segment_file_name(5));
    assert_eq!(
        (offset, seq),
        (HEADER_FIRST_SEQ_OFFSET as u64, FaultSeq::Header(4))
    );
    assert!(
        message.contains("(header of the segment expected to start at seq 4): seq gap"),
        "{message}"
    );
}

#[test]
fn missing_middle_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _, _) = open_collect(dir.path(), config(200), os()).unwrap();
    let records: Vec<Owned> = (1..=12).map(sample).collect();
    append_each(&mut log, &records);
    drop(log);
    let paths = segment_paths(dir.path());
    assert!(paths.len() >= 3);
    std::fs::remove_file(&paths[1]).unwrap();
    let (segment, offset, _, _) = refused(dir.path());
    assert_eq!(segment, paths[2].file_name().unwrap().to_str().unwrap());
    assert_eq!(offset, HEADER_FIRST_SEQ_OFFSET as u64);
}

#[test]
fn log_that_does_not_start_at_one() {
    let dir = tempfile::tempdir().unwrap();
    SegmentBytes::new(2, [0; 32]).record(2).write(dir.path());
    let (segment, offset, seq, _) = refused(dir.path());
    assert_eq!(
        (segment, offset, seq),
        (
            segment_file_name(2),
            HEADER_FIRST_SEQ_OFFSET as u64,
            FaultSeq::Header(1)
        )
    );
}

#[test]
fn file_name_that_disagrees_with_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let first = SegmentBytes::new(1, [0; 32]).record(1).record(2);
    let chain = first.chain();
    first.seal(2).write(dir.path());
    SegmentBytes::new(3, chain)
        .record(3)
        .write_as(dir.path(), &segment_file_name(4));
    let (segment, offset, _, message) = refused(dir.path());
    assert_eq!(
        (segment, offset),
        (segment_file_name(4), HEADER_FIRST_SEQ_OFFSET as u64)
    );
    assert!(message.contains("file name"), "{message}");
}
