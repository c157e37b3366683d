//! What `GET /api/events` sends (SPEC section 4; issue 15 item 5): the data
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
/// is `seq` (what `after` and `Last-Event-ID` take).
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
/// `Last-Event-ID: resume_after` to go on with no gap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overflow {
    /// The seq of the last change event sent before it.
    pub resume_after: u64,
}
