//! What a read replica adds to every route (SPEC section 11):
//! writes answer `421 read_only`, and a read may ask to see at least a
//! given seq (`min_seq=N` in the query, or the header
//! [`MIN_SEQ_HEADER`]), so that a client that just wrote on the writer
//! reads its own write on a replica. Both run in [`super::guarded`],
//! before any handler, so the rule lives in one place for every route.

use std::time::Duration;

use spark_core::wire::problem as wire;
use warp::http::{Method, StatusCode};

use super::{ApiError, AppState, Request};

/// The header that asks a read to wait for a seq, like the `min_seq`
/// query parameter: `X-Spark-Min-Seq: 1234`.
pub const MIN_SEQ_HEADER: &str = "x-spark-min-seq";

/// The query parameter that asks a read to wait for a seq.
pub const MIN_SEQ_PARAM: &str = "min_seq";

/// Whether `method` writes (every route's writes are `POST`, `PUT`,
/// `PATCH` or `DELETE`).
pub fn is_write(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// On a replica, a write is `421 read_only` (problem member `writer_url`:
/// the writer's address from `replica.writer_url`, or `null`). `Ok` on a
/// writer and for reads.
pub fn refuse_writes(state: &AppState, req: &Request) -> Result<(), ApiError> {
    let Some(replica) = &state.replica else {
        return Ok(());
    };
    if !is_write(&req.method) {
        return Ok(());
    }
    let writer = replica.writer_url();
    let detail = match writer {
        Some(url) => format!("this engine is a read replica: send writes to the writer at {url}"),
        None => "this engine is a read replica: send writes to the writer".to_owned(),
    };
    let mut error = ApiError::new(StatusCode::MISDIRECTED_REQUEST, wire::READ_ONLY, detail);
    error.extra.insert(
        "writer_url".into(),
        writer.map_or(serde_json::Value::Null, |w| w.into()),
    );
    Err(error)
}

/// On a replica that has read no manifest yet (an empty prefix, or a
/// wrong `--from`), a read is `503 unavailable` naming the prefix, with
/// `Retry-After`: an empty list or a `404` would look like the writer's
/// state. `Ok` on a writer, and on a replica once a manifest was read.
pub fn refuse_reads_before_first_manifest(state: &AppState) -> Result<(), ApiError> {
    let Some(why) = state
        .replica
        .as_ref()
        .and_then(|replica| replica.before_first_manifest())
    else {
        return Ok(());
    };
    let mut error = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, wire::UNAVAILABLE, why);
    error.retry_after_s = Some(1);
    Err(error)
}

/// The seq a read asks to see (`min_seq` in the query, or
/// [`MIN_SEQ_HEADER`]), taking `min_seq` out of the query so the route's
/// own parameters parse as before. `None` when neither is given, and for
/// writes (which keep their query as it is). Both given and different, or
/// not a whole number: `400 invalid_request`.
pub fn take_min_seq(req: &mut Request) -> Result<Option<u64>, ApiError> {
    if is_write(&req.method) {
        return Ok(None);
    }
    let parse = |what: &str, text: &str| {
        text.trim().parse::<u64>().map_err(|_| {
            ApiError::invalid_request(format!("{what} {text:?} is not a seq (a whole number)"))
        })
    };
    let mut from_query = None;
    if req
        .query
        .split('&')
        .any(|pair| pair.split('=').next() == Some(MIN_SEQ_PARAM))
    {
        let mut kept = Vec::new();
        for pair in req.query.split('&') {
            match pair.split_once('=') {
                Some((MIN_SEQ_PARAM, value)) => from_query = Some(parse("min_seq", value)?),
                None if pair == MIN_SEQ_PARAM => {
                    return Err(ApiError::invalid_request("min_seq needs a value"))
                }
                _ => kept.push(pair),
            }
        }
        req.query = kept.join("&");
    }
    static MIN_SEQ: warp::http::HeaderName = warp::http::HeaderName::from_static(MIN_SEQ_HEADER);
    let from_header = req
        .header(&MIN_SEQ)?
        .map(|v| parse("X-Spark-Min-Seq", v))
        .transpose()?;
    match (from_query, from_header) {
        (Some(q), Some(h)) if q != h => Err(ApiError::invalid_request(
            "min_seq and X-Spark-Min-Seq differ; send one, or both equal",
        )),
        (q, h) => Ok(q.or(h)),
    }
}

/// Waits until the engine's committed seq reaches `min_seq`, at most
/// `replica.min_seq_wait_ms` (on a writer too: there it has usually
/// reached it already). Past the bound: `503 unavailable` with
/// `Retry-After: 1` and members `min_seq` and `seq` (the seq reached).
pub async fn wait_for_seq(state: &AppState, min_seq: u64) -> Result<(), ApiError> {
    let mut commits = state.engine.watch_commits();
    let bound = Duration::from_millis(state.settings.replica.min_seq_wait_ms);
    let reached = tokio::time::timeout(bound, commits.wait_for(|seq| *seq >= min_seq)).await;
    if matches!(reached, Ok(Ok(_))) {
        return Ok(());
    }
    let seq = state.engine.head().seq;
    let mut error = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        wire::UNAVAILABLE,
        format!(
            "this engine holds up to seq {seq}, not yet seq {min_seq} (waited {} ms): try again shortly",
            bound.as_millis()
        ),
    );
    error.retry_after_s = Some(1);
    error.extra.insert("min_seq".into(), min_seq.into());
    error.extra.insert("seq".into(), seq.into());
    Err(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, query: &str, header: Option<&str>) -> Request {
        let mut headers = warp::http::HeaderMap::new();
        if let Some(value) = header {
            headers.insert(MIN_SEQ_HEADER, value.parse().unwrap());
        }
        Request {
            method,
            headers,
            query: query.to_owned(),
            body: Box::pin(futures_util::stream::empty()),
            device: super::super::ANONYMOUS_DEVICE.to_owned(),
        }
    }

    #[test]
    fn min_seq_is_taken_out_of_the_query_and_read_from_the_header() {
        let mut req = request(Method::GET, "after=01J&min_seq=42&limit=3", None);
        assert_eq!(take_min_seq(&mut req).unwrap(), Some(42));
        assert_eq!(req.query, "after=01J&limit=3");
        let mut req = request(Method::GET, "", Some("7"));
        assert_eq!(take_min_seq(&mut req).unwrap(), Some(7));
        let mut req = request(Method::GET, "min_seq=7", Some("7"));
        assert_eq!(take_min_seq(&mut req).unwrap(), Some(7));
        assert_eq!(req.query, "");
        let mut req = request(Method::GET, "limit=3", None);
        assert_eq!(take_min_seq(&mut req).unwrap(), None);
        assert_eq!(req.query, "limit=3");
        for (query, header) in [
            ("min_seq=x", None),
            ("min_seq", None),
            ("min_seq=1", Some("2")),
        ] {
            let mut req = request(Method::GET, query, header);
            let error = take_min_seq(&mut req).unwrap_err();
            assert_eq!(error.code, wire::INVALID_REQUEST, "{query} {header:?}");
        }
        // A write keeps its query as it is (writes take no min_seq).
        let mut req = request(Method::POST, "min_seq=3", None);
        assert_eq!(take_min_seq(&mut req).unwrap(), None);
        assert_eq!(req.query, "min_seq=3");
    }
}
