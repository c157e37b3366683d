//! The brain runner: asks a brain once per committed `turn.start`, in the
//! background, and records the outcome as `turn.finish` or `turn.fail`.
//!
//! The journal sends the id of every committed `turn.start` here; at startup
//! the runner also gets every turn left `running` (a crash or a stop came
//! between its start and its outcome) and asks again, once. A turn whose
//! request id is known is answered from the mirror and never reaches the
//! runner, so a retried request never asks a brain twice (the seed lesson).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

use crate::brain::{Brain, BrainRequest, CopyImage};
use crate::engine::{Command, EndTurn, Engine, EngineError};
use crate::media::MediaStore;
use spark_core::ids::Id;
use spark_core::op::MediaRole;

/// The seats by name.
pub type Seats = HashMap<String, Arc<dyn Brain>>;

/// How the runner asks its brains (`[brains]` settings).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most brain calls at once.
    pub concurrency_max: usize,
    /// Longest one brain call may take.
    pub timeout: Duration,
    /// Most bytes of photo copies one turn reads beyond its first copy
    /// (`brains.copies_max_bytes`).
    pub copies_max_bytes: u64,
}

/// Starts the runner over `engine`: attaches to its committed turn starts
/// and asks again every turn that is running now. Abort the returned task
/// to stop it (and every brain call in flight).
pub fn spawn(
    engine: Arc<Engine>,
    seats: Seats,
    media: MediaStore,
    limits: Limits,
) -> JoinHandle<()> {
    let (sink, mut started) = mpsc::unbounded_channel();
    let running = engine.attach_turn_sink(sink);
    let runner = Arc::new(Runner {
        engine,
        seats,
        media,
        limit: Arc::new(Semaphore::new(limits.concurrency_max)),
        timeout: limits.timeout,
        copies_max_bytes: limits.copies_max_bytes,
    });
    tokio::spawn(async move {
        // Every brain call runs in this set: aborting the runner (at
        // shutdown) aborts them all, and their turns stay running, to be
        // asked again at the next start.
        let mut asking = tokio::task::JoinSet::new();
        if !running.is_empty() {
            tracing::info!(turns = running.len(), "asking again the turns left running");
        }
        for turn_id in running {
            asking.spawn(Arc::clone(&runner).ask_when_free(turn_id));
        }
        loop {
            tokio::select! {
                started = started.recv() => match started {
                    Some(turn_id) => {
                        asking.spawn(Arc::clone(&runner).ask_when_free(turn_id));
                    }
                    None => break,
                },
                Some(_) = asking.join_next(), if !asking.is_empty() => {}
            }
        }
        while asking.join_next().await.is_some() {}
    })
}

struct Runner {
    /// Where turns are read and outcomes recorded.
    engine: Arc<Engine>,
    /// The configured brains.
    seats: Seats,
    /// Where the copies the brains read are.
    media: MediaStore,
    /// At most `concurrency_max` brain calls at once.
    limit: Arc<Semaphore>,
    /// Longest one brain call may take.
    timeout: Duration,
    /// Most bytes of copies one turn reads beyond its first copy.
    copies_max_bytes: u64,
}

impl Runner {
    /// Waits for a free place under the concurrency limit, then asks.
    async fn ask_when_free(self: Arc<Self>, turn_id: Id) {
        let Ok(_permit) = self.limit.clone().acquire_owned().await else {
            return;
        };
        self.ask(turn_id).await;
    }

    /// What the brain reads for a turn, and which seat; `None` when the turn
    /// is not running (already ended) or gone. The copies of the moment's
    /// photos go in photo order (issue 27): the first always, each later
    /// one while the copies taken and it stay within `copies_max_bytes`; a
    /// copy left out for that, or whose blob cannot be read or no longer
    /// matches its op, is said so in the log.
    async fn request(&self, turn_id: Id) -> Option<(String, BrainRequest)> {
        let (seat, mut request, copies) = self.engine.read(|mirror| {
            let turn = mirror.turns.get(&turn_id)?;
            if turn.status != spark_core::mirror::TurnStatus::Running {
                return None;
            }
            let moment = mirror.moment(turn.moment_id)?;
            let mut copies: Vec<_> = moment
                .media()
                .iter()
                .filter_map(|id| mirror.media.get(id))
                .filter(|m| m.role == MediaRole::Copy)
                .map(|m| (m.photo, m.sha256.0, m.size_bytes, m.content_type.clone()))
                .collect();
            copies.sort_by_key(|(photo, ..)| *photo);
            Some((
                turn.seat.clone(),
                BrainRequest {
                    moment_text: moment.text().map(str::to_owned),
                    caption: moment.caption().map(str::to_owned),
                    lang: moment.lang().map(str::to_owned),
                    copies: Vec::new(),
                    mode: turn.mode.name().to_owned(),
                },
                copies,
            ))
        })?;
        let mut taken_bytes = 0u64;
        for (photo, sha256, size_bytes, content_type) in copies {
            if !request.copies.is_empty()
                && taken_bytes.saturating_add(size_bytes) > self.copies_max_bytes
            {
                tracing::warn!(turn = %turn_id, photo, size_bytes, "a copy past brains.copies_max_bytes; asking without it");
                continue;
            }
            match tokio::fs::read(self.media.blob_path(&sha256)).await {
                Ok(bytes) => match spark_core::blob::verify_reader(&bytes[..], &sha256, size_bytes)
                {
                    Ok(()) => {
                        taken_bytes += size_bytes;
                        request.copies.push(CopyImage {
                            bytes,
                            content_type,
                        })
                    }
                    Err(fault) => {
                        tracing::error!(turn = %turn_id, photo, %fault, "a copy's blob no longer matches its op; asking without it")
                    }
                },
                Err(e) => {
                    tracing::error!(turn = %turn_id, photo, error = %e, "a copy's blob cannot be read; asking without it")
                }
            }
        }
        Some((seat, request))
    }

    async fn ask(&self, turn_id: Id) {
        let Some((seat, request)) = self.request(turn_id).await else {
            return;
        };
        let started = Instant::now();
        let outcome = match self.seats.get(&seat) {
            None => Err(format!("seat {seat:?} is not configured")),
            Some(brain) => match tokio::time::timeout(self.timeout, brain.read(request)).await {
                Ok(Ok(answer)) => Ok((answer.text, answer.adapter, answer.source)),
                Ok(Err(e)) => Err(e.0),
                Err(_) => Err(format!(
                    "the brain did not answer within {} ms",
                    self.timeout.as_millis()
                )),
            },
        };
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let outcome_label = if outcome.is_ok() { "done" } else { "failed" };
        crate::metrics::get()
            .brain_calls
            .get_or_create(&crate::metrics::label("outcome", outcome_label))
            .inc();
        let command = Command::EndTurn(EndTurn {
            turn_id,
            outcome,
            elapsed_ms,
        });
        loop {
            match self.engine.submit(command.clone()).await {
                Ok(_) => {}
                // Short of disk space: the outcome is kept here and offered
                // again until space is back (writes resume by themselves),
                // not left for a restart.
                Err(EngineError::InsufficientStorage(why)) => {
                    tracing::warn!(turn = %turn_id, %why, "turn outcome waits for disk space");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    continue;
                }
                // Stopping: the turn stays running and is asked again at restart.
                // Fenced: another engine took the archive's prefix over.
                Err(EngineError::Unavailable(why) | EngineError::Fenced(why)) => {
                    tracing::warn!(turn = %turn_id, %why, "turn outcome not recorded")
                }
                Err(e) => tracing::error!(turn = %turn_id, error = %e, "turn outcome refused"),
            }
            break;
        }
    }
}
