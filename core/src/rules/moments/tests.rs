//! The moment rules against a folded mirror: the two keys of a create
//! (request id first, then entity id), edits with `If-Match`, deletes and
//! their replays (SPEC section 3).

use crate::command::{Command, DeleteMoment, EditMoment, FieldChange};
use crate::error::{Conflict, EngineError};
use crate::ids::{RequestIdError, REQUEST_ID_MAX_BYTES};
use crate::mirror::Mirror;
use crate::op::{Entity, MomentEdit, OpBody, OpKind};
use crate::outcome::{Outcome, Replay};
use crate::rules::test_support::*;

fn edit(n: u128, request_id: Option<&str>, if_match: Option<u32>, text: FieldChange) -> Command {
    Command::EditMoment(EditMoment {
        id: id(n),
        request_id: request_id.map(str::to_owned),
        if_match,
        text,
        caption: None,
        lang: None,
        device: DEVICE.into(),
    })
}

fn delete(n: u128, request_id: Option<&str>, if_match: Option<u32>) -> Command {
    Command::DeleteMoment(DeleteMoment {
        id: id(n),
        request_id: request_id.map(str::to_owned),
        if_match,
        device: DEVICE.into(),
    })
}

fn set(text: &str) -> FieldChange {
    Some(Some(text.to_owned()))
}

/// The created flag, the replay and the moment's id of a create's answer.
fn created(outcome: Outcome) -> (bool, Option<Replay>, crate::ids::Id) {
    match outcome {
        Outcome::MomentCreated {
            created,
            replayed,
            moment,
        } => (created, replayed, moment.id),
        other => panic!("not a create's answer: {other:?}"),
    }
}

#[test]
fn a_new_create_writes_one_op_and_leaves_a_request_row() {
    let mut mirror = Mirror::new();
    let ops = writes(&mirror, create(Some(id(1)), Some("r1")));
    assert_eq!(ops.len(), 1);
    assert!(matches!(&ops[0], OpBody::MomentCreate(c)
        if c.id == id(1) && c.request_id.as_deref() == Some("r1")));
    let (was_created, replayed, moment) =
        created(decided(&mut mirror, create(Some(id(1)), Some("r1"))).unwrap());
    assert_eq!((was_created, replayed, moment), (true, None, id(1)));
    assert_eq!(mirror.seq, 1);
    let row = mirror.requests.get("r1").unwrap();
    assert_eq!(
        (row.seq, row.kind, row.entity),
        (1, OpKind::MomentCreate, Entity::Id(id(1)))
    );
}

#[test]
fn a_known_entity_id_answers_the_moment_and_writes_nothing() {
    let mut mirror = folded([create_op(1, None)]);
    let (was_created, replayed, moment) = created(answered(&mirror, create(Some(id(1)), None)));
    assert!(!was_created);
    assert_eq!(moment, id(1));
    assert_eq!(
        replayed,
        Some(Replay {
            seq: 1,
            ts_ms: NOW_MS + 1,
            request_id: None,
        })
    );
    // A new request id does not make a known entity new (key 2), and
    // leaves no row: nothing was written.
    let (was_created, _, _) = created(answered(&mirror, create(Some(id(1)), Some("fresh"))));
    assert!(!was_created);
    // Deleted or not: a tombstone answers too.
    decided(&mut mirror, delete(1, None, None)).unwrap();
    let seq = mirror.seq;
    let outcome = decided(&mut mirror, create(Some(id(1)), None)).unwrap();
    assert_eq!(mirror.seq, seq);
    match outcome {
        Outcome::MomentCreated {
            created: false,
            moment,
            ..
        } => assert!(moment.deleted),
        other => panic!("{other:?}"),
    }
    assert!(!mirror.requests.contains_key("fresh"));
}

#[test]
fn a_known_request_id_answers_its_moment_whatever_id_it_carries_now() {
    let mut mirror = folded([create_op(1, Some("r1"))]);
    let seq = mirror.seq;
    let (was_created, replayed, moment) =
        created(decided(&mut mirror, create(Some(id(2)), Some("r1"))).unwrap());
    assert!(!was_created);
    assert_eq!(moment, id(1));
    assert_eq!(replayed.unwrap().request_id.as_deref(), Some("r1"));
    assert_eq!(mirror.seq, seq);
    assert!(mirror.moment(id(2)).is_none());
    // Without an id at all, the same.
    let (_, _, moment) = created(answered(&mirror, create(None, Some("r1"))));
    assert_eq!(moment, id(1));
}

#[test]
fn a_request_id_of_another_kind_is_a_conflict_naming_its_user() {
    let mut mirror = folded([create_op(1, None)]);
    decided(&mut mirror, edit(1, Some("e1"), None, set("x"))).unwrap();
    assert_eq!(
        refusal(&mirror, create(Some(id(2)), Some("e1"))),
        EngineError::Conflict(Conflict::RequestId {
            request_id: "e1".into(),
            used_by_kind: OpKind::MomentEdit.name(),
            used_by: id(1).to_string(),
        })
    );
    assert!(mirror.moment(id(2)).is_none());
}

#[test]
fn a_recall_id_sent_as_a_creates_request_id_is_a_conflict() {
    let mut mirror = Mirror::new();
    moment(&mut mirror, 1);
    decided(
        &mut mirror,
        Command::KeepPhrase(crate::command::KeepPhrase {
            phrase: "ausgang".into(),
            moment_id: None,
            device: DEVICE.into(),
        }),
    )
    .unwrap();
    decided(
        &mut mirror,
        Command::StartRecall(crate::command::StartRecall {
            recall_id: Some("rc".into()),
            seat: "seat".into(),
            phrases_max: 5,
            device: DEVICE.into(),
        }),
    )
    .unwrap();
    assert_eq!(
        refusal(&mirror, create(Some(id(9)), Some("rc"))),
        EngineError::Conflict(Conflict::RequestId {
            request_id: "rc".into(),
            used_by_kind: OpKind::RecallStart.name(),
            used_by: "rc".into(),
        })
    );
}

#[test]
fn a_create_without_id_mints_one_no_moment_has() {
    // The minter's first id is taken: the rule must skip it.
    let mirror = folded([create_op(1001, None)]);
    let ops = writes(&mirror, create(None, None));
    assert!(matches!(&ops[..], [OpBody::MomentCreate(c)] if c.id == id(1002)));
}

#[test]
fn a_request_id_over_its_cap_is_refused_before_anything_is_looked_up() {
    let mut mirror = Mirror::new();
    let long = "r".repeat(REQUEST_ID_MAX_BYTES + 1);
    assert_eq!(
        refusal(&mirror, create(Some(id(1)), Some(&long))),
        EngineError::RequestId(RequestIdError::TooLong {
            len_bytes: REQUEST_ID_MAX_BYTES + 1,
            max_bytes: REQUEST_ID_MAX_BYTES,
        })
    );
    let at_cap = "r".repeat(REQUEST_ID_MAX_BYTES);
    decided(&mut mirror, create(Some(id(1)), Some(&at_cap))).unwrap();
    assert!(matches!(
        refusal(&mirror, edit(1, Some(&long), None, set("x"))),
        EngineError::RequestId(_)
    ));
    assert!(matches!(
        refusal(&mirror, delete(1, Some(&long), None)),
        EngineError::RequestId(_)
    ));
}

#[test]
fn an_edit_writes_only_the_fields_that_change() {
    let mut mirror = folded([create_op(1, None)]);
    let ops = writes(
        &mirror,
        Command::EditMoment(EditMoment {
            id: id(1),
            request_id: None,
            if_match: None,
            text: set("Ausgang"),
            caption: Some(None), // already absent: no change
            lang: None,
            device: DEVICE.into(),
        }),
    );
    assert_eq!(
        ops,
        [OpBody::MomentEdit(MomentEdit {
            id: id(1),
            request_id: None,
            device: DEVICE.into(),
            text: set("Ausgang"),
            caption: None,
            lang: None,
        })]
    );
    decided(&mut mirror, edit(1, None, None, set("Ausgang"))).unwrap();
    let m = mirror.moment(id(1)).unwrap();
    assert_eq!((m.text(), m.version), (Some("Ausgang"), 2));
    // The same value again writes nothing and says so.
    match answered(&mirror, edit(1, None, None, set("Ausgang"))) {
        Outcome::MomentEdited { changed, moment } => {
            assert!(!changed);
            assert_eq!(moment.version, 2);
        }
        other => panic!("{other:?}"),
    }
    // Clearing it is a change.
    decided(&mut mirror, edit(1, None, None, Some(None))).unwrap();
    let m = mirror.moment(id(1)).unwrap();
    assert_eq!((m.text(), m.version), (None, 3));
}

#[test]
fn if_match_must_name_the_current_version() {
    let mut mirror = folded([create_op(1, None)]);
    assert_eq!(
        refusal(&mirror, edit(1, None, Some(2), set("x"))),
        EngineError::PreconditionFailed {
            current: 1,
            expected: 2,
        }
    );
    decided(&mut mirror, edit(1, None, Some(1), set("x"))).unwrap();
    assert_eq!(mirror.moment(id(1)).unwrap().version, 2);
    // The old version is now stale, for edits and deletes alike.
    assert_eq!(
        refusal(&mirror, edit(1, None, Some(1), set("y"))),
        EngineError::PreconditionFailed {
            current: 2,
            expected: 1,
        }
    );
    assert_eq!(
        refusal(&mirror, delete(1, None, Some(1))),
        EngineError::PreconditionFailed {
            current: 2,
            expected: 1,
        }
    );
    decided(&mut mirror, delete(1, None, Some(2))).unwrap();
    assert!(mirror.moment(id(1)).unwrap().deleted);
}

#[test]
fn a_retried_edit_is_recognised_after_a_later_edit() {
    let mut mirror = folded([create_op(1, None), create_op(2, None)]);
    decided(&mut mirror, edit(1, Some("e1"), None, set("first"))).unwrap();
    decided(&mut mirror, edit(1, Some("e2"), None, set("second"))).unwrap();
    let seq = mirror.seq;
    // The retry of e1 does not put "first" back: it answers the moment as
    // it is now, unchanged.
    match decided(&mut mirror, edit(1, Some("e1"), None, set("first"))).unwrap() {
        Outcome::MomentEdited { changed, moment } => {
            assert!(!changed);
            assert_eq!(moment.text.as_deref(), Some("second"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(mirror.seq, seq);
    // The same request id on another moment is a conflict.
    assert_eq!(
        refusal(&mirror, edit(2, Some("e1"), None, set("x"))),
        EngineError::Conflict(Conflict::RequestId {
            request_id: "e1".into(),
            used_by_kind: OpKind::MomentEdit.name(),
            used_by: id(1).to_string(),
        })
    );
}

#[test]
fn edits_need_a_live_moment() {
    let mut mirror = folded([create_op(1, None)]);
    assert_eq!(
        refusal(&mirror, edit(7, None, None, set("x"))),
        EngineError::MomentNotFound(id(7))
    );
    decided(&mut mirror, delete(1, None, None)).unwrap();
    assert_eq!(
        refusal(&mirror, edit(1, None, None, set("x"))),
        EngineError::Deleted(id(1))
    );
}

#[test]
fn a_delete_writes_once_then_answers_deleted_false() {
    let mut mirror = folded([create_op(1, None)]);
    assert_eq!(
        refusal(&mirror, delete(7, None, None)),
        EngineError::MomentNotFound(id(7))
    );
    match decided(&mut mirror, delete(1, Some("d1"), None)).unwrap() {
        Outcome::MomentDeleted { deleted, moment } => {
            assert!(deleted);
            assert!(moment.deleted);
            assert_eq!(moment.version, 2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!((mirror.seq, mirror.live_moments), (2, 0));
    // Its replay, and a delete without request id, and one whose If-Match
    // is stale: the tombstone answers, nothing is written.
    for again in [
        delete(1, Some("d1"), None),
        delete(1, None, None),
        delete(1, None, Some(1)),
    ] {
        match decided(&mut mirror, again).unwrap() {
            Outcome::MomentDeleted { deleted, moment } => {
                assert!(!deleted);
                assert!(moment.deleted);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(mirror.seq, 2);
    }
}

#[test]
fn a_creates_request_id_sent_on_a_delete_is_a_conflict() {
    let mirror = folded([create_op(1, Some("c1"))]);
    assert_eq!(
        refusal(&mirror, delete(1, Some("c1"), None)),
        EngineError::Conflict(Conflict::RequestId {
            request_id: "c1".into(),
            used_by_kind: OpKind::MomentCreate.name(),
            used_by: id(1).to_string(),
        })
    );
    assert!(!mirror.moment(id(1)).unwrap().deleted);
}

#[test]
fn a_request_id_outside_printable_ascii_is_refused_and_writes_nothing() {
    let mirror = Mirror::new();
    for bad in ["", "a b", "tab\there", "é"] {
        assert!(
            matches!(
                refusal(&mirror, create(Some(id(1)), Some(bad))),
                EngineError::RequestId(RequestIdError::Invalid(_))
            ),
            "{bad:?} was let in"
        );
    }
    // The printable ends of the range are fine.
    assert_eq!(writes(&mirror, create(Some(id(1)), Some("!~"))).len(), 1);
}
