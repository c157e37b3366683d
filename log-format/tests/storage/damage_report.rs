//! Guards `damage_report` (what `spark-replay audit damage` and the server's
//! refusal to start print): its damaged seq range starts at the seq after
//! the last record actually read, also when the damage is a seq gap at a
//! segment header (a whole segment file missing); its error is the one the
//! reader (what `spark-replay verify` runs) refuses the log with; and a whole
//! last frame that fails its checksum, which `verify` reports as a fault, is
//! reported too (a torn write or a damaged acknowledged record), while a tail
//! that is only a torn write is not.

use crate::common;

use common::*;
use spark_log_format::format::{
    segment_file_name, COMMIT_RECORD_BYTES, HEADER_CRC_OFFSET, HEADER_FIRST_SEQ_OFFSET,
    SEAL_RECORD_BYTES,
};
use spark_log_format::{
    damage_report, DamageKind, DamageReport, LogReader, SegmentInfo, DEFAULT_MAX_RECORD_BYTES,
    HEADER_LEN, RECORD_HEADER_LEN,
};

fn reported(dir: &std::path::Path) -> DamageReport {
    damage_report(dir, DEFAULT_MAX_RECORD_BYTES)
        .expect("the report is made")
        .expect("the log is reported damaged")
}

/// A corrupt log's report carries the reader's error, word for word.
fn assert_same_error_as_the_reader(dir: &std::path::Path, report: &DamageReport) {
    assert_eq!(report.kind, DamageKind::Corrupt);
    assert_eq!(report.error, reader_error(dir).to_string());
}

#[test]
fn a_missing_middle_segment_is_the_range_of_its_seqs() {
    let dir = tempfile::tempdir().unwrap();
    let segments = twelve_records_in_segments(dir.path());
    let (before, missing, after) = (&segments[0], &segments[1], &segments[2]);
    assert!(missing.last_seq >= missing.first_seq, "{missing:?}");
    std::fs::remove_file(dir.path().join(&missing.name)).unwrap();

    let report = reported(dir.path());
    assert_same_error_as_the_reader(dir.path(), &report);
    assert_eq!(report.segment, after.name);
    assert_eq!(report.offset, HEADER_FIRST_SEQ_OFFSET as u64);
    assert_eq!(report.last_good_seq, before.last_seq);
    assert_eq!(report.next_good_seq, Some(after.first_seq));
    assert_eq!(
        report.damaged_seqs(),
        Some((missing.first_seq, Some(missing.last_seq)))
    );
    // The missing records are in no file: nothing to salvage.
    assert!(report.salvaged.is_empty(), "{:?}", report.salvaged);
}

#[test]
fn a_gap_between_hand_built_segments() {
    let dir = tempfile::tempdir().unwrap();
    let first = SegmentBytes::new(1, [0; 32]).record(1).record(2).record(3);
    let chain = first.chain();
    first.seal(3).write(dir.path());
    SegmentBytes::new(6, chain)
        .record(6)
        .record(7)
        .record(8)
        .write(dir.path());
    let report = reported(dir.path());
    assert_same_error_as_the_reader(dir.path(), &report);
    assert_eq!(report.segment, segment_file_name(6));
    assert_eq!((report.last_good_seq, report.next_good_seq), (3, Some(6)));
    assert_eq!(report.damaged_seqs(), Some((4, Some(5))));
}

#[test]
fn a_log_that_does_not_start_at_one() {
    let dir = tempfile::tempdir().unwrap();
    SegmentBytes::new(3, [0; 32])
        .record(3)
        .record(4)
        .write(dir.path());
    let report = reported(dir.path());
    assert_same_error_as_the_reader(dir.path(), &report);
    assert_eq!((report.last_good_seq, report.next_good_seq), (0, Some(3)));
    assert_eq!(report.damaged_seqs(), Some((1, Some(2))));
}

#[test]
fn a_damaged_header_of_a_sealed_segment_hides_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let segments = twelve_records_in_segments(dir.path());
    // The created_ms field: only the header checksum catches it.
    flip(&dir.path().join(&segments[1].name), 30, 0x01);

    let report = reported(dir.path());
    assert_same_error_as_the_reader(dir.path(), &report);
    assert_eq!(report.segment, segments[1].name);
    assert_eq!(report.offset, HEADER_CRC_OFFSET as u64);
    assert_eq!(report.last_good_seq, segments[0].last_seq);
    assert_eq!(report.next_good_seq, Some(segments[1].first_seq));
    assert_eq!(report.damaged_seqs(), None);
}

#[test]
fn a_flipped_record_mid_log_is_its_seq() {
    let dir = tempfile::tempdir().unwrap();
    let seg = SegmentBytes::new(1, [0; 32])
        .record(1)
        .record(2)
        .record(3)
        .record(4);
    let path = seg.write(dir.path());
    flip(&path, seg.offsets[1] + 30, 0x40);
    let report = reported(dir.path());
    assert_same_error_as_the_reader(dir.path(), &report);
    assert_eq!(report.offset, seg.offsets[1] as u64);
    assert_eq!((report.last_good_seq, report.next_good_seq), (1, Some(3)));
    assert_eq!(report.damaged_seqs(), Some((2, Some(2))));
    assert_eq!(report.salvaged.len(), 1);
    assert_eq!(report.salvaged[0].seq, 2);
}

/// Version 2: a flipped record in the middle of a batch. Its batch's
/// earlier records were read intact (they are visited only once the commit
/// mark verifies), so the damaged range still starts right after them.
#[test]
fn a_flipped_record_mid_batch_is_its_seq() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _, _) = open_collect(dir.path(), config(1 << 20), os()).unwrap();
    let first: Vec<Owned> = (1..=5).map(sample).collect();
    let ins: Vec<_> = first.iter().map(Owned::as_in).collect();
    log.append_batch(&ins).unwrap();
    log.append_batch(&[sample(6).as_in(), sample(7).as_in()])
        .unwrap();
    drop(log);
    let path = segment_paths(dir.path()).remove(0);
    let third = HEADER_LEN
        + (1..=2)
            .map(|s| RECORD_HEADER_LEN + sample(s).payload.len())
            .sum::<usize>();
    flip(&path, third + 30, 0x40);
    let report = reported(dir.path());
    assert_same_error_as_the_reader(dir.path(), &report);
    assert_eq!(report.kind, DamageKind::Corrupt);
    assert_eq!(report.offset, third as u64);
    assert_eq!((report.last_good_seq, report.next_good_seq), (2, Some(4)));
    assert_eq!(report.damaged_seqs(), Some((3, Some(3))));
}

/// The last record of a version-1 log, whole but failing its checksum:
/// `verify` reports it as a fault, so the damage report names it too. (In
/// version 2 its commit mark follows it; see the next test.)
#[test]
fn a_whole_last_record_with_a_bad_checksum_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let seg = SegmentBytes::v1(1, [0; 32]).record(1).record(2).record(3);
    let path = seg.write(dir.path());
    flip(&path, seg.offsets[2] + 30, 0x40);
    let reader = LogReader::open(dir.path()).unwrap();
    let torn = reader
        .torn_tail()
        .cloned()
        .expect("the reader sees the tail");
    assert!(torn.whole_frame);

    let report = reported(dir.path());
    assert_eq!(
        report.kind,
        DamageKind::DamagedOrTornLastFrame {
            seal: false,
            zeros_after: true,
            batch_last: None
        }
    );
    assert_eq!(report.segment, segment_file_name(1));
    assert_eq!(report.offset, seg.offsets[2] as u64);
    assert_eq!((report.last_good_seq, report.next_good_seq), (2, None));
    assert_eq!(report.damaged_seqs(), Some((3, Some(3))));
    assert_eq!(report.salvaged.len(), 1);
    assert_eq!(report.salvaged[0].seq, 3);
    let mut payload = sample(3).payload;
    payload[2] ^= 0x40;
    assert_eq!(report.salvaged[0].payload, payload);
    for words in ["seq 3", "torn write", "damaged", "checksum", "offset"] {
        assert!(report.error.contains(words), "{words:?}: {}", report.error);
    }
    assert!(
        report.error.contains(&segment_file_name(1)),
        "{}",
        report.error
    );

    // Zero fill after it changes nothing; garbage after it may hide more
    // (never acknowledged) records of a torn batch: open-ended.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&[0; 100]);
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(reported(dir.path()).damaged_seqs(), Some((3, Some(3))));
    bytes.extend_from_slice(&[0x5a; 3]);
    std::fs::write(&path, &bytes).unwrap();
    let report = reported(dir.path());
    assert_eq!(
        report.kind,
        DamageKind::DamagedOrTornLastFrame {
            seal: false,
            zeros_after: false,
            batch_last: None
        }
    );
    assert_eq!(report.damaged_seqs(), Some((3, None)));
}

/// Version 2: a whole last record failing its checksum with its batch's
/// commit mark after it is damage to an acknowledged record (a torn write
/// leaves a hole of unwritten sectors, not a flipped bit): refused. A whole
/// last commit mark failing its checksum is the ambiguous frame: a torn
/// write of the batch or a damaged mark of an acknowledged one, reported
/// with the batch's seqs.
#[test]
fn version_2_a_damaged_last_record_is_refused_a_damaged_last_mark_reported() {
    let dir = tempfile::tempdir().unwrap();
    let seg = SegmentBytes::new(1, [0; 32]).record(1).record(2).record(3);
    let path = seg.write(dir.path());
    flip(&path, seg.offsets[2] + 30, 0x40);
    let report = reported(dir.path());
    assert_eq!(report.kind, DamageKind::Corrupt);
    assert_eq!(report.offset, seg.offsets[2] as u64);
    assert_eq!(report.last_good_seq, 2);
    assert!(matches!(
        open_collect(dir.path(), config(1 << 20), os()),
        Err(spark_log_format::LogError::Corrupt { .. })
    ));
    flip(&path, seg.offsets[2] + 30, 0x40);

    let mark_at = seg.bytes.len() - COMMIT_RECORD_BYTES;
    flip(&path, mark_at + 30, 0x40);
    let torn = LogReader::open(dir.path()).unwrap().torn_tail().cloned();
    let torn = torn.expect("the reader sees the tail");
    assert!(torn.whole_frame && torn.unacknowledged);
    assert_eq!(
        (torn.offset, torn.seqs),
        (seg.offsets[2] as u64, Some((3, 3)))
    );
    let report = reported(dir.path());
    assert_eq!(report.offset, seg.offsets[2] as u64);
    assert_eq!(report.damaged_seqs(), Some((3, Some(3))));
    for words in ["commit mark", "seqs 3..=3", "torn write", "damaged"] {
        assert!(report.error.contains(words), "{words:?}: {}", report.error);
    }
}

/// A seal at the very end of the log (between a roll's seal and its new
/// file) that fails its checksum hides no record.
#[test]
fn a_whole_last_seal_with_a_bad_checksum_hides_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let seg = SegmentBytes::new(1, [0; 32]).record(1).record(2).seal(2);
    let path = seg.write(dir.path());
    let seal_at = seg.bytes.len() - SEAL_RECORD_BYTES;
    flip(&path, seal_at + 40, 0x02);
    let report = reported(dir.path());
    assert_eq!(
        report.kind,
        DamageKind::DamagedOrTornLastFrame {
            seal: true,
            zeros_after: true,
            batch_last: None
        }
    );
    assert_eq!(report.offset, seal_at as u64);
    assert_eq!(report.last_good_seq, 2);
    assert_eq!(report.damaged_seqs(), None);
    assert!(report.salvaged.is_empty());
    assert!(report.error.contains("seal"), "{}", report.error);
}

/// A tail that is only a torn write (a record cut short, zeros then
/// garbage) is no damage: `verify` notes it and exits 0.
#[test]
fn a_torn_tail_that_is_not_a_whole_frame_is_no_damage() {
    let dir = tempfile::tempdir().unwrap();
    let seg = SegmentBytes::new(1, [0; 32]).record(1).record(2).record(3);
    let path = seg.write(dir.path());
    std::fs::write(&path, &seg.bytes[..seg.bytes.len() - 3]).unwrap();
    assert!(LogReader::open(dir.path()).unwrap().torn_tail().is_some());
    assert!(damage_report(dir.path(), DEFAULT_MAX_RECORD_BYTES)
        .unwrap()
        .is_none());

    let mut bytes = seg.bytes.clone();
    bytes.extend_from_slice(&[0; 40]);
    bytes.push(0x01);
    std::fs::write(&path, &bytes).unwrap();
    assert!(LogReader::open(dir.path()).unwrap().torn_tail().is_some());
    assert!(damage_report(dir.path(), DEFAULT_MAX_RECORD_BYTES)
        .unwrap()
        .is_none());
}

/// Twelve records in 200-byte segments (at least three) under `dir`; the
/// segments as the reader lists them.
fn twelve_records_in_segments(dir: &std::path::Path) -> Vec<SegmentInfo> {
    let (mut log, _, _) = open_collect(dir, config(200), os()).unwrap();
    let records: Vec<Owned> = (1..=12).map(sample).collect();
    append_each(&mut log, &records);
    drop(log);
    let segments = LogReader::open(dir).unwrap().segments().to_vec();
    assert!(segments.len() >= 3, "{segments:?}");
    segments
}
