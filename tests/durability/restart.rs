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
