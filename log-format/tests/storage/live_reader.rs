//! Guards reading a log while it is written (a server's own event
//! catch-up, the tools on a running server's directory): with pre-allocated
//! segments the reader maps bytes the writer is still copying in, and may
//! see a batch's commit mark before its first record. Opened as a live log
//! (`LogReader::open_live`) the reader must not call that damage, and every
//! record it shows is one the writer wrote, in order; a scan reports the log
//! as open found it.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use std::ops::ControlFlow;

use common::*;
use spark_log_format::{Log, LogConfig, LogReader, ScanOptions, DEFAULT_MAX_RECORD_BYTES};

#[test]
fn a_reader_beside_a_busy_writer_never_reports_damage() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        preallocate_bytes: 1 << 20,
        ..config(4 << 20)
    };
    let (mut log, _) = Log::open(dir.path(), config, os(), |_| {
        Ok::<(), std::convert::Infallible>(())
    })
    .unwrap();
    let records: Vec<Owned> = (1..=3_000).map(sample).collect();
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let dir = dir.path().to_owned();
        let done = done.clone();
        std::thread::spawn(move || {
            let mut reads = 0u32;
            while !done.load(Ordering::Relaxed) || reads < 20 {
                let reader = LogReader::open_live(&dir, os(), DEFAULT_MAX_RECORD_BYTES)
                    .unwrap_or_else(|e| panic!("open {reads} beside the writer: {e}"));
                assert!(
                    reader.torn_tail().is_none(),
                    "a live log has no torn tail: {:?}",
                    reader.torn_tail()
                );
                let open_end = reader.segments().last().map_or(0, |s| s.last_seq);
                let mut seen = Vec::new();
                let report = reader
                    .scan(ScanOptions::default(), |_, r| {
                        seen.push(Owned::from_ref(&r));
                        ControlFlow::Continue(())
                    })
                    .unwrap_or_else(|e| panic!("scan {reads} beside the writer: {e}"));
                assert_eq!(report.head.seq, open_end, "a scan ends where open ended");
                for (i, record) in seen.iter().enumerate() {
                    assert_eq!(record, &sample(i as u64 + 1), "read {reads}");
                }
                reads += 1;
            }
            reads
        })
    };
    for chunk in records.chunks(3) {
        let batch: Vec<_> = chunk.iter().map(Owned::as_in).collect();
        log.append_batch(&batch).unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let reads = reader.join().unwrap();
    assert!(reads >= 20);
}

/// The writer creates a segment file, then writes and syncs its header (the
/// first append of a new log, every roll): a live reader that lists the
/// directory in between sees a newest file with no whole header. That is a
/// roll in progress, not a torn tail: the view ends before it. Recovery,
/// which runs alone, still reports it as an interrupted roll.
#[test]
fn a_roll_in_progress_is_not_a_torn_tail_to_a_live_reader() {
    let dir = tempfile::tempdir().unwrap();
    let name = spark_log_format::format::segment_file_name(1);
    for header_bytes in [0usize, 20] {
        std::fs::write(dir.path().join(&name), vec![0u8; header_bytes]).unwrap();
        let live = LogReader::open_live(dir.path(), os(), DEFAULT_MAX_RECORD_BYTES).unwrap();
        assert!(live.torn_tail().is_none(), "{:?}", live.torn_tail());
        assert!(live.segments().is_empty());
        let alone = LogReader::open_with_limit(dir.path(), os(), DEFAULT_MAX_RECORD_BYTES).unwrap();
        assert!(
            alone
                .torn_tail()
                .is_some_and(|t| t.damage.contains("interrupted roll")),
            "{:?}",
            alone.torn_tail()
        );
    }
}
