//! `spark-replay restore --from URL` and `spark-replay verify --from URL`:
//! read an archive (`archive/ARCHIVE.md`, SPEC section 11), check every
//! object it names, and build a data directory the engine starts on.
//! Credentials come from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` /
//! `AWS_SESSION_TOKEN`.
//!
//! The log is written by the archive's one catch-up
//! ([`spark_archive::catch_up()`], which the engine's take-over and read
//! replicas run too) into the empty log directory: objects are fetched
//! [`FETCH_CONCURRENCY`] at a time on the runtime's threads (each checked
//! against its manifest entry there) and written in log order as they
//! come, so memory stays at a few segments whatever the size of the log;
//! `--at` is this module's own, a cut the catch-up applies
//! ([`spark_archive::Keep`]). Blobs and manifests are fetched the same
//! number at a time ([`in_order`]).

use std::future::Future;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use clap::Args;
use futures_util::{Stream, StreamExt};
use serde_json::json;
use sha2::Digest;
use spark_archive::catch_up::Fetched;
use spark_archive::layout::{
    blob_key, extends, key_compaction, manifest_key, missing_key, CheckpointEntry, ChunkEntry,
    Manifest, MissingBlobDoc, SegmentEntry,
};
use spark_archive::{ArchiveStore, CatchUpError, Keep, StoreConfig, StoreError};
use spark_core::mirror::Mirror;
use spark_log_format::format::chain_hex;
use spark_log_format::{FrameKind, Frames, Fs as _, OsFs, ScanReport, DEFAULT_MAX_RECORD_BYTES};

use crate::scan::At;
use crate::{exit, progress, scan, Common, Failure, ToolExit};

/// How many objects (segments, chunks, blobs, manifests) are fetched at
/// once: the catch-up's ([`spark_archive::catch_up::FETCH_CONCURRENCY`]).
/// Bounded because each may be a whole segment (64 MiB by default) held
/// in memory until it is written.
pub const FETCH_CONCURRENCY: usize = spark_archive::catch_up::FETCH_CONCURRENCY;

/// Where the archive is.
#[derive(Args, Debug, Clone)]
pub struct From {
    /// The archive: `s3://BUCKET/PREFIX`.
    #[arg(long = "from", value_name = "URL")]
    pub url: String,
    /// The store's endpoint for stores other than AWS (e.g.
    /// `http://127.0.0.1:8333`); without it (and without
    /// `SPARK_ARCHIVE_ENDPOINT`), `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`.
    #[arg(long, value_name = "URL", env = "SPARK_ARCHIVE_ENDPOINT")]
    pub endpoint: Option<String>,
    /// The store's region.
    #[arg(long, default_value = "us-east-1", env = "SPARK_ARCHIVE_REGION")]
    pub region: String,
}

/// One segment file as written from the archive, with the objects it came
/// from (key, offset in the segment where the object's bytes start).
struct Assembled {
    name: String,
    objects: Vec<(String, u64)>,
}

/// What a restore wrote of the log.
struct Written {
    segments: Vec<Assembled>,
    objects: usize,
    object_bytes: u64,
    /// Where `--at` cut the log, if it did.
    cut: Option<Cut>,
}

/// Where a walk of an object's records found the first op past `--at`.
#[derive(Clone, Copy, Debug)]
struct Cut {
    /// End of the last commit mark (or seal) before that op: bytes kept.
    offset: usize,
    /// Seq of the last op kept.
    last_seq: u64,
    /// Seq of the first op left out.
    next_seq: u64,
    /// Whether that op is not the first of its batch (its batch straddles
    /// the point and is left out whole).
    mid_batch: bool,
}

/// Maps a catch-up failure: the store's as [`store_failure`], an object
/// listed out of seq order damage (exit 1), a file that cannot be written
/// as [`unwritable`]. A refusal of the local log cannot happen in the
/// empty directory a restore writes (damage if it did).
fn catch_up_failure(e: CatchUpError) -> Failure {
    match e {
        CatchUpError::Store(e) => store_failure(e),
        CatchUpError::Local { path, source } => unwritable(&path, source),
        e @ (CatchUpError::OutOfOrder { .. } | CatchUpError::Diverged(_)) => {
            Failure::damage(e.to_string())
        }
    }
}

/// Maps a store failure: unreachable is exit 3, the rest damage (exit 1).
pub fn store_failure(e: StoreError) -> Failure {
    match e {
        StoreError::Unreachable { .. } => Failure::unreadable(e.to_string()),
        other => Failure::damage(other.to_string()),
    }
}

/// A runtime on all cores: fetches run in parallel with the writes.
pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::unreadable(format!("cannot start a runtime: {e}")))
}

/// The store `from` names (a bad URL is a usage failure).
pub fn connect(from: &From) -> Result<ArchiveStore, Failure> {
    ArchiveStore::connect(&StoreConfig {
        url: from.url.clone(),
        endpoint: from.endpoint.clone(),
        region: from.region.clone(),
    })
    .map_err(|e| scan::usage(format!("--from {}: {e}", from.url)))
}

/// Runs `work` on every item as its own task (so on every core), at most
/// [`FETCH_CONCURRENCY`] at once, and yields the results in the items'
/// order.
pub fn in_order<I, T, Fut>(
    items: I,
    work: impl Fn(I::Item) -> Fut,
) -> impl Stream<Item = Result<T, Failure>>
where
    I: IntoIterator,
    T: Send + 'static,
    Fut: Future<Output = Result<T, Failure>> + Send + 'static,
{
    futures_util::stream::iter(items)
        .map(move |item| {
            let task = tokio::spawn(work(item));
            async move {
                task.await.unwrap_or_else(|e| {
                    Err(Failure::unreadable(format!("a fetch did not finish: {e}")))
                })
            }
        })
        .buffered(FETCH_CONCURRENCY)
}

/// An object a manifest names, in log order: its sealed segments, then
/// its chunks.
#[derive(Clone, Copy)]
pub enum Listed<'a> {
    /// A sealed segment.
    Segment(&'a SegmentEntry),
    /// A tail chunk.
    Chunk(&'a ChunkEntry),
}

impl Listed<'_> {
    /// Fetches it, checked against the entry (length and BLAKE3).
    pub fn fetch(&self, store: &ArchiveStore) -> impl Future<Output = Result<Bytes, Failure>> {
        let (key, bytes, blake3) = match self {
            Listed::Segment(s) => (s.key.clone(), s.bytes, s.blake3),
            Listed::Chunk(c) => (c.key.clone(), c.bytes, c.blake3),
        };
        let store = store.clone();
        async move {
            store
                .get_listed(&key, bytes, &blake3)
                .await
                .map_err(store_failure)
        }
    }
}

/// Every object `manifest` names, in log order.
pub fn listed(manifest: &Manifest) -> Vec<Listed<'_>> {
    manifest
        .segments
        .iter()
        .map(Listed::Segment)
        .chain(manifest.chunks.iter().map(Listed::Chunk))
        .collect()
}

/// Walks the records of a segment's bytes from `start` (the end of a
/// commit mark, or [`HEADER_LEN`](spark_log_format::HEADER_LEN)), the last seq before it being
/// `from_seq`, and finds the first op `at` leaves out ([`At::excludes`],
/// the rule `rebuild --at` follows). `None`: every whole record there is
/// kept. Otherwise the log is cut at the end of the last commit mark (or
/// seal) before that op: a restore can only stop at a batch's end.
fn cut_in(bytes: &[u8], start: usize, from_seq: u64, at: &At) -> Option<Cut> {
    let mut kept_end = start;
    let mut kept_seq = from_seq;
    let mut seen_seq = from_seq;
    // The walk ends at the end, or at damage that the full decoder reports
    // later.
    for frame in Frames::new(bytes, start, DEFAULT_MAX_RECORD_BYTES) {
        let record = frame.record;
        match frame.kind {
            FrameKind::CommitMark | FrameKind::Seal => {
                kept_end = frame.end();
                kept_seq = seen_seq;
                continue;
            }
            FrameKind::UnknownMarker(_) => continue,
            FrameKind::Op => {}
        }
        if at.excludes(record.seq, record.ts_ms) {
            return Some(Cut {
                offset: kept_end,
                last_seq: kept_seq,
                next_seq: record.seq,
                mid_batch: kept_end != frame.offset(),
            });
        }
        seen_seq = record.seq;
    }
    None
}

/// Writes `bytes` as the file `path` durably ([`Fs::write_file_durably`]:
/// temporary file, fsync, rename, directory fsync).
fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    OsFs.write_file_durably(path, bytes)
        .map_err(|e| unwritable(path, e))
}

fn sync_dir(path: &Path) -> Result<(), Failure> {
    std::fs::File::open(path)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| unwritable(path, e))
}

fn is_empty_dir(dir: &Path) -> std::io::Result<bool> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e),
    }
}

/// A file or directory of the restore that could not be written.
fn unwritable(path: &Path, e: std::io::Error) -> Failure {
    Failure::unreadable(format!("cannot write {}: {e}", path.display()))
}

/// Fetches every object the manifest names (up to the batch `at` keeps)
/// into `log_dir` with the archive's catch-up ([`spark_archive::catch_up()`]
/// on an empty directory): each checked (ARCHIVE.md "Sealed segment",
/// "Tail chunk": BLAKE3 and length, seq order, then `verify_sealed` /
/// `verify_chunk`: each segment's header, `chain_start` and seal, each
/// chunk's frame, offsets and chain values, also for an object `--at`
/// cuts) and written in log order as they come, each file durably, then
/// the directory fsynced. `at` is applied as a cut ([`cut_in`]) on each
/// object once checked; with `--at SEQ` objects after SEQ are not fetched.
async fn write_archived_log(
    store: &ArchiveStore,
    manifest: &Manifest,
    at: Option<At>,
    log_dir: &Path,
) -> Result<Written, Failure> {
    let trimmed;
    let manifest = match at {
        Some(At::Seq(seq)) => {
            // Objects after SEQ are not fetched at all.
            let mut kept = manifest.clone();
            kept.segments.retain(|s| s.first_seq <= seq);
            kept.chunks.retain(|c| c.first_seq <= seq);
            trimmed = kept;
            &trimmed
        }
        _ => manifest,
    };
    let total: u64 = listed(manifest)
        .iter()
        .map(|e| match e {
            Listed::Segment(s) => s.bytes,
            Listed::Chunk(c) => c.bytes,
        })
        .sum();
    let bar = progress::bar(total, "restore: reading the archive");
    std::fs::create_dir_all(log_dir).map_err(|e| unwritable(log_dir, e))?;
    let mut cut = None;
    let mut keep = |object: &Fetched<'_>| {
        bar.inc(object.object_bytes);
        let found = at
            .as_ref()
            .and_then(|at| cut_in(object.bytes, object.records_from, object.first_seq - 1, at));
        match found {
            Some(found) => {
                cut = Some(found);
                Keep::Upto(found.offset)
            }
            None => Keep::All,
        }
    };
    let caught = spark_archive::catch_up(
        store,
        &OsFs,
        log_dir,
        Some(manifest),
        DEFAULT_MAX_RECORD_BYTES,
        spark_archive::Options {
            allow_more: false,
            keep: Some(&mut keep),
            follow_compactions: false,
        },
    )
    .await
    .map_err(catch_up_failure)?;
    bar.finish_and_clear();
    sync_dir(log_dir)?;
    Ok(Written {
        segments: caught
            .segments
            .into_iter()
            .map(|s| Assembled {
                name: s.name,
                objects: s.objects,
            })
            .collect(),
        objects: caught.objects,
        object_bytes: caught.object_bytes,
        cut,
    })
}

/// Writes the log into `data`, checks it with the full decoder, the chain
/// and the one fold, then fetches and checks every blob a kept op names.
/// With `from_checkpoint`, the fold starts from the newest archived
/// checkpoint that is valid against the written log and not past it
/// ([`start_from_checkpoint`]): every record is still read and checked,
/// only the ops after it are folded.
async fn materialize(
    store: &ArchiveStore,
    manifest: Manifest,
    at: Option<At>,
    data: &Path,
    from_checkpoint: bool,
) -> Result<serde_json::Value, Failure> {
    let log_dir = spark_core::layout::log_dir(data);
    let written = write_archived_log(store, &manifest, at, &log_dir).await?;
    if let (Some(At::Seq(seq)), Some(cut)) = (at, written.cut) {
        if cut.last_seq != seq {
            return Err(scan::usage(format!(
                "--at {seq} is not the last seq of a batch in the archive (its batch ends \
                 after it; the batch before ends at {}): restore to a batch's end",
                cut.last_seq
            )));
        }
    }
    if written.segments.is_empty() {
        return Err(scan::usage(
            "--at: the archive holds no op at or before it".to_owned(),
        ));
    }
    let restored_seq = written.cut.map_or(manifest.shipped_seq, |c| c.last_seq);
    let start = if from_checkpoint {
        start_from_checkpoint(store, &manifest, at, restored_seq, data).await
    } else {
        None
    };
    let checkpoint = start
        .as_ref()
        .map(|(key, mirror)| json!({"key": key, "seq": mirror.seq}));
    let start = start.map_or_else(Mirror::new, |(_, mirror)| mirror);
    let (mirror, report, ops_folded) = check_log(&written, data, start)?;
    let (blobs, blob_bytes, blobs_missing) = restore_blobs(store, &mirror, data).await?;
    let cut = written
        .cut
        .map(|c| json!({"last_seq": c.last_seq, "next_seq": c.next_seq, "mid_batch": c.mid_batch}));
    Ok(json!({
        "manifest": manifest.number,
        "epoch": manifest.epoch,
        "archived_seq": manifest.shipped_seq,
        "written_ms": manifest.written_ms,
        "seq": mirror.seq,
        "ts_ms": mirror.ts_ms,
        "chain": chain_hex(&report.head.chain),
        "segments": written.segments.len(),
        "objects": written.objects,
        "object_bytes": written.object_bytes,
        "blobs": blobs,
        "blob_bytes": blob_bytes,
        "blobs_missing": blobs_missing,
        "digest": mirror.digest(),
        "cut": cut,
        "checkpoint": checkpoint,
        "ops_folded": ops_folded,
    }))
}

/// The newest checkpoint `manifest` lists that `at` keeps and the restored
/// log (up to `restored_seq`) holds, valid against that log
/// ([`spark_archive::checkpoint::install`]: length, BLAKE3, header, chain
/// value) and whole ([`spark_core::checkpoint::load`]): written into
/// `data`'s `checkpoint/` (the engine's first start uses it too) and
/// loaded, with its object key. Every one not used is named on stderr with
/// why, and the restore goes on: a checkpoint only saves time.
async fn start_from_checkpoint(
    store: &ArchiveStore,
    manifest: &Manifest,
    at: Option<At>,
    restored_seq: u64,
    data: &Path,
) -> Option<(String, Mirror)> {
    let log_dir = spark_core::layout::log_dir(data);
    let fits = |entry: &CheckpointEntry| {
        entry.seq <= restored_seq && !at.is_some_and(|at| at.excludes(entry.seq, entry.ts_ms))
    };
    let (installed, skipped) =
        spark_archive::checkpoint::install_newest(store, manifest, data, &log_dir, fits).await;
    for skipped in skipped {
        eprintln!(
            "spark-replay: warning: archived checkpoint {} ignored: {}; folding the log without it",
            skipped.key, skipped.why
        );
    }
    let installed = installed?;
    match spark_core::checkpoint::load(&installed.file, &log_dir, Mirror::new()) {
        Ok((_, mirror)) => Some((installed.key, mirror)),
        Err(why) => {
            eprintln!(
                "spark-replay: warning: archived checkpoint {} ignored: {why}; folding the log without it",
                installed.key
            );
            let _ = std::fs::remove_file(&installed.file);
            None
        }
    }
}

/// Replays the written log with the full decoder, the chain of every
/// sealed segment and the one fold; a failure names the objects its
/// segment came from. A torn tail is damage.
fn check_log(
    written: &Written,
    data: &Path,
    start: Mirror,
) -> Result<(Mirror, ScanReport, u64), Failure> {
    let common = Common {
        data: data.to_owned(),
        json: false,
    };
    let (mirror, report, folded) =
        scan::replay_verified_from(&common, start).map_err(|failure| {
            let objects: Vec<String> = written
                .segments
                .iter()
                .filter(|s| failure.message.contains(&s.name))
                .flat_map(|s| {
                    s.objects
                        .iter()
                        .map(|(k, at)| format!("{k} (from offset {at})"))
                })
                .collect();
            Failure {
                message: format!(
                    "the archived log does not verify: {}; that segment came from: {}",
                    failure.message,
                    objects.join(", ")
                ),
                code: failure.code,
            }
        })?;
    if report.torn_tail.is_some() {
        return Err(Failure::damage(
            "the archived log ends in bytes that are not a whole batch (a chunk past its last commit mark)",
        ));
    }
    Ok((mirror, report, folded))
}

/// Fetches every blob the mirror's media name (but an erased moment's)
/// into `data`'s blob store
/// (several at once), each checked against its media.put op, and syncs the
/// directories. A blob the writer recorded lost (ARCHIVE.md "Missing
/// blob": no blob object, a `missing/` marker) is left out and listed.
/// Returns how many blobs, their bytes and the lost ones.
async fn restore_blobs(
    store: &ArchiveStore,
    mirror: &Mirror,
    data: &Path,
) -> Result<(usize, u64, Vec<serde_json::Value>), Failure> {
    let blobs_dir = spark_core::blob::blobs_dir(data);
    std::fs::create_dir_all(&blobs_dir).map_err(|e| unwritable(&blobs_dir, e))?;
    // An erased moment's blobs are gone on purpose (SPEC section 13): the
    // engine answers its media 410 without them. The archive may still
    // hold them (superseded objects), they are not restored.
    let mut media: Vec<_> = mirror
        .media
        .values()
        .filter(|m| !mirror.is_erased(m.moment_id))
        .map(|m| (m.sha256.0, m.size_bytes))
        .collect();
    media.sort_unstable();
    media.dedup();
    let total: u64 = media.iter().map(|(_, size)| size).sum();
    let bar = progress::bar(total, "restore: blobs");
    let mut fetched = std::pin::pin!(in_order(media.clone(), |(sha, size)| {
        let store = store.clone();
        async move {
            let key = blob_key(store.prefix(), &sha);
            let Some(bytes) = store.get(&key).await.map_err(store_failure)? else {
                return missing_blob(&store, &sha, key).await.map(Err);
            };
            let digest: [u8; 32] = sha2::Sha256::digest(&bytes).into();
            if digest != sha || bytes.len() as u64 != size {
                return Err(Failure::damage(format!(
                    "{key}: {} bytes with SHA-256 {}, the media.put op says {size} bytes \
                     with SHA-256 {}",
                    bytes.len(),
                    hex::encode(digest),
                    hex::encode(sha)
                )));
            }
            Ok(Ok((sha, bytes)))
        }
    }));
    let mut blob_bytes = 0u64;
    let mut missing = Vec::new();
    while let Some(blob) = fetched.next().await {
        let (sha, bytes) = match blob? {
            Ok(blob) => blob,
            Err(lost) => {
                missing.push(lost);
                continue;
            }
        };
        write_file(&spark_core::blob::blob_path(&blobs_dir, &sha), &bytes)?;
        bar.inc(bytes.len() as u64);
        blob_bytes += bytes.len() as u64;
    }
    bar.finish_and_clear();
    sync_dir(&blobs_dir)?;
    for dir in [blobs_dir.parent().unwrap_or(data), data] {
        sync_dir(dir)?;
    }
    Ok((media.len() - missing.len(), blob_bytes, missing))
}

/// A blob with no object under its key: the writer's `missing/` marker
/// for it, as listed in the summary, or a store failure when there is no
/// marker either (the archive lacks a blob it should hold).
async fn missing_blob(
    store: &ArchiveStore,
    sha: &[u8; 32],
    key: String,
) -> Result<serde_json::Value, Failure> {
    let marker_key = missing_key(store.prefix(), sha);
    let marker = store
        .get(&marker_key)
        .await
        .map_err(store_failure)?
        .ok_or_else(|| store_failure(StoreError::Missing { key }))?;
    let marker = MissingBlobDoc::decode(&marker, sha)
        .map_err(|e| Failure::damage(format!("object {marker_key} is damaged: {e}")))?;
    Ok(json!({
        "sha256": marker.sha256,
        "media_id": marker.media_id,
        "seq": marker.seq,
        "reason": marker.reason,
    }))
}

fn print(common: &Common, what: &str, summary: &serde_json::Value) {
    if common.json {
        scan::print_json(summary);
        return;
    }
    println!(
        "{what} up to seq {} (archive manifest {}, epoch {}; the archive holds up to {})",
        summary["seq"], summary["manifest"], summary["epoch"], summary["archived_seq"]
    );
    if let Some(manifests) = summary["manifests"].as_u64() {
        println!("history   {manifests} manifests, each extending the one before");
    }
    if let Some(key) = summary["checkpoint"]["key"].as_str() {
        println!(
            "from      checkpoint {key} (seq {}); {} ops folded after it",
            summary["checkpoint"]["seq"], summary["ops_folded"]
        );
    }
    println!("segments  {}", summary["segments"]);
    println!(
        "objects   {} ({} bytes)",
        summary["objects"], summary["object_bytes"]
    );
    println!(
        "blobs     {} ({} bytes)",
        summary["blobs"], summary["blob_bytes"]
    );
    if let Some(missing) = summary["blobs_missing"]
        .as_array()
        .filter(|m| !m.is_empty())
    {
        println!(
            "missing   {} blobs the writer lost before it could archive them (their media cannot be served):",
            missing.len()
        );
        for m in missing {
            println!(
                "  media {} (seq {}), blob {}: {}",
                m["media_id"].as_str().unwrap_or(""),
                m["seq"],
                m["sha256"].as_str().unwrap_or(""),
                m["reason"].as_str().unwrap_or("")
            );
        }
    }
    println!("chain     {}", summary["chain"].as_str().unwrap_or(""));
    println!("digest    {}", summary["digest"].as_str().unwrap_or(""));
}

/// The latest manifest, or damage when the archive holds none.
pub async fn latest_manifest(store: &ArchiveStore) -> Result<Manifest, Failure> {
    store
        .latest_manifest()
        .await
        .map_err(store_failure)?
        .ok_or_else(|| {
            Failure::damage(format!(
                "no manifest under {:?}: an empty archive",
                store.prefix()
            ))
        })
}

/// Removes what a failed restore wrote into `data` (which was empty or
/// absent before), so that no engine starts on part of a log.
fn discard(data: &Path, existed: bool) {
    if existed {
        for dir in [
            spark_core::layout::log_dir(data),
            spark_core::checkpoint::checkpoint_dir(data),
            spark_core::blob::blobs_dir(data)
                .parent()
                .map(Path::to_owned)
                .unwrap_or_default(),
        ] {
            if dir.starts_with(data) && dir != data {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    } else {
        let _ = std::fs::remove_dir_all(data);
    }
}

/// `restore --from URL --data DIR [--at SEQ|TIME] [--no-checkpoint]`:
/// refuses a non-empty DIR; on failure removes what it wrote. With
/// `from_checkpoint`, the fold starts from the newest valid archived
/// checkpoint ([`start_from_checkpoint`]).
pub fn restore(common: &Common, from: &From, at: Option<&str>, from_checkpoint: bool) -> ToolExit {
    let at = at.map(At::parse).transpose()?;
    let data = &common.data;
    match is_empty_dir(data) {
        Ok(true) => {}
        Ok(false) => {
            return Err(scan::usage(format!(
                "{} is not empty: restore writes a new data directory only",
                data.display()
            )))
        }
        Err(e) => return Err(Failure::unreadable(format!("{}: {e}", data.display()))),
    }
    let store = connect(from)?;
    let existed = data.exists();
    let result = runtime()?.block_on(async {
        let latest = latest_manifest(&store).await?;
        let archived_seq = latest.shipped_seq;
        if let Some(At::Seq(seq)) = at {
            if seq > latest.shipped_seq {
                return Err(scan::usage(format!(
                    "--at {seq}: the archive holds up to {}",
                    latest.shipped_seq
                )));
            }
        }
        let mut manifests = Retained::new(&store, latest);
        let floor = manifests.floor().await?;
        if let Some(at) = at {
            refuse_before_horizon(at, &floor, store.prefix())?;
        }
        std::fs::create_dir_all(data)
            .map_err(|e| Failure::unreadable(format!("cannot create {}: {e}", data.display())))?;
        let summary = match at {
            None => {
                let latest = manifests.latest.clone();
                materialize(&store, latest, None, data, from_checkpoint).await?
            }
            Some(at) => {
                let mut summary =
                    restore_at(&store, &mut manifests, at, data, from_checkpoint).await?;
                // `manifest` is the one read; the archive holds the latest's.
                summary["archived_seq"] = json!(archived_seq);
                summary
            }
        };
        if let Some(seq) = summary["seq"].as_u64().filter(|&seq| seq < archived_seq) {
            // The cut left ops out: a take-over of the prefix from here
            // would fetch them back, so it refuses this directory.
            let doc = json!({"url": from.url, "seq": seq, "archived_seq": archived_seq});
            let path = spark_core::layout::restored_at_file(data);
            write_file(&path, doc.to_string().as_bytes())?;
        }
        Ok(summary)
    });
    let summary = match result {
        Ok(summary) => summary,
        Err(failure) => {
            discard(data, existed);
            return Err(failure);
        }
    };
    if summary["cut"]["mid_batch"] == true {
        eprintln!(
            "spark-replay: note: the batch holding seq {} has ops on both sides of --at; \
             it is left out whole (a restore stops at a batch's end), so the restore stops \
             at seq {} while `rebuild --at` on the original stops at seq {}",
            summary["cut"]["next_seq"],
            summary["seq"],
            summary["cut"]["next_seq"].as_u64().unwrap_or(1) - 1
        );
    }
    print(common, "restored", &summary);
    Ok(exit::OK)
}

/// The retained manifests of an archive (ARCHIVE.md "Retention"): from the
/// latest manifest's `retained_from` (the horizon) to it, read on demand
/// and kept.
struct Retained<'a> {
    store: &'a ArchiveStore,
    latest: Manifest,
    read: std::collections::BTreeMap<u64, Manifest>,
}

impl<'a> Retained<'a> {
    fn new(store: &'a ArchiveStore, latest: Manifest) -> Retained<'a> {
        Retained {
            store,
            latest,
            read: std::collections::BTreeMap::new(),
        }
    }

    /// Manifest `number` (between the floor and the latest).
    async fn get(&mut self, number: u64) -> Result<Manifest, Failure> {
        if number == self.latest.number {
            return Ok(self.latest.clone());
        }
        if let Some(m) = self.read.get(&number) {
            return Ok(m.clone());
        }
        let m = self.store.manifest(number).await.map_err(store_failure)?;
        self.read.insert(number, m.clone());
        Ok(m)
    }

    /// The horizon: the manifest the latest one's `retained_from` names.
    async fn floor(&mut self) -> Result<Manifest, Failure> {
        self.get(self.latest.retained_from).await
    }

    /// The earliest retained manifest for which `reached` holds (it must
    /// hold from some manifest on: `shipped_seq` and `written_ms` only
    /// grow along the history), the latest when none: a binary search,
    /// about log2(retained) GETs.
    async fn earliest(&mut self, reached: impl Fn(&Manifest) -> bool) -> Result<Manifest, Failure> {
        let (mut low, mut high) = (self.latest.retained_from, self.latest.number);
        while low < high {
            let mid = low + (high - low) / 2;
            if reached(&self.get(mid).await?) {
                high = mid;
            } else {
                low = mid + 1;
            }
        }
        self.get(low).await
    }
}

/// Refuses `--at` before the retention horizon (the manifest `floor` the
/// latest one's `retained_from` names): what a compaction erased before it
/// may be deleted from the archive, so a restore there could not be exact
/// (exit 2, naming the horizon and the setting). A floor still at manifest
/// 1 is no horizon: no retention pass moved it, nothing was deleted, and
/// manifest 1 holds the log from seq 1.
fn refuse_before_horizon(at: At, floor: &Manifest, prefix: &str) -> Result<(), Failure> {
    if floor.number <= 1 {
        return Ok(());
    }
    let before = match at {
        At::Seq(seq) => seq < floor.shipped_seq,
        At::TimeMs(ms) => ms < floor.written_ms,
    };
    if !before {
        return Ok(());
    }
    let what = match at {
        At::Seq(seq) => format!("seq {seq}"),
        At::TimeMs(ms) => spark_core::time::format_rfc3339_ms(ms as i64),
    };
    Err(scan::usage(format!(
        "--at {what} is before the archive's retention horizon: seq {} at {} (manifest {}, {}); \
         what is older may have been deleted by the writer's retention pass (`[archive] \
         retention_ms`), so no restore before it can be exact. Restore at or after the horizon",
        floor.shipped_seq,
        spark_core::time::format_rfc3339_ms(floor.written_ms as i64),
        floor.number,
        manifest_key(prefix, floor.number),
    )))
}

/// How many manifests `--at TIME` tries before it gives up finding one
/// whose log reaches past TIME (each try fetches the log up to the cut).
const TIME_TRIES: usize = 8;

/// `restore --at` within the horizon: the ops at or before the cut are
/// read from a manifest that had not applied a compaction after the cut
/// (ARCHIVE.md "Restore"): the latest when its log applies no compaction
/// (or, for `--at SEQ`, none after SEQ); else for `--at SEQ` the earliest
/// retained manifest
/// whose `shipped_seq` reaches SEQ; for `--at TIME` the earliest one
/// written after TIME whose log reaches past TIME (holds an op stamped
/// after it: ops are stamped in seq order, so it then holds every op
/// stamped at or before TIME). When the log of the one tried turns out to
/// end at or before TIME, the log is written again from the next manifest
/// that ships more (at most [`TIME_TRIES`] tries; the latest at the end).
/// A manifest
/// that itself applies a compaction whose record is after the cut is
/// refused (exit 2): its log has the cut's ops in their erased form.
async fn restore_at(
    store: &ArchiveStore,
    manifests: &mut Retained<'_>,
    at: At,
    data: &Path,
    from_checkpoint: bool,
) -> Result<serde_json::Value, Failure> {
    // The latest compaction the latest manifest's log applies (its last
    // sealed segment carries it in its key): none, or none after a seq
    // cut, and the latest manifest is exact for the cut.
    let last_compaction = manifests
        .latest
        .segments
        .iter()
        .filter_map(|s| key_compaction(&s.key))
        .max();
    let latest_exact = match (at, last_compaction) {
        (_, None) => true,
        (At::Seq(seq), Some(record_seq)) => record_seq <= seq,
        (At::TimeMs(_), Some(_)) => false,
    };
    let mut manifest = match at {
        _ if latest_exact => manifests.latest.clone(),
        At::Seq(seq) => manifests.earliest(|m| m.shipped_seq >= seq).await?,
        At::TimeMs(ms) => manifests.earliest(|m| m.written_ms > ms).await?,
    };
    let latest_number = manifests.latest.number;
    let mut tries = 0;
    loop {
        tries += 1;
        let number = manifest.number;
        let compactions = manifest.compactions.clone();
        let shipped = manifest.shipped_seq;
        let summary = materialize(store, manifest, Some(at), data, from_checkpoint).await?;
        let cut_seq = summary["seq"].as_u64().unwrap_or(0);
        if let Some(c) = compactions.iter().find(|c| c.record_seq > cut_seq) {
            return Err(scan::usage(format!(
                "--at: the archive holds the ops up to seq {cut_seq} only as manifest {number} \
                 left them, after the compaction at seq {} erased content in them: a restore \
                 there would not be the state at that point. Restore at or after seq {}",
                c.record_seq, c.record_seq
            )));
        }
        let reached = summary["cut"].is_object() || shipped > cut_seq;
        if reached || number == latest_number || tries >= TIME_TRIES {
            return Ok(summary);
        }
        // --at TIME: this manifest's log ends at or before TIME; a later
        // one holds more.
        discard_written(data);
        manifest = manifests.earliest(|m| m.shipped_seq > shipped).await?;
    }
}

/// Removes what [`materialize`] wrote into `data` (to write it again from
/// another manifest).
fn discard_written(data: &Path) {
    for dir in [
        spark_core::layout::log_dir(data),
        spark_core::checkpoint::checkpoint_dir(data),
        spark_core::blob::blobs_dir(data),
    ] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Reads the retained manifests, from the latest one's `retained_from`
/// to it (the latest as every reader finds it: [`latest_manifest`], which
/// refuses a gap in those numbers, ARCHIVE.md "Gaps"; older ones may have
/// been deleted by retention) and checks that each one's epoch is at
/// least the previous one's and that each extends it ([`extends`],
/// ARCHIVE.md "Manifest history"). Returns the latest and how many were
/// read.
async fn walk_history(store: &ArchiveStore) -> Result<(Manifest, u64), Failure> {
    let prefix = store.prefix().to_owned();
    let latest = latest_manifest(store).await?;
    let (from, latest) = (latest.retained_from, latest.number);
    let mut fetched = std::pin::pin!(in_order(from..=latest, |number| {
        let store = store.clone();
        async move { store.manifest(number).await.map_err(store_failure) }
    }));
    let mut prev: Option<Manifest> = None;
    while let Some(manifest) = fetched.next().await {
        let manifest = manifest?;
        if let Some(prev) = &prev {
            extends(prev, &manifest).map_err(|fork| {
                Failure::damage(format!(
                    "manifest {} ({}) does not extend manifest {} ({}): {fork}; the archive's history forks there",
                    manifest.number,
                    manifest_key(&prefix, manifest.number),
                    prev.number,
                    manifest_key(&prefix, prev.number),
                ))
            })?;
        }
        prev = Some(manifest);
    }
    let latest_manifest = prev.expect("at least the latest manifest was read");
    Ok((latest_manifest, latest - from + 1))
}

/// `verify --from URL`: walks the manifest history, then reads and checks
/// everything the latest manifest names, in a scratch directory that is
/// removed afterwards.
pub fn verify(common: &Common, from: &From) -> ToolExit {
    let store = connect(from)?;
    let scratch: PathBuf = std::env::temp_dir().join(format!(
        "spark-verify-{}-{}",
        std::process::id(),
        spark_log_format::system_now_ms()
    ));
    let result = runtime()?.block_on(async {
        let (manifest, manifests) = walk_history(&store).await?;
        std::fs::create_dir_all(&scratch).map_err(|e| {
            Failure::unreadable(format!("cannot create {}: {e}", scratch.display()))
        })?;
        // verify folds the whole log: a checkpoint would skip the fold it
        // checks.
        let mut summary = materialize(&store, manifest, None, &scratch, false).await?;
        summary["manifests"] = json!(manifests);
        Ok(summary)
    });
    let _ = std::fs::remove_dir_all(&scratch);
    print(common, "verified", &result?);
    Ok(exit::OK)
}
