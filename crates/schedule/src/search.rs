//! Calendar search over naive (wall-clock) date-times: the next local time whose fields match.
//!
//! This module owns field matching (including the Vixie day-of-month/day-of-week rule, with the
//! Quartz tokens of `days` counted in their field) and the fast forward search. It knows nothing about time zones: `cron` maps the local times found here
//! to instants. The search never steps minute by minute; it jumps with bit operations from month to
//! matching month, day to matching day, and so on, so a typical call costs well under a
//! microsecond and an expression that matches nothing for centuries still returns quickly.

use chrono::{Datelike, NaiveDate, NaiveDateTime, Timelike};

use crate::days::DayRules;

/// The six fields of a cron expression as bitsets (bit `v` set = value `v` matches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fields {
    pub(crate) seconds: u64,
    pub(crate) minutes: u64,
    pub(crate) hours: u64,
    /// Bits 1..=31.
    pub(crate) days_of_month: u64,
    /// Bits 1..=12.
    pub(crate) months: u64,
    /// Bits 0..=6, 0 = Sunday.
    pub(crate) days_of_week: u64,
    /// The Quartz tokens of the two day fields, added to `days_of_month` and `days_of_week`
    /// month by month; `None` for a plain expression, which then pays one test per month.
    pub(crate) tokens: Option<DayTokens>,
    /// Both day fields are restricted (neither starts with `*`/`?`): a day matches if EITHER
    /// matches (Vixie cron). Otherwise both must match (the wildcard one matches everything it
    /// covers, so e.g. `*/2` in day-of-month still restricts).
    pub(crate) day_or: bool,
}

/// The Quartz tokens of an expression's day-of-month field (`L`, `L-3`, `15W`, `LW`) and of
/// its day-of-week field (`5L`, `5#2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DayTokens {
    pub(crate) dom: DayRules,
    pub(crate) dow: DayRules,
}

impl DayTokens {
    /// The tokens of the two fields; `None` when neither has any.
    pub(crate) fn new(dom: DayRules, dow: DayRules) -> Option<DayTokens> {
        (!(dom.is_empty() && dow.is_empty())).then_some(DayTokens { dom, dow })
    }

    /// The days each field's tokens select in a month of `len` days whose 1st is weekday
    /// `first`. Out of line on purpose: with the token code inlined into the search loop (or
    /// with a test of the token bitsets instead of `Option`), plain expressions measured 5–25%
    /// slower; with both, they run as fast as before the tokens existed.
    #[inline(never)]
    fn days(&self, len: u32, first: u32) -> (u64, u64) {
        (self.dom.days(len, first), self.dow.days(len, first))
    }
}

/// Days 1, 8, 15, 22, 29: the days of a month that share the weekday of the 1st.
const SAME_WEEKDAY_AS_FIRST: u64 = (1 << 1) | (1 << 8) | (1 << 15) | (1 << 22) | (1 << 29);

/// Lowest set bit of `bits` at position `from` or above.
fn next_bit(bits: u64, from: u32) -> Option<u32> {
    if from >= 64 {
        return None;
    }
    let rest = bits & (!0u64 << from);
    (rest != 0).then(|| rest.trailing_zeros())
}

fn is_leap(year: i32) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

pub(crate) fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

impl Fields {
    /// Bitset (bits 1..=31) of the days of `year`-`month` that match both day rules.
    fn day_mask(&self, year: i32, month: u32) -> u64 {
        let Some(first) = NaiveDate::from_ymd_opt(year, month, 1) else {
            return 0;
        };
        self.day_mask_for(
            days_in_month(year, month),
            first.weekday().num_days_from_sunday(),
        )
    }

    /// The days (bits 1..=`len`) that match both day rules in a month of `len` days whose 1st is
    /// weekday `first` (0 = Sunday). Nothing else about a month matters to the day fields.
    fn day_mask_for(&self, len: u32, first: u32) -> u64 {
        let mut by_weekday = 0u64;
        for wd in 0..7 {
            if self.days_of_week & (1 << wd) != 0 {
                // Day d has weekday (first + d - 1) % 7; the first such d is 1 + shift.
                let shift = (wd + 7 - first) % 7;
                by_weekday |= SAME_WEEKDAY_AS_FIRST << shift;
            }
        }
        let mut by_day = self.days_of_month;
        if let Some(tokens) = &self.tokens {
            let (dom, dow) = tokens.days(len, first);
            by_day |= dom;
            by_weekday |= dow;
        }
        let valid = ((1u64 << (len + 1)) - 1) & !1;
        let days = if self.day_or {
            by_day | by_weekday
        } else {
            by_day & by_weekday
        };
        days & valid
    }

    /// True when no calendar day can ever match (`30 2 *` = February 30th, `0 0 30W 2 *`).
    ///
    /// A month's matching days depend only on its length and the weekday of its 1st
    /// ([`Self::day_mask_for`]), and every 400-year Gregorian cycle holds each month in each of
    /// its lengths (February with 28 and with 29 days) starting on each weekday. So trying those
    /// shapes is exact: when one matches, a match comes within any 400 years.
    pub(crate) fn never_matches(&self) -> bool {
        let can_match = |month: u32| {
            let lengths: &[u32] = if month == 2 {
                &[28, 29]
            } else {
                &[days_in_month(2001, month)]
            };
            lengths
                .iter()
                .any(|&len| (0..7).any(|first| self.day_mask_for(len, first) != 0))
        };
        !(1..=12u32).any(|m| self.months & (1 << m) != 0 && can_match(m))
    }

    /// Whether local time `t` matches all fields (used by tests and debug assertions).
    #[cfg(test)]
    pub(crate) fn matches(&self, t: NaiveDateTime) -> bool {
        self.seconds & (1 << t.second()) != 0
            && self.minutes & (1 << t.minute()) != 0
            && self.hours & (1 << t.hour()) != 0
            && self.months & (1 << t.month()) != 0
            && self.day_mask(t.year(), t.month()) & (1 << t.day()) != 0
    }

    /// The first matching local time at or after `from` (sub-second part ignored), or `None`
    /// if there is none in a year up to and including `last_year`.
    pub(crate) fn next_match(&self, from: NaiveDateTime, last_year: i32) -> Option<NaiveDateTime> {
        let (mut year, mut month, mut day) = (from.year(), from.month(), from.day());
        let (mut hour, mut minute, mut second) = (from.hour(), from.minute(), from.second());
        // Each `continue` below carries into the next larger unit and restarts the checks from
        // the month, resetting every smaller unit to its first value.
        loop {
            if year > last_year {
                return None;
            }
            match next_bit(self.months, month) {
                Some(m) if m == month => {}
                Some(m) => (month, day, hour, minute, second) = (m, 1, 0, 0, 0),
                None => {
                    (year, month, day, hour, minute, second) = (year + 1, 1, 1, 0, 0, 0);
                    continue;
                }
            }
            match next_bit(self.day_mask(year, month), day) {
                Some(d) if d == day => {}
                Some(d) => (day, hour, minute, second) = (d, 0, 0, 0),
                None => {
                    (month, day, hour, minute, second) = (month + 1, 1, 0, 0, 0);
                    if month > 12 {
                        (year, month) = (year + 1, 1);
                    }
                    continue;
                }
            }
            match next_bit(self.hours, hour) {
                Some(h) if h == hour => {}
                Some(h) => (hour, minute, second) = (h, 0, 0),
                None => {
                    // Day 32 is past every month: the day check above then moves on a month.
                    (day, hour, minute, second) = (day + 1, 0, 0, 0);
                    continue;
                }
            }
            match next_bit(self.minutes, minute) {
                Some(m) if m == minute => {}
                Some(m) => (minute, second) = (m, 0),
                None => {
                    (hour, minute, second) = (hour + 1, 0, 0);
                    continue;
                }
            }
            match next_bit(self.seconds, second) {
                Some(s) => second = s,
                None => {
                    (minute, second) = (minute + 1, 0);
                    continue;
                }
            }
            return NaiveDate::from_ymd_opt(year, month, day)?.and_hms_opt(hour, minute, second);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(lo: u32, hi: u32) -> u64 {
        (lo..=hi).fold(0, |b, v| b | (1 << v))
    }

    fn every_second() -> Fields {
        Fields {
            seconds: all(0, 59),
            minutes: all(0, 59),
            hours: all(0, 23),
            days_of_month: all(1, 31),
            months: all(1, 12),
            days_of_week: all(0, 6),
            tokens: None,
            day_or: false,
        }
    }

    fn dt(s: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S").unwrap()
    }

    #[test]
    fn every_second_is_identity() {
        let f = every_second();
        let t = dt("2024-02-29 23:59:59");
        assert_eq!(f.next_match(t, 2100), Some(t));
    }

    #[test]
    fn carries_across_units() {
        let f = Fields {
            seconds: 1,
            minutes: 1,
            hours: 1,
            ..every_second()
        };
        assert_eq!(
            f.next_match(dt("2023-12-31 00:00:01"), 2100),
            Some(dt("2024-01-01 00:00:00"))
        );
    }

    #[test]
    fn leap_day_far_ahead() {
        // Feb 29 that is also a Monday (AND rule): 2016, 2044, 2072, then 2112 (2100 is not leap).
        let f = Fields {
            seconds: 1,
            minutes: 1,
            hours: 1,
            days_of_month: 1 << 29,
            months: 1 << 2,
            days_of_week: 1 << 1,
            ..every_second()
        };
        assert_eq!(
            f.next_match(dt("2016-03-01 00:00:00"), 2500),
            Some(dt("2044-02-29 00:00:00"))
        );
        assert_eq!(
            f.next_match(dt("2072-03-01 00:00:00"), 2500),
            Some(dt("2112-02-29 00:00:00"))
        );
        assert_eq!(f.next_match(dt("2072-03-01 00:00:00"), 2100), None);
        assert!(!f.never_matches());
    }

    #[test]
    fn vixie_or_rule() {
        // Day 13 OR Friday.
        let f = Fields {
            seconds: 1,
            minutes: 1,
            hours: 1,
            days_of_month: 1 << 13,
            days_of_week: 1 << 5,
            day_or: true,
            ..every_second()
        };
        // 2026-03-06 is a Friday, 2026-03-13 also a Friday, 2026-04-13 a Monday.
        assert!(f.matches(dt("2026-03-06 00:00:00")));
        assert!(f.matches(dt("2026-04-13 00:00:00")));
        assert!(!f.matches(dt("2026-04-14 00:00:00")));
        let and = Fields { day_or: false, ..f };
        assert_eq!(
            and.next_match(dt("2026-01-01 00:00:00"), 2100),
            Some(dt("2026-02-13 00:00:00"))
        );
    }

    #[test]
    fn impossible_days() {
        let feb30 = Fields {
            days_of_month: 1 << 30,
            months: 1 << 2,
            ..every_second()
        };
        assert!(feb30.never_matches());
        assert_eq!(feb30.next_match(dt("2026-01-01 00:00:00"), 2426), None);
        let apr31 = Fields {
            days_of_month: 1 << 31,
            months: (1 << 4) | (1 << 6) | (1 << 9) | (1 << 11),
            ..every_second()
        };
        assert!(apr31.never_matches());
        let or_rule = Fields {
            day_or: true,
            ..feb30
        };
        assert!(!or_rule.never_matches());
    }
}
