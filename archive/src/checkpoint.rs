//! Archived checkpoints, reader side (ARCHIVE.md "Checkpoint"): the one
//! rule `spark-replay restore` and a replica starting on an empty cache
//! follow to take a checkpoint from the archive. A checkpoint is derived
//! state: one that is missing, damaged or stale is ignored (the caller
//! warns, naming the object and why) and the log is folded without it.

use std::path::{Path, PathBuf};

use crate::layout::{CheckpointEntry, Manifest, ObjectError};
use spark_core::checkpoint as ckpt;
use spark_log_format::format::chain_hex;

use crate::{ArchiveStore, StoreError};

/// An archived checkpoint written into a data directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    /// The object it came from.
    pub key: String,
    /// The file written: `<data>/checkpoint/<seq>.ckpt`.
    pub file: PathBuf,
    /// Where it stands in the log.
    pub header: ckpt::Header,
}

/// An archived checkpoint that was not used: its key and why (missing,
/// damaged, stale: its chain value is not the log's at its seq).
#[derive(Debug)]
pub struct Skipped {
    /// The object key.
    pub key: String,
    /// Why (its text does not name the key).
    pub why: InstallError,
}

/// Why an archived checkpoint was not installed ([`install`]). Each
/// carries the object's key; the texts do not name it (the caller does, as
/// [`Skipped`] does).
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The object the manifest names is missing.
    #[error("the object is missing")]
    Missing {
        /// The object key.
        key: String,
    },
    /// The object's length or BLAKE3 is not the manifest entry's.
    #[error("damaged: {source}")]
    Damaged {
        /// The object key.
        key: String,
        /// What the check found.
        source: ObjectError,
    },
    /// The store could not be read.
    #[error(transparent)]
    Store(StoreError),
    /// The object's checkpoint frame does not check
    /// ([`ckpt::decode_header`]).
    #[error("damaged: {source}")]
    Frame {
        /// The object key.
        key: String,
        /// Why.
        source: ckpt::CheckpointError,
    },
    /// The object's header is not the manifest entry's seq and chain.
    #[error(
        "its header (seq {seq}, chain {chain}) is not the manifest's entry \
         (seq {entry_seq}, chain {entry_chain})"
    )]
    NotTheEntry {
        /// The object key.
        key: String,
        /// The header's seq.
        seq: u64,
        /// The header's chain value, hex.
        chain: String,
        /// The entry's seq.
        entry_seq: u64,
        /// The entry's chain value, hex.
        entry_chain: String,
    },
    /// The log in the data directory cannot give a chain value at the
    /// header's point ([`ckpt::chain_at`]: missing, short, damaged).
    #[error("stale: {source}")]
    LogShort {
        /// The object key.
        key: String,
        /// Why.
        source: ckpt::CheckpointError,
    },
    /// The header's chain value is not the log's at its seq.
    #[error("stale: its chain value at seq {seq} is not the log's ({log_chain} there)")]
    Stale {
        /// The object key.
        key: String,
        /// The header's seq.
        seq: u64,
        /// The log's chain value there, hex.
        log_chain: String,
    },
    /// The checkpoint file cannot be written ([`ckpt::write_file`]).
    #[error("{source}")]
    Write {
        /// The object key.
        key: String,
        /// Why.
        source: ckpt::CheckpointError,
    },
}

/// Fetches the checkpoint `entry` names and checks it: its length and
/// BLAKE3 against the entry, its frame (magic, version, BLAKE3 trailer,
/// [`ckpt::decode_header`]), its seq and chain value against the entry,
/// and the chain value against the log in `log_dir` at the offset its
/// header names ([`ckpt::chain_at`]): a checkpoint of another log, a stale
/// one, or one past the log's end is refused. Then writes it into
/// `data_dir`'s checkpoint directory durably ([`ckpt::write_file`]: `Fs::write_file_durably`, temporary
/// file, fsync, rename, fsync of the directory). The body is checked by
/// whoever loads it ([`ckpt::load`]).
///
/// Errors: [`InstallError`]; the store unreachable is an error too (the
/// caller goes on without a checkpoint).
pub async fn install(
    store: &ArchiveStore,
    entry: &CheckpointEntry,
    data_dir: &Path,
    log_dir: &Path,
) -> Result<Installed, InstallError> {
    let key = || entry.key.clone();
    let bytes = match store
        .get_listed(&entry.key, entry.bytes, &entry.blake3)
        .await
    {
        Ok(bytes) => bytes,
        Err(StoreError::Missing { key }) => return Err(InstallError::Missing { key }),
        Err(StoreError::Damaged { key, source }) => {
            return Err(InstallError::Damaged { key, source })
        }
        Err(e) => return Err(InstallError::Store(e)),
    };
    let header =
        ckpt::decode_header(&bytes).map_err(|source| InstallError::Frame { key: key(), source })?;
    if header.at.seq != entry.seq || header.at.chain != entry.chain {
        return Err(InstallError::NotTheEntry {
            key: key(),
            seq: header.at.seq,
            chain: chain_hex(&header.at.chain),
            entry_seq: entry.seq,
            entry_chain: chain_hex(&entry.chain),
        });
    }
    let at = header.at;
    let chain = ckpt::chain_at(log_dir, at.segment_first_seq, at.frame_end_offset)
        .map_err(|source| InstallError::LogShort { key: key(), source })?;
    if chain != at.chain {
        return Err(InstallError::Stale {
            key: key(),
            seq: at.seq,
            log_chain: chain_hex(&chain),
        });
    }
    let file = ckpt::write_file(&spark_log_format::OsFs, data_dir, at.seq, &bytes)
        .map_err(|source| InstallError::Write { key: key(), source })?;
    Ok(Installed {
        key: entry.key.clone(),
        file,
        header,
    })
}

/// [`install`] on the newest checkpoint `manifest` lists that `fits` (e.g.
/// not past `restore --at`, not past the log written), then on each older
/// one while the newer ones fail. Returns the one installed (`None`: none
/// listed, or none usable) and the ones skipped, newest first.
pub async fn install_newest(
    store: &ArchiveStore,
    manifest: &Manifest,
    data_dir: &Path,
    log_dir: &Path,
    fits: impl Fn(&CheckpointEntry) -> bool,
) -> (Option<Installed>, Vec<Skipped>) {
    let mut skipped = Vec::new();
    for entry in manifest.checkpoints.iter().rev().filter(|e| fits(e)) {
        match install(store, entry, data_dir, log_dir).await {
            Ok(installed) => return (Some(installed), skipped),
            Err(why) => skipped.push(Skipped {
                key: entry.key.clone(),
                why,
            }),
        }
    }
    (None, skipped)
}
