//! A replica's metrics (SPEC section 11): registered only when a
//! replica starts, and rendered after the engine's own at `/metrics`.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Every replica metric.
pub struct ReplicaMetrics {
    registry: Registry,
    /// `spark_replica_seq`: the last seq the replica applied and serves.
    pub seq: Gauge,
    /// `spark_replica_lag_seconds`: seconds since the replica last knew it
    /// held everything the archive held ([`Watched::lag_ms`]),
    /// computed at each scrape.
    pub lag_seconds: Gauge<f64, AtomicU64>,
    /// `spark_replica_failures_total`: polls or fetches that failed (the
    /// store unreachable, a damaged object), each tried again.
    pub failures: Counter,
}

static METRICS: OnceLock<ReplicaMetrics> = OnceLock::new();

/// The running replicas a scrape reads (one in a server; tests may run
/// several in one process).
static WATCHED: Mutex<Vec<Weak<dyn Watched>>> = parking_lot::const_mutex(Vec::new());

/// What a scrape reads of a running replica. Implemented by the replica's
/// status; this module knows nothing else of it.
pub(crate) trait Watched: Send + Sync {
    /// The last seq the replica applied and serves.
    fn seq(&self) -> u64;
    /// Milliseconds since the replica last knew it held everything the
    /// archive held.
    fn lag_ms(&self) -> u64;
}

/// Makes [`render_into`] read `status` at each scrape, until it is dropped.
pub(crate) fn watch<S: Watched + 'static>(status: &Arc<S>) {
    get();
    let mut watched = WATCHED.lock();
    watched.retain(|w| w.strong_count() > 0);
    let status: Arc<dyn Watched> = status.clone();
    watched.push(Arc::downgrade(&status));
}

/// The replica metrics, registered on first use (when a replica starts).
pub fn get() -> &'static ReplicaMetrics {
    METRICS.get_or_init(|| {
        let mut registry = Registry::with_prefix("spark_replica");
        let seq = Gauge::default();
        registry.register(
            "seq",
            "Last seq this replica applied and serves",
            seq.clone(),
        );
        let lag_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "lag_seconds",
            "Seconds since this replica last knew it held everything the archive held",
            lag_seconds.clone(),
        );
        let failures = Counter::default();
        registry.register(
            "failures",
            "Polls or fetches of the archive that failed (tried again)",
            failures.clone(),
        );
        ReplicaMetrics {
            registry,
            seq,
            lag_seconds,
            failures,
        }
    })
}

/// Appends the replica metrics to `text` (the engine's, in the OpenMetrics
/// format) when a replica was started in this process; keeps one `# EOF`.
pub fn render_into(text: &mut String) {
    let Some(metrics) = METRICS.get() else {
        return;
    };
    let live: Vec<_> = WATCHED.lock().iter().filter_map(Weak::upgrade).collect();
    if let Some(status) = live.first() {
        metrics.seq.set(status.seq() as i64);
        metrics.lag_seconds.set(status.lag_ms() as f64 / 1000.0);
    }
    crate::metrics::append_registry(text, &metrics.registry);
}
