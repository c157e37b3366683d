//! Guards the record-size limit: a `len` over max_record_bytes in the file
//! is a torn tail at the very end and corruption before a valid record,
//! never an allocation of that size; a whole record over a lowered limit is
//! refused, never silently truncated; oversized appends are refused.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use spark_log_format::format::segment_file_name;
use spark_log_format::LogError;

/// Tracks the largest single allocation, to prove no `len` is trusted.
struct Tracking;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Tracking = Tracking;

/// A frame whose `len` claims `len` bytes, followed by 40 bytes of noise.
fn huge_frame(len: u32) -> Vec<u8> {
    let mut frame = len.to_le_bytes().to_vec();
    frame.extend((0..40u8).map(|i| i.wrapping_mul(37)));
    frame
}

#[test]
fn huge_len_at_the_tail_is_torn_and_never_allocated() {
    for len in [u32::MAX, 0x8000_0000, (4 << 20) + 1] {
        let dir = tempfile::tempdir().unwrap();
        let first = SegmentBytes::new(1, [0; 32]).record(1).record(2);
        let mut bytes = first.bytes.clone();
        bytes.extend_from_slice(&huge_frame(len));
        std::fs::write(dir.path().join(segment_file_name(1)), &bytes).unwrap();

        LARGEST.store(0, Ordering::Relaxed);
        let (_, report, seen) = open_collect(dir.path(), config(1 << 20), os()).unwrap();
        assert!(
            LARGEST.load(Ordering::Relaxed) < 1 << 20,
            "recovery allocated {} bytes",
            LARGEST.load(Ordering::Relaxed)
        );
        assert_eq!(seen.len(), 2);
        assert_eq!(report.truncated.unwrap().offset, first.bytes.len() as u64);
    }
}

#[test]
fn huge_len_before_a_valid_record_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let seg = SegmentBytes::new(1, [0; 32]).record(1).record(2).record(3);
    let mut bytes = seg.bytes.clone();
    // Overwrite record 2's len with a huge value: record 3 still follows.
    bytes[seg.offsets[1]..seg.offsets[1] + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(dir.path().join(segment_file_name(1)), &bytes).unwrap();
    LARGEST.store(0, Ordering::Relaxed);
    let error = open_collect(dir.path(), config(1 << 20), os())
        .map(|_| ())
        .unwrap_err();
    assert!(LARGEST.load(Ordering::Relaxed) < 1 << 20);
    let (segment, offset, seq) = corrupt_fields(&error);
    assert_eq!(
        (segment, offset, seq),
        (
            segment_file_name(1),
            seg.offsets[1] as u64,
            spark_log_format::FaultSeq::Record(2)
        )
    );
    assert_eq!(
        corrupt_fields(&reader_error(dir.path())).1,
        seg.offsets[1] as u64
    );
}

#[test]
fn whole_record_over_a_lowered_limit_is_refused_not_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _, _) = open_collect(dir.path(), config(1 << 20), os()).unwrap();
    log.append_batch(&[sample(1).as_in()]).unwrap();
    let big = vec![7u8; 500];
    log.append_batch(&[spark_log_format::RecordIn {
        ts_ms: T0,
        kind: 1,
        kind_version: 1,
        payload: &big,
    }])
    .unwrap();
    drop(log);
    let len_before = std::fs::metadata(segment_paths(dir.path())[0].clone())
        .unwrap()
        .len();
    let mut small = config(1 << 20);
    small.max_record_bytes = 100;
    let error = open_collect(dir.path(), small, os())
        .map(|_| ())
        .unwrap_err();
    assert!(
        error.to_string().contains("over max_record_bytes"),
        "{error}"
    );
    assert_eq!(
        corrupt_fields(&error).2,
        spark_log_format::FaultSeq::Record(2)
    );
    let len_after = std::fs::metadata(segment_paths(dir.path())[0].clone())
        .unwrap()
        .len();
    assert_eq!(len_before, len_after, "acknowledged data was cut off");
}

#[test]
fn oversized_and_reserved_appends_are_refused_without_poisoning() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(1 << 20);
    cfg.max_record_bytes = 64;
    let (mut log, _, _) = open_collect(dir.path(), cfg, os()).unwrap();
    let payload = vec![0u8; 45];
    let too_big = spark_log_format::RecordIn {
        ts_ms: T0,
        kind: 1,
        kind_version: 1,
        payload: &payload,
    };
    assert!(matches!(
        log.append_batch(&[sample(1).as_in(), too_big]),
        Err(LogError::RecordTooLarge {
            bytes: 65,
            limit: 64
        })
    ));
    let seal_kind = spark_log_format::RecordIn {
        ts_ms: T0,
        kind: 0,
        kind_version: 1,
        payload: &[],
    };
    assert!(matches!(
        log.append_batch(&[seal_kind]),
        Err(LogError::ReservedKind { kind: 0 })
    ));
    assert!(!log.is_poisoned());
    assert_eq!(log.last_seq(), 0, "a refused batch wrote part of itself");
    let fits = spark_log_format::RecordIn {
        ts_ms: T0,
        kind: 1,
        kind_version: 1,
        payload: &payload[..44],
    };
    assert_eq!(log.append_batch(&[fits]).unwrap(), 1);
}
