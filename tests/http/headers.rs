//! Request headers at the edges: a single-value header sent twice with
//! different values, `If-Match` lists (RFC 9110 section 13.1.1), and the
//! `Host` check that keeps DNS rebinding out of an engine without tokens.

use crate::common;

use common::{settings, ulid, TestServer};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use spark_engine::config::TokenEntry;

/// Sends `method path` with `body` and every header line of `headers` as
/// its own line (a name may repeat); the status and the JSON answer.
async fn send(
    server: &TestServer,
    method: &str,
    path: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = server.client.request(method, server.url(path)).body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("answered");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The log's head seq.
async fn head(server: &TestServer, headers: &[(&str, &str)]) -> u64 {
    let (status, value) = send(server, "GET", "/api/log/head", Vec::new(), headers).await;
    assert_eq!(status, 200, "{value}");
    value["seq"].as_u64().unwrap()
}

/// A `400 invalid_request` naming `header`.
fn assert_names(status: u16, value: &Value, header: &str) {
    assert_eq!(status, 400, "{header}: {value}");
    assert_eq!(value["code"], "invalid_request", "{value}");
    assert!(
        value["detail"].as_str().unwrap().contains(header),
        "names {header}: {value}"
    );
}

const JSON: (&str, &str) = ("Content-Type", "application/json");

/// Each single-value header twice with different values: `400
/// invalid_request` naming it, nothing written; the same value twice is
/// taken. Before the fix the first line decided: two idempotency keys made
/// two moments, a right digest then a wrong one was accepted.
#[tokio::test]
async fn a_single_value_header_twice_with_different_values_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let moment = ulid();
    let body = |v: Value| v.to_string().into_bytes();
    let (s, v) = send(
        &server,
        "POST",
        "/api/moments",
        body(json!({"id": moment})),
        &[JSON],
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let before = head(&server, &[]).await;

    // Idempotency-Key k-A then k-B; the retry with k-B finds nothing.
    let (s, v) = send(
        &server,
        "POST",
        "/api/moments",
        body(json!({"text": "twice"})),
        &[JSON, ("Idempotency-Key", "k-A"), ("Idempotency-Key", "k-B")],
    )
    .await;
    assert_names(s, &v, "idempotency-key");
    // Content-Type: JSON, then text/plain.
    let (s, v) = send(
        &server,
        "POST",
        "/api/moments",
        body(json!({"text": "typed twice"})),
        &[JSON, ("Content-Type", "text/plain")],
    )
    .await;
    assert_names(s, &v, "content-type");
    // If-Match: the right version, then another.
    let path = format!("/api/moments/{moment}");
    let (s, v) = send(
        &server,
        "PATCH",
        &path,
        body(json!({"text": "edited"})),
        &[JSON, ("If-Match", "\"1\""), ("If-Match", "\"7\"")],
    )
    .await;
    assert_names(s, &v, "if-match");
    // An upload: the digest right then wrong; the moment, the role.
    let bytes = b"not really a jpeg".to_vec();
    let digest = hex::encode(Sha256::digest(&bytes));
    let upload = [
        ("X-Moment-Id", moment.as_str()),
        ("X-Media-Role", "copy"),
        ("Content-Type", "image/jpeg"),
    ];
    let other_moment = ulid();
    let cases: [(&str, &str, &str); 4] = [
        ("X-Content-SHA256", &digest, &"0".repeat(64)),
        ("X-Moment-Id", &moment, &other_moment),
        ("X-Media-Role", "copy", "original"),
        ("Content-Type", "image/jpeg", "image/png"),
    ];
    for (name, first, second) in cases {
        let mut headers: Vec<(&str, &str)> =
            upload.iter().copied().filter(|(n, _)| *n != name).collect();
        headers.push((name, first));
        headers.push((name, second));
        let (s, v) = send(
            &server,
            "PUT",
            &format!("/api/media/{}", ulid()),
            bytes.clone(),
            &headers,
        )
        .await;
        assert_names(s, &v, &name.to_ascii_lowercase());
    }
    assert_eq!(head(&server, &[]).await, before, "nothing written");

    // The same value twice is one value.
    let (s, v) = send(
        &server,
        "POST",
        "/api/moments",
        body(json!({"text": "same key twice"})),
        &[JSON, ("Idempotency-Key", "k-C"), ("Idempotency-Key", "k-C")],
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = send(
        &server,
        "POST",
        "/api/moments",
        body(json!({"text": "same key twice"})),
        &[JSON, ("Idempotency-Key", "k-C")],
    )
    .await;
    assert_eq!(
        (s, v["created"].clone()),
        (200, json!(false)),
        "the retry: {v}"
    );
    server.stop().await;
}

/// With tokens: two `Authorization` lines that differ are refused before
/// either is looked at.
#[tokio::test]
async fn two_authorization_lines_that_differ_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let token = "spk_headers_test_token";
    let mut s = settings(dir.path());
    s.access.tokens.push(TokenEntry {
        device: "phone-1".into(),
        sha256: hex::encode(Sha256::digest(token.as_bytes())),
    });
    let server = TestServer::start_with(s).await;
    let good = format!("Bearer {token}");
    let before = head(&server, &[("Authorization", &good)]).await;
    for pair in [
        [good.as_str(), "Bearer spk_wrong"],
        ["Bearer spk_wrong", good.as_str()],
    ] {
        let (s, v) = send(
            &server,
            "POST",
            "/api/moments",
            json!({"text": "two tokens"}).to_string().into_bytes(),
            &[JSON, ("Authorization", pair[0]), ("Authorization", pair[1])],
        )
        .await;
        assert_names(s, &v, "authorization");
    }
    assert_eq!(head(&server, &[("Authorization", &good)]).await, before);
    server.stop().await;
}

/// DNS rebinding: a hostile name made to resolve to 127.0.0.1 sends
/// `Host: evil.example:PORT` and a matching `Origin`. With no token, a
/// `Host` that is not loopback nor in `access.allowed_hosts` is `403
/// host_not_allowed` on every route, reads included, nothing written;
/// loopback names and addresses and the listed names pass; with a token
/// the token decides. Before the fix the matching pair passed the Origin
/// check and the write was made.
#[tokio::test]
async fn a_foreign_host_is_refused_without_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.access.allowed_hosts = vec!["spark.example".into()];
    let server = TestServer::start_with(s).await;
    let port = server.running.addr.port();
    let evil = format!("evil.example:{port}");
    let evil_origin = format!("http://{evil}");
    let before = head(&server, &[]).await;
    let (s, v) = send(
        &server,
        "POST",
        "/api/moments",
        json!({"text": "rebound"}).to_string().into_bytes(),
        &[JSON, ("Host", &evil), ("Origin", &evil_origin)],
    )
    .await;
    assert_eq!(
        (s, v["code"].as_str()),
        (403, Some("host_not_allowed")),
        "{v}"
    );
    assert!(
        v["detail"].as_str().unwrap().contains("evil.example"),
        "{v}"
    );
    for path in ["/api/moments", "/api/log/head", "/", "/healthz"] {
        let (s, v) = send(&server, "GET", path, Vec::new(), &[("Host", &evil)]).await;
        assert_eq!(
            (s, v["code"].as_str()),
            (403, Some("host_not_allowed")),
            "{path}: {v}"
        );
    }
    assert_eq!(head(&server, &[]).await, before, "nothing written");

    for host in [
        format!("localhost:{port}"),
        format!("app.localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "spark.example".to_owned(),
        format!("SPARK.example:{port}"),
    ] {
        let origin = format!("http://{host}");
        let (s, v) = send(
            &server,
            "POST",
            "/api/moments",
            json!({"text": host}).to_string().into_bytes(),
            &[JSON, ("Host", &host), ("Origin", &origin)],
        )
        .await;
        assert_eq!(s, 201, "{host}: {v}");
    }
    server.stop().await;

    // With a token, the token decides, whatever the Host.
    let dir = tempfile::tempdir().unwrap();
    let token = "spk_host_test_token";
    let mut s = settings(dir.path());
    s.access.tokens.push(TokenEntry {
        device: "phone-1".into(),
        sha256: hex::encode(Sha256::digest(token.as_bytes())),
    });
    let server = TestServer::start_with(s).await;
    let evil = format!("evil.example:{}", server.running.addr.port());
    let bearer = format!("Bearer {token}");
    let (s, v) = send(
        &server,
        "GET",
        "/api/moments",
        Vec::new(),
        &[("Host", &evil), ("Authorization", &bearer)],
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, _) = send(
        &server,
        "GET",
        "/api/moments",
        Vec::new(),
        &[("Host", &evil)],
    )
    .await;
    assert_eq!(s, 401);
    server.stop().await;
}

/// Sends `head` (the request line and header lines, without the blank
/// line) over a fresh connection with an empty body; the status and the
/// JSON body of the answer.
async fn raw(server: &TestServer, head: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(server.running.addr)
        .await
        .unwrap();
    stream
        .write_all(format!("{head}\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("answered")
    .unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Two `Host` lines are `400 invalid_request` (RFC 9112 section 3.2),
/// with or without tokens: before, the first decided, so a loopback name
/// first and a foreign one second passed the DNS-rebinding check while a
/// proxy or a cache might act on the second. The same `Host` twice is
/// taken as one.
#[tokio::test]
async fn two_host_lines_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let port = server.running.addr.port();
    for path in ["/api/log/head", "/healthz", "/"] {
        let (s, v) = raw(
            &server,
            &format!("GET {path} HTTP/1.1\r\nhost: localhost:{port}\r\nhost: evil.example:{port}"),
        )
        .await;
        assert_names(s, &v, "Host");
    }
    let (s, v) = raw(
        &server,
        &format!("GET /api/log/head HTTP/1.1\r\nhost: localhost:{port}\r\nhost: localhost:{port}"),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    server.stop().await;
}

/// `Last-Event-ID` twice with different cursors is `400` naming it (which
/// one a proxy passed on is anyone's guess); a media type that differs
/// only in case (`application/json`, `Application/JSON`) is the same
/// value (RFC 9110 section 8.3.1), not a repeat.
#[tokio::test]
async fn last_event_id_twice_is_refused_and_a_media_type_is_compared_without_case() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    // Raw, with a deadline: a stream that is served would never end.
    let (s, v) = raw(
        &server,
        "GET /api/events HTTP/1.1\r\nhost: localhost\r\nlast-event-id: 0\r\n\
         last-event-id: 1.00000000000000ff",
    )
    .await;
    assert_names(s, &v, "last-event-id");
    let (s, v) = send(
        &server,
        "POST",
        "/api/moments",
        json!({"id": ulid(), "client_request_id": "case", "text": "one type, two spellings"})
            .to_string()
            .into_bytes(),
        &[JSON, ("Content-Type", "Application/JSON")],
    )
    .await;
    assert_eq!(s, 201, "{v}");
    server.stop().await;
}

/// `If-Match` takes a list (RFC 9110 section 13.1.1): the condition holds
/// when any listed version is the moment's current one. `"999", "4"` was
/// `400` before.
#[tokio::test]
async fn if_match_takes_a_list_of_versions() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let id = ulid();
    let (s, v) = send(
        &server,
        "POST",
        "/api/moments",
        json!({"id": id, "text": "v1"}).to_string().into_bytes(),
        &[JSON],
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let path = format!("/api/moments/{id}");
    let edit = |text: &str| json!({ "text": text }).to_string().into_bytes();
    // Version 1 is listed second.
    let (s, v) = send(
        &server,
        "PATCH",
        &path,
        edit("v2"),
        &[JSON, ("If-Match", "\"999\", \"1\"")],
    )
    .await;
    assert_eq!((s, v["moment"]["version"].clone()), (200, json!(2)), "{v}");
    // None listed is the current one: 412 with the current version.
    let before = head(&server, &[]).await;
    let (s, v) = send(
        &server,
        "PATCH",
        &path,
        edit("v3"),
        &[JSON, ("If-Match", "\"999\", \"1\"")],
    )
    .await;
    assert_eq!(
        (s, v["code"].as_str()),
        (412, Some("precondition_failed")),
        "{v}"
    );
    // Weak and bare forms, empty elements.
    let (s, v) = send(
        &server,
        "PATCH",
        &path,
        edit("v3"),
        &[JSON, ("If-Match", ", 7, W/\"2\"")],
    )
    .await;
    assert_eq!((s, v["moment"]["version"].clone()), (200, json!(3)), "{v}");
    // Not a list of versions: 400, nothing written.
    let before_bad = head(&server, &[]).await;
    assert_eq!(before_bad, before + 1);
    for bad in ["\"3\", *", "\"3\", \"x\"", " , "] {
        let (s, v) = send(
            &server,
            "PATCH",
            &path,
            edit("never"),
            &[JSON, ("If-Match", bad)],
        )
        .await;
        assert_eq!(
            (s, v["code"].as_str()),
            (400, Some("invalid_request")),
            "{bad}: {v}"
        );
    }
    // A delete with a list.
    let (s, v) = send(
        &server,
        "DELETE",
        &path,
        Vec::new(),
        &[("If-Match", "\"1\", \"3\"")],
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(head(&server, &[]).await, before_bad + 1);
    server.stop().await;
}
