//! Guards the zero fill ahead (`LogConfig::preallocate_bytes`): the files
//! hold exactly the bytes of a log written without it, followed by zeros;
//! heads and chains are the same; recovery and the reader take the zeros as
//! the end of the log (nothing cut, nothing reported), appends go on inside
//! them, and a torn write into them is still cut back to the last whole
//! record.

use crate::common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use common::*;
use spark_log_format::{LogConfig, LogReader};

fn prealloc(segment_size_bytes: u64, preallocate_bytes: u64) -> LogConfig {
    LogConfig {
        preallocate_bytes,
        ..config(segment_size_bytes)
    }
}

/// Batches of 1..=5 records, 40 records in all.
fn batches() -> Vec<Vec<Owned>> {
    let mut out = Vec::new();
    let mut seq = 1;
    let mut size = 1;
    while seq <= 40 {
        let batch: Vec<Owned> = (seq..(seq + size).min(41)).map(sample).collect();
        seq += batch.len() as u64;
        out.push(batch);
        size = size % 5 + 1;
    }
    out
}

/// The last segment of the log in `dir`: its path, its valid bytes (as
/// the reader sees them) and the file's size (fill included).
fn last_segment(dir: &std::path::Path) -> (std::path::PathBuf, u64, u64) {
    let last = segment_paths(dir).pop().unwrap();
    let logical = LogReader::open(dir)
        .unwrap()
        .segments()
        .last()
        .unwrap()
        .bytes;
    let size = std::fs::metadata(&last).unwrap().len();
    (last, logical, size)
}

fn write_all(dir: &std::path::Path, cfg: LogConfig) -> Vec<spark_log_format::Head> {
    let (mut log, _, _) = open_collect(dir, cfg, os()).unwrap();
    let mut heads = Vec::new();
    for batch in batches() {
        let ins: Vec<_> = batch.iter().map(Owned::as_in).collect();
        log.append_batch(&ins).unwrap();
        heads.push(log.head());
    }
    heads
}

#[test]
fn files_are_the_plain_log_then_zeros() {
    for (segment_size, fill) in [(1 << 20, 256), (1 << 20, 4096), (400, 128), (400, 1 << 20)] {
        let plain = tempfile::tempdir().unwrap();
        let filled = tempfile::tempdir().unwrap();
        let plain_heads = write_all(plain.path(), config(segment_size));
        let filled_heads = write_all(filled.path(), prealloc(segment_size, fill));
        let what = format!("segments of {segment_size}, fill {fill}");
        assert_eq!(plain_heads, filled_heads, "{what}");
        let paths = segment_paths(plain.path());
        assert_eq!(paths.len(), segment_paths(filled.path()).len(), "{what}");
        for path in paths {
            let name = path.file_name().unwrap();
            let a = std::fs::read(&path).unwrap();
            let b = std::fs::read(filled.path().join(name)).unwrap();
            assert!(b.len() >= a.len(), "{what}: {name:?} shorter");
            assert_eq!(a[..], b[..a.len()], "{what}: {name:?} differs");
            assert!(
                b[a.len()..].iter().all(|&x| x == 0),
                "{what}: {name:?} has non-zero fill"
            );
            // The fill never reaches past the segment size (plus a seal).
            assert!(
                b.len() as u64 <= (segment_size + 60).max(a.len() as u64),
                "{what}: {name:?} is {} bytes",
                b.len()
            );
        }
        // The active segment really carries a zero tail when the fill is on.
        let (last, logical, size) = last_segment(filled.path());
        assert!(size >= logical, "{what}");
        if segment_size > 1 << 16 {
            assert!(size > logical, "{what}: no zero fill after the last record");
            assert_eq!(size % fill, 0, "{what}: the fill ends on a multiple");
        }

        // Recovery takes the zeros as the end: nothing cut, the same head.
        let (mut log, report, seen) =
            open_collect(filled.path(), prealloc(segment_size, fill), os()).unwrap();
        assert!(report.truncated.is_none(), "{what}");
        assert_eq!(seen.len(), 40, "{what}");
        assert_eq!(log.head(), *filled_heads.last().unwrap(), "{what}");
        assert_eq!(std::fs::metadata(&last).unwrap().len(), size, "{what}");
        let (scan, scanned) = scan_collect(filled.path()).unwrap();
        assert!(scan.torn_tail.is_none(), "{what}");
        assert_eq!(scanned, seen, "{what}");

        // Appends go on without a gap, the same as without the fill.
        let more: Vec<Owned> = (41..=43).map(sample).collect();
        let ins: Vec<_> = more.iter().map(Owned::as_in).collect();
        assert_eq!(log.append_batch(&ins).unwrap(), 43);
        let head = log.head();
        drop(log);
        let (mut plain_log, _, _) = open_collect(plain.path(), config(segment_size), os()).unwrap();
        plain_log.append_batch(&ins).unwrap();
        assert_eq!(plain_log.head(), head, "{what}: chains agree");
        let (_, report, seen) =
            open_collect(filled.path(), prealloc(segment_size, fill), os()).unwrap();
        assert!(report.truncated.is_none(), "{what}");
        assert_eq!(seen.len(), 43, "{what}");
        assert_eq!(seen[40..], more[..], "{what}");
    }
}

#[test]
fn a_torn_write_into_the_fill_is_cut_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = prealloc(1 << 20, 4096);
    let heads = write_all(dir.path(), cfg.clone());
    let (last, logical, size) = last_segment(dir.path());
    assert!(size > logical + 100);
    // Half a frame where the next record would go, zeros after it.
    let mut partial = 60u32.to_le_bytes().to_vec();
    partial.extend_from_slice(&[0xCD; 30]);
    OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .write_all_at(&partial, logical)
        .unwrap();

    let reader = LogReader::open(dir.path()).unwrap();
    let torn = reader.torn_tail().cloned().expect("the reader reports it");
    assert_eq!(torn.offset, logical);
    assert_eq!(torn.bytes_dropped, size - logical);

    let (mut log, report, seen) = open_collect(dir.path(), cfg.clone(), os()).unwrap();
    assert_eq!(seen.len(), 40);
    assert_eq!(log.head(), *heads.last().unwrap());
    let cut = report.truncated.expect("the torn write is cut");
    assert_eq!(cut.offset, logical);
    assert!(cut.quarantine.is_some(), "the non-zero bytes are kept");
    assert_eq!(std::fs::metadata(&last).unwrap().len(), logical);

    // The next append fills ahead again.
    let next = sample(41);
    assert_eq!(log.append_batch(&[next.as_in()]).unwrap(), 41);
    drop(log);
    assert_eq!(std::fs::metadata(&last).unwrap().len() % 4096, 0);
    let (_, report, seen) = open_collect(dir.path(), cfg, os()).unwrap();
    assert!(report.truncated.is_none());
    assert_eq!(seen.len(), 41);
    assert_eq!(seen[40], next);
}
