//! `spark-replay audit media`: blobs against their `media.put` ops.

use std::collections::HashSet;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::json;
use sha2::{Digest, Sha256};
use spark_engine::media::media_dir;

use crate::scan::replay_all;
use crate::{exit, Common, Failure, Outcome};

/// SHA-256 and length of a file, read in 1 MiB chunks.
fn hash_file(path: &Path) -> std::io::Result<([u8; 32], u64)> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        size += n as u64;
    }
    Ok((hasher.finalize().into(), size))
}

/// The audit: exit 1 when a blob is missing or damaged.
pub fn audit(common: &Common, remove_orphans: bool, grace_seconds: u64) -> Outcome {
    let (mirror, _) = replay_all(common)?;
    let blobs = media_dir(&common.data).join("blobs");
    let mut damaged = Vec::new();
    let mut referenced = HashSet::new();
    let mut media: Vec<_> = mirror.media.values().collect();
    media.sort_by_key(|m| m.seq);
    for m in &media {
        let hex = hex::encode(m.sha256.0);
        referenced.insert(hex.clone());
        let path = blobs.join(&hex);
        let problem = match hash_file(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("blob missing".to_owned()),
            Err(e) => Some(format!("blob unreadable: {e}")),
            Ok((_, size)) if size != m.size_bytes => Some(format!(
                "blob has {size} bytes, media.put says {}",
                m.size_bytes
            )),
            Ok((digest, _)) if digest != m.sha256.0 => {
                Some(format!("blob hashes to {}", hex::encode(digest)))
            }
            Ok(_) => None,
        };
        if let Some(reason) = problem {
            damaged.push(
                json!({"media_id": m.id, "moment_id": m.moment_id, "seq": m.seq,
                                "sha256": hex, "reason": reason}),
            );
        }
    }
    let mut orphans = Vec::new();
    let mut removed = Vec::new();
    let now = SystemTime::now();
    let grace = Duration::from_secs(grace_seconds);
    let entries = match std::fs::read_dir(&blobs) {
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
        if remove_orphans && age >= grace {
            std::fs::remove_file(entry.path())
                .map_err(|e| Failure::unreadable(format!("cannot remove orphan {name}: {e}")))?;
            removed.push(name);
        }
    }
    if !removed.is_empty() {
        std::fs::File::open(&blobs)
            .and_then(|d| d.sync_all())
            .map_err(|e| Failure::unreadable(format!("cannot fsync {}: {e}", blobs.display())))?;
    }
    if common.json {
        let doc = json!({
            "media": media.len(),
            "ok": media.len() - damaged.len(),
            "damaged": damaged,
            "orphans": orphans,
            "removed": removed,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        println!(
            "{} media, {} ok, {} damaged or missing, {} orphan blobs",
            media.len(),
            media.len() - damaged.len(),
            damaged.len(),
            orphans.len()
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
