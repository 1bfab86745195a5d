//! The per-queue start rate: a token bucket with the clock passed in (pure), and its async use.
//! It limits how many tickets a worker starts per second; concurrency is a semaphore elsewhere.

use std::time::Duration;

use tokio::time::Instant;

/// Up to `burst` tokens, refilled at `rate` per second; one token starts one ticket.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket holding one second's worth of tokens (at least one).
    pub fn new(rate_per_second: f64, now: Instant) -> TokenBucket {
        let rate = rate_per_second.max(1e-6);
        let burst = rate.max(1.0);
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes between 1 and `want` tokens, as many as there are, or says how long until one is.
    pub fn take(&mut self, want: usize, now: Instant) -> Result<usize, Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = now;
        if self.tokens < 1.0 {
            return Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate));
        }
        let n = (self.tokens.floor() as usize).min(want.max(1));
        self.tokens -= n as f64;
        Ok(n)
    }

    /// Waits for at least one token; returns how many (≤ `want`) were taken.
    pub async fn acquire(&mut self, want: usize) -> usize {
        loop {
            match self.take(want, Instant::now()) {
                Ok(n) => return n,
                // Rate limiting is waiting by design, not synchronisation.
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_full_bucket_gives_a_second_then_waits() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, t0);
        assert_eq!(b.take(4, t0), Ok(4));
        assert_eq!(b.take(100, t0), Ok(6));
        let wait = b.take(1, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        assert_eq!(b.take(5, t0 + Duration::from_millis(250)), Ok(2));
    }

    #[test]
    fn a_slow_rate_gives_one_token_at_a_time() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(0.5, t0);
        assert_eq!(b.take(8, t0), Ok(1));
        let wait = b.take(1, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 2.0).abs() < 1e-9, "{wait:?}");
        assert_eq!(b.take(8, t0 + Duration::from_secs(2)), Ok(1));
    }

    proptest! {
        /// Over any sequence of requests, no more than `burst + rate · elapsed` tokens are given.
        #[test]
        fn never_more_than_the_rate_allows(
            rate in 0.5f64..5000.0,
            steps in prop::collection::vec((0u64..50_000, 1usize..300), 1..200),
        ) {
            let t0 = Instant::now();
            let mut b = TokenBucket::new(rate, t0);
            let (mut now, mut given) = (t0, 0usize);
            for (advance_us, want) in steps {
                now += Duration::from_micros(advance_us);
                if let Ok(n) = b.take(want, now) {
                    prop_assert!(n >= 1 && n <= want);
                    given += n;
                }
                let allowed = rate.max(1.0) + rate * (now - t0).as_secs_f64();
                prop_assert!(given as f64 <= allowed + 1e-6, "{given} > {allowed}");
            }
        }
    }
}
