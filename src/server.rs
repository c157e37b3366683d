//! The server: opens the engine, binds the listener, serves the API, and
//! shuts down cleanly (stop accepting, finish requests and the batch in
//! flight, stop the journal).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use spark_log_format::{Fs, OsFs};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::{routes, AppState};
use crate::brain::Brain;
use crate::clock::{Clock, SystemClock};
use crate::config::Settings;
use crate::engine::{Engine, EngineOpenError};
use crate::media::MediaStore;
use crate::turns;

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data directory or its log could not be opened.
    #[error(transparent)]
    Engine(#[from] EngineOpenError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The settings are invalid.
    #[error(transparent)]
    Settings(#[from] crate::config::SettingsError),
    /// A listener on a non-loopback address with no token configured
    /// (SPEC section 9).
    #[error("refusing to listen on {0} with no access token configured: add one with `spark-engine token add DEVICE` (it writes ./spark.toml, which the server reads when no --config is given), or listen on a loopback address")]
    OpenToTheNetwork(SocketAddr),
    /// `[archive]` is set and the archive refused to start (SPEC section 11).
    #[error(transparent)]
    Archive(#[from] crate::archive::ArchiveStartError),
    /// `spark-engine replica`: the replica could not bring its cache to
    /// the archive (SPEC section 11).
    #[error(transparent)]
    Replica(#[from] crate::replica::ReplicaStartError),
}

/// A server that is listening. Dropping it without [`RunningServer::shutdown`]
/// leaves the task running until the runtime ends.
pub struct RunningServer {
    /// The address actually bound (port 0 resolved).
    pub addr: SocketAddr,
    engine: Arc<Engine>,
    /// The media store: shutdown waits for its uploads in flight.
    media: MediaStore,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    /// The brain runner; aborted at shutdown (turns in flight stay running
    /// and are asked again at the next start).
    runner: JoinHandle<()>,
    /// Tells open event streams to end.
    closing: tokio::sync::watch::Sender<bool>,
    /// The archive shipper, with `[archive]`.
    archive: Option<crate::archive::Shipping>,
    /// The follower, on a replica (`spark-engine replica`).
    replica: Option<crate::replica::Following>,
    /// The compactor that erases deleted moments (SPEC section 13), unless
    /// it is held ([`crate::retention::Compactor::held`]). Shutdown waits
    /// for its pass in progress before the engine stops.
    compactor: Option<JoinHandle<()>>,
}

impl RunningServer {
    /// The engine behind the API.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Stops accepting, lets requests in flight finish (and uploads whose
    /// request ended before their `media.put` was answered), then stops
    /// the journal after the batch in flight is durable. In `sync` mode
    /// writes in flight wait for the archive while the shipper runs; if
    /// requests or uploads still wait after
    /// [`crate::archive::FINAL_SHIP_TIMEOUT`] the
    /// archive gate is closed, so they are answered `503 unavailable`
    /// (durable locally, archived after the restart) instead of holding
    /// the shutdown.
    pub async fn shutdown(mut self) {
        self.closing.send_replace(true);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = &mut self.task;
        let media = &self.media;
        let drain = async move {
            let _ = task.await;
            media.settled().await;
        };
        tokio::pin!(drain);
        let grace = crate::archive::FINAL_SHIP_TIMEOUT;
        if tokio::time::timeout(grace, &mut drain).await.is_err() {
            if let Some(gate) = self.engine.archive_gate() {
                gate.close(crate::archive::gate::shutting_down());
            }
            drain.await;
        }
        self.runner.abort();
        let _ = (&mut self.runner).await;
        if let Some(compactor) = self.compactor.take() {
            let _ = compactor.await;
        }
        if let Some(replica) = self.replica.take() {
            replica.stop().await;
        }
        self.engine.shutdown().await;
        if let Some(archive) = self.archive.take() {
            archive.stop().await;
        }
    }
}

/// Opens the engine on the real file system and clock, and serves. With the
/// `failpoints` feature, the log's file seam goes through the failpoints and
/// `SPARK_FAILPOINTS` arms them.
pub async fn start(settings: Settings) -> Result<RunningServer, StartError> {
    #[cfg(feature = "failpoints")]
    let fs: Arc<dyn Fs> = {
        if let Ok(spec) = std::env::var("SPARK_FAILPOINTS") {
            crate::failpoints::arm_from_spec(&spec).map_err(|message| {
                StartError::Settings(crate::config::SettingsError::Invalid {
                    key: "SPARK_FAILPOINTS",
                    message,
                })
            })?;
        }
        Arc::new(crate::failpoints::FailpointFs(Arc::new(OsFs)))
    };
    #[cfg(not(feature = "failpoints"))]
    let fs: Arc<dyn Fs> = Arc::new(OsFs);
    start_with(settings, fs, Arc::new(SystemClock)).await
}

/// Opens the engine with the given file seam and clock, and serves, with the
/// brains the settings' seats describe.
pub async fn start_with(
    settings: Settings,
    fs: Arc<dyn Fs>,
    clock: Arc<dyn Clock>,
) -> Result<RunningServer, StartError> {
    let seats = settings
        .brains
        .seats
        .iter()
        .map(|seat| (seat.name.clone(), seat.build()))
        .collect();
    start_with_brains(settings, fs, clock, seats).await
}

/// Opens the engine and serves with the given brains, one per seat name
/// (the names must be the settings' seats, in order); tests use this to put
/// scripted brains in the seats.
pub async fn start_with_brains(
    settings: Settings,
    fs: Arc<dyn Fs>,
    clock: Arc<dyn Clock>,
    brains: Vec<(String, Arc<dyn Brain>)>,
) -> Result<RunningServer, StartError> {
    settings.validate()?;
    if !settings.listen.ip().is_loopback() && settings.access.tokens.is_empty() {
        return Err(StartError::OpenToTheNetwork(settings.listen));
    }
    let settings = Arc::new(settings);
    let replica = match settings.replica_from {
        Some(_) => Some(crate::replica::prepare(&settings).await?),
        None => None,
    };
    let taken_over = take_over(&settings, clock.as_ref()).await?;
    let session_clock = Arc::clone(&clock);
    let retention_clock = Arc::clone(&clock);
    let engine = open_engine(&settings, Arc::clone(&fs), clock).await?;
    let media = open_media(&settings, &engine, Arc::clone(&fs))?;
    let replica = match replica {
        Some(prepared) => Some(
            prepared
                .start(&settings, Arc::clone(&engine), media.clone())
                .await?,
        ),
        None => None,
    };
    if let Some(taken_over) = &taken_over {
        let fetched = taken_over
            .fetch_missing_blobs(&engine, &settings.data_dir)
            .await?;
        tracing::info!(fetched, "blobs of the ops fetched at the take-over");
    }
    let archive = start_archive(&settings, &engine, taken_over.as_ref()).await?;
    let (listener, addr) = bind(settings.listen).await?;
    let seat_names: Vec<String> = brains.iter().map(|(name, _)| name.clone()).collect();
    // A replica asks no brain: its turns end on the writer, and the
    // outcome arrives through the archive.
    let runner = if replica.is_some() {
        tokio::spawn(async {})
    } else {
        turns::spawn(
            Arc::clone(&engine),
            brains.into_iter().collect(),
            media.clone(),
            turns::Limits {
                concurrency_max: settings.brains.concurrency_max,
                timeout: Duration::from_millis(settings.brains.timeout_ms),
                copies_max_bytes: settings.brains.copies_max_bytes,
            },
        )
    };
    let (closing, shutdown) = tokio::sync::watch::channel(false);
    let media_store = media.clone();
    let event_streams_cap = settings.limits.event_streams_cap();
    let state = Arc::new(AppState {
        engine: Arc::clone(&engine),
        settings,
        media,
        verified_blobs: Default::default(),
        seats: seat_names,
        shutdown,
        archive: archive.as_ref().map(|a| Arc::clone(&a.status)),
        replica: replica.as_ref().map(|r| Arc::clone(&r.status)),
        sessions: Arc::new(crate::api::session::Sessions::new(session_clock)),
        event_streams: Arc::new(tokio::sync::Semaphore::new(event_streams_cap)),
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let limits = state.settings.limits.clone();
    let settings = Arc::clone(&state.settings);
    let service = hyper_util::service::TowerToHyperService::new(warp::service(routes(state)));
    let task = tokio::spawn(serve(listener, service, limits, async move {
        let _ = stopped.await;
    }));
    // Only now: the scrub's reads must not delay the first answer.
    if let Err(error) = engine.start_scrub() {
        tracing::error!(%error, "the scrub could not start: the segments startup checked by their links only stay unread until a restart");
    }
    let compactor = match crate::retention::Compactor::held(&settings) {
        Some(held) => {
            tracing::warn!(?held, "deleted moments are not erased on this server: the compactor does not run on a replica");
            None
        }
        None => {
            let compactor = crate::retention::Compactor::new(
                &settings,
                Arc::clone(&engine),
                media_store.clone(),
                fs,
                retention_clock,
            );
            let interval = Duration::from_millis(settings.retention.check_interval_ms);
            Some(tokio::spawn(compactor.run(interval, closing.subscribe())))
        }
    };
    Ok(RunningServer {
        addr,
        engine,
        media: media_store,
        stop: Some(stop),
        task,
        runner,
        closing,
        archive,
        replica,
        compactor,
    })
}

/// Opens the engine off the async threads (replaying the log) and logs
/// what the replay found.
async fn open_engine(
    settings: &Arc<Settings>,
    fs: Arc<dyn Fs>,
    clock: Arc<dyn Clock>,
) -> Result<Arc<Engine>, StartError> {
    let opening = Arc::clone(settings);
    let engine = tokio::task::spawn_blocking(move || Engine::open(&opening, fs, clock))
        .await
        .map_err(|e| EngineOpenError::DataDir {
            path: settings.data_dir.display().to_string(),
            source: std::io::Error::other(format!("replay task failed: {e}")),
        })??;
    let engine = Arc::new(engine);
    let report = engine.recovery();
    tracing::info!(
        segments = report.segments,
        records = report.records,
        seq = engine.head().seq,
        torn_tail = ?report.truncated,
        "log replayed"
    );
    if let Some(torn) = &report.truncated {
        // Said loudly: a whole last frame with a bad checksum is a torn
        // write or a damaged acknowledged record or commit mark, which no
        // reader can tell apart (FORMAT.md); the cut bytes are kept aside.
        tracing::warn!(
            segment = %torn.segment,
            offset = torn.offset,
            bytes = torn.bytes_dropped,
            seqs = ?torn.seqs,
            damage = %torn.damage,
            possible_fault = torn.whole_frame,
            quarantine = ?torn.quarantine,
            "the log's tail after the last whole batch was cut at startup"
        );
    }
    Ok(engine)
}

/// With `--take-over` (and `[archive]`, which validation requires): takes
/// the archive's prefix over before the engine opens (it may append the
/// archive's ops to the local log). Without it, with leases on (`[archive]
/// lease_ms` above 0): takes the prefix over the same way when another
/// writer holds it and its lease expired, and refuses the start, saying
/// when the lease expires, while it is live (ARCHIVE.md "Lease"); whether
/// it expired is read by `clock`, the engine's.
async fn take_over(
    settings: &Settings,
    clock: &dyn Clock,
) -> Result<Option<crate::archive::TakenOver>, StartError> {
    let Some(archive) = settings.archive.as_ref() else {
        return Ok(None);
    };
    let (data_dir, max_record_bytes) = (&settings.data_dir, settings.log.max_record_bytes);
    if !settings.take_over {
        let taken =
            crate::archive::take_over_if_expired(archive, data_dir, max_record_bytes, clock)
                .await?;
        return Ok(taken);
    }
    let taken = crate::archive::take_over(archive, data_dir, max_record_bytes).await?;
    Ok(Some(taken))
}

/// Starts the archive shipper when `[archive]` is set (on the store of
/// the take-over, after one).
async fn start_archive(
    settings: &Settings,
    engine: &Arc<Engine>,
    taken_over: Option<&crate::archive::TakenOver>,
) -> Result<Option<crate::archive::Shipping>, StartError> {
    let Some(archive) = &settings.archive else {
        return Ok(None);
    };
    let (data_dir, max_record_bytes) = (&settings.data_dir, settings.log.max_record_bytes);
    let engine = Arc::clone(engine);
    Ok(Some(match taken_over {
        Some(taken) => {
            taken
                .start(archive, data_dir, engine, max_record_bytes)
                .await?
        }
        None => crate::archive::start(archive, data_dir, engine, max_record_bytes).await?,
    }))
}

/// Binds the listener on `listen`; returns it with the address actually
/// bound (port 0 resolved).
async fn bind(listen: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), StartError> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: listen,
        source,
    })?;
    Ok((listener, addr))
}

/// Opens the media store on `fs` and removes the orphan blobs older than
/// `media.orphan_grace_ms` (a crash between a blob and its `media.put`),
/// with a log line and `spark_media_orphans_removed_total`. Runs before
/// the listener serves, so no upload is in flight.
fn open_media(
    settings: &Settings,
    engine: &Engine,
    fs: Arc<dyn Fs>,
) -> Result<MediaStore, EngineOpenError> {
    let io_error = |source| EngineOpenError::DataDir {
        path: crate::media::media_dir(&settings.data_dir)
            .display()
            .to_string(),
        source,
    };
    let media = MediaStore::open(&settings.data_dir, fs).map_err(io_error)?;
    let referenced: std::collections::HashSet<_> =
        engine.read(|mirror| mirror.media.values().map(|m| m.sha256.0).collect());
    let grace_ms = settings.media.orphan_grace_ms;
    let sweep = media
        .remove_orphans(&referenced, Duration::from_millis(grace_ms))
        .map_err(io_error)?;
    crate::metrics::get()
        .media_orphans_removed
        .inc_by(sweep.removed);
    if sweep.removed > 0 || sweep.young > 0 {
        tracing::info!(
            removed = sweep.removed,
            kept_within_grace = sweep.young,
            grace_ms,
            "orphan blobs (a crash between a blob and its media.put)"
        );
    }
    Ok(media)
}

/// Resolves when the process gets SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The accept loop: at most `limits.connections_max` connections open at
/// once (the listener pauses while that many are, so further clients wait
/// in the kernel's backlog), `limits.header_read_timeout_ms` for each
/// request head, and a graceful stop: once `stop` resolves no connection
/// is accepted, and the call returns when the open ones have finished
/// their requests in flight.
async fn serve<S>(
    listener: tokio::net::TcpListener,
    service: S,
    limits: crate::config::Limits,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) where
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = warp::reply::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.connections_max));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let header_read_timeout = Duration::from_millis(limits.header_read_timeout_ms);
    let mut stop = std::pin::pin!(stop);
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait, then go on.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        // HTTP/1.1 only: the API is served to phones and behind TLS
        // proxies that speak HTTP/1.1 to it. (hyper's HTTP/1-or-2 sniffing
        // read had no timeout, so silent sockets held their slots forever,
        // and cleartext HTTP/2 had no idle timeout.) The head timer runs
        // from the connection's start and between requests, so a socket
        // that sends nothing is closed too.
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout);
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
