//! Wall-clock time, injected so that tests and the pure cores can run on a clock of their choosing.

use std::{sync::Arc, time::Duration};

/// Milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;

    /// Microseconds since the Unix epoch, for waits that must end at a given millisecond (a
    /// wait computed from `now_ms` alone ends up to a millisecond late: the part of the current
    /// millisecond already gone) and for lateness finer than a millisecond (the fire metrics).
    /// A clock without finer time may keep this default.
    fn now_us(&self) -> i64 {
        self.now_ms() * 1000
    }

    /// How long from now until millisecond `at` begins, to the microsecond (zero once it has).
    fn until(&self, at: i64) -> Duration {
        let wait_us = at.saturating_mul(1000).saturating_sub(self.now_us());
        Duration::from_micros(wait_us.max(0) as u64)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock standing at a given microsecond.
    struct At(i64);

    impl Clock for At {
        fn now_ms(&self) -> i64 {
            self.0.div_euclid(1000)
        }

        fn now_us(&self) -> i64 {
            self.0
        }
    }

    #[test]
    fn until_counts_the_part_of_the_millisecond_already_gone() {
        assert_eq!(At(5_250).until(6), Duration::from_micros(750));
        assert_eq!(At(5_000).until(5), Duration::ZERO);
        assert_eq!(
            At(5_250).until(5),
            Duration::ZERO,
            "a millisecond begun is not waited for"
        );
        assert_eq!(
            At(0).until(i64::MAX),
            Duration::from_micros(i64::MAX as u64)
        );
    }
}
