//! A read replica follows a compaction in place (SPEC section 13:
//! "Replicas follow the compacted objects and delete their cached copies of
//! superseded ones"; `archive/ARCHIVE.md` "Replicas"): the real
//! `spark-engine` writes with an archive, `erase_after_ms = 0` and small
//! segments; `spark-engine replica` follows it. Moments with unique markers
//! (text, caption, a thread message, a photo) are read through the
//! replica, then one is deleted. Once the writer erased it and the replica
//! caught up past the compaction: the replica answers the erased moment
//! `410` with `moment.erased == true` (the writer's tombstone), every kept
//! moment, thread and media byte for byte as the writer does, no byte of
//! the erased moment's markers is in any file of its data directory, its
//! `/readyz` is `200`, and writes after the compaction keep flowing to it.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::replay_or_skip;
use crate::s3_common::{engine_or_skip, set_credentials, unique_prefix, EngineProcess};
use crate::weed::Weed;
use spark_test_support::replica::{client, get, start_replica, wait_ready, WRITER_URL};
use spark_test_support::search::{holds, occurrences};

/// Hang guard: a wait expected to end (never a speed check).
const HANG_GUARD: Duration = Duration::from_secs(120);

/// The parts of a moment that carry its marker.
const SUFFIXES: [&str; 4] = ["TEXT", "CAPTION", "MESSAGE", "PHOTO"];

/// The writer's settings: 4 KiB segments, erasure at the next pass (every
/// 200 ms), checkpoints every 4 ops, an archive shipping every 50 ms.
fn writer_config(dir: &Path, url: &str, endpoint: &str) -> std::path::PathBuf {
    let path = dir.join("writer.toml");
    std::fs::write(
        &path,
        format!(
            "[log]\nsegment_size_bytes = 4096\ncheckpoint_interval_ops = 4\n\n\
             [retention]\nerase_after_ms = 0\ncheck_interval_ms = 200\n\n\
             [archive]\nurl = \"{url}\"\nendpoint = \"{endpoint}\"\nship_interval_ms = 50\n\
             mode = \"async\"\n"
        ),
    )
    .unwrap();
    path
}

/// The replica's settings: as `replica_config`, with checkpoints of its
/// own every 4 ops (so that it holds some to remove).
fn replica_config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("replica.toml");
    std::fs::write(
        &path,
        format!(
            "[log]\ncheckpoint_interval_ops = 4\n\n\
             [replica]\npoll_interval_ms = 100\nwriter_url = \"{WRITER_URL}\"\n\
             min_seq_wait_ms = 700\nready_lag_max_ms = 3000\n"
        ),
    )
    .unwrap();
    path
}

/// A ULID for now (the clock window of SPEC section 5), `salt` making it
/// unique.
fn ulid_now(salt: u128) -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    spark_engine::Id::from_parts(ms, salt * 7919 + 13).to_string()
}

fn get_json(http: &reqwest::blocking::Client, url: &str) -> Value {
    let (status, _, body) = get(http, url);
    assert_eq!(status, 200, "{url}: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

/// One moment with `marker` in its text, caption, a thread message and a
/// photo: its id and media id.
fn plant(
    http: &reqwest::blocking::Client,
    base: &str,
    marker: &str,
    salt: u128,
) -> (String, String) {
    let id = ulid_now(salt);
    let r = http
        .post(format!("{base}/api/moments"))
        .json(
            &json!({"id": id, "client_request_id": format!("create-{salt}"),
                      "text": format!("{marker}-TEXT"), "caption": format!("{marker}-CAPTION"),
                      "lang": "en"}),
        )
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
    let r = http
        .post(format!("{base}/api/messages"))
        .json(&json!({"id": ulid_now(salt + 100_000), "thread_id": id,
                      "body": format!("{marker}-MESSAGE")}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap());
    let media = ulid_now(salt + 200_000);
    let photo = format!("\u{89}PNG fake photo bytes {marker}-PHOTO end").into_bytes();
    let r = http
        .put(format!("{base}/api/media/{media}"))
        .header("X-Moment-Id", &id)
        .header("X-Media-Role", "copy")
        .header("Content-Type", "image/png")
        .body(photo)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
    (id, media)
}

/// Every answer about `kept` as bytes: the page, each moment, its thread
/// and its media.
fn answers(
    http: &reqwest::blocking::Client,
    base: &str,
    kept: &[(String, String)],
) -> Vec<(String, u16, Vec<u8>)> {
    let mut paths = vec!["/api/moments?limit=100".to_owned()];
    for (id, media) in kept {
        paths.extend([
            format!("/api/moments/{id}"),
            format!("/api/messages?thread={id}"),
            format!("/api/media/{media}"),
        ]);
    }
    paths
        .into_iter()
        .map(|path| {
            let (status, _, body) = get(http, &format!("{base}{path}"));
            (path, status, body)
        })
        .collect()
}

/// Waits until the writer's archive holds its head and the replica serves
/// it (a replica that read no manifest yet answers `503`); returns that
/// seq.
fn wait_caught_up(http: &reqwest::blocking::Client, writer: &str, replica: &str) -> u64 {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let w = get_json(http, &format!("{writer}/api/log/head"));
        let (status, _, r) = get(http, &format!("{replica}/api/log/head"));
        let r: Value = serde_json::from_slice(&r).unwrap();
        if w["seq"] == w["archived_seq"] && status == 200 && r["seq"] == w["seq"] {
            return w["seq"].as_u64().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "the replica did not catch up: writer {w}, replica {r}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_replica_follows_an_erasure_in_place() {
    let test = "a_replica_follows_an_erasure_in_place";
    if replay_or_skip(test).is_none() {
        return;
    }
    let Some((weed_bin, engine)) = engine_or_skip(test) else {
        return;
    };
    set_credentials();
    let weed = Weed::start(weed_bin);
    let endpoint = weed.endpoint();
    let url = unique_prefix("replica-erasure");
    let work = tempfile::tempdir().unwrap();
    let http = client();
    let mut writer = EngineProcess::start(
        &engine,
        &work.path().join("writer"),
        &writer_config(work.path(), &url, &endpoint),
    );
    let kept_marker = format!("KEEPME{}", ulid_now(1));
    let gone_marker = format!("FORGETME{}", ulid_now(2));
    let mut kept = Vec::new();
    for n in 0..2 {
        kept.push(plant(
            &http,
            &writer.base,
            &format!("{kept_marker}{n}"),
            10 + n,
        ));
    }
    let gone = plant(&http, &writer.base, &gone_marker, 20);
    kept.push(plant(&http, &writer.base, &format!("{kept_marker}2"), 30));

    let replica_data = work.path().join("replica");
    let replica = start_replica(
        &engine,
        &replica_data,
        &replica_config(work.path()),
        &url,
        &endpoint,
    );
    wait_caught_up(&http, &writer.base, &replica.base);
    // Read through the replica: it holds the moment, its thread and photo.
    let (status, _, body) = get(&http, &format!("{}/api/moments/{}", replica.base, gone.0));
    assert_eq!(status, 200);
    assert!(holds(&body, &format!("{gone_marker}-TEXT")));
    let (status, _, body) = get(&http, &format!("{}/api/media/{}", replica.base, gone.1));
    assert_eq!(status, 200);
    assert!(holds(&body, &format!("{gone_marker}-PHOTO")));
    let (_, _, body) = get(
        &http,
        &format!("{}/api/messages?thread={}", replica.base, gone.0),
    );
    assert!(holds(&body, &format!("{gone_marker}-MESSAGE")));
    assert!(!occurrences(&replica_data, &format!("{gone_marker}-PHOTO")).is_empty());

    // The delete, erased by the writer at its next pass.
    let r = http
        .delete(format!("{}/api/moments/{}", writer.base, gone.0))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let deadline = Instant::now() + HANG_GUARD;
    let tombstone = loop {
        let (status, _, body) = get(&http, &format!("{}/api/moments/{}", writer.base, gone.0));
        assert_eq!(status, 410);
        let problem: Value = serde_json::from_slice(&body).unwrap();
        if problem["moment"]["erased"] == true {
            break problem;
        }
        assert!(Instant::now() < deadline, "not erased: {problem}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let seq = wait_caught_up(&http, &writer.base, &replica.base);

    // The replica followed the compaction: the erased moment as the
    // writer shows it, the kept ones byte for byte, no marker anywhere.
    let (status, _, body) = get(&http, &format!("{}/api/moments/{}", replica.base, gone.0));
    assert_eq!(status, 410, "{}", String::from_utf8_lossy(&body));
    let problem: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["moment"]["erased"], true, "{problem}");
    assert_eq!(problem, tombstone);
    let (status, _, _) = get(&http, &format!("{}/api/media/{}", replica.base, gone.1));
    assert_eq!(status, 410);
    assert_eq!(
        answers(&http, &replica.base, &kept),
        answers(&http, &writer.base, &kept)
    );
    assert_eq!(
        get(
            &http,
            &format!("{}/api/messages?thread={}", replica.base, gone.0)
        ),
        get(
            &http,
            &format!("{}/api/messages?thread={}", writer.base, gone.0)
        ),
    );
    for suffix in SUFFIXES {
        let marker = format!("{gone_marker}-{suffix}");
        assert_eq!(
            occurrences(&replica_data, &marker),
            Vec::<String>::new(),
            "{marker} in the replica's data directory"
        );
    }
    for n in 0..3 {
        let marker = format!("{kept_marker}{n}-PHOTO");
        assert!(!occurrences(&replica_data, &marker).is_empty(), "{marker}");
    }
    let ready = wait_ready(
        &http,
        &replica.base,
        Duration::from_secs(10),
        |status, _| status == 200,
    );
    assert!(ready["replica"]["error"].is_null(), "{ready}");
    assert!(ready["replica"]["seq"].as_u64().unwrap() >= seq, "{ready}");

    // Writes after the compaction keep flowing to the replica.
    let later = plant(&http, &writer.base, &format!("{kept_marker}3"), 40);
    kept.push(later);
    wait_caught_up(&http, &writer.base, &replica.base);
    assert_eq!(
        answers(&http, &replica.base, &kept),
        answers(&http, &writer.base, &kept)
    );
    let (status, _, _) = get(&http, &format!("{}/readyz", replica.base));
    assert_eq!(status, 200);

    // A replica stopped before a compaction and started after it follows
    // it from the manifest its cache names: nothing set aside, nothing of
    // the erased moment left.
    let mut replica = replica;
    replica.terminate();
    let second_marker = format!("FORGETTOO{}", ulid_now(3));
    let second = plant(&http, &writer.base, &second_marker, 50);
    let cached = get_json(&http, &format!("{}/api/log/head", writer.base));
    let deadline = Instant::now() + HANG_GUARD;
    while get_json(&http, &format!("{}/api/log/head", writer.base))["archived_seq"] != cached["seq"]
    {
        assert!(Instant::now() < deadline, "not archived");
        std::thread::sleep(Duration::from_millis(50));
    }
    let replica = start_replica(
        &engine,
        &replica_data,
        &replica_config(work.path()),
        &url,
        &endpoint,
    );
    wait_caught_up(&http, &writer.base, &replica.base);
    let mut replica = replica;
    replica.terminate();
    let r = http
        .delete(format!("{}/api/moments/{}", writer.base, second.0))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let (_, _, body) = get(&http, &format!("{}/api/moments/{}", writer.base, second.0));
        let problem: Value = serde_json::from_slice(&body).unwrap();
        if problem["moment"]["erased"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "not erased: {problem}");
        std::thread::sleep(Duration::from_millis(100));
    }
    kept.push(plant(&http, &writer.base, &format!("{kept_marker}4"), 60));
    let replica = start_replica(
        &engine,
        &replica_data,
        &replica_config(work.path()),
        &url,
        &endpoint,
    );
    wait_caught_up(&http, &writer.base, &replica.base);
    let (status, _, body) = get(&http, &format!("{}/api/moments/{}", replica.base, second.0));
    assert_eq!(status, 410);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["moment"]["erased"],
        true
    );
    assert_eq!(
        answers(&http, &replica.base, &kept),
        answers(&http, &writer.base, &kept)
    );
    for marker in [&gone_marker, &second_marker] {
        assert_eq!(
            occurrences(&replica_data, marker),
            Vec::<String>::new(),
            "{marker} in the replica's data directory after a restart"
        );
    }
    let set_aside: Vec<String> = std::fs::read_dir(&replica_data)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".stale-"))
        .collect();
    assert_eq!(set_aside, Vec::<String>::new(), "the cache was set aside");
    wait_ready(
        &http,
        &replica.base,
        Duration::from_secs(10),
        |status, _| status == 200,
    );
    writer.terminate();
}
