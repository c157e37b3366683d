//! RFC 3339 times on the wire, Unix milliseconds inside.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Why a text is not a time [`parse_rfc3339_ms`] accepts. Its `Display` is
/// a sentence for a problem body (`400 invalid_request`) or a tool's usage
/// error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// The text is not an RFC 3339 date-time; `reason` is the parser's.
    #[error("{text:?} is not an RFC 3339 time: {reason}")]
    NotRfc3339 {
        /// The text as given.
        text: String,
        /// What the RFC 3339 parser found wrong.
        reason: String,
    },
    /// The time is RFC 3339 but its Unix milliseconds do not fit an `i64`.
    #[error("{text:?} is out of range")]
    OutOfRange {
        /// The text as given.
        text: String,
    },
}

/// Parses an RFC 3339 time (any offset) into Unix milliseconds.
///
/// # Errors
/// [`TimeError`] when the text is not RFC 3339 or is out of range.
pub fn parse_rfc3339_ms(text: &str) -> Result<i64, TimeError> {
    let parsed = OffsetDateTime::parse(text, &Rfc3339).map_err(|e| TimeError::NotRfc3339 {
        text: text.to_owned(),
        reason: e.to_string(),
    })?;
    let ms = parsed.unix_timestamp_nanos() / 1_000_000;
    i64::try_from(ms).map_err(|_| TimeError::OutOfRange {
        text: text.to_owned(),
    })
}

/// Formats Unix milliseconds as RFC 3339 UTC (`Z`), with milliseconds only
/// when they are not zero. Out-of-range values clamp to the Unix epoch.
pub fn format_rfc3339_ms(ms: i64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    let at = OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let text = at
        .format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into());
    if ms.rem_euclid(1000) == 0 {
        text
    } else {
        // `Rfc3339` prints the sub-second digits it has; keep three.
        let millis = ms.rem_euclid(1000);
        let base = &text[..19];
        format!("{base}.{millis:03}Z")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let ms = parse_rfc3339_ms("2026-09-01T00:00:00Z").unwrap();
        assert_eq!(format_rfc3339_ms(ms), "2026-09-01T00:00:00Z");
        let ms = parse_rfc3339_ms("2026-09-01T02:00:00.250+02:00").unwrap();
        assert_eq!(format_rfc3339_ms(ms), "2026-09-01T00:00:00.250Z");
        assert!(matches!(
            parse_rfc3339_ms("yesterday"),
            Err(TimeError::NotRfc3339 { .. })
        ));
    }
}
