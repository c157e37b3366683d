//! Moments: create, edit and delete (SPEC sections 3 and 4).

use super::{
    answer, check_optional_request_id, known_moment, moment_replay, refuse, Decision, Plan,
};
use crate::command::{CreateMoment, DeleteMoment, EditMoment, FieldChange};
use crate::error::{Conflict, EngineError};
use crate::ids::Id;
use crate::mirror::{Mirror, Moment};
use crate::op::{MomentCreate, MomentDelete, MomentEdit, OpBody, OpKind};
use crate::outcome::Outcome;

/// `moment.create`: a known request id or moment id answers with the
/// moment; a request id used by a recall is a conflict.
pub fn decide_create(mirror: &Mirror, c: CreateMoment, mint: &mut dyn FnMut() -> Id) -> Decision {
    // A recall's id is the request id of the moment it assembled, but it was
    // used by a recall request, not a create (SPEC section 3: another kind
    // of request is a conflict).
    if let Some(rid) = c.request_id.as_deref() {
        if mirror.recalls.contains_key(rid) {
            return refuse(
                Conflict::RequestId {
                    request_id: rid.to_owned(),
                    used_by_kind: OpKind::RecallStart.name(),
                    used_by: rid.to_owned(),
                }
                .into(),
            );
        }
    }
    if let Err(e) = check_optional_request_id(c.request_id.as_deref()) {
        return refuse(e);
    }
    // Key 1: the request id, whatever `id` the request carries now.
    match known_moment(mirror, c.request_id.as_deref(), OpKind::MomentCreate, None) {
        Err(e) => return refuse(e),
        Ok(Some(moment)) => {
            return answer(Outcome::MomentCreated {
                created: false,
                replayed: moment_replay(mirror, moment),
                moment: mirror.moment_view(moment),
            })
        }
        Ok(None) => {}
    }
    // Key 2: the entity id, deleted or not.
    if let Some(moment) = c.id.and_then(|id| mirror.moment(id)) {
        return answer(Outcome::MomentCreated {
            created: false,
            replayed: moment_replay(mirror, moment),
            moment: mirror.moment_view(moment),
        });
    }
    let id = match c.id {
        Some(id) => id,
        None => loop {
            let id = mint();
            if mirror.moment(id).is_none() {
                break id;
            }
        },
    };
    Decision::Write(
        vec![OpBody::MomentCreate(MomentCreate {
            id,
            request_id: c.request_id,
            device: c.device,
            text: c.text,
            caption: c.caption,
            lang: c.lang,
            captured_at_ms: c.captured_at_ms,
        })],
        Plan::Created(id),
    )
}

fn check_if_match(moment: &Moment, if_match: Option<u32>) -> Result<(), EngineError> {
    match if_match {
        Some(expected) if expected != moment.version => Err(EngineError::PreconditionFailed {
            current: moment.version,
            expected,
        }),
        _ => Ok(()),
    }
}

/// The change of one field: `None` when the edit leaves it as it is.
fn field_change(current: Option<&str>, wanted: FieldChange) -> FieldChange {
    match wanted {
        Some(value) if value.as_deref() != current => Some(value),
        _ => None,
    }
}

/// `moment.edit`: writes only the fields that change; `If-Match` must name
/// the current version.
pub fn decide_edit(mirror: &Mirror, c: EditMoment) -> Decision {
    if let Err(e) = check_optional_request_id(c.request_id.as_deref()) {
        return refuse(e);
    }
    match known_moment(
        mirror,
        c.request_id.as_deref(),
        OpKind::MomentEdit,
        Some(c.id),
    ) {
        Err(e) => return refuse(e),
        Ok(Some(moment)) => {
            return answer(Outcome::MomentEdited {
                changed: false,
                moment: mirror.moment_view(moment),
            })
        }
        Ok(None) => {}
    }
    let moment = match mirror.moment(c.id) {
        None => return refuse(EngineError::MomentNotFound(c.id)),
        Some(m) if m.deleted => return refuse(EngineError::Deleted(c.id)),
        Some(m) => m,
    };
    if let Err(e) = check_if_match(moment, c.if_match) {
        return refuse(e);
    }
    let text = field_change(moment.text(), c.text);
    let caption = field_change(moment.caption(), c.caption);
    let lang = field_change(moment.lang(), c.lang);
    if text.is_none() && caption.is_none() && lang.is_none() {
        return answer(Outcome::MomentEdited {
            changed: false,
            moment: mirror.moment_view(moment),
        });
    }
    Decision::Write(
        vec![OpBody::MomentEdit(MomentEdit {
            id: c.id,
            request_id: c.request_id,
            device: c.device,
            text,
            caption,
            lang,
        })],
        Plan::Edited(c.id),
    )
}

/// `moment.delete`: a tombstone answers as deleted; `If-Match` must name
/// the current version.
pub fn decide_delete(mirror: &Mirror, c: DeleteMoment) -> Decision {
    if let Err(e) = check_optional_request_id(c.request_id.as_deref()) {
        return refuse(e);
    }
    match known_moment(
        mirror,
        c.request_id.as_deref(),
        OpKind::MomentDelete,
        Some(c.id),
    ) {
        Err(e) => return refuse(e),
        Ok(Some(moment)) => {
            return answer(Outcome::MomentDeleted {
                deleted: false,
                moment: mirror.moment_view(moment),
            })
        }
        Ok(None) => {}
    }
    let moment = match mirror.moment(c.id) {
        None => return refuse(EngineError::MomentNotFound(c.id)),
        Some(m) => m,
    };
    if moment.deleted {
        return answer(Outcome::MomentDeleted {
            deleted: false,
            moment: mirror.moment_view(moment),
        });
    }
    if let Err(e) = check_if_match(moment, c.if_match) {
        return refuse(e);
    }
    Decision::Write(
        vec![OpBody::MomentDelete(MomentDelete {
            id: c.id,
            request_id: c.request_id,
            device: c.device,
        })],
        Plan::Deleted(c.id),
    )
}

#[cfg(test)]
mod tests;
