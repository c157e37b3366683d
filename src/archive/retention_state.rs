//! What the archive's retention pass (`retention.rs`, ARCHIVE.md
//! "Retention") keeps between passes, in the writer's shipper: the state
//! and its own rules (when a pass is due, what a manifest names). The pass
//! itself is `retention.rs`, which works on the shipper; this file sits
//! below both.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use spark_archive::layout::Manifest;

/// The longest time between two passes.
const PASS_EVERY_MAX: Duration = Duration::from_secs(3600);

/// Whether a blob's moments are all erased, and since when the engine
/// knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unneeded {
    /// Every moment naming it was erased as of the mirror at this head
    /// seq (at or after the compaction that erased the last one).
    Since(u64),
    /// Its object was deleted.
    Deleted,
}

/// What the retention pass remembers between passes: the retained
/// manifests it read (so that a pass reads only the ones stored since the
/// last), which of them names each object, and the blobs found unneeded.
pub(super) struct Retention {
    /// `[archive] retention_ms`.
    pub(super) retention_ms: u64,
    /// At most one pass per this long.
    pub(super) interval: Duration,
    /// When the last pass started.
    pub(super) last_pass: Option<Instant>,
    /// Retained manifests read: number → (`written_ms`, `shipped_seq`).
    pub(super) seen: BTreeMap<u64, (u64, u64)>,
    /// The highest manifest number read (0: none yet).
    pub(super) seen_upto: u64,
    /// Object key → the highest manifest number naming it.
    pub(super) named: HashMap<String, u64>,
    /// Blobs whose every moment is erased, by SHA-256.
    pub(super) unneeded: HashMap<[u8; 32], Unneeded>,
    /// After a pass that left nothing to do: the manifest number it saw
    /// and the wall-clock time (Unix ms) at which something it saw turns
    /// old enough (a manifest above the floor, an unnamed object). While
    /// no manifest is stored and that time has not come, no pass runs: an
    /// idle writer makes no request for retention either.
    pub(super) quiet: Option<(u64, u64)>,
    /// After a pass that gave way to shipping: when the next one may start.
    pub(super) resume_at: Option<Instant>,
}

impl Retention {
    /// The pass's state for `retention_ms` and a ship interval of
    /// `ship_interval`: a pass at most every `retention_ms / 10`, never
    /// more often than the ship interval nor less often than an hour, so
    /// that an object outlives the window by at most a tenth of it (an
    /// hour for the default week) while a pass, which LISTs the log
    /// families, stays rare.
    pub(super) fn new(retention_ms: u64, ship_interval: Duration) -> Retention {
        let interval = Duration::from_millis(retention_ms / 10)
            .min(PASS_EVERY_MAX)
            .max(ship_interval);
        Retention {
            retention_ms,
            interval,
            last_pass: None,
            seen: BTreeMap::new(),
            seen_upto: 0,
            named: HashMap::new(),
            unneeded: HashMap::new(),
            quiet: None,
            resume_at: None,
        }
    }

    /// Whether a pass is due, the state's manifest being `number`.
    pub(super) fn due(&self, number: u64) -> bool {
        if let Some(at) = self.resume_at {
            return Instant::now() >= at;
        }
        let quiet = self.quiet.is_some_and(|(seen, wake_ms)| {
            seen == number && spark_log_format::system_now_ms() < wake_ms
        });
        !quiet
            && self
                .last_pass
                .is_none_or(|at| at.elapsed() >= self.interval)
    }

    /// Takes in manifest `m`: when it was written, how far its log goes,
    /// and the objects it names.
    pub(super) fn observe(&mut self, m: &Manifest) {
        self.seen.insert(m.number, (m.written_ms, m.shipped_seq));
        self.seen_upto = self.seen_upto.max(m.number);
        let keys = m
            .segments
            .iter()
            .map(|s| &s.key)
            .chain(m.chunks.iter().map(|c| &c.key))
            .chain(m.checkpoints.iter().map(|c| &c.key));
        for key in keys {
            let at = self.named.entry(key.clone()).or_default();
            *at = (*at).max(m.number);
        }
    }
}
