//! The media store: content-addressed blobs under `<data>/media/`.
//!
//! An upload streams into a temporary file under `media/tmp/` while its
//! SHA-256 is computed (never held whole in memory); then the file is
//! fsynced, renamed to `media/blobs/<sha256 hex>`, and the directory fsynced.
//! Only after that is the `media.put` op appended (DESIGN.md, "Media"). A
//! crash between the blob and the op leaves an orphan blob, which
//! `spark-replay audit media` reports and `--remove-orphans` removes; never
//! an op without its blob.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::api::BodyStream;

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
#[derive(Debug)]
pub struct Received {
    /// The temporary file (removed when the `Received` is dropped, unless
    /// [`MediaStore::commit`] renamed it to its content address first).
    pub temp_path: PathBuf,
    /// SHA-256 of the bytes.
    pub sha256: Sha256Digest,
    /// Number of bytes.
    pub size_bytes: u64,
}

impl Drop for Received {
    fn drop(&mut self) {
        // After a commit the file is gone (renamed): NotFound is expected.
        let _ = std::fs::remove_file(&self.temp_path);
    }
}

/// Removes a temporary upload file when dropped: also when the request's
/// future is dropped mid-upload (the request timeout, a closed connection).
struct TempGuard(Option<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The blob directory of one data directory.
#[derive(Debug, Clone)]
pub struct MediaStore {
    blobs: PathBuf,
    tmp: PathBuf,
}

/// `<data>/media`, where the blobs live.
pub fn media_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("media")
}

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

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl MediaStore {
    /// Opens (creating if missing, with directory fsyncs) the store of a
    /// data directory, and removes temporary files left by uploads that a
    /// crash interrupted (they were never acknowledged).
    pub fn open(data_dir: &Path) -> std::io::Result<MediaStore> {
        let root = media_dir(data_dir);
        let blobs = root.join("blobs");
        let tmp = root.join("tmp");
        for (dir, parent) in [(&root, data_dir), (&blobs, &root), (&tmp, &root)] {
            if !dir.is_dir() {
                std::fs::create_dir_all(dir)?;
                sync_dir(parent)?;
            }
        }
        let mut removed = 0;
        for entry in std::fs::read_dir(&tmp)? {
            std::fs::remove_file(entry?.path())?;
            removed += 1;
        }
        if removed > 0 {
            sync_dir(&tmp)?;
            tracing::info!(removed, "removed interrupted uploads");
        }
        Ok(MediaStore { blobs, tmp })
    }

    /// Where the blob with this digest lives.
    pub fn blob_path(&self, sha256: &Sha256Digest) -> PathBuf {
        self.blobs.join(hex_digest(sha256))
    }

    /// The directory of blobs.
    pub fn blobs_dir(&self) -> &Path {
        &self.blobs
    }

    /// Streams `body` into a temporary file, hashing as it goes, and fsyncs
    /// the file. Refuses (and removes the file) past `limit_bytes`.
    pub async fn receive(
        &self,
        mut body: BodyStream,
        limit_bytes: u64,
    ) -> Result<Received, ReceiveError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let temp_path = self
            .tmp
            .join(format!("upload-{nanos:x}-{:016x}", rand::random::<u64>()));
        let mut guard = TempGuard(Some(temp_path.clone()));
        let result = async {
            let mut file = tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temp_path)
                .await?;
            let mut hasher = Sha256::new();
            let mut size_bytes: u64 = 0;
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| ReceiveError::Body(e.to_string()))?;
                size_bytes += chunk.len() as u64;
                if size_bytes > limit_bytes {
                    return Err(ReceiveError::TooLarge { limit_bytes });
                }
                hasher.update(&chunk);
                crate::failpoints::check("media.write")?;
                file.write_all(&chunk).await?;
            }
            file.flush().await?;
            crate::failpoints::check("media.fsync")?;
            file.sync_all().await?;
            Ok((hasher.finalize().into(), size_bytes))
        }
        .await;
        // On an error the guard removes the file as it drops.
        let (sha256, size_bytes) = result?;
        guard.0 = None;
        Ok(Received {
            temp_path,
            sha256,
            size_bytes,
        })
    }

    /// Moves a received upload to its content address (replacing a blob of
    /// the same digest, which holds the same bytes unless it was damaged) and
    /// fsyncs the blob directory. After this returns, the blob is durable
    /// under [`MediaStore::blob_path`].
    pub async fn commit(&self, received: &Received) -> std::io::Result<()> {
        let target = self.blob_path(&received.sha256);
        let temp = received.temp_path.clone();
        let blobs = self.blobs.clone();
        tokio::task::spawn_blocking(move || {
            let renamed = crate::failpoints::check("media.rename")
                .and_then(|()| std::fs::rename(&temp, &target));
            if let Err(e) = renamed {
                let _ = std::fs::remove_file(&temp);
                return Err(e);
            }
            crate::failpoints::check("media.dir_fsync")?;
            sync_dir(&blobs)
        })
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?
    }

    /// Drops a received upload that will not be kept.
    pub async fn discard(&self, received: Received) {
        let _ = tokio::fs::remove_file(&received.temp_path).await;
    }
}
