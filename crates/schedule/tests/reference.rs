//! Property tests: `next_after` against a brute-force reference, and preview invariants.
//!
//! The reference shares no code with the crate. Expressions are generated as structured fields
//! whose matching sets the generator computes itself, then rendered to text for `Cron::parse`
//! (so parsing is checked too). The reference walks every local wall-clock minute of a window
//! (and every second of the matching minutes), maps each matching local time to instants with
//! the DESIGN.md §5 rules applied literally, and compares all fires in (after, after + horizon]
//! with what repeated `next_after` calls produce. `after` is drawn around real DST transitions.

use std::sync::OnceLock;

use chrono::{
    DateTime, Datelike, Duration, LocalResult, NaiveDateTime, Offset, TimeZone, Timelike, Utc,
};
use chrono_tz::Tz;
use chronoshard_schedule::{Cron, Schedule};
use proptest::prelude::*;

// ---------- expression generator ----------

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Second,
    Minute,
    Hour,
    Dom,
    Month,
    Dow,
}

impl Kind {
    fn bounds(self) -> (u32, u32) {
        match self {
            Kind::Second | Kind::Minute => (0, 59),
            Kind::Hour => (0, 23),
            Kind::Dom => (1, 31),
            Kind::Month => (1, 12),
            Kind::Dow => (0, 7),
        }
    }
    fn step_end(self) -> u32 {
        if self == Kind::Dow {
            6
        } else {
            self.bounds().1
        }
    }
}

/// One generated field: its text and the set of values it must match.
#[derive(Debug, Clone)]
struct GenField {
    text: String,
    set: u64,
    star: bool,
    single: bool,
}

const MONTHS: [&str; 12] = [
    "jan", "FEB", "Mar", "APR", "may", "JUN", "jul", "AUG", "Sep", "OCT", "nov", "DEC",
];
const DAYS: [&str; 7] = ["SUN", "mon", "Tue", "WED", "thu", "FRI", "sat"];

/// Renders a value, as a name when `named` and the field has names. `end` marks a range end,
/// where Sunday must be written `SUN` only for 7 (SUN as a range end means 7).
fn render(kind: Kind, v: u32, named: bool, end: bool) -> String {
    match kind {
        Kind::Month if named => MONTHS[v as usize - 1].to_string(),
        Kind::Dow if named && (1..=6).contains(&v) => DAYS[v as usize].to_string(),
        Kind::Dow if named && v == 7 && end => "SUN".into(),
        Kind::Dow if named && v == 0 && !end => "sun".into(),
        _ => v.to_string(),
    }
}

fn bits(lo: u32, hi: u32, step: u32) -> u64 {
    (lo..=hi).step_by(step as usize).fold(0, |b, v| b | 1 << v)
}

fn fold7(kind: Kind, set: u64) -> u64 {
    if kind == Kind::Dow && set & (1 << 7) != 0 {
        (set & !(1 << 7)) | 1
    } else {
        set
    }
}

/// A value, biased towards the small hours where DST transitions happen.
fn value(kind: Kind) -> BoxedStrategy<u32> {
    let (lo, hi) = kind.bounds();
    if kind == Kind::Hour {
        prop_oneof![0u32..=4, lo..=hi].boxed()
    } else {
        (lo..=hi).boxed()
    }
}

/// One list item: value, range, or one of the three step forms.
fn item(kind: Kind) -> BoxedStrategy<(String, u64)> {
    let (lo, hi) = kind.bounds();
    let span = hi - lo + 1;
    prop_oneof![
        (value(kind), any::<bool>())
            .prop_map(move |(v, n)| (render(kind, v, n, false), bits(v, v, 1))),
        (value(kind), value(kind), any::<bool>()).prop_map(move |(a, b, n)| {
            let (a, b) = (a.min(b), a.max(b));
            (
                format!("{}-{}", render(kind, a, n, false), render(kind, b, n, true)),
                bits(a, b, 1),
            )
        }),
        (1..=span).prop_map(move |s| (format!("*/{s}"), bits(lo, kind.step_end(), s))),
        (value(kind), 1..=span)
            .prop_map(move |(a, s)| { (format!("{a}/{s}"), bits(a, kind.step_end().max(a), s)) }),
        (value(kind), value(kind), 1..=span).prop_map(move |(a, b, s)| {
            let (a, b) = (a.min(b), a.max(b));
            (format!("{a}-{b}/{s}"), bits(a, b, s))
        }),
    ]
    .boxed()
}

/// A whole field; `star_weight` biases towards `*` for fields that would otherwise rarely
/// match inside the test window (days, months).
fn field(kind: Kind, star_weight: u32) -> BoxedStrategy<GenField> {
    let (lo, hi) = kind.bounds();
    let full = fold7(kind, bits(lo, hi, 1));
    let day_field = matches!(kind, Kind::Dom | Kind::Dow);
    let list = prop::collection::vec(item(kind), 1..=3).prop_map(move |items| {
        let single = items.len() == 1 && !items[0].0.contains(['-', '/', '*']);
        let text = items
            .iter()
            .map(|(t, _)| t.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let set = fold7(kind, items.iter().fold(0, |b, (_, s)| b | s));
        GenField {
            star: text.starts_with('*'),
            text,
            set,
            single,
        }
    });
    let star = prop_oneof![Just("*"), Just(if day_field { "?" } else { "*" })].prop_map(move |t| {
        GenField {
            text: t.into(),
            set: full,
            star: true,
            single: false,
        }
    });
    if kind == Kind::Hour {
        // The DST rules hinge on a single-value hour; make it common, and near the transitions.
        let single = (0u32..=3).prop_map(|v| GenField {
            text: v.to_string(),
            set: 1 << v,
            star: false,
            single: true,
        });
        return prop_oneof![star_weight => star, 10 => list, 8 => single].boxed();
    }
    prop_oneof![star_weight => star, 10 => list].boxed()
}

#[derive(Debug, Clone)]
struct GenCron {
    seconds: GenField,
    with_seconds: bool,
    minute: GenField,
    hour: GenField,
    dom: GenField,
    month: GenField,
    dow: GenField,
}

impl GenCron {
    fn text(&self) -> String {
        let five = [&self.minute, &self.hour, &self.dom, &self.month, &self.dow]
            .map(|f| f.text.as_str())
            .join(" ");
        if self.with_seconds {
            format!("{} {five}", self.seconds.text)
        } else {
            five
        }
    }

    fn seconds_set(&self) -> u64 {
        if self.with_seconds {
            self.seconds.set
        } else {
            1
        }
    }

    /// Minute-level match, with the Vixie day rule decided on the fields' leading `*`/`?`.
    fn matches_minute(&self, l: NaiveDateTime) -> bool {
        let dom = self.dom.set & (1 << l.day()) != 0;
        let dow = self.dow.set & (1 << l.weekday().num_days_from_sunday()) != 0;
        let day = if self.dom.star || self.dow.star {
            dom && dow
        } else {
            dom || dow
        };
        day && self.month.set & (1 << l.month()) != 0
            && self.hour.set & (1 << l.hour()) != 0
            && self.minute.set & (1 << l.minute()) != 0
    }
}

fn gen_cron() -> impl Strategy<Value = GenCron> {
    (
        field(Kind::Second, 3),
        any::<bool>(),
        field(Kind::Minute, 2),
        field(Kind::Hour, 4),
        field(Kind::Dom, 30),
        field(Kind::Month, 30),
        field(Kind::Dow, 20),
    )
        .prop_map(
            |(seconds, with_seconds, minute, hour, dom, month, dow)| GenCron {
                seconds,
                with_seconds,
                minute,
                hour,
                dom,
                month,
                dow,
            },
        )
}

// ---------- reference ----------

/// First instant after the gap containing nonexistent local time `l`: walk local time forward
/// minute by minute until it exists again, then back second by second to its first second.
fn gap_end(tz: Tz, l: NaiveDateTime) -> (NaiveDateTime, DateTime<Utc>) {
    let exists = |x: NaiveDateTime| !matches!(tz.from_local_datetime(&x), LocalResult::None);
    let mut x = l;
    while !exists(x) {
        x += Duration::minutes(1);
    }
    // The gap ends somewhere in (x - 1 minute, x]; x - 1 minute does not exist.
    while exists(x - Duration::seconds(1)) {
        x -= Duration::seconds(1);
    }
    let first = tz.from_local_datetime(&x).earliest().unwrap();
    (x, first.with_timezone(&Utc))
}

/// Every fire in `(after, until]`, by walking every local minute that could map there.
fn reference_fires(
    c: &GenCron,
    tz: Tz,
    after: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    // Offsets are within -12h..+14h (Samoa's jump included), so local times of instants in
    // (after, until] lie inside this window.
    let mut l = (after.naive_utc() - Duration::hours(15))
        .with_second(0)
        .unwrap()
        .with_nanosecond(0)
        .unwrap();
    let stop = until.naive_utc() + Duration::hours(15);
    let single = c.hour.single;
    let mut out = Vec::new();
    let mut last_gap: Option<(NaiveDateTime, NaiveDateTime, DateTime<Utc>)> = None;
    while l <= stop {
        if c.matches_minute(l) {
            for s in (0..60).filter(|s| c.seconds_set() & (1 << s) != 0) {
                let lt = l.with_second(s).unwrap();
                match tz.from_local_datetime(&lt) {
                    LocalResult::Single(u) => out.push(u.with_timezone(&Utc)),
                    LocalResult::Ambiguous(a, b) => {
                        out.push(a.with_timezone(&Utc));
                        if !single {
                            out.push(b.with_timezone(&Utc));
                        }
                    }
                    LocalResult::None if single => {
                        let end = match last_gap {
                            Some((from, to, end)) if from <= lt && lt < to => end,
                            _ => {
                                let (to, end) = gap_end(tz, lt);
                                last_gap = Some((lt, to, end));
                                end
                            }
                        };
                        out.push(end);
                    }
                    LocalResult::None => {}
                }
            }
        }
        l += Duration::minutes(1);
    }
    out.sort();
    out.dedup();
    out.retain(|&u| u > after && u <= until);
    out
}

fn actual_fires(cron: &Cron, after: DateTime<Utc>, until: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let mut out = Vec::new();
    let mut cur = after;
    while let Some(next) = cron.next_after(cur) {
        assert!(next > cur, "not strictly after: {next} <= {cur}");
        if next > until {
            break;
        }
        out.push(next);
        cur = next;
    }
    out
}

// ---------- where `after` is drawn ----------

/// (zone, instant) pairs: every offset change of the zones in the test years (and the instants
/// one shift before and after it), plus a plain instant per zone.
fn anchors() -> &'static [(Tz, DateTime<Utc>)] {
    static ANCHORS: OnceLock<Vec<(Tz, DateTime<Utc>)>> = OnceLock::new();
    ANCHORS.get_or_init(|| {
        let mut out = Vec::new();
        let zones: [(&str, i32, i32); 7] = [
            ("Europe/Berlin", 2025, 2027),
            ("America/New_York", 2025, 2027),
            ("Australia/Lord_Howe", 2025, 2027),
            ("Asia/Kolkata", 1941, 1946),
            ("America/Sao_Paulo", 2017, 2019),
            ("Pacific/Apia", 2011, 2012),
            ("UTC", 2026, 2026),
        ];
        for (name, from, to) in zones {
            let tz: Tz = name.parse().unwrap();
            for t in transitions(tz, from, to) {
                // Also where an overlap's first pass starts and its second pass ends.
                let shift = Duration::seconds(
                    (offset(tz, t) - offset(tz, t - Duration::seconds(1)))
                        .abs()
                        .into(),
                );
                out.extend([(tz, t), (tz, t - shift), (tz, t + shift)]);
            }
            let plain = Utc.with_ymd_and_hms(from, 6, 15, 12, 0, 0).unwrap();
            out.push((tz, plain));
        }
        out.push((
            Tz::UTC,
            Utc.with_ymd_and_hms(2024, 2, 28, 23, 0, 0).unwrap(),
        ));
        out
    })
}

fn offset(tz: Tz, t: DateTime<Utc>) -> i32 {
    tz.offset_from_utc_datetime(&t.naive_utc())
        .fix()
        .local_minus_utc()
}

/// All instants in the given years at which `tz`'s UTC offset changes (day steps, then bisection).
fn transitions(tz: Tz, from_year: i32, to_year: i32) -> Vec<DateTime<Utc>> {
    let mut out = Vec::new();
    let mut t = Utc.with_ymd_and_hms(from_year, 1, 1, 0, 0, 0).unwrap();
    let end = Utc.with_ymd_and_hms(to_year + 1, 1, 1, 0, 0, 0).unwrap();
    while t < end {
        let next = t + Duration::days(1);
        if offset(tz, t) != offset(tz, next) {
            let (mut lo, mut hi) = (t, next);
            while hi - lo > Duration::seconds(1) {
                let mid = lo + (hi - lo) / 2;
                let mid = DateTime::from_timestamp(mid.timestamp(), 0).unwrap();
                if offset(tz, mid) == offset(tz, t) {
                    lo = mid
                } else {
                    hi = mid
                }
            }
            out.push(hi);
        }
        t = next;
    }
    out
}

/// An instant near an anchor: often within seconds of it, sometimes with a sub-second part.
fn near_anchor() -> impl Strategy<Value = (Tz, DateTime<Utc>)> {
    let n = anchors().len();
    (
        0..n,
        prop_oneof![-2i64..=1, -5400i64..=5400, -129_600i64..=129_600],
        prop_oneof![3 => Just(0u32), 1 => 0u32..1_000_000_000],
    )
        .prop_map(|(i, secs, nanos)| {
            let (tz, t) = anchors()[i];
            (
                tz,
                t + Duration::seconds(secs) + Duration::nanoseconds(nanos.into()),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// All fires in the next 36 hours (3 hours with a seconds field) equal the reference.
    #[test]
    fn next_after_matches_reference(c in gen_cron(), (tz, after) in near_anchor()) {
        let text = c.text();
        let cron = Cron::parse(&text, tz.name()).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        let horizon = if c.with_seconds { Duration::hours(3) } else { Duration::hours(36) };
        let until = after + horizon;
        let want = reference_fires(&c, tz, after, until);
        let got = actual_fires(&cron, after, until);
        prop_assert_eq!(got, want, "expr {:?} tz {} after {}", text, tz.name(), after);
    }

    /// Preview: at most `count`, strictly increasing, all strictly after `after`, for every kind.
    #[test]
    fn preview_invariants(
        c in gen_cron(),
        (tz, after) in near_anchor(),
        kind in 0u8..3,
        every_ms in 1u64..10_000_000,
        start_offset_s in -100_000i64..100_000,
        count in 0usize..40,
    ) {
        let start_at = after + Duration::seconds(start_offset_s);
        let schedule = match kind {
            0 => Schedule::Cron(Cron::parse(&c.text(), tz.name()).unwrap()),
            1 => Schedule::every(std::time::Duration::from_millis(every_ms), start_at, None).unwrap(),
            _ => Schedule::At(start_at),
        };
        let fires = schedule.preview(after, count);
        prop_assert!(fires.len() <= count);
        prop_assert!(fires.iter().all(|&f| f > after));
        prop_assert!(fires.windows(2).all(|w| w[0] < w[1]));
        if let Schedule::Every { every, .. } = schedule {
            // Every fire is on the grid start_at + k·every.
            for f in &fires {
                let k = (*f - start_at).num_milliseconds() as u64;
                prop_assert_eq!(k % every.as_millis() as u64, 0);
            }
            if count > 0 && start_at > after {
                prop_assert_eq!(fires[0], start_at);
            }
        }
    }
}
