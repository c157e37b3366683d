//! Turns against a folded mirror: a known request id answers its turn
//! (running or ended) and asks no brain; a request id of another kind, of
//! another moment or derived by a job or a recall is a conflict; the first
//! outcome stands (SPEC section 4).

use crate::command::{Command, EndTurn, StartJob, StartRecall, StartTurn};
use crate::error::{Conflict, EngineError};
use crate::ids::Id;
use crate::mirror::{Mirror, TurnStatus};
use crate::op::{Entity, OpBody, OpKind, TurnMode};
use crate::outcome::Outcome;
use crate::rules::test_support::*;

fn start(moment_id: Id, request_id: Option<&str>) -> Command {
    Command::StartTurn(StartTurn {
        moment_id,
        request_id: request_id.map(str::to_owned),
        seat: "seat".into(),
        device: DEVICE.into(),
    })
}

fn end(turn_id: Id, outcome: Result<&str, &str>) -> Command {
    Command::EndTurn(EndTurn {
        turn_id,
        outcome: outcome
            .map(|a| (a.to_owned(), "adapter".to_owned(), "copy".to_owned()))
            .map_err(str::to_owned),
        elapsed_ms: 12,
    })
}

/// The id of the turn a start answered with, and whether it was new.
fn started(outcome: Outcome) -> (bool, Id, &'static str) {
    match outcome {
        Outcome::TurnStarted { created, turn, .. } => (created, turn.id, turn.status),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_turn_may_not_reuse_a_request_id_a_job_or_a_recall_derived() {
    use crate::command::KeepPhrase;
    let mut mirror = Mirror::new();
    let m = moment(&mut mirror, 1);
    let turn = |moment_id: Id, request_id: &str| {
        Command::StartTurn(StartTurn {
            moment_id,
            request_id: Some(request_id.into()),
            seat: "seat".into(),
            device: "test".into(),
        })
    };
    let job = |job_id: &str| {
        Command::StartJob(StartJob {
            job_id: job_id.into(),
            moment_id: m,
            seats: vec!["a".into(), "b".into()],
            device: "test".into(),
        })
    };
    let derived = |request_id: &str| {
        EngineError::Conflict(Conflict::DerivedRequestId {
            request_id: request_id.into(),
        })
    };
    // A job's turns, on the same moment: 409, not the job's turn.
    decided(&mut mirror, job("job-7")).unwrap();
    assert_eq!(refusal(&mirror, turn(m, "job-7:0")), derived("job-7:0"));
    assert_eq!(refusal(&mirror, turn(m, "job-7:1")), derived("job-7:1"));
    // The job's own retry still answers with its turns.
    decided(&mut mirror, job("job-7")).unwrap();
    // A seat index the job does not have is an ordinary request id.
    decided(&mut mirror, turn(m, "job-7:2")).unwrap();
    // A turn first, then a job deriving its request id: 409 too.
    decided(&mut mirror, turn(m, "job-8:1")).unwrap();
    assert_eq!(refusal(&mirror, job("job-8")), derived("job-8:1"));
    // A recall's turn, on the recall's moment.
    decided(
        &mut mirror,
        Command::KeepPhrase(KeepPhrase {
            phrase: "ausfahrt".into(),
            moment_id: Some(m),
            device: "test".into(),
        }),
    )
    .unwrap();
    decided(
        &mut mirror,
        Command::StartRecall(StartRecall {
            recall_id: Some("r-1".into()),
            seat: "seat".into(),
            phrases_max: 5,
            device: "test".into(),
        }),
    )
    .unwrap();
    let recall_moment = mirror.recalls["r-1"].moment_id;
    assert_eq!(
        refusal(&mirror, turn(recall_moment, "r-1:turn")),
        derived("r-1:turn")
    );
}

#[test]
fn a_new_turn_gets_a_fresh_id_and_a_request_row() {
    // The minter's first id is a moment's: the turn must not take it.
    let mut mirror = folded([create_op(1, None), create_op(1001, None)]);
    let m = id(1);
    let ops = writes(&mirror, start(m, Some("t1")));
    assert!(matches!(&ops[..], [OpBody::TurnStart(t)]
        if t.id == id(1002) && t.moment_id == m && t.mode == TurnMode::Practical
            && t.request_id.as_deref() == Some("t1")));
    let (created, turn, status) = started(decided(&mut mirror, start(m, Some("t1"))).unwrap());
    assert_eq!((created, turn, status), (true, id(1002), "running"));
    let row = mirror.requests.get("t1").unwrap();
    assert_eq!(
        (row.kind, row.entity),
        (OpKind::TurnStart, Entity::Id(turn))
    );
    assert_eq!(mirror.moment(m).unwrap().turns(), [turn]);
}

#[test]
fn a_known_request_id_answers_its_turn_running_or_ended() {
    let mut mirror = folded([create_op(1, None)]);
    let m = id(1);
    let (_, turn, _) = started(decided(&mut mirror, start(m, Some("t1"))).unwrap());
    let start_seq = mirror.seq;
    match answered(&mirror, start(m, Some("t1"))) {
        Outcome::TurnStarted {
            created,
            replayed,
            turn: view,
        } => {
            assert!(!created);
            assert_eq!(view.id, turn);
            let replayed = replayed.unwrap();
            assert_eq!(replayed.seq, start_seq);
            assert_eq!(replayed.request_id.as_deref(), Some("t1"));
        }
        other => panic!("{other:?}"),
    }
    decided(&mut mirror, end(turn, Ok("Ausgang"))).unwrap();
    let seq = mirror.seq;
    let (created, again, status) = started(decided(&mut mirror, start(m, Some("t1"))).unwrap());
    assert_eq!((created, again, status), (false, turn, "done"));
    assert_eq!(mirror.seq, seq);
    // Without a request id, every start is a new turn.
    let (created, other, _) = started(decided(&mut mirror, start(m, None)).unwrap());
    assert!(created);
    assert_ne!(other, turn);
}

#[test]
fn a_turns_request_id_on_another_moment_or_kind_is_a_conflict() {
    let mut mirror = folded([create_op(1, Some("c1")), create_op(2, None)]);
    let (_, turn, _) = started(decided(&mut mirror, start(id(1), Some("t1"))).unwrap());
    assert_eq!(
        refusal(&mirror, start(id(2), Some("t1"))),
        EngineError::Conflict(Conflict::TurnRequest {
            request_id: "t1".into(),
            turn_id: turn,
            moment_id: id(1),
        })
    );
    assert_eq!(
        refusal(&mirror, start(id(1), Some("c1"))),
        EngineError::Conflict(Conflict::RequestId {
            request_id: "c1".into(),
            used_by_kind: OpKind::MomentCreate.name(),
            used_by: id(1).to_string(),
        })
    );
}

#[test]
fn a_turn_needs_a_live_moment() {
    let mut mirror = Mirror::new();
    assert_eq!(
        refusal(&mirror, start(id(9), None)),
        EngineError::MomentNotFound(id(9))
    );
    let m = moment(&mut mirror, 1);
    delete_moment(&mut mirror, m);
    assert_eq!(refusal(&mirror, start(m, None)), EngineError::Deleted(m));
}

#[test]
fn the_first_outcome_stands() {
    let mut mirror = folded([create_op(1, None)]);
    let (_, turn, _) = started(decided(&mut mirror, start(id(1), None)).unwrap());
    let ops = writes(&mirror, end(turn, Err("timeout")));
    assert!(matches!(&ops[..], [OpBody::TurnFail(f)] if f.id == turn && f.error == "timeout"));
    decided(&mut mirror, end(turn, Ok("Ausgang"))).unwrap();
    let seq = mirror.seq;
    // A late failure (or a second answer) changes nothing.
    for late in [end(turn, Err("timeout")), end(turn, Ok("Eingang"))] {
        match decided(&mut mirror, late).unwrap() {
            Outcome::TurnEnded { turn: view } => {
                assert_eq!(view.answer.as_deref(), Some("Ausgang"))
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(mirror.seq, seq);
    assert!(matches!(
        &mirror.turns[&turn].status,
        TurnStatus::Done { answer, elapsed_ms: 12, .. } if answer == "Ausgang"
    ));
}

#[test]
fn ending_an_unknown_turn_names_it() {
    let mirror = Mirror::new();
    assert_eq!(
        refusal(&mirror, end(id(4), Ok("x"))),
        EngineError::Missing(format!("turn {}", id(4)))
    );
}

#[test]
fn a_recall_turn_id_is_not_a_job_seat() {
    // A job seat index past the job's seats, and a recall id that is not a
    // recall: ordinary request ids (the derived check must not over-reach).
    let mut mirror = folded([create_op(1, None)]);
    decided(
        &mut mirror,
        Command::StartJob(StartJob {
            job_id: "job".into(),
            moment_id: id(1),
            seats: vec!["a".into()],
            device: DEVICE.into(),
        }),
    )
    .unwrap();
    decided(&mut mirror, start(id(1), Some("job:1"))).unwrap();
    decided(&mut mirror, start(id(1), Some("nope:turn"))).unwrap();
    // The recall that would derive "nope:turn" is now refused instead.
    decided(
        &mut mirror,
        Command::KeepPhrase(crate::command::KeepPhrase {
            phrase: "x".into(),
            moment_id: None,
            device: DEVICE.into(),
        }),
    )
    .unwrap();
    assert_eq!(
        refusal(
            &mirror,
            Command::StartRecall(StartRecall {
                recall_id: Some("nope".into()),
                seat: "seat".into(),
                phrases_max: 5,
                device: DEVICE.into(),
            })
        ),
        EngineError::Conflict(Conflict::DerivedRequestId {
            request_id: "nope:turn".into(),
        })
    );
}
