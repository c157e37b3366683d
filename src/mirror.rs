//! The mirror: the engine's state, and the one fold that builds it.
//!
//! [`Mirror::apply`] is the only code that turns ops into state. Startup
//! replay, `spark-replay rebuild` (with or without `--at`) and the live write
//! path all call it. It is deterministic: no clock, no randomness, no I/O;
//! time and ids come inside the op. The request index (SPEC section 3) is
//! filled by the same fold: every op that carries a request id leaves a row,
//! and the first producer wins forever.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::ids::Id;
use crate::op::{MediaRole, Op, OpBody, OpKind, Sha256};

/// One moment as the mirror holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moment {
    /// The moment's id.
    pub id: Id,
    /// What the sign says.
    pub text: Option<String>,
    /// The person's caption.
    pub caption: Option<String>,
    /// Language tag of the text.
    pub lang: Option<String>,
    /// When the photo was taken, Unix milliseconds.
    pub captured_at_ms: Option<i64>,
    /// Server time of the `moment.create`, Unix milliseconds.
    pub created_at_ms: u64,
    /// Number of ops applied to this moment (1 after the create).
    pub version: u32,
    /// True once a `moment.delete` was applied (a tombstone).
    pub deleted: bool,
    /// Seq of the last op applied to this moment.
    pub last_seq: u64,
    /// Ids of the moment's media, in upload order (at most one per role).
    pub media: Vec<Id>,
}

/// One stored blob as the mirror holds it (from its `media.put`).
#[derive(Clone, Debug, PartialEq, Eq)]
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
    pub entity_id: Id,
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
    pub moments: BTreeMap<Id, Moment>,
    /// The request index: request id -> what its first op produced.
    pub requests: HashMap<String, RequestRow>,
    /// Every stored blob, by media id.
    pub media: HashMap<Id, Media>,
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
    pub fn apply(&mut self, op: &Op) -> Result<(), FoldError> {
        if op.seq != self.seq + 1 {
            return Err(FoldError::OutOfOrder {
                mirror_seq: self.seq,
                found: op.seq,
            });
        }
        match &op.body {
            OpBody::MomentCreate(p) => {
                if self.moments.contains_key(&p.id) {
                    return Err(FoldError::AlreadyExists {
                        seq: op.seq,
                        id: p.id,
                    });
                }
                self.moments.insert(
                    p.id,
                    Moment {
                        id: p.id,
                        text: p.text.clone(),
                        caption: p.caption.clone(),
                        lang: p.lang.clone(),
                        captured_at_ms: p.captured_at_ms,
                        created_at_ms: op.ts_ms,
                        version: 1,
                        deleted: false,
                        last_seq: op.seq,
                        media: Vec::new(),
                    },
                );
                self.live_moments += 1;
            }
            OpBody::MomentEdit(p) => {
                let moment = live_moment(&mut self.moments, op, p.id)?;
                if let Some(text) = &p.text {
                    moment.text = text.clone();
                }
                if let Some(caption) = &p.caption {
                    moment.caption = caption.clone();
                }
                if let Some(lang) = &p.lang {
                    moment.lang = lang.clone();
                }
                moment.version += 1;
                moment.last_seq = op.seq;
            }
            OpBody::MomentDelete(p) => {
                let moment = live_moment(&mut self.moments, op, p.id)?;
                moment.deleted = true;
                moment.version += 1;
                moment.last_seq = op.seq;
                self.live_moments -= 1;
            }
            OpBody::MediaPut(p) => {
                let conflict = |why: String| FoldError::MediaConflict {
                    seq: op.seq,
                    id: p.id,
                    why,
                };
                if self.media.contains_key(&p.id) {
                    return Err(conflict("the media id exists".into()));
                }
                let moment = live_moment(&mut self.moments, op, p.moment_id)?;
                if let Some(other) = moment
                    .media
                    .iter()
                    .find(|m| self.media.get(m).is_some_and(|x| x.role == p.role))
                {
                    return Err(conflict(format!(
                        "the {} is already media {other}",
                        p.role.name()
                    )));
                }
                moment.media.push(p.id);
                moment.version += 1;
                moment.last_seq = op.seq;
                self.media.insert(
                    p.id,
                    Media {
                        id: p.id,
                        moment_id: p.moment_id,
                        role: p.role,
                        sha256: p.sha256,
                        size_bytes: p.size_bytes,
                        content_type: p.content_type.clone(),
                        seq: op.seq,
                    },
                );
            }
        }
        if let Some(request_id) = op.body.request_id() {
            // First producer wins forever (INSERT OR IGNORE).
            self.requests
                .entry(request_id.to_owned())
                .or_insert(RequestRow {
                    seq: op.seq,
                    kind: op.body.kind(),
                    entity_id: op.body.entity_id(),
                });
        }
        self.seq = op.seq;
        self.ts_ms = op.ts_ms;
        Ok(())
    }

    /// A moment by id, tombstones included.
    pub fn moment(&self, id: Id) -> Option<&Moment> {
        self.moments.get(&id)
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
            .map(|(_, m)| m)
            .filter(|m| !m.deleted);
        let page: Vec<&Moment> = live.by_ref().take(limit).collect();
        let more = live.next().is_some();
        (page, more)
    }

    /// Number of tombstones.
    pub fn deleted_moments(&self) -> usize {
        self.moments.len() - self.live_moments
    }

    /// A BLAKE3 digest of the whole mirror in a canonical order (moments by
    /// id, requests by request id), as 64 lower-case hex characters. Two
    /// mirrors with the same state have the same digest, however they were
    /// built; `spark-replay rebuild` prints it and the restart tests compare it.
    pub fn digest(&self) -> String {
        let mut hasher = blake3::Hasher::new();
        hasher.update(&self.seq.to_le_bytes());
        for moment in self.moments.values() {
            hasher.update(&moment.id.0.to_le_bytes());
            for field in [&moment.text, &moment.caption, &moment.lang] {
                hash_opt_str(&mut hasher, field.as_deref());
            }
            match moment.captured_at_ms {
                Some(ms) => hasher.update(&[1]).update(&ms.to_le_bytes()),
                None => hasher.update(&[0]),
            };
            hasher.update(&moment.created_at_ms.to_le_bytes());
            hasher.update(&moment.version.to_le_bytes());
            hasher.update(&[u8::from(moment.deleted)]);
            hasher.update(&moment.last_seq.to_le_bytes());
            for media_id in &moment.media {
                hasher.update(&media_id.0.to_le_bytes());
            }
        }
        let mut media: Vec<&Media> = self.media.values().collect();
        media.sort_unstable_by_key(|m| m.id);
        for m in media {
            hasher.update(&m.id.0.to_le_bytes());
            hasher.update(&m.moment_id.0.to_le_bytes());
            hasher.update(m.role.name().as_bytes());
            hasher.update(&m.sha256.0);
            hasher.update(&m.size_bytes.to_le_bytes());
            hash_opt_str(&mut hasher, Some(&m.content_type));
            hasher.update(&m.seq.to_le_bytes());
        }
        let mut requests: Vec<(&String, &RequestRow)> = self.requests.iter().collect();
        requests.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (request_id, row) in requests {
            hash_opt_str(&mut hasher, Some(request_id));
            hasher.update(&row.seq.to_le_bytes());
            hasher.update(&row.kind.code().to_le_bytes());
            hasher.update(&row.entity_id.0.to_le_bytes());
        }
        hasher.finalize().to_hex().to_string()
    }
}

fn hash_opt_str(hasher: &mut blake3::Hasher, value: Option<&str>) {
    match value {
        Some(s) => {
            hasher.update(&[1]);
            hasher.update(&(s.len() as u64).to_le_bytes());
            hasher.update(s.as_bytes());
        }
        None => {
            hasher.update(&[0]);
        }
    }
}

fn live_moment<'a>(
    moments: &'a mut BTreeMap<Id, Moment>,
    op: &Op,
    id: Id,
) -> Result<&'a mut Moment, FoldError> {
    let not_live = |state| FoldError::NotLive {
        seq: op.seq,
        kind: op.body.kind().name(),
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
        MomentView {
            id: moment.id,
            text: moment.text.clone(),
            caption: moment.caption.clone(),
            lang: moment.lang.clone(),
            captured_at: moment.captured_at_ms.map(crate::time::format_rfc3339_ms),
            // Cast: server times are below i64::MAX ms for 292 million years.
            created_at: crate::time::format_rfc3339_ms(moment.created_at_ms as i64),
            version: moment.version,
            deleted: moment.deleted,
            media: moment
                .media
                .iter()
                .filter_map(|id| self.media.get(id))
                .map(|m| self.media_view(m))
                .collect(),
            turns: Vec::new(),
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
