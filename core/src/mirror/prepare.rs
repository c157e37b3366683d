//! Ops made ready for the fold: a create's moment built and boxed, the
//! request id hashed, off the fold thread.

use super::{Mirror, Moment};
use crate::ids::Id;
use crate::op::{MomentCreate, Op, OpBody};
use crate::request_index::{HashedRequestId, RequestHasher, RequestRow};

impl Mirror {
    /// A [`Preparer`] for ops this mirror will fold: startup replay prepares
    /// on the decoding thread and folds on another.
    pub fn preparer(&self) -> Preparer {
        Preparer {
            hasher: self.requests.hasher(),
        }
    }
}

/// An op made ready for the fold by [`Preparer::prepare`]: a create's
/// moment already built and boxed, the request id already hashed, the
/// request index row already decided. Startup replay prepares on the
/// decoding thread, so the fold thread moves a few pointers per op instead
/// of a whole payload. Preparing reads no state: it cannot fail.
#[derive(Debug)]
pub struct PreparedOp {
    pub(super) seq: u64,
    pub(super) ts_ms: u64,
    pub(super) request: Option<(HashedRequestId, RequestRow)>,
    pub(super) body: PreparedBody,
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

impl Mirror {
    /// Asks the CPU to bring in the request index slot that folding `op`
    /// will probe, a few ops ahead of [`Mirror::apply_prepared`] (startup
    /// replay: a cache miss per request id was the fold's largest cost
    /// after first-touch page zeroing). A hint: nothing changes.
    pub fn prefetch_prepared(&self, op: &PreparedOp) {
        if let Some((request_id, _)) = &op.request {
            self.requests.prefetch(request_id);
        }
    }
}

#[derive(Debug)]
pub(super) enum PreparedBody {
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

pub(super) fn prepare(hasher: &RequestHasher, op: Op) -> PreparedOp {
    prepare_keeping_create(hasher, op).0
}

/// [`prepare`], handing a create's payload back (its request id taken out
/// for the index) instead of dropping it: the moment is built from its
/// strings, which stay the caller's.
pub(super) fn prepare_keeping_create(
    hasher: &RequestHasher,
    op: Op,
) -> (PreparedOp, Option<MomentCreate>) {
    let Op {
        seq,
        ts_ms,
        mut body,
        erased,
    } = op;
    let request = body.take_request_id().map(|request_id| {
        let row = RequestRow {
            seq,
            kind: body.kind(),
            entity: body.entity(),
        };
        (hasher.hashed(request_id), row)
    });
    let (body, kept) = match body {
        OpBody::MomentCreate(p) => {
            let mut moment = Box::new(Moment::created(&p, seq, ts_ms));
            // An erased create (SPEC section 13) makes an erased moment;
            // its other ops were erased with it.
            if erased {
                moment.erase();
            }
            (PreparedBody::Create { id: p.id, moment }, Some(p))
        }
        other => (PreparedBody::Other(Box::new(other)), None),
    };
    let prepared = PreparedOp {
        seq,
        ts_ms,
        request,
        body,
    };
    (prepared, kept)
}

impl Moment {
    /// The moment a `moment.create` at `seq`, `ts_ms` makes (the payload's
    /// device is dropped: the mirror does not keep it).
    pub(super) fn created(p: &MomentCreate, seq: u64, ts_ms: u64) -> Moment {
        Moment::new(
            p.id,
            p.text.as_deref(),
            p.caption.as_deref(),
            p.lang.as_deref(),
            p.captured_at_ms,
            (seq, ts_ms),
        )
    }
}
