//! The checkpoint worker: a background thread that writes a
//! checkpoint ([`spark_core::checkpoint`]) once `log.checkpoint_interval_ops`
//! ops were committed after the newest one.
//!
//! It never takes the mirror's lock nor waits for the journal: it builds
//! its checkpoint from the log's files (the newest valid checkpoint plus a
//! live read of the committed records after it) with the one fold, at a
//! lower CPU priority, so writes never wait for it. A checkpoint is derived
//! state: nothing acknowledged depends on one.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use spark_log_format::Fs;

use super::Shared;

/// How often the worker looks at the committed seq.
const POLL_INTERVAL_MS: u64 = 100;

/// Nice value of the worker thread (Linux: per thread): above the
/// journal's and the HTTP workers' 0, so a checkpoint yields the CPU to
/// them.
const WORKER_NICE: i32 = 10;

/// The running worker; dropping it stops it (an unfinished checkpoint is
/// abandoned, never half written) and waits for the thread.
pub(super) struct CheckpointWorker {
    stop: Arc<AtomicBool>,
    wake: Option<mpsc::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

/// What the worker needs from the settings.
pub(super) struct WorkerConfig {
    /// The engine's file seam, which checkpoints are written through.
    pub fs: Arc<dyn Fs>,
    pub data_dir: PathBuf,
    pub log_dir: PathBuf,
    pub max_record_bytes: u32,
    pub interval_ops: u64,
    pub kept: usize,
    /// Seq of the checkpoint startup loaded (0 without one).
    pub last_seq: u64,
}

impl CheckpointWorker {
    /// Starts the worker thread. Errors: the thread could not be spawned.
    pub(super) fn spawn(
        config: WorkerConfig,
        shared: Arc<Shared>,
    ) -> std::io::Result<CheckpointWorker> {
        let stop = Arc::new(AtomicBool::new(false));
        let (wake, woken) = mpsc::channel::<()>();
        let thread_stop = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("spark-checkpoint".into())
            .spawn(move || run(config, shared, woken, thread_stop))?;
        Ok(CheckpointWorker {
            stop,
            wake: Some(wake),
            handle: Some(handle),
        })
    }

    /// Stops the worker and waits for its thread.
    pub(super) fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.take();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for CheckpointWorker {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(
    config: WorkerConfig,
    shared: Arc<Shared>,
    woken: mpsc::Receiver<()>,
    stop: Arc<AtomicBool>,
) {
    super::lower_thread_priority(WORKER_NICE);
    let mut last_seq = config.last_seq;
    let stopped = || stop.load(Ordering::SeqCst);
    loop {
        match woken.recv_timeout(Duration::from_millis(POLL_INTERVAL_MS)) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        if stopped() {
            return;
        }
        let committed = shared.head.lock().seq;
        if committed < last_seq.saturating_add(config.interval_ops) {
            continue;
        }
        let started = std::time::Instant::now();
        // Not while a compaction replaces segments and removes the
        // checkpoints holding what it erased.
        let _held = shared.checkpoints_held.blocking_lock();
        match spark_core::checkpoint::build(
            config.fs.as_ref(),
            &config.data_dir,
            &config.log_dir,
            config.max_record_bytes,
            config.kept,
            committed,
            &stopped,
        ) {
            Ok(Some(built)) => {
                for ignored in &built.ignored {
                    tracing::warn!(file = %ignored.file.display(), why = %ignored.why, "checkpoint ignored");
                }
                tracing::info!(
                    file = %built.file.display(),
                    seq = built.at.seq,
                    bytes = built.bytes,
                    from = ?built.from.as_ref().map(|f| f.display().to_string()),
                    ms = started.elapsed().as_millis() as u64,
                    "checkpoint written"
                );
                last_seq = built.at.seq;
            }
            Ok(None) => {}
            Err(why) => {
                // Derived state: a failed checkpoint costs only startup
                // time. Try again after another interval.
                tracing::warn!(dir = %spark_core::checkpoint::checkpoint_dir(&config.data_dir).display(), %why, "checkpoint not written");
                last_seq = committed;
            }
        }
    }
}
