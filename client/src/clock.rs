//! The client's clock: the time it mints ids with and the waits between
//! passes. Injectable, so tests can skew the phone's clock and skip the
//! waits.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;

/// What the client reads the time from and waits with.
pub trait ClientClock: Send + Sync {
    /// Now, in Unix milliseconds, as this device believes it.
    fn now_ms(&self) -> u64;
    /// Waits `duration` (a drain's backoff or `Retry-After`).
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()>;
}

/// The machine's wall clock in Unix milliseconds (a clock before 1970
/// reads as 0 rather than failing).
fn wall_clock_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The machine's wall clock, waiting with `tokio::time::sleep`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClientClock;

impl ClientClock for SystemClientClock {
    fn now_ms(&self) -> u64 {
        wall_clock_ms()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// The wall clock shifted by an adjustable offset (a phone whose clock is
/// behind or ahead), waiting for real.
#[derive(Debug, Default, Clone)]
pub struct SkewedClientClock {
    offset_ms: Arc<AtomicI64>,
}

impl SkewedClientClock {
    /// A clock `offset_ms` milliseconds off the wall clock (negative:
    /// behind).
    pub fn new(offset_ms: i64) -> Self {
        let clock = SkewedClientClock::default();
        clock.set_offset_ms(offset_ms);
        clock
    }

    /// Sets the offset from the wall clock, in milliseconds.
    pub fn set_offset_ms(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::SeqCst);
    }
}

impl ClientClock for SkewedClientClock {
    fn now_ms(&self) -> u64 {
        wall_clock_ms().saturating_add_signed(self.offset_ms.load(Ordering::SeqCst))
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// A clock that moves only when told to: `sleep` returns at once and moves
/// the time forward by the duration, and every wait is recorded. For
/// tests. Clones share the time and the record.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    /// The time in Unix microseconds: waits carry microseconds of jitter,
    /// and a clock that dropped them would run behind the waits it made.
    now_us: Arc<AtomicU64>,
    sleeps: Arc<Mutex<Vec<Duration>>>,
}

impl ManualClock {
    /// A clock reading `now_ms`.
    pub fn at(now_ms: u64) -> Self {
        let clock = ManualClock::default();
        clock.set_ms(now_ms);
        clock
    }

    /// Sets the time, in Unix milliseconds.
    pub fn set_ms(&self, now_ms: u64) {
        self.now_us
            .store(now_ms.saturating_mul(1000), Ordering::SeqCst);
    }

    /// Moves the time forward.
    pub fn advance(&self, by: Duration) {
        let us = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.now_us.fetch_add(us, Ordering::SeqCst);
    }

    /// Every wait asked for so far, in order.
    pub fn sleeps(&self) -> Vec<Duration> {
        self.sleeps.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl ClientClock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_us.load(Ordering::SeqCst) / 1000
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        if let Ok(mut sleeps) = self.sleeps.lock() {
            sleeps.push(duration);
        }
        self.advance(duration);
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manual_clock_moves_on_sleep() {
        let clock = ManualClock::at(1_000);
        clock.sleep(Duration::from_millis(250)).await;
        clock.advance(Duration::from_secs(1));
        assert_eq!(clock.now_ms(), 2_250);
        assert_eq!(clock.sleeps(), vec![Duration::from_millis(250)]);
    }

    #[test]
    fn skewed_clock_is_behind() {
        let clock = SkewedClientClock::new(-120_000);
        let diff = wall_clock_ms() as i64 - clock.now_ms() as i64;
        assert!((119_000..=121_000).contains(&diff), "{diff}");
    }
}
