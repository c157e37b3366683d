//! Helpers shared by the integration tests: a pinned clock, owned records,
//! opening and scanning with collection, and hand-built segments.
#![allow(dead_code)]

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use spark_log_format::format::{
    chain_value, encode_commit, encode_record, encode_seal, segment_file_name, CommitMark,
    SegmentHeader,
};
use spark_log_format::{
    ChainValue, FaultSeq, Fs, Head, Log, LogConfig, LogError, LogReader, OsFs, RecordIn, RecordRef,
    RecoveryReport, ScanOptions, ScanReport, Seq,
};

/// The pinned clock of the tests (2023-11-14T22:13:20Z).
pub const T0: u64 = 1_700_000_000_000;

pub fn fixed_clock() -> u64 {
    T0
}

/// A config with the pinned clock.
pub fn config(segment_size_bytes: u64) -> LogConfig {
    LogConfig {
        segment_size_bytes,
        now_ms: fixed_clock,
        ..LogConfig::default()
    }
}

pub fn os() -> Arc<dyn Fs> {
    Arc::new(OsFs)
}

/// SplitMix64: small, deterministic, good enough to pick cuts, flips and
/// payloads.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True one time in `one_in` (`one_in > 0`).
    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

/// A record with its bytes owned, for comparing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owned {
    pub seq: Seq,
    pub ts_ms: u64,
    pub kind: u16,
    pub kind_version: u16,
    pub payload: Vec<u8>,
}

impl Owned {
    pub fn from_ref(r: &RecordRef<'_>) -> Owned {
        Owned {
            seq: r.seq,
            ts_ms: r.ts_ms,
            kind: r.kind,
            kind_version: r.kind_version,
            payload: r.payload.to_vec(),
        }
    }

    pub fn as_in(&self) -> RecordIn<'_> {
        RecordIn {
            ts_ms: self.ts_ms,
            kind: self.kind,
            kind_version: self.kind_version,
            payload: &self.payload,
        }
    }
}

/// A deterministic record for `seq`: payload length varies with the seq.
pub fn sample(seq: Seq) -> Owned {
    let len = (seq as usize * 7) % 23 + 5;
    Owned {
        seq,
        ts_ms: T0 + seq,
        kind: 1 + (seq % 3) as u16,
        kind_version: 1,
        payload: (0..len)
            .map(|i| (seq as u8).wrapping_mul(31).wrapping_add(i as u8))
            .collect(),
    }
}

/// Opens `dir` and collects every visited record.
pub fn open_collect(
    dir: &Path,
    config: LogConfig,
    fs: Arc<dyn Fs>,
) -> Result<(Log, RecoveryReport, Vec<Owned>), LogError> {
    let mut seen = Vec::new();
    let (log, report) = Log::open(dir, config, fs, |r| {
        seen.push(Owned::from_ref(&r));
        Ok::<(), std::convert::Infallible>(())
    })?;
    Ok((log, report, seen))
}

/// Reads `dir` with LogReader (open + full scan) and collects the records.
pub fn scan_collect(dir: &Path) -> Result<(ScanReport, Vec<Owned>), LogError> {
    scan_collect_with(dir, os())
}

/// [`scan_collect`] through `fs`.
pub fn scan_collect_with(
    dir: &Path,
    fs: Arc<dyn Fs>,
) -> Result<(ScanReport, Vec<Owned>), LogError> {
    let reader = LogReader::open_with(dir, fs)?;
    let mut seen = Vec::new();
    let report = reader.scan(ScanOptions::default(), |_, r| {
        seen.push(Owned::from_ref(&r));
        ControlFlow::Continue(())
    })?;
    Ok((report, seen))
}

/// Appends `records` one batch per record and returns the head after each.
pub fn append_each(log: &mut Log, records: &[Owned]) -> Vec<Head> {
    records
        .iter()
        .map(|r| {
            let seq = log.append_batch(&[r.as_in()]).expect("append");
            assert_eq!(seq, r.seq);
            log.head()
        })
        .collect()
}

/// Segment files in `dir`, sorted.
pub fn segment_paths(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    paths.sort();
    paths
}

/// Copies every file of `from` into a fresh temporary directory.
pub fn copy_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.path().join(entry.file_name())).expect("copy");
    }
    to
}

/// XORs the byte at `offset` of `path` with `mask`.
pub fn flip(path: &Path, offset: usize, mask: u8) {
    let mut bytes = std::fs::read(path).expect("read");
    bytes[offset] ^= mask;
    std::fs::write(path, bytes).expect("write");
}

/// The fields of a `Corrupt` error, or a panic naming what came instead.
pub fn corrupt_fields(error: &LogError) -> (String, u64, FaultSeq) {
    match error {
        LogError::Corrupt {
            segment,
            offset,
            seq,
            ..
        } => (segment.clone(), *offset, *seq),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// What LogReader says about `dir`: the error of open or of a full scan.
pub fn reader_error(dir: &Path) -> LogError {
    match LogReader::open(dir) {
        Err(e) => e,
        Ok(reader) => reader
            .scan(ScanOptions::default(), |_, _| ControlFlow::Continue(()))
            .expect_err("reader accepted a damaged log"),
    }
}

/// Hand-built segment bytes (format version 2): a header, then
/// single-record batches (each record and its commit mark), then optionally
/// a seal.
pub struct SegmentBytes {
    pub first_seq: Seq,
    pub chain_start: ChainValue,
    pub bytes: Vec<u8>,
    pub offsets: Vec<usize>,
    /// Format version 1: records without commit marks.
    pub v1: bool,
}

impl SegmentBytes {
    pub fn new(first_seq: Seq, chain_start: ChainValue) -> SegmentBytes {
        let header = SegmentHeader {
            first_seq,
            created_ms: T0,
            chain_start,
        };
        SegmentBytes {
            first_seq,
            chain_start,
            bytes: header.encode().to_vec(),
            offsets: Vec::new(),
            v1: false,
        }
    }

    /// A format-version-1 segment: its records carry no commit marks.
    pub fn v1(first_seq: Seq, chain_start: ChainValue) -> SegmentBytes {
        let header = SegmentHeader {
            first_seq,
            created_ms: T0,
            chain_start,
        };
        SegmentBytes {
            bytes: header.encode_version(1).to_vec(),
            v1: true,
            ..SegmentBytes::new(first_seq, chain_start)
        }
    }

    /// Appends the frame of `sample(seq)` with `seq`, then (version 2) its
    /// commit mark (a batch of one, as the writer would).
    pub fn record(mut self, seq: Seq) -> SegmentBytes {
        let start = self.bytes.len();
        self.offsets.push(start);
        encode_record(&mut self.bytes, seq, &sample(seq).as_in()).expect("encode");
        if self.v1 {
            return self;
        }
        let mark = CommitMark::for_batch(&self.bytes[start..], 1);
        encode_commit(&mut self.bytes, seq, T0, &mark);
        self
    }

    /// The chain value at the current end.
    pub fn chain(&self) -> ChainValue {
        chain_value(&self.chain_start, &self.bytes)
    }

    /// Appends a seal naming `last_seq` with the correct chain value.
    pub fn seal(mut self, last_seq: Seq) -> SegmentBytes {
        let chain = self.chain();
        encode_seal(&mut self.bytes, last_seq, T0, &chain);
        self
    }

    /// Writes it into `dir` under the name for `first_seq`.
    pub fn write(&self, dir: &Path) -> PathBuf {
        self.write_as(dir, &segment_file_name(self.first_seq))
    }

    pub fn write_as(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, &self.bytes).expect("write segment");
        path
    }
}
