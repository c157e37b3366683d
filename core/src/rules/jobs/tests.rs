//! High-quality jobs against a folded mirror: a job writes its
//! `job.start` and one turn per seat (request ids `<job id>:<index>`); a
//! retry answers or completes a torn batch; the job id is capped, bound to
//! its moment, and must be unused (SPEC sections 2 and 4).

use crate::command::{Command, StartJob, StartRecall};
use crate::error::{Conflict, EngineError};
use crate::ids::{job_turn_request_id, Id, RequestIdError, JOB_ID_MAX_BYTES, RECALL_ID_MAX_BYTES};
use crate::mirror::Mirror;
use crate::op::{Entity, JobStart, MomentDelete, OpBody, OpKind, TurnMode};
use crate::outcome::Outcome;
use crate::rules::test_support::*;

fn job(job_id: &str, moment_id: Id, seats: &[&str]) -> Command {
    Command::StartJob(StartJob {
        job_id: job_id.into(),
        moment_id,
        seats: seats.iter().map(|s| (*s).to_owned()).collect(),
        device: DEVICE.into(),
    })
}

#[test]
fn id_caps_hold_for_every_caller() {
    let mut mirror = Mirror::new();
    let m = moment(&mut mirror, 1);
    let recall = |id: String| {
        Command::StartRecall(StartRecall {
            recall_id: Some(id),
            seat: "seat".into(),
            phrases_max: 5,
            device: "test".into(),
        })
    };
    assert_eq!(
        refusal(&mirror, recall("r".repeat(RECALL_ID_MAX_BYTES + 1))),
        EngineError::RequestId(RequestIdError::TooLong {
            len_bytes: RECALL_ID_MAX_BYTES + 1,
            max_bytes: RECALL_ID_MAX_BYTES,
        })
    );
    let job = |id: String| {
        Command::StartJob(StartJob {
            job_id: id,
            moment_id: m,
            seats: vec!["seat".into()],
            device: "test".into(),
        })
    };
    assert_eq!(
        refusal(&mirror, job("j".repeat(JOB_ID_MAX_BYTES + 1))),
        EngineError::RequestId(RequestIdError::TooLong {
            len_bytes: JOB_ID_MAX_BYTES + 1,
            max_bytes: JOB_ID_MAX_BYTES,
        })
    );
    decided(&mut mirror, job("j".repeat(JOB_ID_MAX_BYTES))).unwrap();
    let other = moment(&mut mirror, 2);
    let mut moved = job("j".repeat(JOB_ID_MAX_BYTES));
    if let Command::StartJob(j) = &mut moved {
        j.moment_id = other;
    }
    let e = refusal(&mirror, moved);
    assert_eq!(
        e.to_string(),
        format!("job {:?} reads moment {m}", "j".repeat(JOB_ID_MAX_BYTES))
    );
}

#[test]
fn a_job_writes_its_start_and_one_turn_per_seat() {
    let mut mirror = folded([create_op(1, None)]);
    let m = id(1);
    let ops = writes(&mirror, job("j1", m, &["a", "b"]));
    assert_eq!(
        ops[0],
        OpBody::JobStart(JobStart {
            job_id: "j1".into(),
            moment_id: m,
            seats: vec!["a".into(), "b".into()],
            device: DEVICE.into(),
        })
    );
    let turns: Vec<_> = ops[1..]
        .iter()
        .map(|op| match op {
            OpBody::TurnStart(t) => {
                assert_eq!((t.moment_id, t.mode), (m, TurnMode::Practical));
                (t.id, t.seat.clone(), t.request_id.clone().unwrap())
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(turns.len(), 2);
    assert_ne!(turns[0].0, turns[1].0);
    assert_eq!(
        (&turns[0].1, &turns[0].2, &turns[1].1, &turns[1].2),
        (
            &"a".to_owned(),
            &job_turn_request_id("j1", 0),
            &"b".to_owned(),
            &job_turn_request_id("j1", 1)
        )
    );
    decided(&mut mirror, job("j1", m, &["a", "b"])).unwrap();
    let row = mirror.requests.get("j1").unwrap();
    assert_eq!(
        (row.kind, row.entity),
        (OpKind::JobStart, Entity::Name("j1".into()))
    );
    assert_eq!(mirror.moment(m).unwrap().turns().len(), 2);
}

#[test]
fn a_retried_job_answers_with_its_turns_and_writes_nothing() {
    let mut mirror = folded([create_op(1, None)]);
    decided(&mut mirror, job("j1", id(1), &["a", "b"])).unwrap();
    let seq = mirror.seq;
    let turns = mirror.moment(id(1)).unwrap().turns().to_vec();
    // Even if the configured seats changed since: the job keeps its own.
    match decided(&mut mirror, job("j1", id(1), &["c"])).unwrap() {
        Outcome::JobStarted {
            created,
            replayed,
            job,
        } => {
            assert!(!created);
            assert_eq!(replayed.unwrap().seq, mirror.jobs["j1"].seq);
            let ids: Vec<Id> = job.turns.iter().map(|t| t.id).collect();
            assert_eq!(ids, turns);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(mirror.seq, seq);
}

#[test]
fn a_retry_completes_a_torn_job() {
    let mut mirror = folded([create_op(1, None)]);
    let ops = writes(&mirror, job("j1", id(1), &["a", "b"]));
    // The job.start and the first seat's turn made it to the log.
    apply(&mut mirror, ops[0].clone());
    apply(&mut mirror, ops[1].clone());
    let rest = writes(&mirror, job("j1", id(1), &["a", "b"]));
    assert!(matches!(&rest[..], [OpBody::TurnStart(t)]
        if t.seat == "b" && t.request_id == Some(job_turn_request_id("j1", 1))));
}

#[test]
fn a_new_job_needs_an_unused_id_a_live_moment_and_a_seat() {
    let mut mirror = folded([create_op(1, Some("c1")), create_op(2, None)]);
    assert_eq!(
        refusal(&mirror, job("c1", id(1), &["a"])),
        EngineError::Conflict(Conflict::RequestId {
            request_id: "c1".into(),
            used_by_kind: OpKind::MomentCreate.name(),
            used_by: id(1).to_string(),
        })
    );
    assert!(matches!(
        refusal(&mirror, job("j1", id(1), &[])),
        EngineError::Invalid(_)
    ));
    assert_eq!(
        refusal(&mirror, job("j1", id(9), &["a"])),
        EngineError::MomentNotFound(id(9))
    );
    delete_moment(&mut mirror, id(2));
    assert_eq!(
        refusal(&mirror, job("j1", id(2), &["a"])),
        EngineError::Deleted(id(2))
    );
    assert!(mirror.jobs.is_empty());
}

#[test]
fn a_job_on_another_moment_is_a_conflict_naming_its_moment() {
    let mut mirror = folded([create_op(1, None), create_op(2, None)]);
    decided(&mut mirror, job("j1", id(1), &["a"])).unwrap();
    assert_eq!(
        refusal(&mirror, job("j1", id(2), &["a"])),
        EngineError::Conflict(Conflict::JobMoment {
            job_id: "j1".into(),
            moment_id: id(1),
        })
    );
}

#[test]
fn a_retry_of_a_torn_job_whose_moment_was_deleted_is_refused_not_written() {
    // The job.start and the first seat's turn made it to the log; the
    // moment was deleted since. The missing turn cannot be started on a
    // tombstone: the fold would refuse that op after it is durable (the
    // write path stops and replay stops at it), so the rule refuses first.
    let mut mirror = folded([create_op(1, None)]);
    let ops = writes(&mirror, job("j1", id(1), &["a", "b"]));
    apply(&mut mirror, ops[0].clone());
    apply(&mut mirror, ops[1].clone());
    delete_moment(&mut mirror, id(1));
    assert_eq!(
        refusal(&mirror, job("j1", id(1), &["a", "b"])),
        EngineError::Deleted(id(1))
    );
    // A whole job on a deleted moment still answers: nothing to write.
    let mut whole = folded([create_op(1, None)]);
    decided(&mut whole, job("j1", id(1), &["a"])).unwrap();
    apply(
        &mut whole,
        OpBody::MomentDelete(MomentDelete {
            id: id(1),
            request_id: None,
            device: DEVICE.into(),
        }),
    );
    assert!(matches!(
        answered(&whole, job("j1", id(1), &["a"])),
        Outcome::JobStarted { created: false, .. }
    ));
}
