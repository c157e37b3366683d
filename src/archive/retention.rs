//! The archive's retention pass (SPEC section 13, ARCHIVE.md "Retention"):
//! run by the writer's shipper, after a tick that stored what it had to,
//! at most once per [`Retention::interval`](super::retention_state::Retention::interval). It raises the manifests'
//! retention floor to the newest manifest written at least `[archive]
//! retention_ms` ago (a manifest of the same entries carrying
//! `retained_from`: the pass's commit point), deletes the manifests below
//! the floor, then every segment, chunk and checkpoint object no retained
//! manifest names, then the blobs only erased moments named, once every
//! retained manifest's log has them erased.
//!
//! Every step is idempotent and each leaves a state every reader accepts:
//! a crash (or a failed delete, a WARN) anywhere leaves objects the next
//! pass deletes. A fenced writer deletes nothing: the pass starts with the
//! fencing HEAD a ship starts with, and its manifest put is fenced as any.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use spark_archive::layout::{blob_key, key_epoch, manifest_key, Manifest};

use super::metrics;
use super::retention_state::Unneeded;
use super::shipper::{ShipError, Shipper};

/// Deletes in flight at once.
const DELETES_AT_ONCE: usize = 16;
/// Manifests read at once when the pass catches up with the history.
const READS_AT_ONCE: usize = 16;
/// After a pass gave way to shipping, the next one starts this much later
/// at the earliest (it goes on where this one stopped).
const RESUME_AFTER: Duration = Duration::from_secs(1);

/// What one pass deleted, by family.
#[derive(Debug, Default)]
pub(super) struct PassReport {
    /// The retention floor after the pass (0: no manifest old enough).
    pub(super) floor: u64,
    /// Objects and bytes deleted, by family (`manifest`, `segment`,
    /// `chunk`, `checkpoint`, `blob`).
    pub(super) deleted: BTreeMap<&'static str, (u64, u64)>,
    /// Deletes that failed (retried at the next pass).
    pub(super) failed: u64,
    /// The pass stopped between two batches of deletes to let a ship go
    /// first (writes wait in `sync` mode, or the head moved and the pass
    /// has run a ship interval); the next one goes on.
    pub(super) gave_way: bool,
    /// Batches of deletes sent (a pass sends at least one before it gives
    /// way, so that a busy writer still deletes).
    batches: usize,
}

impl PassReport {
    fn count(&mut self, family: &'static str, bytes: u64) {
        let entry = self.deleted.entry(family).or_default();
        entry.0 += 1;
        entry.1 += bytes;
        let m = metrics::get();
        let label = crate::metrics::label("kind", family);
        m.objects_deleted.get_or_create(&label).inc();
        m.bytes_deleted.get_or_create(&label).inc_by(bytes);
    }
}

impl Shipper {
    /// Runs a retention pass when one is due; a failure other than a fence
    /// is a WARN (the next pass tries again), never a failed ship.
    pub(super) async fn retention_tick(&mut self) -> Result<(), ShipError> {
        if !self.retention.due(self.state.number) {
            return Ok(());
        }
        self.retention.last_pass = Some(Instant::now());
        self.retention.quiet = None;
        self.retention.resume_at = None;
        match self.retention_pass().await {
            Ok(report) => {
                if report.gave_way {
                    self.retention.resume_at = Some(Instant::now() + RESUME_AFTER);
                }
                let (objects, bytes) = report
                    .deleted
                    .values()
                    .fold((0, 0), |(o, b), (o2, b2)| (o + o2, b + b2));
                if objects > 0 || report.failed > 0 {
                    tracing::info!(
                        floor = report.floor,
                        objects,
                        bytes,
                        failed = report.failed,
                        gave_way = report.gave_way,
                        by_kind = ?report.deleted,
                        "archive: retention pass deleted what is older than retention_ms"
                    );
                }
                Ok(())
            }
            Err(fenced @ ShipError::Fenced(_)) => Err(fenced),
            Err(e) => {
                tracing::warn!(error = %e, "archive: retention pass failed; trying again at the next one");
                Ok(())
            }
        }
    }

    /// One retention pass (ARCHIVE.md "Retention"). Returns what it
    /// deleted; an error stops the pass where it is (what it did is kept).
    pub(super) async fn retention_pass(&mut self) -> Result<PassReport, ShipError> {
        let started = Instant::now();
        let mut report = PassReport::default();
        if self.state.number == 0 {
            return Ok(report);
        }
        // The soonest time something seen now turns old enough.
        let mut wake_ms = u64::MAX;
        self.check_not_taken_over().await?;
        self.read_retained().await?;
        let now_ms = spark_log_format::system_now_ms();
        let horizon_ms = now_ms.saturating_sub(self.retention.retention_ms);
        let retention_ms = self.retention.retention_ms;
        let older = |written_ms: u64| written_ms.saturating_add(retention_ms);
        if let Some((_, (written_ms, _))) =
            self.retention.seen.iter().find(|(n, (written_ms, _))| {
                **n > self.state.retained_from && *written_ms > horizon_ms
            })
        {
            wake_ms = wake_ms.min(older(*written_ms));
        }
        let Some(floor) = self
            .retention
            .seen
            .iter()
            .filter(|(_, (written_ms, _))| *written_ms <= horizon_ms)
            .map(|(n, _)| *n)
            .next_back()
        else {
            self.retention.quiet = Some((self.state.number, wake_ms));
            return Ok(report);
        };
        let floor = floor.max(self.state.retained_from);
        report.floor = floor;
        // 1. The commit point: a manifest of the same entries naming the
        //    floor. Nothing is deleted before it is stored. Not when the
        //    floor would move by one manifest naming the same objects (an
        //    idle archive: the manifest the last pass stored), so that an
        //    idle writer does not store a manifest every retention_ms.
        if floor > self.state.retained_from && !self.same_objects(floor).await? {
            let mut next = self.state.clone();
            next.retained_from = floor;
            self.ship_manifest_as("retention", next).await?;
            self.read_retained().await?;
        }
        let floor = self.state.retained_from;
        report.floor = floor;
        self.retention.seen.retain(|n, _| *n >= floor);
        let Some(&(_, floor_shipped_seq)) = self.retention.seen.get(&floor) else {
            return Ok(report);
        };
        // 2. The manifests below the floor, lowest first.
        let prefix = self.store.prefix().to_owned();
        let below: Vec<(String, u64)> = self
            .store
            .numbered_below(|n| manifest_key(&prefix, n), floor)
            .await?
            .into_iter()
            .map(|(_, key, bytes)| (key, bytes))
            .collect();
        self.delete_all("manifest", below, started, &mut report)
            .await?;
        if report.gave_way {
            return Ok(report);
        }
        // 3. Log objects no retained manifest names, old enough, of this
        //    writer's epoch or an older one (a newer writer's objects are
        //    never touched), and not a checkpoint waiting to be listed.
        let epoch = self.status.epoch;
        let waiting = self.checkpoint_stored.as_ref().map(|c| c.key.clone());
        for family in ["segment", "chunk", "checkpoint"] {
            if family == "checkpoint" && self.checkpoint_put.is_some() {
                // A checkpoint put in flight may be stored already and not
                // listed yet: checkpoints wait for a pass without one.
                report.gave_way = true;
                continue;
            }
            let mut unnamed: Vec<(String, u64)> = Vec::new();
            for (key, bytes, modified_ms) in self.store.list_family_dated(family).await? {
                let deletable = self.retention.named.get(&key).is_none_or(|n| *n < floor)
                    && key_epoch(&key).is_some_and(|e| e <= epoch)
                    && waiting.as_deref() != Some(key.as_str());
                if !deletable {
                    continue;
                }
                if modified_ms > horizon_ms {
                    wake_ms = wake_ms.min(older(modified_ms));
                    continue;
                }
                unnamed.push((key, bytes));
            }
            let label: &'static str = family;
            let deleted = self
                .delete_all(label, unnamed, started, &mut report)
                .await?;
            for key in deleted {
                self.retention.named.remove(&key);
            }
            if report.gave_way {
                return Ok(report);
            }
        }
        // 4. Blobs only erased moments name, erased as of the floor's log.
        let waiting_blobs = self
            .delete_erased_blobs(floor_shipped_seq, started, &mut report)
            .await?;
        if report.failed == 0 && !waiting_blobs && !report.gave_way {
            self.retention.quiet = Some((self.state.number, wake_ms));
        }
        Ok(report)
    }

    /// Whether `floor` is the manifest right after the current floor and
    /// names the same objects: raising the floor to it deletes nothing
    /// but one manifest.
    async fn same_objects(&self, floor: u64) -> Result<bool, ShipError> {
        let current = self.state.retained_from;
        if floor != current + 1 {
            return Ok(false);
        }
        let (a, b) = futures_util::future::try_join(
            self.store.manifest(current),
            self.store.manifest(floor),
        )
        .await?;
        let keys = |m: &Manifest| {
            let mut keys: Vec<String> = m
                .segments
                .iter()
                .map(|s| s.key.clone())
                .chain(m.chunks.iter().map(|c| c.key.clone()))
                .chain(m.checkpoints.iter().map(|c| c.key.clone()))
                .collect();
            keys.sort();
            keys
        };
        Ok(keys(&a) == keys(&b))
    }

    /// Reads the manifests from the retention floor (or the last one read)
    /// to the state's, taking in each.
    async fn read_retained(&mut self) -> Result<(), ShipError> {
        let from = (self.retention.seen_upto + 1).max(self.state.retained_from);
        let to = self.state.number;
        let store = &self.store;
        let mut read = std::pin::pin!(futures_util::stream::iter(from..=to)
            .map(|n| async move { store.manifest(n).await })
            .buffered(READS_AT_ONCE));
        let mut manifests = Vec::new();
        while let Some(m) = read.next().await {
            manifests.push(m?);
        }
        for m in &manifests {
            self.retention.observe(m);
        }
        Ok(())
    }

    /// Whether the pass (started at `started`) should stop and let a ship
    /// go first: in `sync` mode writes wait for one; in `async` mode the
    /// head moved and the pass has already run a ship interval.
    fn give_way(&self, started: Instant) -> bool {
        if let Some(gate) = self.engine.archive_gate() {
            return gate.waiting_answers() > 0;
        }
        started.elapsed() >= self.status.interval && self.engine.head().seq > self.state.shipped_seq
    }

    /// Deletes `objects` (key, bytes) in key order, in batches of
    /// [`DELETES_AT_ONCE`] at once; counts each deleted in `report`, a
    /// failed one as a WARN. Before each batch: the fencing HEAD (a writer
    /// fenced since the pass started deletes nothing more), and a look at
    /// whether a ship should go first ([`Shipper::give_way`], once the
    /// pass sent a batch: then it stops, `report.gave_way`, and the next
    /// pass goes on). Returns the keys deleted.
    async fn delete_all(
        &self,
        family: &'static str,
        objects: Vec<(String, u64)>,
        started: Instant,
        report: &mut PassReport,
    ) -> Result<Vec<String>, ShipError> {
        let store = &self.store;
        let mut deleted = Vec::new();
        for batch in objects.chunks(DELETES_AT_ONCE) {
            if report.batches > 0 && self.give_way(started) {
                report.gave_way = true;
                break;
            }
            self.check_not_taken_over().await?;
            report.batches += 1;
            let results = futures_util::future::join_all(
                batch
                    .iter()
                    .map(|(key, bytes)| async move { (key, *bytes, store.delete(key).await) }),
            )
            .await;
            for (key, bytes, result) in results {
                match result {
                    Ok(()) => {
                        report.count(family, bytes);
                        deleted.push(key.clone());
                    }
                    Err(e) => {
                        report.failed += 1;
                        tracing::warn!(%key, error = %e, "archive: retention could not delete an object; trying again at the next pass");
                    }
                }
            }
        }
        Ok(deleted)
    }

    /// Deletes `blob/<sha256>` of each blob that only erased moments name
    /// (the compactor's rule, `crate::retention::remove_erased_blobs`:
    /// named by no moment that is not erased), once the mirror that showed
    /// it so was at a head seq at most `floor_shipped_seq`: the compaction
    /// that erased its last moment is then in every retained manifest's
    /// log, so no restore within the window needs it.
    ///
    /// Returns whether unneeded blobs wait for the floor to move.
    async fn delete_erased_blobs(
        &mut self,
        floor_shipped_seq: u64,
        started: Instant,
        report: &mut PassReport,
    ) -> Result<bool, ShipError> {
        let unneeded: Vec<[u8; 32]> = self.engine.read(|mirror| {
            let mut gone = std::collections::HashSet::new();
            let mut kept = std::collections::HashSet::new();
            for media in mirror.media.values() {
                if mirror.is_erased(media.moment_id) {
                    gone.insert(media.sha256.0);
                } else {
                    kept.insert(media.sha256.0);
                }
            }
            gone.difference(&kept).copied().collect()
        });
        // The mirror read was at this head or before it: every compaction
        // it showed has a record at or before this seq.
        let seen_at = self.engine.head().seq;
        let now: std::collections::HashSet<[u8; 32]> = unneeded.iter().copied().collect();
        self.retention.unneeded.retain(|sha, _| now.contains(sha));
        for sha in unneeded {
            self.retention
                .unneeded
                .entry(sha)
                .or_insert(Unneeded::Since(seen_at));
        }
        let due: Vec<[u8; 32]> = self
            .retention
            .unneeded
            .iter()
            .filter(|(_, u)| matches!(u, Unneeded::Since(s) if *s <= floor_shipped_seq))
            .map(|(sha, _)| *sha)
            .collect();
        let waiting = self
            .retention
            .unneeded
            .values()
            .any(|u| matches!(u, Unneeded::Since(s) if *s > floor_shipped_seq));
        if due.is_empty() {
            return Ok(waiting);
        }
        let prefix = self.store.prefix().to_owned();
        let sizes: HashMap<String, u64> =
            self.store.list_family("blob").await?.into_iter().collect();
        let mut objects = Vec::new();
        for sha in &due {
            let key = blob_key(&prefix, sha);
            match sizes.get(&key) {
                Some(bytes) => objects.push((key, *bytes)),
                None => {
                    self.retention.unneeded.insert(*sha, Unneeded::Deleted);
                }
            }
        }
        let deleted = self.delete_all("blob", objects, started, report).await?;
        for key in deleted {
            if let Some(sha) = due.iter().find(|sha| blob_key(&prefix, sha) == key) {
                self.retention.unneeded.insert(*sha, Unneeded::Deleted);
            }
        }
        Ok(waiting)
    }
}
