//! Guards the fuzz targets' promises with the stable toolchain: the two
//! entry points of `/fuzz` (in `tests/fuzz_entry/`), fed a bounded number of
//! random byte strings and of mutations of valid frames and segments (bit
//! flips, overwritten bytes and `len` fields, cuts, insertions, splices).
//! See `tests/fuzz_entry/mod.rs` for what each one checks.
//!
//! `SPARK_FUZZ_CASES` sets the cases per property (default 5000).

mod fuzz_entry;

use std::sync::atomic::{AtomicU64, Ordering};

use fuzz_entry::Outcome;
use proptest::prelude::*;
use spark_log_format::format::encode_record;
use spark_log_format::RecordIn;

fn cases() -> u32 {
    std::env::var("SPARK_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000)
}

/// One edit of a byte string; positions are taken modulo its length.
#[derive(Clone, Debug)]
enum Mutation {
    FlipBit(usize, u8),
    SetByte(usize, u8),
    /// Overwrites 4 bytes with a little-endian u32 (a `len` field, say).
    SetU32(usize, u32),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
    /// Copies a range over another place of the same string.
    Splice(usize, usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let interesting_u32 = prop_oneof![
        Just(0u32),
        Just(19),
        Just(20),
        Just(52),
        Just(64),
        Just(4 << 20),
        Just((4 << 20) + 1),
        Just(u32::MAX),
        any::<u32>(),
    ];
    prop_oneof![
        3 => (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::FlipBit(at, bit)),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(at, v)| Mutation::SetByte(at, v)),
        2 => (any::<usize>(), interesting_u32).prop_map(|(at, v)| Mutation::SetU32(at, v)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..40))
            .prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
        1 => (any::<usize>(), 1usize..64).prop_map(|(at, n)| Mutation::Remove(at, n)),
        1 => (any::<usize>(), any::<usize>(), 1usize..80)
            .prop_map(|(from, to, n)| Mutation::Splice(from, to, n)),
    ]
}

fn apply(bytes: &mut Vec<u8>, mutations: &[Mutation]) {
    for m in mutations {
        let len = bytes.len();
        let at = |i: usize| if len == 0 { 0 } else { i % len };
        match m {
            Mutation::FlipBit(i, bit) if len > 0 => bytes[at(*i)] ^= 1 << bit,
            Mutation::SetByte(i, v) if len > 0 => bytes[at(*i)] = *v,
            Mutation::SetU32(i, v) if len >= 4 => {
                let start = at(*i).min(len - 4);
                bytes[start..start + 4].copy_from_slice(&v.to_le_bytes());
            }
            Mutation::Truncate(i) => bytes.truncate(if len == 0 { 0 } else { i % (len + 1) }),
            Mutation::Insert(i, more) => {
                let start = if len == 0 { 0 } else { i % (len + 1) };
                bytes.splice(start..start, more.iter().copied());
            }
            Mutation::Remove(i, n) if len > 0 => {
                let start = at(*i);
                let end = (start + n).min(len);
                bytes.drain(start..end);
            }
            Mutation::Splice(from, to, n) if len > 0 => {
                let from = at(*from);
                let to = at(*to);
                let n = (*n).min(len - from).min(len - to);
                let chunk = bytes[from..from + n].to_vec();
                bytes[to..to + n].copy_from_slice(&chunk);
            }
            _ => {}
        }
    }
}

/// Valid frames back to back, as a segment body holds them.
fn valid_frames() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        (
            any::<u64>(),
            any::<u64>(),
            any::<u16>(),
            any::<u16>(),
            proptest::collection::vec(any::<u8>(), 0..80),
        ),
        1..6,
    )
    .prop_map(|records| {
        let mut out = Vec::new();
        for (seq, ts_ms, kind, kind_version, payload) in records {
            let input = RecordIn {
                ts_ms,
                kind,
                kind_version,
                payload: &payload,
            };
            encode_record(&mut out, seq, &input).unwrap();
        }
        out
    })
}

/// A valid segment file to start from, by index.
fn base_segment(index: u8) -> &'static [u8] {
    match index % 3 {
        0 => fuzz_entry::SINGLE_1,
        1 => fuzz_entry::SEALED_1,
        _ => fuzz_entry::LAST_4,
    }
}

/// Runs `check` on `cases()` inputs drawn from `strategy` (shrinking a
/// failure to a minimal input), then prints how many ran and their outcomes.
fn run<S: Strategy>(name: &str, strategy: S, check: impl Fn(S::Value) -> Option<Outcome>)
where
    S::Value: std::fmt::Debug,
{
    let outcomes = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
    let runs = AtomicU64::new(0);
    let config = ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let result = runner.run(&strategy, |value| {
        runs.fetch_add(1, Ordering::Relaxed);
        let index = match check(value) {
            None => return Ok(()),
            Some(Outcome::Empty | Outcome::Refused) => 0,
            Some(Outcome::Repaired(_)) => 1,
            Some(Outcome::Clean(_)) => 2,
        };
        outcomes[index].fetch_add(1, Ordering::Relaxed);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
    let [refused, repaired, clean] = outcomes.map(|o| o.load(Ordering::Relaxed));
    if refused + repaired + clean == 0 {
        eprintln!("fuzz_like {name}: {} inputs", runs.load(Ordering::Relaxed));
    } else {
        eprintln!(
            "fuzz_like {name}: {} inputs; refused {refused}, repaired {repaired}, clean {clean}",
            runs.load(Ordering::Relaxed)
        );
    }
}

#[test]
fn record_decoder_on_random_bytes() {
    run(
        "record_decoder/random",
        proptest::collection::vec(any::<u8>(), 0..400),
        |data| {
            fuzz_entry::record_decoder(&data);
            None
        },
    );
}

#[test]
fn record_decoder_on_mutated_frames() {
    run(
        "record_decoder/mutated",
        (valid_frames(), proptest::collection::vec(mutation(), 0..4)),
        |(mut data, mutations)| {
            apply(&mut data, &mutations);
            fuzz_entry::record_decoder(&data);
            None
        },
    );
}

#[test]
fn segment_recovery_on_random_bytes() {
    run(
        "segment_recovery/random",
        (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..300)),
        |(selector, data)| {
            let mut input = vec![selector];
            input.extend(data);
            Some(fuzz_entry::segment_recovery(&input))
        },
    );
}

#[test]
fn segment_recovery_on_mutated_segments() {
    run(
        "segment_recovery/mutated",
        (
            any::<u8>(),
            any::<u8>(),
            proptest::option::of(valid_frames()),
            proptest::collection::vec(mutation(), 0..4),
        ),
        |(selector, base, extra, mutations)| {
            let mut segment = base_segment(base).to_vec();
            if let Some(extra) = extra {
                segment.extend(extra);
            }
            apply(&mut segment, &mutations);
            let mut input = vec![selector];
            input.extend(segment);
            Some(fuzz_entry::segment_recovery(&input))
        },
    );
}

/// The committed vectors themselves, under every selector, pass unchanged;
/// and the allocation accounting the checks rely on is installed.
#[test]
fn segment_recovery_on_the_vectors() {
    let (v, allocs, largest) = fuzz_entry::measure(|| vec![7u8; 1000]);
    assert_eq!((v.len(), allocs, largest), (1000, 1, 1000));
    let mut outcomes = Vec::new();
    for selector in 0..8u8 {
        for base in 0..3 {
            let mut input = vec![selector];
            input.extend_from_slice(base_segment(base));
            outcomes.push(fuzz_entry::segment_recovery(&input));
        }
    }
    // The first layout with a valid segment recovers it whole.
    assert_eq!(outcomes[0], Outcome::Clean(3));
    assert!(outcomes.contains(&Outcome::Clean(5)));
}
