//! `generate`: a synthetic log for measuring replay and startup,
//! written by the engine's own log writer ([`spark_core::synth`]).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use spark_log_format::LogConfig;

use crate::{Common, Failure, ToolExit};
use spark_core::layout::log_dir;

/// Writes `ops` synthetic moment creates, then `edits` edits and deletes
/// ([`spark_core::synth::tail_op`]), into `--data DIR` (which must hold no
/// log yet), with the server's default segment size; prints the ops, the
/// payload bytes and the log bytes.
pub fn run(common: &Common, ops: u64, edits: u64) -> ToolExit {
    let dir = log_dir(&common.data);
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) && ops + edits >= 100_000 {
        let bar = ProgressBar::with_draw_target(Some(ops + edits), ProgressDrawTarget::stderr());
        if let Ok(style) =
            ProgressStyle::with_template("generate [{bar:40}] {pos}/{len} ops {per_sec} eta {eta}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let generated =
        spark_core::synth::generate_with_tail(&dir, ops, edits, LogConfig::default(), |n| {
            bar.set_position(n)
        })
        .map_err(|e| Failure::unreadable(format!("cannot generate into {}: {e}", dir.display())))?;
    bar.finish_and_clear();
    let log_bytes: u64 = std::fs::read_dir(&dir)
        .map_err(|e| Failure::unreadable(format!("cannot list {}: {e}", dir.display())))?
        .filter_map(|entry| entry.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    if common.json {
        println!(
            "{}",
            json!({"ops": generated.ops, "payload_bytes": generated.payload_bytes, "log_bytes": log_bytes})
        );
    } else {
        println!(
            "generated {} ops ({ops} moment creates, {edits} edits and deletes) into {}: {} payload bytes, {} log bytes",
            generated.ops,
            dir.display(),
            generated.payload_bytes,
            log_bytes
        );
    }
    Ok(crate::exit::OK)
}
