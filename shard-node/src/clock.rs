//! Wall-clock time, injected so that tests and the pure cores can run on a clock of their choosing.

use std::sync::Arc;

/// Milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;

    /// Microseconds since the Unix epoch, for waits that must end at a given millisecond: a
    /// wait computed from `now_ms` alone ends up to a millisecond late (the part of the current
    /// millisecond already gone). A clock without finer time may keep this default.
    fn now_us(&self) -> i64 {
        self.now_ms() * 1000
    }
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        chrono::Utc::now().timestamp_millis()
    }

    fn now_us(&self) -> i64 {
        chrono::Utc::now().timestamp_micros()
    }
}

pub type SharedClock = Arc<dyn Clock>;
