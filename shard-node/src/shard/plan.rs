//! What to do with a job's due occurrences when the wheel fires it: which fire, which are recorded
//! as missed or skipped (catch-up policy), and the job's next occurrence. Pure: the caller passes
//! `now`, so this is tested without a clock.
//!
//! A one-shot (`at`, `delay`) always fires, however late. For recurring schedules, an occurrence
//! is *on time* when it is at most `GRACE_MS` old: it fires whatever the policy. Older
//! ones came due while the shard could not fire them (node down, shard moving); for those:
//! - `skip`: recorded as skipped;
//! - `latest`: only the most recent due occurrence fires; older ones are recorded as missed;
//! - `all`: each fires, oldest first.
//!
//! With every policy an occurrence older than the catch-up window is recorded as missed.
//! Consecutive not-fired occurrences with the same status and reason become one range row.

use chronoshard_schedule::Schedule;
use chronoshard_wire::{CatchupPolicy, CatchupSpec, RunStatus};

use super::store::NotFiredRow;

/// Lateness up to which an occurrence counts as on time (a busy node, not an outage).
pub const GRACE_MS: i64 = 2_000;
/// Occurrences examined in one plan; the rest are planned on the next pass, so one job with a
/// very long outage cannot stall its shard.
pub const MAX_STEPS: usize = 100_000;
/// Occurrences fired in one plan, for the same reason.
pub const MAX_FIRES: usize = 1_000;

pub const REASON_WINDOW: &str = "older than the catch-up window";
pub const REASON_SUPERSEDED: &str = "superseded by a later occurrence (catch-up policy latest)";
pub const REASON_SKIP: &str = "came due while the shard was not firing (catch-up policy skip)";

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Occurrences to fire, oldest first (ms).
    pub fire: Vec<i64>,
    pub not_fired: Vec<NotFiredRow>,
    /// The job's next occurrence after this plan; None when the schedule has no more.
    pub next: Option<i64>,
}

/// Plans the occurrences of `schedule` from `first` (the job's next occurrence) up to `now`.
pub fn plan(schedule: &Schedule, first: i64, now: i64, catchup: &CatchupSpec) -> Plan {
    let mut plan = Plan::default();
    let window = catchup.window.as_millis();
    let mut pending_latest: Option<i64> = None;
    let mut at = Some(first);
    let mut steps = 0;
    while let Some(t) = at.filter(|t| *t <= now) {
        if steps == MAX_STEPS || plan.fire.len() == MAX_FIRES {
            break;
        }
        steps += 1;
        let late = now - t;
        // A one-shot is due at once however late: catch-up policies are about recurring
        // schedules (an `at` in the past is due at once).
        if late <= GRACE_MS || matches!(schedule, Schedule::At(_)) {
            if let Some(prev) = pending_latest.take() {
                not_fired(
                    &mut plan.not_fired,
                    prev,
                    RunStatus::Missed,
                    REASON_SUPERSEDED,
                );
            }
            plan.fire.push(t);
        } else if late > window {
            not_fired(&mut plan.not_fired, t, RunStatus::Missed, REASON_WINDOW);
        } else {
            match catchup.policy {
                CatchupPolicy::Skip => {
                    not_fired(&mut plan.not_fired, t, RunStatus::Skipped, REASON_SKIP)
                }
                CatchupPolicy::All => plan.fire.push(t),
                CatchupPolicy::Latest => {
                    if let Some(prev) = pending_latest.replace(t) {
                        not_fired(
                            &mut plan.not_fired,
                            prev,
                            RunStatus::Missed,
                            REASON_SUPERSEDED,
                        );
                    }
                }
            }
        }
        at = schedule
            .next_after(chronoshard_wire::from_millis(t))
            .map(chronoshard_wire::to_millis);
    }
    if let Some(t) = pending_latest {
        plan.fire.push(t);
    }
    plan.next = at;
    plan
}

fn not_fired(rows: &mut Vec<NotFiredRow>, t: i64, status: RunStatus, reason: &str) {
    if let Some(last) = rows.last_mut() {
        if last.status == status && last.reason == reason {
            last.last = t;
            last.count += 1;
            return;
        }
    }
    rows.push(NotFiredRow {
        first: t,
        last: t,
        count: 1,
        status,
        reason: reason.to_string(),
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::{TimeZone, Utc};
    use chronoshard_wire::Dur;

    use super::*;

    const S: i64 = 1_000;

    fn every_second() -> Schedule {
        Schedule::every(
            Duration::from_secs(1),
            Utc.timestamp_opt(0, 0).unwrap(),
            None,
        )
        .unwrap()
    }

    fn spec(policy: CatchupPolicy, window_s: u64) -> CatchupSpec {
        CatchupSpec {
            policy,
            window: Dur(Duration::from_secs(window_s)),
        }
    }

    #[test]
    fn on_time_fires_one_and_moves_on() {
        let p = plan(
            &every_second(),
            100 * S,
            100 * S + 3,
            &spec(CatchupPolicy::Skip, 60),
        );
        assert_eq!(
            p,
            Plan {
                fire: vec![100 * S],
                not_fired: vec![],
                next: Some(101 * S)
            }
        );
    }

    #[test]
    fn latest_fires_only_the_newest_late_one() {
        // down from 100 s to 110.5 s: 100..=108 are late, 109 and 110 are within grace
        let p = plan(
            &every_second(),
            100 * S,
            110 * S + 500,
            &spec(CatchupPolicy::Latest, 3600),
        );
        assert_eq!(p.fire, vec![109 * S, 110 * S]);
        assert_eq!(p.not_fired.len(), 1);
        let r = &p.not_fired[0];
        assert_eq!(
            (r.first, r.last, r.count, r.status),
            (100 * S, 108 * S, 9, RunStatus::Missed)
        );
        assert_eq!(p.next, Some(111 * S));
    }

    #[test]
    fn latest_with_nothing_on_time_fires_the_last_late_one() {
        let sched = Schedule::every(
            Duration::from_secs(10),
            Utc.timestamp_opt(0, 0).unwrap(),
            None,
        )
        .unwrap();
        let p = plan(&sched, 100 * S, 135 * S, &spec(CatchupPolicy::Latest, 3600));
        assert_eq!(p.fire, vec![130 * S]);
        assert_eq!(p.not_fired[0].count, 3);
        assert_eq!(p.next, Some(140 * S));
    }

    #[test]
    fn all_fires_within_window_and_misses_older() {
        let p = plan(
            &every_second(),
            100 * S,
            120 * S,
            &spec(CatchupPolicy::All, 10),
        );
        assert_eq!(p.fire, (110..=120).map(|s| s * S).collect::<Vec<_>>());
        assert_eq!(p.not_fired[0].reason, REASON_WINDOW);
        assert_eq!(p.not_fired[0].count, 10);
    }

    #[test]
    fn skip_records_skipped() {
        let p = plan(
            &every_second(),
            100 * S,
            105 * S,
            &spec(CatchupPolicy::Skip, 3600),
        );
        assert_eq!(p.fire, vec![103 * S, 104 * S, 105 * S]);
        assert_eq!(
            (p.not_fired[0].status, p.not_fired[0].count),
            (RunStatus::Skipped, 3)
        );
    }

    #[test]
    fn a_one_shot_fires_however_late_and_whatever_the_policy() {
        let at = Schedule::At(chronoshard_wire::from_millis(5 * S));
        for policy in [
            CatchupPolicy::Skip,
            CatchupPolicy::Latest,
            CatchupPolicy::All,
        ] {
            let p = plan(&at, 5 * S, 5 * S + 7_200_000, &spec(policy, 60));
            assert_eq!((p.fire, p.not_fired, p.next), (vec![5 * S], vec![], None));
        }
    }

    #[test]
    fn a_one_shot_completes() {
        let p = plan(
            &Schedule::At(chronoshard_wire::from_millis(5 * S)),
            5 * S,
            5 * S + 1,
            &CatchupSpec::default(),
        );
        assert_eq!((p.fire, p.next), (vec![5 * S], None));
    }

    #[test]
    fn long_outages_are_planned_in_bounded_steps() {
        let ms_sched = Schedule::every(
            Duration::from_millis(1),
            Utc.timestamp_opt(0, 0).unwrap(),
            None,
        )
        .unwrap();
        let p = plan(&ms_sched, 0, 10_000_000, &spec(CatchupPolicy::Latest, 1));
        assert_eq!(p.fire, Vec::<i64>::new());
        assert_eq!(p.not_fired[0].count as usize, MAX_STEPS);
        assert_eq!(p.next, Some(MAX_STEPS as i64));
    }
}
