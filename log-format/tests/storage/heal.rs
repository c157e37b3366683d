//! [`Log::heal`]: a write or create refused for want of space
//! leaves a poison that an in-process recovery lifts, with the head exactly
//! where the last acknowledged batch left it and none of the failed bytes
//! kept; a failed fsync stays fatal whatever its errno.

use crate::common;

use std::sync::Arc;

use common::*;
use spark_log_format::{Fault, FaultOp, FaultyFs, LogConfig, LogError};

const ENOSPC: i32 = 28;

/// A payload the failed batch carried, unlike anything `sample` makes.
fn stranger(seq: u64) -> Owned {
    Owned {
        payload: vec![0xEE; 40],
        ..sample(seq)
    }
}

/// Appends 1..=5, fails a batch with `fault` on `op`, heals, appends 6..=7,
/// reopens, and checks that exactly 1..=7 of `sample` are there.
fn fail_heal_and_check(config: LogConfig, op: FaultOp, fault: Fault) {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyFs::new(os()));
    let (mut log, _, _) = open_collect(dir.path(), config.clone(), faulty.clone()).unwrap();
    let first: Vec<Owned> = (1..=5).map(sample).collect();
    append_each(&mut log, &first);
    let acked = log.head();

    faulty.fail_next(op, fault);
    let failed: Vec<Owned> = (6..=9).map(stranger).collect();
    let ins: Vec<_> = failed.iter().map(Owned::as_in).collect();
    let error = log.append_batch(&ins).unwrap_err();
    assert!(error.is_no_space(), "{op:?}: {error:?}");
    assert!(log.is_healable(), "{op:?}");
    assert_eq!(log.head(), acked, "{op:?}: a failed batch moved the head");
    assert!(matches!(
        log.append_batch(&[sample(6).as_in()]),
        Err(LogError::Poisoned(_))
    ));

    let report = log.heal().unwrap();
    assert!(report.is_some(), "{op:?}: heal ran");
    assert!(!log.is_poisoned(), "{op:?}");
    assert_eq!(log.head(), acked, "{op:?}: heal moved the head");
    assert_eq!(
        log.heal().unwrap().map(|_| ()),
        None,
        "nothing left to heal"
    );
    let later: Vec<Owned> = (6..=7).map(sample).collect();
    append_each(&mut log, &later);
    drop(log);

    let (_, _, seen) = open_collect(dir.path(), config, os()).unwrap();
    let want: Vec<Owned> = (1..=7).map(sample).collect();
    assert_eq!(seen, want, "{op:?}: the log after the heal");
}

#[test]
fn a_whole_batch_written_then_enospc_is_cut_by_the_heal() {
    // The write put every byte of the batch, commit mark included, in the
    // file before failing: recovery alone would keep it; the heal must not.
    for prealloc in [0, 4096] {
        let config = LogConfig {
            preallocate_bytes: prealloc,
            ..config(1 << 20)
        };
        fail_heal_and_check(
            config,
            FaultOp::Write,
            Fault::ShortWriteNoSpace {
                written: usize::MAX,
            },
        );
        fail_heal_and_check(
            LogConfig {
                preallocate_bytes: prealloc,
                ..common::config(1 << 20)
            },
            FaultOp::Write,
            Fault::ShortWriteNoSpace { written: 30 },
        );
    }
}

#[test]
fn enospc_at_each_write_of_a_roll_heals() {
    // A segment size that the sixth record crosses: the failed batch rolls.
    let small = {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _, _) = open_collect(dir.path(), config(1 << 20), os()).unwrap();
        append_each(&mut log, &(1..=5).map(sample).collect::<Vec<_>>());
        let head = log.head();
        drop(log);
        std::fs::metadata(dir.path().join(head.segment))
            .unwrap()
            .len()
    };
    for (op, fault) in [
        // The seal's write.
        (FaultOp::Write, Fault::ShortWriteNoSpace { written: 10 }),
        (FaultOp::Write, Fault::Os(ENOSPC)),
        // The next segment's create.
        (FaultOp::CreateNew, Fault::Os(ENOSPC)),
    ] {
        fail_heal_and_check(config(small), op, fault);
    }
    // The next segment's header write: the second write of the roll.
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyFs::new(os()));
    let (mut log, _, _) = open_collect(dir.path(), config(small), faulty.clone()).unwrap();
    append_each(&mut log, &(1..=5).map(sample).collect::<Vec<_>>());
    let acked = log.head();
    faulty.fail(
        FaultOp::Write,
        faulty.count(FaultOp::Write) + 2,
        Fault::ShortWriteNoSpace { written: 20 },
    );
    assert!(log
        .append_batch(&[stranger(6).as_in()])
        .unwrap_err()
        .is_no_space());
    log.heal().unwrap();
    assert_eq!(log.head().seq, acked.seq);
    append_each(&mut log, &[sample(6)]);
    drop(log);
    let (_, _, seen) = open_collect(dir.path(), config(small), os()).unwrap();
    assert_eq!(seen, (1..=6).map(sample).collect::<Vec<_>>());
}

#[test]
fn a_failed_fsync_is_never_healed_whatever_its_errno() {
    for code in [5, ENOSPC] {
        let dir = tempfile::tempdir().unwrap();
        let faulty = Arc::new(FaultyFs::new(os()));
        let (mut log, _, _) = open_collect(dir.path(), config(1 << 20), faulty.clone()).unwrap();
        append_each(&mut log, &[sample(1)]);
        faulty.fail_next(FaultOp::SyncData, Fault::Os(code));
        log.append_batch(&[sample(2).as_in()]).unwrap_err();
        assert!(!log.is_healable());
        let writes = faulty.count(FaultOp::Write);
        assert!(matches!(log.heal(), Err(LogError::Poisoned(_))));
        assert!(log.is_poisoned(), "errno {code}");
        assert_eq!(faulty.count(FaultOp::Write), writes, "heal wrote");
    }
    // A write that fails with EIO is not a full disk either.
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyFs::new(os()));
    let (mut log, _, _) = open_collect(dir.path(), config(1 << 20), faulty.clone()).unwrap();
    faulty.fail_next(FaultOp::Write, Fault::Os(5));
    log.append_batch(&[sample(1).as_in()]).unwrap_err();
    assert!(!log.is_healable());
    assert!(log.heal().is_err());
}
