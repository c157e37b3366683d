//! Blobs against their ops: the one check that a stored blob still is what
//! its `media.put` recorded (size, then SHA-256). Downloads, the turn
//! runner and `spark-replay audit media` all call [`verify`] (or
//! [`verify_reader`] on bytes already read), never a copy.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::layout::media_dir;

/// Bytes read per step when a blob is hashed.
const READ_CHUNK_BYTES: usize = 1 << 20;

/// `<data_dir>/media/blobs`, where blobs live under their SHA-256 in hex.
pub fn blobs_dir(data_dir: &Path) -> PathBuf {
    media_dir(data_dir).join("blobs")
}

/// The path of the blob with this SHA-256 in a blob directory.
pub fn blob_path(blobs_dir: &Path, sha256: &[u8; 32]) -> PathBuf {
    blobs_dir.join(hex::encode(sha256))
}

/// How a blob differs from its op. `Display` is the reason
/// `spark-replay audit media` prints.
#[derive(Debug, thiserror::Error)]
pub enum BlobFault {
    /// No file at the blob's path.
    #[error("blob missing")]
    Missing,
    /// The file cannot be opened or read.
    #[error("blob unreadable: {0}")]
    Unreadable(std::io::Error),
    /// Another length than the op recorded.
    #[error("blob has {size_bytes} bytes, media.put says {recorded_bytes}")]
    Size {
        /// Bytes in the blob.
        size_bytes: u64,
        /// Bytes the op recorded.
        recorded_bytes: u64,
    },
    /// The right length, other bytes.
    #[error("blob hashes to {}", hex::encode(actual_sha256))]
    Hash {
        /// What the blob hashes to.
        actual_sha256: [u8; 32],
    },
}

/// Checks the blob at `path` against its op's `sha256` and `size_bytes`,
/// reading it whole in [`READ_CHUNK_BYTES`] steps.
///
/// Errors: [`BlobFault::Missing`], [`BlobFault::Unreadable`],
/// [`BlobFault::Size`], [`BlobFault::Hash`].
pub fn verify(path: &Path, sha256: &[u8; 32], size_bytes: u64) -> Result<(), BlobFault> {
    let file = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => BlobFault::Missing,
        _ => BlobFault::Unreadable(e),
    })?;
    verify_reader(file, sha256, size_bytes)
}

/// Checks the bytes `reader` yields against an op's `sha256` and
/// `size_bytes` (the size first, then the hash).
///
/// Errors: [`BlobFault::Unreadable`], [`BlobFault::Size`],
/// [`BlobFault::Hash`].
pub fn verify_reader(
    mut reader: impl Read,
    sha256: &[u8; 32],
    size_bytes: u64,
) -> Result<(), BlobFault> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; READ_CHUNK_BYTES];
    let mut read_bytes = 0u64;
    loop {
        let n = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(BlobFault::Unreadable(e)),
        };
        hasher.update(&buffer[..n]);
        read_bytes += n as u64;
    }
    if read_bytes != size_bytes {
        return Err(BlobFault::Size {
            size_bytes: read_bytes,
            recorded_bytes: size_bytes,
        });
    }
    let actual_sha256: [u8; 32] = hasher.finalize().into();
    if actual_sha256 != *sha256 {
        return Err(BlobFault::Hash { actual_sha256 });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_names_each_fault() {
        let bytes = b"a sign";
        let sha: [u8; 32] = Sha256::digest(bytes).into();
        assert!(verify_reader(&bytes[..], &sha, 6).is_ok());
        assert!(matches!(
            verify_reader(&bytes[..], &sha, 7),
            Err(BlobFault::Size {
                size_bytes: 6,
                recorded_bytes: 7
            })
        ));
        let other: [u8; 32] = Sha256::digest(b"a sigh").into();
        assert!(matches!(
            verify_reader(&b"a sigh"[..], &sha, 6),
            Err(BlobFault::Hash { actual_sha256 }) if actual_sha256 == other
        ));
        let dir = std::env::temp_dir().join(format!("spark-core-blob-{}", std::process::id()));
        assert!(matches!(
            verify(&dir.join("absent"), &sha, 6),
            Err(BlobFault::Missing)
        ));
    }
}
