//! Kill -9 mid-compaction (SPEC section 13): against the real server
//! binary, with 4 KiB segments, frequent checkpoints, `erase_after_ms = 0`
//! and a check every 50 ms, a few clients create moments with unique
//! markers (text, caption, a message, a photo) and delete about half of
//! them while the compactor erases them; the server is killed at a random
//! moment (a quarter of the cycles right after a delete, a quarter as soon
//! as a compaction's staged files appear in the log directory, a quarter as
//! soon as its redo journal `COMPACTION` does) and
//! restarted on the same data directory, where it must start (recovery
//! finishes or rolls back the compaction) and the lost answers are retried.
//!
//! After the last cycle, once every deleted moment answers `410` erased:
//! every moment that was not deleted is served with its content, over HTTP
//! and in the mirror replayed from the stopped server's log, with its
//! message and its photo (blob on disk, SHA-256); no byte of a deleted
//! moment's marker is left anywhere in the data directory; no request id
//! produced two moments; no compaction file is left; `spark-replay verify`
//! passes.
//!
//! 15 cycles; `SPARK_ERASURE_KILL_CYCLES=N` runs N (the long mode) and
//! prints the figures (`--nocapture`).

use crate::common;
use spark_test_support::search::files_under;

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{ulid, ServerProcess};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use spark_core::op::{Op, OpBody};
use spark_log_format::{LogReader, ScanOptions};

/// The server's settings: erase at the next pass, a pass every 50 ms,
/// segments of the minimum size (every compaction rewrites several) and a
/// checkpoint every few ops (which the compaction then replaces).
const ENV: &[(&str, &str)] = &[
    ("SPARK_RETENTION_ERASE_AFTER_MS", "0"),
    ("SPARK_RETENTION_CHECK_INTERVAL_MS", "50"),
    ("SPARK_LOG_SEGMENT_SIZE_BYTES", "4096"),
    ("SPARK_LOG_CHECKPOINT_INTERVAL_OPS", "6"),
];

const CLIENTS: usize = 4;

/// The longest anything may take (a hang guard, not a timing bound).
const PATIENCE: Duration = Duration::from_secs(180);

/// One moment a client plants: its steps are the create, the message, the
/// photo and, for about half, the delete.
#[derive(Clone)]
struct Plan {
    id: String,
    request_id: String,
    /// Unique: every byte of content about the moment contains it.
    marker: String,
    message_id: String,
    media_id: String,
    photo: Vec<u8>,
    sha: String,
    delete: bool,
}

impl Plan {
    fn new(rng: &mut impl Rng) -> Plan {
        let marker = format!("MARK{}", ulid());
        let mut photo = format!("\u{89}PNG fake photo {marker}-PHOTO ").into_bytes();
        let len = rng.gen_range(100..1500);
        photo.extend((0..len).map(|_| rng.r#gen::<u8>()));
        let sha = hex::encode(Sha256::digest(&photo));
        Plan {
            id: ulid(),
            // Request ids stay after an erasure (SPEC section 3): no marker.
            request_id: format!("ek9-{}", ulid()),
            marker,
            message_id: String::new(),
            media_id: ulid(),
            photo,
            sha,
            delete: rng.gen_bool(0.5),
        }
    }

    fn steps(&self) -> usize {
        if self.delete {
            4
        } else {
            3
        }
    }

    fn text(&self) -> String {
        format!("{}-TEXT", self.marker)
    }

    fn caption(&self) -> String {
        format!("{}-CAPTION", self.marker)
    }

    fn body(&self) -> String {
        format!("{}-MESSAGE", self.marker)
    }
}

/// A planted moment and how many of its steps were acknowledged.
struct Planted {
    plan: Plan,
    acked: usize,
    /// A step was sent and its answer lost: it may or may not have landed.
    sent: bool,
}

#[derive(Default)]
struct Ledger {
    moments: Vec<Planted>,
    /// Acknowledged steps, all kinds.
    acked: u64,
    /// Acknowledged deletes.
    deletes: u64,
}

/// What a step's answer was.
enum Answer {
    Acked,
    /// No answer (the server is gone, or it answered `503`): it may have
    /// landed. Why, in words.
    Lost(String),
}

/// Sends step `step` of `plan`; a wrong answer panics.
fn send_step(http: &reqwest::blocking::Client, base: &str, plan: &mut Plan, step: usize) -> Answer {
    let result = match step {
        0 => http
            .post(format!("{base}/api/moments"))
            .json(&json!({
                "id": plan.id,
                "client_request_id": plan.request_id,
                "text": plan.text(),
                "caption": plan.caption(),
                "lang": "en",
            }))
            .send(),
        1 => {
            // A message id is minted at the send attempt (SPEC section 5);
            // a retry of a lost one keeps it.
            if plan.message_id.is_empty() {
                plan.message_id = ulid();
            }
            http.post(format!("{base}/api/messages"))
                .json(&json!({"id": plan.message_id, "thread_id": plan.id, "body": plan.body()}))
                .send()
        }
        2 => http
            .put(format!("{base}/api/media/{}", plan.media_id))
            .header("X-Moment-Id", &plan.id)
            .header("X-Media-Role", "copy")
            .header("Content-Type", "image/png")
            .header("X-Content-SHA256", &plan.sha)
            .body(plan.photo.clone())
            .send(),
        _ => http
            .delete(format!("{base}/api/moments/{}", plan.id))
            .send(),
    };
    let response = match result {
        Ok(response) => response,
        Err(e) => return Answer::Lost(e.to_string()),
    };
    let status = response.status().as_u16();
    let bytes = match response.bytes() {
        Ok(bytes) => bytes,
        Err(e) => return Answer::Lost(e.to_string()),
    };
    if status == 503 {
        return Answer::Lost(format!("503 {}", String::from_utf8_lossy(&bytes)));
    }
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let what = ["create", "message", "upload", "delete"][step];
    let ok = match step {
        0 => (status == 201 || status == 200) && body["moment"]["id"] == plan.id.as_str(),
        1 => status == 202,
        2 => status == 201 || status == 200,
        _ => status == 200,
    };
    assert!(ok, "{what} of {} answered {status}: {body}", plan.id);
    Answer::Acked
}

/// A client: plants moments until `stop`, or until an answer is lost (the
/// server was killed): the rest of that moment is left to the retries.
fn client_loop(base: String, ledger: Arc<Mutex<Ledger>>, stop: Arc<AtomicBool>, seed: u64) {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::Relaxed) {
        let mut plan = Plan::new(&mut rng);
        let index = {
            let mut l = ledger.lock().unwrap();
            l.moments.push(Planted {
                plan: plan.clone(),
                acked: 0,
                sent: false,
            });
            l.moments.len() - 1
        };
        for step in 0..plan.steps() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            ledger.lock().unwrap().moments[index].sent = true;
            let answer = send_step(&http, &base, &mut plan, step);
            let mut l = ledger.lock().unwrap();
            l.moments[index].plan.message_id = plan.message_id.clone();
            match answer {
                Answer::Acked => {
                    let m = &mut l.moments[index];
                    m.acked = step + 1;
                    m.sent = false;
                    l.acked += 1;
                    if step == 3 {
                        l.deletes += 1;
                    }
                }
                Answer::Lost(_) => return,
            }
        }
    }
}

/// Retries, against the restarted server, every step that was sent and
/// lost, and finishes every moment whose create was acknowledged (a moment
/// whose create was never sent is left out: it never existed).
fn finish_all(base: &str, ledger: &mut Ledger) {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    for m in &mut ledger.moments {
        if m.acked == 0 && !m.sent {
            continue;
        }
        for step in m.acked..m.plan.steps() {
            let started = Instant::now();
            while let Answer::Lost(why) = send_step(&http, base, &mut m.plan, step) {
                assert!(
                    started.elapsed() < PATIENCE,
                    "step {step} of {} is never answered: {why}",
                    m.plan.id
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            m.acked = step + 1;
            m.sent = false;
            ledger.acked += 1;
        }
    }
}

/// Every moment still planted is served as what was acknowledged: a live
/// one `200` with its text and caption, a deleted one `410`.
fn check_served(base: &str, ledger: &Ledger) {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    for m in ledger.moments.iter().filter(|m| m.acked > 0) {
        let plan = &m.plan;
        let r = http
            .get(format!("{base}/api/moments/{}", plan.id))
            .send()
            .unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().unwrap_or(Value::Null);
        if m.acked == 4 {
            assert_eq!(status, 410, "deleted moment {}: {body}", plan.id);
        } else if !(m.sent && m.acked == 3) {
            assert_eq!(status, 200, "live moment {}: {body}", plan.id);
            assert_eq!(body["text"], plan.text().as_str(), "{body}");
            assert_eq!(body["caption"], plan.caption().as_str(), "{body}");
        }
    }
}

/// What lies in the log directory: (journal, staged files).
fn compaction_files(data: &Path) -> (bool, usize) {
    let log = data.join("log");
    let journal = log.join("COMPACTION").exists();
    let staged = std::fs::read_dir(&log)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".seg.compact"))
                .count()
        })
        .unwrap_or(0);
    (journal, staged)
}

/// `path:offset` of every occurrence of one of `markers` under `dir`
/// (every marker has the same length).
fn occurrences(dir: &Path, markers: &HashSet<Vec<u8>>) -> Vec<String> {
    let Some(len) = markers.iter().map(Vec::len).next() else {
        return Vec::new();
    };
    assert!(markers.iter().all(|m| m.len() == len));
    let mut found = Vec::new();
    for path in files_under(dir) {
        let bytes = std::fs::read(&path).unwrap_or_default();
        for (at, window) in bytes.windows(len).enumerate() {
            if window.starts_with(b"MARK") && markers.contains(window) {
                found.push(format!(
                    "{}:{at} ({})",
                    path.display(),
                    String::from_utf8_lossy(window)
                ));
            }
        }
    }
    found
}

/// The final checks over HTTP: every deleted moment answers `410` erased
/// (waiting for the compactor), every live one its content, message and
/// photo.
fn check_final_http(base: &str, ledger: &Ledger) {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let get = |path: String| {
        let r = http.get(format!("{base}{path}")).send().unwrap();
        let status = r.status().as_u16();
        (status, r.bytes().unwrap().to_vec())
    };
    for m in ledger.moments.iter().filter(|m| m.acked > 0) {
        let plan = &m.plan;
        if plan.delete {
            let started = Instant::now();
            loop {
                let (status, body) = get(format!("/api/moments/{}", plan.id));
                let problem: Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(status, 410, "deleted {}: {problem}", plan.id);
                if problem["moment"]["erased"] == true {
                    assert_eq!(problem["moment"]["text"], Value::Null, "{problem}");
                    assert_eq!(problem["moment"]["caption"], Value::Null, "{problem}");
                    break;
                }
                assert!(
                    started.elapsed() < PATIENCE,
                    "{} not erased after {PATIENCE:?}: {problem}",
                    plan.id
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            let (status, _) = get(format!("/api/media/{}", plan.media_id));
            assert_eq!(status, 410, "media of erased {}", plan.id);
        } else {
            let (status, body) = get(format!("/api/moments/{}", plan.id));
            let moment: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(status, 200, "live {}: {moment}", plan.id);
            assert_eq!(moment["text"], plan.text().as_str(), "{moment}");
            assert_eq!(moment["caption"], plan.caption().as_str(), "{moment}");
            let (status, body) = get(format!("/api/messages?thread={}", plan.id));
            let thread: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(status, 200);
            assert_eq!(
                thread["messages"][0]["id"],
                plan.message_id.as_str(),
                "{thread}"
            );
            assert_eq!(
                thread["messages"][0]["body"],
                plan.body().as_str(),
                "{thread}"
            );
            let (status, bytes) = get(format!("/api/media/{}", plan.media_id));
            assert_eq!(status, 200, "media of {}", plan.id);
            assert_eq!(hex::encode(Sha256::digest(&bytes)), plan.sha, "{}", plan.id);
        }
    }
}

/// The final checks on the stopped server's data directory.
fn check_final_disk(data: &Path, ledger: &Ledger) {
    let planted: Vec<&Plan> = ledger
        .moments
        .iter()
        .filter(|m| m.acked > 0)
        .map(|m| &m.plan)
        .collect();
    // The replayed mirror.
    let engine = spark_engine::Engine::open(
        &common::settings(data),
        Arc::new(spark_log_format::OsFs),
        Arc::new(spark_engine::clock::SystemClock),
    )
    .expect("the compacted log replays");
    let live_shas: HashSet<String> = engine.read(|mirror| {
        let mut live_shas = HashSet::new();
        for plan in &planted {
            let id = spark_engine::Id::parse(&plan.id).unwrap();
            let moment = mirror
                .moment(id)
                .unwrap_or_else(|| panic!("acknowledged create of {} lost", plan.id));
            let row = mirror
                .requests
                .get(&plan.request_id)
                .unwrap_or_else(|| panic!("request {} lost", plan.request_id));
            assert_eq!(row.entity.to_string(), plan.id, "{}", plan.request_id);
            let media = mirror
                .media
                .get(&spark_engine::Id::parse(&plan.media_id).unwrap())
                .unwrap_or_else(|| panic!("acknowledged upload {} lost", plan.media_id));
            assert_eq!(hex::encode(media.sha256.0), plan.sha);
            let message = mirror
                .messages
                .get(&spark_engine::Id::parse(&plan.message_id).unwrap())
                .unwrap_or_else(|| panic!("acknowledged message {} lost", plan.message_id));
            if plan.delete {
                assert!(moment.deleted && moment.erased(), "{} not erased", plan.id);
                assert_eq!(message.body, "", "{}", plan.message_id);
            } else {
                assert!(!moment.deleted && !moment.erased(), "{} gone", plan.id);
                assert_eq!(moment.text(), Some(plan.text().as_str()));
                assert_eq!(moment.caption(), Some(plan.caption().as_str()));
                assert_eq!(message.body, plan.body());
                let blob = std::fs::read(spark_core::blob::blob_path(
                    &spark_core::blob::blobs_dir(data),
                    &media.sha256.0,
                ))
                .unwrap_or_else(|e| panic!("blob of {}: {e}", plan.media_id));
                assert_eq!(hex::encode(Sha256::digest(&blob)), plan.sha, "blob damaged");
                live_shas.insert(plan.sha.clone());
            }
        }
        live_shas
    });
    drop(engine);
    // No blob but those of live moments (no orphan, none of an erased one).
    for entry in std::fs::read_dir(spark_core::blob::blobs_dir(data)).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            live_shas.contains(&name),
            "blob {name} is not a live moment's"
        );
    }
    // No compaction left half done, no staged file, no copy.
    let log = data.join("log");
    for entry in std::fs::read_dir(&log).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            !(name.starts_with("COMPACTION")
                || name.ends_with(".compact")
                || name.ends_with(".tmp")),
            "{name} is left in the log directory"
        );
    }
    // No request id made two moments.
    let mut creates: HashMap<String, u32> = HashMap::new();
    LogReader::open(&log)
        .unwrap()
        .scan(ScanOptions::default(), |_, record| {
            if let Ok(Op {
                body: OpBody::MomentCreate(c),
                ..
            }) = Op::decode(&record)
            {
                if let Some(rid) = c.request_id {
                    *creates.entry(rid).or_default() += 1;
                }
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    for plan in &planted {
        assert_eq!(
            creates.get(&plan.request_id),
            Some(&1),
            "{}",
            plan.request_id
        );
    }
    assert!(
        creates.values().all(|&n| n == 1),
        "a request id made two moments"
    );
    // Not one byte of a deleted moment's markers is left; every live
    // moment's photo still is.
    let gone: HashSet<Vec<u8>> = planted
        .iter()
        .filter(|p| p.delete)
        .map(|p| p.marker.clone().into_bytes())
        .collect();
    assert_eq!(occurrences(data, &gone), Vec::<String>::new());
    let kept: HashSet<Vec<u8>> = planted
        .iter()
        .filter(|p| !p.delete)
        .map(|p| p.marker.clone().into_bytes())
        .collect();
    let found = occurrences(data, &kept);
    for plan in planted.iter().filter(|p| !p.delete) {
        assert!(
            found.iter().any(|f| f.contains(&plan.marker)),
            "{} is nowhere on disk",
            plan.marker
        );
    }
    if let Some(replay) = common::replay_or_skip("erasure kill -9: spark-replay verify") {
        let out = std::process::Command::new(replay)
            .arg("verify")
            .arg("--data")
            .arg(data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "verify: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Waits until `done` holds (a hang guard of [`PATIENCE`]).
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < PATIENCE, "{what} never happened");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn kill_9_mid_compaction_loses_nothing_kept_and_leaves_nothing_deleted() {
    let long = std::env::var("SPARK_ERASURE_KILL_CYCLES").ok();
    let cycles: u64 = long.as_deref().and_then(|v| v.parse().ok()).unwrap_or(15);
    let seed: u64 = rand::random();
    eprintln!("erasure kill -9: seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let (mut kills_journal, mut kills_staged) = (0u64, 0u64);
    for cycle in 0..cycles {
        // The restart on the data directory a kill left: it starts, and
        // the lost answers are retried.
        let server = ServerProcess::start_with_env(&data, ENV);
        {
            let mut l = ledger.lock().unwrap();
            finish_all(&server.base, &mut l);
            check_served(&server.base, &l);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (base, ledger, stop) = (server.base.clone(), ledger.clone(), stop.clone());
                let seed = seed ^ (cycle * 100 + c as u64);
                std::thread::spawn(move || client_loop(base, ledger, stop, seed))
            })
            .collect();
        let (acked, deletes) = {
            let l = ledger.lock().unwrap();
            (l.acked, l.deletes)
        };
        match cycle % 4 {
            // At a random moment after this cycle's first acknowledged
            // write.
            0 => {
                wait_for("a write", || ledger.lock().unwrap().acked > acked);
                std::thread::sleep(Duration::from_millis(rng.gen_range(0..800)));
            }
            // Right after a delete: its pass is likely running.
            1 => {
                wait_for("a delete", || ledger.lock().unwrap().deletes > deletes);
                std::thread::sleep(Duration::from_millis(rng.gen_range(0..80)));
            }
            // As soon as a compaction's staged files (2) or its journal (3)
            // appear, or, if none does, after a while.
            mode => {
                wait_for("a delete", || ledger.lock().unwrap().deletes > deletes);
                let started = Instant::now();
                while started.elapsed() < Duration::from_secs(20) {
                    let (journal, staged) = compaction_files(&data);
                    if journal || (mode == 2 && staged > 0) {
                        break;
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        }
        let child_id = server.child.id();
        server.kill();
        let (journal, staged) = compaction_files(&data);
        kills_journal += u64::from(journal);
        kills_staged += u64::from(!journal && staged > 0);
        if long.is_some() {
            eprintln!(
                "cycle {cycle}: killed {child_id} (journal {journal}, staged files {staged})"
            );
        }
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.join().expect("a client saw a wrong answer");
        }
    }
    let server = ServerProcess::start_with_env(&data, ENV);
    let mut l = ledger.lock().unwrap();
    finish_all(&server.base, &mut l);
    check_served(&server.base, &l);
    check_final_http(&server.base, &l);
    assert!(server.terminate().success());
    check_final_disk(&data, &l);
    let planted = l.moments.iter().filter(|m| m.acked > 0).count();
    let deleted = l.moments.iter().filter(|m| m.acked == 4).count();
    eprintln!(
        "erasure kill -9: {cycles} cycles, {planted} moments ({deleted} deleted and erased), \
         {} acknowledged steps; kills with a journal {kills_journal}, with staged files only {kills_staged}",
        l.acked
    );
    assert!(deleted > 0, "the load deleted moments");
    assert!(
        kills_journal + kills_staged > 0,
        "no kill landed mid-compaction"
    );
}
