//! Identity: ULIDs, request ids and the ids derived from them, with their
//! caps (SPEC section 2).
//!
//! Entity ids are ULIDs: 26 characters of Crockford base32 without I, L, O
//! or U. Input is case-insensitive, output is canonical upper case, and the
//! value is kept as a `u128` so that the mirror and the log stay compact.
//! Request ids (`client_request_id` or the `Idempotency-Key` header) are 1 to
//! 80 bytes of printable ASCII without spaces (0x21..=0x7E).

use std::fmt;

/// Crockford base32 alphabet, as written in canonical (upper-case) output.
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// Length of a ULID in characters.
pub const ULID_LEN: usize = 26;

/// Longest request id accepted, in bytes (SPEC section 2: "1 to 80 bytes").
pub const REQUEST_ID_MAX_BYTES: usize = 80;

/// A ULID held as its 128-bit value: 48 bits of Unix milliseconds, then 80
/// random bits. `Display` writes the canonical 26-character upper-case form.
///
/// Aligned to 8 bytes, not the 16 of a bare `u128` on x86-64: every
/// struct and enum that holds an id (a moment, a request index row, an
/// op) would otherwise pad to a multiple of 16 bytes, paid per record in a
/// big mirror. Read the value by copy (`id.0`); a reference to the field is
/// not allowed in a packed struct.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
#[repr(Rust, packed(8))]
pub struct Id(pub u128);

impl Id {
    /// Parses a ULID, case-insensitively. Errors with [`IdError`] on any
    /// length other than 26, a character outside Crockford base32 (I, L, O
    /// and U included), or a first character above `7` (the value would not
    /// fit 128 bits).
    pub fn parse(text: &str) -> Result<Id, IdError> {
        let bytes = text.as_bytes();
        if bytes.len() != ULID_LEN {
            return Err(IdError(format!(
                "a ULID is {ULID_LEN} ASCII characters, this one is {} bytes",
                bytes.len()
            )));
        }
        let mut value: u128 = 0;
        for (index, &byte) in bytes.iter().enumerate() {
            let digit = decode_digit(byte).ok_or_else(|| {
                IdError(format!(
                    "character {} ({:?}) is not Crockford base32 (0-9, A-Z without I, L, O, U)",
                    index + 1,
                    char::from(byte)
                ))
            })?;
            if index == 0 && digit > 7 {
                return Err(IdError(
                    "a ULID starts with 0-7 (it must fit 128 bits)".into(),
                ));
            }
            value = (value << 5) | u128::from(digit);
        }
        Ok(Id(value))
    }

    /// Builds an id from a time in Unix milliseconds (the low 48 bits are
    /// used) and 80 random bits (the low 80 bits of `random` are used).
    pub fn from_parts(time_ms: u64, random: u128) -> Id {
        let time = u128::from(time_ms & 0xFFFF_FFFF_FFFF);
        Id((time << 80) | (random & ((1u128 << 80) - 1)))
    }

    /// The time part of the ULID, in Unix milliseconds.
    pub fn time_ms(self) -> u64 {
        // The shift leaves 48 bits, which always fit a u64.
        (self.0 >> 80) as u64
    }

    /// Writes the canonical 26-character form into `out`.
    pub fn encode(self, out: &mut [u8; ULID_LEN]) {
        let mut value = self.0;
        for slot in out.iter_mut().rev() {
            // `value & 31` is below 32, a valid index into the alphabet.
            *slot = CROCKFORD[(value & 31) as usize];
            value >>= 5;
        }
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = [0u8; ULID_LEN];
        self.encode(&mut out);
        // The alphabet is ASCII, so the buffer is valid UTF-8.
        f.write_str(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
    }
}

/// Human-readable formats (JSON) carry the canonical 26-character string;
/// binary formats (the log's bincode payloads) carry the `u128`, 16 bytes
/// or fewer.
impl serde::Serialize for Id {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            // The same string `Display` writes, without the formatting
            // machinery (`collect_str` goes through `fmt::write`).
            let mut out = [0u8; ULID_LEN];
            self.encode(&mut out);
            let text = std::str::from_utf8(&out).map_err(serde::ser::Error::custom)?;
            serializer.serialize_str(text)
        } else {
            serializer.serialize_u128(self.0)
        }
    }
}

impl<'de> serde::Deserialize<'de> for Id {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Id, D::Error> {
        if deserializer.is_human_readable() {
            let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
            Id::parse(&text).map_err(serde::de::Error::custom)
        } else {
            u128::deserialize(deserializer).map(Id)
        }
    }
}

fn decode_digit(byte: u8) -> Option<u8> {
    let upper = byte.to_ascii_uppercase();
    CROCKFORD
        .iter()
        .position(|&c| c == upper)
        // The alphabet has 32 entries, so the position fits a u8.
        .map(|p| p as u8)
}

/// Why a text is not a ULID; maps to `400 invalid_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdError(pub String);

impl fmt::Display for IdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a request id is refused (SPEC section 2 and 10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestIdError {
    /// Longer than [`REQUEST_ID_MAX_BYTES`] (or the route's own cap, for
    /// ids that derive others); maps to `400 request_id_too_long`.
    TooLong {
        /// Length of the refused id, in bytes.
        len_bytes: usize,
        /// The cap it broke, in bytes.
        max_bytes: usize,
    },
    /// Empty, or a byte outside 0x21..=0x7E; maps to `400 invalid_request`.
    Invalid(String),
}

impl fmt::Display for RequestIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestIdError::TooLong {
                len_bytes,
                max_bytes,
            } => write!(
                f,
                "request id is {len_bytes} bytes; the limit is {max_bytes} bytes"
            ),
            RequestIdError::Invalid(why) => f.write_str(why),
        }
    }
}

/// Checks a request id against SPEC section 2 with the cap `max_bytes`
/// ([`REQUEST_ID_MAX_BYTES`] for plain request ids; [`check_recall_id`] and
/// [`check_job_id`] for ids that derive others).
pub fn check_request_id(value: &str, max_bytes: usize) -> Result<(), RequestIdError> {
    if value.is_empty() {
        return Err(RequestIdError::Invalid("request id is empty".into()));
    }
    if value.len() > max_bytes {
        return Err(RequestIdError::TooLong {
            len_bytes: value.len(),
            max_bytes,
        });
    }
    if let Some(pos) = value.bytes().position(|b| !(0x21..=0x7E).contains(&b)) {
        return Err(RequestIdError::Invalid(format!(
            "request id byte {} is outside printable ASCII without spaces (0x21..=0x7E)",
            pos + 1
        )));
    }
    Ok(())
}

/// Longest recall id, in bytes (SPEC section 2): its turn's request id
/// `<recall id>:turn` ([`recall_turn_request_id`]) stays within
/// [`REQUEST_ID_MAX_BYTES`].
pub const RECALL_ID_MAX_BYTES: usize = 70;

/// Longest job id, in bytes (SPEC section 2): its turns' request ids
/// `<job id>:<index>` ([`job_turn_request_id`]) stay within
/// [`REQUEST_ID_MAX_BYTES`] for any index of at most
/// [`JOB_SEAT_INDEX_MAX_DIGITS`] digits.
pub const JOB_ID_MAX_BYTES: usize = 64;

/// Most decimal digits of a seat index in a job turn's request id.
pub const JOB_SEAT_INDEX_MAX_DIGITS: usize = 15;

/// The suffix of a recall's turn request id.
pub const RECALL_TURN_SUFFIX: &str = ":turn";

/// The prefix of a mark id: a kept phrase's id is `keep:<normalised phrase>`
/// (SPEC section 4). A mark id is not a request id: no 80-byte ceiling.
pub const MARK_ID_PREFIX: &str = "keep:";

// Every derived request id fits the ceiling (SPEC section 2), checked when
// this crate compiles.
const _: () = assert!(RECALL_ID_MAX_BYTES + RECALL_TURN_SUFFIX.len() <= REQUEST_ID_MAX_BYTES);
const _: () = assert!(JOB_ID_MAX_BYTES + 1 + JOB_SEAT_INDEX_MAX_DIGITS <= REQUEST_ID_MAX_BYTES);

/// The request id of a recall's turn: `<recall id>:turn` (SPEC section 2).
pub fn recall_turn_request_id(recall_id: &str) -> String {
    format!("{recall_id}{RECALL_TURN_SUFFIX}")
}

/// The request id of a job's turn for seat `index`: `<job id>:<index>`
/// (SPEC section 2).
pub fn job_turn_request_id(job_id: &str, index: usize) -> String {
    format!("{job_id}:{index}")
}

/// The mark id of a normalised phrase: `keep:<phrase>` (SPEC section 4).
pub fn mark_id(phrase: &str) -> String {
    format!("{MARK_ID_PREFIX}{phrase}")
}

/// The phrase of a mark id, `None` when the text is not `keep:<phrase>`.
pub fn mark_phrase(mark_id: &str) -> Option<&str> {
    mark_id.strip_prefix(MARK_ID_PREFIX)
}

/// Checks a recall id: a request id of at most [`RECALL_ID_MAX_BYTES`].
pub fn check_recall_id(value: &str) -> Result<(), RequestIdError> {
    check_request_id(value, RECALL_ID_MAX_BYTES)
}

/// Checks a job id: a request id of at most [`JOB_ID_MAX_BYTES`].
pub fn check_job_id(value: &str) -> Result<(), RequestIdError> {
    check_request_id(value, JOB_ID_MAX_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_16_bytes_aligned_to_8() {
        // A u128 would align every struct holding an id to 16.
        assert_eq!(std::mem::size_of::<Id>(), 16);
        assert_eq!(std::mem::align_of::<Id>(), 8);
    }

    #[test]
    fn round_trips_and_is_case_insensitive() {
        let upper = "01M34QZRVNRE3CTR9Y63CF2TPZ";
        let id = Id::parse(upper).unwrap();
        assert_eq!(id.to_string(), upper);
        assert_eq!(Id::parse(&upper.to_lowercase()).unwrap(), id);
    }

    #[test]
    fn refuses_what_is_not_a_ulid() {
        for bad in [
            "",
            "not-a-ulid",
            "01M34QZRVNRE3CTR9Y63CF2TP",
            "01M34QZRVNRE3CTR9Y63CF2TPZZ",
            "01M34QZRVNRE3CTR9Y63CF2TPI",
            "01M34QZRVNRE3CTR9Y63CF2TPL",
            "01M34QZRVNRE3CTR9Y63CF2TPO",
            "01M34QZRVNRE3CTR9Y63CF2TPU",
            "81M34QZRVNRE3CTR9Y63CF2TPZ",
            "01M34QZRVNRE3CTR9Y63CF2TPé",
        ] {
            assert!(Id::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn time_part_round_trips() {
        let id = Id::from_parts(1_767_225_600_000, 12345);
        assert_eq!(id.time_ms(), 1_767_225_600_000);
        assert_eq!(Id::parse(&id.to_string()).unwrap(), id);
    }

    #[test]
    fn request_id_rules() {
        assert!(check_request_id(&"x".repeat(80), 80).is_ok());
        assert!(matches!(
            check_request_id(&"x".repeat(81), 80),
            Err(RequestIdError::TooLong {
                len_bytes: 81,
                max_bytes: 80
            })
        ));
        assert!(matches!(
            check_request_id("", 80),
            Err(RequestIdError::Invalid(_))
        ));
        assert!(matches!(
            check_request_id("has space", 80),
            Err(RequestIdError::Invalid(_))
        ));
        assert!(matches!(
            check_request_id("tab\t", 80),
            Err(RequestIdError::Invalid(_))
        ));
        assert!(matches!(
            check_request_id("é", 80),
            Err(RequestIdError::Invalid(_))
        ));
    }
}
