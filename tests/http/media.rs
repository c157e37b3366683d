//! Uploads that answer by content, and downloads that never pass off a
//! damaged blob as good (SPEC section 4, DESIGN.md "Media").

use crate::common;

use std::sync::Arc;

use common::{log_records, settings, ulid, TestServer};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

async fn put(
    server: &TestServer,
    media_id: &str,
    moment_id: &str,
    role: &str,
    bytes: Vec<u8>,
    extra: &[(&str, &str)],
) -> (u16, Value) {
    let mut request = server
        .client
        .put(server.url(&format!("/api/media/{media_id}")))
        .header("X-Moment-Id", moment_id)
        .header("X-Media-Role", role)
        .header("Content-Type", "image/jpeg")
        .body(bytes);
    for (k, v) in extra {
        request = request.header(*k, *v);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Starts a practical turn on moment `m` with `request_id` and waits until
/// it is done.
async fn practical_turn_done(server: &TestServer, m: &str, request_id: &str) {
    let (s, v) = server
        .post(
            &format!("/api/moments/{m}/turns"),
            json!({"client_request_id": request_id, "mode": "practical"}),
        )
        .await;
    assert_eq!(s, 202, "{v}");
    let turn = v["turn"]["id"].as_str().unwrap().to_owned();
    let (_, done) = server.get(&format!("/api/turns/{turn}?wait=20")).await;
    assert_eq!(done["status"], "done", "{done}");
}

async fn moment(server: &TestServer) -> String {
    let id = ulid();
    let (s, _) = server
        .post("/api/moments", json!({"id": id, "text": "Kein Zutritt"}))
        .await;
    assert_eq!(s, 201);
    id
}

#[tokio::test]
async fn uploads_answer_by_content() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let m = moment(&server).await;
    let copy = ulid();
    let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let digest = sha(&bytes);

    let (s, v) = put(
        &server,
        &copy,
        &m,
        "copy",
        bytes.clone(),
        &[("X-Content-SHA256", &digest)],
    )
    .await;
    assert_eq!((s, v["created"].clone()), (201, json!(true)), "{v}");
    let media = &v["media"];
    assert_eq!(media["id"], copy.as_str());
    assert_eq!(media["moment_id"], m.as_str());
    assert_eq!(media["role"], "copy");
    assert_eq!(media["sha256"], digest.as_str());
    assert_eq!(media["size"], 100_000);
    assert_eq!(media["content_type"], "image/jpeg");

    // Replays: same bytes answer with the record; other bytes are refused.
    let (s, v) = put(
        &server,
        &copy.to_lowercase(),
        &m,
        "copy",
        bytes.clone(),
        &[],
    )
    .await;
    assert_eq!(
        (s, v["created"].clone(), v["media"]["id"].clone()),
        (200, json!(false), json!(copy))
    );
    let mut other = bytes.clone();
    other[500] ^= 1;
    let (s, v) = put(&server, &copy, &m, "copy", other.clone(), &[]).await;
    assert_eq!((s, v["code"].clone()), (409, json!("conflict")));
    let detail = v["detail"].as_str().unwrap();
    assert!(
        detail.contains(&digest) && detail.contains(&sha(&other)),
        "names both hashes: {detail}"
    );

    // One media per role; the other role is free.
    let (s, v) = put(&server, &ulid(), &m, "copy", b"another copy".to_vec(), &[]).await;
    assert_eq!((s, v["code"].clone()), (409, json!("conflict")));
    let original = ulid();
    let (s, _) = put(&server, &original, &m, "original", vec![1u8; 3000], &[]).await;
    assert_eq!(s, 201);

    // The moment lists its media and counts them in its version.
    let (_, got) = server.get(&format!("/api/moments/{m}")).await;
    let listed: Vec<_> = got["media"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].clone())
        .collect();
    assert_eq!(listed, vec![json!(copy), json!(original)]);
    assert_eq!(got["version"], 3);
    assert_eq!(got["media"][0]["sha256"], digest.as_str());

    // Bad input writes nothing (on a moment with free roles).
    let m = moment(&server).await;
    let wrong = sha(b"something else");
    let (s, v) = put(
        &server,
        &ulid(),
        &m,
        "copy",
        bytes.clone(),
        &[("X-Content-SHA256", &wrong)],
    )
    .await;
    assert_eq!((s, v["code"].clone()), (400, json!("digest_mismatch")));
    let (s, v) = put(&server, &ulid(), &m, "thumbnail", bytes.clone(), &[]).await;
    assert_eq!((s, v["code"].clone()), (400, json!("invalid_request")));
    let (s, v) = put(&server, "not-a-ulid", &m, "copy", bytes.clone(), &[]).await;
    assert_eq!((s, v["code"].clone()), (400, json!("invalid_id")));
    let (s, v) = put(&server, &ulid(), &ulid(), "copy", bytes.clone(), &[]).await;
    assert_eq!((s, v["code"].clone()), (404, json!("not_found")));
    let (s, v) = put(
        &server,
        &ulid(),
        &m,
        "copy",
        bytes.clone(),
        &[("X-Content-SHA256", "xyz")],
    )
    .await;
    assert_eq!((s, v["code"].clone()), (400, json!("invalid_request")));
    let dead = moment(&server).await;
    server
        .call("DELETE", &format!("/api/moments/{dead}"), None, &[])
        .await;
    let (s, v) = put(&server, &ulid(), &dead, "copy", bytes.clone(), &[]).await;
    assert_eq!((s, v["code"].clone()), (410, json!("deleted")));
    server.stop().await;
    let records = log_records(dir.path());
    let puts = records.iter().filter(|(_, kind)| *kind == 4).count();
    assert_eq!(puts, 2, "one media.put per stored media");
    // No blob was kept for refused uploads: exactly the two stored ones.
    let blobs = std::fs::read_dir(dir.path().join("media/blobs"))
        .unwrap()
        .count();
    assert_eq!(blobs, 2);
    assert_eq!(
        std::fs::read_dir(dir.path().join("media/tmp"))
            .unwrap()
            .count(),
        0
    );
}

#[tokio::test]
async fn over_the_limit_is_413_and_keeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.limits.media_limit_bytes = 10_000;
    let server = TestServer::start_with(s).await;
    let m = moment(&server).await;
    let (status, v) = put(&server, &ulid(), &m, "copy", vec![0u8; 10_001], &[]).await;
    assert_eq!((status, v["code"].clone()), (413, json!("too_large")));
    // Without Content-Length (a chunked stream), the limit still holds.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..20).map(|_| Ok(vec![7u8; 1000])).collect();
    let response = server
        .client
        .put(server.url(&format!("/api/media/{}", ulid())))
        .header("X-Moment-Id", &m)
        .header("X-Media-Role", "copy")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    assert_eq!(response.headers()["connection"], "close");
    let (status, _) = put(&server, &ulid(), &m, "copy", vec![0u8; 10_000], &[]).await;
    assert_eq!(status, 201, "exactly the limit is accepted");
    server.stop().await;
    assert_eq!(
        std::fs::read_dir(dir.path().join("media/tmp"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("media/blobs"))
            .unwrap()
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_uploads_of_one_id_make_one_op() {
    let dir = tempfile::tempdir().unwrap();
    let server = Arc::new(TestServer::start(dir.path()).await);
    let m = moment(&server).await;
    let id = ulid();
    let bytes = vec![42u8; 200_000];
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let server = Arc::clone(&server);
        let (id, m, bytes) = (id.clone(), m.clone(), bytes.clone());
        tasks.push(tokio::spawn(async move {
            put(&server, &id, &m, "copy", bytes, &[]).await
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        let (s, v) = t.await.unwrap();
        assert_eq!(v["media"]["id"], id.as_str());
        statuses.push(s);
    }
    assert_eq!(
        statuses.iter().filter(|&&s| s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        15,
        "{statuses:?}"
    );
    Arc::into_inner(server).unwrap().stop().await;
    assert_eq!(
        log_records(dir.path())
            .iter()
            .filter(|(_, k)| *k == 4)
            .count(),
        1
    );
}

#[tokio::test]
async fn downloads_with_etag_ranges_and_damage_checks() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let m = moment(&server).await;
    let id = ulid();
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    put(&server, &id, &m, "copy", bytes.clone(), &[]).await;
    let url = server.url(&format!("/api/media/{id}"));

    let r = server.client.get(&url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let etag = r.headers()["etag"].to_str().unwrap().to_owned();
    assert_eq!(etag, format!("\"{}\"", sha(&bytes)));
    assert_eq!(r.headers()["content-type"], "image/jpeg");
    assert_eq!(r.headers()["content-length"], "300000");
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert_eq!(r.bytes().await.unwrap().as_ref(), bytes.as_slice());

    let r = server
        .client
        .get(&url)
        .header("If-None-Match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 304);
    let r = server
        .client
        .get(&url)
        .header("Range", "bytes=100-199")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 206);
    assert_eq!(r.headers()["content-range"], "bytes 100-199/300000");
    assert_eq!(r.bytes().await.unwrap().as_ref(), &bytes[100..200]);
    let r = server
        .client
        .get(&url)
        .header("Range", "bytes=-10")
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap().as_ref(), &bytes[299_990..]);
    let r = server
        .client
        .get(&url)
        .header("Range", "bytes=300000-")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 416);
    assert_eq!(r.headers()["content-range"], "bytes */300000");
    // If-Range (RFC 9110 section 13.1.5): the range only for this blob's
    // strong tag; any other validator gets the whole blob.
    for (validator, status) in [(etag.as_str(), 206), ("\"nope\"", 200)] {
        let r = server
            .client
            .get(&url)
            .header("Range", "bytes=0-9")
            .header("If-Range", validator)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "If-Range: {validator}");
        let body = r.bytes().await.unwrap();
        let want = if status == 206 {
            &bytes[..10]
        } else {
            &bytes[..]
        };
        assert_eq!(body.as_ref(), want, "If-Range: {validator}");
    }
    let r = server.client.head(&url).send().await.unwrap();
    assert_eq!(
        (
            r.status().as_u16(),
            r.headers()["content-length"].to_str().unwrap()
        ),
        (200, "300000")
    );
    let r = server
        .client
        .get(server.url(&format!("/api/media/{}", ulid())))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    // Flip one byte of the blob on disk: a whole download is cut off rather
    // than delivered as good, and a range is refused.
    let blob = dir.path().join("media/blobs").join(sha(&bytes));
    let mut on_disk = std::fs::read(&blob).unwrap();
    on_disk[250_000] ^= 0x01;
    std::fs::write(&blob, &on_disk).unwrap();
    let r = server.client.get(&url).send().await.unwrap();
    assert!(
        r.bytes().await.is_err(),
        "a damaged blob must not arrive whole"
    );
    let r = server
        .client
        .get(&url)
        .header("Range", "bytes=0-9")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 500);
    // A blob of the wrong size is refused before a byte is sent.
    std::fs::write(&blob, &on_disk[..1000]).unwrap();
    let r = server.client.get(&url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 500);
    server.stop().await;
}

/// Every file under the media store (blobs and temporary files).
fn media_files(data: &std::path::Path) -> Vec<std::path::PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&spark_engine::media::media_dir(data), &mut out);
    out
}

#[tokio::test]
async fn an_empty_upload_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let m = moment(&server).await;
    let records = log_records(dir.path()).len();
    // As curl sends a file that does not exist: Content-Length: 0.
    let (s, v) = put(&server, &ulid(), &m, "original", Vec::new(), &[]).await;
    assert_eq!(
        (s, v["code"].clone()),
        (400, json!("invalid_request")),
        "{v}"
    );
    assert!(v["detail"].as_str().unwrap().contains("empty"), "{v}");
    // Chunked, with no length: found empty once read.
    let empty = futures_util::stream::iter(Vec::<Result<Vec<u8>, std::io::Error>>::new());
    let response = server
        .client
        .put(server.url(&format!("/api/media/{}", ulid())))
        .header("X-Moment-Id", &m)
        .header("X-Media-Role", "original")
        .header("Content-Type", "image/jpeg")
        .body(reqwest::Body::wrap_stream(empty))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let v: Value = response.json().await.unwrap();
    assert_eq!(
        (status, v["code"].clone()),
        (400, json!("invalid_request")),
        "{v}"
    );
    // Nothing written: no op, no blob, no temporary file.
    assert_eq!(log_records(dir.path()).len(), records);
    assert_eq!(media_files(dir.path()), Vec::<std::path::PathBuf>::new());
    let (s, v) = server.get(&format!("/api/moments/{m}")).await;
    assert_eq!(s, 200);
    assert_eq!(v["media"], json!([]), "{v}");
    server.stop().await;
}

/// An upload is never served as a document of the engine's origin: every
/// media answer carries a `sandbox` policy that runs no script, and what
/// is not a raster image is an attachment (stored XSS through an uploaded
/// `text/html` or SVG, found by a newcomer's break test, 2026-12-04). A
/// photo is still shown inline.
#[tokio::test]
async fn uploads_are_never_served_as_an_active_document() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    for (role, content_type, inline) in [
        ("copy", "text/html; charset=utf-8", false),
        ("original", "image/svg+xml", false),
        ("copy", "application/javascript", false),
        ("original", "image/PNG", true),
    ] {
        let m = moment(&server).await;
        let id = ulid();
        let body =
            format!("<script>fetch('/api/moments',{{method:'POST'}})</script>{content_type}");
        let r = server
            .client
            .put(server.url(&format!("/api/media/{id}")))
            .header("X-Moment-Id", &m)
            .header("X-Media-Role", role)
            .header("Content-Type", content_type)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "{content_type}");
        for range in [None, Some("bytes=0-3")] {
            let mut request = server.client.get(server.url(&format!("/api/media/{id}")));
            if let Some(range) = range {
                request = request.header("Range", range);
            }
            let r = request.send().await.unwrap();
            assert!(r.status().is_success(), "{content_type}");
            let headers = r.headers();
            assert_eq!(headers["content-type"], content_type);
            assert_eq!(
                headers["content-security-policy"], "default-src 'none'; sandbox",
                "{content_type}"
            );
            assert_eq!(headers["x-content-type-options"], "nosniff");
            assert_eq!(
                headers
                    .get("content-disposition")
                    .map(|v| v.to_str().unwrap()),
                (!inline).then_some("attachment"),
                "{content_type}"
            );
        }
    }
    server.stop().await;
}

/// Issue 27: a moment holds up to 10 photos (`X-Photo` 0 to 9), each with
/// one copy and one original. Each upload keeps its photo number through a
/// restart; a taken photo role, a known media id under another photo and a
/// bad `X-Photo` are refused and write nothing; the brain reads every
/// photo's copy, in photo order whatever the upload order.
#[tokio::test]
async fn a_moment_holds_several_photos() {
    use spark_engine::brain::scripted::ScriptedBrain;

    let dir = tempfile::tempdir().unwrap();
    let brain = ScriptedBrain::echo();
    let server = TestServer::start_with_brains(
        settings(dir.path()),
        vec![("pippa", Arc::new(brain.clone()) as Arc<_>)],
    )
    .await;
    let m = moment(&server).await;
    // Photo 2 first, then photo 0 (no header), then photo 1: upload order
    // is not photo order.
    let mut uploads = Vec::new();
    for (photo, header) in [(2u8, Some("2")), (0, None), (1, Some("1"))] {
        for role in ["copy", "original"] {
            let id = ulid();
            let bytes = format!("{role} of photo {photo}").into_bytes();
            let extra: Vec<(&str, &str)> = header.map(|h| ("X-Photo", h)).into_iter().collect();
            let (s, v) = put(&server, &id, &m, role, bytes, &extra).await;
            assert_eq!(s, 201, "{v}");
            assert_eq!(v["media"]["photo"], photo, "{v}");
            assert_eq!(v["media"]["role"], role);
            uploads.push((id, photo, role));
        }
    }

    // Another upload of the copy role, as photo `photo`.
    let copy_as = |id: String, photo: &'static str, bytes: &'static [u8]| {
        let (server, m) = (&server, m.clone());
        async move {
            put(
                server,
                &id,
                &m,
                "copy",
                bytes.to_vec(),
                &[("X-Photo", photo)],
            )
            .await
        }
    };
    // A photo's role holds one media: 409 naming the photo.
    let (s, v) = copy_as(ulid(), "1", b"late").await;
    assert_eq!(
        (s, v["conflict"].clone(), v["photo"].clone()),
        (409, json!("media_role"), json!(1)),
        "{v}"
    );
    assert_eq!(v["media_id"], uploads[4].0.as_str());
    // A known media id under another photo: 409 media_owner.
    let id = uploads[0].0.clone();
    let (s, v) = copy_as(id.clone(), "3", b"copy of photo 2").await;
    assert_eq!(
        (s, v["conflict"].clone(), v["photo"].clone()),
        (409, json!("media_owner"), json!(2)),
        "{v}"
    );
    // The same upload again (same id, photo and bytes) answers 200.
    let (s, v) = copy_as(id, "2", b"copy of photo 2").await;
    assert_eq!((s, v["created"].clone()), (200, json!(false)), "{v}");
    // X-Photo outside 0..=9, or not a plain number: 400, nothing written
    // (white space around a header value is not part of it, RFC 9110).
    for bad in ["10", "-1", "+1", "1.0", "one", "1 2", "", "256", "99999"] {
        let (s, v) = copy_as(ulid(), bad, b"x").await;
        assert_eq!(
            (s, v["code"].clone()),
            (400, json!("invalid_request")),
            "X-Photo {bad:?}: {v}"
        );
    }
    // X-Photo on two lines with different values: 400 naming it; a long
    // bad value is quoted short.
    let (s, v) = put(
        &server,
        &ulid(),
        &m,
        "copy",
        b"x".to_vec(),
        &[("X-Photo", "3"), ("X-Photo", "4")],
    )
    .await;
    assert_eq!(
        (s, v["code"].clone()),
        (400, json!("invalid_request")),
        "{v}"
    );
    assert!(v["detail"].as_str().unwrap().contains("x-photo"), "{v}");
    let long = "7".repeat(20_000);
    let (s, v) = put(
        &server,
        &ulid(),
        &m,
        "copy",
        b"x".to_vec(),
        &[("X-Photo", &long)],
    )
    .await;
    assert_eq!(s, 400);
    assert!(v["detail"].as_str().unwrap().len() < 200, "{v}");

    // The brain reads the three copies in photo order.
    practical_turn_done(&server, &m, "photos-turn").await;
    let asked = brain.requests();
    let copies: Vec<String> = asked[0]
        .copies
        .iter()
        .map(|c| String::from_utf8(c.bytes.clone()).unwrap())
        .collect();
    assert_eq!(
        copies,
        ["copy of photo 0", "copy of photo 1", "copy of photo 2"]
    );

    // After a restart (the log replayed), the moment lists its media in
    // upload order, each with its photo.
    server.stop().await;
    let server = TestServer::start(dir.path()).await;
    let (_, got) = server.get(&format!("/api/moments/{m}")).await;
    let listed: Vec<(String, u64, String)> = got["media"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["id"].as_str().unwrap().to_owned(),
                x["photo"].as_u64().unwrap(),
                x["role"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, u64, String)> = uploads
        .iter()
        .map(|(id, photo, role)| (id.clone(), u64::from(*photo), (*role).to_owned()))
        .collect();
    assert_eq!(listed, expected);
    assert_eq!(
        got["version"],
        1 + 6 + 1,
        "the create, six uploads, the turn"
    );
    server.stop().await;
    let puts = log_records(dir.path())
        .iter()
        .filter(|(_, kind)| *kind == 4)
        .count();
    assert_eq!(puts, 6, "one media.put per stored media, none for refusals");
}

/// `brains.copies_max_bytes`: the first photo's copy is always read; a
/// later one only while the copies taken and it stay within the limit, so
/// a turn of ten large copies does not hold them all in memory.
#[tokio::test]
async fn a_turn_reads_copies_within_brains_copies_max_bytes() {
    use spark_engine::brain::scripted::ScriptedBrain;

    let dir = tempfile::tempdir().unwrap();
    let brain = ScriptedBrain::echo();
    let mut settings = settings(dir.path());
    settings.brains.copies_max_bytes = 1000;
    let server =
        TestServer::start_with_brains(settings, vec![("pippa", Arc::new(brain.clone()) as Arc<_>)])
            .await;
    let m = moment(&server).await;
    // Photo 0 and 1 of 600 bytes, photo 2 of 300: 0 and 2 fit, 1 does not.
    for (photo, size) in [("0", 600usize), ("1", 600), ("2", 300)] {
        let bytes = vec![photo.as_bytes()[0]; size];
        let (s, v) = put(&server, &ulid(), &m, "copy", bytes, &[("X-Photo", photo)]).await;
        assert_eq!(s, 201, "{v}");
    }
    practical_turn_done(&server, &m, "budget-turn").await;
    let read: Vec<(u8, usize)> = brain.requests()[0]
        .copies
        .iter()
        .map(|c| (c.bytes[0], c.bytes.len()))
        .collect();
    assert_eq!(read, [(b'0', 600), (b'2', 300)]);
    server.stop().await;
}
