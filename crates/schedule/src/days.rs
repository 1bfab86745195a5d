//! The Quartz day tokens (`L`, `L-3`, `15W`, `LW`, `L-3W` in day-of-month; `5L`, `5#2` in
//! day-of-week): what they select in a given month.
//!
//! This module owns the meaning of those tokens, never their spelling (that is `field`) or how
//! the two day fields combine (that is `search`). Unlike plain values, these tokens select
//! different days in different months, so they are kept apart from the fields' fixed bitsets and
//! evaluated once per month from two facts: the month's length and the weekday of its 1st. A
//! plain expression has an empty [`DayRules`] and pays one comparison per month for them.

/// Iterates the set bits of `bits`, lowest first.
fn set_bits(mut bits: u64) -> impl Iterator<Item = u32> {
    std::iter::from_fn(move || {
        (bits != 0).then(|| {
            let b = bits.trailing_zeros();
            bits &= bits - 1;
            b
        })
    })
}

/// The Quartz tokens of one day field, as small bitsets. The tokens of a list are a union, so
/// `L,15W` keeps one bit in `last` and one in `nearest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct DayRules {
    /// Bit n: `L-n` (`L` is n = 0), the day n days before the month's last day.
    last: u32,
    /// Bit n: `L-nW` (`LW` is n = 0), the weekday nearest to that day.
    last_nearest: u32,
    /// Bit d: `dW`, the weekday nearest to day d.
    nearest: u32,
    /// Bit w (0 = Sunday): `wL`, the last weekday w of the month.
    last_of_week: u8,
    /// Bit 7·(k−1)+w: `w#k`, the k-th weekday w of the month (k = 1..=5).
    nth: u64,
}

/// The largest n in `L-n`, as in Quartz: `L-30` is the 1st of a 31-day month.
pub(crate) const MAX_LAST_OFFSET: u32 = 30;

impl DayRules {
    /// `L-n`; `n` must be at most [`MAX_LAST_OFFSET`].
    pub(crate) fn last(n: u32) -> DayRules {
        DayRules {
            last: 1 << n,
            ..DayRules::default()
        }
    }

    /// `L-nW`; `n` must be at most [`MAX_LAST_OFFSET`].
    pub(crate) fn last_nearest(n: u32) -> DayRules {
        DayRules {
            last_nearest: 1 << n,
            ..DayRules::default()
        }
    }

    /// `dW`; `day` must be in 1..=31.
    pub(crate) fn nearest(day: u32) -> DayRules {
        DayRules {
            nearest: 1 << day,
            ..DayRules::default()
        }
    }

    /// `wL`; `weekday` must be in 0..=6 (0 = Sunday).
    pub(crate) fn last_of_week(weekday: u32) -> DayRules {
        DayRules {
            last_of_week: 1 << weekday,
            ..DayRules::default()
        }
    }

    /// `w#k`; `weekday` in 0..=6 (0 = Sunday), `k` in 1..=5.
    pub(crate) fn nth(weekday: u32, k: u32) -> DayRules {
        DayRules {
            nth: 1 << (7 * (k - 1) + weekday),
            ..DayRules::default()
        }
    }

    /// The union of two token sets (a list).
    pub(crate) fn union(self, other: DayRules) -> DayRules {
        DayRules {
            last: self.last | other.last,
            last_nearest: self.last_nearest | other.last_nearest,
            nearest: self.nearest | other.nearest,
            last_of_week: self.last_of_week | other.last_of_week,
            nth: self.nth | other.nth,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        *self == DayRules::default()
    }

    /// The days (bits 1..=`len`) these tokens select in a month of `len` days whose 1st is
    /// weekday `first` (0 = Sunday). A token whose day falls outside the month (`31W` in April,
    /// `L-30` in February, `5#5` in most months) selects nothing in it: no token ever moves into
    /// another month.
    pub(crate) fn days(&self, len: u32, first: u32) -> u64 {
        let weekday = |d: u32| (first + d - 1) % 7;
        let nearest_weekday = |d: u32| match weekday(d) {
            // Saturday: Friday before, unless that is in the previous month (the 1st).
            6 if d == 1 => 3,
            6 => d - 1,
            // Sunday: Monday after, unless that is in the next month (the last day).
            0 if d == len => d - 2,
            0 => d + 1,
            _ => d,
        };
        let mut out = 0u64;
        for n in set_bits(self.last.into()).filter(|&n| n < len) {
            out |= 1 << (len - n);
        }
        for n in set_bits(self.last_nearest.into()).filter(|&n| n < len) {
            out |= 1 << nearest_weekday(len - n);
        }
        for d in set_bits(self.nearest.into()).filter(|&d| d <= len) {
            out |= 1 << nearest_weekday(d);
        }
        for w in set_bits(self.last_of_week.into()) {
            // Back from the last day to the nearest day with weekday w.
            out |= 1 << (len - (weekday(len) + 7 - w) % 7);
        }
        for i in set_bits(self.nth) {
            let (w, k) = (i % 7, i / 7 + 1);
            let d = 1 + (w + 7 - first) % 7 + 7 * (k - 1);
            if d <= len {
                out |= 1 << d;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Datelike, NaiveDate};

    /// The days `rules` select in `year`-`month`, as day numbers.
    fn days(rules: DayRules, year: i32, month: u32) -> Vec<u32> {
        let first = NaiveDate::from_ymd_opt(year, month, 1).unwrap();
        let len = (28..=31)
            .rev()
            .find(|&d| NaiveDate::from_ymd_opt(year, month, d).is_some())
            .unwrap();
        let mask = rules.days(len, first.weekday().num_days_from_sunday());
        (0..64).filter(|d| mask & (1 << d) != 0).collect()
    }

    // The calendar facts below can be checked with `cal 2026` (or `ncal`).

    #[test]
    fn last_day_and_offsets() {
        assert_eq!(days(DayRules::last(0), 2026, 2), [28]);
        assert_eq!(days(DayRules::last(0), 2028, 2), [29]);
        assert_eq!(days(DayRules::last(0), 2026, 4), [30]);
        assert_eq!(days(DayRules::last(3), 2026, 1), [28]);
        assert_eq!(days(DayRules::last(30), 2026, 1), [1]);
        // L-30 and L-29 fall before the 1st of February: nothing that month.
        assert_eq!(days(DayRules::last(30), 2026, 2), [] as [u32; 0]);
        assert_eq!(days(DayRules::last(28), 2026, 2), [] as [u32; 0]);
        assert_eq!(days(DayRules::last(28), 2028, 2), [1]);
    }

    #[test]
    fn nearest_weekday() {
        // Aug 2026: the 1st is a Saturday, the 15th a Saturday, the 16th a Sunday.
        assert_eq!(days(DayRules::nearest(15), 2026, 8), [14]);
        assert_eq!(days(DayRules::nearest(16), 2026, 8), [17]);
        assert_eq!(days(DayRules::nearest(1), 2026, 8), [3]);
        assert_eq!(days(DayRules::nearest(12), 2026, 8), [12]);
        // May 2026: the 31st is a Sunday, so 31W stays in May, on Friday the 29th.
        assert_eq!(days(DayRules::nearest(31), 2026, 5), [29]);
        // 31W in a 30-day month: there is no 31st, so nothing.
        assert_eq!(days(DayRules::nearest(31), 2026, 4), [] as [u32; 0]);
        // Feb 2026: 28W, the 28th is a Saturday -> Friday 27th.
        assert_eq!(days(DayRules::nearest(28), 2026, 2), [27]);
    }

    #[test]
    fn last_weekday() {
        // May 2026 ends on Sunday the 31st: LW is Friday 29th.
        assert_eq!(days(DayRules::last_nearest(0), 2026, 5), [29]);
        // Jan 2026 ends on Saturday the 31st: Friday 30th.
        assert_eq!(days(DayRules::last_nearest(0), 2026, 1), [30]);
        // Jun 2026 ends on Tuesday the 30th.
        assert_eq!(days(DayRules::last_nearest(0), 2026, 6), [30]);
        // L-1W in May 2026: the 30th is a Saturday -> Friday 29th.
        assert_eq!(days(DayRules::last_nearest(1), 2026, 5), [29]);
        // L-30W in Aug 2026 is 1W: Saturday the 1st -> Monday 3rd.
        assert_eq!(days(DayRules::last_nearest(30), 2026, 8), [3]);
    }

    #[test]
    fn last_of_week() {
        // Fridays of Feb 2026: 6, 13, 20, 27.
        assert_eq!(days(DayRules::last_of_week(5), 2026, 2), [27]);
        // Sundays of Mar 2026: 1, 8, 15, 22, 29 (the EU clock change).
        assert_eq!(days(DayRules::last_of_week(0), 2026, 3), [29]);
        // Saturdays of Jan 2026: ..., 24, 31: the last day itself.
        assert_eq!(days(DayRules::last_of_week(6), 2026, 1), [31]);
    }

    #[test]
    fn nth_of_week() {
        // Fridays of Feb 2026: 6, 13, 20, 27; no fifth.
        assert_eq!(days(DayRules::nth(5, 2), 2026, 2), [13]);
        assert_eq!(days(DayRules::nth(5, 4), 2026, 2), [27]);
        assert_eq!(days(DayRules::nth(5, 5), 2026, 2), [] as [u32; 0]);
        // Sundays of Mar 2026: the 2nd is the 8th (the US clock change).
        assert_eq!(days(DayRules::nth(0, 2), 2026, 3), [8]);
        // Saturdays of Aug 2026: 1, 8, 15, 22, 29.
        assert_eq!(days(DayRules::nth(6, 1), 2026, 8), [1]);
        assert_eq!(days(DayRules::nth(6, 5), 2026, 8), [29]);
    }

    #[test]
    fn union_and_empty() {
        assert!(DayRules::default().is_empty());
        assert_eq!(DayRules::default().days(31, 0), 0);
        let both = DayRules::last(0).union(DayRules::nearest(15));
        assert!(!both.is_empty());
        assert_eq!(days(both, 2026, 8), [14, 31]);
        let nths = DayRules::nth(1, 1).union(DayRules::nth(3, 3));
        // Aug 2026: first Monday the 3rd, third Wednesday the 19th.
        assert_eq!(days(nths, 2026, 8), [3, 19]);
    }

    /// Every token, in every shape of month, against the definitions written out day by day.
    #[test]
    fn exhaustive_against_definitions() {
        for len in 28..=31u32 {
            for first in 0..7u32 {
                let wd = |d: u32| (first + d - 1) % 7;
                let is_weekday = |d: u32| (1..=len).contains(&d) && (1..=5).contains(&wd(d));
                // The weekday of the month closest to `target` (no ties can occur).
                let closest = |target: u32| {
                    (1..=len)
                        .filter(|&d| is_weekday(d))
                        .min_by_key(|&d| d.abs_diff(target))
                };
                let one = |d: Option<u32>| d.map_or(0u64, |d| 1 << d);
                for n in 0..=MAX_LAST_OFFSET {
                    let day = (n < len).then(|| len - n);
                    assert_eq!(DayRules::last(n).days(len, first), one(day));
                    let near = day.and_then(closest);
                    assert_eq!(DayRules::last_nearest(n).days(len, first), one(near));
                }
                for d in 1..=31 {
                    let near = (d <= len).then(|| closest(d)).flatten();
                    assert_eq!(DayRules::nearest(d).days(len, first), one(near), "{d}W");
                }
                for w in 0..7 {
                    let of_w: Vec<u32> = (1..=len).filter(|&d| wd(d) == w).collect();
                    let last = of_w.last().copied();
                    assert_eq!(DayRules::last_of_week(w).days(len, first), one(last));
                    for k in 1..=5 {
                        let kth = of_w.get(k as usize - 1).copied();
                        assert_eq!(DayRules::nth(w, k).days(len, first), one(kth));
                    }
                }
            }
        }
    }
}
