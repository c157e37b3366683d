//! Messages against a folded mirror: a new id must fall inside the clock
//! window (inclusive, both ways); a known id answers whatever the clock
//! says; the same id with another body or thread is a conflict (SPEC
//! section 5).

use crate::command::{Command, PostMessage};
use crate::error::{Conflict, EngineError};
use crate::ids::Id;
use crate::mirror::Mirror;
use crate::op::{MessagePost, OpBody};
use crate::outcome::Outcome;
use crate::rules::messages::{check_clock_window, CLOCK_WINDOW_MS};
use crate::rules::test_support::*;

fn message(id: Id, thread_id: Id, body: &str) -> Command {
    Command::PostMessage(PostMessage {
        id,
        thread_id,
        body: body.into(),
        device: DEVICE.into(),
    })
}

#[test]
fn the_clock_window_is_inclusive_and_says_its_width() {
    let mut mirror = Mirror::new();
    let thread = moment(&mut mirror, 1);
    let post = |time_ms: u64, n: u128| {
        Command::PostMessage(PostMessage {
            id: Id::from_parts(time_ms, n),
            thread_id: thread,
            body: "hello".into(),
            device: "test".into(),
        })
    };
    decided(&mut mirror, post(NOW_MS - CLOCK_WINDOW_MS, 10)).unwrap();
    decided(&mut mirror, post(NOW_MS + CLOCK_WINDOW_MS, 11)).unwrap();
    let e = refusal(&mirror, post(NOW_MS + CLOCK_WINDOW_MS + 1, 12));
    assert_eq!(
        e,
        EngineError::ClockSkew {
            server_time_ms: NOW_MS,
            id_time_ms: NOW_MS + CLOCK_WINDOW_MS + 1,
            skew_ms: 300_001,
        }
    );
    assert_eq!(
        e.to_string(),
        "the message id's time is 300001 ms from the server clock; the window is 5 minutes"
    );
    // A known id answers whatever the clock says; other text conflicts.
    let mut changed = post(NOW_MS - CLOCK_WINDOW_MS, 10);
    if let Command::PostMessage(p) = &mut changed {
        p.body = "bye".into();
    }
    let id = Id::from_parts(NOW_MS - CLOCK_WINDOW_MS, 10);
    assert_eq!(
        refusal(&mirror, changed),
        EngineError::Conflict(Conflict::Message { message_id: id })
    );
}

#[test]
fn the_window_holds_below_the_server_clock_too() {
    let mut mirror = Mirror::new();
    let thread = moment(&mut mirror, 1);
    let late = Id::from_parts(NOW_MS - CLOCK_WINDOW_MS - 1, 5);
    let e = refusal(&mirror, message(late, thread, "hi"));
    assert_eq!(
        e,
        EngineError::ClockSkew {
            server_time_ms: NOW_MS,
            id_time_ms: NOW_MS - CLOCK_WINDOW_MS - 1,
            skew_ms: -i64::try_from(CLOCK_WINDOW_MS + 1).unwrap(),
        }
    );
    assert!(check_clock_window(Id::from_parts(NOW_MS, 0), NOW_MS).is_ok());
    assert!(mirror.messages.is_empty());
}

#[test]
fn a_new_message_writes_its_post_and_joins_its_thread() {
    let mut mirror = Mirror::new();
    let thread = moment(&mut mirror, 1);
    let ops = writes(&mirror, message(id(5), thread, "hallo"));
    assert_eq!(
        ops,
        [OpBody::MessagePost(MessagePost {
            id: id(5),
            thread_id: thread,
            body: "hallo".into(),
            device: DEVICE.into(),
        })]
    );
    match decided(&mut mirror, message(id(5), thread, "hallo")).unwrap() {
        Outcome::MessagePosted {
            created,
            replayed,
            message,
        } => {
            assert_eq!((created, replayed), (true, None));
            assert_eq!(message.ts_ms, NOW_MS + 2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        mirror.threads[&thread].iter().copied().collect::<Vec<_>>(),
        [id(5)]
    );
}

#[test]
fn a_known_message_answers_whatever_the_clock_says_now() {
    let mut mirror = Mirror::new();
    let thread = moment(&mut mirror, 1);
    decided(&mut mirror, message(id(5), thread, "hallo")).unwrap();
    let seq = mirror.seq;
    // Hours later, far outside the window: the known id still answers.
    let later = NOW_MS + 100 * CLOCK_WINDOW_MS;
    match decided_at(&mut mirror, message(id(5), thread, "hallo"), later).unwrap() {
        Outcome::MessagePosted {
            created, replayed, ..
        } => {
            assert!(!created);
            assert_eq!(replayed.unwrap().seq, seq);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(mirror.seq, seq);
    // A new id at that time is refused.
    assert!(matches!(
        decided_at(&mut mirror, message(id(6), thread, "hallo"), later),
        Err(EngineError::ClockSkew { .. })
    ));
}

#[test]
fn the_same_id_in_another_thread_is_a_conflict() {
    let mut mirror = Mirror::new();
    let thread = moment(&mut mirror, 1);
    let other = moment(&mut mirror, 2);
    decided(&mut mirror, message(id(5), thread, "hallo")).unwrap();
    assert_eq!(
        refusal(&mirror, message(id(5), other, "hallo")),
        EngineError::Conflict(Conflict::Message { message_id: id(5) })
    );
}

#[test]
fn a_new_message_needs_a_live_thread() {
    let mut mirror = Mirror::new();
    assert_eq!(
        refusal(&mirror, message(id(5), id(9), "hallo")),
        EngineError::MomentNotFound(id(9))
    );
    let thread = moment(&mut mirror, 1);
    delete_moment(&mut mirror, thread);
    assert_eq!(
        refusal(&mirror, message(id(5), thread, "hallo")),
        EngineError::Deleted(thread)
    );
}
