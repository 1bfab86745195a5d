//! The timeout watchdog's rule for a started attempt that has not reported a result. Pure: the
//! shard loop asks it what to do at a check and re-arms, probes the worker, or declares the
//! attempt lost.
//!
//! A worker enforces the ticket's timeout itself and reports a failure when it passes, so the
//! watchdog only acts when a result is missing: the worker died, was cut off, or its report was
//! lost. It waits `timeout + SLACK` after the (latest) start; past that, an attempt that showed
//! life within `STALE_MS` gets up to the hard limit (`2 × timeout + SLACK`). One silent for
//! `STALE_MS` is not lost on silence alone: the worker that started it is asked (a probe) and
//! the attempt is lost only when that worker says it does not run it, or does not answer. The hard
//! limit stays hard whatever the worker says. A lost attempt is failed with a reason and retried
//! per policy. Times are the shard's.

/// Time for a result to travel and for the worker's own timeout to fire before the shard decides.
pub const SLACK_MS: i64 = 10_000;
/// No sign of life (start or progress report) for this long means the worker may be gone: it is
/// probed. It exceeds what a worker's death costs before another worker shows life: JetStream
/// redelivers the ticket `ack_wait` (30 s) after the dead worker's last progress ack, and the new
/// worker reports its start at once and progress every 10 s. A shorter wait would probe (and,
/// with the dead worker silent, retry) a ticket already running again elsewhere.
pub const STALE_MS: i64 = 60_000;
/// How long the probed worker has to answer; silence past it counts as no answer.
pub const PROBE_TIMEOUT_MS: i64 = 5_000;
/// After a worker said it still runs (or has just finished) the attempt: when to look again.
pub const PROBE_EVERY_MS: i64 = 20_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Check again at this instant.
    WaitUntil(i64),
    /// Silent for `STALE_MS`: ask the worker that started it (`after_probe` judges the answer).
    Probe,
    /// No result will come: fail the attempt with this reason.
    Lost(String),
}

/// What the worker that started an attempt said when probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Its handler still runs the attempt.
    Running,
    /// It ended there; its result is on its way.
    Finished,
    /// It does not run the attempt (it restarted, or never had it).
    NotRunning,
    /// No answer within `PROBE_TIMEOUT_MS`, or no worker of that id is connected.
    Silent,
}

/// When to check a started attempt first.
pub fn first_check(started_at: i64, timeout_ms: i64) -> i64 {
    started_at
        .saturating_add(timeout_ms)
        .saturating_add(SLACK_MS)
}

fn hard_limit(started_at: i64, timeout_ms: i64) -> i64 {
    first_check(started_at, timeout_ms).saturating_add(timeout_ms)
}

fn past_hard_limit(started_at: i64, now: i64) -> Verdict {
    Verdict::Lost(format!(
        "lost: no result {} ms after the start, past the hard limit of twice the timeout",
        now - started_at
    ))
}

/// What to do about an attempt started at `started_at` with no result at `now`.
pub fn verdict(started_at: i64, progress_at: Option<i64>, timeout_ms: i64, now: i64) -> Verdict {
    let soft = first_check(started_at, timeout_ms);
    if now < soft {
        return Verdict::WaitUntil(soft);
    }
    let hard = hard_limit(started_at, timeout_ms);
    let beat = progress_at.unwrap_or(started_at).max(started_at);
    if now >= hard {
        return past_hard_limit(started_at, now);
    }
    if now - beat < STALE_MS {
        return Verdict::WaitUntil(hard.min(beat + STALE_MS));
    }
    Verdict::Probe
}

/// What to do once the worker (`None`: none is recorded) answered the probe of a silent attempt.
pub fn after_probe(
    worker: Option<&str>,
    answer: Answer,
    started_at: i64,
    progress_at: Option<i64>,
    timeout_ms: i64,
    now: i64,
) -> Verdict {
    let hard = hard_limit(started_at, timeout_ms);
    if now >= hard {
        return past_hard_limit(started_at, now);
    }
    let silent = now - progress_at.unwrap_or(started_at).max(started_at);
    let Some(worker) = worker else {
        return Verdict::Lost(format!(
            "lost: no sign of life for {silent} ms and no worker recorded to ask"
        ));
    };
    match answer {
        Answer::Running | Answer::Finished => {
            Verdict::WaitUntil(hard.min(now.saturating_add(PROBE_EVERY_MS)))
        }
        Answer::NotRunning => Verdict::Lost(format!(
            "lost: no sign of life for {silent} ms and worker {worker} says it does not run this attempt"
        )),
        Answer::Silent => Verdict::Lost(format!(
            "lost: no sign of life for {silent} ms and worker {worker} did not answer the watchdog's probe"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_silent_worker_is_probed_at_timeout_plus_slack() {
        // timeout 60 s, no progress since the start: probed at the first check
        assert_eq!(verdict(0, None, 60_000, 1_000), Verdict::WaitUntil(70_000));
        assert_eq!(verdict(0, None, 60_000, 70_000), Verdict::Probe);
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

    #[test]
    fn a_probed_worker_keeps_its_attempt_only_while_it_runs_it() {
        // timeout 60 s: probed at 70 s, hard limit at 130 s
        let judge = |answer, now| after_probe(Some("w1"), answer, 0, None, 60_000, now);
        assert_eq!(judge(Answer::Running, 70_000), Verdict::WaitUntil(90_000));
        assert_eq!(judge(Answer::Finished, 70_000), Verdict::WaitUntil(90_000));
        assert_eq!(judge(Answer::Running, 120_000), Verdict::WaitUntil(130_000));
        assert!(
            matches!(judge(Answer::Running, 130_000), Verdict::Lost(r) if r.contains("hard limit"))
        );
        assert!(
            matches!(judge(Answer::NotRunning, 70_000), Verdict::Lost(r) if r == "lost: no sign of life for 70000 ms and worker w1 says it does not run this attempt")
        );
        assert!(
            matches!(judge(Answer::Silent, 70_000), Verdict::Lost(r) if r.contains("w1 did not answer"))
        );
        assert!(matches!(
            after_probe(None, Answer::Running, 0, None, 60_000, 70_000),
            Verdict::Lost(r) if r.contains("no worker recorded")
        ));
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
                Verdict::Probe => {
                    prop_assert!(now >= first_check(started, timeout));
                    prop_assert!(now - progress.unwrap_or(started).max(started) >= STALE_MS);
                    // a worker that answers it runs the attempt keeps it, never past the hard limit
                    match after_probe(Some("w"), Answer::Running, started, progress, timeout, now) {
                        Verdict::WaitUntil(t) => {
                            prop_assert!(t > now);
                            prop_assert!(t <= started + 2 * timeout + SLACK_MS);
                        }
                        other => prop_assert!(false, "{other:?}"),
                    }
                    let silent = after_probe(Some("w"), Answer::Silent, started, progress, timeout, now);
                    prop_assert!(matches!(silent, Verdict::Lost(_)));
                }
                Verdict::Lost(_) => prop_assert!(now >= started + 2 * timeout + SLACK_MS),
            }
        }
    }
}
