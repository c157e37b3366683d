//! Guards the fatal-error rule: an injected fsync or write failure makes that
//! append fail and every later one return Poisoned (no retry, no further
//! write); reopening recovers the synced records and cuts a torn tail.

use crate::common;

use std::sync::Arc;

use common::*;
use spark_log_format::{Fault, FaultOp, FaultyFs, LogError};

const EIO: i32 = 5;

#[test]
fn fsync_failure_poisons_and_reopen_recovers_the_synced_records() {
    for code in [EIO, 28] {
        let dir = tempfile::tempdir().unwrap();
        let faulty = Arc::new(FaultyFs::new(os()));
        let (mut log, _, _) = open_collect(dir.path(), config(1 << 20), faulty.clone()).unwrap();
        let synced: Vec<Owned> = (1..=5).map(sample).collect();
        let ins: Vec<_> = synced.iter().map(Owned::as_in).collect();
        assert_eq!(log.append_batch(&ins).unwrap(), 5);
        let synced_head = log.head();

        faulty.fail_next(FaultOp::SyncData, Fault::Os(code));
        let failed = sample(6);
        let error = log.append_batch(&[failed.as_in()]).unwrap_err();
        assert!(
            matches!(
                &error,
                LogError::Io {
                    op: "sync_data",
                    ..
                }
            ),
            "{error:?}"
        );
        assert_eq!(error.is_no_space(), code == 28);
        assert!(log.is_poisoned());
        assert_eq!(log.head(), synced_head, "an unsynced batch moved the head");

        let writes = faulty.count(FaultOp::Write);
        let syncs = faulty.count(FaultOp::SyncData);
        for _ in 0..3 {
            let later = log.append_batch(&[sample(7).as_in()]).unwrap_err();
            assert!(
                matches!(later, LogError::Poisoned(ref m) if m.contains("sync_data")),
                "{later:?}"
            );
        }
        assert!(matches!(log.append_batch(&[]), Err(LogError::Poisoned(_))));
        assert_eq!(faulty.count(FaultOp::Write), writes, "a poisoned log wrote");
        assert_eq!(
            faulty.count(FaultOp::SyncData),
            syncs,
            "a poisoned log retried fsync"
        );
        drop(log);

        // The failed batch reached the page cache, so it may or may not be
        // on disk after a real crash; the synced ones must be.
        let (log, _, seen) = open_collect(dir.path(), config(1 << 20), os()).unwrap();
        assert_eq!(seen[..5], synced[..]);
        assert!(seen.len() == 5 || seen[5] == failed);
        assert_eq!(log.last_seq(), seen.len() as u64);
    }
}

#[test]
fn short_write_poisons_and_reopen_truncates_the_torn_tail() {
    for written in [1usize, 7, 8, 27, 40] {
        let dir = tempfile::tempdir().unwrap();
        let faulty = Arc::new(FaultyFs::new(os()));
        let (mut log, _, _) = open_collect(dir.path(), config(1 << 20), faulty.clone()).unwrap();
        let synced: Vec<Owned> = (1..=3).map(sample).collect();
        let ins: Vec<_> = synced.iter().map(Owned::as_in).collect();
        log.append_batch(&ins).unwrap();
        let head = log.head();
        let end = std::fs::metadata(segment_paths(dir.path())[0].clone())
            .unwrap()
            .len();

        faulty.fail_next(FaultOp::Write, Fault::ShortWrite { written });
        let batch: Vec<Owned> = (4..=5).map(sample).collect();
        let ins: Vec<_> = batch.iter().map(Owned::as_in).collect();
        assert!(matches!(
            log.append_batch(&ins),
            Err(LogError::Io { op: "write", .. })
        ));
        assert!(matches!(log.append_batch(&ins), Err(LogError::Poisoned(_))));
        drop(log);

        // Whole records inside the written prefix were never acknowledged:
        // the batch's commit mark, at its end, was not written, so recovery
        // cuts the whole prefix (format version 2) and names its seqs.
        let first_size = (spark_log_format::RECORD_HEADER_LEN + batch[0].payload.len()) as u64;
        let (mut log, report, seen) = open_collect(dir.path(), config(1 << 20), os()).unwrap();
        assert_eq!(seen, synced, "short write of {written}");
        assert_eq!(log.head(), head);
        let torn = report.truncated.expect("torn tail reported");
        assert_eq!((torn.offset, torn.bytes_dropped), (end, written as u64));
        assert!(torn.unacknowledged);
        let whole = written as u64 >= first_size;
        assert_eq!(
            torn.seqs,
            whole.then_some((4, 4)),
            "short write of {written}"
        );
        let rest: Vec<_> = batch.iter().map(Owned::as_in).collect();
        assert_eq!(log.append_batch(&rest).unwrap(), 5);
    }
}

#[test]
fn truncate_failure_during_recovery_is_an_error_not_a_silent_pass() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _, _) = open_collect(dir.path(), config(1 << 20), os()).unwrap();
    log.append_batch(&[sample(1).as_in()]).unwrap();
    drop(log);
    let path = segment_paths(dir.path()).remove(0);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&[0xEE; 5]);
    std::fs::write(&path, &bytes).unwrap();
    let faulty = Arc::new(FaultyFs::new(os()));
    faulty.fail_next(FaultOp::SetLen, Fault::Os(EIO));
    let error = open_collect(dir.path(), config(1 << 20), faulty)
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(error, LogError::Io { op: "set_len", .. }),
        "{error:?}"
    );
}
