//! The request index (SPEC section 3): request id -> what the first op that
//! carried it produced. First producer wins forever (INSERT OR IGNORE).
//!
//! Laid out for a big mirror (issue 7):
//! - rows live in one dense vector, in the order they were added (32 bytes
//!   each, no empty slots);
//! - request ids and entity names live in a byte arena of 1 MiB chunks,
//!   length-prefixed (no allocation and no allocator rounding per id);
//! - the hash table holds only 4-byte positions into the rows, so probing it
//!   touches a few bytes per request id instead of a whole row.
//!
//! Hashes can be computed before the fold: startup replay hashes each
//! request id on the decoding thread ([`RequestHasher`]), so the fold thread
//! only probes. The hash is foldhash seeded at random per index, so request
//! ids chosen by clients cannot be picked to collide.
//!
//! Limits: at most `u32::MAX` rows (about 4.3 billion request ids, some
//! 300 GB of mirror; far beyond any machine this runs on).

use std::fmt;
use std::hash::BuildHasher;

use crate::ids::Id;
use crate::mirror::RequestRow;
use crate::op::{Entity, OpKind};

/// The index. Clone, compare and debug-print it like a map.
#[derive(Clone)]
pub struct RequestIndex {
    /// Positions in `rows`, by the hash of the request id.
    table: hashbrown::HashTable<u32>,
    /// The rows, in the order they were added.
    rows: Vec<Row>,
    /// The request ids and entity names the rows point at.
    arena: TextArena,
    hasher: foldhash::fast::RandomState,
    /// Random per index (and kept by its clones): tells whether a
    /// [`HashedRequestId`] was hashed with this index's hasher.
    seed_tag: u64,
}

/// One row, compact: 32 bytes.
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
    fn push(&mut self, text: &str) -> TextRef {
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
        crate::len_prefixed::push(chunk, text.as_bytes());
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

/// A request id with its hash, made by [`RequestIndex::hashed`] (or a
/// [`RequestHasher`] of the same index) ahead of the fold.
#[derive(Clone, Debug)]
pub struct HashedRequestId {
    key: String,
    hash: u64,
    seed_tag: u64,
}

impl HashedRequestId {
    /// The request id.
    pub fn as_str(&self) -> &str {
        &self.key
    }
}

/// Hashes request ids the way one index does, on any thread: the
/// startup replay's decoding thread holds one.
#[derive(Clone)]
pub struct RequestHasher {
    hasher: foldhash::fast::RandomState,
    seed_tag: u64,
}

impl RequestHasher {
    /// `request_id` with its hash under the index this hasher came from.
    pub fn hashed(&self, request_id: String) -> HashedRequestId {
        HashedRequestId {
            hash: self.hasher.hash_one(request_id.as_bytes()),
            key: request_id,
            seed_tag: self.seed_tag,
        }
    }
}

impl Default for RequestIndex {
    fn default() -> Self {
        RequestIndex {
            table: hashbrown::HashTable::new(),
            rows: Vec::new(),
            arena: TextArena::default(),
            hasher: foldhash::fast::RandomState::default(),
            seed_tag: rand::random(),
        }
    }
}

impl RequestIndex {
    fn hash(&self, request_id: &str) -> u64 {
        self.hasher.hash_one(request_id.as_bytes())
    }

    fn position(&self, hash: u64, request_id: &str) -> Option<usize> {
        self.table
            .find(hash, |&at| {
                self.arena.get_bytes(self.rows[at as usize].key()) == request_id.as_bytes()
            })
            .map(|&at| at as usize)
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
        let at = self.position(self.hash(request_id), request_id)?;
        Some(self.row(&self.rows[at]))
    }

    /// The request id and row that the op at `seq` left, if it carried a
    /// request id that was new then. A binary search: rows are added in
    /// seq order, at most one per op.
    pub fn by_seq(&self, seq: u64) -> Option<(&str, RequestRow)> {
        let at = self.rows.binary_search_by_key(&seq, |row| row.seq).ok()?;
        let row = &self.rows[at];
        Some((self.arena.get(row.key()), self.row(row)))
    }

    /// True if an op carried `request_id`.
    pub fn contains_key(&self, request_id: &str) -> bool {
        self.position(self.hash(request_id), request_id).is_some()
    }

    /// Number of request ids.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when no op carried a request id.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Every `(request id, row)`, in the order the rows were added (seq
    /// order).
    pub fn iter(&self) -> impl Iterator<Item = (&str, RequestRow)> + '_ {
        self.rows
            .iter()
            .map(|row| (self.arena.get(row.key()), self.row(row)))
    }

    /// A hasher for this index, to hash request ids on another thread.
    pub fn hasher(&self) -> RequestHasher {
        RequestHasher {
            hasher: self.hasher.clone(),
            seed_tag: self.seed_tag,
        }
    }

    /// `request_id` with its hash under this index.
    pub fn hashed(&self, request_id: String) -> HashedRequestId {
        self.hasher().hashed(request_id)
    }

    /// Makes room for `additional` more request ids without rehashing.
    pub fn reserve(&mut self, additional: usize) {
        let (rows, arena, hasher) = (&self.rows, &self.arena, &self.hasher);
        self.table.reserve(additional, |&at| {
            hasher.hash_one(arena.get_bytes(rows[at as usize].key()))
        });
        self.rows.reserve(additional);
    }

    /// Adds `row` under `request_id` unless the id is there already (the
    /// first producer wins). A request id hashed for another index is
    /// hashed again here.
    pub(crate) fn insert_first(&mut self, request_id: HashedRequestId, row: RequestRow) {
        let hash = if request_id.seed_tag == self.seed_tag {
            request_id.hash
        } else {
            self.hash(&request_id.key)
        };
        let position = u32::try_from(self.rows.len()).expect("at most u32::MAX request ids");
        let (rows, arena, hasher) = (&self.rows, &self.arena, &self.hasher);
        let hashbrown::hash_table::Entry::Vacant(slot) = self.table.entry(
            hash,
            |&at| arena.get_bytes(rows[at as usize].key()) == request_id.key.as_bytes(),
            |&at| hasher.hash_one(arena.get_bytes(rows[at as usize].key())),
        ) else {
            return;
        };
        slot.insert(position);
        let key = self.arena.push(&request_id.key);
        let (entity, name_bit) = match &row.entity {
            Entity::Id(id) => (*id, 0),
            Entity::Name(name) => (Id(u128::from(self.arena.push(name).0)), ENTITY_IS_NAME),
        };
        self.rows.push(Row {
            seq: row.seq,
            entity,
            meta: key.0 | (u64::from(row.kind.code()) << TEXT_REF_BITS) | name_bit,
        });
    }
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
}
