//! What each scenario creates and what those jobs must then produce. Pure: given the time it
//! starts and its settings, a scenario is a list of job bodies and, for each, the occurrences the
//! platform owes inside the measured window. The runner creates them; `check.rs` compares.
//!
//! Every job asks for `catchup: all` and `overlap: allow`: the load test's question is whether
//! the platform fires everything, so no policy may legitimately drop an occurrence.

use chrono::{DateTime, Duration, DurationRound, SecondsFormat, Utc};
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// N one-shot jobs all due at the same instant.
    Burst,
    /// N one-shot jobs due uniformly over a window.
    Spread,
    /// K cron jobs, each firing every second, over a window.
    CronFleet,
    /// Like `spread`, over many tenants: half of the jobs belong to one big tenant.
    Tenants,
    /// Like `spread`, while a shard node and/or a worker is killed with SIGKILL.
    Fault,
    /// Like `spread`, while shards are added and a shard node joins.
    Grow,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Burst => "burst",
            Kind::Spread => "spread",
            Kind::CronFleet => "cron-fleet",
            Kind::Tenants => "tenants",
            Kind::Fault => "fault",
            Kind::Grow => "grow",
        }
    }
}

/// A scenario's shape (the parts the plan depends on).
#[derive(Clone, Debug)]
pub struct Shape {
    pub kind: Kind,
    /// Jobs to create (for `cron-fleet`: cron jobs).
    pub jobs: u64,
    pub tenants: u64,
    /// `spread`, `tenants`, `fault`, `grow`: due times spread over this; `cron-fleet`: how long to count
    /// occurrences; `burst`: unused.
    pub window: std::time::Duration,
    /// The first due time: chosen by the runner so that every job exists before it is due.
    pub first_due: DateTime<Utc>,
}

/// The occurrences one job owes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owed {
    /// A one-shot: exactly this occurrence.
    Once(DateTime<Utc>),
    /// A cron job firing every second: every whole second in `[from, to)`.
    EverySecond {
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    },
}

impl Owed {
    pub fn count(&self) -> u64 {
        match self {
            Owed::Once(_) => 1,
            Owed::EverySecond { from, to } => (*to - *from).num_seconds().max(0) as u64,
        }
    }

    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        match self {
            Owed::Once(at) => *at == t,
            Owed::EverySecond { from, to } => {
                t >= *from && t < *to && t.timestamp_subsec_nanos() == 0
            }
        }
    }

    /// Every occurrence owed, in time order.
    pub fn instants(&self) -> Vec<DateTime<Utc>> {
        match self {
            Owed::Once(at) => vec![*at],
            Owed::EverySecond { from, to } => {
                let mut v = Vec::new();
                let mut t = *from;
                while t < *to {
                    v.push(t);
                    t += Duration::seconds(1);
                }
                v
            }
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub specs: Vec<Value>,
    pub owed: Vec<Owed>,
}

impl Plan {
    pub fn expected(&self) -> u64 {
        self.owed.iter().map(Owed::count).sum()
    }

    /// When the last owed occurrence is due.
    pub fn last_due(&self) -> Option<DateTime<Utc>> {
        self.owed
            .iter()
            .map(|o| match o {
                Owed::Once(at) => *at,
                Owed::EverySecond { to, .. } => *to - Duration::seconds(1),
            })
            .max()
    }
}

/// The tenant of job `i`: round robin, except in `tenants` where every second job belongs to the
/// first (big) tenant, so a fair platform must not let it delay the small ones.
fn tenant_of(shape: &Shape, run: &str, i: u64) -> String {
    let tenants = shape.tenants.max(1);
    let t = match shape.kind {
        Kind::Tenants if tenants > 1 => {
            if i.is_multiple_of(2) {
                0
            } else {
                1 + (i / 2) % (tenants - 1)
            }
        }
        _ => i % tenants,
    };
    tenant_name(run, t)
}

/// The name of tenant `t` of run `run` (tenant 0 is `tenants`' big one).
pub fn tenant_name(run: &str, t: u64) -> String {
    format!("lt-{run}-{t}")
}

/// The whole second at or after `t`.
pub fn next_second(t: DateTime<Utc>) -> DateTime<Utc> {
    let floor = t
        .duration_trunc(Duration::seconds(1))
        .expect("truncating to a second never overflows");
    if floor == t {
        t
    } else {
        floor + Duration::seconds(1)
    }
}

/// The jobs of a scenario. `target` is the job body's `target` (a queue the load test's no-op
/// workers consume, or its HTTP sink); `run` is the run id (tenant names carry it, so runs on one
/// platform never share a tenant).
pub fn plan(shape: &Shape, run: &str, target: &Value) -> Plan {
    let mut plan = Plan::default();
    let window_us = shape.window.as_micros() as i64;
    // `at` is written to the millisecond, so that is what the platform schedules.
    let first_due = shape
        .first_due
        .duration_trunc(Duration::milliseconds(1))
        .expect("truncating to a millisecond never overflows");
    for i in 0..shape.jobs {
        let tenant = tenant_of(shape, run, i);
        let (schedule, owed) = match shape.kind {
            Kind::CronFleet => {
                let from = next_second(first_due);
                let to = from + Duration::seconds(shape.window.as_secs().max(1) as i64);
                (
                    json!({"cron": "* * * * * *"}),
                    Owed::EverySecond { from, to },
                )
            }
            kind => {
                let offset_us = match kind {
                    Kind::Burst => 0,
                    // Uniform: job i at i/n of the window, to the millisecond (what `at` keeps).
                    _ => (window_us as i128 * i as i128 / shape.jobs as i128) as i64 / 1000 * 1000,
                };
                let at = first_due + Duration::microseconds(offset_us);
                (
                    json!({"at": at.to_rfc3339_opts(SecondsFormat::Millis, true)}),
                    Owed::Once(at),
                )
            }
        };
        plan.specs.push(json!({
            "tenant": tenant,
            "name": format!("lt-{run}-{i}"),
            "schedule": schedule,
            "target": target,
            "payload": {"loadtest": run, "i": i},
            "overlap": "allow",
            "catchup": {"policy": "all", "window": "1h"},
            "retry": {"max_attempts": 5, "backoff": "fixed", "initial": "1s"},
        }));
        plan.owed.push(owed);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use chronoshard_wire::JobSpec;

    fn shape(kind: Kind, jobs: u64) -> Shape {
        Shape {
            kind,
            jobs,
            tenants: 4,
            window: std::time::Duration::from_secs(10),
            first_due: "2026-11-29T12:00:00.250700Z".parse().unwrap(),
        }
    }

    fn target() -> Value {
        json!({"type": "queue", "queue": "lt-q"})
    }

    #[test]
    fn every_body_is_a_valid_job_spec() {
        for kind in [
            Kind::Burst,
            Kind::Spread,
            Kind::CronFleet,
            Kind::Tenants,
            Kind::Fault,
            Kind::Grow,
        ] {
            let p = plan(&shape(kind, 7), "r1", &target());
            for spec in &p.specs {
                let parsed: JobSpec = serde_json::from_value(spec.clone()).unwrap();
                chronoshard_schedule::spec::check_job(&parsed, shape(kind, 1).first_due).unwrap();
            }
        }
    }

    #[test]
    fn spread_covers_the_window_uniformly() {
        let p = plan(&shape(Kind::Spread, 1000), "r1", &target());
        let first: DateTime<Utc> = "2026-11-29T12:00:00.250Z".parse().unwrap();
        assert_eq!(p.owed[0], Owed::Once(first));
        assert_eq!(p.owed[500], Owed::Once(first + Duration::seconds(5)));
        assert_eq!(p.last_due(), Some(first + Duration::milliseconds(9990)));
        assert_eq!(p.expected(), 1000);
    }

    #[test]
    fn burst_is_due_at_one_instant() {
        let p = plan(&shape(Kind::Burst, 50), "r1", &target());
        assert!(p.owed.iter().all(|o| *o == p.owed[0]));
    }

    #[test]
    fn cron_fleet_owes_every_whole_second_of_the_window() {
        let p = plan(&shape(Kind::CronFleet, 3), "r1", &target());
        let from: DateTime<Utc> = "2026-11-29T12:00:01Z".parse().unwrap();
        assert_eq!(p.expected(), 30);
        assert!(p.owed[0].contains(from));
        assert!(!p.owed[0].contains(from - Duration::seconds(1)));
        assert!(!p.owed[0].contains(from + Duration::milliseconds(500)));
        assert!(!p.owed[0].contains(from + Duration::seconds(10)));
        assert_eq!(p.owed[0].instants().len(), 10);
    }

    #[test]
    fn the_big_tenant_gets_half_of_the_jobs() {
        let p = plan(&shape(Kind::Tenants, 100), "r1", &target());
        let big = p.specs.iter().filter(|s| s["tenant"] == "lt-r1-0").count();
        assert_eq!(big, 50);
        let other = p.specs.iter().filter(|s| s["tenant"] == "lt-r1-3").count();
        assert!((15..=18).contains(&other), "{other}");
    }

    #[test]
    fn next_second_rounds_up_only_fractions() {
        let t: DateTime<Utc> = "2026-11-29T12:00:00Z".parse().unwrap();
        assert_eq!(next_second(t), t);
        assert_eq!(
            next_second(t + Duration::milliseconds(1)),
            t + Duration::seconds(1)
        );
    }
}
