//! The mirror: the engine's state, and the one fold that builds it.
//!
//! [`Mirror::apply`] is the only code that turns ops into state. Startup
//! replay, `spark-replay rebuild` (with or without `--at`) and the live write
//! path all call it. It is deterministic: no clock, no randomness, no I/O;
//! time and ids come inside the op. The request index (SPEC section 3) is
//! filled by the same fold: every op that carries a request id leaves a row,
//! and the first producer wins forever.

use std::collections::{BTreeMap, HashMap};

/// The mirror's hash maps: hashbrown's std map with foldhash, a fast hash
/// seeded at random per map (so request ids chosen by clients cannot be
/// picked to collide). SipHash, std's default, was the largest item in the
/// replay profile (issue 7).
pub type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

use serde::Serialize;
use thin_vec::ThinVec;

use crate::ids::Id;
use crate::op::{Entity, MediaRole, MomentCreate, Op, OpBody, OpKind, Sha256, TurnMode};
use crate::request_index::{HashedRequestId, RequestHasher, RequestIndex};

/// One moment as the mirror holds it: 64 bytes, and one allocation for its
/// three texts (issue 7: the mirror pays both per moment; it was 120 bytes
/// and three allocations). Read the texts, capture time, media and turns
/// through [`Moment::text`], [`Moment::caption`], [`Moment::lang`],
/// [`Moment::captured_at_ms`], [`Moment::media`] and [`Moment::turns`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moment {
    /// The moment's id.
    pub id: Id,
    /// What the sign says, the caption and the language tag, each present
    /// one as a LEB128 byte length and its UTF-8 bytes, in that order (see
    /// `present`).
    texts: Box<[u8]>,
    /// When the photo was taken, Unix milliseconds (when `present` says so).
    captured_at_ms: i64,
    /// Server time of the `moment.create`, Unix milliseconds.
    pub created_at_ms: u64,
    /// Number of ops applied to this moment (1 after the create).
    pub version: u32,
    /// True once a `moment.delete` was applied (a tombstone).
    pub deleted: bool,
    /// Which of text, caption, lang and capture time are present (bits 0
    /// to 3).
    present: u8,
    /// How many of `ids` are media ids (the rest are turn ids); at most one
    /// per role, so at most 2.
    media_count: u8,
    /// The ids of the moment's media in upload order, then of its turns in
    /// start order. A `ThinVec` (one pointer, no allocation while empty):
    /// most moments in a big mirror hold few.
    ids: ThinVec<Id>,
}

/// Bits of [`Moment`]'s `present`.
const HAS_TEXT: u8 = 1;
const HAS_CAPTION: u8 = 2;
const HAS_LANG: u8 = 4;
const HAS_CAPTURED_AT: u8 = 8;

impl Moment {
    /// A moment as a `moment.create` at server time `ts_ms` (Unix
    /// milliseconds) makes it: version 1, no media, no turns.
    pub fn new(
        id: Id,
        text: Option<&str>,
        caption: Option<&str>,
        lang: Option<&str>,
        captured_at_ms: Option<i64>,
        ts_ms: u64,
    ) -> Moment {
        let mut moment = Moment {
            id,
            texts: Box::default(),
            captured_at_ms: captured_at_ms.unwrap_or(0),
            created_at_ms: ts_ms,
            version: 1,
            deleted: false,
            present: if captured_at_ms.is_some() {
                HAS_CAPTURED_AT
            } else {
                0
            },
            media_count: 0,
            ids: ThinVec::new(),
        };
        moment.set_texts([text, caption, lang]);
        moment
    }

    /// What the sign says.
    pub fn text(&self) -> Option<&str> {
        self.texts()[0]
    }

    /// The person's caption.
    pub fn caption(&self) -> Option<&str> {
        self.texts()[1]
    }

    /// Language tag of the text.
    pub fn lang(&self) -> Option<&str> {
        self.texts()[2]
    }

    /// When the photo was taken, Unix milliseconds.
    pub fn captured_at_ms(&self) -> Option<i64> {
        (self.present & HAS_CAPTURED_AT != 0).then_some(self.captured_at_ms)
    }

    /// Ids of the moment's media, in upload order (at most one per role).
    pub fn media(&self) -> &[Id] {
        &self.ids[..usize::from(self.media_count)]
    }

    /// Ids of the moment's turns, in start order.
    pub fn turns(&self) -> &[Id] {
        &self.ids[usize::from(self.media_count)..]
    }

    /// Adds a media id after the others. The fold allows one per role, so
    /// the count stays far below 255.
    fn push_media(&mut self, id: Id) {
        self.ids.insert(usize::from(self.media_count), id);
        self.media_count += 1;
    }

    /// Text, caption and lang.
    fn texts(&self) -> [Option<&str>; 3] {
        let mut out = [None; 3];
        let mut at = 0usize;
        for (index, bit) in [HAS_TEXT, HAS_CAPTION, HAS_LANG].into_iter().enumerate() {
            if self.present & bit == 0 {
                continue;
            }
            let (bytes, next) = crate::len_prefixed::read(&self.texts, at);
            // Written by `set_texts` from whole `str`s only.
            out[index] = Some(std::str::from_utf8(bytes).expect("whole strs"));
            at = next;
        }
        out
    }

    /// Replaces text, caption and lang.
    fn set_texts(&mut self, texts: [Option<&str>; 3]) {
        // The exact size up front: shrinking a larger buffer would keep the
        // allocator's larger block.
        let total: usize = texts
            .iter()
            .flatten()
            .map(|t| crate::len_prefixed::encoded_len(t.len()))
            .sum();
        let mut bytes = Vec::with_capacity(total);
        self.present &= !(HAS_TEXT | HAS_CAPTION | HAS_LANG);
        for (text, bit) in texts.into_iter().zip([HAS_TEXT, HAS_CAPTION, HAS_LANG]) {
            let Some(text) = text else { continue };
            self.present |= bit;
            crate::len_prefixed::push(&mut bytes, text.as_bytes());
        }
        debug_assert_eq!(bytes.len(), total);
        self.texts = bytes.into_boxed_slice();
    }
}

/// The fields the mirror digest feeds, in a fixed order and encoding.
impl Serialize for Moment {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let [text, caption, lang] = self.texts();
        let mut s = serializer.serialize_struct("Moment", 10)?;
        s.serialize_field("id", &self.id)?;
        s.serialize_field("text", &text)?;
        s.serialize_field("caption", &caption)?;
        s.serialize_field("lang", &lang)?;
        s.serialize_field("captured_at_ms", &self.captured_at_ms())?;
        s.serialize_field("created_at_ms", &self.created_at_ms)?;
        s.serialize_field("version", &self.version)?;
        s.serialize_field("deleted", &self.deleted)?;
        s.serialize_field("media", self.media())?;
        s.serialize_field("turns", self.turns())?;
        s.end()
    }
}

/// One stored blob as the mirror holds it (from its `media.put`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Media {
    /// The phone-minted media id.
    pub id: Id,
    /// The moment it belongs to.
    pub moment_id: Id,
    /// Copy or original.
    pub role: MediaRole,
    /// SHA-256 of the bytes: the blob's address under `<data>/media/blobs/`.
    pub sha256: Sha256,
    /// Number of bytes.
    pub size_bytes: u64,
    /// `Content-Type` as uploaded.
    pub content_type: String,
    /// Seq of its `media.put`.
    pub seq: u64,
}

/// What a request id produced: a row of the request index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRow {
    /// Seq of the op that first carried the request id.
    pub seq: u64,
    /// That op's kind.
    pub kind: OpKind,
    /// The entity that op was about.
    pub entity: Entity,
}

/// Where a turn stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum TurnStatus {
    /// Started; the brain has not answered (or the engine stopped before it
    /// did: it is asked again after a restart).
    Running,
    /// The brain answered.
    Done {
        /// The reading.
        answer: String,
        /// Which adapter answered.
        adapter: String,
        /// What the reading was made from.
        source: String,
        /// How long the brain took, in milliseconds.
        elapsed_ms: u64,
    },
    /// The brain gave no answer.
    Failed {
        /// Why.
        error: String,
        /// How long the attempt took, in milliseconds.
        elapsed_ms: u64,
    },
}

/// One turn as the mirror holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Turn {
    /// The engine-minted turn id.
    pub id: Id,
    /// The moment it reads.
    pub moment_id: Id,
    /// The seat asked.
    pub seat: String,
    /// Practical or recall.
    pub mode: TurnMode,
    /// Its request id, if any.
    pub request_id: Option<String>,
    /// Where it stands.
    pub status: TurnStatus,
    /// Seq of its `turn.start`.
    pub seq: u64,
}

/// One kept phrase (a mark).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mark {
    /// `keep:<phrase>`.
    pub id: String,
    /// The normalised phrase.
    pub phrase: String,
    /// False once dropped (until kept again).
    pub active: bool,
    /// The moment it was last kept from, if any.
    pub moment_id: Option<Id>,
    /// Seq of the last `mark.keep`: recall takes the most recent first.
    pub kept_seq: u64,
}

/// One high-quality job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Job {
    /// The client's job id.
    pub job_id: String,
    /// The moment it reads.
    pub moment_id: Id,
    /// The seats asked, in order; turn `i` has request id `<job id>:<i>`.
    pub seats: Vec<String>,
    /// Seq of its `job.start`.
    pub seq: u64,
}

/// One message in a moment's thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// The ULID minted at the send attempt.
    pub id: Id,
    /// The thread (a moment id).
    pub thread_id: Id,
    /// The text.
    pub body: String,
    /// Server time of its `message.post`, Unix milliseconds.
    pub ts_ms: u64,
    /// Seq of its `message.post`.
    pub seq: u64,
}

/// One quick-recall session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Recall {
    /// The recall id.
    pub id: String,
    /// The moment assembled from the phrases.
    pub moment_id: Id,
    /// The session's turn.
    pub turn_id: Id,
    /// The marks used, most recent first.
    pub marks: Vec<String>,
    /// Seq of its `recall.start`.
    pub seq: u64,
}

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
    /// A `media.put` whose media id exists, or whose role is already filled.
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

/// The in-memory state: moments and the request index, as of `seq`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mirror {
    /// Seq of the last op applied (0 for an empty log).
    pub seq: u64,
    /// Server time of the last op applied, Unix milliseconds (0 when empty).
    pub ts_ms: u64,
    /// Every moment ever created, tombstones included, in id order (so the
    /// paged list walks it directly).
    /// Boxed: appends in id order leave B-tree nodes about half full, and a
    /// pointer per slot wastes far less than a whole moment per slot
    /// (issue 7: about 160 bytes less per moment).
    pub moments: BTreeMap<Id, Box<Moment>>,
    /// The request index: request id -> what its first op produced.
    pub requests: RequestIndex,
    /// Every stored blob, by media id.
    pub media: FastMap<Id, Media>,
    /// Every turn, by turn id.
    pub turns: FastMap<Id, Turn>,
    /// Every mark ever kept, active or dropped, by mark id.
    pub marks: BTreeMap<String, Mark>,
    /// Every job, by job id.
    pub jobs: FastMap<String, Job>,
    /// Every quick-recall session, by recall id.
    pub recalls: FastMap<String, Recall>,
    /// Every message, by id.
    pub messages: FastMap<Id, Message>,
    /// The message ids of each thread, in id order.
    pub threads: FastMap<Id, std::collections::BTreeSet<Id>>,
    /// Number of moments that are not deleted.
    pub live_moments: usize,
}

impl Mirror {
    /// An empty mirror (seq 0).
    pub fn new() -> Mirror {
        Mirror::default()
    }

    /// THE fold: applies one op. Ops must come in seq order, each exactly
    /// once. On error the mirror is unchanged.
    ///
    /// Takes the op by value: its strings move into the mirror, so startup
    /// replay allocates each of them once (at decode) and never copies.
    /// Same as [`Mirror::apply_prepared`] of [`Preparer::prepare`].
    pub fn apply(&mut self, op: Op) -> Result<(), FoldError> {
        let prepared = prepare(&self.requests.hasher(), op);
        self.apply_prepared(prepared)
    }

    /// A [`Preparer`] for ops this mirror will fold: startup replay prepares
    /// on the decoding thread and folds on another (issue 7).
    pub fn preparer(&self) -> Preparer {
        Preparer {
            hasher: self.requests.hasher(),
        }
    }

    /// THE fold, for an op made ready by [`Preparer::prepare`] (or by
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
        let body = match body {
            PreparedBody::Create { id, moment } => {
                match self.moments.entry(id) {
                    std::collections::btree_map::Entry::Occupied(_) => {
                        return Err(FoldError::AlreadyExists { seq, id });
                    }
                    std::collections::btree_map::Entry::Vacant(slot) => {
                        slot.insert(moment);
                    }
                }
                self.live_moments += 1;
                None
            }
            PreparedBody::Other(body) => Some(*body),
        };
        if let Some(body) = body {
            self.apply_body(seq, ts_ms, body)?;
        }
        if let Some((request_id, row)) = request {
            self.requests.insert_first(request_id, row);
        }
        self.seq = seq;
        self.ts_ms = ts_ms;
        Ok(())
    }

    /// The state change of one op other than a prepared create.
    fn apply_body(&mut self, seq: u64, ts_ms: u64, body: OpBody) -> Result<(), FoldError> {
        let at = At {
            seq,
            kind: body.kind(),
        };
        match body {
            OpBody::MomentCreate(p) => {
                // Not reached from `prepare` (it boxes creates), kept whole
                // so that the fold never depends on how it was called.
                let id = p.id;
                if self.moments.contains_key(&id) {
                    return Err(FoldError::AlreadyExists { seq, id });
                }
                self.moments.insert(id, Box::new(Moment::created(p, ts_ms)));
                self.live_moments += 1;
            }
            OpBody::MomentEdit(p) => {
                let moment = live_moment(&mut self.moments, at, p.id)?;
                if p.text.is_some() || p.caption.is_some() || p.lang.is_some() {
                    let [text, caption, lang] = moment.texts().map(|t| t.map(str::to_owned));
                    let text = p.text.unwrap_or(text);
                    let caption = p.caption.unwrap_or(caption);
                    let lang = p.lang.unwrap_or(lang);
                    moment.set_texts([text.as_deref(), caption.as_deref(), lang.as_deref()]);
                }
                moment.version += 1;
            }
            OpBody::MomentDelete(p) => {
                let moment = live_moment(&mut self.moments, at, p.id)?;
                moment.deleted = true;
                moment.version += 1;
                self.live_moments -= 1;
            }
            OpBody::MediaPut(p) => {
                let conflict = |why: String| FoldError::MediaConflict { seq, id: p.id, why };
                if self.media.contains_key(&p.id) {
                    return Err(conflict("the media id exists".into()));
                }
                let moment = live_moment(&mut self.moments, at, p.moment_id)?;
                if let Some(other) = moment
                    .media()
                    .iter()
                    .find(|m| self.media.get(m).is_some_and(|x| x.role == p.role))
                {
                    return Err(conflict(format!(
                        "the {} is already media {other}",
                        p.role.name()
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
                        sha256: p.sha256,
                        size_bytes: p.size_bytes,
                        content_type: p.content_type,
                        seq,
                    },
                );
            }
            OpBody::TurnStart(p) => {
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
                        seq,
                    },
                );
            }
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
            OpBody::MarkKeep(p) => {
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
                        kept_seq: seq,
                    },
                );
            }
            OpBody::MarkDrop(p) => match self.marks.get_mut(&p.id) {
                Some(mark) if mark.active => mark.active = false,
                _ => return Err(refuse(at, Entity::Name(p.id), "the mark is not active")),
            },
            OpBody::JobStart(p) => {
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
                        seq,
                    },
                );
            }
            OpBody::MessagePost(p) => {
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
                        seq,
                    },
                );
            }
            OpBody::RecallStart(p) => {
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
                        seq,
                    },
                );
            }
        }
        Ok(())
    }

    /// A moment by id, tombstones included.
    pub fn moment(&self, id: Id) -> Option<&Moment> {
        self.moments.get(&id).map(|m| &**m)
    }

    /// Up to `limit` live moments with ids above `after`, in id order, and
    /// whether more live moments follow.
    pub fn live_page(&self, after: Option<Id>, limit: usize) -> (Vec<&Moment>, bool) {
        use std::ops::Bound;
        let start = match after {
            Some(id) => Bound::Excluded(id),
            None => Bound::Unbounded,
        };
        let mut live = self
            .moments
            .range((start, Bound::Unbounded))
            .map(|(_, m)| &**m)
            .filter(|m| !m.deleted);
        let page: Vec<&Moment> = live.by_ref().take(limit).collect();
        let more = live.next().is_some();
        (page, more)
    }

    /// Number of tombstones.
    pub fn deleted_moments(&self) -> usize {
        self.moments.len() - self.live_moments
    }

    /// A BLAKE3 digest of the whole mirror in a canonical order (every map
    /// sorted by key, each item encoded by [`crate::codec`]), as 64
    /// lower-case hex characters. Two mirrors with the same state have the
    /// same digest, however they were built; `spark-replay rebuild` prints it
    /// and the restart tests compare it. It covers what the mirror holds, so
    /// digests are comparable between builds with the same mirror (README,
    /// "The tools"), not across every version.
    pub fn digest(&self) -> String {
        let mut hasher = blake3::Hasher::new();
        let mut feed = |item: &dyn erased::Encode| {
            // Encoding plain data into memory cannot fail; an error would
            // only make two digests differ.
            let bytes = item.encode().unwrap_or_default();
            hasher.update(&(bytes.len() as u64).to_le_bytes());
            hasher.update(&bytes);
        };
        feed(&self.seq);
        for moment in self.moments.values() {
            feed(moment);
        }
        let mut requests: Vec<(&str, RequestRow)> = self.requests.iter().collect();
        requests.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (request_id, row) in requests {
            feed(&(request_id, row.seq, row.kind.code(), row.entity.to_string()));
        }
        for item in sorted(&self.media) {
            feed(item);
        }
        for item in sorted(&self.turns) {
            feed(item);
        }
        for item in self.marks.values() {
            feed(item);
        }
        for item in sorted(&self.jobs) {
            feed(item);
        }
        for item in sorted(&self.recalls) {
            feed(item);
        }
        for item in sorted(&self.messages) {
            feed(item);
        }
        hasher.finalize().to_hex().to_string()
    }
}

/// An op made ready for the fold by [`Preparer::prepare`]: a create's
/// moment already built and boxed, the request id already hashed, the
/// request index row already decided. Startup replay prepares on the
/// decoding thread, so the fold thread moves a few pointers per op instead
/// of a whole payload (issue 7). Preparing reads no state: it cannot fail.
#[derive(Debug)]
pub struct PreparedOp {
    seq: u64,
    ts_ms: u64,
    request: Option<(HashedRequestId, RequestRow)>,
    body: PreparedBody,
}

impl PreparedOp {
    /// The op's seq.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// True if the op carries a request id (it adds a request index row
    /// unless the id is known).
    pub fn carries_request_id(&self) -> bool {
        self.request.is_some()
    }
}

#[derive(Debug)]
enum PreparedBody {
    /// A `moment.create`: the moment as the mirror will hold it.
    Create { id: Id, moment: Box<Moment> },
    /// Any other op, boxed (so that a batch of prepared ops stays small).
    Other(Box<OpBody>),
}

/// Prepares ops for one mirror (see [`Mirror::preparer`]); `Send`, for the
/// replay's decoding thread.
#[derive(Clone)]
pub struct Preparer {
    hasher: RequestHasher,
}

impl Preparer {
    /// `op`, made ready for [`Mirror::apply_prepared`] of the mirror this
    /// preparer came from. Pure: no state is read.
    pub fn prepare(&self, op: Op) -> PreparedOp {
        prepare(&self.hasher, op)
    }
}

fn prepare(hasher: &RequestHasher, op: Op) -> PreparedOp {
    let Op {
        seq,
        ts_ms,
        mut body,
    } = op;
    let request = body.take_request_id().map(|request_id| {
        let row = RequestRow {
            seq,
            kind: body.kind(),
            entity: body.entity(),
        };
        (hasher.hashed(request_id), row)
    });
    let body = match body {
        OpBody::MomentCreate(p) => PreparedBody::Create {
            id: p.id,
            moment: Box::new(Moment::created(p, ts_ms)),
        },
        other => PreparedBody::Other(Box::new(other)),
    };
    PreparedOp {
        seq,
        ts_ms,
        request,
        body,
    }
}

impl Moment {
    /// The moment a `moment.create` at `seq`, `ts_ms` makes (the payload's
    /// device is dropped: the mirror does not keep it).
    fn created(p: MomentCreate, ts_ms: u64) -> Moment {
        Moment::new(
            p.id,
            p.text.as_deref(),
            p.caption.as_deref(),
            p.lang.as_deref(),
            p.captured_at_ms,
            ts_ms,
        )
    }
}

/// The values of a map in key order.
fn sorted<K: Ord, V>(map: &FastMap<K, V>) -> Vec<&V> {
    let mut entries: Vec<(&K, &V)> = map.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    entries.into_iter().map(|(_, v)| v).collect()
}

/// Object-safe encoding for the digest.
mod erased {
    /// Encodes a value with the crate's codec.
    pub trait Encode {
        /// The value's bytes.
        fn encode(&self) -> Result<Vec<u8>, crate::codec::CodecError>;
    }

    impl<T: serde::Serialize> Encode for T {
        fn encode(&self) -> Result<Vec<u8>, crate::codec::CodecError> {
            crate::codec::encode(self)
        }
    }
}

/// Where the fold is: the op's seq and kind, for its errors.
#[derive(Clone, Copy)]
struct At {
    seq: u64,
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
    /// The moment's media, in upload order.
    pub media: Vec<MediaView>,
    /// Ids of the moment's turns.
    pub turns: Vec<Id>,
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
    /// SHA-256 of the bytes, 64 lower-case hex characters.
    pub sha256: String,
    /// Number of bytes.
    pub size: u64,
    /// `Content-Type` as uploaded.
    pub content_type: String,
}

impl Mirror {
    /// A moment as the API shows it, with its media.
    pub fn moment_view(&self, moment: &Moment) -> MomentView {
        // Decoded once for the three (each accessor decodes them all).
        let [text, caption, lang] = moment.texts();
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
    /// The reading, when done.
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

impl Turn {
    /// The turn as the API shows it.
    pub fn view(&self) -> TurnView {
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
            .filter_map(|index| self.turn_by_request(&format!("{}:{index}", job.job_id)))
            .map(Turn::view)
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
            turn: turn.view(),
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
    /// The text.
    pub body: String,
    /// Server time of the post (RFC 3339 UTC).
    pub ts: String,
    /// The same time in Unix milliseconds.
    pub ts_ms: u64,
}

impl Message {
    /// The message as the API shows it.
    pub fn view(&self) -> MessageView {
        MessageView {
            id: self.id,
            thread_id: self.thread_id,
            body: self.body.clone(),
            // Cast: server times are below i64::MAX ms.
            ts: crate::time::format_rfc3339_ms(self.ts_ms as i64),
            ts_ms: self.ts_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::MomentEdit;

    fn create(seq: u64, id: u128, text: Option<&str>, lang: Option<&str>) -> Op {
        Op {
            seq,
            ts_ms: 1_700_000_000_000 + seq,
            body: OpBody::MomentCreate(MomentCreate {
                id: Id(id),
                request_id: Some(format!("r{seq}")),
                device: "phone".into(),
                text: text.map(str::to_owned),
                caption: None,
                lang: lang.map(str::to_owned),
                captured_at_ms: Some(-5),
            }),
        }
    }

    #[test]
    fn a_moment_is_64_bytes() {
        // Issue 7: paid once per moment in a big mirror.
        assert_eq!(std::mem::size_of::<Moment>(), 64);
    }

    #[test]
    fn texts_survive_creates_and_edits() {
        let long = "é".repeat(200); // 400 bytes: a two-byte length prefix
        let mut mirror = Mirror::new();
        mirror.apply(create(1, 1, Some(&long), Some("fr"))).unwrap();
        mirror.apply(create(2, 2, None, Some(""))).unwrap();
        let m = mirror.moment(Id(1)).unwrap();
        assert_eq!(
            (m.text(), m.caption(), m.lang(), m.captured_at_ms()),
            (Some(long.as_str()), None, Some("fr"), Some(-5))
        );
        let m = mirror.moment(Id(2)).unwrap();
        assert_eq!((m.text(), m.caption(), m.lang()), (None, None, Some("")));

        // Set the caption, clear the text, leave the lang alone.
        mirror
            .apply(Op {
                seq: 3,
                ts_ms: 1_700_000_000_003,
                body: OpBody::MomentEdit(MomentEdit {
                    id: Id(1),
                    request_id: None,
                    device: "phone".into(),
                    text: Some(None),
                    caption: Some(Some("ÿ near the station".into())),
                    lang: None,
                }),
            })
            .unwrap();
        let m = mirror.moment(Id(1)).unwrap();
        assert_eq!(
            (m.text(), m.caption(), m.lang(), m.version),
            (None, Some("ÿ near the station"), Some("fr"), 2)
        );
        // What the digest feeds is the same as for an equal moment built whole.
        let whole = Moment {
            version: 2,
            ..Moment::new(
                Id(1),
                None,
                Some("ÿ near the station"),
                Some("fr"),
                Some(-5),
                1_700_000_000_001,
            )
        };
        assert_eq!(m, &whole);
        assert_eq!(
            crate::codec::encode(m).unwrap(),
            crate::codec::encode(&whole).unwrap()
        );
    }
}
