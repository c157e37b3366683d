//! Guards group commit: many threads appending through GroupCommitAppender
//! get unique, gapless seqs that survive a reopen; under contention records
//! share fdatasyncs; a lone record is written at once.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;
use spark_log_format::{FaultOp, FaultyFs, GroupCommitAppender, LogError};

fn assert_sync<T: Sync + Send>() {}

#[test]
fn many_threads_get_gapless_seqs_and_share_syncs() {
    assert_sync::<GroupCommitAppender>();
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyFs::new(os()));
    let (log, _, _) = open_collect(dir.path(), config(4096), faulty.clone()).unwrap();
    // A slow fsync widens the window in which submitters queue up.
    faulty.set_delay(FaultOp::SyncData, Some(Duration::from_millis(2)));
    let syncs_before = faulty.count(FaultOp::SyncData);
    let appender = Arc::new(GroupCommitAppender::spawn(log, 64));

    const THREADS: u64 = 8;
    const PER_THREAD: u64 = 40;
    let barrier = Arc::new(Barrier::new(THREADS as usize));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let appender = Arc::clone(&appender);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                (0..PER_THREAD)
                    .map(|i| {
                        let payload = format!("thread {t} record {i}").into_bytes();
                        let seq = appender.append(T0 + i, 7, 1, payload.clone()).unwrap();
                        (seq, payload)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut by_seq = BTreeMap::new();
    for handle in handles {
        for (seq, payload) in handle.join().unwrap() {
            assert!(
                by_seq.insert(seq, payload).is_none(),
                "seq {seq} given twice"
            );
        }
    }
    let total = THREADS * PER_THREAD;
    assert_eq!(
        by_seq.keys().copied().collect::<Vec<_>>(),
        (1..=total).collect::<Vec<_>>()
    );
    let head = appender.head();
    assert_eq!(head.seq, total);

    let appender = Arc::into_inner(appender).unwrap();
    let log = appender.shutdown().unwrap();
    assert_eq!(log.head(), head);
    drop(log);
    let syncs = faulty.count(FaultOp::SyncData) - syncs_before;
    eprintln!("{syncs} fdatasyncs for {total} records");
    assert!(
        syncs * 2 <= total,
        "{syncs} fdatasyncs for {total} records: batching did not happen"
    );

    let (log, _, seen) = open_collect(dir.path(), config(4096), os()).unwrap();
    assert_eq!(log.head(), head);
    assert_eq!(seen.len() as u64, total);
    for record in seen {
        assert_eq!(by_seq[&record.seq], record.payload, "seq {}", record.seq);
    }
}

#[test]
fn a_lone_record_is_written_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyFs::new(os()));
    let (log, _, _) = open_collect(dir.path(), config(1 << 20), faulty.clone()).unwrap();
    let appender = GroupCommitAppender::spawn(log, 64);
    for i in 1..=20u64 {
        let syncs = faulty.count(FaultOp::SyncData);
        let started = Instant::now();
        assert_eq!(appender.append(T0, 3, 1, vec![i as u8; 10]).unwrap(), i);
        // One record, one batch, one sync, and no waiting for company.
        assert_eq!(faulty.count(FaultOp::SyncData), syncs + 1);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "lone append waited"
        );
    }
    let log = appender.shutdown().unwrap();
    assert_eq!(log.last_seq(), 20);
}

#[test]
fn a_bad_record_fails_alone_and_errors_reach_every_submitter() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyFs::new(os()));
    let mut cfg = config(1 << 20);
    cfg.max_record_bytes = 100;
    let (log, _, _) = open_collect(dir.path(), cfg, faulty.clone()).unwrap();
    let appender = GroupCommitAppender::spawn(log, 64);
    assert!(matches!(
        appender.append(T0, 1, 1, vec![0; 81]),
        Err(LogError::RecordTooLarge {
            bytes: 101,
            limit: 100
        })
    ));
    assert!(matches!(
        appender.append(T0, 0, 1, vec![]),
        Err(LogError::ReservedKind { kind: 0 })
    ));
    assert_eq!(appender.append(T0, 1, 1, vec![0; 80]).unwrap(), 1);
    faulty.fail_next(FaultOp::SyncData, spark_log_format::Fault::Os(28));
    let error = appender.append(T0, 1, 1, vec![1]).unwrap_err();
    assert!(error.is_no_space(), "{error:?}");
    assert!(matches!(
        appender.append(T0, 1, 1, vec![2]),
        Err(LogError::Poisoned(_))
    ));
    let log = appender.shutdown().unwrap();
    assert!(log.is_poisoned());
}
