//! What the archive shipper reports: [`ArchiveStatus`] (the `archive`
//! member of `/readyz`, `/api/log/head`'s shipped seq, the lag and
//! missing-blob metrics) and [`Shipping`], the handle of the running
//! shipper that stops it. The shipper (`shipper.rs`) records into the
//! status as it ships; nothing here makes a request to the store.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use spark_log_format::format::{segment_file_name, RECORD_LEN_OFFSET, RECORD_SEQ_OFFSET};
use spark_log_format::{FrameKind, Frames, HEADER_LEN};

use super::{gate, metrics, read_range, BEHIND_AFTER_INTERVALS};
use crate::engine::Engine;

/// At most this many lost blobs are listed in `/readyz` (all are counted).
pub(super) const MISSING_BLOBS_LISTED: usize = 100;

/// What `/readyz`, `/api/log/head` and the metrics tell about shipping.
pub struct ArchiveStatus {
    pub(super) epoch: u64,
    /// `[archive] lease_ms` (0: leases off).
    pub(super) lease_ms: u64,
    /// When the engine was fenced (set after [`Engine::fence`] returned).
    pub(super) fenced_at: Mutex<Option<Instant>>,
    pub(super) shipped_seq: AtomicU64,
    pub(super) interval: Duration,
    pub(super) engine: Arc<Engine>,
    pub(super) log_dir: PathBuf,
    pub(super) max_record_bytes: u32,
    /// Where the first unshipped op is, and its acknowledgement time once
    /// read.
    pub(super) next: Mutex<NextOp>,
    /// The last ship's failure, until a ship succeeds.
    pub(super) failing: Mutex<Option<String>>,
    /// Blobs the archive records lost since this engine started.
    pub(super) missing: Mutex<MissingBlobs>,
}

impl metrics::Watched for ArchiveStatus {
    fn lag_seconds(&self) -> f64 {
        ArchiveStatus::lag_seconds(self)
    }
    fn blobs_missing(&self) -> usize {
        ArchiveStatus::blobs_missing(self)
    }
}

impl std::fmt::Debug for ArchiveStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveStatus")
            .field("epoch", &self.epoch)
            .field("shipped_seq", &self.shipped_seq())
            .finish_non_exhaustive()
    }
}

/// The first op after the shipped seq: in segment `segment_first_seq` at
/// byte `offset` (0: after its header), or at the start of the next
/// segment when a seal is there.
#[derive(Debug)]
pub(super) struct NextOp {
    pub(super) seq: u64,
    pub(super) segment_first_seq: u64,
    pub(super) offset: u64,
    /// Its `ts_ms` (when it was sequenced, just before its fdatasync).
    pub(super) ts_ms: Option<u64>,
}

#[derive(Debug, Default)]
pub(super) struct MissingBlobs {
    pub(super) seen: HashSet<[u8; 32]>,
    pub(super) listed: Vec<serde_json::Value>,
}

impl ArchiveStatus {
    /// The last seq a stored manifest names.
    pub fn shipped_seq(&self) -> u64 {
        self.shipped_seq.load(Ordering::Acquire)
    }

    /// Seconds the oldest acknowledged op not yet shipped has waited (now
    /// minus its `ts_ms`), 0 when caught up (newcomer finding 4). Computed
    /// when read, so it grows while a put hangs and during backoff.
    pub fn lag_seconds(&self) -> f64 {
        let head = self.engine.head().seq;
        let mut next = self.next.lock();
        if head < next.seq {
            return 0.0;
        }
        let ts_ms = match next.ts_ms {
            Some(ts_ms) => ts_ms,
            None => {
                // Unreadable (it should not be): from now on, not zero.
                let ts_ms = self
                    .ts_ms_of(&next)
                    .unwrap_or_else(spark_log_format::system_now_ms);
                next.ts_ms = Some(ts_ms);
                ts_ms
            }
        };
        spark_log_format::system_now_ms().saturating_sub(ts_ms) as f64 / 1000.0
    }

    /// The `ts_ms` of the op `next` points at, read from the local log.
    pub(super) fn ts_ms_of(&self, next: &NextOp) -> Option<u64> {
        let at = next.offset.max(HEADER_LEN as u64);
        for (first_seq, at) in [(next.segment_first_seq, at), (next.seq, HEADER_LEN as u64)] {
            let path = self.log_dir.join(segment_file_name(first_seq));
            let prefix = read_range(&path, at, Some(at + RECORD_SEQ_OFFSET as u64)).ok()?;
            let len = u32::from_le_bytes(
                prefix
                    .get(RECORD_LEN_OFFSET..RECORD_LEN_OFFSET + 4)?
                    .try_into()
                    .ok()?,
            );
            let frame = read_range(
                &path,
                at,
                Some(at + RECORD_SEQ_OFFSET as u64 + u64::from(len)),
            )
            .ok()?;
            match Frames::new(&frame, 0, self.max_record_bytes).next() {
                Some(frame) if frame.seq() == next.seq => {
                    return (frame.kind == FrameKind::Op).then_some(frame.record.ts_ms)
                }
                Some(frame) if frame.kind == FrameKind::Seal => continue,
                _ => return None,
            }
        }
        None
    }

    /// How long the oldest unshipped op may wait before shipping is
    /// `behind`: [`BEHIND_AFTER_INTERVALS`] ship intervals.
    pub fn behind_after(&self) -> Duration {
        self.interval * BEHIND_AFTER_INTERVALS
    }

    /// In `sync` mode, every unshipped op's write waits for the archive:
    /// when the oldest has waited longer than [`ArchiveStatus::behind_after`]
    /// (a store that hangs, or one too slow for the load), why writes are
    /// not answered in time, else `None`. `/readyz` answers `503` with it.
    /// A hung store is seen here within a few intervals, long before a
    /// request to it times out (object puts get a long timeout: a large
    /// blob or segment on a slow link needs it).
    pub fn writes_waiting_too_long(&self) -> Option<String> {
        let waited = self.lag_seconds();
        let limit = self.behind_after().as_secs_f64();
        (waited > limit).then(|| {
            format!(
                "archive mode \"sync\": the oldest write not archived has waited {waited:.1} s \
                 for the archive, more than {BEHIND_AFTER_INTERVALS} ship intervals ({limit:.1} \
                 s): the store answers slowly or not at all, and writes wait for it"
            )
        })
    }

    /// Why shipping fails, if its last try failed.
    pub fn failing(&self) -> Option<String> {
        self.failing.lock().clone()
    }

    /// This writer's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The lease this writer renews, in ms (`[archive] lease_ms`; 0: leases
    /// off).
    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    /// When this engine learnt that another took the prefix over, if it
    /// did: set just after the engine was fenced, so every
    /// [`Engine::submit`] that starts after this instant is refused.
    pub fn fenced_at(&self) -> Option<Instant> {
        *self.fenced_at.lock()
    }

    /// `fenced` (another engine took the prefix over), `failing` (the last
    /// ship failed, retried with backoff), `behind` (the lag passed
    /// [`BEHIND_AFTER_INTERVALS`] ship intervals) or `shipping`.
    pub fn status_name(&self) -> &'static str {
        if self.fenced_at().is_some() {
            "fenced"
        } else if self.failing.lock().is_some() {
            "failing"
        } else if self.lag_seconds() > self.behind_after().as_secs_f64() {
            "behind"
        } else {
            "shipping"
        }
    }

    /// How many blobs the archive recorded lost (missing or damaged
    /// locally, their ops shipped without them) since this engine started.
    pub fn blobs_missing(&self) -> usize {
        self.missing.lock().seen.len()
    }

    /// The `archive` member of `/readyz`, its `status` as
    /// [`ArchiveStatus::status_name`] says.
    pub fn to_json(&self) -> serde_json::Value {
        let failing = self.failing();
        let lag_seconds = self.lag_seconds();
        let missing = self.missing.lock();
        serde_json::json!({
            "status": self.status_name(),
            "epoch": self.epoch,
            "lease_ms": self.lease_ms,
            "shipped_seq": self.shipped_seq(),
            "lag_seconds": lag_seconds,
            "error": failing,
            "blobs_missing": missing.seen.len(),
            "missing_blobs": missing.listed,
        })
    }
}

/// The running shipper: stop it with [`Shipping::stop`].
pub struct Shipping {
    /// What it reports.
    pub status: Arc<ArchiveStatus>,
    pub(super) stop: tokio::sync::watch::Sender<bool>,
    pub(super) task: tokio::task::JoinHandle<()>,
    /// The engine's archive gate (`sync` mode), closed once shipping ends.
    pub(super) gate: Option<Arc<gate::ArchiveGate>>,
}

impl Shipping {
    /// Ships what is committed (one last ship, up to
    /// [`FINAL_SHIP_TIMEOUT`](super::FINAL_SHIP_TIMEOUT)), then stops. In `sync` mode the archive gate
    /// is then closed: writes still waiting, and any later one, are
    /// answered `503 unavailable` (durable locally, archived after the
    /// restart), never left hanging.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        // The task closes the gate itself; this covers a task that failed.
        let _ = self.task.await;
        if let Some(gate) = &self.gate {
            gate.close(gate::shutting_down());
        }
    }
}
