//! Daylight-saving behaviour at fixed, hand-checked transitions (the DST rules of the crate docs):
//! gap → single-hour schedules fire once at the gap end, others skip the missing local times;
//! overlap → single-hour schedules fire at the first instant only, others at both.

use chronoshard_schedule::{Cron, DateTime, Schedule, Utc};

fn fires(expr: &str, tz: &str, after: &str, count: usize) -> Vec<String> {
    let cron = Cron::parse(expr, tz).unwrap_or_else(|e| panic!("{expr}: {e}"));
    let after: DateTime<Utc> = after.parse().unwrap();
    Schedule::Cron(cron)
        .preview(after, count)
        .iter()
        .map(|d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .collect()
}

// Europe/Berlin, 2026-03-29: 02:00 CET (+1) jumps to 03:00 CEST (+2) at 01:00Z.

#[test]
fn berlin_gap_single_hour() {
    assert_eq!(
        fires("30 2 * * *", "Europe/Berlin", "2026-03-28T00:00:00Z", 3),
        [
            "2026-03-28T01:30:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-30T00:30:00Z"
        ]
    );
    // Two missing local times in the same gap: one fire at the gap end, not two.
    assert_eq!(
        fires("0,30 2 * * *", "Europe/Berlin", "2026-03-29T00:00:00Z", 3),
        [
            "2026-03-29T01:00:00Z",
            "2026-03-30T00:00:00Z",
            "2026-03-30T00:30:00Z"
        ]
    );
    // Every second of the missing hour (6 fields): still one fire.
    assert_eq!(
        fires("* * 2 * * *", "Europe/Berlin", "2026-03-29T00:59:58Z", 2),
        ["2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z"]
    );
}

#[test]
fn berlin_gap_fire_is_found_from_just_before_and_not_repeated() {
    // `after` one second before the gap end: the gap end (01:00Z) is the next fire.
    assert_eq!(
        fires("30 2 * * *", "Europe/Berlin", "2026-03-29T00:59:59Z", 2),
        ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
    );
    assert_eq!(
        fires("30 2 * * *", "Europe/Berlin", "2026-03-29T00:59:59.999Z", 1),
        ["2026-03-29T01:00:00Z"]
    );
    assert_eq!(
        fires("30 2 * * *", "Europe/Berlin", "2026-03-29T01:00:00Z", 1),
        ["2026-03-30T00:30:00Z"]
    );
}

#[test]
fn berlin_gap_wildcard_hour() {
    assert_eq!(
        fires("*/30 * * * *", "Europe/Berlin", "2026-03-29T00:00:00Z", 3),
        [
            "2026-03-29T00:30:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-29T01:30:00Z"
        ]
    );
    assert_eq!(
        fires("0 * * * *", "Europe/Berlin", "2026-03-28T23:30:00Z", 3),
        [
            "2026-03-29T00:00:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-29T02:00:00Z"
        ]
    );
    // A range in the hour field is not a single value: 02:30 is skipped, 03:30 fires.
    assert_eq!(
        fires("30 2-3 * * *", "Europe/Berlin", "2026-03-29T00:00:00Z", 2),
        ["2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"]
    );
}

// Europe/Berlin, 2026-10-25: 03:00 CEST (+2) falls back to 02:00 CET (+1) at 01:00Z;
// local 02:00-02:59 happens at 00:00-00:59Z and again at 01:00-01:59Z.

#[test]
fn berlin_overlap_single_hour() {
    assert_eq!(
        fires("30 2 * * *", "Europe/Berlin", "2026-10-24T00:00:00Z", 3),
        [
            "2026-10-24T00:30:00Z",
            "2026-10-25T00:30:00Z",
            "2026-10-26T01:30:00Z"
        ]
    );
    // Starting inside the second pass: the repeated 02:30 does not fire again.
    assert_eq!(
        fires("30 2 * * *", "Europe/Berlin", "2026-10-25T01:00:00Z", 1),
        ["2026-10-26T01:30:00Z"]
    );
}

#[test]
fn berlin_overlap_wildcard_hour() {
    assert_eq!(
        fires("*/30 * * * *", "Europe/Berlin", "2026-10-24T23:45:00Z", 5),
        [
            "2026-10-25T00:00:00Z",
            "2026-10-25T00:30:00Z",
            "2026-10-25T01:00:00Z",
            "2026-10-25T01:30:00Z",
            "2026-10-25T02:00:00Z"
        ]
    );
    assert_eq!(
        fires("0 * * * *", "Europe/Berlin", "2026-10-24T23:30:00Z", 3),
        [
            "2026-10-25T00:00:00Z",
            "2026-10-25T01:00:00Z",
            "2026-10-25T02:00:00Z"
        ]
    );
    // From inside the first pass, the second 02:00 comes before 03:00.
    assert_eq!(
        fires("0 * * * *", "Europe/Berlin", "2026-10-25T00:15:00Z", 2),
        ["2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z"]
    );
    assert_eq!(
        fires("*/30 * * * *", "Europe/Berlin", "2026-10-25T00:45:00Z", 2),
        ["2026-10-25T01:00:00Z", "2026-10-25T01:30:00Z"]
    );
    // A range over the repeated hour fires on both passes too.
    assert_eq!(
        fires("15 2-3 * * *", "Europe/Berlin", "2026-10-25T00:00:00Z", 3),
        [
            "2026-10-25T00:15:00Z",
            "2026-10-25T01:15:00Z",
            "2026-10-25T02:15:00Z"
        ]
    );
}

// America/New_York, 2026-03-08: 02:00 EST (-5) jumps to 03:00 EDT (-4) at 07:00Z.

#[test]
fn new_york_gap() {
    assert_eq!(
        fires("30 2 * * *", "America/New_York", "2026-03-07T00:00:00Z", 3),
        [
            "2026-03-07T07:30:00Z",
            "2026-03-08T07:00:00Z",
            "2026-03-09T06:30:00Z"
        ]
    );
    assert_eq!(
        fires(
            "*/30 * * * *",
            "America/New_York",
            "2026-03-08T06:00:00Z",
            3
        ),
        [
            "2026-03-08T06:30:00Z",
            "2026-03-08T07:00:00Z",
            "2026-03-08T07:30:00Z"
        ]
    );
    assert_eq!(
        fires("0 * * * *", "America/New_York", "2026-03-08T05:30:00Z", 2),
        ["2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z"]
    );
}

// America/New_York, 2026-11-01: 02:00 EDT (-4) falls back to 01:00 EST (-5) at 06:00Z;
// local 01:00-01:59 happens at 05:00-05:59Z and again at 06:00-06:59Z.

#[test]
fn new_york_overlap() {
    assert_eq!(
        fires("30 1 * * *", "America/New_York", "2026-10-31T00:00:00Z", 3),
        [
            "2026-10-31T05:30:00Z",
            "2026-11-01T05:30:00Z",
            "2026-11-02T06:30:00Z"
        ]
    );
    assert_eq!(
        fires(
            "*/30 * * * *",
            "America/New_York",
            "2026-11-01T04:45:00Z",
            5
        ),
        [
            "2026-11-01T05:00:00Z",
            "2026-11-01T05:30:00Z",
            "2026-11-01T06:00:00Z",
            "2026-11-01T06:30:00Z",
            "2026-11-01T07:00:00Z"
        ]
    );
    assert_eq!(
        fires("0 * * * *", "America/New_York", "2026-11-01T04:30:00Z", 3),
        [
            "2026-11-01T05:00:00Z",
            "2026-11-01T06:00:00Z",
            "2026-11-01T07:00:00Z"
        ]
    );
    // From inside the first pass (01:15 EDT) the next is 01:00 EST, before 02:00 EST.
    assert_eq!(
        fires("0 * * * *", "America/New_York", "2026-11-01T05:15:00Z", 2),
        ["2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"]
    );
    // The hour after the overlap is unaffected.
    assert_eq!(
        fires("30 2 * * *", "America/New_York", "2026-10-31T12:00:00Z", 1),
        ["2026-11-01T07:30:00Z"]
    );
}

// Australia/Lord_Howe shifts by 30 minutes: +10:30 standard, +11 daylight.
// 2026-10-04 02:00 (+10:30) jumps to 02:30 (+11) at 2026-10-03T15:30Z.
// 2026-04-05 02:00 (+11) falls back to 01:30 (+10:30) at 2026-04-04T15:00Z.

#[test]
fn lord_howe_half_hour_gap() {
    // 02:00 is missing and maps to the gap end, which is also 02:30, a real match: one fire.
    assert_eq!(
        fires(
            "0,30 2 * * *",
            "Australia/Lord_Howe",
            "2026-10-02T00:00:00Z",
            5
        ),
        [
            "2026-10-02T15:30:00Z",
            "2026-10-02T16:00:00Z",
            "2026-10-03T15:30:00Z",
            "2026-10-04T15:00:00Z",
            "2026-10-04T15:30:00Z"
        ]
    );
    assert_eq!(
        fires(
            "*/15 2 * * *",
            "Australia/Lord_Howe",
            "2026-10-03T15:00:00Z",
            3
        ),
        [
            "2026-10-03T15:30:00Z",
            "2026-10-03T15:45:00Z",
            "2026-10-04T15:00:00Z"
        ]
    );
}

#[test]
fn lord_howe_half_hour_overlap() {
    assert_eq!(
        fires(
            "*/15 * * * *",
            "Australia/Lord_Howe",
            "2026-04-04T14:20:00Z",
            5
        ),
        [
            "2026-04-04T14:30:00Z",
            "2026-04-04T14:45:00Z",
            "2026-04-04T15:00:00Z",
            "2026-04-04T15:15:00Z",
            "2026-04-04T15:30:00Z"
        ]
    );
    // Single hour: 01:45 fires only on the first pass.
    assert_eq!(
        fires(
            "45 1 * * *",
            "Australia/Lord_Howe",
            "2026-04-04T12:00:00Z",
            2
        ),
        ["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"]
    );
}

#[test]
fn kolkata_and_utc_have_no_transitions() {
    assert_eq!(
        fires("30 2 * * *", "Asia/Kolkata", "2026-03-28T00:00:00Z", 2),
        ["2026-03-28T21:00:00Z", "2026-03-29T21:00:00Z"]
    );
    assert_eq!(
        fires("30 2 * * *", "UTC", "2026-03-28T00:00:00Z", 2),
        ["2026-03-28T02:30:00Z", "2026-03-29T02:30:00Z"]
    );
}

#[test]
fn midnight_gap_single_hour_zero() {
    // America/Sao_Paulo used to spring forward at midnight: 2018-11-04 00:00 (-3) -> 01:00 (-2)
    // at 03:00Z. A daily midnight job fires at 01:00 local that day.
    assert_eq!(
        fires("0 0 * * *", "America/Sao_Paulo", "2018-11-03T00:00:00Z", 3),
        [
            "2018-11-03T03:00:00Z",
            "2018-11-04T03:00:00Z",
            "2018-11-05T02:00:00Z"
        ]
    );
}

#[test]
fn samoa_skipped_day() {
    // Pacific/Apia skipped 2011-12-30 entirely (-10 -> +14 at 2011-12-30T10:00Z).
    // A single-hour job at noon fires once at the gap end (2011-12-31 00:00 local).
    assert_eq!(
        fires("0 12 * * *", "Pacific/Apia", "2011-12-29T00:00:00Z", 3),
        [
            "2011-12-29T22:00:00Z",
            "2011-12-30T10:00:00Z",
            "2011-12-30T22:00:00Z"
        ]
    );
    // Any-hour jobs just skip the missing day.
    assert_eq!(
        fires("0 */12 * * *", "Pacific/Apia", "2011-12-29T21:00:00Z", 3),
        [
            "2011-12-29T22:00:00Z",
            "2011-12-30T10:00:00Z",
            "2011-12-30T22:00:00Z"
        ]
    );
}

// ---------- Quartz day tokens and macros on clock-change days ----------
// Tokens only choose days; the gap and overlap rules still follow the hour field.

#[test]
fn berlin_last_sunday_tokens() {
    // The EU changes are on the last Sunday: Mar 29 2026 and Mar 28 2027 (gap at 01:00Z),
    // Oct 25 2026 (overlap 00:00-01:59Z). L-2 of March is always the 29th.
    for expr in ["30 2 * 3 0L", "30 2 ? 3 SUNL", "30 2 * 3 7L"] {
        assert_eq!(
            fires(expr, "Europe/Berlin", "2026-01-01T00:00:00Z", 2),
            ["2026-03-29T01:00:00Z", "2027-03-28T01:00:00Z"],
            "{expr}"
        );
    }
    // In 2027 the 29th is a Monday, after the change: 02:30 CEST.
    assert_eq!(
        fires("30 2 L-2 3 *", "Europe/Berlin", "2026-01-01T00:00:00Z", 2),
        ["2026-03-29T01:00:00Z", "2027-03-29T00:30:00Z"]
    );
    // Not a single hour: the missing 02:30 is skipped, 03:30 CEST fires.
    assert_eq!(
        fires("30 2-3 * 3 0L", "Europe/Berlin", "2026-03-01T00:00:00Z", 1),
        ["2026-03-29T01:30:00Z"]
    );
    // Overlap: a single hour fires on the first pass only, a range on both.
    assert_eq!(
        fires("30 2 * 10 0L", "Europe/Berlin", "2026-10-01T00:00:00Z", 1),
        ["2026-10-25T00:30:00Z"]
    );
    assert_eq!(
        fires("30 2-3 * 10 0L", "Europe/Berlin", "2026-10-01T00:00:00Z", 3),
        [
            "2026-10-25T00:30:00Z",
            "2026-10-25T01:30:00Z",
            "2026-10-25T02:30:00Z"
        ]
    );
}

#[test]
fn new_york_nth_sunday_tokens() {
    // Second Sunday of March 2026 is the 8th (gap at 07:00Z); of April, the 12th (EDT).
    assert_eq!(
        fires(
            "30 2 * * 0#2",
            "America/New_York",
            "2026-03-01T00:00:00Z",
            2
        ),
        ["2026-03-08T07:00:00Z", "2026-04-12T06:30:00Z"]
    );
    // First Sunday of November 2026 is the 1st: 01:00-01:59 happens at 05:00Z and 06:00Z.
    assert_eq!(
        fires(
            "30 1 * 11 SUN#1",
            "America/New_York",
            "2026-10-01T00:00:00Z",
            1
        ),
        ["2026-11-01T05:30:00Z"]
    );
    assert_eq!(
        fires(
            "30 1-2 * 11 SUN#1",
            "America/New_York",
            "2026-10-01T00:00:00Z",
            3
        ),
        [
            "2026-11-01T05:30:00Z",
            "2026-11-01T06:30:00Z",
            "2026-11-01T07:30:00Z"
        ]
    );
}

#[test]
fn jerusalem_friday_change_with_w_and_l() {
    // Israel springs forward on the Friday before the last Sunday of March: 2026-03-27,
    // 02:00 IST (+2) -> 03:00 IDT (+3) at 00:00Z. That Friday is the last Friday (5L), the
    // nearest weekday to Saturday the 28th (28W) and to itself (27W); 02:30 does not exist.
    for expr in [
        "30 2 * 3 5L",
        "30 2 28W 3 *",
        "30 2 27W 3 *",
        "30 2 L-4 3 *",
    ] {
        assert_eq!(
            fires(expr, "Asia/Jerusalem", "2026-03-01T00:00:00Z", 1),
            ["2026-03-27T00:00:00Z"],
            "{expr}"
        );
    }
    // Not a single hour: skipped, and 03:30 IDT fires instead.
    assert_eq!(
        fires(
            "30 2,3 28W 3 *",
            "Asia/Jerusalem",
            "2026-03-01T00:00:00Z",
            1
        ),
        ["2026-03-27T00:30:00Z"]
    );
    // It falls back on the last Sunday of October, 2026-10-25: 02:00 IDT -> 01:00 IST at
    // 23:00Z the day before, so 01:30 happens at 22:30Z and 23:30Z.
    assert_eq!(
        fires("30 1 * 10 0L", "Asia/Jerusalem", "2026-10-01T00:00:00Z", 1),
        ["2026-10-24T22:30:00Z"]
    );
}

#[test]
fn samoa_skipped_day_is_the_last_weekday() {
    // Pacific/Apia skipped Friday 2011-12-30 (-10 -> +14 at 2011-12-30T10:00Z). December 2011
    // ends on Saturday the 31st, so LW (and 30W) is that missing Friday: a single-hour job
    // fires once at the gap end, 2011-12-31 00:00 local.
    for expr in ["0 12 LW 12 *", "0 12 30W 12 *"] {
        assert_eq!(
            fires(expr, "Pacific/Apia", "2011-12-01T00:00:00Z", 1),
            ["2011-12-30T10:00:00Z"],
            "{expr}"
        );
    }
    // Any-hour jobs skip the missing day; the next LW is Monday 2012-12-31 (+14, DST).
    assert_eq!(
        fires("0 */12 LW 12 *", "Pacific/Apia", "2011-12-01T00:00:00Z", 1),
        ["2012-12-30T10:00:00Z"]
    );
}

#[test]
fn lord_howe_first_sunday_half_hour_gap() {
    // First Sunday of October: 2026-10-04 and 2027-10-03, 02:00 (+10:30) -> 02:30 (+11).
    // 02:00 is missing and maps to the gap end, which is 02:30 itself: one fire a year.
    assert_eq!(
        fires(
            "0,30 2 * 10 SUN#1",
            "Australia/Lord_Howe",
            "2026-10-01T00:00:00Z",
            2
        ),
        ["2026-10-03T15:30:00Z", "2027-10-02T15:30:00Z"]
    );
}

#[test]
fn macros_follow_their_hour_field() {
    // America/Sao_Paulo sprang forward at midnight on Sunday 2018-11-04 (00:00 -03 -> 01:00
    // -02 at 03:00Z). @weekly, @daily and @midnight have the single hour 0: that day's
    // midnight fires at the gap end, 01:00 local.
    assert_eq!(
        fires("@weekly", "America/Sao_Paulo", "2018-10-27T00:00:00Z", 3),
        [
            "2018-10-28T03:00:00Z",
            "2018-11-04T03:00:00Z",
            "2018-11-11T02:00:00Z"
        ]
    );
    for expr in ["@daily", "@midnight"] {
        assert_eq!(
            fires(expr, "America/Sao_Paulo", "2018-11-03T00:00:00Z", 3),
            [
                "2018-11-03T03:00:00Z",
                "2018-11-04T03:00:00Z",
                "2018-11-05T02:00:00Z"
            ],
            "{expr}"
        );
    }
    // @hourly has a wildcard hour: New York's missing 02:00 (2026-03-08) is skipped, and the
    // repeated 01:00 (2026-11-01) fires twice.
    assert_eq!(
        fires("@hourly", "America/New_York", "2026-03-08T05:30:00Z", 3),
        [
            "2026-03-08T06:00:00Z",
            "2026-03-08T07:00:00Z",
            "2026-03-08T08:00:00Z"
        ]
    );
    assert_eq!(
        fires("@hourly", "America/New_York", "2026-11-01T04:30:00Z", 3),
        [
            "2026-11-01T05:00:00Z",
            "2026-11-01T06:00:00Z",
            "2026-11-01T07:00:00Z"
        ]
    );
}
