//! `spark-replay audit erasure` (SPEC section 13): the moments deleted,
//! which are due for erasure, which are erased, and for every due moment
//! each place where bytes of it still remain: ops with content in the log
//! that are not erased, checkpoints that hold it not erased, blobs of its
//! media, and copies of cut tails that hold ops with its content.
//!
//! Read-only, beside a running server too: the log is read once through
//! one reader ([`crate::scan::open`]), first folded into a mirror with the
//! engine's fold, then walked again for the deletes and the ops with
//! content. With `--from`, the archive's objects are read too
//! ([`find_in_archive`]): what the writer's retention pass has still to
//! delete (ARCHIVE.md "Retention").

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::ControlFlow;
use std::path::PathBuf;

use serde_json::{json, Value};
use spark_core::ids::Id;
use spark_core::layout::log_dir;
use spark_core::mirror::Mirror;
use spark_core::op::{Op, OpBody, OpKind};
use spark_log_format::{FrameKind, Frames, HEADER_LEN};

use crate::scan::{open, replay_reader, scan};
use crate::{exit, Common, Failure, ToolExit};

/// The engine's default `[retention] erase_after_ms`: a day.
pub const DEFAULT_ERASE_AFTER_MS: u64 = spark_core::op::ERASE_AFTER_MS_DEFAULT;

/// The engine's default `[archive] retention_ms`: a week.
pub const DEFAULT_ARCHIVE_RETENTION_MS: u64 = spark_archive::RETENTION_MS_DEFAULT;

/// `audit erasure --from`: the archive to look in, and its writer's
/// `[archive] retention_ms`.
pub struct ArchiveCheck {
    /// The archive.
    pub from: crate::archive::From,
    /// How long after a moment falls due the archive may hold it.
    pub retention_ms: u64,
}

/// One archive object that holds a due moment: its key, what it is
/// (`segment`, `chunk`, `checkpoint`, `blob`), the seq of the op found
/// (log objects), and whether the writer's retention may still keep it.
struct InArchive {
    key: String,
    kind: &'static str,
    seq: Option<u64>,
    within_retention: bool,
}

/// One deleted moment, as the audit found it.
struct Deleted {
    id: Id,
    /// Seq of its `moment.create`.
    created_seq: u64,
    /// Seq and server time (Unix ms) of its `moment.delete`, once found.
    delete: Option<(u64, u64)>,
    /// The mirror says its content was erased.
    erased: bool,
    /// Seqs and kinds of its ops with content that are not erased.
    log: Vec<(u64, OpKind)>,
}

/// Where bytes of one due moment remain outside the log.
#[derive(Default)]
struct Elsewhere {
    /// Checkpoint files that hold it not erased: path, seq, and whether
    /// the file decoded (one that does not is counted as holding it).
    checkpoints: Vec<(PathBuf, u64, bool)>,
    /// Blob files of its media: path, media id, SHA-256 (hex).
    blobs: Vec<(PathBuf, Id, String)>,
    /// Copies of cut tails that hold its content: file, and the seq of the
    /// op (`None`: a partial record that names it).
    cut_tails: Vec<(PathBuf, Option<u64>)>,
    /// Archive objects that hold it (with `--from`).
    archive: Vec<InArchive>,
}

impl Elsewhere {
    /// Whether nothing remains where it should not: locally nothing, and
    /// in the archive nothing past the retention window.
    fn is_empty(&self) -> bool {
        self.checkpoints.is_empty()
            && self.blobs.is_empty()
            && self.cut_tails.is_empty()
            && self.archive.iter().all(|a| a.within_retention)
    }
}

/// The audit: exit 1 when a due moment has bytes left anywhere.
pub fn audit(common: &Common, erase_after_ms: u64, archive: Option<&ArchiveCheck>) -> ToolExit {
    let now_ms = spark_log_format::system_now_ms();
    let reader = open(common)?;
    let (mirror, _) = replay_reader(&reader)?;
    let mut deleted: BTreeMap<Id, Deleted> = mirror
        .moments
        .values()
        .filter(|m| m.deleted)
        .map(|m| {
            (
                m.id,
                Deleted {
                    id: m.id,
                    created_seq: m.created_seq(),
                    delete: None,
                    erased: m.erased(),
                    log: Vec::new(),
                },
            )
        })
        .collect();
    if let Some(from_seq) = deleted.values().map(|d| d.created_seq).min() {
        walk_log(&reader, &mirror, from_seq, &mut deleted)?;
    }
    let is_due = |d: &Deleted| {
        d.delete
            .is_some_and(|(_, at)| at.saturating_add(erase_after_ms) <= now_ms)
    };
    let due: HashSet<Id> = deleted
        .values()
        .filter(|d| is_due(d))
        .map(|d| d.id)
        .collect();
    let mut elsewhere: HashMap<Id, Elsewhere> =
        due.iter().map(|id| (*id, Elsewhere::default())).collect();
    if !due.is_empty() {
        find_checkpoints(common, &deleted, &due, &mut elsewhere);
        find_blobs(common, &mirror, &due, &mut elsewhere);
        find_cut_tails(common, &mirror, &due, &mut elsewhere)?;
        if let Some(check) = archive {
            let due_at: HashMap<Id, u64> = deleted
                .values()
                .filter(|d| due.contains(&d.id))
                .filter_map(|d| {
                    d.delete
                        .map(|(_, at)| (d.id, at.saturating_add(erase_after_ms)))
                })
                .collect();
            find_in_archive(check, &mirror, &due_at, now_ms, &mut elsewhere)?;
        }
    }
    let mut order: Vec<&Deleted> = deleted.values().collect();
    order.sort_by_key(|d| (d.delete.map_or(u64::MAX, |(seq, _)| seq), d.id));
    let overdue = |d: &Deleted| {
        elsewhere
            .get(&d.id)
            .is_some_and(|e| !d.log.is_empty() || !e.is_empty())
    };
    let overdue_count = order.iter().filter(|d| overdue(d)).count();
    let erased_count = order.iter().filter(|d| d.erased).count();
    if common.json {
        let moments: Vec<Value> = order
            .iter()
            .map(|d| moment_json(d, elsewhere.get(&d.id), erase_after_ms, overdue(d)))
            .collect();
        crate::scan::print_json(&json!({
            "now_ms": now_ms,
            "erase_after_ms": erase_after_ms,
            "retention_ms": archive.map(|a| a.retention_ms),
            "deleted": order.len(),
            "due": due.len(),
            "erased": erased_count,
            "overdue": overdue_count,
            "moments": moments,
        }));
    } else {
        println!(
            "{} deleted moments, {} due (deleted at least {erase_after_ms} ms ago), {} erased, \
             {} overdue (due, with bytes left)",
            order.len(),
            due.len(),
            erased_count,
            overdue_count
        );
        for d in &order {
            print_moment(d, elsewhere.get(&d.id), erase_after_ms, overdue(d));
        }
    }
    Ok(if overdue_count == 0 {
        exit::OK
    } else {
        exit::DAMAGE
    })
}

/// Reads the log from `from_seq` for each deleted moment's delete and its
/// ops with content that are not erased (its create and edits, the outcome
/// of its turns, the messages of its thread).
fn walk_log(
    reader: &spark_log_format::LogReader,
    mirror: &Mirror,
    from_seq: u64,
    deleted: &mut BTreeMap<Id, Deleted>,
) -> Result<(), Failure> {
    scan(reader, false, "audit", |segment, record| {
        if record.seq < from_seq {
            return Ok(ControlFlow::Continue(()));
        }
        let Some(kind) = OpKind::from_code(record.kind) else {
            return Ok(ControlFlow::Continue(()));
        };
        if kind != OpKind::MomentDelete && !kind.has_content() {
            return Ok(ControlFlow::Continue(()));
        }
        let op = Op::decode(record).map_err(|e| {
            Failure::damage(format!(
                "segment {} at offset {}: {e}",
                segment.name, record.offset
            ))
        })?;
        if let OpBody::MomentDelete(p) = &op.body {
            if let Some(d) = deleted.get_mut(&p.id) {
                d.delete = Some((op.seq, op.ts_ms));
            }
        } else if !op.erased {
            if let Some(d) = owner(mirror, &op.body).and_then(|id| deleted.get_mut(&id)) {
                d.log.push((op.seq, kind));
            }
        }
        Ok(ControlFlow::Continue(()))
    })?;
    Ok(())
}

/// The media of due moments whose bytes no moment that is not due names
/// (those blobs stay: they are that moment's too), in upload order: the
/// blobs that must be gone, locally and in the archive.
fn due_media<'m>(mirror: &'m Mirror, due: &HashSet<Id>) -> Vec<&'m spark_core::mirror::Media> {
    let kept: HashSet<[u8; 32]> = mirror
        .media
        .values()
        .filter(|m| !due.contains(&m.moment_id))
        .map(|m| m.sha256.0)
        .collect();
    let mut media: Vec<_> = mirror
        .media
        .values()
        .filter(|m| due.contains(&m.moment_id) && !kept.contains(&m.sha256.0))
        .collect();
    media.sort_by_key(|m| m.seq);
    media
}

/// The due moment whose content `frame` still holds, with the op's seq: a
/// whole op that is not erased, of a kind with content, about a moment in
/// `due`. The one test of a log's bytes, local or archived.
fn due_content(
    mirror: &Mirror,
    due: &HashSet<Id>,
    frame: &spark_log_format::Frame<'_>,
) -> Option<(Id, u64)> {
    if frame.kind != FrameKind::Op {
        return None;
    }
    let op = Op::decode(&frame.record).ok()?;
    if op.erased || !op.body.kind().has_content() {
        return None;
    }
    owner(mirror, &op.body)
        .filter(|id| due.contains(id))
        .map(|id| (id, op.seq))
}

/// The moment an op with content is about: a create's or edit's moment, a
/// message's thread, a turn outcome's moment (by the turn in `mirror`).
fn owner(mirror: &Mirror, body: &OpBody) -> Option<Id> {
    match body {
        OpBody::MomentCreate(p) => Some(p.id),
        OpBody::MomentEdit(p) => Some(p.id),
        OpBody::MessagePost(p) => Some(p.thread_id),
        OpBody::TurnFinish(p) => mirror.turns.get(&p.id).map(|t| t.moment_id),
        OpBody::TurnFail(p) => mirror.turns.get(&p.id).map(|t| t.moment_id),
        _ => None,
    }
}

/// The checkpoint files at or after a due moment's create that hold it not
/// erased, the temporary file of a write a crash cut short
/// (`<seq>.ckpt.tmp`, removed at the engine's next start) among them. Each
/// is decoded without the check against the log's chain (a stale
/// checkpoint holds bytes too); one that does not decode (a cut temporary
/// file, say) is counted as holding every due moment created at or before
/// its seq.
fn find_checkpoints(
    common: &Common,
    deleted: &BTreeMap<Id, Deleted>,
    due: &HashSet<Id>,
    elsewhere: &mut HashMap<Id, Elsewhere>,
) {
    let Some(first) = due.iter().map(|id| deleted[id].created_seq).min() else {
        return;
    };
    let mut listed = spark_core::checkpoint::list(&common.data);
    listed.extend(spark_core::checkpoint::list_temp_files(&common.data));
    listed.sort_by_key(|(seq, _)| *seq);
    for (seq, file) in listed.into_iter().filter(|(seq, _)| *seq >= first) {
        let decoded = std::fs::read(&file)
            .ok()
            .and_then(|bytes| spark_core::checkpoint::decode(&bytes, Mirror::new()).ok())
            .map(|(_, mirror)| mirror);
        for id in due {
            if deleted[id].created_seq > seq {
                continue;
            }
            let holds = match &decoded {
                Some(mirror) => mirror.moment(*id).is_some_and(|m| !m.erased()),
                None => true,
            };
            if holds {
                if let Some(e) = elsewhere.get_mut(id) {
                    e.checkpoints.push((file.clone(), seq, decoded.is_some()));
                }
            }
        }
    }
}

/// The blob files of the due moments' media that are present, unless a
/// moment that is not due names the same bytes (then they stay for it).
fn find_blobs(
    common: &Common,
    mirror: &Mirror,
    due: &HashSet<Id>,
    elsewhere: &mut HashMap<Id, Elsewhere>,
) {
    let blobs = spark_core::blob::blobs_dir(&common.data);
    for m in due_media(mirror, due) {
        let path = spark_core::blob::blob_path(&blobs, &m.sha256.0);
        if path.exists() {
            if let Some(e) = elsewhere.get_mut(&m.moment_id) {
                e.blobs.push((path, m.id, hex::encode(m.sha256.0)));
            }
        }
    }
}

/// Whether `name` is a copy recovery keeps of bytes it cut: the torn tail
/// of a segment (`<segment>.torn-<offset>`) or the file of an interrupted
/// roll (`<segment>.torn-roll`), either with a `.N` suffix when the name
/// was taken.
fn is_cut_tail(name: &str) -> bool {
    name.contains(".seg.torn-")
}

/// The copies of cut tails in the log directory that hold ops with content
/// of a due moment that are not erased (whole records, decoded), or a
/// partial record that names a due moment (its id's encoding among the
/// bytes after the last whole record).
fn find_cut_tails(
    common: &Common,
    mirror: &Mirror,
    due: &HashSet<Id>,
    elsewhere: &mut HashMap<Id, Elsewhere>,
) -> Result<(), Failure> {
    let dir = log_dir(&common.data);
    let entries = std::fs::read_dir(&dir)
        .map_err(|e| Failure::unreadable(format!("cannot list {}: {e}", dir.display())))?;
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(is_cut_tail))
        .map(|e| e.path())
        .collect();
    files.sort();
    let encoded: Vec<(Id, Vec<u8>)> = due
        .iter()
        .filter_map(|id| spark_core::codec::encode(id).ok().map(|b| (*id, b)))
        .collect();
    for file in files {
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        let mut found: Vec<(Id, Option<u64>)> = Vec::new();
        // A torn tail starts at a frame; an interrupted roll's copy with
        // the segment header.
        let starts: &[usize] = if bytes.len() > HEADER_LEN {
            &[0, HEADER_LEN]
        } else {
            &[0]
        };
        let mut rest_from = 0;
        for &start in starts {
            let mut frames = Frames::new(&bytes, start, u32::MAX);
            for frame in frames.by_ref() {
                if let Some((id, seq)) = due_content(mirror, due, &frame) {
                    if !found.contains(&(id, Some(seq))) {
                        found.push((id, Some(seq)));
                    }
                }
            }
            rest_from = rest_from.max(frames.offset());
        }
        // The bytes no whole record covers: a partial record may still
        // hold content; it counts when it names a due moment.
        let rest = &bytes[rest_from.min(bytes.len())..];
        for (id, needle) in &encoded {
            let named = !needle.is_empty() && rest.windows(needle.len()).any(|w| w == needle);
            if named && !found.iter().any(|(f, _)| f == id) {
                found.push((*id, None));
            }
        }
        for (id, seq) in found {
            if let Some(e) = elsewhere.get_mut(&id) {
                e.cut_tails.push((file.clone(), seq));
            }
        }
    }
    Ok(())
}

/// The JSON of one deleted moment (docs/tools.md, `audit erasure`).
fn moment_json(
    d: &Deleted,
    elsewhere: Option<&Elsewhere>,
    erase_after_ms: u64,
    overdue: bool,
) -> Value {
    let remaining = elsewhere.map(|e| {
        json!({
            "log": d.log.iter().map(|(seq, kind)| json!({"seq": seq, "kind": kind.name()})).collect::<Vec<_>>(),
            "checkpoints": e.checkpoints.iter().map(|(file, seq, readable)| json!({
                "file": file.display().to_string(), "seq": seq, "readable": readable,
            })).collect::<Vec<_>>(),
            "blobs": e.blobs.iter().map(|(file, media, sha)| json!({
                "file": file.display().to_string(), "media_id": media.to_string(), "sha256": sha,
            })).collect::<Vec<_>>(),
            "cut_tails": e.cut_tails.iter().map(|(file, seq)| json!({
                "file": file.display().to_string(), "seq": seq,
            })).collect::<Vec<_>>(),
            "archive": e.archive.iter().map(|a| json!({
                "key": a.key, "kind": a.kind, "seq": a.seq, "within_retention": a.within_retention,
            })).collect::<Vec<_>>(),
        })
    });
    json!({
        "id": d.id.to_string(),
        "created_seq": d.created_seq,
        "delete_seq": d.delete.map(|(seq, _)| seq),
        "deleted_at_ms": d.delete.map(|(_, at)| at),
        "due_at_ms": d.delete.map(|(_, at)| at.saturating_add(erase_after_ms)),
        "due": elsewhere.is_some(),
        "erased": d.erased,
        "overdue": overdue,
        "remaining": remaining,
    })
}

/// The text lines of one deleted moment: what it is, then one line per
/// place where bytes of it remain.
fn print_moment(d: &Deleted, elsewhere: Option<&Elsewhere>, erase_after_ms: u64, overdue: bool) {
    let time = |ms: u64| spark_core::time::format_rfc3339_ms(ms as i64);
    let when = match d.delete {
        Some((seq, at)) => format!(
            "delete seq {seq} at {}, due at {}",
            time(at),
            time(at.saturating_add(erase_after_ms))
        ),
        None => "delete not found in the log".to_owned(),
    };
    let state = match (elsewhere.is_some(), d.erased, overdue) {
        (_, _, true) if d.erased => "erased, but bytes remain: overdue",
        (_, _, true) => "not erased: overdue",
        (true, true, false) => "erased",
        (true, false, false) => "not erased, nothing remains",
        (false, true, false) => "not due, erased",
        (false, false, false) => "not due",
    };
    println!("deleted {}: {when}; {state}", d.id);
    let Some(e) = elsewhere else {
        return;
    };
    for (seq, kind) in &d.log {
        println!("remains: {} log seq {seq} ({})", d.id, kind.name());
    }
    for (file, seq, readable) in &e.checkpoints {
        let note = if *readable { "" } else { ", does not decode" };
        println!(
            "remains: {} checkpoint {} (seq {seq}{note})",
            d.id,
            file.display()
        );
    }
    for (file, media, _) in &e.blobs {
        println!("remains: {} blob {} (media {media})", d.id, file.display());
    }
    for a in &e.archive {
        let seq = a.seq.map_or(String::new(), |seq| format!(" seq {seq}"));
        let state = if a.within_retention {
            "within retention_ms: expected"
        } else {
            "past retention_ms: overdue"
        };
        println!(
            "remains: {} archive {} {}{seq} ({state})",
            d.id, a.kind, a.key
        );
    }
    for (file, seq) in &e.cut_tails {
        match seq {
            Some(seq) => println!("remains: {} cut tail {} seq {seq}", d.id, file.display()),
            None => println!(
                "remains: {} cut tail {} (a partial record naming it)",
                d.id,
                file.display()
            ),
        }
    }
}

/// The archive objects that hold a due moment (`due_at`: each due
/// moment's due time, Unix ms): every segment and chunk object with an op
/// with content of it that is not erased, every checkpoint object whose
/// mirror holds it not erased, and the blob objects of its media (unless
/// a moment that is not due names the same bytes). Each is within the
/// retention window while its moment has been due for at most
/// `retention_ms` plus the retention pass's interval (`retention_ms / 10`,
/// at most an hour), overdue after. Reads every such object (several at
/// once); an object that does not decode is skipped (`verify --from`
/// names damage).
fn find_in_archive(
    check: &ArchiveCheck,
    mirror: &Mirror,
    due_at: &HashMap<Id, u64>,
    now_ms: u64,
    elsewhere: &mut HashMap<Id, Elsewhere>,
) -> Result<(), Failure> {
    use futures_util::StreamExt;
    let store = crate::archive::connect(&check.from)?;
    let grace = (check.retention_ms / 10).min(3_600_000);
    let within = |id: &Id| {
        due_at
            .get(id)
            .is_some_and(|at| at.saturating_add(check.retention_ms + grace) > now_ms)
    };
    let due: HashSet<Id> = due_at.keys().copied().collect();
    let found = crate::archive::runtime()?.block_on(async {
        let mut keys = Vec::new();
        for family in ["segment", "chunk", "checkpoint"] {
            let listed = store
                .list_family(family)
                .await
                .map_err(crate::archive::store_failure)?;
            keys.extend(listed.into_iter().map(|(key, _)| (family, key)));
        }
        let mut found: Vec<(Id, &'static str, String, Option<u64>)> = Vec::new();
        let mut fetched = std::pin::pin!(futures_util::stream::iter(keys)
            .map(|(family, key)| {
                let store = store.clone();
                async move {
                    let bytes = store.get(&key).await;
                    (family, key, bytes)
                }
            })
            .buffered(crate::archive::FETCH_CONCURRENCY));
        while let Some((family, key, bytes)) = fetched.next().await {
            let Some(bytes) = bytes.map_err(crate::archive::store_failure)? else {
                continue;
            };
            if family == "checkpoint" {
                let Ok((_, held)) = spark_core::checkpoint::decode(&bytes, Mirror::new()) else {
                    continue;
                };
                for id in &due {
                    if held.moment(*id).is_some_and(|m| !m.erased()) {
                        found.push((*id, family, key.clone(), None));
                    }
                }
                continue;
            }
            let (body, start): (&[u8], usize) = if family == "chunk" {
                let Ok((header, body)) = spark_archive::layout::ChunkHeader::decode(&bytes) else {
                    continue;
                };
                (body, if header.offset == 0 { HEADER_LEN } else { 0 })
            } else {
                (&bytes, HEADER_LEN)
            };
            for frame in Frames::new(body, start, u32::MAX) {
                if let Some((id, seq)) = due_content(mirror, &due, &frame) {
                    found.push((id, family, key.clone(), Some(seq)));
                }
            }
        }
        for m in due_media(mirror, &due) {
            let key = spark_archive::layout::blob_key(store.prefix(), &m.sha256.0);
            if store
                .exists(&key)
                .await
                .map_err(crate::archive::store_failure)?
            {
                found.push((m.moment_id, "blob", key, None));
            }
        }
        Ok::<_, Failure>(found)
    })?;
    for (id, kind, key, seq) in found {
        if let Some(e) = elsewhere.get_mut(&id) {
            e.archive.push(InArchive {
                key,
                kind,
                seq,
                within_retention: within(&id),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::is_cut_tail;

    #[test]
    fn cut_tail_copies_are_told_by_their_names() {
        assert!(is_cut_tail("00000000000000000001.seg.torn-000000004096"));
        assert!(is_cut_tail("00000000000000000001.seg.torn-roll"));
        assert!(is_cut_tail("00000000000000000001.seg.torn-roll.2"));
        assert!(!is_cut_tail("00000000000000000001.seg"));
        assert!(!is_cut_tail("COMPACTION"));
    }
}
