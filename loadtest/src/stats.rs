//! Summaries of measured samples: exact percentiles, log-scale histograms and per-bucket
//! timelines. Pure (no clock, no I/O): the probes collect samples, this module only counts them.
//!
//! Samples are kept whole (8 bytes each) rather than in a sketch: a run of a few million events
//! costs tens of MB, and the percentiles are then exact, which is what a benchmark report should
//! state.

use crate::report::{Histogram, Percentiles};

/// Samples in microseconds (signed: a ticket may be published before its scheduled time).
#[derive(Clone, Debug, Default)]
pub struct Samples {
    us: Vec<i64>,
    sorted: bool,
}

impl Samples {
    pub fn new() -> Samples {
        Samples::default()
    }

    pub fn push(&mut self, us: i64) {
        self.us.push(us);
        self.sorted = false;
    }

    pub fn len(&self) -> usize {
        self.us.len()
    }

    pub fn is_empty(&self) -> bool {
        self.us.is_empty()
    }

    fn sort(&mut self) {
        if !self.sorted {
            self.us.sort_unstable();
            self.sorted = true;
        }
    }

    /// The sample at quantile `q` (0..=1) by the nearest-rank method, in µs.
    pub fn quantile_us(&mut self, q: f64) -> Option<i64> {
        if self.us.is_empty() {
            return None;
        }
        self.sort();
        let n = self.us.len();
        // Nearest rank: the smallest sample with at least q·n samples at or below it.
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as usize).clamp(1, n);
        Some(self.us[rank - 1])
    }

    pub fn percentiles(&mut self) -> Percentiles {
        if self.us.is_empty() {
            return Percentiles::default();
        }
        let ms = |v: Option<i64>| v.unwrap_or(0) as f64 / 1000.0;
        let sum: i128 = self.us.iter().map(|&v| v as i128).sum();
        Percentiles {
            count: self.us.len() as u64,
            min: ms(self.quantile_us(0.0)),
            p50: ms(self.quantile_us(0.50)),
            p90: ms(self.quantile_us(0.90)),
            p99: ms(self.quantile_us(0.99)),
            p999: ms(self.quantile_us(0.999)),
            max: ms(self.quantile_us(1.0)),
            mean: sum as f64 / self.us.len() as f64 / 1000.0,
        }
    }

    /// Counts over logarithmic bounds: 0, then 0.1 ms ·2^(k/4) up to at least the largest
    /// sample (negative samples fall into the first range).
    pub fn histogram(&mut self) -> Histogram {
        let max_ms = self.quantile_us(1.0).unwrap_or(0) as f64 / 1000.0;
        let mut bounds = vec![0.0];
        let mut b = 0.1f64;
        while b <= max_ms {
            bounds.push((b * 1000.0).round() / 1000.0);
            b *= 2f64.powf(0.25);
        }
        let mut counts = vec![0u64; bounds.len()];
        for &v in &self.us {
            let ms = v as f64 / 1000.0;
            // The last bound at or below the sample (negatives count in the first range).
            let i = bounds.partition_point(|&x| x <= ms).saturating_sub(1);
            counts[i] += 1;
        }
        Histogram {
            bounds_ms: bounds,
            counts,
        }
    }
}

/// Events placed into fixed-width time buckets: each bucket keeps its count and its samples.
#[derive(Clone, Debug)]
pub struct Buckets {
    width_us: i64,
    buckets: Vec<Samples>,
}

impl Buckets {
    pub fn new(width_ms: u64) -> Buckets {
        Buckets {
            width_us: width_ms.max(1) as i64 * 1000,
            buckets: Vec::new(),
        }
    }

    /// Records an event `at_us` after the run's start (earlier events go into the first
    /// bucket) with its sample.
    pub fn push(&mut self, at_us: i64, sample_us: i64) {
        let i = (at_us.max(0) / self.width_us) as usize;
        if self.buckets.len() <= i {
            self.buckets.resize_with(i + 1, Samples::new);
        }
        self.buckets[i].push(sample_us);
    }

    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    pub fn get_mut(&mut self, i: usize) -> Option<&mut Samples> {
        self.buckets.get_mut(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut s = Samples::new();
        for v in 1..=1000 {
            s.push(v * 1000);
        }
        let p = s.percentiles();
        assert_eq!(
            (p.min, p.p50, p.p99, p.p999, p.max),
            (1.0, 500.0, 990.0, 999.0, 1000.0)
        );
        assert_eq!(p.count, 1000);
        assert!((p.mean - 500.5).abs() < 1e-9);
    }

    #[test]
    fn empty_samples_have_zero_count() {
        let mut s = Samples::new();
        assert_eq!(s.percentiles(), Percentiles::default());
        assert_eq!(s.histogram().counts.iter().sum::<u64>(), 0);
    }

    #[test]
    fn buckets_place_events_by_time() {
        let mut b = Buckets::new(100);
        b.push(-5, 1);
        b.push(99_999, 2);
        b.push(250_000, 3);
        assert_eq!(b.len(), 3);
        assert_eq!(b.get_mut(0).unwrap().len(), 2);
        assert!(b.get_mut(1).unwrap().is_empty());
        assert_eq!(b.get_mut(2).unwrap().quantile_us(1.0), Some(3));
    }

    proptest! {
        #[test]
        fn quantiles_match_a_sorted_reference(mut v in prop::collection::vec(-10_000i64..10_000_000, 1..400), q in 0.0f64..=1.0) {
            let mut s = Samples::new();
            for &x in &v { s.push(x); }
            v.sort();
            let got = s.quantile_us(q).unwrap();
            // At least q of the samples are at or below it, and fewer than q strictly below.
            let at_or_below = v.iter().filter(|&&x| x <= got).count() as f64;
            let below = v.iter().filter(|&&x| x < got).count() as f64;
            prop_assert!(at_or_below >= (q * v.len() as f64).ceil().max(1.0));
            prop_assert!(below < (q * v.len() as f64).ceil().max(1.0));
        }

        #[test]
        fn histogram_counts_every_sample_once(v in prop::collection::vec(-5_000i64..60_000_000, 0..300)) {
            let mut s = Samples::new();
            for &x in &v { s.push(x); }
            let h = s.histogram();
            prop_assert_eq!(h.counts.iter().sum::<u64>(), v.len() as u64);
            prop_assert_eq!(h.counts.len(), h.bounds_ms.len());
            prop_assert!(h.bounds_ms.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
