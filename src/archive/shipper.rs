//! The shipper task ([`Shipper`]): follows the journal's durable head and
//! ships, each time, the fencing HEAD, the blobs of new `media.put` ops
//! (each checked locally first, a lost one recorded missing), the log
//! (sealed segments, at most one tail chunk, merged runs of chunks in
//! `sync` mode) and the manifest naming them; it renews the lease, puts
//! local checkpoints, retries a failed ship with backoff, and fences its
//! engine once another took the prefix over. Also here: the shipping
//! state it moves ([`ShipState`]; [`state_after`] a stored manifest, at
//! start and when it adopts an earlier try's manifest), what it records in
//! the [`ArchiveStatus`], and the put counters.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use spark_archive::layout::{
    acknowledged_end, blob_key, checkpoint_key, chunk_key, compacted_segment_key, epoch_key,
    extends, manifest_key, missing_key, segment_key, CheckpointEntry, ChunkEntry, ChunkHeader,
    CompactionEntry, Manifest, MissingBlobDoc, SegmentEntry, CHECKPOINTS_LISTED, CHUNK_HEADER_LEN,
};
use spark_archive::{ArchiveStore, Put, StoreError};
use spark_log_format::format::{
    chain_hasher, chain_hex, chain_value, segment_file_name, ChainValue, HEADER_CHAIN_START_OFFSET,
    SEAL_PAYLOAD_LEN, SEAL_RECORD_BYTES,
};
use spark_log_format::{CompactionRecord, FrameKind, Frames, Head, HEADER_LEN, KIND_COMPACTION};

use super::status::{ArchiveStatus, NextOp, MISSING_BLOBS_LISTED};
use super::{
    gate, metrics, read_range, ArchiveStartError, BLOBS_AHEAD_EVERY, BLOB_PUTS_AT_ONCE,
    CHECKPOINT_LOOK_INTERVAL, FINAL_SHIP_TIMEOUT,
};
use crate::engine::Engine;

/// The longest wait between two tries of a failing ship.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The longest wait between two tries of a failing ship in `sync` mode,
/// where writers wait for it: they are answered within this (plus one
/// ship) of the store coming back.
const SYNC_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// In `sync` mode (a chunk per ship), this many chunks of one level in a
/// row are merged into one chunk of the next level, so that a manifest
/// lists at most `(MERGE_FAN_IN - 1)` chunks per level (ARCHIVE.md "Sync
/// mode"); each byte is put once more per level.
const MERGE_FAN_IN: usize = 16;

/// Why one ship failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ShipError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("local log: {0}")]
    Local(String),
    /// A local blob could not be read for a reason other than its absence
    /// (permissions, an I/O error): retried, as it may be repaired.
    #[error("blob {path}: {message}")]
    Blob { path: String, message: String },
    #[error("fenced: {0}")]
    Fenced(String),
    /// A manifest of this writer's epoch under the number it needs that
    /// it did not store (it does not extend the state, or its last entry
    /// is not the local log's): never adopted; retried, as it may be
    /// removed.
    #[error("{0}")]
    Foreign(String),
}

impl ShipError {
    fn kind(&self) -> &'static str {
        match self {
            ShipError::Store(e) => e.kind(),
            ShipError::Local(_) => "local",
            ShipError::Blob { .. } => "blob",
            ShipError::Fenced(_) => "fenced",
            ShipError::Foreign(_) => "conflict",
        }
    }
}

/// A [`ShipError::Local`]: `e`, found at `context` (a file).
fn local(context: &str, e: impl std::fmt::Display) -> ShipError {
    ShipError::Local(format!("{context}: {e}"))
}

/// What the shipper records in the [`ArchiveStatus`] it reports: here, beside
/// the shipper's types these read ([`ShipState`], [`MediaOp`]), so that
/// `status` does not depend on `shipper`.
impl ArchiveStatus {
    /// Records that everything up to `state` is shipped.
    pub(super) fn shipped(&self, state: &ShipState) {
        *self.next.lock() = NextOp {
            seq: state.shipped_seq + 1,
            segment_first_seq: state.tail.segment_first_seq,
            offset: state.tail.offset,
            ts_ms: None,
        };
        self.shipped_seq.store(state.shipped_seq, Ordering::Release);
        metrics::get().shipped_seq.set(state.shipped_seq as i64);
    }

    /// Records a lost blob once: listed in `/readyz`, counted by
    /// `spark_archive_blobs_missing`, and a WARN line.
    fn record_missing(&self, op: &MediaOp, reason: &str) {
        let mut missing = self.missing.lock();
        if !missing.seen.insert(op.sha256) {
            return;
        }
        let sha = chain_hex(&op.sha256);
        tracing::warn!(
            blob = %sha, media_id = %op.media_id, seq = op.seq, reason,
            "archive: a blob is lost locally; its op is shipped without it and the archive records it missing"
        );
        if missing.listed.len() < MISSING_BLOBS_LISTED {
            missing.listed.push(serde_json::json!({
                "sha256": sha,
                "media_id": op.media_id,
                "seq": op.seq,
                "reason": reason,
            }));
        }
    }
}

/// A `media.put` op to ship the blob of.
#[derive(Debug)]
struct MediaOp {
    seq: u64,
    media_id: String,
    sha256: [u8; 32],
    size_bytes: u64,
}

/// What the local copy of a blob is.
enum LocalBlob {
    /// Its bytes, as its op names them.
    Good(Vec<u8>),
    /// Missing or damaged: never to be shipped (the reason, naming the
    /// path).
    Lost(String),
    /// It could not be read (not a missing file): tried again.
    Unreadable(String),
}

/// Reads the blob at `path` and checks it against its `media.put` with
/// the one blob check ([`spark_core::blob::verify_reader`]; newcomer
/// finding 2: a damaged blob put create-only could never be replaced).
fn check_local_blob(path: &Path, sha256: &[u8; 32], size_bytes: u64) -> LocalBlob {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return LocalBlob::Lost(format!("missing: {}: {e}", path.display()))
        }
        Err(e) => return LocalBlob::Unreadable(e.to_string()),
    };
    match spark_core::blob::verify_reader(&bytes[..], sha256, size_bytes) {
        Ok(()) => LocalBlob::Good(bytes),
        Err(fault) => LocalBlob::Lost(format!("damaged: {}: {fault}", path.display())),
    }
}

/// The segment being shipped as chunks.
#[derive(Clone)]
pub(super) struct Tail {
    segment_first_seq: u64,
    /// Bytes of it already shipped (0: none; the next chunk has the header).
    offset: u64,
    chain_start: ChainValue,
    /// Fed `chain_start` and the `offset` bytes.
    hasher: blake3::Hasher,
}

impl Tail {
    pub(super) fn fresh(segment_first_seq: u64, chain_start: ChainValue) -> Tail {
        Tail {
            segment_first_seq,
            offset: 0,
            chain_start,
            hasher: chain_hasher(&chain_start),
        }
    }
}

/// What the archive holds as of the last manifest, and where to go on.
#[derive(Clone)]
pub(super) struct ShipState {
    pub(super) number: u64,
    pub(super) segments: Vec<SegmentEntry>,
    pub(super) chunks: Vec<ChunkEntry>,
    /// The merge level of each of `chunks` (0: one ship's; not stored:
    /// chunks read back from a manifest count as level 0).
    pub(super) chunk_levels: Vec<u8>,
    pub(super) shipped_seq: u64,
    pub(super) shipped_chain: ChainValue,
    pub(super) tail: Tail,
    /// The checkpoints the manifest lists (ARCHIVE.md "Checkpoint").
    pub(super) checkpoints: Vec<CheckpointEntry>,
    /// The compactions the manifest naming this state applies relative to
    /// the stored one (ARCHIVE.md "Compaction"); empty once it is stored.
    pub(super) compactions: Vec<CompactionEntry>,
    /// The manifest's retention floor (ARCHIVE.md "Retention"): raised
    /// only by the retention pass, carried by every later manifest.
    pub(super) retained_from: u64,
}

/// A checkpoint put in flight, off the ship's path: a large object must
/// not hold up the manifests writers wait for (`sync` mode).
type CheckpointPut = tokio::task::JoinHandle<Result<CheckpointEntry, String>>;

/// The shipper task ([`Shipper::run`]): what it ships from and to, the
/// shipping state it moves, and its lease and checkpoint bookkeeping.
pub(super) struct Shipper {
    pub(super) store: ArchiveStore,
    pub(super) engine: Arc<Engine>,
    pub(super) status: Arc<ArchiveStatus>,
    pub(super) log_dir: PathBuf,
    pub(super) blobs_dir: PathBuf,
    pub(super) max_record_bytes: u32,
    pub(super) state: ShipState,
    /// The lease this writer renews (`[archive] lease_ms`), `None` when off.
    pub(super) lease: Option<Duration>,
    /// When the last manifest (or, before the first, the epoch object) was
    /// written, on this process's monotonic clock: a renewal is due
    /// `lease / 3` after it.
    pub(super) renewed_at: Instant,
    /// The `lease_ms` the archive says this writer holds (its last
    /// manifest's, or its epoch object's): a renewal is due at once when it
    /// is not this writer's, so that the archive never advertises a lease
    /// nobody renews.
    pub(super) advertised_lease_ms: u64,
    /// The data directory (its `checkpoint/` is shipped).
    pub(super) data_dir: PathBuf,
    /// The checkpoint put in flight, if any.
    pub(super) checkpoint_put: Option<CheckpointPut>,
    /// A checkpoint stored in the archive that no manifest lists yet: the
    /// next manifest does (a ship's, or one of its own).
    pub(super) checkpoint_stored: Option<CheckpointEntry>,
    /// When the shipper last looked for a new local checkpoint.
    pub(super) checkpoint_looked: Option<Instant>,
    /// `async` mode: blobs the archive holds, put ahead of their ship
    /// ([`Shipper::put_blobs_ahead`]), by SHA-256, with the seq of the op
    /// they were put for: the ship skips them; forgotten once a manifest
    /// covers that seq.
    pub(super) blobs_ahead: Mutex<std::collections::HashMap<[u8; 32], u64>>,
    /// The retention pass's state (ARCHIVE.md "Retention").
    pub(super) retention: super::retention_state::Retention,
}

/// The [`Instant`] at which the wall clock read `written_ms` (Unix ms),
/// as far as this process can tell: now less the age, the age clamped to
/// [0, a day] (a clock that went back makes it now: a renewal comes later,
/// never earlier than the schedule says).
pub(super) fn instant_of(written_ms: u64) -> Instant {
    let age = spark_log_format::system_now_ms()
        .saturating_sub(written_ms)
        .min(crate::config::LEASE_MS_MAX);
    let now = Instant::now();
    now.checked_sub(Duration::from_millis(age)).unwrap_or(now)
}

/// The shipping state right after `manifest` (a manifest of this writer's
/// epoch), checked against the local log. When the local log no longer
/// holds the bytes the manifest's last entry names because a compaction
/// after its `shipped_seq` rewrote them (a `log.compact` record between it
/// and the head), the state starts the walk at the segment after its last
/// sealed one: the first ship moves the archive to the compacted log,
/// checking the rewritten segments' old chains against it (ARCHIVE.md
/// "Compaction").
pub(super) fn state_after(
    log_dir: &Path,
    head: &Head,
    manifest: Manifest,
    max_record_bytes: u32,
) -> Result<ShipState, ArchiveStartError> {
    let diverged = |m: String| ArchiveStartError::Diverged(m);
    if manifest.shipped_seq > head.seq {
        return Err(diverged(format!(
            "the archive holds up to seq {}, the local log only up to {}: this directory is behind its archive (an older copy?). Restore a new directory (spark-replay restore --from <archive url> --data <new dir>) and start that one with --take-over to go on shipping to this prefix, or start this one on a new prefix to keep it as it is",
            manifest.shipped_seq, head.seq
        )));
    }
    let shipped_chain = manifest.shipped_chain;
    let tail = match resume_tail(log_dir, &manifest, shipped_chain) {
        Ok(tail) => tail,
        Err(e) => {
            let (from, chain) = manifest
                .segments
                .last()
                .map_or((1, [0; 32]), |s| (s.last_seq + 1, s.chain_end));
            let compacted = walk_log(
                log_dir,
                from,
                0,
                manifest.shipped_seq,
                head.seq,
                max_record_bytes,
            )
            .is_ok_and(|walk| !walk.compactions.is_empty());
            if !compacted {
                return Err(e);
            }
            Tail::fresh(from, chain)
        }
    };
    Ok(ShipState {
        number: manifest.number,
        segments: manifest.segments,
        chunk_levels: vec![0; manifest.chunks.len()],
        chunks: manifest.chunks,
        shipped_seq: manifest.shipped_seq,
        shipped_chain,
        tail,
        checkpoints: manifest.checkpoints,
        compactions: Vec::new(),
        retained_from: manifest.retained_from,
    })
}

/// What the local log holds after the shipped seq up to the head that a
/// ship acts on besides its bytes: the `media.put` ops whose blobs it
/// ships (not an erased one's: its blob is gone on purpose), and the
/// compactions (`log.compact` records) it applies first.
#[derive(Default)]
pub(super) struct Walk {
    media: Vec<MediaOp>,
    compactions: Vec<(u64, CompactionRecord)>,
}

/// Whether `bytes`, read from the shipped offset of a segment, start with
/// the frame that comes after the shipped seq there: the op after it, or
/// the seal. Not so when a compaction rewrote the bytes before the offset.
fn at_shipped_offset(bytes: &[u8], shipped_seq: u64, max_record_bytes: u32) -> bool {
    match Frames::new(bytes, 0, max_record_bytes).next() {
        Some(frame) => match frame.kind {
            FrameKind::Op => frame.seq() == shipped_seq + 1,
            FrameKind::Seal => frame.seq() == shipped_seq,
            FrameKind::CommitMark | FrameKind::UnknownMarker(_) => false,
        },
        None => false,
    }
}

/// Walks the local log from `offset` of the segment `segment_first_seq`
/// (0: its header; else the end of the shipped seq's commit mark) up to
/// `head_seq`, collecting what [`Walk`] holds for the ops after
/// `shipped_seq`. When a compaction rewrote the bytes before the offset,
/// the frame there is not the one after the shipped seq: the segment is
/// walked from its header instead.
fn walk_log(
    log_dir: &Path,
    segment_first_seq: u64,
    offset: u64,
    shipped_seq: u64,
    head_seq: u64,
    max_record_bytes: u32,
) -> Result<Walk, ShipError> {
    let mut out = Walk::default();
    let mut first_seq = segment_first_seq;
    let mut offset = offset.max(HEADER_LEN as u64);
    let mut last_seq = shipped_seq;
    let media_put = spark_core::op::OpKind::MediaPut.code();
    while last_seq < head_seq {
        let path = log_dir.join(segment_file_name(first_seq));
        let where_ = path.display().to_string();
        let bytes = read_range(&path, offset, None).map_err(|e| local(&where_, e))?;
        if offset > HEADER_LEN as u64 && !at_shipped_offset(&bytes, shipped_seq, max_record_bytes) {
            offset = HEADER_LEN as u64;
            continue;
        }
        let mut sealed = false;
        for frame in Frames::new(&bytes, 0, max_record_bytes) {
            let record = frame.record;
            if frame.kind != FrameKind::Op {
                sealed = frame.kind == FrameKind::Seal;
                if sealed {
                    break;
                }
                continue;
            }
            if record.seq > head_seq {
                return Ok(out);
            }
            last_seq = record.seq;
            if record.seq <= shipped_seq {
                continue;
            }
            if record.kind == media_put {
                let op = spark_core::op::Op::decode(&record).map_err(|e| local(&where_, e))?;
                if let (spark_core::op::OpBody::MediaPut(put), false) = (op.body, op.erased) {
                    out.media.push(MediaOp {
                        seq: op.seq,
                        media_id: put.id.to_string(),
                        sha256: put.sha256.0,
                        size_bytes: put.size_bytes,
                    });
                }
            } else if record.kind == KIND_COMPACTION {
                let compaction = CompactionRecord::decode(record.payload)
                    .map_err(|e| local(&where_, format!("seq {}: {e}", record.seq)))?;
                out.compactions.push((record.seq, compaction));
            }
        }
        if !sealed {
            break;
        }
        first_seq = last_seq + 1;
        offset = HEADER_LEN as u64;
    }
    Ok(out)
}

/// Where shipping goes on after `manifest`: after its last chunk (whose
/// bytes the local log must still hold, giving the same chain), or at the
/// segment after its last sealed one (which the local log must hold
/// byte for byte: length and BLAKE3). Either way a manifest whose last
/// entry is not this log's (another history's, under this writer's
/// epoch) is refused.
fn resume_tail(
    log_dir: &Path,
    manifest: &Manifest,
    shipped_chain: ChainValue,
) -> Result<Tail, ArchiveStartError> {
    let diverged = |m: String| ArchiveStartError::Diverged(m);
    Ok(match (manifest.chunks.last(), manifest.segments.last()) {
        (Some(chunk), _) => {
            let end = chunk.offset + chunk.bytes - CHUNK_HEADER_LEN as u64;
            let path = log_dir.join(segment_file_name(chunk.segment_first_seq));
            let bytes = read_range(&path, 0, Some(end))
                .map_err(|e| diverged(format!("{}: {e}", path.display())))?;
            if (bytes.len() as u64) < end || bytes.len() < HEADER_LEN {
                return Err(diverged(format!(
                    "{} is shorter than what the archive holds of it",
                    path.display()
                )));
            }
            let chain_start: ChainValue = bytes
                [HEADER_CHAIN_START_OFFSET..HEADER_CHAIN_START_OFFSET + 32]
                .try_into()
                .expect("32 bytes");
            let mut hasher = chain_hasher(&chain_start);
            hasher.update(&bytes);
            let chain: ChainValue = hasher.clone().finalize().into();
            if chain != shipped_chain {
                return Err(diverged(format!(
                    "the local {} differs from the archive up to seq {} (chain {} there, {} archived)",
                    path.display(),
                    manifest.shipped_seq,
                    chain_hex(&chain),
                    chain_hex(&manifest.shipped_chain)
                )));
            }
            Tail {
                segment_first_seq: chunk.segment_first_seq,
                offset: end,
                chain_start,
                hasher,
            }
        }
        (None, Some(segment)) => {
            let path = log_dir.join(segment_file_name(segment.first_seq));
            let bytes = read_range(&path, 0, Some(segment.bytes))
                .map_err(|e| diverged(format!("{}: {e}", path.display())))?;
            let hash = blake3::hash(&bytes);
            if bytes.len() as u64 != segment.bytes || *hash.as_bytes() != segment.blake3 {
                return Err(diverged(format!(
                    "the local {} differs from the archive's {} up to seq {} (its first {} bytes \
                     have BLAKE3 {}, {} archived)",
                    path.display(),
                    segment.key,
                    segment.last_seq,
                    segment.bytes,
                    hash.to_hex(),
                    chain_hex(&segment.blake3)
                )));
            }
            Tail::fresh(segment.last_seq + 1, shipped_chain)
        }
        (None, None) => Tail::fresh(1, [0; 32]),
    })
}

/// Observes `to - from` as stage `stage` of a ship
/// (`spark_archive_ship_seconds`).
fn stage_seconds(stage: &str, from: Instant, to: Instant) {
    metrics::get()
        .ship_seconds
        .get_or_create(&crate::metrics::label("stage", stage))
        .observe((to - from).as_secs_f64());
}

/// Counts one object of `kind` stored (`spark_archive_objects_put_total`)
/// and its `bytes` (`spark_archive_bytes_put_total`).
pub(super) fn count_put(kind: &str, bytes: u64) {
    let m = metrics::get();
    let label = crate::metrics::label("kind", kind);
    m.objects_put.get_or_create(&label).inc();
    m.bytes_put.get_or_create(&label).inc_by(bytes);
}

impl Shipper {
    pub(super) async fn run(
        mut self,
        interval: Duration,
        mut stopped: tokio::sync::watch::Receiver<bool>,
    ) {
        let gate = self.engine.archive_gate().cloned();
        let mut backoff_max = if gate.is_some() {
            SYNC_BACKOFF_MAX
        } else {
            BACKOFF_MAX
        };
        if let Some(lease) = self.lease {
            // A failing renewal is tried again well within the lease.
            backoff_max = backoff_max.min(lease / 3);
        }
        let mut wait = interval;
        let mut healthy = true;
        loop {
            // In sync mode a waiting write starts a ship at once, unless the
            // last one failed (then the backoff paces the tries).
            let wanted = async {
                match &gate {
                    Some(gate) if healthy => gate.wanted().await,
                    _ => std::future::pending().await,
                }
            };
            // With a lease, wake up when the renewal is due if that comes
            // first (the backoff paces a failing one).
            let sleep = match self.renewal_due_in() {
                Some(due_in) if healthy => wait.min(due_in),
                _ => wait,
            };
            // In async mode, while healthy, the wait puts blobs ahead (and
            // ends on time: the puts in flight then are the ship's).
            let ahead = healthy && gate.is_none();
            let stopping = tokio::select! {
                () = tokio::time::sleep(sleep) => false,
                () = self.put_blobs_ahead(), if ahead => false,
                () = wanted => false,
                _ = stopped.changed() => true,
            };
            if stopping {
                if let Some(put) = self.checkpoint_put.take() {
                    // Derived state: an unfinished put is shipped again
                    // after the restart.
                    put.abort();
                }
                let _ = tokio::time::timeout(FINAL_SHIP_TIMEOUT, self.tick()).await;
                if let Some(gate) = &gate {
                    gate.close(gate::shutting_down());
                }
                return;
            }
            let started = Instant::now();
            match self.tick().await {
                Ok(()) => {
                    // The next ship starts an interval after this one
                    // started, not after it ended: a slow ship (puts
                    // taking hundreds of ms under load) would otherwise
                    // add its own time to the async window twice.
                    wait = interval.saturating_sub(started.elapsed());
                    healthy = true;
                }
                Err(ShipError::Fenced(reason)) => {
                    self.fence(reason.clone());
                    if let Some(gate) = &gate {
                        // Writes waiting for the archive are not
                        // acknowledged: they answer 503 fenced too.
                        gate.close(crate::engine::EngineError::Fenced(reason));
                    }
                    return;
                }
                Err(_) => {
                    wait = (wait * 2).clamp(interval, backoff_max.max(interval));
                    healthy = false;
                }
            }
        }
    }

    /// Another engine took the prefix over: from now on this engine
    /// acknowledges nothing (`503 fenced`, ARCHIVE.md "Epoch"), and this
    /// shipper stops.
    fn fence(&self, reason: String) {
        tracing::error!(
            epoch = self.status.epoch,
            %reason,
            "archive: another engine took the prefix over; this engine is fenced and \
             acknowledges no write any more (503 fenced)"
        );
        self.engine.fence(reason.clone());
        *self.status.fenced_at.lock() = Some(Instant::now());
        *self.status.failing.lock() = Some(format!("fenced: {reason}"));
        metrics::get().fenced.set(1);
    }

    /// How long until the lease's renewal is due (zero: due now), `None`
    /// with leases off.
    fn renewal_due_in(&self) -> Option<Duration> {
        let lease = self.lease?;
        if self.advertised_lease_ms != lease.as_millis() as u64 {
            return Some(Duration::ZERO);
        }
        Some((self.renewed_at + lease / 3).saturating_duration_since(Instant::now()))
    }

    /// Whether a renewal is due now: `lease / 3` passed since the last
    /// manifest, or the archive advertises another lease for this writer
    /// than its own (with leases off, one manifest after a start that had a
    /// lease, so that no lease nobody renews is left advertised).
    fn renewal_due(&self) -> bool {
        self.renewal_due_in().is_some_and(|d| d.is_zero())
            || self.advertised_lease_ms != self.lease.map_or(0, |l| l.as_millis() as u64)
    }

    /// One look at the head: ships if it moved, then renews the lease if no
    /// manifest was stored for `lease / 3` (ARCHIVE.md "Lease"), and
    /// records the outcome. With leases off and the head still, no request.
    async fn tick(&mut self) -> Result<(), ShipError> {
        self.checkpoints_tick();
        let head = self.engine.head();
        let moved = head.seq > self.state.shipped_seq;
        let list_checkpoint = self
            .checkpoint_stored
            .as_ref()
            .is_some_and(|c| c.seq <= self.state.shipped_seq);
        if !moved
            && !self.renewal_due()
            && !list_checkpoint
            && !self.retention.due(self.state.number)
        {
            return Ok(());
        }
        let mut result = if moved {
            self.ship(&head).await
        } else {
            Ok(())
        };
        // A stored checkpoint no manifest lists yet, and no ship stored
        // a manifest (idle): one manifest of the same entries lists it.
        let shipped = self.state.shipped_seq;
        if result.is_ok()
            && self
                .checkpoint_stored
                .as_ref()
                .is_some_and(|c| c.seq <= shipped)
        {
            let next = self.state.clone();
            result = self.ship_manifest_as("checkpoint", next).await;
        }
        // Also after a failed ship (not a fence): a writer that is alive
        // and reaches the store keeps its lease while a local fault (an
        // unreadable blob, say) holds its ship back, so that no standby
        // takes over from an archive that lacks writes this one still has.
        if !matches!(result, Err(ShipError::Fenced(_))) && self.renewal_due() {
            let renewed = self.renew().await;
            result = match (result, renewed) {
                (_, Err(fenced @ ShipError::Fenced(_))) => Err(fenced),
                (Err(e), _) => Err(e),
                (Ok(()), renewed) => renewed,
            };
        }
        // After what this tick had to store: the retention pass (at most
        // once per its interval; a failure in it is a WARN, a fence ends
        // shipping as any).
        if result.is_ok() {
            result = self.retention_tick().await;
        }
        match &result {
            Ok(()) => {
                *self.status.failing.lock() = None;
                self.status.shipped(&self.state);
                let shipped = self.state.shipped_seq;
                self.blobs_ahead.lock().retain(|_, seq| *seq > shipped);
                if let Some(gate) = self.engine.archive_gate() {
                    // `ship` moves the state only once a manifest naming
                    // it is stored: the commit point (ARCHIVE.md).
                    gate.archived(self.state.shipped_seq);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "archive: ship failed; retrying with backoff");
                metrics::get()
                    .failures
                    .get_or_create(&crate::metrics::label("kind", e.kind()))
                    .inc();
                *self.status.failing.lock() = Some(e.to_string());
            }
        }
        result
    }

    /// Renews the lease: stores the next manifest with the entries of the
    /// last one (ARCHIVE.md "Lease"), create-only like every manifest, so
    /// that a newer epoch's manifest under its number fences this writer
    /// as a ship's would.
    async fn renew(&mut self) -> Result<(), ShipError> {
        let next = self.state.clone();
        self.ship_manifest_as("renewal", next).await
    }

    async fn put(&self, kind: &str, key: &str, bytes: Vec<u8>) -> Result<(), ShipError> {
        let len = bytes.len() as u64;
        if self.store.put_create(key, Bytes::from(bytes)).await? == Put::Created {
            count_put(kind, len);
        }
        Ok(())
    }

    /// Ships everything acknowledged up to `head`: the fencing HEAD first
    /// (nothing is stored before it), then the blobs and the log (sealed
    /// segments, one chunk) at the same time, then, once both are stored,
    /// the manifest naming them. The state moves only once the manifest is
    /// stored. Each stage's time goes to `spark_archive_ship_seconds`.
    async fn ship(&mut self, head: &Head) -> Result<(), ShipError> {
        let started = Instant::now();
        self.check_not_taken_over().await?;
        let head_done = Instant::now();
        // Blobs and log objects only need to be stored before the manifest
        // that names them (the commit point): a reader never sees a log
        // object no manifest names. One after the other, a ship's blob puts
        // added their whole time to the async window.
        let walk = self.walk(head)?;
        let media = self.blobs_to_ship(walk.media);
        let compactions = walk.compactions;
        let ((blobs, blobs_done), (log, log_done)) = tokio::join!(
            async { (self.ship_blobs(media).await, Instant::now()) },
            async { (self.ship_log(head, &compactions).await, Instant::now()) },
        );
        blobs?;
        let next = log?;
        if next.shipped_seq == self.state.shipped_seq {
            return Ok(());
        }
        let manifest_started = Instant::now();
        self.ship_manifest(next).await?;
        let done = Instant::now();
        for (stage, from, to) in [
            ("head", started, head_done),
            ("blobs", head_done, blobs_done),
            ("log", head_done, log_done),
            ("manifest", manifest_started, done),
            ("ship", started, done),
        ] {
            stage_seconds(stage, from, to);
        }
        tracing::debug!(
            head_ms = (head_done - started).as_millis() as u64,
            blobs_ms = (blobs_done - head_done).as_millis() as u64,
            log_ms = (log_done - head_done).as_millis() as u64,
            manifest_ms = (done - manifest_started).as_millis() as u64,
            ship_ms = (done - started).as_millis() as u64,
            seq = self.state.shipped_seq,
            "archive: shipped"
        );
        Ok(())
    }

    /// One HEAD before each ship (never when idle): once another engine
    /// took the next epoch, this one is fenced before it stores anything
    /// more, so a take-over's manifest put races at most the one manifest
    /// this writer has in flight (ARCHIVE.md "Epoch").
    pub(super) async fn check_not_taken_over(&self) -> Result<(), ShipError> {
        let next = epoch_key(self.store.prefix(), self.status.epoch + 1);
        if self.store.exists(&next).await? {
            return Err(ShipError::Fenced(format!(
                "epoch {} was taken by another engine ({next})",
                self.status.epoch + 1
            )));
        }
        Ok(())
    }

    /// Ships the blobs of `ops` (the media ops after the shipped seq, up to
    /// the head: [`Shipper::blobs_to_ship`]), [`BLOB_PUTS_AT_ONCE`] at a
    /// time (beside the log's puts, all before the manifest): each checked
    /// first; one lost locally is recorded missing instead (ARCHIVE.md
    /// "Missing blob").
    async fn ship_blobs(&self, ops: Vec<MediaOp>) -> Result<(), ShipError> {
        futures_util::stream::iter(ops)
            .map(|op| async move { self.ship_blob(op).await.map(|_| ()) })
            .buffer_unordered(BLOB_PUTS_AT_ONCE)
            .try_collect::<()>()
            .await
    }

    /// Of the `media.put` ops `ops`, the ones whose blob is not put yet (by
    /// [`Shipper::put_blobs_ahead`]), one per blob (the first op naming it).
    fn blobs_to_ship(&self, mut ops: Vec<MediaOp>) -> Vec<MediaOp> {
        let ahead = self.blobs_ahead.lock();
        ops.retain(|op| !ahead.contains_key(&op.sha256));
        drop(ahead);
        ops.sort_unstable_by_key(|op| (op.sha256, op.seq));
        ops.dedup_by_key(|op| op.sha256);
        ops
    }

    /// `async` mode, between ships (never returns: the wait for the next
    /// ship drops it): every [`BLOBS_AHEAD_EVERY`], puts the blobs of the
    /// ops committed since the shipped seq that are not put yet, as a ship
    /// would ([`Shipper::ship_blob`], [`BLOB_PUTS_AT_ONCE`] at a time), each
    /// round after the same fencing HEAD a ship starts with (a round with
    /// nothing to put makes no request). Only the manifest makes an object
    /// part of the archive, so a blob put early is stored before the
    /// manifest naming its op, as always; the ship then skips it. A failure
    /// here is left to the ship, which puts what is missing and reports it.
    async fn put_blobs_ahead(&self) {
        let mut round = Instant::now();
        loop {
            // Rounds start BLOBS_AHEAD_EVERY apart, or at once after a
            // longer one.
            tokio::time::sleep_until((round + BLOBS_AHEAD_EVERY).into()).await;
            round = Instant::now();
            let head = self.engine.head();
            let Ok(walk) = self.walk(&head) else {
                continue;
            };
            let ops = self.blobs_to_ship(walk.media);
            if ops.is_empty() || self.check_not_taken_over().await.is_err() {
                continue;
            }
            futures_util::stream::iter(ops)
                .for_each_concurrent(BLOB_PUTS_AT_ONCE, |op| async move {
                    let (sha256, seq) = (op.sha256, op.seq);
                    // A blob recorded missing is left to the ship: its local
                    // copy may be put again (by a later op) before then.
                    if let Ok(true) = self.ship_blob(op).await {
                        self.blobs_ahead.lock().insert(sha256, seq);
                    }
                })
                .await;
        }
    }

    /// The media ops and compactions after the shipped seq up to `head`
    /// ([`walk_log`]), read from the local log where shipping stands (not
    /// the whole mirror).
    fn walk(&self, head: &Head) -> Result<Walk, ShipError> {
        let tail = &self.state.tail;
        walk_log(
            &self.log_dir,
            tail.segment_first_seq,
            tail.offset,
            self.state.shipped_seq,
            head.seq,
            self.max_record_bytes,
        )
    }

    /// Puts one blob once its local copy is checked against its op; a lost
    /// one (missing, or other bytes) is recorded missing unless the archive
    /// already holds it. `Ok(true)`: the archive holds the blob; `Ok(false)`:
    /// its missing-blob marker instead.
    async fn ship_blob(&self, op: MediaOp) -> Result<bool, ShipError> {
        let path = spark_core::blob::blob_path(&self.blobs_dir, &op.sha256);
        let (sha256, size_bytes) = (op.sha256, op.size_bytes);
        let read_path = path.clone();
        let checked =
            tokio::task::spawn_blocking(move || check_local_blob(&read_path, &sha256, size_bytes))
                .await
                .map_err(|e| ShipError::Blob {
                    path: path.display().to_string(),
                    message: e.to_string(),
                })?;
        let key = blob_key(self.store.prefix(), &op.sha256);
        match checked {
            LocalBlob::Good(bytes) => self.put("blob", &key, bytes).await.map(|()| true),
            LocalBlob::Unreadable(message) => Err(ShipError::Blob {
                path: path.display().to_string(),
                message,
            }),
            LocalBlob::Lost(reason) => {
                if self.store.exists(&key).await? {
                    return Ok(true);
                }
                let marker = MissingBlobDoc {
                    sha256: chain_hex(&op.sha256),
                    seq: op.seq,
                    media_id: op.media_id.clone(),
                    size_bytes: op.size_bytes,
                    reason: reason.clone(),
                    epoch: self.status.epoch,
                    written_ms: spark_log_format::system_now_ms(),
                };
                let marker_key = missing_key(self.store.prefix(), &op.sha256);
                match self.put("missing", &marker_key, marker.encode()).await {
                    // An earlier try's marker (its answer lost) says the same.
                    Ok(()) | Err(ShipError::Store(StoreError::Conflict { .. })) => {}
                    Err(e) => return Err(e),
                }
                self.status.record_missing(&op, &reason);
                Ok(false)
            }
        }
    }

    /// Ships the log from the shipped state up to `head`: first, when
    /// `compactions` (the `log.compact` records after the shipped seq) is
    /// not empty, the archive's segments they rewrote ([`Shipper::rebase`]);
    /// then the sealed segments in between, then at most one chunk.
    /// Returns the state these puts make, not yet named by a manifest.
    async fn ship_log(
        &self,
        head: &Head,
        compactions: &[(u64, CompactionRecord)],
    ) -> Result<ShipState, ShipError> {
        let mut next = self.state.clone();
        // First seq of a segment -> the latest compaction of this ship that
        // lists it: its key carries that compaction's seq.
        let mut rewritten = std::collections::HashMap::new();
        if !compactions.is_empty() {
            self.rebase(&mut next, compactions, &mut rewritten).await?;
        }
        loop {
            let tail = &mut next.tail;
            let name = segment_file_name(tail.segment_first_seq);
            let path = self.log_dir.join(&name);
            let where_ = path.display().to_string();
            let bytes = read_range(&path, tail.offset, None).map_err(|e| local(&where_, e))?;
            let start = if tail.offset == 0 {
                let header_chain = bytes.get(HEADER_CHAIN_START_OFFSET..HEADER_LEN);
                if header_chain != Some(&tail.chain_start[..]) {
                    return Err(local(
                        &where_,
                        "its chain_start is not the archived chain before it",
                    ));
                }
                HEADER_LEN
            } else {
                0
            };
            let in_head = head.segment == name;
            let target = if in_head { head.seq } else { u64::MAX };
            let end = acknowledged_end(
                &bytes,
                start,
                next.shipped_seq,
                target,
                self.max_record_bytes,
            );
            let body = &bytes[..end.offset];
            if end.sealed {
                let compaction = rewritten.get(&next.tail.segment_first_seq).copied();
                self.ship_segment(&mut next, &path, &where_, body, end.last_seq, compaction)
                    .await?;
                if next.shipped_seq >= head.seq {
                    break;
                }
                continue;
            }
            if end.last_seq <= next.shipped_seq {
                if in_head {
                    break;
                }
                return Err(local(
                    &where_,
                    "ends without a seal, yet the head is in a later segment",
                ));
            }
            let head_chain = (in_head && end.last_seq == head.seq).then_some(&head.chain);
            self.ship_chunk(&mut next, &where_, body, end.last_seq, head_chain)
                .await?;
            if self.engine.archive_gate().is_some() {
                self.merge_chunks(&mut next, &path, &where_).await?;
            }
            break;
        }
        Ok(next)
    }

    /// Moves `next` (the archive's state) to the local log as the
    /// compactions `compactions` (record seq and payload, in log order)
    /// left it (ARCHIVE.md "Compaction"): each listed segment the archive
    /// holds sealed must end with the listed old seal (after the
    /// compactions before it; else the archive holds another history and
    /// nothing is guessed); it is put again from the local file (its
    /// acknowledged bytes, checked against the new seal) under the key of
    /// the last compaction listing it, and its entry replaced; the
    /// checkpoints listed at or after the first rewritten segment are
    /// dropped (their chain value is gone), the chunks too, and the tail
    /// starts over at the segment after the last sealed one, from offset 0.
    /// `rewritten` gets, for every listed segment, the last compaction
    /// listing it (the ship's later segments are keyed by it). The
    /// compactions go to `next.compactions`, for the manifest.
    async fn rebase(
        &self,
        next: &mut ShipState,
        compactions: &[(u64, CompactionRecord)],
        rewritten: &mut std::collections::HashMap<u64, u64>,
    ) -> Result<(), ShipError> {
        let archived_end = next.segments.last().map_or(0, |s| s.last_seq);
        let mut stale_from = u64::MAX;
        for (record_seq, record) in compactions {
            for listed in &record.segments {
                stale_from = stale_from.min(listed.first_seq);
                rewritten.insert(listed.first_seq, *record_seq);
                let entry = next
                    .segments
                    .iter_mut()
                    .find(|e| e.first_seq == listed.first_seq);
                let found = match entry {
                    Some(entry)
                        if entry.last_seq == listed.last_seq
                            && entry.chain_end == listed.old_seal =>
                    {
                        entry.chain_end = listed.new_seal;
                        continue;
                    }
                    None if listed.first_seq > archived_end => continue,
                    Some(entry) => format!(
                        "the archive's {} holds seqs {}..={} ending with chain {}",
                        entry.key,
                        entry.first_seq,
                        entry.last_seq,
                        chain_hex(&entry.chain_end)
                    ),
                    None => format!(
                        "the archive holds no segment starting there (its sealed segments end at seq {archived_end})"
                    ),
                };
                return Err(ShipError::Local(format!(
                    "the compaction at seq {record_seq} rewrote segment {}..={} whose seal was {}, \
                     but {found}: the archive is not this log's history; nothing more is shipped \
                     until that is settled",
                    listed.first_seq,
                    listed.last_seq,
                    chain_hex(&listed.old_seal)
                )));
            }
            next.compactions
                .push(CompactionEntry::of_record(*record_seq, record));
        }
        for i in 0..next.segments.len() {
            let entry = &next.segments[i];
            let Some(&record_seq) = rewritten.get(&entry.first_seq) else {
                continue;
            };
            let chain_start = match i {
                0 => [0; 32],
                _ => next.segments[i - 1].chain_end,
            };
            let path = self.log_dir.join(segment_file_name(entry.first_seq));
            let where_ = path.display().to_string();
            let bytes = read_range(&path, 0, None).map_err(|e| local(&where_, e))?;
            if bytes.get(HEADER_CHAIN_START_OFFSET..HEADER_LEN) != Some(&chain_start[..]) {
                return Err(local(
                    &where_,
                    "its chain_start is not the compacted chain before it",
                ));
            }
            let end = acknowledged_end(
                &bytes,
                HEADER_LEN,
                entry.first_seq - 1,
                u64::MAX,
                self.max_record_bytes,
            );
            if !end.sealed || end.last_seq != entry.last_seq {
                return Err(local(
                    &where_,
                    format!(
                        "it does not end with the seal of seq {} its compaction lists",
                        entry.last_seq
                    ),
                ));
            }
            let mut whole = bytes;
            whole.truncate(end.offset);
            let seal_at = whole.len() - SEAL_RECORD_BYTES;
            let sealed: ChainValue = whole[whole.len() - SEAL_PAYLOAD_LEN..]
                .try_into()
                .expect("32 bytes");
            if sealed != entry.chain_end || chain_value(&chain_start, &whole[..seal_at]) != sealed {
                return Err(local(
                    &where_,
                    "its seal is not the new seal its compaction lists, or not its chain",
                ));
            }
            let key = compacted_segment_key(
                self.store.prefix(),
                entry.first_seq,
                self.status.epoch,
                record_seq,
            );
            let replaced = SegmentEntry {
                key: key.clone(),
                first_seq: entry.first_seq,
                last_seq: entry.last_seq,
                bytes: whole.len() as u64,
                blake3: *blake3::hash(&whole).as_bytes(),
                chain_end: sealed,
            };
            self.put("segment", &key, whole).await?;
            next.segments[i] = replaced;
        }
        next.checkpoints.retain(|c| c.seq < stale_from);
        next.chunks.clear();
        next.chunk_levels.clear();
        let (seq, chain) = next
            .segments
            .last()
            .map_or((0, [0; 32]), |s| (s.last_seq, s.chain_end));
        next.shipped_seq = seq;
        next.shipped_chain = chain;
        next.tail = Tail::fresh(seq + 1, chain);
        Ok(())
    }

    /// Ships the tail's segment whole once it is sealed: the bytes already
    /// shipped as chunks and `body` (the rest, up to its seal, ending at
    /// `last_seq`), checked against its chain, under the key of
    /// `compaction` (the seq of the latest compaction of this ship that
    /// rewrote it, if one did). Moves `next` past it.
    async fn ship_segment(
        &self,
        next: &mut ShipState,
        path: &Path,
        where_: &str,
        body: &[u8],
        last_seq: u64,
        compaction: Option<u64>,
    ) -> Result<(), ShipError> {
        let tail = &next.tail;
        let mut whole = if tail.offset == 0 {
            Vec::new()
        } else {
            read_range(path, 0, Some(tail.offset)).map_err(|e| local(where_, e))?
        };
        whole.extend_from_slice(body);
        let seal_at = whole.len() - SEAL_RECORD_BYTES;
        let chain_end: ChainValue = whole[whole.len() - SEAL_PAYLOAD_LEN..]
            .try_into()
            .expect("32 bytes");
        if chain_value(&tail.chain_start, &whole[..seal_at]) != chain_end {
            return Err(local(where_, "its seal does not match its chain"));
        }
        let (prefix, epoch) = (self.store.prefix(), self.status.epoch);
        let key = match compaction {
            Some(record_seq) => {
                compacted_segment_key(prefix, tail.segment_first_seq, epoch, record_seq)
            }
            None => segment_key(prefix, tail.segment_first_seq, epoch),
        };
        let entry = SegmentEntry {
            key: key.clone(),
            first_seq: tail.segment_first_seq,
            last_seq,
            bytes: whole.len() as u64,
            blake3: *blake3::hash(&whole).as_bytes(),
            chain_end,
        };
        self.put("segment", &key, whole).await?;
        next.segments.push(entry);
        next.chunks.clear();
        next.chunk_levels.clear();
        next.shipped_seq = last_seq;
        next.shipped_chain = chain_end;
        next.tail = Tail::fresh(last_seq + 1, chain_end);
        Ok(())
    }

    /// Ships `body` (the tail's unsealed bytes up to `last_seq`) as one
    /// chunk; `head_chain` is the head's chain when `last_seq` is the head,
    /// which the chain after `body` must be. Moves `next` past it.
    async fn ship_chunk(
        &self,
        next: &mut ShipState,
        where_: &str,
        body: &[u8],
        last_seq: u64,
        head_chain: Option<&ChainValue>,
    ) -> Result<(), ShipError> {
        let tail = &mut next.tail;
        tail.hasher.update(body);
        let chain_after: ChainValue = tail.hasher.clone().finalize().into();
        if head_chain.is_some_and(|chain| chain_after != *chain) {
            return Err(local(where_, "its bytes do not give the head's chain"));
        }
        let header = ChunkHeader {
            epoch: self.status.epoch,
            first_seq: next.shipped_seq + 1,
            last_seq,
            segment_first_seq: tail.segment_first_seq,
            offset: tail.offset,
            body_bytes: body.len() as u64,
            body_crc: crc32fast::hash(body),
            chain_before: next.shipped_chain,
            chain_after,
        };
        let (key, object, entry) = self.chunk_object(&header, body);
        next.chunks.push(entry);
        next.chunk_levels.push(0);
        tail.offset += body.len() as u64;
        next.shipped_seq = last_seq;
        next.shipped_chain = chain_after;
        self.put("chunk", &key, object).await
    }

    /// The chunk object of `header` and `body`, its key and its manifest
    /// entry.
    fn chunk_object(&self, header: &ChunkHeader, body: &[u8]) -> (String, Vec<u8>, ChunkEntry) {
        let object = header.encode(body);
        let key = chunk_key(
            self.store.prefix(),
            header.first_seq,
            header.last_seq,
            header.epoch,
        );
        let entry = ChunkEntry {
            key: key.clone(),
            epoch: header.epoch,
            segment_first_seq: header.segment_first_seq,
            first_seq: header.first_seq,
            last_seq: header.last_seq,
            offset: header.offset,
            bytes: object.len() as u64,
            blake3: *blake3::hash(&object).as_bytes(),
            chain_after: header.chain_after,
        };
        (key, object, entry)
    }

    /// `sync` mode: while the last [`MERGE_FAN_IN`] chunks of `next` are of
    /// one level (and this epoch's), puts one chunk holding their bytes
    /// (read again from the local segment `path`, each piece checked
    /// against its entry's BLAKE3) and lists it in their place, one level
    /// up. The merged chunk is what a reader checks like any other.
    async fn merge_chunks(
        &self,
        next: &mut ShipState,
        path: &Path,
        where_: &str,
    ) -> Result<(), ShipError> {
        loop {
            let n = next.chunks.len();
            if n < MERGE_FAN_IN {
                return Ok(());
            }
            let from = n - MERGE_FAN_IN;
            let level = next.chunk_levels[n - 1];
            let run = &next.chunks[from..];
            if next.chunk_levels[from..].iter().any(|l| *l != level)
                || run.iter().any(|c| c.epoch != self.status.epoch)
            {
                return Ok(());
            }
            let start = run[0].offset;
            let chain_before = match from {
                0 if start == 0 => next.tail.chain_start,
                0 => return Ok(()),
                _ => next.chunks[from - 1].chain_after,
            };
            let last = &run[MERGE_FAN_IN - 1];
            let end = last.offset + last.bytes - CHUNK_HEADER_LEN as u64;
            let body = read_range(path, start, Some(end)).map_err(|e| local(where_, e))?;
            if body.len() as u64 != end - start {
                return Err(local(where_, "shorter than the chunks shipped from it"));
            }
            // Each piece is the bytes shipped before: same object, same hash.
            let mut before = chain_before;
            for entry in run {
                let piece_end = entry.offset + entry.bytes - CHUNK_HEADER_LEN as u64;
                let piece = &body[(entry.offset - start) as usize..(piece_end - start) as usize];
                let after = entry.chain_after;
                let shipped = ChunkHeader {
                    epoch: entry.epoch,
                    first_seq: entry.first_seq,
                    last_seq: entry.last_seq,
                    segment_first_seq: entry.segment_first_seq,
                    offset: entry.offset,
                    body_bytes: piece.len() as u64,
                    body_crc: crc32fast::hash(piece),
                    chain_before: before,
                    chain_after: after,
                };
                if *blake3::hash(&shipped.encode(piece)).as_bytes() != entry.blake3 {
                    return Err(local(
                        where_,
                        format!("its bytes differ from the shipped chunk {}", entry.key),
                    ));
                }
                before = after;
            }
            let header = ChunkHeader {
                epoch: self.status.epoch,
                first_seq: run[0].first_seq,
                last_seq: last.last_seq,
                segment_first_seq: last.segment_first_seq,
                offset: start,
                body_bytes: body.len() as u64,
                body_crc: crc32fast::hash(&body),
                chain_before,
                chain_after: before,
            };
            let (key, object, entry) = self.chunk_object(&header, &body);
            self.put("chunk", &key, object).await?;
            next.chunks.truncate(from);
            next.chunk_levels.truncate(from);
            next.chunks.push(entry);
            next.chunk_levels.push(level.saturating_add(1));
        }
    }

    /// Stores the manifest naming `next` and moves the state to it. A
    /// manifest already at that number is an earlier try of this writer
    /// whose answer was lost (go on from it), or another writer's (fenced or
    /// a conflict).
    async fn ship_manifest(&mut self, next: ShipState) -> Result<(), ShipError> {
        self.ship_manifest_as("manifest", next).await
    }

    /// [`Shipper::ship_manifest`], its put counted as `kind` (`manifest`,
    /// or `renewal` for a lease renewal). Every stored manifest renews the
    /// lease: it carries this writer's `lease_ms`, and the renewal clock
    /// restarts from just before its put.
    pub(super) async fn ship_manifest_as(
        &mut self,
        kind: &str,
        mut next: ShipState,
    ) -> Result<(), ShipError> {
        next.number += 1;
        let stale_from = next
            .compactions
            .iter()
            .flat_map(|c| &c.segments)
            .map(|s| s.first_seq)
            .min();
        if let Some(from) = stale_from {
            // A checkpoint at or after a rewritten segment holds the old
            // chain (and maybe erased content): never listed.
            if self
                .checkpoint_stored
                .as_ref()
                .is_some_and(|c| c.seq >= from)
            {
                self.checkpoint_stored = None;
            }
            if let Some(put) = self.checkpoint_put.take() {
                put.abort();
            }
        }
        if let Some(stored) = self
            .checkpoint_stored
            .clone()
            .filter(|c| c.seq <= next.shipped_seq && !next.checkpoints.contains(c))
        {
            next.checkpoints.push(stored);
            let over = next.checkpoints.len().saturating_sub(CHECKPOINTS_LISTED);
            next.checkpoints.drain(..over);
        }
        let lease_ms = self.lease.map_or(0, |l| l.as_millis() as u64);
        let started = Instant::now();
        let manifest = self.manifest_of(&next, spark_log_format::system_now_ms());
        let key = manifest_key(self.store.prefix(), next.number);
        match self.put(kind, &key, manifest.encode()).await {
            Ok(()) => {}
            Err(ShipError::Store(StoreError::Conflict { .. })) => {
                let stored = self.store.manifest(next.number).await?;
                if stored.epoch > self.status.epoch {
                    return Err(ShipError::Fenced(format!(
                        "manifest {} was written by epoch {}",
                        stored.number, stored.epoch
                    )));
                }
                // A renewal repeats the last state: any manifest of this
                // epoch under its number is one of this writer's whose
                // answer was lost (a ship's or a renewal's). So does a
                // manifest that only lists a checkpoint.
                let renewal = kind == "renewal" || kind == "checkpoint" || kind == "retention";
                if stored.epoch == self.status.epoch
                    && (renewal || stored.shipped_seq <= next.shipped_seq)
                {
                    // An earlier try of this writer landed, its answer lost:
                    // go on from what it says (a newer epoch's manifest
                    // after it is found at the next put), once it is
                    // known to be this writer's: it extends the manifest
                    // the state is at, and its last entry is the local
                    // log's (a well-formed manifest of another history
                    // under this epoch number is never adopted).
                    let (number, epoch) = (stored.number, self.status.epoch);
                    let foreign = |why: String| {
                        ShipError::Foreign(format!(
                            "manifest {number} ({key}) carries this writer's epoch {epoch} but is not one this \
                             writer stored: {why}; the archive's history forks there, and this \
                             writer ships nothing more to the prefix until it is removed"
                        ))
                    };
                    let current = self.manifest_of(&self.state, stored.written_ms);
                    extends(&current, &stored).map_err(|fork| {
                        foreign(format!(
                            "it does not extend manifest {}: {fork}",
                            current.number
                        ))
                    })?;
                    let head_now = self.engine.head();
                    self.renewed_at = instant_of(stored.written_ms);
                    self.advertised_lease_ms = stored.lease_ms;
                    self.state =
                        state_after(&self.log_dir, &head_now, stored, self.max_record_bytes)
                            .map_err(|e| foreign(e.to_string()))?;
                    self.checkpoint_listed();
                    return Ok(());
                }
                return Err(ShipError::Store(StoreError::Conflict { key }));
            }
            Err(e) => return Err(e),
        }
        self.state = next;
        self.state.compactions.clear();
        self.renewed_at = started;
        self.advertised_lease_ms = lease_ms;
        self.checkpoint_listed();
        Ok(())
    }

    /// The manifest naming `state` (its number, this writer's epoch and
    /// lease), written at `written_ms`.
    fn manifest_of(&self, state: &ShipState, written_ms: u64) -> Manifest {
        Manifest {
            number: state.number,
            epoch: self.status.epoch,
            written_ms,
            shipped_seq: state.shipped_seq,
            shipped_chain: state.shipped_chain,
            segments: state.segments.clone(),
            chunks: state.chunks.clone(),
            lease_ms: self.lease.map_or(0, |l| l.as_millis() as u64),
            checkpoints: state.checkpoints.clone(),
            compactions: state.compactions.clone(),
            retained_from: state.retained_from,
        }
    }

    /// Forgets the stored checkpoint once the state's manifest lists it.
    fn checkpoint_listed(&mut self) {
        if self
            .checkpoint_stored
            .as_ref()
            .is_some_and(|c| self.state.checkpoints.contains(c))
        {
            self.checkpoint_stored = None;
        }
    }

    /// ARCHIVE.md "Checkpoint": collects a finished checkpoint put (stored:
    /// the next manifest lists it; failed: a WARN, tried again later), and
    /// at most every [`CHECKPOINT_LOOK_INTERVAL`], with no put in flight
    /// and none waiting to be listed, starts the put of the newest local
    /// checkpoint that the archive's log covers (`seq` at most the shipped
    /// seq) and is newer than the newest listed. Never fails the ship: a
    /// checkpoint is derived state.
    fn checkpoints_tick(&mut self) {
        if let Some(put) = self.checkpoint_put.take_if(|p| p.is_finished()) {
            match futures_util::FutureExt::now_or_never(put) {
                Some(Ok(Ok(entry))) => {
                    tracing::info!(key = %entry.key, seq = entry.seq, bytes = entry.bytes, "archive: checkpoint stored");
                    self.checkpoint_stored = Some(entry);
                }
                Some(Ok(Err(why))) => {
                    tracing::warn!(%why, "archive: checkpoint not shipped; trying again later")
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "archive: checkpoint put did not finish")
                }
                None => {}
            }
        }
        if self.checkpoint_put.is_some() || self.checkpoint_stored.is_some() {
            return;
        }
        if self
            .checkpoint_looked
            .is_some_and(|at| at.elapsed() < CHECKPOINT_LOOK_INTERVAL)
        {
            return;
        }
        self.checkpoint_looked = Some(Instant::now());
        let listed = self.state.checkpoints.last().map_or(0, |c| c.seq);
        let shipped = self.state.shipped_seq;
        let Some((seq, file)) = spark_core::checkpoint::list(&self.data_dir)
            .into_iter()
            .find(|(seq, _)| *seq <= shipped)
            .filter(|(seq, _)| *seq > listed)
        else {
            return;
        };
        let store = self.store.clone();
        let log_dir = self.log_dir.clone();
        let epoch = self.status.epoch;
        self.checkpoint_put = Some(tokio::spawn(async move {
            let (file_, log_dir_) = (file.clone(), log_dir.clone());
            let read = tokio::task::spawn_blocking(move || read_checkpoint(&file_, &log_dir_));
            let (header, bytes, blake3) = read
                .await
                .map_err(|e| format!("{}: {e}", file.display()))?
                .map_err(|why| format!("{}: {why}", file.display()))?;
            debug_assert_eq!(header.at.seq, seq);
            let key = checkpoint_key(store.prefix(), seq, epoch);
            let entry = CheckpointEntry {
                key: key.clone(),
                seq,
                ts_ms: header.ts_ms,
                bytes: bytes.len() as u64,
                blake3,
                chain: header.at.chain,
            };
            let len = bytes.len() as u64;
            match store.put_create(&key, Bytes::from(bytes)).await {
                Ok(Put::Created) => count_put("checkpoint", len),
                Ok(Put::AlreadyThere) => {}
                Err(e) => return Err(e.to_string()),
            }
            Ok(entry)
        }));
    }
}

/// A local checkpoint file to ship, checked first as a start would check
/// it: its header and length, its chain value against the local log
/// ([`spark_core::checkpoint::peek`]), and its BLAKE3 trailer (a damaged
/// file put create-only could never be replaced). Returns the header, the
/// bytes and the whole object's BLAKE3 (for the manifest's entry),
/// all on the calling (blocking) thread: a checkpoint is as large as the
/// mirror. Errors in words.
fn read_checkpoint(
    file: &Path,
    log_dir: &Path,
) -> Result<(spark_core::checkpoint::Header, Vec<u8>, [u8; 32]), String> {
    let header = spark_core::checkpoint::peek(file, log_dir).map_err(|e| e.to_string())?;
    let bytes = std::fs::read(file).map_err(|e| format!("cannot be read: {e}"))?;
    let decoded = spark_core::checkpoint::decode_header(&bytes).map_err(|e| e.to_string())?;
    if decoded != header {
        return Err("changed while it was read".into());
    }
    let blake3 = *blake3::hash(&bytes).as_bytes();
    Ok((header, bytes, blake3))
}
