//! The job state machine's cost (`shard::machine`): how long one transition takes, with no store
//! and no wheel around it. Run it with `cargo bench -p chronoshard-shard-node --bench machine`.
//!
//! For an `every` job and a `cron` job in a time zone with DST (`0 */5 * * * *`,
//! Europe/Berlin): `create` (check every field, compile, first occurrence), `pause`, `resume`
//! (compile again, first occurrence after now) and a `patch` of the schedule. Each is run
//! `MACHINE_BENCH_N` times per round over jobs whose clocks move on, five rounds; printed per
//! transition: the median and the spread of the rounds' nanoseconds per call. Every call's
//! answer is checked (state and next occurrence), so a broken machine fails the bench.
//!
//! Environment (defaults in brackets): `MACHINE_BENCH_N` [20000].

use std::time::Instant;

use chronoshard_shard_node::shard::machine::{self, Request};
use chronoshard_wire::{JobPatch, JobSpec, JobState};
use uuid::Uuid;

/// 2026-01-01T00:00:00Z.
const T0: i64 = 1_767_225_600_000;
const ROUNDS: usize = 5;

fn spec(schedule: serde_json::Value) -> JobSpec {
    serde_json::from_value(serde_json::json!({"tenant": "acme", "name": "bench",
        "schedule": schedule, "target": {"type": "queue", "queue": "q"}}))
    .expect("a valid spec")
}

/// Runs `one(i)` n times per round; the median and range of the rounds' ns per call.
fn measure(n: usize, mut one: impl FnMut(usize)) -> (f64, f64, f64) {
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            for i in 0..n {
                one(i);
            }
            start.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    (rounds[ROUNDS / 2], rounds[0], rounds[ROUNDS - 1])
}

fn main() {
    let n: usize = std::env::var("MACHINE_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let kinds = [
        ("every", spec(serde_json::json!({"every": "30s"}))),
        (
            "cron",
            spec(serde_json::json!({"cron": "0 */5 * * * *", "timezone": "Europe/Berlin"})),
        ),
    ];
    println!("transition      ns/call median (min–max of {ROUNDS} rounds of {n})");
    for (kind, spec) in &kinds {
        let at = |i: usize| T0 + i as i64 * 7_001;
        let created = machine::create(Uuid::nil(), spec.clone(), T0).expect("created");
        let report = |what: &str, (median, min, max): (f64, f64, f64)| {
            println!("{kind:5} {what:9} {median:>8.0} ({min:.0}–{max:.0})");
        };
        report(
            "create",
            measure(n, |i| {
                let job = machine::create(Uuid::nil(), spec.clone(), at(i)).expect("created");
                assert_eq!(job.state, JobState::Active);
            }),
        );
        report(
            "pause",
            measure(n, |i| {
                let req = Request::Pause { fired_ahead: false };
                let (job, _) = machine::apply(&created, req, at(i)).expect("paused");
                assert_eq!(job.next_fire_at, None);
            }),
        );
        let (paused, _) =
            machine::apply(&created, Request::Pause { fired_ahead: false }, T0).expect("paused");
        report(
            "resume",
            measure(n, |i| {
                let (job, _) = machine::apply(&paused, Request::Resume, at(i)).expect("resumed");
                assert!(job.next_fire_at.expect("a next occurrence") >= at(i));
            }),
        );
        let patch = JobPatch {
            schedule: Some(spec.schedule.clone()),
            name: Some("renamed".into()),
            ..Default::default()
        };
        report(
            "patch",
            measure(n, |i| {
                let (job, _) =
                    machine::apply(&created, Request::Patch(&patch), at(i)).expect("patched");
                assert_eq!(job.spec.name, "renamed");
            }),
        );
    }
}
