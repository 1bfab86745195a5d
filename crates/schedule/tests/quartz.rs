//! The Quartz extensions through the public API: each day token on concrete dates, lists, the
//! Vixie OR rule with tokens, never-firing token expressions, and the macros.
//!
//! Every expected date is a calendar fact of the year it is in (check with `cal 2026`); the
//! comments give the weekdays each assertion relies on.

use chronoshard_schedule::{Cron, CronField, DateTime, Error, Schedule, Utc};

fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

/// The dates (UTC) of the next `count` fires after `after`.
fn dates(expr: &str, after: &str, count: usize) -> Vec<String> {
    let cron = Cron::parse(expr, "UTC").unwrap_or_else(|e| panic!("{expr}: {e}"));
    Schedule::Cron(cron)
        .preview(t(after), count)
        .iter()
        .map(|d| d.format("%Y-%m-%d").to_string())
        .collect()
}

#[test]
fn last_day_of_month() {
    // 2026 is not a leap year, 2028 is.
    assert_eq!(
        dates("0 0 L * *", "2026-01-01T00:00:00Z", 4),
        ["2026-01-31", "2026-02-28", "2026-03-31", "2026-04-30"]
    );
    assert_eq!(
        dates("0 0 L 2 *", "2026-01-01T00:00:00Z", 3),
        ["2026-02-28", "2027-02-28", "2028-02-29"]
    );
    // L-3: three days before the last day.
    assert_eq!(
        dates("0 0 L-3 * *", "2026-01-01T00:00:00Z", 3),
        ["2026-01-28", "2026-02-25", "2026-03-28"]
    );
    // L-30 is the 1st of 31-day months only.
    assert_eq!(
        dates("0 0 L-30 * *", "2026-01-02T00:00:00Z", 3),
        ["2026-03-01", "2026-05-01", "2026-07-01"]
    );
}

#[test]
fn nearest_weekday() {
    // Aug 2026: Saturday the 1st -> Monday the 3rd (never back into July);
    // Saturday the 15th -> Friday the 14th.
    assert_eq!(
        dates("0 0 1W 8 *", "2026-01-01T00:00:00Z", 1),
        ["2026-08-03"]
    );
    assert_eq!(
        dates("0 0 15W 8 *", "2026-01-01T00:00:00Z", 1),
        ["2026-08-14"]
    );
    // Sunday the 16th -> Monday the 17th; Wednesday the 12th stays.
    assert_eq!(
        dates("0 0 16W 8 *", "2026-01-01T00:00:00Z", 1),
        ["2026-08-17"]
    );
    assert_eq!(
        dates("0 0 12W 8 *", "2026-01-01T00:00:00Z", 1),
        ["2026-08-12"]
    );
    // May 2026: Sunday the 31st -> Friday the 29th (never forward into June).
    assert_eq!(
        dates("0 0 31W 5 *", "2026-01-01T00:00:00Z", 1),
        ["2026-05-29"]
    );
    // 31W has no 31st to move in 30-day months and February: Jan 30 (Sat 31st), Mar 31 (Tue),
    // May 29 (Sun 31st).
    assert_eq!(
        dates("0 0 31W * *", "2026-01-01T00:00:00Z", 3),
        ["2026-01-30", "2026-03-31", "2026-05-29"]
    );
}

#[test]
fn last_weekday_of_month() {
    // May 2026 ends on Sunday the 31st -> Friday 29th; Jan 2026 on Saturday the 31st -> Friday
    // 30th; Feb 2026 on Saturday the 28th -> Friday 27th; Mar 2026 on Tuesday the 31st.
    assert_eq!(
        dates("0 0 LW * *", "2026-01-01T00:00:00Z", 5),
        [
            "2026-01-30",
            "2026-02-27",
            "2026-03-31",
            "2026-04-30",
            "2026-05-29"
        ]
    );
    // L-1W in May 2026: Saturday the 30th -> Friday the 29th.
    assert_eq!(
        dates("0 0 L-1W 5 *", "2026-01-01T00:00:00Z", 1),
        ["2026-05-29"]
    );
}

#[test]
fn last_weekday_of_week_in_month() {
    // Fridays of Feb 2026: 6, 13, 20, 27. Of Mar 2026: 6, 13, 20, 27. Of Apr 2026: 3, ..., 24.
    for expr in ["0 0 * * 5L", "0 0 ? * FRIL", "0 0 * * fril"] {
        assert_eq!(
            dates(expr, "2026-02-01T00:00:00Z", 3),
            ["2026-02-27", "2026-03-27", "2026-04-24"],
            "{expr}"
        );
    }
    // Last Sunday, written 0L or 7L: Mar 29 and Oct 25 2026 (the EU clock changes).
    assert_eq!(
        dates("0 0 * 3,10 7L", "2026-01-01T00:00:00Z", 2),
        ["2026-03-29", "2026-10-25"]
    );
}

#[test]
fn nth_weekday_of_month() {
    // Second Friday: Feb 13, Mar 13, Apr 10 2026.
    for expr in ["0 0 * * 5#2", "0 0 ? * FRI#2", "0 0 * * Fri#2"] {
        assert_eq!(
            dates(expr, "2026-02-01T00:00:00Z", 3),
            ["2026-02-13", "2026-03-13", "2026-04-10"],
            "{expr}"
        );
    }
    // A fifth Friday exists only in some months: 2026 has them in Jan (30), May (29), Jul (31),
    // Oct (30); February 2026 has four Fridays and is skipped.
    assert_eq!(
        dates("0 0 * * 5#5", "2026-01-01T00:00:00Z", 4),
        ["2026-01-30", "2026-05-29", "2026-07-31", "2026-10-30"]
    );
    // First Monday and third Wednesday: Aug 2026 starts on a Saturday.
    assert_eq!(
        dates("0 0 * 8 1#1,3#3", "2026-01-01T00:00:00Z", 2),
        ["2026-08-03", "2026-08-19"]
    );
}

#[test]
fn lists_are_unions() {
    // The 15th and the last day.
    assert_eq!(
        dates("0 0 L,15 * *", "2026-01-01T00:00:00Z", 4),
        ["2026-01-15", "2026-01-31", "2026-02-15", "2026-02-28"]
    );
    // 1W and LW in Aug 2026: Monday 3rd, Monday 31st.
    assert_eq!(
        dates("0 0 1W,LW 8 *", "2026-01-01T00:00:00Z", 2),
        ["2026-08-03", "2026-08-31"]
    );
    // Every Monday and the last Friday of Feb 2026 (Mondays 2, 9, 16, 23).
    assert_eq!(
        dates("0 0 * 2 MON,5L", "2026-01-01T00:00:00Z", 5),
        [
            "2026-02-02",
            "2026-02-09",
            "2026-02-16",
            "2026-02-23",
            "2026-02-27"
        ]
    );
    // A token and a plain item selecting the same day fire once.
    assert_eq!(
        dates("0 0 L,31 1 *", "2026-01-01T00:00:00Z", 2),
        ["2026-01-31", "2027-01-31"]
    );
}

#[test]
fn vixie_or_rule_with_tokens() {
    // Both day fields restricted: the last day OR the second Friday. Feb 2026: Fri 13, Sat 28.
    assert_eq!(
        dates("0 0 L * 5#2", "2026-02-01T00:00:00Z", 3),
        ["2026-02-13", "2026-02-28", "2026-03-13"]
    );
    // 15W OR every Sunday, in Aug 2026: Sundays 2, 9, 16, 23, 30; 15W is Friday 14th.
    assert_eq!(
        dates("0 0 15W 8 SUN", "2026-01-01T00:00:00Z", 4),
        ["2026-08-02", "2026-08-09", "2026-08-14", "2026-08-16"]
    );
    // Day-of-week `*` or `?`: only the token (AND with every day).
    for expr in ["0 0 LW * *", "0 0 LW * ?"] {
        assert_eq!(
            dates(expr, "2026-05-01T00:00:00Z", 1),
            ["2026-05-29"],
            "{expr}"
        );
    }
    // A day-of-month starting with `*` keeps the AND rule: odd days that are a last Friday.
    // Last Fridays of 2026: Jan 30, Feb 27, Mar 27, Apr 24, May 29.
    assert_eq!(
        dates("0 0 */2 * 5L", "2026-01-01T00:00:00Z", 2),
        ["2026-02-27", "2026-03-27"]
    );
}

#[test]
fn never_firing_token_expressions_return_none_at_once() {
    let start = std::time::Instant::now();
    for expr in [
        "0 0 30W 2 *",
        "0 0 31W 4,6,9,11 *",
        "0 0 L-30 2 *",
        "0 0 L-29 2 *",
        // AND rule (day-of-month starts with `*`): days 1 and 21 are never a second Monday
        // (8-14) nor a last Friday (22 or later).
        "0 0 */20 * 1#2",
        "0 0 */20 * 5L",
    ] {
        let c = Cron::parse(expr, "Europe/Berlin").unwrap();
        assert_eq!(c.next_after(t("2026-01-01T00:00:00Z")), None, "{expr}");
        assert_eq!(c.next_after(t("1900-01-01T00:00:00Z")), None, "{expr}");
    }
    // A fifth Friday of February is a Friday the 29th: 2008, 2036, 2064 (every 28 years
    // while no century year intervenes).
    assert_eq!(
        dates("0 0 ? 2 5#5", "2000-01-01T00:00:00Z", 3),
        ["2008-02-29", "2036-02-29", "2064-02-29"]
    );
    // L-28 in February is the 1st in leap years only.
    assert_eq!(
        dates("0 0 L-28 2 *", "2026-01-01T00:00:00Z", 2),
        ["2028-02-01", "2032-02-01"]
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(2));
}

#[test]
fn macros() {
    let after = "2026-01-31T12:00:00Z";
    let pairs = [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
    ];
    for (name, expansion) in pairs {
        for tz in ["UTC", "Europe/Berlin", "America/New_York"] {
            let m = Schedule::Cron(Cron::parse(name, tz).unwrap());
            let e = Schedule::Cron(Cron::parse(expansion, tz).unwrap());
            assert_eq!(
                m.preview(t(after), 20),
                e.preview(t(after), 20),
                "{name} {tz}"
            );
        }
    }
    // The expansions on the calendar: Sunday Feb 1 2026, the first of a month.
    assert_eq!(dates("@weekly", after, 2), ["2026-02-01", "2026-02-08"]);
    assert_eq!(dates("@monthly", after, 2), ["2026-02-01", "2026-03-01"]);
    assert_eq!(dates("@yearly", after, 1), ["2027-01-01"]);
    // Case-insensitive as names are, surrounding whitespace ignored, kept as written.
    let c = Cron::parse("  @Daily ", "UTC").unwrap();
    assert_eq!(c.expression(), "@Daily");
}

#[test]
fn macro_errors_concern_the_whole_expression() {
    for (expr, part) in [
        ("@reboot", "unknown macro \"@reboot\""),
        ("@every 5m", "stands alone"),
        ("@daily *", "stands alone"),
        ("@", "unknown macro"),
        ("@fortnightly", "known: @yearly @annually"),
    ] {
        match Cron::parse(expr, "UTC") {
            Err(e @ Error::InvalidCron { field: None, .. }) => {
                assert!(e.to_string().contains(part), "{expr}: {e}")
            }
            other => panic!("{expr}: {other:?}"),
        }
    }
    // A macro in a field position is an invalid value of that field.
    assert!(matches!(
        Cron::parse("0 @daily * * *", "UTC"),
        Err(Error::InvalidCron {
            field: Some(CronField::Hour),
            ..
        })
    ));
}
