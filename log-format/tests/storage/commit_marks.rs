//! Guards format version 2's commit marks (FORMAT.md, "Commit mark" and
//! "Acknowledged bytes"):
//!
//! - a power cut that persists any subset of the pages of the last batch's
//!   unsynced write (a suffix without its prefix, every other page, only the
//!   last page, random subsets, and every subset of its pages), at every
//!   batch size from 1 to 64 records,
//!   with and without pre-allocated segments, never stops the log from
//!   opening, never loses an acknowledged record, and cuts exactly the
//!   unacknowledged tail (copied aside), which the reader reports as such;
//! - damage to acknowledged records (an earlier batch, or a record of the
//!   last batch whose commit mark is intact) is still refused, at every batch
//!   size;
//! - a version-1 log opens, takes appends (in a new version-2 segment) and
//!   verifies.

use crate::common;

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use common::*;
use spark_log_format::format::SegmentHeader;
use spark_log_format::{
    CutMode, Fs, Log, LogConfig, LogError, LogReader, MemFs, RecoveryReport, ScanOptions,
    ScanReport, PAGE_BYTES,
};

const DIR: &str = "/data/log";

fn dir() -> &'static Path {
    Path::new(DIR)
}

/// `count` records from `first_seq` on, payloads of 1 to 400 random bytes
/// with no zero byte (so no sector of a record reads as unwritten).
fn batch(rng: &mut Rng, first_seq: u64, count: u64) -> Vec<Owned> {
    (first_seq..first_seq + count)
        .map(|seq| Owned {
            seq,
            ts_ms: T0 + seq,
            kind: 1 + rng.below(100) as u16,
            kind_version: 1,
            payload: (0..1 + rng.below(400))
                .map(|_| 1 + rng.below(255) as u8)
                .collect(),
        })
        .collect()
}

fn open(fs: &MemFs, cfg: &LogConfig) -> Result<(Log, RecoveryReport, Vec<Owned>), LogError> {
    open_collect(dir(), cfg.clone(), Arc::new(fs.clone()))
}

fn read(fs: &MemFs) -> Result<(ScanReport, Vec<Owned>), LogError> {
    scan_collect_with(dir(), Arc::new(fs.clone()))
}

fn append(log: &mut Log, records: &[Owned]) -> Result<u64, LogError> {
    let ins: Vec<_> = records.iter().map(Owned::as_in).collect();
    log.append_batch(&ins)
}

/// The page patterns of the last write: (name, which of `n` pages persist).
type Pattern = (&'static str, fn(usize, usize) -> bool);

const PATTERNS: [Pattern; 8] = [
    ("no page", |_, _| false),
    ("every page", |_, _| true),
    ("only the first page", |i, _| i == 0),
    ("only the last page", |i, n| i + 1 == n),
    ("a suffix without its prefix", |i, n| i >= n / 2),
    ("a prefix without its suffix", |i, n| i < n.div_ceil(2)),
    ("every other page from the first", |i, _| i % 2 == 0),
    ("every other page from the second", |i, _| i % 2 == 1),
];

/// A log on `fs` with acknowledged batches (sizes varying, so the last
/// batch starts anywhere in a page), then one batch of `size` records whose
/// write reached the page cache but whose fdatasync never returned. Returns
/// the acknowledged records and the unacknowledged batch.
fn acked_then_unsynced(
    fs: &MemFs,
    cfg: &LogConfig,
    size: u64,
    rng: &mut Rng,
) -> (Vec<Owned>, Vec<Owned>) {
    let (mut log, _, _) = open(fs, cfg).unwrap();
    let mut acked = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let count = 1 + rng.below(size);
        let records = batch(rng, acked.len() as u64 + 1, count);
        append(&mut log, &records).unwrap();
        acked.extend(records);
    }
    let torn = batch(rng, acked.len() as u64 + 1, size);
    // The write succeeds, its fdatasync fails: the machine stopped there.
    fs.crash_after(1);
    assert!(
        append(&mut log, &torn).is_err(),
        "the batch was acknowledged"
    );
    drop(log);
    (acked, torn)
}

/// After the cut: the log opens, keeps every acknowledged record, cuts the
/// unacknowledged batch unless all of it arrived, and goes on. Returns
/// whether recovery cut a tail.
fn check_reopens(fs: &MemFs, cfg: &LogConfig, acked: &[Owned], torn: &[Owned], what: &str) -> bool {
    let (scan, scanned) = read(fs).unwrap_or_else(|e| panic!("{what}: the reader refused: {e}"));
    let (mut log, report, seen) =
        open(fs, cfg).unwrap_or_else(|e| panic!("{what}: the log refused to open: {e}"));
    assert_eq!(scanned, seen, "{what}: reader and recovery disagree");
    assert_eq!(scan.head, log.head(), "{what}");
    assert_eq!(
        &seen[..acked.len()],
        acked,
        "{what}: an acknowledged record is lost"
    );
    let all: Vec<Owned> = acked.iter().chain(torn).cloned().collect();
    assert!(
        seen.len() == acked.len() || seen == all,
        "{what}: part of a batch came back ({} of {} records)",
        seen.len() - acked.len(),
        torn.len()
    );
    if let Some(cut) = &report.truncated {
        assert!(cut.unacknowledged, "{what}: {cut:?}");
        assert!(
            !cut.whole_frame,
            "{what}: a torn write reported as damage: {cut:?}"
        );
        let (first, last) = cut.seqs.unwrap_or((acked.len() as u64 + 1, 0));
        assert_eq!(first, acked.len() as u64 + 1, "{what}");
        assert!(last <= all.len() as u64, "{what}");
        let tail = scan
            .torn_tail
            .as_ref()
            .expect("the reader reports the tail too");
        assert_eq!((tail.offset, tail.seqs), (cut.offset, cut.seqs), "{what}");
        if let Some(name) = &cut.quarantine {
            assert!(fs.read(&dir().join(name)).is_some(), "{what}: no copy");
        }
    }
    let next = batch(&mut Rng(7), seen.len() as u64 + 1, 2);
    assert_eq!(
        append(&mut log, &next).unwrap(),
        seen.len() as u64 + 2,
        "{what}"
    );
    drop(log);
    let (_, again, seen_again) = open(fs, cfg).unwrap();
    assert!(again.truncated.is_none(), "{what}");
    assert_eq!(seen_again.len(), seen.len() + 2, "{what}");
    report.truncated.is_some()
}

fn configs() -> [(&'static str, LogConfig); 2] {
    [
        ("plain", config(1 << 30)),
        (
            "pre-allocated",
            LogConfig {
                preallocate_bytes: 64 << 10,
                ..config(1 << 30)
            },
        ),
    ]
}

#[test]
fn a_torn_last_batch_in_any_page_order_is_cut_never_refused() {
    let mut rng = Rng(0x5eed_c0de);
    let (mut cuts, mut cut_tails) = (0u64, 0u64);
    for (setting, cfg) in configs() {
        for size in 1..=64u64 {
            let patterns = PATTERNS.iter().map(|&(name, keep)| (name, Some(keep)));
            let random = (0..4).map(|_| ("random pages", None));
            for (name, keep) in patterns.chain(random) {
                let fs = MemFs::new();
                let (acked, torn) = acked_then_unsynced(&fs, &cfg, size, &mut rng);
                match keep {
                    Some(keep) => fs.power_cut_pages(rng.next(), &keep),
                    None => fs.power_cut(CutMode::Pages, rng.next()),
                }
                let what = format!("{setting}, batch of {size}, {name}");
                cuts += 1;
                cut_tails += u64::from(check_reopens(&fs, &cfg, &acked, &torn, &what));
            }
        }
    }
    eprintln!("commit_marks: {cuts} page-granular power cuts, every one reopened with every acknowledged record; {cut_tails} left an unacknowledged tail, cut and copied aside");
    assert!(cuts >= 2 * 64 * 12);
}

/// Every subset of the last write's pages, not only the patterns above: at
/// every batch size from 1 to 64 records the unsynced write spans a few
/// pages (at most 6 here), so all `2^n` orders of persistence are tried,
/// each on the same log rebuilt from the same seed.
#[test]
fn a_torn_last_batch_is_cut_for_every_subset_of_its_pages() {
    let mut seeds = Rng(0x0b5e_55ed);
    let mut cuts = 0u64;
    for (setting, cfg) in configs() {
        for size in 1..=64u64 {
            let seed = seeds.next();
            let cut_seed = seeds.next();
            // The first cut learns how many pages the last write spans.
            let pages = std::cell::Cell::new(0usize);
            let fs = MemFs::new();
            let (acked, torn) = acked_then_unsynced(&fs, &cfg, size, &mut Rng(seed));
            fs.power_cut_pages(cut_seed, &|_, n| {
                pages.set(pages.get().max(n));
                true
            });
            let what = format!("{setting}, batch of {size}, every page");
            check_reopens(&fs, &cfg, &acked, &torn, &what);
            let n = pages.get();
            assert!((1..=12).contains(&n), "{what}: {n} pages");
            for mask in 0..(1u32 << n) {
                let fs = MemFs::new();
                let (acked, torn) = acked_then_unsynced(&fs, &cfg, size, &mut Rng(seed));
                fs.power_cut_pages(cut_seed, &|i, _| mask & (1 << i) != 0);
                let what = format!("{setting}, batch of {size}, pages {mask:0n$b} of {n}");
                check_reopens(&fs, &cfg, &acked, &torn, &what);
                cuts += 1;
            }
        }
    }
    eprintln!(
        "commit_marks: {cuts} cuts, every subset of the last write's pages at every batch size"
    );
    assert!(cuts >= 2 * 64 * 2);
}

/// Bytes of the batches as the writer laid them out: (offset, size) of each
/// batch's records (its commit mark follows).
fn batch_extents(fs: &MemFs) -> (std::path::PathBuf, Vec<(usize, usize)>) {
    let reader = LogReader::open_with(dir(), Arc::new(fs.clone())).unwrap();
    let name = reader.segments().last().unwrap().name.clone();
    let mut extents = Vec::new();
    let mut last_end = 0usize;
    reader
        .scan(ScanOptions::default(), |_, r| {
            let at = r.offset as usize;
            let end = at + 28 + r.payload.len();
            if at != last_end || extents.is_empty() {
                extents.push((at, end - at));
            } else if let Some(last) = extents.last_mut() {
                last.1 = end - last.0;
            }
            last_end = end;
            ControlFlow::Continue(())
        })
        .unwrap();
    (dir().join(name), extents)
}

fn flip_in(fs: &MemFs, path: &Path, offset: usize) {
    let mut bytes = fs.read(path).unwrap();
    bytes[offset] ^= 0x10;
    fs.remove_file(path).unwrap();
    let mut file = fs.create_new(path).unwrap();
    file.write_all_at(0, &bytes).unwrap();
    file.sync_all().unwrap();
    fs.sync_dir(dir()).unwrap();
}

#[test]
fn damage_to_acknowledged_records_is_refused_at_every_batch_size() {
    let mut rng = Rng(0xdead_beef);
    let cfg = config(1 << 30);
    for size in 1..=64u64 {
        for target in ["an earlier batch", "the last batch, its mark intact"] {
            let fs = MemFs::new();
            let (mut log, _, _) = open(&fs, &cfg).unwrap();
            let first = batch(&mut rng, 1, size);
            append(&mut log, &first).unwrap();
            let second = batch(&mut rng, size + 1, size);
            append(&mut log, &second).unwrap();
            drop(log);
            let (path, extents) = batch_extents(&fs);
            assert_eq!(extents.len(), 2, "two batches of {size}");
            let (at, len) = extents[usize::from(target != "an earlier batch")];
            let offset = at + rng.below(len as u64) as usize;
            flip_in(&fs, &path, offset);
            let what = format!("batch of {size}, a flip at {offset} in {target}");
            let refused = open(&fs, &cfg).map(|_| ()).unwrap_err();
            assert!(
                matches!(refused, LogError::Corrupt { .. }),
                "{what}: {refused}"
            );
            let by_reader = read(&fs).map(|_| ()).unwrap_err();
            assert_eq!(
                corrupt_fields(&by_reader),
                corrupt_fields(&refused),
                "{what}"
            );
        }
    }
}

#[test]
fn a_version_1_log_opens_takes_appends_in_version_2_and_verifies() {
    let vectors = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/v1/two-segments");
    let copy = copy_dir(&vectors);
    let (mut log, report, seen) = open_collect(copy.path(), config(1 << 20), os()).unwrap();
    assert_eq!((seen.len(), report.truncated.is_none()), (5, true));
    append(&mut log, &[sample(6), sample(7)]).unwrap();
    drop(log);
    let names: Vec<String> = segment_paths(copy.path())
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        names.len(),
        3,
        "the version-1 segment was sealed: {names:?}"
    );
    let versions: Vec<u16> = segment_paths(copy.path())
        .iter()
        .map(|p| {
            SegmentHeader::decode_versioned(&std::fs::read(p).unwrap())
                .unwrap()
                .1
        })
        .collect();
    assert_eq!(versions, [1, 1, 2]);
    let (scan, scanned) = scan_collect(copy.path()).unwrap();
    assert_eq!(scanned.len(), 7);
    assert_eq!(&scanned[5..], &[sample(6), sample(7)]);
    let (log, _, seen) = open_collect(copy.path(), config(1 << 20), os()).unwrap();
    assert_eq!((seen, log.head()), (scanned, scan.head));

    // A version-1 segment holding no record gets a version-2 header.
    let empty = tempfile::tempdir().unwrap();
    SegmentBytes::v1(1, [0; 32]).write(empty.path());
    let (mut log, _, _) = open_collect(empty.path(), config(1 << 20), os()).unwrap();
    append(&mut log, &[sample(1)]).unwrap();
    drop(log);
    let paths = segment_paths(empty.path());
    assert_eq!(paths.len(), 1);
    let bytes = std::fs::read(&paths[0]).unwrap();
    assert_eq!(SegmentHeader::decode_versioned(&bytes).unwrap().1, 2);
    let (_, seen) = scan_collect(empty.path()).unwrap();
    assert_eq!(seen, [sample(1)]);
}

/// A hole of unwritten pages in the middle of the last batch, with its
/// commit mark persisted after it, is cut; the same batch followed by a
/// later write is refused (the writer starts a batch only after the one
/// before is durable).
#[test]
fn a_hole_is_cut_in_the_last_write_and_refused_before_a_later_one() {
    let cfg = config(1 << 30);
    let fs = MemFs::new();
    let (mut log, _, _) = open(&fs, &cfg).unwrap();
    let mut rng = Rng(3);
    let first = batch(&mut rng, 1, 40);
    append(&mut log, &first).unwrap();
    drop(log);
    let (path, extents) = batch_extents(&fs);
    let (at, len) = extents[0];
    assert!(len > 2 * PAGE_BYTES);
    let mut bytes = fs.read(&path).unwrap();
    let hole = (at / PAGE_BYTES + 1) * PAGE_BYTES;
    bytes[hole..hole + PAGE_BYTES].fill(0);
    let rewrite = |bytes: &[u8]| {
        fs.remove_file(&path).unwrap();
        let mut file = fs.create_new(&path).unwrap();
        file.write_all_at(0, bytes).unwrap();
        file.sync_all().unwrap();
        fs.sync_dir(dir()).unwrap();
    };
    // Followed by more bytes: a later batch was written, so this one was
    // acknowledged.
    let mut later = bytes.clone();
    later.extend_from_slice(&[0xAB; 100]);
    rewrite(&later);
    assert!(matches!(open(&fs, &cfg), Err(LogError::Corrupt { .. })));
    // The last write: cut, with a copy.
    rewrite(&bytes);
    let (_, report, seen) = open(&fs, &cfg).unwrap();
    assert!(seen.is_empty());
    let cut = report.truncated.unwrap();
    assert!(cut.unacknowledged && cut.quarantine.is_some());
    assert_eq!(cut.seqs, Some((1, 40)));
    assert!(
        cut.summary().starts_with("unacknowledged tail cut"),
        "{}",
        cut.summary()
    );
}
