//! Quick recall against a folded mirror: a recall writes its
//! `recall.start`, the moment it assembles (request id = recall id) and its
//! turn (request id `<recall id>:turn`); a retry answers or completes a
//! torn batch with the same ids (SPEC sections 2 and 4).

use crate::command::{Command, KeepPhrase, StartRecall, StartTurn};
use crate::error::{Conflict, EngineError};
use crate::ids::{mark_id, recall_turn_request_id, RequestIdError, RECALL_ID_MAX_BYTES};
use crate::mirror::Mirror;
use crate::op::{Entity, OpBody, OpKind, TurnMode};
use crate::outcome::Outcome;
use crate::rules::test_support::*;

fn keep(mirror: &mut Mirror, phrase: &str) {
    decided(
        mirror,
        Command::KeepPhrase(KeepPhrase {
            phrase: phrase.into(),
            moment_id: None,
            device: DEVICE.into(),
        }),
    )
    .unwrap();
}

fn recall(recall_id: Option<&str>, phrases_max: usize) -> Command {
    Command::StartRecall(StartRecall {
        recall_id: recall_id.map(str::to_owned),
        seat: "seat".into(),
        phrases_max,
        device: DEVICE.into(),
    })
}

/// A mirror with "eins", "zwei", "drei" kept in that order.
fn three_phrases() -> Mirror {
    let mut mirror = Mirror::new();
    for phrase in ["eins", "zwei", "drei"] {
        keep(&mut mirror, phrase);
    }
    mirror
}

#[test]
fn a_recall_without_a_kept_phrase_is_refused() {
    let mut mirror = Mirror::new();
    assert!(matches!(
        refusal(&mirror, recall(Some("r"), 5)),
        EngineError::Invalid(_)
    ));
    // A dropped phrase does not count.
    keep(&mut mirror, "eins");
    decided(
        &mut mirror,
        Command::DropPhrase(crate::command::DropPhrase {
            mark_id: mark_id("eins"),
            device: DEVICE.into(),
        }),
    )
    .unwrap();
    assert!(matches!(
        refusal(&mirror, recall(Some("r"), 5)),
        EngineError::Invalid(_)
    ));
}

#[test]
fn a_recall_writes_its_start_moment_and_turn_most_recent_phrase_first() {
    let mut mirror = three_phrases();
    let ops = writes(&mirror, recall(Some("r1"), 2));
    let [OpBody::RecallStart(start), OpBody::MomentCreate(moment), OpBody::TurnStart(turn)] =
        &ops[..]
    else {
        panic!("{ops:?}");
    };
    assert_eq!(start.id, "r1");
    assert_eq!(start.marks, [mark_id("drei"), mark_id("zwei")]);
    assert_eq!(
        (moment.id, moment.request_id.as_deref()),
        (start.moment_id, Some("r1"))
    );
    assert_eq!(moment.text.as_deref(), Some("drei\nzwei"));
    assert_eq!(
        (turn.id, turn.moment_id, turn.mode),
        (start.turn_id, start.moment_id, TurnMode::Recall)
    );
    assert_eq!(turn.request_id, Some(recall_turn_request_id("r1")));
    assert_ne!(start.moment_id, start.turn_id);

    decided(&mut mirror, recall(Some("r1"), 2)).unwrap();
    let row = mirror.requests.get("r1").unwrap();
    assert_eq!(
        (row.kind, row.entity),
        (OpKind::MomentCreate, Entity::Id(start.moment_id))
    );
    let row = mirror.requests.get(&recall_turn_request_id("r1")).unwrap();
    assert_eq!(
        (row.kind, row.entity),
        (OpKind::TurnStart, Entity::Id(start.turn_id))
    );
}

#[test]
fn a_retried_recall_answers_and_writes_nothing() {
    let mut mirror = three_phrases();
    decided(&mut mirror, recall(Some("r1"), 5)).unwrap();
    let seq = mirror.seq;
    let first = mirror.recalls["r1"].clone();
    // Even once another phrase is kept, the recall stays as it was.
    keep(&mut mirror, "vier");
    match decided(&mut mirror, recall(Some("r1"), 5)).unwrap() {
        Outcome::RecallStarted {
            created,
            replayed,
            recall,
        } => {
            assert!(!created);
            assert_eq!(replayed.unwrap().seq, first.seq);
            assert_eq!(recall.moment.id, first.moment_id);
            assert_eq!(recall.turn.id, first.turn_id);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(mirror.seq, seq + 1);
    assert_eq!(mirror.recalls["r1"], first);
}

#[test]
fn a_retry_completes_a_torn_recall_with_its_ids() {
    let mut mirror = three_phrases();
    let ops = writes(&mirror, recall(Some("r1"), 5));
    // Only the recall.start made it to the log.
    apply(&mut mirror, ops[0].clone());
    let OpBody::RecallStart(start) = &ops[0] else {
        panic!("{ops:?}")
    };
    let rest = writes(&mirror, recall(Some("r1"), 5));
    assert_eq!(rest, ops[1..]);
    // With the moment folded too, only the turn is missing.
    apply(&mut mirror, ops[1].clone());
    let rest = writes(&mirror, recall(Some("r1"), 5));
    assert!(matches!(&rest[..], [OpBody::TurnStart(t)] if t.id == start.turn_id));
}

#[test]
fn recall_ids_are_capped_and_minted_when_absent() {
    let mut mirror = three_phrases();
    assert_eq!(
        refusal(
            &mirror,
            recall(Some(&"r".repeat(RECALL_ID_MAX_BYTES + 1)), 5)
        ),
        EngineError::RequestId(RequestIdError::TooLong {
            len_bytes: RECALL_ID_MAX_BYTES + 1,
            max_bytes: RECALL_ID_MAX_BYTES,
        })
    );
    decided(
        &mut mirror,
        recall(Some(&"r".repeat(RECALL_ID_MAX_BYTES)), 5),
    )
    .unwrap();
    // Minted: the minter's first id is taken as a request id (a moment's),
    // so the recall takes the next.
    let mut mirror = three_phrases();
    apply(
        &mut mirror,
        create_op(7, Some(id(1001).to_string().as_str())),
    );
    let ops = writes(&mirror, recall(None, 5));
    assert!(matches!(&ops[0], OpBody::RecallStart(s) if s.id == id(1002).to_string()));
}

#[test]
fn a_recall_id_used_by_another_request_is_a_conflict() {
    let mut mirror = three_phrases();
    apply(&mut mirror, create_op(1, Some("r1")));
    assert_eq!(
        refusal(&mirror, recall(Some("r1"), 5)),
        EngineError::Conflict(Conflict::RequestId {
            request_id: "r1".into(),
            used_by_kind: OpKind::MomentCreate.name(),
            used_by: id(1).to_string(),
        })
    );
    // Its turn's request id taken by a client's turn: derived conflict.
    decided(
        &mut mirror,
        Command::StartTurn(StartTurn {
            moment_id: id(1),
            request_id: Some(recall_turn_request_id("r2")),
            seat: "seat".into(),
            device: DEVICE.into(),
        }),
    )
    .unwrap();
    assert_eq!(
        refusal(&mirror, recall(Some("r2"), 5)),
        EngineError::Conflict(Conflict::DerivedRequestId {
            request_id: recall_turn_request_id("r2"),
        })
    );
    assert!(mirror.recalls.is_empty());
}

#[test]
fn a_retry_of_a_torn_recall_whose_moment_was_deleted_is_refused_not_written() {
    // The recall.start and its moment made it to the log; the person
    // deleted the moment since. Its turn cannot be started on a tombstone
    // (the fold would refuse that op once durable): the rule refuses.
    let mut mirror = three_phrases();
    let ops = writes(&mirror, recall(Some("r1"), 5));
    apply(&mut mirror, ops[0].clone());
    apply(&mut mirror, ops[1].clone());
    let moment_id = mirror.recalls["r1"].moment_id;
    apply(
        &mut mirror,
        OpBody::MomentDelete(crate::op::MomentDelete {
            id: moment_id,
            request_id: None,
            device: DEVICE.into(),
        }),
    );
    assert_eq!(
        refusal(&mirror, recall(Some("r1"), 5)),
        EngineError::Deleted(moment_id)
    );
}
