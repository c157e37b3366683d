//! Forgetting, proven by search (SPEC section 13): unique markers planted
//! in a moment's text, caption, an edit, a message body, the bytes of a
//! photo and (through the text) a turn's answer are found in the data
//! directory; the moment is deleted; after `erase_after_ms` plus a check
//! interval not one byte of any marker is left anywhere in the data
//! directory (log, checkpoints, media), while every answer about the other
//! moments is byte for byte what it was, the erased moment answers `410`
//! with its tombstone, its media `410`, a retried create `200` with
//! `created: false`, and all of it holds after a restart; `spark-replay
//! verify` passes on the compacted log.

use crate::common;

use std::time::{Duration, Instant};

use common::{ulid, ServerProcess};
use serde_json::{json, Value};
use spark_test_support::search::occurrences;

/// How long the test waits for the compactor, at most.
const ERASURE_TIMEOUT: Duration = Duration::from_secs(60);

/// The server's settings: a short retention, frequent checks, small
/// segments (the moment's ops spread over several, and the compaction
/// rewrites more than one) and frequent checkpoints (which then hold the
/// markers until the compaction removes them).
const ENV: &[(&str, &str)] = &[
    ("SPARK_RETENTION_ERASE_AFTER_MS", "3000"),
    ("SPARK_RETENTION_CHECK_INTERVAL_MS", "200"),
    ("SPARK_LOG_SEGMENT_SIZE_BYTES", "4096"),
    ("SPARK_LOG_CHECKPOINT_INTERVAL_OPS", "4"),
];

/// `(status, body bytes)` of a GET.
fn get(client: &reqwest::blocking::Client, url: &str) -> (u16, Vec<u8>) {
    let response = client.get(url).send().unwrap();
    let status = response.status().as_u16();
    (status, response.bytes().unwrap().to_vec())
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

/// One moment with content everywhere: text (which a turn's answer quotes),
/// caption, an edit, a message, a photo. Returns its id, create request id,
/// media id, turn id and message id.
fn plant(
    client: &reqwest::blocking::Client,
    base: &str,
    marker: &str,
) -> (String, String, String, String, String) {
    let id = ulid();
    // Request ids stay (SPEC section 3): they carry no marker.
    let request_id = format!("create-{}", ulid());
    let r = client
        .post(format!("{base}/api/moments"))
        .json(&json!({
            "id": id,
            "client_request_id": request_id,
            "text": format!("{marker}-TEXT"),
            "caption": format!("{marker}-CAPTION"),
            "lang": "en",
        }))
        .send()
        .unwrap();
    assert_eq!(r.status(), 201);
    // A turn reads the text now: its answer quotes it.
    let r = client
        .post(format!("{base}/api/moments/{id}/turns"))
        .json(&json!({"client_request_id": format!("turn-{}", ulid()), "mode": "practical"}))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "turn: {}", r.status());
    let turn_id = json_of(&r.bytes().unwrap())["turn"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, turn) = get(client, &format!("{base}/api/turns/{turn_id}?wait=20"));
    assert_eq!(status, 200);
    let turn = json_of(&turn);
    assert_eq!(turn["status"], "done", "{turn}");
    assert!(
        turn["answer"].as_str().unwrap().contains(marker),
        "the answer quotes the text: {turn}"
    );
    let r = client
        .patch(format!("{base}/api/moments/{id}"))
        .json(&json!({"text": format!("{marker}-EDIT")}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let message_id = ulid();
    let r = client
        .post(format!("{base}/api/messages"))
        .json(&json!({"id": message_id, "thread_id": id, "body": format!("{marker}-MESSAGE")}))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "message: {}", r.status());
    let media_id = ulid();
    let photo = format!("\u{89}PNG fake photo bytes {marker}-PHOTO end").into_bytes();
    let r = client
        .put(format!("{base}/api/media/{media_id}"))
        .header("X-Moment-Id", &id)
        .header("X-Media-Role", "copy")
        .header("Content-Type", "image/png")
        .body(photo)
        .send()
        .unwrap();
    assert_eq!(r.status(), 201);
    (id, request_id, media_id, turn_id, message_id)
}

/// Every answer about the kept moments, as bytes: the live page, the kept
/// phrases, and each moment, its thread, its media's bytes and its turn.
fn answers(
    client: &reqwest::blocking::Client,
    base: &str,
    kept: &[(String, String, String, String, String)],
) -> Vec<(String, u16, Vec<u8>)> {
    let mut paths = vec![
        "/api/moments?limit=50".to_owned(),
        "/api/phrases".to_owned(),
    ];
    for (id, _, media_id, turn_id, _) in kept {
        paths.extend([
            format!("/api/moments/{id}"),
            format!("/api/messages?thread={id}"),
            format!("/api/media/{media_id}"),
            format!("/api/turns/{turn_id}"),
        ]);
    }
    paths
        .into_iter()
        .map(|path| {
            let (status, body) = get(client, &format!("{base}{path}"));
            (path, status, body)
        })
        .collect()
}

#[test]
fn a_deleted_moment_is_erased_from_every_byte_of_the_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = ServerProcess::start_with_env(&data, ENV);
    let base = server.base.clone();
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    let kept_marker = format!("KEEPME{}", ulid());
    let gone_marker = format!("FORGETME{}", ulid());
    let mut kept: Vec<_> = (0..2)
        .map(|n| plant(&client, &base, &format!("{kept_marker}{n}")))
        .collect();
    let gone = plant(&client, &base, &gone_marker);
    kept.push(plant(&client, &base, &format!("{kept_marker}2")));
    // A phrase kept from the moment is the person's vocabulary, not the
    // moment's content: it stays (SPEC section 13).
    let r = client
        .post(format!("{base}/api/phrases"))
        .json(&json!({"phrase": "Ausfahrt freihalten", "moment_id": gone.0}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 201);
    for suffix in ["TEXT", "CAPTION", "EDIT", "MESSAGE", "PHOTO"] {
        let marker = format!("{gone_marker}-{suffix}");
        assert!(
            !occurrences(&data, &marker).is_empty(),
            "{marker} is written somewhere before the delete"
        );
    }

    let r = client
        .delete(format!("{base}/api/moments/{}", gone.0))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let before = answers(&client, &base, &kept);

    // Erased within erase_after_ms plus a check interval (and the time a
    // pass takes on a busy machine).
    let deadline = Instant::now() + ERASURE_TIMEOUT;
    let tombstone = loop {
        let (status, body) = get(&client, &format!("{base}/api/moments/{}", gone.0));
        assert_eq!(status, 410);
        let problem = json_of(&body);
        if problem["moment"]["erased"] == true {
            break problem["moment"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "not erased after {ERASURE_TIMEOUT:?}: {problem}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(tombstone["deleted"], true);
    for member in ["text", "caption", "lang"] {
        assert_eq!(tombstone[member], Value::Null, "{member} of {tombstone}");
    }
    assert_eq!(tombstone["media"][0]["id"], gone.2.as_str());
    assert_eq!(tombstone["turns"][0], gone.3.as_str());

    // Not one byte of any marker is left. The pass removes the blobs right
    // after its commit, which the tombstone above already shows: the photo
    // may outlive the commit by that step, so it is waited for (within the
    // same deadline); the log's markers are gone at the commit.
    for suffix in ["TEXT", "CAPTION", "EDIT", "MESSAGE", "PHOTO"] {
        let marker = format!("{gone_marker}-{suffix}");
        loop {
            let left = occurrences(&data, &marker);
            if left.is_empty() {
                break;
            }
            assert!(
                suffix == "PHOTO" && Instant::now() < deadline,
                "{marker} is still on disk: {left:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    assert_eq!(occurrences(&data, &gone_marker), Vec::<String>::new());
    // The other moment's content is all still there, and every answer
    // about it is byte for byte what it was.
    for n in 0..3 {
        for suffix in ["TEXT", "CAPTION", "EDIT", "MESSAGE", "PHOTO"] {
            let marker = format!("{kept_marker}{n}-{suffix}");
            assert!(!occurrences(&data, &marker).is_empty(), "{marker} is kept");
        }
    }
    assert_eq!(answers(&client, &base, &kept), before);

    // The erased moment's other answers: media 410, turn and message
    // without content, a retried create known.
    let (status, _) = get(&client, &format!("{base}/api/media/{}", gone.2));
    assert_eq!(status, 410);
    let (status, turn) = get(&client, &format!("{base}/api/turns/{}", gone.3));
    assert_eq!(status, 200);
    let turn = json_of(&turn);
    assert_eq!(
        (turn["status"].as_str(), &turn["answer"]),
        (Some("done"), &Value::Null)
    );
    let (status, thread) = get(&client, &format!("{base}/api/messages?thread={}", gone.0));
    assert_eq!(status, 200);
    let thread = json_of(&thread);
    assert_eq!(thread["messages"][0]["id"], gone.4.as_str(), "{thread}");
    assert_eq!(thread["messages"][0]["body"], Value::Null, "{thread}");
    let r = client
        .post(format!("{base}/api/moments"))
        .json(&json!({"client_request_id": gone.1, "text": "resurrected?"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200, "a retried create is known, never new");
    let answer = json_of(&r.bytes().unwrap());
    assert_eq!(answer["created"], false);
    assert_eq!(answer["moment"]["id"], gone.0.as_str());
    assert_eq!(answer["moment"]["erased"], true);

    // After a restart (a replay of the compacted log): the same.
    let after_erasure = answers(&client, &base, &kept);
    assert!(server.terminate().success());
    if let Some(replay) =
        common::replay_or_skip("erasure: spark-replay verify of the compacted log")
    {
        let out = std::process::Command::new(replay)
            .arg("verify")
            .arg("--data")
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "verify: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let server = ServerProcess::start_with_env(&data, ENV);
    let base = server.base.clone();
    assert_eq!(answers(&client, &base, &kept), after_erasure);
    let (status, body) = get(&client, &format!("{base}/api/moments/{}", gone.0));
    assert_eq!(status, 410);
    assert_eq!(json_of(&body)["moment"], tombstone);
    assert_eq!(occurrences(&data, &gone_marker), Vec::<String>::new());
    server.kill();
}
