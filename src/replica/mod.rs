//! Read replicas (SPEC section 11): `spark-engine replica --from
//! s3://BUCKET/PREFIX` serves every read route from an archive
//! (`archive/ARCHIVE.md`) and follows it as it grows. Writes answer
//! `421 read_only` ([`crate::api`]).
//!
//! The data directory is a cache. At start the local log is brought to the
//! latest manifest with the catch-up the take-over and restore run too
//! ([`spark_archive::catch_up()`]: the local log must be a prefix of the
//! archive; what the archive holds past it is fetched and checked object by
//! object against the manifest's lengths, BLAKE3 and chain values), so a
//! restart fetches only what was added since; then the engine opens on it
//! as a writer would (full recovery and replay), and every blob its media
//! name is fetched by SHA-256 and checked ([`crate::archive::fetch_blob`]).
//! A cache that is not a prefix of the archive (another archive's, or
//! damaged) is set aside and fetched again.
//!
//! Following: every `replica.poll_interval_ms` the replica GETs the next
//! manifest's predicted key (`manifest/N+1`); when it is not there, one
//! LIST page after `manifest/N` tells "caught up" from a gap (a later
//! manifest with `N+1` missing: damage, named in `/readyz`). Once one is
//! found it reads ahead (the keys after it, several at once). Each manifest
//! found is checked ([`Manifest::decode`], and [`extends`] against the one
//! before); for the last of the run, the new objects are fetched and appended to the local log by the
//! same catch-up, the blobs its new `media.put` ops name are fetched, and
//! only then are the ops folded and published
//! ([`Engine::apply_replicated`]): the head, the committed seq and the
//! change notices, so `/api/events` catches up from the local log and tails
//! live exactly as on the writer. A failure (the store unreachable, a
//! damaged object) changes nothing that is served: the replica keeps
//! serving what it verified, tries again after a backoff, and says why in
//! `/readyz`; its lag grows. Keys come from manifests only, so chunks a
//! fenced writer stored past a take-over point are never read.
//!
//! Compactions (SPEC section 13): a manifest that applies one is applied on
//! its own, right after the one before it; the catch-up replaces the cached
//! segments it rewrote and the re-chained tail
//! ([`spark_archive::Options::follow_compactions`]), the fold of its
//! `log.compact` record erases the moments, and the cached blobs and
//! checkpoints that held their content are removed with the compactor's
//! rules ([`crate::retention`]). A restart on a cache made before a
//! compaction follows it from the manifest the cache file names.
//!
//! Lag (`lag_ms` of `/api/log/head`, `spark_replica_lag_seconds`): how long
//! ago the replica last knew it held everything the archive held: the time
//! since the send of the last GET that found no manifest after the one
//! applied. Caught up and reachable, it stays below one poll interval plus
//! one round trip; with the store unreachable it grows.

pub mod metrics;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::json;
use spark_archive::layout::{extends, manifest_key, Manifest};
use spark_archive::{ArchiveStore, CatchUpError, StoreConfig, StoreError};
use spark_core::wire::events::EventCursor;
use spark_log_format::format::segment_file_name;
use spark_log_format::{Fs, Head, OsFs};

use crate::archive::{catch_up, distinct, fetch_blob, ArchiveStartError, BlobFetch};
use crate::config::Settings;
use crate::engine::Engine;
use crate::media::MediaStore;
use spark_core::ids::Id;
use spark_core::op::{Op, OpBody};
use std::collections::HashSet;

/// The file in a replica's data directory that names the archive it
/// caches and the last manifest applied: JSON `{"url": "s3://…",
/// "manifest": N}`, written durably after each manifest is applied.
pub const CACHE_FILE: &str = "replica-manifest";

/// The longest wait between two tries while following fails.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Why a replica did not start.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaStartError {
    /// The settings do not make a store (the URL, the endpoint, no
    /// credentials).
    #[error("replica: {0}")]
    Config(String),
    /// The archive could not be read, or an object failed its check (the
    /// message names the object).
    #[error("replica: {0}")]
    Archive(#[from] ArchiveStartError),
    /// The store is unreachable and the cache holds nothing to serve.
    #[error("replica: the archive cannot be read ({0}) and the cache in the data directory holds nothing yet: start again once the store is reachable")]
    NothingToServe(String),
    /// The cache directory could not be used.
    #[error("replica: {path}: {source}")]
    Local {
        /// The file or directory.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl From<StoreError> for ReplicaStartError {
    fn from(e: StoreError) -> ReplicaStartError {
        ReplicaStartError::Archive(ArchiveStartError::Store(e))
    }
}

/// What the cache file says.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
struct CacheFile {
    url: String,
    manifest: u64,
}

/// Wall-clock milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    spark_log_format::system_now_ms()
}

/// What `/readyz`, `/api/log/head` and the metrics tell about a replica.
pub struct ReplicaStatus {
    url: String,
    writer_url: Option<String>,
    ready_lag_max_ms: u64,
    engine: Arc<Engine>,
    /// The number of the last manifest applied (0: none).
    manifest: AtomicU64,
    /// Its epoch.
    epoch: AtomicU64,
    /// When the replica last knew it held all the archive held (the send
    /// time of the last GET that found no newer manifest), Unix ms; 0:
    /// never yet.
    caught_up_at_ms: AtomicU64,
    /// When the replica started, Unix ms.
    started_ms: u64,
    /// Why the last try to follow failed, until one succeeds.
    failing: Mutex<Option<String>>,
    /// Set when following stopped for good (a fold refused a verified op,
    /// a bug); the reason.
    stopped: Mutex<Option<String>>,
}

impl std::fmt::Debug for ReplicaStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaStatus")
            .field("url", &self.url)
            .field("manifest", &self.manifest.load(Ordering::Acquire))
            .finish_non_exhaustive()
    }
}

impl metrics::Watched for ReplicaStatus {
    fn seq(&self) -> u64 {
        ReplicaStatus::seq(self)
    }
    fn lag_ms(&self) -> u64 {
        ReplicaStatus::lag_ms(self)
    }
}

impl ReplicaStatus {
    /// The writer's address (`replica.writer_url`), named in `421
    /// read_only` answers; `None` when not configured.
    pub fn writer_url(&self) -> Option<&str> {
        self.writer_url.as_deref()
    }

    /// The last seq applied (and served).
    pub fn seq(&self) -> u64 {
        self.engine.head().seq
    }

    /// Milliseconds since the replica last knew it held everything the
    /// archive held (see the module doc); since its start before the first
    /// such moment.
    pub fn lag_ms(&self) -> u64 {
        let at = match self.caught_up_at_ms.load(Ordering::Acquire) {
            0 => self.started_ms,
            at => at,
        };
        now_ms().saturating_sub(at)
    }

    /// Why following fails now (the store unreachable, a damaged object,
    /// named), or stopped for good; `None` while it works.
    pub fn failing(&self) -> Option<String> {
        if let Some(stopped) = self.stopped.lock().clone() {
            return Some(format!("following stopped: {stopped}"));
        }
        self.failing.lock().clone()
    }

    /// Why the replica serves nothing yet: no manifest was read (an empty
    /// prefix, or a wrong `--from`); `None` once one was. Reads answer
    /// `503` with this, not an empty state that looks like the writer's.
    pub fn before_first_manifest(&self) -> Option<String> {
        (self.manifest.load(Ordering::Acquire) == 0).then(|| {
            format!(
                "no manifest under {} yet: the replica serves nothing until the writer stores \
                 one (is --from the writer's [archive] url?)",
                self.url
            )
        })
    }

    /// Why `/readyz` should answer `503`: following fails, no manifest
    /// was read yet (an empty prefix, or a wrong `--from`), or the lag is
    /// above `replica.ready_lag_max_ms`; `None` when ready.
    pub fn not_ready(&self) -> Option<String> {
        if let Some(failing) = self.failing() {
            return Some(format!(
                "the replica cannot follow the archive {} ({failing}); it serves what it has, {} ms behind",
                self.url,
                self.lag_ms()
            ));
        }
        if let Some(empty) = self.before_first_manifest() {
            return Some(empty);
        }
        let lag_ms = self.lag_ms();
        (lag_ms > self.ready_lag_max_ms).then(|| {
            format!(
                "the replica is {lag_ms} ms behind the archive {} (replica.ready_lag_max_ms is {})",
                self.url, self.ready_lag_max_ms
            )
        })
    }

    /// The `replica` member of `/readyz`: `url`, `seq`, `manifest`,
    /// `epoch`, `lag_ms`, `error` (or `null`).
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "url": self.url,
            "seq": self.seq(),
            "manifest": self.manifest.load(Ordering::Acquire),
            "epoch": self.epoch.load(Ordering::Acquire),
            "lag_ms": self.lag_ms(),
            "error": self.failing(),
        })
    }

    fn applied(&self, manifest: &Manifest) {
        self.manifest.store(manifest.number, Ordering::Release);
        self.epoch.store(manifest.epoch, Ordering::Release);
    }
}

/// A replica's cache brought to the archive, before the engine opens on it
/// ([`prepare`]).
pub struct Prepared {
    store: ArchiveStore,
    url: String,
    data_dir: PathBuf,
    /// The manifest the local log equals, if any (`None`: an empty archive,
    /// or the store was unreachable and the cache is served as it is).
    manifest: Option<Manifest>,
    /// The number of the last manifest applied (0: none).
    number: u64,
    /// Why the store could not be read at start, when the cache is served.
    unreachable: Option<String>,
    /// When the archive was last seen to hold nothing newer, Unix ms.
    caught_up_at_ms: u64,
    max_record_bytes: u32,
}

/// The store `settings` name for `--from`.
fn connect(settings: &Settings, url: &str) -> Result<ArchiveStore, ReplicaStartError> {
    let endpoint = Some(settings.replica.endpoint.clone()).filter(|e| !e.is_empty());
    ArchiveStore::connect(&StoreConfig {
        url: url.to_owned(),
        endpoint,
        region: settings.replica.region.clone(),
    })
    .map_err(|e| ReplicaStartError::Config(e.to_string()))
}

fn local(path: &Path, source: std::io::Error) -> ReplicaStartError {
    ReplicaStartError::Local {
        path: path.display().to_string(),
        source,
    }
}

/// `<data>/replica-manifest` on `fs` ([`OsFs`] outside tests): `None`
/// when there is none, or when it does not parse (the cache is then
/// checked against the archive as if it had no record).
fn read_cache_file(fs: &dyn Fs, data_dir: &Path) -> Result<Option<CacheFile>, ReplicaStartError> {
    let path = data_dir.join(CACHE_FILE);
    match fs.map(&path) {
        Ok(bytes) => Ok(serde_json::from_slice((*bytes).as_ref()).ok()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(local(&path, e)),
    }
}

/// Records the archive `url` and the manifest applied as
/// `<data>/replica-manifest` on `fs`, durably ([`Fs::write_file_durably`]):
/// a power cut leaves the old record or the new one, whole.
fn write_cache_file(fs: &dyn Fs, data_dir: &Path, url: &str, manifest: u64) -> std::io::Result<()> {
    let doc = CacheFile {
        url: url.to_owned(),
        manifest,
    };
    let bytes = serde_json::to_vec(&doc).map_err(std::io::Error::other)?;
    fs.write_file_durably(&data_dir.join(CACHE_FILE), &bytes)
}

/// Sets the cached log aside (`log` becomes `log.stale-<ms>`) so that it
/// is fetched again; blobs are kept (they are checked by their SHA-256).
/// The renames are made durable (the data directory is fsynced), so that a
/// power cut does not bring the stale log back.
fn set_cache_aside(data_dir: &Path, why: &str) -> Result<(), ReplicaStartError> {
    let log_dir = spark_core::layout::log_dir(data_dir);
    if log_dir.exists() {
        let aside = data_dir.join(format!("log.stale-{}", now_ms()));
        tracing::warn!(
            reason = why,
            aside = %aside.display(),
            "replica: the cached log is not a prefix of the archive; it is set aside and fetched again"
        );
        std::fs::rename(&log_dir, &aside).map_err(|e| local(&log_dir, e))?;
    }
    // Its checkpoints are of that log: set aside with it.
    let checkpoints = spark_core::checkpoint::checkpoint_dir(data_dir);
    if checkpoints.exists() {
        let aside = data_dir.join(format!("checkpoint.stale-{}", now_ms()));
        std::fs::rename(&checkpoints, &aside).map_err(|e| local(&checkpoints, e))?;
    }
    let _ = std::fs::remove_file(data_dir.join(CACHE_FILE));
    OsFs.sync_dir(data_dir).map_err(|e| local(data_dir, e))
}

/// `spark-engine replica`, before the engine opens: connects to the
/// archive of `--from`, finds its latest manifest (checked for gaps and
/// against the one before it, ARCHIVE.md "Gaps") and brings the cache's
/// log to it. A prefix with no manifest starts with a WARN, and `/readyz`
/// answers `503` until one is read. With the store
/// unreachable, a cache that holds a log is served as it is (following
/// starts once the store answers); an empty one refuses the start.
///
/// Errors: the settings, a damaged object (named), a local file.
pub async fn prepare(settings: &Settings) -> Result<Prepared, ReplicaStartError> {
    let url = settings
        .replica_from
        .clone()
        .ok_or_else(|| ReplicaStartError::Config("no --from".into()))?;
    let store = connect(settings, &url)?;
    let data_dir = settings.data_dir.clone();
    let max_record_bytes = settings.log.max_record_bytes;
    let _lock = crate::engine::lock_data_dir(&data_dir).map_err(|e| {
        local(
            &data_dir,
            std::io::Error::other(format!("cannot lock the cache: {e}")),
        )
    })?;
    let log_dir = spark_core::layout::log_dir(&data_dir);
    let cached = read_cache_file(&OsFs, &data_dir)?;
    if cached.as_ref().is_some_and(|c| c.url != url) || (cached.is_none() && log_dir.exists()) {
        set_cache_aside(
            &data_dir,
            "the cache belongs to another archive, or to none",
        )?;
    }
    let cached = read_cache_file(&OsFs, &data_dir)?;
    let probe_sent_ms = now_ms();
    let latest = match store.latest_manifest().await {
        Ok(latest) => latest,
        Err(e @ StoreError::Unreachable { .. }) => {
            let Some(cached) = cached.filter(|c| c.manifest > 0) else {
                return Err(ReplicaStartError::NothingToServe(e.to_string()));
            };
            tracing::warn!(error = %e, manifest = cached.manifest,
                "replica: the archive is unreachable; serving the cache as it is until it answers");
            return Ok(Prepared {
                store,
                url,
                data_dir,
                manifest: None,
                number: cached.manifest,
                unreachable: Some(e.to_string()),
                caught_up_at_ms: 0,
                max_record_bytes,
            });
        }
        Err(e) => return Err(e.into()),
    };
    if latest.is_none() {
        tracing::warn!(url = %url,
            "replica: no manifest under this prefix: nothing to serve, and /readyz answers 503, \
             until the writer stores one (is --from the writer's [archive] url?)");
    }
    // An empty cache starts from the archive's checkpoint, if any.
    let mut fresh = cached.is_none();
    let mut latest = latest;
    let mut caught_up_at_ms = probe_sent_ms;
    crate::engine::create_dir_durably(&log_dir).map_err(|e| local(&log_dir, e))?;
    match catch_up(&store, &log_dir, latest.as_ref(), max_record_bytes, false, false)
        .await
        .map_err(ArchiveStartError::from)
    {
        Ok(_) => {}
        Err(ArchiveStartError::Diverged(why))
            if from_the_named_manifest(&store, cached.as_ref(), latest.as_ref(), &log_dir, max_record_bytes)
                .await
                .is_some_and(|named| {
                    tracing::info!(manifest = named.number, latest = ?latest.as_ref().map(|m| m.number), why = %why,
                        "replica: the cache is not a prefix of the latest manifest, but is the manifest it names: \
                         following the archive from there (a compaction since is followed in place)");
                    latest = Some(named);
                    caught_up_at_ms = 0;
                    true
                }) => {}
        Err(ArchiveStartError::Diverged(why)) => {
            set_cache_aside(&data_dir, &why)?;
            fresh = true;
            crate::engine::create_dir_durably(&log_dir).map_err(|e| local(&log_dir, e))?;
            catch_up(&store, &log_dir, latest.as_ref(), max_record_bytes, false, false)
                .await
                .map_err(ArchiveStartError::from)?;
        }
        Err(e) => return Err(e.into()),
    }
    if let Some(manifest) = latest.as_ref().filter(|_| fresh) {
        if settings.log.checkpoint_interval_ops > 0 {
            install_checkpoint(&store, manifest, &data_dir).await;
        }
    }
    let number = latest.as_ref().map_or(0, |m| m.number);
    Ok(Prepared {
        store,
        url,
        data_dir,
        manifest: latest,
        number,
        unreachable: None,
        caught_up_at_ms,
        max_record_bytes,
    })
}

/// A cache that is not a prefix of the `latest` manifest may be one made
/// before a compaction the archive applied since (a replica stopped, then
/// started after the writer compacted): when the cache file names a
/// manifest before the latest, that manifest is read and checked, and the
/// cache brought to it. `Some(it)`: the follower goes on from there,
/// following each compaction in place ([`Follower::step`]); `None` (no
/// such manifest, or the cache is not a prefix of it either): the cache is
/// set aside as before.
async fn from_the_named_manifest(
    store: &ArchiveStore,
    cached: Option<&CacheFile>,
    latest: Option<&Manifest>,
    log_dir: &Path,
    max_record_bytes: u32,
) -> Option<Manifest> {
    let named = cached?.manifest;
    if named == 0 || latest.is_none_or(|l| l.number <= named) {
        return None;
    }
    let manifest = read_manifest(store, named).await.ok()??;
    catch_up(
        store,
        log_dir,
        Some(&manifest),
        max_record_bytes,
        false,
        false,
    )
    .await
    .ok()?;
    Some(manifest)
}

/// Manifest `number` of `store`, checked (frame, number); `None` when no
/// object has its key.
async fn read_manifest(store: &ArchiveStore, number: u64) -> Result<Option<Manifest>, StoreError> {
    let key = manifest_key(store.prefix(), number);
    let Some(bytes) = store.get(&key).await? else {
        return Ok(None);
    };
    let manifest =
        Manifest::decode(&bytes, number).map_err(|source| StoreError::Damaged { key, source })?;
    Ok(Some(manifest))
}

/// A replica starting on an empty cache (ARCHIVE.md "Replicas"): the
/// newest checkpoint `manifest` lists that is valid against the log just
/// fetched ([`spark_archive::checkpoint::install_newest`]) is written into
/// the cache's `checkpoint/`, so that the engine opens from it and folds
/// only the ops after it. One that is missing, damaged or stale is ignored
/// with a WARN naming the object; the engine checks the one installed
/// again when it loads it, and replays the whole log if it fails.
async fn install_checkpoint(store: &ArchiveStore, manifest: &Manifest, data_dir: &Path) {
    let log_dir = spark_core::layout::log_dir(data_dir);
    let (installed, skipped) =
        spark_archive::checkpoint::install_newest(store, manifest, data_dir, &log_dir, |entry| {
            entry.seq <= manifest.shipped_seq
        })
        .await;
    for skipped in skipped {
        tracing::warn!(key = %skipped.key, why = %skipped.why,
            "replica: archived checkpoint ignored; the engine folds the log without it");
    }
    if let Some(installed) = installed {
        tracing::info!(key = %installed.key, seq = installed.header.at.seq,
            file = %installed.file.display(),
            "replica: starting from the archived checkpoint");
    }
}

/// A running follower: its status, and how to stop it. It runs on a
/// thread of its own (named `spark-replica`, with a runtime of its own),
/// so that its file work (reading, hashing and writing segments) never
/// holds up the threads that serve requests.
pub struct Following {
    /// What it reports.
    pub status: Arc<ReplicaStatus>,
    stop: tokio::sync::watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

impl Following {
    /// Stops following (a fetch in flight is abandoned; what was applied
    /// stays in the cache) and waits for its thread.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

impl Prepared {
    /// Once the engine is open on the cache: fetches the blobs its media
    /// name (checked by SHA-256 and size), records the manifest applied,
    /// and starts following the archive; `media` is the server's media
    /// store (the blobs of moments a followed compaction erases are
    /// removed through it).
    ///
    /// Errors: a blob whose object is damaged (named) or missing with no
    /// marker, the store unreachable while blobs are missing, a local file.
    pub async fn start(
        self,
        settings: &Settings,
        engine: Arc<Engine>,
        media: MediaStore,
    ) -> Result<Following, ReplicaStartError> {
        if self.unreachable.is_none() {
            fetch_media_blobs(&self.store, &self.data_dir, &engine, None).await?;
            write_cache_file(&OsFs, &self.data_dir, &self.url, self.number)
                .map_err(|e| local(&self.data_dir.join(CACHE_FILE), e))?;
        }
        let replica = &settings.replica;
        let status = Arc::new(ReplicaStatus {
            url: self.url.clone(),
            writer_url: Some(replica.writer_url.clone()).filter(|w| !w.is_empty()),
            ready_lag_max_ms: replica.ready_lag_max_ms,
            engine: Arc::clone(&engine),
            manifest: AtomicU64::new(self.number),
            epoch: AtomicU64::new(self.manifest.as_ref().map_or(0, |m| m.epoch)),
            caught_up_at_ms: AtomicU64::new(self.caught_up_at_ms),
            started_ms: now_ms(),
            failing: Mutex::new(self.unreachable.clone()),
            stopped: Mutex::new(None),
        });
        metrics::watch(&status);
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let self_data_dir = self.data_dir.clone();
        let follower = Follower {
            store: self.store,
            url: self.url,
            data_dir: self.data_dir,
            max_record_bytes: self.max_record_bytes,
            engine,
            media,
            status: Arc::clone(&status),
            prev: self.manifest,
            number: self.number,
            poll_interval: Duration::from_millis(replica.poll_interval_ms),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| local(&self_data_dir, e))?;
        let thread = std::thread::Builder::new()
            .name("spark-replica".into())
            .spawn(move || runtime.block_on(follower.run(stopping)))
            .map_err(|e| local(&self_data_dir, e))?;
        Ok(Following {
            status,
            stop,
            thread,
        })
    }
}

/// Manifest keys a follower GETs at once once it found one more (each
/// checked, only the last one applied: [`Follower::step`]).
const READ_AHEAD: u64 = 16;
/// At most this many manifests are read and checked before one is applied.
const MOST_PER_STEP: usize = 256;

/// Blobs fetched at once (each is checked in memory before it is written).
const BLOB_FETCHES_AT_ONCE: usize = 8;

/// Fetches every blob the mirror's media name (but an erased moment's) that the cache lacks
/// (`only`: just these `(sha256, size)` pairs), [`BLOB_FETCHES_AT_ONCE`] at
/// a time; a blob the writer recorded lost (a `missing/` marker) is left
/// out with a WARN line, as restore does. Returns how many were fetched.
async fn fetch_media_blobs(
    store: &ArchiveStore,
    data_dir: &Path,
    engine: &Engine,
    only: Option<Vec<([u8; 32], u64)>>,
) -> Result<usize, ArchiveStartError> {
    let media = match only {
        Some(media) => media,
        // An erased moment's blobs are gone on purpose (SPEC section 13),
        // though the archive may still hold them (superseded objects).
        None => engine.read(|mirror| {
            mirror
                .media
                .values()
                .filter(|m| !mirror.is_erased(m.moment_id))
                .map(|m| (m.sha256.0, m.size_bytes))
                .collect()
        }),
    };
    use futures_util::StreamExt;
    let mut results = futures_util::stream::iter(distinct(media))
        .map(|(sha, size)| async move { (sha, fetch_blob(store, data_dir, &sha, size).await) })
        .buffer_unordered(BLOB_FETCHES_AT_ONCE);
    let mut fetched = 0;
    while let Some((sha, result)) = results.next().await {
        match result? {
            BlobFetch::Fetched => fetched += 1,
            BlobFetch::AlreadyLocal => {}
            BlobFetch::Lost(reason) => tracing::warn!(
                sha256 = %hex::encode(sha),
                reason,
                "replica: the writer lost this blob before it was archived; its media cannot be served"
            ),
        }
    }
    Ok(fetched)
}

/// Why one step of following failed.
#[derive(Debug, thiserror::Error)]
enum FollowError {
    /// Tried again after a backoff (the store unreachable, a damaged
    /// object, a manifest that does not extend the one before).
    #[error("{0}")]
    Retry(String),
    /// Following stops (a verified op the fold refuses: a bug).
    #[error("{0}")]
    Stop(String),
}

impl From<ArchiveStartError> for FollowError {
    fn from(e: ArchiveStartError) -> FollowError {
        FollowError::Retry(e.to_string())
    }
}

impl From<StoreError> for FollowError {
    fn from(e: StoreError) -> FollowError {
        FollowError::Retry(e.to_string())
    }
}

struct Follower {
    store: ArchiveStore,
    /// The server's media store: blobs of erased moments are removed
    /// through it ([`Follower::forget`]).
    media: MediaStore,
    url: String,
    data_dir: PathBuf,
    max_record_bytes: u32,
    engine: Arc<Engine>,
    status: Arc<ReplicaStatus>,
    /// The last manifest applied, when known (not after a start on the
    /// cache alone).
    prev: Option<Manifest>,
    /// Its number (0: none yet).
    number: u64,
    poll_interval: Duration,
}

impl Follower {
    async fn run(mut self, mut stopping: tokio::sync::watch::Receiver<bool>) {
        let mut backoff = self.poll_interval;
        let mut wait = if self.status.failing().is_some() {
            Duration::ZERO
        } else {
            self.poll_interval
        };
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stopping.wait_for(|stop| *stop) => return,
            }
            let step = tokio::select! {
                step = self.step() => step,
                _ = stopping.wait_for(|stop| *stop) => return,
            };
            wait = match step {
                Ok(found) => {
                    *self.status.failing.lock() = None;
                    backoff = self.poll_interval;
                    if found {
                        Duration::ZERO
                    } else {
                        self.poll_interval
                    }
                }
                Err(FollowError::Retry(why)) => {
                    metrics::get().failures.inc();
                    let first = self.status.failing.lock().replace(why.clone()).is_none();
                    if first {
                        tracing::warn!(error = %why, "replica: following the archive fails; serving what was verified, trying again");
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    backoff
                }
                Err(FollowError::Stop(why)) => {
                    tracing::error!(error = %why, "replica: following stopped; serving what was verified until a restart");
                    *self.status.stopped.lock() = Some(why);
                    return;
                }
            };
        }
    }

    /// One poll: GETs the next manifest's key. When found, reads on (the
    /// next [`READ_AHEAD`] keys at once, while each window is found whole,
    /// up to [`MOST_PER_STEP`] manifests), checks each manifest (frame,
    /// number) and that it extends the one before, and applies only the
    /// last one: a writer that stores manifests faster than one catch-up
    /// per manifest is followed by one catch-up per step. Every manifest
    /// is still read and checked; the ops folded are the same. A manifest
    /// that does not extend the one before stops the run there: the ones
    /// before it are applied, then the step fails naming it.
    ///
    /// `Ok(true)`: more may be stored, look again at once; `Ok(false)`: a
    /// key was not found, and the replica is caught up as of that GET's
    /// send.
    async fn step(&mut self) -> Result<bool, FollowError> {
        let sent_ms = now_ms();
        if self.prev.is_none() && self.number > 0 {
            return self.step_to_latest(sent_ms).await;
        }
        let Some(first) = self.read_manifest(self.number + 1).await? else {
            return self.ended_at_a_missing_key(sent_ms).await;
        };
        let mut run = vec![first];
        let mut caught_up_at = None;
        // A manifest that cannot be read or checked ends the run: the ones
        // before it are applied, then the step fails with it.
        let mut failure = None;
        while caught_up_at.is_none() && failure.is_none() && run.len() < MOST_PER_STEP {
            let from = self.number + run.len() as u64 + 1;
            let sent_ms = now_ms();
            use futures_util::StreamExt;
            let mut window = futures_util::stream::iter(from..from + READ_AHEAD)
                .map(|number| self.read_manifest(number))
                .buffered(READ_AHEAD as usize);
            while let Some(found) = window.next().await {
                match found {
                    Ok(Some(manifest)) => run.push(manifest),
                    Ok(None) => {
                        caught_up_at = Some(sent_ms);
                        break;
                    }
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
        let mut fork = None;
        let mut good = 0;
        for (i, next) in run.iter().enumerate() {
            let prev = if i == 0 {
                self.prev.as_ref()
            } else {
                run.get(i - 1)
            };
            if let Some(prev) = prev {
                if let Err(why) = extends(prev, next) {
                    fork = Some((next.number, prev.number, why.to_string()));
                    break;
                }
            }
            if !next.compactions.is_empty() {
                // Its compactions are relative to the manifest before it:
                // it is applied on its own, right after that one (the next
                // step, at once), so that the cache it finds is that
                // manifest's ([`Follower::apply`]).
                if i == 0 {
                    good = 1;
                }
                break;
            }
            good = i + 1;
        }
        // Manifests read past a compaction are read again by the next step.
        let more_read = good < run.len() && fork.is_none();
        run.truncate(good);
        if let Some(last) = run.pop() {
            self.apply(&last).await?;
            self.number = last.number;
            self.status.applied(&last);
            if let Err(e) = write_cache_file(&OsFs, &self.data_dir, &self.url, last.number) {
                tracing::warn!(error = %e, "replica: cannot record the manifest applied; a restart checks the cache against the archive");
            }
            self.prev = Some(last);
        }
        if let Some((number, prev, why)) = fork {
            return Err(FollowError::Retry(format!(
                "manifest {number} ({}) does not extend manifest {prev}: {why}; the archive's \
                 history forks there, and the replica stays at seq {}",
                manifest_key(self.store.prefix(), number),
                self.engine.head().seq
            )));
        }
        if more_read {
            return Ok(true);
        }
        if let Some(failure) = failure {
            return Err(failure);
        }
        match caught_up_at {
            Some(sent_ms) => self.ended_at_a_missing_key(sent_ms).await,
            None => Ok(true),
        }
    }

    /// A run of manifests ended at `manifest/N+1` not found (N applied):
    /// caught up as of `sent_ms` (the GET's send) only if no later manifest
    /// exists either; one missing while a later one exists is a gap
    /// (damage, named; the replica stays where it is). `Ok(true)` when
    /// `N+1` was stored since the GET: step again at once.
    ///
    /// A missing `N+1` below the latest manifest's `retained_from` is no
    /// gap: the writer's retention pass deleted it (the replica fell more
    /// than `[archive] retention_ms` behind, ARCHIVE.md "Retention"); the
    /// replica then goes to the latest manifest at once, as after a start
    /// on its cache alone.
    async fn ended_at_a_missing_key(&mut self, sent_ms: u64) -> Result<bool, FollowError> {
        let prefix = self.store.prefix().to_owned();
        let nothing_after = match self
            .store
            .nothing_after(|n| manifest_key(&prefix, n), self.number)
            .await
        {
            Err(spark_archive::StoreError::Gap { key, later }) => {
                let latest = self.store.latest_manifest().await?;
                if latest.is_some_and(|m| m.retained_from > self.number + 1) {
                    tracing::info!(
                        manifest = self.number,
                        "replica: the manifests after the one applied were deleted by the \
                         archive's retention; going to the latest at once"
                    );
                    return self.step_to_latest(sent_ms).await;
                }
                return Err(spark_archive::StoreError::Gap { key, later }.into());
            }
            other => other?,
        };
        if nothing_after {
            self.status
                .caught_up_at_ms
                .store(sent_ms, Ordering::Release);
        }
        Ok(!nothing_after)
    }

    /// Manifest `number`, checked (frame, number); `None` when no object
    /// has its key.
    async fn read_manifest(&self, number: u64) -> Result<Option<Manifest>, FollowError> {
        Ok(read_manifest(&self.store, number).await?)
    }

    /// The first step after a start on the cache alone (the store was
    /// unreachable): the cache may hold more than the manifest its file
    /// names (a stop between a catch-up and the file's write), so the
    /// replica goes to the latest manifest at once; the catch-up checks
    /// that the cache is a prefix of it.
    async fn step_to_latest(&mut self, sent_ms: u64) -> Result<bool, FollowError> {
        let latest = self.store.latest_manifest().await?;
        let Some(latest) = latest.filter(|m| m.number >= self.number) else {
            return Err(FollowError::Retry(format!(
                "the archive's latest manifest is before manifest {}, which this cache \
                 applied: another archive is at this URL now (start the replica on an empty \
                 data directory)",
                self.number
            )));
        };
        if latest.number > self.number {
            if let Err(e) = self.apply(&latest).await {
                // A compaction between the manifest the cache names and
                // the latest is followed manifest by manifest from there.
                let FollowError::Retry(_) = &e else {
                    return Err(e);
                };
                let Ok(Some(named)) = self.read_manifest(self.number).await else {
                    return Err(e);
                };
                tracing::info!(manifest = self.number, latest = latest.number, error = %e,
                    "replica: the cache cannot be brought to the latest manifest at once; following \
                     the archive manifest by manifest from the one it names");
                self.prev = Some(named);
                return Ok(true);
            }
        }
        self.number = latest.number;
        self.status.applied(&latest);
        self.status
            .caught_up_at_ms
            .store(sent_ms, Ordering::Release);
        if let Err(e) = write_cache_file(&OsFs, &self.data_dir, &self.url, latest.number) {
            tracing::warn!(error = %e, "replica: cannot record the manifest applied");
        }
        self.prev = Some(latest);
        Ok(true)
    }

    /// Brings the cache's log to `manifest` (fetching and checking what it
    /// lacks), fetches the blobs of the new ops, then folds and publishes
    /// them.
    ///
    /// A manifest that applies compactions (applied right after the one
    /// before it, [`Follower::step`]) is followed in place: the catch-up
    /// replaces the cached segments they rewrote and the re-chained tail
    /// ([`spark_archive::Options::follow_compactions`]), the fold of the
    /// `log.compact` records erases the moments in the mirror; the cached
    /// blobs and checkpoints that hold erased content are removed before
    /// that fold is published ([`Follower::forget`]). No checkpoint is
    /// built meanwhile.
    // The checkpoint hold is taken across the catch-up on purpose (no
    // checkpoint is built from segments being replaced); the follower runs
    // on a thread and a runtime of its own.
    #[allow(clippy::await_holding_lock)]
    async fn apply(&self, manifest: &Manifest) -> Result<(), FollowError> {
        let log_dir = spark_core::layout::log_dir(&self.data_dir);
        let compacts = !manifest.compactions.is_empty();
        // Awaited: the guard, not a future of it (a future held here would
        // leave the checkpoint worker free to build from the segments being
        // replaced).
        let _held = match compacts {
            true => Some(self.engine.hold_checkpoints().await),
            false => None,
        };
        match catch_up(
            &self.store,
            &log_dir,
            Some(manifest),
            self.max_record_bytes,
            false,
            compacts,
        )
        .await
        {
            Ok(caught) => {
                if compacts {
                    tracing::info!(
                        manifest = manifest.number,
                        segments = ?caught.compacted,
                        record_seqs = ?manifest.compactions.iter().map(|c| c.record_seq).collect::<Vec<_>>(),
                        "replica: the archive applies a compaction; the cached segments it \
                         rewrote were replaced"
                    );
                }
            }
            Err(CatchUpError::Diverged(why)) => {
                return Err(FollowError::Retry(format!(
                    "{why}: the archive's history forks from what this replica holds (manifest \
                     {}), and the replica stays at seq {}",
                    manifest.number,
                    self.engine.head().seq
                )));
            }
            Err(e) => return Err(ArchiveStartError::from(e).into()),
        }
        let after = self.engine.head().seq;
        let upto = manifest.shipped_seq;
        if upto < after {
            return Err(FollowError::Retry(format!(
                "manifest {} names up to seq {upto}, the replica holds {after}",
                manifest.number
            )));
        }
        let ops =
            read_ops(&log_dir, after, upto, self.max_record_bytes).map_err(FollowError::Retry)?;
        // The moments a compaction among the new ops erases: their blobs
        // are not fetched (the archive may still hold them).
        let erased: HashSet<Id> = ops
            .iter()
            .filter_map(|(op, _)| match &op.body {
                OpBody::LogCompact(record) => Some(record.subjects.iter()),
                _ => None,
            })
            .flatten()
            .map(|subject| Id(u128::from_be_bytes(*subject)))
            .collect();
        let media: Vec<([u8; 32], u64)> = ops
            .iter()
            .filter_map(|(op, _)| match &op.body {
                OpBody::MediaPut(m) if !erased.contains(&m.moment_id) => {
                    Some((m.sha256.0, m.size_bytes))
                }
                _ => None,
            })
            .collect();
        if !media.is_empty() {
            fetch_media_blobs(&self.store, &self.data_dir, &self.engine, Some(media)).await?;
        }
        // Before the new ops are published: a reader that sees the
        // replica at the manifest's seq finds the erased content gone from
        // its cache too (the blobs' rule takes `erased` as erased already).
        if compacts || !erased.is_empty() {
            self.forget(manifest, &erased)?;
        }
        let head = head_of(manifest);
        let seq = head.seq;
        self.engine
            .apply_replicated(ops, head)
            .map_err(FollowError::Stop)?;
        metrics::get().seq.set(seq as i64);
        Ok(())
    }

    /// Once the cache holds a compacted log, before its ops are folded and
    /// published (SPEC section 13: replicas delete their cached copies of
    /// what was erased): removes the blobs of the erased moments (unless a moment that is not erased names the same
    /// bytes) and the checkpoints that hold erased content (at or after the
    /// first segment a compaction of `manifest` lists, or whose chain value
    /// is not the log's any more), with the compactor's rules
    /// ([`crate::retention`]); each directory is fsynced. A failure fails
    /// the step, which is tried again after a backoff (its catch-up finds
    /// the cache already compacted, and nothing was folded yet).
    fn forget(&self, manifest: &Manifest, erased: &HashSet<Id>) -> Result<(), FollowError> {
        let log_dir = spark_core::layout::log_dir(&self.data_dir);
        let blobs = crate::retention::remove_erased_blobs(&self.engine, &self.media, erased)
            .map_err(|e| {
                FollowError::Retry(format!("removing the blobs of erased moments: {e}"))
            })?;
        let first_rewritten = manifest
            .compactions
            .iter()
            .flat_map(|c| c.segments.first())
            .map(|s| s.first_seq)
            .min();
        let mut checkpoints = 0;
        if let Some(first) = first_rewritten {
            checkpoints += crate::retention::remove_checkpoints_from(
                &self.engine,
                &OsFs,
                &self.data_dir,
                first,
            )
            .map_err(|e| FollowError::Retry(e.to_string()))?;
        }
        checkpoints += crate::retention::remove_stale_checkpoints(
            &self.engine,
            &OsFs,
            &self.data_dir,
            &log_dir,
        )
        .map_err(|e| FollowError::Retry(e.to_string()))?;
        tracing::info!(
            manifest = manifest.number,
            erased = erased.len(),
            blobs,
            checkpoints,
            "replica: followed the archive's compaction; cached copies of erased content removed"
        );
        Ok(())
    }
}

/// The head a writer shows once it holds exactly what `manifest` names:
/// its seq and chain (`shipped_seq`, `shipped_chain`) and its active
/// segment (the chunks' segment; after a sealed segment, the next one).
fn head_of(manifest: &Manifest) -> Head {
    let segment = match (manifest.chunks.last(), manifest.segments.last()) {
        (Some(chunk), _) => segment_file_name(chunk.segment_first_seq),
        (None, Some(segment)) => segment_file_name(segment.last_seq + 1),
        (None, None) => String::new(),
    };
    Head {
        seq: manifest.shipped_seq,
        segment,
        chain: manifest.shipped_chain,
    }
}

/// The ops with seqs in `(after, upto]` from the local log in `log_dir`
/// (which the catch-up wrote and checked), in seq order, each with its
/// event cursor ([`crate::history::committed_ops`]: each record's CRC is
/// checked again as it is decoded). Errors name the segment file.
fn read_ops(
    log_dir: &Path,
    after: u64,
    upto: u64,
    max_record_bytes: u32,
) -> Result<Vec<(Op, EventCursor)>, String> {
    let mut ops = Vec::new();
    crate::history::committed_ops(log_dir, after, upto, max_record_bytes, |op, cursor| {
        ops.push((op, cursor));
        std::ops::ControlFlow::Continue(())
    })?;
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spark_log_format::{Fault, FaultOp, FaultyFs, MemFs};

    const URL: &str = "s3://bucket/prefix";

    /// A disk whose data directory holds the record of manifest `old`, or
    /// no record.
    fn disk(data: &Path, old: Option<u64>) -> MemFs {
        let fs = MemFs::new();
        fs.create_dir_all(data).unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
        if let Some(old) = old {
            let doc = CacheFile {
                url: URL.into(),
                manifest: old,
            };
            fs.insert_durable(&data.join(CACHE_FILE), &serde_json::to_vec(&doc).unwrap());
        }
        fs
    }

    /// The replica's record of the manifest applied, written through
    /// `MemFs` and crashed after each of its file system calls, then
    /// power-cut in every mode: it reads back as the old record or the new
    /// one, whole (a torn record would read as none and set the whole
    /// cached log aside); a write that returned `Ok` survives.
    #[test]
    fn the_cache_record_is_old_or_new_whole_after_a_power_cut() {
        let data = Path::new("/data");
        for old in [None, Some(6)] {
            let calls = MemFs::every_crash_point(
                || disk(data, old),
                |fs| write_cache_file(fs, data, URL, 7),
                8,
                |fs, written, point| {
                    let back = read_cache_file(fs, data)
                        .unwrap_or_else(|e| panic!("crash after {point:?}: {e}"));
                    let manifest = back.as_ref().map(|c| c.manifest);
                    assert!(
                        manifest == old || manifest == Some(7),
                        "crash after {point:?}: {back:?}"
                    );
                    if let Some(back) = &back {
                        assert_eq!(back.url, URL, "crash after {point:?}");
                    }
                    if written.is_ok() {
                        assert_eq!(manifest, Some(7), "acknowledged, then lost");
                    }
                },
            );
            assert!(calls >= 4, "{calls} file system calls");
        }
    }

    /// An error injected at each file system call of the write (create,
    /// write, fsync, rename, directory fsync) is returned, naming the
    /// record's file, and the record there is still the old one or the new
    /// one, whole.
    #[test]
    fn an_injected_error_at_any_call_is_returned_and_leaves_a_whole_record() {
        let data = Path::new("/data");
        for op in FaultOp::DURABLE_WRITE {
            let mem = Arc::new(disk(data, Some(6)));
            let fs = FaultyFs::new(mem.clone());
            fs.fail_next(op, Fault::Os(5));
            let e = write_cache_file(&fs, data, URL, 7).expect_err("the fault is returned");
            assert!(e.to_string().contains(CACHE_FILE), "{op:?}: {e}");
            let back = read_cache_file(mem.as_ref(), data)
                .unwrap()
                .map(|c| c.manifest);
            match op {
                // The rename happened: the new record is in place, durable
                // or not.
                FaultOp::SyncDir => assert_eq!(back, Some(7), "{op:?}"),
                _ => assert_eq!(back, Some(6), "{op:?}"),
            }
        }
    }
}
