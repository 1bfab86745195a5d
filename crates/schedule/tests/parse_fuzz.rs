//! Parser fuzzing: arbitrary strings, soups of cron tokens, and valid expressions with one field
//! replaced by such a soup. Nothing may panic, neither parsing nor searching what parsed; every
//! rejection is an `InvalidCron` that names its field (by variant, and at the start of its
//! message), and when only one field was disturbed, it names that one.

use chronoshard_schedule::{Cron, CronField, DateTime, Error, Schedule, Utc};
use proptest::prelude::*;

/// Zones with and without DST, with 30-minute shifts, and with a skipped day.
const ZONES: [&str; 6] = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "Asia/Jerusalem",
];

/// The fields in the order a 6-field expression has them.
const SIX: [CronField; 6] = [
    CronField::Second,
    CronField::Minute,
    CronField::Hour,
    CronField::DayOfMonth,
    CronField::Month,
    CronField::DayOfWeek,
];

/// Instants to search from: the representable extremes and days of clock changes.
fn search_starts() -> [DateTime<Utc>; 5] {
    [
        DateTime::<Utc>::MIN_UTC,
        "2026-03-29T00:30:00Z".parse().unwrap(),
        "2026-10-25T00:59:59.5Z".parse().unwrap(),
        "2011-12-29T12:00:00Z".parse().unwrap(),
        DateTime::<Utc>::MAX_UTC - chrono::Duration::days(400),
    ]
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Accepted,
    /// Refused, naming this field (`None`: the expression as a whole).
    Refused(Option<CronField>),
}

/// Parses `expr` in `tz`; an accepted expression is searched from several instants, a rejected
/// one must name its field.
fn check(expr: &str, tz: &str) -> Result<Outcome, TestCaseError> {
    match Cron::parse(expr, tz) {
        Ok(cron) => {
            let schedule = Schedule::Cron(cron);
            for after in search_starts() {
                let fires = schedule.preview(after, 3);
                prop_assert!(fires.iter().all(|&f| f > after), "{expr}");
                prop_assert!(fires.windows(2).all(|w| w[0] < w[1]), "{expr}");
            }
            Ok(Outcome::Accepted)
        }
        Err(e @ Error::InvalidCron { field, .. }) => {
            let msg = e.to_string();
            let parts: Vec<&str> = expr.split_ascii_whitespace().collect();
            let is_macro = parts.first().is_some_and(|p| p.starts_with('@'));
            match field {
                Some(f) => {
                    let prefix = format!("invalid cron expression: {}: ", f.name());
                    prop_assert!(msg.starts_with(&prefix), "{expr:?}: {msg}");
                    // A year is named exactly when there are 7 fields.
                    prop_assert_eq!(f == CronField::Year, parts.len() == 7 && !is_macro);
                    prop_assert!(is_macro || [5, 6, 7].contains(&parts.len()));
                }
                // Only the expression as a whole: its field count, or a macro.
                None if is_macro => prop_assert!(msg.contains("macro"), "{expr:?}: {msg}"),
                None => {
                    prop_assert!(![5, 6, 7].contains(&parts.len()), "{expr:?}: {msg}");
                    prop_assert!(msg.contains("expected 5 fields"), "{expr:?}: {msg}");
                }
            }
            Ok(Outcome::Refused(field))
        }
        Err(other) => Err(TestCaseError::fail(format!("{expr:?}: {other:?}"))),
    }
}

/// Pieces of cron syntax, valid and not, that soups are made of.
const PIECES: [&str; 48] = [
    "0",
    "1",
    "2",
    "5",
    "7",
    "8",
    "12",
    "13",
    "15",
    "23",
    "24",
    "29",
    "30",
    "31",
    "32",
    "59",
    "60",
    "99999999999",
    "MON",
    "fri",
    "SUN",
    "Jan",
    "DEC",
    "FOO",
    "*",
    "?",
    "L",
    "l",
    "W",
    "w",
    "LW",
    "#",
    "-",
    "/",
    ",",
    "@",
    "@daily",
    "@hourly",
    "@reboot",
    "FRIL",
    "5#2",
    "L-3",
    "15W",
    "é",
    "\u{a0}",
    "+",
    "",
    "0x1",
];

/// A field-sized soup: a list of one to three items, each a few pieces glued together.
fn soup_field() -> impl Strategy<Value = String> {
    let item =
        prop::collection::vec(prop::sample::select(&PIECES[..]), 1..=3).prop_map(|p| p.concat());
    prop::collection::vec(item, 1..=3).prop_map(|items| items.join(","))
}

/// Whole fields that are valid in some positions and not in others.
const ALMOST: [&str; 16] = [
    "*", "0", "1", "?", "1-5", "*/5", "7/15", "L", "LW", "L-3", "15W", "5L", "FRIL", "5#2",
    "MON-FRI", "JAN,JUL",
];

/// A whole soup: mostly five or six fields (so the fields themselves get parsed), else one to
/// eight, separated by blanks; each field is an [`ALMOST`] one or a soup of pieces.
fn soup() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        4 => prop::sample::select(&ALMOST[..]).prop_map(str::to_owned),
        1 => soup_field(),
    ];
    let count = prop_oneof![3 => 5usize..=6, 1 => 1usize..=8];
    let separator = prop::sample::select(&[" ", "  ", "\t", " \n "][..]);
    (
        count.prop_flat_map(move |n| prop::collection::vec(field.clone(), n)),
        separator,
    )
        .prop_map(|(fields, sep)| fields.join(sep))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_strings(text in any::<String>(), tz in prop::sample::select(&ZONES[..])) {
        check(&text, tz)?;
    }

    #[test]
    fn printable_strings(text in "[ -~]{0,40}", tz in prop::sample::select(&ZONES[..])) {
        check(&text, tz)?;
    }

    #[test]
    fn token_soups(text in soup(), tz in prop::sample::select(&ZONES[..])) {
        check(&text, tz)?;
    }

    /// A valid expression with one field replaced: a rejection names exactly that field.
    #[test]
    fn one_bad_field_is_the_one_named(
        base in prop::sample::select(&[
            ["0", "30", "2", "*", "*", "?"],
            ["*/10", "*", "*", "L", "*", "*"],
            ["0", "0", "9", "15W", "JAN-JUN", "?"],
            ["0", "0", "0", "?", "*", "5#2,FRIL"],
        ][..]),
        six in any::<bool>(),
        position in 0usize..6,
        replacement in soup_field().prop_filter("one field", |s| {
            !s.is_empty() && !s.contains(char::is_whitespace)
        }),
        tz in prop::sample::select(&ZONES[..]),
    ) {
        let mut fields = base.map(str::to_owned);
        fields[position] = replacement;
        // Without seconds, position 0 is dropped, so the replaced field must be another one.
        let skip = usize::from(!six);
        prop_assume!(six || position > 0);
        let expr = fields[skip..].join(" ");
        if let Outcome::Refused(named) = check(&expr, tz)? {
            // A leading `@` reads as a macro, and then the whole expression is at fault.
            let want = (!expr.starts_with('@')).then_some(SIX[position]);
            prop_assert_eq!(named, want, "{:?}", expr);
        }
    }
}

#[test]
fn named_field_examples() {
    // The property above on a few hand-picked cases, so a failure here reads plainly.
    let cases = [
        ("0 0 L-31 * *", CronField::DayOfMonth),
        ("0 0 * * L", CronField::DayOfWeek),
        ("0 0 * * 5#6", CronField::DayOfWeek),
        ("0 L * * *", CronField::Hour),
        ("0 0 * 5L *", CronField::Month),
        ("15W 0 0 * * *", CronField::Second),
        ("0 @daily * * *", CronField::Hour),
        ("0 0 0 1 1 ? 2026", CronField::Year),
    ];
    for (expr, want) in cases {
        assert_eq!(
            check(expr, "UTC").unwrap(),
            Outcome::Refused(Some(want)),
            "{expr}"
        );
    }
    assert_eq!(
        check("@daily 0 0 * * *", "UTC").unwrap(),
        Outcome::Refused(None)
    );
    assert_eq!(
        check("@weekly", "Europe/Berlin").unwrap(),
        Outcome::Accepted
    );
}
