//! Compaction (FORMAT.md, "Compaction"): staging and committing a rewrite
//! of sealed segments, staleness, a power cut at every file-system call of
//! stage + commit (in one call, and split in begin, apply and finish with
//! batches appended meanwhile), rolls held while a compaction is pending,
//! linking old heads, and the compaction record's payload.

mod common;

use std::collections::BTreeSet;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use spark_log_format::{
    link_head, stage_compaction, CompactionRecord, CutMode, Fs, Head, HeadLink, Log, LogConfig,
    LogError, LogReader, MemFs, OsFs, RecordIn, Rewrite, ScanOptions, SegmentRewrite, Seq,
    WritePace, JOURNAL_NAME, KIND_COMPACTION,
};

/// Small segments: a roll every few batches.
const SEGMENT_BYTES: u64 = 420;
/// Records in the test log.
const RECORDS: u64 = 40;

fn cfg() -> LogConfig {
    config(SEGMENT_BYTES)
}

/// Appends `RECORDS` sample records in batches of 1, 2, 3, 1, 2, 3, ...;
/// returns the head after each batch.
fn fill(log: &mut Log) -> Vec<Head> {
    let mut heads = Vec::new();
    let mut seq = log.last_seq() + 1;
    let mut size = 1;
    while seq <= RECORDS {
        let batch: Vec<Owned> = (seq..(seq + size).min(RECORDS + 1)).map(sample).collect();
        let ins: Vec<RecordIn<'_>> = batch.iter().map(Owned::as_in).collect();
        let last = log.append_batch(&ins).expect("append");
        assert_eq!(last, batch.last().unwrap().seq);
        heads.push(log.head());
        seq = last + 1;
        size = size % 3 + 1;
    }
    heads
}

/// The payload an erased record gets.
fn erased(seq: Seq) -> Vec<u8> {
    format!("erased {seq}").into_bytes()
}

/// The rewrite that erases `seqs` (kind_version 9, a short payload).
fn erase(seqs: &BTreeSet<Seq>) -> impl FnMut(spark_log_format::RecordRef<'_>) -> Rewrite + '_ {
    move |record| {
        if seqs.contains(&record.seq) {
            Rewrite::Replace {
                kind_version: 9,
                payload: erased(record.seq),
            }
        } else {
            Rewrite::Keep
        }
    }
}

/// The sample records `1..=last` with `seqs` erased.
fn expected(last: Seq, seqs: &BTreeSet<Seq>) -> Vec<Owned> {
    (1..=last)
        .map(|seq| {
            let mut record = sample(seq);
            if seqs.contains(&seq) {
                record.kind_version = 9;
                record.payload = erased(seq);
            }
            record
        })
        .collect()
}

/// Every record of the log in `dir` through `fs`, read by LogReader with
/// the full chain check.
fn scan_all(dir: &Path, fs: Arc<dyn Fs>) -> Vec<Owned> {
    scan_collect_with(dir, fs).expect("scan").1
}

/// The seqs of the (non-empty) segments of the log in `dir`:
/// (first, last, sealed).
fn segments(dir: &Path, fs: Arc<dyn Fs>) -> Vec<(Seq, Seq, bool)> {
    LogReader::open_with(dir, fs)
        .expect("reader")
        .segments()
        .iter()
        .map(|s| (s.first_seq, s.last_seq, s.sealed))
        .collect()
}

/// The names of the files in `dir` that are not segments.
fn other_files(fs: &dyn Fs, dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs
        .list(dir)
        .expect("list")
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .filter(|n| !n.ends_with(".seg"))
        .collect();
    names.sort();
    names
}

/// Splits off the compaction records (checking each decodes).
fn split_compactions(records: Vec<Owned>) -> (Vec<Owned>, Vec<(Seq, CompactionRecord)>) {
    let (compactions, rest): (Vec<Owned>, Vec<Owned>) =
        records.into_iter().partition(|r| r.kind == KIND_COMPACTION);
    let compactions = compactions
        .into_iter()
        .map(|r| {
            assert_eq!(r.kind_version, 1);
            (
                r.seq,
                CompactionRecord::decode(&r.payload).expect("decodes"),
            )
        })
        .collect();
    (rest, compactions)
}

#[test]
fn stage_and_commit_rewrite_a_middle_segment_and_rechain_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let (mut log, _, _) = open_collect(&dir, cfg(), os()).unwrap();
    fill(&mut log);
    let before = segments(&dir, os());
    assert!(before.len() >= 6, "{before:?}");
    let sealed = before.iter().filter(|s| s.2).count();
    let (first, last, _) = before[2];
    let seqs: BTreeSet<Seq> = [first, first + 1, last].into_iter().collect();

    let staged = stage_compaction(&dir, os(), &cfg(), erase(&seqs))
        .unwrap()
        .expect("something to stage");
    assert_eq!(staged.rewritten_records(), 3);
    assert_eq!(staged.segments().len(), sealed - 2);
    assert_eq!(staged.segments()[0].first_seq, first);
    assert!(staged.bytes_written() > 0);
    assert!(other_files(&OsFs, &dir)
        .iter()
        .all(|n| n.ends_with(".seg.compact")));
    // Staged files are no segments: the log reads as before.
    assert_eq!(scan_all(&dir, os()), expected(RECORDS, &BTreeSet::new()));

    let commit = log.commit_compaction(staged, vec![[7; 16]]).unwrap();
    assert_eq!(commit.record_seq, RECORDS + 1);
    assert_eq!(commit.record.subjects, vec![[7; 16]]);
    assert_eq!(commit.record.segments.len(), sealed - 2);
    for s in &commit.record.segments {
        assert_ne!(s.old_seal, s.new_seal);
    }
    assert_eq!(other_files(&OsFs, &dir), Vec::<String>::new());
    assert_eq!(log.head().chain, log_head_by_reader(&dir));

    // Appends continue after the commit.
    let more = sample(RECORDS + 2);
    log.append_batch(&[more.as_in()]).unwrap();
    drop(log);

    let (mut log, report, seen) = open_collect(&dir, cfg(), os()).unwrap();
    assert!(report.compaction_finished.is_none());
    let (rest, compactions) = split_compactions(seen.clone());
    let mut want = expected(RECORDS, &seqs);
    want.push(more.clone());
    assert_eq!(rest, want);
    assert_eq!(compactions, vec![(RECORDS + 1, commit.record.clone())]);
    assert_eq!(seen.last().unwrap().seq, RECORDS + 2);
    assert_eq!(scan_all(&dir, os()), seen);
    // The seqs, ts and kinds of every record are unchanged.
    for (new, old) in rest.iter().zip(expected(RECORDS, &BTreeSet::new())) {
        assert_eq!(
            (new.seq, new.ts_ms, new.kind),
            (old.seq, old.ts_ms, old.kind)
        );
    }
    // Same segment boundaries.
    let after = segments(&dir, os());
    assert_eq!(after[..before.len() - 1], before[..before.len() - 1]);

    // And after a reopen.
    let again = sample(RECORDS + 3);
    log.append_batch(&[again.as_in()]).unwrap();
    log.seal_active().unwrap();
    log.append_batch(&[sample(RECORDS + 4).as_in()]).unwrap();
    drop(log);
    let (_, _, seen2) = open_collect(&dir, cfg(), os()).unwrap();
    assert_eq!(seen2.len(), seen.len() + 2);
    assert_eq!(scan_all(&dir, os()), seen2);
}

/// The head chain LogReader computes for `dir`.
fn log_head_by_reader(dir: &Path) -> [u8; 32] {
    LogReader::open(dir)
        .unwrap()
        .scan(ScanOptions::default(), |_, _| ControlFlow::Continue(()))
        .unwrap()
        .head
        .chain
}

#[test]
fn nothing_to_replace_stages_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let (mut log, _, _) = open_collect(&dir, cfg(), os()).unwrap();
    fill(&mut log);
    let mut seen = 0;
    let staged = stage_compaction(&dir, os(), &cfg(), |_| {
        seen += 1;
        Rewrite::Keep
    })
    .unwrap();
    assert!(staged.is_none());
    let sealed_records: u64 = segments(&dir, os())
        .iter()
        .filter(|s| s.2)
        .map(|s| s.1 + 1 - s.0)
        .sum();
    assert_eq!(seen, sealed_records);
    assert_eq!(other_files(&OsFs, &dir), Vec::<String>::new());
}

#[test]
fn callers_may_not_write_the_compaction_kind_nor_oversize_replacements() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let (mut log, _, _) = open_collect(&dir, cfg(), os()).unwrap();
    let record = RecordIn {
        ts_ms: T0,
        kind: KIND_COMPACTION,
        kind_version: 1,
        payload: b"",
    };
    assert!(matches!(
        log.append_batch(&[record]),
        Err(LogError::ReservedKind {
            kind: KIND_COMPACTION
        })
    ));
    assert!(!log.is_poisoned());
    fill(&mut log);
    let small = LogConfig {
        max_record_bytes: 64,
        ..cfg()
    };
    let e = stage_compaction(&dir, os(), &small, |_| Rewrite::Replace {
        kind_version: 2,
        payload: vec![0; 100],
    })
    .unwrap_err();
    assert!(matches!(e, LogError::RecordTooLarge { .. }), "{e:?}");
    assert_eq!(other_files(&OsFs, &dir), Vec::<String>::new());
}

#[test]
fn a_roll_between_stage_and_commit_makes_the_staging_stale() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let (mut log, _, _) = open_collect(&dir, cfg(), os()).unwrap();
    fill(&mut log);
    let seqs: BTreeSet<Seq> = [2].into_iter().collect();
    let staged = stage_compaction(&dir, os(), &cfg(), erase(&seqs))
        .unwrap()
        .unwrap();
    log.seal_active().unwrap();
    let head = log.head();
    let e = log.commit_compaction(staged, Vec::new()).unwrap_err();
    assert!(matches!(e, LogError::CompactionStale), "{e:?}");
    assert!(!log.is_poisoned());
    assert_eq!(log.head(), head);
    assert_eq!(other_files(&OsFs, &dir), Vec::<String>::new());
    assert_eq!(scan_all(&dir, os()), expected(RECORDS, &BTreeSet::new()));

    // Staged again, it commits, and the newly sealed segment is staged too.
    let staged = stage_compaction(&dir, os(), &cfg(), erase(&seqs))
        .unwrap()
        .unwrap();
    assert_eq!(staged.segments().last().unwrap().last_seq, RECORDS);
    log.commit_compaction(staged, Vec::new()).unwrap();
    drop(log);
    let (_, _, seen) = open_collect(&dir, cfg(), os()).unwrap();
    let (rest, compactions) = split_compactions(seen);
    assert_eq!(rest, expected(RECORDS, &seqs));
    assert_eq!(compactions.len(), 1);
}

#[test]
fn a_log_whose_last_segment_is_sealed_compacts_it_too() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let (mut log, _, _) = open_collect(&dir, cfg(), os()).unwrap();
    fill(&mut log);
    log.seal_active().unwrap();
    drop(log);
    // The roll left an empty active segment; remove it so the last segment
    // is sealed (as a log whose roll was interrupted before its header).
    let last = segment_paths(&dir).pop().unwrap();
    std::fs::remove_file(&last).unwrap();
    let (mut log, _, _) = open_collect(&dir, cfg(), os()).unwrap();
    let seqs: BTreeSet<Seq> = [RECORDS].into_iter().collect();
    let staged = stage_compaction(&dir, os(), &cfg(), erase(&seqs))
        .unwrap()
        .unwrap();
    assert_eq!(staged.segments().len(), 1);
    log.commit_compaction(staged, Vec::new()).unwrap();
    log.append_batch(&[sample(RECORDS + 2).as_in()]).unwrap();
    drop(log);
    let (_, _, seen) = open_collect(&dir, cfg(), os()).unwrap();
    let (rest, compactions) = split_compactions(seen.clone());
    let mut want = expected(RECORDS, &seqs);
    want.push(sample(RECORDS + 2));
    assert_eq!(rest, want);
    assert_eq!(compactions.len(), 1);
    assert_eq!(scan_all(&dir, os()), seen);
}

// ---- Power cuts -------------------------------------------------------------

fn mem_dir() -> PathBuf {
    PathBuf::from("/data/log")
}

/// A MemFs holding the filled test log (everything durable), and the Log
/// open on it with `config`.
fn mem_log(config: &LogConfig) -> (MemFs, Log) {
    let fs = MemFs::new();
    let (mut log, _, _) = open_collect(&mem_dir(), config.clone(), Arc::new(fs.clone())).unwrap();
    fill(&mut log);
    (fs, log)
}

/// The erased seqs of the power-cut test: records of the third segment.
fn cut_seqs(fs: &MemFs) -> BTreeSet<Seq> {
    let segs = segments(&mem_dir(), Arc::new(fs.clone()));
    let (first, last, _) = segs[2];
    [first, last].into_iter().collect()
}

/// The test log's configuration with the compaction's writes paced in
/// steps of 128 bytes (several per staged segment and per copy), at a rate
/// no test waits for.
fn paced_cfg() -> LogConfig {
    LogConfig {
        compaction_pace: Some(WritePace {
            bytes_per_s: u64::MAX,
            step_bytes: 128,
        }),
        ..cfg()
    }
}

#[test]
fn a_power_cut_at_every_call_of_stage_and_commit_leaves_the_old_or_the_new_log() {
    power_cut_at_every_call_of_stage_and_commit(cfg());
}

#[test]
fn a_power_cut_at_every_call_of_a_paced_stage_and_commit_leaves_the_old_or_the_new_log() {
    let paced = power_cut_at_every_call_of_stage_and_commit(paced_cfg());
    // The pace split the writes: more calls, each one a cut point.
    let plain = power_cut_at_every_call_of_stage_and_commit(cfg());
    assert!(paced > plain, "paced {paced} calls, unpaced {plain}");
}

/// A power cut after every number of file-system calls of stage and
/// commit (in one call), with the log and the staging on `config`.
/// Returns the number of calls stage and commit made.
fn power_cut_at_every_call_of_stage_and_commit(config: LogConfig) -> u64 {
    let seqs = {
        let (fs, _log) = mem_log(&cfg());
        cut_seqs(&fs)
    };
    let old = expected(RECORDS, &BTreeSet::new());
    let new = expected(RECORDS, &seqs);
    let mut outcomes = (0, 0, 0);
    let mut n = 0;
    loop {
        let mut completed = false;
        for mode in CutMode::ALL {
            for seed in 0..4 {
                let (fs, mut log) = mem_log(&config);
                let mem: Arc<dyn Fs> = Arc::new(fs.clone());
                fs.crash_after(n);
                let result = stage_compaction(&mem_dir(), mem.clone(), &config, erase(&seqs))
                    .and_then(|staged| {
                        log.commit_compaction(staged.expect("staged"), vec![[1; 16]])
                    });
                let ok = result.is_ok();
                completed |= ok && !fs.crashed();
                drop(log);
                fs.power_cut(mode, seed);
                let point = format!("crash after {n} calls, {mode:?}, seed {seed}");

                let journal = fs.read(&mem_dir().join(JOURNAL_NAME)).is_some();
                if journal {
                    let e = LogReader::open_with(&mem_dir(), mem.clone()).unwrap_err();
                    assert!(
                        matches!(e, LogError::CompactionPending { .. }),
                        "{point}: {e:?}"
                    );
                }
                let (mut log, report, seen) = open_collect(&mem_dir(), config.clone(), mem.clone())
                    .unwrap_or_else(|e| panic!("{point}: recovery failed: {e}"));
                // Only the copy of a cut tail (the compaction record's
                // torn write) may stay beside the segments.
                let left: Vec<String> = other_files(&fs, &mem_dir())
                    .into_iter()
                    .filter(|n| !n.contains(".seg.torn-"))
                    .collect();
                assert_eq!(left, Vec::<String>::new(), "{point}");
                // The visitor saw the log as recovery found it; a record
                // recovery appended to finish a commit comes after.
                let all = scan_all(&mem_dir(), mem.clone());
                let appended = usize::from(report.compaction_record_appended);
                assert_eq!(all[..all.len() - appended], seen[..], "{point}");
                let (rest, compactions) = split_compactions(all.clone());
                if rest == old && compactions.is_empty() {
                    assert!(!ok, "{point}: acknowledged, then lost");
                    assert!(report.compaction_finished.is_none(), "{point}");
                    outcomes.0 += 1;
                } else {
                    assert_eq!(rest, new, "{point}: neither the old nor the new log");
                    assert_eq!(compactions.len(), 1, "{point}");
                    assert_eq!(compactions[0].0, RECORDS + 1, "{point}");
                    assert_eq!(compactions[0].1.subjects, vec![[1; 16]], "{point}");
                    if report.compaction_finished.is_some() {
                        outcomes.1 += 1;
                    } else {
                        outcomes.2 += 1;
                    }
                }
                // The log goes on.
                let next = log.last_seq() + 1;
                log.append_batch(&[sample(next).as_in()])
                    .unwrap_or_else(|e| panic!("{point}: append after recovery: {e}"));
                drop(log);
                let (_, report, seen2) =
                    open_collect(&mem_dir(), config.clone(), mem.clone()).unwrap();
                assert!(report.compaction_finished.is_none(), "{point}");
                assert_eq!(seen2.len(), all.len() + 1, "{point}");
            }
        }
        if completed {
            break;
        }
        n += 1;
        assert!(n < 2000, "stage + commit never completed");
    }
    // Every outcome happened: the old log, a commit finished by recovery,
    // and a commit complete before the cut.
    assert!(
        outcomes.0 > 0 && outcomes.1 > 0 && outcomes.2 > 0,
        "{outcomes:?}"
    );
    n
}

/// The split commit: begin, a batch, apply, a batch, finish (the batches
/// as the engine's writer appends them while the compaction's thread
/// applies it). Returns the seqs acknowledged by the batches and the
/// result.
fn split_commit(
    log: &mut Log,
    staged: spark_log_format::StagedCompaction,
    acked: &mut Vec<Seq>,
) -> Result<spark_log_format::CompactionCommit, LogError> {
    let mut ticket = log.begin_compaction(staged, vec![[1; 16]])?;
    let next = log.last_seq() + 1;
    acked.push(log.append_batch(&[sample(next).as_in()])?);
    let applied = ticket.apply();
    let next = log.last_seq() + 1;
    match log.append_batch(&[sample(next).as_in()]) {
        Ok(seq) => acked.push(seq),
        // The appends fail once the file system is gone; finish is told.
        Err(e) => return log.finish_compaction(ticket, applied.and(Err(e))),
    }
    log.finish_compaction(ticket, applied)
}

#[test]
fn a_power_cut_at_every_call_of_a_split_commit_keeps_the_batches_appended_meanwhile() {
    power_cut_at_every_call_of_a_split_commit(cfg());
}

#[test]
fn a_power_cut_at_every_call_of_a_paced_split_commit_keeps_the_batches_appended_meanwhile() {
    power_cut_at_every_call_of_a_split_commit(paced_cfg());
}

/// A power cut after every number of file-system calls of stage and a
/// split commit with batches appended meanwhile, on `config`.
fn power_cut_at_every_call_of_a_split_commit(config: LogConfig) {
    let seqs = {
        let (fs, _log) = mem_log(&cfg());
        cut_seqs(&fs)
    };
    let old = expected(RECORDS, &BTreeSet::new());
    let new = expected(RECORDS, &seqs);
    let mut outcomes = (0, 0, 0);
    let mut n = 0;
    loop {
        let mut completed = false;
        for mode in CutMode::ALL {
            for seed in 0..4 {
                let (fs, mut log) = mem_log(&config);
                let mem: Arc<dyn Fs> = Arc::new(fs.clone());
                fs.crash_after(n);
                let mut acked = Vec::new();
                let result = stage_compaction(&mem_dir(), mem.clone(), &config, erase(&seqs))
                    .and_then(|staged| split_commit(&mut log, staged.expect("staged"), &mut acked));
                let ok = result.is_ok();
                completed |= ok && !fs.crashed();
                assert!(
                    ok || log.is_poisoned() || acked.is_empty(),
                    "n {n}: {result:?}"
                );
                drop(log);
                fs.power_cut(mode, seed);
                let point = format!("crash after {n} calls, {mode:?}, seed {seed}");

                let (mut log, report, seen) = open_collect(&mem_dir(), config.clone(), mem.clone())
                    .unwrap_or_else(|e| panic!("{point}: recovery failed: {e}"));
                let left: Vec<String> = other_files(&fs, &mem_dir())
                    .into_iter()
                    .filter(|n| !n.contains(".seg.torn-"))
                    .collect();
                assert_eq!(left, Vec::<String>::new(), "{point}");
                let all = scan_all(&mem_dir(), mem.clone());
                let appended = usize::from(report.compaction_record_appended);
                assert_eq!(all[..all.len() - appended], seen[..], "{point}");
                let (rest, compactions) = split_compactions(all.clone());
                // The batches appended during the compaction follow the
                // old or new records; every acknowledged one survived.
                assert!(rest.len() >= RECORDS as usize, "{point}");
                let (records, during) = rest.split_at(RECORDS as usize);
                let during_seqs: Vec<Seq> = during.iter().map(|r| r.seq).collect();
                assert!(during_seqs.len() <= 2, "{point}: {during_seqs:?}");
                assert!(
                    during_seqs.starts_with(&acked),
                    "{point}: acked {acked:?}, found {during_seqs:?}"
                );
                for record in during {
                    assert_eq!(*record, sample(record.seq), "{point}");
                }
                if records == old && compactions.is_empty() {
                    assert!(!ok, "{point}: acknowledged, then lost");
                    assert!(report.compaction_finished.is_none(), "{point}");
                    outcomes.0 += 1;
                } else {
                    assert_eq!(records, new, "{point}: neither the old nor the new log");
                    assert_eq!(compactions.len(), 1, "{point}");
                    assert_eq!(compactions[0].0, rest.len() as Seq + 1, "{point}");
                    assert_eq!(compactions[0].1.subjects, vec![[1; 16]], "{point}");
                    if report.compaction_finished.is_some() {
                        outcomes.1 += 1;
                    } else {
                        outcomes.2 += 1;
                    }
                }
                // The log goes on, and rolls again.
                for _ in 0..4 {
                    let next = log.last_seq() + 1;
                    log.append_batch(&[sample(next).as_in()])
                        .unwrap_or_else(|e| panic!("{point}: append after recovery: {e}"));
                }
                drop(log);
                let (_, report, seen2) =
                    open_collect(&mem_dir(), config.clone(), mem.clone()).unwrap();
                assert!(report.compaction_finished.is_none(), "{point}");
                assert_eq!(seen2.len(), all.len() + 4, "{point}");
            }
        }
        if completed {
            break;
        }
        n += 1;
        assert!(n < 2000, "stage + split commit never completed");
    }
    assert!(
        outcomes.0 > 0 && outcomes.1 > 0 && outcomes.2 > 0,
        "{outcomes:?}"
    );
}

#[test]
fn batches_do_not_roll_while_a_compaction_is_pending_and_roll_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let (mut log, _, _) = open_collect(&dir, cfg(), os()).unwrap();
    fill(&mut log);
    let before = segments(&dir, os());
    let (first, _, _) = before[1];
    let seqs: BTreeSet<Seq> = [first].into_iter().collect();
    let staged = stage_compaction(&dir, os(), &cfg(), erase(&seqs))
        .unwrap()
        .unwrap();
    let files = segment_paths(&dir).len();
    let mut ticket = log.begin_compaction(staged, vec![[2; 16]]).unwrap();
    let active = log.head().segment;
    let active_path = dir.join(&active);
    // Past segment_size_bytes, before and after apply: no roll, and
    // sealing is a no-op.
    let mut heads = Vec::new();
    let append_some = |log: &mut Log, heads: &mut Vec<Head>| {
        for _ in 0..6 {
            let next = log.last_seq() + 1;
            log.append_batch(&[sample(next).as_in(), sample(next + 1).as_in()])
                .unwrap();
            heads.push(log.head());
        }
    };
    append_some(&mut log, &mut heads);
    log.seal_active().unwrap();
    ticket.apply().unwrap();
    append_some(&mut log, &mut heads);
    assert_eq!(log.head().segment, active);
    let len = std::fs::metadata(&active_path).unwrap().len();
    assert!(len > SEGMENT_BYTES, "{len}");
    assert_eq!(segment_paths(&dir).len(), files);
    let commit = log.finish_compaction(ticket, Ok(())).unwrap();
    assert_eq!(commit.record_seq, log.last_seq());
    // Released: the compaction record's batch rolled first.
    assert_ne!(log.head().segment, active);
    assert_eq!(log.head().segment, format!("{:020}.seg", commit.record_seq));
    let next = log.last_seq() + 1;
    log.append_batch(&[sample(next).as_in()]).unwrap();
    let last = log.last_seq();
    drop(log);

    let (_, _, seen) = open_collect(&dir, cfg(), os()).unwrap();
    assert_eq!(scan_all(&dir, os()), seen);
    let (rest, compactions) = split_compactions(seen);
    assert_eq!(compactions.len(), 1);
    assert_eq!(compactions[0].0, commit.record_seq);
    let mut want = expected(RECORDS, &seqs);
    want.extend(
        (RECORDS + 1..=last)
            .filter(|s| *s != commit.record_seq)
            .map(sample),
    );
    assert_eq!(rest, want);
    // The heads acknowledged while the compaction was pending link
    // through it (their segment was re-chained only).
    let reader = LogReader::open(&dir).unwrap();
    for head in &heads {
        assert_eq!(
            link_head(&reader, head.seq, head.chain).unwrap(),
            HeadLink::ThroughCompaction {
                record_seq: commit.record_seq
            },
            "{head:?}"
        );
    }
}

#[test]
fn a_failed_apply_poisons_and_the_next_open_finishes_or_drops_the_compaction() {
    for journal_written in [false, true] {
        let (fs, mut log) = mem_log(&cfg());
        let mem: Arc<dyn Fs> = Arc::new(fs.clone());
        let seqs = cut_seqs(&fs);
        let staged = stage_compaction(&mem_dir(), mem.clone(), &cfg(), erase(&seqs))
            .unwrap()
            .unwrap();
        let mut ticket = log.begin_compaction(staged, Vec::new()).unwrap();
        let next = log.last_seq() + 1;
        log.append_batch(&[sample(next).as_in()]).unwrap();
        let applied = if journal_written {
            ticket.apply()
        } else {
            Err(LogError::Poisoned("apply failed".into()))
        };
        let next = log.last_seq() + 1;
        log.append_batch(&[sample(next).as_in()]).unwrap();
        let e = log
            .finish_compaction(ticket, applied.and(Err(LogError::Poisoned("told".into()))))
            .unwrap_err();
        assert!(matches!(e, LogError::Poisoned(_)), "{e:?}");
        assert!(log.is_poisoned() && !log.is_healable());
        drop(log);
        let (_, report, _) = open_collect(&mem_dir(), cfg(), mem.clone()).unwrap();
        let (rest, compactions) = split_compactions(scan_all(&mem_dir(), mem.clone()));
        let erased = if journal_written {
            seqs.clone()
        } else {
            BTreeSet::new()
        };
        let mut want = expected(RECORDS, &erased);
        want.extend([sample(RECORDS + 1), sample(RECORDS + 2)]);
        assert_eq!(rest, want);
        assert_eq!(compactions.len(), usize::from(journal_written));
        assert_eq!(report.compaction_finished.is_some(), journal_written);
    }
}

// ---- Linking old heads --------------------------------------------------------

#[test]
fn old_heads_link_directly_through_a_compaction_or_not_at_all() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let (mut log, _, _) = open_collect(&dir, cfg(), os()).unwrap();
    let heads = fill(&mut log);
    let segs = segments(&dir, os());
    let (first, last, _) = segs[2];
    // Erase the first record of segment 2: every later chain value in it
    // changes.
    let seqs: BTreeSet<Seq> = [first].into_iter().collect();
    let staged = stage_compaction(&dir, os(), &cfg(), erase(&seqs))
        .unwrap()
        .unwrap();
    let commit = log.commit_compaction(staged, Vec::new()).unwrap();
    let record_seq = commit.record_seq;
    let now = log.head();
    drop(log);
    let reader = LogReader::open(&dir).unwrap();
    let link = |head: &Head| link_head(&reader, head.seq, head.chain).unwrap();
    let head_at = |seq: Seq| heads.iter().find(|h| h.seq == seq).unwrap().clone();
    let in_segment = |i: usize| -> Vec<Head> {
        let (f, l, _) = segs[i];
        heads
            .iter()
            .filter(|h| f <= h.seq && h.seq <= l)
            .cloned()
            .collect()
    };

    // Before the rewritten segment: unchanged.
    for head in in_segment(1) {
        assert_eq!(link(&head), HeadLink::Direct, "{head:?}");
    }
    assert_eq!(link(&now), HeadLink::Direct);
    // The rewritten segment's end: its old seal.
    assert_eq!(
        link(&head_at(last)),
        HeadLink::ThroughCompaction { record_seq }
    );
    // Inside the rewritten segment, after the erased record: gone.
    let inside: Vec<Head> = in_segment(2)
        .into_iter()
        .filter(|h| h.seq != last)
        .collect();
    assert!(!inside.is_empty());
    for head in inside {
        assert_eq!(
            link(&head),
            HeadLink::SegmentRewritten {
                first_seq: first,
                record_seq
            },
            "{head:?}"
        );
    }
    // A later segment, only re-chained, and the active one (header patched).
    for i in 3..segs.len() {
        for head in in_segment(i) {
            assert_eq!(
                link(&head),
                HeadLink::ThroughCompaction { record_seq },
                "segment {i}, {head:?}"
            );
        }
    }
    // A chain value that is no chain value of the log.
    let mut forged = head_at(segs[1].1);
    forged.chain[0] ^= 1;
    assert_eq!(link(&forged), HeadLink::NotLinked);
    assert_eq!(
        link_head(&reader, 10_000, [0; 32]).unwrap(),
        HeadLink::PastEnd { last_seq: now.seq }
    );
    assert_eq!(link_head(&reader, 0, [0; 32]).unwrap(), HeadLink::Direct);
    drop(reader);

    // A second compaction (of an earlier segment) rewrites segment 2
    // again: a head inside it still names the first compaction, the one
    // that changed the bytes it saw.
    let (mut log, _, _) = open_collect(&dir, cfg(), os()).unwrap();
    let earlier: BTreeSet<Seq> = [segs[1].0].into_iter().collect();
    let staged = stage_compaction(&dir, os(), &cfg(), erase(&earlier))
        .unwrap()
        .unwrap();
    let second = log.commit_compaction(staged, Vec::new()).unwrap();
    assert!(second.record_seq > record_seq);
    drop(log);
    let reader = LogReader::open(&dir).unwrap();
    let inside = in_segment(2).into_iter().find(|h| h.seq != last).unwrap();
    assert_eq!(
        link_head(&reader, inside.seq, inside.chain).unwrap(),
        HeadLink::SegmentRewritten {
            first_seq: first,
            record_seq
        }
    );
}

// ---- The compaction record ----------------------------------------------------

#[test]
fn the_compaction_record_round_trips_and_refuses_truncated_or_trailing_bytes() {
    let record = CompactionRecord {
        segments: vec![
            SegmentRewrite {
                first_seq: 5,
                last_seq: 9,
                old_seal: [1; 32],
                new_seal: [2; 32],
            },
            SegmentRewrite {
                first_seq: 10,
                last_seq: 20,
                old_seal: [3; 32],
                new_seal: [4; 32],
            },
        ],
        subjects: vec![[9; 16], [8; 16], [7; 16]],
    };
    let bytes = record.encode();
    assert_eq!(bytes.len(), 4 + 2 * 80 + 4 + 3 * 16);
    assert_eq!(&bytes[..4], &2u32.to_le_bytes());
    assert_eq!(&bytes[4..12], &5u64.to_le_bytes());
    assert_eq!(CompactionRecord::decode(&bytes).unwrap(), record);
    for cut in 0..bytes.len() {
        assert!(
            CompactionRecord::decode(&bytes[..cut]).is_err(),
            "truncated at {cut}"
        );
    }
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(CompactionRecord::decode(&trailing).is_err());
    // A count over what the bytes can hold is refused without allocating.
    let mut huge = bytes.clone();
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(CompactionRecord::decode(&huge).is_err());
    let empty = CompactionRecord::default();
    assert_eq!(CompactionRecord::decode(&empty.encode()).unwrap(), empty);
}

#[test]
fn a_damaged_journal_is_refused_naming_it_and_stale_staging_is_removed() {
    let (fs, mut log) = mem_log(&cfg());
    let mem: Arc<dyn Fs> = Arc::new(fs.clone());
    let seqs = cut_seqs(&fs);
    // A staging that never committed: its files go at the next open.
    let staged = stage_compaction(&mem_dir(), mem.clone(), &cfg(), erase(&seqs))
        .unwrap()
        .unwrap();
    let names: Vec<String> = other_files(&fs, &mem_dir());
    assert_eq!(names.len(), staged.segments().len());
    drop(log);
    let (_, report, seen) = open_collect(&mem_dir(), cfg(), mem.clone()).unwrap();
    assert_eq!(report.staged_removed, names);
    assert_eq!(seen, expected(RECORDS, &BTreeSet::new()));
    assert_eq!(other_files(&fs, &mem_dir()), Vec::<String>::new());

    // A journal that does not verify: damage, refused, nothing changed.
    let journal = mem_dir().join(JOURNAL_NAME);
    let mut bytes = b"SPARKCMP\x01\x00\x00\x00".to_vec();
    bytes.extend_from_slice(&[0xAB; 40]);
    fs.insert_durable(&journal, &bytes);
    let e = open_collect(&mem_dir(), cfg(), mem.clone()).unwrap_err();
    match &e {
        LogError::CompactionJournalDamaged {
            journal: named,
            aside,
            ..
        } => {
            assert_eq!(named, &journal);
            assert_eq!(
                aside,
                &mem_dir().parent().unwrap().join("COMPACTION.damaged")
            );
        }
        other => panic!("not a damaged journal: {other}"),
    }
    let message = e.to_string();
    assert!(
        message.contains("COMPACTION.damaged") && message.contains("start again"),
        "{message}"
    );
    assert_eq!(fs.read(&journal), Some(bytes));
    // The way out the message gives: the journal moved aside, the start
    // checks the log, which no segment replacement had touched.
    fs.remove_file(&journal).unwrap();
    log = open_collect(&mem_dir(), cfg(), mem.clone()).unwrap().0;
    assert_eq!(log.last_seq(), RECORDS);
}

#[test]
fn version_1_segments_stay_version_1() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    std::fs::create_dir_all(&dir).unwrap();
    let first = SegmentBytes::v1(1, [0; 32])
        .record(1)
        .record(2)
        .record(3)
        .seal(3);
    first.write(&dir);
    // A seal's chain value: over the bytes before it.
    let seal_of = |segment: &SegmentBytes| {
        let before = &segment.bytes[..segment.bytes.len() - 60];
        spark_log_format::format::chain_value(&segment.chain_start, before)
    };
    let second = SegmentBytes::v1(4, seal_of(&first))
        .record(4)
        .record(5)
        .seal(5);
    let second_seal = seal_of(&second);
    second.write(&dir);
    SegmentBytes::v1(6, second_seal).record(6).write(&dir);
    let (mut log, _, _) = open_collect(&dir, cfg(), os()).unwrap();
    let seqs: BTreeSet<Seq> = [2].into_iter().collect();
    let staged = stage_compaction(&dir, os(), &cfg(), erase(&seqs))
        .unwrap()
        .unwrap();
    assert_eq!(staged.segments().len(), 2);
    log.commit_compaction(staged, Vec::new()).unwrap();
    drop(log);
    for path in segment_paths(&dir).iter().take(2) {
        let bytes = std::fs::read(path).unwrap();
        assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 1, "{path:?}");
    }
    let (_, _, seen) = open_collect(&dir, cfg(), os()).unwrap();
    let (rest, compactions) = split_compactions(seen.clone());
    assert_eq!(rest, expected(6, &seqs));
    assert_eq!(compactions.len(), 1);
    assert_eq!(scan_all(&dir, os()), seen);
}

/// A live view taken while a commit is between apply (segments replaced,
/// journal present) and finish (active header patched) would see the chain
/// break where the new segments meet the old active header: the live open
/// waits for the journal to go and then reads the finished log, damage
/// free. The same open without the wait (not live) refuses the journal.
#[test]
fn a_live_open_during_a_commit_waits_for_it_instead_of_reporting_damage() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let (mut log, _, _) = open_collect(&dir, cfg(), os()).unwrap();
    fill(&mut log);
    let (first, _, _) = segments(&dir, os())[1];
    let seqs: BTreeSet<Seq> = [first].into_iter().collect();
    let staged = stage_compaction(&dir, os(), &cfg(), erase(&seqs))
        .unwrap()
        .unwrap();
    let mut ticket = log.begin_compaction(staged, vec![[3; 16]]).unwrap();
    ticket.apply().unwrap();
    assert!(matches!(
        LogReader::open(&dir),
        Err(LogError::CompactionPending { .. })
    ));
    let reader_dir = dir.clone();
    let live = std::thread::spawn(move || {
        LogReader::open_live(
            &reader_dir,
            os(),
            spark_log_format::DEFAULT_MAX_RECORD_BYTES,
        )
    });
    // Long enough for the live open to have found the broken chain and
    // waited on the journal at least once.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!live.is_finished(), "the live open returned mid-commit");
    let commit = log.finish_compaction(ticket, Ok(())).unwrap();
    let reader = live
        .join()
        .unwrap()
        .expect("the live view after the commit");
    let last = last_seq_scanned(&reader);
    assert_eq!(last, commit.record_seq);
}

/// The seq of the last record a clean scan of `reader` gives.
fn last_seq_scanned(reader: &LogReader) -> Seq {
    let mut last = 0;
    reader
        .scan(ScanOptions::default(), |_, record| {
            last = record.seq;
            ControlFlow::Continue(())
        })
        .expect("a clean scan");
    last
}

/// A clean live opening while a journal exists (the log before a commit's
/// first swap, or after its header patch and before its record) is not
/// handed out: the open waits until the journal is gone, then reads the
/// log as the commit left it.
#[test]
fn a_clean_live_open_beside_a_journal_waits_for_the_journal_to_go() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let (mut log, _, _) = open_collect(&dir, cfg(), os()).unwrap();
    fill(&mut log);
    let journal = dir.join(JOURNAL_NAME);
    std::fs::write(&journal, b"a commit in progress").unwrap();
    let reader_dir = dir.clone();
    let live = std::thread::spawn(move || {
        LogReader::open_live(
            &reader_dir,
            os(),
            spark_log_format::DEFAULT_MAX_RECORD_BYTES,
        )
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        !live.is_finished(),
        "a view was handed out beside the journal"
    );
    let next = log.last_seq() + 1;
    log.append_batch(&[sample(next).as_in()]).unwrap();
    std::fs::remove_file(&journal).unwrap();
    let reader = live
        .join()
        .unwrap()
        .expect("the view once the journal went");
    let last = last_seq_scanned(&reader);
    assert_eq!(
        last, next,
        "the view holds what was appended before the journal went"
    );
}

/// A live view opened before a whole commit scans the log as it was at
/// open: the commit replaced the sealed segments (the view keeps the old
/// files mapped) and patched the active header in place (which the map
/// shows at once); the scan reads the active segment with the header open
/// read, so the chain holds.
#[test]
fn a_live_view_opened_before_a_commit_scans_the_log_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let (mut log, _, _) = open_collect(&dir, cfg(), os()).unwrap();
    fill(&mut log);
    let head = log.head();
    let view =
        LogReader::open_live(&dir, os(), spark_log_format::DEFAULT_MAX_RECORD_BYTES).unwrap();
    let (first, _, _) = segments(&dir, os())[1];
    let seqs: BTreeSet<Seq> = [first].into_iter().collect();
    let staged = stage_compaction(&dir, os(), &cfg(), erase(&seqs))
        .unwrap()
        .unwrap();
    log.commit_compaction(staged, Vec::new()).unwrap();
    let mut seen = Vec::new();
    let report = view
        .scan(ScanOptions::default(), |_, record| {
            seen.push(Owned::from_ref(&record));
            ControlFlow::Continue(())
        })
        .expect("the view as it was at open");
    assert_eq!(report.head.seq, head.seq);
    assert_eq!(report.head.chain, head.chain);
    assert_eq!(seen, expected(RECORDS, &BTreeSet::new()));
}
