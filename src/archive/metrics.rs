//! The archive's metrics (SPEC section 11): registered only when an archive
//! is configured, and rendered after the engine's own at `/metrics`.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// Every archive metric.
pub struct ArchiveMetrics {
    registry: Registry,
    /// `spark_archive_shipped_seq`: the last seq a stored manifest names.
    pub shipped_seq: Gauge,
    /// `spark_archive_lag_seconds`: seconds the oldest acknowledged op not
    /// yet shipped has waited (0 when caught up), computed at each scrape
    /// ([`render_into`]).
    pub lag_seconds: Gauge<f64, AtomicU64>,
    /// `spark_archive_fenced`: 1 once another engine took the prefix over
    /// and this one stopped acknowledging writes (`503 fenced`), else 0.
    pub fenced: Gauge,
    /// `spark_archive_blobs_missing`: blobs the archive recorded lost
    /// (missing or damaged locally; their ops shipped without them) since
    /// the engine started, computed at each scrape.
    pub blobs_missing: Gauge,
    /// `spark_archive_objects_put_total`, by kind (`segment`, `chunk`,
    /// `manifest`, `renewal` (a manifest stored only to renew the lease,
    /// ARCHIVE.md "Lease"), `checkpoint` (an archived checkpoint, or a
    /// manifest stored only to list one), `retention` (a manifest stored
    /// only to raise the retention floor, ARCHIVE.md "Retention"), `blob`,
    /// `missing` (a missing-blob marker), `epoch`).
    pub objects_put: Family<Labels, Counter>,
    /// `spark_archive_bytes_put_total`, by kind.
    pub bytes_put: Family<Labels, Counter>,
    /// `spark_archive_objects_deleted_total`, by kind (`manifest`,
    /// `segment`, `chunk`, `checkpoint`, `blob`): objects the retention
    /// pass deleted (ARCHIVE.md "Retention").
    pub objects_deleted: Family<Labels, Counter>,
    /// `spark_archive_bytes_deleted_total`, by kind.
    pub bytes_deleted: Family<Labels, Counter>,
    /// `spark_archive_failures_total`, by kind (`unreachable`, `conflict`,
    /// `damaged`, `missing`, `local`, `blob`, `fenced`).
    pub failures: Family<Labels, Counter>,
    /// `spark_archive_waiting_writes`: in `sync` mode, answers committed
    /// locally and waiting for the archive to store them (0 otherwise).
    pub waiting_writes: Gauge,
    /// `spark_archive_ship_seconds`, by `stage`: how long each stage of a
    /// ship took (a histogram, 1 ms to about 16 s): `head` (the fencing
    /// HEAD), `blobs` (every blob put of the ship, or its missing-blob
    /// markers), `log` (the sealed segments and the chunk), `manifest`,
    /// and `ship` (the whole ship, from the HEAD to the stored manifest).
    /// `blobs` and `log` run at the same time, so `ship` is about `head` +
    /// the longer of the two + `manifest`. Only ships that stored a
    /// manifest are observed.
    pub ship_seconds: Family<Labels, Histogram>,
}

/// The buckets of [`ArchiveMetrics::ship_seconds`]: 1 ms, doubling, 15 of them.
fn ship_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

static METRICS: OnceLock<ArchiveMetrics> = OnceLock::new();

/// What a scrape reads of a running shipper: the gauges computed when
/// read. Implemented by the shipper's status; this module knows nothing
/// else of it.
pub(crate) trait Watched: Send + Sync {
    /// Seconds the oldest acknowledged op not yet shipped has waited (0
    /// when caught up).
    fn lag_seconds(&self) -> f64;
    /// Blobs the archive recorded lost since the shipper started.
    fn blobs_missing(&self) -> usize;
}

/// The running shippers a scrape reads (one in a server; tests run
/// several in one process).
static WATCHED: Mutex<Vec<Weak<dyn Watched>>> = parking_lot::const_mutex(Vec::new());

/// Makes [`render_into`] read `status` at each scrape, until it is dropped.
pub(crate) fn watch<S: Watched + 'static>(status: &Arc<S>) {
    let mut watched = WATCHED.lock();
    watched.retain(|w| w.strong_count() > 0);
    let status: Arc<dyn Watched> = status.clone();
    watched.push(Arc::downgrade(&status));
}

/// Sets the gauges computed when read: the largest lag and the lost blobs
/// of the running shippers.
fn refresh(metrics: &ArchiveMetrics) {
    let live: Vec<_> = WATCHED.lock().iter().filter_map(Weak::upgrade).collect();
    if live.is_empty() {
        return;
    }
    let lag = live.iter().map(|s| s.lag_seconds()).fold(0.0, f64::max);
    metrics.lag_seconds.set(lag);
    let missing: usize = live.iter().map(|s| s.blobs_missing()).sum();
    metrics.blobs_missing.set(missing as i64);
}

/// The archive metrics, registered on first use (when an archive starts).
pub fn get() -> &'static ArchiveMetrics {
    METRICS.get_or_init(|| {
        let mut registry = Registry::with_prefix("spark_archive");
        let shipped_seq = Gauge::default();
        registry.register(
            "shipped_seq",
            "Last seq named by a stored manifest",
            shipped_seq.clone(),
        );
        let lag_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "lag_seconds",
            "Seconds the oldest acknowledged write not yet shipped has waited",
            lag_seconds.clone(),
        );
        let fenced = Gauge::default();
        registry.register(
            "fenced",
            "1 once another engine took the prefix over (writes answer 503 fenced)",
            fenced.clone(),
        );
        let blobs_missing = Gauge::default();
        registry.register(
            "blobs_missing",
            "Blobs recorded lost in the archive (missing or damaged locally) since start",
            blobs_missing.clone(),
        );
        let objects_put = Family::<Labels, Counter>::default();
        registry.register(
            "objects_put",
            "Objects stored, by kind",
            objects_put.clone(),
        );
        let bytes_put = Family::<Labels, Counter>::default();
        registry.register("bytes_put", "Bytes stored, by kind", bytes_put.clone());
        let objects_deleted = Family::<Labels, Counter>::default();
        registry.register(
            "objects_deleted",
            "Objects the retention pass deleted, by kind",
            objects_deleted.clone(),
        );
        let bytes_deleted = Family::<Labels, Counter>::default();
        registry.register(
            "bytes_deleted",
            "Bytes the retention pass deleted, by kind",
            bytes_deleted.clone(),
        );
        let failures = Family::<Labels, Counter>::default();
        registry.register("failures", "Failed ships, by kind", failures.clone());
        let waiting_writes = Gauge::default();
        registry.register(
            "waiting_writes",
            "Answers committed locally and waiting for the archive (sync mode)",
            waiting_writes.clone(),
        );
        let ship_seconds =
            Family::<Labels, Histogram>::new_with_constructor(ship_histogram as fn() -> Histogram);
        registry.register(
            "ship_seconds",
            "Seconds per stage of a ship (head, blobs, log, manifest; ship: the whole)",
            ship_seconds.clone(),
        );
        ArchiveMetrics {
            registry,
            shipped_seq,
            lag_seconds,
            fenced,
            blobs_missing,
            objects_put,
            bytes_put,
            objects_deleted,
            bytes_deleted,
            failures,
            waiting_writes,
            ship_seconds,
        }
    })
}

/// Appends the archive metrics to `text` (the engine's, in the OpenMetrics
/// format) when an archive was started in this process; keeps one `# EOF`.
pub fn render_into(text: &mut String) {
    let Some(metrics) = METRICS.get() else {
        return;
    };
    refresh(metrics);
    crate::metrics::append_registry(text, &metrics.registry);
}
