//! THE fold: the only code that turns ops into state (SPEC section 3 for
//! the request index rows it leaves). Deterministic: no clock, no
//! randomness, no I/O; time and ids come inside the op.

use std::collections::BTreeMap;

use super::prepare::{prepare, PreparedBody};
use super::{FastMap, Job, Mark, Media, Message, Mirror, Moment, Recall, Turn, TurnStatus};
use crate::ids::Id;
use crate::op::{
    Entity, JobStart, MarkKeep, MediaPut, MessagePost, MomentCreate, MomentEdit, Op, OpBody,
    OpKind, RecallStart, TurnStart,
};

use super::PreparedOp;

/// Why an op cannot be applied. The sequencer never decides such an op, so
/// meeting one in a log means the log was written by something else; replay
/// stops and names the seq.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FoldError {
    /// The op's seq is not the one after the mirror's.
    #[error("op seq {found} does not follow the mirror's seq {mirror_seq}")]
    OutOfOrder {
        /// The mirror's last applied seq.
        mirror_seq: u64,
        /// The op's seq.
        found: u64,
    },
    /// A create for an id that already exists.
    #[error("seq {seq}: moment {id} already exists")]
    AlreadyExists {
        /// The op's seq.
        seq: u64,
        /// The moment id.
        id: Id,
    },
    /// An edit or delete of a moment that does not exist or is deleted.
    #[error("seq {seq}: {kind} of moment {id}, which is {state}")]
    NotLive {
        /// The op's seq.
        seq: u64,
        /// The op's kind name.
        kind: &'static str,
        /// The moment id.
        id: Id,
        /// `"unknown"` or `"deleted"`.
        state: &'static str,
    },
    /// An op that does not fit the state (an id that exists, a turn that
    /// already ended, a mark that is not active, ...).
    #[error("seq {seq}: {kind} of {entity} refused: {why}")]
    Refused {
        /// The op's seq.
        seq: u64,
        /// The op's kind name.
        kind: &'static str,
        /// What it was about.
        entity: String,
        /// Why.
        why: &'static str,
    },
    /// A `media.put` whose media id exists, whose photo's role is already
    /// filled, or whose photo number is past the last.
    #[error("seq {seq}: media {id} cannot be put: {why}")]
    MediaConflict {
        /// The op's seq.
        seq: u64,
        /// The media id.
        id: Id,
        /// What is in the way.
        why: String,
    },
}

impl Mirror {
    /// THE fold: applies one op. Ops must come in seq order, each exactly
    /// once. On error the mirror is unchanged.
    ///
    /// Takes the op by value: its strings move into the mirror, so startup
    /// replay allocates each of them once (at decode) and never copies.
    /// Same as [`Mirror::apply_prepared`] of [`super::Preparer::prepare`].
    pub fn apply(&mut self, op: Op) -> Result<(), FoldError> {
        let prepared = prepare(&self.requests.hasher(), op);
        self.apply_prepared(prepared)
    }

    /// [`Mirror::apply`], handing a `moment.create`'s payload back once it
    /// is applied (without its request id, which the request index took):
    /// the writer builds the create's answer from it
    /// ([`super::MomentView::of_create`]), its strings moved rather than
    /// read back from the mirror and copied. `Ok(None)` for any other op.
    pub fn apply_keeping_create(&mut self, op: Op) -> Result<Option<MomentCreate>, FoldError> {
        let (prepared, kept) = super::prepare::prepare_keeping_create(&self.requests.hasher(), op);
        self.apply_prepared(prepared)?;
        Ok(kept)
    }

    /// THE fold, for an op made ready by [`super::Preparer::prepare`] (or by
    /// [`Mirror::apply`]): the only code that changes the mirror's state.
    /// Ops must come in seq order, each exactly once; on error the mirror
    /// is unchanged.
    pub fn apply_prepared(&mut self, op: PreparedOp) -> Result<(), FoldError> {
        if op.seq != self.seq + 1 {
            return Err(FoldError::OutOfOrder {
                mirror_seq: self.seq,
                found: op.seq,
            });
        }
        let PreparedOp {
            seq,
            ts_ms,
            request,
            body,
        } = op;
        match body {
            PreparedBody::Create { id, moment } => self.insert_moment(seq, id, moment)?,
            PreparedBody::Other(body) => self.apply_body(seq, ts_ms, *body)?,
        }
        if let Some((request_id, row)) = request {
            self.requests.insert_first(request_id, row);
        }
        self.seq = seq;
        self.ts_ms = ts_ms;
        Ok(())
    }

    /// Adds a created moment; refuses an id that exists.
    fn insert_moment(&mut self, seq: u64, id: Id, moment: Box<Moment>) -> Result<(), FoldError> {
        match self.moments.entry(id) {
            std::collections::btree_map::Entry::Occupied(_) => {
                return Err(FoldError::AlreadyExists { seq, id });
            }
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(moment);
            }
        }
        self.live_moments += 1;
        Ok(())
    }

    /// The state change of one op other than a prepared create.
    fn apply_body(&mut self, seq: u64, ts_ms: u64, body: OpBody) -> Result<(), FoldError> {
        let at = At {
            seq,
            ts_ms,
            kind: body.kind(),
        };
        match body {
            // Not reached from `prepare` (it boxes creates), kept whole so
            // that the fold never depends on how it was called.
            OpBody::MomentCreate(p) => {
                self.insert_moment(seq, p.id, Box::new(Moment::created(&p, seq, ts_ms)))?
            }
            OpBody::MomentEdit(p) => self.fold_edit(at, p)?,
            OpBody::MomentDelete(p) => {
                let moment = live_moment(&mut self.moments, at, p.id)?;
                moment.deleted = true;
                moment.version += 1;
                self.live_moments -= 1;
            }
            OpBody::MediaPut(p) => self.fold_media_put(at, p)?,
            OpBody::TurnStart(p) => self.fold_turn_start(at, p)?,
            OpBody::TurnFinish(p) => {
                let turn = running_turn(&mut self.turns, at, p.id)?;
                turn.status = TurnStatus::Done {
                    answer: p.answer,
                    adapter: p.adapter,
                    source: p.source,
                    elapsed_ms: p.elapsed_ms,
                };
            }
            OpBody::TurnFail(p) => {
                let turn = running_turn(&mut self.turns, at, p.id)?;
                turn.status = TurnStatus::Failed {
                    error: p.error,
                    elapsed_ms: p.elapsed_ms,
                };
            }
            OpBody::MarkKeep(p) => self.fold_mark_keep(at, p)?,
            OpBody::MarkDrop(p) => match self.marks.get_mut(&p.id) {
                Some(mark) if mark.active => mark.active = false,
                _ => return Err(refuse(at, Entity::Name(p.id), "the mark is not active")),
            },
            OpBody::JobStart(p) => self.fold_job_start(at, p)?,
            OpBody::MessagePost(p) => self.fold_message(at, ts_ms, p)?,
            OpBody::RecallStart(p) => self.fold_recall(at, p)?,
            OpBody::LogCompact(p) => {
                for subject in &p.subjects {
                    self.erase_moment(at, Id(u128::from_be_bytes(*subject)))?;
                }
            }
        }
        Ok(())
    }

    /// The fold's part of an erasure (SPEC section 13): the deleted moment
    /// loses its texts and is marked erased, its turns lose their answers,
    /// sources and errors, its thread's messages their bodies. Ids, times,
    /// versions, media records and the request index stay. Erasing an
    /// erased moment again changes nothing (a replay of a compacted log
    /// meets erased ops first, then the record).
    ///
    /// Errors: `NotLive` for a moment that does not exist, `Refused` for one
    /// that is not deleted (only tombstones are erased).
    fn erase_moment(&mut self, at: At, id: Id) -> Result<(), FoldError> {
        let Some(moment) = self.moments.get_mut(&id) else {
            return Err(FoldError::NotLive {
                seq: at.seq,
                kind: at.kind.name(),
                id,
                state: "unknown",
            });
        };
        if !moment.deleted {
            return Err(refuse(
                at,
                Entity::Id(id),
                "only a deleted moment is erased",
            ));
        }
        moment.erase();
        for turn_id in moment.turns() {
            if let Some(turn) = self.turns.get_mut(turn_id) {
                match &mut turn.status {
                    TurnStatus::Running => {}
                    TurnStatus::Done { answer, source, .. } => {
                        *answer = String::new();
                        *source = String::new();
                    }
                    TurnStatus::Failed { error, .. } => *error = String::new(),
                }
            }
        }
        if let Some(thread) = self.threads.get(&id) {
            for message_id in thread {
                if let Some(message) = self.messages.get_mut(message_id) {
                    message.body = String::new();
                }
            }
        }
        Ok(())
    }

    fn fold_edit(&mut self, at: At, p: MomentEdit) -> Result<(), FoldError> {
        let moment = live_moment(&mut self.moments, at, p.id)?;
        if p.text.is_some() || p.caption.is_some() || p.lang.is_some() {
            let [text, caption, lang] = moment.texts().map(|t| t.map(str::to_owned));
            let text = p.text.unwrap_or(text);
            let caption = p.caption.unwrap_or(caption);
            let lang = p.lang.unwrap_or(lang);
            let seq = moment.created_seq();
            moment.set_texts(seq, [text.as_deref(), caption.as_deref(), lang.as_deref()]);
        }
        moment.version += 1;
        Ok(())
    }

    fn fold_media_put(&mut self, at: At, p: MediaPut) -> Result<(), FoldError> {
        let seq = at.seq;
        let conflict = |why: String| FoldError::MediaConflict { seq, id: p.id, why };
        if self.media.contains_key(&p.id) {
            return Err(conflict("the media id exists".into()));
        }
        if let Some(why) = crate::wire::photo_out_of_range(p.photo) {
            return Err(conflict(why));
        }
        let moment = live_moment(&mut self.moments, at, p.moment_id)?;
        if let Some(other) = moment.media().iter().find(|m| {
            self.media
                .get(m)
                .is_some_and(|x| x.role == p.role && x.photo == p.photo)
        }) {
            return Err(conflict(format!(
                "the {} of photo {} is already media {other}",
                p.role.name(),
                p.photo
            )));
        }
        moment.push_media(p.id);
        moment.version += 1;
        self.media.insert(
            p.id,
            Media {
                id: p.id,
                moment_id: p.moment_id,
                role: p.role,
                photo: p.photo,
                sha256: p.sha256,
                size_bytes: p.size_bytes,
                content_type: p.content_type,
                seq,
                ts_ms: at.ts_ms,
            },
        );
        Ok(())
    }

    fn fold_turn_start(&mut self, at: At, p: TurnStart) -> Result<(), FoldError> {
        if self.turns.contains_key(&p.id) {
            return Err(refuse(at, Entity::Id(p.id), "the turn id exists"));
        }
        let moment = live_moment(&mut self.moments, at, p.moment_id)?;
        moment.ids.push(p.id);
        moment.version += 1;
        self.turns.insert(
            p.id,
            Turn {
                id: p.id,
                moment_id: p.moment_id,
                seat: p.seat,
                mode: p.mode,
                request_id: p.request_id,
                status: TurnStatus::Running,
                seq: at.seq,
                ts_ms: at.ts_ms,
            },
        );
        Ok(())
    }

    fn fold_mark_keep(&mut self, at: At, p: MarkKeep) -> Result<(), FoldError> {
        if self.marks.get(&p.id).is_some_and(|m| m.active) {
            return Err(refuse(at, Entity::Name(p.id), "the mark is active"));
        }
        self.marks.insert(
            p.id.clone(),
            Mark {
                id: p.id,
                phrase: p.phrase,
                active: true,
                moment_id: p.moment_id,
                kept_seq: at.seq,
                kept_ts_ms: at.ts_ms,
            },
        );
        Ok(())
    }

    fn fold_job_start(&mut self, at: At, p: JobStart) -> Result<(), FoldError> {
        if self.jobs.contains_key(&p.job_id) {
            return Err(refuse(at, Entity::Name(p.job_id), "the job id exists"));
        }
        live_moment(&mut self.moments, at, p.moment_id)?;
        self.jobs.insert(
            p.job_id.clone(),
            Job {
                job_id: p.job_id,
                moment_id: p.moment_id,
                seats: p.seats,
                seq: at.seq,
                ts_ms: at.ts_ms,
            },
        );
        Ok(())
    }

    fn fold_message(&mut self, at: At, ts_ms: u64, p: MessagePost) -> Result<(), FoldError> {
        if self.messages.contains_key(&p.id) {
            return Err(refuse(at, Entity::Id(p.id), "the message id exists"));
        }
        if self.moment(p.thread_id).is_none() {
            return Err(refuse(
                at,
                Entity::Id(p.id),
                "the thread's moment does not exist",
            ));
        }
        self.threads.entry(p.thread_id).or_default().insert(p.id);
        self.messages.insert(
            p.id,
            Message {
                id: p.id,
                thread_id: p.thread_id,
                body: p.body,
                ts_ms,
                seq: at.seq,
            },
        );
        Ok(())
    }

    fn fold_recall(&mut self, at: At, p: RecallStart) -> Result<(), FoldError> {
        if self.recalls.contains_key(&p.id) {
            return Err(refuse(at, Entity::Name(p.id), "the recall id exists"));
        }
        self.recalls.insert(
            p.id.clone(),
            Recall {
                id: p.id,
                moment_id: p.moment_id,
                turn_id: p.turn_id,
                marks: p.marks,
                seq: at.seq,
                ts_ms: at.ts_ms,
            },
        );
        Ok(())
    }
}

/// Where the fold is: the op's seq, server time and kind.
#[derive(Clone, Copy)]
struct At {
    seq: u64,
    ts_ms: u64,
    kind: OpKind,
}

fn refuse(at: At, entity: Entity, why: &'static str) -> FoldError {
    FoldError::Refused {
        seq: at.seq,
        kind: at.kind.name(),
        entity: entity.to_string(),
        why,
    }
}

fn running_turn(turns: &mut FastMap<Id, Turn>, at: At, id: Id) -> Result<&mut Turn, FoldError> {
    match turns.get_mut(&id) {
        Some(turn) if turn.status == TurnStatus::Running => Ok(turn),
        Some(_) => Err(refuse(at, Entity::Id(id), "the turn already ended")),
        None => Err(refuse(at, Entity::Id(id), "no such turn")),
    }
}

fn live_moment(
    moments: &mut BTreeMap<Id, Box<Moment>>,
    at: At,
    id: Id,
) -> Result<&mut Moment, FoldError> {
    let not_live = |state| FoldError::NotLive {
        seq: at.seq,
        kind: at.kind.name(),
        id,
        state,
    };
    match moments.get_mut(&id) {
        None => Err(not_live("unknown")),
        Some(m) if m.deleted => Err(not_live("deleted")),
        Some(m) => Ok(m),
    }
}

#[cfg(test)]
mod tests;
