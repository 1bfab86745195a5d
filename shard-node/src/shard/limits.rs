//! The per-tenant create rate: a token bucket per tenant, refilled at `rate` per second up to
//! `burst`. Pure (the caller passes the shard's clock) and owned by the shard loop, the only
//! place a tenant's creates pass, so one bucket per tenant holds cluster-wide whichever replica
//! took the request. It must not read the store: the job quota is counted there, by the caller.

use std::collections::HashMap;

/// Buckets kept before full ones are dropped (a full bucket is the same as none).
const KEEP: usize = 10_000;

#[derive(Debug, Default)]
pub struct CreateRate {
    buckets: HashMap<String, Bucket>,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Tokens left, in thousandths (integer arithmetic: no drift between replicas of a test).
    milli: u64,
    /// When it was last refilled, shard milliseconds.
    at: i64,
}

impl CreateRate {
    /// Takes one create of `tenant` at `now`, or says in how many milliseconds one would fit.
    /// A `rate` of 0 means no limit.
    pub fn admit(&mut self, tenant: &str, now: i64, rate: u32, burst: u32) -> Result<(), u64> {
        if rate == 0 {
            return Ok(());
        }
        let full = u64::from(burst.max(1)) * 1000;
        if self.buckets.len() >= KEEP && !self.buckets.contains_key(tenant) {
            self.forget_full(now, rate, full);
        }
        let b = self.buckets.entry(tenant.to_string()).or_insert(Bucket {
            milli: full,
            at: now,
        });
        refill(b, now, rate, full);
        if b.milli >= 1000 {
            b.milli -= 1000;
            return Ok(());
        }
        // Each millisecond brings `rate` thousandths.
        let missing = 1000 - b.milli;
        Err(missing.div_ceil(u64::from(rate)))
    }

    /// Gives back the create `admit` took from `tenant` for a create refused after all (its job
    /// quota was full), so a refused create costs no token.
    pub fn give_back(&mut self, tenant: &str, burst: u32) {
        let full = u64::from(burst.max(1)) * 1000;
        if let Some(b) = self.buckets.get_mut(tenant) {
            b.milli = (b.milli + 1000).min(full);
        }
    }

    fn forget_full(&mut self, now: i64, rate: u32, full: u64) {
        self.buckets.retain(|_, b| {
            refill(b, now, rate, full);
            b.milli < full
        });
    }
}

fn refill(b: &mut Bucket, now: i64, rate: u32, full: u64) {
    let elapsed = now.saturating_sub(b.at).max(0) as u64;
    b.milli = b
        .milli
        .saturating_add(elapsed.saturating_mul(u64::from(rate)))
        .min(full);
    b.at = b.at.max(now);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_create_given_back_can_be_taken_again() {
        let mut r = CreateRate::default();
        assert_eq!(r.admit("a", 0, 1, 1), Ok(()));
        assert_eq!(r.admit("a", 0, 1, 1), Err(1000));
        r.give_back("a", 1);
        assert_eq!(r.admit("a", 0, 1, 1), Ok(()));
        // Never beyond the burst, and nothing for a tenant never seen.
        r.give_back("a", 1);
        r.give_back("a", 1);
        r.give_back("b", 1);
        assert_eq!(r.admit("a", 0, 1, 1), Ok(()));
        assert_eq!(r.admit("a", 0, 1, 1), Err(1000));
    }

    #[test]
    fn a_burst_passes_then_the_rate_holds_and_says_when_to_retry() {
        let mut r = CreateRate::default();
        for _ in 0..3 {
            assert_eq!(r.admit("a", 0, 10, 3), Ok(()));
        }
        // Empty: one token every 100 ms at 10/s.
        assert_eq!(r.admit("a", 0, 10, 3), Err(100));
        assert_eq!(r.admit("a", 40, 10, 3), Err(60));
        assert_eq!(r.admit("a", 100, 10, 3), Ok(()));
        // Another tenant has its own bucket; no rate is no limit.
        assert_eq!(r.admit("b", 100, 10, 3), Ok(()));
        for _ in 0..1000 {
            assert_eq!(r.admit("a", 100, 0, 3), Ok(()));
        }
    }

    #[test]
    fn a_clock_going_back_gives_nothing_and_takes_nothing() {
        let mut r = CreateRate::default();
        assert_eq!(r.admit("a", 1_000, 1, 1), Ok(()));
        assert!(r.admit("a", 500, 1, 1).is_err());
        assert_eq!(r.admit("a", 2_000, 1, 1), Ok(()));
    }

    #[test]
    fn full_buckets_are_forgotten_when_there_are_many() {
        let mut r = CreateRate::default();
        for i in 0..KEEP {
            r.admit(&format!("t{i}"), 0, 1000, 1).unwrap();
        }
        assert_eq!(r.buckets.len(), KEEP);
        // A second later every bucket is full again: all go but the new one.
        r.admit("new", 1_000, 1000, 1).unwrap();
        assert_eq!(r.buckets.len(), 1);
    }

    proptest! {
        /// Over any window, no more than `burst + rate × seconds` creates pass, and a refused
        /// create passes once the wait it was told has gone by.
        #[test]
        fn never_more_than_the_burst_and_the_rate(
            rate in 1u32..200,
            burst in 1u32..50,
            gaps in proptest::collection::vec(0i64..50, 1..400),
        ) {
            let mut r = CreateRate::default();
            let (mut now, mut passed) = (0i64, 0u64);
            for gap in gaps {
                now += gap;
                match r.admit("t", now, rate, burst) {
                    Ok(()) => passed += 1,
                    Err(wait) => {
                        prop_assert!(wait >= 1);
                        let mut later = CreateRate { buckets: r.buckets.clone() };
                        prop_assert_eq!(later.admit("t", now + wait as i64, rate, burst), Ok(()));
                    }
                }
                let allowed = u64::from(burst) + (now as u64 * u64::from(rate)) / 1000;
                prop_assert!(passed <= allowed, "{} passed, {} allowed at {}", passed, allowed, now);
            }
        }
    }
}
