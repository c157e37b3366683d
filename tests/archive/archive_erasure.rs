//! The archive follows a compaction (SPEC section 13, `archive/ARCHIVE.md`
//! "Compaction"): the real `spark-engine` ships to a `weed mini` store
//! with `erase_after_ms = 0` and small segments; a moment with unique
//! markers (text, caption, an edit, a photo) is shipped, then deleted and
//! erased locally; the shipper moves the archive to the compacted log.
//! Then `spark-replay verify --from` passes on the whole history, a
//! restore serves the kept moments byte for byte as the original and the
//! erased one as erased, with no marker anywhere in the restored
//! directory, `audit archive` finds the local log equal to the archive,
//! and the latest manifest's objects hold no marker; the
//! superseded objects (named by older manifests only) still do, within
//! `[archive] retention_ms` (8 s here). Once it has passed, the writer's
//! retention pass has deleted them (ARCHIVE.md "Retention"): every object
//! of the archive, listed through weed's S3 API, holds no marker, the
//! kept moments still serve, `verify --from` passes and a restore of the
//! archive gives the same answers.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use serde_json::{json, Value};
use spark_archive::{ArchiveStore, StoreConfig};
use spark_test_support::search::{holds, occurrences};
use spark_test_support::weed::{KEY_ID, SECRET};

use crate::common::{replay_or_skip, ulid, ServerProcess};
use crate::s3_common::{replay, restore, unique_prefix, weed_or_skip};

/// Hang guard: a wait expected to end (never a speed check).
const HANG_GUARD: Duration = Duration::from_secs(120);

/// `[archive] retention_ms` of the test's engine: long enough for the
/// checks of the superseded objects before it passes (on a machine that
/// is not too busy), short enough to wait for.
const RETENTION_MS: u64 = 8000;

/// The parts of a moment that carry a marker.
const SUFFIXES: [&str; 4] = ["TEXT", "CAPTION", "EDIT", "PHOTO"];

/// One moment with a marker in its text, caption, an edit and a photo:
/// its id and media id.
pub(crate) async fn plant(client: &reqwest::Client, base: &str, marker: &str) -> (String, String) {
    let id = ulid();
    let r = client
        .post(format!("{base}/api/moments"))
        .json(&json!({
            "id": id,
            "client_request_id": format!("create-{}", ulid()),
            "text": format!("{marker}-TEXT"),
            "caption": format!("{marker}-CAPTION"),
            "lang": "en",
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = client
        .patch(format!("{base}/api/moments/{id}"))
        .json(&json!({"text": format!("{marker}-EDIT")}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let media_id = ulid();
    let photo = format!("\u{89}PNG fake photo bytes {marker}-PHOTO end").into_bytes();
    let r = client
        .put(format!("{base}/api/media/{media_id}"))
        .header("X-Moment-Id", &id)
        .header("X-Media-Role", "copy")
        .header("Content-Type", "image/png")
        .body(photo)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    (id, media_id)
}

/// `(status, body bytes)` of a GET.
pub(crate) async fn get(client: &reqwest::Client, url: &str) -> (u16, Vec<u8>) {
    let response = client.get(url).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.bytes().await.unwrap().to_vec())
}

pub(crate) fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

/// Every answer about the kept moments, as bytes: the page, each moment and
/// its media's bytes.
async fn answers(
    client: &reqwest::Client,
    base: &str,
    kept: &[(String, String)],
) -> Vec<(String, u16, Vec<u8>)> {
    let mut paths = vec!["/api/moments?limit=50".to_owned()];
    for (id, media_id) in kept {
        paths.extend([
            format!("/api/moments/{id}"),
            format!("/api/media/{media_id}"),
        ]);
    }
    let mut out = Vec::new();
    for path in paths {
        let (status, body) = get(client, &format!("{base}{path}")).await;
        out.push((path, status, body));
    }
    out
}

/// Waits until `GET /api/log/head` says the archive holds the head.
pub(crate) async fn wait_archived(client: &reqwest::Client, base: &str) -> u64 {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let (status, body) = get(client, &format!("{base}/api/log/head")).await;
        assert_eq!(status, 200);
        let head = json_of(&body);
        if head["archived_seq"] == head["seq"] {
            return head["seq"].as_u64().unwrap();
        }
        if Instant::now() >= deadline {
            // What the shipper says it is stuck on.
            let (_, ready) = get(client, &format!("{base}/readyz")).await;
            panic!(
                "not archived: {head}; /readyz: {}",
                String::from_utf8_lossy(&ready)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The object keys a manifest names: segments, chunks, checkpoints.
fn keys_of(manifest: &spark_archive::layout::Manifest) -> BTreeSet<String> {
    let segments = manifest.segments.iter().map(|s| s.key.clone());
    let chunks = manifest.chunks.iter().map(|c| c.key.clone());
    let checkpoints = manifest.checkpoints.iter().map(|c| c.key.clone());
    segments.chain(chunks).chain(checkpoints).collect()
}

/// Of `keys`, the ones whose object holds `marker`.
async fn holding(store: &ArchiveStore, keys: &BTreeSet<String>, marker: &str) -> Vec<String> {
    let mut out = Vec::new();
    for key in keys {
        let bytes = store.get_required(key).await.unwrap();
        if holds(&bytes, marker) {
            out.push(key.clone());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archive_follows_an_erasure_and_a_restore_serves_it() {
    let test = "the_archive_follows_an_erasure_and_a_restore_serves_it";
    if replay_or_skip(test).is_none() {
        return;
    }
    let Some(weed) = weed_or_skip(test).await else {
        return;
    };
    let endpoint = weed.endpoint();
    let url = unique_prefix("erasure");
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("original");
    let env = [
        ("SPARK_ARCHIVE_URL", url.as_str()),
        ("SPARK_ARCHIVE_ENDPOINT", endpoint.as_str()),
        ("SPARK_ARCHIVE_SHIP_INTERVAL_MS", "50"),
        ("SPARK_ARCHIVE_RETENTION_MS", "8000"),
        ("SPARK_RETENTION_ERASE_AFTER_MS", "0"),
        ("SPARK_RETENTION_CHECK_INTERVAL_MS", "200"),
        ("SPARK_LOG_SEGMENT_SIZE_BYTES", "4096"),
        ("SPARK_LOG_CHECKPOINT_INTERVAL_OPS", "4"),
        ("AWS_ACCESS_KEY_ID", KEY_ID),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
    ];
    let server = start_server(&data, &env).await;
    let base = server.base.clone();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    let kept_marker = format!("KEEPME{}", ulid());
    let gone_marker = format!("FORGETME{}", ulid());
    let mut kept = Vec::new();
    for n in 0..2 {
        kept.push(plant(&client, &base, &format!("{kept_marker}{n}")).await);
    }
    let gone = plant(&client, &base, &gone_marker).await;
    kept.push(plant(&client, &base, &format!("{kept_marker}2")).await);
    // The archive holds the moment before it is deleted: the compaction
    // then rewrites segments the archive holds.
    wait_archived(&client, &base).await;
    let store = ArchiveStore::connect(&StoreConfig {
        url: url.clone(),
        endpoint: Some(endpoint.clone()),
        region: "us-east-1".into(),
    })
    .unwrap();
    let before = store.latest_manifest().await.unwrap().unwrap();
    assert!(
        !holding(&store, &keys_of(&before), &gone_marker)
            .await
            .is_empty(),
        "the archive holds the moment's content before the delete"
    );

    let r = client
        .delete(format!("{base}/api/moments/{}", gone.0))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let deadline = Instant::now() + HANG_GUARD;
    let tombstone = loop {
        let (status, body) = get(&client, &format!("{base}/api/moments/{}", gone.0)).await;
        assert_eq!(status, 410);
        let problem = json_of(&body);
        if problem["moment"]["erased"] == true {
            break body;
        }
        if Instant::now() >= deadline {
            let (_, ready) = get(&client, &format!("{base}/readyz")).await;
            panic!(
                "not erased: {problem}; /readyz: {}",
                String::from_utf8_lossy(&ready)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let archived = wait_archived(&client, &base).await;
    // The compaction's manifest is stored: retention counts from about now.
    let compaction_archived = Instant::now();
    let original = answers(&client, &base, &kept).await;
    assert_eq!(occurrences(&data, &gone_marker), Vec::<String>::new());

    // The history: every manifest extends the one before, one of them
    // applies the compaction.
    let (code, out, err) = replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 0, "verify --from: {out}{err}");
    let latest = store.latest_manifest().await.unwrap().unwrap();
    assert!(latest.shipped_seq >= archived);
    let mut older = BTreeSet::new();
    let mut compacted = Vec::new();
    for number in 1..latest.number {
        let manifest = store.manifest(number).await.unwrap();
        compacted.extend(manifest.compactions.iter().map(|c| c.record_seq));
        older.extend(keys_of(&manifest));
    }
    compacted.extend(latest.compactions.iter().map(|c| c.record_seq));
    assert!(!compacted.is_empty(), "a manifest applies the compaction");
    assert!(
        latest.segments.iter().any(|s| s.key.contains("-c")),
        "rewritten segments under compaction keys: {:?}",
        latest.segments
    );

    // The latest manifest's objects hold no marker; the kept moments'
    // content is there.
    let latest_keys = keys_of(&latest);
    for suffix in SUFFIXES {
        let marker = format!("{gone_marker}-{suffix}");
        assert_eq!(
            holding(&store, &latest_keys, &marker).await,
            Vec::<String>::new(),
            "{marker} in an object the latest manifest names"
        );
    }
    assert!(
        !holding(&store, &latest_keys, &format!("{kept_marker}0-TEXT"))
            .await
            .is_empty()
    );
    // The superseded objects (named by older manifests only) still hold
    // it, and so does the photo's blob: removing them after
    // `[archive] retention_ms` is a later step (SPEC section 13).
    let superseded: BTreeSet<String> = older.difference(&latest_keys).cloned().collect();
    if compaction_archived.elapsed() < Duration::from_millis(RETENTION_MS / 2) {
        assert!(
            !holding(&store, &superseded, &format!("{gone_marker}-TEXT"))
                .await
                .is_empty(),
            "the superseded objects still hold the erased text within retention_ms"
        );
        // `audit erasure --from` lists them as expected within the
        // window, and as overdue for a writer that keeps nothing.
        let (code, out, err) = audit_erasure(&data, &url, &endpoint, RETENTION_MS);
        assert_eq!(code, 0, "audit erasure --from: {out}{err}");
        let listed = in_archive(&out, &gone.0);
        assert!(!listed.is_empty(), "{out}");
        assert!(
            listed.iter().all(|a| a["within_retention"] == true),
            "{out}"
        );
        let (code, out, err) = audit_erasure(&data, &url, &endpoint, 1);
        assert_eq!(code, 1, "audit erasure --from --retention-ms 1: {out}{err}");
    } else {
        eprintln!("{test}: note: too slow to see the superseded objects within retention_ms");
    }

    // A restore serves the kept moments byte for byte, the erased one
    // erased, and holds no marker.
    let restored = work.path().join("restored");
    let (code, out, err) = restore(&url, &restored, &endpoint, &[]);
    assert_eq!(code, 0, "restore: {out}{err}");
    assert_eq!(occurrences(&restored, &gone_marker), Vec::<String>::new());
    for n in 0..3 {
        let marker = format!("{kept_marker}{n}-PHOTO");
        assert!(!occurrences(&restored, &marker).is_empty(), "{marker}");
    }
    let copy = {
        let restored = restored.clone();
        tokio::task::spawn_blocking(move || ServerProcess::start(&restored))
            .await
            .unwrap()
    };
    assert_eq!(answers(&client, &copy.base, &kept).await, original);
    let (status, body) = get(&client, &format!("{}/api/moments/{}", copy.base, gone.0)).await;
    assert_eq!(status, 410);
    assert_eq!(json_of(&body)["moment"]["erased"], true);
    assert_eq!(json_of(&body), json_of(&tombstone));
    let (status, _) = get(&client, &format!("{}/api/media/{}", copy.base, gone.1)).await;
    assert_eq!(status, 410);
    copy.kill();
    assert!(server.terminate().success());
    // The compacted local log holds exactly the archived bytes.
    let (code, out, err) = replay(
        &[
            "audit",
            "archive",
            "--data",
            data.to_str().unwrap(),
            "--from",
            &url,
        ],
        &endpoint,
    );
    assert_eq!(code, 0, "audit archive: {out}{err}");

    // Once retention_ms has passed, the writer's retention pass deletes
    // every object that held the erased content: none of the archive's
    // objects, listed through the store's own API, holds a marker.
    let server = start_server(&data, &env).await;
    let base = server.base.clone();
    let prefix = spark_archive::ArchiveUrl::parse(&url).unwrap().prefix;
    let raw = spark_test_support::weed::raw_store(&endpoint);
    let deadline = Instant::now() + HANG_GUARD + Duration::from_millis(RETENTION_MS);
    let (objects, bytes) = loop {
        let listed = all_objects(&raw, &prefix).await;
        let mut holding_marker = Vec::new();
        for (key, _) in &listed {
            let object = match raw.get(&object_store::path::Path::from(key.as_str())).await {
                Ok(got) => got.bytes().await.unwrap(),
                // Deleted by the retention pass since the listing.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => panic!("{key}: {e}"),
            };
            for suffix in SUFFIXES {
                if holds(&object, &format!("{gone_marker}-{suffix}")) {
                    holding_marker.push(format!("{key} ({suffix})"));
                }
            }
        }
        if holding_marker.is_empty() {
            break (listed.len(), listed.iter().map(|(_, b)| b).sum::<u64>());
        }
        assert!(
            Instant::now() < deadline,
            "after retention_ms the archive still holds the erased content: {holding_marker:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!("{test}: after retention: {objects} objects, {bytes} bytes");
    let (code, out, err) = audit_erasure(&data, &url, &endpoint, 1);
    assert_eq!(code, 0, "audit erasure --from after retention: {out}{err}");
    assert_eq!(in_archive(&out, &gone.0), Vec::<Value>::new(), "{out}");
    let latest = store.latest_manifest().await.unwrap().unwrap();
    assert!(latest.retained_from > 1, "the floor moved: {latest:?}");
    assert!(!store
        .exists(&spark_archive::layout::manifest_key(&prefix, 1))
        .await
        .unwrap());
    // The kept moments still serve, from the original and from a restore.
    assert_eq!(answers(&client, &base, &kept).await, original);
    let (code, out, err) = replay(&["verify", "--from", &url], &endpoint);
    assert_eq!(code, 0, "verify --from after retention: {out}{err}");
    let again = work.path().join("restored-after-retention");
    let (code, out, err) = restore(&url, &again, &endpoint, &[]);
    assert_eq!(code, 0, "restore after retention: {out}{err}");
    assert_eq!(occurrences(&again, &gone_marker), Vec::<String>::new());
    let copy = {
        let again = again.clone();
        tokio::task::spawn_blocking(move || ServerProcess::start(&again))
            .await
            .unwrap()
    };
    assert_eq!(answers(&client, &copy.base, &kept).await, original);
    let (status, _) = get(&client, &format!("{}/api/moments/{}", copy.base, gone.0)).await;
    assert_eq!(status, 410);
    copy.kill();
    let status = server.terminate();
    assert!(status.success(), "the restarted writer exited {status}");
}

/// Every object under `prefix` of the test bucket, through the store's S3
/// API: key and size.
/// The real binary on `data` with `env`, started off the runtime's threads
/// (it waits for the server's ready line).
async fn start_server(data: &std::path::Path, env: &[(&str, &str)]) -> ServerProcess {
    let data = data.to_owned();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        ServerProcess::start_with_env(&data, &env)
    })
    .await
    .unwrap()
}

async fn all_objects(raw: &object_store::aws::AmazonS3, prefix: &str) -> Vec<(String, u64)> {
    use futures_util::StreamExt;
    let path = object_store::path::Path::from(prefix);
    let mut listed = raw.list(Some(&path));
    let mut out = Vec::new();
    while let Some(meta) = listed.next().await {
        let meta = meta.unwrap();
        out.push((meta.location.to_string(), meta.size));
    }
    out
}

/// `spark-replay audit erasure --json --erase-after-ms 0 --data DATA
/// --from URL --retention-ms MS`: exit code, stdout, stderr.
fn audit_erasure(
    data: &std::path::Path,
    url: &str,
    endpoint: &str,
    retention_ms: u64,
) -> (i32, String, String) {
    let retention = retention_ms.to_string();
    replay(
        &[
            "audit",
            "erasure",
            "--json",
            "--erase-after-ms",
            "0",
            "--data",
            data.to_str().unwrap(),
            "--from",
            url,
            "--retention-ms",
            &retention,
        ],
        endpoint,
    )
}

/// The archive objects `audit erasure --json` lists for moment `id`.
fn in_archive(out: &str, id: &str) -> Vec<Value> {
    let doc: Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
    doc["moments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("{id} not in {out}"))["remaining"]["archive"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}
