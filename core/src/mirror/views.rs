//! The mirror as the API shows it (SPEC section 10): views of moments,
//! media, turns, marks, jobs, recalls and messages, and the queries they
//! need.

use serde::Serialize;

use super::{Job, Mark, Media, Message, Mirror, Moment, Recall, Turn, TurnStatus};
use crate::ids::Id;
use crate::op::{MediaRole, OpKind, TurnMode};

/// A moment as the API shows it (SPEC section 10): every member present,
/// missing optional ones as `null`, times as RFC 3339 UTC strings.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct MomentView {
    /// Canonical ULID.
    pub id: Id,
    /// What the sign says.
    pub text: Option<String>,
    /// The person's caption.
    pub caption: Option<String>,
    /// Language tag.
    pub lang: Option<String>,
    /// When the photo was taken (RFC 3339 UTC), or null.
    pub captured_at: Option<String>,
    /// When the engine recorded the create (RFC 3339 UTC).
    pub created_at: String,
    /// Number of ops applied to the moment; what `ETag` and `If-Match` carry.
    pub version: u32,
    /// True for a tombstone.
    pub deleted: bool,
    /// True once the tombstone's content was erased (SPEC section 13): text,
    /// caption and lang are then `null`. Left out while false, so a moment
    /// that was never erased answers as it always did.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub erased: bool,
    /// The moment's media, in upload order.
    pub media: Vec<MediaView>,
    /// Ids of the moment's turns.
    pub turns: Vec<Id>,
}

impl MomentView {
    /// The view of the moment the `moment.create` `p` made at server time
    /// `ts_ms`, as [`Mirror::moment_view`] shows it right after that op
    /// (version 1, not deleted, no media, no turns), the payload's strings
    /// moved into it: the writer answers a create with it without reading
    /// the moment back from the mirror (issue 28).
    pub fn of_create(p: crate::op::MomentCreate, ts_ms: u64) -> MomentView {
        MomentView {
            id: p.id,
            text: p.text,
            caption: p.caption,
            lang: p.lang,
            captured_at: p.captured_at_ms.map(crate::time::format_rfc3339_ms),
            // Cast: server times are below i64::MAX ms for 292 million years.
            created_at: crate::time::format_rfc3339_ms(ts_ms as i64),
            version: 1,
            deleted: false,
            erased: false,
            media: Vec::new(),
            turns: Vec::new(),
        }
    }
}

/// A media record as the API shows it (SPEC section 10).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct MediaView {
    /// The media id.
    pub id: Id,
    /// The moment it belongs to.
    pub moment_id: Id,
    /// `copy` or `original`.
    pub role: MediaRole,
    /// Which photo of the moment, from 0 (issue 27).
    pub photo: u8,
    /// SHA-256 of the bytes, 64 lower-case hex characters.
    pub sha256: String,
    /// Number of bytes.
    pub size: u64,
    /// `Content-Type` as uploaded.
    pub content_type: String,
}

impl Mirror {
    /// A moment as the API shows it, with its media. A deleted moment's
    /// text, caption and lang are `None` from the delete on, in every
    /// answer that carries the moment (its `410`, the delete's own answer
    /// and its retries, a retried create or edit), not only once it is
    /// erased (SPEC section 13: nothing a person deleted is served again;
    /// the log keeps the content until the erasure, for an operator's
    /// `spark-replay dump` only).
    pub fn moment_view(&self, moment: &Moment) -> MomentView {
        // Decoded once for the three (each accessor decodes them all).
        let [text, caption, lang] = if moment.deleted {
            [None; 3]
        } else {
            moment.texts()
        };
        MomentView {
            id: moment.id,
            text: text.map(str::to_owned),
            caption: caption.map(str::to_owned),
            lang: lang.map(str::to_owned),
            captured_at: moment.captured_at_ms().map(crate::time::format_rfc3339_ms),
            // Cast: server times are below i64::MAX ms for 292 million years.
            created_at: crate::time::format_rfc3339_ms(moment.created_at_ms as i64),
            version: moment.version,
            deleted: moment.deleted,
            erased: moment.erased(),
            media: moment
                .media()
                .iter()
                .filter_map(|id| self.media.get(id))
                .map(|m| self.media_view(m))
                .collect(),
            turns: moment.turns().to_vec(),
        }
    }

    /// A media record as the API shows it.
    pub fn media_view(&self, media: &Media) -> MediaView {
        MediaView {
            id: media.id,
            moment_id: media.moment_id,
            role: media.role,
            photo: media.photo,
            sha256: hex::encode(media.sha256.0),
            size: media.size_bytes,
            content_type: media.content_type.clone(),
        }
    }
}

/// A turn as the API shows it (SPEC section 10).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct TurnView {
    /// The turn id.
    pub id: Id,
    /// The moment it reads.
    pub moment_id: Id,
    /// The seat asked.
    pub seat: String,
    /// `practical` or `recall`.
    pub mode: TurnMode,
    /// `running`, `done` or `failed`.
    pub status: &'static str,
    /// The reading, when done; `None` (as are `source` and `error`, but
    /// for [`MOMENT_DELETED_ERROR`](crate::rules::turns::MOMENT_DELETED_ERROR))
    /// once the turn's moment was deleted (SPEC section 13).
    pub answer: Option<String>,
    /// Why it failed, when failed.
    pub error: Option<String>,
    /// Which adapter answered, when done.
    pub adapter: Option<String>,
    /// What the reading was made from (`ocr`, `text`, `model`), when done.
    pub source: Option<String>,
    /// How long the brain took, in milliseconds, once ended.
    pub elapsed_ms: Option<u64>,
    /// The turn's request id, if any.
    pub request_id: Option<String>,
}

/// A mark as the API shows it (SPEC section 10).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct MarkView {
    /// `keep:<phrase>`.
    pub id: String,
    /// The normalised phrase.
    pub phrase: String,
    /// False once dropped.
    pub active: bool,
    /// The moment it was kept from, if any.
    pub moment_id: Option<Id>,
}

/// A job as the API shows it (SPEC section 10).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct JobView {
    /// The client's job id.
    pub job_id: String,
    /// The moment it reads.
    pub moment_id: Id,
    /// One turn per seat, in seat order (request ids `<job id>:<index>`).
    pub turns: Vec<TurnView>,
}

/// A quick-recall session as the API shows it (SPEC section 10).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct RecallView {
    /// The recall id.
    pub id: String,
    /// The moment assembled from the phrases.
    pub moment: MomentView,
    /// The session's turn (request id `<recall id>:turn`).
    pub turn: TurnView,
}

impl Mirror {
    /// True when `moment_id` names a moment whose content was erased (SPEC
    /// section 13): its turns' answers and its thread's bodies are gone.
    pub fn is_erased(&self, moment_id: Id) -> bool {
        self.moment(moment_id).is_some_and(Moment::erased)
    }

    /// True when `moment_id` names a deleted moment (erased or not yet):
    /// from the delete on, the API serves none of its content, its turns'
    /// readings nor its thread's bodies; the erasure later removes them
    /// from disk (SPEC section 13: a delete makes a tombstone at once).
    pub fn is_deleted(&self, moment_id: Id) -> bool {
        self.moment(moment_id).is_some_and(|m| m.deleted)
    }

    /// A turn as the API shows it; a turn of a deleted moment shows no
    /// answer, source or error, except the engine's own
    /// [`MOMENT_DELETED_ERROR`](crate::rules::turns::MOMENT_DELETED_ERROR),
    /// which holds nothing of the moment (SPEC section 13).
    pub fn turn_view(&self, turn: &Turn) -> TurnView {
        let mut view = turn.view();
        if self.is_deleted(turn.moment_id) {
            view.answer = None;
            view.source = None;
            view.error = view
                .error
                .filter(|e| e == crate::rules::turns::MOMENT_DELETED_ERROR);
        }
        view
    }

    /// A message as the API shows it; a message in a deleted moment's
    /// thread shows no body (`null`; SPEC section 13).
    pub fn message_view(&self, message: &Message) -> MessageView {
        MessageView {
            id: message.id,
            thread_id: message.thread_id,
            body: (!self.is_deleted(message.thread_id)).then(|| message.body.clone()),
            // Cast: server times are below i64::MAX ms.
            ts: crate::time::format_rfc3339_ms(message.ts_ms as i64),
            ts_ms: message.ts_ms,
        }
    }
}

impl Turn {
    /// The turn as stored, content included: the API goes through
    /// [`Mirror::turn_view`].
    fn view(&self) -> TurnView {
        let (status, answer, error, adapter, source, elapsed_ms) = match &self.status {
            TurnStatus::Running => ("running", None, None, None, None, None),
            TurnStatus::Done {
                answer,
                adapter,
                source,
                elapsed_ms,
            } => (
                "done",
                Some(answer.clone()),
                None,
                Some(adapter.clone()),
                Some(source.clone()),
                Some(*elapsed_ms),
            ),
            TurnStatus::Failed { error, elapsed_ms } => (
                "failed",
                None,
                Some(error.clone()),
                None,
                None,
                Some(*elapsed_ms),
            ),
        };
        TurnView {
            id: self.id,
            moment_id: self.moment_id,
            seat: self.seat.clone(),
            mode: self.mode,
            status,
            answer,
            error,
            adapter,
            source,
            elapsed_ms,
            request_id: self.request_id.clone(),
        }
    }
}

impl Mark {
    /// The mark as the API shows it.
    pub fn view(&self) -> MarkView {
        MarkView {
            id: self.id.clone(),
            phrase: self.phrase.clone(),
            active: self.active,
            moment_id: self.moment_id,
        }
    }
}

impl Mirror {
    /// A job as the API shows it: its turns are found by their derived
    /// request ids; a turn not (yet) written is left out.
    pub fn job_view(&self, job: &Job) -> JobView {
        let turns = (0..job.seats.len())
            .filter_map(|index| {
                self.turn_by_request(&crate::ids::job_turn_request_id(&job.job_id, index))
            })
            .map(|turn| self.turn_view(turn))
            .collect();
        JobView {
            job_id: job.job_id.clone(),
            moment_id: job.moment_id,
            turns,
        }
    }

    /// A recall as the API shows it, once its moment and turn exist.
    pub fn recall_view(&self, recall: &Recall) -> Option<RecallView> {
        let moment = self.moment(recall.moment_id)?;
        let turn = self.turns.get(&recall.turn_id)?;
        Some(RecallView {
            id: recall.id.clone(),
            moment: self.moment_view(moment),
            turn: self.turn_view(turn),
        })
    }

    /// The turn a request id started, if it started one.
    pub fn turn_by_request(&self, request_id: &str) -> Option<&Turn> {
        let row = self.requests.get(request_id)?;
        if row.kind != OpKind::TurnStart {
            return None;
        }
        self.turns.get(&row.entity.id()?)
    }

    /// Active marks, most recently kept first, at most `limit`.
    pub fn recent_marks(&self, limit: usize) -> Vec<&Mark> {
        let mut active: Vec<&Mark> = self.marks.values().filter(|m| m.active).collect();
        active.sort_unstable_by_key(|m| std::cmp::Reverse(m.kept_seq));
        active.truncate(limit);
        active
    }
}

/// A message as the API shows it (SPEC section 10).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct MessageView {
    /// The message id.
    pub id: Id,
    /// The thread (a moment id).
    pub thread_id: Id,
    /// The text; `null` once the thread's moment was deleted (SPEC section
    /// 13: served without it from the delete, erased from disk later).
    pub body: Option<String>,
    /// Server time of the post (RFC 3339 UTC).
    pub ts: String,
    /// The same time in Unix milliseconds.
    pub ts_ms: u64,
}
