//! The media store: content-addressed blobs under `<data>/media/`.
//!
//! [`MediaStore::put`] owns an upload from its request to its op (the
//! checks, the streaming, the digest, the durable blob, the `media.put`),
//! answering a typed [`UploadError`]; the HTTP handler only reads the
//! request and maps the outcome.
//!
//! An upload streams into a temporary file under `media/tmp/` while its
//! SHA-256 is computed (never held whole in memory); then the file is
//! fsynced, renamed to `media/blobs/<sha256 hex>`, and the directory fsynced.
//! Only after that is the `media.put` op appended (DESIGN.md, "Media"). Every
//! file operation goes through the same seam as the log
//! ([`spark_log_format::Fs`]), so the in-memory power-loss file system covers
//! the blob-then-op order too. Downloads and the turn runner read blobs from
//! the OS file system.
//!
//! Uploads racing for one role (or to a moment being deleted) each put their
//! blob in place before the sequencer decides; the refused ones remove their
//! blob again unless a committed op or another pending upload names the same
//! bytes. The hold on a digest lives in a task detached from the request
//! ([`MediaStore::spawn_put`]), so a request timeout or a closed connection
//! cannot drop it while the `media.put` is still queued (a hold owned by
//! the request was dropped with it, and a racing refused upload then
//! removed a blob an acknowledged op names). A crash between a blob and its op leaves an
//! orphan blob, never an op without its blob; the next start removes
//! orphans older than `media.orphan_grace_ms`
//! ([`MediaStore::remove_orphans`]), and `spark-replay audit media` lists
//! them.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use spark_log_format::{Fs, LogFile};
use tokio::task::JoinHandle;

use bytes::Bytes;
use futures_util::Stream;

use crate::engine::{Command, Engine, EngineError, Outcome, PutMedia};
use spark_core::ids::Id;
use spark_core::op::MediaRole;
use spark_core::rules::media as media_rules;

/// Bytes of an upload gathered before one write to its temporary file.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;

/// A SHA-256 digest.
pub type Sha256Digest = [u8; 32];

/// Why an upload could not be received.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// More bytes than the limit: `413 too_large`. Nothing is kept.
    #[error("the upload is over the limit of {limit_bytes} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit_bytes: u64,
    },
    /// The client's body broke off: `400 invalid_request`.
    #[error("the upload broke off: {0}")]
    Body(String),
    /// The store could not write: `503 unavailable`.
    #[error("the media store cannot write: {0}")]
    Io(#[from] std::io::Error),
}

/// A received upload: durable in a temporary file, not yet in place.
pub struct Received {
    /// The temporary file (removed when the `Received` is dropped, unless
    /// [`MediaStore::commit`] renamed it to its content address first).
    pub temp_path: PathBuf,
    /// SHA-256 of the bytes.
    pub sha256: Sha256Digest,
    /// Number of bytes.
    pub size_bytes: u64,
    /// The seam the file lives on.
    fs: Arc<dyn Fs>,
    /// Set once the file was renamed to its content address.
    in_place: AtomicBool,
}

impl std::fmt::Debug for Received {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received")
            .field("temp_path", &self.temp_path)
            .field("sha256", &hex_digest(&self.sha256))
            .field("size_bytes", &self.size_bytes)
            .finish()
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        if !self.in_place.load(Ordering::SeqCst) {
            let _ = self.fs.remove_file(&self.temp_path);
        }
    }
}

/// Removes a temporary upload file when dropped: also when the request's
/// future is dropped mid-upload (the request timeout, a closed connection).
struct TempGuard {
    fs: Arc<dyn Fs>,
    path: Option<PathBuf>,
}

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = self.fs.remove_file(&path);
        }
    }
}

/// Why a [`MediaStore::spawn_put`] did not end with an op.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    /// The blob could not be put in place: `503 unavailable`.
    #[error("the media store cannot write: {0}")]
    Store(std::io::Error),
    /// The engine refused the `media.put` or could not write it.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// One upload as its request describes it: where the blob goes, what it
/// is and what the client says of its bytes (SPEC section 4,
/// `PUT /api/media/{id}`).
#[derive(Debug, Clone)]
pub struct Upload {
    /// The media id (from the path).
    pub id: Id,
    /// The moment it belongs to (`X-Moment-Id`).
    pub moment_id: Id,
    /// Copy or original (`X-Media-Role`).
    pub role: MediaRole,
    /// Which photo of the moment (`X-Photo`, 0 when absent; issue 27).
    pub photo: u8,
    /// `Content-Type` as uploaded, kept with the blob.
    pub content_type: String,
    /// `X-Content-SHA256`, when sent: the bytes must hash to it.
    pub declared_sha256: Option<Sha256Digest>,
    /// `Content-Length`, when sent (a chunked body has none).
    pub declared_length_bytes: Option<u64>,
    /// Who sent it.
    pub device: String,
}

/// Why [`MediaStore::put`] kept no upload. Nothing of a refused upload is
/// left behind (no temporary file, no blob no op names).
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// Refused on what the request declares, before a byte of the body
    /// was read: the rules of `spark_core::rules::media` on the target
    /// (`404`, `409`, `410`...), or a disk below its reserve (`507
    /// insufficient_storage`). The body is left unread.
    #[error(transparent)]
    Unread(EngineError),
    /// The body is over `limit_bytes`, by its `Content-Length` (the body
    /// is then left unread) or once read that far: `413 too_large`.
    #[error("the upload is over the limit of {limit_bytes} bytes")]
    TooLarge {
        /// The limit, in bytes (`limits.media_limit_bytes`).
        limit_bytes: u64,
    },
    /// The body is empty (0 bytes): `400 invalid_request`.
    #[error("the media body is empty")]
    Empty,
    /// The client's body broke off: `400 invalid_request`.
    #[error("the upload broke off: {0}")]
    Body(String),
    /// The bytes do not hash to `X-Content-SHA256`: `400 digest_mismatch`.
    #[error("the bytes do not hash to the declared digest")]
    DigestMismatch {
        /// What `X-Content-SHA256` said.
        declared: Sha256Digest,
        /// What the bytes hash to.
        actual: Sha256Digest,
    },
    /// The engine refused the upload once its bytes were known (the rules
    /// on the bytes, the sequencer), or could not write it; a disk found
    /// full while the blob was written is `InsufficientStorage` here too.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The store could not write, not for want of space: `503
    /// unavailable`.
    #[error("the media store cannot write: {0}")]
    Store(std::io::Error),
    /// The task that puts the blob in place and submits the op failed
    /// (a panic): `503 unavailable`.
    #[error("the upload task failed: {0}")]
    Task(String),
}

/// Digests of blobs put in place by uploads whose `media.put` is not
/// answered yet, with how many such uploads hold each.
struct Holds {
    map: Mutex<HashMap<Sha256Digest, usize>>,
    /// How many holds exist ([`MediaStore::settled`] waits for 0).
    count: tokio::sync::watch::Sender<usize>,
}

impl Holds {
    /// Publishes the number of holds (called with `map` locked).
    fn publish(&self, map: &HashMap<Sha256Digest, usize>) {
        self.count.send_replace(map.values().sum());
    }
}

/// An upload's hold on its blob's digest, from before the blob is put in
/// place until the engine answered its `media.put` (see
/// [`MediaStore::spawn_put`]): while it lives, no refused upload of the
/// same bytes removes the blob.
pub struct BlobHold {
    holds: Arc<Holds>,
    sha256: Sha256Digest,
    released: bool,
}

impl BlobHold {
    /// Releases the hold with the map already locked.
    fn release_locked(&mut self, map: &mut HashMap<Sha256Digest, usize>) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        if let Some(count) = map.get_mut(&self.sha256) {
            *count -= 1;
            if *count == 0 {
                map.remove(&self.sha256);
            }
        }
        self.holds.publish(map);
    }
}

impl Drop for BlobHold {
    fn drop(&mut self) {
        let holds = Arc::clone(&self.holds);
        let mut map = holds.map.lock();
        self.release_locked(&mut map);
    }
}

/// What [`MediaStore::remove_orphans`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrphanSweep {
    /// Orphan blobs removed (older than the grace period).
    pub removed: u64,
    /// Orphan blobs kept because they are younger than the grace period.
    pub young: u64,
}

/// The blob directory of one data directory, on a file seam. Clones share
/// the holds.
#[derive(Clone)]
pub struct MediaStore {
    fs: Arc<dyn Fs>,
    blobs: PathBuf,
    tmp: PathBuf,
    holds: Arc<Holds>,
}

impl std::fmt::Debug for MediaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MediaStore")
            .field("blobs", &self.blobs)
            .field("tmp", &self.tmp)
            .finish()
    }
}

pub use spark_core::layout::media_dir;

/// Lower-case hex of a digest.
pub fn hex_digest(digest: &Sha256Digest) -> String {
    hex::encode(digest)
}

/// Parses 64 hex characters (either case) into a digest.
pub fn parse_hex_digest(text: &str) -> Option<Sha256Digest> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut out).ok()?;
    Some(out)
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?
}

/// Writes `buffer` at `offset` of `file` off the async threads; gives both
/// back (the buffer emptied).
async fn write_buffer(
    mut file: Box<dyn LogFile>,
    offset: u64,
    mut buffer: Vec<u8>,
) -> std::io::Result<(Box<dyn LogFile>, Vec<u8>)> {
    blocking(move || {
        file.write_all_at(offset, &buffer)?;
        buffer.clear();
        Ok((file, buffer))
    })
    .await
}

/// What a failed write of the media store means, as the disk check
/// decides ([`crate::disk::DiskSpace::full_refusal`]): for a full disk or
/// quota, `507 insufficient_storage` (the upload was not kept; it can be
/// sent again once space is back); else the store's own failure.
fn store_error(engine: &Engine, e: std::io::Error) -> UploadError {
    match engine.disk().full_refusal(
        "a media upload",
        &e,
        1,
        "the upload was not kept, send it again once space is freed",
    ) {
        Some(refusal) => UploadError::Engine(refusal),
        None => UploadError::Store(e),
    }
}

impl MediaStore {
    /// Opens (creating if missing, with directory fsyncs) the store of a
    /// data directory on `fs`, and removes temporary files left by uploads
    /// that a crash interrupted (they were never acknowledged).
    pub fn open(data_dir: &Path, fs: Arc<dyn Fs>) -> std::io::Result<MediaStore> {
        let root = media_dir(data_dir);
        let blobs = spark_core::blob::blobs_dir(data_dir);
        let tmp = root.join("tmp");
        for (dir, parent) in [(&root, data_dir), (&blobs, &root), (&tmp, &root)] {
            match fs.list(dir) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    fs.create_dir_all(dir)?;
                    fs.sync_dir(parent)?;
                }
                Err(e) => return Err(e),
            }
        }
        let mut removed = 0;
        for path in fs.list(&tmp)? {
            fs.remove_file(&path)?;
            removed += 1;
        }
        if removed > 0 {
            fs.sync_dir(&tmp)?;
            tracing::info!(removed, "removed interrupted uploads");
        }
        let (count, _) = tokio::sync::watch::channel(0);
        Ok(MediaStore {
            fs,
            blobs,
            tmp,
            holds: Arc::new(Holds {
                map: Mutex::default(),
                count,
            }),
        })
    }

    /// Removes orphan blobs (named by a digest that `referenced` does not
    /// hold: a crash between a blob and its `media.put`, or an upload whose
    /// op failed to write) whose contents are at least `grace` old, then
    /// fsyncs the blob directory. Younger orphans are kept and counted.
    /// Files whose name is not a lower-case digest are left alone. Called
    /// at startup, before any upload can be in flight.
    pub fn remove_orphans(
        &self,
        referenced: &HashSet<Sha256Digest>,
        grace: Duration,
    ) -> std::io::Result<OrphanSweep> {
        let now = SystemTime::now();
        let mut sweep = OrphanSweep::default();
        for path in self.fs.list(&self.blobs)? {
            let digest = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|name| parse_hex_digest(name).filter(|d| hex_digest(d) == name));
            let Some(digest) = digest else {
                continue;
            };
            if referenced.contains(&digest) {
                continue;
            }
            let modified = self.fs.modified(&path)?;
            if now.duration_since(modified).unwrap_or_default() < grace {
                sweep.young += 1;
                continue;
            }
            self.fs.remove_file(&path)?;
            sweep.removed += 1;
        }
        if sweep.removed > 0 {
            self.fs.sync_dir(&self.blobs)?;
        }
        Ok(sweep)
    }

    /// Removes the blobs of erased moments (SPEC section 13): those named
    /// by `digests()`, which is called under the upload holds' lock (so an
    /// upload that committed its `media.put` before is in the mirror it
    /// reads, and none can start on these digests meanwhile), except those
    /// an upload holds ([`MediaStore::hold`]: the same bytes arriving for
    /// another moment). Then fsyncs the blob directory. A blob already gone
    /// is no error. Returns how many were removed.
    ///
    /// Errors: the first I/O error of a removal or of the directory sync.
    pub fn remove_erased(
        &self,
        digests: impl FnOnce() -> Vec<Sha256Digest>,
    ) -> std::io::Result<usize> {
        let mut removed = 0;
        {
            let map = self.holds.map.lock();
            for digest in digests() {
                if map.get(&digest).is_some_and(|n| *n > 0) {
                    continue;
                }
                match self.fs.remove_file(&self.blob_path(&digest)) {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if removed > 0 {
            self.fs.sync_dir(&self.blobs)?;
        }
        Ok(removed)
    }

    /// Where the blob with this digest lives.
    pub fn blob_path(&self, sha256: &Sha256Digest) -> PathBuf {
        spark_core::blob::blob_path(&self.blobs, sha256)
    }

    /// The directory of blobs.
    pub fn blobs_dir(&self) -> &Path {
        &self.blobs
    }

    /// Streams `body` (plain byte chunks; an error is the sender's body
    /// breaking off) into a temporary file, hashing as it goes, and fsyncs
    /// the file. Refuses (and removes the file) past `limit_bytes`. Holds
    /// at most [`WRITE_BUFFER_BYTES`] of the body in memory.
    pub async fn receive(
        &self,
        mut body: impl Stream<Item = std::io::Result<Bytes>> + Unpin,
        limit_bytes: u64,
    ) -> Result<Received, ReceiveError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let temp_path = self
            .tmp
            .join(format!("upload-{nanos:x}-{:016x}", rand::random::<u64>()));
        let mut guard = TempGuard {
            fs: Arc::clone(&self.fs),
            path: Some(temp_path.clone()),
        };
        let result = async {
            let (fs, path) = (Arc::clone(&self.fs), temp_path.clone());
            let mut file = blocking(move || fs.create_new(&path)).await?;
            let mut hasher = Sha256::new();
            let mut size_bytes: u64 = 0;
            let mut buffer = Vec::with_capacity(WRITE_BUFFER_BYTES);
            let mut written: u64 = 0;
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| ReceiveError::Body(e.to_string()))?;
                size_bytes += chunk.len() as u64;
                if size_bytes > limit_bytes {
                    return Err(ReceiveError::TooLarge { limit_bytes });
                }
                hasher.update(&chunk);
                buffer.extend_from_slice(&chunk);
                if buffer.len() >= WRITE_BUFFER_BYTES {
                    let length = buffer.len() as u64;
                    (file, buffer) = write_buffer(file, written, buffer).await?;
                    written += length;
                }
            }
            if !buffer.is_empty() {
                (file, _) = write_buffer(file, written, buffer).await?;
            }
            blocking(move || file.sync_all()).await?;
            Ok((hasher.finalize().into(), size_bytes))
        }
        .await;
        // On an error the guard removes the file as it drops.
        let (sha256, size_bytes) = result?;
        guard.path = None;
        Ok(Received {
            temp_path,
            sha256,
            size_bytes,
            fs: Arc::clone(&self.fs),
            in_place: AtomicBool::new(false),
        })
    }

    /// Moves a received upload to its content address (replacing a blob of
    /// the same digest, which holds the same bytes unless it was damaged) and
    /// fsyncs the blob directory. After this returns, the blob is durable
    /// under [`MediaStore::blob_path`]. An upload racing others should go
    /// through [`MediaStore::spawn_put`] instead, which holds the digest.
    pub async fn commit(&self, received: &Received) -> std::io::Result<()> {
        let target = self.blob_path(&received.sha256);
        let temp = received.temp_path.clone();
        let blobs = self.blobs.clone();
        let fs = Arc::clone(&self.fs);
        let renamed = blocking(move || {
            if let Err(e) = fs.rename(&temp, &target) {
                let _ = fs.remove_file(&temp);
                return Err(e);
            }
            Ok(fs)
        })
        .await?;
        received.in_place.store(true, Ordering::SeqCst);
        blocking(move || renamed.sync_dir(&blobs)).await
    }

    /// Drops a received upload that will not be kept (its temporary file is
    /// removed).
    pub async fn discard(&self, received: Received) {
        let _ = blocking(move || {
            drop(received);
            Ok(())
        })
        .await;
    }

    /// Holds `sha256` for an upload about to put its blob in place: until
    /// the hold is dropped, the blob is never removed by
    /// [`MediaStore::remove_refused`] of another upload.
    pub fn hold(&self, sha256: Sha256Digest) -> BlobHold {
        let mut map = self.holds.map.lock();
        *map.entry(sha256).or_insert(0) += 1;
        self.holds.publish(&map);
        BlobHold {
            holds: Arc::clone(&self.holds),
            sha256,
            released: false,
        }
    }

    /// Resolves once no upload holds a digest (every `media.put` handed to
    /// [`MediaStore::spawn_put`] was answered and its refused blob, if any,
    /// removed): the server waits for this before it stops the engine.
    pub async fn settled(&self) {
        let mut count = self.holds.count.subscribe();
        let _ = count.wait_for(|n| *n == 0).await;
    }

    /// After the engine refused an upload's `media.put` (a conflict found
    /// only at commit: uploads racing for one role, a moment deleted
    /// meanwhile): removes the blob it put in place, unless another upload
    /// holds the same digest or `referenced` (asked with the holds locked)
    /// says a committed media names it; fsyncs the blob directory after a
    /// removal. Returns whether the blob was removed.
    pub async fn remove_refused(
        &self,
        mut hold: BlobHold,
        referenced: impl FnOnce() -> bool + Send + 'static,
    ) -> std::io::Result<bool> {
        let holds = Arc::clone(&self.holds);
        let path = self.blob_path(&hold.sha256);
        let blobs = self.blobs.clone();
        let fs = Arc::clone(&self.fs);
        blocking(move || {
            // Locked throughout: an upload of the same bytes takes its hold
            // before putting its blob in place, so it waits for this.
            let mut map = holds.map.lock();
            let others = map.get(&hold.sha256).copied().unwrap_or(0) > 1;
            hold.release_locked(&mut map);
            if others || referenced() {
                return Ok(false);
            }
            match fs.remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(e),
            }
            fs.sync_dir(&blobs)?;
            Ok(true)
        })
        .await
    }

    /// Takes one upload from its request to its op (SPEC section 4, DESIGN.md
    /// "Media"): the rules of `spark_core::rules::media` admit the target
    /// before a byte is read; the declared length is held to `limit_bytes`
    /// and, with what else is admitted, to the disk reserve; the body
    /// streams into a temporary file while it is hashed, is fsynced, and is
    /// held to `X-Content-SHA256`; the rules admit the bytes (a replay of a
    /// known upload answers by content and keeps nothing, in `sync` mode
    /// once its original is archived); then [`MediaStore::spawn_put`] puts
    /// the blob in place and submits the op, the sequencer deciding last.
    /// An upload refused anywhere leaves nothing behind.
    ///
    /// Returns the engine's outcome (`created: true` for a new upload).
    /// Errors: [`UploadError`], each saying which answer it is.
    pub async fn put(
        &self,
        engine: &Arc<Engine>,
        upload: Upload,
        body: impl Stream<Item = std::io::Result<Bytes>> + Unpin,
        limit_bytes: u64,
    ) -> Result<Outcome, UploadError> {
        // Fail fast, before reading a byte, on what the bytes cannot change.
        engine
            .read(|mirror| {
                media_rules::admit_target(
                    mirror,
                    upload.id,
                    upload.moment_id,
                    upload.photo,
                    upload.role,
                )
                .map(|_| ())
            })
            .map_err(UploadError::Unread)?;
        if let Some(length) = upload.declared_length_bytes {
            if length > limit_bytes {
                return Err(UploadError::TooLarge { limit_bytes });
            }
            if length == 0 {
                return Err(UploadError::Empty);
            }
        }
        engine
            .disk()
            .admit_writes(upload.declared_length_bytes.unwrap_or(0), 1)
            .map_err(UploadError::Unread)?;
        let received = self.receive(body, limit_bytes).await.map_err(|e| match e {
            ReceiveError::TooLarge { limit_bytes } => UploadError::TooLarge { limit_bytes },
            ReceiveError::Body(why) => UploadError::Body(why),
            ReceiveError::Io(e) => store_error(engine, e),
        })?;
        if received.size_bytes == 0 {
            // A chunked body without a length, found empty once read.
            self.discard(received).await;
            return Err(UploadError::Empty);
        }
        if let Some(declared) = upload.declared_sha256 {
            if declared != received.sha256 {
                let actual = received.sha256;
                self.discard(received).await;
                return Err(UploadError::DigestMismatch { declared, actual });
            }
        }
        let command = PutMedia {
            id: upload.id,
            moment_id: upload.moment_id,
            role: upload.role,
            photo: upload.photo,
            sha256: received.sha256,
            size_bytes: received.size_bytes,
            content_type: upload.content_type,
            device: upload.device,
        };
        // A replay of a known upload answers by content and keeps nothing; a
        // refused one keeps nothing either.
        let admitted = engine.read(|mirror| {
            media_rules::admit_bytes(mirror, &command)
                .map(|known| known.map(|m| media_rules::known_upload(mirror, m)))
        });
        match admitted {
            Ok(None) => {}
            Ok(Some(known)) => {
                self.discard(received).await;
                // In `sync` mode a replay waits until its original is archived.
                return Ok(engine.acknowledge(known).await?);
            }
            Err(e) => {
                self.discard(received).await;
                return Err(e.into());
            }
        }
        // The blob goes in place and the op is submitted by a task of its own,
        // which holds the digest until the engine answers: a request timeout or
        // a closed connection drops this future, never that task.
        match self.spawn_put(Arc::clone(engine), received, command).await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(PutError::Engine(e))) => Err(e.into()),
            Ok(Err(PutError::Store(e))) => Err(store_error(engine, e)),
            Err(e) => Err(UploadError::Task(e.to_string())),
        }
    }

    /// Puts a received upload's blob in place and submits its `media.put`,
    /// in a task of its own that holds the blob's digest until the engine
    /// answered: dropping the returned handle (the request timed out, the
    /// client went away) neither cancels the put nor releases the hold
    /// early. When the engine refuses the op (not when it is unavailable:
    /// a failed append may still be on disk), the task removes the blob as
    /// [`MediaStore::remove_refused`] says. The hold is taken before this
    /// returns, so call it only after the upload was admitted.
    ///
    /// Errors: [`PutError::Store`] (the blob could not be put in place, or
    /// the failpoint `media.before_op`), [`PutError::Engine`].
    pub fn spawn_put(
        &self,
        engine: Arc<Engine>,
        received: Received,
        command: PutMedia,
    ) -> JoinHandle<Result<Outcome, PutError>> {
        let hold = self.hold(received.sha256);
        let store = self.clone();
        tokio::spawn(async move {
            store.commit(&received).await.map_err(PutError::Store)?;
            // The blob is durable; a crash here leaves an orphan, never an
            // op without its blob.
            crate::failpoints::check("media.before_op").map_err(PutError::Store)?;
            match engine.submit(Command::PutMedia(command)).await {
                // Unavailable or fenced: the op may be written all the same, so
                // the blob stays (a later start's sweep settles it).
                Err(refused)
                    if !matches!(
                        refused,
                        EngineError::Unavailable(_) | EngineError::Fenced(_)
                    ) =>
                {
                    let sha256 = received.sha256;
                    let referenced = move || {
                        engine.read(|mirror| mirror.media.values().any(|m| m.sha256.0 == sha256))
                    };
                    if let Err(e) = store.remove_refused(hold, referenced).await {
                        tracing::warn!(error = %e, "could not remove the blob of a refused upload");
                    }
                    Err(PutError::Engine(refused))
                }
                answered => {
                    drop(hold);
                    answered.map_err(PutError::Engine)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spark_log_format::OsFs;

    #[test]
    fn orphans_past_the_grace_period_are_removed_and_younger_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = MediaStore::open(dir.path(), Arc::new(OsFs)).unwrap();
        let digest = |b: &[u8]| -> Sha256Digest { Sha256::digest(b).into() };
        let (named, old, young) = (digest(b"named"), digest(b"old"), digest(b"young"));
        for d in [named, old, young] {
            std::fs::write(store.blob_path(&d), b"x").unwrap();
        }
        let stray = store.blobs_dir().join("not-a-digest");
        std::fs::write(&stray, b"x").unwrap();
        let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
        for path in [
            store.blob_path(&named),
            store.blob_path(&old),
            stray.clone(),
        ] {
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(two_hours_ago)
                .unwrap();
        }
        let referenced = HashSet::from([named]);
        let sweep = store
            .remove_orphans(&referenced, Duration::from_secs(3600))
            .unwrap();
        assert_eq!(
            sweep,
            OrphanSweep {
                removed: 1,
                young: 1
            }
        );
        assert!(store.blob_path(&named).is_file());
        assert!(!store.blob_path(&old).exists());
        assert!(store.blob_path(&young).is_file());
        assert!(
            stray.is_file(),
            "a file not named by a digest is left alone"
        );
        let sweep = store.remove_orphans(&referenced, Duration::ZERO).unwrap();
        assert_eq!(
            sweep,
            OrphanSweep {
                removed: 1,
                young: 0
            }
        );
    }

    #[tokio::test]
    async fn a_refused_upload_keeps_a_blob_that_another_upload_holds() {
        let dir = tempfile::tempdir().unwrap();
        let store = MediaStore::open(dir.path(), Arc::new(OsFs)).unwrap();
        let body = || futures_util::stream::iter(vec![Ok(Bytes::from_static(b"the same bytes"))]);
        let first = store.receive(body(), 1 << 20).await.unwrap();
        let second = store.receive(body(), 1 << 20).await.unwrap();
        let sha256 = first.sha256;
        let (hold_first, hold_second) = (store.hold(sha256), store.hold(sha256));
        store.commit(&first).await.unwrap();
        store.commit(&second).await.unwrap();
        // The second is refused while the first still waits: kept.
        assert!(!store.remove_refused(hold_second, || false).await.unwrap());
        assert!(store.blob_path(&sha256).is_file());
        // The first is refused too, and no op names the bytes: removed.
        let settled = store.settled();
        assert!(store.remove_refused(hold_first, || false).await.unwrap());
        assert!(!store.blob_path(&sha256).exists());
        settled.await;
        // Named by a committed op: kept.
        let third = store.receive(body(), 1 << 20).await.unwrap();
        let hold = store.hold(sha256);
        store.commit(&third).await.unwrap();
        assert!(!store.remove_refused(hold, || true).await.unwrap());
        assert!(store.blob_path(&sha256).is_file());
    }
}
