//! The moments routes over HTTP: the two keys, edits with If-Match and
//! request ids, tombstones, paging, and bad input that writes nothing
//! (SPEC sections 2-4, 8 and 10).

use crate::common;

use common::{log_records, ulid, TestServer};
use serde_json::{json, Value};

fn code(v: &Value) -> &str {
    v["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn moment_shape_has_every_member_and_canonical_ids() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let id = ulid();
    let (status, answer) = server
        .post(
            "/api/moments",
            json!({"id": id.to_lowercase(), "client_request_id": "r1", "text": "Zákaz vstupu",
                   "lang": "cs", "captured_at": "2026-09-02T03:07:00+02:00"}),
        )
        .await;
    assert_eq!(status, 201);
    let m = &answer["moment"];
    assert_eq!(m["id"], id.as_str(), "output is canonical upper case");
    assert_eq!(
        m["caption"],
        Value::Null,
        "missing optional members are null"
    );
    assert_eq!(m["captured_at"], "2026-09-02T01:07:00Z");
    assert_eq!(m["version"], 1);
    assert_eq!(m["deleted"], false);
    assert_eq!(m["media"], json!([]));
    assert_eq!(m["turns"], json!([]));
    assert!(m["created_at"].as_str().unwrap().ends_with('Z'));
    let (_, got, headers) = server
        .call("GET", &format!("/api/moments/{id}"), None, &[])
        .await;
    assert_eq!(&got, m);
    assert_eq!(headers["etag"], "\"1\"");
    server.stop().await;
}

#[tokio::test]
async fn edits_if_match_and_request_ids() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let id = ulid();
    server
        .post(
            "/api/moments",
            json!({"id": id, "client_request_id": "c1", "text": "a"}),
        )
        .await;
    let path = format!("/api/moments/{id}");

    let (s, v, _) = server
        .call(
            "PATCH",
            &path,
            Some(json!({"caption": "x"})),
            &[("If-Match", "\"1\"")],
        )
        .await;
    assert_eq!(
        (s, v["changed"].clone(), v["moment"]["version"].clone()),
        (200, json!(true), json!(2))
    );
    let (s, v, _) = server
        .call(
            "PATCH",
            &path,
            Some(json!({"caption": "y"})),
            &[("If-Match", "\"1\"")],
        )
        .await;
    assert_eq!((s, code(&v)), (412, "precondition_failed"));

    // A retried edit is recognised by its request id even after a later edit.
    let (s, v, _) = server
        .call(
            "PATCH",
            &path,
            Some(json!({"text": "b", "client_request_id": "e1"})),
            &[],
        )
        .await;
    assert_eq!((s, v["changed"].clone()), (200, json!(true)));
    server
        .call("PATCH", &path, Some(json!({"text": "c"})), &[])
        .await;
    let (s, v, _) = server
        .call(
            "PATCH",
            &path,
            Some(json!({"text": "b", "client_request_id": "e1"})),
            &[],
        )
        .await;
    assert_eq!(
        (s, v["changed"].clone(), v["moment"]["text"].clone()),
        (200, json!(false), json!("c"))
    );

    // null clears a member; an edit that changes nothing writes nothing.
    let (_, v, _) = server
        .call("PATCH", &path, Some(json!({"caption": null})), &[])
        .await;
    assert_eq!(
        (v["changed"].clone(), v["moment"]["caption"].clone()),
        (json!(true), Value::Null)
    );
    let (_, v, _) = server
        .call("PATCH", &path, Some(json!({"caption": null})), &[])
        .await;
    assert_eq!(v["changed"], false);

    // A request id already used by another kind of request is a conflict.
    let (s, v, _) = server
        .call(
            "PATCH",
            &path,
            Some(json!({"text": "d", "client_request_id": "c1"})),
            &[],
        )
        .await;
    assert_eq!((s, code(&v)), (409, "conflict"));
    // ... and so is an edit's request id sent for another moment.
    let other = ulid();
    server.post("/api/moments", json!({"id": other})).await;
    let (s, v, _) = server
        .call(
            "PATCH",
            &format!("/api/moments/{other}"),
            Some(json!({"text": "d", "client_request_id": "e1"})),
            &[],
        )
        .await;
    assert_eq!((s, code(&v)), (409, "conflict"));

    let (s, v, _) = server
        .call(
            "PATCH",
            &format!("/api/moments/{}", ulid()),
            Some(json!({"text": "z"})),
            &[],
        )
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"));
    server.stop().await;
    // create, caption, text b, text c, caption null, create of `other`.
    assert_eq!(log_records(dir.path()).len(), 6);
}

#[tokio::test]
async fn deletes_are_tombstones_and_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let id = ulid();
    server
        .post("/api/moments", json!({"id": id, "text": "Выход"}))
        .await;
    let path = format!("/api/moments/{id}");
    let (s, v, _) = server
        .call("DELETE", &path, None, &[("If-Match", "\"7\"")])
        .await;
    assert_eq!((s, code(&v)), (412, "precondition_failed"));
    let (s, v, _) = server
        .call("DELETE", &path, None, &[("Idempotency-Key", "del-1")])
        .await;
    assert_eq!(
        (s, v["deleted"].clone(), v["moment"]["deleted"].clone()),
        (200, json!(true), json!(true))
    );
    let (s, v, _) = server
        .call("DELETE", &path, None, &[("Idempotency-Key", "del-1")])
        .await;
    assert_eq!((s, v["deleted"].clone()), (200, json!(false)));
    let (s, v, _) = server.call("DELETE", &path, None, &[]).await;
    assert_eq!((s, v["deleted"].clone()), (200, json!(false)));
    let (s, v) = server.get(&path).await;
    assert_eq!((s, code(&v)), (410, "deleted"));
    let (s, v, _) = server
        .call("PATCH", &path, Some(json!({"text": "x"})), &[])
        .await;
    assert_eq!((s, code(&v)), (410, "deleted"));
    let (s, v) = server
        .post("/api/moments", json!({"id": id, "text": "again"}))
        .await;
    assert_eq!(
        (s, v["created"].clone(), v["moment"]["deleted"].clone()),
        (200, json!(false), json!(true))
    );
    let (s, v, _) = server
        .call("DELETE", &format!("/api/moments/{}", ulid()), None, &[])
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"));
    server.stop().await;
    assert_eq!(log_records(dir.path()).len(), 2);
}

/// From the delete on, no answer carries the moment's text, caption or
/// lang (SPEC section 13), not only its `410`: the delete's own answer, its
/// retries, and a retried create or edit answer the tombstone too, though
/// the content stays in the log until the erasure (a newcomer found it
/// in every one of these, 2026-12-04).
#[tokio::test]
async fn no_answer_after_a_delete_carries_the_moments_content() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let id = ulid();
    let path = format!("/api/moments/{id}");
    let create = json!({"id": id, "client_request_id": "c-del", "text": "WINDOWTEXT",
        "caption": "first", "lang": "en"});
    let (s, v) = server.post("/api/moments", create.clone()).await;
    assert_eq!((s, v["moment"]["text"].clone()), (201, json!("WINDOWTEXT")));
    let edit = json!({"caption": "WINDOWEDIT", "client_request_id": "e-del"});
    let (s, v, _) = server.call("PATCH", &path, Some(edit.clone()), &[]).await;
    assert_eq!(
        (s, v["moment"]["caption"].clone()),
        (200, json!("WINDOWEDIT"))
    );
    let gone = |what: &str, v: &serde_json::Value| {
        let moment = &v["moment"];
        assert_eq!(moment["id"], json!(id), "{what}: {v}");
        assert_eq!(moment["deleted"], json!(true), "{what}: {v}");
        for member in ["text", "caption", "lang"] {
            assert_eq!(moment[member], json!(null), "{what}: {member} in {v}");
        }
        let text = v.to_string();
        assert!(
            !text.contains("WINDOWTEXT") && !text.contains("WINDOWEDIT"),
            "{what}: {text}"
        );
    };
    let (s, v, _) = server
        .call("DELETE", &path, None, &[("Idempotency-Key", "d-del")])
        .await;
    assert_eq!((s, v["deleted"].clone()), (200, json!(true)));
    gone("the delete", &v);
    let (s, v, _) = server
        .call("DELETE", &path, None, &[("Idempotency-Key", "d-del")])
        .await;
    assert_eq!((s, v["deleted"].clone()), (200, json!(false)));
    gone("the delete retried", &v);
    let (s, v, _) = server.call("DELETE", &path, None, &[]).await;
    assert_eq!(s, 200);
    gone("another delete", &v);
    let (s, v) = server.post("/api/moments", create).await;
    assert_eq!((s, v["created"].clone()), (200, json!(false)));
    gone("the create retried", &v);
    let (s, v) = server
        .post("/api/moments", json!({"id": id, "text": "other"}))
        .await;
    assert_eq!((s, v["created"].clone()), (200, json!(false)));
    gone("a create of its id", &v);
    let (s, v, _) = server.call("PATCH", &path, Some(edit), &[]).await;
    assert_eq!(s, 200, "{v}");
    gone("the edit retried", &v);
    let (s, v) = server.get(&path).await;
    assert_eq!((s, code(&v)), (410, "deleted"));
    gone("the get", &v);
    server.stop().await;
}

#[tokio::test]
async fn list_pages_through_live_moments_in_id_order() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut ids: Vec<String> = (0..25).map(|_| ulid()).collect();
    for id in &ids {
        server.post("/api/moments", json!({"id": id})).await;
    }
    let dead = ids.remove(3);
    server
        .call("DELETE", &format!("/api/moments/{dead}"), None, &[])
        .await;
    ids.sort();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("/api/moments?limit=10&after={a}"),
            None => "/api/moments?limit=10".to_owned(),
        };
        let (s, v) = server.get(&path).await;
        assert_eq!(s, 200);
        for m in v["moments"].as_array().unwrap() {
            seen.push(m["id"].as_str().unwrap().to_owned());
        }
        match v["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, ids);
    // 0 is refused, naming the accepted range.
    let (s, v) = server.get("/api/moments?limit=0").await;
    assert_eq!((s, code(&v)), (400, "invalid_request"));
    let detail = v["detail"].as_str().unwrap();
    assert!(detail.contains("from 1 to 1000"), "{detail}");
    let (s, v) = server.get("/api/moments?after=nope").await;
    assert_eq!((s, code(&v)), (400, "invalid_id"));
    // A large limit is clamped, not refused, and the answer says so; a
    // limit within the range carries no such header.
    for path in [
        "/api/moments?limit=5000",
        "/api/phrases?limit=5000",
        // Past what any integer type holds: clamped too (it was refused).
        "/api/moments?limit=99999999999999999999999999",
    ] {
        let (s, v, headers) = server.call("GET", path, None, &[]).await;
        assert_eq!(s, 200, "{path}: {v}");
        assert_eq!(
            headers
                .get("spark-limit-clamped")
                .map(|h| h.to_str().unwrap()),
            Some("1000"),
            "{path}"
        );
    }
    let (s, v, headers) = server
        .call("GET", "/api/moments?limit=5000", None, &[])
        .await;
    assert_eq!(
        (s, v["moments"].as_array().unwrap().len()),
        (200, 24),
        "large limits are clamped, not refused"
    );
    assert!(headers.contains_key("spark-limit-clamped"));
    let (_, _, headers) = server
        .call("GET", "/api/moments?limit=1000", None, &[])
        .await;
    assert!(!headers.contains_key("spark-limit-clamped"));
    server.stop().await;
}

#[tokio::test]
async fn list_pages_newest_first_with_order_newest() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut ids: Vec<String> = (0..23).map(|_| ulid()).collect();
    for id in &ids {
        server.post("/api/moments", json!({"id": id})).await;
    }
    let dead = ids.remove(7);
    server
        .call("DELETE", &format!("/api/moments/{dead}"), None, &[])
        .await;
    ids.sort();
    ids.reverse();
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("/api/moments?order=newest&limit=10&after={a}"),
            None => "/api/moments?order=newest&limit=10".to_owned(),
        };
        let (s, v) = server.get(&path).await;
        assert_eq!(s, 200, "{path}: {v}");
        let page: Vec<String> = v["moments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect();
        pages.push(page);
        match v["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    // 22 live moments: 10, 10 and 2, highest id first, the deleted one left out.
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![10, 10, 2]
    );
    assert_eq!(pages.concat(), ids);
    // `oldest` is the default's order, spelled out.
    let (s, oldest) = server.get("/api/moments?order=oldest&limit=1000").await;
    assert_eq!(s, 200);
    let (_, default) = server.get("/api/moments?limit=1000").await;
    assert_eq!(oldest, default);
    // A moment made later (a later ULID) heads the first page.
    let newer = ulid();
    server.post("/api/moments", json!({"id": newer})).await;
    let (_, first) = server.get("/api/moments?order=newest&limit=1").await;
    assert_eq!(first["moments"][0]["id"], json!(newer));
    let (s, v) = server.get("/api/moments?order=backwards").await;
    assert_eq!((s, code(&v)), (400, "invalid_request"));
    assert!(v["detail"].as_str().unwrap().contains("newest"), "{v}");
    server.stop().await;
}

#[tokio::test]
async fn bad_input_gets_a_clear_4xx_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    type Case<'a> = (Value, Vec<(&'a str, &'a str)>, u16, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            json!({"client_request_id": "x".repeat(81)}),
            vec![],
            400,
            "request_id_too_long",
        ),
        (json!({"id": "not-a-ulid"}), vec![], 400, "invalid_id"),
        (
            json!({"id": "01M34QZRVNRE3CTR9Y63CF2TPU"}),
            vec![],
            400,
            "invalid_id",
        ),
        (
            json!({"text": "t", "surprise": 1}),
            vec![],
            400,
            "invalid_request",
        ),
        (json!({"text": 42}), vec![], 400, "invalid_request"),
        (
            json!({"client_request_id": "has space"}),
            vec![],
            400,
            "invalid_request",
        ),
        (
            json!({"client_request_id": ""}),
            vec![],
            400,
            "invalid_request",
        ),
        (
            json!({"client_request_id": "abc"}),
            vec![("Idempotency-Key", "abd")],
            400,
            "invalid_request",
        ),
        (
            json!({"captured_at": "yesterday"}),
            vec![],
            400,
            "invalid_request",
        ),
        (json!([1, 2]), vec![], 400, "invalid_request"),
        (
            json!(["01JDQ3ZC9W4G8Y7E6QJ2KX5N3M", "arr-1", "from an array"]),
            vec![],
            400,
            "invalid_request",
        ),
        (json!("just a string"), vec![], 400, "invalid_request"),
        (
            json!({"text": "z".repeat(70 * 1024)}),
            vec![],
            413,
            "too_large",
        ),
    ];
    for (body, headers, want_status, want_code) in cases {
        let (s, v, h) = server
            .call("POST", "/api/moments", Some(body.clone()), &headers)
            .await;
        assert_eq!((s, code(&v)), (want_status, want_code), "{body:.80}");
        assert_eq!(h["content-type"], "application/problem+json");
        for member in ["type", "title", "status", "detail", "code"] {
            assert!(v.get(member).is_some(), "problem lacks {member}: {v}");
        }
    }
    let raw = server
        .client
        .post(server.url("/api/moments"))
        .header("content-type", "application/json")
        .body("{\"text\": \"unterminated")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    // Duplicate members are refused, not "last one wins" (found by a
    // break-it run).
    let raw = server
        .client
        .post(server.url("/api/moments"))
        .header("content-type", "application/json")
        .body(r#"{"text": "a", "text": "b"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    let v: serde_json::Value = raw.json().await.unwrap();
    assert_eq!(code(&v), "invalid_request");
    assert!(
        v["detail"].as_str().unwrap().contains("duplicate field"),
        "{v}"
    );
    let (s, v) = server.get("/api/moments/not-a-ulid").await;
    assert_eq!((s, code(&v)), (400, "invalid_id"));
    let (s, v) = server.get("/api/nothing-here").await;
    assert_eq!((s, code(&v)), (404, "not_found"));
    let id = ulid();
    let (s, _) = server.post("/api/moments", json!({"id": id})).await;
    assert_eq!(s, 201);
    let (s, v, _) = server
        .call(
            "DELETE",
            &format!("/api/moments/{id}"),
            Some(json!(["del-rid"])),
            &[],
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (400, "invalid_request"),
        "an array is not a delete body"
    );
    let (s, v, _) = server
        .call(
            "PATCH",
            &format!("/api/moments/{id}"),
            Some(json!([null, "x"])),
            &[],
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (400, "invalid_request"),
        "an array is not an edit body"
    );
    let (s, _, h) = server.call("PUT", "/api/moments", None, &[]).await;
    assert_eq!((s, h["allow"].to_str().unwrap()), (405, "GET, POST"));
    let (s, _) = server
        .post("/api/moments", json!({"client_request_id": "y".repeat(80)}))
        .await;
    assert_eq!(s, 201, "80 bytes is within the limit");
    server.stop().await;
    assert_eq!(
        log_records(dir.path()).len(),
        2,
        "only the two valid creates were written"
    );
}

#[tokio::test]
async fn log_head_follows_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let (s, head0) = server.get("/api/log/head").await;
    assert_eq!((s, head0["seq"].clone()), (200, json!(0)));
    server.post("/api/moments", json!({"text": "a"})).await;
    server.post("/api/moments", json!({"text": "b"})).await;
    let (_, head) = server.get("/api/log/head").await;
    assert_eq!(head["seq"], 2);
    assert_eq!(head["segment"], "00000000000000000001.seg");
    let chain = head["chain"].as_str().unwrap();
    assert!(
        chain.len() == 64
            && chain
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    assert_ne!(head["chain"], head0["chain"]);
    server.stop().await;
}

/// Once fenced (another engine took the archive's prefix over, SPEC section
/// 11), every write answers `503 fenced` with nothing acknowledged,
/// `/readyz` says so, and reads keep working.
#[tokio::test]
async fn a_fenced_engine_answers_503_fenced_to_writes_and_keeps_reads() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let id = ulid();
    let (s, _) = server
        .post("/api/moments", json!({"id": id, "text": "before"}))
        .await;
    assert_eq!(s, 201);
    server
        .running
        .engine()
        .fence("manifest 7 was written by epoch 2".into());
    let (s, v) = server
        .post("/api/moments", json!({"id": ulid(), "text": "after"}))
        .await;
    assert_eq!((s, v["code"].clone()), (503, json!("fenced")), "{v}");
    assert_eq!(v["title"], json!("Fenced"));
    assert!(v["detail"].as_str().unwrap().contains("epoch 2"), "{v}");
    let (s, v) = server.get("/readyz").await;
    assert_eq!((s, v["code"].clone()), (503, json!("fenced")), "{v}");
    let (s, v) = server.get(&format!("/api/moments/{id}")).await;
    assert_eq!((s, v["text"].clone()), (200, json!("before")), "{v}");
    server.stop().await;
}
