//! The archive with the real `spark-engine` process under load (SPEC
//! section 11, issue 15 item 7), against a `weed mini` of the test's own
//! ([`crate::weed`]): concurrent clients create moments over HTTP back to
//! back, each acknowledgement timed, while a monitor polls
//! `GET /api/log/head` (`seq`, `archived_seq`).
//!
//! - kill -9 at a random moment, the data directory deleted, `spark-replay
//!   restore` from the archive: every write acknowledged before the engine
//!   said the archive held it is there (asserted), and the writes
//!   acknowledged in the last ship interval before the kill that are
//!   missing are counted and reported (`eprintln!`, `-- --nocapture`), with
//!   the age of the oldest missing one at the kill: the RPO of `async` mode
//!   as a time window (docs/performance/archive-shipping.md). A write
//!   acknowledged a little more than one interval before the kill may be
//!   missing too (counted apart, not asserted): a ship takes time (its
//!   puts), and the next starts one interval after it started (at once
//!   when it took longer). `SPARK_ARCHIVE_UPLOADS=1` makes one create in
//!   five also upload 100 B to 60 KiB of media (blobs shipped before their
//!   ops). `SPARK_ARCHIVE_KILLS=N` runs N cycles and sums them up,
//!   `SPARK_ARCHIVE_SHIP_INTERVAL_MS` ships at another interval than
//!   200 ms, `SPARK_ENGINE_BIN` runs another build. A mode is one line:
//!   [`kill_9_under_load_then_restore`] with `"sync"` also asserts that
//!   none is missing.
//! - the store down for 30 s under load: writes go on, the lag grows and
//!   shows (`archived_seq`, `spark_archive_lag_seconds`, `/readyz`),
//!   shipping catches up by itself once the store is back, and a restore
//!   holds every acknowledged write.
//!
//! No figure is asserted: timings are printed, never compared with a bound.
//! Without `weed` (or the `spark-engine` binary) the tests print
//! `skipped: ...`; `SPARK_REQUIRE_S3=1` makes them fail instead. Without
//! the `spark-replay` binary (another package's: `cargo test --workspace`
//! builds it) they skip too, unless `SPARK_REQUIRE_REPLAY=1`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{json, Value};
use spark_engine::clock::SystemClock;
use spark_engine::config::Settings;
use spark_engine::{Engine, Id};
use spark_log_format::OsFs;

use crate::common::replay_or_skip;
use crate::s3_common::{
    digest_of, engine_or_skip, json, replay, restore, unique_prefix, write_archive_config,
    EngineProcess,
};
use crate::weed::Weed;

/// How often the engines of these tests ship, in ms: 200, or
/// `SPARK_ARCHIVE_SHIP_INTERVAL_MS` (for figures at another interval).
fn ship_interval_ms() -> u64 {
    std::env::var("SPARK_ARCHIVE_SHIP_INTERVAL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// Small segments, so that several seal (and fold into the manifest) under
/// the load.
const SEGMENT_SIZE_BYTES: u64 = 64 * 1024;
/// Concurrent HTTP clients.
const CLIENTS: usize = 16;
/// The longest any wait of these tests may take before it is called a hang.
const HANG_GUARD: Duration = Duration::from_secs(300);

/// An acknowledged create: its moment id and when its answer arrived.
struct Acked {
    id: String,
    at: Instant,
}

/// What one client did: its acknowledged creates, and the transport error
/// that ended it (the server went away), if any.
#[derive(Default)]
struct ClientRun {
    acked: Vec<Acked>,
    ended_by: Option<String>,
}

/// A fresh ULID for now.
fn ulid() -> String {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    Id::from_parts(now_ms, rand::random::<u128>()).to_string()
}

/// Whether clients also upload (`SPARK_ARCHIVE_UPLOADS=1`): one create in
/// five is followed by a media upload of 100 B to 60 KiB to its moment.
fn uploads() -> bool {
    std::env::var("SPARK_ARCHIVE_UPLOADS").is_ok_and(|v| v == "1")
}

/// Uploads 100 B to 60 KiB of media to `moment`; a transport error (the
/// kill) is returned, any answer but `201` fails the test.
fn upload(http: &reqwest::blocking::Client, base: &str, moment: &str) -> reqwest::Result<()> {
    let size = rand::thread_rng().gen_range(100..=60 * 1024);
    let bytes: Vec<u8> = (0..size).map(|_| rand::random::<u8>()).collect();
    let r = http
        .put(format!("{base}/api/media/{}", ulid()))
        .header("X-Moment-Id", moment)
        .header("X-Media-Role", "copy")
        .header("Content-Type", "image/jpeg")
        .body(bytes)
        .send()?;
    let status = r.status().as_u16();
    let text = r.text()?;
    assert_eq!(status, 201, "upload answered {status}: {text}");
    Ok(())
}

/// Creates moments back to back until `stop` or a transport error; any
/// answer but `201` fails the test. With [`uploads`], one in five is
/// followed by an upload to it.
fn client(base: String, n: usize, stop: Arc<AtomicBool>) -> ClientRun {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let mut run = ClientRun::default();
    let mut k = 0u64;
    while !stop.load(Ordering::Relaxed) {
        k += 1;
        let id = ulid();
        let body = json!({
            "id": id,
            "client_request_id": format!("c{n}-{k}"),
            "text": format!("sign {k} of client {n}, photographed under load"),
        });
        match http.post(format!("{base}/api/moments")).json(&body).send() {
            Ok(r) if r.status().as_u16() == 201 => {
                let at = Instant::now();
                if let Err(e) = r.bytes() {
                    // The status line is the acknowledgement; the body was
                    // cut by the kill.
                    run.acked.push(Acked { id, at });
                    run.ended_by = Some(e.to_string());
                    break;
                }
                run.acked.push(Acked { id: id.clone(), at });
                if uploads() && k.is_multiple_of(5) {
                    if let Err(e) = upload(&http, &base, &id) {
                        run.ended_by = Some(e.to_string());
                        break;
                    }
                }
            }
            Ok(r) => panic!(
                "create answered {}: {}",
                r.status(),
                r.text().unwrap_or_default()
            ),
            Err(e) => {
                run.ended_by = Some(e.to_string());
                break;
            }
        }
    }
    run
}

/// [`CLIENTS`] clients running [`client`].
struct Load {
    stop: Arc<AtomicBool>,
    clients: Vec<JoinHandle<ClientRun>>,
}

impl Load {
    fn start(base: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let clients = (0..CLIENTS)
            .map(|n| {
                let (base, stop) = (base.to_owned(), Arc::clone(&stop));
                std::thread::spawn(move || client(base, n, stop))
            })
            .collect();
        Load { stop, clients }
    }

    /// Stops the clients; every acknowledged create, and the errors that
    /// ended clients.
    fn finish(self) -> (Vec<Acked>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let mut acked = Vec::new();
        let mut errors = Vec::new();
        for c in self.clients {
            let run = c.join().expect("a client saw a wrong answer");
            acked.extend(run.acked);
            errors.extend(run.ended_by);
        }
        (acked, errors)
    }
}

/// `GET BASE/PATH`: (status, body as JSON or the text as a string).
fn get(http: &reqwest::blocking::Client, base: &str, path: &str) -> reqwest::Result<(u16, Value)> {
    let r = http.get(format!("{base}{path}")).send()?;
    let status = r.status().as_u16();
    let text = r.text()?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

/// One answer of `GET /api/log/head`, and when it was asked.
#[derive(Clone, Copy, Debug)]
struct Seen {
    asked: Instant,
    seq: u64,
    archived_seq: u64,
}

/// Polls `GET /api/log/head` every `every` until stopped or the server is
/// gone.
struct Monitor {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Monitor {
    fn start(base: &str, every: Duration) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let (base, stop, seen) = (base.to_owned(), Arc::clone(&stop), Arc::clone(&seen));
            std::thread::spawn(move || {
                let http = reqwest::blocking::Client::builder()
                    .timeout(Duration::from_secs(60))
                    .build()
                    .unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    let Ok((200, head)) = get(&http, &base, "/api/log/head") else {
                        return;
                    };
                    seen.lock().unwrap().push(Seen {
                        asked,
                        seq: head["seq"].as_u64().unwrap(),
                        archived_seq: head["archived_seq"].as_u64().expect("archived_seq"),
                    });
                    std::thread::sleep(every);
                }
            })
        };
        Monitor { stop, seen, task }
    }

    /// The latest answer, if any.
    fn last(&self) -> Option<Seen> {
        self.seen.lock().unwrap().last().copied()
    }

    /// Waits (at most [`HANG_GUARD`]) for an answer that satisfies `what`.
    fn wait_for(&self, why: &str, what: impl Fn(&Seen) -> bool) -> Seen {
        let deadline = Instant::now() + HANG_GUARD;
        loop {
            if let Some(seen) = self.last().filter(|s| what(s)) {
                return seen;
            }
            assert!(
                Instant::now() < deadline,
                "waited {HANG_GUARD:?} for {why}; last seen {:?}",
                self.last()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn finish(self) -> Vec<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.join().unwrap();
        Arc::try_unwrap(self.seen).unwrap().into_inner().unwrap()
    }
}

/// For each acknowledged create, whether the data directory `data` (no
/// server on it) holds its moment.
fn present(data: &Path, acked: &[Acked]) -> Vec<bool> {
    let settings = Settings {
        data_dir: data.to_owned(),
        ..Settings::default()
    };
    let engine = Engine::open(&settings, Arc::new(OsFs), Arc::new(SystemClock))
        .expect("the restored directory opens");
    engine.read(|mirror| {
        acked
            .iter()
            .map(|a| mirror.moment(Id::parse(&a.id).unwrap()).is_some())
            .collect()
    })
}

/// The value of the metric line `name VALUE` in a `/metrics` text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A `spark-engine` process on a fresh data directory, shipping to a fresh
/// prefix.
struct Archived {
    /// Holds `data`, the settings file and the server's log.
    work: tempfile::TempDir,
    data: PathBuf,
    url: String,
    endpoint: String,
    server: EngineProcess,
}

/// Starts `engine_binary` shipping to a fresh prefix `NAME-NNN` of `weed`
/// in `mode`, every [`ship_interval_ms`], with segments of
/// [`SEGMENT_SIZE_BYTES`].
fn serve_archived(weed: &Weed, engine_binary: &Path, name: &str, mode: &str) -> Archived {
    let endpoint = weed.endpoint();
    let url = unique_prefix(name);
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("original");
    let config = work.path().join("spark.toml");
    write_archive_config(
        &config,
        SEGMENT_SIZE_BYTES,
        &url,
        &endpoint,
        ship_interval_ms(),
        mode,
    );
    let server = EngineProcess::start(engine_binary, &data, &config);
    Archived {
        work,
        data,
        url,
        endpoint,
        server,
    }
}

/// What one kill cycle measured.
struct KillCycle {
    acked: usize,
    /// Acknowledged in the last ship interval before the kill.
    in_window: usize,
    /// Of those, missing after the restore.
    missing_in_window: usize,
    /// Ages at the kill of the missing writes acknowledged earlier than
    /// one interval before it (the ship in flight at the kill).
    missing_older: Vec<Duration>,
    /// Age at the kill of the oldest missing write: this cycle's RPO.
    oldest_missing: Option<Duration>,
}

/// kill -9 under load at a random moment, the data directory lost, a
/// restore from the archive; `SPARK_ARCHIVE_KILLS` cycles (default 1), each
/// on a fresh prefix of one `weed`. `mode` is the archive's (`"async"`; the
/// `"sync"` case asserts that no acknowledged write is missing).
fn kill_9_under_load_then_restore(mode: &str) {
    let test = format!("kill_9_under_load_then_restore({mode})");
    if replay_or_skip(&test).is_none() {
        return;
    }
    let Some((weed_binary, engine_binary)) = engine_or_skip(&test) else {
        return;
    };
    let cycles: usize = std::env::var("SPARK_ARCHIVE_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let weed = Weed::start(weed_binary);
    let runs: Vec<KillCycle> = (0..cycles)
        .map(|_| kill_cycle(&weed, &engine_binary, mode))
        .collect();
    if cycles > 1 {
        let acked: usize = runs.iter().map(|r| r.acked).sum();
        let in_window: usize = runs.iter().map(|r| r.in_window).sum();
        let missing: usize = runs
            .iter()
            .map(|r| r.missing_in_window + r.missing_older.len())
            .sum();
        let older = runs.iter().filter(|r| !r.missing_older.is_empty()).count();
        let mut rpo: Vec<f64> = runs
            .iter()
            .map(|r| r.oldest_missing.map_or(0.0, |d| d.as_secs_f64()))
            .collect();
        rpo.sort_by(f64::total_cmp);
        eprintln!(
            "archive kill -9 ({mode}, ship_interval_ms {}): {cycles} cycles, \
             {acked} writes acknowledged, {in_window} in the last interval before a kill, \
             {missing} missing after the restores; {older} cycles lost a write acknowledged \
             more than one interval before the kill; RPO window (age of the oldest missing \
             write at the kill): median {:.3} s, max {:.3} s",
            ship_interval_ms(),
            rpo[rpo.len() / 2],
            rpo[rpo.len() - 1],
        );
    }
    drop(weed);
}

/// One cycle of [`kill_9_under_load_then_restore`].
fn kill_cycle(weed: &Weed, engine_binary: &Path, mode: &str) -> KillCycle {
    let Archived {
        work,
        data,
        url,
        endpoint,
        mut server,
    } = serve_archived(weed, engine_binary, &format!("kill9-{mode}"), mode);
    let monitor = Monitor::start(&server.base, Duration::from_millis(20));
    let load = Load::start(&server.base);
    // Shipping is under way; then a random moment.
    monitor.wait_for("a first ship", |s| s.archived_seq > 0);
    let pause_ms = rand::thread_rng().gen_range(1_000..4_000);
    std::thread::sleep(Duration::from_millis(pause_ms));
    let killed_at = Instant::now();
    server.kill();
    let (acked, _) = load.finish();
    let seen = monitor.finish();
    // The machine is lost with its disk.
    std::fs::remove_dir_all(&data).unwrap();

    let restored = work.path().join("restored");
    let (code, out, err) = restore(&url, &restored, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let restored_seq = json(&out)["seq"].as_u64().unwrap();
    let (code, out, err) = replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 0, "{out}{err}");

    // What the archive said it held before the kill, it holds; and every
    // write acknowledged before the head was at most that is there (no
    // timing: an answer seen before a look at the head is at most that
    // head's seq).
    let archived = seen.iter().map(|s| s.archived_seq).max().unwrap_or(0);
    assert!(
        restored_seq >= archived,
        "restored up to seq {restored_seq}, but the engine said {archived} was archived"
    );
    let covered_until = seen
        .iter()
        .filter(|s| s.seq <= archived)
        .map(|s| s.asked)
        .max()
        .expect("a look at the head before the first ship");
    let here = present(&restored, &acked);
    let lost: Vec<&Acked> = acked
        .iter()
        .zip(&here)
        .filter(|(a, here)| !**here && a.at < covered_until)
        .map(|(a, _)| a)
        .collect();
    assert!(
        lost.is_empty(),
        "{} writes acknowledged before the archive held them are missing after the restore \
         (first: {}, {:?} before the kill)",
        lost.len(),
        lost[0].id,
        killed_at - lost[0].at
    );

    // The window: writes acknowledged in the last ship interval before the
    // kill (and the ship in flight) may be missing in async mode; count
    // them.
    let interval = Duration::from_millis(ship_interval_ms());
    let age = |a: &Acked| killed_at.saturating_duration_since(a.at);
    let missing: Vec<Duration> = acked
        .iter()
        .zip(&here)
        .filter(|(_, here)| !**here)
        .map(|(a, _)| age(a))
        .collect();
    let run = KillCycle {
        acked: acked.len(),
        in_window: acked.iter().filter(|a| age(a) <= interval).count(),
        missing_in_window: missing.iter().filter(|d| **d <= interval).count(),
        missing_older: missing.iter().copied().filter(|d| *d > interval).collect(),
        oldest_missing: missing.iter().max().copied(),
    };
    eprintln!(
        "archive kill -9 ({mode}, ship_interval_ms {}, {CLIENTS} clients, \
         killed {pause_ms} ms after the first ship): {} writes acknowledged; \
         {} in the last interval before the kill, {} of them missing after the restore; \
         {} acknowledged earlier missing{}; oldest missing acknowledged {} before the kill \
         (the RPO window of this run); restored seq {restored_seq}, the engine last said \
         {archived} archived",
        ship_interval_ms(),
        run.acked,
        run.in_window,
        run.missing_in_window,
        run.missing_older.len(),
        match run.missing_older.iter().max() {
            Some(d) => format!(
                " (up to {:.3} s before the kill: the ship in flight)",
                d.as_secs_f64()
            ),
            None => String::new(),
        },
        run.oldest_missing
            .map_or("none".into(), |d| format!("{:.3} s", d.as_secs_f64())),
    );
    assert!(run.acked > CLIENTS, "the load made progress");
    if mode == "sync" {
        assert!(
            missing.is_empty(),
            "sync mode: {} acknowledged writes missing after the restore",
            missing.len()
        );
    }
    run
}

#[test]
fn async_archive_kill_9_under_load_then_restore() {
    kill_9_under_load_then_restore("async");
}

#[test]
fn sync_archive_kill_9_under_load_then_restore() {
    kill_9_under_load_then_restore("sync");
}

/// One look at the server during the outage.
#[derive(Debug)]
struct Look {
    head: Value,
    readyz_status: u16,
    readyz: Value,
    /// `spark_archive_lag_seconds` from `/metrics`.
    lag_metric_seconds: f64,
    /// `spark_archive_failures_total{kind="unreachable"}`.
    unreachable_failures: f64,
}

fn look(base: &str) -> Look {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let (_, head) = get(&http, base, "/api/log/head").unwrap();
    let (readyz_status, readyz) = get(&http, base, "/readyz").unwrap();
    let (_, metrics) = get(&http, base, "/metrics").unwrap();
    let metrics = metrics.as_str().unwrap_or_default().to_owned();
    Look {
        head,
        readyz_status,
        readyz,
        lag_metric_seconds: metric(&metrics, "spark_archive_lag_seconds").expect("lag metric"),
        unreachable_failures: metric(
            &metrics,
            "spark_archive_failures_total{kind=\"unreachable\"}",
        )
        .unwrap_or(0.0),
    }
}

#[test]
fn the_store_down_30_s_under_load_loses_nothing_and_shipping_catches_up() {
    let test = "the_store_down_30_s_under_load_loses_nothing_and_shipping_catches_up";
    if replay_or_skip(test).is_none() {
        return;
    }
    let Some((weed_binary, engine_binary)) = engine_or_skip(test) else {
        return;
    };
    // `SPARK_ARCHIVE_OUTAGE_SECONDS` shortens the outage for a quick look.
    let outage = Duration::from_secs(
        std::env::var("SPARK_ARCHIVE_OUTAGE_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(30),
    );
    let mut weed = Weed::start(weed_binary);
    let Archived {
        work,
        data,
        url,
        endpoint,
        mut server,
    } = serve_archived(&weed, &engine_binary, "outage-30s", "async");
    let monitor = Monitor::start(&server.base, Duration::from_millis(100));
    let load = Load::start(&server.base);
    monitor.wait_for("a first ship", |s| s.archived_seq > 0);
    let before = look(&server.base);
    // Shipping, or "behind" when a loaded machine let the lag pass its
    // limit under the load: either way not failing before the outage.
    let status = before.readyz["archive"]["status"].as_str().unwrap_or("");
    assert!(status == "shipping" || status == "behind", "{before:?}");

    // The store goes away for `outage`; the load goes on.
    weed.stop();
    let down_at = Instant::now();
    let mut looks = Vec::new();
    while down_at.elapsed() < outage {
        std::thread::sleep(Duration::from_secs(1));
        looks.push(look(&server.base));
    }
    for l in &looks {
        // Writes are taken locally all along (async mode).
        assert_eq!(l.readyz_status, 200, "{l:?}");
        assert_eq!(l.readyz["status"], "ready", "{l:?}");
    }
    let failing: Vec<&Look> = looks
        .iter()
        .filter(|l| l.readyz["archive"]["status"] == "failing")
        .collect();
    let (first, last) = (failing.first(), looks.last().unwrap());
    let first = first.unwrap_or_else(|| panic!("/readyz never said failing: {looks:?}"));
    assert_eq!(last.readyz["archive"]["status"], "failing", "{last:?}");
    assert!(
        last.readyz["archive"]["error"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{last:?}"
    );
    // The archive stands still while the head moves on, and the lag grows
    // in `/readyz` and in the metrics.
    let archived_down = first.head["archived_seq"].as_u64().unwrap();
    assert_eq!(last.head["archived_seq"], archived_down, "{last:?}");
    let head_down = last.head["seq"].as_u64().unwrap();
    assert!(head_down > archived_down, "{last:?}");
    assert_eq!(last.readyz["archive"]["shipped_seq"], archived_down);
    let lag = |l: &Look| l.readyz["archive"]["lag_seconds"].as_f64().unwrap();
    assert!(lag(last) > lag(first), "{first:?} {last:?}");
    assert!(
        last.lag_metric_seconds > first.lag_metric_seconds,
        "{first:?} {last:?}"
    );
    assert!(last.unreachable_failures > 0.0, "{last:?}");

    // The store comes back; shipping catches up by itself under the load.
    let back_at = Instant::now();
    weed.resume();
    let up_at = Instant::now();
    let backlog = look(&server.base).head["seq"].as_u64().unwrap();
    monitor.wait_for("shipping to catch up", |s| s.archived_seq >= backlog);
    let caught_up_after = up_at.elapsed();
    let (acked, errors) = load.finish();
    assert!(errors.is_empty(), "{errors:?}");
    let deadline = Instant::now() + HANG_GUARD;
    let settled = loop {
        let l = look(&server.base);
        if l.head["archived_seq"] == l.head["seq"]
            && l.readyz["archive"]["status"] == "shipping"
            && lag(&l) == 0.0
            && l.lag_metric_seconds == 0.0
        {
            break l;
        }
        assert!(Instant::now() < deadline, "never settled: {l:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    monitor.finish();
    server.terminate();

    // Nothing lost: the restore is the original, and holds every
    // acknowledged write.
    let (seq, digest) = digest_of(&data, None);
    assert_eq!(settled.head["seq"], seq);
    let restored = work.path().join("restored");
    let (code, out, err) = restore(&url, &restored, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json(&out)["seq"], seq);
    assert_eq!(json(&out)["digest"], digest.as_str());
    let here = present(&restored, &acked);
    let missing = here.iter().filter(|h| !**h).count();
    assert_eq!(missing, 0, "{missing} acknowledged writes missing");
    let during = acked
        .iter()
        .filter(|a| a.at >= down_at && a.at < up_at)
        .count();
    eprintln!(
        "archive outage: store stopped {:.0} s (then {:.1} s to serve again) under {CLIENTS} \
         clients; {} writes acknowledged ({during} while the store was down); archived_seq \
         stayed at {archived_down} while the head went to {head_down}; lag at the end of the \
         outage {:.1} s in /readyz, {:.1} s in spark_archive_lag_seconds; caught up {:.1} s \
         after the store came back; the restore holds all {} (seq {seq})",
        (back_at - down_at).as_secs_f64(),
        (up_at - back_at).as_secs_f64(),
        acked.len(),
        lag(last),
        last.lag_metric_seconds,
        caught_up_after.as_secs_f64(),
        acked.len(),
    );
    drop(weed);
}
