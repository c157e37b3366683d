//! A clean restart and a kill -9 restart give back the same mirror and
//! request index, and every acknowledged write survives kill -9.

use crate::common;

use std::collections::HashMap;

use common::{replayed_state, ulid, ServerProcess};
use serde_json::{json, Value};

fn post(client: &reqwest::blocking::Client, url: &str, body: Value) -> (u16, Value) {
    let r = client.post(url).json(&body).send().unwrap();
    let s = r.status().as_u16();
    (s, r.json().unwrap_or(Value::Null))
}

#[test]
fn clean_and_kill_9_restarts_give_the_same_mirror_and_request_index() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let client = reqwest::blocking::Client::new();
    let server = ServerProcess::start(&data);
    let mut produced = HashMap::new();
    for n in 0..40 {
        let rid = format!("req-{n}");
        let body = if n % 2 == 0 {
            json!({"client_request_id": rid, "text": format!("sign {n}")})
        } else {
            json!({"id": ulid(), "client_request_id": rid, "text": format!("sign {n}")})
        };
        let (s, v) = post(&client, &server.url("/api/moments"), body);
        assert_eq!(s, 201);
        let id = v["moment"]["id"].as_str().unwrap().to_owned();
        if n % 7 == 0 {
            client
                .delete(server.url(&format!("/api/moments/{id}")))
                .send()
                .unwrap();
        }
        if n % 4 == 0 {
            client
                .patch(server.url(&format!("/api/moments/{id}")))
                .json(&json!({"caption": "c", "client_request_id": format!("edit-{n}")}))
                .send()
                .unwrap();
        }
        produced.insert(rid, id);
    }
    assert!(server.terminate().success(), "SIGTERM exits 0");
    let clean = replayed_state(&data);
    assert_eq!(
        clean.2,
        produced.len() + 10 - 2,
        "request rows: creates + edits of live moments"
    );

    // Restart, retry every create (answers from the request index), kill -9.
    let server = ServerProcess::start(&data);
    for (rid, id) in &produced {
        let (s, v) = post(
            &client,
            &server.url("/api/moments"),
            json!({"client_request_id": rid}),
        );
        assert_eq!(s, 200);
        assert_eq!(v["moment"]["id"], id.as_str());
    }
    server.kill();
    assert_eq!(
        replayed_state(&data),
        clean,
        "kill -9 restart: same mirror and request index"
    );

    // And once more with a clean stop.
    let server = ServerProcess::start(&data);
    assert!(server.terminate().success());
    assert_eq!(replayed_state(&data), clean);
}

#[test]
fn every_acknowledged_write_survives_kill_9_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = ServerProcess::start(&data);
    let base = server.base.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked_so_far = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..8 {
        let base = base.clone();
        let stop = stop.clone();
        let acked_so_far = acked_so_far.clone();
        workers.push(std::thread::spawn(move || {
            let client = reqwest::blocking::Client::builder()
                .timeout(std::time::Duration::from_secs(5))
                .build()
                .unwrap();
            let mut acked = Vec::new();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let id = ulid();
                let body = json!({"id": id, "client_request_id": format!("w{w}-{n}"), "text": format!("t{n}")});
                match client.post(format!("{base}/api/moments")).json(&body).send() {
                    Ok(r) if r.status().as_u16() == 201 => {
                        acked.push((format!("w{w}-{n}"), id));
                        acked_so_far.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
                n += 1;
            }
            acked
        }));
    }
    // Under load: once writes are being acknowledged (however slowly this
    // machine goes; a hang guard of five minutes), a little later still.
    let started = std::time::Instant::now();
    while acked_so_far.load(std::sync::atomic::Ordering::Relaxed) < 50 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(300),
            "no write acknowledged"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    server.kill();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked: Vec<(String, String)> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    assert!(!acked.is_empty());
    let server = ServerProcess::start(&data);
    let client = reqwest::blocking::Client::new();
    for (rid, id) in &acked {
        let r = client
            .get(server.url(&format!("/api/moments/{id}")))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "acknowledged moment {id} lost");
        let (s, v) = post(
            &client,
            &server.url("/api/moments"),
            json!({"client_request_id": rid}),
        );
        assert_eq!((s, v["moment"]["id"].as_str()), (200, Some(id.as_str())));
    }
    assert!(server.terminate().success());
}

/// Format version 1 at the engine's level: the ops of a real
/// workload, written again as one version-1 segment (no commit marks), open
/// in the engine to the same mirror, request index and head seq as their
/// version-2 log, `spark-replay verify` and `rebuild` accept them, and a
/// server on the version-1 log serves the same moments and takes new writes
/// (into a version-2 segment).
#[test]
fn a_version_1_log_of_real_ops_replays_verifies_and_serves_as_its_version_2_log() {
    use spark_log_format::format::{encode_record, RecordIn, SegmentHeader, KIND_SEAL};
    use spark_log_format::{LogReader, ScanOptions};

    let dir = tempfile::tempdir().unwrap();
    let v2 = dir.path().join("v2");
    let client = reqwest::blocking::Client::new();
    let server = ServerProcess::start(&v2);
    let mut ids = Vec::new();
    for n in 0..12 {
        let (s, v) = post(
            &client,
            &server.url("/api/moments"),
            json!({"client_request_id": format!("req-{n}"), "text": format!("sign {n}")}),
        );
        assert_eq!(s, 201, "{v}");
        ids.push(v["moment"]["id"].as_str().unwrap().to_owned());
    }
    for (n, id) in ids.iter().enumerate().step_by(3) {
        let r = client
            .patch(server.url(&format!("/api/moments/{id}")))
            .json(&json!({"caption": format!("edit {n}")}))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    }
    let r = client
        .delete(server.url(&format!("/api/moments/{}", ids[1])))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let served = |base: &ServerProcess| -> Vec<Value> {
        ids.iter()
            .map(|id| {
                client
                    .get(base.url(&format!("/api/moments/{id}")))
                    .send()
                    .unwrap()
                    .json::<Value>()
                    .unwrap()
            })
            .collect()
    };
    let before = served(&server);
    assert!(server.terminate().success());

    // The same records, framed as version 1 wrote them: a version-1 header,
    // then each record, with no commit mark.
    let reader = LogReader::open(&v2.join("log")).unwrap();
    let mut segment = SegmentHeader {
        first_seq: 1,
        created_ms: 1_767_225_600_000,
        chain_start: [0; 32],
    }
    .encode_version(1)
    .to_vec();
    let mut count = 0u64;
    reader
        .scan(ScanOptions::default(), |_, r| {
            if r.kind != KIND_SEAL {
                let record = RecordIn {
                    ts_ms: r.ts_ms,
                    kind: r.kind,
                    kind_version: r.kind_version,
                    payload: r.payload,
                };
                encode_record(&mut segment, r.seq, &record).unwrap();
                count += 1;
            }
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
    drop(reader);
    assert_eq!(count, 12 + 4 + 1);
    let v1 = dir.path().join("v1");
    std::fs::create_dir_all(v1.join("log")).unwrap();
    std::fs::write(v1.join("log").join("00000000000000000001.seg"), &segment).unwrap();

    assert_eq!(replayed_state(&v1), replayed_state(&v2));
    if let Some(replay) =
        common::replay_or_skip("restart::a_version_1_log_of_real_ops (its spark-replay part)")
    {
        for args in [&["verify"][..], &["rebuild"][..]] {
            let outputs: Vec<String> = [&v1, &v2]
                .iter()
                .map(|data| {
                    let out = std::process::Command::new(&replay)
                        .args(args)
                        .arg("--data")
                        .arg(data)
                        .output()
                        .unwrap();
                    assert!(
                        out.status.success(),
                        "spark-replay {args:?} on {}: {}",
                        data.display(),
                        String::from_utf8_lossy(&out.stderr)
                    );
                    String::from_utf8_lossy(&out.stdout).into_owned()
                })
                .collect();
            if args == ["rebuild"] {
                assert_eq!(outputs[0], outputs[1], "the same mirror digest");
            }
        }
    }

    let server = ServerProcess::start(&v1);
    assert_eq!(served(&server), before);
    let (s, _) = post(
        &client,
        &server.url("/api/moments"),
        json!({"client_request_id": "after-v1", "text": "new"}),
    );
    assert_eq!(s, 201);
    assert!(server.terminate().success());
    let (_, seq, _) = replayed_state(&v1);
    assert_eq!(seq, count + 1);
}
