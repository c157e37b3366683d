//! The `Host` check against DNS rebinding (SPEC section 9). Without
//! tokens the engine answers anyone who reaches its loopback socket, and the
//! `Origin` check ([`super::session::refuse_cross_site`]) compares `Origin`
//! with `Host`: a hostile name made to resolve to 127.0.0.1 sends a
//! matching pair, and its page could read and write the engine. Such a
//! request names the hostile name in `Host`, so with no token configured a
//! `Host` that is neither a loopback name or address nor one of
//! `access.allowed_hosts` is refused before any route runs.

use spark_core::wire::problem as wire;
use warp::http::{header, HeaderMap, StatusCode};

use super::ApiError;
use crate::config::Settings;

/// Refuses, with no token configured, a request whose `Host` is not
/// loopback ([`is_loopback_host`]) nor one of `access.allowed_hosts`
/// (compared without the port and without regard to case): `403
/// host_not_allowed` naming the host and the setting. A request without
/// `Host` passes (browsers always send one; DNS rebinding needs a
/// browser). With tokens every request passes here: the token is what
/// keeps another site's page out, and it cannot send one. Two `Host`
/// lines with different values are `400 invalid_request`, tokens or not.
pub fn refuse_foreign_host(settings: &Settings, headers: &HeaderMap) -> Result<(), ApiError> {
    // RFC 9112 section 3.2: more than one Host is a 400, tokens or not
    // (the same value repeated is taken as one, as for the other
    // single-value headers).
    let mut hosts = headers.get_all(header::HOST).iter();
    if let Some(first) = hosts.next() {
        if hosts.any(|other| !other.as_bytes().eq_ignore_ascii_case(first.as_bytes())) {
            return Err(ApiError::invalid_request(
                "the Host header is sent more than once with different values; a request \
                 names one host",
            ));
        }
    }
    if !settings.access.tokens.is_empty() {
        return Ok(());
    }
    let Some(value) = headers.get(header::HOST) else {
        return Ok(());
    };
    let refused =
        |detail: String| ApiError::new(StatusCode::FORBIDDEN, wire::HOST_NOT_ALLOWED, detail);
    let Ok(text) = value.to_str() else {
        return Err(refused("the Host header is not visible ASCII".to_owned()));
    };
    let host = host_name(text);
    let allowed = settings
        .access
        .allowed_hosts
        .iter()
        .any(|a| host_name(a).eq_ignore_ascii_case(host));
    if is_loopback_host(host) || allowed {
        return Ok(());
    }
    Err(refused(format!(
        "Host {text:?} is not a loopback name or address: with no access token the engine \
         answers only requests addressed to it by a loopback name (localhost, 127.0.0.1, \
         [::1]) or one listed in access.allowed_hosts; a page of another site can make its \
         own name resolve to this machine (DNS rebinding). Add the name to \
         access.allowed_hosts, or configure a token"
    )))
}

/// The host of a `Host` value (or an `access.allowed_hosts` entry): the
/// port and the brackets of an IPv6 literal removed, one trailing dot
/// dropped. `example.com:8080` is `example.com`, `[::1]:8080` is `::1`.
pub fn host_name(value: &str) -> &str {
    let value = value.trim();
    let host = match value.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => value.rsplit_once(':').map_or(value, |(host, _port)| host),
    };
    host.strip_suffix('.').unwrap_or(host)
}

/// Whether `host` (a [`host_name`]) reaches this machine's loopback by
/// itself, whatever DNS says: `localhost` and any `*.localhost` name
/// (RFC 6761; browsers resolve them to loopback without asking DNS), and
/// loopback addresses (`127.0.0.0/8`, `::1`, `::ffff:127.x.y.z`).
pub fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost")
        || host
            .len()
            .checked_sub(".localhost".len())
            .and_then(|at| host.get(at..))
            .is_some_and(|tail| tail.eq_ignore_ascii_case(".localhost"))
    {
        return true;
    }
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_loopback() {
        for (value, host) in [
            ("localhost:8080", "localhost"),
            ("127.0.0.1", "127.0.0.1"),
            ("[::1]:9", "::1"),
            ("[::1]", "::1"),
            ("Example.COM.:80", "Example.COM"),
        ] {
            assert_eq!(host_name(value), host, "{value}");
        }
        for loopback in [
            "localhost",
            "LOCALHOST",
            "app.localhost",
            "127.0.0.1",
            "127.9.8.7",
            "::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_loopback_host(loopback), "{loopback}");
        }
        for other in [
            "evil.example",
            "localhost.evil.example",
            "xlocalhost",
            "10.0.0.1",
            "0.0.0.0",
            "::",
            "",
        ] {
            assert!(!is_loopback_host(other), "{other}");
        }
    }
}
