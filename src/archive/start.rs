//! Starting the archive shipper ([`start`], [`start_on`],
//! [`start_on_leased`], [`start_on_retained`]): connects to the store, takes or resumes this data
//! directory's writer epoch (ARCHIVE.md "Epoch", recorded in the writer
//! file `<data>/archive-writer`), resumes from the latest manifest once the
//! local log is found to hold what it names, and spawns the [`Shipper`]
//! task.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use spark_archive::layout::{epoch_key, EpochDoc};
use spark_archive::{ArchiveStore, StoreConfig, StoreError};
use spark_log_format::{Fs, Head, OsFs};

use super::shipper::{count_put, instant_of, state_after, ShipState, Shipper, Tail};
use super::status::{ArchiveStatus, MissingBlobs, NextOp, Shipping};
use super::{metrics, ArchiveStartError, WRITER_FILE};
use crate::config::ArchiveSettings;
use crate::engine::Engine;

/// The writer file: `{"writer": id, "epoch": n}`.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct WriterFile {
    pub(super) writer: String,
    pub(super) epoch: u64,
}

/// Starts shipping `engine`'s log to the archive of `settings`: takes or
/// resumes this data directory's writer epoch, reads the latest manifest and
/// checks that the local log holds what it names, then spawns the shipper.
/// Refuses (an error the server reports) when another writer holds the
/// prefix, the archive is ahead of the local log or disagrees with it, or
/// the store cannot be reached.
pub async fn start(
    settings: &ArchiveSettings,
    data_dir: &Path,
    engine: Arc<Engine>,
    max_record_bytes: u32,
) -> Result<Shipping, ArchiveStartError> {
    let store = connect(settings)?;
    let sync = settings.mode == crate::config::ArchiveMode::Sync;
    if sync != engine.archive_gate().is_some() {
        return Err(ArchiveStartError::Config(format!(
            "mode {:?}, but the engine was opened {} an archive gate (open it with the same settings)",
            settings.mode,
            if sync { "without" } else { "with" }
        )));
    }
    start_on_retained(
        store,
        data_dir,
        engine,
        max_record_bytes,
        Duration::from_millis(settings.ship_interval_ms),
        settings.lease_ms,
        settings.retention_ms,
    )
    .await
}

/// The store of `settings` (no request is made yet).
pub(super) fn connect(settings: &ArchiveSettings) -> Result<ArchiveStore, ArchiveStartError> {
    ArchiveStore::connect(&StoreConfig {
        url: settings.url.clone(),
        endpoint: settings.endpoint.clone(),
        region: settings.region.clone(),
    })
    .map_err(|e| ArchiveStartError::Config(e.to_string()))
}

/// [`start`] on a given store (tests use `object_store`'s in-memory store),
/// shipping every `interval` (`async` mode), or as soon as a write waits
/// when the engine has an archive gate (`sync` mode).
///
/// Leases off (see [`start_on_leased`]).
pub async fn start_on(
    store: ArchiveStore,
    data_dir: &Path,
    engine: Arc<Engine>,
    max_record_bytes: u32,
    interval: Duration,
) -> Result<Shipping, ArchiveStartError> {
    start_on_leased(store, data_dir, engine, max_record_bytes, interval, 0).await
}

/// [`start_on`] with a lease of `lease_ms` ms and the default `[archive]
/// retention_ms` ([`start_on_retained`] sets it) (`[archive] lease_ms`; 0:
/// off, exactly [`start_on`]): the shipper then stores a manifest at least
/// every `lease_ms / 3` ms, a renewal when nothing else needs one
/// (ARCHIVE.md "Lease"), and right after the start when the archive
/// advertises another lease for this writer than `lease_ms` (a restart
/// with another setting). An epoch this start claims (epoch 1 on an
/// untouched prefix) records `lease_ms`.
pub async fn start_on_leased(
    store: ArchiveStore,
    data_dir: &Path,
    engine: Arc<Engine>,
    max_record_bytes: u32,
    interval: Duration,
    lease_ms: u64,
) -> Result<Shipping, ArchiveStartError> {
    start_on_retained(
        store,
        data_dir,
        engine,
        max_record_bytes,
        interval,
        lease_ms,
        crate::config::ARCHIVE_RETENTION_MS_DEFAULT,
    )
    .await
}

/// [`start_on_leased`] with `[archive] retention_ms` = `retention_ms`
/// (above 0): the shipper's retention pass deletes what is older than it
/// (ARCHIVE.md "Retention").
pub async fn start_on_retained(
    store: ArchiveStore,
    data_dir: &Path,
    engine: Arc<Engine>,
    max_record_bytes: u32,
    interval: Duration,
    lease_ms: u64,
    retention_ms: u64,
) -> Result<Shipping, ArchiveStartError> {
    let doc = take_epoch(&store, data_dir, lease_ms).await?;
    let epoch = doc.epoch;
    let log_dir = spark_core::layout::log_dir(data_dir);
    let (state, last) = resume(&store, &log_dir, &engine.head(), epoch, max_record_bytes).await?;
    // The lease as the archive holds it: the last manifest's, or before
    // the first one of this epoch, the epoch object's.
    let (written_ms, advertised_lease_ms) = last.unwrap_or((doc.taken_ms, doc.lease_ms));
    let status = Arc::new(ArchiveStatus {
        epoch,
        lease_ms,
        fenced_at: Mutex::new(None),
        shipped_seq: AtomicU64::new(0),
        interval,
        engine: Arc::clone(&engine),
        log_dir: log_dir.clone(),
        max_record_bytes,
        next: Mutex::new(NextOp {
            seq: 1,
            segment_first_seq: 1,
            offset: 0,
            ts_ms: None,
        }),
        failing: Mutex::new(None),
        missing: Mutex::new(MissingBlobs::default()),
    });
    status.shipped(&state);
    metrics::watch(&status);
    metrics::get().fenced.set(0);
    let engine_gate = engine.archive_gate().cloned();
    if let Some(gate) = &engine_gate {
        // What the latest manifest names is archived.
        gate.archived(state.shipped_seq);
    }
    let shipper = Shipper {
        store,
        engine,
        status: Arc::clone(&status),
        log_dir,
        blobs_dir: spark_core::blob::blobs_dir(data_dir),
        max_record_bytes,
        state,
        lease: (lease_ms > 0).then(|| Duration::from_millis(lease_ms)),
        renewed_at: instant_of(written_ms),
        advertised_lease_ms,
        data_dir: data_dir.to_owned(),
        checkpoint_put: None,
        checkpoint_stored: None,
        checkpoint_looked: None,
        blobs_ahead: Mutex::new(std::collections::HashMap::new()),
        retention: super::retention_state::Retention::new(retention_ms, interval),
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(shipper.run(interval, stopped));
    Ok(Shipping {
        status,
        stop,
        task,
        gate: engine_gate,
    })
}

/// ARCHIVE.md "Epoch": resumes this directory's epoch if it is the latest,
/// takes epoch 1 on an untouched prefix (recording `lease_ms` in its epoch
/// object), refuses otherwise. Returns the epoch object.
pub(super) async fn take_epoch(
    store: &ArchiveStore,
    data_dir: &Path,
    lease_ms: u64,
) -> Result<EpochDoc, ArchiveStartError> {
    let mine = read_writer_file(&OsFs, data_dir)?;
    match store.latest_epoch().await? {
        Some(doc) => match &mine {
            Some(me) if me.writer == doc.writer && me.epoch == doc.epoch => Ok(doc),
            _ => Err(ArchiveStartError::Held {
                writer: doc.writer,
                epoch: doc.epoch,
                lease: String::new(),
            }),
        },
        None => {
            // Manifests with no epoch object: epoch 1 was lost (a gap,
            // which `latest_manifest` names), never an untouched prefix.
            if let Some(m) = store.latest_manifest().await? {
                return Err(StoreError::Gap {
                    key: epoch_key(store.prefix(), 1),
                    later: format!("manifest {} exists", m.number),
                }
                .into());
            }
            claim_epoch(store, data_dir, mine, 1, lease_ms)
                .await
                .map_err(|e| match e {
                    ArchiveStartError::TakeOver(_) => ArchiveStartError::Held {
                        writer: "another writer (taking epoch 1 at the same time)".into(),
                        epoch: 1,
                        lease: String::new(),
                    },
                    other => other,
                })
        }
    }
}

fn writer_file_error(data_dir: &Path, source: std::io::Error) -> ArchiveStartError {
    ArchiveStartError::Local {
        path: data_dir.join(WRITER_FILE).display().to_string(),
        source,
    }
}

/// `<data>/archive-writer` on `fs`, `None` when there is none.
pub(super) fn read_writer_file(
    fs: &dyn Fs,
    data_dir: &Path,
) -> Result<Option<WriterFile>, ArchiveStartError> {
    match fs.map(&data_dir.join(WRITER_FILE)) {
        Ok(bytes) => serde_json::from_slice((*bytes).as_ref())
            .map(Some)
            .map_err(|e| {
                writer_file_error(
                    data_dir,
                    std::io::Error::new(std::io::ErrorKind::InvalidData, e),
                )
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(writer_file_error(data_dir, e)),
    }
}

/// Records `file` as `<data>/archive-writer` on `fs`, durably
/// ([`Fs::write_file_durably`]): what fencing rests on, so a power cut
/// leaves the old record or the new one, whole.
pub(super) fn write_writer_file(
    fs: &dyn Fs,
    data_dir: &Path,
    file: &WriterFile,
) -> Result<(), ArchiveStartError> {
    let text = serde_json::to_vec(file).expect("the writer file serializes");
    fs.write_file_durably(&data_dir.join(WRITER_FILE), &text)
        .map_err(|e| writer_file_error(data_dir, e))
}

/// Takes writer epoch `epoch` for this data directory, with a lease of
/// `lease_ms` (0: none) recorded in its epoch object: records it in
/// `<data>/archive-writer` (fsync of the file and the directory), then
/// creates `epoch/<epoch>` create-only. Of two engines claiming the same
/// epoch exactly one gets it; the other gets
/// [`ArchiveStartError::TakeOver`]. The file first: a crash after the put
/// leaves a prefix this directory can resume; a crash before it, or a lost
/// race, leaves a file naming an epoch whose object names another writer
/// id (or none), which no start takes for this directory's. Returns the
/// epoch object stored.
pub(super) async fn claim_epoch(
    store: &ArchiveStore,
    data_dir: &Path,
    mine: Option<WriterFile>,
    epoch: u64,
    lease_ms: u64,
) -> Result<EpochDoc, ArchiveStartError> {
    let writer = mine
        .map(|m| m.writer)
        .unwrap_or_else(|| hex::encode(rand::random::<[u8; 16]>()));
    let file = WriterFile {
        writer: writer.clone(),
        epoch,
    };
    write_writer_file(&OsFs, data_dir, &file)?;
    let doc = EpochDoc {
        epoch,
        writer,
        taken_ms: spark_log_format::system_now_ms(),
        lease_ms,
    };
    let bytes = Bytes::from(doc.encode());
    let len = bytes.len() as u64;
    let key = epoch_key(store.prefix(), epoch);
    match store.put_create(&key, bytes).await {
        Ok(_) => {}
        Err(StoreError::Conflict { .. }) => {
            return Err(ArchiveStartError::TakeOver(format!(
                "another engine took epoch {epoch} ({key}) at the same time"
            )))
        }
        Err(other) => return Err(other.into()),
    }
    count_put("epoch", len);
    Ok(doc)
}

/// The state after the latest manifest, checked against the local log,
/// with that manifest's `written_ms` and `lease_ms` (`None`: no manifest).
async fn resume(
    store: &ArchiveStore,
    log_dir: &Path,
    head: &Head,
    epoch: u64,
    max_record_bytes: u32,
) -> Result<(ShipState, Option<(u64, u64)>), ArchiveStartError> {
    let Some(manifest) = store.latest_manifest().await? else {
        let empty = ShipState {
            number: 0,
            segments: Vec::new(),
            chunks: Vec::new(),
            chunk_levels: Vec::new(),
            shipped_seq: 0,
            shipped_chain: [0; 32],
            tail: Tail::fresh(1, [0; 32]),
            checkpoints: Vec::new(),
            compactions: Vec::new(),
            retained_from: 1,
        };
        return Ok((empty, None));
    };
    let diverged = |m: String| ArchiveStartError::Diverged(m);
    if manifest.epoch > epoch {
        return Err(diverged(format!(
            "manifest {} was written by epoch {}, after this writer's {epoch}",
            manifest.number, manifest.epoch
        )));
    }
    if manifest.epoch < epoch {
        return Err(ArchiveStartError::TakeOver(format!(
            "this directory took epoch {epoch}, but the latest manifest ({}) is still epoch {}'s: \
             the take-over stopped before its first manifest; start again with --take-over to finish it",
            manifest.number, manifest.epoch
        )));
    }
    let last = (manifest.written_ms, manifest.lease_ms);
    Ok((
        state_after(log_dir, head, manifest, max_record_bytes)?,
        Some(last),
    ))
}
