//! `GET /api/log/head`: the last committed seq, the active segment and the
//! BLAKE3 chain value (SPEC section 10). Record the chain elsewhere and any
//! later rewrite of history becomes visible.

use std::sync::Arc;

use serde::Serialize;
use warp::http::{Method, StatusCode};
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
}

/// `GET /api/log/head`.
pub async fn head(state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    if req.method != Method::GET {
        return Err(ApiError::method_not_allowed("GET"));
    }
    let head = state.engine.head();
    Ok(json_response(
        StatusCode::OK,
        &HeadView {
            seq: head.seq,
            segment: head.segment.clone(),
            chain: head.chain_hex(),
        },
    ))
}
