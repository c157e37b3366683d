//! The request index (SPEC section 3): request id -> what the first op that
//! carried it produced. First producer wins forever (INSERT OR IGNORE).
//!
//! Laid out for a big mirror:
//! - rows live in one dense vector, in the order they were added (32 bytes
//!   each, no empty slots);
//! - request ids and entity names live in a byte arena of 1 MiB chunks,
//!   length-prefixed (no allocation and no allocator rounding per id);
//! - the hash table is open addressing with linear probing over 8-byte
//!   slots, each the top 32 bits of the request id's hash and the row's
//!   position: one probe reads one cache line, a tag mismatch never reads
//!   a row, and growing it never reads a request id (the slot's tag gives
//!   its place in the larger table). A fold that knows its next ops asks
//!   for their slots ahead ([`RequestIndex::prefetch`]), so startup replay
//!   does not wait for a cache miss per request id.
//!
//! Hashes can be computed before the fold: startup replay hashes each
//! request id on the decoding thread ([`RequestHasher`]), so the fold thread
//! only probes. A short request id travels inline in its
//! [`HashedRequestId`], so the fold thread frees no memory the decoding
//! thread allocated. The hash is foldhash seeded at random per index, so
//! request ids chosen by clients cannot be picked to collide (the seed is
//! 64 random bits per new index, kept by its checkpoints).
//!
//! An index loaded from a checkpoint is used in place: the checkpoint's
//! request index section (`log-format/CHECKPOINT.md`, "Request index") is
//! this table, its rows and its arena as they lie in the file, probed
//! through the file's mapping ([`stored`]); request ids that come after
//! the checkpoint go into the in-memory part. So a start from a checkpoint
//! no longer builds the index (every row faulted into fresh memory and
//! inserted), which grew with every request id ever seen (SPEC section 3
//! keeps them forever). The hash's seed is part of the index and of the
//! checkpoint, so the stored table stays valid.
//!
//! Limits: at most `u32::MAX - 1` rows (about 4.3 billion request ids, some
//! 300 GB of mirror; far beyond any machine this runs on).

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

use crate::ids::Id;
use crate::op::{Entity, OpKind};

pub(crate) mod stored;

use stored::StoredIndex;
pub use stored::{DetachedRows, MappedRows, StoredIndexError};

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

/// The index. Clone, compare and debug-print it like a map.
#[derive(Clone)]
pub struct RequestIndex {
    /// The rows of the checkpoint the index was loaded from, used in place
    /// (positions before the in-memory rows'); `None` for an index built
    /// in memory alone.
    stored: Option<Arc<StoredIndex>>,
    /// The in-memory hash table (of the rows added after `stored`): empty, or a power of two of slots, each 0 (free) or
    /// the hash's top 32 bits (bits 32..64) and the row's position plus
    /// one (bits 0..32). A request id's first slot is given by the top bits
    /// of its hash; probing goes on to the next slot, wrapping around.
    slots: Vec<u64>,
    /// The rows, in the order they were added.
    rows: Vec<Row>,
    /// The request ids and entity names the rows point at.
    arena: TextArena,
    hasher: foldhash::fast::FixedState,
    /// The hash's seed: random for a new index, kept by its clones and its
    /// checkpoints. Also tells whether a [`HashedRequestId`] was hashed
    /// like this index hashes.
    seed: u64,
}

/// Fewest slots of a table that holds anything.
const MIN_SLOTS: usize = 16;

/// Most rows of an index, stored and in memory together (positions are
/// 32 bits, plus one).
const MAX_ROWS: usize = u32::MAX as usize - 1;

/// Most rows per 10 slots (a load of at most 0.7: an insert of a new
/// request id probes about 6 slots on average, within one or two cache
/// lines).
const MAX_LOAD_TENTHS: usize = 7;

/// One row, compact: 32 bytes (a checkpoint stores it as these three
/// fields, little-endian, with its texts' [`TextRef`]s as byte offsets
/// into the section's arena).
#[derive(Clone, Copy)]
struct Row {
    /// Seq of the op that first carried the request id.
    seq: u64,
    /// The entity id; for a named entity, the low 64 bits hold the name's
    /// [`TextRef`].
    entity: Id,
    /// The request id's [`TextRef`] (bits 0..44), the op kind's code (bits
    /// 44..52) and whether `entity` refers to a name (bit 52).
    meta: u64,
}

/// Bits of a [`TextRef`] in [`Row::meta`].
const TEXT_REF_BITS: u32 = 44;
/// Bit of [`Row::meta`] set when the entity is a name.
const ENTITY_IS_NAME: u64 = 1 << 52;

impl Row {
    fn key(&self) -> TextRef {
        TextRef(self.meta & ((1 << TEXT_REF_BITS) - 1))
    }
}

/// Where a text is in a [`TextArena`]: chunk index (bits 20..44) and byte
/// offset of its length prefix in the chunk (bits 0..20).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct TextRef(u64);

/// Bits of the offset in a [`TextRef`].
const CHUNK_OFFSET_BITS: u32 = 20;

/// Bytes of one arena chunk; a longer text gets a chunk of its own (at
/// offset 0). At most 2^24 chunks: 16 TiB of request ids and names.
const ARENA_CHUNK_BYTES: usize = 1 << CHUNK_OFFSET_BITS;

/// Append-only storage for short texts: each is a LEB128 length and the
/// UTF-8 bytes, never split across chunks, never moved once written.
#[derive(Clone, Default)]
struct TextArena {
    chunks: Vec<Vec<u8>>,
}

impl TextArena {
    /// Stores `text`, which must be whole UTF-8 (a `str`'s bytes).
    fn push(&mut self, text: &[u8]) -> TextRef {
        let need = crate::len_prefixed::encoded_len(text.len());
        let fits = self
            .chunks
            .last()
            .is_some_and(|c| c.len() + need <= ARENA_CHUNK_BYTES);
        if !fits {
            self.chunks
                .push(Vec::with_capacity(ARENA_CHUNK_BYTES.max(need)));
        }
        let chunk_index = self.chunks.len() - 1;
        let chunk = &mut self.chunks[chunk_index];
        let offset = chunk.len();
        crate::len_prefixed::push(chunk, text);
        assert!(
            chunk_index < 1 << (TEXT_REF_BITS - CHUNK_OFFSET_BITS),
            "the request index holds at most 16 TiB of request ids"
        );
        // Cast: below 2^20 (a text that does not fit starts a new chunk).
        TextRef(((chunk_index as u64) << CHUNK_OFFSET_BITS) | offset as u64)
    }

    fn get(&self, at: TextRef) -> &str {
        // Only whole `str`s are written, each in one chunk.
        std::str::from_utf8(self.get_bytes(at)).expect("the arena holds whole strs")
    }

    fn get_bytes(&self, at: TextRef) -> &[u8] {
        let chunk = &self.chunks[(at.0 >> CHUNK_OFFSET_BITS) as usize];
        let offset = (at.0 & ((1 << CHUNK_OFFSET_BITS) - 1)) as usize;
        crate::len_prefixed::read(chunk, offset).0
    }
}

/// Bytes of a request id kept inside its [`HashedRequestId`]; a longer one
/// keeps its `String`.
const INLINE_KEY_BYTES: usize = 46;

/// A request id's text: short ones inline (no allocation to free on the
/// fold thread), longer ones as the `String` they came in.
#[derive(Clone)]
enum Key {
    /// Length, then the UTF-8 bytes of a `str` (the first `len`).
    Inline(u8, [u8; INLINE_KEY_BYTES]),
    Heap(String),
}

impl Key {
    fn new(text: String) -> Key {
        if text.len() <= INLINE_KEY_BYTES {
            let mut bytes = [0; INLINE_KEY_BYTES];
            bytes[..text.len()].copy_from_slice(text.as_bytes());
            // Cast: at most INLINE_KEY_BYTES (46).
            Key::Inline(text.len() as u8, bytes)
        } else {
            Key::Heap(text)
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline(len, bytes) => &bytes[..usize::from(*len)],
            Key::Heap(text) => text.as_bytes(),
        }
    }
}

/// A request id with its hash, made by [`RequestIndex::hashed`] (or a
/// [`RequestHasher`] of the same index) ahead of the fold.
#[derive(Clone)]
pub struct HashedRequestId {
    key: Key,
    hash: u64,
    /// The seed it was hashed with.
    seed: u64,
}

impl HashedRequestId {
    /// The request id.
    pub fn as_str(&self) -> &str {
        // Only a `str`'s whole bytes are kept.
        std::str::from_utf8(self.key.as_bytes()).expect("a request id is whole UTF-8")
    }
}

impl fmt::Debug for HashedRequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HashedRequestId")
            .field("key", &self.as_str())
            .field("hash", &self.hash)
            .finish()
    }
}

/// Hashes request ids the way one index does, on any thread: the
/// startup replay's decoding thread holds one.
#[derive(Clone)]
pub struct RequestHasher {
    hasher: foldhash::fast::FixedState,
    seed: u64,
}

impl RequestHasher {
    /// `request_id` with its hash under the index this hasher came from.
    pub fn hashed(&self, request_id: String) -> HashedRequestId {
        HashedRequestId {
            hash: self.hasher.hash_one(request_id.as_bytes()),
            key: Key::new(request_id),
            seed: self.seed,
        }
    }
}

impl Default for RequestIndex {
    /// An empty index with a random seed.
    fn default() -> Self {
        RequestIndex::with_seed(rand::random())
    }
}

/// The slot's tag: the hash's top 32 bits.
fn tag_of(hash: u64) -> u32 {
    (hash >> 32) as u32
}

/// The first slot of `tag` in a table of `slots` slots (a power of two,
/// at most 2^32): the tag's top bits.
fn home(tag: u32, slots: usize) -> usize {
    let bits = slots.trailing_zeros();
    // A shift of 32 (a table of one slot) is done in u64.
    (u64::from(tag) >> (32 - bits)) as usize
}

/// The row position a taken slot names (`usize::MAX` for a free slot):
/// its low 32 bits hold the position plus one.
fn position_of(slot: u64) -> usize {
    // Cast: the low 32 bits only.
    (slot as u32).wrapping_sub(1) as usize
}

/// Where a probe for a request id ended.
enum Probe {
    /// At the row in this position.
    Found(usize),
    /// At this free slot.
    Free(usize),
}

/// The probe of both tables, the in-memory one and the one a checkpoint
/// stores ([`stored`]): from the home slot of `hash`'s tag in a table of
/// `slots` slots (a power of two, above 0), on to the next slot, wrapping
/// around, until a free slot (`slot_at` gives 0) or a taken one with the
/// tag whose row position `is_key` accepts. `None` after a whole table's
/// worth of slots without either (a table always keeps a free slot; only
/// a damaged stored one could be full).
#[inline]
fn probe_slots(
    slots: usize,
    hash: u64,
    slot_at: impl Fn(usize) -> u64,
    is_key: impl Fn(usize) -> bool,
) -> Option<Probe> {
    let tag = tag_of(hash);
    let mask = slots - 1;
    let mut at = home(tag, slots);
    for _ in 0..slots {
        let slot = slot_at(at);
        if slot == 0 {
            return Some(Probe::Free(at));
        }
        if (slot >> 32) as u32 == tag && is_key(position_of(slot)) {
            return Some(Probe::Found(position_of(slot)));
        }
        at = (at + 1) & mask;
    }
    None
}

impl RequestIndex {
    /// An empty index hashing with `seed` (foldhash's fixed state with
    /// `seed` as its per-hasher seed): what a checkpoint's index is loaded
    /// with, so that its stored table stays valid.
    pub fn with_seed(seed: u64) -> RequestIndex {
        RequestIndex {
            stored: None,
            slots: Vec::new(),
            rows: Vec::new(),
            arena: TextArena::default(),
            hasher: foldhash::fast::FixedState::with_seed(seed),
            seed,
        }
    }

    /// The hash's seed (kept by checkpoints).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn hash(&self, request_id: &[u8]) -> u64 {
        self.hasher.hash_one(request_id)
    }

    /// The hash of `request_id` under this index (for [`Self::prefetch_hash`]
    /// and [`Self::insert_first_hashed`]).
    pub(crate) fn hash_str(&self, request_id: &str) -> u64 {
        self.hash(request_id.as_bytes())
    }

    /// Probes for `request_id` with hash `hash`; the table must have slots.
    fn probe(&self, hash: u64, request_id: &[u8]) -> Probe {
        probe_slots(
            self.slots.len(),
            hash,
            |at| self.slots[at],
            |position| self.arena.get_bytes(self.rows[position].key()) == request_id,
        )
        .expect("the in-memory table keeps a free slot (load at most 0.7)")
    }

    fn position(&self, hash: u64, request_id: &str) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        match self.probe(hash, request_id.as_bytes()) {
            Probe::Found(position) => Some(position),
            Probe::Free(_) => None,
        }
    }

    /// Grows the table to at least `slots` slots (a power of two), placing
    /// every slot again by its tag: no request id is read or hashed.
    fn grow_to(&mut self, slots: usize) {
        let slots = slots.max(MIN_SLOTS).next_power_of_two();
        if slots <= self.slots.len() {
            return;
        }
        assert!(
            slots <= 1 << 32,
            "the request index holds at most u32::MAX - 1 request ids"
        );
        let old = std::mem::replace(&mut self.slots, vec![0; slots]);
        let mask = slots - 1;
        for slot in old.into_iter().filter(|&s| s != 0) {
            let mut at = home((slot >> 32) as u32, slots);
            while self.slots[at] != 0 {
                at = (at + 1) & mask;
            }
            self.slots[at] = slot;
        }
    }

    /// Slots needed for `rows` rows at the highest load.
    fn slots_for(rows: usize) -> usize {
        rows.saturating_mul(10) / MAX_LOAD_TENTHS + 1
    }

    fn row(&self, row: &Row) -> RequestRow {
        let entity = if row.meta & ENTITY_IS_NAME != 0 {
            let at = TextRef(row.entity.0 as u64);
            Entity::Name(self.arena.get(at).to_owned())
        } else {
            Entity::Id(row.entity)
        };
        RequestRow {
            seq: row.seq,
            // Bits 44..52 hold a code written from an `OpKind`.
            kind: OpKind::from_code(((row.meta >> TEXT_REF_BITS) & 0xFF) as u16)
                .expect("a code written from an OpKind"),
            entity,
        }
    }

    /// The row of `request_id`, if an op carried it.
    pub fn get(&self, request_id: &str) -> Option<RequestRow> {
        let hash = self.hash_str(request_id);
        if let Some(stored) = &self.stored {
            if let Some(at) = stored.position(hash, request_id.as_bytes()) {
                return Some(stored.row(at));
            }
        }
        let at = self.position(hash, request_id)?;
        Some(self.row(&self.rows[at]))
    }

    /// The request id and row that the op at `seq` left, if it carried a
    /// request id that was new then. A binary search: rows are added in
    /// seq order, at most one per op (the stored rows all come before the
    /// in-memory ones).
    pub fn by_seq(&self, seq: u64) -> Option<(&str, RequestRow)> {
        if let Some(stored) = &self.stored {
            if let Some(at) = stored.by_seq(seq) {
                return Some((stored.key(at), stored.row(at)));
            }
        }
        let at = self.rows.binary_search_by_key(&seq, |row| row.seq).ok()?;
        let row = &self.rows[at];
        Some((self.arena.get(row.key()), self.row(row)))
    }

    /// True if an op carried `request_id`.
    pub fn contains_key(&self, request_id: &str) -> bool {
        let hash = self.hash_str(request_id);
        self.stored_contains(hash, request_id.as_bytes())
            || self.position(hash, request_id).is_some()
    }

    /// True if the stored rows hold `request_id` (with its `hash`).
    fn stored_contains(&self, hash: u64, request_id: &[u8]) -> bool {
        self.stored
            .as_ref()
            .is_some_and(|stored| stored.position(hash, request_id).is_some())
    }

    /// Number of stored rows (used in place from a checkpoint).
    fn stored_len(&self) -> usize {
        self.stored.as_ref().map_or(0, |stored| stored.len())
    }

    /// Number of request ids.
    pub fn len(&self) -> usize {
        self.stored_len() + self.rows.len()
    }

    /// True when no op carried a request id.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every `(request id, row)`, in the order the rows were added (seq
    /// order).
    pub fn iter(&self) -> impl Iterator<Item = (&str, RequestRow)> + '_ {
        let stored = self.stored.as_deref().into_iter();
        stored
            .flat_map(|s| (0..s.len()).map(move |at| (s.key(at), s.row(at))))
            .chain(
                self.rows
                    .iter()
                    .map(|row| (self.arena.get(row.key()), self.row(row))),
            )
    }

    /// A hasher for this index, to hash request ids on another thread.
    pub fn hasher(&self) -> RequestHasher {
        RequestHasher {
            hasher: self.hasher.clone(),
            seed: self.seed,
        }
    }

    /// `request_id` with its hash under this index.
    pub fn hashed(&self, request_id: String) -> HashedRequestId {
        self.hasher().hashed(request_id)
    }

    /// Makes room for `additional` more request ids without growing the
    /// table.
    pub fn reserve(&mut self, additional: usize) {
        self.grow_to(Self::slots_for(self.rows.len().saturating_add(additional)));
        self.rows.reserve(additional);
    }

    /// Asks the CPU to bring in the table slot where `request_id` is looked
    /// up, ahead of its [`RequestIndex::insert_first`]: a hint, no state
    /// changes. Does nothing for an id hashed for another index.
    pub fn prefetch(&self, request_id: &HashedRequestId) {
        if request_id.seed == self.seed {
            self.prefetch_hash(request_id.hash);
        }
    }

    /// [`RequestIndex::prefetch`] for a hash under this index.
    pub(crate) fn prefetch_hash(&self, hash: u64) {
        if let Some(stored) = &self.stored {
            stored.prefetch(hash);
        }
        if self.slots.is_empty() {
            return;
        }
        let at = home(tag_of(hash), self.slots.len());
        prefetch_read(&self.slots[at]);
    }

    /// Adds `row` under `request_id` unless the id is there already (the
    /// first producer wins). A request id hashed for another index is
    /// hashed again here.
    pub(crate) fn insert_first(&mut self, request_id: HashedRequestId, row: RequestRow) {
        let key = request_id.key.as_bytes();
        let hash = if request_id.seed == self.seed {
            request_id.hash
        } else {
            self.hash(key)
        };
        self.insert_first_hashed(hash, key, &row);
    }

    /// [`RequestIndex::insert_first`] of `request_id` (whole UTF-8) with its
    /// hash under this index ([`Self::hash_str`]); true if it was added,
    /// false if the id was there already.
    pub(crate) fn insert_first_hashed(
        &mut self,
        hash: u64,
        request_id: &[u8],
        row: &RequestRow,
    ) -> bool {
        if self.stored_contains(hash, request_id) {
            return false;
        }
        if Self::slots_for(self.rows.len() + 1) > self.slots.len() {
            self.grow_to(Self::slots_for(self.rows.len() + 1).max(2 * self.slots.len()));
        }
        let Probe::Free(free) = self.probe(hash, request_id) else {
            return false;
        };
        let position = u32::try_from(self.rows.len())
            .ok()
            .filter(|&p| p < u32::MAX && self.len() < MAX_ROWS)
            .expect("at most u32::MAX - 1 request ids");
        self.slots[free] = (u64::from(tag_of(hash)) << 32) | u64::from(position + 1);
        let key = self.arena.push(request_id);
        let (entity, name_bit) = match &row.entity {
            Entity::Id(id) => (*id, 0),
            Entity::Name(name) => (
                Id(u128::from(self.arena.push(name.as_bytes()).0)),
                ENTITY_IS_NAME,
            ),
        };
        self.rows.push(Row {
            seq: row.seq,
            entity,
            meta: key.0 | (u64::from(row.kind.code()) << TEXT_REF_BITS) | name_bit,
        });
        true
    }
}

/// A prefetch of the cache line at `value` (x86-64; elsewhere nothing).
#[inline]
fn prefetch_read<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults and reads no data
    // into Rust's view (the pointer comes from a reference anyway).
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((value as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

impl PartialEq for RequestIndex {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().all(|(k, row)| other.get(k) == Some(row))
    }
}

impl Eq for RequestIndex {}

impl fmt::Debug for RequestIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Id;
    use crate::op::{Entity, OpKind};

    fn row(seq: u64) -> RequestRow {
        RequestRow {
            seq,
            kind: OpKind::MomentCreate,
            entity: Entity::Id(Id(u128::from(seq))),
        }
    }

    #[test]
    fn first_producer_wins_and_foreign_hashes_are_redone() {
        let mut index = RequestIndex::default();
        let other = RequestIndex::default();
        index.insert_first(index.hashed("r1".into()), row(1));
        index.insert_first(index.hashed("r1".into()), row(2));
        // Hashed by another index (another seed): must still land on "r1".
        index.insert_first(other.hashed("r1".into()), row(3));
        index.insert_first(other.hashed("r2".into()), row(4));
        assert_eq!(index.len(), 2);
        assert_eq!(index.get("r1"), Some(row(1)));
        assert_eq!(index.get("r2"), Some(row(4)));
        assert!(!index.contains_key("r3"));
        assert_eq!(index.by_seq(1), Some(("r1", row(1))));
        assert_eq!(index.by_seq(4), Some(("r2", row(4))));
        assert_eq!(index.by_seq(2), None);
        assert_eq!(index.by_seq(5), None);
    }

    #[test]
    fn rows_are_32_bytes_and_keep_names_and_long_ids() {
        assert_eq!(std::mem::size_of::<Row>(), 32);
        let mut index = RequestIndex::default();
        let long = "k".repeat(3 << 20); // a chunk of its own
        let name_row = RequestRow {
            seq: 9,
            kind: OpKind::JobStart,
            entity: Entity::Name("job-7".into()),
        };
        index.insert_first(index.hashed("job-7".into()), name_row.clone());
        index.insert_first(index.hashed(long.clone()), row(10));
        index.insert_first(index.hashed("after".into()), row(11));
        assert_eq!(index.get("job-7"), Some(name_row));
        assert_eq!(index.get(&long), Some(row(10)));
        assert_eq!(index.get("after"), Some(row(11)));
        let keys: Vec<&str> = index.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["job-7", long.as_str(), "after"]);
    }

    #[test]
    fn equality_ignores_order_and_seed() {
        let mut a = RequestIndex::default();
        let mut b = RequestIndex::default();
        for i in 0..100u64 {
            a.insert_first(a.hashed(format!("r{i}")), row(i));
        }
        for i in (0..100u64).rev() {
            b.insert_first(b.hashed(format!("r{i}")), row(i));
        }
        assert_eq!(a, b);
        assert_eq!(a.clone(), a);
        b.insert_first(b.hashed("extra".into()), row(7));
        assert_ne!(a, b);
    }
    #[test]
    fn growth_keeps_every_id_and_first_producer() {
        // Grows from empty through many doublings, with and without a
        // reserve, ids at the inline limit and past it, prefetches between
        // inserts; every id is found with its first row, no other is.
        let at_limit = "i".repeat(INLINE_KEY_BYTES);
        let past_limit = "p".repeat(INLINE_KEY_BYTES + 1);
        for reserve in [0, 50_000] {
            let mut index = RequestIndex::default();
            index.reserve(reserve);
            let key = |i: u64| match i % 3 {
                0 => format!("{at_limit}{i}").split_off(i.to_string().len()),
                1 => format!("{past_limit}{i}"),
                _ => format!("r{i}"),
            };
            let mut seq = 0;
            for i in 0..40_000u64 {
                seq += 1;
                let hashed = index.hashed(key(i));
                index.prefetch(&hashed);
                index.insert_first(hashed, row(seq));
                if i % 7 == 0 {
                    // A repeat of an earlier id: ignored.
                    seq += 1;
                    index.insert_first(index.hashed(key(i / 2)), row(seq));
                }
            }
            assert_eq!(index.len(), 40_000);
            let mut seq = 0;
            for i in 0..40_000u64 {
                seq += 1;
                assert_eq!(index.get(&key(i)), Some(row(seq)), "id {i}");
                seq += u64::from(i % 7 == 0);
            }
            assert!(!index.contains_key("r40000"));
            assert!(!index.contains_key(&at_limit[1..]));
            let load = index.len() as f64 / index.slots.len() as f64;
            assert!(load <= 0.7, "load {load}");
        }
    }

    #[test]
    fn hashed_ids_keep_their_text() {
        let index = RequestIndex::default();
        for text in ["", "r1", &"é".repeat(23), &"x".repeat(47), &"y".repeat(300)] {
            assert_eq!(index.hashed(text.to_owned()).as_str(), text);
        }
    }
}
