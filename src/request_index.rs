//! The request index (SPEC section 3): request id -> what the first op that
//! carried it produced. First producer wins forever (INSERT OR IGNORE).
//!
//! A hash table of `(request id, row)` entries whose hashes can be computed
//! before the fold: startup replay hashes each request id on the decoding
//! thread ([`RequestIndex::hashed`]), so the fold thread only probes
//! (issue 7: hashing was 5% of a 10-million-op startup, on the thread that
//! bounds it). The hash is foldhash seeded at random per index, so request
//! ids chosen by clients cannot be picked to collide.

use std::fmt;
use std::hash::BuildHasher;

use crate::mirror::RequestRow;

/// The index. Clone, compare and debug-print it like a map.
#[derive(Clone)]
pub struct RequestIndex {
    table: hashbrown::HashTable<Entry>,
    hasher: foldhash::fast::RandomState,
    /// Random per index (and kept by its clones): tells whether a
    /// [`HashedRequestId`] was hashed with this index's hasher.
    seed_tag: u64,
}

#[derive(Clone)]
struct Entry {
    key: Box<str>,
    row: RequestRow,
}

/// A request id with its hash, made by [`RequestIndex::hashed`] (or a
/// [`RequestHasher`] of the same index) ahead of the fold.
#[derive(Clone, Debug)]
pub struct HashedRequestId {
    key: Box<str>,
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
            hash: self.hasher.hash_one(request_id.as_str()),
            key: request_id.into_boxed_str(),
            seed_tag: self.seed_tag,
        }
    }
}

impl Default for RequestIndex {
    fn default() -> Self {
        RequestIndex {
            table: hashbrown::HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            seed_tag: rand::random(),
        }
    }
}

impl RequestIndex {
    /// The row of `request_id`, if an op carried it.
    pub fn get(&self, request_id: &str) -> Option<&RequestRow> {
        let hash = self.hasher.hash_one(request_id);
        self.table
            .find(hash, |e| &*e.key == request_id)
            .map(|e| &e.row)
    }

    /// True if an op carried `request_id`.
    pub fn contains_key(&self, request_id: &str) -> bool {
        self.get(request_id).is_some()
    }

    /// Number of request ids.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True when no op carried a request id.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Every `(request id, row)`, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &RequestRow)> {
        self.table.iter().map(|e| (&*e.key, &e.row))
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
        let hasher = &self.hasher;
        self.table.reserve(additional, |e| hasher.hash_one(&*e.key));
    }

    /// Adds `row` under `request_id` unless the id is there already (the
    /// first producer wins). A request id hashed for another index is
    /// hashed again here.
    pub(crate) fn insert_first(&mut self, request_id: HashedRequestId, row: RequestRow) {
        let hash = if request_id.seed_tag == self.seed_tag {
            request_id.hash
        } else {
            self.hasher.hash_one(&*request_id.key)
        };
        let hasher = &self.hasher;
        if let hashbrown::hash_table::Entry::Vacant(slot) = self.table.entry(
            hash,
            |e| e.key == request_id.key,
            |e| hasher.hash_one(&*e.key),
        ) {
            slot.insert(Entry {
                key: request_id.key,
                row,
            });
        }
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
        assert_eq!(index.get("r1"), Some(&row(1)));
        assert_eq!(index.get("r2"), Some(&row(4)));
        assert!(!index.contains_key("r3"));
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
