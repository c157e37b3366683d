//! The wire shapes the server and the client share (SPEC sections 4, 5, 6
//! and 10): request and answer bodies ([`bodies`]), the problem+json body
//! and its codes ([`problem`]), what `/api/events` sends ([`events`]), the header names, and the clock window of
//! message ids with the client's reuse margin derived from it.
//!
//! A shape lives here once: the server (`spark-engine`, `src/api/*`) reads
//! and writes these types, the client (`spark-client`) writes and reads the
//! same ones. Member names, `null` handling and member order are the wire
//! contract; changing one changes what every client sees.

pub mod bodies;
pub mod events;
pub mod problem;

/// `X-Moment-Id`: the moment an upload belongs to, on
/// `PUT /api/media/{media id}` (SPEC section 4). Lower case, as sent.
pub const HEADER_MOMENT_ID: &str = "x-moment-id";

/// `X-Media-Role`: [`MEDIA_ROLE_COPY`] or [`MEDIA_ROLE_ORIGINAL`], on
/// `PUT /api/media/{media id}` (SPEC section 4).
pub const HEADER_MEDIA_ROLE: &str = "x-media-role";

/// `X-Photo`: which photo of its moment an upload is, a decimal from 0 to
/// [`PHOTOS_PER_MOMENT`] - 1, optional on `PUT /api/media/{media id}` (0
/// when absent; issue 27: several photos per moment, each with one copy
/// and one original).
pub const HEADER_PHOTO: &str = "x-photo";

/// How many photos a moment holds at most (issue 27): `X-Photo` runs from 0
/// to this minus one.
pub const PHOTOS_PER_MOMENT: u8 = 10;

/// Why `photo` is no photo of a moment (at or past [`PHOTOS_PER_MOMENT`]),
/// or `None`: the one rule admission and the fold both check.
pub fn photo_out_of_range(photo: u8) -> Option<String> {
    (photo >= PHOTOS_PER_MOMENT).then(|| {
        format!(
            "photo {photo} is past the last photo a moment holds ({})",
            PHOTOS_PER_MOMENT - 1
        )
    })
}

/// `X-Content-SHA256`: the SHA-256 of an upload's bytes as 64 hex
/// characters, optional on `PUT /api/media/{media id}`; the server refuses
/// bytes that hash otherwise (`400 digest_mismatch`).
pub const HEADER_CONTENT_SHA256: &str = "x-content-sha256";

/// `Idempotency-Key`: a write's request id, as an alternative to the body's
/// `client_request_id` (SPEC section 2); both sent must be equal.
pub const HEADER_IDEMPOTENCY_KEY: &str = "idempotency-key";

/// `Idempotent-Replayed: true`: on an answer from a known identity
/// (`created: false`), a replay of a write the engine already made (issue
/// 19, after the IETF httpapi idempotency-key draft).
pub const HEADER_IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// `Spark-Limit-Clamped`: a list route's `limit` was above the maximum; the
/// value is the page size used instead (SPEC section 10).
pub const HEADER_LIMIT_CLAMPED: &str = "spark-limit-clamped";

/// `X-Spark-Client`: sent by the browser client on every request (SPEC
/// section 12). A cross-site form cannot send it and a cross-site script
/// cannot without a CORS preflight the engine never grants, so a write
/// authenticated by the session cookie is taken only with it or with a
/// same-origin `Origin`.
pub const HEADER_CLIENT: &str = "x-spark-client";

/// The name of the session cookie that `POST /api/session` sets in
/// exchange for a bearer token (SPEC section 12): `HttpOnly`,
/// `SameSite=Strict`, `Secure` behind TLS.
pub const SESSION_COOKIE: &str = "spark_session";

/// `X-Media-Role` of the small copy the brain reads.
pub const MEDIA_ROLE_COPY: &str = "copy";

/// `X-Media-Role` of the photo as taken.
pub const MEDIA_ROLE_ORIGINAL: &str = "original";

/// The `mode` of a practical reading on `POST /api/moments/{id}/turns`, the
/// only mode that route starts (recall turns start with `POST /api/recall`).
pub const TURN_MODE_PRACTICAL: &str = "practical";

/// The clock window of ids minted at send time (SPEC section 5, seed
/// ADR-036), in milliseconds: 5 minutes either way, inclusive. The server
/// refuses a new message whose id's time is farther than this from its
/// clock ([`crate::rules::messages::check_clock_window`]); it is on the wire
/// because the client's reuse margin is derived from it.
pub const CLOCK_WINDOW_MS: u64 = 5 * 60 * 1000;

/// What the client keeps back from [`CLOCK_WINDOW_MS`] when it decides to
/// reuse a message id, in milliseconds: 1 minute for encryption, the
/// client's queue and the network (SPEC section 6).
pub const REUSE_SLACK_MS: u64 = 60 * 1000;

/// The client's reuse margin (SPEC section 6): a retry reuses a message's
/// ULID while the id's time is at most this far from the client clock, in
/// milliseconds; past it a fresh ULID is minted. 4 minutes:
/// [`CLOCK_WINDOW_MS`] less [`REUSE_SLACK_MS`].
pub const REUSE_MARGIN_MS: u64 = CLOCK_WINDOW_MS - REUSE_SLACK_MS;

const _: () = assert!(REUSE_MARGIN_MS > 0 && REUSE_MARGIN_MS < CLOCK_WINDOW_MS);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reuse_margin_is_four_minutes_under_a_five_minute_window() {
        assert_eq!(CLOCK_WINDOW_MS, 300_000);
        assert_eq!(REUSE_MARGIN_MS, 240_000);
    }
}
