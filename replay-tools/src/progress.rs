//! A progress bar over the bytes of the log, shown only when stderr is a
//! terminal and the log is large enough to wait for.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Logs smaller than this finish before a bar would be worth drawing.
const MIN_BYTES_FOR_BAR: u64 = 64 << 20;

/// A bar over `total_bytes`, hidden when stderr is not a terminal or the
/// log is small.
pub fn bar(total_bytes: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() || total_bytes < MIN_BYTES_FOR_BAR {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total_bytes), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}
