//! Fixed-interval schedules (`every`): start_at + k·every, strictly before an optional end.
//!
//! This module owns the arithmetic; it computes k directly (no loop), in nanoseconds with i128
//! so that neither long intervals nor far-apart instants can overflow.

use std::time::Duration;

use chrono::{DateTime, Utc};

const NANOS_PER_SEC: i128 = 1_000_000_000;

fn to_nanos(t: DateTime<Utc>) -> i128 {
    i128::from(t.timestamp()) * NANOS_PER_SEC + i128::from(t.timestamp_subsec_nanos())
}

fn from_nanos(n: i128) -> Option<DateTime<Utc>> {
    let secs = i64::try_from(n.div_euclid(NANOS_PER_SEC)).ok()?;
    // rem_euclid is in 0..1e9, so it always fits.
    DateTime::from_timestamp(secs, n.rem_euclid(NANOS_PER_SEC) as u32)
}

/// The first `start_at + k·every` (k ≥ 0) strictly after `after` and strictly before `end_at`.
///
/// A zero `every` cannot be built through `Schedule::every`; if one is constructed directly it
/// degenerates to a single fire at `start_at` instead of dividing by zero.
pub(crate) fn next_after(
    every: Duration,
    start_at: DateTime<Utc>,
    end_at: Option<DateTime<Utc>>,
    after: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let start = to_nanos(start_at);
    let elapsed = to_nanos(after) - start;
    let step = i128::try_from(every.as_nanos()).ok()?;
    let next = if elapsed < 0 {
        start
    } else if step == 0 {
        return None;
    } else {
        // Smallest k with start + k·step > after.
        start + (elapsed / step + 1) * step
    };
    let next = from_nanos(next)?;
    match end_at {
        Some(end) if next >= end => None,
        _ => Some(next),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn arithmetic() {
        let start = t("2026-01-01T00:00:00Z");
        let every = Duration::from_secs(30);
        assert_eq!(
            next_after(every, start, None, t("2025-12-31T00:00:00Z")),
            Some(start)
        );
        assert_eq!(
            next_after(every, start, None, start),
            Some(t("2026-01-01T00:00:30Z"))
        );
        assert_eq!(
            next_after(every, start, None, t("2026-01-01T00:00:29.999Z")),
            Some(t("2026-01-01T00:00:30Z"))
        );
        assert_eq!(
            next_after(every, start, None, t("2026-01-01T00:00:30Z")),
            Some(t("2026-01-01T00:01:00Z"))
        );
        assert_eq!(
            next_after(every, start, None, t("2027-01-01T00:00:10Z")),
            Some(t("2027-01-01T00:00:30Z"))
        );
    }

    #[test]
    fn end_is_exclusive() {
        let start = t("2026-01-01T00:00:00Z");
        let end = Some(t("2026-01-01T00:01:00Z"));
        let every = Duration::from_secs(30);
        assert_eq!(
            next_after(every, start, end, start),
            Some(t("2026-01-01T00:00:30Z"))
        );
        assert_eq!(
            next_after(every, start, end, t("2026-01-01T00:00:30Z")),
            None
        );
    }

    #[test]
    fn sub_second_and_huge() {
        let start = t("2026-01-01T00:00:00Z");
        let every = Duration::from_millis(250);
        assert_eq!(
            next_after(every, start, None, t("2026-01-01T00:00:01.1Z")),
            Some(t("2026-01-01T00:00:01.25Z"))
        );
        assert_eq!(next_after(Duration::MAX, start, None, start), None);
        assert_eq!(next_after(Duration::ZERO, start, None, start), None);
        assert_eq!(
            next_after(Duration::ZERO, start, None, t("2025-01-01T00:00:00Z")),
            Some(start)
        );
    }
}
