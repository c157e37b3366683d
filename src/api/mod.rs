//! The HTTP API (SPEC section 4), on warp 0.4.
//!
//! The router is built from the route table ([`RESOURCES`]): per path,
//! warp's method filters pick the handler of each method it takes and any
//! other method is `405`; every handler returns a response or an
//! [`ApiError`], and [`recover`] turns what no route matched into a
//! problem+json `404`. Bodies are read through [`Request::json`],
//! which enforces the size limit before parsing and takes only a body
//! declared JSON (`415 unsupported_media_type` otherwise). Writes from
//! another site are refused before any handler runs ([`authorize`]).

mod answer;
pub mod consistency;
pub mod deadline;
pub mod events;
pub mod health;
pub mod host;
pub mod jobs;
pub mod log;
pub mod media;
pub mod messages;
pub mod moments;
pub mod openapi;
pub mod phrases;
pub mod problem;
pub mod recall;
pub mod route_table;
pub mod session;
pub mod turns;
pub mod web;

use spark_core::wire::problem as wire;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Stream, StreamExt, TryStreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use warp::filters::BoxedFilter;
use warp::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use warp::reply::Response;
use warp::Filter;

use self::route_table::{Access, Handler, HandlerFuture, Resource, RESOURCES};
use crate::config::Settings;
use crate::engine::Engine;
use crate::media::{MediaStore, Sha256Digest};
use spark_core::ids::{check_request_id, REQUEST_ID_MAX_BYTES};

pub(crate) use answer::outcome_response;
pub use problem::ApiError;

/// The device recorded on ops while no access tokens exist (SPEC section 9:
/// once tokens are configured, each token names its device).
pub const ANONYMOUS_DEVICE: &str = "anonymous";

/// What every handler can reach.
pub struct AppState {
    /// The engine: commands in, mirror out.
    pub engine: Arc<Engine>,
    /// The effective settings (limits).
    pub settings: Arc<Settings>,
    /// Where uploads go.
    pub media: MediaStore,
    /// Blobs whose whole bytes were hashed and matched their op since
    /// startup; a range of one of these is served without hashing it all again.
    pub verified_blobs: Arc<parking_lot::Mutex<std::collections::HashSet<Sha256Digest>>>,
    /// The seat names, in configuration order (practical turns ask the
    /// first; jobs ask each).
    pub seats: Vec<String>,
    /// Becomes true when the server stops: open event streams end, so the
    /// graceful shutdown is not held up by them.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// The archive shipper's status, with `[archive]` (SPEC section 11).
    pub archive: Option<Arc<crate::archive::ArchiveStatus>>,
    /// On a read replica (`spark-engine replica`), what it follows: writes
    /// answer `421 read_only` (SPEC section 11).
    pub replica: Option<Arc<crate::replica::ReplicaStatus>>,
    /// Browser sessions made by `POST /api/session` (SPEC section 12).
    pub sessions: Arc<session::Sessions>,
    /// Permits of open `/api/events` streams, one each
    /// ([`crate::config::Limits::event_streams_cap`] in all).
    pub event_streams: Arc<tokio::sync::Semaphore>,
}

/// The body of a request as a stream of chunks, not yet read.
pub type BodyStream = Pin<Box<dyn Stream<Item = Result<Bytes, warp::Error>> + Send + Sync>>;

/// One request as the handlers see it.
pub struct Request {
    /// The method.
    pub method: Method,
    /// The headers.
    pub headers: HeaderMap,
    /// The raw query string (empty when none).
    pub query: String,
    /// The unread body.
    pub body: BodyStream,
    /// The device the bearer token names (SPEC section 9), or
    /// [`ANONYMOUS_DEVICE`] when no token is configured; set by
    /// [`authorize`] before any handler runs.
    pub device: String,
}

impl Request {
    /// Reads the whole body, refusing it with `413 too_large` as soon as it
    /// passes `limit_bytes` (by `Content-Length` before reading, or while
    /// reading a body without one).
    pub async fn bytes(&mut self, limit_bytes: u64) -> Result<Bytes, ApiError> {
        if let Some(length) = self
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            if length > limit_bytes {
                return Err(ApiError::too_large(limit_bytes));
            }
        }
        let reading = |e: warp::Error| ApiError::invalid_request(format!("reading the body: {e}"));
        // A body that arrives in one chunk (a small JSON body, the common
        // case) is returned as it is, without a copy.
        let Some(first) = self.body.next().await else {
            return Ok(Bytes::new());
        };
        let first = first.map_err(reading)?;
        if first.len() as u64 > limit_bytes {
            return Err(ApiError::too_large(limit_bytes));
        }
        let Some(second) = self.body.next().await else {
            return Ok(first);
        };
        let mut buffer = BytesMut::from(first);
        let mut next = Some(second);
        while let Some(chunk) = next {
            let chunk = chunk.map_err(reading)?;
            if (buffer.len() + chunk.len()) as u64 > limit_bytes {
                return Err(ApiError::too_large(limit_bytes));
            }
            buffer.extend_from_slice(&chunk);
            next = self.body.next().await;
        }
        Ok(buffer.freeze())
    }

    /// Reads and parses a JSON object body of at most `limit_bytes`. An
    /// empty body is `Ok(None)`; malformed JSON, anything but an object,
    /// unknown members and wrong types are `400 invalid_request` naming the
    /// problem. The body must be declared JSON ([`Request::json_declared`]):
    /// otherwise `415 unsupported_media_type`, after the body was read (so
    /// the connection stays usable) and before it is parsed.
    pub async fn json<T: DeserializeOwned>(
        &mut self,
        limit_bytes: u64,
    ) -> Result<Option<T>, ApiError> {
        let bytes = self.bytes(limit_bytes).await?;
        self.json_declared(bytes.len())?;
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        // The common case, an object that fits, in one parse straight into
        // `T`. Anything that does not parse that way takes the two-step path
        // below, whose messages say what is wrong in more cases (an array
        // for an object, say); the direct parse's refusal stands when only
        // the two-step path would accept (duplicate members: SPEC section 8
        // wants a 4xx, not the last one winning).
        let direct = match first {
            None => return Ok(None),
            Some(b'{') => match serde_json::from_slice::<T>(&bytes) {
                Ok(parsed) => return Ok(Some(parsed)),
                Err(e) => Some(e),
            },
            Some(_) => None,
        };
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::invalid_request(format!("the body is not JSON: {e}")))?;
        // serde would read an array as a struct's fields in order; only an
        // object names its members.
        if !value.is_object() {
            return Err(ApiError::invalid_request("a JSON object is required"));
        }
        let refused = |e: serde_json::Error| {
            ApiError::invalid_request(format!("the JSON body does not fit: {e}"))
        };
        match (serde_json::from_value::<T>(value), direct) {
            (Err(e), _) | (Ok(_), Some(e)) => Err(refused(e)),
            (Ok(parsed), None) => Ok(Some(parsed)),
        }
    }

    /// Whether a body of `body_len` bytes that the route reads as JSON is
    /// declared so: a `Content-Type` that [`is_json_media_type`] accepts;
    /// or, for an empty body, no `Content-Type` at all (a body-less `POST`
    /// where the body is optional). Anything else is `415
    /// unsupported_media_type`: a non-empty body without a JSON type, and
    /// any other declared type even with an empty body (a `text/plain` or
    /// form body is what a page of another site can send without a CORS
    /// preflight; a client of this API has no reason to send one).
    pub fn json_declared(&self, body_len: usize) -> Result<(), ApiError> {
        let declared = self
            .headers
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().map(str::trim))
            .filter(|v| !matches!(v, Ok("")));
        let refused = |what: String| {
            ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                wire::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "this route reads its body as JSON: send Content-Type: application/json \
                     ({what})"
                ),
            )
        };
        match declared {
            Some(Ok(content_type)) if is_json_media_type(content_type) => Ok(()),
            Some(Ok(content_type)) => {
                Err(refused(format!("the request declares {content_type:?}")))
            }
            Some(Err(_)) => Err(refused(
                "the request's Content-Type is not visible ASCII".to_owned(),
            )),
            None if body_len == 0 => Ok(()),
            None => Err(refused(format!(
                "the request has a body of {body_len} bytes and no Content-Type"
            ))),
        }
    }

    /// Parses the query string into `T` (unknown parameters are refused
    /// when `T` denies them).
    pub fn query<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_urlencoded::from_str(&self.query)
            .map_err(|e| ApiError::invalid_request(format!("the query does not fit: {e}")))
    }

    /// A header as text, if present; a header that is not visible ASCII is
    /// `400 invalid_request`.
    /// `name` is a `&str` or, on a path every request takes, a
    /// `&HeaderName` made once (a `&str` is parsed into a name on every
    /// look-up).
    pub fn header<N>(&self, name: N) -> Result<Option<&str>, ApiError>
    where
        N: header::AsHeaderName + Copy + std::fmt::Display,
    {
        match self.headers.get(name) {
            None => Ok(None),
            Some(value) => value.to_str().map(|v| Some(v.trim())).map_err(|_| {
                ApiError::invalid_request(format!("header {name} is not visible ASCII"))
            }),
        }
    }

    /// The request id of a write: `client_request_id` from the body and/or
    /// the `Idempotency-Key` header (SPEC section 2). Both sent and
    /// different is `400 invalid_request`; each is checked against the
    /// 80-byte cap and the character rules.
    pub fn request_id(&self, from_body: Option<String>) -> Result<Option<String>, ApiError> {
        static IDEMPOTENCY_KEY: HeaderName =
            HeaderName::from_static(spark_core::wire::HEADER_IDEMPOTENCY_KEY);
        let from_header = self.header(&IDEMPOTENCY_KEY)?.map(str::to_owned);
        let request_id = match (from_body, from_header) {
            (Some(body), Some(head)) if body != head => {
                return Err(ApiError::invalid_request(
                    "Idempotency-Key and client_request_id differ; send one, or both equal",
                ))
            }
            (Some(body), _) => Some(body),
            (None, head) => head,
        };
        if let Some(r) = &request_id {
            check_request_id(r, REQUEST_ID_MAX_BYTES)?;
        }
        Ok(request_id)
    }
}

/// Whether `content_type` (a `Content-Type` value) is JSON:
/// `application/json` or `application/<subtype>+json` (RFC 6839), with any
/// parameters (`; charset=utf-8`), without regard to case.
pub fn is_json_media_type(content_type: &str) -> bool {
    // What nearly every client sends, at the cost of one comparison.
    if content_type == "application/json" {
        return true;
    }
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    let suffix = subtype
        .len()
        .checked_sub("+json".len())
        .filter(|&at| at > 0)
        .and_then(|at| subtype.get(at..));
    kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case("json")
            || suffix.is_some_and(|s| s.eq_ignore_ascii_case("+json")))
}

/// The header that says a list route's `limit` was clamped, with the page
/// size used instead (documented in `openapi.json`, `LimitClamped`).
pub use spark_core::wire::HEADER_LIMIT_CLAMPED as LIMIT_CLAMPED_HEADER;

/// A list route's page size, and whether the `limit` asked for was above
/// `list_limit_max` and clamped to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageLimit {
    /// Items per page.
    pub items: usize,
    /// The asked `limit` was larger and cut to `items`.
    pub clamped: bool,
}

impl PageLimit {
    /// `response`, with `Spark-Limit-Clamped: <items>` when the limit was
    /// clamped.
    pub fn mark(self, mut response: Response) -> Response {
        if self.clamped {
            response.headers_mut().insert(
                HeaderName::from_static(LIMIT_CLAMPED_HEADER),
                HeaderValue::from(self.items),
            );
        }
        response
    }
}

/// The query of a list route that pages by id only (`GET /api/phrases`;
/// `GET /api/moments` adds `order`): `after`, the last id of the page before, and
/// `limit`, read by [`page_limit`]. Any other parameter is `400
/// invalid_request`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageQuery {
    /// The last id of the page before (absent: the first page).
    pub after: Option<String>,
    /// The page size as given, in items.
    pub limit: Option<String>,
}

/// The page size of a list route: `limit` from the query (a whole number
/// from 1 to `list_limit_max`; larger is clamped, not refused, and the
/// answer says so), else the default. Anything else is `400
/// invalid_request` naming the accepted range.
pub fn page_limit(
    limit: Option<&str>,
    limits: &crate::config::Limits,
) -> Result<PageLimit, ApiError> {
    let max = limits.list_limit_max;
    match limit {
        None => Ok(PageLimit {
            items: limits.list_limit_default,
            clamped: false,
        }),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if n > 0 => Ok(PageLimit {
                items: n.min(max),
                clamped: n > max,
            }),
            // A whole number too large for a `usize` is clamped as every
            // other one above the maximum.
            Err(_) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
                Ok(PageLimit {
                    items: max,
                    clamped: true,
                })
            }
            _ => Err(ApiError::invalid_request(format!(
                "limit {text:?} is not accepted: give a whole number from 1 to {max} (larger \
                 numbers are clamped to {max}; without limit a page holds {})",
                limits.list_limit_default
            ))),
        },
    }
}

/// A JSON response with `status`.
pub fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response {
    // Room for a typical write answer (a moment is ~600 bytes as JSON) in
    // one allocation, where `to_vec` starts at 128 and grows three times.
    let mut bytes = Vec::with_capacity(1024);
    match serde_json::to_writer(&mut bytes, value) {
        Ok(()) => {
            let mut response = Response::new(bytes.into());
            *response.status_mut() = status;
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            wire::UNAVAILABLE,
            format!("the answer did not encode: {e}"),
        )
        .into_response(),
    }
}

/// The request behind the headers `headers` extracted: its method, the
/// raw query (empty when none) and the unread body.
fn request(
    headers: impl Filter<Extract = (HeaderMap,), Error = warp::Rejection> + Clone + Send + Sync,
) -> impl Filter<Extract = (Request,), Error = warp::Rejection> + Clone {
    let query = warp::query::raw().or(warp::any().map(String::new)).unify();
    headers
        .and(warp::method())
        .and(query)
        .and(warp::body::stream())
        .map(|headers, method, query, body| Request {
            method,
            headers,
            query,
            body: box_body(body),
            device: ANONYMOUS_DEVICE.to_owned(),
        })
}

fn box_body<S, B>(body: S) -> BodyStream
where
    S: Stream<Item = Result<B, warp::Error>> + Send + Sync + 'static,
    B: Buf,
{
    Box::pin(body.map_ok(|mut chunk| chunk.copy_to_bytes(chunk.remaining())))
}

/// The bearer token of `Authorization: Bearer <token>`, if sent (the
/// scheme is case-insensitive, RFC 9110 section 11.1).
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        })
        .map(str::trim)
}

/// Checks the bearer token (SPEC section 9) or the session cookie (SPEC
/// section 12, [`session`]) and records its device on the request. With no
/// token configured every request passes as [`ANONYMOUS_DEVICE`];
/// otherwise a missing or unknown token, or a session that expired, was
/// ended or whose token is gone, is `401 unauthorized`. The presented
/// token is hashed with SHA-256 and compared with every stored hash in
/// constant time. A write authenticated by the cookie alone must be the
/// page's own ([`session::same_origin_write`], else `403 forbidden`).
///
/// In every mode, a write without a bearer token whose `Origin` is another
/// site is `403 forbidden` ([`session::refuse_cross_site`]), before the
/// cookie or the missing token is looked at. A valid bearer token is not
/// held to it: a browser never adds one by itself, so a request that
/// carries one was meant by whoever holds the token (and a page of another
/// site cannot send `Authorization` without a CORS preflight, which the
/// engine never grants).
pub fn authorize(state: &AppState, req: &mut Request) -> Result<(), ApiError> {
    let tokens = &state.settings.access.tokens;
    if tokens.is_empty() {
        return session::refuse_cross_site(&req.method, &req.headers);
    }
    let unauthorized =
        |why: &str| ApiError::new(StatusCode::UNAUTHORIZED, wire::UNAUTHORIZED, why.to_owned());
    let Some(presented) = bearer(&req.headers) else {
        session::refuse_cross_site(&req.method, &req.headers)?;
        if let Some(secret) = session::cookie_secret(&req.headers) {
            let found = state
                .sessions
                .lookup(secret, tokens.iter().map(|t| t.sha256.as_str()))
                .ok_or_else(|| {
                    unauthorized(
                        "the session has expired or was ended: sign in with the token again",
                    )
                })?;
            session::same_origin_write(&req.method, &req.headers)?;
            req.device = found.device;
            return Ok(());
        }
        return Err(unauthorized("send Authorization: Bearer <token>"));
    };
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(presented.as_bytes()));
    let mut device = None;
    for token in tokens {
        // Constant time per comparison, and every entry is compared.
        let equal = subtle::ConstantTimeEq::ct_eq(
            digest.as_bytes(),
            token.sha256.to_ascii_lowercase().as_bytes(),
        );
        if bool::from(equal) {
            device = Some(token.device.clone());
        }
    }
    req.device = device.ok_or_else(|| unauthorized("the token is not valid"))?;
    Ok(())
}

/// The request headers that carry one value. The same one sent on two
/// lines with different values is `400 invalid_request` naming it
/// ([`refuse_repeated_headers`]): a header map answers the first line, and
/// a proxy or a client may read the other (two idempotency keys made two
/// moments; a right digest then a wrong one was accepted). Repeated lines
/// with the same value are taken as one.
pub const SINGLE_VALUE_HEADERS: [&str; 9] = [
    spark_core::wire::HEADER_IDEMPOTENCY_KEY,
    spark_core::wire::HEADER_CONTENT_SHA256,
    spark_core::wire::HEADER_MOMENT_ID,
    spark_core::wire::HEADER_MEDIA_ROLE,
    spark_core::wire::HEADER_PHOTO,
    "content-type",
    "if-match",
    "authorization",
    "last-event-id",
];

/// Headers of [`SINGLE_VALUE_HEADERS`] whose values are compared without
/// regard to ASCII case: a media type (RFC 9110 section 8.3.1).
const CASELESS_HEADERS: [&str; 1] = ["content-type"];

/// Refuses a request that sends one of [`SINGLE_VALUE_HEADERS`] on two
/// lines whose values differ (surrounding blanks aside): `400
/// invalid_request` naming the header. Runs before anything else looks at
/// the request, authentication included, so nothing is written.
pub fn refuse_repeated_headers(headers: &HeaderMap) -> Result<(), ApiError> {
    // No name on two lines (the common case): nothing can differ, and the
    // nine look-ups below (each hashing its name) are skipped.
    if headers.len() == headers.keys_len() {
        return Ok(());
    }
    for name in SINGLE_VALUE_HEADERS {
        let mut lines = headers
            .get_all(name)
            .iter()
            .map(|v| v.as_bytes().trim_ascii());
        let Some(first) = lines.next() else {
            continue;
        };
        let caseless = CASELESS_HEADERS.contains(&name);
        if lines.any(|other| {
            if caseless {
                !other.eq_ignore_ascii_case(first)
            } else {
                other != first
            }
        }) {
            return Err(ApiError::invalid_request(format!(
                "header {name} is sent more than once with different values; it takes one \
                 value: send it once"
            )));
        }
    }
    Ok(())
}

/// Runs `handler` after [`refuse_repeated_headers`] and [`authorize`],
/// turning errors into problem+json.
async fn guarded<F, Fut>(state: Arc<AppState>, mut req: Request, handler: F) -> Response
where
    F: FnOnce(Arc<AppState>, Request) -> Fut,
    Fut: std::future::Future<Output = Result<Response, ApiError>> + Unpin,
{
    if let Err(e) = refuse_repeated_headers(&req.headers) {
        return e.into_response();
    }
    if let Err(e) = authorize(&state, &mut req) {
        let unauthorized = e.status == StatusCode::UNAUTHORIZED;
        let mut response = e.into_response();
        // RFC 9110 section 11.6.1: a 401 names the scheme to use.
        if unauthorized {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        return response;
    }
    if let Err(e) = consistency::refuse_writes(&state, &req) {
        return e.into_response();
    }
    if let Err(e) = consistency::refuse_reads_before_first_manifest(&state) {
        return e.into_response();
    }
    let min_seq = match consistency::take_min_seq(&mut req) {
        Ok(min_seq) => min_seq,
        Err(e) => return e.into_response(),
    };
    if let Some(min_seq) = min_seq {
        if let Err(e) = consistency::wait_for_seq(&state, min_seq).await {
            return e.into_response();
        }
    }
    let limit = Duration::from_millis(state.settings.limits.request_timeout_ms);
    // Whether the body has been read to its end, to tell a slow client
    // (408) from a slow answer (503) when the time runs out.
    let has_body = req.headers.contains_key(header::TRANSFER_ENCODING)
        || req
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0");
    let body_done = Arc::new(AtomicBool::new(!has_body));
    let flag = Arc::clone(&body_done);
    let body = std::mem::replace(&mut req.body, Box::pin(futures_util::stream::empty()));
    req.body = Box::pin(body.chain(futures_util::stream::poll_fn(move |_| {
        flag.store(true, Ordering::Release);
        std::task::Poll::Ready(None)
    })));
    match deadline::within(limit, handler(state, req)).await {
        Ok(result) => into_response(result),
        Err(_) => timed_out(limit, body_done.load(Ordering::Acquire)).into_response(),
    }
}

/// The answer when `limits.request_timeout_ms` runs out: `408
/// request_timeout` while the body was still arriving, else `503 timeout`
/// (the client's retry rules, SPEC section 6, wait and retry either way).
fn timed_out(limit: Duration, body_done: bool) -> ApiError {
    if body_done {
        let mut error = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            wire::TIMEOUT,
            format!(
                "no answer within {} ms; a write already accepted still commits, retry with the same ids",
                limit.as_millis()
            ),
        );
        error.retry_after_s = Some(1);
        error
    } else {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            wire::REQUEST_TIMEOUT,
            format!(
                "the request was not received within {} ms",
                limit.as_millis()
            ),
        )
    }
}

/// Every route of [`RESOURCES`], with rejections turned into problem+json.
pub fn routes(
    state: Arc<AppState>,
) -> impl Filter<Extract = (impl warp::Reply,), Error = Infallible> + Clone + Send + Sync + 'static
{
    let with_state = warp::any().map(move || Arc::clone(&state));
    // Boxed, path by path: a chain of this many `or`s of unboxed filters
    // overflows rustc's type recursion limit in release builds (E0275).
    let chosen = balanced_or(RESOURCES.iter().map(resource_filter).collect());
    // Before any route: the Host check (DNS rebinding, [`host`]); the
    // headers it read are the request's, cloned once.
    let host_checked = warp::header::headers_cloned()
        .and(with_state.clone())
        .and_then(|headers: HeaderMap, state: Arc<AppState>| async move {
            host::refuse_foreign_host(&state.settings, &headers)
                .map(|()| headers)
                .map_err(|e| warp::reject::custom(Refused(e)))
        });
    let served = request(host_checked)
        .and(chosen)
        .and(with_state)
        .then(|req: Request, route: Route, state| answer(route, state, req));
    served
        .recover(recover)
        .unify()
        .with(warp::log::custom(|info| {
            crate::metrics::get().observe_request(
                route_table::template_of(info.path()),
                crate::metrics::method_of(info.method().as_str()),
                info.status().as_u16(),
                info.elapsed().as_secs_f64(),
            );
            tracing::debug!(
                method = %info.method(),
                path = info.path(),
                status = info.status().as_u16(),
                elapsed_us = info.elapsed().as_micros() as u64,
                "request"
            );
        }))
}

/// `filters[0].or(filters[1]).or(...)`, tried in the same order, as a
/// balanced tree of `or`s: a request passes about log2(n) of them, not up
/// to n. Each `or` of boxed filters costs a request a boxed future and an
/// `EitherFuture` poll on its way in and out, and a left-nested chain put
/// the table's first path (`POST /api/moments`) at the bottom of all 23
/// (issue 28: about 1.7 µs of server CPU per create at 64 connections).
///
/// # Panics
/// On an empty list (the table lists every path the engine serves).
fn balanced_or(mut filters: Vec<BoxedFilter<(Route,)>>) -> BoxedFilter<(Route,)> {
    assert!(!filters.is_empty(), "RESOURCES lists a path");
    if filters.len() == 1 {
        return filters.remove(0);
    }
    let right = filters.split_off(filters.len() / 2);
    balanced_or(filters).or(balanced_or(right)).unify().boxed()
}

/// What the route table chose for a request: the path's resource, the
/// handler of the request's method (`None`: the path does not take it,
/// `405`), and the `{id}` segment as sent (empty for a path without one).
struct Route {
    resource: &'static Resource,
    handler: Option<Handler>,
    id: String,
}

/// The filter of one path of the table: the path (its `{id}` segment
/// extracted), then warp's filter of each method the path takes
/// (`warp::get()`, ...) choosing that method's handler, and any other
/// method chosen as `None` (answered `405` with the path's `Allow`, after
/// the path's [`route_table::Resource::path_check`]). The path is matched
/// before the method, and every method of a matched path is answered, so
/// no method rejection reaches [`recover`]: a path nobody serves stays
/// `404 no such route`, never a warp `405`. It reads nothing but the path
/// and the method: the request is built once, after the route is chosen.
fn resource_filter(resource: &'static Resource) -> BoxedFilter<(Route,)> {
    let chosen = resource
        .methods
        .iter()
        .map(|&(method, handler)| method_filter(method).map(move || Some(handler)).boxed())
        .reduce(|chosen, next| chosen.or(next).unify().boxed())
        .expect("a path of RESOURCES takes a method")
        .or(warp::any().map(|| None::<Handler>))
        .unify();
    path_filter(resource.template)
        .and(chosen)
        .map(move |id, handler| Route {
            resource,
            handler,
            id,
        })
        .boxed()
}

/// Warp's filter of one method of [`RESOURCES`] (`GET` is `warp::get()`:
/// it takes `GET` only, not `HEAD`).
///
/// # Panics
/// On a method warp has no filter for; the table's unit test builds every
/// one.
fn method_filter(method: &str) -> BoxedFilter<()> {
    match method {
        "GET" => warp::get().boxed(),
        "HEAD" => warp::head().boxed(),
        "POST" => warp::post().boxed(),
        "PUT" => warp::put().boxed(),
        "PATCH" => warp::patch().boxed(),
        "DELETE" => warp::delete().boxed(),
        other => panic!("RESOURCES lists the method {other}, which has no filter here"),
    }
}

/// Warp's path filter of a template of [`RESOURCES`]: a literal segment is
/// `warp::path(segment)`, `{id}` extracts the segment as sent, and the path
/// ends there (`warp::path::end()`); extracts the `{id}` segment, or the
/// empty string for a path without one.
fn path_filter(template: &'static str) -> BoxedFilter<(String,)> {
    let mut filter = warp::any().map(String::new).boxed();
    for segment in template.split('/').filter(|s| !s.is_empty()) {
        filter = if segment == "{id}" {
            filter
                .and(warp::path::param::<String>())
                .map(|_: String, id: String| id)
                .boxed()
        } else {
            filter.and(warp::path(segment)).boxed()
        };
    }
    filter.and(warp::path::end()).boxed()
}

/// Runs the handler a method filter chose (or, with none, the path's `405`)
/// behind the checks of the path's [`Access`].
async fn answer(route: Route, state: Arc<AppState>, req: Request) -> Response {
    let Route {
        resource,
        handler,
        id,
    } = route;
    let run = move |state: Arc<AppState>, req: Request| -> HandlerFuture {
        match handler {
            Some(handler) => handler(state, id, req),
            None => Box::pin(async move {
                if let Some(check) = resource.path_check {
                    check(&id)?;
                }
                Err(ApiError::method_not_allowed(&resource.allow()))
            }),
        }
    };
    match resource.access {
        Access::Token => guarded(state, req, run).await,
        Access::Public => into_response(run(state, req).await),
    }
}

fn into_response(result: Result<Response, ApiError>) -> Response {
    result.unwrap_or_else(ApiError::into_response)
}

/// A refusal made by a filter that runs before the routes (the `Host`
/// check), carried to [`recover`] as a rejection.
#[derive(Debug)]
struct Refused(ApiError);

impl warp::reject::Reject for Refused {}

/// Turns what no route answered into problem+json.
async fn recover(rejection: warp::Rejection) -> Result<Response, Infallible> {
    let error = if let Some(Refused(error)) = rejection.find::<Refused>() {
        error.clone()
    } else if rejection.is_not_found() {
        ApiError::not_found("no such route")
    } else {
        ApiError::invalid_request(format!("the request was refused: {rejection:?}"))
    };
    Ok(error.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every method and path of the table has its warp filter.
    #[test]
    fn every_route_has_its_filters() {
        for resource in RESOURCES {
            let _ = path_filter(resource.template);
            for (method, _) in resource.methods {
                let _ = method_filter(method);
            }
        }
    }

    /// JSON is `application/json` or `application/*+json`, parameters
    /// and case aside; nothing else a browser sends without a preflight is.
    #[test]
    fn json_media_types() {
        for json in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON;charset=UTF-8",
            " application/json ",
            "application/merge-patch+json",
            "application/vnd.spark.moment+json; v=1",
        ] {
            assert!(is_json_media_type(json), "{json}");
        }
        for other in [
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "text/json",
            "application/+json",
            "application/jsonx",
            "application/json-seq",
            "application",
            "json",
            "",
        ] {
            assert!(!is_json_media_type(other), "{other}");
        }
    }
}
