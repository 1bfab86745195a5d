//! The retry policy of a failed attempt: whether another attempt is allowed and how long to wait
//! before it. Pure: the jitter comes from the ticket id and attempt number, not from a random
//! source, so a delay can be reproduced from the ticket alone and tests need no seed.

use std::{
    hash::{DefaultHasher, Hash, Hasher},
    time::Duration,
};

use chronoshard_wire::{Backoff, RetrySpec};
use uuid::Uuid;

/// Whether a ticket that has made `made` attempts in its current budget may make another.
pub fn allows_another(spec: &RetrySpec, made: u32) -> bool {
    made < spec.max_attempts
}

/// How long to wait after the `failed`-th attempt of a budget (1 for the first) failed.
///
/// `fixed` waits `initial` each time; `exponential` doubles from `initial` up to `max`;
/// `exponential_jitter` takes the exponential delay `d` and waits a value in `[d/2, d]` picked by
/// `jitter` ("equal jitter": a storm of failures spreads out, and no retry comes sooner than half
/// the nominal delay).
pub fn delay(spec: &RetrySpec, failed: u32, jitter: u64) -> Duration {
    let initial = spec.initial.0;
    let max = spec.max.0.max(initial);
    let exponential = || {
        let doublings = failed.saturating_sub(1).min(63);
        initial
            .checked_mul(1u32.checked_shl(doublings).unwrap_or(u32::MAX))
            .unwrap_or(max)
            .min(max)
    };
    match spec.backoff {
        Backoff::Fixed => initial,
        Backoff::Exponential => exponential(),
        Backoff::ExponentialJitter => {
            let d = exponential().as_millis() as u64;
            let half = d / 2;
            Duration::from_millis(d - half + jitter % (half + 1))
        }
    }
}

/// The jitter value of one retry: a hash of the ticket and the attempt that failed.
pub fn jitter_of(ticket: Uuid, attempt: u32) -> u64 {
    let mut h = DefaultHasher::new();
    (ticket, attempt).hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chronoshard_wire::Dur;
    use proptest::prelude::*;

    fn spec(backoff: Backoff, initial_ms: u64, max_ms: u64) -> RetrySpec {
        RetrySpec {
            max_attempts: 5,
            backoff,
            initial: Dur(Duration::from_millis(initial_ms)),
            max: Dur(Duration::from_millis(max_ms)),
        }
    }

    #[test]
    fn the_budget_counts_every_attempt_including_the_first() {
        let s = spec(Backoff::Fixed, 10, 10);
        assert!(allows_another(&s, 4));
        assert!(!allows_another(&s, 5));
        let one = RetrySpec::default();
        assert!(!allows_another(&one, 1), "default: a single attempt");
    }

    #[test]
    fn exponential_doubles_then_stops_at_max() {
        let s = spec(Backoff::Exponential, 1000, 5000);
        let got: Vec<u64> = (1..=5)
            .map(|n| delay(&s, n, 0).as_millis() as u64)
            .collect();
        assert_eq!(got, [1000, 2000, 4000, 5000, 5000]);
        assert_eq!(delay(&s, u32::MAX, 0), Duration::from_millis(5000));
    }

    proptest! {
        #[test]
        fn delays_stay_within_their_bounds(
            backoff in prop_oneof![Just(Backoff::Fixed), Just(Backoff::Exponential), Just(Backoff::ExponentialJitter)],
            initial in 1u64..100_000,
            extra in 0u64..10_000_000,
            failed in 1u32..200,
            jitter in any::<u64>(),
        ) {
            let s = spec(backoff, initial, initial + extra);
            let d = delay(&s, failed, jitter).as_millis() as u64;
            let nominal = delay(&RetrySpec { backoff: Backoff::Exponential, ..s.clone() }, failed, 0).as_millis() as u64;
            match backoff {
                Backoff::Fixed => prop_assert_eq!(d, initial),
                Backoff::Exponential => {
                    prop_assert!(d >= initial && d <= initial + extra);
                    // never shorter than the delay before it
                    let before = delay(&s, failed.saturating_sub(1).max(1), 0).as_millis() as u64;
                    prop_assert!(before <= d);
                }
                Backoff::ExponentialJitter => {
                    prop_assert!(d <= nominal && d >= nominal - nominal / 2, "{} not in [{}/2, {}]", d, nominal, nominal);
                }
            }
        }
    }

    #[test]
    fn jitter_spreads_a_storm_of_failures() {
        let s = spec(Backoff::ExponentialJitter, 10_000, 10_000);
        let delays: std::collections::HashSet<u128> = (0..100)
            .map(|_| delay(&s, 1, jitter_of(Uuid::now_v7(), 1)).as_millis())
            .collect();
        assert!(delays.len() > 50, "only {} distinct delays", delays.len());
    }
}
