//! The web (SPEC section 12): the numbers the TypeScript client
//! reads from the OpenAPI document, the page and its assets (embedded,
//! fresh, served with types and ETags), and browser sessions (the cookie,
//! same-origin writes, expiry and revocation).

use crate::common;
use serde_json::Value;
use spark_engine::api::openapi::document;

use common::{settings, ulid, TestServer};
use serde_json::json;
use sha2::{Digest, Sha256};
use spark_engine::api::web::{sources_sha256, DIST};
use spark_engine::config::TokenEntry;

/// `info.x-spark-message-clock` in `src/api/openapi.json`, which the
/// TypeScript client's generated `rules.ts` is made from, says what
/// `spark_core::wire` says: the clock window and the reuse margin (SPEC
/// sections 5 and 6) live once, in Rust, and the document carries them.
#[test]
fn the_documented_message_clock_is_the_wire_constants() {
    let doc: Value = serde_json::from_str(document()).expect("the document is JSON");
    let clock = &doc["info"]["x-spark-message-clock"];
    assert_eq!(
        clock["window_ms"].as_u64(),
        Some(spark_core::wire::CLOCK_WINDOW_MS),
        "window_ms"
    );
    assert_eq!(
        clock["reuse_margin_ms"].as_u64(),
        Some(spark_core::wire::REUSE_MARGIN_MS),
        "reuse_margin_ms"
    );
}

const TOKEN: &str = "spk_web_test_token";
const OTHER_TOKEN: &str = "spk_web_test_token_2";

fn with_tokens(dir: &std::path::Path, ttl_ms: u64) -> spark_engine::Settings {
    let mut s = settings(dir);
    s.access.session_ttl_ms = ttl_ms;
    for (device, token) in [("browser", TOKEN), ("tablet", OTHER_TOKEN)] {
        s.access.tokens.push(TokenEntry {
            device: device.into(),
            sha256: hex::encode(Sha256::digest(token.as_bytes())),
        });
    }
    s
}

/// The committed build in `web/dist/` is the build of the committed
/// sources: `web/build.mjs` writes a SHA-256 over `web/page/` and
/// `web/client/src/` (and the lockfile and itself) into `manifest.json`;
/// this recomputes it in Rust, so a source changed without `npm run build`
/// fails here, with no Node needed. And the binary embeds exactly the
/// files of `web/dist/`.
#[test]
fn the_committed_page_build_is_fresh() {
    let web = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web");
    let manifest: Value = serde_json::from_slice(
        DIST.get_file("manifest.json")
            .expect("web/dist/manifest.json is embedded")
            .contents(),
    )
    .unwrap();
    let recorded = manifest["sources_sha256"].as_str().unwrap();
    let now = sources_sha256(&web).expect("the page's sources read");
    assert_eq!(
        recorded, now,
        "web/dist/ is stale: its sources changed since it was built; run `npm ci && npm run build` in web/ \
         (after `npm ci` in web/client/) and commit web/dist/"
    );
    for file in manifest["files"].as_array().unwrap() {
        let name = file.as_str().unwrap();
        let embedded = DIST.get_file(name).expect("listed files are embedded");
        let on_disk = std::fs::read(web.join("dist").join(name)).unwrap();
        assert!(
            embedded.contents() == on_disk.as_slice(),
            "{name}: the binary embeds another build than web/dist/ (rebuild the crate)"
        );
    }
}

/// Changing any source byte changes the recorded hash (so the test above
/// can fail).
#[test]
fn the_source_hash_covers_the_sources() {
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path();
    for rel in ["page/src", "client/src"] {
        std::fs::create_dir_all(web.join(rel)).unwrap();
    }
    std::fs::write(web.join("page/index.html"), "<!doctype html>").unwrap();
    std::fs::write(web.join("page/src/main.ts"), "main()").unwrap();
    std::fs::write(web.join("client/src/index.ts"), "export {}").unwrap();
    std::fs::write(web.join("client/package-lock.json"), "{}").unwrap();
    std::fs::write(web.join("build.mjs"), "build()").unwrap();
    let first = sources_sha256(web).unwrap();
    std::fs::write(web.join("client/src/index.ts"), "export {};").unwrap();
    let second = sources_sha256(web).unwrap();
    assert_ne!(first, second);
    std::fs::write(web.join("page/src/extra.ts"), "").unwrap();
    assert_ne!(second, sources_sha256(web).unwrap(), "a new file counts");
}

/// `GET /` and `GET /assets/{name}`: the embedded files with their media
/// types, a strong ETag that `If-None-Match` answers `304` to, `no-cache`,
/// and a content security policy on the page; unknown names and other
/// methods are refused as problems.
#[tokio::test]
async fn the_page_and_its_assets_are_served_with_types_and_etags() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    for (path, file, content_type) in [
        ("/", "index.html", "text/html; charset=utf-8"),
        (
            "/assets/app.js",
            "assets/app.js",
            "text/javascript; charset=utf-8",
        ),
        (
            "/assets/app.css",
            "assets/app.css",
            "text/css; charset=utf-8",
        ),
        ("/assets/icon.svg", "assets/icon.svg", "image/svg+xml"),
        ("/assets/icon-192.png", "assets/icon-192.png", "image/png"),
        ("/assets/icon-512.png", "assets/icon-512.png", "image/png"),
        (
            "/assets/icon-maskable-512.png",
            "assets/icon-maskable-512.png",
            "image/png",
        ),
        (
            "/assets/apple-touch-icon.png",
            "assets/apple-touch-icon.png",
            "image/png",
        ),
        ("/sw.js", "sw.js", "text/javascript; charset=utf-8"),
        (
            "/app.webmanifest",
            "app.webmanifest",
            "application/manifest+json",
        ),
    ] {
        let answer = server.client.get(server.url(path)).send().await.unwrap();
        assert_eq!(answer.status(), 200, "{path}");
        let headers = answer.headers().clone();
        assert_eq!(headers["content-type"], content_type, "{path}");
        assert_eq!(headers["cache-control"], "no-cache");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        let body = answer.bytes().await.unwrap();
        assert_eq!(&body[..], DIST.get_file(file).unwrap().contents(), "{path}");
        let etag = headers["etag"].to_str().unwrap().to_owned();
        assert_eq!(etag, format!("\"{}\"", hex::encode(Sha256::digest(&body))));
        if path == "/" {
            let csp = headers["content-security-policy"].to_str().unwrap();
            assert!(csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"));
            let html = String::from_utf8(body.to_vec()).unwrap();
            assert!(
                html.contains(r#"<input id="capture-file" type="file" accept="image/*" capture"#)
            );
            assert!(html.contains("/assets/app.js"));
        }
        let again = server
            .client
            .get(server.url(path))
            .header("If-None-Match", &etag)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), 304, "{path}");
        assert_eq!(again.headers()["etag"].to_str().unwrap(), etag);
        assert!(again.bytes().await.unwrap().is_empty());
    }
    for path in [
        "/assets/nope.js",
        "/assets/..%2Fmanifest.json",
        "/assets/.hidden",
        "/manifest.json",
        "/sw.js/x",
        "/assets/sw.js",
    ] {
        let (status, body, _) = server.call("GET", path, None, &[]).await;
        assert_eq!(status, 404, "{path}");
        assert_eq!(body["code"], "not_found", "{path}");
    }
    let (status, body, _) = server.call("POST", "/", Some(json!({})), &[]).await;
    assert_eq!(status, 405);
    assert_eq!(body["code"], "invalid_request");
    server.stop().await;
}

/// The shell the service worker keeps, read off the built `sw.js`
/// (`["/path","<SHA-256 hex>"]` pairs, as `web/build.mjs` writes them).
fn worker_shell() -> Vec<(String, String)> {
    let worker = std::str::from_utf8(DIST.get_file("sw.js").unwrap().contents()).unwrap();
    let mut shell = Vec::new();
    for part in worker.split("[\"/").skip(1) {
        let Some((path, rest)) = part.split_once("\",\"") else {
            continue;
        };
        let Some((sha256, _)) = rest.split_once("\"]") else {
            continue;
        };
        if sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            shell.push((format!("/{path}"), sha256.to_owned()));
        }
    }
    shell
}

/// `GET /sw.js` is the service worker at the root scope
/// (`Service-Worker-Allowed: /`, `no-cache` so a new build is seen at
/// once), and the shell it keeps is exactly the page's built files but the
/// worker itself and the build record, each with the SHA-256 of the bytes
/// the engine serves there: what the worker checks at install, so a worker
/// never caches a build the engine does not serve. No `/api/` path is in
/// it (the worker never keeps an answer of the engine's API).
#[tokio::test]
async fn the_service_worker_is_served_at_the_root_and_keeps_the_served_shell() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let answer = server
        .client
        .get(server.url("/sw.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["service-worker-allowed"], "/");
    assert_eq!(answer.headers()["cache-control"], "no-cache");
    assert_eq!(
        answer.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );

    let shell = worker_shell();
    let mut paths: Vec<&str> = shell.iter().map(|(p, _)| p.as_str()).collect();
    paths.sort_unstable();
    let manifest: Value =
        serde_json::from_slice(DIST.get_file("manifest.json").unwrap().contents()).unwrap();
    let mut built: Vec<String> = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .filter(|f| *f != "sw.js")
        .map(|f| {
            if f == "index.html" {
                "/".to_owned()
            } else {
                format!("/{f}")
            }
        })
        .collect();
    built.sort_unstable();
    assert_eq!(paths, built, "the worker keeps every built file but itself");
    assert!(paths.iter().all(|p| !p.starts_with("/api/")), "{paths:?}");
    for (path, sha256) in &shell {
        let answer = server.client.get(server.url(path)).send().await.unwrap();
        assert_eq!(answer.status(), 200, "{path}");
        let body = answer.bytes().await.unwrap();
        assert_eq!(&hex::encode(Sha256::digest(&body)), sha256, "{path}");
    }
    assert_eq!(
        manifest["shell_version"].as_str().map(str::len),
        Some(16),
        "the cache's version"
    );
    server.stop().await;
}

/// `GET /app.webmanifest`: an installable web app manifest (name,
/// `start_url` and `scope` `/`, `display: standalone`, colours) whose icons
/// the engine serves with their declared types, among them PNGs of 192 and
/// 512 px and a maskable one; the page links it.
#[tokio::test]
async fn the_web_app_manifest_names_served_icons() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let answer = server
        .client
        .get(server.url("/app.webmanifest"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.headers()["content-type"],
        "application/manifest+json"
    );
    let manifest: Value = answer.json().await.unwrap();
    assert_eq!(manifest["name"], "Spark");
    assert_eq!(manifest["start_url"], "/");
    assert_eq!(manifest["scope"], "/");
    assert_eq!(manifest["display"], "standalone");
    for colour in ["theme_color", "background_color"] {
        let c = manifest[colour].as_str().unwrap();
        assert!(c.len() == 7 && c.starts_with('#'), "{colour}: {c}");
    }
    let mut sizes = Vec::new();
    for icon in manifest["icons"].as_array().unwrap() {
        let src = icon["src"].as_str().unwrap();
        let answer = server.client.get(server.url(src)).send().await.unwrap();
        assert_eq!(answer.status(), 200, "{src}");
        assert_eq!(
            answer.headers()["content-type"],
            icon["type"].as_str().unwrap(),
            "{src}"
        );
        let body = answer.bytes().await.unwrap();
        if icon["type"] == "image/png" {
            // The PNG's IHDR width and height are its declared size.
            let (w, h) = (
                u32::from_be_bytes(body[16..20].try_into().unwrap()),
                u32::from_be_bytes(body[20..24].try_into().unwrap()),
            );
            assert_eq!(icon["sizes"], format!("{w}x{h}"), "{src}");
        }
        sizes.push(format!(
            "{} {}",
            icon["sizes"].as_str().unwrap(),
            icon["purpose"].as_str().unwrap_or("any")
        ));
    }
    for needed in ["192x192 any", "512x512 any", "512x512 maskable"] {
        assert!(sizes.iter().any(|s| s == needed), "{needed}: {sizes:?}");
    }
    let page = server.client.get(server.url("/")).send().await.unwrap();
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"<link rel="manifest" href="/app.webmanifest">"#));
    server.stop().await;
}

/// A new session made with `token`: its cookie pair (`spark_session=…`).
async fn new_session(server: &TestServer, token: &str) -> String {
    let bearer = format!("Bearer {token}");
    let (status, _, headers) = server
        .call("POST", "/api/session", None, &[("Authorization", &bearer)])
        .await;
    assert_eq!(status, 201);
    cookie_of(&headers).0
}

fn cookie_of(headers: &reqwest::header::HeaderMap) -> (String, String) {
    let set = headers["set-cookie"].to_str().unwrap().to_owned();
    let pair = set.split(';').next().unwrap().trim().to_owned();
    (pair, set)
}

/// `POST /api/session` with the token sets an `HttpOnly; SameSite=Strict`
/// cookie (`Secure` behind TLS) that the page, the event stream and media
/// downloads use; the page itself needs no token.
#[tokio::test]
async fn a_token_is_exchanged_for_a_session_cookie_that_reads_streams_and_downloads() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(with_tokens(dir.path(), 60_000)).await;
    // The page answers without a token, so that it can ask for one.
    let (status, _, _) = server.call("GET", "/", None, &[]).await;
    assert_eq!(status, 200);
    let (status, _, _) = server.call("GET", "/assets/app.js", None, &[]).await;
    assert_eq!(status, 200);
    let (status, body, _) = server.call("GET", "/api/log/head", None, &[]).await;
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));

    let bearer = format!("Bearer {TOKEN}");
    let (status, body, headers) = server
        .call("POST", "/api/session", None, &[("Authorization", &bearer)])
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["device"], "browser");
    assert!(body["expires_at"].is_string());
    let (cookie, set) = cookie_of(&headers);
    assert!(cookie.starts_with("spark_session="));
    assert_eq!(cookie.len(), "spark_session=".len() + 43);
    assert!(!cookie.contains(TOKEN), "the cookie is not the token");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=60"] {
        assert!(set.contains(attribute), "{attribute} in {set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: no Secure");
    assert_eq!(headers["cache-control"], "no-store");

    // Behind TLS the cookie is Secure.
    let (_, _, tls) = server
        .call(
            "POST",
            "/api/session",
            None,
            &[("Authorization", &bearer), ("X-Forwarded-Proto", "https")],
        )
        .await;
    assert!(cookie_of(&tls).1.ends_with("; Secure"));

    // Reads with the cookie.
    let (status, _, _) = server
        .call("GET", "/api/log/head", None, &[("Cookie", &cookie)])
        .await;
    assert_eq!(status, 200);
    // A write from the page (same-origin Origin), and its media download.
    let origin = server.base.clone();
    let moment = ulid();
    let (status, body, _) = server
        .call(
            "POST",
            "/api/moments",
            Some(json!({"id": moment})),
            &[("Cookie", &cookie), ("Origin", &origin)],
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let media = ulid();
    let upload = server
        .client
        .put(server.url(&format!("/api/media/{media}")))
        .header("Cookie", &cookie)
        .header("X-Spark-Client", "web")
        .header("X-Moment-Id", &moment)
        .header("X-Media-Role", "copy")
        .header("Content-Type", "image/jpeg")
        .body(b"jpeg bytes".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status(), 201);
    let download = server
        .client
        .get(server.url(&format!("/api/media/{media}")))
        .header("Cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(download.status(), 200);
    assert_eq!(&download.bytes().await.unwrap()[..], b"jpeg bytes");
    // The event stream with the cookie.
    let mut stream = server
        .client
        .get(server.url("/api/events?after=0"))
        .header("Cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert!(stream.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let first = tokio::time::timeout(std::time::Duration::from_secs(30), stream.chunk())
        .await
        .expect("an event arrives")
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first).contains("moment.create"));
    drop(stream);
    // The ops record the token's device.
    let (_, moment_body, _) = server
        .call(
            "GET",
            &format!("/api/moments/{moment}"),
            None,
            &[("Cookie", &cookie)],
        )
        .await;
    assert_eq!(moment_body["id"], moment);
    server.stop().await;
}

/// A write with the cookie alone is taken only from the page: a
/// cross-site `Origin` is `403 forbidden` (whatever else is sent), as is a
/// write with neither `Origin` nor `X-Spark-Client`; nothing is written.
/// A bearer token is not held to this (it is no ambient credential).
#[tokio::test]
async fn a_cookie_write_from_another_origin_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(with_tokens(dir.path(), 60_000)).await;
    let bearer = format!("Bearer {TOKEN}");
    let (_, _, headers) = server
        .call("POST", "/api/session", None, &[("Authorization", &bearer)])
        .await;
    let (cookie, _) = cookie_of(&headers);
    let head = || async {
        server
            .call("GET", "/api/log/head", None, &[("Authorization", &bearer)])
            .await
            .1["seq"]
            .as_u64()
            .unwrap()
    };
    let before = head().await;
    for extra in [
        vec![("Origin", "http://evil.example")],
        vec![("Origin", "http://evil.example"), ("X-Spark-Client", "web")],
        vec![("Origin", "null")],
        vec![],
    ] {
        let mut h = vec![("Cookie", cookie.as_str())];
        h.extend(extra.iter().copied());
        for (method, path, body) in [
            ("POST", "/api/moments".to_owned(), json!({"id": ulid()})),
            (
                "POST",
                "/api/phrases".to_owned(),
                json!({"phrase": "hallo"}),
            ),
            ("DELETE", "/api/session".to_owned(), json!({})),
        ] {
            let (status, answer, _) = server.call(method, &path, Some(body), &h).await;
            assert_eq!(status, 403, "{method} {path} with {extra:?}: {answer}");
            assert_eq!(answer["code"], "forbidden");
        }
    }
    assert_eq!(head().await, before, "nothing was written");
    // The same writes with the token and a foreign Origin are taken.
    let (status, _, _) = server
        .call(
            "POST",
            "/api/moments",
            Some(json!({"id": ulid()})),
            &[
                ("Authorization", &bearer),
                ("Origin", "http://evil.example"),
            ],
        )
        .await;
    assert_eq!(status, 201);
    // Without Origin, the client header makes it the page's own.
    let (status, _, _) = server
        .call(
            "POST",
            "/api/moments",
            Some(json!({"id": ulid()})),
            &[("Cookie", &cookie), ("X-Spark-Client", "web")],
        )
        .await;
    assert_eq!(status, 201);
    // Reads need neither.
    let (status, _, _) = server
        .call(
            "GET",
            "/api/moments",
            None,
            &[("Cookie", &cookie), ("Origin", "http://evil.example")],
        )
        .await;
    assert_eq!(status, 200);
    server.stop().await;
}

/// Sessions end: when they expire (`access.session_ttl_ms`), with the
/// cookie (that one), with the token (every session made with it); a
/// session is not a token (it cannot make another); junk cookies are
/// `401`; with no token configured there is nothing to exchange.
#[tokio::test]
async fn sessions_expire_and_are_revoked_with_the_cookie_or_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(with_tokens(dir.path(), 1_000)).await;
    let bearer = format!("Bearer {TOKEN}");
    // Before the session is made: its 1 s starts later than this.
    let asked = std::time::Instant::now();
    let (status, _, headers) = server
        .call("POST", "/api/session", None, &[("Authorization", &bearer)])
        .await;
    assert_eq!(status, 201);
    let short = cookie_of(&headers).0;
    let (status, _, _) = server
        .call("GET", "/api/log/head", None, &[("Cookie", &short)])
        .await;
    // Served while it lives; a busy machine may take the whole second
    // between the two calls, and then the session may be gone already.
    if asked.elapsed() < std::time::Duration::from_millis(1_000) {
        assert_eq!(status, 200);
    }
    tokio::time::sleep(std::time::Duration::from_millis(1_300)).await;
    let (status, body, headers) = server
        .call("GET", "/api/log/head", None, &[("Cookie", &short)])
        .await;
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));
    assert_eq!(headers["www-authenticate"], "Bearer");
    server.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(with_tokens(dir.path(), 60_000)).await;
    let reads = |cookie: String| {
        let server = &server;
        async move {
            server
                .call("GET", "/api/log/head", None, &[("Cookie", &cookie)])
                .await
                .0
        }
    };
    // Signing out with the cookie ends that session only.
    let a = new_session(&server, TOKEN).await;
    let b = new_session(&server, TOKEN).await;
    let other = new_session(&server, OTHER_TOKEN).await;
    let (status, body, headers) = server
        .call(
            "DELETE",
            "/api/session",
            None,
            &[("Cookie", &a), ("X-Spark-Client", "web")],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["revoked"], 1);
    assert!(cookie_of(&headers).1.contains("Max-Age=0"));
    assert_eq!(reads(a).await, 401);
    assert_eq!(reads(b.clone()).await, 200);
    // With the token: every session made with it, and no other.
    let c = new_session(&server, TOKEN).await;
    let (status, body, _) = server
        .call(
            "DELETE",
            "/api/session",
            None,
            &[("Authorization", &format!("Bearer {TOKEN}"))],
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["revoked"], 2);
    assert_eq!(reads(b).await, 401);
    assert_eq!(reads(c).await, 401);
    assert_eq!(reads(other.clone()).await, 200);
    // A session cannot make a session; junk is refused.
    let (status, body, _) = server
        .call(
            "POST",
            "/api/session",
            None,
            &[("Cookie", &other), ("X-Spark-Client", "web")],
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, body, _) = server
        .call(
            "POST",
            "/api/session",
            Some(json!({"token": TOKEN})),
            &[("Authorization", &format!("Bearer {TOKEN}"))],
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_request")),
        "no body members"
    );
    for junk in [
        "spark_session=",
        "spark_session=abc",
        "spark_session=x; other=1",
    ] {
        assert_eq!(reads(junk.to_owned()).await, 401, "{junk}");
    }
    let (status, _, _) = server
        .call(
            "POST",
            "/api/session",
            None,
            &[("Authorization", "Bearer wrong")],
        )
        .await;
    assert_eq!(status, 401);
    server.stop().await;

    // No token configured: nothing to exchange, no cookie.
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let (status, body, headers) = server.call("POST", "/api/session", None, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"device": "anonymous", "expires_at": null, "revoked": 0})
    );
    assert!(headers.get("set-cookie").is_none());
    server.stop().await;
}

/// `access.session_ttl_ms` is a setting like the others: `0` is refused,
/// and `SPARK_ACCESS_SESSION_TTL_MS` sets it.
#[test]
fn the_session_life_is_a_setting() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    assert_eq!(s.access.session_ttl_ms, 12 * 60 * 60 * 1000);
    s.apply_env([("SPARK_ACCESS_SESSION_TTL_MS".to_owned(), "90000".to_owned())].into_iter())
        .unwrap();
    assert_eq!(s.access.session_ttl_ms, 90_000);
    s.access.session_ttl_ms = 0;
    let error = s.validate().unwrap_err().to_string();
    assert!(error.contains("access.session_ttl_ms"), "{error}");
}

/// Reads `stream` until it ends; panics if it has not within `within`.
async fn ends_within(stream: &mut reqwest::Response, within: std::time::Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.chunk()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) | Ok(Err(_)) => return,
            Err(_) => panic!("the stream was still open after {within:?}"),
        }
    }
}

/// Reads `stream` until `text` arrives.
async fn receives(stream: &mut reqwest::Response, text: &str) {
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !seen.contains(text) {
        let chunk = tokio::time::timeout_at(deadline, stream.chunk())
            .await
            .unwrap_or_else(|_| panic!("no {text:?} in {seen:?}"))
            .unwrap()
            .unwrap_or_else(|| panic!("the stream ended before {text:?}: {seen:?}"));
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// An event stream opened with a session cookie ends with its session
///: signed out with that cookie, every session of its
/// token revoked, or expired. Streams of other sessions and of a bearer
/// token go on. Before, the stream kept delivering every change notice to
/// a client whose requests were all answered 401.
#[tokio::test]
async fn an_event_stream_ends_with_the_session_that_opened_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(with_tokens(dir.path(), 60_000)).await;
    let open = |auth: (&'static str, String)| {
        let server = &server;
        async move {
            let stream = server
                .client
                .get(server.url("/api/events?after=0"))
                .header(auth.0, auth.1)
                .send()
                .await
                .unwrap();
            assert_eq!(stream.status(), 200);
            stream
        }
    };
    let create = |text: &'static str| {
        let server = &server;
        async move {
            let id = ulid();
            let (status, body, _) = server
                .call(
                    "POST",
                    "/api/moments",
                    Some(json!({ "id": id, "text": text })),
                    &[("Authorization", &format!("Bearer {OTHER_TOKEN}"))],
                )
                .await;
            assert_eq!(status, 201, "{body}");
            id
        }
    };
    let a = new_session(&server, TOKEN).await;
    let b = new_session(&server, TOKEN).await;
    let mut by_a = open(("Cookie", a.clone())).await;
    let mut by_b = open(("Cookie", b.clone())).await;
    let mut by_token = open(("Authorization", format!("Bearer {OTHER_TOKEN}"))).await;
    let first = create("first").await;
    for stream in [&mut by_a, &mut by_b, &mut by_token] {
        receives(stream, &first).await;
    }
    // Signing out with cookie A ends A's stream, not B's.
    let (status, body, _) = server
        .call(
            "DELETE",
            "/api/session",
            None,
            &[("Cookie", &a), ("X-Spark-Client", "web")],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    ends_within(&mut by_a, std::time::Duration::from_secs(10)).await;
    let second = create("second").await;
    receives(&mut by_b, &second).await;
    // Revoking every session of the token ends B's stream too.
    let (status, body, _) = server
        .call(
            "DELETE",
            "/api/session",
            None,
            &[("Authorization", &format!("Bearer {TOKEN}"))],
        )
        .await;
    assert_eq!((status, body["revoked"].clone()), (200, json!(1)));
    ends_within(&mut by_b, std::time::Duration::from_secs(10)).await;
    // The bearer token's stream goes on.
    let third = create("third").await;
    receives(&mut by_token, &third).await;
    drop(by_token);
    server.stop().await;

    // A session that expires ends its stream within a second or so of it.
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(with_tokens(dir.path(), 1_500)).await;
    let bearer = format!("Bearer {TOKEN}");
    let (status, _, headers) = server
        .call("POST", "/api/session", None, &[("Authorization", &bearer)])
        .await;
    assert_eq!(status, 201);
    let short = cookie_of(&headers).0;
    let mut stream = server
        .client
        .get(server.url("/api/events?after=0"))
        .header("Cookie", &short)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    ends_within(&mut stream, std::time::Duration::from_secs(20)).await;
    server.stop().await;
}
