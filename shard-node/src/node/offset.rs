//! A node's clock offset against the NATS server's, estimated the way NTP does from a round trip:
//! the server stamped the probe somewhere between the moment it was sent and the moment its
//! acknowledgement came back, so the offset is the midpoint minus the stamp, good to half the
//! round trip. Of the recent samples the one with the shortest round trip wins: a slow trip
//! (a busy network, a descheduled thread) says least. Pure: the caller measures.

use std::collections::VecDeque;

/// Samples kept.
const KEEP: usize = 8;

/// One probe: local microseconds before sending and after the answer, and the server's stamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub sent_us: i64,
    pub answered_us: i64,
    pub server_us: i64,
}

impl Sample {
    fn round_trip_us(&self) -> i64 {
        self.answered_us - self.sent_us
    }

    /// Local clock minus server clock, by the midpoint of the round trip.
    fn offset_us(&self) -> i64 {
        self.sent_us + self.round_trip_us() / 2 - self.server_us
    }
}

#[derive(Debug, Default)]
pub struct OffsetEstimate {
    samples: VecDeque<Sample>,
}

impl OffsetEstimate {
    pub fn add(&mut self, s: Sample) {
        if s.round_trip_us() < 0 {
            return; // the local clock stepped back during the probe: says nothing
        }
        if self.samples.len() == KEEP {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    /// The offset in milliseconds, from the sample with the shortest round trip; None before
    /// the first sample.
    pub fn offset_ms(&self) -> Option<f64> {
        self.samples
            .iter()
            .min_by_key(|s| s.round_trip_us())
            .map(|s| s.offset_us() as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_shortest_round_trip_wins_and_old_samples_go() {
        let mut e = OffsetEstimate::default();
        assert_eq!(e.offset_ms(), None);
        // Server stamped at 1_000_000; a fast trip 200 µs long centred 2 s later locally.
        e.add(Sample {
            sent_us: 3_000_000 - 100,
            answered_us: 3_000_000 + 100,
            server_us: 1_000_000,
        });
        // A slow trip (40 ms) whose stamp came early: it would say 1.98 s.
        e.add(Sample {
            sent_us: 10_000_000,
            answered_us: 10_040_000,
            server_us: 8_000_000 + 40_000,
        });
        assert_eq!(e.offset_ms(), Some(2000.0));
        for i in 0..KEEP as i64 {
            e.add(Sample {
                sent_us: 20_000_000 + i,
                answered_us: 20_001_000 + i,
                server_us: 20_000_500 + i - 5_000,
            });
        }
        assert_eq!(e.offset_ms(), Some(5.0), "the 2 s samples are gone");
        // A clock stepping back during a probe is no sample.
        e.add(Sample {
            sent_us: 5,
            answered_us: 1,
            server_us: 0,
        });
        assert_eq!(e.offset_ms(), Some(5.0));
    }

    proptest! {
        /// Whatever the trip's split between going and coming back, the estimate is off by at
        /// most half the shortest round trip.
        #[test]
        fn the_error_is_at_most_half_the_round_trip(
            offset in -10_000_000i64..10_000_000,
            trips in proptest::collection::vec((1i64..50_000, 0u32..=100), 1..12),
        ) {
            let mut e = OffsetEstimate::default();
            let mut t = 1_000_000_000i64;
            for (rtt, share) in &trips {
                let server = t + rtt * *share as i64 / 100; // when the server stamped it
                e.add(Sample { sent_us: t + offset, answered_us: t + rtt + offset, server_us: server });
                t += 500_000;
            }
            let best = trips.iter().rev().take(KEEP).map(|(r, _)| *r).min().unwrap();
            let err = (e.offset_ms().unwrap() * 1000.0 - offset as f64).abs();
            prop_assert!(err <= best as f64 / 2.0 + 1.0, "err {err} µs, best trip {best} µs");
        }
    }
}
