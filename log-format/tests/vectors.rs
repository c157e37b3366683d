//! Guards format versions 1 and 2 byte for byte: the committed files under
//! tests/vectors/v1/ and tests/vectors/v2/ are rebuilt from the same fixed
//! inputs (version 2 with the writer, version 1 with the format's encoders,
//! as the writer of version 1 did) and must match exactly, and the
//! committed files must stay readable (backward compatibility).
//! `SPARK_WRITE_VECTORS=1 cargo test -p spark-log-format --test vectors`
//! regenerates them; only do that for a new format version.

mod common;

use std::fmt::Write as _;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use common::*;
use spark_log_format::format::{encode_record, encode_seal, segment_file_name, SegmentHeader};
use spark_log_format::{ChainValue, LogReader, RecordIn, ScanOptions};

/// The fixed inputs: (ts_ms, kind, kind_version, payload), seqs 1..=5.
const INPUTS: [(u64, u16, u16, &[u8]); 5] = [
    (1_700_000_000_001, 1, 1, b"hello"),
    (1_700_000_000_002, 2, 1, b""),
    (1_700_000_000_003, 0x0201, 2, &[0x00, 0x01, 0xFE, 0xFF]),
    (1_700_000_000_004, 1, 1, b"world"),
    (1_700_000_000_005, 3, 1, b"spark"),
];

/// One format version's vectors and their chain values.
struct Vectors {
    /// The `format_version` of their headers, and their folder `v<N>`.
    version: u16,
    /// Head chain of `single/` (records 1..=3 in one segment).
    single_head: &'static str,
    /// Seal chain value of `two-segments/00000000000000000001.seg`: the
    /// same bytes as `single/` before it, so the same value.
    two_seal: &'static str,
    /// Head chain of `two-segments/` (record 5 in segment 4).
    two_head: &'static str,
}

const V1: Vectors = Vectors {
    version: 1,
    single_head: "8da4fbb4fe5a607e4d48a2010830e34ac72039e02489513d837a7a7c6fe875e1",
    two_seal: "8da4fbb4fe5a607e4d48a2010830e34ac72039e02489513d837a7a7c6fe875e1",
    two_head: "403a613fbf59e10b20d67a530dd1c24cf53ea2a7d59b1166ac2821cff5d1b3be",
};

const V2: Vectors = Vectors {
    version: 2,
    single_head: V2_SINGLE_HEAD,
    two_seal: V2_SINGLE_HEAD,
    two_head: V2_TWO_HEAD,
};
const V2_SINGLE_HEAD: &str = "59f9ed6e06a2c78ecc490c1e6b05daf0a4aca57883f9bbd56999b27ecebae9a0";
const V2_TWO_HEAD: &str = "2352d2d6b33ac5c009efa43062898b34cd2f2dc1556dbf323aaa2eac44456dd2";

/// A segment size that holds the batch [1, 2, 3] (64 + 33 + 28 + 32 = 157
/// bytes, and a 48-byte commit mark in version 2) and makes the batch
/// [4, 5] roll.
const TWO_SEGMENT_SIZE: u64 = 160;

fn vectors_dir(version: u16) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/vectors/v{version}"))
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

/// Builds both fixtures of `version` from the inputs in a temporary
/// directory.
fn build(version: u16) -> tempfile::TempDir {
    if version == 1 {
        return build_v1();
    }
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

/// Version 1 as its writer wrote it (the current writer writes version 2):
/// header, records back to back, a seal at the roll; built with the
/// format's encoders.
fn build_v1() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let segment = |first_seq: u64, chain_start: ChainValue, seqs: &[u64]| -> Vec<u8> {
        let header = SegmentHeader {
            first_seq,
            created_ms: T0,
            chain_start,
        };
        let mut bytes = header.encode_version(1).to_vec();
        for &seq in seqs {
            encode_record(&mut bytes, seq, &input(seq)).unwrap();
        }
        bytes
    };
    let single = segment(1, [0; 32], &[1, 2, 3]);
    let mut first = single.clone();
    let seal = spark_log_format::format::chain_value(&[0; 32], &first);
    encode_seal(&mut first, 3, T0, &seal);
    let second = segment(4, seal, &[4, 5]);
    for (fixture, first_seq, bytes) in [
        ("single", 1, single),
        ("two-segments", 1, first),
        ("two-segments", 4, second),
    ] {
        let dir = root.path().join(fixture);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(segment_file_name(first_seq)), bytes).unwrap();
    }
    root
}

/// The fixture files, as (path relative to v<N>/, bytes).
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
fn describe(version: u16, root: &Path) -> String {
    let mut text = String::new();
    writeln!(
        text,
        "# Format version {version} test vectors (generated; do not edit)"
    )
    .unwrap();
    writeln!(text).unwrap();
    writeln!(text, "Regenerate only for a new format version: `SPARK_WRITE_VECTORS=1 cargo test -p spark-log-format --test vectors`.").unwrap();
    let stamps = if version == 1 {
        "created_ms, seal ts_ms"
    } else {
        "created_ms, seal and commit mark ts_ms"
    };
    writeln!(
        text,
        "Inputs: clock ({stamps}) = {T0}; records (seq: ts_ms, kind, kind_version, payload hex):"
    )
    .unwrap();
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
            let kind_version =
                u16::from_le_bytes(bytes[offset + 26..offset + 28].try_into().unwrap());
            let what = if kind == 0 && kind_version == 2 {
                format!("commit mark (seq {seq})")
            } else if kind == 0 {
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
    rebuild(1);
    rebuild(2);
}

fn rebuild(version: u16) {
    let built = build(version);
    let dir = vectors_dir(version);
    if std::env::var_os("SPARK_WRITE_VECTORS").is_some_and(|v| v == "1") {
        for (name, bytes) in files(built.path()) {
            let path = dir.join(&name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        std::fs::write(dir.join("VECTORS.md"), describe(version, built.path())).unwrap();
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
    assert_eq!(text, describe(version, built.path()), "VECTORS.md is stale");
}

#[test]
fn the_committed_files_are_still_readable() {
    readable(&V1);
    readable(&V2);
}

fn readable(v: &Vectors) {
    let dir = vectors_dir(v.version);
    for (fixture, records, head) in [
        ("single", 3, v.single_head),
        ("two-segments", 5, v.two_head),
    ] {
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

/// Checks a version-2 commit mark at `at` closing the batch of `count`
/// records that starts at `batch_start`, with literal offsets; returns its
/// size (48).
fn check_commit(b: &[u8], at: usize, batch_start: usize, seq: u64, count: u64) -> usize {
    let mut payload = count.to_le_bytes().to_vec();
    payload.extend_from_slice(&((at - batch_start) as u64).to_le_bytes());
    payload.extend_from_slice(&crc32fast::hash(&b[batch_start..at]).to_le_bytes());
    check_record(b, at, seq, 0, 2, T0, &payload)
}

/// Checks a header of `version` with literal offsets; returns chain_start.
fn check_header(b: &[u8], version: u16, first_seq: u64) -> [u8; 32] {
    assert_eq!(&b[0..8], b"SPARKLOG");
    assert_eq!(u16_at(b, 8), version);
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
    tables(&V1);
    tables(&V2);
}

/// Checks a batch of `seqs` at `at` (with its commit mark in version 2);
/// returns the offset after it.
fn check_batch(
    b: &[u8],
    version: u16,
    mut at: usize,
    seqs: std::ops::RangeInclusive<u64>,
) -> usize {
    let start = at;
    let (last, count) = (*seqs.end(), seqs.clone().count() as u64);
    for seq in seqs {
        let r = input(seq);
        at += check_record(b, at, seq, r.kind, r.kind_version, r.ts_ms, r.payload);
    }
    if version >= 2 {
        at += check_commit(b, at, start, last, count);
    }
    at
}

fn tables(v: &Vectors) {
    // Independent of the crate's decoder: FORMAT.md's tables, by hand.
    let dir = vectors_dir(v.version);
    let single = std::fs::read(dir.join("single/00000000000000000001.seg")).unwrap();
    assert_eq!(check_header(&single, v.version, 1), [0; 32]);
    let at = check_batch(&single, v.version, 64, 1..=3);
    assert_eq!(at, single.len());
    let mut chain = blake3::Hasher::new();
    chain.update(&[0; 32]);
    chain.update(&single);
    assert_eq!(chain.finalize().to_hex().as_str(), v.single_head);

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
    assert_eq!(hex::encode(seal_chain), v.two_seal);
    assert_eq!(check_record(&first, seal_at, 3, 0, 1, T0, &seal_chain), 60);
    assert_eq!(first.len(), seal_at + 60);

    let second = std::fs::read(dir.join("two-segments/00000000000000000004.seg")).unwrap();
    assert_eq!(check_header(&second, v.version, 4), seal_chain);
    let at = check_batch(&second, v.version, 64, 4..=5);
    assert_eq!(at, second.len());
    let mut chain = blake3::Hasher::new();
    chain.update(&seal_chain);
    chain.update(&second);
    assert_eq!(chain.finalize().to_hex().as_str(), v.two_head);
}
