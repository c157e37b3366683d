//! Guards format version 1 byte for byte: the committed files under
//! tests/vectors/v1/ are rebuilt from the same fixed inputs and must match
//! exactly, and the committed files must stay readable (backward
//! compatibility). `SPARK_WRITE_VECTORS=1 cargo test -p spark-log-format
//! --test vectors` regenerates them; only do that for a new format version.

mod common;

use std::fmt::Write as _;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use common::*;
use spark_log_format::{LogReader, RecordIn, ScanOptions};

/// The fixed inputs: (ts_ms, kind, kind_version, payload), seqs 1..=5.
const INPUTS: [(u64, u16, u16, &[u8]); 5] = [
    (1_700_000_000_001, 1, 1, b"hello"),
    (1_700_000_000_002, 2, 1, b""),
    (1_700_000_000_003, 0x0201, 2, &[0x00, 0x01, 0xFE, 0xFF]),
    (1_700_000_000_004, 1, 1, b"world"),
    (1_700_000_000_005, 3, 1, b"spark"),
];

/// Head chain of `single/` (records 1..=3 in one segment).
const SINGLE_HEAD: &str = "8da4fbb4fe5a607e4d48a2010830e34ac72039e02489513d837a7a7c6fe875e1";
/// Seal chain value of `two-segments/00000000000000000001.seg`: the same
/// bytes as `single/` before it, so the same value.
const TWO_SEAL: &str = "8da4fbb4fe5a607e4d48a2010830e34ac72039e02489513d837a7a7c6fe875e1";
/// Head chain of `two-segments/` (record 5 in segment 4).
const TWO_HEAD: &str = "403a613fbf59e10b20d67a530dd1c24cf53ea2a7d59b1166ac2821cff5d1b3be";

/// A segment size that holds records 1..=3 (64 + 33 + 28 + 32 = 157 bytes)
/// and makes the batch [4, 5] roll.
const TWO_SEGMENT_SIZE: u64 = 160;

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/v1")
}

fn input(seq: u64) -> RecordIn<'static> {
    let (ts_ms, kind, kind_version, payload) = INPUTS[seq as usize - 1];
    RecordIn {
        ts_ms,
        kind,
        kind_version,
        payload,
    }
}

fn expected(seqs: std::ops::RangeInclusive<u64>) -> Vec<Owned> {
    seqs.map(|seq| {
        let r = input(seq);
        Owned {
            seq,
            ts_ms: r.ts_ms,
            kind: r.kind,
            kind_version: r.kind_version,
            payload: r.payload.to_vec(),
        }
    })
    .collect()
}

/// Builds both fixtures from the inputs in a temporary directory.
fn build() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let single = root.path().join("single");
    let (mut log, _, _) = open_collect(&single, config(1 << 20), os()).unwrap();
    log.append_batch(&[input(1), input(2), input(3)]).unwrap();
    drop(log);
    let two = root.path().join("two-segments");
    let (mut log, _, _) = open_collect(&two, config(TWO_SEGMENT_SIZE), os()).unwrap();
    log.append_batch(&[input(1), input(2), input(3)]).unwrap();
    log.append_batch(&[input(4), input(5)]).unwrap();
    drop(log);
    root
}

/// The fixture files, as (path relative to v1/, bytes).
fn files(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for fixture in ["single", "two-segments"] {
        for path in segment_paths(&root.join(fixture)) {
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            out.push((format!("{fixture}/{name}"), std::fs::read(&path).unwrap()));
        }
    }
    out
}

/// The human-readable description committed beside the files: every region
/// of every file in hex, and the chain values.
fn describe(root: &Path) -> String {
    let mut text = String::new();
    writeln!(
        text,
        "# Format version 1 test vectors (generated; do not edit)"
    )
    .unwrap();
    writeln!(text).unwrap();
    writeln!(text, "Regenerate only for a new format version: `SPARK_WRITE_VECTORS=1 cargo test -p spark-log-format --test vectors`.").unwrap();
    writeln!(text, "Inputs: clock (created_ms, seal ts_ms) = {T0}; records (seq: ts_ms, kind, kind_version, payload hex):").unwrap();
    for seq in 1..=5u64 {
        let r = input(seq);
        writeln!(
            text,
            "- {seq}: {}, {}, {}, `{}`",
            r.ts_ms,
            r.kind,
            r.kind_version,
            hex::encode(r.payload)
        )
        .unwrap();
    }
    writeln!(text).unwrap();
    writeln!(text, "`single/`: one batch [1, 2, 3], default settings.").unwrap();
    writeln!(text, "`two-segments/`: batches [1, 2, 3] and [4, 5] with segment_size_bytes = {TWO_SEGMENT_SIZE}: the second batch rolls.").unwrap();
    for (name, bytes) in files(root) {
        writeln!(text).unwrap();
        writeln!(text, "## {name} ({} bytes)", bytes.len()).unwrap();
        writeln!(text).unwrap();
        writeln!(text, "```").unwrap();
        let mut regions = vec![(0usize, 64usize, "header".to_owned())];
        let mut offset = 64;
        while offset + 8 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap()) as usize;
            let seq = u64::from_le_bytes(bytes[offset + 8..offset + 16].try_into().unwrap());
            let kind = u16::from_le_bytes(bytes[offset + 24..offset + 26].try_into().unwrap());
            let what = if kind == 0 {
                format!("seal (seq {seq})")
            } else {
                format!("record seq {seq}")
            };
            regions.push((offset, 8 + len, what));
            offset += 8 + len;
        }
        for (start, size, what) in regions {
            writeln!(text, "{what} @ {start}, {size} bytes").unwrap();
            for (i, line) in bytes[start..start + size].chunks(16).enumerate() {
                writeln!(text, "  {:04x}: {}", start + 16 * i, hex::encode(line)).unwrap();
            }
        }
        writeln!(text, "```").unwrap();
    }
    writeln!(text).unwrap();
    writeln!(text, "Chain values:").unwrap();
    for fixture in ["single", "two-segments"] {
        let scan = LogReader::open(&root.join(fixture))
            .unwrap()
            .scan(ScanOptions::default(), |_, _| ControlFlow::Continue(()))
            .unwrap();
        writeln!(
            text,
            "- `{fixture}/` head: seq {}, segment {}, chain {}",
            scan.head.seq,
            scan.head.segment,
            scan.head.chain_hex()
        )
        .unwrap();
    }
    text
}

#[test]
fn the_same_inputs_rebuild_the_committed_bytes() {
    let built = build();
    let dir = vectors_dir();
    if std::env::var_os("SPARK_WRITE_VECTORS").is_some_and(|v| v == "1") {
        for (name, bytes) in files(built.path()) {
            let path = dir.join(&name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        std::fs::write(dir.join("VECTORS.md"), describe(built.path())).unwrap();
    }
    let rebuilt = files(built.path());
    let names: Vec<&str> = rebuilt.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "single/00000000000000000001.seg",
            "two-segments/00000000000000000001.seg",
            "two-segments/00000000000000000004.seg"
        ]
    );
    for (name, bytes) in &rebuilt {
        let committed = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            hex::encode(&committed),
            hex::encode(bytes),
            "{name} differs from the committed vector"
        );
    }
    let committed_files = files(&dir);
    assert_eq!(
        committed_files.len(),
        rebuilt.len(),
        "extra committed segment files"
    );
    let text = std::fs::read_to_string(dir.join("VECTORS.md")).unwrap();
    assert_eq!(text, describe(built.path()), "VECTORS.md is stale");
}

#[test]
fn the_committed_files_are_still_readable() {
    let dir = vectors_dir();
    for (fixture, records, head) in [("single", 3, SINGLE_HEAD), ("two-segments", 5, TWO_HEAD)] {
        // Log::open repairs in place; give it a copy.
        let copy = copy_dir(&dir.join(fixture));
        let (log, report, seen) = open_collect(copy.path(), config(1 << 20), os()).unwrap();
        assert_eq!(seen, expected(1..=records), "{fixture}");
        assert_eq!(log.head().chain_hex(), head, "{fixture}");
        assert!(report.truncated.is_none() && report.removed_segment.is_none());

        let reader = LogReader::open(&dir.join(fixture)).unwrap();
        let mut scanned = Vec::new();
        let scan = reader
            .scan(ScanOptions::default(), |_, r| {
                scanned.push(Owned::from_ref(&r));
                ControlFlow::Continue(())
            })
            .unwrap();
        assert_eq!(scanned, seen, "{fixture}");
        assert_eq!(scan.head, log.head(), "{fixture}");
        assert!(reader.segments().iter().all(|s| s.created_ms == T0));
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Checks a record frame at `at` field by field with literal offsets.
fn check_record(
    b: &[u8],
    at: usize,
    seq: u64,
    kind: u16,
    kind_version: u16,
    ts_ms: u64,
    payload: &[u8],
) -> usize {
    let len = u32_at(b, at) as usize;
    assert_eq!(len, 20 + payload.len());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&b[at..at + 4]);
    crc.update(&b[at + 8..at + 8 + len]);
    assert_eq!(u32_at(b, at + 4), crc.finalize());
    assert_eq!(u64_at(b, at + 8), seq);
    assert_eq!(u64_at(b, at + 16), ts_ms);
    assert_eq!(u16_at(b, at + 24), kind);
    assert_eq!(u16_at(b, at + 26), kind_version);
    assert_eq!(&b[at + 28..at + 8 + len], payload);
    8 + len
}

/// Checks a header with literal offsets; returns chain_start.
fn check_header(b: &[u8], first_seq: u64) -> [u8; 32] {
    assert_eq!(&b[0..8], b"SPARKLOG");
    assert_eq!(u16_at(b, 8), 1);
    assert_eq!(u16_at(b, 10), 64);
    let mut zeroed = b[..64].to_vec();
    zeroed[12..16].fill(0);
    assert_eq!(u32_at(b, 12), crc32fast::hash(&zeroed));
    assert_eq!(u64_at(b, 16), first_seq);
    assert_eq!(u64_at(b, 24), T0);
    b[32..64].try_into().unwrap()
}

#[test]
fn the_committed_bytes_match_the_format_tables() {
    // Independent of the crate's decoder: FORMAT.md's tables, by hand.
    let dir = vectors_dir();
    let single = std::fs::read(dir.join("single/00000000000000000001.seg")).unwrap();
    assert_eq!(check_header(&single, 1), [0; 32]);
    let mut at = 64;
    for seq in 1..=3 {
        let r = input(seq);
        at += check_record(&single, at, seq, r.kind, r.kind_version, r.ts_ms, r.payload);
    }
    assert_eq!(at, single.len());
    let mut chain = blake3::Hasher::new();
    chain.update(&[0; 32]);
    chain.update(&single);
    assert_eq!(chain.finalize().to_hex().as_str(), SINGLE_HEAD);

    let first = std::fs::read(dir.join("two-segments/00000000000000000001.seg")).unwrap();
    assert_eq!(
        &first[..single.len()],
        &single[..],
        "same inputs, same first segment"
    );
    let seal_at = single.len();
    let mut chain = blake3::Hasher::new();
    chain.update(&[0; 32]);
    chain.update(&first[..seal_at]);
    let seal_chain: [u8; 32] = chain.finalize().into();
    assert_eq!(hex::encode(seal_chain), TWO_SEAL);
    assert_eq!(check_record(&first, seal_at, 3, 0, 1, T0, &seal_chain), 60);
    assert_eq!(first.len(), seal_at + 60);

    let second = std::fs::read(dir.join("two-segments/00000000000000000004.seg")).unwrap();
    assert_eq!(check_header(&second, 4), seal_chain);
    let mut at = 64;
    for seq in 4..=5 {
        let r = input(seq);
        at += check_record(&second, at, seq, r.kind, r.kind_version, r.ts_ms, r.payload);
    }
    assert_eq!(at, second.len());
    let mut chain = blake3::Hasher::new();
    chain.update(&seal_chain);
    chain.update(&second);
    assert_eq!(chain.finalize().to_hex().as_str(), TWO_HEAD);
}
