//! `--take-over` (SPEC section 11, ARCHIVE.md "Epoch"): moves an
//! archive's prefix to this data directory while another engine may still
//! hold it and ship.
//!
//! The rule for the local log: it must be a prefix of what the archive
//! holds (normally it was restored from the archive with `spark-replay
//! restore`, a while ago or just now). What the archive holds past it is
//! fetched and appended (checked chunk by chunk and segment by segment
//! against the chain: [`spark_archive::catch_up()`], the one catch-up
//! restore and replicas run too) before the engine opens,
//! so the local log equals the archive at the take-over point exactly. A
//! local log that holds an op the archive does not, or other bytes, is
//! refused before anything is taken: two writers' ops are never
//! interleaved.

use std::path::Path;

use bytes::Bytes;
use spark_archive::layout::{blob_key, extends, manifest_key, Manifest, ObjectError};
use spark_archive::{ArchiveStore, CatchUpError, Options as CatchUpOptions, StoreError};
use spark_log_format::{Fs as _, OsFs};

use super::lease::{still_expired, LeaseView};
use super::shipper::count_put;
use super::start::{claim_epoch, connect, read_writer_file, start_on_retained};
use super::status::Shipping;
use super::ArchiveStartError;
use crate::clock::Clock;
use crate::config::ArchiveSettings;
use crate::engine::Engine;

/// How many times the take-over manifest is tried while the writer that
/// holds the prefix keeps storing manifests under the number it needs.
const MANIFEST_TRIES: usize = 200;

/// What [`take_over`] did: this data directory holds `epoch`, manifest
/// `manifest` (of that epoch) is the take-over point, and the local log
/// equals the archive up to `shipped_seq` (or holds more of its own, when
/// this directory held the prefix already).
#[derive(Debug)]
pub struct TakenOver {
    /// The epoch taken (or held already, when a take-over is started again).
    pub epoch: u64,
    /// The number of the take-over manifest.
    pub manifest: u64,
    /// The last seq it names.
    pub shipped_seq: u64,
    store: ArchiveStore,
}

/// `spark-engine serve --take-over`, before the engine opens: takes the
/// prefix of `settings` for this data directory (see [`take_over_on`]).
pub async fn take_over(
    settings: &ArchiveSettings,
    data_dir: &Path,
    max_record_bytes: u32,
) -> Result<TakenOver, ArchiveStartError> {
    take_over_leased(
        connect(settings)?,
        data_dir,
        max_record_bytes,
        settings.lease_ms,
        None,
    )
    .await
}

/// Takes the prefix over for `data_dir` (ARCHIVE.md "Epoch"), holding the
/// data directory's lock meanwhile; call it before the engine opens:
///
/// 1. The local log is brought to the latest manifest (see the module
///    doc); a local log that is not a prefix of the archive is refused
///    here, with nothing taken.
/// 2. Epoch `E + 1` is claimed: `<data>/archive-writer` durably, then
///    `epoch/E+1` create-only; of two engines taking over at once exactly
///    one gets it, the other is refused ([`ArchiveStartError::TakeOver`]).
///    A directory that holds the latest epoch already (a take-over started
///    again) skips this.
/// 3. The take-over manifest: the latest manifest's number + 1, this
///    epoch, listing exactly the latest manifest's entries. The old writer
///    keeps shipping until then: when its manifest got the number first,
///    the next number is tried (up to [`MANIFEST_TRIES`] times). From this
///    put on, the old writer's next manifest put fails and it is fenced.
/// 4. The local log is brought to the take-over point (the archive holds
///    still now).
///
/// Then open the engine, fetch the blobs its new ops name
/// ([`TakenOver::fetch_missing_blobs`]) and start shipping
/// ([`TakenOver::start`], which is [`super::start()`] on the same store).
///
/// Leases off: the epoch and the take-over manifest record no lease (see
/// [`take_over_leased`]).
pub async fn take_over_on(
    store: ArchiveStore,
    data_dir: &Path,
    max_record_bytes: u32,
) -> Result<TakenOver, ArchiveStartError> {
    take_over_leased(store, data_dir, max_record_bytes, 0, None).await
}

/// [`take_over_on`] for a writer with a lease of `lease_ms` (0: none),
/// which its epoch object and take-over manifest record. `expired`: the
/// take-over is one of a lease found expired by the clock given with it
/// ([`super::take_over_if_expired`]),
/// so right before claiming the epoch (after the catch-up, which may take a
/// while) the archive is read again and the take-over is refused, with
/// nothing taken, if another engine took the prefix since or its holder
/// renewed its lease meanwhile.
pub async fn take_over_leased(
    store: ArchiveStore,
    data_dir: &Path,
    max_record_bytes: u32,
    lease_ms: u64,
    expired: Option<(&super::LeaseView, &dyn crate::clock::Clock)>,
) -> Result<TakenOver, ArchiveStartError> {
    let _lock = crate::engine::lock_data_dir(data_dir).map_err(|e| ArchiveStartError::Local {
        path: data_dir.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })?;
    refuse_a_cut_restore(data_dir)?;
    let log_dir = spark_core::layout::log_dir(data_dir);
    crate::engine::create_dir_durably(&log_dir).map_err(|source| ArchiveStartError::Local {
        path: log_dir.display().to_string(),
        source,
    })?;
    let mine = read_writer_file(&OsFs, data_dir)?;
    let latest_epoch = store.latest_epoch().await?;
    let held = matches!((&mine, &latest_epoch),
        (Some(me), Some(doc)) if me.writer == doc.writer && me.epoch == doc.epoch);
    let mut latest = store.latest_manifest().await?;
    let epoch = match latest_epoch {
        Some(doc) if held => doc.epoch,
        other => {
            // Refuses a local log that is not a prefix of the archive
            // before anything is taken.
            catch_up(
                &store,
                &log_dir,
                latest.as_ref(),
                max_record_bytes,
                false,
                false,
            )
            .await?;
            if let Some((view, clock)) = expired {
                still_expired(&store, view, lease_ms, clock).await?;
            }
            let next = other.map_or(1, |doc| doc.epoch + 1);
            claim_epoch(&store, data_dir, mine, next, lease_ms)
                .await?
                .epoch
        }
    };
    for _ in 0..MANIFEST_TRIES {
        if let Some(m) = &latest {
            if m.epoch > epoch {
                return Err(ArchiveStartError::TakeOver(format!(
                    "manifest {} was written by epoch {}, after this directory's {epoch}: \
                     another engine took the prefix over since",
                    m.number, m.epoch
                )));
            }
            if m.epoch == epoch {
                // Stored by an earlier try of this directory (whose
                // catch-up may not have finished), or this directory held
                // the prefix already and may hold more (its own ops, not
                // shipped yet): the usual start checks those against it.
                catch_up(&store, &log_dir, Some(m), max_record_bytes, true, false).await?;
                return Ok(TakenOver {
                    epoch,
                    manifest: m.number,
                    shipped_seq: m.shipped_seq,
                    store,
                });
            }
        }
        // No catch-up in this loop: the manifest put must be quick to win
        // the number from a writer that ships every interval. The local
        // log is a prefix of the archive (checked above), so of every
        // later manifest too (each extends the one before).
        let manifest = takeover_manifest(latest.as_ref(), epoch, lease_ms);
        let key = manifest_key(store.prefix(), manifest.number);
        let bytes = Bytes::from(manifest.encode());
        let len = bytes.len() as u64;
        match store.put_create(&key, bytes).await {
            Ok(_) => {
                count_put("manifest", len);
                // The archive holds still now (the old writer is fenced at
                // its next manifest put): fetch what the local log lacks.
                catch_up(
                    &store,
                    &log_dir,
                    Some(&manifest),
                    max_record_bytes,
                    false,
                    false,
                )
                .await?;
                tracing::info!(
                    epoch,
                    manifest = manifest.number,
                    shipped_seq = manifest.shipped_seq,
                    "archive: took the prefix over; the engine that held it is fenced at its next ship"
                );
                return Ok(TakenOver {
                    epoch,
                    manifest: manifest.number,
                    shipped_seq: manifest.shipped_seq,
                    store,
                });
            }
            Err(StoreError::Conflict { .. }) => {
                // The old writer (or a try of ours whose answer was lost)
                // stored this number first: go on from what is there, if
                // it extends what the local log was checked against.
                let stored = store.manifest(manifest.number).await?;
                if let Some(prev) = &latest {
                    extends(prev, &stored).map_err(|fork| {
                        ArchiveStartError::Diverged(format!(
                            "manifest {} ({key}) does not extend manifest {}: {fork}; the \
                             archive's history forks there, nothing more is taken",
                            stored.number, prev.number
                        ))
                    })?;
                }
                latest = Some(stored);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(ArchiveStartError::TakeOver(format!(
        "the writer that held the prefix stored {MANIFEST_TRIES} manifests while this engine \
         tried to take over after them; this directory holds epoch {epoch}: start again with \
         --take-over"
    )))
}

/// `spark-engine serve` without `--take-over`, before the engine opens,
/// when `[archive] lease_ms` is above 0 (see [`take_over_if_expired_on`]);
/// `Ok(None)` at once with leases off.
pub async fn take_over_if_expired(
    settings: &ArchiveSettings,
    data_dir: &Path,
    max_record_bytes: u32,
    clock: &dyn Clock,
) -> Result<Option<TakenOver>, ArchiveStartError> {
    if settings.lease_ms == 0 {
        return Ok(None);
    }
    take_over_if_expired_on(
        connect(settings)?,
        data_dir,
        max_record_bytes,
        settings.lease_ms,
        clock,
    )
    .await
}

/// With leases on (`lease_ms` above 0; 0: `Ok(None)` at once), before the
/// engine opens: reads who holds the prefix and its lease
/// ([`LeaseView`]).
///
/// - Nobody yet, or this data directory: `Ok(None)`, the usual start goes
///   on (and claims epoch 1, or resumes its own); except when this
///   directory holds the latest epoch but the latest manifest is of an
///   older one (a take-over that stopped between its epoch and its
///   manifest): that take-over is finished, as a start with `--take-over`
///   would, and `Ok(Some(_))`.
/// - Another writer whose lease expired by `clock` (this engine's): a WARN line
///   naming it and how long ago its lease was last renewed, then the
///   take-over `--take-over` runs ([`super::take_over_leased`]), checking
///   the lease again right before it claims the next epoch; `Ok(Some(_))`
///   to open the engine on and start shipping with, as after
///   `--take-over`.
/// - Another writer whose lease is live, or that holds the prefix without a
///   lease: [`ArchiveStartError::Held`], its `lease` saying when the lease
///   expires (or that it never does).
///
/// Errors as [`super::take_over_on`] does for the take-over itself.
pub async fn take_over_if_expired_on(
    store: ArchiveStore,
    data_dir: &Path,
    max_record_bytes: u32,
    lease_ms: u64,
    clock: &dyn Clock,
) -> Result<Option<TakenOver>, ArchiveStartError> {
    if lease_ms == 0 {
        return Ok(None);
    }
    let mine = read_writer_file(&spark_log_format::OsFs, data_dir)?;
    let Some(doc) = store.latest_epoch().await? else {
        return Ok(None);
    };
    let latest = store.latest_manifest().await?;
    if mine
        .as_ref()
        .is_some_and(|me| me.writer == doc.writer && me.epoch == doc.epoch)
    {
        if latest.as_ref().is_some_and(|m| m.epoch < doc.epoch) {
            tracing::warn!(
                epoch = doc.epoch,
                "archive: this directory took epoch {} but its take-over stopped before its \
                 manifest; finishing it",
                doc.epoch
            );
            return take_over_leased(store, data_dir, max_record_bytes, lease_ms, None)
                .await
                .map(Some);
        }
        return Ok(None);
    }
    let view = LeaseView::of(&doc, latest.as_ref());
    let now_ms = clock.now_ms();
    if view.expires_in_ms(lease_ms, now_ms) != Some(0) {
        return Err(view.refusal(lease_ms, now_ms, ""));
    }
    tracing::warn!(
        writer = %view.writer,
        epoch = view.epoch,
        renewed_ms_ago = view.age_ms(now_ms),
        lease_ms = view.effective_ms(lease_ms).unwrap_or(0),
        "archive: the lease of writer {} (epoch {}) expired: it was last renewed {} ms ago; \
         taking the prefix over without --take-over (that engine is fenced if it comes back)",
        view.writer,
        view.epoch,
        view.age_ms(now_ms)
    );
    take_over_leased(
        store,
        data_dir,
        max_record_bytes,
        lease_ms,
        Some((&view, clock)),
    )
    .await
    .map(Some)
}

/// Refuses a directory `spark-replay restore --at` cut short of the
/// archive ([`spark_core::layout::restored_at_file`]), before anything is
/// read or taken: the catch-up would fetch the ops the cut left out back,
/// undoing the `--at` without a word, and the archive cannot be rolled
/// back. The same answer wherever the cut falls in a chunk.
fn refuse_a_cut_restore(data_dir: &Path) -> Result<(), ArchiveStartError> {
    let path = spark_core::layout::restored_at_file(data_dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(local(&path, source)),
    };
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let seq = doc["seq"]
        .as_u64()
        .map_or("?".to_owned(), |s| s.to_string());
    let archived = doc["archived_seq"]
        .as_u64()
        .map_or("?".to_owned(), |s| s.to_string());
    Err(ArchiveStartError::TakeOver(format!(
        "{} says this directory was restored with `--at` to seq {seq}, leaving out the ops \
         up to seq {archived} the archive held: a take-over brings the local log to the \
         archive's end and would fetch them back, and the archive cannot be rolled back. To \
         go on from seq {seq}, ship this directory to a new prefix (`[archive] url`); to take \
         the prefix over, restore without `--at` into an empty directory (nothing was taken)",
        path.display()
    )))
}

/// The manifest after `latest` for `epoch` (with a lease of `lease_ms`),
/// naming exactly its entries.
fn takeover_manifest(latest: Option<&Manifest>, epoch: u64, lease_ms: u64) -> Manifest {
    match latest {
        Some(m) => Manifest {
            number: m.number + 1,
            epoch,
            written_ms: spark_log_format::system_now_ms(),
            lease_ms,
            // The same entries: it applies no compaction.
            compactions: Vec::new(),
            ..m.clone()
        },
        None => Manifest {
            number: 1,
            epoch,
            written_ms: spark_log_format::system_now_ms(),
            lease_ms,
            ..Manifest::empty()
        },
    }
}

impl TakenOver {
    /// [`super::start()`] on the store the take-over used (building an S3
    /// client again costs tens of milliseconds), once the engine is open.
    pub async fn start(
        &self,
        settings: &ArchiveSettings,
        data_dir: &Path,
        engine: std::sync::Arc<Engine>,
        max_record_bytes: u32,
    ) -> Result<Shipping, ArchiveStartError> {
        start_on_retained(
            self.store.clone(),
            data_dir,
            engine,
            max_record_bytes,
            std::time::Duration::from_millis(settings.ship_interval_ms),
            settings.lease_ms,
            settings.retention_ms,
        )
        .await
    }

    /// Fetches into the blob store every blob a `media.put` op of `engine`
    /// names that is missing locally (the ops the take-over appended from
    /// the archive), each checked against its SHA-256 and size. Returns how
    /// many it fetched.
    pub async fn fetch_missing_blobs(
        &self,
        engine: &Engine,
        data_dir: &Path,
    ) -> Result<usize, ArchiveStartError> {
        let media = engine.read(|mirror| {
            mirror
                .media
                .values()
                .map(|m| (m.sha256.0, m.size_bytes))
                .collect()
        });
        let mut fetched = 0;
        for (sha, size) in distinct(media) {
            match fetch_blob(&self.store, data_dir, &sha, size).await? {
                BlobFetch::Fetched => fetched += 1,
                BlobFetch::AlreadyLocal => {}
                BlobFetch::Lost(_) => {
                    return Err(ArchiveStartError::Store(StoreError::Missing {
                        key: blob_key(self.store.prefix(), &sha),
                    }))
                }
            }
        }
        Ok(fetched)
    }
}

/// `(sha256, size)` pairs sorted, each once.
pub(crate) fn distinct(mut media: Vec<([u8; 32], u64)>) -> Vec<([u8; 32], u64)> {
    media.sort_unstable();
    media.dedup();
    media
}

/// What [`fetch_blob`] did.
#[derive(Debug)]
pub(crate) enum BlobFetch {
    /// The blob was fetched, checked and written durably.
    Fetched,
    /// The blob store holds it already (nothing fetched).
    AlreadyLocal,
    /// The archive holds no blob object but the writer's `missing/` marker
    /// (ARCHIVE.md "Missing blob"): its reason. Nothing written.
    Lost(String),
}

/// Fetches blob `sha` (`size` bytes, as its `media.put` op names it) from
/// the archive into `data_dir`'s blob store unless it is there already:
/// the object's SHA-256 and size are checked before anything is written
/// (temporary file, fsync, rename, directory fsync). The one rule for the
/// take-over and for read replicas ([`crate::replica`]).
///
/// Errors: the store unreachable; a blob whose bytes are not what the op
/// names ([`ArchiveStartError::Diverged`], naming the key); neither a blob
/// nor a marker ([`StoreError::Missing`]); a damaged marker; a local write.
pub(crate) async fn fetch_blob(
    store: &ArchiveStore,
    data_dir: &Path,
    sha: &[u8; 32],
    size: u64,
) -> Result<BlobFetch, ArchiveStartError> {
    let blobs_dir = spark_core::blob::blobs_dir(data_dir);
    let path = spark_core::blob::blob_path(&blobs_dir, sha);
    if path.exists() {
        return Ok(BlobFetch::AlreadyLocal);
    }
    let key = blob_key(store.prefix(), sha);
    let Some(bytes) = store.get(&key).await? else {
        let marker_key = spark_archive::layout::missing_key(store.prefix(), sha);
        let marker = store
            .get(&marker_key)
            .await?
            .ok_or(StoreError::Missing { key })?;
        let doc =
            spark_archive::layout::MissingBlobDoc::decode(&marker, sha).map_err(|source| {
                StoreError::Damaged {
                    key: marker_key,
                    source,
                }
            })?;
        return Ok(BlobFetch::Lost(doc.reason));
    };
    let digest: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(&bytes).into();
    if digest != *sha || bytes.len() as u64 != size {
        return Err(ArchiveStartError::Diverged(format!(
            "object {key} is damaged: {} bytes with SHA-256 {}, the media.put op says {size} \
             bytes with SHA-256 {}",
            bytes.len(),
            hex::encode(digest),
            hex::encode(sha)
        )));
    }
    crate::engine::create_dir_durably(&blobs_dir).map_err(|e| local(&blobs_dir, e))?;
    OsFs.write_file_durably(&path, &bytes)
        .map_err(|e| local(&path, e))?;
    Ok(BlobFetch::Fetched)
}

fn local(path: &Path, source: std::io::Error) -> ArchiveStartError {
    ArchiveStartError::Local {
        path: path.display().to_string(),
        source,
    }
}

/// What [`diverged`] appends to its message: the advice for a take-over.
pub(crate) const DIVERGED_ADVICE: &str =
    "; the local log is not a prefix of the archive, so this directory cannot take the prefix \
     over: restore it from the archive into an empty directory (`spark-replay restore`) and \
     take over from there";

fn diverged(message: String) -> ArchiveStartError {
    ArchiveStartError::Diverged(format!("{message}{DIVERGED_ADVICE}"))
}

/// The take-over's and the replica's way to [`spark_archive::catch_up`]:
/// the local log in `log_dir` brought to what `manifest` names (`None`: an
/// empty archive), on the real file system, with no cut. `allow_more`:
/// accept a local log that holds more than the manifest (this directory's
/// own ops, not shipped yet: the shipper's start checks them).
/// `follow_compactions`: a replica following the archive manifest by
/// manifest replaces what the manifest's compactions rewrote
/// ([`spark_archive::Options::follow_compactions`]); the
/// take-over never sets it. Logs the merged chunk a local tail ended
/// inside, when one was fetched whole. Returns what was written.
pub(crate) async fn catch_up(
    store: &ArchiveStore,
    log_dir: &Path,
    manifest: Option<&Manifest>,
    max_record_bytes: u32,
    allow_more: bool,
    follow_compactions: bool,
) -> Result<spark_archive::CaughtUp, CatchUpError> {
    let caught = spark_archive::catch_up(
        store,
        &OsFs,
        log_dir,
        manifest,
        max_record_bytes,
        CatchUpOptions {
            allow_more,
            keep: None,
            follow_compactions,
        },
    )
    .await?;
    if let Some(chunk) = &caught.merged_chunk {
        tracing::info!(
            chunk = %chunk,
            "archive: the local tail ended inside a merged chunk; the chunk was fetched whole"
        );
    }
    Ok(caught)
}

/// A catch-up's failure as the take-over (and a replica's start) reports
/// it: a local log that is not a prefix is [`ArchiveStartError::Diverged`]
/// with [`DIVERGED_ADVICE`] appended; a manifest that lists an object out
/// of seq order is the manifest's damage.
impl From<CatchUpError> for ArchiveStartError {
    fn from(e: CatchUpError) -> ArchiveStartError {
        match e {
            CatchUpError::Store(e) => ArchiveStartError::Store(e),
            CatchUpError::Diverged(why) => diverged(why.to_string()),
            CatchUpError::Local { path, source } => local(&path, source),
            CatchUpError::OutOfOrder {
                manifest_key,
                what,
                key,
                first_seq,
                expected,
                ..
            } => ArchiveStartError::Store(StoreError::Damaged {
                key: manifest_key,
                source: ObjectError::Mismatch(format!(
                    "{what} {key} starts at seq {first_seq}, expected {expected}"
                )),
            }),
        }
    }
}
