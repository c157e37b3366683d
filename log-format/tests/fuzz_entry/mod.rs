//! The two fuzz entry points, shared by the cargo-fuzz targets in `/fuzz`
//! (which include this file by path) and by `tests/fuzz_like.rs` (which runs
//! them on random and mutated-valid inputs with the stable toolchain).
//!
//! Each entry point panics on a broken promise, so a fuzzer reports it:
//!
//! - [`record_decoder`]: arbitrary bytes into the record and header
//!   decoders: no panic, no allocation at all, every accepted frame lies
//!   inside the input and re-encodes to exactly its bytes.
//! - [`segment_recovery`]: arbitrary bytes as the last segment, or as a
//!   sealed one, of a log on `MemFs`, through `LogReader` and `Log::open`: no
//!   panic, no allocation larger than a small multiple of the input (nothing
//!   sized from a length field), reader and recovery agree, and when recovery
//!   succeeds, opening again changes nothing, reads the same records, and
//!   appends go on.
//!
//! The module installs a counting global allocator ([`Counting`]) in the
//! binary that includes it.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use spark_log_format::format::{
    decode_record, encode_record, segment_file_name, RecordDecode, SegmentHeader,
};
use spark_log_format::{
    LogConfig, LogError, LogReader, MemFs, RecordIn, ScanOptions, DEFAULT_MAX_RECORD_BYTES,
    HEADER_LEN,
};

// ---- Allocation accounting ------------------------------------------------

/// The global allocator of a binary that includes this module: the system
/// allocator, counting per thread the allocations made and the largest one.
pub struct Counting;

thread_local! {
    /// Allocations (and reallocations) on this thread since the last reset.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    /// The largest size requested on this thread since the last reset.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: never panics, even while a thread is being torn down; the
    // cells are const-initialised and need no allocation.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
    let _ = LARGEST.try_with(|c| c.set(c.get().max(size)));
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// bookkeeping touches only const-initialised thread-locals.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f` and returns its result with the number of allocations it made
/// and the largest one (in bytes), on this thread.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, u64, usize) {
    ALLOCS.with(|c| c.set(0));
    LARGEST.with(|c| c.set(0));
    let out = f();
    (out, ALLOCS.with(Cell::get), LARGEST.with(Cell::get))
}

// ---- record_decoder -------------------------------------------------------

/// Arbitrary bytes through [`decode_record`] (walking frame after frame, with
/// the default limit and with no limit) and [`SegmentHeader::decode`].
pub fn record_decoder(data: &[u8]) {
    for limit in [DEFAULT_MAX_RECORD_BYTES, u32::MAX, 64] {
        let mut offset = 0;
        loop {
            let (decoded, allocs, _) = measure(|| decode_record(data, offset, limit));
            assert_eq!(allocs, 0, "decode_record allocated");
            let RecordDecode::Record { record, size } = decoded else {
                break;
            };
            let frame = data
                .get(offset..offset + size)
                .expect("an accepted frame lies inside the input");
            assert_eq!(record.offset, offset as u64);
            assert!(size >= 28 && (size - 8) as u64 <= u64::from(limit));
            // The decoder accepts exactly what the encoder writes.
            let mut again = Vec::new();
            let input = RecordIn {
                ts_ms: record.ts_ms,
                kind: record.kind,
                kind_version: record.kind_version,
                payload: record.payload,
            };
            encode_record(&mut again, record.seq, &input).expect("re-encode");
            assert_eq!(
                again, frame,
                "an accepted frame does not re-encode to its bytes"
            );
            offset += size;
        }
    }
    let (header, allocs, _) = measure(|| SegmentHeader::decode(data));
    assert_eq!(allocs, 0, "SegmentHeader::decode allocated");
    if let Ok(header) = header {
        assert_eq!(
            &header.encode()[..],
            &data[..HEADER_LEN],
            "header re-encode"
        );
    }
}

// ---- segment_recovery -----------------------------------------------------

/// The committed test vector `two-segments/`: records 1 to 3 sealed in the
/// first segment, 4 and 5 in the open second one.
pub const SEALED_1: &[u8] = include_bytes!("../vectors/v1/two-segments/00000000000000000001.seg");
/// See [`SEALED_1`].
pub const LAST_4: &[u8] = include_bytes!("../vectors/v1/two-segments/00000000000000000004.seg");
/// The committed test vector `single/`: records 1 to 3, open.
pub const SINGLE_1: &[u8] = include_bytes!("../vectors/v1/single/00000000000000000001.seg");

const DIR: &str = "/fuzz/log";

fn pinned_clock() -> u64 {
    1_700_000_000_000
}

/// Every file of the log directory with its bytes.
fn snapshot(fs: &MemFs) -> Vec<(PathBuf, Vec<u8>)> {
    fs.paths()
        .into_iter()
        .map(|p| {
            let bytes = fs.read(&p).unwrap_or_default();
            (p, bytes)
        })
        .collect()
}

/// (seq, ts, kind, kind_version, payload) of every record, with the head.
type Records = Vec<(u64, u64, u16, u16, Vec<u8>)>;

fn corrupt_place(e: &LogError) -> Option<(String, u64, spark_log_format::FaultSeq)> {
    match e {
        LogError::Corrupt {
            segment,
            offset,
            seq,
            ..
        } => Some((segment.clone(), *offset, *seq)),
        _ => None,
    }
}

/// What the reader makes of the directory: records and head, or the error.
fn read(fs: &MemFs, limit: u32) -> Result<(Records, spark_log_format::Head), LogError> {
    let reader = LogReader::open_with_limit(Path::new(DIR), Arc::new(fs.clone()), limit)?;
    let mut records = Vec::new();
    let report = reader.scan(
        ScanOptions {
            verify_chain: true,
            max_record_bytes: limit,
        },
        |_, r| {
            records.push((r.seq, r.ts_ms, r.kind, r.kind_version, r.payload.to_vec()));
            ControlFlow::Continue(())
        },
    )?;
    Ok((records, report.head))
}

type Opened = (
    spark_log_format::Log,
    spark_log_format::RecoveryReport,
    Records,
);

fn open(fs: &MemFs, config: &LogConfig) -> Result<Opened, LogError> {
    let mut records = Vec::new();
    let (log, report) =
        spark_log_format::Log::open(Path::new(DIR), config.clone(), Arc::new(fs.clone()), |r| {
            records.push((r.seq, r.ts_ms, r.kind, r.kind_version, r.payload.to_vec()));
            Ok::<(), std::convert::Infallible>(())
        })?;
    Ok((log, report, records))
}

/// `data[0]` picks the layout (bits 0-1) and a small record limit (bit 2);
/// the rest is a segment file:
///
/// - 0: the only segment, `…01.seg` (the last one);
/// - 1: the last segment, `…04.seg`, after the valid sealed `SEALED_1`;
/// - 2: a sealed segment, `…01.seg`, before the valid last `LAST_4`;
/// - 3: a sealed segment, `…01.seg`, before an empty last `…02.seg` (an
///   interrupted roll).
///
/// Returns what happened, for statistics.
pub fn segment_recovery(data: &[u8]) -> Outcome {
    let Some((&selector, segment)) = data.split_first() else {
        return Outcome::Empty;
    };
    let dir = Path::new(DIR);
    let fs = MemFs::new();
    let name = |seq| dir.join(segment_file_name(seq));
    match selector & 3 {
        0 => fs.insert_durable(&name(1), segment),
        1 => {
            fs.insert_durable(&name(1), SEALED_1);
            fs.insert_durable(&name(4), segment);
        }
        2 => {
            fs.insert_durable(&name(1), segment);
            fs.insert_durable(&name(4), LAST_4);
        }
        _ => {
            fs.insert_durable(&name(1), segment);
            fs.insert_durable(&name(2), &[]);
        }
    }
    let limit = if selector & 4 == 0 {
        DEFAULT_MAX_RECORD_BYTES
    } else {
        64
    };
    let config = LogConfig {
        segment_size_bytes: 256,
        max_record_bytes: limit,
        now_ms: pinned_clock,
        preallocate_bytes: 0,
        compaction_pace: None,
    };
    // The largest allocation any of this may make: copies of the files (the
    // MemFs maps are copies), never a size read from the bytes.
    let bound = 4 * data.len() + SEALED_1.len() + LAST_4.len() + (64 << 10);

    let (read_first, _, largest) = measure(|| read(&fs, limit));
    assert!(largest <= bound, "the reader allocated {largest} bytes");
    let (opened, _, largest) = measure(|| open(&fs, &config));
    assert!(largest <= bound, "recovery allocated {largest} bytes");

    let (log, report, records) = match (read_first, opened) {
        (Err(read_error), Err(open_error)) => {
            assert_eq!(
                corrupt_place(&read_error),
                corrupt_place(&open_error),
                "reader and recovery name different damage: {read_error} / {open_error}"
            );
            return Outcome::Refused;
        }
        (Ok(_), Err(e)) => panic!("recovery refused what the reader read: {e}"),
        (Err(e), Ok(_)) => panic!("the reader refused what recovery accepted: {e}"),
        (Ok((read_records, read_head)), Ok((log, report, records))) => {
            assert_eq!(
                read_records, records,
                "reader and recovery read different records"
            );
            assert_eq!(
                read_head,
                log.head(),
                "reader and recovery disagree on the head"
            );
            (log, report, records)
        }
    };
    assert_eq!(log.last_seq(), records.len() as u64);
    let head = log.head();
    drop(log);

    // Idempotent: a second open reads the same and changes nothing.
    let before = snapshot(&fs);
    let (log, again, records_again) = open(&fs, &config).expect("a recovered log reopens");
    assert!(
        again.truncated.is_none() && again.removed_segment.is_none(),
        "the second open repaired something: {again:?}"
    );
    assert_eq!(records_again, records);
    assert_eq!(log.head(), head);
    assert_eq!(snapshot(&fs), before, "the second open changed the files");
    let (read_records, read_head) = read(&fs, limit).expect("the reader reads a recovered log");
    assert_eq!(read_records, records);
    assert_eq!(read_head, head);

    // Appends go on without a gap.
    let mut log = log;
    let next = log
        .append_batch(&[RecordIn {
            ts_ms: 1,
            kind: 7,
            kind_version: 1,
            payload: b"after",
        }])
        .expect("append after recovery");
    assert_eq!(next, head.seq + 1);
    drop(log);
    let (_, _, after) = open(&fs, &config).expect("reopen after the append");
    assert_eq!(after.len(), records.len() + 1);
    assert_eq!(&after[..records.len()], &records[..]);
    if report.truncated.is_some() || report.removed_segment.is_some() {
        Outcome::Repaired(records.len())
    } else {
        Outcome::Clean(records.len())
    }
}

/// What [`segment_recovery`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No input.
    Empty,
    /// Reader and recovery both refused the log (the same damage).
    Refused,
    /// Recovery cut a torn tail or removed an interrupted roll, then kept
    /// this many records.
    Repaired(usize),
    /// Recovery found nothing to repair; this many records.
    Clean(usize),
}
