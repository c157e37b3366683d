//! The scrub: the background check of the sealed segments that startup
//! took on a checkpoint's word (FORMAT.md, "Recovery" step 2a).
//!
//! Started from a checkpoint, recovery checks only the links of the sealed
//! segments before the one holding the checkpoint's point (header, seal,
//! seqs, chain values), not their records. Once the server listens, this
//! thread reads each of them with the full decoder, at the lowest CPU
//! priority, one after the other. Damage is said loudly (an ERROR line
//! naming segment, offset and seq; `spark_log_scrub_damaged_segments`;
//! the `scrub` member of `/readyz`) but changes nothing: the mirror was
//! built from the checkpoint and the checked tail, and the damaged bytes
//! are history that only a start without that checkpoint would read (and
//! refuse). The operator restores the segment (from the archive or a
//! replica) before such a start.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use serde_json::json;
use spark_log_format::{DeferredSegment, Fs};

/// Nice value of the scrub thread (Linux: per thread): the lowest, below
/// the checkpoint worker's, so that it only uses idle CPU.
const SCRUB_NICE: i32 = 19;

/// What the scrub has found so far; shared with `/readyz`.
#[derive(Debug, Default)]
pub struct ScrubStatus {
    state: Mutex<ScrubState>,
}

#[derive(Debug, Default)]
struct ScrubState {
    /// Segments startup deferred.
    segments: usize,
    /// Segments the scrub has read (damaged ones included).
    checked: usize,
    /// The thread runs (or ran).
    started: bool,
    /// One line per damaged or unreadable segment: the error, which names
    /// the segment, offset and seq.
    damage: Vec<String>,
}

impl ScrubStatus {
    fn new(segments: usize) -> ScrubStatus {
        ScrubStatus {
            state: Mutex::new(ScrubState {
                segments,
                ..ScrubState::default()
            }),
        }
    }

    /// The `scrub` member of `/readyz`, or `None` when startup deferred no
    /// segment (no checkpoint, or one in the first segment): `status` is
    /// `pending` (not started yet), `running`, `clean` (every deferred
    /// segment verified) or `damaged` (at least one did not: `damage`
    /// lists them); `segments` and `checked` count segments.
    pub fn to_json(&self) -> Option<serde_json::Value> {
        let state = self.state.lock();
        if state.segments == 0 {
            return None;
        }
        let status = if !state.damage.is_empty() {
            "damaged"
        } else if !state.started {
            "pending"
        } else if state.checked < state.segments {
            "running"
        } else {
            "clean"
        };
        Some(json!({
            "status": status,
            "segments": state.segments,
            "checked": state.checked,
            "damage": state.damage,
        }))
    }

    /// Damage found so far, one line per segment (empty while clean).
    pub fn damage(&self) -> Vec<String> {
        self.state.lock().damage.clone()
    }

    /// True once every deferred segment was read (clean or not).
    pub fn finished(&self) -> bool {
        let state = self.state.lock();
        state.checked == state.segments
    }
}

/// The deferred segments and where to find them; the thread once started.
pub(super) struct Scrub {
    status: Arc<ScrubStatus>,
    job: Mutex<Option<ScrubJob>>,
    stop: Arc<AtomicBool>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

/// What the thread needs.
struct ScrubJob {
    log_dir: PathBuf,
    fs: Arc<dyn Fs>,
    segments: Vec<DeferredSegment>,
    max_record_bytes: u32,
}

impl Scrub {
    /// A scrub of `segments` in `log_dir`, not started yet.
    pub(super) fn new(
        log_dir: PathBuf,
        fs: Arc<dyn Fs>,
        segments: Vec<DeferredSegment>,
        max_record_bytes: u32,
    ) -> Scrub {
        crate::metrics::get()
            .log_scrub_segments_pending
            .set(i64::try_from(segments.len()).unwrap_or(i64::MAX));
        Scrub {
            status: Arc::new(ScrubStatus::new(segments.len())),
            job: Mutex::new(Some(ScrubJob {
                log_dir,
                fs,
                segments,
                max_record_bytes,
            })),
            stop: Arc::new(AtomicBool::new(false)),
            handle: Mutex::new(None),
        }
    }

    /// The status, for `/readyz`.
    pub(super) fn status(&self) -> &Arc<ScrubStatus> {
        &self.status
    }

    /// Starts the thread (once; later calls do nothing). Errors: the thread
    /// could not be spawned.
    pub(super) fn start(&self) -> std::io::Result<()> {
        let Some(job) = self.job.lock().take() else {
            return Ok(());
        };
        if job.segments.is_empty() {
            return Ok(());
        }
        self.status.state.lock().started = true;
        let (status, stop) = (Arc::clone(&self.status), Arc::clone(&self.stop));
        let handle = std::thread::Builder::new()
            .name("spark-scrub".into())
            .spawn(move || run(job, &status, &stop))?;
        *self.handle.lock() = Some(handle);
        Ok(())
    }

    /// Tells the thread to stop after the segment it reads; returns it to
    /// wait for, if it was started and not waited for yet.
    pub(super) fn halt(&self) -> Option<JoinHandle<()>> {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.lock().take()
    }
}

impl Drop for Scrub {
    fn drop(&mut self) {
        if let Some(handle) = self.halt() {
            let _ = handle.join();
        }
    }
}

fn run(job: ScrubJob, status: &ScrubStatus, stop: &AtomicBool) {
    super::lower_thread_priority(SCRUB_NICE);
    let metrics = crate::metrics::get();
    let started = std::time::Instant::now();
    let mut bytes = 0u64;
    for segment in &job.segments {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let checked = spark_log_format::scrub_segment(
            &job.log_dir,
            job.fs.as_ref(),
            segment,
            job.max_record_bytes,
        );
        bytes += segment.bytes;
        let mut state = status.state.lock();
        state.checked += 1;
        metrics.log_scrub_segments_pending.dec();
        if let Err(error) = checked {
            tracing::error!(
                segment = %segment.name,
                %error,
                "scrub: a sealed segment that startup took on the checkpoint's word is damaged \
                 (the running state is not affected; restore the segment before a start \
                 without the checkpoint)"
            );
            metrics.log_scrub_damaged_segments.inc();
            state.damage.push(error.to_string());
        }
    }
    tracing::info!(
        segments = job.segments.len(),
        bytes,
        damaged = status.state.lock().damage.len(),
        ms = started.elapsed().as_millis() as u64,
        "scrub of the segments checked by their links at startup finished"
    );
}
