//! Read replicas (SPEC section 11) with the real `spark-engine`
//! processes against a `weed mini` of the test's own ([`crate::weed`]): a
//! writer ships to a prefix, `spark-engine replica --from` follows it.
//!
//! - [`replica_answers_every_read_as_the_writer_does`]: a mixed workload on
//!   the writer over HTTP (creates, edits, deletes, uploads, turns, kept
//!   phrases, messages); once the replica caught up, every GET answers
//!   the same on both (status, body, `ETag`; media bytes, whole and a
//!   `Range`), `/api/log/head` names the same seq, segment and chain, and
//!   `/api/events` delivers the same events. Then the replica restarts on
//!   its cache while the writer goes on: the stream resumed with
//!   `Last-Event-ID` gives every seq once, no gap, no duplicate, and the
//!   restart fetches a fraction of the objects a first start fetched
//!   (counted with the store's own request metrics). Also: writes answer
//!   `421 read_only` naming the writer; `min_seq` and `X-Spark-Min-Seq`
//!   wait for a seq and answer `503` with `Retry-After` past the bound;
//!   `lag_ms`, `spark_replica_seq`, `spark_replica_lag_seconds`, `/readyz`.
//! - [`replica_faults_unreachable_store_takeover_and_corrupt_objects`]:
//!   the store stopped (the replica serves what it has, `/readyz` answers
//!   `503` naming the store, `lag_ms` grows; it catches up once the store
//!   is back), a take-over on the writer side (the replica follows the new
//!   epoch and serves exactly what the new writer serves, never the fenced
//!   writer's later writes), a restart while the store is unreachable
//!   (the cache is served, then followed once the store is back), a
//!   damaged manifest (refused, named in
//!   `/readyz`, nothing of it served) and a damaged chunk (a replica
//!   starting on it refuses, naming the object).
//! - [`replica_follows_a_sync_mode_writer_through_chunk_merges`] follows
//!   a `sync`-mode writer, which merges runs of chunks.
//! - [`a_replica_further_behind_than_retention_goes_to_the_latest`]
//!   finds the manifests after the one it applied deleted by the
//!   writer's retention at its next poll, and goes to the latest.
//!
//! Without `weed` (or the `spark-engine` binary) the tests print
//! `skipped: ...`; `SPARK_REQUIRE_S3=1` makes them fail instead. The two
//! that run `spark-replay` (a restore for the take-over, `verify` by
//! `AWS_ENDPOINT_URL`) skip without it too, unless
//! `SPARK_REQUIRE_REPLAY=1`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::replay_or_skip;
use crate::s3_common::{engine_or_skip, set_credentials, unique_prefix, EngineProcess};
use crate::weed::{raw_store, Weed};
use spark_test_support::replica::{
    client, get, replica_config, start_replica, wait_ready, WRITER_URL,
};

/// A writer's settings: small segments (so they seal and fold under the
/// workload), an `[archive]` shipping every 100 ms.
fn writer_config(dir: &Path, url: &str, endpoint: &str) -> std::path::PathBuf {
    let path = dir.join("writer.toml");
    crate::s3_common::write_archive_config(&path, 8192, url, endpoint, 100, "async");
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

fn head_seq(http: &reqwest::blocking::Client, base: &str) -> u64 {
    get_json(http, &format!("{base}/api/log/head"))["seq"]
        .as_u64()
        .unwrap()
}

/// Waits until the writer's archive holds its head and the replica serves
/// it; returns that seq.
fn wait_caught_up(
    http: &reqwest::blocking::Client,
    writer: &str,
    replica: &str,
    within: Duration,
) -> u64 {
    let deadline = Instant::now() + within;
    loop {
        let w = get_json(http, &format!("{writer}/api/log/head"));
        let r = get_json(http, &format!("{replica}/api/log/head"));
        if w["seq"] == w["archived_seq"] && r["seq"] == w["seq"] {
            return w["seq"].as_u64().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "the replica did not catch up within {within:?}: writer {w}, replica {r}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the writer's archive holds its head.
fn wait_archived(http: &reqwest::blocking::Client, writer: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let head = get_json(http, &format!("{writer}/api/log/head"));
        if head["seq"] == head["archived_seq"] {
            return;
        }
        assert!(Instant::now() < deadline, "not archived: {head}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the workload wrote, to read back.
#[derive(Default)]
struct Written {
    moments: Vec<String>,
    media: Vec<String>,
    turns: Vec<String>,
    threads: Vec<String>,
}

/// A mixed workload of `rounds` rounds on the writer at `base`: creates,
/// edits, deletes, uploads, turns, kept phrases and messages.
fn workload(
    http: &reqwest::blocking::Client,
    base: &str,
    rounds: u128,
    salt: u128,
    out: &mut Written,
) {
    for i in 0..rounds {
        let n = salt * 1000 + i;
        let moment = ulid_now(n);
        let r = http
            .post(format!("{base}/api/moments"))
            .json(&json!({"id": moment, "client_request_id": format!("c-{n}"),
                          "text": format!("Ausgang {n}"), "lang": "de"}))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
        out.moments.push(moment.clone());
        let r = http
            .patch(format!("{base}/api/moments/{moment}"))
            .json(&json!({"caption": format!("exit sign {n}")}))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().unwrap());
        let media = ulid_now(n + 500_000);
        let bytes: Vec<u8> = (0..(3000 + (n % 7) * 100) as usize)
            .map(|b| (b as u128 * 31 + n) as u8)
            .collect();
        let r = http
            .put(format!("{base}/api/media/{media}"))
            .header("X-Moment-Id", &moment)
            .header("X-Media-Role", "copy")
            .header("Content-Type", "image/jpeg")
            .body(bytes)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
        out.media.push(media);
        if i % 3 == 0 {
            let r = http
                .post(format!("{base}/api/moments/{moment}/turns"))
                .json(&json!({"client_request_id": format!("t-{n}"), "mode": "practical"}))
                .send()
                .unwrap();
            assert!(r.status().is_success(), "{}", r.text().unwrap());
            let turn: Value = r.json().unwrap();
            out.turns
                .push(turn["turn"]["id"].as_str().unwrap().to_owned());
        }
        let r = http
            .post(format!("{base}/api/phrases"))
            .json(&json!({"phrase": format!("Notausgang {}", n % 4), "moment_id": moment}))
            .send()
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().unwrap());
        let r = http
            .post(format!("{base}/api/messages"))
            .json(&json!({"id": ulid_now(n + 900_000), "thread_id": moment,
                          "body": format!("what does {n} mean?")}))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap());
        out.threads.push(moment.clone());
        if i % 4 == 3 {
            let r = http
                .delete(format!(
                    "{base}/api/moments/{}",
                    out.moments[out.moments.len() - 2]
                ))
                .send()
                .unwrap();
            assert_eq!(r.status().as_u16(), 200, "{}", r.text().unwrap());
        }
    }
}

/// Waits until every turn of the workload has ended on `base` (a long
/// poll each), so that no turn ends between two reads being compared.
fn settle_turns(http: &reqwest::blocking::Client, base: &str, written: &Written) {
    for turn in &written.turns {
        let deadline = Instant::now() + Duration::from_secs(60);
        while get_json(http, &format!("{base}/api/turns/{turn}?wait=5"))["status"] == "running" {
            assert!(Instant::now() < deadline, "turn {turn} still running");
        }
    }
}

/// Every GET the workload's records answer, on `base`: (path, status,
/// ETag, body).
fn every_get(
    http: &reqwest::blocking::Client,
    base: &str,
    written: &Written,
) -> Vec<(String, u16, Option<String>, Vec<u8>)> {
    let mut paths = vec![
        "/api/moments?limit=1000".to_owned(),
        "/api/moments?limit=3".to_owned(),
        "/api/phrases".to_owned(),
    ];
    paths.extend(written.moments.iter().map(|m| format!("/api/moments/{m}")));
    paths.extend(written.media.iter().map(|m| format!("/api/media/{m}")));
    paths.extend(written.turns.iter().map(|t| format!("/api/turns/{t}")));
    paths.extend(
        written
            .threads
            .iter()
            .map(|t| format!("/api/messages?thread={t}")),
    );
    let mut answers: Vec<_> = paths
        .into_iter()
        .map(|path| {
            let (status, etag, body) = get(http, &format!("{base}{path}"));
            (path, status, etag, body)
        })
        .collect();
    // A Range of each blob.
    for media in &written.media {
        let r = http
            .get(format!("{base}/api/media/{media}"))
            .header("Range", "bytes=100-1099")
            .send()
            .unwrap();
        let status = r.status().as_u16();
        let range = r
            .headers()
            .get("content-range")
            .map(|v| v.to_str().unwrap().to_owned());
        answers.push((
            format!("/api/media/{media} Range"),
            status,
            range,
            r.bytes().unwrap().to_vec(),
        ));
    }
    answers
}

/// The events of `GET /api/events` on `base` (after `after`, or with
/// `Last-Event-ID`), read until the event of seq `upto`: (seq, data).
fn events(
    http: &reqwest::blocking::Client,
    base: &str,
    after: &str,
    last_event_id: bool,
    upto: u64,
) -> Vec<(String, String)> {
    let request = if last_event_id {
        http.get(format!("{base}/api/events"))
            .header("Last-Event-ID", after)
    } else {
        http.get(format!("{base}/api/events?after={after}"))
    };
    let response = request.send().unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut lines = BufReader::new(response).lines();
    let mut out: Vec<(String, String)> = Vec::new();
    let (mut id, mut data) = (None, None);
    while out.last().map_or(seq_of(after), |(id, _)| seq_of(id)) < upto {
        let line = lines.next().expect("the stream ended early").unwrap();
        if let Some(value) = line.strip_prefix("id:") {
            id = Some(value.trim().to_owned());
        } else if let Some(value) = line.strip_prefix("data:") {
            data = Some(value.trim().to_owned());
        } else if line.is_empty() {
            if let (Some(id), Some(data)) = (id.take(), data.take()) {
                out.push((id, data));
            }
        }
    }
    out
}

/// The seq of an event cursor (`SEQ.CHAIN`, or `0`).
fn seq_of(cursor: &str) -> u64 {
    cursor.split('.').next().unwrap().parse().unwrap()
}

/// The status and problem code of `GET /api/events` with `Last-Event-ID:
/// cursor`.
fn events_refusal(http: &reqwest::blocking::Client, base: &str, cursor: &str) -> (u16, Value) {
    let response = http
        .get(format!("{base}/api/events"))
        .header("Last-Event-ID", cursor)
        .send()
        .unwrap();
    let status = response.status().as_u16();
    if status == 200 {
        return (status, Value::Null);
    }
    (status, response.json().unwrap())
}

/// Seqs `after+1..=upto`, each once, in order.
fn assert_gapless(events: &[(String, String)], after: &str, upto: u64) {
    let seqs: Vec<u64> = events.iter().map(|(id, _)| seq_of(id)).collect();
    let expected: Vec<u64> = (seq_of(after) + 1..=upto).collect();
    assert_eq!(seqs, expected, "events after {after} up to {upto}");
}

/// GET requests the store served so far (its own Prometheus counter).
fn store_gets(http: &reqwest::blocking::Client, weed: &Weed) -> u64 {
    let text = http.get(weed.metrics_url()).send().unwrap().text().unwrap();
    text.lines()
        .filter(|l| l.starts_with("SeaweedFS_s3_request_total") && l.contains("type=\"GET\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[test]
fn replica_answers_every_read_as_the_writer_does() {
    let test = "replica_answers_every_read_as_the_writer_does";
    let Some((weed_bin, engine)) = engine_or_skip(test) else {
        return;
    };
    set_credentials();
    let weed = Weed::start(weed_bin);
    let endpoint = weed.endpoint();
    let url = unique_prefix("replica-same");
    let work = tempfile::tempdir().unwrap();
    let http = client();
    let mut writer = EngineProcess::start(
        &engine,
        &work.path().join("writer"),
        &writer_config(work.path(), &url, &endpoint),
    );
    let mut written = Written::default();
    workload(&http, &writer.base, 12, 1, &mut written);
    wait_archived(&http, &writer.base);
    // The replica starts on an empty cache from everything archived so
    // far, then follows while the workload goes on.
    let replica_data = work.path().join("replica");
    let replica_toml = replica_config(work.path());
    let gets_before = store_gets(&http, &weed);
    let replica = start_replica(&engine, &replica_data, &replica_toml, &url, &endpoint);
    let first_start_gets = store_gets(&http, &weed) - gets_before;
    workload(&http, &writer.base, 12, 2, &mut written);
    settle_turns(&http, &writer.base, &written);
    let seq = wait_caught_up(&http, &writer.base, &replica.base, Duration::from_secs(30));

    let on_writer = every_get(&http, &writer.base, &written);
    let on_replica = every_get(&http, &replica.base, &written);
    assert_eq!(on_writer.len(), on_replica.len());
    let mut media_bytes = 0;
    for (w, r) in on_writer.iter().zip(&on_replica) {
        assert_eq!(
            (w.1, &w.2),
            (r.1, &r.2),
            "{}: writer {} {:?}, replica {} {:?}: {}",
            w.0,
            w.1,
            w.2,
            r.1,
            r.2,
            String::from_utf8_lossy(&r.3)
        );
        assert!(w.3 == r.3, "{}: the bodies differ", w.0);
        if w.0.starts_with("/api/media/") {
            media_bytes += r.3.len();
        }
    }
    assert!(
        on_writer.iter().any(|a| a.1 == 410),
        "a deleted moment is read"
    );
    assert!(on_writer.iter().any(|a| a.1 == 206), "a Range is read");
    assert!(media_bytes > 24 * 3000);
    // The head: the same seq, segment and chain; the replica shows its lag.
    let wh = get_json(&http, &format!("{}/api/log/head", writer.base));
    let rh = get_json(&http, &format!("{}/api/log/head", replica.base));
    for member in ["seq", "segment", "chain"] {
        assert_eq!(
            wh[member], rh[member],
            "{member}: writer {wh}, replica {rh}"
        );
    }
    assert!(rh["lag_ms"].as_u64().unwrap() < 3000, "{rh}");
    assert!(wh.get("lag_ms").is_none(), "{wh}");
    // The same events from the start.
    let from_writer = events(&http, &writer.base, "0", false, seq);
    let from_replica = events(&http, &replica.base, "0", false, seq);
    assert_gapless(&from_replica, "0", seq);
    assert_eq!(from_writer, from_replica);

    // Writes answer 421 read_only, naming the writer.
    let r = http
        .post(format!("{}/api/moments", replica.base))
        .json(&json!({"text": "nope"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 421);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    let problem: Value = r.json().unwrap();
    assert_eq!(problem["code"], "read_only", "{problem}");
    assert_eq!(problem["writer_url"], WRITER_URL, "{problem}");
    for (method, path) in [
        (
            reqwest::Method::DELETE,
            format!("/api/moments/{}", written.moments[0]),
        ),
        (reqwest::Method::PUT, format!("/api/media/{}", ulid_now(77))),
        (reqwest::Method::POST, "/api/messages".to_owned()),
        (
            reqwest::Method::PATCH,
            format!("/api/moments/{}", written.moments[0]),
        ),
    ] {
        let r = http
            .request(method.clone(), format!("{}{path}", replica.base))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 421, "{method} {path}");
    }

    // Read your own write: min_seq (or the header) waits for the replica.
    let moment = ulid_now(4242);
    let r = http
        .post(format!("{}/api/moments", writer.base))
        .json(&json!({"id": moment, "text": "fresh"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let wrote = head_seq(&http, &writer.base);
    let (status, _, body) = get(
        &http,
        &format!("{}/api/moments/{moment}?min_seq={wrote}", replica.base),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let r = http
        .get(format!("{}/api/moments?limit=1000", replica.base))
        .header("X-Spark-Min-Seq", wrote.to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let started = Instant::now();
    let r = http
        .get(format!("{}/api/moments/{moment}", replica.base))
        .header("X-Spark-Min-Seq", (wrote + 1000).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert_eq!(r.headers()["retry-after"], "1");
    let problem: Value = r.json().unwrap();
    assert_eq!(problem["min_seq"], wrote + 1000, "{problem}");
    let (status, _, _) = get(&http, &format!("{}/api/moments?min_seq=x", replica.base));
    assert_eq!(status, 400);

    // Lag and readiness.
    let ready = get_json(&http, &format!("{}/readyz", replica.base));
    assert_eq!(ready["replica"]["url"], url.as_str(), "{ready}");
    let metrics = http
        .get(format!("{}/metrics", replica.base))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(metrics.contains("spark_replica_seq"), "{metrics}");
    assert!(metrics.contains("spark_replica_lag_seconds"), "{metrics}");
    assert_eq!(metrics.matches("# EOF").count(), 1);

    // A restart on the cache while the writer goes on: the stream resumes
    // after the last event seen, every seq once.
    wait_caught_up(&http, &writer.base, &replica.base, Duration::from_secs(30));
    // The cursor a follower of the replica holds: the same on the writer
    // (the replica's log is the writer's bytes), so a failover either way
    // goes on.
    let seen = get_json(&http, &format!("{}/api/log/head", replica.base))["cursor"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        seen,
        get_json(&http, &format!("{}/api/log/head", writer.base))["cursor"]
    );
    let mut replica = replica;
    replica.terminate();
    // Nothing new in the archive: a restart on the cache finds the latest
    // manifest (a LIST of the manifest and epoch keys, which the store
    // counts as GETs) and reads it with the one before it and the epoch
    // object, and fetches no segment, chunk or blob (a first start
    // fetched 12 blobs and every log object).
    let gets_before = store_gets(&http, &weed);
    let mut replica = start_replica(&engine, &replica_data, &replica_toml, &url, &endpoint);
    let restart_gets = store_gets(&http, &weed) - gets_before;
    eprintln!(
        "replica start: {first_start_gets} store GETs from an empty cache, {restart_gets} on its cache"
    );
    assert!(
        restart_gets * 2 < first_start_gets && first_start_gets > 12,
        "a restart on the cache fetched {restart_gets} objects, a first start {first_start_gets}"
    );
    replica.terminate();
    workload(&http, &writer.base, 6, 3, &mut written);
    let replica = start_replica(&engine, &replica_data, &replica_toml, &url, &endpoint);
    workload(&http, &writer.base, 4, 4, &mut written);
    settle_turns(&http, &writer.base, &written);
    let upto = wait_caught_up(&http, &writer.base, &replica.base, Duration::from_secs(30));
    let resumed = events(&http, &replica.base, &seen, true, upto);
    assert_gapless(&resumed, &seen, upto);
    assert_eq!(resumed, events(&http, &writer.base, &seen, true, upto));
    let on_writer = every_get(&http, &writer.base, &written);
    let on_replica = every_get(&http, &replica.base, &written);
    assert!(
        on_writer == on_replica,
        "after the restart the answers differ"
    );
    writer.terminate();
}

/// How long a replica that caught up may take to say ready: its lag must
/// drop under `ready_lag_max_ms` (3 s here) at a poll of the archive, which
/// a busy machine delays.
const READY_WITHIN: Duration = Duration::from_secs(30);

#[test]
fn replica_faults_unreachable_store_takeover_and_corrupt_objects() {
    let test = "replica_faults_unreachable_store_takeover_and_corrupt_objects";
    if replay_or_skip(test).is_none() {
        return;
    }
    let Some((weed_bin, engine)) = engine_or_skip(test) else {
        return;
    };
    set_credentials();
    let mut weed = Weed::start(weed_bin);
    let endpoint = weed.endpoint();
    let url = unique_prefix("replica-faults");
    let work = tempfile::tempdir().unwrap();
    let http = client();
    let writer_toml = writer_config(work.path(), &url, &endpoint);
    let writer = EngineProcess::start(&engine, &work.path().join("writer"), &writer_toml);
    let mut written = Written::default();
    workload(&http, &writer.base, 5, 1, &mut written);
    let replica_toml = replica_config(work.path());
    let replica_data = work.path().join("replica");
    let replica = start_replica(&engine, &replica_data, &replica_toml, &url, &endpoint);
    let seq = wait_caught_up(&http, &writer.base, &replica.base, Duration::from_secs(30));
    wait_ready(&http, &replica.base, READY_WITHIN, |s, _| s == 200);

    // The store unreachable: the replica serves what it has, says so, and
    // its lag grows; the writer goes on locally.
    weed.stop();
    workload(&http, &writer.base, 2, 2, &mut written);
    let down = wait_ready(&http, &replica.base, Duration::from_secs(20), |s, b| {
        s == 503
            && b["replica"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("unreachable"))
    });
    assert_eq!(down["code"], "unavailable", "{down}");
    let lag_1 = get_json(&http, &format!("{}/api/log/head", replica.base))["lag_ms"]
        .as_u64()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let head = get_json(&http, &format!("{}/api/log/head", replica.base));
    assert!(head["lag_ms"].as_u64().unwrap() >= lag_1 + 400, "{head}");
    assert_eq!(head["seq"], seq, "{head}");
    let (status, _, _) = get(
        &http,
        &format!("{}/api/moments/{}", replica.base, written.moments[0]),
    );
    assert_eq!(status, 200, "the replica serves what it has");
    let (status, _, body) = get(
        &http,
        &format!("{}/api/media/{}", replica.base, written.media[0]),
    );
    assert_eq!(status, 200);
    assert!(body.len() >= 3000);
    weed.resume();
    wait_caught_up(&http, &writer.base, &replica.base, Duration::from_secs(60));
    wait_ready(&http, &replica.base, Duration::from_secs(20), |s, _| {
        s == 200
    });

    // A take-over on the writer side: restore a new directory, take the
    // prefix over; the old writer is fenced at its next ship. The replica
    // follows the new epoch.
    let taken = work.path().join("taken");
    let (code, out, err) = crate::s3_common::restore(&url, &taken, &endpoint, &[]);
    assert_eq!(code, 0, "{out}{err}");
    // The restore's point: in both histories.
    let shared = get_json(&http, &format!("{}/api/log/head", replica.base))["cursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut new_writer =
        EngineProcess::start_args(&engine, &["serve", "--take-over"], &taken, &writer_toml);
    // Where the new history starts.
    let base = get_json(&http, &format!("{}/api/log/head", new_writer.base))["cursor"]
        .as_str()
        .unwrap()
        .to_owned();
    // The old writer's writes after the take-over are never acknowledged
    // once it knows (its chunks past the take-over point are orphans).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    loop {
        n += 1;
        let r = http
            .post(format!("{}/api/moments", writer.base))
            .json(&json!({"id": ulid_now(700_000 + n), "text": "from the fenced writer"}))
            .send()
            .unwrap();
        if r.status().as_u16() == 503 {
            let problem: Value = r.json().unwrap();
            assert_eq!(problem["code"], "fenced", "{problem}");
            break;
        }
        assert!(Instant::now() < deadline, "the old writer was never fenced");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A follower of the old writer, at its last acknowledged op: past the
    // take-over point when the old writer acknowledged writes (async mode)
    // before it learnt it was fenced; their seqs go to other ops now.
    let old_head = get_json(&http, &format!("{}/api/log/head", writer.base));
    let lost = old_head["cursor"].as_str().unwrap().to_owned();
    eprintln!("take-over at {base}; the fenced writer's head {lost}");
    workload(&http, &new_writer.base, 3, 3, &mut written);
    settle_turns(&http, &new_writer.base, &written);
    let seq = wait_caught_up(
        &http,
        &new_writer.base,
        &replica.base,
        Duration::from_secs(30),
    );
    // That follower comes back to the new writer or fails over to the
    // replica: its cursor names the lost history, so 409 cursor_unknown
    // naming the head (before: 200 and the ops after its seq, the new
    // writer's ops under the lost seqs never delivered).
    assert!(seq > seq_of(&lost), "the new history passed {lost}: {seq}");
    for server in [&new_writer.base, &replica.base] {
        if lost == base {
            // Fenced before it acknowledged anything more: one history.
            assert_gapless(&events(&http, server, &lost, true, seq), &lost, seq);
        } else {
            let (status, problem) = events_refusal(&http, server, &lost);
            assert_eq!(status, 409, "{server}: {problem}");
            assert_eq!(problem["code"], "cursor_unknown", "{problem}");
            assert_eq!(problem["head_seq"], seq, "{problem}");
        }
        // The restore's point is in both: it goes on from there.
        let from_shared = events(&http, server, &shared, true, seq);
        assert_gapless(&from_shared, &shared, seq);
    }
    let on_new = every_get(&http, &new_writer.base, &written);
    let on_replica = every_get(&http, &replica.base, &written);
    assert!(
        on_new == on_replica,
        "the replica serves what the new writer serves"
    );
    let ready = wait_ready(&http, &replica.base, READY_WITHIN, |s, _| s == 200);
    assert_eq!(ready["replica"]["epoch"], 2, "{ready}");
    assert_eq!(
        events(&http, &replica.base, "0", false, seq),
        events(&http, &new_writer.base, "0", false, seq)
    );
    drop(writer);

    // A restart while the store is unreachable: the replica serves its
    // cache, says it cannot follow, and catches up once the store is back.
    let mut replica = replica;
    replica.terminate();
    weed.stop();
    let replica = start_replica(&engine, &replica_data, &replica_toml, &url, &endpoint);
    let (status, _, _) = get(
        &http,
        &format!("{}/api/moments/{}", replica.base, written.moments[0]),
    );
    assert_eq!(status, 200, "the cache is served");
    assert_eq!(head_seq(&http, &replica.base), seq);
    wait_ready(&http, &replica.base, Duration::from_secs(20), |s, _| {
        s == 503
    });
    weed.resume();
    workload(&http, &new_writer.base, 1, 4, &mut written);
    settle_turns(&http, &new_writer.base, &written);
    let seq = wait_caught_up(
        &http,
        &new_writer.base,
        &replica.base,
        Duration::from_secs(60),
    );
    assert!(
        every_get(&http, &new_writer.base, &written) == every_get(&http, &replica.base, &written)
    );

    // A damaged manifest under the next key: refused and named; nothing of
    // it is served.
    new_writer.terminate();
    let prefix = url.strip_prefix("s3://spark/").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let raw = raw_store(&endpoint);
    let latest = rt
        .block_on(
            spark_archive::ArchiveStore::new(
                std::sync::Arc::new(raw_store(&endpoint)),
                prefix.to_owned(),
            )
            .latest(|n| spark_archive::layout::manifest_key(prefix, n)),
        )
        .unwrap();
    let next_key = spark_archive::layout::manifest_key(prefix, latest + 1);
    rt.block_on(object_store::ObjectStore::put(
        &raw,
        &object_store::path::Path::from(next_key.as_str()),
        object_store::PutPayload::from_static(b"SPARKMAN not a manifest"),
    ))
    .unwrap();
    let refused = wait_ready(&http, &replica.base, Duration::from_secs(20), |s, b| {
        s == 503
            && b["replica"]["error"]
                .as_str()
                .is_some_and(|e| e.contains(&next_key))
    });
    assert_eq!(refused["replica"]["seq"], seq, "{refused}");
    assert_eq!(head_seq(&http, &replica.base), seq);
    let mut replica = replica;
    replica.terminate();

    // A damaged chunk: a replica starting on it (an empty cache) refuses,
    // naming the object.
    let manifest_bytes = rt
        .block_on(async {
            object_store::ObjectStore::get(
                &raw,
                &object_store::path::Path::from(
                    spark_archive::layout::manifest_key(prefix, latest).as_str(),
                ),
            )
            .await
            .unwrap()
            .bytes()
            .await
        })
        .unwrap();
    let manifest = spark_archive::layout::Manifest::decode(&manifest_bytes, latest).unwrap();
    let chunk = match manifest.chunks.last() {
        Some(chunk) => chunk.key.clone(),
        None => manifest.segments.last().expect("a segment").key.clone(),
    };
    let mut bytes = rt
        .block_on(async {
            object_store::ObjectStore::get(&raw, &object_store::path::Path::from(chunk.as_str()))
                .await
                .unwrap()
                .bytes()
                .await
        })
        .unwrap()
        .to_vec();
    let last = bytes.len() - 20;
    bytes[last] ^= 0x40;
    rt.block_on(object_store::ObjectStore::put(
        &raw,
        &object_store::path::Path::from(chunk.as_str()),
        object_store::PutPayload::from(bytes),
    ))
    .unwrap();
    // Take the damaged manifest away again (a test's own hand, as a store
    // operator would), so the start reads the chunk.
    rt.block_on(object_store::ObjectStore::delete(
        &raw,
        &object_store::path::Path::from(next_key.as_str()),
    ))
    .unwrap();
    let fresh = work.path().join("fresh-replica");
    let out = std::process::Command::new(&engine)
        .args([
            "replica",
            "--from",
            &url,
            "--endpoint",
            &endpoint,
            "--listen",
            "127.0.0.1:0",
            "--data",
        ])
        .arg(&fresh)
        .arg("--config")
        .arg(&replica_toml)
        .env("AWS_ACCESS_KEY_ID", crate::weed::KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", crate::weed::SECRET)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "started on a damaged chunk: {stderr}"
    );
    assert!(
        stderr.contains(&chunk),
        "the refusal names {chunk}: {stderr}"
    );
}

#[test]
fn replica_follows_a_sync_mode_writer_through_chunk_merges() {
    let test = "replica_follows_a_sync_mode_writer_through_chunk_merges";
    let Some((weed_bin, engine)) = engine_or_skip(test) else {
        return;
    };
    set_credentials();
    let weed = Weed::start(weed_bin);
    let endpoint = weed.endpoint();
    let url = unique_prefix("replica-sync");
    let work = tempfile::tempdir().unwrap();
    let http = client();
    // `sync` mode: a chunk per ship, and every 16 chunks merged into one
    // (ARCHIVE.md "Sync mode"), so the replica's tail often ends inside a
    // merged chunk.
    let toml = work.path().join("writer.toml");
    crate::s3_common::write_archive_config(&toml, 1 << 20, &url, &endpoint, 100, "sync");
    let writer = EngineProcess::start(&engine, &work.path().join("writer"), &toml);
    let replica_toml = work.path().join("replica.toml");
    std::fs::write(&replica_toml, "[replica]\npoll_interval_ms = 10\n").unwrap();
    let r = http
        .post(format!("{}/api/moments", writer.base))
        .json(&json!({"text": "first"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let replica = start_replica(
        &engine,
        &work.path().join("replica"),
        &replica_toml,
        &url,
        &endpoint,
    );
    let mut written = Written::default();
    for n in 0..70u128 {
        let id = ulid_now(50_000 + n);
        let r = http
            .post(format!("{}/api/moments", writer.base))
            .json(&json!({"id": id, "text": format!("sync {n}")}))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
        written.moments.push(id);
        // Give the replica a poll between writes now and then.
        if n.is_multiple_of(3) {
            std::thread::sleep(Duration::from_millis(25));
        }
    }
    let seq = wait_caught_up(&http, &writer.base, &replica.base, Duration::from_secs(30));
    assert!(every_get(&http, &writer.base, &written) == every_get(&http, &replica.base, &written));
    let wh = get_json(&http, &format!("{}/api/log/head", writer.base));
    let rh = get_json(&http, &format!("{}/api/log/head", replica.base));
    assert_eq!(
        (&wh["chain"], &wh["segment"]),
        (&rh["chain"], &rh["segment"])
    );
    assert_eq!(
        events(&http, &replica.base, "0", false, seq),
        events(&http, &writer.base, "0", false, seq)
    );
    let log = std::fs::read_to_string(work.path().join("replica.log")).unwrap();
    assert!(
        log.contains("ended inside a merged chunk"),
        "no merge was met: {log}"
    );
}

/// The archive's endpoint from `AWS_ENDPOINT_URL` (the AWS CLI's and SDKs'
/// variable) when the settings and the command line name none: the writer,
/// a replica and `spark-replay verify` reach the store by it alone; an
/// endpoint given (`--endpoint`) wins over a wrong one in the variable.
#[test]
fn the_endpoint_comes_from_aws_endpoint_url_unless_one_is_given() {
    let test = "the_endpoint_comes_from_aws_endpoint_url_unless_one_is_given";
    let Some(replay) = replay_or_skip(test) else {
        return;
    };
    let Some((weed_bin, engine)) = engine_or_skip(test) else {
        return;
    };
    set_credentials();
    let weed = Weed::start(weed_bin);
    let endpoint = weed.endpoint();
    // Nothing listens there.
    let wrong = "http://127.0.0.1:9";
    let url = unique_prefix("aws-endpoint-url");
    let work = tempfile::tempdir().unwrap();
    let http = client();
    let toml = work.path().join("writer.toml");
    std::fs::write(
        &toml,
        format!("[archive]\nurl = \"{url}\"\nship_interval_ms = 100\n"),
    )
    .unwrap();
    let env = [("AWS_ENDPOINT_URL", endpoint.as_str())];
    let writer = EngineProcess::start_env(&engine, &[], &work.path().join("writer"), &toml, &env);
    let r = http
        .post(format!("{}/api/moments", writer.base))
        .json(&json!({"text": "by AWS_ENDPOINT_URL"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    wait_archived(&http, &writer.base);
    let replica_toml = replica_config(work.path());
    let by_env = EngineProcess::start_env(
        &engine,
        &["replica", "--from", &url],
        &work.path().join("replica-env"),
        &replica_toml,
        &env,
    );
    let given = EngineProcess::start_env(
        &engine,
        &["replica", "--from", &url, "--endpoint", &endpoint],
        &work.path().join("replica-given"),
        &replica_toml,
        &[("AWS_ENDPOINT_URL", wrong)],
    );
    for replica in [&by_env, &given] {
        wait_caught_up(&http, &writer.base, &replica.base, Duration::from_secs(60));
    }
    let verify = |args: &[&str], aws_endpoint: &str| {
        let out = std::process::Command::new(&replay)
            .args(args)
            .env_remove("SPARK_ARCHIVE_ENDPOINT")
            .env("AWS_ENDPOINT_URL", aws_endpoint)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?} with AWS_ENDPOINT_URL={aws_endpoint}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    verify(&["verify", "--from", &url], &endpoint);
    verify(&["verify", "--from", &url, "--endpoint", &endpoint], wrong);
    drop((writer, by_env, given));
    drop(weed);
}

/// A replica keeps up with a `sync`-mode writer under
/// concurrent load, which stores a manifest per ship (about 100 a second
/// here). It read and applied each manifest in turn (55-60 a second), so
/// its lag grew without bound; it now reads ahead and applies the latest
/// of each run. Measured: the writer's manifests per second against the
/// replica's, and the lag at the end of the load; the replica must be
/// caught up within a few seconds of the load's end (a backlog of the
/// old rate would take longer than the load itself).
#[test]
fn replica_keeps_up_with_a_sync_mode_writer_under_load() {
    let test = "replica_keeps_up_with_a_sync_mode_writer_under_load";
    let Some((weed_bin, engine)) = engine_or_skip(test) else {
        return;
    };
    set_credentials();
    let weed = Weed::start(weed_bin);
    let endpoint = weed.endpoint();
    let url = unique_prefix("replica-sync-load");
    let work = tempfile::tempdir().unwrap();
    let http = client();
    let toml = work.path().join("writer.toml");
    crate::s3_common::write_archive_config(&toml, 1 << 20, &url, &endpoint, 100, "sync");
    let writer = EngineProcess::start(&engine, &work.path().join("writer"), &toml);
    let replica_toml = work.path().join("replica.toml");
    std::fs::write(&replica_toml, "[replica]\npoll_interval_ms = 10\n").unwrap();
    let r = http
        .post(format!("{}/api/moments", writer.base))
        .json(&json!({"text": "first"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let replica = start_replica(
        &engine,
        &work.path().join("replica"),
        &replica_toml,
        &url,
        &endpoint,
    );
    wait_caught_up(&http, &writer.base, &replica.base, Duration::from_secs(60));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = spark_archive::ArchiveStore::connect(&spark_archive::StoreConfig {
        url: url.clone(),
        endpoint: Some(endpoint.clone()),
        region: "us-east-1".into(),
    })
    .unwrap();
    let written = || {
        runtime
            .block_on(store.latest_manifest())
            .unwrap()
            .map_or(0, |m| m.number)
    };
    // From the `replica` member, whether `/readyz` answers 200 or 503.
    let applied = || {
        let (_, _, body) = get(&http, &format!("{}/readyz", replica.base));
        serde_json::from_slice::<Value>(&body).unwrap()["replica"]["manifest"]
            .as_u64()
            .unwrap()
    };
    let load = Duration::from_secs(15);
    let (w0, r0, start) = (written(), applied(), Instant::now());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..8u128)
        .map(|t| {
            let (base, stop) = (writer.base.clone(), std::sync::Arc::clone(&stop));
            std::thread::spawn(move || {
                let http = client();
                let mut n = 0u128;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let id = ulid_now(1_000_000 * (t + 1) + n);
                    let r = http
                        .post(format!("{base}/api/moments"))
                        .json(&json!({"id": id, "text": format!("load {t} {n}")}))
                        .send()
                        .unwrap();
                    assert_eq!(r.status().as_u16(), 201);
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut lag_at_end = 0;
    while start.elapsed() < load {
        std::thread::sleep(Duration::from_millis(500));
        lag_at_end = get_json(&http, &format!("{}/api/log/head", replica.base))["lag_ms"]
            .as_u64()
            .unwrap();
    }
    let (w1, r1, secs) = (written(), applied(), start.elapsed().as_secs_f64());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let creates: u128 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    let ended = Instant::now();
    let seq = wait_caught_up(&http, &writer.base, &replica.base, Duration::from_secs(120));
    let drained = ended.elapsed();
    eprintln!(
        "{test}: {creates} creates in {secs:.1} s ({:.0}/s); the writer stored {:.0} manifests/s, \
         the replica read and checked {:.0}/s; its lag at the load's end {lag_at_end} ms; caught up \
         (seq {seq}) {drained:?} after the load",
        creates as f64 / secs,
        (w1 - w0) as f64 / secs,
        (r1 - r0) as f64 / secs,
    );
    assert!(
        drained < Duration::from_secs(8),
        "the replica took {drained:?} to catch up after {secs:.0} s of load"
    );
    drop((writer, replica));
    drop(weed);
}

/// A replica that falls more than `[archive] retention_ms` behind finds
/// its next manifest deleted by the writer's retention pass (ARCHIVE.md
/// "Retention", "Replicas"): that is no gap; it goes to the latest
/// manifest at once and serves what the writer serves.
#[test]
fn a_replica_further_behind_than_retention_goes_to_the_latest() {
    let test = "a_replica_further_behind_than_retention_goes_to_the_latest";
    let Some((weed_bin, engine)) = engine_or_skip(test) else {
        return;
    };
    set_credentials();
    let weed = Weed::start(weed_bin);
    let endpoint = weed.endpoint();
    let url = unique_prefix("replica-retention");
    let work = tempfile::tempdir().unwrap();
    let http = client();
    let toml = writer_config(work.path(), &url, &endpoint);
    let mut config = std::fs::read_to_string(&toml).unwrap();
    config.push_str("retention_ms = 1000\n");
    std::fs::write(&toml, config).unwrap();
    let writer = EngineProcess::start(&engine, &work.path().join("writer"), &toml);
    let r = http
        .post(format!("{}/api/moments", writer.base))
        .json(&json!({"text": "first"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    wait_archived(&http, &writer.base);
    // Polls 8 s apart: the writes below and the retention of their
    // manifests happen between two polls.
    let replica_toml = work.path().join("replica.toml");
    std::fs::write(&replica_toml, "[replica]\npoll_interval_ms = 8000\n").unwrap();
    let replica_data = work.path().join("replica");
    let replica = start_replica(&engine, &replica_data, &replica_toml, &url, &endpoint);
    wait_caught_up(&http, &writer.base, &replica.base, Duration::from_secs(30));
    let applied = || -> u64 {
        let text = std::fs::read_to_string(replica_data.join("replica-manifest")).unwrap();
        serde_json::from_str::<Value>(&text).unwrap()["manifest"]
            .as_u64()
            .unwrap()
    };
    let at = applied();
    let mut written = Written::default();
    for n in 0..20u128 {
        let id = ulid_now(70_000 + n);
        let r = http
            .post(format!("{}/api/moments", writer.base))
            .json(&json!({"id": id, "text": format!("behind {n}")}))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
        written.moments.push(id);
        std::thread::sleep(Duration::from_millis(120));
    }
    wait_archived(&http, &writer.base);
    // The manifests after the one the replica applied are deleted.
    let raw = raw_store(&endpoint);
    let prefix = spark_archive::ArchiveUrl::parse(&url).unwrap().prefix;
    let next = object_store::path::Path::from(spark_archive::layout::manifest_key(&prefix, at + 1));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while runtime
        .block_on(object_store::ObjectStore::head(&raw, &next))
        .is_ok()
    {
        assert!(
            Instant::now() < deadline,
            "manifest {} never deleted",
            at + 1
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        applied(),
        at,
        "the replica polled meanwhile: make the poll slower"
    );
    wait_caught_up(&http, &writer.base, &replica.base, Duration::from_secs(40));
    assert!(every_get(&http, &writer.base, &written) == every_get(&http, &replica.base, &written));
    let log = std::fs::read_to_string(work.path().join("replica.log")).unwrap();
    assert!(
        log.contains("deleted by the archive's retention"),
        "the replica did not jump: {log}"
    );
}
