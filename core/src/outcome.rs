//! What a write command produced: the answer shapes of SPEC section 10,
//! built from the mirror's views.

use crate::mirror::{
    JobView, MarkView, MediaView, MessageView, Mirror, MomentView, RecallView, TurnView,
};

/// Where a known answer came from (after the IETF httpapi
/// idempotency-key draft): the op that first produced what a replayed write
/// is answered with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    /// Seq of that op.
    pub seq: u64,
    /// Its server time, Unix milliseconds.
    pub ts_ms: u64,
    /// The request id it carried, if any (a media put, a phrase keep, a
    /// message and a recall start carry none; neither does an op whose
    /// request id an earlier op had already carried).
    pub request_id: Option<String>,
}

impl Replay {
    /// The replay of what the op at `seq`, server time `ts_ms`, produced:
    /// its request id is read from the request index (no row: `None`).
    pub fn of(mirror: &Mirror, seq: u64, ts_ms: u64) -> Replay {
        Replay {
            seq,
            ts_ms,
            request_id: mirror
                .requests
                .by_seq(seq)
                .map(|(request_id, _)| request_id.to_owned()),
        }
    }
}

/// What a write command produced (SPEC section 10 answer shapes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A create: `created` is false when a known request id or entity id
    /// answered with the existing moment.
    MomentCreated {
        /// True when this command wrote the `moment.create`.
        created: bool,
        /// When `created` is false: the op that created the moment.
        replayed: Option<Replay>,
        /// The moment as it is now.
        moment: MomentView,
    },
    /// An edit: `changed` is false when nothing was written.
    MomentEdited {
        /// True when this command wrote a `moment.edit`.
        changed: bool,
        /// The moment as it is now.
        moment: MomentView,
    },
    /// A delete: `deleted` is false when the moment was already a tombstone
    /// or the request id was already answered.
    MomentDeleted {
        /// True when this command wrote the `moment.delete`.
        deleted: bool,
        /// The moment as it is now.
        moment: MomentView,
    },
    /// An upload: `created` is false when the media id was known with the
    /// same bytes.
    MediaPut {
        /// True when this command wrote the `media.put`.
        created: bool,
        /// When `created` is false: the `media.put` that stored it.
        replayed: Option<Replay>,
        /// The media record.
        media: MediaView,
    },
    /// A turn start: `created` is false when the request id was known.
    TurnStarted {
        /// True when this command wrote the `turn.start`.
        created: bool,
        /// When `created` is false: the `turn.start` that started it.
        replayed: Option<Replay>,
        /// The turn as it is now.
        turn: TurnView,
    },
    /// A turn's outcome was recorded (or it had already ended).
    TurnEnded {
        /// The turn as it is now.
        turn: TurnView,
    },
    /// A phrase kept: `created` is false when it was already active.
    PhraseKept {
        /// True when this command wrote a `mark.keep`.
        created: bool,
        /// When `created` is false: the `mark.keep` that kept it last.
        replayed: Option<Replay>,
        /// The mark.
        mark: MarkView,
    },
    /// A phrase dropped: `dropped` is false when it was not active.
    PhraseDropped {
        /// True when this command wrote a `mark.drop`.
        dropped: bool,
        /// The mark.
        mark: MarkView,
    },
    /// A quick recall: `created` is false when the recall id was known.
    RecallStarted {
        /// True when this command wrote ops.
        created: bool,
        /// When `created` is false: the `recall.start` that started it.
        replayed: Option<Replay>,
        /// The recall with its moment and turn (boxed: it is the largest
        /// answer by far).
        recall: Box<RecallView>,
    },
    /// A message: `created` is false when the id was known (same body).
    MessagePosted {
        /// True when this command wrote the `message.post`.
        created: bool,
        /// When `created` is false: the `message.post` that stored it.
        replayed: Option<Replay>,
        /// The message, with the server's `ts`.
        message: MessageView,
    },
    /// A high-quality job: `created` is false when the job id was known.
    JobStarted {
        /// True when this command wrote ops.
        created: bool,
        /// When `created` is false: the `job.start` that started it.
        replayed: Option<Replay>,
        /// The job with its turns.
        job: JobView,
    },
}
