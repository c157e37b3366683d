//! `GET /api/log/head`: the last committed seq, the active segment and the
//! BLAKE3 chain value (SPEC section 10). Record the chain elsewhere and any
//! later rewrite of history becomes visible. On a read replica `seq` is
//! the last seq it applied, and `lag_ms` says how far behind the archive
//! it may be.

use std::sync::Arc;

use serde::Serialize;
use warp::http::StatusCode;
use warp::reply::Response;

use super::{json_response, ApiError, AppState, Request};

/// The head as the API shows it.
#[derive(Serialize)]
struct HeadView {
    /// Last committed seq; 0 for an empty log.
    seq: u64,
    /// The active segment's file name ("" before the first write).
    segment: String,
    /// The chain value, 64 lower-case hex characters.
    chain: String,
    /// The head's event cursor (`SEQ.CHAIN`, `0` for an empty log;
    /// [`spark_core::wire::events::EventCursor`]): `GET /api/events` with
    /// `after` this follows the ops committed after this answer.
    cursor: String,
    /// With `[archive]`: the last seq a stored manifest names (SPEC
    /// section 11). Left out without an archive, so that the answer stays
    /// byte for byte what it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    archived_seq: Option<u64>,
    /// With `[archive]`: `shipping`, `failing` or `fenced` (another engine
    /// took the prefix over; this one acknowledges no write any more).
    #[serde(skip_serializing_if = "Option::is_none")]
    archive_status: Option<&'static str>,
    /// On a replica: milliseconds since it last knew it held everything the
    /// archive held (SPEC section 11; [`crate::replica::ReplicaStatus::lag_ms`]).
    /// Left out on a writer.
    #[serde(skip_serializing_if = "Option::is_none")]
    lag_ms: Option<u64>,
}

/// `GET /api/log/head`.
pub async fn head(state: Arc<AppState>, _req: Request) -> Result<Response, ApiError> {
    let head = state.engine.head();
    Ok(json_response(
        StatusCode::OK,
        &HeadView {
            seq: head.seq,
            segment: head.segment.clone(),
            chain: head.chain_hex(),
            cursor: spark_core::wire::events::EventCursor::at(head.seq, &head.chain).to_string(),
            archived_seq: state.archive.as_ref().map(|a| a.shipped_seq()),
            archive_status: state.archive.as_ref().map(|a| a.status_name()),
            lag_ms: state.replica.as_ref().map(|r| r.lag_ms()),
        },
    ))
}
