//! Media admission against a folded mirror: a media id names one blob of
//! one role of one photo of a moment for good; the same bytes replay, other bytes, another
//! owner, a taken role or a deleted moment are refused with typed conflicts
//! (SPEC section 4).

use crate::command::{Command, PutMedia};
use crate::error::{Conflict, EngineError};
use crate::ids::Id;
use crate::mirror::Mirror;
use crate::op::{MediaPut, MediaRole, MomentDelete, OpBody, Sha256};
use crate::outcome::{Outcome, Replay};
use crate::rules::media;
use crate::rules::test_support::*;
use crate::wire::PHOTOS_PER_MOMENT;

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
        photo: 0,
        role: MediaRole::Copy,
    };
    assert_eq!(e, EngineError::Conflict(owner.clone()));
    assert_eq!(
        e.to_string(),
        format!("media {media} belongs to moment {a} as the copy of its photo 0")
    );
    // Before a byte is read, the same answer.
    assert_eq!(
        media::admit_target(&mirror, media, b, 0, MediaRole::Copy).unwrap_err(),
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
            photo: 0,
            role: MediaRole::Copy,
            media_id: media,
        })
    );
    assert_eq!(
        e.to_string(),
        format!("moment {a} already has the copy of its photo 0: media {media}")
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
        media::admit_target(&mirror, other, b, 0, MediaRole::Copy).unwrap_err(),
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
            photo: 0,
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
            photo: 0,
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
        media::admit_target(&mirror, id(2), id(9), 0, MediaRole::Copy).unwrap_err(),
        EngineError::MomentNotFound(id(9))
    );
}

/// Issue 27: a moment holds up to [`PHOTOS_PER_MOMENT`] photos, each with
/// one copy and one original; the same media id for another photo is an
/// owner conflict, and a photo number past the last is refused.
#[test]
fn each_photo_of_a_moment_holds_one_copy_and_one_original() {
    let mut mirror = Mirror::new();
    let m = moment(&mut mirror, 1);
    let photo = |id: Id, photo: u8, role: MediaRole, byte: u8| {
        Command::PutMedia(PutMedia {
            photo,
            ..put(id, m, role, byte)
        })
    };
    let mut ids = Vec::new();
    for n in 0..PHOTOS_PER_MOMENT {
        for (k, role) in [MediaRole::Copy, MediaRole::Original]
            .into_iter()
            .enumerate()
        {
            let media = Id::from_parts(NOW_MS, 100 + u128::from(n) * 2 + k as u128);
            decided(&mut mirror, photo(media, n, role, n)).unwrap();
            ids.push(media);
        }
    }
    let moment = mirror.moment(m).unwrap();
    assert_eq!(moment.media(), &ids[..]);
    assert_eq!(
        mirror.media[&ids[7]].photo, 3,
        "the eighth upload is photo 3's original"
    );
    // Photo 3's copy is taken by ids[6]; the same photo number again is
    // refused, with the photo named.
    let late = Id::from_parts(NOW_MS, 999);
    let e = refusal(&mirror, photo(late, 3, MediaRole::Copy, 9));
    assert_eq!(
        e,
        EngineError::Conflict(Conflict::RoleTaken {
            moment_id: m,
            photo: 3,
            role: MediaRole::Copy,
            media_id: ids[6],
        })
    );
    // A known media id offered as another photo is an owner conflict.
    assert_eq!(
        refusal(&mirror, photo(ids[0], 1, MediaRole::Copy, 0)),
        EngineError::Conflict(Conflict::MediaOwner {
            media_id: ids[0],
            moment_id: m,
            photo: 0,
            role: MediaRole::Copy,
        })
    );
    // Past the last photo: refused before a byte is read and after.
    let too_far = PHOTOS_PER_MOMENT;
    assert!(matches!(
        media::admit_target(&mirror, late, m, too_far, MediaRole::Copy),
        Err(EngineError::Invalid(_))
    ));
    assert!(matches!(
        refusal(&mirror, photo(late, too_far, MediaRole::Copy, 9)),
        EngineError::Invalid(_)
    ));
}
