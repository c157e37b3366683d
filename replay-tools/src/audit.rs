//! `spark-replay audit`: one entity's history, what one request produced,
//! the chain head to record elsewhere, and live moments with the same
//! content under different ids (the residual case ADR-036 admits); the
//! damage, media, erasure (`crate::erasure`) and archive audits.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use clap::Subcommand;
use serde_json::json;
use spark_core::ids::Id;
use spark_core::op::Op;

use crate::scan::{open, replay_all, scan};
use crate::{exit, Common, Failure, ToolExit};

/// The audits.
#[derive(Subcommand, Debug)]
pub enum AuditCmd {
    /// Every op that touched one entity, in seq order.
    Entity {
        /// The entity: a moment, media or turn id (a ULID), a mark id
        /// (keep:...), a job id or a recall id.
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// What one request id produced: the request index row and its ops.
    Request {
        /// The request id.
        rid: String,
        #[command(flatten)]
        common: Common,
    },
    /// The head: last seq, active segment and chain value, verified from the
    /// first byte. Record the chain elsewhere: any later rewrite of history
    /// changes it.
    Chain {
        #[command(flatten)]
        common: Common,
    },
    /// Live moments with the same content (text, caption, lang, captured_at)
    /// under different ids. Exit 1 when any are found.
    Duplicates {
        #[command(flatten)]
        common: Common,
    },
    /// The first corruption of the log: the damaged seq range and, where the
    /// damaged records still decode, their entity and request ids (so the
    /// clients holding those captures can send them again). A whole last
    /// record that fails its checksum (a torn write or a damaged
    /// acknowledged record, which `verify` reports as a fault) is reported
    /// too, and so is a record whose bytes verify but whose op does not
    /// decode or fold (kind `op_does_not_replay`), as `verify` checks.
    /// Exit 1 when the log is damaged, 0 when it is whole (a torn write
    /// at the tail included, which `verify` only notes; a version-2 tail
    /// after the last valid commit mark is reported as "unacknowledged tail
    /// cut" with its seqs, not as damage). A `.seg` file whose name is not
    /// 20 digits is named as a stray file, not damage: exit 3, since no log
    /// is read until it is moved out.
    Damage {
        #[command(flatten)]
        common: Common,
    },
    /// Every media.put has its blob with the right size and SHA-256; blobs
    /// that no op names (a crash between blob and op) are listed as orphans,
    /// with how many are past the grace period (the server removes those at
    /// its next start, `media.orphan_grace_ms`). Exit 1 on any missing or
    /// damaged blob (orphans alone exit 0).
    Media {
        #[command(flatten)]
        common: Common,
        /// Delete orphan blobs older than the grace period (the only audit
        /// that writes).
        #[arg(long)]
        remove_orphans: bool,
        /// Orphans younger than this may belong to an upload in flight on a
        /// running server; they are never removed.
        #[arg(long, value_name = "SECONDS", default_value_t = 3600)]
        grace_seconds: u64,
    },
    /// Forgetting (SPEC section 13): the moments deleted (id, delete seq
    /// and time), which are due for erasure (deleted at least
    /// `--erase-after-ms` ago), which are erased, and for every due moment
    /// each place where bytes of it remain: its ops with content in the log
    /// that are not erased, checkpoints that hold it not erased, blobs of
    /// its media, copies of cut tails with its content. With `--from URL`,
    /// also the archive's objects that still hold it (segments and chunks
    /// with an op of it that is not erased, checkpoints that hold it not
    /// erased, blobs of its media): expected within `--retention-ms` of
    /// the moment falling due, overdue after. Exit 1 when a due moment has
    /// bytes left anywhere it should not (overdue), 0 otherwise.
    Erasure {
        #[command(flatten)]
        common: Common,
        /// Also look in this archive (`s3://BUCKET/PREFIX`; reads every
        /// segment, chunk and checkpoint object it holds).
        #[arg(long = "from", value_name = "URL")]
        from: Option<String>,
        /// The archive store's endpoint (as `restore --endpoint`).
        #[arg(long, value_name = "URL", env = "SPARK_ARCHIVE_ENDPOINT")]
        endpoint: Option<String>,
        /// The archive store's region.
        #[arg(long, default_value = "us-east-1", env = "SPARK_ARCHIVE_REGION")]
        region: String,
        /// The writer's `[archive] retention_ms`
        /// (`SPARK_ARCHIVE_RETENTION_MS`); the default is the engine's, a
        /// week. An archive object holding a due moment is expected until
        /// the moment has been due this long (plus the retention pass's
        /// interval, a tenth of it, at most an hour), overdue after.
        #[arg(long, value_name = "MS", default_value_t = crate::erasure::DEFAULT_ARCHIVE_RETENTION_MS)]
        retention_ms: u64,
        /// How long after its delete a moment's content is due for
        /// erasure, in milliseconds. Give the server's `[retention]
        /// erase_after_ms` (`SPARK_RETENTION_ERASE_AFTER_MS`); the default
        /// is the engine's, a day. The engine erases within one `[retention]
        /// check_interval_ms` after a moment is due.
        #[arg(long, value_name = "MS", default_value_t = crate::erasure::DEFAULT_ERASE_AFTER_MS)]
        erase_after_ms: u64,
    },
    /// Whether the local log and an archive agree up to the archive's
    /// shipped seq (every archived segment's and chunk's bytes equal the
    /// local segment's bytes there, and the chain at that seq), and how
    /// far behind the archive is: ops and bytes the local log holds past
    /// it, and the age of its latest manifest. Exit 0 when they agree
    /// (however far behind), 1 when they differ (naming the first archived
    /// object, local segment, offset and seq that differ), 2 on bad usage,
    /// 3 when the log or the store cannot be read.
    Archive {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        from: crate::archive::From,
    },
}

/// Runs one audit.
pub fn run(cmd: AuditCmd) -> ToolExit {
    match cmd {
        AuditCmd::Entity { id, common } => entity(&common, &id),
        AuditCmd::Request { rid, common } => request(&common, &rid),
        AuditCmd::Chain { common } => chain(&common),
        AuditCmd::Duplicates { common } => duplicates(&common),
        AuditCmd::Damage { common } => damage(&common),
        AuditCmd::Media {
            common,
            remove_orphans,
            grace_seconds,
        } => crate::media::audit(&common, remove_orphans, grace_seconds),
        AuditCmd::Erasure {
            common,
            erase_after_ms,
            from,
            endpoint,
            region,
            retention_ms,
        } => {
            let archive = from.map(|url| crate::erasure::ArchiveCheck {
                from: crate::archive::From {
                    url,
                    endpoint,
                    region,
                },
                retention_ms,
            });
            crate::erasure::audit(&common, erase_after_ms, archive.as_ref())
        }
        AuditCmd::Archive { common, from } => crate::archive_audit::audit(&common, &from),
    }
}

fn ops_where(common: &Common, keep: impl Fn(&Op) -> bool) -> Result<Vec<Op>, Failure> {
    let reader = open(common)?;
    let mut ops = Vec::new();
    scan(&reader, false, "audit", |segment, record| {
        let op = Op::decode(record).map_err(|e| {
            Failure::damage(format!(
                "segment {} at offset {}: {e}",
                segment.name, record.offset
            ))
        })?;
        if keep(&op) {
            ops.push(op);
        }
        Ok(ControlFlow::Continue(()))
    })?;
    Ok(ops)
}

fn entity(common: &Common, id: &str) -> ToolExit {
    let id = crate::scan::parse_entity(id);
    let ops = ops_where(common, |op| op.body.entity() == id)?;
    if common.json {
        let list: Vec<_> = ops.iter().map(Op::to_json).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"entity_id": id.to_string(), "ops": list}))
                .unwrap_or_default()
        );
    } else if ops.is_empty() {
        println!("no op touched {id}");
    } else {
        for op in &ops {
            println!(
                "seq {:>8}  {}  {:<14} request {}  device {}",
                op.seq,
                spark_core::time::format_rfc3339_ms(op.ts_ms as i64),
                op.body.kind().name(),
                op.body.request_id().unwrap_or("-"),
                op.body.device()
            );
        }
    }
    Ok(exit::OK)
}

fn request(common: &Common, rid: &str) -> ToolExit {
    let (mirror, _) = replay_all(common)?;
    let ops = ops_where(common, |op| op.body.request_id() == Some(rid))?;
    let row = mirror.requests.get(rid);
    let doc = json!({
        "request_id": rid,
        "produced": row.as_ref().map(|r| json!({"seq": r.seq, "kind": r.kind.name(), "entity_id": r.entity.to_string()})),
        "ops": ops.iter().map(Op::to_json).collect::<Vec<_>>(),
    });
    if common.json {
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        match row {
            None => println!("request id {rid:?} is unknown: no op carried it"),
            Some(r) => println!(
                "request id {rid:?} produced {} of {} at seq {} ({} op(s) carry it)",
                r.kind.name(),
                r.entity,
                r.seq,
                ops.len()
            ),
        }
    }
    Ok(exit::OK)
}

fn chain(common: &Common) -> ToolExit {
    let reader = open(common)?;
    let report = scan(&reader, true, "chain", |_, _| Ok(ControlFlow::Continue(())))?;
    let head = &report.head;
    if common.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "seq": head.seq,
                "segment": head.segment,
                "chain": head.chain_hex(),
            }))
            .unwrap_or_default()
        );
    } else {
        println!("seq      {}", head.seq);
        println!("segment  {}", head.segment);
        println!("chain    {}", head.chain_hex());
    }
    Ok(exit::OK)
}

fn duplicates(common: &Common) -> ToolExit {
    let (mirror, _) = replay_all(common)?;
    type Content<'a> = (
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        Option<i64>,
    );
    let mut groups: BTreeMap<Content<'_>, Vec<Id>> = BTreeMap::new();
    for moment in mirror.moments.values().filter(|m| !m.deleted) {
        let key = (
            moment.text(),
            moment.caption(),
            moment.lang(),
            moment.captured_at_ms(),
        );
        groups.entry(key).or_default().push(moment.id);
    }
    let found: Vec<_> = groups
        .into_iter()
        .filter(|(_, ids)| ids.len() > 1)
        .map(|((text, caption, lang, _), ids)| json!({"text": text, "caption": caption, "lang": lang, "ids": ids}))
        .collect();
    if common.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"groups": found})).unwrap_or_default()
        );
    } else if found.is_empty() {
        println!("no live moments share their content");
    } else {
        for group in &found {
            println!("{group}");
        }
    }
    Ok(if found.is_empty() {
        exit::OK
    } else {
        exit::DAMAGE
    })
}

fn damage(common: &Common) -> ToolExit {
    let dir = spark_core::layout::log_dir(&common.data);
    if !dir.is_dir() {
        return Err(Failure::unreadable(format!("no log at {}", dir.display())));
    }
    let report = crate::scan::damage_report(&common.data).map_err(crate::scan::log_failure)?;
    let Some(report) = report else {
        // The bytes verify; like `verify`, every op must also decode and
        // fold with the engine's code, or the engine refuses to start.
        if let Err(failure) = replay_all(common) {
            if failure.code != exit::DAMAGE {
                return Err(failure);
            }
            if common.json {
                println!(
                    "{}",
                    json!({"damaged": true, "kind": "op_does_not_replay", "error": failure.message})
                );
            } else {
                println!(
                    "damaged: {}\nthe record's bytes verify but its op does not decode or fold \
                     with the engine's code (the engine refuses to start on it)",
                    failure.message
                );
            }
            return Ok(exit::DAMAGE);
        }
        // No damage; a version-2 tail after the last valid commit mark is
        // reported apart, as bytes no client was promised.
        let listed = spark_core::checkpoint::list(&common.data);
        let reader = crate::scan::open_log(&common.data).map_err(crate::scan::log_failure)?;
        // A whole checkpoint past the log's end (listed before the log was
        // opened, so not one a live server wrote since): acknowledged
        // records are gone, whatever the bytes that are left say.
        let last_seq = reader.segments().last().map_or(0, |s| s.last_seq);
        let listed: Vec<&std::path::Path> = listed.iter().map(|(_, file)| file.as_path()).collect();
        let lost = crate::scan::lost_committed(common, &listed, last_seq);
        if let Some(past) = lost {
            if common.json {
                println!(
                    "{}",
                    json!({"damaged": true, "kind": "lost_committed", "error": past.to_string(),
                           "seq": last_seq, "committed_seq": past.seq})
                );
            } else {
                println!("damaged: {past}");
            }
            return Ok(exit::DAMAGE);
        }
        let tail = crate::scan::unacknowledged_tail(reader.torn_tail());
        if common.json {
            let tail = tail.map(crate::scan::unacknowledged_json);
            println!("{}", json!({"damaged": false, "unacknowledged_tail": tail}));
        } else {
            println!("no damage: every checksum, seq, header, seal and the chain verify");
            if let Some(tail) = tail {
                println!("{}", crate::scan::unacknowledged_text(tail));
            }
        }
        return Ok(exit::OK);
    };
    if common.json {
        let (first, last) = report
            .damaged_seqs()
            .map_or((None, None), |(f, l)| (Some(f), l));
        let kind = match report.kind {
            spark_log_format::DamageKind::Corrupt => "corrupt",
            spark_log_format::DamageKind::DamagedOrTornLastFrame { .. } => {
                "damaged_or_torn_last_frame"
            }
        };
        let doc = json!({
            "damaged": true,
            "kind": kind,
            "error": report.error,
            "segment": report.segment,
            "offset": report.offset,
            "last_good_seq": report.last_good_seq,
            "next_good_seq": report.next_good_seq,
            "damaged_seqs": {"first": first, "last": last},
            "records": spark_core::damage::salvage(&report),
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        println!("{}", spark_core::damage::summary(&report));
    }
    Ok(exit::DAMAGE)
}
