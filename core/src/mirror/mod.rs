//! The mirror: the engine's state, and the one fold that builds it.
//!
//! [`Mirror::apply`] is the only code that turns ops into state. Startup
//! replay, `spark-replay rebuild` (with or without `--at`) and the live write
//! path all call it. It is deterministic: no clock, no randomness, no I/O;
//! time and ids come inside the op. The request index (SPEC section 3) is
//! filled by the same fold: every op that carries a request id leaves a row,
//! and the first producer wins forever.
//!
//! By job: this file holds the state (the entities and [`Mirror`] with its
//! queries); `fold.rs` the one fold, `prepare.rs` the ops made ready for
//! it, `digest.rs` the canonical digest, `views.rs` the API views.

mod digest;
mod fold;
mod prepare;
mod views;

pub use fold::FoldError;
pub use prepare::{PreparedOp, Preparer};
pub use views::{JobView, MarkView, MediaView, MessageView, MomentView, RecallView, TurnView};

use std::collections::{BTreeMap, HashMap};

/// The mirror's hash maps: hashbrown's std map with foldhash, a fast hash
/// seeded at random per map (so request ids chosen by clients cannot be
/// picked to collide). SipHash, std's default, was the largest item in the
/// replay profile.
pub type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

use serde::{Deserialize, Serialize};
use thin_vec::ThinVec;

use crate::ids::Id;
use crate::op::{MediaRole, Sha256, TurnMode};
use crate::request_index::RequestIndex;

/// Why a moment's packed parts (as a checkpoint stores them,
/// CHECKPOINT.md "Moments") do not make a moment. Each names the moment.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PackedMomentError {
    /// `present` has bits other than the three texts, capture time and
    /// erased.
    #[error("moment {id}: unknown present bits {present:#x}")]
    PresentBits {
        /// The moment.
        id: Id,
        /// The present bits.
        present: u8,
    },
    /// More media than ids.
    #[error("moment {id}: {media_count} media but {ids} ids")]
    MediaCount {
        /// The moment.
        id: Id,
        /// The media count.
        media_count: u8,
        /// How many ids there are.
        ids: usize,
    },
    /// The packed texts do not start with a LEB128 create seq.
    #[error("moment {id}: packed texts hold no create seq")]
    NoCreateSeq {
        /// The moment.
        id: Id,
    },
    /// A packed text's length runs past the packed texts.
    #[error("moment {id}: a packed text runs past its end")]
    TextRunsPast {
        /// The moment.
        id: Id,
    },
    /// A packed text is not UTF-8.
    #[error("moment {id}: a packed text is not UTF-8")]
    TextNotUtf8 {
        /// The moment.
        id: Id,
    },
    /// Bytes are left after the texts `present` names.
    #[error("moment {id}: {trailing_bytes} bytes after the packed texts")]
    TrailingBytes {
        /// The moment.
        id: Id,
        /// How many.
        trailing_bytes: usize,
    },
}

/// One moment as the mirror holds it: 64 bytes, and one allocation for its
/// create's seq and its three texts (the mirror pays both per
/// moment; it was 120 bytes and three allocations). Read the texts, capture
/// time, create seq, media and turns through [`Moment::text`],
/// [`Moment::caption`], [`Moment::lang`], [`Moment::captured_at_ms`],
/// [`Moment::created_seq`], [`Moment::media`] and [`Moment::turns`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moment {
    /// The moment's id.
    pub id: Id,
    /// The seq of the `moment.create` as LEB128 (1 to 4 bytes below 2^28
    /// ops: what a replayed create's answer names), then what the
    /// sign says, the caption and the language tag, each present one as a
    /// LEB128 byte length and its UTF-8 bytes, in that order (see
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
/// Set once the moment's content was erased (SPEC section 13): it is deleted,
/// its texts are gone, and so are its turns' answers, its messages' bodies
/// and its media's bytes.
const ERASED: u8 = 16;

impl Moment {
    /// A moment as a `moment.create` at `seq` and server time `ts_ms` (Unix
    /// milliseconds) makes it: version 1, no media, no turns.
    pub fn new(
        id: Id,
        text: Option<&str>,
        caption: Option<&str>,
        lang: Option<&str>,
        captured_at_ms: Option<i64>,
        (seq, ts_ms): (u64, u64),
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
        moment.set_texts(seq, [text, caption, lang]);
        moment
    }

    /// Seq of the `moment.create`.
    pub fn created_seq(&self) -> u64 {
        crate::len_prefixed::read_leb128(&self.texts, 0).0
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

    /// True once a compaction erased the moment's content (SPEC section 13):
    /// its text, caption and lang are `None`, and its turns' answers, its
    /// thread's message bodies and its media's bytes are gone too.
    pub fn erased(&self) -> bool {
        self.present & ERASED != 0
    }

    /// Drops the moment's texts and marks it erased (the fold's part of an
    /// erasure; see [`Moment::erased`]).
    pub(crate) fn erase(&mut self) {
        let seq = self.created_seq();
        self.set_texts(seq, [None; 3]);
        self.present |= ERASED;
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

    /// The packed parts a checkpoint stores (see `crate::checkpoint`):
    /// the create seq and texts as packed, the capture time field, the
    /// `present` bits, the media count and the ids.
    pub(crate) fn packed_parts(&self) -> (&[u8], i64, u8, u8, &[Id]) {
        (
            &self.texts,
            self.captured_at_ms,
            self.present,
            self.media_count,
            &self.ids,
        )
    }

    /// A moment from the parts [`Moment::packed_parts`] gave, checked: the
    /// packed texts must hold a LEB128 seq and exactly the texts `present`
    /// names, each whole UTF-8; `present` only its four bits;
    /// `media_count` at most the ids. Errors say which part is wrong.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_packed_parts(
        id: Id,
        texts: Box<[u8]>,
        captured_at_ms: i64,
        (created_at_ms, version, deleted): (u64, u32, bool),
        present: u8,
        media_count: u8,
        ids: ThinVec<Id>,
    ) -> Result<Moment, PackedMomentError> {
        if present & !(HAS_TEXT | HAS_CAPTION | HAS_LANG | HAS_CAPTURED_AT | ERASED) != 0 {
            return Err(PackedMomentError::PresentBits { id, present });
        }
        if usize::from(media_count) > ids.len() {
            return Err(PackedMomentError::MediaCount {
                id,
                media_count,
                ids: ids.len(),
            });
        }
        let mut at = crate::len_prefixed::checked_read_leb128(&texts, 0)
            .ok_or(PackedMomentError::NoCreateSeq { id })?
            .1;
        for bit in [HAS_TEXT, HAS_CAPTION, HAS_LANG] {
            if present & bit == 0 {
                continue;
            }
            let (bytes, next) = crate::len_prefixed::checked_read(&texts, at)
                .ok_or(PackedMomentError::TextRunsPast { id })?;
            std::str::from_utf8(bytes).map_err(|_| PackedMomentError::TextNotUtf8 { id })?;
            at = next;
        }
        if at != texts.len() {
            return Err(PackedMomentError::TrailingBytes {
                id,
                trailing_bytes: texts.len() - at,
            });
        }
        Ok(Moment {
            id,
            texts,
            captured_at_ms,
            created_at_ms,
            version,
            deleted,
            present,
            media_count,
            ids,
        })
    }

    /// Text, caption and lang.
    fn texts(&self) -> [Option<&str>; 3] {
        let mut out = [None; 3];
        let mut at = crate::len_prefixed::read_leb128(&self.texts, 0).1;
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

    /// Replaces text, caption and lang; `seq` is the create's.
    fn set_texts(&mut self, seq: u64, texts: [Option<&str>; 3]) {
        // The exact size up front: shrinking a larger buffer would keep the
        // allocator's larger block.
        let total: usize = texts
            .iter()
            .flatten()
            .map(|t| crate::len_prefixed::encoded_len(t.len()))
            .sum::<usize>()
            + crate::len_prefixed::leb128_len(seq);
        let mut bytes = Vec::with_capacity(total);
        crate::len_prefixed::push_leb128(&mut bytes, seq);
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
        let mut s = serializer.serialize_struct("Moment", 11)?;
        s.serialize_field("id", &self.id)?;
        s.serialize_field("created_seq", &self.created_seq())?;
        s.serialize_field("text", &text)?;
        s.serialize_field("caption", &caption)?;
        s.serialize_field("lang", &lang)?;
        s.serialize_field("captured_at_ms", &self.captured_at_ms())?;
        s.serialize_field("created_at_ms", &self.created_at_ms)?;
        s.serialize_field("version", &self.version)?;
        // 0 live, 1 deleted, 2 erased: a `u8` encodes as the `bool` it
        // replaced did, so digests of mirrors without erasures are unchanged.
        s.serialize_field(
            "deleted",
            &(u8::from(self.deleted) + u8::from(self.erased())),
        )?;
        s.serialize_field("media", self.media())?;
        s.serialize_field("turns", self.turns())?;
        s.end()
    }
}

/// One stored blob as the mirror holds it (from its `media.put`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Media {
    /// The phone-minted media id.
    pub id: Id,
    /// The moment it belongs to.
    pub moment_id: Id,
    /// Copy or original.
    pub role: MediaRole,
    /// Which photo of the moment, `0 ..` [`crate::wire::PHOTOS_PER_MOMENT`]
    /// (issue 27; 0 for uploads written before several photos).
    pub photo: u8,
    /// SHA-256 of the bytes: the blob's address under `<data>/media/blobs/`.
    pub sha256: Sha256,
    /// Number of bytes.
    pub size_bytes: u64,
    /// `Content-Type` as uploaded.
    pub content_type: String,
    /// Seq of its `media.put`.
    pub seq: u64,
    /// Server time of its `media.put`, Unix milliseconds.
    pub ts_ms: u64,
}

/// Where a turn stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Server time of its `turn.start`, Unix milliseconds.
    pub ts_ms: u64,
}

/// One kept phrase (a mark).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Server time of the last `mark.keep`, Unix milliseconds.
    pub kept_ts_ms: u64,
}

/// One high-quality job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// The client's job id.
    pub job_id: String,
    /// The moment it reads.
    pub moment_id: Id,
    /// The seats asked, in order; turn `i` has request id `<job id>:<i>`.
    pub seats: Vec<String>,
    /// Seq of its `job.start`.
    pub seq: u64,
    /// Server time of its `job.start`, Unix milliseconds.
    pub ts_ms: u64,
}

/// One message in a moment's thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Server time of its `recall.start`, Unix milliseconds.
    pub ts_ms: u64,
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
    /// (about 160 bytes less per moment).
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

/// The order of a page of moments (`GET /api/moments?order=`): ids sort
/// by time (ULIDs), so id order is capture order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PageOrder {
    /// Lowest id first (the default: SPEC section 4's id order).
    #[default]
    Oldest,
    /// Highest id first: a feed's newest moments on its first page.
    Newest,
}

impl Mirror {
    /// An empty mirror (seq 0).
    pub fn new() -> Mirror {
        Mirror::default()
    }

    /// An empty mirror whose request index hashes with `seed`: the mirror
    /// a checkpoint with that seed is loaded into
    /// ([`crate::checkpoint::Header::request_seed`]), so that request ids
    /// prepared for it beforehand need no second hash.
    pub fn with_request_seed(seed: u64) -> Mirror {
        Mirror {
            requests: RequestIndex::with_seed(seed),
            ..Mirror::default()
        }
    }

    /// A moment by id, tombstones included.
    pub fn moment(&self, id: Id) -> Option<&Moment> {
        self.moments.get(&id).map(|m| &**m)
    }

    /// Up to `limit` live moments after `after` in `order` (for
    /// [`PageOrder::Oldest`]: ids above `after`, in id order; for
    /// [`PageOrder::Newest`]: ids below `after`, highest first), and whether
    /// more live moments follow in that order. `after` need not be a
    /// moment's id: any id is a place in the order.
    pub fn live_page(
        &self,
        after: Option<Id>,
        limit: usize,
        order: PageOrder,
    ) -> (Vec<&Moment>, bool) {
        use std::ops::Bound;
        let bound = match after {
            Some(id) => Bound::Excluded(id),
            None => Bound::Unbounded,
        };
        let live = |m: &&Moment| !m.deleted;
        let (page, more) = match order {
            PageOrder::Oldest => {
                let mut it = self
                    .moments
                    .range((bound, Bound::Unbounded))
                    .map(|(_, m)| &**m)
                    .filter(live);
                let page: Vec<&Moment> = it.by_ref().take(limit).collect();
                (page, it.next().is_some())
            }
            PageOrder::Newest => {
                let mut it = self
                    .moments
                    .range((Bound::Unbounded, bound))
                    .rev()
                    .map(|(_, m)| &**m)
                    .filter(live);
                let page: Vec<&Moment> = it.by_ref().take(limit).collect();
                (page, it.next().is_some())
            }
        };
        (page, more)
    }

    /// Number of tombstones.
    pub fn deleted_moments(&self) -> usize {
        self.moments.len() - self.live_moments
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{MomentCreate, MomentEdit, Op, OpBody};

    fn create(seq: u64, id: u128, text: Option<&str>, lang: Option<&str>) -> Op {
        Op {
            erased: false,
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
        // Paid once per moment in a big mirror.
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
                erased: false,
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
                (1, 1_700_000_000_001),
            )
        };
        assert_eq!(m, &whole);
        assert_eq!(
            crate::codec::encode(m).unwrap(),
            crate::codec::encode(&whole).unwrap()
        );
    }

    #[test]
    fn pages_run_both_ways_and_skip_tombstones() {
        let mut mirror = Mirror::new();
        for id in 1..=7u128 {
            mirror.apply(create(id as u64, id, None, None)).unwrap();
        }
        mirror
            .apply(Op {
                erased: false,
                seq: 8,
                ts_ms: 1_700_000_000_008,
                body: OpBody::MomentDelete(crate::op::MomentDelete {
                    id: Id(5),
                    request_id: None,
                    device: "phone".into(),
                }),
            })
            .unwrap();
        let ids = |(page, more): (Vec<&Moment>, bool)| {
            (page.iter().map(|m| m.id.0).collect::<Vec<_>>(), more)
        };
        assert_eq!(
            ids(mirror.live_page(None, 3, PageOrder::Oldest)),
            (vec![1, 2, 3], true)
        );
        assert_eq!(
            ids(mirror.live_page(Some(Id(3)), 3, PageOrder::Oldest)),
            (vec![4, 6, 7], false)
        );
        // Newest first: the page after 7 in that order is below it; the
        // tombstone (5) is skipped, and an id that is no moment is a place.
        assert_eq!(
            ids(mirror.live_page(None, 3, PageOrder::Newest)),
            (vec![7, 6, 4], true)
        );
        assert_eq!(
            ids(mirror.live_page(Some(Id(4)), 3, PageOrder::Newest)),
            (vec![3, 2, 1], false)
        );
        assert_eq!(
            ids(mirror.live_page(Some(Id(5)), 2, PageOrder::Newest)),
            (vec![4, 3], true)
        );
        assert_eq!(
            ids(mirror.live_page(Some(Id(1)), 2, PageOrder::Newest)),
            (vec![], false)
        );
    }
}
