//! Reading the log for the tools: one scan routine, and the subcommands
//! built on it (verify, dump, rebuild, stats).

use std::collections::BTreeMap;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::Path;

use clap::Args;
use serde_json::json;
use spark_engine::config::log_dir;
use spark_engine::engine::replay_record;
use spark_engine::ids::Id;
use spark_engine::mirror::Mirror;
use spark_engine::op::{Entity, Op, OpKind};
use spark_log_format::{LogError, LogReader, RecordRef, ScanOptions, ScanReport, SegmentInfo};

use crate::{exit, progress, Common, Failure, Outcome};

/// Opens the log of a data directory read-only.
pub fn open(common: &Common) -> Result<LogReader, Failure> {
    let dir = log_dir(&common.data);
    if !dir.is_dir() {
        return Err(Failure::unreadable(format!(
            "no log at {} (is --data the engine's data directory?)",
            dir.display()
        )));
    }
    LogReader::open(&dir).map_err(log_failure)
}

/// Maps a log error to a failure: damage exits 1, the rest 3.
pub fn log_failure(error: LogError) -> Failure {
    match error {
        LogError::Corrupt { .. } | LogError::UnsupportedVersion { .. } => {
            Failure::damage(error.to_string())
        }
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

fn print_json(value: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

fn torn_json(report: &ScanReport) -> serde_json::Value {
    match &report.torn_tail {
        Some(t) => json!({"segment": t.segment, "offset": t.offset, "bytes": t.bytes_dropped,
                          "damage": t.damage, "whole_frame": t.whole_frame}),
        None => serde_json::Value::Null,
    }
}

/// `verify`: the whole log, checksums and chain, every op decoded and folded.
pub fn verify(common: &Common) -> Outcome {
    let reader = open(common)?;
    let mut mirror = Mirror::new();
    let result = scan(&reader, true, "verify", |segment, record| {
        fold(&mut mirror, segment, record).map(|_| ControlFlow::Continue(()))
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
    // A whole last record that fails its checksum may be an acknowledged
    // record that was damaged, not only a torn write: a fault, not a note.
    let damaged_tail = report.torn_tail.as_ref().filter(|t| t.whole_frame);
    if common.json {
        print_json(&json!({
            "ok": damaged_tail.is_none(),
            "segments": report.segments,
            "records": report.records,
            "bytes": report.bytes,
            "seq": report.head.seq,
            "chain": report.head.chain_hex(),
            "torn_tail": torn_json(&report),
        }));
    } else {
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
        if let Some(t) = report.torn_tail.as_ref().filter(|t| !t.whole_frame) {
            println!(
                "note: {} bytes after the last whole record in segment {} at offset {} ({}): \
                 a torn write, or a write in progress on a running server; the engine cuts \
                 it at its next start and keeps a copy beside the segment",
                t.bytes_dropped, t.segment, t.offset, t.damage
            );
        }
    }
    match damaged_tail {
        None => Ok(exit::OK),
        // The same words as `audit damage`, which reports the same frame.
        Some(t) => Err(Failure::damage(
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
        )),
    }
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
    spark_engine::time::parse_rfc3339_ms(text)
        .and_then(|ms| u64::try_from(ms).map_err(|_| format!("{text:?} is before 1970")))
        .map_err(|e| Failure {
            message: e,
            code: exit::USAGE,
        })
}

fn usage(message: String) -> Failure {
    Failure {
        message,
        code: exit::USAGE,
    }
}

/// `dump`: ops as JSON lines.
pub fn dump(common: &Common, filter: &Filter) -> Outcome {
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

/// Where `rebuild --at` stops.
enum At {
    Seq(u64),
    TimeMs(u64),
}

/// Replays the whole log (or up to `at`) into a mirror with the engine's fold.
fn replay(reader: &LogReader, at: Option<&At>) -> Result<(Mirror, ScanReport), Failure> {
    let mut mirror = Mirror::new();
    let report = scan(reader, false, "rebuild", |segment, record| {
        let stop = match at {
            Some(At::Seq(seq)) => record.seq > *seq,
            Some(At::TimeMs(ms)) => record.ts_ms > *ms,
            None => false,
        };
        if stop {
            return Ok(ControlFlow::Break(()));
        }
        fold(&mut mirror, segment, record).map(|_| ControlFlow::Continue(()))
    })?;
    Ok((mirror, report))
}

/// Replays a data directory fully; for the audits.
pub fn replay_all(common: &Common) -> Result<(Mirror, ScanReport), Failure> {
    let reader = open(common)?;
    replay(&reader, None)
}

/// `rebuild`: counts and digest of the mirror, optionally as of `--at`, and
/// optionally exported as JSON.
pub fn rebuild(common: &Common, at: Option<&str>, export: Option<&Path>) -> Outcome {
    let at = match at {
        None => None,
        Some(text) => Some(match text.parse::<u64>() {
            Ok(seq) => At::Seq(seq),
            Err(_) => At::TimeMs(parse_time_ms(text)?),
        }),
    };
    let reader = open(common)?;
    let (mirror, _report) = replay(&reader, at.as_ref())?;
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
    });
    if common.json {
        print_json(&summary);
    } else {
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

/// `stats`: ops per kind, segments, bytes and the time span.
pub fn stats(common: &Common) -> Outcome {
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
                spark_engine::time::format_rfc3339_ms(first_ts as i64),
                spark_engine::time::format_rfc3339_ms(last_ts as i64)
            );
        }
    }
    Ok(exit::OK)
}
