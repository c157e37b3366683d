//! What `GET /api/events` sends (SPEC section 4): the data
//! of a change event, the names of the other events, and the data of an
//! `overflow` event. The server writes these, the client reads them.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::op::Op;

/// The `event:` name of the event that ends a stream whose subscriber fell
/// behind; its data is an [`Overflow`]. Change events have no name.
pub const EVENT_OVERFLOW: &str = "overflow";
/// The `event:` name of the event that ends a stream whose log could not be
/// read; its data is the error, as text.
pub const EVENT_ERROR: &str = "error";

/// What one committed op changed: the data of a change event, whose `id:`
/// is the op's [`EventCursor`] (what `after` and `Last-Event-ID` take).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeNotice {
    /// The op's seq.
    pub seq: u64,
    /// The op's kind name (`moment.create`, `media.put`, ...).
    pub kind: Cow<'static, str>,
    /// Ids of the entities it created or updated.
    pub upserted: Vec<String>,
    /// Ids of the entities it removed.
    pub removed: Vec<String>,
}

impl ChangeNotice {
    /// The notice of one op.
    pub fn of(op: &Op) -> ChangeNotice {
        let (upserted, removed) = op.body.change();
        ChangeNotice {
            seq: op.seq,
            kind: Cow::Borrowed(op.body.kind().name()),
            upserted,
            removed,
        }
    }
}

/// The data of an [`EVENT_OVERFLOW`] event: reconnect with
/// `Last-Event-ID: <resume_cursor>` to go on with no gap.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overflow {
    /// The seq of the last change event sent before it.
    pub resume_after: u64,
    /// Its cursor ([`EventCursor`] text): what to resume after.
    #[serde(default)]
    pub resume_cursor: String,
}

/// Hex digits of the chain value an [`EventCursor`] carries.
pub const CURSOR_CHAIN_HEX: usize = 16;

/// A point in one history of the log, as the `id:` of a change event, the
/// `after` query and `Last-Event-ID` carry it: `SEQ.CHAIN`, the op's seq
/// and the first [`CURSOR_CHAIN_HEX`] hex digits of the log's chain value
/// at the end of the batch that holds it (after its commit mark: the
/// `chain` `/api/log/head` gives when that batch is the last). Two logs
/// that share seqs but not bytes (a restore, then another writer's ops)
/// have other chain values there, so a cursor names its history; `0` (no
/// chain) is the start, which every history shares.
///
/// A bare seq above 0 (the form of event ids before cursors) parses with no chain:
/// the server refuses it, since nothing in it can be checked against its
/// log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventCursor {
    /// The op's seq (0: before the first op).
    pub seq: u64,
    /// The chain value's first 8 bytes; `None` for `0` and for a bare seq.
    pub chain: Option<[u8; CURSOR_CHAIN_HEX / 2]>,
}

impl EventCursor {
    /// The start of every history: follow from the first op.
    pub const START: EventCursor = EventCursor {
        seq: 0,
        chain: None,
    };

    /// The cursor of `seq` whose batch ends at chain value `chain` (the
    /// full 32 bytes); `seq` 0 is [`EventCursor::START`].
    pub fn at(seq: u64, chain: &[u8; 32]) -> EventCursor {
        if seq == 0 {
            return EventCursor::START;
        }
        let mut prefix = [0u8; CURSOR_CHAIN_HEX / 2];
        prefix.copy_from_slice(&chain[..CURSOR_CHAIN_HEX / 2]);
        EventCursor {
            seq,
            chain: Some(prefix),
        }
    }

    /// Whether `chain` (the full 32 bytes, at the end of the batch holding
    /// `seq`) is the one this cursor names.
    pub fn matches(&self, chain: &[u8; 32]) -> bool {
        self.chain
            .is_some_and(|prefix| chain[..CURSOR_CHAIN_HEX / 2] == prefix)
    }

    /// Parses `SEQ.CHAIN` (or a bare `SEQ`); `None` for anything else.
    pub fn parse(text: &str) -> Option<EventCursor> {
        let text = text.trim();
        let (seq, chain) = match text.split_once('.') {
            Some((seq, digits)) => {
                if digits.len() != CURSOR_CHAIN_HEX {
                    return None;
                }
                let mut prefix = [0u8; CURSOR_CHAIN_HEX / 2];
                hex::decode_to_slice(digits, &mut prefix).ok()?;
                (seq, Some(prefix))
            }
            None => (text, None),
        };
        if !seq.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let seq: u64 = seq.parse().ok()?;
        if seq == 0 && chain.is_some() {
            return None;
        }
        Some(EventCursor { seq, chain })
    }
}

impl std::fmt::Display for EventCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.chain {
            Some(prefix) => write!(f, "{}.{}", self.seq, hex::encode(prefix)),
            None => write!(f, "{}", self.seq),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_what_it_writes_and_names_its_chain() {
        let chain = [0xab; 32];
        let cursor = EventCursor::at(42, &chain);
        assert_eq!(cursor.to_string(), "42.abababababababab");
        assert_eq!(EventCursor::parse("42.abababababababab"), Some(cursor));
        assert!(cursor.matches(&chain));
        assert!(!cursor.matches(&[0xac; 32]));
        assert_eq!(EventCursor::at(0, &chain), EventCursor::START);
        assert_eq!(EventCursor::START.to_string(), "0");
        assert_eq!(EventCursor::parse(" 0 "), Some(EventCursor::START));
        let bare = EventCursor::parse("7").unwrap();
        assert_eq!((bare.seq, bare.chain), (7, None));
        assert!(!bare.matches(&chain));
        for bad in [
            "",
            "x",
            "-1",
            "+3",
            "3.",
            "3.abc",
            "0.abababababababab",
            "3.zzzzzzzzzzzzzzzz",
        ] {
            assert_eq!(EventCursor::parse(bad), None, "{bad}");
        }
    }
}
