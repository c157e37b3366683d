//! Archived checkpoints, reader side (ARCHIVE.md "Checkpoint"): the one
//! rule `spark-replay restore` and a replica starting on an empty cache
//! follow to take a checkpoint from the archive. A checkpoint is derived
//! state: one that is missing, damaged or stale is ignored (the caller
//! warns, naming the object and why) and the log is folded without it.

use std::path::{Path, PathBuf};

use crate::layout::{CheckpointEntry, Manifest};
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The object key.
    pub key: String,
    /// Why, in words.
    pub why: String,
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
/// Errors: why, in words; the store unreachable is an error too (the
/// caller goes on without a checkpoint).
pub async fn install(
    store: &ArchiveStore,
    entry: &CheckpointEntry,
    data_dir: &Path,
    log_dir: &Path,
) -> Result<Installed, String> {
    let bytes = match store
        .get_listed(&entry.key, entry.bytes, &entry.blake3)
        .await
    {
        Ok(bytes) => bytes,
        Err(StoreError::Missing { .. }) => return Err("the object is missing".into()),
        Err(StoreError::Damaged { source, .. }) => return Err(format!("damaged: {source}")),
        Err(e) => return Err(e.to_string()),
    };
    let header = ckpt::decode_header(&bytes).map_err(|e| format!("damaged: {e}"))?;
    if header.at.seq != entry.seq || header.at.chain != entry.chain {
        return Err(format!(
            "its header (seq {}, chain {}) is not the manifest's entry (seq {}, chain {})",
            header.at.seq,
            chain_hex(&header.at.chain),
            entry.seq,
            chain_hex(&entry.chain)
        ));
    }
    let at = header.at;
    let chain = ckpt::chain_at(log_dir, at.segment_first_seq, at.frame_end_offset)
        .map_err(|e| format!("stale: {e}"))?;
    if chain != at.chain {
        return Err(format!(
            "stale: its chain value at seq {} is not the log's ({} there)",
            at.seq,
            chain_hex(&chain)
        ));
    }
    let file = ckpt::write_file(&spark_log_format::OsFs, data_dir, at.seq, &bytes)?;
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
