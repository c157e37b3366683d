//! Guards the round trip under random shapes: random batches, payloads and
//! segment sizes, with random reopens in between, come back from Log::open
//! and from LogReader exactly as appended, with the same head chain.

use crate::common;

use std::ops::ControlFlow;

use common::*;
use proptest::prelude::*;
use spark_log_format::{LogReader, ScanOptions};

type Batch = Vec<(u16, u16, Vec<u8>)>;

fn batches() -> impl Strategy<Value = Vec<(Batch, bool)>> {
    let record = (
        1u16..6,
        0u16..3,
        proptest::collection::vec(any::<u8>(), 0..120),
    );
    let batch = proptest::collection::vec(record, 1..7);
    proptest::collection::vec((batch, any::<bool>()), 1..12)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn appended_records_come_back(segment_size in 0u64..1500, batches in batches()) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(segment_size);
        let (mut log, _, _) = open_collect(dir.path(), cfg.clone(), os()).unwrap();
        let mut expected: Vec<Owned> = Vec::new();
        let mut heads = Vec::new();
        for (i, (batch, reopen)) in batches.iter().enumerate() {
            let owned: Vec<Owned> = batch
                .iter()
                .enumerate()
                .map(|(j, (kind, kind_version, payload))| Owned {
                    seq: expected.len() as u64 + 1 + j as u64,
                    ts_ms: T0 + i as u64,
                    kind: *kind,
                    kind_version: *kind_version,
                    payload: payload.clone(),
                })
                .collect();
            let ins: Vec<_> = owned.iter().map(Owned::as_in).collect();
            let last = log.append_batch(&ins).unwrap();
            expected.extend(owned);
            prop_assert_eq!(last, expected.len() as u64);
            heads.push(log.head());
            if *reopen {
                let head = log.head();
                drop(log);
                let (again, report, seen) = open_collect(dir.path(), cfg.clone(), os()).unwrap();
                prop_assert!(report.truncated.is_none() && report.removed_segment.is_none());
                prop_assert_eq!(&seen, &expected);
                prop_assert_eq!(again.head(), head);
                log = again;
            }
        }
        let head = log.head();
        drop(log);

        let (log, report, seen) = open_collect(dir.path(), cfg, os()).unwrap();
        prop_assert_eq!(&seen, &expected);
        prop_assert_eq!(log.head(), head.clone());
        prop_assert_eq!(report.records, expected.len() as u64);

        let reader = LogReader::open(dir.path()).unwrap();
        let mut scanned = Vec::new();
        let scan = reader
            .scan(ScanOptions::default(), |_, r| {
                scanned.push(Owned::from_ref(&r));
                ControlFlow::Continue(())
            })
            .unwrap();
        prop_assert_eq!(&scanned, &expected);
        prop_assert_eq!(&scan.head, &head);
        prop_assert_eq!(scan.bytes, report.bytes);
        prop_assert_eq!(scan.segments, report.segments);
        let infos = reader.segments();
        prop_assert_eq!(infos.last().map(|s| s.last_seq), Some(head.seq));
        for pair in infos.windows(2) {
            prop_assert!(pair[0].sealed);
            prop_assert_eq!(pair[1].first_seq, pair[0].last_seq + 1);
        }

        // Stopping early reports the head at the stopping record, and that
        // chain is the one the log had when that record was the last.
        let then = &heads[heads.len() / 2];
        let partial = reader
            .scan(ScanOptions::default(), |_, r| {
                if r.seq == then.seq { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
            })
            .unwrap();
        prop_assert_eq!(&partial.head, then);
        prop_assert_eq!(partial.records, then.seq);
    }
}
