//! Turns, kept phrases, quick recall and high-quality jobs over HTTP: asking
//! twice never launches twice (SPEC sections 2-4; the seed lesson "Two
//! meanings of replay").

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{log_records, settings, ulid, TestServer};
use serde_json::{json, Value};
use spark_core::op::OpKind;
use spark_engine::brain::scripted::ScriptedBrain;
use spark_engine::brain::Brain;

fn brain(b: &ScriptedBrain) -> Arc<dyn Brain> {
    Arc::new(b.clone())
}

async fn moment(server: &TestServer, text: &str) -> String {
    let id = ulid();
    let (s, _) = server
        .post("/api/moments", json!({"id": id, "text": text}))
        .await;
    assert_eq!(s, 201);
    id
}

fn count(dir: &std::path::Path, kind: OpKind) -> usize {
    log_records(dir)
        .iter()
        .filter(|(_, k)| *k == kind.code())
        .count()
}

async fn wait(server: &TestServer, turn: &str) -> Value {
    let (s, v) = server.get(&format!("/api/turns/{turn}?wait=20")).await;
    assert_eq!(s, 200);
    v
}

#[tokio::test]
async fn the_same_practical_request_twice_asks_the_brain_once() {
    let dir = tempfile::tempdir().unwrap();
    let pippa = ScriptedBrain::echo();
    let server =
        TestServer::start_with_brains(settings(dir.path()), vec![("pippa", brain(&pippa))]).await;
    let m = moment(&server, "Notausgang").await;
    let path = format!("/api/moments/{m}/turns");
    let body = json!({"client_request_id": "turn-1", "mode": "practical"});
    let (s1, a1) = server.post(&path, body.clone()).await;
    assert_eq!((s1, a1["created"].clone()), (202, json!(true)), "{a1}");
    let turn = a1["turn"]["id"].as_str().unwrap().to_owned();
    assert_eq!(a1["turn"]["request_id"], "turn-1");
    assert_eq!(a1["turn"]["seat"], "pippa");
    let (s2, a2) = server.post(&path, body.clone()).await;
    assert_eq!((s2, a2["turn"]["id"].as_str()), (200, Some(turn.as_str())));
    let done = wait(&server, &turn).await;
    assert_eq!(done["status"], "done");
    assert_eq!(done["answer"], "echo: Notausgang");
    assert_eq!(done["error"], Value::Null);
    // After it finished, the same request still answers with that turn.
    let (s3, a3) = server.post(&path, body).await;
    assert_eq!((s3, a3["turn"]["status"].clone()), (200, json!("done")));
    assert_eq!(pippa.calls(), 1, "the brain was asked exactly once");
    // The moment lists its turn and counts it in its version.
    let (_, got) = server.get(&format!("/api/moments/{m}")).await;
    assert_eq!(got["turns"], json!([turn]));
    assert_eq!(got["version"], 2);
    // The request id of a turn is not a create's, nor another moment's.
    let other = moment(&server, "Ausgang").await;
    let (s, v) = server
        .post(
            &format!("/api/moments/{other}/turns"),
            json!({"client_request_id": "turn-1"}),
        )
        .await;
    assert_eq!((s, v["code"].clone()), (409, json!("conflict")));
    let (s, v) = server
        .post("/api/moments", json!({"client_request_id": "turn-1"}))
        .await;
    assert_eq!((s, v["code"].clone()), (409, json!("conflict")));
    server.stop().await;
    assert_eq!(count(dir.path(), OpKind::TurnStart), 1);
    assert_eq!(count(dir.path(), OpKind::TurnFinish), 1);
}

#[tokio::test]
async fn a_turn_left_running_by_a_stop_is_asked_again_after_restart_once() {
    let dir = tempfile::tempdir().unwrap();
    let held = ScriptedBrain::answering("never recorded").gated();
    let server =
        TestServer::start_with_brains(settings(dir.path()), vec![("pippa", brain(&held))]).await;
    let m = moment(&server, "Kein Zutritt").await;
    let (_, a) = server
        .post(
            &format!("/api/moments/{m}/turns"),
            json!({"client_request_id": "t"}),
        )
        .await;
    let turn = a["turn"]["id"].as_str().unwrap().to_owned();
    tokio::time::timeout(Duration::from_secs(10), held.wait_for_calls(1))
        .await
        .unwrap();
    // Stop while the brain is still thinking: no outcome is recorded.
    server.stop().await;
    assert_eq!(
        count(dir.path(), OpKind::TurnFinish) + count(dir.path(), OpKind::TurnFail),
        0
    );

    let again = ScriptedBrain::answering("Kein Zutritt: no entry.");
    let server =
        TestServer::start_with_brains(settings(dir.path()), vec![("pippa", brain(&again))]).await;
    let done = wait(&server, &turn).await;
    assert_eq!(
        (done["status"].clone(), done["answer"].clone()),
        (json!("done"), json!("Kein Zutritt: no entry."))
    );
    assert_eq!(again.calls(), 1, "asked again once");
    // A further restart asks nothing: the turn has its outcome.
    server.stop().await;
    let third = ScriptedBrain::answering("x");
    let server =
        TestServer::start_with_brains(settings(dir.path()), vec![("pippa", brain(&third))]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(third.calls(), 0);
    server.stop().await;
    assert_eq!(count(dir.path(), OpKind::TurnStart), 1);
    assert_eq!(count(dir.path(), OpKind::TurnFinish), 1);
}

#[tokio::test]
async fn errors_and_timeouts_become_failed_turns() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.brains.timeout_ms = 300;
    let slow = ScriptedBrain::answering("late").with_delay(Duration::from_secs(5));
    let broken = ScriptedBrain::failing("the model is down");
    let server =
        TestServer::start_with_brains(s, vec![("slow", brain(&slow)), ("broken", brain(&broken))])
            .await;
    let m = moment(&server, "PUSH").await;
    let (_, a) = server
        .post(&format!("/api/moments/{m}/turns"), json!({}))
        .await;
    let failed = wait(&server, a["turn"]["id"].as_str().unwrap()).await;
    assert_eq!(failed["status"], "failed");
    assert!(
        failed["error"].as_str().unwrap().contains("300 ms"),
        "{failed}"
    );
    let (_, a) = server
        .post(
            &format!("/api/moments/{m}/turns"),
            json!({"seat": "broken"}),
        )
        .await;
    let failed = wait(&server, a["turn"]["id"].as_str().unwrap()).await;
    assert_eq!(
        (failed["status"].clone(), failed["error"].clone()),
        (json!("failed"), json!("the model is down"))
    );
    let (s, v) = server
        .post(
            &format!("/api/moments/{m}/turns"),
            json!({"seat": "nobody"}),
        )
        .await;
    assert_eq!((s, v["code"].clone()), (400, json!("invalid_request")));
    let (s, _) = server
        .post(
            &format!("/api/moments/{m}/turns"),
            json!({"mode": "recall"}),
        )
        .await;
    assert_eq!(s, 400);
    let (s, _) = server
        .post(&format!("/api/moments/{}/turns", ulid()), json!({}))
        .await;
    assert_eq!(s, 404);
    let (s, _) = server.get(&format!("/api/turns/{}", ulid())).await;
    assert_eq!(s, 404);
    server.stop().await;
}

#[tokio::test]
async fn a_long_poll_returns_when_the_turn_ends() {
    let dir = tempfile::tempdir().unwrap();
    let held = ScriptedBrain::answering("done now").gated();
    let server = Arc::new(
        TestServer::start_with_brains(settings(dir.path()), vec![("pippa", brain(&held))]).await,
    );
    let m = moment(&server, "Sackgasse").await;
    let (_, a) = server
        .post(&format!("/api/moments/{m}/turns"), json!({}))
        .await;
    let turn = a["turn"]["id"].as_str().unwrap().to_owned();
    let (s, v) = server.get(&format!("/api/turns/{turn}?wait=0")).await;
    assert_eq!((s, v["status"].clone()), (200, json!("running")));
    let poll = {
        let server = Arc::clone(&server);
        let turn = turn.clone();
        tokio::spawn(async move { server.get(&format!("/api/turns/{turn}?wait=30")).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!poll.is_finished(), "the poll waits while the turn runs");
    held.release(1);
    let (s, v) = tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((s, v["status"].clone()), (200, json!("done")));
    let (s, _) = server.get(&format!("/api/turns/{turn}?wait=soon")).await;
    assert_eq!(s, 400);
    Arc::into_inner(server).unwrap().stop().await;
}

#[tokio::test]
async fn phrases_recall_and_jobs_create_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let pippa = ScriptedBrain::echo();
    let ada = ScriptedBrain::answering("a second opinion");
    let server = TestServer::start_with_brains(
        settings(dir.path()),
        vec![("pippa", brain(&pippa)), ("ada", brain(&ada))],
    )
    .await;
    let m = moment(&server, "Bitte nicht rauchen").await;

    // Keep: NFKC, lower case, trimmed, single spaces; again writes nothing.
    let (s, v) = server
        .post(
            "/api/phrases",
            json!({"phrase": "  Bitte   NICHT rauchen ", "moment_id": m}),
        )
        .await;
    assert_eq!(
        (s, v["mark"]["id"].clone()),
        (201, json!("keep:bitte nicht rauchen"))
    );
    assert_eq!(v["mark"]["moment_id"], m.as_str());
    let (s, v) = server
        .post("/api/phrases", json!({"phrase": "bitte nicht rauchen"}))
        .await;
    assert_eq!((s, v["created"].clone()), (200, json!(false)));
    let (s, _) = server
        .post("/api/phrases", json!({"phrase": "ＡＵＳＧＡＮＧ"}))
        .await;
    assert_eq!(s, 201);
    let (s, _) = server.post("/api/phrases", json!({"phrase": "   "})).await;
    assert_eq!(s, 400);
    let (s, _) = server
        .post("/api/phrases", json!({"phrase": "x".repeat(201)}))
        .await;
    assert_eq!(s, 400);
    let (_, list) = server.get("/api/phrases").await;
    let ids: Vec<_> = list["marks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(
        ids,
        vec![json!("keep:ausgang"), json!("keep:bitte nicht rauchen")]
    );

    // Drop, drop again, keep again.
    let (s, v, _) = server
        .call("DELETE", "/api/phrases/keep:ausgang", None, &[])
        .await;
    assert_eq!(
        (s, v["dropped"].clone(), v["mark"]["active"].clone()),
        (200, json!(true), json!(false))
    );
    let (s, v, _) = server
        .call("DELETE", "/api/phrases/keep%3Aausgang", None, &[])
        .await;
    assert_eq!((s, v["dropped"].clone()), (200, json!(false)));
    let (s, _, _) = server
        .call("DELETE", "/api/phrases/keep:never%20kept", None, &[])
        .await;
    assert_eq!(s, 404);
    let (s, _) = server
        .post("/api/phrases", json!({"phrase": "Ausgang"}))
        .await;
    assert_eq!(s, 201, "keeping a dropped phrase writes a keep");

    // Recall: the most recent phrases first; a retry lands on the same ids.
    let (s, r1) = server.post("/api/recall", json!({"id": "recall-1"})).await;
    assert_eq!(s, 202, "{r1}");
    let recall = &r1["recall"];
    assert_eq!(recall["id"], "recall-1");
    assert_eq!(recall["moment"]["text"], "ausgang\nbitte nicht rauchen");
    assert_eq!(recall["turn"]["request_id"], "recall-1:turn");
    assert_eq!(recall["turn"]["mode"], "recall");
    let (s, r2) = server.post("/api/recall", json!({"id": "recall-1"})).await;
    assert_eq!(s, 200);
    assert_eq!(r2["recall"]["moment"]["id"], recall["moment"]["id"]);
    assert_eq!(r2["recall"]["turn"]["id"], recall["turn"]["id"]);
    let (s, v) = server
        .post("/api/recall", json!({"id": "r".repeat(71)}))
        .await;
    assert_eq!((s, v["code"].clone()), (400, json!("request_id_too_long")));
    let (s, minted) = server.post("/api/recall", json!({})).await;
    assert_eq!(s, 202);
    assert_eq!(minted["recall"]["id"].as_str().unwrap().len(), 26);
    // A recall id used again by a create is another kind of request (SPEC
    // section 3), not the recall's moment (found by a break-it run).
    let (s, v) = server
        .post(
            "/api/moments",
            json!({"client_request_id": "recall-1", "text": "NOTAUSGANG"}),
        )
        .await;
    assert_eq!((s, v["code"].clone()), (409, json!("conflict")), "{v}");

    // Jobs: one turn per seat, <job id>:<index> in seat order.
    let (s, j1) = server
        .post("/api/jobs", json!({"job_id": "job-1", "moment_id": m}))
        .await;
    assert_eq!(s, 202, "{j1}");
    let turns = j1["job"]["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2);
    assert_eq!(
        (turns[0]["request_id"].clone(), turns[0]["seat"].clone()),
        (json!("job-1:0"), json!("pippa"))
    );
    assert_eq!(
        (turns[1]["request_id"].clone(), turns[1]["seat"].clone()),
        (json!("job-1:1"), json!("ada"))
    );
    let (s, j2) = server
        .post("/api/jobs", json!({"job_id": "job-1", "moment_id": m}))
        .await;
    assert_eq!(s, 200);
    assert_eq!(j2["job"]["turns"][1]["id"], turns[1]["id"]);
    // A turn started with a request id the job or the recall derived, on
    // the same moment, is another kind of request: 409, not their turn.
    let recall_moment = recall["moment"]["id"].as_str().unwrap();
    for (moment_id, request_id) in [(m.as_str(), "job-1:0"), (recall_moment, "recall-1:turn")] {
        let (s, v) = server
            .post(
                &format!("/api/moments/{moment_id}/turns"),
                json!({"client_request_id": request_id}),
            )
            .await;
        assert_eq!(
            (s, v["code"].clone(), v["conflict"].clone()),
            (409, json!("conflict"), json!("derived_request_id")),
            "{request_id}: {v}"
        );
    }
    let (s, v) = server
        .post(
            "/api/jobs",
            json!({"job_id": "j".repeat(65), "moment_id": m}),
        )
        .await;
    assert_eq!((s, v["code"].clone()), (400, json!("request_id_too_long")));
    let (s, _) = server
        .post("/api/jobs", json!({"job_id": "job-1", "moment_id": ulid()}))
        .await;
    assert_eq!(s, 409, "a job id names one moment");
    let (s, _) = server
        .post("/api/jobs", json!({"job_id": "job-2", "moment_id": ulid()}))
        .await;
    assert_eq!(s, 404);
    for t in turns {
        assert_eq!(
            wait(&server, t["id"].as_str().unwrap()).await["status"],
            "done"
        );
    }
    assert_eq!(ada.calls(), 1);
    server.stop().await;
    assert_eq!(count(dir.path(), OpKind::RecallStart), 2);
    assert_eq!(count(dir.path(), OpKind::JobStart), 1);
    assert_eq!(count(dir.path(), OpKind::MarkKeep), 3);
    assert_eq!(count(dir.path(), OpKind::MarkDrop), 1);
    // Two recall turns and two job turns.
    assert_eq!(count(dir.path(), OpKind::TurnStart), 4);
}

#[tokio::test]
async fn recall_with_no_kept_phrase_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let (s, v) = server.post("/api/recall", json!({"id": "r-empty"})).await;
    assert_eq!((s, v["code"].clone()), (400, json!("invalid_request")));
    server.stop().await;
    assert_eq!(log_records(dir.path()).len(), 0);
}

#[tokio::test]
async fn an_answer_too_large_for_the_log_fails_its_turn_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.limits.json_body_limit_bytes = 16 * 1024;
    settings.log.max_record_bytes = 32 * 1024;
    let huge = ScriptedBrain::answering("A".repeat(100 * 1024));
    let server =
        TestServer::start_with_brains(settings.clone(), vec![("huge", brain(&huge))]).await;
    let m = moment(&server, "Notausgang").await;
    let (s, v) = server
        .post(
            &format!("/api/moments/{m}/turns"),
            json!({"client_request_id": "big-1", "mode": "practical"}),
        )
        .await;
    assert_eq!(s, 202, "{v}");
    let turn = v["turn"]["id"].as_str().unwrap().to_owned();
    let ended = wait(&server, &turn).await;
    assert_eq!(ended["status"], "failed", "{ended}");
    assert!(
        ended["error"]
            .as_str()
            .unwrap()
            .contains("over the log's record limit of 32768 bytes"),
        "{ended}"
    );
    // The write path goes on (it used to stop until restart, and the turn,
    // left running, stopped it again after every restart).
    let (s, _) = server
        .post("/api/moments", json!({"id": ulid(), "text": "after"}))
        .await;
    assert_eq!(s, 201);
    let (s, _) = server.get("/readyz").await;
    assert_eq!(s, 200);
    server.stop().await;
    assert_eq!(count(dir.path(), OpKind::TurnFail), 1);
    assert_eq!(count(dir.path(), OpKind::TurnFinish), 0);

    // After a restart the turn stays failed: the brain is not asked again.
    let calls = huge.calls();
    let server = TestServer::start_with_brains(settings, vec![("huge", brain(&huge))]).await;
    let (s, v) = server.get(&format!("/api/turns/{turn}")).await;
    assert_eq!((s, v["status"].clone()), (200, json!("failed")));
    assert_eq!(huge.calls(), calls);
    server.stop().await;
}
