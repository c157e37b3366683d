//! Replaying one record: decode it and apply it with the one fold. Startup
//! replay and every offline tool (`spark-replay verify`, `rebuild`, `dump`,
//! `stats`) call [`replay_record`], never a copy.

use spark_log_format::RecordRef;

use crate::mirror::{FoldError, Mirror};
use crate::op::{Op, OpDecodeError};

/// A record that decodes but does not fold, or does not decode.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The payload is not a known op.
    #[error(transparent)]
    Decode(#[from] OpDecodeError),
    /// The fold refused the op.
    #[error(transparent)]
    Fold(#[from] FoldError),
}

/// Decodes one record and applies it with the one fold: what startup replay
/// and the offline tools do for every record.
///
/// Errors: [`ReplayError::Decode`] when the payload is not a known op,
/// [`ReplayError::Fold`] when the fold refuses it (both name the seq).
pub fn replay_record(mirror: &mut Mirror, record: &RecordRef<'_>) -> Result<(), ReplayError> {
    mirror.apply(Op::decode(record)?)?;
    Ok(())
}
