//! The server clock, injectable so tests can move time.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current time in Unix milliseconds. The fold never reads
/// a clock: time enters only through the ops the sequencer stamps.
pub trait Clock: Send + Sync + 'static {
    /// Now, in Unix milliseconds.
    fn now_ms(&self) -> u64;
}

/// The machine's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            // A clock before 1970 reads as 0 rather than failing.
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// The wall clock shifted by an adjustable offset, for tests that skew the
/// server's time.
#[derive(Debug, Default, Clone)]
pub struct OffsetClock {
    /// Milliseconds added to the wall clock (may be negative).
    pub offset_ms: Arc<AtomicI64>,
}

impl OffsetClock {
    /// Sets the offset added to the wall clock, in milliseconds.
    pub fn set_offset_ms(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::SeqCst);
    }
}

impl Clock for OffsetClock {
    fn now_ms(&self) -> u64 {
        let now = SystemClock.now_ms();
        now.saturating_add_signed(self.offset_ms.load(Ordering::SeqCst))
    }
}
