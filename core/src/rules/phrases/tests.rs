//! Kept phrases against a folded mirror: the mark id is built from the
//! normalised text, so keeping twice writes once; dropping twice writes
//! once; a dropped phrase kept again is a new keep (SPEC section 4).

use crate::command::{Command, DropPhrase, KeepPhrase};
use crate::error::EngineError;
use crate::ids::{mark_id, Id};
use crate::mirror::Mirror;
use crate::op::{MarkKeep, OpBody};
use crate::outcome::Outcome;
use crate::rules::phrases::{normalise_phrase, PhraseError, PHRASE_MAX_CHARS};
use crate::rules::test_support::*;

fn keep(phrase: &str, moment_id: Option<Id>) -> Command {
    Command::KeepPhrase(KeepPhrase {
        phrase: phrase.into(),
        moment_id,
        device: DEVICE.into(),
    })
}

fn drop_mark(mark_id: &str) -> Command {
    Command::DropPhrase(DropPhrase {
        mark_id: mark_id.into(),
        device: DEVICE.into(),
    })
}

#[test]
fn phrases_normalise() {
    assert_eq!(
        normalise_phrase("  Bitte   NICHT rauchen ").unwrap(),
        "bitte nicht rauchen"
    );
    assert_eq!(normalise_phrase("ＡＵＳＧＡＮＧ").unwrap(), "ausgang");
    assert_eq!(normalise_phrase("ﬁre exit").unwrap(), "fire exit");
    assert_eq!(normalise_phrase("Straße\t\nfrei").unwrap(), "straße frei");
    assert_eq!(normalise_phrase(" \t "), Err(PhraseError::Empty));
    assert_eq!(
        normalise_phrase(&"a".repeat(201)),
        Err(PhraseError::TooLong { chars: 201 })
    );
    assert!(normalise_phrase(&"a".repeat(200)).is_ok());
}

#[test]
fn keeping_writes_the_normalised_phrase_under_its_mark_id() {
    let mirror = folded([create_op(1, None)]);
    let ops = writes(&mirror, keep("  Bitte   NICHT rauchen ", Some(id(1))));
    assert_eq!(
        ops,
        [OpBody::MarkKeep(MarkKeep {
            id: mark_id("bitte nicht rauchen"),
            phrase: "bitte nicht rauchen".into(),
            moment_id: Some(id(1)),
            device: DEVICE.into(),
        })]
    );
}

#[test]
fn keeping_an_active_phrase_again_writes_nothing() {
    let mut mirror = Mirror::new();
    decided(&mut mirror, keep("Ausgang", None)).unwrap();
    let kept_seq = mirror.seq;
    // Another spelling of the same phrase is the same mark.
    match decided(&mut mirror, keep(" AUSGANG ", None)).unwrap() {
        Outcome::PhraseKept {
            created,
            replayed,
            mark,
        } => {
            assert!(!created);
            assert_eq!(replayed.unwrap().seq, kept_seq);
            assert_eq!((mark.id, mark.active), (mark_id("ausgang"), true));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(mirror.seq, kept_seq);
    assert_eq!(mirror.marks.len(), 1);
}

#[test]
fn dropping_writes_once_and_a_dropped_phrase_kept_again_is_new() {
    let mut mirror = Mirror::new();
    let mark = mark_id("ausgang");
    decided(&mut mirror, keep("ausgang", None)).unwrap();
    match decided(&mut mirror, drop_mark(&mark)).unwrap() {
        Outcome::PhraseDropped { dropped, mark } => assert!(dropped && !mark.active),
        other => panic!("{other:?}"),
    }
    let seq = mirror.seq;
    match decided(&mut mirror, drop_mark(&mark)).unwrap() {
        Outcome::PhraseDropped { dropped, .. } => assert!(!dropped),
        other => panic!("{other:?}"),
    }
    assert_eq!(mirror.seq, seq);
    // Kept again: a new keep op, the mark active with its new seq.
    match decided(&mut mirror, keep("ausgang", None)).unwrap() {
        Outcome::PhraseKept { created, .. } => assert!(created),
        other => panic!("{other:?}"),
    }
    assert_eq!(mirror.seq, seq + 1);
    let stored = &mirror.marks[&mark];
    assert!(stored.active);
    assert_eq!(stored.kept_seq, seq + 1);
}

#[test]
fn refusals_name_what_is_wrong() {
    let mut mirror = Mirror::new();
    assert_eq!(
        refusal(&mirror, drop_mark("keep:nothing")),
        EngineError::Missing(format!("mark {:?}", "keep:nothing"))
    );
    assert_eq!(
        refusal(&mirror, keep("ausgang", Some(id(9)))),
        EngineError::MomentNotFound(id(9))
    );
    assert!(matches!(
        refusal(&mirror, keep(" \n ", None)),
        EngineError::Invalid(_)
    ));
    assert!(matches!(
        refusal(&mirror, keep(&"a".repeat(PHRASE_MAX_CHARS + 1), None)),
        EngineError::Invalid(_)
    ));
    decided(&mut mirror, keep(&"a".repeat(PHRASE_MAX_CHARS), None)).unwrap();
    assert!(mirror
        .marks
        .contains_key(&mark_id(&"a".repeat(PHRASE_MAX_CHARS))));
}

#[test]
fn keeping_from_a_deleted_moment_is_allowed() {
    // As implemented: the rule asks only that the moment exists (a
    // tombstone counts), unlike turns and media which need a live one.
    let mut mirror = folded([create_op(1, None)]);
    apply(
        &mut mirror,
        OpBody::MomentDelete(crate::op::MomentDelete {
            id: id(1),
            request_id: None,
            device: DEVICE.into(),
        }),
    );
    decided(&mut mirror, keep("ausgang", Some(id(1)))).unwrap();
    assert_eq!(mirror.marks[&mark_id("ausgang")].moment_id, Some(id(1)));
}
