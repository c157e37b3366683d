//! The archive shipper (SPEC section 11, `archive/ARCHIVE.md`): with
//! `[archive]`, a background task follows the journal's durable head and
//! ships: one fencing HEAD, then the blobs new ops name beside the sealed
//! segments and at most one tail chunk (at the same time), then, once all
//! are stored, a manifest naming them. Every put is
//! create-only; a failed ship is retried with backoff while the engine goes
//! on taking writes. Without `[archive]` nothing here runs.
//!
//! One writer per prefix (ARCHIVE.md "Epoch"): [`take_over`] moves the
//! prefix to this data directory (`serve --take-over`); a shipper whose
//! manifest put meets a newer epoch's fences its engine (`503 fenced`).
//!
//! A blob is checked (size and SHA-256, as its `media.put` names them)
//! before it is put, up to [`BLOB_PUTS_AT_ONCE`] at a time. A blob that is
//! missing or damaged locally is never shipped: the archive records it
//! lost (a `missing/` marker, ARCHIVE.md "Missing blob"), the log keeps
//! shipping, and `/readyz`, `spark_archive_blobs_missing` and a WARN line
//! name it.
//!
//! `async` mode ships at most once per `ship_interval_ms`, and between
//! ships puts the blobs of newly committed ops ahead of their ship
//! ([`BLOBS_AHEAD_EVERY`]), so that a stream of uploads does not make each
//! ship an interval's worth of blob puts long. `sync` mode
//! (the engine was opened with an [`gate::ArchiveGate`]) ships as soon as a
//! write waits and no ship is in flight, tells the gate every stored
//! manifest's seq, and closes the gate when it stops for good (fenced, or
//! shut down), so that no writer waits forever; as it puts a chunk per
//! ship, it merges runs of chunks so manifests stay small.
//!
//! Leases (`[archive] lease_ms`, ARCHIVE.md "Lease"): with a lease, the
//! shipper stores a manifest at least every `lease_ms / 3`, idle or not (a
//! renewal: the last manifest's entries, numbered next), and
//! [`take_over_if_expired`] lets a second engine take the prefix over by
//! itself once the holder's lease expired. Without one, an idle writer
//! makes no request and only `--take-over` moves the prefix.
//!
//! The files, by job: `start` starts the archive (the writer epoch and
//! its file, resuming from the latest manifest, spawning the shipper);
//! `shipper` is the task that ships; `status` is what it reports
//! ([`ArchiveStatus`], [`Shipping`]); `takeover` and `lease` move the
//! prefix to another engine; `gate` is the `sync` mode's wait for the
//! archive; `metrics` its Prometheus metrics. This file holds what they
//! share: the start error, the tuning constants and `read_range`.

pub mod gate;
mod lease;
pub mod metrics;
mod retention;
mod retention_state;
mod shipper;
mod start;
mod status;
mod takeover;

pub use lease::LeaseView;
pub use start::{start, start_on, start_on_leased, start_on_retained};
pub use status::{ArchiveStatus, Shipping};
pub(crate) use takeover::{catch_up, distinct, fetch_blob, BlobFetch};
pub use takeover::{
    take_over, take_over_if_expired, take_over_if_expired_on, take_over_leased, take_over_on,
    TakenOver,
};

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::Duration;

use spark_archive::StoreError;

/// How long the last ship at shutdown may take.
pub const FINAL_SHIP_TIMEOUT: Duration = Duration::from_secs(10);
/// Most blob puts in flight at once (newcomer finding 3: one at a time, a
/// burst of uploads made each ship take several intervals; at 8, a stream
/// of uploads still made the blob puts most of a ship's time).
pub const BLOB_PUTS_AT_ONCE: usize = 16;
/// `/readyz` says `behind` (not `shipping`) once the oldest unshipped op
/// has waited this many ship intervals: a ship that hangs, or one that
/// cannot keep up.
pub const BEHIND_AFTER_INTERVALS: u32 = 3;
/// The file in the data directory that names this writer and its epoch.
pub const WRITER_FILE: &str = "archive-writer";
/// `async` mode: between ships, the shipper looks this often for blobs of
/// newly committed ops and puts them ahead of their ship
/// ([`shipper::Shipper::put_blobs_ahead`]), so that a ship under a stream of uploads is
/// not one interval's worth of blob puts long.
pub const BLOBS_AHEAD_EVERY: Duration = Duration::from_millis(100);
/// How often the shipper looks for a new local checkpoint to ship
/// (ARCHIVE.md "Checkpoint"): one directory listing, off the ship's path.
pub const CHECKPOINT_LOOK_INTERVAL: Duration = Duration::from_secs(1);

/// Why the archive did not start (the server refuses to start).
#[derive(Debug, thiserror::Error)]
pub enum ArchiveStartError {
    /// The settings do not make a store.
    #[error("archive: {0}")]
    Config(String),
    /// The store could not be read or written at start.
    #[error("archive: {0}")]
    Store(#[from] StoreError),
    /// Another writer holds the prefix.
    #[error("archive: the prefix is held by writer {writer} (epoch {epoch}); this data directory is not that writer. To ship from this directory (a restored or a new one), point [archive] url at a new prefix; to move the prefix to this directory, restore it from the archive (`spark-replay restore`) and start it with --take-over: the other engine is then fenced (its writes answer 503 fenced){lease}")]
    Held {
        /// The other writer's id.
        writer: String,
        /// Its epoch.
        epoch: u64,
        /// With leases on (`[archive] lease_ms` above 0): a sentence
        /// (starting with `. `) saying when the holder's lease expires, or
        /// that it holds the prefix without one; empty with leases off.
        lease: String,
    },
    /// The local log and the archive disagree.
    #[error("archive: {0}")]
    Diverged(String),
    /// `--take-over` did not get the prefix: another engine took it at the
    /// same time, or the writer holding it kept shipping past every try.
    #[error("archive: take-over refused: {0}")]
    TakeOver(String),
    /// The writer file could not be read or written.
    #[error("archive: {path}: {source}")]
    Local {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Bytes `[from, to)` of a file (`to = None`: to its end).
fn read_range(path: &Path, from: u64, to: Option<u64>) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(from))?;
    let mut out = Vec::new();
    match to {
        Some(to) => {
            file.take(to.saturating_sub(from)).read_to_end(&mut out)?;
        }
        None => {
            file.read_to_end(&mut out)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
