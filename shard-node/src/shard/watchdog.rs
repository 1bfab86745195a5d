//! The timeout watchdog's rule for a started attempt that has not reported a result. Pure: the
//! shard loop asks it what to do at a check and re-arms or declares the attempt lost.
//!
//! A worker enforces the ticket's timeout itself and reports a failure when it passes, so the
//! watchdog only acts when a result is missing: the worker died, was cut off, or its report was
//! lost. It waits `timeout + SLACK` after the (latest) start; past that, an attempt that showed
//! life within `STALE_MS` gets up to the hard limit (`2 × timeout + SLACK`), one without is lost.
//! A lost attempt is failed with a reason and retried per policy. Times are the shard's.

/// Time for a result to travel and for the worker's own timeout to fire before the shard decides.
pub const SLACK_MS: i64 = 10_000;
/// No sign of life (start or progress report) for this long means the worker is gone. It exceeds
/// what a worker's death costs before another worker shows life: JetStream redelivers the ticket
/// `ack_wait` (30 s) after the dead worker's last progress ack, and the new worker reports its
/// start at once and progress every 10 s. A shorter wait would retry a ticket already running
/// again elsewhere.
pub const STALE_MS: i64 = 60_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Check again at this instant.
    WaitUntil(i64),
    /// No result will come: fail the attempt with this reason.
    Lost(String),
}

/// When to check a started attempt first.
pub fn first_check(started_at: i64, timeout_ms: i64) -> i64 {
    started_at
        .saturating_add(timeout_ms)
        .saturating_add(SLACK_MS)
}

/// What to do about an attempt started at `started_at` with no result at `now`.
pub fn verdict(started_at: i64, progress_at: Option<i64>, timeout_ms: i64, now: i64) -> Verdict {
    let soft = first_check(started_at, timeout_ms);
    if now < soft {
        return Verdict::WaitUntil(soft);
    }
    let hard = soft.saturating_add(timeout_ms);
    let beat = progress_at.unwrap_or(started_at).max(started_at);
    if now >= hard {
        return Verdict::Lost(format!(
            "lost: no result {} ms after the start, past the hard limit of twice the timeout",
            now - started_at
        ));
    }
    if now - beat < STALE_MS {
        return Verdict::WaitUntil(hard.min(beat + STALE_MS));
    }
    Verdict::Lost(format!(
        "lost: no result {} ms after the start and no progress report for {} ms",
        now - started_at,
        now - beat
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_silent_worker_is_lost_at_timeout_plus_slack() {
        // timeout 60 s, no progress since the start: lost at the first check
        assert_eq!(verdict(0, None, 60_000, 1_000), Verdict::WaitUntil(70_000));
        assert!(
            matches!(verdict(0, None, 60_000, 70_000), Verdict::Lost(r) if r.contains("no progress"))
        );
        // timeout 5 s, shorter than the progress interval: the start counts as the last sign of
        // life, so the hard limit (20 s) comes first
        assert_eq!(verdict(0, None, 5_000, 15_000), Verdict::WaitUntil(20_000));
        assert!(
            matches!(verdict(0, None, 5_000, 20_000), Verdict::Lost(r) if r.contains("hard limit"))
        );
    }

    #[test]
    fn a_worker_reporting_progress_gets_until_the_hard_limit() {
        // timeout 60 s: soft check at 70 s, hard limit at 130 s
        assert_eq!(
            verdict(0, Some(65_000), 60_000, 70_000),
            Verdict::WaitUntil(125_000)
        );
        assert_eq!(
            verdict(0, Some(120_000), 60_000, 125_000),
            Verdict::WaitUntil(130_000)
        );
        assert!(
            matches!(verdict(0, Some(129_000), 60_000, 130_000), Verdict::Lost(r) if r.contains("hard limit"))
        );
    }

    proptest! {
        #[test]
        fn waits_always_move_forward_and_end_by_the_hard_limit(
            started in 0i64..1_000_000,
            timeout in 1i64..10_000_000,
            beat_after in proptest::option::of(0i64..30_000_000),
            at in 0i64..40_000_000,
        ) {
            let now = started + at;
            let progress = beat_after.map(|b| started + b).filter(|b| *b <= now);
            match verdict(started, progress, timeout, now) {
                Verdict::WaitUntil(t) => {
                    prop_assert!(t > now);
                    prop_assert!(t <= started + 2 * timeout + SLACK_MS);
                }
                Verdict::Lost(_) => prop_assert!(now >= first_check(started, timeout)),
            }
        }
    }
}
