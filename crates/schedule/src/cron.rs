//! Cron expressions with an IANA time zone: parsing and the next fire time, DST rules included.
//!
//! This module owns the mapping from matching wall-clock times (found by `search`) to UTC
//! instants under the daylight-saving rules of docs/api.md (see the crate docs, `lib.rs`):
//! - gap: a matching local time that does not exist fires once, at the instant the gap ends, when
//!   the hour field is a single value; otherwise it is skipped;
//! - overlap: a matching local time that occurs twice fires at both instants, except when the
//!   hour field is a single value: then only at the first.
//!
//! Several matching local times in one gap therefore collapse into one fire, and fire times are
//! strictly increasing because `next_after` is always strictly after its argument.

use chrono::{
    DateTime, Datelike, LocalResult, NaiveDate, NaiveDateTime, Offset, TimeDelta, TimeZone, Utc,
};
use chrono_tz::{GapInfo, Tz};

use crate::field::{parse_field, FieldKind};
use crate::search::{DayTokens, Fields};
use crate::{CronField, Error};

/// How many years past `after` the search looks before concluding that nothing fires.
///
/// Only pathological expressions get near it: a satisfiable day rule matches within about 40
/// years (Feb 29 on a given weekday; 2100 is not a leap year), and expressions that can never
/// match (Feb 30) are recognised at parse time. What remains are matches that always fall into
/// a DST gap with a non-single hour field, e.g. `30 2-2 25-31 3 */7` in Europe/Berlin (the last
/// Sunday of March at 02:30, which does not exist); those stop at this bound instead of looping.
const SEARCH_YEARS: i32 = 400;

/// A parsed cron expression and the time zone its wall-clock fields are read in.
#[derive(Debug, Clone, PartialEq)]
pub struct Cron {
    expression: String,
    tz: Tz,
    fields: Fields,
    /// The hour field is one plain value; selects the DST rule (see the module docs).
    single_hour: bool,
    /// No calendar day can ever match; `next_after` answers `None` without searching.
    never: bool,
}

impl Cron {
    /// Parses a 5-field (`min hour dom month dow`) or 6-field (leading seconds) expression, or
    /// one of the macros `@yearly @annually @monthly @weekly @daily @midnight @hourly`.
    /// `timezone` is an IANA name; `""` and `"UTC"` mean UTC.
    pub fn parse(expr: &str, timezone: &str) -> Result<Cron, Error> {
        let tz = parse_timezone(timezone)?;
        let parts: Vec<&str> = expr.split_ascii_whitespace().collect();
        let (fields, single_hour) = match parts.first() {
            Some(first) if first.starts_with('@') => {
                let expansion = expand_macro(&parts)?;
                parse_fields(&expansion.split_ascii_whitespace().collect::<Vec<_>>())?
            }
            _ => parse_fields(&parts)?,
        };
        Ok(Cron {
            expression: parts.join(" "),
            tz,
            never: fields.never_matches(),
            fields,
            single_hour,
        })
    }

    /// The expression as parsed, with runs of whitespace collapsed to one space.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The time zone the fields are read in.
    pub fn timezone(&self) -> Tz {
        self.tz
    }

    /// The first fire time strictly after `after`, or `None` if the expression never fires
    /// (within 400 years).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if self.never {
            return None;
        }
        // Fire times are whole seconds: the first candidate is the next whole second.
        let floor = after.checked_sub_signed(TimeDelta::nanoseconds(
            after.timestamp_subsec_nanos().into(),
        ))?;
        // Keep a margin from chrono's representable range so that adding a UTC offset or a
        // second below can never overflow; no real schedule fires within days of year ±262143.
        let earliest = DateTime::<Utc>::MIN_UTC + TimeDelta::days(2);
        let mut p = floor
            .checked_add_signed(TimeDelta::seconds(1))?
            .max(earliest);
        let latest_year = NaiveDate::MAX.year() - 1;
        if p.year() >= latest_year {
            return None;
        }
        let last_year = (p.year() + SEARCH_YEARS).min(latest_year);
        let mut cursor = self.local(p);

        if self.single_hour {
            // `p` may be exactly the instant a gap ends; the gap's local times lie before
            // `cursor`, so the fire they map to (at `p`) would be missed by the scan below.
            let before = self.offset(p - TimeDelta::seconds(1));
            let now = self.offset(p);
            if before < now {
                let gap_start = p.naive_utc() + before;
                if self
                    .fields
                    .next_match(gap_start, last_year)
                    .is_some_and(|l| l < cursor)
                {
                    return Some(p);
                }
            }
        } else if let LocalResult::Ambiguous(first, second) = self.tz.from_local_datetime(&cursor) {
            // `p` is in the first pass through an overlap. Second-pass instants of local times
            // earlier than `cursor` come after every first-pass instant but before anything past
            // the overlap, so scan the overlap's two passes explicitly.
            if first.with_timezone(&Utc) == p {
                let (o1, o2) = (first.offset().fix(), second.offset().fix());
                let len = second.with_timezone(&Utc) - p;
                let switch = self.transition_after(p, p + len);
                let local_begin = switch.naive_utc() + o2;
                let local_end = switch.naive_utc() + o1;
                if let Some(l) = self
                    .fields
                    .next_match(cursor, last_year)
                    .filter(|&l| l < local_end)
                {
                    return Some(l.and_utc() - o1);
                }
                if let Some(l) = self
                    .fields
                    .next_match(local_begin, last_year)
                    .filter(|&l| l < local_end)
                {
                    return Some(l.and_utc() - o2);
                }
                p = switch + len;
                cursor = local_end;
            }
        }

        // From here on, no matching local time before `cursor` has an instant >= `p`, and local
        // order equals instant order except inside overlaps, which the branches below handle.
        loop {
            let l = self.fields.next_match(cursor, last_year)?;
            match self.tz.from_local_datetime(&l) {
                LocalResult::Single(t) => {
                    let t = t.with_timezone(&Utc);
                    if t >= p {
                        return Some(t);
                    }
                    cursor = l + TimeDelta::seconds(1);
                }
                LocalResult::Ambiguous(first, second) => {
                    let (first, second) = (first.with_timezone(&Utc), second.with_timezone(&Utc));
                    if first >= p {
                        return Some(first);
                    }
                    if !self.single_hour && second >= p {
                        return Some(second);
                    }
                    // `p` is in the second pass and this schedule fires only on first passes:
                    // jump past the overlap instead of rejecting its local times one by one.
                    let switch = self.transition_after(first, second);
                    cursor =
                        (switch.naive_utc() + self.offset(first)).max(l + TimeDelta::seconds(1));
                }
                LocalResult::None => match GapInfo::new(&l, &self.tz).and_then(|g| g.end) {
                    Some(end) if self.single_hour && end.with_timezone(&Utc) >= p => {
                        return Some(end.with_timezone(&Utc));
                    }
                    // Skipped (or already behind `p`): resume at the first local time after the gap.
                    Some(end) => cursor = end.naive_local().max(l + TimeDelta::seconds(1)),
                    // A gap with no known end only happens at the edge of the tz tables.
                    None => cursor = l + TimeDelta::seconds(1),
                },
            }
        }
    }

    fn offset(&self, t: DateTime<Utc>) -> TimeDelta {
        TimeDelta::seconds(
            self.tz
                .offset_from_utc_datetime(&t.naive_utc())
                .fix()
                .local_minus_utc()
                .into(),
        )
    }

    fn local(&self, t: DateTime<Utc>) -> NaiveDateTime {
        t.naive_utc() + self.offset(t)
    }

    /// The first instant in `(lo, hi]` whose UTC offset differs from the one at `lo`, found by
    /// bisection (transitions are whole seconds); `hi` when the offset never changes.
    fn transition_after(&self, lo: DateTime<Utc>, hi: DateTime<Utc>) -> DateTime<Utc> {
        let base = self.offset(lo);
        let (mut lo, mut hi) = (lo.timestamp(), hi.timestamp());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match DateTime::from_timestamp(mid, 0) {
                Some(t) if self.offset(t) == base => lo = mid,
                _ => hi = mid,
            }
        }
        DateTime::from_timestamp(hi, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)
    }
}

/// The macros and the expressions they stand for, with the meanings Vixie cron gives them.
/// `@reboot` is not among them: it is not a time.
const MACROS: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

/// The expression a macro stands for; `parts` is the whole expression, split on whitespace.
/// Macro names are case-insensitive, as month and day names are.
fn expand_macro(parts: &[&str]) -> Result<&'static str, Error> {
    let whole = |reason: String| Error::InvalidCron {
        field: None,
        reason,
    };
    let name = parts.first().copied().unwrap_or_default();
    if parts.len() > 1 {
        return Err(whole(format!(
            "a macro such as {name} stands alone, without other fields"
        )));
    }
    if let Some((_, expansion)) = MACROS.iter().find(|(m, _)| m.eq_ignore_ascii_case(name)) {
        return Ok(expansion);
    }
    let known = MACROS.map(|(m, _)| m).join(" ");
    Err(whole(format!("unknown macro {name:?}; known: {known}")))
}

/// The fields of a 5- or 6-field expression, and whether its hour is a single value.
fn parse_fields(parts: &[&str]) -> Result<(Fields, bool), Error> {
    let (second, rest) = match parts {
        [minute, hour, dom, month, dow] => ("0", [*minute, *hour, *dom, *month, *dow]),
        [second, minute, hour, dom, month, dow] => (*second, [*minute, *hour, *dom, *month, *dow]),
        [_, _, _, _, _, _, _] => {
            return Err(Error::InvalidCron {
                field: Some(CronField::Year),
                reason: "7 fields: a year field (as in Quartz) is not supported; \
                         use 5 fields, or 6 with leading seconds"
                    .into(),
            })
        }
        _ => {
            return Err(Error::InvalidCron {
                field: None,
                reason: format!(
                    "expected 5 fields (minute hour day-of-month month day-of-week) \
                     or 6 (with leading second), got {}",
                    parts.len()
                ),
            })
        }
    };
    let seconds = parse_field(FieldKind::Second, second)?;
    let minutes = parse_field(FieldKind::Minute, rest[0])?;
    let hours = parse_field(FieldKind::Hour, rest[1])?;
    let dom = parse_field(FieldKind::DayOfMonth, rest[2])?;
    let months = parse_field(FieldKind::Month, rest[3])?;
    let dow = parse_field(FieldKind::DayOfWeek, rest[4])?;
    let fields = Fields {
        seconds: seconds.bits,
        minutes: minutes.bits,
        hours: hours.bits,
        days_of_month: dom.bits,
        months: months.bits,
        days_of_week: dow.bits,
        tokens: DayTokens::new(dom.rules, dow.rules),
        // A field holding Quartz tokens does not start with `*` or `?`: it is restricted.
        day_or: !dom.star && !dow.star,
    };
    Ok((fields, hours.single))
}

/// `""` and `"UTC"` are UTC; anything else must be an IANA name chrono-tz knows.
fn parse_timezone(name: &str) -> Result<Tz, Error> {
    if name.is_empty() || name == "UTC" {
        return Ok(Tz::UTC);
    }
    name.parse::<Tz>()
        .map_err(|_| Error::UnknownTimeZone(name.to_owned()))
}
