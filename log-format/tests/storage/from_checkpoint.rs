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

/// A live view from a seq (`LogReader::open_live_from`: the event stream's
/// catch-up, the checkpoint writer) reads only from the segment holding
/// that seq: damage in a segment before it does not stop it, and the
/// records it gives are exactly those of that segment on, chain checked
/// from that segment's header.
#[test]
fn a_live_view_from_a_seq_reads_only_from_its_segment_on() {
    let (dir, points) = build(40);
    let files = segment_paths(dir.path());
    assert!(files.len() >= 4, "{files:?}");
    flip(&files[1], 64 + 30, 0x10);
    let whole = LogReader::open_live(dir.path(), std::sync::Arc::new(OsFs), 4 << 20)
        .expect_err("the whole view reads the damaged segment");
    assert_eq!(
        corrupt_fields(&whole).0,
        files[1].file_name().unwrap().to_string_lossy()
    );
    let third_first = SegmentHeader::decode(&std::fs::read(&files[2]).unwrap())
        .unwrap()
        .first_seq;
    // Every seq from the segment after the damaged one on.
    for point in points.iter().filter(|p| p.seq >= third_first) {
        let view =
            LogReader::open_live_from(dir.path(), std::sync::Arc::new(OsFs), 4 << 20, point.seq)
                .unwrap_or_else(|e| panic!("from seq {}: {e}", point.seq));
        let mut seen = Vec::new();
        let report = view
            .scan(ScanOptions::default(), |_, r| {
                seen.push(r.seq);
                ControlFlow::Continue(())
            })
            .unwrap();
        assert_eq!(
            seen,
            (point.segment_first_seq..=40).collect::<Vec<_>>(),
            "from seq {}",
            point.seq
        );
        assert_eq!(report.head.seq, 40);
    }
}

/// A directory listing that misses the next-to-last segment file the
/// first `misses` times, as a listing racing with two segment rolls can
/// (the newcomer's checkpoint writer saw a false "seq gap" under 4 KiB
/// segments); everything else is `OsFs`.
struct RacingListing {
    misses: std::sync::atomic::AtomicU32,
}

impl spark_log_format::Fs for RacingListing {
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        OsFs.create_dir_all(path)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
        let mut listing = OsFs.list(dir)?;
        let left = self.misses.load(std::sync::atomic::Ordering::SeqCst);
        if left > 0 {
            self.misses
                .store(left - 1, std::sync::atomic::Ordering::SeqCst);
            let mut segments: Vec<_> = listing
                .iter()
                .filter(|p| p.extension().is_some_and(|e| e == "seg"))
                .cloned()
                .collect();
            segments.sort();
            let missed = segments[segments.len() - 2].clone();
            listing.retain(|p| *p != missed);
        }
        Ok(listing)
    }
    fn open_rw(&self, path: &Path) -> std::io::Result<Box<dyn spark_log_format::LogFile>> {
        OsFs.open_rw(path)
    }
    fn create_new(&self, path: &Path) -> std::io::Result<Box<dyn spark_log_format::LogFile>> {
        OsFs.create_new(path)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        OsFs.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        OsFs.rename(from, to)
    }
    fn modified(&self, path: &Path) -> std::io::Result<std::time::SystemTime> {
        OsFs.modified(path)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        OsFs.sync_dir(dir)
    }
    fn map(&self, path: &Path) -> std::io::Result<Box<dyn AsRef<[u8]> + Send + Sync>> {
        OsFs.map(path)
    }
}

/// A live view opens the directory again when its listing shows a seq gap
/// (a segment created while it was listed), and reports the gap only when
/// every listing shows it.
#[test]
fn a_live_view_lists_again_when_a_listing_missed_a_new_segment() {
    let (dir, _) = build(40);
    let racing = |misses| {
        std::sync::Arc::new(RacingListing {
            misses: std::sync::atomic::AtomicU32::new(misses),
        })
    };
    let view = LogReader::open_live_from(dir.path(), racing(1), 4 << 20, 1)
        .expect("the second listing has every segment");
    let mut seen = 0u64;
    view.scan(ScanOptions::default(), |_, _| {
        seen += 1;
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(seen, 40);
    let gap = LogReader::open_live_from(
        dir.path(),
        racing(spark_log_format::LIVE_OPEN_ATTEMPTS),
        4 << 20,
        1,
    )
    .expect_err("a gap in every listing is reported");
    assert!(gap.to_string().contains("seq gap"), "{gap}");
}
