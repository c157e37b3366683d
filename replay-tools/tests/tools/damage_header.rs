//! Every byte of a record's 28-byte frame header (`len`, `crc`, `seq`,
//! `ts_ms`, `kind`, `kind_version`), flipped, is named as that record's
//! damage by all three readers: `spark-replay verify` (the place: segment,
//! offset, `seq N`), `spark-replay audit damage` (its first and last
//! damaged seq, and the record salvaged under its seq) and the engine's
//! refusal to start (`damaged: seq N`). A break-test found a flipped `seq`
//! or `len` byte named by `verify` but reported by the other two as "no op
//! ... no record is damaged": the commit mark after the record, which
//! repeats its seq, was taken for the next good record.
//!
//! The log is written in batches of three records (each closed by its
//! commit mark) over small segments, and the damaged record is the first,
//! the middle and the last of a batch, in a sealed segment and in the last
//! one (with a later batch after it, so the damage is no torn tail).

use std::path::Path;
use std::sync::Arc;

use spark_core::synth;
use spark_log_format::{Log, LogConfig, OsFs, RecordIn};

use crate::{frames_by_the_tables, json, refused_open, run};

/// Records per batch.
const BATCH: u64 = 3;
/// Batches written.
const BATCHES: u64 = 24;

/// A log of [`BATCHES`] batches of [`BATCH`] synthetic creates in 4 KiB
/// segments under `data`; returns the segment file names in order.
fn batched_log(data: &Path) -> Vec<String> {
    let dir = data.join("log");
    let config = LogConfig {
        segment_size_bytes: 4096,
        ..LogConfig::default()
    };
    let (mut log, _) = Log::open(&dir, config, Arc::new(OsFs), |_| {
        Ok::<(), std::convert::Infallible>(())
    })
    .unwrap();
    for b in 0..BATCHES {
        let encoded: Vec<(u16, u16, Vec<u8>)> = (0..BATCH)
            .map(|i| synth::moment_create(b * BATCH + i).encode().unwrap())
            .collect();
        let batch: Vec<RecordIn<'_>> = encoded
            .iter()
            .map(|(kind, kind_version, payload)| RecordIn {
                ts_ms: synth::BASE_MS + b,
                kind: *kind,
                kind_version: *kind_version,
                payload,
            })
            .collect();
        log.append_batch(&batch).unwrap();
    }
    drop(log);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// The records to damage in the segment `bytes`: (offset, seq) of the first,
/// middle and last record of its second batch (`from_batch` = 1), or of
/// another one, by FORMAT.md's tables.
fn batch_records(bytes: &[u8], from_batch: usize) -> Vec<(usize, u64)> {
    let frames = frames_by_the_tables(bytes);
    // Batches: the records before each commit mark (kind 0).
    let mut batches: Vec<Vec<(usize, u64)>> = vec![Vec::new()];
    for (offset, seq, kind) in frames {
        if kind == 0 {
            batches.push(Vec::new());
        } else {
            batches.last_mut().unwrap().push((offset, seq));
        }
    }
    batches
        .into_iter()
        .filter(|b| b.len() == BATCH as usize)
        .nth(from_batch)
        .expect("a whole batch")
}

#[test]
fn every_flipped_header_byte_of_a_record_is_named_as_its_damage_by_all_three() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let names = batched_log(&data);
    assert!(names.len() >= 4, "{names:?}");
    let read = |name: &str| std::fs::read(data.join("log").join(name)).unwrap();
    // A sealed segment (first, middle and last record of a batch), and the
    // last segment (its first whole batch: a later one follows it).
    let sealed = &names[1];
    let last = names.last().unwrap();
    let last_bytes = read(last);
    assert!(
        frames_by_the_tables(&last_bytes).len() >= 2 * (BATCH as usize + 1),
        "the last segment holds two batches"
    );
    let mut targets: Vec<(&String, usize, u64)> = batch_records(&read(sealed), 1)
        .into_iter()
        .map(|(offset, seq)| (sealed, offset, seq))
        .collect();
    let in_last = batch_records(&last_bytes, 0);
    targets.push((last, in_last[0].0, in_last[0].1));
    targets.push((last, in_last[2].0, in_last[2].1));

    let mut cases = 0;
    for (segment, offset, seq) in targets {
        let original = read(segment);
        for byte in 0..28usize {
            let mut masks = vec![0x01u8, 0xFF];
            // The flips that make a record look most like the commit mark
            // or seal before it: its seq that of the record before, its
            // kind 0.
            if byte == 8 {
                masks.push(((seq ^ (seq - 1)) & 0xFF) as u8);
            }
            if byte == 24 {
                masks.push(original[offset + 24]);
            }
            for mask in masks {
                cases += 1;
                let case = dir.path().join(format!("case-{cases}"));
                std::fs::create_dir_all(case.join("log")).unwrap();
                for name in &names {
                    std::fs::copy(data.join("log").join(name), case.join("log").join(name))
                        .unwrap();
                }
                let mut bytes = original.clone();
                bytes[offset + byte] ^= mask;
                std::fs::write(case.join("log").join(segment), &bytes).unwrap();
                let what = format!("header byte {byte} ^ {mask:#04x} of seq {seq} in {segment}");
                let place = format!("{segment} at offset {offset} (seq {seq}):");

                let (code, out, err) = run(&["verify"], &case);
                assert_eq!(code, 1, "{what}: verify: {out}{err}");
                assert!(err.contains(&place), "{what}: verify: {err}");

                let (code, out, err) = run(&["audit", "damage", "--json"], &case);
                assert_eq!(code, 1, "{what}: audit damage: {out}{err}");
                let report = json(&out);
                assert_eq!(report["kind"], "corrupt", "{what}: {report}");
                assert!(
                    report["error"].as_str().unwrap().contains(&place),
                    "{what}: {report}"
                );
                assert_eq!(
                    report["damaged_seqs"],
                    serde_json::json!({"first": seq, "last": seq}),
                    "{what}: {report}"
                );
                assert_eq!(report["records"][0]["seq"], seq, "{what}: {report}");

                let error = refused_open(&case);
                assert!(
                    error.contains(&place) && error.contains(&format!("damaged: seq {seq} ")),
                    "{what}: the engine's refusal: {error}"
                );
                std::fs::remove_dir_all(&case).unwrap();
            }
        }
    }
    assert!(cases >= 5 * 28 * 2, "{cases}");
}
