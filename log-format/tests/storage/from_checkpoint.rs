//! Guards recovery from a checkpoint's point (`Log::open_from`, FORMAT.md
//! "Recovery" step 2a): the sealed segments before the point's segment are
//! checked by their links only and listed for the scrub; the visitor sees
//! exactly the records after the point; a damaged record there is left to
//! `scrub_segment` (which names it), while a damaged seal or header, a
//! missing segment or a point whose chain value is not the log's is
//! refused.

use crate::common;

use std::ops::ControlFlow;
use std::path::Path;

use common::*;
use spark_log_format::format::{chain_value, SegmentHeader};
use spark_log_format::{
    scrub_segment, Log, LogConfig, LogError, LogPoint, LogReader, OsFs, RecoveryReport,
    ScanOptions, RECORD_HEADER_LEN,
};

/// Segments of three or four single-record batches, zero fill ahead of
/// 256 bytes: sealed segments end in zeros after their seal.
fn config_with_fill() -> LogConfig {
    LogConfig {
        preallocate_bytes: 256,
        ..config(430)
    }
}

/// A log of `n` records; the point of every record, in seq order.
fn build(n: u64) -> (tempfile::TempDir, Vec<LogPoint>) {
    let dir = tempfile::tempdir().unwrap();
    let all: Vec<Owned> = (1..=n).map(sample).collect();
    let (mut log, _, _) = open_collect(dir.path(), config_with_fill(), os()).unwrap();
    append_each(&mut log, &all);
    drop(log);
    let mut points = Vec::new();
    LogReader::open(dir.path())
        .unwrap()
        .scan(ScanOptions::default(), |segment, r| {
            let bytes = std::fs::read(dir.path().join(&segment.name)).unwrap();
            let header = SegmentHeader::decode(&bytes).unwrap();
            let end = r.offset + (RECORD_HEADER_LEN + r.payload.len()) as u64;
            points.push(LogPoint {
                seq: r.seq,
                segment_first_seq: segment.first_seq,
                frame_end_offset: end,
                chain: chain_value(&header.chain_start, &bytes[..end as usize]),
            });
            ControlFlow::Continue(())
        })
        .unwrap();
    (dir, points)
}

/// Opens `dir` from `point`; the seqs the visitor saw and the report.
fn open_from(dir: &Path, point: &LogPoint) -> Result<(Log, RecoveryReport, Vec<u64>), LogError> {
    let mut seen = Vec::new();
    let (log, report) = Log::open_from(
        dir,
        config_with_fill(),
        std::sync::Arc::new(OsFs),
        Some(point),
        |r| {
            seen.push(r.seq);
            Ok::<(), std::convert::Infallible>(())
        },
    )
    .map_err(|e| match e {
        spark_log_format::OpenError::Log(e) => e,
        spark_log_format::OpenError::Visit(never) => match never {},
    })?;
    Ok((log, report, seen))
}

/// The error of opening `dir` from `point`, which must be refused.
fn refusal(dir: &Path, point: &LogPoint) -> LogError {
    match open_from(dir, point) {
        Ok(_) => panic!("the log from seq {} was accepted", point.seq),
        Err(e) => e,
    }
}

#[test]
fn from_every_point_the_tail_is_visited_and_the_covered_segments_scrub_clean() {
    let (dir, points) = build(40);
    let (full, _, _) = open_collect(dir.path(), config_with_fill(), os()).unwrap();
    let head = full.head();
    drop(full);
    let files = segment_paths(dir.path());
    for point in &points {
        let (log, report, seen) = open_from(dir.path(), point).unwrap();
        assert_eq!(log.head(), head, "point {}", point.seq);
        assert_eq!(seen, (point.seq + 1..=40).collect::<Vec<_>>());
        let before: Vec<String> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .filter(|name| name.as_str() < format!("{:020}.seg", point.segment_first_seq).as_str())
            .collect();
        let deferred: Vec<String> = report.deferred.iter().map(|d| d.name.clone()).collect();
        assert_eq!(deferred, before, "point {}", point.seq);
        for segment in &report.deferred {
            scrub_segment(dir.path(), &OsFs, segment, 4 << 20).unwrap();
        }
    }
}

#[test]
fn a_damaged_record_in_a_covered_segment_is_left_to_the_scrub_which_names_it() {
    let (dir, points) = build(40);
    let files = segment_paths(dir.path());
    // A payload byte of the first record of the second segment.
    flip(&files[1], 64 + 30, 0x10);
    let point = points.last().unwrap();
    let (_, report, seen) = open_from(dir.path(), point).unwrap();
    assert!(seen.is_empty());
    let damaged = &report.deferred[1];
    let error = scrub_segment(dir.path(), &OsFs, damaged, 4 << 20).unwrap_err();
    let (segment, offset, _) = corrupt_fields(&error);
    assert_eq!(segment, damaged.name);
    assert_eq!(offset, 64, "the damaged record's offset: {error}");
    for clean in report.deferred.iter().filter(|d| d.name != damaged.name) {
        scrub_segment(dir.path(), &OsFs, clean, 4 << 20).unwrap();
    }
    // Without the point every byte is checked: refused.
    let refused = open_collect(dir.path(), config_with_fill(), os())
        .err()
        .unwrap();
    assert_eq!(corrupt_fields(&refused).0, damaged.name);
}

#[test]
fn a_damaged_seal_or_header_in_a_covered_segment_is_refused() {
    let (dir, points) = build(40);
    let point = points.last().unwrap();
    let (_, report, _) = open_from(dir.path(), point).unwrap();
    let sealed = &report.deferred[2];
    let path = dir.path().join(&sealed.name);
    // The seal's chain value (its last byte), then the header's chain start.
    for at in [sealed.bytes as usize - 1, 40] {
        let copy = copy_dir(dir.path());
        flip(&copy.path().join(&sealed.name), at, 0x01);
        let refused = refusal(copy.path(), point);
        let (segment, _, _) = corrupt_fields(&refused);
        assert!(
            segment == sealed.name || segment == report.deferred[3].name,
            "{refused}"
        );
    }
    assert!(path.is_file());
}

#[test]
fn a_missing_or_reordered_covered_segment_is_refused() {
    let (dir, points) = build(40);
    let point = points.last().unwrap();
    let files = segment_paths(dir.path());
    let missing = copy_dir(dir.path());
    std::fs::remove_file(missing.path().join(files[2].file_name().unwrap())).unwrap();
    let refused = refusal(missing.path(), point);
    assert!(refused.to_string().contains("seq gap"), "{refused}");

    let swapped = copy_dir(dir.path());
    let (a, b) = (
        swapped.path().join(files[1].file_name().unwrap()),
        swapped.path().join(files[2].file_name().unwrap()),
    );
    let aside = a.with_extension("aside");
    std::fs::rename(&a, &aside).unwrap();
    std::fs::rename(&b, &a).unwrap();
    std::fs::rename(&aside, &b).unwrap();
    let refused = refusal(swapped.path(), point);
    corrupt_fields(&refused);
}

#[test]
fn a_point_whose_chain_value_is_not_the_logs_is_refused() {
    let (dir, points) = build(40);
    let mut point = points[20];
    point.chain[0] ^= 1;
    let refused = refusal(dir.path(), &point);
    assert!(
        refused.to_string().contains("does not match the log"),
        "{refused}"
    );
}
