//! Leases (SPEC section 11, ARCHIVE.md "Lease"): a second engine on a
//! prefix held by another writer takes it over by itself, as `--take-over`
//! does, once the holder's lease expired; otherwise it refuses to start,
//! saying when the lease expires. This file reads a lease ([`LeaseView`],
//! [`still_expired`]); the take-over on expiry that uses it is
//! [`super::takeover::take_over_if_expired`].
//!
//! The holder renews its lease with its manifests (the shipper, `mod.rs`):
//! every manifest carries its writer's `lease_ms`, and one is stored at
//! least every `lease_ms / 3`, idle or not. The lease is read from the
//! archive: the latest epoch object names the holder, and the latest
//! manifest of that epoch (or, before its first one, the epoch object)
//! says when it was last renewed and for how long.
//!
//! Clocks decide only when a take-over may start (liveness), never what is
//! acknowledged (safety): a take-over claims the next epoch and stores its
//! manifest create-only, and the old writer is fenced by those conditional
//! writes whatever any clock says ("Epoch"). A clock that is off makes a
//! take-over come early (the old writer is then fenced, as with
//! `--take-over`) or late.

use spark_archive::layout::{EpochDoc, Manifest};
use spark_archive::ArchiveStore;

use super::ArchiveStartError;
use crate::clock::Clock;

/// The holder's lease as the archive shows it (ARCHIVE.md "Lease").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseView {
    /// The holder's writer id (the latest epoch object's).
    pub writer: String,
    /// Its epoch (the latest).
    pub epoch: u64,
    /// Unix ms, by the holder's clock, of its last renewal: the later of
    /// its epoch object's `taken_ms` and the latest manifest's
    /// `written_ms` when that manifest is of its epoch.
    pub renewed_ms: u64,
    /// The lease it advertises, in ms: that manifest's `lease_ms`, or the
    /// epoch object's before its first manifest; 0 when it holds the
    /// prefix without a lease.
    pub lease_ms: u64,
}

impl LeaseView {
    /// The lease of the holder of epoch `doc` (the latest epoch object),
    /// `latest` being the latest manifest (`None`: no manifest yet).
    pub fn of(doc: &EpochDoc, latest: Option<&Manifest>) -> LeaseView {
        let own = latest.filter(|m| m.epoch == doc.epoch);
        LeaseView {
            writer: doc.writer.clone(),
            epoch: doc.epoch,
            renewed_ms: own.map_or(doc.taken_ms, |m| m.written_ms.max(doc.taken_ms)),
            lease_ms: own.map_or(doc.lease_ms, |m| m.lease_ms),
        }
    }

    /// The lease that applies for an engine whose own `[archive] lease_ms`
    /// is `own_lease_ms` (above 0): the longer of the holder's and its
    /// own, so that neither side's setting can make it shorter; `None`
    /// when the holder holds the prefix without a lease (only
    /// `--take-over` moves it).
    pub fn effective_ms(&self, own_lease_ms: u64) -> Option<u64> {
        (self.lease_ms > 0).then(|| self.lease_ms.max(own_lease_ms))
    }

    /// Milliseconds until the lease expires at Unix ms `now_ms` (this
    /// engine's clock): `Some(0)` once expired (`now_ms - renewed_ms` at
    /// least the lease of [`LeaseView::effective_ms`]), `None` when it
    /// never does (no lease).
    pub fn expires_in_ms(&self, own_lease_ms: u64, now_ms: u64) -> Option<u64> {
        let lease = self.effective_ms(own_lease_ms)?;
        Some((self.renewed_ms.saturating_add(lease)).saturating_sub(now_ms))
    }

    /// How many ms ago, at `now_ms`, the lease was last renewed.
    pub fn age_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.renewed_ms)
    }

    /// The refusal of a start that finds this lease live (or no lease).
    pub(super) fn refusal(&self, own_lease_ms: u64, now_ms: u64, since: &str) -> ArchiveStartError {
        let age = self.age_ms(now_ms);
        let renewed = spark_core::time::format_rfc3339_ms(self.renewed_ms as i64);
        let lease = match self.expires_in_ms(own_lease_ms, now_ms) {
            None => format!(
                ". Leases are on here ([archive] lease_ms = {own_lease_ms}), but writer {} holds \
                 the prefix without a lease (lease_ms = 0 there; last manifest {age} ms ago, at \
                 {renewed} by its clock): it never expires, only --take-over moves the prefix",
                self.writer
            ),
            Some(left) => {
                let lease = self.effective_ms(own_lease_ms).unwrap_or(0);
                let at = spark_core::time::format_rfc3339_ms(now_ms.saturating_add(left) as i64);
                format!(
                    ". Its lease ({lease} ms) was last renewed {age} ms ago{since} (at {renewed} \
                     by its clock) and expires in {left} ms, at {at} by this machine's clock, \
                     unless renewed again: if that engine has stopped, start this one after \
                     that and it takes the prefix over by itself (or now, with --take-over)"
                )
            }
        };
        ArchiveStartError::Held {
            writer: self.writer.clone(),
            epoch: self.epoch,
            lease,
        }
    }
}

/// Right before a take-over of an expired lease claims the next epoch: the
/// prefix is still held by `view`'s epoch, and its lease is still expired
/// (the catch-up before may have taken a while). Otherwise refused, with
/// nothing taken.
pub(super) async fn still_expired(
    store: &ArchiveStore,
    view: &LeaseView,
    lease_ms: u64,
    clock: &dyn Clock,
) -> Result<(), ArchiveStartError> {
    let doc = store.latest_epoch().await?;
    let Some(doc) = doc.filter(|d| d.epoch == view.epoch) else {
        return Err(ArchiveStartError::TakeOver(format!(
            "another engine took the prefix over (after epoch {}) while this one fetched the \
             archive's log; start again to see who holds it now",
            view.epoch
        )));
    };
    let latest = store.latest_manifest().await?;
    let now = LeaseView::of(&doc, latest.as_ref());
    let now_ms = clock.now_ms();
    if now.expires_in_ms(lease_ms, now_ms) != Some(0) {
        return Err(now.refusal(
            lease_ms,
            now_ms,
            " (renewed while this engine fetched the log)",
        ));
    }
    Ok(())
}
