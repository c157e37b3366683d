//! Guards the roll: interrupted at each of its steps (seal write, seal sync,
//! create, header write, header fsync, directory fsync, first batch), the log
//! reopens without a gap, appends continue, and the chain verifies across
//! segments; hand-built leftovers of a crash mid-roll are repaired the same.

use crate::common;

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use common::*;
use spark_log_format::format::{segment_file_name, SegmentHeader, COMMIT_RECORD_BYTES};
use spark_log_format::{
    Fault, FaultOp, FaultyFs, LogError, LogReader, ScanOptions, HEADER_LEN, RECORD_HEADER_LEN,
};

/// A segment size that holds exactly records 1..=3, so appending 4 rolls.
fn three_records() -> u64 {
    (HEADER_LEN
        + (1..=3)
            .map(|s| RECORD_HEADER_LEN + sample(s).payload.len() + COMMIT_RECORD_BYTES)
            .sum::<usize>()) as u64
}

#[derive(Debug)]
struct Case {
    name: &'static str,
    op: FaultOp,
    /// Which call of `op` inside the roll fails (1 = the first).
    nth_in_roll: u64,
    fault: Fault,
    /// Records on disk after the crash.
    survivors: u64,
    removed: bool,
    truncated: bool,
    /// The last segment after reopening is seg 1, sealed.
    sealed_only: bool,
}

const EIO: i32 = 5;

fn cases() -> Vec<Case> {
    let case = |name, op, nth_in_roll, fault, survivors, removed, truncated, sealed_only| Case {
        name,
        op,
        nth_in_roll,
        fault,
        survivors,
        removed,
        truncated,
        sealed_only,
    };
    vec![
        case(
            "seal write fails",
            FaultOp::Write,
            1,
            Fault::Os(EIO),
            3,
            false,
            false,
            false,
        ),
        case(
            "seal write torn",
            FaultOp::Write,
            1,
            Fault::ShortWrite { written: 30 },
            3,
            false,
            true,
            false,
        ),
        case(
            "seal sync fails",
            FaultOp::SyncData,
            1,
            Fault::Os(EIO),
            3,
            false,
            false,
            true,
        ),
        case(
            "create fails",
            FaultOp::CreateNew,
            1,
            Fault::Os(28),
            3,
            false,
            false,
            true,
        ),
        case(
            "header write fails",
            FaultOp::Write,
            2,
            Fault::Os(EIO),
            3,
            true,
            false,
            true,
        ),
        case(
            "header half written",
            FaultOp::Write,
            2,
            Fault::ShortWrite { written: 32 },
            3,
            true,
            false,
            true,
        ),
        case(
            "header fsync fails",
            FaultOp::SyncAll,
            1,
            Fault::Os(EIO),
            3,
            false,
            false,
            false,
        ),
        case(
            "dir fsync fails",
            FaultOp::SyncDir,
            1,
            Fault::Os(EIO),
            3,
            false,
            false,
            false,
        ),
        case(
            "first batch write fails",
            FaultOp::Write,
            3,
            Fault::Os(EIO),
            3,
            false,
            false,
            false,
        ),
        case(
            "first batch torn",
            FaultOp::Write,
            3,
            Fault::ShortWrite { written: 9 },
            3,
            false,
            true,
            false,
        ),
        case(
            "first batch sync fails",
            FaultOp::SyncData,
            2,
            Fault::Os(EIO),
            4,
            false,
            false,
            false,
        ),
    ]
}

/// After the crash: reopen, check, append, reopen, verify the whole chain.
fn check_recovers(dir: &Path, survivors: u64, what: &str) -> spark_log_format::RecoveryReport {
    let records: Vec<Owned> = (1..=survivors + 2).map(sample).collect();
    let (mut log, report, seen) = open_collect(dir, config(three_records()), os()).unwrap();
    assert_eq!(seen, records[..survivors as usize], "{what}");
    assert_eq!(log.last_seq(), survivors, "{what}");
    for record in &records[survivors as usize..] {
        assert_eq!(
            log.append_batch(&[record.as_in()]).unwrap(),
            record.seq,
            "{what}"
        );
    }
    let head = log.head();
    drop(log);
    let (log, again, seen) = open_collect(dir, config(three_records()), os()).unwrap();
    assert!(
        again.truncated.is_none() && again.removed_segment.is_none(),
        "{what}"
    );
    assert_eq!(seen, records, "{what}");
    assert_eq!(log.head(), head, "{what}");
    let reader = LogReader::open(dir).unwrap();
    let segments = reader.segments().to_vec();
    assert!(segments.len() >= 2, "{what}: {segments:?}");
    assert!(
        segments[..segments.len() - 1].iter().all(|s| s.sealed),
        "{what}"
    );
    for pair in segments.windows(2) {
        assert_eq!(pair[1].first_seq, pair[0].last_seq + 1, "{what}");
    }
    let mut scanned = Vec::new();
    let scan = reader
        .scan(ScanOptions::default(), |_, r| {
            scanned.push(Owned::from_ref(&r));
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(scanned, records, "{what}");
    assert_eq!(scan.head, head, "{what}");
    report
}

#[test]
fn roll_interrupted_at_each_step() {
    for case in cases() {
        let dir = tempfile::tempdir().unwrap();
        let faulty = Arc::new(FaultyFs::new(os()));
        let (mut log, _, _) =
            open_collect(dir.path(), config(three_records()), faulty.clone()).unwrap();
        for seq in 1..=3 {
            log.append_batch(&[sample(seq).as_in()]).unwrap();
        }
        assert_eq!(segment_paths(dir.path()).len(), 1, "{}", case.name);
        faulty.fail(
            case.op,
            faulty.count(case.op) + case.nth_in_roll,
            case.fault,
        );
        let error = log.append_batch(&[sample(4).as_in()]).unwrap_err();
        assert!(
            matches!(error, LogError::Io { .. }),
            "{}: {error:?}",
            case.name
        );
        assert!(log.is_poisoned(), "{}", case.name);
        let again = log.append_batch(&[sample(4).as_in()]).unwrap_err();
        assert!(
            matches!(again, LogError::Poisoned(_)),
            "{}: {again:?}",
            case.name
        );
        drop(log);

        // A reader beside the crashed log sees the surviving records and
        // treats an interrupted roll's file as an in-progress tail.
        let reader = LogReader::open(dir.path()).unwrap();
        let last = reader.segments().last().unwrap().clone();
        assert_eq!(last.last_seq, case.survivors, "{}", case.name);
        assert_eq!(
            reader.torn_tail().is_some(),
            case.removed || case.truncated,
            "{}",
            case.name
        );
        drop(reader);

        let report = check_recovers(dir.path(), case.survivors, case.name);
        assert_eq!(
            report.removed_segment.is_some(),
            case.removed,
            "{}",
            case.name
        );
        if case.removed {
            assert_eq!(
                report.removed_segment.as_deref(),
                Some(segment_file_name(4).as_str())
            );
        }
        assert_eq!(report.truncated.is_some(), case.truncated, "{}", case.name);
        if case.sealed_only {
            assert_eq!(report.segments, 1, "{}", case.name);
        }
    }
}

/// Builds what a crash mid-roll leaves: segment 1 with records 1..=3 and a
/// seal, then `second` (bytes of file 00..04.seg) if any.
fn leftover(second: Option<&[u8]>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let first = SegmentBytes::new(1, [0; 32]).record(1).record(2).record(3);
    first.seal(3).write(dir.path());
    if let Some(bytes) = second {
        std::fs::write(dir.path().join(segment_file_name(4)), bytes).unwrap();
    }
    dir
}

#[test]
fn hand_built_leftovers_of_a_roll() {
    let first = SegmentBytes::new(1, [0; 32]).record(1).record(2).record(3);
    let header = SegmentHeader {
        first_seq: 4,
        created_ms: T0,
        chain_start: first.chain(),
    }
    .encode();
    let zeroed_header = [0u8; HEADER_LEN];
    let cases: [(&str, Option<&[u8]>, bool); 6] = [
        ("after the seal only", None, false),
        ("new file created empty", Some(&[]), true),
        ("header half written", Some(&header[..HEADER_LEN / 2]), true),
        (
            "header all zeros (size synced, data not)",
            Some(&zeroed_header),
            true,
        ),
        (
            "header written, no dir fsync (file kept)",
            Some(&header),
            false,
        ),
        (
            "header one byte short",
            Some(&header[..HEADER_LEN - 1]),
            true,
        ),
    ];
    for (what, second, removed) in cases {
        let dir = leftover(second);
        let report = check_recovers(dir.path(), 3, what);
        assert_eq!(report.removed_segment.is_some(), removed, "{what}");
        assert!(report.truncated.is_none(), "{what}");
    }
}

#[test]
fn torn_header_with_a_valid_record_behind_it_is_corrupt() {
    let first = SegmentBytes::new(1, [0; 32]).record(1).record(2).record(3);
    let chain = first.chain();
    let mut second = SegmentBytes::new(4, chain).record(4).bytes;
    second[0] ^= 0xFF;
    let dir = leftover(Some(&second));
    let error = open_collect(dir.path(), config(1 << 20), os())
        .map(|_| ())
        .unwrap_err();
    let (segment, offset, seq) = corrupt_fields(&error);
    assert_eq!(
        (segment, offset, seq),
        (
            segment_file_name(4),
            0,
            spark_log_format::FaultSeq::Header(4)
        )
    );
    assert!(dir.path().join(segment_file_name(4)).exists());
}

#[test]
fn unsealed_segment_before_the_last_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let first = SegmentBytes::new(1, [0; 32]).record(1).record(2);
    let chain = first.chain();
    first.write(dir.path());
    SegmentBytes::new(3, chain).record(3).write(dir.path());
    let error = open_collect(dir.path(), config(1 << 20), os())
        .map(|_| ())
        .unwrap_err();
    assert!(error.to_string().contains("without a seal"), "{error}");
    assert_eq!(corrupt_fields(&error).0, segment_file_name(1));
    // An empty file after an unsealed segment is not an interrupted roll.
    let dir = tempfile::tempdir().unwrap();
    SegmentBytes::new(1, [0; 32]).record(1).write(dir.path());
    std::fs::write(dir.path().join(segment_file_name(2)), b"").unwrap();
    assert!(open_collect(dir.path(), config(1 << 20), os()).is_err());
}
