//! Media admission against a folded mirror: a media id names one blob of
//! one moment's role for good; the same bytes replay, other bytes, another
//! owner, a taken role or a deleted moment are refused with typed conflicts
//! (SPEC section 4).

use crate::command::Command;
use crate::error::{Conflict, EngineError};
use crate::ids::Id;
use crate::mirror::Mirror;
use crate::op::{MediaPut, MediaRole, MomentDelete, OpBody, Sha256};
use crate::outcome::{Outcome, Replay};
use crate::rules::media;
use crate::rules::test_support::*;

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
        &mirror,
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
        &mirror,
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
        &mirror,
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
        &mirror,
        Command::PutMedia(put(other, b, MediaRole::Copy, 5)),
    );
    assert_eq!(e, EngineError::Deleted(b));
    assert_eq!(
        media::admit_target(&mirror, other, b, MediaRole::Copy).unwrap_err(),
        EngineError::Deleted(b)
    );
}

#[test]
fn a_new_upload_writes_its_media_put_and_fills_the_role() {
    let mut mirror = Mirror::new();
    let m = moment(&mut mirror, 1);
    let ops = writes(
        &mirror,
        Command::PutMedia(put(id(2), m, MediaRole::Copy, 7)),
    );
    assert_eq!(
        ops,
        [OpBody::MediaPut(MediaPut {
            id: id(2),
            moment_id: m,
            role: MediaRole::Copy,
            sha256: Sha256([7; 32]),
            size_bytes: 1,
            content_type: "image/jpeg".into(),
            device: DEVICE.into(),
        })]
    );
    match decided(
        &mut mirror,
        Command::PutMedia(put(id(2), m, MediaRole::Copy, 7)),
    )
    .unwrap()
    {
        Outcome::MediaPut {
            created, replayed, ..
        } => assert_eq!((created, replayed), (true, None)),
        other => panic!("{other:?}"),
    }
    let moment = mirror.moment(m).unwrap();
    assert_eq!((moment.media(), moment.version), (&[id(2)][..], 2));
    // The other role is free: an original beside the copy.
    decided(
        &mut mirror,
        Command::PutMedia(put(id(3), m, MediaRole::Original, 8)),
    )
    .unwrap();
    assert_eq!(mirror.moment(m).unwrap().media(), [id(2), id(3)]);
}

#[test]
fn a_replayed_upload_answers_its_first_put() {
    let mut mirror = Mirror::new();
    let m = moment(&mut mirror, 1);
    decided(
        &mut mirror,
        Command::PutMedia(put(id(2), m, MediaRole::Copy, 7)),
    )
    .unwrap();
    let put_seq = mirror.seq;
    // Later ops do not change what the replay names.
    moment(&mut mirror, 3);
    match answered(
        &mirror,
        Command::PutMedia(put(id(2), m, MediaRole::Copy, 7)),
    ) {
        Outcome::MediaPut {
            created,
            replayed,
            media,
        } => {
            assert!(!created);
            assert_eq!(
                replayed,
                Some(Replay {
                    seq: put_seq,
                    ts_ms: NOW_MS + put_seq,
                    request_id: None,
                })
            );
            assert_eq!((media.id, media.moment_id), (id(2), m));
        }
        other => panic!("{other:?}"),
    }
    // Even once its moment is deleted, the known upload answers (the
    // media id is checked first).
    delete_moment(&mut mirror, m);
    assert!(matches!(
        answered(
            &mirror,
            Command::PutMedia(put(id(2), m, MediaRole::Copy, 7))
        ),
        Outcome::MediaPut { created: false, .. }
    ));
}

#[test]
fn same_id_same_bytes_for_another_role_is_an_owner_conflict() {
    let mut mirror = Mirror::new();
    let m = moment(&mut mirror, 1);
    decided(
        &mut mirror,
        Command::PutMedia(put(id(2), m, MediaRole::Copy, 7)),
    )
    .unwrap();
    assert_eq!(
        refusal(
            &mirror,
            Command::PutMedia(put(id(2), m, MediaRole::Original, 7))
        ),
        EngineError::Conflict(Conflict::MediaOwner {
            media_id: id(2),
            moment_id: m,
            role: MediaRole::Copy,
        })
    );
}

#[test]
fn an_upload_needs_a_known_moment() {
    let mirror = Mirror::new();
    assert_eq!(
        refusal(
            &mirror,
            Command::PutMedia(put(id(2), id(9), MediaRole::Copy, 7))
        ),
        EngineError::MomentNotFound(id(9))
    );
    assert_eq!(
        media::admit_target(&mirror, id(2), id(9), MediaRole::Copy).unwrap_err(),
        EngineError::MomentNotFound(id(9))
    );
}
