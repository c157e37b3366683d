//! Kill -9 under load: 64 concurrent clients create, edit, delete and
//! upload against the real server binary, which is killed at random
//! moments and restarted. After every restart, lost answers are retried over
//! HTTP, the server is stopped, and the mirror replayed from the log must
//! hold every acknowledged write with its content (blobs hashed on disk); no
//! request id may produce two entities, and the log must verify.
//!
//! CI runs 20 cycles; `SPARK_KILL_CYCLES=200 cargo test --release --test
//! crash_kill9 -- --nocapture` is the long mode and prints the figures.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{ulid, ServerProcess};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use spark_core::op::{Op, OpBody};
use spark_log_format::{LogReader, ScanOptions};

const CLIENTS: usize = 64;

/// What the clients know: acknowledged writes, and attempts whose answer
/// was lost (they may or may not have landed).
#[derive(Default)]
struct Ledger {
    /// moment id -> request id of its acknowledged create.
    created: HashMap<String, String>,
    /// Creates whose answer was lost: (moment id, request id).
    maybe_created: Vec<(String, String)>,
    /// moment id -> caption of the last acknowledged edit.
    caption: HashMap<String, String>,
    /// moment id -> captions of edits sent after it whose answer was lost.
    maybe_caption: HashMap<String, Vec<String>>,
    /// Acknowledged deletes.
    deleted: HashSet<String>,
    /// Deletes whose answer was lost.
    maybe_deleted: HashSet<String>,
    /// media id -> sha256 of acknowledged uploads.
    media: HashMap<String, String>,
    /// Acknowledged writes, all kinds.
    acked: u64,
}

fn client_loop(base: String, ledger: Arc<Mutex<Ledger>>, stop: Arc<AtomicBool>, seed: u64) {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut mine: Vec<String> = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let pick = rng.gen_range(0..10);
        if mine.is_empty() || pick < 5 {
            let id = ulid();
            let rid = format!("c{seed}-{n}");
            let body = json!({"id": id, "client_request_id": rid, "text": format!("sign {n}")});
            match client
                .post(format!("{base}/api/moments"))
                .json(&body)
                .send()
            {
                Ok(r) if r.status().is_success() => {
                    let mut l = ledger.lock().unwrap();
                    l.created.insert(id.clone(), rid);
                    l.acked += 1;
                    mine.push(id);
                }
                Ok(r) => panic!("create answered {}", r.status()),
                Err(_) => {
                    ledger.lock().unwrap().maybe_created.push((id, rid));
                    return;
                }
            }
        } else if pick < 7 {
            let id = mine[rng.gen_range(0..mine.len())].clone();
            let caption = format!("c{n}");
            let r = client
                .patch(format!("{base}/api/moments/{id}"))
                .json(&json!({"caption": caption}))
                .send();
            let mut l = ledger.lock().unwrap();
            match r {
                Ok(r) if r.status().is_success() => {
                    l.caption.insert(id.clone(), caption);
                    l.maybe_caption.remove(&id);
                    l.acked += 1;
                }
                Ok(r) => panic!("edit answered {}", r.status()),
                Err(_) => {
                    l.maybe_caption.entry(id).or_default().push(caption);
                    return;
                }
            }
        } else if pick < 8 {
            let id = mine.swap_remove(rng.gen_range(0..mine.len()));
            let r = client.delete(format!("{base}/api/moments/{id}")).send();
            let mut l = ledger.lock().unwrap();
            match r {
                Ok(r) if r.status().is_success() => {
                    l.deleted.insert(id);
                    l.acked += 1;
                }
                Ok(r) => panic!("delete answered {}", r.status()),
                Err(_) => {
                    l.maybe_deleted.insert(id);
                    return;
                }
            }
        } else {
            // Upload a copy for a moment that has none yet (one per role).
            let Some(pos) = (0..mine.len()).find(|_| true) else {
                continue;
            };
            let id = mine.swap_remove(pos);
            let media = ulid();
            let bytes: Vec<u8> = (0..rng.gen_range(100..4000)).map(|_| rng.r#gen()).collect();
            let sha = hex::encode(Sha256::digest(&bytes));
            let r = client
                .put(format!("{base}/api/media/{media}"))
                .header("X-Moment-Id", &id)
                .header("X-Media-Role", "copy")
                .header("Content-Type", "image/jpeg")
                .header("X-Content-SHA256", &sha)
                .body(bytes)
                .send();
            match r {
                Ok(r) if r.status().is_success() => {
                    let mut l = ledger.lock().unwrap();
                    l.media.insert(media, sha);
                    l.acked += 1;
                }
                Ok(r) => panic!("upload answered {}", r.status()),
                Err(_) => return,
            }
        }
    }
}

/// Retries the creates whose answer was lost (over HTTP, against the
/// restarted server): the engine answers with what it already has.
fn retry_lost_creates(base: &str, ledger: &mut Ledger) {
    let client = reqwest::blocking::Client::new();
    for (id, rid) in std::mem::take(&mut ledger.maybe_created) {
        let r = client
            .post(format!("{base}/api/moments"))
            .json(&json!({"id": id, "client_request_id": rid, "text": "retry"}))
            .send()
            .unwrap();
        assert!(r.status().is_success());
        let v: Value = r.json().unwrap();
        assert_eq!(v["moment"]["id"], id.as_str());
        ledger.created.insert(id, rid);
    }
}

/// Checks the ledger against the mirror replayed from the log (the server
/// is stopped), the blobs on disk, and the log itself. Returns how many
/// moments and media were checked.
fn check(data: &std::path::Path, ledger: &Ledger) -> u64 {
    let mut checked = 0;
    let engine = spark_engine::Engine::open(
        &common::settings(data),
        Arc::new(spark_log_format::OsFs),
        Arc::new(spark_engine::clock::SystemClock),
    )
    .expect("the log replays");
    engine.read(|mirror| {
        for (id, rid) in &ledger.created {
            let moment = mirror
                .moment(spark_engine::Id::parse(id).unwrap())
                .unwrap_or_else(|| panic!("acknowledged create of {id} lost"));
            let row = mirror
                .requests
                .get(rid)
                .unwrap_or_else(|| panic!("request {rid} of an acknowledged create lost"));
            assert_eq!(
                row.entity.to_string(),
                *id,
                "request {rid} answers another moment"
            );
            if ledger.deleted.contains(id) {
                assert!(moment.deleted, "acknowledged delete of {id} lost");
            } else if moment.deleted {
                assert!(
                    ledger.maybe_deleted.contains(id),
                    "{id} deleted, but no delete was sent"
                );
            }
            if let Some(caption) = ledger.caption.get(id) {
                let got = moment.caption().unwrap_or("");
                let later = ledger
                    .maybe_caption
                    .get(id)
                    .is_some_and(|c| c.iter().any(|c| c == got));
                assert!(
                    got == caption || later,
                    "{id}: acknowledged caption {caption:?} lost, got {got:?}"
                );
            }
            checked += 1;
        }
        for (media, sha) in &ledger.media {
            let m = mirror
                .media
                .get(&spark_engine::Id::parse(media).unwrap())
                .unwrap_or_else(|| panic!("acknowledged upload {media} lost"));
            assert_eq!(hex::encode(m.sha256.0), *sha);
            let blob = std::fs::read(data.join("media/blobs").join(sha)).expect("its blob");
            assert_eq!(
                hex::encode(Sha256::digest(&blob)),
                *sha,
                "blob of {media} damaged"
            );
            checked += 1;
        }
    });
    drop(engine);
    // The log verifies (checksums, seqs, chain), and no request id made two
    // moments.
    let reader = LogReader::open(&data.join("log")).unwrap();
    let mut creates_per_request: HashMap<String, u32> = HashMap::new();
    reader
        .scan(ScanOptions::default(), |_, record| {
            let op = Op::decode(&record).unwrap();
            if let OpBody::MomentCreate(c) = &op.body {
                if let Some(rid) = &c.request_id {
                    *creates_per_request.entry(rid.clone()).or_default() += 1;
                }
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    assert!(
        creates_per_request.values().all(|&n| n == 1),
        "a request id produced two moments"
    );
    checked
}

#[test]
fn acknowledged_writes_survive_kill_9_under_load() {
    let cycles: u64 = std::env::var("SPARK_KILL_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut rng = rand::thread_rng();
    let mut checked_total = 0;
    for cycle in 0..cycles {
        let t0 = std::time::Instant::now();
        let server = ServerProcess::start(&data);
        let t_start = t0.elapsed();
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (base, ledger, stop) = (server.base.clone(), ledger.clone(), stop.clone());
                let seed = cycle * 1000 + c as u64;
                std::thread::spawn(move || client_loop(base, ledger, stop, seed))
            })
            .collect();
        // The kill comes a random moment after this cycle's first
        // acknowledged write: on a loaded machine the first answers can take
        // longer than any fixed window, and a cycle killed before it tests
        // no acknowledged write.
        let acked_before = ledger.lock().unwrap().acked;
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while ledger.lock().unwrap().acked == acked_before {
            assert!(
                std::time::Instant::now() < deadline,
                "cycle {cycle}: no write acknowledged in 120 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..550)));
        server.kill();
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.join().expect("a client saw a wrong answer");
        }
        let t_load = t0.elapsed();
        let server = ServerProcess::start(&data);
        let mut l = ledger.lock().unwrap();
        retry_lost_creates(&server.base, &mut l);
        assert!(server.terminate().success());
        checked_total += check(&data, &l);
        drop(l);
        let t_check = t0.elapsed();
        if std::env::var("SPARK_KILL_TIMES").is_ok() {
            eprintln!(
                "cycle {cycle}: start {t_start:?} load {t_load:?} check {t_check:?} stop {:?}",
                t0.elapsed()
            );
        }
    }
    let l = ledger.lock().unwrap();
    eprintln!(
        "kill -9: {cycles} cycles, {} acknowledged writes, {} moments and media checked after restarts",
        l.acked, checked_total
    );
    assert!(
        l.acked >= cycles,
        "every cycle acknowledged a write before its kill"
    );
}
