//! Reading the log for the tools: one scan routine, and the subcommands
//! built on it (verify, dump, rebuild, stats).

use std::collections::BTreeMap;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::Path;

use clap::Args;
use serde_json::json;
use spark_core::ids::Id;
use spark_core::layout::log_dir;
use spark_core::mirror::Mirror;
use spark_core::op::{Entity, Op, OpKind};
use spark_core::replay::replay_record;
use spark_log_format::{
    LogError, LogReader, RecordRef, ScanOptions, ScanReport, SegmentInfo, TornTail,
};

use crate::{exit, progress, Common, Failure, ToolExit};

/// Opens the log of a data directory read-only.
pub fn open(common: &Common) -> Result<LogReader, Failure> {
    let dir = log_dir(&common.data);
    if !dir.is_dir() {
        return Err(Failure::unreadable(format!(
            "no log at {} (is --data the engine's data directory?)",
            dir.display()
        )));
    }
    open_log(&common.data).map_err(log_failure)
}

/// Opens the log of the data directory `data`: as a live log
/// ([`LogReader::open_live`]) when an engine holds the directory's `LOCK`
/// (it may be appending right now), else as recovery would read it.
pub fn open_log(data: &Path) -> Result<LogReader, LogError> {
    let dir = log_dir(data);
    if engine_running(data) {
        LogReader::open_live(
            &dir,
            std::sync::Arc::new(spark_log_format::OsFs),
            spark_log_format::DEFAULT_MAX_RECORD_BYTES,
        )
    } else {
        LogReader::open(&dir)
    }
}

/// [`spark_log_format::damage_report`] on the log of the data directory
/// `data`, in the view [`open_log`] reads it in: beside a running engine,
/// the live one ([`spark_log_format::damage_report_live`]), so that `audit
/// damage` never reports a roll or a batch in progress that `verify`
/// reads past.
pub fn damage_report(data: &Path) -> Result<Option<spark_log_format::DamageReport>, LogError> {
    let dir = log_dir(data);
    let limit = spark_log_format::DEFAULT_MAX_RECORD_BYTES;
    if engine_running(data) {
        spark_log_format::damage_report_live(&dir, limit)
    } else {
        spark_log_format::damage_report(&dir, limit)
    }
}

/// Whether an engine holds `<data>/LOCK` (its exclusive lock while it
/// runs). A missing or unreadable lock file means no engine.
fn engine_running(data: &Path) -> bool {
    let Ok(file) = std::fs::File::open(data.join("LOCK")) else {
        return false;
    };
    matches!(
        file.try_lock_shared(),
        Err(std::fs::TryLockError::WouldBlock)
    )
}

/// Maps a log error to a failure: damage exits 1, the rest 3. A stray
/// `.seg` file (a name that is not 20 digits) is named and exits 3, not 1:
/// it is no segment and no seq is damaged (docs/tools.md, `audit damage`), but no
/// log is read until it is moved out of the log directory. A segment of a
/// newer format (its header whole, its checksum valid) exits 3 too: it is
/// not damage, this build cannot read it (a newer `spark-replay` can).
pub fn log_failure(error: LogError) -> Failure {
    match error {
        LogError::Corrupt { .. } => Failure::damage(error.to_string()),
        LogError::UnsupportedVersion { .. } => Failure::unreadable(format!(
            "{error}; not damage (exit 3): read it with a spark-replay of that format version \
             or newer"
        )),
        LogError::StrayFile { .. } => Failure::unreadable(format!(
            "{error}; not damage (exit 3): the log was not checked, run again once the file \
             is moved out"
        )),
        other => Failure::unreadable(other.to_string()),
    }
}

/// Visits every whole record in seq order with its segment; `visit` may stop
/// the scan early or fail it. Verifies checksums, seqs, headers and (when
/// `verify_chain`) the chain; shows a progress bar on a terminal.
pub fn scan(
    reader: &LogReader,
    verify_chain: bool,
    what: &str,
    mut visit: impl FnMut(&SegmentInfo, &RecordRef<'_>) -> Result<ControlFlow<()>, Failure>,
) -> Result<ScanReport, Failure> {
    let total: u64 = reader.segments().iter().map(|s| s.bytes).sum();
    let bar = progress::bar(total, what);
    let mut failure = None;
    let mut since_tick = 0u64;
    let options = ScanOptions {
        verify_chain,
        ..ScanOptions::default()
    };
    let report = reader.scan(options, |segment, record| {
        since_tick += 1;
        if since_tick == 65_536 {
            bar.set_position(segment_position(reader, segment) + record.offset);
            since_tick = 0;
        }
        match visit(segment, &record) {
            Ok(flow) => flow,
            Err(e) => {
                failure = Some(e);
                ControlFlow::Break(())
            }
        }
    });
    bar.finish_and_clear();
    if let Some(failure) = failure {
        return Err(failure);
    }
    report.map_err(log_failure)
}

/// Bytes of the segments before `segment`, for the progress bar.
fn segment_position(reader: &LogReader, segment: &SegmentInfo) -> u64 {
    reader
        .segments()
        .iter()
        .take_while(|s| s.first_seq < segment.first_seq)
        .map(|s| s.bytes)
        .sum()
}

fn decode(segment: &SegmentInfo, record: &RecordRef<'_>) -> Result<Op, Failure> {
    Op::decode(record).map_err(|e| {
        Failure::damage(format!(
            "segment {} at offset {}: {e}",
            segment.name, record.offset
        ))
    })
}

fn fold(mirror: &mut Mirror, segment: &SegmentInfo, record: &RecordRef<'_>) -> Result<(), Failure> {
    replay_record(mirror, record).map_err(|e| {
        Failure::damage(format!(
            "segment {} at offset {}: {e}",
            segment.name, record.offset
        ))
    })
}

/// Prints `value` as one line of JSON.
pub fn print_json(value: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

fn torn_json(report: &ScanReport) -> serde_json::Value {
    match &report.torn_tail {
        Some(t) => json!({"segment": t.segment, "offset": t.offset, "bytes": t.bytes_dropped,
                          "damage": t.damage, "whole_frame": t.whole_frame,
                          "unacknowledged": t.unacknowledged}),
        None => serde_json::Value::Null,
    }
}

/// A format-version-2 tail after the last valid commit mark that is not a
/// possibly damaged whole frame: bytes no client was ever promised
/// (FORMAT.md, "Acknowledged bytes"), which the engine cuts at its next
/// start. Reported as "unacknowledged tail cut", never as damage.
pub fn unacknowledged_tail(tail: Option<&TornTail>) -> Option<&TornTail> {
    tail.filter(|t| t.unacknowledged && !t.whole_frame)
}

/// The JSON of an unacknowledged tail: what, where, how many bytes, and the
/// seqs of the whole records in it (`null` when it holds none).
pub fn unacknowledged_json(tail: &TornTail) -> serde_json::Value {
    let (first, last) = tail.seqs.map_or((None, None), |(f, l)| (Some(f), Some(l)));
    json!({
        "what": "unacknowledged tail cut",
        "segment": tail.segment,
        "offset": tail.offset,
        "bytes": tail.bytes_dropped,
        "seqs": {"first": first, "last": last},
        "found": tail.damage,
    })
}

/// The line of an unacknowledged tail: "unacknowledged tail cut: ...".
pub fn unacknowledged_text(tail: &TornTail) -> String {
    format!(
        "{}: never acknowledged (after the last valid commit mark); the engine cuts it at its \
         next start and keeps a copy beside the segment",
        tail.summary()
    )
}

/// A head recorded earlier, as `verify --head SEQ:CHAIN` takes it (the
/// `seq` and `chain` that `audit chain` or `GET /api/log/head` printed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportedHead {
    /// The head's seq.
    pub seq: u64,
    /// The chain value there.
    pub chain: spark_log_format::ChainValue,
}

/// Parses `SEQ:CHAIN`: a whole number, a colon, and 64 hex digits (either
/// case). For clap, whose error is a usage error (exit 2).
pub fn parse_head(text: &str) -> Result<ExportedHead, String> {
    let malformed = || format!("{text:?} is not SEQ:CHAIN (a seq, a colon, 64 hex digits)");
    let (seq, chain) = text.split_once(':').ok_or_else(malformed)?;
    let seq = seq.parse::<u64>().map_err(|_| malformed())?;
    let mut value = [0u8; 32];
    if chain.len() != 64 || hex::decode_to_slice(chain, &mut value).is_err() {
        return Err(malformed());
    }
    Ok(ExportedHead { seq, chain: value })
}

/// How an exported head links to the log ([`spark_log_format::link_head`]):
/// whether it is linked, its JSON member and its line.
fn head_link(
    reader: &LogReader,
    head: &ExportedHead,
) -> Result<(bool, serde_json::Value, String), Failure> {
    use spark_log_format::HeadLink;
    let link = spark_log_format::link_head(reader, head.seq, head.chain).map_err(log_failure)?;
    let (linked, name, record_seq, first_seq, text) = match link {
        HeadLink::Direct => (true, "direct", None, None, "linked".to_owned()),
        HeadLink::ThroughCompaction { record_seq } => (
            true,
            "through_compaction",
            Some(record_seq),
            None,
            format!("linked through the compaction record at seq {record_seq}"),
        ),
        HeadLink::SegmentRewritten {
            first_seq,
            record_seq,
        } => (
            false,
            "segment_rewritten",
            Some(record_seq),
            Some(first_seq),
            format!(
                "not linked: the segment holding seq {} (from seq {first_seq}) was rewritten by \
                 the compaction at seq {record_seq}, the first after it (content was erased)",
                head.seq
            ),
        ),
        HeadLink::PastEnd { last_seq } => (
            false,
            "past_end",
            None,
            None,
            format!(
                "not linked: seq {} is past the log's last seq {last_seq} (the head saw records \
                 this log does not hold: lost, or another log's)",
                head.seq
            ),
        ),
        HeadLink::NotLinked => (false, "not_linked", None, None, "not linked".to_owned()),
    };
    let chain = hex::encode(head.chain);
    let doc = json!({
        "seq": head.seq,
        "chain": chain,
        "linked": linked,
        "link": name,
        "compaction_seq": record_seq,
        "segment_first_seq": first_seq,
    });
    Ok((linked, doc, format!("head {}:{chain}: {text}", head.seq)))
}

/// `verify`: the whole log, checksums and chain, every op decoded and
/// folded; with `head`, then whether that exported head links to the log
/// (exit 1 when it does not).
pub fn verify(common: &Common, head: Option<&ExportedHead>) -> ToolExit {
    let reader = open(common)?;
    let mut mirror = Mirror::new();
    let checkpoints = check_checkpoints(common);
    // The seqs of the valid checkpoints, and the log's own digest there.
    let mut log_digests: BTreeMap<u64, Option<String>> = checkpoints
        .iter()
        .filter_map(|c| c.valid.as_ref().map(|(seq, _)| (*seq, None)))
        .collect();
    let result = scan(&reader, true, "verify", |segment, record| {
        fold(&mut mirror, segment, record)?;
        if let Some(slot) = log_digests.get_mut(&record.seq) {
            *slot = Some(mirror.digest());
        }
        Ok(ControlFlow::Continue(()))
    });
    let report = match result {
        Ok(report) => report,
        Err(failure) => {
            if common.json {
                print_json(&json!({"ok": false, "error": failure.message}));
            }
            return Err(failure);
        }
    };
    // A whole checkpoint (listed before the scan, so not one a live server
    // wrote since) past the log's end: acknowledged records are gone, and
    // a tail after the last commit mark was not "never acknowledged".
    let listed: Vec<&std::path::Path> = checkpoints.iter().map(|c| c.file.as_path()).collect();
    let lost = lost_committed(common, &listed, report.head.seq);
    if let Some(past) = lost {
        if common.json {
            print_json(&json!({"ok": false, "error": past.to_string(),
                               "seq": report.head.seq, "committed_seq": past.seq}));
        }
        return Err(Failure::damage(past.to_string()));
    }
    // A whole last record that fails its checksum may be an acknowledged
    // record that was damaged, not only a torn write: a fault, not a note.
    let damaged_tail = report.torn_tail.as_ref().filter(|t| t.whole_frame);
    let unacknowledged = unacknowledged_tail(report.torn_tail.as_ref());
    let link = head.map(|head| head_link(&reader, head)).transpose()?;
    // A valid checkpoint whose mirror is not the log's fold at its seq
    // would give a wrong start: a fault. An ignored one is only a note
    // (startup ignores it too).
    let mut checkpoint_fault = None;
    let checkpoint_json: Vec<serde_json::Value> = checkpoints
        .iter()
        .map(|c| match &c.valid {
            Some((seq, digest)) => {
                let matches = log_digests.get(seq).and_then(|d| d.as_ref()) == Some(digest);
                if !matches && checkpoint_fault.is_none() {
                    checkpoint_fault = Some(format!(
                        "checkpoint {}: its mirror at seq {seq} is not the log's fold there \
                         (digest {digest})",
                        c.file.display()
                    ));
                }
                json!({"file": c.file.display().to_string(), "seq": seq,
                       "status": if matches { "valid" } else { "mismatch" }})
            }
            None => json!({"file": c.file.display().to_string(), "status": "ignored",
                           "why": c.why}),
        })
        .collect();
    if common.json {
        let mut doc = json!({
            "ok": damaged_tail.is_none(),
            "segments": report.segments,
            "records": report.records,
            "bytes": report.bytes,
            "seq": report.head.seq,
            "chain": report.head.chain_hex(),
            "torn_tail": torn_json(&report),
            "unacknowledged_tail": unacknowledged.map(unacknowledged_json),
            "checkpoints": checkpoint_json,
        });
        if let Some((_, member, _)) = &link {
            doc["head"] = member.clone();
        }
        print_json(&doc);
    } else if damaged_tail.is_none() {
        // A damaged last record is a fault: only the fault is reported
        // (below, on stderr), never an `ok:` line before it.
        print_verified(&report, unacknowledged);
        for c in &checkpoints {
            match (&c.valid, &c.why) {
                (Some((seq, _)), _) => println!(
                    "checkpoint {}: valid (seq {seq}, the log's fold there)",
                    c.file.display()
                ),
                (None, why) => println!(
                    "checkpoint {}: ignored: {}",
                    c.file.display(),
                    why.as_deref().unwrap_or("")
                ),
            }
        }
        if let Some((_, _, line)) = &link {
            println!("{line}");
        }
    }
    if let Some(fault) = checkpoint_fault {
        return Err(Failure::damage(fault));
    }
    match damaged_tail {
        None if link.as_ref().is_some_and(|(linked, _, _)| !linked) => Ok(exit::DAMAGE),
        None => Ok(exit::OK),
        // The same words as `audit damage`, which reports the same frame.
        Some(t) => Err(damaged_tail_failure(common, &report, t)),
    }
}

/// `verify`'s `ok:` line for a log without a damaged last record, and a
/// note on a tail that was never acknowledged or is torn.
fn print_verified(report: &ScanReport, unacknowledged: Option<&TornTail>) {
    if report.records == 0 {
        println!(
            "ok: empty log ({} segments, {} bytes)",
            report.segments, report.bytes
        );
    } else {
        println!(
            "ok: {} records in {} segments ({} bytes), seq 1..={}, chain {}",
            report.records,
            report.segments,
            report.bytes,
            report.head.seq,
            report.head.chain_hex()
        );
    }
    if let Some(t) = unacknowledged {
        println!("note: {}", unacknowledged_text(t));
    } else if let Some(t) = report.torn_tail.as_ref().filter(|t| !t.whole_frame) {
        println!(
            "note: {} bytes after the last whole record in segment {} at offset {} ({}): \
             a torn write, or a write in progress on a running server; the engine cuts \
             it at its next start and keeps a copy beside the segment",
            t.bytes_dropped, t.segment, t.offset, t.damage
        );
    }
}

/// The fault for a whole last record `t` that fails its checksum: the
/// words of `audit damage` when the frame can be read, else a description
/// of the place.
fn damaged_tail_failure(common: &Common, report: &ScanReport, t: &TornTail) -> Failure {
    Failure::damage(
        spark_log_format::last_frame_report(
            &log_dir(&common.data),
            t,
            report.head.seq,
            ScanOptions::default().max_record_bytes,
        )
        .ok()
        .flatten()
        .map_or_else(
            || {
                format!(
                    "segment {} at offset {} (after seq {}): the last record is whole but \
                     fails its checksum ({}); it is either a torn write (never acknowledged) \
                     or a damaged acknowledged record. The engine will cut it at its next \
                     start and keep a copy in the log directory",
                    t.segment, t.offset, report.head.seq, t.damage
                )
            },
            |damage| damage.error,
        ),
    )
}

/// Filters of `dump` (combined with AND).
#[derive(Args, Debug, Clone, Default)]
pub struct Filter {
    /// Only ops with seq >= N.
    #[arg(long, value_name = "N")]
    pub from_seq: Option<u64>,
    /// Only ops with seq <= N.
    #[arg(long, value_name = "N")]
    pub to_seq: Option<u64>,
    /// Only ops at or after this time (RFC 3339 or Unix ms).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Only ops at or before this time (RFC 3339 or Unix ms).
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Only ops of this kind (e.g. moment.create); repeat for several.
    #[arg(long, value_name = "KIND")]
    pub kind: Vec<String>,
    /// Only ops about this entity: a moment, media or turn id (a ULID), a
    /// mark id (keep:...), a job id or a recall id.
    #[arg(long, value_name = "ID")]
    pub entity: Option<String>,
    /// Only ops that carry this request id.
    #[arg(long, value_name = "RID")]
    pub request: Option<String>,
}

/// An entity named on the command line: a ULID (any case) for moments,
/// media and turns, else a name (a mark id `keep:...`, a job or recall id).
pub fn parse_entity(text: &str) -> Entity {
    match Id::parse(text) {
        Ok(id) => Entity::Id(id),
        Err(_) => Entity::Name(text.to_owned()),
    }
}

/// Parses a time given as RFC 3339 or as Unix milliseconds.
pub fn parse_time_ms(text: &str) -> Result<u64, Failure> {
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(ms);
    }
    spark_core::time::parse_rfc3339_ms(text)
        .map_err(|e| e.to_string())
        .and_then(|ms| u64::try_from(ms).map_err(|_| format!("{text:?} is before 1970")))
        .map_err(|e| Failure {
            message: e,
            code: exit::USAGE,
        })
}

/// A usage failure (exit 2).
pub fn usage(message: String) -> Failure {
    Failure {
        message,
        code: exit::USAGE,
    }
}

/// `dump`: ops as JSON lines.
pub fn dump(common: &Common, filter: &Filter) -> ToolExit {
    let since = filter.since.as_deref().map(parse_time_ms).transpose()?;
    let until = filter.until.as_deref().map(parse_time_ms).transpose()?;
    let mut kinds = Vec::new();
    for name in &filter.kind {
        kinds.push(
            OpKind::from_name(name).ok_or_else(|| usage(format!("unknown op kind {name:?}")))?,
        );
    }
    let entity = filter.entity.as_deref().map(parse_entity);
    let reader = open(common)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut closed = false;
    scan(&reader, false, "dump", |segment, record| {
        if filter.to_seq.is_some_and(|to| record.seq > to) {
            return Ok(ControlFlow::Break(()));
        }
        if filter.from_seq.is_some_and(|from| record.seq < from)
            || since.is_some_and(|s| record.ts_ms < s)
            || until.is_some_and(|u| record.ts_ms > u)
        {
            return Ok(ControlFlow::Continue(()));
        }
        let op = decode(segment, record)?;
        if (!kinds.is_empty() && !kinds.contains(&op.body.kind()))
            || entity.as_ref().is_some_and(|e| op.body.entity() != *e)
            || filter
                .request
                .as_deref()
                .is_some_and(|r| op.body.request_id() != Some(r))
        {
            return Ok(ControlFlow::Continue(()));
        }
        if writeln!(out, "{}", op.to_json()).is_err() {
            // The reader went away (e.g. `| head`): stop quietly.
            closed = true;
            return Ok(ControlFlow::Break(()));
        }
        Ok(ControlFlow::Continue(()))
    })?;
    if !closed {
        let _ = out.flush();
    }
    Ok(exit::OK)
}

/// A point in the log given as `--at SEQ|TIME` (`rebuild --at`,
/// `restore --at`): the one rule for which ops it keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// Up to and including this seq.
    Seq(u64),
    /// Every op up to the first one stamped after this time (Unix ms): ops
    /// at or before it are kept, and the first op with `ts_ms` past it and
    /// everything after it are left out. The engine stamps all ops of a
    /// batch with one time, never earlier than the batch before, so this is
    /// the last batch whose ops are at or before the time.
    TimeMs(u64),
}

impl At {
    /// Parses `--at`: a whole number is a seq, anything else a time (RFC
    /// 3339, as [`parse_time_ms`] takes it). Bad input is a usage failure.
    pub fn parse(text: &str) -> Result<At, Failure> {
        match text.parse::<u64>() {
            Ok(seq) => Ok(At::Seq(seq)),
            Err(_) => Ok(At::TimeMs(parse_time_ms(text)?)),
        }
    }

    /// Whether the op with `seq` and `ts_ms`, met in seq order, is past the
    /// point: it and every op after it are left out.
    pub fn excludes(&self, seq: u64, ts_ms: u64) -> bool {
        match *self {
            At::Seq(at) => seq > at,
            At::TimeMs(at) => ts_ms > at,
        }
    }
}

/// Replays the whole log (or up to `at`) into a mirror with the engine's fold.
fn replay(
    reader: &LogReader,
    at: Option<&At>,
    verify_chain: bool,
) -> Result<(Mirror, ScanReport), Failure> {
    replay_from(reader, at, verify_chain, Mirror::new())
}

/// [`replay`] starting from `mirror` (a checkpoint's): the records at or
/// before `mirror.seq` are read and checked but not folded.
fn replay_from(
    reader: &LogReader,
    at: Option<&At>,
    verify_chain: bool,
    mut mirror: Mirror,
) -> Result<(Mirror, ScanReport), Failure> {
    let skip_through = mirror.seq;
    let report = scan(reader, verify_chain, "rebuild", |segment, record| {
        if at.is_some_and(|at| at.excludes(record.seq, record.ts_ms)) {
            return Ok(ControlFlow::Break(()));
        }
        if record.seq <= skip_through {
            return Ok(ControlFlow::Continue(()));
        }
        fold(&mut mirror, segment, record).map(|_| ControlFlow::Continue(()))
    })?;
    Ok((mirror, report))
}

/// Replays a data directory fully; for the audits.
pub fn replay_all(common: &Common) -> Result<(Mirror, ScanReport), Failure> {
    let reader = open(common)?;
    replay(&reader, None, false)
}

/// Replays the whole log `reader` views; for an audit that reads the same
/// view again after the fold.
pub fn replay_reader(reader: &LogReader) -> Result<(Mirror, ScanReport), Failure> {
    replay(reader, None, false)
}

/// Replays a data directory and checks every sealed segment's chain
/// against its seal too (the chain from the first op), starting from
/// `mirror` (a checkpoint's, or an empty one): every record is read and
/// checked (CRC, seqs, commit marks, chains), only those after
/// `mirror.seq` are folded; for restore. Also returns how many ops were
/// folded.
pub fn replay_verified_from(
    common: &Common,
    mirror: Mirror,
) -> Result<(Mirror, ScanReport, u64), Failure> {
    let reader = open(common)?;
    let mut folded = 0u64;
    let skip_through = mirror.seq;
    let mut mirror = mirror;
    let report = scan(&reader, true, "rebuild", |segment, record| {
        if record.seq <= skip_through {
            return Ok(ControlFlow::Continue(()));
        }
        folded += 1;
        fold(&mut mirror, segment, record).map(|_| ControlFlow::Continue(()))
    })?;
    Ok((mirror, report, folded))
}

/// `rebuild`: counts and digest of the mirror, optionally as of `--at`, and
/// optionally exported as JSON.
pub fn rebuild(
    common: &Common,
    at: Option<&str>,
    export: Option<&Path>,
    from_checkpoint: bool,
) -> ToolExit {
    let at = at.map(At::parse).transpose()?;
    let reader = open(common)?;
    let start = if from_checkpoint {
        newest_checkpoint(common, at.as_ref())
    } else {
        None
    };
    let checkpoint_file = start.as_ref().map(|(file, _)| file.display().to_string());
    let start = start.map_or_else(Mirror::new, |(_, mirror)| mirror);
    let (mirror, _report) = replay_from(&reader, at.as_ref(), false, start)?;
    if let Some(At::Seq(seq)) = at {
        if seq > mirror.seq {
            return Err(usage(format!(
                "--at {seq} is past the head of the log (seq {}); for a time, give RFC 3339",
                mirror.seq
            )));
        }
    }
    if let Some(path) = export {
        let moments: Vec<_> = mirror
            .moments
            .values()
            .map(|m| mirror.moment_view(m))
            .collect();
        let mut requests: Vec<_> = mirror.requests.iter().collect();
        requests.sort_by(|a, b| a.0.cmp(b.0));
        let requests: serde_json::Map<String, serde_json::Value> = requests
            .into_iter()
            .map(|(rid, row)| {
                (
                    rid.to_string(),
                    json!({"seq": row.seq, "kind": row.kind.name(), "entity_id": row.entity.to_string()}),
                )
            })
            .collect();
        let doc = json!({
            "seq": mirror.seq,
            "digest": mirror.digest(),
            "moments": moments,
            "requests": requests,
        });
        let text = serde_json::to_vec_pretty(&doc).unwrap_or_default();
        std::fs::write(path, text)
            .map_err(|e| Failure::unreadable(format!("cannot write {}: {e}", path.display())))?;
    }
    let summary = json!({
        "seq": mirror.seq,
        "ts_ms": mirror.ts_ms,
        "moments": {"live": mirror.live_moments, "deleted": mirror.deleted_moments()},
        "requests": mirror.requests.len(),
        "digest": mirror.digest(),
        "checkpoint": checkpoint_file,
    });
    if common.json {
        print_json(&summary);
    } else {
        if let Some(file) = &checkpoint_file {
            println!("from      checkpoint {file}");
        }
        println!("seq       {}", mirror.seq);
        println!(
            "moments   {} live, {} deleted",
            mirror.live_moments,
            mirror.deleted_moments()
        );
        println!("requests  {}", mirror.requests.len());
        println!("digest    {}", mirror.digest());
    }
    Ok(exit::OK)
}

/// `rebuild --from-checkpoint`: the newest checkpoint that is valid
/// against the log (checksum, version, chain value) and not past `at`,
/// with its mirror. Each newer one that is not used is named on stderr
/// with why; `None` when there is none (the whole log is replayed).
fn newest_checkpoint(common: &Common, at: Option<&At>) -> Option<(std::path::PathBuf, Mirror)> {
    use spark_core::checkpoint;
    for (_, file) in checkpoint::list(&common.data) {
        match checkpoint::load(&file, &log_dir(&common.data), Mirror::new()) {
            Ok((header, mirror)) => {
                if at.is_some_and(|at| at.excludes(header.at.seq, header.ts_ms)) {
                    eprintln!(
                        "spark-replay: checkpoint {} is past --at; not used",
                        file.display()
                    );
                    continue;
                }
                return Some((file, mirror));
            }
            Err(why) => eprintln!("spark-replay: checkpoint {} ignored: {why}", file.display()),
        }
    }
    None
}

/// What `verify` found about one checkpoint file.
struct CheckpointCheck {
    file: std::path::PathBuf,
    /// Its seq and the digest of its mirror, when it is valid.
    valid: Option<(u64, String)>,
    /// Why it is ignored, when it is not valid.
    why: Option<String>,
}

/// Loads every checkpoint file in the data directory against the log:
/// valid (with its seq and mirror digest) or ignored with why.
fn check_checkpoints(common: &Common) -> Vec<CheckpointCheck> {
    use spark_core::checkpoint;
    checkpoint::list(&common.data)
        .into_iter()
        .map(
            |(_, file)| match checkpoint::load(&file, &log_dir(&common.data), Mirror::new()) {
                Ok((header, mirror)) => CheckpointCheck {
                    file,
                    valid: Some((header.at.seq, mirror.digest())),
                    why: None,
                },
                Err(why) => CheckpointCheck {
                    file,
                    valid: None,
                    why: Some(why.to_string()),
                },
            },
        )
        .collect()
}

/// `stats`: ops per kind, segments, bytes and the time span.
pub fn stats(common: &Common) -> ToolExit {
    let reader = open(common)?;
    let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
    let mut first_ts = None;
    let mut last_ts = 0;
    let report = scan(&reader, false, "stats", |_, record| {
        let name = OpKind::from_code(record.kind)
            .map(|k| k.name().to_owned())
            .unwrap_or_else(|| format!("unknown({})", record.kind));
        *by_kind.entry(name).or_default() += 1;
        first_ts.get_or_insert(record.ts_ms);
        last_ts = record.ts_ms;
        Ok(ControlFlow::Continue(()))
    })?;
    let segments: Vec<_> = reader
        .segments()
        .iter()
        .map(|s| {
            json!({"name": s.name, "first_seq": s.first_seq, "last_seq": s.last_seq,
                   "bytes": s.bytes, "sealed": s.sealed})
        })
        .collect();
    let first_ts = first_ts.unwrap_or(0);
    let doc = json!({
        "ops": report.records,
        "segments": report.segments,
        "bytes": report.bytes,
        "by_kind": by_kind,
        "first_ts_ms": first_ts,
        "last_ts_ms": last_ts,
        "span_ms": last_ts.saturating_sub(first_ts),
        "seq": report.head.seq,
        "segment_files": segments,
    });
    if common.json {
        print_json(&doc);
    } else {
        println!("ops       {}", report.records);
        println!("segments  {}", report.segments);
        println!("bytes     {}", report.bytes);
        for (kind, count) in &by_kind {
            println!("  {kind:<16} {count}");
        }
        if report.records > 0 {
            println!(
                "time      {} .. {}",
                spark_core::time::format_rfc3339_ms(first_ts as i64),
                spark_core::time::format_rfc3339_ms(last_ts as i64)
            );
        }
    }
    Ok(exit::OK)
}

/// The whole checkpoint among `listed` (files listed before the log was
/// read, so none a live server wrote since) whose seq is past `last_seq`,
/// the log's last seq: proof that acknowledged records are gone
/// ([`spark_core::checkpoint::committed_past`]). For `verify` and `audit
/// damage`.
pub(crate) fn lost_committed(
    common: &Common,
    listed: &[&std::path::Path],
    last_seq: u64,
) -> Option<spark_core::checkpoint::PastTheLog> {
    spark_core::checkpoint::committed_past(&common.data, last_seq)
        .filter(|past| listed.contains(&past.file.as_path()))
}
