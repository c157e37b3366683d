//! The mirror's digest: BLAKE3 over the whole state in a canonical order.

use super::{FastMap, Mirror};
use crate::request_index::RequestRow;

impl Mirror {
    /// A BLAKE3 digest of the whole mirror in a canonical order (every map
    /// sorted by key, each item encoded by [`crate::codec`]), as 64
    /// lower-case hex characters. Two mirrors with the same state have the
    /// same digest, however they were built; `spark-replay rebuild` prints it
    /// and the restart tests compare it. It covers what the mirror holds, so
    /// digests are comparable between builds with the same mirror (docs/tools.md), not across every version.
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
