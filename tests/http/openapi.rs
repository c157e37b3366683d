//! The API description (`src/api/openapi.json`, served at
//! `GET /api/openapi.json`) against the route table
//! ([`spark_engine::api::route_table::RESOURCES`], its (method, path) pairs
//! [`routes`]) and against the router, which is built from the table (a
//! path or a method is served only through it).
//!
//! - (a) `document_operations_equal_routes`: the document's (method, path)
//!   pairs equal [`routes`] exactly, both ways; every `$ref` resolves.
//! - (b) `every_route_reaches_a_handler`: on a live server, every entry of
//!   [`routes`] reaches a handler (neither the router's `404 no such
//!   route`, nor `405`, nor a warp rejection). So nothing is documented
//!   that is not served.
//! - (c) `unlisted_methods_are_not_served`: on a live server, every other
//!   method on every path of the table answers `405` with the table's
//!   methods in `Allow`; `unserved_paths_are_no_such_route`: a path the
//!   table lacks is `404 no such route` whatever the method (a method
//!   filter's rejection never wins over it).
//!
//!   Together with (a) and (b): document = table = what the router serves.
//! - (d) `security_matches_the_router`: with a token configured, exactly the
//!   operations the document marks `security: []` answer without one; every
//!   other answers `401 unauthorized`, as the document says.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::{settings, ulid, TestServer};
use serde_json::{json, Value};
use spark_engine::api::openapi::document;
use spark_engine::api::route_table::routes;

/// The HTTP methods an OpenAPI path item can hold (as its lower-case keys).
const METHODS: &[&str] = &[
    "GET", "PUT", "POST", "DELETE", "OPTIONS", "HEAD", "PATCH", "TRACE",
];

fn parsed() -> Value {
    serde_json::from_str(document()).expect("the document is JSON")
}

fn routes_set() -> BTreeSet<(String, String)> {
    let set: BTreeSet<(String, String)> = routes()
        .map(|(m, p)| (m.to_owned(), p.to_owned()))
        .collect();
    assert_eq!(set.len(), routes().count(), "the table lists a route twice");
    set
}

/// Resolves a local JSON pointer (`#/components/...`).
fn resolve<'v>(doc: &'v Value, reference: &str) -> Option<&'v Value> {
    doc.pointer(reference.strip_prefix('#')?)
}

fn check_refs(doc: &Value, node: &Value, broken: &mut Vec<String>) {
    match node {
        Value::Object(map) => {
            for (key, value) in map {
                if key == "$ref" {
                    let target = value.as_str().unwrap_or_default();
                    if resolve(doc, target).is_none() {
                        broken.push(target.to_owned());
                    }
                }
                check_refs(doc, value, broken);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| check_refs(doc, v, broken)),
        _ => {}
    }
}

/// (a) The document is OpenAPI 3.1, its operations are exactly [`routes`],
/// and every `$ref` in it resolves.
#[test]
fn document_operations_equal_routes() {
    let doc = parsed();
    let version = doc["openapi"].as_str().expect("an openapi member");
    assert!(version.starts_with("3.1."), "OpenAPI {version}, not 3.1");
    let mut operations = BTreeSet::new();
    let paths = doc["paths"].as_object().expect("a paths object");
    for (path, item) in paths {
        for method in METHODS {
            if item.get(method.to_ascii_lowercase()).is_some() {
                operations.insert(((*method).to_owned(), path.clone()));
            }
        }
    }
    let routes = routes_set();
    let undocumented: Vec<_> = routes.difference(&operations).collect();
    let unserved: Vec<_> = operations.difference(&routes).collect();
    assert!(
        undocumented.is_empty() && unserved.is_empty(),
        "in the table but not in the document: {undocumented:?}; \
         in the document but not in the table: {unserved:?}"
    );
    let mut broken = Vec::new();
    check_refs(&doc, &doc, &mut broken);
    assert!(broken.is_empty(), "unresolved $ref: {broken:?}");
    // Operation ids are unique (links and tools name operations by them).
    let mut ids = BTreeSet::new();
    for item in paths.values() {
        for method in METHODS {
            if let Some(op) = item.get(method.to_ascii_lowercase()) {
                let id = op["operationId"]
                    .as_str()
                    .expect("every operation has an id");
                assert!(ids.insert(id.to_owned()), "operationId {id} twice");
            }
        }
    }
}

/// What a live server answered.
struct Answer {
    status: u16,
    body: Value,
    /// The `Allow` header, if any.
    allow: Option<String>,
}

impl Answer {
    /// True when a handler took the request: not the router's `no such
    /// route`, not a method the handler refused (`405`), not a warp
    /// rejection (`the request was refused`). A `HEAD` answer has no body,
    /// so there any `404` counts as not served (the fixtures make every
    /// served `HEAD` answer `200`).
    fn served(&self, method: &str) -> bool {
        let detail = self.body["detail"].as_str().unwrap_or_default();
        let no_route = self.status == 404 && (method == "HEAD" || detail == "no such route");
        let rejected = self.status == 400 && detail.starts_with("the request was refused");
        !no_route && !rejected && self.status != 405
    }
}

/// Sends one request; the body of an event stream is not read.
async fn send(
    server: &TestServer,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
    headers: &[(String, String)],
) -> Answer {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = server.client.request(method, server.url(path));
    for (k, v) in headers {
        request = request.header(k, v);
    }
    if let Some(body) = body {
        request = request.body(body);
    }
    let response = request.send().await.expect("the request is answered");
    let status = response.status().as_u16();
    let allow = response
        .headers()
        .get("allow")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let streaming = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let body = if streaming {
        Value::Null
    } else {
        let bytes = response.bytes().await.expect("the body reads");
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    };
    Answer {
        status,
        body,
        allow,
    }
}

/// Entities for the item routes to find, so each route answers as it
/// would for a client (and `HEAD` answers `200`).
struct Fixtures {
    moment: String,
    spare_moment: String,
    media: String,
    media_bytes: Vec<u8>,
    turn: String,
}

async fn fixtures(server: &TestServer) -> Fixtures {
    let moment = ulid();
    let (status, _) = server
        .post(
            "/api/moments",
            json!({"id": moment, "text": "Ausfahrt freihalten"}),
        )
        .await;
    assert_eq!(status, 201);
    let spare_moment = ulid();
    let (status, _) = server
        .post("/api/moments", json!({"id": spare_moment}))
        .await;
    assert_eq!(status, 201);
    let media = ulid();
    let media_bytes = b"not really a jpeg".to_vec();
    let headers = [
        ("X-Moment-Id".to_owned(), moment.clone()),
        ("X-Media-Role".to_owned(), "copy".to_owned()),
        ("Content-Type".to_owned(), "image/jpeg".to_owned()),
    ];
    let answer = send(
        server,
        "PUT",
        &format!("/api/media/{media}"),
        Some(media_bytes.clone()),
        &headers,
    )
    .await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let (status, started) = server
        .post(&format!("/api/moments/{moment}/turns"), json!({}))
        .await;
    assert_eq!(status, 202, "{started}");
    let turn = started["turn"]["id"].as_str().unwrap().to_owned();
    let (status, _) = server
        .post("/api/phrases", json!({"phrase": "hello"}))
        .await;
    assert_eq!(status, 201);
    Fixtures {
        moment,
        spare_moment,
        media,
        media_bytes,
        turn,
    }
}

/// A minimal request for one [`routes`] entry: the path with its `{id}`
/// filled in, a body, and headers.
fn minimal(
    method: &str,
    template: &str,
    f: &Fixtures,
) -> (String, Option<Vec<u8>>, Vec<(String, String)>) {
    let json_body = |v: Value| Some(serde_json::to_vec(&v).unwrap());
    let json_type = vec![("Content-Type".to_owned(), "application/json".to_owned())];
    match (method, template) {
        ("DELETE", "/api/moments/{id}") => (
            format!("/api/moments/{}", f.spare_moment),
            json_body(json!({})),
            json_type,
        ),
        (_, "/api/moments/{id}") => (
            format!("/api/moments/{}", f.moment),
            json_body(json!({})),
            json_type,
        ),
        ("PUT", "/api/media/{id}") => (
            format!("/api/media/{}", f.media),
            Some(f.media_bytes.clone()),
            vec![
                ("X-Moment-Id".to_owned(), f.moment.clone()),
                ("X-Media-Role".to_owned(), "copy".to_owned()),
                ("Content-Type".to_owned(), "image/jpeg".to_owned()),
            ],
        ),
        (_, "/api/media/{id}") => (format!("/api/media/{}", f.media), None, vec![]),
        (_, "/api/moments/{id}/turns") => (
            format!("/api/moments/{}/turns", f.moment),
            json_body(json!({})),
            json_type,
        ),
        (_, "/api/turns/{id}") => (format!("/api/turns/{}", f.turn), None, vec![]),
        (_, "/assets/{id}") => ("/assets/app.js".to_owned(), None, vec![]),
        (_, "/api/phrases/{id}") => ("/api/phrases/keep:hello".to_owned(), None, vec![]),
        ("POST", "/api/phrases") => (
            template.to_owned(),
            json_body(json!({"phrase": "hello"})),
            json_type,
        ),
        ("POST", "/api/jobs") => (
            template.to_owned(),
            json_body(json!({"job_id": "job-1", "moment_id": f.moment})),
            json_type,
        ),
        ("POST", "/api/messages") => (
            template.to_owned(),
            json_body(json!({"id": ulid(), "thread_id": f.moment, "body": "hi"})),
            json_type,
        ),
        ("GET", "/api/messages") => (format!("/api/messages?thread={}", f.moment), None, vec![]),
        ("POST", _) => (template.to_owned(), json_body(json!({})), json_type),
        _ => {
            assert!(
                !template.contains('{'),
                "no fixture for the path parameter of {method} {template}: add one to minimal()"
            );
            (template.to_owned(), None, vec![])
        }
    }
}

/// (b) Every [`routes`] entry reaches a handler on a live server.
#[tokio::test]
async fn every_route_reaches_a_handler() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start(data.path()).await;
    let f = fixtures(&server).await;
    let mut unserved = Vec::new();
    for (method, template) in routes() {
        let (path, body, headers) = minimal(method, template, &f);
        let answer = send(&server, method, &path, body, &headers).await;
        if !answer.served(method) {
            unserved.push(format!(
                "{method} {path}: {} {}",
                answer.status, answer.body
            ));
        }
    }
    // The document that is served is the one compiled in.
    let served = server
        .client
        .get(server.url("/api/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(
        served.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    assert_eq!(served.text().await.unwrap(), document());
    server.stop().await;
    assert!(
        unserved.is_empty(),
        "the table entries the router does not serve:\n{}",
        unserved.join("\n")
    );
}

/// (c) On every path of the table, every method it does not list is
/// answered `405` with the table's methods in `Allow`, without reaching a
/// handler.
#[tokio::test]
async fn unlisted_methods_are_not_served() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start(data.path()).await;
    let f = fixtures(&server).await;
    let mut by_path: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (method, path) in routes() {
        by_path.entry(path).or_default().insert(method);
    }
    let mut served = Vec::new();
    for (template, listed) in &by_path {
        for method in ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
            if listed.contains(method) {
                continue;
            }
            // HEAD is sent as the GET of the same route would be, which
            // the fixtures make a 200: a HEAD a handler took answers so too.
            let like = if method == "HEAD" { "GET" } else { method };
            let (path, body, headers) = minimal(like, template, &f);
            let body = if method == "HEAD" { None } else { body };
            let answer = send(&server, method, &path, body, &headers).await;
            if answer.status != 405 {
                served.push(format!(
                    "{method} {path}: {} {}",
                    answer.status, answer.body
                ));
                continue;
            }
            if method != "HEAD" {
                assert_eq!(answer.body["code"], "invalid_request", "{method} {path}");
            }
            // The 405 names in `Allow` what the table lists for the path,
            // in the table's order.
            let allowed: BTreeSet<&str> = answer
                .allow
                .as_deref()
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .collect();
            assert_eq!(&allowed, listed, "{method} {path}: Allow");
        }
    }
    server.stop().await;
    assert!(
        served.is_empty(),
        "methods on a path of the table not answered 405:\n{}",
        served.join("\n")
    );
}

/// (c) A path the table lacks is `404 not_found`, `no such route`, for
/// every method (a method the router takes elsewhere included); a
/// malformed id on a path that checks it before the method keeps its own
/// answer whatever the method.
#[tokio::test]
async fn unserved_paths_are_no_such_route() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start(data.path()).await;
    let id = ulid();
    let paths = [
        "/nope".to_owned(),
        "/api".to_owned(),
        "/api/".to_owned(),
        "/api/moment".to_owned(),
        format!("/api/moments/{id}/turns/x"),
        format!("/api/moments/{id}/nope"),
        format!("/api/turns/{id}/x"),
        "/api/log".to_owned(),
        "/api/log/head/x".to_owned(),
        "/assets".to_owned(),
        "/assets/app.js/x".to_owned(),
        "/healthz/x".to_owned(),
    ];
    let mut wrong = Vec::new();
    for path in &paths {
        for method in ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
            let answer = send(&server, method, path, None, &[]).await;
            let detail = answer.body["detail"].as_str().unwrap_or_default();
            let fits = answer.status == 404
                && answer.allow.is_none()
                && (method == "HEAD"
                    || (answer.body["code"] == "not_found" && detail == "no such route"));
            if !fits {
                wrong.push(format!(
                    "{method} {path}: {} {}",
                    answer.status, answer.body
                ));
            }
        }
    }
    // The id of `/api/moments/{id}` and `/api/media/{id}`, and the name of
    // `/assets/{id}`, are refused before the method is.
    for (method, path, status, code) in [
        ("PUT", "/api/moments/not-a-ulid", 400, "invalid_id"),
        ("POST", "/api/media/not-a-ulid", 400, "invalid_id"),
        ("POST", "/assets/.hidden", 404, "not_found"),
        ("POST", "/api/turns/not-a-ulid", 405, "invalid_request"),
    ] {
        let answer = send(&server, method, path, None, &[]).await;
        if (answer.status, answer.body["code"].as_str()) != (status, Some(code)) {
            wrong.push(format!(
                "{method} {path}: {} {}",
                answer.status, answer.body
            ));
        }
    }
    server.stop().await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// (d) With a token configured, the operations the document marks
/// `security: []` answer without a token and every other answers `401
/// unauthorized`; with the token, none answers `401`.
#[tokio::test]
async fn security_matches_the_router() {
    use sha2::{Digest, Sha256};
    let doc = parsed();
    let data = tempfile::tempdir().unwrap();
    let mut config = settings(data.path());
    let token = "openapi-test-token";
    config.access.tokens.push(spark_engine::config::TokenEntry {
        device: "openapi-test".into(),
        sha256: hex::encode(Sha256::digest(token.as_bytes())),
    });
    let server = TestServer::start_with(config).await;
    let bearer = vec![("Authorization".to_owned(), format!("Bearer {token}"))];
    let mut wrong = Vec::new();
    for (method, template) in routes() {
        let op = &doc["paths"][template][method.to_ascii_lowercase()];
        let public = op
            .get("security")
            .and_then(Value::as_array)
            .is_some_and(|requirements| requirements.is_empty());
        // No fixtures exist: the id routes answer 404 once past the check.
        let path = template.replace("{id}", &ulid());
        let path = if template == "/api/messages" && method == "GET" {
            format!("{path}?thread={}", ulid())
        } else {
            path
        };
        let anonymous = send(&server, method, &path, None, &[]).await;
        let refused = anonymous.status == 401
            && (method == "HEAD" || anonymous.body["code"] == "unauthorized");
        if public == refused {
            wrong.push(format!(
                "{method} {template}: the document says {}, without a token it answers {} {}",
                if public { "public" } else { "bearer" },
                anonymous.status,
                anonymous.body
            ));
        }
        let with_token = send(&server, method, &path, None, &bearer).await;
        if with_token.status == 401 {
            wrong.push(format!("{method} {template}: 401 with a valid token"));
        }
    }
    server.stop().await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `ProblemCode` lists exactly the codes the server sends
/// (`spark_core::wire::problem::CODES`, which every `ApiError` is checked
/// against when made): `request_timeout` and `timeout` were missing.
#[test]
fn problem_codes_equal_the_codes_sent() {
    let doc = parsed();
    let listed: BTreeSet<String> = doc["components"]["schemas"]["ProblemCode"]["enum"]
        .as_array()
        .expect("ProblemCode is an enum")
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    let sent: BTreeSet<String> = spark_core::wire::problem::CODES
        .iter()
        .map(|(code, _)| (*code).to_owned())
        .collect();
    assert_eq!(listed, sent);
}
