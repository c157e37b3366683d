//! Media admission (SPEC section 4, DESIGN.md "Media"): a media id names one
//! blob of one role of one photo of one moment, for good (a moment holds up
//! to [`crate::wire::PHOTOS_PER_MOMENT`] photos, issue 27). The same id with other
//! bytes, a photo's role another media already fills, and a deleted moment are refused here,
//! and only here: the HTTP layer asks [`admit_target`] before it reads a
//! byte and [`admit_bytes`] before it puts the blob in place, and the
//! sequencer decides with [`decide_put_media`], which asks [`admit_bytes`]
//! again against the committed mirror.

use super::{answer, live, refuse, Decision, Plan};
use crate::command::PutMedia;
use crate::error::{Conflict, EngineError};
use crate::ids::Id;
use crate::mirror::{Media, Mirror};
use crate::op::{MediaPut, MediaRole, OpBody, Sha256};
use crate::outcome::{Outcome, Replay};
use crate::wire::photo_out_of_range;

/// What the bytes cannot change: a known media id must belong to this
/// moment, photo and role; an unknown one needs a live moment and a photo
/// number below [`crate::wire::PHOTOS_PER_MOMENT`] (issue 27). `Ok(Some(media))` when
/// the id is known (its bytes are compared by [`admit_bytes`]).
///
/// Errors: [`Conflict::MediaOwner`], [`EngineError::Invalid`] (a photo
/// number past the last), [`EngineError::MomentNotFound`],
/// [`EngineError::Deleted`].
pub fn admit_target(
    mirror: &Mirror,
    media_id: Id,
    moment_id: Id,
    photo: u8,
    role: MediaRole,
) -> Result<Option<&Media>, EngineError> {
    if let Some(known) = mirror.media.get(&media_id) {
        if known.moment_id != moment_id || known.photo != photo || known.role != role {
            return Err(Conflict::MediaOwner {
                media_id,
                moment_id: known.moment_id,
                photo: known.photo,
                role: known.role,
            }
            .into());
        }
        return Ok(Some(known));
    }
    photo_in_range(photo)?;
    live(mirror, moment_id)?;
    Ok(None)
}

/// A new upload's photo number must be below [`crate::wire::PHOTOS_PER_MOMENT`]
/// (`X-Photo`, issue 27). Errors: [`EngineError::Invalid`].
fn photo_in_range(photo: u8) -> Result<(), EngineError> {
    match photo_out_of_range(photo) {
        Some(why) => Err(EngineError::Invalid(why)),
        None => Ok(()),
    }
}

/// The whole admission of an upload whose bytes are known: `Ok(Some(media))`
/// for a replay of a known upload (same bytes, moment, photo and role:
/// nothing to write), `Ok(None)` for a new one. Each photo of a moment
/// holds one copy and one original (issue 27).
///
/// Errors: [`Conflict::MediaBytes`] (same id, other bytes),
/// [`Conflict::MediaOwner`], [`EngineError::MomentNotFound`],
/// [`EngineError::Invalid`], [`EngineError::Deleted`],
/// [`Conflict::RoleTaken`].
pub fn admit_bytes<'m>(mirror: &'m Mirror, c: &PutMedia) -> Result<Option<&'m Media>, EngineError> {
    // The media id: a replay must carry the same bytes for the same moment
    // and role; anything else is a client bug, never a guess.
    if let Some(existing) = mirror.media.get(&c.id) {
        if existing.sha256.0 != c.sha256 {
            return Err(Conflict::MediaBytes {
                media_id: c.id,
                stored_sha256: existing.sha256.0,
                offered_sha256: c.sha256,
            }
            .into());
        }
        return admit_target(mirror, c.id, c.moment_id, c.photo, c.role);
    }
    photo_in_range(c.photo)?;
    let moment = live(mirror, c.moment_id)?;
    if let Some(other) = moment
        .media()
        .iter()
        .filter_map(|id| mirror.media.get(id))
        .find(|m| m.photo == c.photo && m.role == c.role)
    {
        return Err(Conflict::RoleTaken {
            moment_id: c.moment_id,
            photo: c.photo,
            role: c.role,
            media_id: other.id,
        }
        .into());
    }
    Ok(None)
}

/// The answer to a replay of the known upload `existing`: its record, and
/// its `media.put` as the replay.
pub fn known_upload(mirror: &Mirror, existing: &Media) -> Outcome {
    Outcome::MediaPut {
        created: false,
        replayed: Some(Replay::of(mirror, existing.seq, existing.ts_ms)),
        media: mirror.media_view(existing),
    }
}

/// `media.put`: a known upload answers with its record; a new one is
/// written once [`admit_bytes`] lets it in.
pub fn decide_put_media(mirror: &Mirror, c: PutMedia) -> Decision {
    match admit_bytes(mirror, &c) {
        Err(e) => refuse(e),
        Ok(Some(existing)) => answer(known_upload(mirror, existing)),
        Ok(None) => Decision::Write(
            vec![OpBody::MediaPut(MediaPut {
                id: c.id,
                moment_id: c.moment_id,
                role: c.role,
                sha256: Sha256(c.sha256),
                size_bytes: c.size_bytes,
                content_type: c.content_type,
                device: c.device,
                photo: c.photo,
            })],
            Plan::MediaPut(c.id),
        ),
    }
}

#[cfg(test)]
mod tests;
