//! Kill -9 under racing uploads: against the real server binary,
//! clients race uploads of the same bytes for one role, upload to moments
//! being deleted, upload to a moment behind a flood of edits with a request
//! timeout of 300 ms, and hang up mid-upload; the server is killed at a
//! random moment and restarted with `media.orphan_grace_ms = 0`. Every
//! acknowledged upload's bytes are then served (or, for a deleted moment,
//! its blob is on disk) and hash to their SHA-256, and `audit media` finds
//! no orphan and no lost blob.
//!
//! 3 cycles; `SPARK_MEDIA_KILL_CYCLES=N` runs N (the long mode).

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{assert_media_whole, ulid, ServerProcess};
use rand::{Rng, SeedableRng};
use serde_json::json;
use sha2::{Digest, Sha256};

/// media id -> SHA-256 (hex) of acknowledged uploads.
type Acked = Arc<Mutex<HashMap<String, String>>>;

fn client(timeout: Duration) -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(timeout)
        .build()
        .unwrap()
}

/// Creates a moment; `None` once the server is gone or when a busy server
/// answered `503 timeout` (the create may still land).
fn moment(http: &reqwest::blocking::Client, base: &str) -> Option<String> {
    let id = ulid();
    let r = http
        .post(format!("{base}/api/moments"))
        .json(&json!({"id": id}))
        .send()
        .ok()?;
    match r.status().as_u16() {
        200 | 201 => Some(id),
        503 => None,
        other => panic!("create answered {other}"),
    }
}

/// One upload; records it when acknowledged (201 or 200). Refusals must be
/// 409 or 410; a busy server may answer 503 (timeout) or 408 (the body was
/// still arriving at the timeout); a lost answer is neither acknowledged
/// nor wrong.
fn upload(
    http: &reqwest::blocking::Client,
    base: &str,
    moment: &str,
    role: &str,
    bytes: Vec<u8>,
    acked: &Acked,
) {
    let id = ulid();
    let sha = hex::encode(Sha256::digest(&bytes));
    let Ok(r) = http
        .put(format!("{base}/api/media/{id}"))
        .header("X-Moment-Id", moment)
        .header("X-Media-Role", role)
        .body(bytes)
        .send()
    else {
        return;
    };
    match r.status().as_u16() {
        200 | 201 => {
            acked.lock().unwrap().insert(id, sha);
        }
        408 | 409 | 410 | 503 => {}
        other => panic!("upload answered {other}"),
    }
}

fn bytes_of(rng: &mut impl Rng, len: usize) -> Vec<u8> {
    let seed: u64 = rng.gen();
    (0..len)
        .map(|i| (seed >> (i % 8 * 8)) as u8 ^ i as u8)
        .collect()
}

/// What one client does until `stop`: `kind` 0 races uploads of the same
/// bytes for one role, 1 uploads to a moment it deletes meanwhile, 2
/// floods one moment with edits and uploads to it, 3 hangs up mid-upload.
fn client_loop(base: String, kind: usize, seed: u64, acked: Acked, stop: Arc<AtomicBool>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let http = client(Duration::from_secs(5));
    while !stop.load(Ordering::Relaxed) {
        let Some(m) = moment(&http, &base) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let same = bytes_of(&mut rng, 40_000);
        std::thread::scope(|scope| match kind {
            0 | 1 => {
                for n in 0..4 {
                    let bytes = if n < 3 {
                        same.clone()
                    } else {
                        bytes_of(&mut rng, 40_001)
                    };
                    let role = if kind == 1 && n % 2 == 1 {
                        "original"
                    } else {
                        "copy"
                    };
                    let (http, base, m, acked) = (&http, &base, &m, &acked);
                    scope.spawn(move || upload(http, base, m, role, bytes, acked));
                }
                if kind == 1 {
                    let _ = http.delete(format!("{base}/api/moments/{m}")).send();
                }
            }
            2 => {
                for _ in 0..4 {
                    let (http, base, m) = (&http, &base, &m);
                    scope.spawn(move || {
                        for i in 0..50 {
                            let _ = http
                                .patch(format!("{base}/api/moments/{m}"))
                                .json(&json!({"caption": format!("c{i}")}))
                                .send();
                        }
                    });
                }
                upload(&http, &base, &m, "copy", same.clone(), &acked);
            }
            _ => {
                let hasty = client(Duration::from_millis(rng.gen_range(1..30)));
                upload(&hasty, &base, &m, "copy", same.clone(), &acked);
            }
        });
    }
}

#[test]
fn acknowledged_uploads_survive_kill_9_with_no_orphan() {
    let cycles: u64 = std::env::var("SPARK_MEDIA_KILL_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let env = [
        ("SPARK_MEDIA_ORPHAN_GRACE_MS", "0"),
        ("SPARK_LIMITS_REQUEST_TIMEOUT_MS", "300"),
        ("SPARK_BRAINS_TURN_WAIT_MAX_S", "0"),
    ];
    let acked: Acked = Arc::default();
    let mut rng = rand::thread_rng();
    for cycle in 0..cycles {
        let server = ServerProcess::start_with_env(&data, &env);
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..8)
            .map(|c| {
                let (base, acked, stop) = (server.base.clone(), acked.clone(), stop.clone());
                let seed = cycle * 100 + c as u64;
                std::thread::spawn(move || client_loop(base, c % 4, seed, acked, stop))
            })
            .collect();
        // Once an upload of this cycle was acknowledged (however slowly
        // this machine goes; a hang guard of five minutes), at a random
        // moment after.
        let before = acked.lock().unwrap().len();
        let started = std::time::Instant::now();
        while acked.lock().unwrap().len() == before {
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "cycle {cycle}: no upload acknowledged"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..500)));
        server.kill();
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.join().expect("a client saw a wrong answer");
        }
        // The restart removes the orphans the kill left (grace 0).
        let server = ServerProcess::start_with_env(&data, &env);
        let http = client(Duration::from_secs(10));
        for (id, sha) in acked.lock().unwrap().iter() {
            let r = http
                .get(server.url(&format!("/api/media/{id}")))
                .send()
                .unwrap();
            match r.status().as_u16() {
                200 => {
                    let body = r.bytes().unwrap();
                    assert_eq!(hex::encode(Sha256::digest(&body)), *sha, "media {id}");
                }
                // Its moment was deleted: the blob is checked on disk below.
                410 => {}
                other => panic!("acknowledged media {id} answers {other}"),
            }
        }
        assert!(server.terminate().success());
        let whole = assert_media_whole(&data);
        assert!(whole >= acked.lock().unwrap().len());
        let blobs = spark_core::blob::blobs_dir(&data);
        for (id, sha) in acked.lock().unwrap().iter() {
            let blob = std::fs::read(blobs.join(sha)).unwrap_or_default();
            assert_eq!(hex::encode(Sha256::digest(&blob)), *sha, "blob of {id}");
        }
    }
    let acked = acked.lock().unwrap().len() as u64;
    eprintln!("media kill -9: {cycles} cycles, {acked} acknowledged uploads checked");
    assert!(acked > 0, "the load made progress");
}
