//! Metrics in the Prometheus text format, served at `/metrics`: ops appended
//! by kind, group-commit batch sizes, the latency of a batch's write and
//! fdatasync, request latency by route and status, the replay at startup,
//! mirror sizes, brain calls by outcome, and the event streams' subscribers
//! and queued bytes.
//!
//! One process-wide registry ([`get`]), because one engine process owns one
//! data directory; tests that run several servers in one process share it.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use spark_core::mirror::Mirror;

/// Label pairs of a family.
type Labels = Vec<(String, String)>;

/// Every metric the engine keeps.
pub struct Metrics {
    registry: Registry,
    /// Ops appended to the log, by kind.
    pub ops_appended: Family<Labels, Counter>,
    /// Ops per group-commit batch.
    pub batch_ops: Histogram,
    /// Seconds for one batch's write call and fdatasync.
    pub fsync_seconds: Histogram,
    /// Seconds per request, by route template, method and status; observed
    /// through [`Metrics::observe_request`].
    pub request_seconds: Family<Labels, Histogram>,
    /// The histograms of `request_seconds` already made, by (route template,
    /// method label, status): a request finds its own with no allocation (the
    /// family's key is a vector of owned strings, six allocations per look-up).
    /// Hashed with foldhash (the keys are a few static strings; SipHash was
    /// a measurable part of every request).
    request_cache: parking_lot::RwLock<RequestCache>,
    /// Seconds the startup replay took.
    pub replay_seconds: Gauge<f64, AtomicU64>,
    /// Sealed segments startup checked by their links only (a checkpoint
    /// covers them) that the scrub has not read yet.
    pub log_scrub_segments_pending: Gauge,
    /// Such segments the scrub found damaged (or could not read).
    pub log_scrub_damaged_segments: Gauge,
    /// Brain calls, by outcome (`done`, `failed`).
    pub brain_calls: Family<Labels, Counter>,
    /// Mirror sizes at the last scrape, by what is counted.
    pub mirror_entries: Family<Labels, Gauge>,
    /// Orphan blobs removed at startup (older than `media.orphan_grace_ms`).
    pub media_orphans_removed: Counter,
    /// Free bytes of the data directory's file system at the last check
    /// (`statvfs`: blocks available to unprivileged users).
    pub disk_free_bytes: Gauge,
    /// The reserve, `log.disk_reserve_bytes`.
    pub disk_reserve_bytes: Gauge,
    /// 1 while writes are refused for want of space (below the reserve, or
    /// the log waits for space to recover its tail), else 0.
    pub writes_refused_now: Gauge,
    /// Writes refused, by reason: `disk_reserve` (free space below the
    /// reserve), `disk_full` (a write of the log or a blob failed with
    /// `ENOSPC`).
    pub writes_refused: Family<Labels, Counter>,
    /// In-process recoveries of the log's tail after a full disk.
    pub log_heals: Counter,
    /// Open event streams (`GET /api/events`).
    pub event_subscribers: Gauge,
    /// Bytes of events queued for the open event streams, summed (each at
    /// most `api::events::SUBSCRIBER_BUFFER_BYTES`).
    pub event_buffered_bytes: Gauge,
}

/// The request histograms by (route template, method label, status).
type RequestCache =
    HashMap<(&'static str, &'static str, u16), Histogram, foldhash::fast::RandomState>;

fn request_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 18))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("spark");
        let ops_appended = Family::<Labels, Counter>::default();
        registry.register(
            "ops_appended",
            "Ops appended to the log, by kind",
            ops_appended.clone(),
        );
        let batch_ops = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        registry.register("batch_ops", "Ops per group-commit batch", batch_ops.clone());
        let fsync_seconds = Histogram::new(exponential_buckets(0.000_02, 2.0, 16));
        registry.register(
            "batch_write_fsync_seconds",
            "Seconds for one batch's write call and fdatasync",
            fsync_seconds.clone(),
        );
        let request_seconds = Family::<Labels, Histogram>::new_with_constructor(
            request_histogram as fn() -> Histogram,
        );
        registry.register(
            "request_seconds",
            "Seconds per HTTP request, by route, method and status",
            request_seconds.clone(),
        );
        let replay_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "replay_seconds",
            "Seconds the startup replay took",
            replay_seconds.clone(),
        );
        let log_scrub_segments_pending = Gauge::default();
        registry.register(
            "log_scrub_segments_pending",
            "Sealed segments startup checked by their links only, not yet read by the scrub",
            log_scrub_segments_pending.clone(),
        );
        let log_scrub_damaged_segments = Gauge::default();
        registry.register(
            "log_scrub_damaged_segments",
            "Sealed segments the scrub found damaged or could not read",
            log_scrub_damaged_segments.clone(),
        );
        let brain_calls = Family::<Labels, Counter>::default();
        registry.register(
            "brain_calls",
            "Brain calls, by outcome",
            brain_calls.clone(),
        );
        let mirror_entries = Family::<Labels, Gauge>::default();
        registry.register(
            "mirror_entries",
            "Entries in the mirror, by what is counted",
            mirror_entries.clone(),
        );
        let media_orphans_removed = Counter::default();
        registry.register(
            "media_orphans_removed",
            "Orphan blobs removed at startup (a crash between a blob and its media.put)",
            media_orphans_removed.clone(),
        );
        let disk_free_bytes = Gauge::default();
        registry.register(
            "disk_free_bytes",
            "Free bytes of the data directory's file system at the last check",
            disk_free_bytes.clone(),
        );
        let disk_reserve_bytes = Gauge::default();
        registry.register(
            "disk_reserve_bytes",
            "Free bytes below which writes are refused (log.disk_reserve_bytes)",
            disk_reserve_bytes.clone(),
        );
        let writes_refused_now = Gauge::default();
        registry.register(
            "writes_refused_for_space",
            "1 while writes are refused for want of disk space, else 0",
            writes_refused_now.clone(),
        );
        let writes_refused = Family::<Labels, Counter>::default();
        registry.register(
            "writes_refused",
            "Writes refused for want of disk space, by reason (disk_reserve, disk_full)",
            writes_refused.clone(),
        );
        let log_heals = Counter::default();
        registry.register(
            "log_heals",
            "In-process recoveries of the log's tail after a full disk",
            log_heals.clone(),
        );
        let event_subscribers = Gauge::default();
        registry.register(
            "event_subscribers",
            "Open event streams (GET /api/events)",
            event_subscribers.clone(),
        );
        let event_buffered_bytes = Gauge::default();
        registry.register(
            "event_buffered_bytes",
            "Bytes of events queued for the open event streams, summed",
            event_buffered_bytes.clone(),
        );
        Metrics {
            disk_free_bytes,
            disk_reserve_bytes,
            writes_refused_now,
            writes_refused,
            log_heals,
            registry,
            media_orphans_removed,
            ops_appended,
            batch_ops,
            fsync_seconds,
            request_seconds,
            request_cache: parking_lot::RwLock::new(RequestCache::default()),
            replay_seconds,
            log_scrub_segments_pending,
            log_scrub_damaged_segments,
            brain_calls,
            mirror_entries,
            event_subscribers,
            event_buffered_bytes,
        }
    }

    /// Observes one request of `seconds` in `request_seconds`, labelled
    /// `route` (a [`crate::api::route_table::template_of`] template), `method` (a [`method_of`] label)
    /// and `status`. The label set stays small (templates and standard
    /// methods only), and so does the cache of their histograms.
    pub fn observe_request(
        &self,
        route: &'static str,
        method: &'static str,
        status: u16,
        seconds: f64,
    ) {
        let key = (route, method, status);
        if let Some(histogram) = self.request_cache.read().get(&key) {
            histogram.observe(seconds);
            return;
        }
        let histogram = self
            .request_seconds
            .get_or_create(&vec![
                ("route".to_owned(), route.to_owned()),
                ("method".to_owned(), method.to_owned()),
                ("status".to_owned(), status.to_string()),
            ])
            .clone();
        histogram.observe(seconds);
        self.request_cache.write().insert(key, histogram);
    }

    /// Sets the mirror gauges from `mirror`.
    pub fn observe_mirror(&self, mirror: &Mirror) {
        let counts = [
            ("moments_live", mirror.live_moments),
            ("moments_deleted", mirror.deleted_moments()),
            ("requests", mirror.requests.len()),
            ("media", mirror.media.len()),
            ("turns", mirror.turns.len()),
            ("marks", mirror.marks.len()),
            ("messages", mirror.messages.len()),
            ("jobs", mirror.jobs.len()),
            ("recalls", mirror.recalls.len()),
        ];
        for (what, n) in counts {
            self.mirror_entries
                .get_or_create(&vec![("what".to_owned(), what.to_owned())])
                // Cast: entry counts are far below i64::MAX.
                .set(n as i64);
        }
    }

    /// The engine's own registry in the OpenMetrics text format; `GET
    /// /metrics` appends the archive's and a replica's after it
    /// (`crate::archive::metrics::render_into`,
    /// `crate::replica::metrics::render_into`).
    pub fn render(&self) -> String {
        let mut text = String::new();
        if encode(&mut text, &self.registry).is_err() {
            text.push_str("# metrics could not be encoded\n");
        }
        text
    }
}

/// Appends the samples of `registry` (a component's own, such as the
/// archive's or a replica's) to `text`, an OpenMetrics exposition, keeping
/// one `# EOF` at its end. A registry that fails to encode adds nothing.
pub(crate) fn append_registry(text: &mut String, registry: &Registry) {
    let mut extra = String::new();
    if encode(&mut extra, registry).is_err() {
        return;
    }
    if let Some(stripped) = text.strip_suffix("# EOF\n") {
        text.truncate(stripped.len());
    }
    text.push_str(&extra);
}

/// The process-wide metrics.
pub fn get() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// A label set of one pair.
pub fn label(key: &str, value: &str) -> Labels {
    vec![(key.to_owned(), value.to_owned())]
}

/// The method label of the request metrics: the standard methods by name,
/// anything else `other`, so that made-up methods cannot add series.
pub fn method_of(method: &str) -> &'static str {
    match method {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_up_methods_share_one_label() {
        assert_eq!(method_of("GET"), "GET");
        assert_eq!(method_of("FOO1"), "other");
        assert_eq!(method_of("FOO2"), "other");
    }

    #[test]
    fn request_observations_land_in_their_own_series() {
        let metrics = get();
        // A status no route answers, so no other test adds to these series.
        metrics.observe_request("/api/recall", "PUT", 599, 0.25);
        metrics.observe_request("/api/recall", "PUT", 599, 0.5);
        metrics.observe_request("/api/recall", "PATCH", 599, 1.0);
        let text = metrics.render();
        let sample = |name: &str, method: &str| -> Option<f64> {
            let prefix =
                format!("spark_request_seconds_{name}{{route=\"/api/recall\",method=\"{method}\",status=\"599\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .and_then(|v| v.trim().parse().ok())
        };
        assert_eq!(sample("count", "PUT"), Some(2.0), "{text}");
        assert_eq!(sample("sum", "PUT"), Some(0.75), "{text}");
        assert_eq!(sample("count", "PATCH"), Some(1.0), "{text}");
    }
}
