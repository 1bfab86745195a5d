//! The brute-force reference: which local times match (day tokens by their definitions, date by
//! date), which instants they fire at (the crate's DST rules applied literally), and the
//! instants `after` is drawn around (real offset changes, in chosen and in random zones).

use std::sync::OnceLock;

use chrono::{
    DateTime, Datelike, Duration, LocalResult, NaiveDate, NaiveDateTime, Offset, TimeZone,
    Timelike, Utc,
};
use chrono_tz::{Tz, TZ_VARIANTS};
use proptest::prelude::*;

use crate::gen::{DayRule, GenCron};

// ---------- which local times match ----------

/// The number of days in `d`'s month, by asking the calendar which day numbers exist.
fn month_len(d: NaiveDate) -> u32 {
    (28..=31).rev().find(|&n| d.with_day(n).is_some()).unwrap()
}

fn weekday(d: NaiveDate) -> u32 {
    d.weekday().num_days_from_sunday()
}

/// Quartz's "nearest weekday" to day `target` of `d`'s month, stated as a search: the Monday to
/// Friday of the same month closest to the target (there are never two equally close).
fn closest_weekday(d: NaiveDate, target: u32) -> Option<u32> {
    (1..=month_len(d))
        .filter(|&n| (1..=5).contains(&weekday(d.with_day(n).unwrap())))
        .min_by_key(|&n| n.abs_diff(target))
}

impl DayRule {
    /// Whether date `d` is a day this token selects.
    pub fn matches(self, d: NaiveDate) -> bool {
        let len = month_len(d);
        match self {
            DayRule::Last(n) => d.day() + n == len,
            DayRule::LastNearest(n) => n < len && closest_weekday(d, len - n) == Some(d.day()),
            DayRule::Nearest(t) => t <= len && closest_weekday(d, t) == Some(d.day()),
            // No later day of the same weekday in this month.
            DayRule::LastOf(w) => weekday(d) == w && (d + Duration::days(7)).month() != d.month(),
            // k-1 earlier days of the same weekday in this month.
            DayRule::Nth(w, k) => weekday(d) == w && (d.day() - 1) / 7 + 1 == k,
        }
    }
}

impl GenCron {
    /// Day-level match, with the Vixie day rule decided on the fields' leading `*`/`?`.
    pub fn matches_day(&self, d: NaiveDate) -> bool {
        let dom = self.dom.set & (1 << d.day()) != 0 || self.dom.rules.iter().any(|r| r.matches(d));
        let dow =
            self.dow.set & (1 << weekday(d)) != 0 || self.dow.rules.iter().any(|r| r.matches(d));
        let day = if self.dom.star || self.dow.star {
            dom && dow
        } else {
            dom || dow
        };
        day && self.month.set & (1 << d.month()) != 0
    }

    fn matches_minute(&self, l: NaiveDateTime) -> bool {
        self.hour.set & (1 << l.hour()) != 0
            && self.minute.set & (1 << l.minute()) != 0
            && self.matches_day(l.date())
    }
}

// ---------- which instants they fire at ----------

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

/// Collects the instants matching local times fire at, by the crate's DST rules.
struct Fires {
    tz: Tz,
    single_hour: bool,
    out: Vec<DateTime<Utc>>,
    /// The last gap seen: (first missing local time seen, gap end local, gap end instant).
    last_gap: Option<(NaiveDateTime, NaiveDateTime, DateTime<Utc>)>,
}

impl Fires {
    fn new(c: &GenCron, tz: Tz) -> Fires {
        Fires {
            tz,
            single_hour: c.hour.single,
            out: Vec::new(),
            last_gap: None,
        }
    }

    fn push(&mut self, lt: NaiveDateTime) {
        match self.tz.from_local_datetime(&lt) {
            LocalResult::Single(u) => self.out.push(u.with_timezone(&Utc)),
            LocalResult::Ambiguous(a, b) => {
                self.out.push(a.with_timezone(&Utc));
                if !self.single_hour {
                    self.out.push(b.with_timezone(&Utc));
                }
            }
            LocalResult::None if self.single_hour => {
                let end = match self.last_gap {
                    Some((from, to, end)) if from <= lt && lt < to => end,
                    _ => {
                        let (to, end) = gap_end(self.tz, lt);
                        self.last_gap = Some((lt, to, end));
                        end
                    }
                };
                self.out.push(end);
            }
            LocalResult::None => {}
        }
    }

    /// The fires in `(after, until]`, sorted, each once.
    fn finish(mut self, after: DateTime<Utc>, until: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        self.out.sort();
        self.out.dedup();
        self.out.retain(|&u| u > after && u <= until);
        self.out
    }
}

/// Offsets are within -12h..+14h (Samoa's jump included), so local times of instants in
/// (after, until] lie inside this local window.
fn local_window(after: DateTime<Utc>, until: DateTime<Utc>) -> (NaiveDateTime, NaiveDateTime) {
    let start = (after.naive_utc() - Duration::hours(15))
        .with_second(0)
        .unwrap()
        .with_nanosecond(0)
        .unwrap();
    (start, until.naive_utc() + Duration::hours(15))
}

/// Every fire in `(after, until]`, by walking every local minute that could map there.
pub fn reference_fires(
    c: &GenCron,
    tz: Tz,
    after: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    let (mut l, stop) = local_window(after, until);
    let mut fires = Fires::new(c, tz);
    while l <= stop {
        if c.matches_minute(l) {
            for s in (0..60).filter(|s| c.seconds_set() & (1 << s) != 0) {
                fires.push(l.with_second(s).unwrap());
            }
        }
        l += Duration::minutes(1);
    }
    fires.finish(after, until)
}

/// Every fire in `(after, until]`, by walking every local date and, on matching dates, every
/// combination of the hour, minute and second sets: the same reference, cheap enough for
/// windows of years.
pub fn reference_fires_by_day(
    c: &GenCron,
    tz: Tz,
    after: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    let (start, stop) = local_window(after, until);
    let values = |set: u64, max: u32| (0..=max).filter(move |v| set & (1 << v) != 0);
    let mut fires = Fires::new(c, tz);
    let mut d = start.date();
    while d <= stop.date() {
        if c.matches_day(d) {
            for h in values(c.hour.set, 23) {
                for m in values(c.minute.set, 59) {
                    for s in values(c.seconds_set(), 59) {
                        fires.push(d.and_hms_opt(h, m, s).unwrap());
                    }
                }
            }
        }
        d = d.succ_opt().unwrap();
    }
    fires.finish(after, until)
}

// ---------- where `after` is drawn ----------

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

/// A transition and the instants one shift before and after it: where an overlap's first pass
/// starts and its second pass ends.
fn around(tz: Tz, t: DateTime<Utc>) -> [DateTime<Utc>; 3] {
    let shift = Duration::seconds(
        (offset(tz, t) - offset(tz, t - Duration::seconds(1)))
            .abs()
            .into(),
    );
    [t, t - shift, t + shift]
}

/// (zone, instant) pairs: every offset change of the zones in the test years (and the instants
/// one shift before and after it), plus a plain instant per zone.
fn anchors() -> &'static [(Tz, DateTime<Utc>)] {
    static ANCHORS: OnceLock<Vec<(Tz, DateTime<Utc>)>> = OnceLock::new();
    ANCHORS.get_or_init(|| {
        let mut out = Vec::new();
        let zones: [(&str, i32, i32); 8] = [
            ("Europe/Berlin", 2025, 2027),
            ("America/New_York", 2025, 2027),
            ("Australia/Lord_Howe", 2025, 2027),
            ("Asia/Kolkata", 1941, 1946),
            ("America/Sao_Paulo", 2017, 2019),
            ("Pacific/Apia", 2011, 2012),
            // Changes on a Friday (the one before the last Sunday of March): W and L days.
            ("Asia/Jerusalem", 2025, 2026),
            ("UTC", 2026, 2026),
        ];
        for (name, from, to) in zones {
            let tz: Tz = name.parse().unwrap();
            for t in transitions(tz, from, to) {
                out.extend(around(tz, t).map(|a| (tz, a)));
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

/// Near a transition of a random zone in a random year (a random instant of that year when
/// the zone has none).
fn random_zone_transition() -> impl Strategy<Value = (Tz, DateTime<Utc>)> {
    (
        0..TZ_VARIANTS.len(),
        1970i32..=2037,
        any::<prop::sample::Index>(),
        0i64..365 * 86_400,
    )
        .prop_map(|(z, year, pick, secs)| {
            let tz = TZ_VARIANTS[z];
            let found: Vec<_> = transitions(tz, year, year)
                .into_iter()
                .flat_map(|t| around(tz, t))
                .collect();
            let t = if found.is_empty() {
                Utc.with_ymd_and_hms(year, 1, 1, 0, 0, 0).unwrap() + Duration::seconds(secs)
            } else {
                found[pick.index(found.len())]
            };
            (tz, t)
        })
}

/// An instant near an anchor or a random zone's transition: often within seconds of it,
/// sometimes with a sub-second part.
pub fn near_anchor() -> impl Strategy<Value = (Tz, DateTime<Utc>)> {
    let n = anchors().len();
    let base = prop_oneof![
        3 => (0..n).prop_map(|i| anchors()[i]),
        1 => random_zone_transition(),
    ];
    (
        base,
        prop_oneof![-2i64..=1, -5400i64..=5400, -129_600i64..=129_600],
        prop_oneof![3 => Just(0u32), 1 => 0u32..1_000_000_000],
    )
        .prop_map(|((tz, t), secs, nanos)| {
            (
                tz,
                t + Duration::seconds(secs) + Duration::nanoseconds(nanos.into()),
            )
        })
}

/// Any zone, any instant from 1900 to 2100 (where chrono-tz has history and rules).
pub fn random_zone_instant() -> impl Strategy<Value = (Tz, DateTime<Utc>)> {
    (0..TZ_VARIANTS.len(), -2_208_988_800i64..4_102_444_800)
        .prop_map(|(z, secs)| (TZ_VARIANTS[z], DateTime::from_timestamp(secs, 0).unwrap()))
}
