//! Access (SPEC section 9) and operations: bearer tokens naming devices,
//! writes from other sites and bodies not declared JSON (refused in every
//! mode), health and readiness, `token add`, `config print`, environment
//! overrides, JSON logs, and the refusal to serve the network without a token.

use crate::common;

use std::process::Command;
use std::sync::Arc;

use common::{settings, ulid, TestServer};
use serde_json::json;
use sha2::{Digest, Sha256};
use spark_core::op::Op;
use spark_engine::config::TokenEntry;
use spark_log_format::{LogReader, ScanOptions};

const TOKEN: &str = "spk_test_token_for_phone_1";

fn with_token(dir: &std::path::Path) -> spark_engine::Settings {
    let mut s = settings(dir);
    s.access.tokens.push(TokenEntry {
        device: "phone-1".into(),
        sha256: hex::encode(Sha256::digest(TOKEN.as_bytes())),
    });
    s
}

#[tokio::test]
async fn every_route_but_health_needs_a_valid_token_and_ops_record_its_device() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(with_token(dir.path())).await;
    let id = ulid();
    let body = json!({"id": id, "client_request_id": "r1"});
    for headers in [
        vec![],
        vec![("Authorization", "Bearer wrong")],
        vec![("Authorization", "Basic abc")],
    ] {
        let (s, v, h) = server
            .call("POST", "/api/moments", Some(body.clone()), &headers)
            .await;
        assert_eq!(
            (s, v["code"].clone()),
            (401, json!("unauthorized")),
            "{headers:?}"
        );
        assert_eq!(h["content-type"], "application/problem+json");
    }
    for path in [
        "/api/moments",
        "/api/log/head",
        "/api/phrases",
        "/api/events",
    ] {
        let (s, _, _) = server.call("GET", path, None, &[]).await;
        assert_eq!(s, 401, "{path}");
    }
    for path in ["/healthz", "/readyz"] {
        let (s, v, _) = server.call("GET", path, None, &[]).await;
        assert_eq!(s, 200, "{path}: {v}");
    }
    let auth = format!("Bearer {TOKEN}");
    let (s, _, _) = server
        .call(
            "POST",
            "/api/moments",
            Some(body),
            &[("Authorization", &auth)],
        )
        .await;
    assert_eq!(s, 201);
    let (s, _, _) = server
        .call(
            "GET",
            &format!("/api/moments/{id}"),
            None,
            &[("Authorization", &auth)],
        )
        .await;
    assert_eq!(s, 200);
    server.stop().await;
    let reader = LogReader::open(&dir.path().join("log")).unwrap();
    let mut devices = Vec::new();
    reader
        .scan(ScanOptions::default(), |_, r| {
            devices.push(Op::decode(&r).unwrap().body.device().to_owned());
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(
        devices,
        vec!["phone-1"],
        "nothing written for refused requests; the op names the device"
    );
}

/// The log head's seq: what a refused request leaves as it was.
async fn head_seq(server: &TestServer, headers: &[(&str, &str)]) -> u64 {
    let (status, head, _) = server.call("GET", "/api/log/head", None, headers).await;
    assert_eq!(status, 200, "{head}");
    head["seq"].as_u64().unwrap()
}

/// Sends `method path` with `body` as it is (no Content-Type but what
/// `headers` name); the status and the answer's JSON (Null when none).
async fn send_raw(
    server: &TestServer,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> (u16, serde_json::Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = server
        .client
        .request(method, server.url(path))
        .body(body.to_vec());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("the request is answered");
    let status = response.status().as_u16();
    let problem_json = response
        .headers()
        .get("content-type")
        .is_some_and(|v| v == "application/problem+json");
    let value: serde_json::Value = response.json().await.unwrap_or_default();
    assert!(status < 400 || problem_json, "{status} {value}");
    (status, value)
}

/// A moment to write on: its id.
async fn a_moment(server: &TestServer, headers: &[(&str, &str)]) -> String {
    let id = ulid();
    let (status, body, _) = server
        .call("POST", "/api/moments", Some(json!({"id": id})), headers)
        .await;
    assert_eq!(status, 201, "{body}");
    id
}

/// A write to send as it is: its body and the `Content-Type` it declares.
struct RawWrite {
    method: &'static str,
    path: String,
    body: Vec<u8>,
    content_type: Option<&'static str>,
}

/// Every write route that reads a JSON body, with a body it would take:
/// (method, path, body).
fn json_writes(moment: &str) -> Vec<(&'static str, String, String)> {
    vec![
        (
            "POST",
            "/api/moments".to_owned(),
            json!({"text": "written by evil.example"}).to_string(),
        ),
        (
            "PATCH",
            format!("/api/moments/{moment}"),
            json!({"caption": "evil"}).to_string(),
        ),
        ("DELETE", format!("/api/moments/{moment}"), "{}".to_owned()),
        (
            "POST",
            format!("/api/moments/{moment}/turns"),
            json!({"mode": "practical"}).to_string(),
        ),
        (
            "POST",
            "/api/phrases".to_owned(),
            json!({"phrase": "evil"}).to_string(),
        ),
        (
            "POST",
            "/api/recall".to_owned(),
            json!({"id": "evil-recall"}).to_string(),
        ),
        (
            "POST",
            "/api/jobs".to_owned(),
            json!({"job_id": "evil-job", "moment_id": moment}).to_string(),
        ),
        (
            "POST",
            "/api/messages".to_owned(),
            json!({"id": ulid(), "thread_id": moment, "body": "evil"}).to_string(),
        ),
        ("POST", "/api/session".to_owned(), "{}".to_owned()),
    ]
}

/// A body a route reads as JSON must be declared so: `text/plain` (what
/// `fetch(url, {method: "POST", mode: "no-cors", body})` sends from any
/// page, with no CORS preflight), a form type, or no type at all is `415
/// unsupported_media_type` on every such route, and nothing is written. A
/// body-less `POST` without a type stays allowed where the body is
/// optional; `application/json` with parameters, any case, and
/// `application/*+json` are JSON.
#[tokio::test]
async fn a_body_not_declared_json_is_415_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let moment = a_moment(&server, &[]).await;
    let before = head_seq(&server, &[]).await;
    for content_type in [
        Some("text/plain;charset=UTF-8"),
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("text/json"),
        None,
    ] {
        let headers: Vec<(&str, &str)> =
            content_type.iter().map(|t| ("Content-Type", *t)).collect();
        for (method, path, body) in json_writes(&moment) {
            let (status, problem) =
                send_raw(&server, method, &path, body.as_bytes(), &headers).await;
            assert_eq!(
                (status, problem["code"].as_str()),
                (415, Some("unsupported_media_type")),
                "{method} {path} with {content_type:?}: {problem}"
            );
            assert_eq!(problem["status"], 415);
            assert_eq!(problem["type"], "urn:spark:problem:unsupported_media_type");
        }
    }
    // A declared type that is not JSON is refused even with no body.
    for (method, path) in [
        ("POST", "/api/recall".to_owned()),
        ("POST", format!("/api/moments/{moment}/turns")),
        ("DELETE", format!("/api/moments/{moment}")),
    ] {
        let (status, problem) = send_raw(
            &server,
            method,
            &path,
            b"",
            &[("Content-Type", "application/x-www-form-urlencoded")],
        )
        .await;
        assert_eq!(status, 415, "{method} {path}: {problem}");
    }
    assert_eq!(head_seq(&server, &[]).await, before, "nothing was written");

    // Declared JSON is taken, with parameters, in any case, or +json.
    for content_type in [
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.spark+json",
    ] {
        let (status, answer) = send_raw(
            &server,
            "POST",
            "/api/moments",
            json!({"text": content_type}).to_string().as_bytes(),
            &[("Content-Type", content_type)],
        )
        .await;
        assert_eq!(status, 201, "{content_type}: {answer}");
    }
    let (status, answer) = send_raw(
        &server,
        "PATCH",
        &format!("/api/moments/{moment}"),
        br#"{"caption":"merged"}"#,
        &[("Content-Type", "application/merge-patch+json")],
    )
    .await;
    assert_eq!(
        (status, &answer["changed"]),
        (200, &json!(true)),
        "{answer}"
    );
    // A body-less POST with no Content-Type, where the body is optional.
    let (status, answer) = send_raw(
        &server,
        "POST",
        &format!("/api/moments/{moment}/turns"),
        b"",
        &[],
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let (status, _, _) = server
        .call(
            "POST",
            "/api/phrases",
            Some(json!({"phrase": "hallo"})),
            &[],
        )
        .await;
    assert_eq!(status, 201);
    let (status, answer) = send_raw(&server, "POST", "/api/recall", b"", &[]).await;
    assert_eq!(status, 202, "{answer}");
    assert!(head_seq(&server, &[]).await > before);
    server.stop().await;
}

/// Every write request whose `Origin` is another site (another host, the
/// same host on another port, `null`) is `403 forbidden` with no token
/// configured (the default), on every write route, media uploads and
/// body-less deletes included, and before its body is looked at (the
/// break-it request, `text/plain` from `http://evil.example`, is `403`);
/// nothing is written. The engine's own origin (`http` or `https`, as a
/// TLS proxy may stand in front), no `Origin` at all, and reads from
/// anywhere are served.
#[tokio::test]
async fn a_write_from_another_site_is_refused_without_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let moment = a_moment(&server, &[]).await;
    let (status, _, _) = server
        .call(
            "POST",
            "/api/phrases",
            Some(json!({"phrase": "hallo"})),
            &[],
        )
        .await;
    assert_eq!(status, 201);
    let media = ulid();
    let upload_headers = |origin: &str| {
        vec![
            ("X-Moment-Id".to_owned(), moment.clone()),
            ("X-Media-Role".to_owned(), "copy".to_owned()),
            ("Content-Type".to_owned(), "image/jpeg".to_owned()),
            ("Origin".to_owned(), origin.to_owned()),
        ]
    };
    let before = head_seq(&server, &[]).await;
    let other_port = format!("http://127.0.0.1:{}", server.running.addr.port() ^ 1);
    let evil_origins = [
        "http://evil.example",
        "https://evil.example",
        "null",
        other_port.as_str(),
    ];
    for origin in evil_origins {
        let mut requests: Vec<RawWrite> = json_writes(&moment)
            .into_iter()
            .map(|(method, path, body)| RawWrite {
                method,
                path,
                body: body.into_bytes(),
                content_type: Some("application/json"),
            })
            .collect();
        requests.push(RawWrite {
            method: "DELETE",
            path: "/api/phrases/keep:hallo".to_owned(),
            body: Vec::new(),
            content_type: None,
        });
        requests.push(RawWrite {
            method: "DELETE",
            path: "/api/session".to_owned(),
            body: Vec::new(),
            content_type: None,
        });
        // The break-it request as a browser sends it.
        requests.push(RawWrite {
            method: "POST",
            path: "/api/moments".to_owned(),
            body: br#"{"text":"written by evil.example"}"#.to_vec(),
            content_type: Some("text/plain;charset=UTF-8"),
        });
        for write in &requests {
            let mut headers = vec![("Origin", origin)];
            headers.extend(write.content_type.map(|t| ("Content-Type", t)));
            let (status, problem) =
                send_raw(&server, write.method, &write.path, &write.body, &headers).await;
            assert_eq!(
                (status, problem["code"].as_str()),
                (403, Some("forbidden")),
                "{} {} from {origin}: {problem}",
                write.method,
                write.path
            );
        }
        // A media upload (raw bytes with their own type) too.
        let headers = upload_headers(origin);
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let path = format!("/api/media/{media}");
        let (status, problem) = send_raw(&server, "PUT", &path, b"jpeg bytes", &headers).await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (403, Some("forbidden")),
            "PUT {path} from {origin}: {problem}"
        );
        // Reads from another site are answered as before.
        let (status, _, _) = server
            .call("GET", "/api/moments", None, &[("Origin", origin)])
            .await;
        assert_eq!(status, 200);
    }
    assert_eq!(head_seq(&server, &[]).await, before, "nothing was written");
    let (status, _, _) = server
        .call("GET", &format!("/api/media/{media}"), None, &[])
        .await;
    assert_eq!(status, 404, "the upload was not stored");

    // The engine's own origin writes.
    let own = server.base.clone();
    let own_tls = own.replacen("http://", "https://", 1);
    for origin in [own.as_str(), own_tls.as_str()] {
        let (status, answer, _) = server
            .call(
                "POST",
                "/api/moments",
                Some(json!({"text": "from the page"})),
                &[("Origin", origin)],
            )
            .await;
        assert_eq!(status, 201, "{origin}: {answer}");
    }
    let headers = upload_headers(&own);
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (status, answer) = send_raw(
        &server,
        "PUT",
        &format!("/api/media/{media}"),
        b"jpeg bytes",
        &headers,
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let (status, answer, _) = server
        .call(
            "PATCH",
            &format!("/api/moments/{moment}"),
            Some(json!({"caption": "from the page"})),
            &[("Origin", &own)],
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer, _) = server
        .call(
            "DELETE",
            "/api/phrases/keep:hallo",
            None,
            &[("Origin", &own)],
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    // No Origin (curl, the Rust client): served as before.
    let (status, answer, _) = server
        .call(
            "POST",
            "/api/moments",
            Some(json!({"text": "from curl"})),
            &[],
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let (status, answer, _) = server
        .call("DELETE", &format!("/api/moments/{moment}"), None, &[])
        .await;
    assert_eq!(status, 200, "{answer}");
    server.stop().await;
}

/// With tokens configured the rule holds too: a cross-site write without a
/// bearer token is `403 forbidden` (it was `401`; a session cookie does not
/// help it, `tests/http/web.rs`), and one with a valid bearer token is
/// taken from any origin (a browser never adds the token by itself). A
/// bearer write still needs its body declared JSON.
#[tokio::test]
async fn with_tokens_a_cross_site_write_needs_the_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(with_token(dir.path())).await;
    let auth = format!("Bearer {TOKEN}");
    let bearer = [("Authorization", auth.as_str())];
    let before = head_seq(&server, &bearer).await;
    let evil = ("Origin", "http://evil.example");
    let (status, problem) = send_raw(
        &server,
        "POST",
        "/api/moments",
        br#"{"text":"written by evil.example"}"#,
        &[("Content-Type", "text/plain;charset=UTF-8"), evil],
    )
    .await;
    assert_eq!((status, problem["code"].as_str()), (403, Some("forbidden")));
    let (status, problem) = send_raw(
        &server,
        "POST",
        "/api/moments",
        br#"{"text":"text/plain with the token"}"#,
        &[("Content-Type", "text/plain"), bearer[0]],
    )
    .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (415, Some("unsupported_media_type"))
    );
    assert_eq!(
        head_seq(&server, &bearer).await,
        before,
        "nothing was written"
    );
    // Without Origin and without a token: 401, as before.
    let (status, _, headers) = server
        .call("POST", "/api/moments", Some(json!({})), &[])
        .await;
    assert_eq!(status, 401);
    assert_eq!(headers["www-authenticate"], "Bearer");
    let (status, answer, _) = server
        .call("POST", "/api/moments", Some(json!({})), &[bearer[0], evil])
        .await;
    assert_eq!(status, 201, "{answer}");
    server.stop().await;
}

#[tokio::test]
async fn listening_beyond_loopback_needs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut open = settings(dir.path());
    open.listen = "0.0.0.0:0".parse().unwrap();
    let error = spark_engine::server::start(open)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains("no access token"), "{error}");
    let mut guarded = with_token(dir.path());
    guarded.listen = "0.0.0.0:0".parse().unwrap();
    let running = spark_engine::server::start_with(
        guarded,
        Arc::new(spark_log_format::OsFs),
        Arc::new(spark_engine::clock::SystemClock),
    )
    .await
    .expect("starts with a token");
    running.shutdown().await;
}

fn engine(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    engine_in(std::path::Path::new("."), args, envs)
}

/// Runs the real binary in `cwd` with `args`, the test's own
/// `SPARK_CONFIG`, `SPARK_LISTEN` and `SPARK_DATA` removed and `envs` set;
/// exit code, stdout, stderr.
fn engine_in(cwd: &std::path::Path, args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spark-engine"))
        .args(args)
        .current_dir(cwd)
        .env_remove("SPARK_CONFIG")
        .env_remove("SPARK_LISTEN")
        .env_remove("SPARK_DATA")
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn token_add_config_print_and_environment() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("spark.toml");
    std::fs::write(&config, "[limits]\njson_body_limit_bytes = 1000\n").unwrap();
    let (code, token, err) = engine(
        &[
            "token",
            "add",
            "phone-2",
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let token = token.trim();
    assert!(token.starts_with("spk_") && token.len() > 40);
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(!text.contains(token), "the token itself is never stored");
    assert!(text.contains(&hex::encode(Sha256::digest(token.as_bytes()))));
    assert!(
        text.contains("json_body_limit_bytes = 1000"),
        "the file keeps its settings"
    );

    let (code, printed, err) = engine(
        &["config", "print", "--config", config.to_str().unwrap()],
        &[("SPARK_LOG_GROUP_COMMIT_MAX_OPS", "7")],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        printed.contains("json_body_limit_bytes = 1000"),
        "{printed}"
    );
    assert!(
        printed.contains("group_commit_max_ops = 7"),
        "environment overrides: {printed}"
    );
    assert!(
        printed.contains("device = \"phone-2\"") && printed.contains("<hidden>"),
        "{printed}"
    );
    assert!(!printed.contains(&hex::encode(Sha256::digest(token.as_bytes()))));

    std::fs::write(&config, "[limits]\njson_body_limit = 5\n").unwrap();
    let (code, _, err) = engine(
        &["config", "print", "--config", config.to_str().unwrap()],
        &[],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("json_body_limit"),
        "unknown keys are named: {err}"
    );
}

#[test]
fn json_logs_for_machines() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (child, addr) = start_engine_in(
        dir.path(),
        &[
            "--log-format",
            "json",
            "--listen",
            "127.0.0.1:0",
            "--data",
            data.to_str().unwrap(),
        ],
    );
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let (ok, logs) = stop_engine(child);
    assert!(ok, "{logs}");
    let lines: Vec<&str> = logs.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(v.get("level").is_some(), "{l}");
    }
}

#[test]
fn printed_config_takes_a_token_and_flags_work_before_the_subcommand() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("printed.toml");
    // A newcomer saves `config print` as the settings file...
    let (code, printed, err) = engine(&["config", "print"], &[]);
    assert_eq!(code, 0, "{err}");
    std::fs::write(&config, printed).unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    // ...and adds a token to it.
    let (code, _, err) = engine(
        &[
            "token",
            "add",
            "phone-9",
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let mode = std::fs::metadata(&config).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "token add kept the file's permissions");

    // Flags before the subcommand mean the same as after it.
    let (code, printed, err) = engine(
        &[
            "--config",
            config.to_str().unwrap(),
            "--listen",
            "127.0.0.1:9",
            "config",
            "print",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(printed.contains("127.0.0.1:9"), "{printed}");
    assert!(printed.contains("phone-9"), "{printed}");
}

#[tokio::test]
async fn a_401_names_the_bearer_scheme_which_is_case_insensitive() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(with_token(dir.path())).await;
    let (s, _, h) = server.call("GET", "/api/moments", None, &[]).await;
    assert_eq!(s, 401);
    assert_eq!(h["www-authenticate"], "Bearer");
    let upper = format!("BEARER {TOKEN}");
    let (s, _, _) = server
        .call("GET", "/api/moments", None, &[("Authorization", &upper)])
        .await;
    assert_eq!(s, 200);
    server.stop().await;
}

#[test]
fn environment_typos_are_refused_and_bounds_are_checked_after_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = engine(
        &["config", "print"],
        &[("SPARK_LIMITS_CONECTIONS_MAX", "5")],
    );
    assert_eq!(code, 1, "a typo in a settings variable is refused");
    assert!(
        err.contains("environment variable SPARK_LIMITS_CONECTIONS_MAX"),
        "{err}"
    );
    let (code, _, err) = engine(
        &["config", "print"],
        &[("SPARK_LIMITS_CONNECTIONS_MAX", "many")],
    );
    assert_eq!(code, 1);
    assert!(err.contains("SPARK_LIMITS_CONNECTIONS_MAX"), "{err}");

    // A file that is valid only with its override applied is accepted.
    let config = dir.path().join("spark.toml");
    std::fs::write(&config, "[limits]\nlist_limit_default = 2000\n").unwrap();
    let (code, _, err) = engine(
        &["config", "print", "--config", config.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 1, "default above the max alone: {err}");
    assert!(err.contains("list_limit_default"), "{err}");
    let (code, printed, err) = engine(
        &["config", "print", "--config", config.to_str().unwrap()],
        &[("SPARK_LIMITS_LIST_LIMIT_MAX", "5000")],
    );
    assert_eq!(code, 0, "{err}");
    assert!(printed.contains("list_limit_max = 5000"), "{printed}");
}

#[test]
fn with_json_logs_a_fatal_error_is_a_json_line_too() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (code, _, err) = engine(
        &[
            "--log-format",
            "json",
            "--listen",
            "0.0.0.0:0",
            "--data",
            data.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l.to_string().contains("token")),
        "{err}"
    );
}

/// Starts the real binary in `cwd` with `args`; returns it and the address
/// it printed.
fn start_engine_in(cwd: &std::path::Path, args: &[&str]) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spark-engine"))
        .args(args)
        .current_dir(cwd)
        .env_remove("SPARK_CONFIG")
        .env_remove("SPARK_LISTEN")
        .env_remove("SPARK_DATA")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (child, addr)
}

/// SIGTERM, then the exit status and stderr.
fn stop_engine(child: std::process::Child) -> (bool, String) {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_plain_restart_uses_the_token_that_token_add_wrote() {
    let dir = tempfile::tempdir().unwrap();
    // `token add` with no --config writes ./spark.toml...
    let out = Command::new(env!("CARGO_BIN_EXE_spark-engine"))
        .args(["token", "add", "phone-1"])
        .current_dir(dir.path())
        .env_remove("SPARK_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("spark.toml") && said.contains("restart"),
        "{said}"
    );
    assert!(dir.path().join("spark.toml").is_file());
    // ...and a plain start in that directory reads it: access control is on.
    let (child, addr) = start_engine_in(dir.path(), &["--listen", "127.0.0.1:0"]);
    let client = reqwest::blocking::Client::new();
    let url = format!("http://{addr}/api/moments");
    assert_eq!(client.get(&url).send().unwrap().status().as_u16(), 401);
    let answer = client.get(&url).bearer_auth(&token).send().unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    let (ok, logs) = stop_engine(child);
    assert!(ok, "{logs}");
    assert!(
        logs.contains("spark.toml"),
        "the start says which file: {logs}"
    );

    // A --config naming another file while ./spark.toml exists: warned.
    let other = dir.path().join("other.toml");
    std::fs::write(&other, "").unwrap();
    let (child, _) = start_engine_in(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--config",
            other.to_str().unwrap(),
        ],
    );
    let (ok, logs) = stop_engine(child);
    assert!(ok, "{logs}");
    assert!(logs.contains("NOT read"), "{logs}");
}

#[test]
fn listen_takes_a_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (child, addr) = start_engine_in(
        dir.path(),
        &["--listen", "localhost:0", "--data", data.to_str().unwrap()],
    );
    let ip: std::net::SocketAddr = addr.parse().unwrap();
    assert!(ip.ip().is_loopback(), "{addr}");
    let health = reqwest::blocking::get(format!("http://{addr}/healthz")).unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let (ok, logs) = stop_engine(child);
    assert!(ok, "{logs}");
    // A name that resolves to nothing is refused, naming the forms.
    let (code, _, err) = engine(&["--listen", "no-such-host.invalid:0"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("HOST:PORT"), "{err}");
}

/// `token add --config LINK`, where LINK is a symbolic link to the
/// settings file (as configuration managers lay files out), writes the
/// file the link names and keeps the link: the server reads the token
/// through it. Before the fix the rename replaced the link with a copy, so
/// the file the link named (the one the operator keeps) had no token. A
/// missing directory is refused naming the path, with nothing written.
#[test]
fn token_add_writes_through_a_symbolic_link_and_names_a_missing_directory() {
    let dir = tempfile::tempdir().unwrap();
    let real_dir = dir.path().join("managed");
    std::fs::create_dir_all(&real_dir).unwrap();
    let real = real_dir.join("engine.toml");
    std::fs::write(&real, "[limits]\njson_body_limit_bytes = 4096\n").unwrap();
    // A relative link, the way `ln -s managed/engine.toml` makes it.
    let link = dir.path().join("engine.toml");
    std::os::unix::fs::symlink("managed/engine.toml", &link).unwrap();

    let (code, token, said) = engine_in(
        dir.path(),
        &[
            "token",
            "add",
            "phone-1",
            "--config",
            link.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{said}");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link is kept"
    );
    let text = std::fs::read_to_string(&real).unwrap();
    assert!(
        text.contains(&hex::encode(Sha256::digest(token.trim().as_bytes()))),
        "the file the link names has the token: {text}"
    );
    assert!(text.contains("json_body_limit_bytes = 4096"), "{text}");
    assert!(
        said.contains(&real.canonicalize().unwrap().display().to_string()),
        "the file written is named: {said}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .chain(std::fs::read_dir(&real_dir).unwrap())
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A link whose file does not exist yet: the file is made where the
    // link points.
    let fresh = dir.path().join("fresh.toml");
    std::os::unix::fs::symlink("managed/fresh.toml", &fresh).unwrap();
    let (code, _, said) = engine_in(
        dir.path(),
        &[
            "token",
            "add",
            "phone-2",
            "--config",
            fresh.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{said}");
    assert!(std::fs::read_to_string(real_dir.join("fresh.toml"))
        .unwrap()
        .contains("phone-2"));
    assert!(std::fs::symlink_metadata(&fresh)
        .unwrap()
        .file_type()
        .is_symlink());

    // A directory that does not exist: refused, naming the path.
    let missing = dir.path().join("no-such-dir").join("engine.toml");
    let (code, printed, said) = engine_in(
        dir.path(),
        &[
            "token",
            "add",
            "phone-3",
            "--config",
            missing.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 1, "{said}");
    assert!(printed.is_empty(), "no token printed: {printed}");
    assert!(said.contains("no-such-dir"), "{said}");
}

/// The operator flow with the settings file outside the working directory:
/// `spark-engine --config FILE token add DEVICE` writes FILE (not
/// `./spark.toml`) and says its absolute path, `SPARK_CONFIG` is honoured
/// the same way, two names for the file that disagree are refused with
/// nothing written, and a server started with `--config FILE` then needs
/// the token for writes. Before the fix the flag before `token` was
/// ignored: the token went to `./spark.toml` and the server served every
/// write without one.
#[test]
fn token_add_writes_the_file_the_server_is_started_with() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().join("work");
    let etc = dir.path().join("etc");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::create_dir_all(&etc).unwrap();
    let file = etc.join("engine.toml");
    let file_text = file.to_str().unwrap();
    let absolute = file.canonicalize().unwrap_or(file.clone());
    let local = cwd.join("spark.toml");

    // The form of the issue: the flag before the subcommand.
    let (code, token, said) = engine_in(
        &cwd,
        &["--config", file_text, "token", "add", "phone-1"],
        &[],
    );
    assert_eq!(code, 0, "{said}");
    let token = token.trim().to_owned();
    assert!(!local.exists(), "nothing in the working directory: {said}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains(&hex::encode(Sha256::digest(token.as_bytes()))),
        "{text}"
    );
    let absolute = std::fs::canonicalize(&file).unwrap_or(absolute);
    assert!(
        said.contains(&format!("to {}", absolute.display())),
        "the absolute path written is printed: {said}"
    );

    // SPARK_CONFIG alone, and with a flag that agrees.
    let (code, token_2, said) = engine_in(
        &cwd,
        &["token", "add", "phone-2"],
        &[("SPARK_CONFIG", file_text)],
    );
    assert_eq!(code, 0, "{said}");
    let (code, _, said) = engine_in(
        &cwd,
        &["token", "add", "phone-3", "--config", "../etc/engine.toml"],
        &[("SPARK_CONFIG", file_text)],
    );
    assert_eq!(code, 0, "the same file by another name: {said}");
    assert!(!local.exists());
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(&hex::encode(Sha256::digest(token_2.trim().as_bytes()))));
    assert!(text.contains("phone-3"));

    // Two names for the file that disagree: refused, each named, nothing
    // written anywhere.
    let other = etc.join("other.toml");
    let other_text = other.to_str().unwrap();
    for (args, env) in [
        (
            vec!["token", "add", "phone-4", "--config", other_text],
            &[("SPARK_CONFIG", file_text)][..],
        ),
        (
            vec![
                "--config", file_text, "token", "add", "phone-4", "--config", other_text,
            ],
            &[],
        ),
        (
            vec!["--config", other_text, "token", "add", "phone-4"],
            &[("SPARK_CONFIG", file_text)],
        ),
    ] {
        let (code, printed, said) = engine_in(&cwd, &args, env);
        assert_eq!(code, 1, "{args:?}: {said}");
        assert!(printed.is_empty(), "no token printed: {printed}");
        assert!(
            said.contains("engine.toml") && said.contains("other.toml"),
            "{said}"
        );
        assert!(!other.exists() && !local.exists(), "{args:?}");
        assert!(!std::fs::read_to_string(&file).unwrap().contains("phone-4"));
    }

    // The other commands that read the file: a flag before the subcommand
    // beats SPARK_CONFIG (flags beat the environment), and two flags that
    // disagree are refused.
    std::fs::write(&other, "[limits]\njson_body_limit_bytes = 1234\n").unwrap();
    let (code, printed, said) = engine_in(
        &cwd,
        &["--config", file_text, "config", "print"],
        &[("SPARK_CONFIG", other_text)],
    );
    assert_eq!(code, 0, "{said}");
    assert!(
        printed.contains("phone-1") && !printed.contains("1234"),
        "{printed}"
    );
    let (code, _, said) = engine_in(
        &cwd,
        &["--config", file_text, "serve", "--config", other_text],
        &[],
    );
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("name the settings file once"), "{said}");

    // The server started with --config FILE from the working directory
    // needs the token for writes (and reads).
    let data = dir.path().join("data");
    let (child, addr) = start_engine_in(
        &cwd,
        &[
            "--config",
            file_text,
            "--listen",
            "127.0.0.1:0",
            "--data",
            data.to_str().unwrap(),
        ],
    );
    let client = reqwest::blocking::Client::new();
    let url = format!("http://{addr}/api/moments");
    let body = json!({"id": ulid()});
    let refused = client.post(&url).json(&body).send().unwrap();
    assert_eq!(refused.status().as_u16(), 401, "a write without the token");
    assert_eq!(client.get(&url).send().unwrap().status().as_u16(), 401);
    let created = client
        .post(&url)
        .bearer_auth(&token)
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    let (ok, logs) = stop_engine(child);
    assert!(ok, "{logs}");
}
