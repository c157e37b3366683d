//! Synthetic logs for measurement: a data directory holding `count` moment
//! creates of about 200 bytes each (the record size the replay
//! targets are stated for), written through the real log writer with one
//! fdatasync per batch. Used by `spark-replay generate` and the replay
//! benches; never by the server.

use std::path::Path;
use std::sync::Arc;

use spark_log_format::{Log, LogConfig, LogError, OpenError, OsFs, RecordIn};

use crate::ids::Id;
use crate::op::{MomentCreate, OpBody};

/// Ops written per `append_batch` (one write and one fdatasync each).
pub const BATCH_OPS: u64 = 1000;

/// Server time of the first synthetic op, Unix milliseconds
/// (2026-01-01T00:00:00Z); op `k` is `k` ms later.
pub const BASE_MS: u64 = 1_767_225_600_000;

/// What [`generate`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generated {
    /// Ops appended (seqs `1..=ops`).
    pub ops: u64,
    /// Bytes of the ops' payloads (the live payload the mirror holds).
    pub payload_bytes: u64,
}

/// The `k`-th synthetic `moment.create`: a distinct id (time-ordered, as
/// phones mint them), a request id, text, caption, language and capture
/// time, about 200 bytes as a record.
pub fn moment_create(k: u64) -> OpBody {
    OpBody::MomentCreate(MomentCreate {
        id: Id::from_parts(BASE_MS + k, u128::from(k) * 7919),
        request_id: Some(format!("outbox-{k:012}-c2d98960")),
        device: "phone-1".into(),
        text: Some(format!("Stationnement interdit sauf livraisons {k}")),
        caption: Some("near the station, left of the bakery".into()),
        lang: Some("fr".into()),
        // BASE_MS + k fits an i64 for any count a disk can hold.
        captured_at_ms: Some((BASE_MS + k) as i64),
    })
}

/// The `j`-th synthetic op after `creates` creates in a log of `creates`
/// creates then `tail` edits and deletes (`tail` ops in all): the last
/// `tail_deletes(creates, tail)` of them delete moments `0, 1, ...`; the
/// others edit moment `j % creates` (its text, with a request id), never a
/// deleted one.
pub fn tail_op(creates: u64, tail: u64, j: u64) -> OpBody {
    let deletes = tail_deletes(creates, tail);
    let id = |k: u64| Id::from_parts(BASE_MS + k, u128::from(k) * 7919);
    if j >= tail - deletes {
        let k = j - (tail - deletes);
        return OpBody::MomentDelete(crate::op::MomentDelete {
            id: id(k),
            request_id: Some(format!("outbox-delete-{k:012}")),
            device: "phone-1".into(),
        });
    }
    let k = j % creates;
    OpBody::MomentEdit(crate::op::MomentEdit {
        id: id(k),
        request_id: Some(format!("outbox-edit-{j:012}-c2d98960")),
        device: "phone-1".into(),
        text: Some(Some(format!(
            "Stationnement interdit sauf livraisons {k} v{j}"
        ))),
        caption: None,
        lang: None,
    })
}

/// How many of [`tail_op`]'s `tail` ops are deletes: a tenth, at most half
/// the creates.
pub fn tail_deletes(creates: u64, tail: u64) -> u64 {
    (tail / 10).min(creates / 2)
}

/// Appends `count` synthetic moment creates to the log in `log_dir`
/// (created if missing), [`BATCH_OPS`] per fdatasync, calling `progress`
/// with the ops written so far after each batch.
///
/// Errors: the directory must hold no log yet (an `Io` error of kind
/// `AlreadyExists` otherwise, so a real log is never extended with fake
/// ops); write and fsync errors as [`Log::append_batch`] reports them.
pub fn generate(
    log_dir: &Path,
    count: u64,
    config: LogConfig,
    progress: impl FnMut(u64),
) -> Result<Generated, LogError> {
    generate_with_tail(log_dir, count, 0, config, progress)
}

/// [`generate`], then `tail` edits and deletes of those moments
/// ([`tail_op`]): a log whose history outgrows its live state, for
/// measuring checkpoints. `progress` gets the ops written so
/// far, creates and tail together. Errors as [`generate`]; `tail` above 0
/// needs `count` above 0 (`InvalidInput` otherwise).
pub fn generate_with_tail(
    log_dir: &Path,
    count: u64,
    tail: u64,
    config: LogConfig,
    mut progress: impl FnMut(u64),
) -> Result<Generated, LogError> {
    if tail > 0 && count == 0 {
        return Err(LogError::Io {
            op: "generate",
            path: log_dir.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "edits and deletes need at least one create",
            ),
        });
    }
    let (mut log, _) = Log::open(log_dir, config, Arc::new(OsFs), |_| {
        Ok::<(), std::convert::Infallible>(())
    })
    .map_err(|e| match e {
        OpenError::Log(e) => e,
        OpenError::Visit(never) => match never {},
    })?;
    if log.head().seq != 0 {
        return Err(LogError::Io {
            op: "generate",
            path: log_dir.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "the log is not empty; synthetic ops go only into a new data directory",
            ),
        });
    }
    let mut written = 0;
    let mut payload_bytes = 0;
    let total = count + tail;
    while written < total {
        let n = (total - written).min(BATCH_OPS);
        let encoded: Vec<_> = (written..written + n)
            .map(|k| {
                let body = if k < count {
                    moment_create(k)
                } else {
                    tail_op(count, tail, k - count)
                };
                body.encode().map_err(|e| LogError::Io {
                    op: "encode",
                    path: log_dir.to_owned(),
                    source: std::io::Error::other(e),
                })
            })
            .collect::<Result<_, _>>()?;
        let batch: Vec<RecordIn<'_>> = encoded
            .iter()
            .zip(written..)
            .map(|((kind, version, payload), k)| {
                payload_bytes += payload.len() as u64;
                RecordIn {
                    ts_ms: BASE_MS + k,
                    kind: *kind,
                    kind_version: *version,
                    payload,
                }
            })
            .collect();
        log.append_batch(&batch)?;
        written += n;
        progress(written);
    }
    Ok(Generated {
        ops: written,
        payload_bytes,
    })
}
