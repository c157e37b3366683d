//! The rules against a small mirror: typed conflicts with their fields and
//! today's texts, the clock window's edges, and the id caps for every
//! caller.

use super::*;
use crate::command::{PostMessage, PutMedia, StartJob, StartRecall};
use crate::ids::{RequestIdError, JOB_ID_MAX_BYTES, RECALL_ID_MAX_BYTES};
use crate::op::{MediaRole, MomentCreate, MomentDelete, Op};
use crate::wire::CLOCK_WINDOW_MS;

const NOW_MS: u64 = 1_767_225_600_000;

fn moment(mirror: &mut Mirror, n: u128) -> Id {
    let id = Id::from_parts(NOW_MS, n);
    let body = OpBody::MomentCreate(MomentCreate {
        id,
        request_id: None,
        device: "test".into(),
        text: None,
        caption: None,
        lang: None,
        captured_at_ms: None,
    });
    apply(mirror, body);
    id
}

fn apply(mirror: &mut Mirror, body: OpBody) {
    let seq = mirror.seq + 1;
    mirror
        .apply(Op {
            seq,
            ts_ms: NOW_MS,
            body,
        })
        .unwrap();
}

fn put(id: Id, moment_id: Id, role: MediaRole, byte: u8) -> PutMedia {
    PutMedia {
        id,
        moment_id,
        role,
        sha256: [byte; 32],
        size_bytes: 1,
        content_type: "image/jpeg".into(),
        device: "test".into(),
    }
}

fn decided(mirror: &mut Mirror, command: Command) -> Result<(), EngineError> {
    let mut n = 1000;
    let mut mint = || {
        n += 1;
        Id::from_parts(NOW_MS, n)
    };
    match decide(mirror, command, NOW_MS, &mut mint) {
        Decision::Answer(answer) => answer.map(|_| ()),
        Decision::Write(ops, _) => {
            for body in ops {
                apply(mirror, body);
            }
            Ok(())
        }
    }
}

fn refusal(mirror: &mut Mirror, command: Command) -> EngineError {
    decided(mirror, command).unwrap_err()
}

#[test]
fn media_admission_names_what_conflicted() {
    let mut mirror = Mirror::new();
    let a = moment(&mut mirror, 1);
    let b = moment(&mut mirror, 2);
    let media = Id::from_parts(NOW_MS, 3);
    decided(
        &mut mirror,
        Command::PutMedia(put(media, a, MediaRole::Copy, 1)),
    )
    .unwrap();
    // The same upload again answers, writing nothing.
    let seq = mirror.seq;
    decided(
        &mut mirror,
        Command::PutMedia(put(media, a, MediaRole::Copy, 1)),
    )
    .unwrap();
    assert_eq!(mirror.seq, seq);

    let e = refusal(
        &mut mirror,
        Command::PutMedia(put(media, a, MediaRole::Copy, 2)),
    );
    assert_eq!(
        e,
        EngineError::Conflict(Conflict::MediaBytes {
            media_id: media,
            stored_sha256: [1; 32],
            offered_sha256: [2; 32],
        })
    );
    assert_eq!(
        e.to_string(),
        format!(
            "media {media} was uploaded with sha256 {}; these bytes hash to {}",
            "01".repeat(32),
            "02".repeat(32)
        )
    );

    let e = refusal(
        &mut mirror,
        Command::PutMedia(put(media, b, MediaRole::Copy, 1)),
    );
    let owner = Conflict::MediaOwner {
        media_id: media,
        moment_id: a,
        role: MediaRole::Copy,
    };
    assert_eq!(e, EngineError::Conflict(owner.clone()));
    assert_eq!(
        e.to_string(),
        format!("media {media} belongs to moment {a} as its copy")
    );
    // Before a byte is read, the same answer.
    assert_eq!(
        media::admit_target(&mirror, media, b, MediaRole::Copy).unwrap_err(),
        EngineError::Conflict(owner)
    );

    let other = Id::from_parts(NOW_MS, 4);
    let e = refusal(
        &mut mirror,
        Command::PutMedia(put(other, a, MediaRole::Copy, 5)),
    );
    assert_eq!(
        e,
        EngineError::Conflict(Conflict::RoleTaken {
            moment_id: a,
            role: MediaRole::Copy,
            media_id: media,
        })
    );
    assert_eq!(
        e.to_string(),
        format!("moment {a} already has its copy: media {media}")
    );

    apply(
        &mut mirror,
        OpBody::MomentDelete(MomentDelete {
            id: b,
            request_id: None,
            device: "test".into(),
        }),
    );
    let e = refusal(
        &mut mirror,
        Command::PutMedia(put(other, b, MediaRole::Copy, 5)),
    );
    assert_eq!(e, EngineError::Deleted(b));
    assert_eq!(
        media::admit_target(&mirror, other, b, MediaRole::Copy).unwrap_err(),
        EngineError::Deleted(b)
    );
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
    let e = refusal(&mut mirror, post(NOW_MS + CLOCK_WINDOW_MS + 1, 12));
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
        refusal(&mut mirror, changed),
        EngineError::Conflict(Conflict::Message { message_id: id })
    );
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
        refusal(&mut mirror, recall("r".repeat(RECALL_ID_MAX_BYTES + 1))),
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
        refusal(&mut mirror, job("j".repeat(JOB_ID_MAX_BYTES + 1))),
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
    let e = refusal(&mut mirror, moved);
    assert_eq!(
        e.to_string(),
        format!("job {:?} reads moment {m}", "j".repeat(JOB_ID_MAX_BYTES))
    );
}

#[test]
fn a_turn_may_not_reuse_a_request_id_a_job_or_a_recall_derived() {
    use crate::command::{KeepPhrase, StartTurn};
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
    assert_eq!(refusal(&mut mirror, turn(m, "job-7:0")), derived("job-7:0"));
    assert_eq!(refusal(&mut mirror, turn(m, "job-7:1")), derived("job-7:1"));
    // The job's own retry still answers with its turns.
    decided(&mut mirror, job("job-7")).unwrap();
    // A seat index the job does not have is an ordinary request id.
    decided(&mut mirror, turn(m, "job-7:2")).unwrap();
    // A turn first, then a job deriving its request id: 409 too.
    decided(&mut mirror, turn(m, "job-8:1")).unwrap();
    assert_eq!(refusal(&mut mirror, job("job-8")), derived("job-8:1"));
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
        refusal(&mut mirror, turn(recall_moment, "r-1:turn")),
        derived("r-1:turn")
    );
}
