//! Public-API tests: parsing (accepted syntax and every error kind), field semantics observed
//! through fire times, intervals, one-shots and preview.

use chronoshard_schedule::{Cron, CronField, DateTime, Error, Schedule, Utc};
use std::time::Duration;

fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn fires(expr: &str, tz: &str, after: &str, count: usize) -> Vec<String> {
    let cron = Cron::parse(expr, tz).unwrap_or_else(|e| panic!("{expr}: {e}"));
    Schedule::Cron(cron)
        .preview(t(after), count)
        .iter()
        .map(|d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .collect()
}

fn cron_err(expr: &str) -> String {
    match Cron::parse(expr, "UTC") {
        Err(e @ Error::InvalidCron { .. }) => e.to_string(),
        other => panic!("{expr}: expected InvalidCron, got {other:?}"),
    }
}

/// The field a rejection of `expr` names.
fn err_field(expr: &str) -> Option<CronField> {
    match Cron::parse(expr, "UTC") {
        Err(Error::InvalidCron { field, .. }) => field,
        other => panic!("{expr}: expected InvalidCron, got {other:?}"),
    }
}

#[test]
fn contract_acceptance_example() {
    assert_eq!(
        fires("0 30 2 * * *", "Europe/Berlin", "2026-03-28T00:00:00Z", 3),
        [
            "2026-03-28T01:30:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-30T00:30:00Z"
        ]
    );
}

#[test]
fn five_and_six_fields() {
    assert_eq!(
        fires("*/20 * * * *", "", "2026-01-01T00:00:00Z", 2),
        ["2026-01-01T00:20:00Z", "2026-01-01T00:40:00Z"]
    );
    assert_eq!(
        fires("*/20 * * * * *", "", "2026-01-01T00:00:00Z", 2),
        ["2026-01-01T00:00:20Z", "2026-01-01T00:00:40Z"]
    );
    // Extra whitespace between fields is fine.
    assert_eq!(
        fires("  15\t10  * * *  ", "UTC", "2026-01-01T00:00:00Z", 1),
        ["2026-01-01T10:15:00Z"]
    );
}

#[test]
fn wrong_field_count() {
    for expr in ["", "* * * *", "* * * * * * * *", "0"] {
        let msg = cron_err(expr);
        assert!(msg.contains("expected 5 fields"), "{expr}: {msg}");
        assert_eq!(err_field(expr), None, "{expr}");
    }
    assert_eq!(
        cron_err("* * * *"),
        "invalid cron expression: expected 5 fields (minute hour day-of-month month day-of-week) \
         or 6 (with leading second), got 4"
    );
}

#[test]
fn year_field_is_refused() {
    // Quartz's optional seventh field.
    for expr in ["0 0 12 * * ? 2026", "0 0 12 ? * 6L *"] {
        assert_eq!(err_field(expr), Some(CronField::Year), "{expr}");
        let msg = cron_err(expr);
        assert!(
            msg.starts_with("invalid cron expression: year: 7 fields"),
            "{msg}"
        );
    }
}

#[test]
fn errors_name_field_and_reason() {
    use CronField::*;
    let cases = [
        ("0 24 * * *", Hour, "hour: value 24 out of range 0-23"),
        ("60 * * * * *", Second, "second: value 60 out of range 0-59"),
        (
            "* * 32 * *",
            DayOfMonth,
            "day-of-month: value 32 out of range 1-31",
        ),
        ("* * * 0 *", Month, "month: value 0 out of range 1-12"),
        (
            "* * * * 8",
            DayOfWeek,
            "day-of-week: value 8 out of range 0-7",
        ),
        ("30-10 * * * *", Minute, "minute: reversed range 30-10"),
        ("*/0 * * * *", Minute, "minute: step 0 (must be at least 1)"),
        ("* * * JANUARY *", Month, "month: unknown name \"JANUARY\""),
        (
            "* * * * MON,,FRI",
            DayOfWeek,
            "day-of-week: empty list item in \"MON,,FRI\"",
        ),
        (
            "* ? * * *",
            Hour,
            "hour: `?` is only allowed in day-of-month and day-of-week",
        ),
        (
            "0 0 L-31 * *",
            DayOfMonth,
            "day-of-month: \"L-31\": offset from the last day is at most 30",
        ),
        (
            "0 0 * * 5#6",
            DayOfWeek,
            "day-of-week: \"5#6\": # must be followed by 1 to 5 (which occurrence in the month)",
        ),
    ];
    for (expr, field, want) in cases {
        assert_eq!(
            cron_err(expr),
            format!("invalid cron expression: {want}"),
            "{expr}"
        );
        assert_eq!(err_field(expr), Some(field), "{expr}");
    }
}

#[test]
fn unknown_time_zone() {
    let err = Cron::parse("* * * * *", "Mars/Olympus").unwrap_err();
    assert_eq!(err, Error::UnknownTimeZone("Mars/Olympus".into()));
    assert_eq!(err.to_string(), "unknown time zone \"Mars/Olympus\"");
    assert!(Cron::parse("* * * * *", "europe/berlin").is_err());
    // A valid expression with a valid zone parses; the zone is kept.
    let c = Cron::parse("0 9 * * MON-FRI", "America/New_York").unwrap();
    assert_eq!(c.timezone().name(), "America/New_York");
    assert_eq!(c.expression(), "0 9 * * MON-FRI");
    assert_eq!(
        Cron::parse("* * * * *", "").unwrap(),
        Cron::parse("* * * * *", "UTC").unwrap()
    );
}

#[test]
fn names_are_case_insensitive() {
    // 2026-01-05 is a Monday.
    assert_eq!(
        fires("0 9 * jan mon-wed", "UTC", "2026-01-05T09:00:00Z", 3),
        [
            "2026-01-06T09:00:00Z",
            "2026-01-07T09:00:00Z",
            "2026-01-12T09:00:00Z"
        ]
    );
    assert_eq!(
        fires("0 0 1 Feb,aug *", "UTC", "2026-01-01T00:00:00Z", 2),
        ["2026-02-01T00:00:00Z", "2026-08-01T00:00:00Z"]
    );
}

#[test]
fn steps_and_ranges() {
    assert_eq!(
        fires("10-40/10 * * * *", "", "2026-01-01T00:00:00Z", 5),
        [
            "2026-01-01T00:10:00Z",
            "2026-01-01T00:20:00Z",
            "2026-01-01T00:30:00Z",
            "2026-01-01T00:40:00Z",
            "2026-01-01T01:10:00Z"
        ]
    );
    assert_eq!(
        fires("7/15 * * * *", "", "2026-01-01T00:00:00Z", 5),
        [
            "2026-01-01T00:07:00Z",
            "2026-01-01T00:22:00Z",
            "2026-01-01T00:37:00Z",
            "2026-01-01T00:52:00Z",
            "2026-01-01T01:07:00Z"
        ]
    );
}

#[test]
fn day_of_week_seven_and_step() {
    // 2026-01-04 is a Sunday, 2026-01-09 a Friday.
    assert_eq!(
        fires("0 0 * * 7", "", "2026-01-01T00:00:00Z", 2),
        ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]
    );
    assert_eq!(
        fires("0 0 * * 5/2", "", "2026-01-01T00:00:00Z", 3),
        [
            "2026-01-02T00:00:00Z",
            "2026-01-09T00:00:00Z",
            "2026-01-16T00:00:00Z"
        ]
    );
}

#[test]
fn vixie_day_of_month_or_day_of_week() {
    // Both restricted: the 13th OR any Friday. Jan 2026: Fri 2, 9, 13 (Tue), 16.
    assert_eq!(
        fires("0 0 13 * FRI", "", "2026-01-01T00:00:00Z", 4),
        [
            "2026-01-02T00:00:00Z",
            "2026-01-09T00:00:00Z",
            "2026-01-13T00:00:00Z",
            "2026-01-16T00:00:00Z"
        ]
    );
    // Day-of-week `*`: only the 13th.
    assert_eq!(
        fires("0 0 13 * *", "", "2026-01-01T00:00:00Z", 2),
        ["2026-01-13T00:00:00Z", "2026-02-13T00:00:00Z"]
    );
    // Day-of-month `?` (Quartz): only Fridays.
    assert_eq!(
        fires("0 0 ? * FRI", "", "2026-01-01T00:00:00Z", 2),
        ["2026-01-02T00:00:00Z", "2026-01-09T00:00:00Z"]
    );
    // A field starting with `*` is "unrestricted" for the rule (Vixie): odd days AND Monday.
    // Mondays in Jan 2026: 5, 12, 19, 26; odd ones: 5, 19; Feb 2: even; Feb 9: odd.
    assert_eq!(
        fires("0 0 */2 * MON", "", "2026-01-01T00:00:00Z", 3),
        [
            "2026-01-05T00:00:00Z",
            "2026-01-19T00:00:00Z",
            "2026-02-09T00:00:00Z"
        ]
    );
}

#[test]
fn never_firing_and_rare() {
    let start = std::time::Instant::now();
    for expr in ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 31 2 */2"] {
        let c = Cron::parse(expr, "Europe/Berlin").unwrap();
        assert_eq!(c.next_after(t("2026-01-01T00:00:00Z")), None, "{expr}");
        assert!(Schedule::Cron(c)
            .preview(t("2026-01-01T00:00:00Z"), 10)
            .is_empty());
    }
    // Feb 29 only; then Feb 29 on a Sunday (`*/7` is Sunday, and its `*` makes it an AND):
    // 2100 is not a leap year, so after 2088 the next is 2128.
    assert_eq!(
        fires("0 0 29 2 *", "", "2026-01-01T00:00:00Z", 3),
        [
            "2028-02-29T00:00:00Z",
            "2032-02-29T00:00:00Z",
            "2036-02-29T00:00:00Z"
        ]
    );
    assert_eq!(
        fires("0 0 29 2 */7", "", "2088-03-01T00:00:00Z", 1),
        ["2128-02-29T00:00:00Z"]
    );
    // Always in the Berlin spring-forward gap with a non-single hour: never fires while the EU
    // rule holds; must still terminate quickly.
    let gap_only = Cron::parse("30 2-2 25-31 3 */7", "Europe/Berlin").unwrap();
    let next = gap_only.next_after(t("2026-01-01T00:00:00Z"));
    assert!(
        next.is_none_or(|n| n > t("2037-01-01T00:00:00Z")),
        "{next:?}"
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(2));
}

#[test]
fn sub_second_after() {
    assert_eq!(
        fires("* * * * * *", "", "2026-01-01T00:00:00.5Z", 2),
        ["2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z"]
    );
}

#[test]
fn every_validation_and_fires() {
    let start = t("2026-01-01T00:00:00Z");
    assert!(matches!(
        Schedule::every(Duration::ZERO, start, None),
        Err(Error::InvalidInterval(_))
    ));
    for end in [start, t("2025-12-31T23:59:59Z")] {
        let err = Schedule::every(Duration::from_secs(1), start, Some(end)).unwrap_err();
        assert!(
            err.to_string().starts_with("invalid interval: end_at"),
            "{err}"
        );
    }
    let s = Schedule::every(
        Duration::from_millis(250),
        start,
        Some(t("2026-01-01T00:00:01Z")),
    )
    .unwrap();
    assert_eq!(s.first_at_or_after(start), Some(start));
    assert_eq!(
        s.preview(start, 10),
        [
            t("2026-01-01T00:00:00.25Z"),
            t("2026-01-01T00:00:00.5Z"),
            t("2026-01-01T00:00:00.75Z")
        ]
    );
    assert_eq!(s.preview(t("2025-01-01T00:00:00Z"), 1), [start]);
    let s = Schedule::every(Duration::from_secs(30), start, None).unwrap();
    assert_eq!(
        s.next_after(t("2026-03-01T12:00:10Z")),
        Some(t("2026-03-01T12:00:30Z"))
    );
}

#[test]
fn at_is_strictly_after() {
    let at = t("2026-05-01T12:00:00Z");
    let s = Schedule::At(at);
    assert_eq!(s.next_after(t("2026-05-01T11:59:59.999Z")), Some(at));
    assert_eq!(s.next_after(at), None);
    assert_eq!(s.first_at_or_after(at), Some(at));
    assert_eq!(s.first_at_or_after(t("2026-05-01T12:00:01Z")), None);
    assert_eq!(s.preview(t("2026-01-01T00:00:00Z"), 5), [at]);
    assert!(s.preview(t("2026-01-01T00:00:00Z"), 0).is_empty());
}

#[test]
fn first_at_or_after_cron() {
    let s = Schedule::Cron(Cron::parse("0 * * * *", "").unwrap());
    assert_eq!(
        s.first_at_or_after(t("2026-01-01T10:00:00Z")),
        Some(t("2026-01-01T10:00:00Z"))
    );
    assert_eq!(
        s.first_at_or_after(t("2026-01-01T10:00:00.1Z")),
        Some(t("2026-01-01T11:00:00Z"))
    );
}

#[test]
fn extreme_instants_do_not_panic() {
    let (min, max) = (DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC);
    let schedules = [
        Schedule::Cron(Cron::parse("* * * * * *", "America/New_York").unwrap()),
        Schedule::Cron(Cron::parse("0 2 * * *", "Pacific/Apia").unwrap()),
        Schedule::Cron(Cron::parse("0 0 29 2 */7", "Asia/Tokyo").unwrap()),
        Schedule::every(Duration::from_secs(1), min, None).unwrap(),
        Schedule::every(Duration::from_secs(u64::MAX), max, None).unwrap(),
        Schedule::At(min),
        Schedule::At(max),
    ];
    for s in &schedules {
        for at in [
            min,
            min + chrono::Duration::seconds(1),
            max - chrono::Duration::days(1),
            max,
        ] {
            let _ = s.next_after(at);
            let _ = s.first_at_or_after(at);
            let _ = s.preview(at, 3);
        }
    }
    // Far-but-real instants still work.
    let s = Schedule::Cron(Cron::parse("0 0 1 1 *", "Europe/Berlin").unwrap());
    assert_eq!(
        s.next_after(t("9999-06-01T00:00:00Z")),
        Some(t("9999-12-31T23:00:00Z"))
    );
}
