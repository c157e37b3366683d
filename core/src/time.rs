//! RFC 3339 times on the wire, Unix milliseconds inside.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Parses an RFC 3339 time (any offset) into Unix milliseconds. Errors with
/// a sentence for the problem body when the text is not RFC 3339.
pub fn parse_rfc3339_ms(text: &str) -> Result<i64, String> {
    let parsed = OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|e| format!("{text:?} is not an RFC 3339 time: {e}"))?;
    let ms = parsed.unix_timestamp_nanos() / 1_000_000;
    i64::try_from(ms).map_err(|_| format!("{text:?} is out of range"))
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
        assert!(parse_rfc3339_ms("yesterday").is_err());
    }
}
