//! Browser sessions (SPEC section 12): `POST /api/session`
//! exchanges a bearer token for a session cookie, `DELETE /api/session`
//! ends sessions, and [`Sessions`] holds them.
//!
//! - The cookie ([`SESSION_COOKIE`]) is `HttpOnly; SameSite=Strict;
//!   Path=/` with `Max-Age` the session's life (`access.session_ttl_ms`),
//!   and `Secure` when the page came over TLS (an `https` `Origin`, or
//!   `X-Forwarded-Proto: https` from the proxy in front). The page never
//!   sees it, so no token or session lives in script-readable storage, and
//!   neither goes into a URL or a log.
//! - The engine keeps only the SHA-256 of each session's secret, with the
//!   device and the hash of the token it was made with. A session ends when
//!   it expires, when `DELETE /api/session` ends it (with the cookie: that
//!   session; with the token: every session made with that token), or when
//!   its token is no longer configured.
//! - The cookie authenticates every route a token does ([`super::authorize`]);
//!   a write with it must come from the page itself ([`same_origin_write`]).
//! - Whatever the configuration, a write that carries no bearer token is
//!   refused when its `Origin` is another site's ([`refuse_cross_site`]):
//!   with no token configured, nothing else stands between a web page the
//!   user visits and the engine on their machine.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spark_core::wire::problem as wire;
use spark_core::wire::{HEADER_CLIENT, SESSION_COOKIE};
use warp::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use warp::reply::Response;

use super::{json_response, ApiError, AppState, Request};
use crate::clock::Clock;

/// Sessions held at most; making one more first drops the expired ones,
/// then the one that expires soonest.
pub const SESSIONS_MAX: usize = 10_000;

/// One session, as kept (never its secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The device of the token it was made with (recorded on the ops it causes).
    pub device: String,
    /// The SHA-256 (hex) of that token, as configured.
    pub token_sha256: String,
    /// When it ends, Unix milliseconds.
    pub expires_at_ms: u64,
}

/// The sessions of this engine, in memory (a restart ends them all).
pub struct Sessions {
    clock: Arc<dyn Clock>,
    by_secret_hash: parking_lot::Mutex<HashMap<[u8; 32], Session>>,
    /// Woken whenever sessions are ended or dropped, for [`Sessions::ended`].
    removed: tokio::sync::Notify,
}

/// How often [`Sessions::ended`] looks again at a session nothing ended:
/// its expiry by the engine's clock, and a drop to make room, are seen
/// within this.
pub const SESSION_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

fn secret_hash(secret: &str) -> [u8; 32] {
    <sha2::Sha256 as sha2::Digest>::digest(secret.as_bytes()).into()
}

impl Sessions {
    /// No sessions, with `clock` for their expiry.
    pub fn new(clock: Arc<dyn Clock>) -> Sessions {
        Sessions {
            clock,
            by_secret_hash: Default::default(),
            removed: tokio::sync::Notify::new(),
        }
    }

    /// Makes a session for `device` and its token's hash lasting `ttl_ms`:
    /// the secret (43 characters of URL-safe base64 over 32 random bytes),
    /// for the cookie, and the session.
    pub fn create(&self, device: &str, token_sha256: &str, ttl_ms: u64) -> (String, Session) {
        let bytes = rand::random::<[u8; 32]>();
        let secret =
            base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, bytes);
        let now = self.clock.now_ms();
        let session = Session {
            device: device.to_owned(),
            token_sha256: token_sha256.to_ascii_lowercase(),
            expires_at_ms: now.saturating_add(ttl_ms),
        };
        let mut map = self.by_secret_hash.lock();
        if map.len() >= SESSIONS_MAX {
            map.retain(|_, s| s.expires_at_ms > now);
        }
        if map.len() >= SESSIONS_MAX {
            if let Some(soonest) = map
                .iter()
                .min_by_key(|(_, s)| s.expires_at_ms)
                .map(|(k, _)| *k)
            {
                map.remove(&soonest);
            }
        }
        map.insert(secret_hash(&secret), session.clone());
        (secret, session)
    }

    /// The live session of `secret`: not expired, and its token still
    /// among `token_hashes` (the configured tokens' SHA-256, hex). A
    /// session that is neither is removed.
    pub fn lookup<'t>(
        &self,
        secret: &str,
        mut token_hashes: impl Iterator<Item = &'t str>,
    ) -> Option<Session> {
        let key = secret_hash(secret);
        let mut map = self.by_secret_hash.lock();
        let session = map.get(&key)?;
        let live = session.expires_at_ms > self.clock.now_ms()
            && token_hashes.any(|t| t.eq_ignore_ascii_case(&session.token_sha256));
        if live {
            Some(session.clone())
        } else {
            map.remove(&key);
            None
        }
    }

    /// Ends the session of `secret`; whether there was one. Streams it
    /// opened end ([`Sessions::ended`]).
    pub fn revoke(&self, secret: &str) -> bool {
        let removed = self
            .by_secret_hash
            .lock()
            .remove(&secret_hash(secret))
            .is_some();
        self.removed.notify_waiters();
        removed
    }

    /// Ends every session made with the token of this hash; how many.
    /// Streams they opened end ([`Sessions::ended`]).
    pub fn revoke_token(&self, token_sha256: &str) -> usize {
        let mut map = self.by_secret_hash.lock();
        let before = map.len();
        map.retain(|_, s| !s.token_sha256.eq_ignore_ascii_case(token_sha256));
        let removed = before - map.len();
        drop(map);
        self.removed.notify_waiters();
        removed
    }

    /// Resolves once the session of `secret` is no longer live (ended by
    /// `DELETE /api/session`, expired, dropped to make room, or its token
    /// not among `token_hashes`, as [`Sessions::lookup`] decides): what an
    /// event stream opened with it waits for, to end with it. An end is
    /// seen at once, an expiry within [`SESSION_RECHECK`].
    pub async fn ended(&self, secret: &str, token_hashes: &[String]) {
        loop {
            let removed = self.removed.notified();
            tokio::pin!(removed);
            // Registered before the look, so an end between the two wakes it.
            removed.as_mut().enable();
            let Some(session) = self.lookup(secret, token_hashes.iter().map(String::as_str)) else {
                return;
            };
            let left_ms = session.expires_at_ms.saturating_sub(self.clock.now_ms());
            let wait = std::time::Duration::from_millis(left_ms).min(SESSION_RECHECK);
            tokio::select! {
                () = removed => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Sessions held (live or not yet swept).
    pub fn len(&self) -> usize {
        self.by_secret_hash.lock().len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The secret of the session that authenticates a request with these
/// headers, as [`super::authorize`] decides: its cookie, when tokens are
/// configured and no bearer token is sent; `None` otherwise.
pub fn authenticating_secret<'h>(state: &AppState, headers: &'h HeaderMap) -> Option<&'h str> {
    if state.settings.access.tokens.is_empty() || super::bearer(headers).is_some() {
        return None;
    }
    cookie_secret(headers)
}

/// The session secret in the request's `Cookie` headers, if any.
pub fn cookie_secret(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.trim())
}

/// Where a request says it comes from: its `Origin` header, compared with
/// its `Host` header (the rule of every origin check, [`refuse_cross_site`]
/// and [`same_origin_write`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOrigin {
    /// No `Origin` header: not a browser's cross-site request (curl, the
    /// Rust client, a form in an old browser aside).
    Absent,
    /// An `Origin` that names this engine: `http://` or `https://` (a TLS
    /// proxy may stand in front) and then the `Host` header, compared
    /// without regard to case.
    Same,
    /// An `Origin` of another site, with the header's text: another
    /// scheme, host or port, or `null` (an opaque origin: a sandboxed
    /// frame, a `data:` page, a redirect across sites).
    Other(String),
    /// An `Origin` header that is not visible ASCII (never this engine's).
    Invalid,
}

impl RequestOrigin {
    /// The origin of the request with these headers.
    pub fn of(headers: &HeaderMap) -> RequestOrigin {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        match headers.get(header::ORIGIN).map(|v| v.to_str()) {
            None => RequestOrigin::Absent,
            Some(Err(_)) => RequestOrigin::Invalid,
            Some(Ok(origin)) => {
                let same = host.is_some_and(|host| {
                    origin
                        .strip_prefix("http://")
                        .or_else(|| origin.strip_prefix("https://"))
                        .is_some_and(|rest| rest.eq_ignore_ascii_case(host))
                });
                if same {
                    RequestOrigin::Same
                } else {
                    RequestOrigin::Other(origin.to_owned())
                }
            }
        }
    }
}

fn forbidden(why: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, wire::FORBIDDEN, why)
}

/// Refuses a write (`POST`, `PUT`, `PATCH`, `DELETE`) from another site:
/// an `Origin` that is not this engine's ([`RequestOrigin`]; `null` is
/// another site) is `403 forbidden`, before anything is read or written.
/// A browser sends `Origin` on every such request, and a page of another
/// site can send a simple `POST` without asking (no CORS preflight), so
/// this is what keeps any page the user visits from writing to an engine
/// on their machine. A request without `Origin` (curl, the Rust client,
/// the conformance suite) and reads pass. [`super::authorize`] applies it
/// to every request that carries no bearer token, whether or not tokens
/// are configured.
pub fn refuse_cross_site(method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
    if !super::consistency::is_write(method) {
        return Ok(());
    }
    match RequestOrigin::of(headers) {
        RequestOrigin::Absent | RequestOrigin::Same => Ok(()),
        RequestOrigin::Other(origin) => Err(forbidden(format!(
            "a write from another site is refused: Origin {origin:?} is not this engine \
             (send writes from the engine's own page, or without Origin)"
        ))),
        RequestOrigin::Invalid => Err(forbidden("the Origin header is not visible ASCII".into())),
    }
}

/// Whether a write that the session cookie authenticates comes from the
/// engine's own page (SPEC section 12): an `Origin` that names this host
/// ([`RequestOrigin::Same`]); with no `Origin`, the [`HEADER_CLIENT`]
/// header, which a cross-site form cannot send. A cross-site `Origin` is
/// refused whatever else is sent. Reads (`GET`, `HEAD`) need neither.
pub fn same_origin_write(method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
    if method == Method::GET || method == Method::HEAD {
        return Ok(());
    }
    match RequestOrigin::of(headers) {
        RequestOrigin::Same => Ok(()),
        RequestOrigin::Other(origin) => Err(forbidden(format!(
            "a write with the session cookie must come from this engine's page; \
             Origin {origin:?} is another site (send Authorization: Bearer instead)"
        ))),
        RequestOrigin::Invalid => Err(forbidden("the Origin header is not visible ASCII".into())),
        RequestOrigin::Absent if headers.contains_key(HEADER_CLIENT) => Ok(()),
        RequestOrigin::Absent => Err(forbidden(format!(
            "a write with the session cookie needs a same-origin Origin or the {HEADER_CLIENT} \
             header (send Authorization: Bearer instead)"
        ))),
    }
}

/// The answer of `POST /api/session` and `DELETE /api/session`.
#[derive(Debug, Serialize)]
pub struct SessionAnswer {
    /// The device the session (or the open engine) records on ops.
    pub device: String,
    /// When the session ends (RFC 3339 UTC); `null` when none was made
    /// (no token configured, or after `DELETE`).
    pub expires_at: Option<String>,
    /// Sessions ended (`DELETE`; 0 for `POST`).
    pub revoked: usize,
}

/// No members: the body of `POST /api/session` is empty or `{}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

fn is_tls(headers: &HeaderMap) -> bool {
    let forwarded = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
    let origin = headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("https://"));
    forwarded || origin
}

fn set_cookie(response: &mut Response, value: &str, max_age_s: u64, secure: bool) {
    let cookie = format!(
        "{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{}",
        if secure { "; Secure" } else { "" }
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// The SHA-256 (hex) of the request's bearer token, when it carries one
/// ([`super::authorize`] has checked it against the configuration).
fn bearer_hash(headers: &HeaderMap) -> Option<String> {
    super::bearer(headers)
        .map(|t| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(t.as_bytes())))
}

/// `POST /api/session`; with `DELETE /api/session` ([`end`]):
///
/// - `POST` with `Authorization: Bearer <token>`: `201` with a new
///   session's cookie and `{"device", "expires_at", "revoked": 0}`. With no
///   token configured there is nothing to exchange: `200`, no cookie,
///   `expires_at: null`. With only the cookie: `400 invalid_request` (a
///   session is made from a token, not from a session).
/// - `DELETE`: with the cookie, ends that session; with the token, every
///   session made with it; `200` with how many, and a cookie that clears
///   the browser's.
pub async fn start(state: Arc<AppState>, mut req: Request) -> Result<Response, ApiError> {
    let secure = is_tls(&req.headers);
    let tokens = &state.settings.access.tokens;
    let limit = state.settings.limits.json_body_limit_bytes;
    let _: Option<Empty> = req.json(limit).await?;
    if tokens.is_empty() {
        let answer = SessionAnswer {
            device: req.device.clone(),
            expires_at: None,
            revoked: 0,
        };
        return Ok(json_response(StatusCode::OK, &answer));
    }
    let Some(token_sha256) = bearer_hash(&req.headers) else {
        return Err(ApiError::invalid_request(
            "a session is made from a token: send Authorization: Bearer <token>",
        ));
    };
    let ttl_ms = state.settings.access.session_ttl_ms;
    let (secret, session) = state.sessions.create(&req.device, &token_sha256, ttl_ms);
    let answer = SessionAnswer {
        device: session.device,
        expires_at: Some(spark_core::time::format_rfc3339_ms(
            i64::try_from(session.expires_at_ms).unwrap_or(i64::MAX),
        )),
        revoked: 0,
    };
    let mut response = json_response(StatusCode::CREATED, &answer);
    set_cookie(&mut response, &secret, ttl_ms.div_ceil(1000), secure);
    Ok(response)
}

/// `DELETE /api/session`: see [`start`].
pub async fn end(state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    let secure = is_tls(&req.headers);
    let revoked = if let Some(token_sha256) = bearer_hash(&req.headers) {
        state.sessions.revoke_token(&token_sha256)
    } else if let Some(secret) = cookie_secret(&req.headers) {
        usize::from(state.sessions.revoke(secret))
    } else {
        0
    };
    let answer = SessionAnswer {
        device: req.device.clone(),
        expires_at: None,
        revoked,
    };
    let mut response = json_response(StatusCode::OK, &answer);
    set_cookie(&mut response, "", 0, secure);
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::OffsetClock;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    /// The origin is this engine's when it is `http://` or `https://` and
    /// the `Host`; another port, another host, `null` and a missing `Host`
    /// are another site; with no `Origin` there is nothing to tell.
    #[test]
    fn an_origin_is_this_engine_s_only_when_it_names_the_host() {
        let host = ("host", "127.0.0.1:8080");
        for (origin, want) in [
            ("http://127.0.0.1:8080", RequestOrigin::Same),
            ("https://127.0.0.1:8080", RequestOrigin::Same),
            (
                "http://127.0.0.1:8081",
                RequestOrigin::Other("http://127.0.0.1:8081".into()),
            ),
            (
                "http://127.0.0.1",
                RequestOrigin::Other("http://127.0.0.1".into()),
            ),
            (
                "http://evil.example",
                RequestOrigin::Other("http://evil.example".into()),
            ),
            ("null", RequestOrigin::Other("null".into())),
        ] {
            assert_eq!(
                RequestOrigin::of(&headers(&[host, ("origin", origin)])),
                want,
                "{origin}"
            );
        }
        assert_eq!(
            RequestOrigin::of(&headers(&[("origin", "http://127.0.0.1:8080")])),
            RequestOrigin::Other("http://127.0.0.1:8080".into())
        );
        assert_eq!(RequestOrigin::of(&headers(&[host])), RequestOrigin::Absent);
        let mut invalid = headers(&[host]);
        invalid.insert(
            header::ORIGIN,
            HeaderValue::from_bytes(b"http://\xe9").unwrap(),
        );
        assert_eq!(RequestOrigin::of(&invalid), RequestOrigin::Invalid);
        // Only writes are refused; reads pass whatever their origin.
        let evil = headers(&[host, ("origin", "http://evil.example")]);
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            let error = refuse_cross_site(&method, &evil).unwrap_err();
            assert_eq!(
                (error.status, error.code),
                (StatusCode::FORBIDDEN, "forbidden")
            );
        }
        for method in [Method::GET, Method::HEAD] {
            assert!(refuse_cross_site(&method, &evil).is_ok());
        }
        assert!(refuse_cross_site(&Method::POST, &headers(&[host])).is_ok());
    }

    /// A session ends at its expiry, and when its token leaves the
    /// configuration; the secret is kept only as its hash.
    #[test]
    fn a_session_ends_at_expiry_or_with_its_token() {
        let clock = OffsetClock::default();
        let sessions = Sessions::new(Arc::new(clock.clone()));
        let (secret, session) = sessions.create("browser", "AB", 1_000);
        assert_eq!(session.token_sha256, "ab");
        assert!(!sessions
            .by_secret_hash
            .lock()
            .keys()
            .any(|k| k == secret.as_bytes()));
        assert!(sessions.lookup(&secret, ["ab"].into_iter()).is_some());
        assert!(sessions.lookup(&secret, ["AB"].into_iter()).is_some());
        // The token is gone from the configuration: so is the session.
        assert!(sessions.lookup(&secret, ["cd"].into_iter()).is_none());
        assert!(sessions.is_empty());
        let (secret, _) = sessions.create("browser", "ab", 1_000);
        clock.set_offset_ms(1_000);
        assert!(sessions.lookup(&secret, ["ab"].into_iter()).is_none());
        assert!(sessions.is_empty());
    }
}
