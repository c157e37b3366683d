//! `spark-replay audit archive --data DIR --from URL`: whether the local
//! log and the archive agree up to the archive's shipped seq, and how far
//! behind the archive is (`archive/ARCHIVE.md`
//! "Audit").
//!
//! Sealed segments are compared by hashing the local file's bytes up to
//! the archived length against the manifest's BLAKE3 (no download); only
//! a segment that differs is fetched, to name the first byte that differs.
//! Chunks (the tail, at most one segment) are fetched and compared byte
//! for byte. Each object's bytes (a sealed segment's when the local file
//! holds them) get the checks restore and take-over make
//! ([`spark_archive::verify`]): one that fails them is damage in the
//! archive. The manifest history is `verify --from`'s.

use std::io::Read;
use std::path::Path;

use futures_util::StreamExt;
use serde_json::json;
use spark_archive::layout::{Manifest, CHUNK_HEADER_LEN};
use spark_archive::verify::{verify_chunk, verify_sealed, SegmentChain};
use spark_archive::StoreError;
use spark_log_format::format::{chain_hex, segment_file_name, ChainValue};
use spark_log_format::{Frames, DEFAULT_MAX_RECORD_BYTES, HEADER_LEN};

use crate::archive::{
    connect, in_order, latest_manifest, listed, runtime, store_failure, From, Listed,
};
use crate::{exit, scan, Common, Failure, ToolExit};

/// The first place where the local log and the archive differ.
struct Difference {
    /// The archived object whose bytes differ (or that the local log lacks).
    object: String,
    /// The local segment file.
    segment: String,
    /// Byte offset in that segment where they first differ.
    offset: u64,
    /// Seq of the archived record at that offset, when there is one.
    seq: Option<u64>,
    /// What differs, in words.
    what: String,
}

/// The local segment file `name` of `log_dir`: its bytes, or `None` when
/// it is missing.
fn read_local(log_dir: &Path, name: &str) -> Result<Option<Vec<u8>>, Failure> {
    let path = log_dir.join(name);
    let mut bytes = Vec::new();
    match std::fs::File::open(&path) {
        Ok(mut file) => {
            file.read_to_end(&mut bytes)
                .map_err(|e| Failure::unreadable(format!("{}: {e}", path.display())))?;
            Ok(Some(bytes))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Failure::unreadable(format!("{}: {e}", path.display()))),
    }
}

/// Seq of the record (or commit mark) of `bytes` that holds `offset`,
/// walking the frames from `start`; `None` in the header or past whole
/// frames.
fn seq_at(bytes: &[u8], start: usize, offset: usize) -> Option<u64> {
    for frame in Frames::new(bytes, start, DEFAULT_MAX_RECORD_BYTES) {
        if offset < frame.offset() {
            return None;
        }
        if offset < frame.end() {
            return Some(frame.seq());
        }
    }
    None
}

/// The first offset where `a` and `b` differ (the shorter one's length
/// when one is a prefix of the other), `None` when equal.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    Some(
        a.iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len())),
    )
}

/// Compares every object `manifest` names with the local log; returns the
/// first difference, and the local chain at the archive's shipped seq when
/// everything agrees.
async fn compare(
    store: &spark_archive::ArchiveStore,
    manifest: &Manifest,
    log_dir: &Path,
) -> Result<Result<ChainValue, Difference>, Failure> {
    let chain = match compare_segments(store, manifest, log_dir).await? {
        Ok(chain) => chain,
        Err(difference) => return Ok(Err(difference)),
    };
    compare_chunks(store, manifest, log_dir, chain).await
}

/// The sealed segments `manifest` names against the local files: the first
/// difference, or the chain value at the end of the last of them (zeros
/// when there is none).
async fn compare_segments(
    store: &spark_archive::ArchiveStore,
    manifest: &Manifest,
    log_dir: &Path,
) -> Result<Result<ChainValue, Difference>, Failure> {
    let mut chain: ChainValue = [0; 32];
    for entry in &manifest.segments {
        let name = segment_file_name(entry.first_seq);
        let Some(local) = read_local(log_dir, &name)? else {
            return Ok(Err(Difference {
                object: entry.key.clone(),
                segment: name,
                offset: 0,
                seq: Some(entry.first_seq),
                what: "the local log has no such segment file".into(),
            }));
        };
        let archived_len = usize::try_from(entry.bytes).unwrap_or(usize::MAX);
        let prefix = &local[..local.len().min(archived_len)];
        if prefix.len() == archived_len && *blake3::hash(prefix).as_bytes() == entry.blake3 {
            // The archived bytes: they must also go on from the chain.
            chain = verify_sealed(entry, prefix, &chain).map_err(|source| {
                store_failure(StoreError::Damaged {
                    key: entry.key.clone(),
                    source,
                })
            })?;
            continue;
        }
        let archived = Listed::Segment(entry).fetch(store).await?;
        let offset = first_difference(prefix, &archived).unwrap_or(prefix.len());
        let what = if offset >= prefix.len() {
            format!(
                "the local segment ends at byte {} but the archived one holds {} bytes",
                local.len(),
                archived.len()
            )
        } else {
            "the bytes differ".into()
        };
        return Ok(Err(Difference {
            object: entry.key.clone(),
            segment: name,
            offset: offset as u64,
            seq: seq_at(&archived, HEADER_LEN, offset),
            what,
        }));
    }
    Ok(Ok(chain))
}

/// The tail chunks `manifest` names against the local tail segment, from
/// `chain` (the chain after the sealed segments): the first difference, or
/// the chain value at the archive's shipped seq. A chunk that fails its
/// own check ([`verify_chunk`]: frame, header, offset, chain values) is
/// damage in the archive.
async fn compare_chunks(
    store: &spark_archive::ArchiveStore,
    manifest: &Manifest,
    log_dir: &Path,
    chain: ChainValue,
) -> Result<Result<ChainValue, Difference>, Failure> {
    let Some(first) = manifest.chunks.first() else {
        return Ok(Ok(chain));
    };
    let name = segment_file_name(first.segment_first_seq);
    let local = read_local(log_dir, &name)?.unwrap_or_default();
    let mut segment = SegmentChain::start(chain);
    let chunks: Vec<Listed<'_>> = listed(manifest)
        .into_iter()
        .filter(|e| matches!(e, Listed::Chunk(_)))
        .collect();
    let mut fetched = std::pin::pin!(in_order(chunks.clone(), |e| e.fetch(store)));
    for entry in &chunks {
        let Listed::Chunk(entry) = entry else {
            continue;
        };
        let object = fetched
            .next()
            .await
            .ok_or_else(|| Failure::unreadable("the fetches ended early"))??;
        let checked = verify_chunk(entry, &object, &segment).map_err(|source| {
            store_failure(StoreError::Damaged {
                key: entry.key.clone(),
                source,
            })
        })?;
        let (header, body) = (&checked.header, checked.body);
        let from = usize::try_from(header.offset).unwrap_or(usize::MAX);
        let local_body = local.get(from..).unwrap_or_default();
        let local_body = &local_body[..local_body.len().min(body.len())];
        if let Some(at) = first_difference(local_body, body) {
            let start = if header.offset == 0 { HEADER_LEN } else { 0 };
            let what = if at >= local_body.len() {
                format!(
                    "the local segment ends at byte {} but the archived chunk reaches byte {}",
                    local.len(),
                    header.offset + body.len() as u64
                )
            } else {
                "the bytes differ".into()
            };
            return Ok(Err(Difference {
                object: entry.key.clone(),
                segment: name,
                offset: header.offset + at as u64,
                seq: seq_at(body, start, at),
                what,
            }));
        }
        segment = checked.after;
    }
    Ok(Ok(segment.chain()))
}

/// `audit archive --data DIR --from URL`: exit 0 when the local log holds
/// exactly the archive's bytes up to its shipped seq (however far behind
/// the archive is), 1 when they differ (naming the first object, segment,
/// offset and seq), 2 on bad usage, 3 when the log or the store cannot be
/// read.
pub fn audit(common: &Common, from: &From) -> ToolExit {
    let reader = scan::open(common)?;
    let log_dir = spark_core::layout::log_dir(&common.data);
    let local_seq = reader.segments().last().map_or(0, |s| s.last_seq);
    let local_bytes: u64 = reader.segments().iter().map(|s| s.bytes).sum();
    let store = connect(from)?;
    let (manifest, compared) = runtime()?.block_on(async {
        let manifest = latest_manifest(&store).await?;
        let compared = compare(&store, &manifest, &log_dir).await?;
        Ok::<_, Failure>((manifest, compared))
    })?;
    let archived_bytes: u64 = manifest.segments.iter().map(|s| s.bytes).sum::<u64>()
        + manifest
            .chunks
            .iter()
            .map(|c| c.bytes - CHUNK_HEADER_LEN as u64)
            .sum::<u64>();
    let now_ms = spark_log_format::system_now_ms();
    let age_ms = now_ms.saturating_sub(manifest.written_ms);
    let ops_behind = local_seq.saturating_sub(manifest.shipped_seq);
    let bytes_behind = local_bytes.saturating_sub(archived_bytes);
    let (agree, difference, local_chain) = match &compared {
        Ok(chain) => {
            let chains_equal = *chain == manifest.shipped_chain;
            (chains_equal, None, Some(chain_hex(chain)))
        }
        Err(d) => (false, Some(d), None),
    };
    let difference = difference.map(|d| {
        json!({"object": d.object, "segment": d.segment, "offset": d.offset,
               "seq": d.seq, "what": d.what})
    });
    let difference = match (&compared, difference) {
        (Ok(_), None) if !agree => Some(json!({
            "object": manifest.chunks.last().map_or_else(
                || manifest.segments.last().map(|s| s.key.clone()).unwrap_or_default(),
                |c| c.key.clone()),
            "what": format!("the local chain at seq {} is {}, the archive's shipped_chain is {}",
                manifest.shipped_seq, local_chain.clone().unwrap_or_default(),
                chain_hex(&manifest.shipped_chain)),
        })),
        (_, d) => d,
    };
    let doc = json!({
        "agree": agree,
        "archive": {
            "manifest": manifest.number,
            "epoch": manifest.epoch,
            "written_ms": manifest.written_ms,
            "shipped_seq": manifest.shipped_seq,
            "shipped_chain": chain_hex(&manifest.shipped_chain),
            "bytes": archived_bytes,
        },
        "local": {
            "seq": local_seq,
            "bytes": local_bytes,
            "chain_at_shipped_seq": local_chain,
        },
        "behind": {
            "ops": ops_behind,
            "bytes": bytes_behind,
            "manifest_age_ms": age_ms,
        },
        "difference": difference,
    });
    if common.json {
        scan::print_json(&doc);
    } else {
        print_text(&doc);
    }
    Ok(if agree { exit::OK } else { exit::DAMAGE })
}

fn print_text(doc: &serde_json::Value) {
    let archive = &doc["archive"];
    if doc["agree"] == true {
        println!(
            "agree: the local log holds the archive's bytes up to its shipped seq {} \
             (manifest {}, epoch {}, chain {})",
            archive["shipped_seq"],
            archive["manifest"],
            archive["epoch"],
            archive["shipped_chain"].as_str().unwrap_or("")
        );
    } else {
        let d = &doc["difference"];
        println!(
            "disagree: {} (archived object {}{}{}{})",
            d["what"].as_str().unwrap_or(""),
            d["object"].as_str().unwrap_or(""),
            d["segment"]
                .as_str()
                .map_or(String::new(), |s| format!(", local segment {s}")),
            d["offset"]
                .as_u64()
                .map_or(String::new(), |o| format!(" at offset {o}")),
            d["seq"]
                .as_u64()
                .map_or(String::new(), |s| format!(", seq {s}")),
        );
    }
    let behind = &doc["behind"];
    println!(
        "behind: the archive holds up to seq {}, the local log up to {}: {} ops ({} bytes) \
         not archived; its latest manifest (number {}) was written {:.1} s ago",
        archive["shipped_seq"],
        doc["local"]["seq"],
        behind["ops"],
        behind["bytes"],
        archive["manifest"],
        behind["manifest_age_ms"].as_u64().unwrap_or(0) as f64 / 1000.0
    );
}
