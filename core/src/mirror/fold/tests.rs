//! The one fold: a sequence of ops gives the expected mirror; the same ops
//! folded again (a replay) give the same state and digest, however they are
//! prepared; an op that does not fit leaves the mirror as it was; the
//! request index keeps the first producer of each request id (SPEC section
//! 3). And, over generated histories: creates with retries, decided by the
//! rules and folded, leave exactly one moment per entity id; and any mix of
//! commands of every kind, batches torn by a crash included, never makes
//! the rules write an op the fold refuses.

use proptest::prelude::*;

use crate::ids::Id;
use crate::mirror::{FoldError, Mirror, TurnStatus};
use crate::op::{
    Entity, JobStart, MarkDrop, MarkKeep, MediaPut, MediaRole, MessagePost, MomentDelete,
    MomentEdit, Op, OpBody, OpKind, RecallStart, Sha256, TurnFail, TurnFinish, TurnMode, TurnStart,
};
use crate::outcome::Outcome;
use crate::request_index::RequestRow;
use crate::rules::test_support::*;

fn edit_op(n: u128, request_id: Option<&str>, text: &str) -> OpBody {
    OpBody::MomentEdit(MomentEdit {
        id: id(n),
        request_id: request_id.map(str::to_owned),
        device: DEVICE.into(),
        text: Some(Some(text.into())),
        caption: None,
        lang: None,
    })
}

fn delete_op(n: u128) -> OpBody {
    OpBody::MomentDelete(MomentDelete {
        id: id(n),
        request_id: None,
        device: DEVICE.into(),
    })
}

fn media_op(n: u128, moment: u128, role: MediaRole) -> OpBody {
    OpBody::MediaPut(MediaPut {
        id: id(n),
        moment_id: id(moment),
        role,
        sha256: Sha256([3; 32]),
        size_bytes: 10,
        content_type: "image/jpeg".into(),
        device: DEVICE.into(),
        photo: 0,
    })
}

fn turn_op(n: u128, moment: u128, request_id: Option<&str>) -> OpBody {
    OpBody::TurnStart(TurnStart {
        id: id(n),
        moment_id: id(moment),
        seat: "seat".into(),
        mode: TurnMode::Practical,
        request_id: request_id.map(str::to_owned),
        device: DEVICE.into(),
    })
}

fn finish_op(n: u128) -> OpBody {
    OpBody::TurnFinish(TurnFinish {
        id: id(n),
        answer: "Ausgang".into(),
        adapter: "a".into(),
        source: "copy".into(),
        elapsed_ms: 5,
    })
}

fn keep_op(phrase: &str) -> OpBody {
    OpBody::MarkKeep(MarkKeep {
        id: crate::ids::mark_id(phrase),
        phrase: phrase.into(),
        moment_id: None,
        device: DEVICE.into(),
    })
}

/// A history touching every kind of op.
fn history() -> Vec<OpBody> {
    vec![
        create_op(1, Some("c1")),          // 1
        create_op(2, None),                // 2
        edit_op(1, Some("e1"), "Ausgang"), // 3
        media_op(10, 1, MediaRole::Copy),  // 4
        turn_op(20, 1, Some("t1")),        // 5
        finish_op(20),                     // 6
        keep_op("ausgang"),                // 7
        OpBody::JobStart(JobStart {
            job_id: "j1".into(),
            moment_id: id(1),
            seats: vec!["a".into()],
            device: DEVICE.into(),
        }), // 8
        OpBody::MessagePost(MessagePost {
            id: id(30),
            thread_id: id(1),
            body: "hallo".into(),
            device: DEVICE.into(),
        }), // 9
        OpBody::RecallStart(RecallStart {
            id: "r1".into(),
            moment_id: id(40),
            turn_id: id(41),
            marks: vec![crate::ids::mark_id("ausgang")],
            device: DEVICE.into(),
        }), // 10
        delete_op(2),                      // 11
        OpBody::MarkDrop(MarkDrop {
            id: crate::ids::mark_id("ausgang"),
            device: DEVICE.into(),
        }), // 12
    ]
}

fn ops(bodies: Vec<OpBody>) -> Vec<Op> {
    bodies
        .into_iter()
        .zip(1..)
        .map(|(body, seq)| Op {
            erased: false,
            seq,
            ts_ms: NOW_MS + seq,
            body,
        })
        .collect()
}

#[test]
fn a_history_folds_to_the_expected_mirror() {
    let mirror = folded(history());
    assert_eq!((mirror.seq, mirror.ts_ms), (12, NOW_MS + 12));
    assert_eq!((mirror.moments.len(), mirror.live_moments), (2, 1));
    assert_eq!(mirror.deleted_moments(), 1);

    let one = mirror.moment(id(1)).unwrap();
    // create, edit, media, turn: four ops on it (the job and the message
    // do not version the moment).
    assert_eq!(one.version, 4);
    assert_eq!(one.text(), Some("Ausgang"));
    assert_eq!((one.created_seq(), one.created_at_ms), (1, NOW_MS + 1));
    assert_eq!(one.media(), [id(10)]);
    assert_eq!(one.turns(), [id(20)]);
    assert!(!one.deleted);
    let two = mirror.moment(id(2)).unwrap();
    assert!(two.deleted);
    assert_eq!(two.version, 2);

    assert_eq!(mirror.media[&id(10)].seq, 4);
    assert!(matches!(
        &mirror.turns[&id(20)].status,
        TurnStatus::Done { answer, elapsed_ms: 5, .. } if answer == "Ausgang"
    ));
    let mark = &mirror.marks[&crate::ids::mark_id("ausgang")];
    assert_eq!((mark.active, mark.kept_seq), (false, 7));
    assert_eq!(mirror.jobs["j1"].seq, 8);
    assert_eq!(mirror.messages[&id(30)].ts_ms, NOW_MS + 9);
    assert!(mirror.threads[&id(1)].contains(&id(30)));
    assert_eq!(mirror.recalls["r1"].turn_id, id(41));
    // Rows for c1, e1, t1 and the job id; none for the rest.
    let mut keys: Vec<&str> = mirror.requests.iter().map(|(k, _)| k).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["c1", "e1", "j1", "t1"]);
}

#[test]
fn folding_the_same_ops_again_gives_the_same_mirror_and_digest() {
    let first = folded(history());
    let again = folded(history());
    assert_eq!(first, again);
    assert_eq!(first.digest(), again.digest());
    assert_eq!(first.digest().len(), 64);
    // Prepared apart from the mirror (as startup replay does), the same.
    let mut prepared = Mirror::new();
    let preparer = prepared.preparer();
    for op in ops(history()) {
        let op = preparer.prepare(op);
        prepared.apply_prepared(op).unwrap();
    }
    assert_eq!(prepared.digest(), first.digest());
    // The digest sees a difference in any op: one other letter, or one
    // other server time.
    let mut changed = history();
    changed[2] = edit_op(1, Some("e1"), "Eingang");
    assert_ne!(folded(changed).digest(), first.digest());
    let mut late = Mirror::new();
    for mut op in ops(history()) {
        if op.seq == 9 {
            op.ts_ms += 1;
        }
        late.apply(op).unwrap();
    }
    assert_ne!(late.digest(), first.digest());
    // And each prefix has its own.
    let shorter = folded(history().into_iter().take(11));
    assert_ne!(shorter.digest(), first.digest());
}

#[test]
fn an_op_that_does_not_fit_leaves_the_mirror_as_it_was() {
    let mut mirror = folded(history());
    let digest = mirror.digest();
    let next = |body| Op {
        erased: false,
        seq: 13,
        ts_ms: NOW_MS + 13,
        body,
    };
    let refused = [
        (next(create_op(1, None)), "AlreadyExists"),
        (next(edit_op(2, None, "x")), "NotLive deleted"),
        (next(edit_op(9, None, "x")), "NotLive unknown"),
        (
            next(media_op(10, 1, MediaRole::Original)),
            "media id exists",
        ),
        (next(media_op(11, 1, MediaRole::Copy)), "role filled"),
        (next(finish_op(20)), "turn ended"),
        (next(turn_op(20, 1, None)), "turn id exists"),
        (
            next(OpBody::MarkDrop(MarkDrop {
                id: crate::ids::mark_id("ausgang"),
                device: DEVICE.into(),
            })),
            "mark not active",
        ),
        (
            next(OpBody::MessagePost(MessagePost {
                id: id(31),
                thread_id: id(9),
                body: "x".into(),
                device: DEVICE.into(),
            })),
            "unknown thread",
        ),
    ];
    for (op, what) in refused {
        assert!(mirror.apply(op).is_err(), "{what} was folded");
        assert_eq!(mirror.digest(), digest, "{what} changed the mirror");
        assert_eq!(mirror.seq, 12);
    }
    assert_eq!(
        mirror.apply(Op {
            erased: false,
            seq: 14,
            ts_ms: NOW_MS,
            body: create_op(50, None),
        }),
        Err(FoldError::OutOfOrder {
            mirror_seq: 12,
            found: 14,
        })
    );
    assert_eq!(
        mirror.apply(next(edit_op(2, None, "x"))),
        Err(FoldError::NotLive {
            seq: 13,
            kind: "moment.edit",
            id: id(2),
            state: "deleted",
        })
    );
    assert_eq!(
        mirror.apply(next(create_op(1, None))),
        Err(FoldError::AlreadyExists { seq: 13, id: id(1) })
    );
    assert_eq!(mirror.digest(), digest);
    // A turn that failed cannot finish either, and a running one can.
    apply(&mut mirror, turn_op(21, 1, None));
    apply(
        &mut mirror,
        OpBody::TurnFail(TurnFail {
            id: id(21),
            error: "timeout".into(),
            elapsed_ms: 1,
        }),
    );
    assert!(mirror.apply(next_after(&mirror, finish_op(21))).is_err());
}

fn next_after(mirror: &Mirror, body: OpBody) -> Op {
    Op {
        erased: false,
        seq: mirror.seq + 1,
        ts_ms: NOW_MS + mirror.seq + 1,
        body,
    }
}

#[test]
fn the_request_index_keeps_the_op_that_first_carried_an_id() {
    // The fold itself keeps the first producer even when a later op
    // carries the same request id (the rules would have refused it).
    let mirror = folded([
        create_op(1, Some("r")),
        create_op(2, Some("r")),
        edit_op(2, Some("r"), "x"),
        turn_op(20, 2, Some("t")),
    ]);
    assert_eq!(
        mirror.requests.get("r"),
        Some(RequestRow {
            seq: 1,
            kind: OpKind::MomentCreate,
            entity: Entity::Id(id(1)),
        })
    );
    assert_eq!(mirror.requests.by_seq(1).map(|(k, _)| k), Some("r"));
    assert_eq!(mirror.requests.by_seq(2), None);
    assert_eq!(mirror.requests.by_seq(3), None);
    assert_eq!(
        mirror.requests.get("t"),
        Some(RequestRow {
            seq: 4,
            kind: OpKind::TurnStart,
            entity: Entity::Id(id(20)),
        })
    );
    assert!(!mirror.requests.contains_key("unknown"));
    // A replay of the create through the rules answers with that op.
    match answered(&mirror, create(Some(id(3)), Some("r"))) {
        Outcome::MomentCreated {
            created: false,
            replayed: Some(replay),
            moment,
        } => {
            assert_eq!((replay.seq, moment.id), (1, id(1)));
            assert_eq!(replay.request_id.as_deref(), Some("r"));
        }
        other => panic!("{other:?}"),
    }
}

/// One send of a create: the entity (0 to 5) and whether it carries the
/// entity's request id.
fn sends() -> impl Strategy<Value = Vec<(u8, bool)>> {
    prop::collection::vec((0u8..6, any::<bool>()), 1..40)
}

proptest! {
    /// Creates with retries (the same id resent, with or without its
    /// request id, in any order), decided by the rules and folded: exactly
    /// one op and one moment per entity id, every request row on its
    /// entity; the written log folded again gives the same digest.
    #[test]
    fn creates_with_retries_fold_to_one_moment_per_entity(sends in sends()) {
        let entity = |e: u8| id(100 + u128::from(e));
        let mut mirror = Mirror::new();
        let mut log: Vec<OpBody> = Vec::new();
        for (e, with_request) in &sends {
            let request_id = with_request.then(|| format!("req-{e}"));
            match decide_now(&mirror, create(Some(entity(*e)), request_id.as_deref())) {
                Decided::Write(ops) => {
                    for op in ops {
                        log.push(op.clone());
                        apply(&mut mirror, op);
                    }
                }
                Decided::Answer(Outcome::MomentCreated { created: false, moment, .. }) => {
                    prop_assert_eq!(moment.id, entity(*e));
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }
        let mut distinct: Vec<u8> = sends.iter().map(|(e, _)| *e).collect();
        distinct.sort_unstable();
        distinct.dedup();
        prop_assert_eq!(log.len(), distinct.len());
        prop_assert_eq!(mirror.moments.len(), distinct.len());
        prop_assert_eq!(mirror.live_moments, distinct.len());
        for e in &distinct {
            prop_assert!(mirror.moment(entity(*e)).is_some());
            if let Some(row) = mirror.requests.get(&format!("req-{e}")) {
                prop_assert_eq!(row.entity, Entity::Id(entity(*e)));
            }
        }
        prop_assert_eq!(folded(log).digest(), mirror.digest());
    }
}

/// One client (or brain runner) action of the property below, over small
/// pools of ids so that retries, reuse across kinds and conflicts happen
/// often.
#[derive(Clone, Debug)]
enum Action {
    Create(u8, Option<u8>, bool),
    Edit(u8, Option<u8>, u8, Option<u32>),
    Delete(u8, Option<u8>, Option<u32>),
    Media(u8, u8, bool, u8),
    Turn(u8, Option<u8>),
    End(u8, bool),
    Keep(u8, Option<u8>),
    Drop(u8),
    Recall(Option<u8>, u8),
    Job(u8, u8, u8),
    Message(u8, u8, u8, u8),
}

/// Request ids shared by every kind, job and recall ids and what they
/// derive included.
const REQUEST_POOL: [&str; 8] = ["a", "b", "j0", "j0:0", "j0:1", "r0", "r0:turn", "j1"];

fn actions() -> impl Strategy<Value = Vec<(Action, Option<u8>)>> {
    let e = 0u8..4;
    let req = prop::option::of(0u8..8);
    let action = prop_oneof![
        (e.clone(), req.clone(), any::<bool>()).prop_map(|(e, r, i)| Action::Create(e, r, i)),
        (e.clone(), req.clone(), 0u8..3, prop::option::of(1u32..5))
            .prop_map(|(e, r, t, m)| Action::Edit(e, r, t, m)),
        (0u8..5, req.clone(), prop::option::of(1u32..5))
            .prop_map(|(e, r, m)| Action::Delete(e, r, m)),
        (0u8..4, e.clone(), any::<bool>(), 0u8..2)
            .prop_map(|(m, e, o, b)| Action::Media(m, e, o, b)),
        (e.clone(), req).prop_map(|(e, r)| Action::Turn(e, r)),
        (0u8..8, any::<bool>()).prop_map(|(t, ok)| Action::End(t, ok)),
        (0u8..3, prop::option::of(e.clone())).prop_map(|(p, m)| Action::Keep(p, m)),
        (0u8..3).prop_map(Action::Drop),
        (prop::option::of(0u8..2), 1u8..3).prop_map(|(r, n)| Action::Recall(r, n)),
        (0u8..2, e.clone(), 0u8..3).prop_map(|(j, e, s)| Action::Job(j, e, s)),
        (0u8..4, e, 0u8..2, 0u8..3).prop_map(|(m, e, b, s)| Action::Message(m, e, b, s)),
    ];
    // With each, where a crash tears its batch (how many of its ops stay).
    prop::collection::vec((action, prop::option::of(0u8..3)), 1..60)
}

fn command(action: &Action, mirror: &Mirror) -> (crate::command::Command, u64) {
    use crate::command::*;
    use crate::wire::CLOCK_WINDOW_MS;
    let entity = |e: &u8| id(100 + u128::from(*e));
    let request = |r: &Option<u8>| r.map(|r| REQUEST_POOL[usize::from(r)].to_owned());
    let phrase = |p: &u8| ["eins", "zwei", "drei"][usize::from(*p)].to_owned();
    let command = match action {
        Action::Create(e, r, with_id) => Command::CreateMoment(CreateMoment {
            id: with_id.then(|| entity(e)),
            request_id: request(r),
            text: None,
            caption: None,
            lang: None,
            captured_at_ms: None,
            device: DEVICE.into(),
        }),
        Action::Edit(e, r, t, if_match) => Command::EditMoment(EditMoment {
            id: entity(e),
            request_id: request(r),
            if_match: *if_match,
            text: Some(Some(format!("text {t}"))),
            caption: None,
            lang: None,
            device: DEVICE.into(),
        }),
        Action::Delete(e, r, if_match) => Command::DeleteMoment(DeleteMoment {
            // 4: the moment recall r0 assembled, if any.
            id: match mirror.recalls.get("r0") {
                Some(recall) if *e == 4 => recall.moment_id,
                _ => entity(e),
            },
            request_id: request(r),
            if_match: *if_match,
            device: DEVICE.into(),
        }),
        Action::Media(m, e, original, byte) => {
            let role = if *original {
                MediaRole::Original
            } else {
                MediaRole::Copy
            };
            Command::PutMedia(put(id(200 + u128::from(*m)), entity(e), role, *byte))
        }
        Action::Turn(e, r) => Command::StartTurn(StartTurn {
            moment_id: entity(e),
            request_id: request(r),
            seat: "seat".into(),
            device: DEVICE.into(),
        }),
        Action::End(t, ok) => {
            let mut turns: Vec<_> = mirror.turns.keys().copied().collect();
            turns.sort_unstable();
            let turn_id = turns
                .get(usize::from(*t) % turns.len().max(1))
                .copied()
                .unwrap_or(id(999));
            Command::EndTurn(EndTurn {
                turn_id,
                outcome: if *ok {
                    Ok(("answer".into(), "adapter".into(), "copy".into()))
                } else {
                    Err("timeout".into())
                },
                elapsed_ms: 1,
            })
        }
        Action::Keep(p, e) => Command::KeepPhrase(KeepPhrase {
            phrase: phrase(p),
            moment_id: e.as_ref().map(entity),
            device: DEVICE.into(),
        }),
        Action::Drop(p) => Command::DropPhrase(DropPhrase {
            mark_id: crate::ids::mark_id(&phrase(p)),
            device: DEVICE.into(),
        }),
        Action::Recall(r, max) => Command::StartRecall(StartRecall {
            recall_id: r.map(|r| format!("r{r}")),
            seat: "seat".into(),
            phrases_max: usize::from(*max),
            device: DEVICE.into(),
        }),
        Action::Job(j, e, seats) => Command::StartJob(StartJob {
            job_id: format!("j{j}"),
            moment_id: entity(e),
            seats: (0..*seats).map(|s| format!("seat{s}")).collect(),
            device: DEVICE.into(),
        }),
        Action::Message(m, e, body, skew) => {
            // At the clock, at the window's edge, or just past it.
            let skew = [0, CLOCK_WINDOW_MS, CLOCK_WINDOW_MS + 1][usize::from(*skew)];
            Command::PostMessage(PostMessage {
                id: Id::from_parts(NOW_MS + skew, 300 + u128::from(*m)),
                thread_id: entity(e),
                body: format!("body {body}"),
                device: DEVICE.into(),
            })
        }
    };
    (command, NOW_MS)
}

proptest! {
    /// Whatever the rules decide to write folds: over any sequence of
    /// actions of every kind (retries, request ids reused across kinds,
    /// deletes, batches torn by a crash and retried), the fold never
    /// refuses an op the rules wrote (it would be durable before the fold
    /// saw it, stopping the write path and replay). And the log they
    /// wrote, folded again, gives the same digest.
    #[test]
    fn every_op_the_rules_write_folds(actions in actions()) {
        let mut mirror = Mirror::new();
        let mut log: Vec<OpBody> = Vec::new();
        let mut minted = 10_000u128;
        for (action, tear) in &actions {
            let (command, now_ms) = command(action, &mirror);
            let mut mint = || {
                minted += 1;
                id(minted)
            };
            if let crate::rules::Decision::Write(ops, _) =
                crate::rules::decide(&mirror, command.clone(), now_ms, &mut mint)
            {
                let keep = tear.map_or(ops.len(), |k| usize::from(k).min(ops.len()));
                for body in ops.into_iter().take(keep) {
                    let seq = mirror.seq + 1;
                    let folded = mirror.apply(Op { erased: false, seq, ts_ms: NOW_MS + seq, body: body.clone() });
                    prop_assert!(
                        folded.is_ok(),
                        "{:?} decided {:?}, which the fold refuses: {:?}",
                        command, body, folded
                    );
                    log.push(body);
                }
            }
        }
        prop_assert_eq!(folded(log).digest(), mirror.digest());
    }
}

/// The history, then moment 1 deleted (seq 13).
fn history_with_a_delete() -> Vec<Op> {
    let mut bodies = history();
    bodies.push(delete_op(1));
    ops(bodies)
}

#[test]
fn the_compaction_record_erases_what_a_replay_of_the_erased_ops_erases() {
    // Live: the history folded, then the record naming moment 1.
    let history = history_with_a_delete();
    let mut live = Mirror::new();
    for op in history.clone() {
        live.apply(op).unwrap();
    }
    let record = spark_log_format::CompactionRecord {
        segments: Vec::new(),
        subjects: vec![id(1).0.to_be_bytes()],
    };
    let compact = Op::new(14, NOW_MS + 14, OpBody::LogCompact(record));
    live.apply(compact.clone()).unwrap();

    // Replay: every op with content about moment 1 read back erased (as a
    // compaction writes it), then the record.
    let about_one = |body: &OpBody| match body {
        OpBody::MomentCreate(p) => p.id == id(1),
        OpBody::MomentEdit(p) => p.id == id(1),
        OpBody::TurnFinish(p) => p.id == id(20),
        OpBody::MessagePost(p) => p.thread_id == id(1),
        _ => false,
    };
    let mut replayed = Mirror::new();
    for op in history {
        let op = if op.body.has_content() && about_one(&op.body) {
            Op {
                erased: true,
                body: op.body.erased(),
                ..op
            }
        } else {
            op
        };
        replayed.apply(op).unwrap();
    }
    replayed.apply(compact).unwrap();
    assert_eq!(live.digest(), replayed.digest());
    assert_eq!(live, replayed);

    let moment = live.moment(id(1)).unwrap();
    assert!(moment.deleted && moment.erased());
    assert_eq!(
        (moment.text(), moment.caption(), moment.lang()),
        (None, None, None)
    );
    assert_eq!(moment.version, 5, "versions stay");
    let turn = live.turn_view(&live.turns[&id(20)]);
    assert_eq!(
        (turn.status, turn.answer, turn.source),
        ("done", None, None)
    );
    assert_eq!(turn.adapter.as_deref(), Some("a"));
    let message = live.message_view(&live.messages[&id(30)]);
    assert_eq!(message.body, None);
    assert!(live.requests.get("c1").is_some(), "request ids stay");
    // The other moment is untouched.
    assert!(!live.moment(id(2)).unwrap().erased());
}

#[test]
fn only_a_deleted_moment_is_erased() {
    let mut mirror = folded(history());
    let record = spark_log_format::CompactionRecord {
        segments: Vec::new(),
        subjects: vec![id(1).0.to_be_bytes()],
    };
    let before = mirror.clone();
    let refused = mirror.apply(Op::new(13, NOW_MS + 13, OpBody::LogCompact(record)));
    assert!(
        matches!(refused, Err(FoldError::Refused { .. })),
        "{refused:?}"
    );
    assert_eq!(mirror, before);
}

#[test]
fn an_erased_op_round_trips_through_its_record() {
    let op = Op::new(
        7,
        NOW_MS,
        OpBody::MessagePost(MessagePost {
            id: id(30),
            thread_id: id(1),
            body: "secret".into(),
            device: DEVICE.into(),
        }),
    );
    let (kind, kind_version, payload) = op.encode_erased().unwrap();
    assert_eq!(kind_version, 1 | crate::op::ERASED_BIT);
    assert!(!payload.windows(6).any(|w| w == b"secret"));
    let record = spark_log_format::RecordRef {
        seq: 7,
        offset: 64,
        ts_ms: NOW_MS,
        kind,
        kind_version,
        payload: &payload,
    };
    let read = Op::decode(&record).unwrap();
    assert!(read.erased);
    assert_eq!(read.body, op.body.clone().erased());
    let json = read.to_json();
    assert_eq!(json["erased"], true);
    assert!(json["payload"].get("body").is_none(), "{json}");
}

#[test]
fn a_deleted_moment_s_turns_and_thread_show_no_content_before_the_erasure() {
    let mut mirror = Mirror::new();
    let history = ops(history());
    let live_at = history.len();
    for op in history {
        mirror.apply(op).unwrap();
    }
    // Live: the reading and the body are served.
    let turn = mirror.turn_view(&mirror.turns[&id(20)]);
    assert!(turn.answer.is_some() && turn.source.is_some());
    let message = mirror.message_view(&mirror.messages[&id(30)]);
    assert_eq!(message.body.as_deref(), Some("hallo"));

    // Deleted, not erased: the log still holds the content, no view shows it.
    mirror
        .apply(Op::new(live_at as u64 + 1, NOW_MS + 13, delete_op(1)))
        .unwrap();
    assert!(!mirror.moment(id(1)).unwrap().erased());
    let turn = mirror.turn_view(&mirror.turns[&id(20)]);
    assert_eq!(
        (turn.status, turn.answer, turn.source, turn.error),
        ("done", None, None, None)
    );
    let message = mirror.message_view(&mirror.messages[&id(30)]);
    assert_eq!(message.body, None);
    // Moment 2's thread and the rest are untouched.
    assert!(!mirror.is_deleted(id(40)));
}
