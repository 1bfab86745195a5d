//! Parsing of one cron field (`*/5`, `1-5,10`, `MON-FRI`, `?`, and the Quartz day tokens `L`,
//! `L-3`, `15W`, `LW`, `5L`, `FRI#2`) into a bitset plus [`DayRules`].
//!
//! This module owns the per-field grammar, the value ranges and names of the six fields, and the
//! error messages that name the offending field. It knows nothing about dates, time zones or how
//! the fields combine (that is `days`, `search` and `cron`).

use crate::days::{DayRules, MAX_LAST_OFFSET};
use crate::{CronField, Error};

/// Which of the six cron fields is being parsed; fixes its range, names and special rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldKind {
    Second,
    Minute,
    Hour,
    DayOfMonth,
    Month,
    DayOfWeek,
}

const MONTH_NAMES: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

impl FieldKind {
    /// The field as errors name it, so a user can tell which of five or six fields is wrong.
    fn field(self) -> CronField {
        match self {
            FieldKind::Second => CronField::Second,
            FieldKind::Minute => CronField::Minute,
            FieldKind::Hour => CronField::Hour,
            FieldKind::DayOfMonth => CronField::DayOfMonth,
            FieldKind::Month => CronField::Month,
            FieldKind::DayOfWeek => CronField::DayOfWeek,
        }
    }

    /// Inclusive range of values a user may write (day-of-week accepts 7 as a second Sunday).
    fn bounds(self) -> (u32, u32) {
        match self {
            FieldKind::Second | FieldKind::Minute => (0, 59),
            FieldKind::Hour => (0, 23),
            FieldKind::DayOfMonth => (1, 31),
            FieldKind::Month => (1, 12),
            FieldKind::DayOfWeek => (0, 7),
        }
    }

    /// Where `*/s` and `a/s` stop. Day-of-week steps run over 0–6 so that Sunday is not counted
    /// twice (`*/2` is Sun,Tue,Thu,Sat and `5/2` is Friday only, as docs/api.md says).
    fn step_end(self) -> u32 {
        match self {
            FieldKind::DayOfWeek => 6,
            _ => self.bounds().1,
        }
    }

    fn names(self) -> Option<(&'static [&'static str], u32)> {
        match self {
            FieldKind::Month => Some((&MONTH_NAMES, 1)),
            FieldKind::DayOfWeek => Some((&DAY_NAMES, 0)),
            _ => None,
        }
    }
}

/// One parsed field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Field {
    /// Bit `v` set when value `v` matches (day-of-week already folds 7 onto 0).
    pub(crate) bits: u64,
    /// The field text starts with `*` or `?`. Vixie cron decides the day-of-month/day-of-week
    /// OR-rule on exactly this syntactic test, so `*/2` counts as unrestricted there.
    pub(crate) star: bool,
    /// The field is one plain value (`2`, `FEB`): no list, range, step or wildcard. The DST gap
    /// and overlap rules for the hour field depend on this syntactic property.
    pub(crate) single: bool,
    /// The Quartz tokens among the list items (day-of-month and day-of-week only).
    pub(crate) rules: DayRules,
}

fn err(kind: FieldKind, msg: impl std::fmt::Display) -> Error {
    Error::InvalidCron {
        field: Some(kind.field()),
        reason: msg.to_string(),
    }
}

/// Parses the text of one field.
pub(crate) fn parse_field(kind: FieldKind, text: &str) -> Result<Field, Error> {
    if text.is_empty() {
        return Err(err(kind, "empty field"));
    }
    if text == "?" {
        // Quartz users write `?` for "no specific value"; it only makes sense for the two day fields.
        return match kind {
            FieldKind::DayOfMonth | FieldKind::DayOfWeek => {
                let (lo, hi) = kind.bounds();
                Ok(Field {
                    bits: fold_sunday(kind, range_bits(lo, hi, 1)),
                    star: true,
                    single: false,
                    rules: DayRules::default(),
                })
            }
            _ => Err(err(
                kind,
                "`?` is only allowed in day-of-month and day-of-week",
            )),
        };
    }
    let mut bits = 0u64;
    let mut rules = DayRules::default();
    for item in text.split(',') {
        if item.is_empty() {
            return Err(err(kind, format!("empty list item in {text:?}")));
        }
        // A list is a union: Quartz tokens and plain items mix freely (`L,15`, `1#1,3#3`).
        match day_token(kind, item) {
            Some(token) => rules = rules.union(token?),
            None => bits |= parse_item(kind, item)?,
        }
    }
    let single = !text.contains([',', '-', '/', '*']);
    Ok(Field {
        bits: fold_sunday(kind, bits),
        star: text.starts_with('*'),
        single,
        rules,
    })
}

/// A day-of-month or day-of-week list item that is a Quartz token, parsed; `None` when the item
/// is plain syntax (or in another field), to be parsed by [`parse_item`].
fn day_token(kind: FieldKind, item: &str) -> Option<Result<DayRules, Error>> {
    if !matches!(kind, FieldKind::DayOfMonth | FieldKind::DayOfWeek) {
        return None;
    }
    let upper = item.to_ascii_uppercase();
    match kind {
        FieldKind::DayOfMonth if upper.starts_with('L') || upper.ends_with('W') => {
            Some(day_of_month_token(&upper).map_err(|why| err(kind, format!("{item:?}: {why}"))))
        }
        FieldKind::DayOfWeek if upper.contains('#') => Some(nth_weekday_token(&upper, item)),
        // `L` alone is Quartz's Saturday and an error in Spring: refuse it rather than guess.
        FieldKind::DayOfWeek if upper == "L" => Some(Err(err(
            kind,
            "`L` alone is ambiguous (Quartz reads it as Saturday); write SAT for every \
             Saturday or 6L for the last one",
        ))),
        FieldKind::DayOfWeek => upper
            .strip_suffix('L')
            .map(|stem| Ok(DayRules::last_of_week(one_weekday(stem, "L", "5L")?))),
        _ => None,
    }
}

/// `L`, `L-n`, `LW`, `L-nW` or `nW` (upper case); the error is the reason only.
fn day_of_month_token(token: &str) -> Result<DayRules, String> {
    const EXPECTED: &str = "expected L, L-n, LW, L-nW or nW (n a number)";
    if let Some(rest) = token.strip_prefix('L') {
        let (offset, nearest) = match rest.strip_suffix('W') {
            Some(offset) => (offset, true),
            None => (rest, false),
        };
        let n = match offset.strip_prefix('-') {
            None if offset.is_empty() => 0,
            None => return Err(EXPECTED.into()),
            Some(n) => match small_number(n) {
                Some(n) if n <= MAX_LAST_OFFSET => n,
                _ if is_digits(n) => {
                    return Err(format!(
                        "offset from the last day is at most {MAX_LAST_OFFSET}"
                    ))
                }
                _ => return Err(EXPECTED.into()),
            },
        };
        return Ok(if nearest {
            DayRules::last_nearest(n)
        } else {
            DayRules::last(n)
        });
    }
    let day = token.strip_suffix('W').unwrap_or(token);
    match small_number(day) {
        Some(d) if (1..=31).contains(&d) => Ok(DayRules::nearest(d)),
        _ if is_digits(day) => Err("W needs a day in 1-31".into()),
        _ if day.is_empty() => Err("W needs a day before it, as in 15W".into()),
        _ => Err(format!("W applies to one day, as in 15W; {EXPECTED}")),
    }
}

/// `w#k` (upper-cased in `upper`, as written in `item`): the k-th weekday w of the month.
fn nth_weekday_token(upper: &str, item: &str) -> Result<DayRules, Error> {
    let kind = FieldKind::DayOfWeek;
    let (day, k) = upper.split_once('#').unwrap_or((upper, ""));
    let weekday = one_weekday(day, "#", "5#2")?;
    match small_number(k) {
        Some(k) if (1..=5).contains(&k) => Ok(DayRules::nth(weekday, k)),
        _ => Err(err(
            kind,
            format!("{item:?}: # must be followed by 1 to 5 (which occurrence in the month)"),
        )),
    }
}

/// The single weekday (number 0–7 or name) before a day-of-week `L` or `#`, 7 folded onto 0.
fn one_weekday(stem: &str, token: &str, example: &str) -> Result<u32, Error> {
    let kind = FieldKind::DayOfWeek;
    if stem.is_empty() || stem.contains(['-', '/', '*', ',', '?', '#', 'L']) {
        return Err(err(
            kind,
            format!("{token} applies to one weekday, as in {example}, not {stem:?}"),
        ));
    }
    Ok(parse_value(kind, stem, false)? % 7)
}

fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// A non-empty run of ASCII digits that fits a `u32`.
fn small_number(text: &str) -> Option<u32> {
    if is_digits(text) {
        text.parse().ok()
    } else {
        None
    }
}

/// Day-of-week 7 is Sunday, like 0; store it only as bit 0 so matching needs no special case.
fn fold_sunday(kind: FieldKind, bits: u64) -> u64 {
    if kind == FieldKind::DayOfWeek && bits & (1 << 7) != 0 {
        (bits & !(1 << 7)) | 1
    } else {
        bits
    }
}

fn range_bits(lo: u32, hi: u32, step: u32) -> u64 {
    (lo..=hi)
        .step_by(step as usize)
        .fold(0, |b, v| b | (1u64 << v))
}

/// One list item: `*`, `v`, `a-b`, each optionally followed by `/step`.
fn parse_item(kind: FieldKind, item: &str) -> Result<u64, Error> {
    let (base, step) = match item.split_once('/') {
        Some((base, step)) => (base, Some(parse_step(kind, step)?)),
        None => (item, None),
    };
    let (min, max) = kind.bounds();
    let (lo, hi) = if base == "*" {
        (min, if step.is_some() { kind.step_end() } else { max })
    } else if base == "?" {
        return Err(err(kind, format!("`?` must stand alone, not in {item:?}")));
    } else if let Some((a, b)) = base.split_once('-') {
        let lo = parse_value(kind, a, false)?;
        let hi = parse_value(kind, b, true)?;
        if lo > hi {
            return Err(err(kind, format!("reversed range {base}")));
        }
        (lo, hi)
    } else {
        let v = parse_value(kind, base, false)?;
        match step {
            // `7/15`: from 7 to the end of the field. For day-of-week the end is Saturday (6);
            // `7/s` (Sunday written as 7) can only mean Sunday itself.
            Some(_) => (v, kind.step_end().max(v)),
            None => (v, v),
        }
    };
    Ok(range_bits(lo, hi, step.unwrap_or(1)))
}

fn parse_step(kind: FieldKind, text: &str) -> Result<u32, Error> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err(kind, format!("step {text:?} is not a number")));
    }
    match text.parse::<u32>() {
        Ok(0) => Err(err(kind, "step 0 (must be at least 1)")),
        Ok(s) => Ok(s),
        // Any step this large selects only the range start; reject it rather than guess.
        Err(_) => Err(err(kind, format!("step {text} is too large"))),
    }
}

/// A number or (month / day-of-week) a three-letter name, checked against the field's range.
/// `range_end` lets `FRI-SUN` mean Friday to Sunday: SUN as a range end is 7, not 0.
fn parse_value(kind: FieldKind, text: &str, range_end: bool) -> Result<u32, Error> {
    let (min, max) = kind.bounds();
    if text.is_empty() {
        return Err(err(kind, "missing value in range"));
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return match text.parse::<u32>() {
            Ok(v) if (min..=max).contains(&v) => Ok(v),
            _ => Err(err(kind, format!("value {text} out of range {min}-{max}"))),
        };
    }
    if let Some((names, base)) = kind.names() {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(text)) {
            let v = base + i as u32;
            return Ok(if range_end && kind == FieldKind::DayOfWeek && v == 0 {
                7
            } else {
                v
            });
        }
    }
    if is_quartz_special(text) {
        let hint = match kind {
            FieldKind::DayOfMonth => {
                "L and W stand only as whole list items (L, L-3, LW, 15W); # is for day-of-week"
            }
            FieldKind::DayOfWeek => {
                "L and # stand only as whole list items (5L, FRIL, 5#2); W is for day-of-month"
            }
            _ => "L, W and # are only allowed in day-of-month and day-of-week",
        };
        return Err(err(kind, format!("{text:?}: {hint}")));
    }
    if kind.names().is_some() && text.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(err(kind, format!("unknown name {text:?}")));
    }
    Err(err(kind, format!("invalid value {text:?}")))
}

/// Quartz tokens (`L`, `LW`, `15W`, `5L`, `5#3`) in the wrong field or inside a range get a
/// clearer message than "invalid value", since users copy them from other schedulers.
fn is_quartz_special(text: &str) -> bool {
    let upper = text.to_ascii_uppercase();
    let stem = upper.trim_end_matches(['L', 'W']);
    upper.contains('#') || (stem.len() < upper.len() && stem.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(kind: FieldKind, text: &str) -> Vec<u32> {
        let f = parse_field(kind, text).unwrap();
        (0..64).filter(|v| f.bits & (1 << v) != 0).collect()
    }

    /// The message of a rejection, which must name `kind` as the field at fault.
    fn msg(kind: FieldKind, text: &str) -> String {
        match parse_field(kind, text) {
            Err(Error::InvalidCron {
                field: Some(field),
                reason,
            }) if field == kind.field() => format!("{field}: {reason}"),
            other => panic!("expected InvalidCron for {kind:?} {text:?}, got {other:?}"),
        }
    }

    fn rules(kind: FieldKind, text: &str) -> DayRules {
        parse_field(kind, text).unwrap().rules
    }

    #[test]
    fn values_lists_ranges() {
        assert_eq!(bits(FieldKind::Minute, "5"), vec![5]);
        assert_eq!(bits(FieldKind::Minute, "1,3,5-7"), vec![1, 3, 5, 6, 7]);
        assert_eq!(bits(FieldKind::Hour, "*").len(), 24);
        assert_eq!(bits(FieldKind::DayOfMonth, "*").len(), 31);
        assert_eq!(bits(FieldKind::DayOfMonth, "31"), vec![31]);
    }

    #[test]
    fn steps() {
        assert_eq!(bits(FieldKind::Minute, "*/15"), vec![0, 15, 30, 45]);
        assert_eq!(bits(FieldKind::Minute, "10-40/10"), vec![10, 20, 30, 40]);
        assert_eq!(bits(FieldKind::Minute, "7/15"), vec![7, 22, 37, 52]);
        assert_eq!(bits(FieldKind::Hour, "*/100"), vec![0]);
        assert_eq!(bits(FieldKind::DayOfMonth, "*/10"), vec![1, 11, 21, 31]);
        assert_eq!(bits(FieldKind::Month, "*/4"), vec![1, 5, 9]);
    }

    #[test]
    fn day_of_week_sunday_and_steps() {
        assert_eq!(bits(FieldKind::DayOfWeek, "7"), vec![0]);
        assert_eq!(bits(FieldKind::DayOfWeek, "0,7"), vec![0]);
        assert_eq!(bits(FieldKind::DayOfWeek, "5/2"), vec![5]);
        assert_eq!(bits(FieldKind::DayOfWeek, "*/2"), vec![0, 2, 4, 6]);
        assert_eq!(bits(FieldKind::DayOfWeek, "1/2"), vec![1, 3, 5]);
        assert_eq!(bits(FieldKind::DayOfWeek, "7/2"), vec![0]);
        assert_eq!(bits(FieldKind::DayOfWeek, "5-7"), vec![0, 5, 6]);
        assert_eq!(bits(FieldKind::DayOfWeek, "1-7/2"), vec![0, 1, 3, 5]);
    }

    #[test]
    fn names_case_insensitive() {
        assert_eq!(bits(FieldKind::Month, "jan,Mar,DEC"), vec![1, 3, 12]);
        assert_eq!(bits(FieldKind::Month, "FEB-apr"), vec![2, 3, 4]);
        assert_eq!(bits(FieldKind::DayOfWeek, "mon-FRI"), vec![1, 2, 3, 4, 5]);
        assert_eq!(bits(FieldKind::DayOfWeek, "FRI-SUN"), vec![0, 5, 6]);
        assert_eq!(bits(FieldKind::DayOfWeek, "SUN"), vec![0]);
        assert_eq!(bits(FieldKind::DayOfWeek, "MON/2"), vec![1, 3, 5]);
    }

    #[test]
    fn star_and_single_flags() {
        let f = parse_field(FieldKind::Hour, "2").unwrap();
        assert!(f.single && !f.star);
        for text in ["2-2", "2,3", "*/2", "*", "2/1"] {
            assert!(
                !parse_field(FieldKind::Hour, text).unwrap().single,
                "{text}"
            );
        }
        assert!(parse_field(FieldKind::DayOfMonth, "*/2").unwrap().star);
        assert!(parse_field(FieldKind::DayOfWeek, "?").unwrap().star);
        assert!(!parse_field(FieldKind::DayOfWeek, "1-5").unwrap().star);
    }

    #[test]
    fn question_mark() {
        assert_eq!(bits(FieldKind::DayOfWeek, "?"), vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(bits(FieldKind::DayOfMonth, "?").len(), 31);
        assert!(msg(FieldKind::Hour, "?").starts_with("hour: `?` is only allowed"));
        assert!(msg(FieldKind::DayOfWeek, "?/2").contains("stand alone"));
        assert!(msg(FieldKind::DayOfWeek, "1,?").contains("stand alone"));
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            msg(FieldKind::Hour, "24"),
            "hour: value 24 out of range 0-23"
        );
        assert_eq!(
            msg(FieldKind::Minute, "60"),
            "minute: value 60 out of range 0-59"
        );
        assert_eq!(
            msg(FieldKind::Second, "99999999999999"),
            "second: value 99999999999999 out of range 0-59"
        );
        assert_eq!(
            msg(FieldKind::DayOfMonth, "0"),
            "day-of-month: value 0 out of range 1-31"
        );
        assert_eq!(
            msg(FieldKind::Month, "13"),
            "month: value 13 out of range 1-12"
        );
        assert_eq!(
            msg(FieldKind::DayOfWeek, "8"),
            "day-of-week: value 8 out of range 0-7"
        );
        assert_eq!(
            msg(FieldKind::Minute, "40-10"),
            "minute: reversed range 40-10"
        );
        assert_eq!(
            msg(FieldKind::DayOfWeek, "SAT-MON"),
            "day-of-week: reversed range SAT-MON"
        );
        assert_eq!(
            msg(FieldKind::Minute, "*/0"),
            "minute: step 0 (must be at least 1)"
        );
        assert_eq!(
            msg(FieldKind::Minute, "*/"),
            "minute: step \"\" is not a number"
        );
        assert_eq!(
            msg(FieldKind::Minute, "*/x"),
            "minute: step \"x\" is not a number"
        );
        assert_eq!(
            msg(FieldKind::Minute, "1,,2"),
            "minute: empty list item in \"1,,2\""
        );
        assert_eq!(
            msg(FieldKind::Minute, "1,"),
            "minute: empty list item in \"1,\""
        );
        assert_eq!(msg(FieldKind::Month, "FOO"), "month: unknown name \"FOO\"");
        assert_eq!(msg(FieldKind::Hour, "MON"), "hour: invalid value \"MON\"");
        assert_eq!(
            msg(FieldKind::Minute, "-5"),
            "minute: missing value in range"
        );
        assert_eq!(
            msg(FieldKind::Minute, "5-"),
            "minute: missing value in range"
        );
        assert_eq!(msg(FieldKind::Minute, "+5"), "minute: invalid value \"+5\"");
    }

    #[test]
    fn day_of_month_tokens() {
        let dom = FieldKind::DayOfMonth;
        assert_eq!(rules(dom, "L"), DayRules::last(0));
        assert_eq!(rules(dom, "l"), DayRules::last(0));
        assert_eq!(rules(dom, "L-3"), DayRules::last(3));
        assert_eq!(rules(dom, "L-0"), DayRules::last(0));
        assert_eq!(rules(dom, "L-30"), DayRules::last(30));
        assert_eq!(rules(dom, "LW"), DayRules::last_nearest(0));
        assert_eq!(rules(dom, "lw"), DayRules::last_nearest(0));
        assert_eq!(rules(dom, "L-2W"), DayRules::last_nearest(2));
        assert_eq!(rules(dom, "15W"), DayRules::nearest(15));
        assert_eq!(rules(dom, "1w"), DayRules::nearest(1));
        assert_eq!(rules(dom, "31W"), DayRules::nearest(31));
        // Lists are unions; plain items keep their bits.
        let f = parse_field(dom, "L,15,1W").unwrap();
        assert_eq!(f.rules, DayRules::last(0).union(DayRules::nearest(1)));
        assert_eq!(f.bits, 1 << 15);
        assert!(!f.star, "a field of Quartz tokens is restricted");
        assert!(parse_field(dom, "1-5").unwrap().rules.is_empty());
    }

    #[test]
    fn day_of_week_tokens() {
        let dow = FieldKind::DayOfWeek;
        assert_eq!(rules(dow, "5L"), DayRules::last_of_week(5));
        assert_eq!(rules(dow, "FRIL"), DayRules::last_of_week(5));
        assert_eq!(rules(dow, "fril"), DayRules::last_of_week(5));
        assert_eq!(rules(dow, "7L"), DayRules::last_of_week(0));
        assert_eq!(rules(dow, "0L"), DayRules::last_of_week(0));
        assert_eq!(rules(dow, "5#2"), DayRules::nth(5, 2));
        assert_eq!(rules(dow, "Fri#2"), DayRules::nth(5, 2));
        assert_eq!(rules(dow, "7#5"), DayRules::nth(0, 5));
        let f = parse_field(dow, "1#1,3#3,SATL,MON").unwrap();
        let want = DayRules::nth(1, 1)
            .union(DayRules::nth(3, 3))
            .union(DayRules::last_of_week(6));
        assert_eq!(f.rules, want);
        assert_eq!(f.bits, 1 << 1);
    }

    #[test]
    fn token_errors_name_the_field() {
        let (dom, dow) = (FieldKind::DayOfMonth, FieldKind::DayOfWeek);
        for (text, part) in [
            ("L-31", "at most 30"),
            ("L-", "expected L, L-n"),
            ("L-x", "expected L, L-n"),
            ("LL", "expected L, L-n"),
            ("L/2", "expected L, L-n"),
            ("L-3WW", "expected L, L-n"),
            ("W", "needs a day before it"),
            ("0W", "day in 1-31"),
            ("32W", "day in 1-31"),
            ("99999999999W", "day in 1-31"),
            ("1-5W", "one day"),
            ("*/2W", "one day"),
            ("5L", "whole list items"),
            ("1-L", "whole list items"),
            ("5#2", "# is for day-of-week"),
        ] {
            let m = msg(dom, text);
            assert!(m.starts_with("day-of-month: "), "{text}: {m}");
            assert!(m.contains(part), "{text}: {m}");
        }
        for (text, part) in [
            ("L", "ambiguous"),
            ("l", "ambiguous"),
            ("8L", "out of range 0-7"),
            ("1-5L", "one weekday"),
            ("*L", "one weekday"),
            ("LL", "one weekday"),
            ("#2", "one weekday"),
            ("5#0", "1 to 5"),
            ("5#6", "1 to 5"),
            ("5#", "1 to 5"),
            ("5#2#3", "1 to 5"),
            ("FOO#1", "unknown name"),
            ("15W", "W is for day-of-month"),
            ("L-2", "whole list items"),
        ] {
            let m = msg(dow, text);
            assert!(m.starts_with("day-of-week: "), "{text}: {m}");
            assert!(m.contains(part), "{text}: {m}");
        }
        for kind in [
            FieldKind::Second,
            FieldKind::Minute,
            FieldKind::Hour,
            FieldKind::Month,
        ] {
            for text in ["L", "5L", "LW", "15W", "5#2"] {
                assert!(
                    msg(kind, text).contains("only allowed in day-of-month and day-of-week"),
                    "{kind:?} {text}"
                );
            }
        }
    }
}
