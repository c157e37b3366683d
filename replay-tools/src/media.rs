//! `spark-replay audit media`: blobs against their `media.put` ops (the
//! media of erased moments apart: their blobs are gone on purpose).

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::json;
use spark_core::blob::{blob_path, blobs_dir, verify};
use spark_core::mirror::Media;
use spark_log_format::{Fs as _, OsFs};

use crate::scan::replay_all;
use crate::{exit, Common, Failure, ToolExit};

/// The audit: exit 1 when a blob is missing or damaged.
pub fn audit(common: &Common, remove_orphans: bool, grace_seconds: u64) -> ToolExit {
    let (mirror, _) = replay_all(common)?;
    let blobs = blobs_dir(&common.data);
    let mut media: Vec<_> = mirror.media.values().collect();
    media.sort_by_key(|m| m.seq);
    // The media of erased moments keep no blob (the compactor removes it,
    // unless a moment that is not erased names the same bytes): they are
    // counted apart, not checked (SPEC section 13).
    let (erased, kept): (Vec<&Media>, Vec<&Media>) = media
        .iter()
        .partition(|m| mirror.moment(m.moment_id).is_some_and(|x| x.erased()));
    let (damaged, mut referenced) = check_blobs(&kept, &blobs);
    // A blob an erased moment named is not an orphan while it is there:
    // `audit erasure` says whether it should be.
    referenced.extend(erased.iter().map(|m| hex::encode(m.sha256.0)));
    let Orphans {
        orphans,
        past_grace,
        removed,
    } = sweep_orphans(&blobs, &referenced, remove_orphans, grace_seconds)?;
    if common.json {
        let doc = json!({
            "media": media.len(),
            "ok": kept.len() - damaged.len(),
            "erased": erased.len(),
            "damaged": damaged,
            "orphans": orphans,
            "orphans_past_grace": past_grace,
            "removed": removed,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        println!(
            "{} media, {} ok, {} damaged or missing, {} of erased moments (no blob kept), {} orphan blobs ({} past the {grace_seconds} s grace period)",
            media.len(),
            kept.len() - damaged.len(),
            damaged.len(),
            erased.len(),
            orphans.len(),
            past_grace
        );
        for d in &damaged {
            println!("damaged: {d}");
        }
        for o in &orphans {
            println!("orphan:  {o}");
        }
        for r in &removed {
            println!("removed: {r}");
        }
    }
    Ok(if damaged.is_empty() {
        exit::OK
    } else {
        exit::DAMAGE
    })
}

/// Checks the blob of each media (in seq order) against its `media.put`
/// op. Returns the damaged or missing ones and the hex names of every
/// referenced blob.
fn check_blobs(media: &[&Media], blobs: &Path) -> (Vec<serde_json::Value>, HashSet<String>) {
    let mut damaged = Vec::new();
    let mut referenced = HashSet::new();
    for m in media {
        let hex = hex::encode(m.sha256.0);
        referenced.insert(hex.clone());
        let path = blob_path(blobs, &m.sha256.0);
        if let Err(fault) = verify(&path, &m.sha256.0, m.size_bytes) {
            let reason = fault.to_string();
            damaged.push(
                json!({"media_id": m.id, "moment_id": m.moment_id, "seq": m.seq,
                                "sha256": hex, "reason": reason}),
            );
        }
    }
    (damaged, referenced)
}

/// The blob files no media references.
struct Orphans {
    /// Each orphan: its file name, bytes and age in seconds.
    orphans: Vec<serde_json::Value>,
    /// How many are older than the grace period.
    past_grace: usize,
    /// The file names removed.
    removed: Vec<String>,
}

/// Lists the blob files not in `referenced`; with `remove_orphans`,
/// removes those older than `grace_seconds` and fsyncs the directory.
fn sweep_orphans(
    blobs: &Path,
    referenced: &HashSet<String>,
    remove_orphans: bool,
    grace_seconds: u64,
) -> Result<Orphans, Failure> {
    let mut orphans = Vec::new();
    let mut past_grace = 0usize;
    let mut removed = Vec::new();
    let now = SystemTime::now();
    let grace = Duration::from_secs(grace_seconds);
    let entries = match std::fs::read_dir(blobs) {
        Ok(entries) => entries.collect::<Result<Vec<_>, _>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
    .map_err(|e| Failure::unreadable(format!("cannot list {}: {e}", blobs.display())))?;
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        if referenced.contains(&name) {
            continue;
        }
        let meta = entry
            .metadata()
            .map_err(|e| Failure::unreadable(format!("cannot stat {name}: {e}")))?;
        let age = meta
            .modified()
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .unwrap_or_default();
        orphans.push(json!({"file": name, "bytes": meta.len(), "age_s": age.as_secs()}));
        if age >= grace {
            past_grace += 1;
        }
        if remove_orphans && age >= grace {
            OsFs.remove_file(&entry.path())
                .map_err(|e| Failure::unreadable(format!("cannot remove orphan {name}: {e}")))?;
            removed.push(name);
        }
    }
    if !removed.is_empty() {
        OsFs.sync_dir(blobs)
            .map_err(|e| Failure::unreadable(format!("cannot fsync {}: {e}", blobs.display())))?;
    }
    Ok(Orphans {
        orphans,
        past_grace,
        removed,
    })
}
