//! Property tests: `next_after` against a brute-force reference, and preview invariants.
//!
//! The reference shares no code with the crate. Expressions are generated as structured fields
//! whose meaning the generator (`gen`) works out itself: a set of values per field, plus the
//! Quartz day tokens (`L`, `L-3`, `15W`, `LW`, `5L`, `5#2`, in lists, any case) and macros.
//! They are rendered to text for `Cron::parse` (so parsing is checked too). The reference
//! (`model`) decides each date by the tokens' definitions, walks every local wall-clock minute
//! of a window (and every second of the matching minutes), maps each matching local time to
//! instants with the crate's DST rules applied literally, and compares all fires in
//! (after, after + horizon] with what repeated `next_after` calls produce. `after` is drawn
//! around real DST transitions, of chosen zones and of random ones; a second property runs day
//! tokens over two years in random zones.

mod gen;
mod model;

use chrono::{DateTime, Duration, Utc};
use chronoshard_schedule::{Cron, Schedule};
use proptest::prelude::*;

use gen::{gen_cron, gen_day_cron};
use model::{near_anchor, random_zone_instant, reference_fires, reference_fires_by_day};

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

    /// Day tokens over two years (every month shape comes up), in any zone: all fires equal
    /// the reference's, which walks the dates one by one.
    #[test]
    fn day_tokens_match_reference_over_years(
        c in gen_day_cron(),
        (tz, after) in prop_oneof![near_anchor(), random_zone_instant()],
    ) {
        let text = c.text();
        let cron = Cron::parse(&text, tz.name()).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        let until = after + Duration::days(731);
        let want = reference_fires_by_day(&c, tz, after, until);
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
