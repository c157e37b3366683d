//! The one place that knows the payload encoding: bincode 2.0.1 through
//! serde, standard configuration (little-endian, variable-length integers).
//!
//! Kept behind these two functions so that a bincode-compatible successor is
//! a one-file change (DESIGN.md, "The log"); the committed op vectors in
//! `tests/durability/op_vectors.rs` guard the bytes.

use serde::{de::DeserializeOwned, Serialize};

/// Why a payload did not decode: the bytes are not a valid encoding of the
/// expected type, or bytes are left over after it.
#[derive(Debug, thiserror::Error)]
#[error("payload does not decode: {0}")]
pub struct CodecError(pub String);

/// Most bytes a decode may claim for one value: above the largest record
/// (4 MiB by default), so a damaged length prefix can never make a decode
/// allocate more than this.
pub const DECODE_LIMIT_BYTES: usize = 16 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_LIMIT_BYTES>()
}

/// Encodes `value` into a fresh byte vector.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    bincode::serde::encode_to_vec(value, config()).map_err(|e| CodecError(e.to_string()))
}

/// Decodes a whole payload; trailing bytes are an error, so a payload can
/// never be read as a shorter value of another shape by accident.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (value, used) = bincode::serde::decode_from_slice(bytes, config())
        .map_err(|e| CodecError(e.to_string()))?;
    if used != bytes.len() {
        return Err(CodecError(format!(
            "{} trailing bytes after the value",
            bytes.len() - used
        )));
    }
    Ok(value)
}
