//! The few lines a run prints when it ends: the headline figures and every target, so a terminal
//! user need not open the report to know the outcome.

use std::{fmt::Write, path::Path};

use super::{cpu_total, CpuPerUnit, Growth, Percentiles, Report, ServerView};

fn lat(p: &Percentiles) -> String {
    format!(
        "p50 {:.2} · p99 {:.2} · p99.9 {:.2} · max {:.2} ms",
        p.p50, p.p99, p.p999, p.max
    )
}

/// A histogram of the platform's own: its count, the share within 1, 3 and 10 ms (the bounds
/// the targets are stated at) and the buckets p99 and p99.9 lie in.
pub fn server_line(v: &ServerView) -> String {
    let mut s = format!("{}: {}", v.what, v.count);
    for ms in [1.0, 3.0, 10.0] {
        if let Some(share) = v.share_within(ms) {
            let _ = write!(s, " · {:.1}% ≤ {ms} ms", share * 100.0);
        }
    }
    let bucket = |(lower, upper): (f64, Option<f64>)| match upper {
        Some(upper) => format!("in ({lower}, {upper}] ms"),
        None => format!("> {lower} ms"),
    };
    let _ = write!(
        s,
        " · p99 {} · p99.9 {}",
        bucket(v.p99_ms),
        bucket(v.p999_ms)
    );
    s
}

/// "4 + 4 → 8 shards: added at 12.3 s, done at 15.1 s (2.80 s), 97 tenants moved; node
/// lt-node-2 joined at 18.0 s, owned shards at 19.2 s"
pub fn growth_line(g: &Growth) -> String {
    let at = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1} s"));
    let done = match (g.ended_s, g.duration_s) {
        (Some(e), Some(d)) => format!("done at {e:.1} s ({d:.2} s)"),
        _ => "NOT DONE by the drain deadline".to_string(),
    };
    let after = g.shards_after.map_or("?".to_string(), |n| n.to_string());
    format!(
        "{} + {} → {after} shards: added at {:.1} s, {done}, {} tenants moved; node {} joined at {}, owned shards at {}",
        g.shards_from,
        g.shards_added,
        g.started_s,
        g.tenants_moved,
        g.node,
        at(g.node_joined_s),
        at(g.node_owned_shards_s)
    )
}

/// CPU per unit of work, in all and by process: `219 µs (chronoshard dev 116 · nats-server 54)`,
/// the largest first. None when nothing was measured.
pub fn cpu_line(v: &[CpuPerUnit]) -> Option<String> {
    if v.is_empty() {
        return None;
    }
    let mut by = v.to_vec();
    by.sort_by(|a, b| b.us.total_cmp(&a.us));
    let parts: Vec<String> = by
        .iter()
        .map(|c| format!("{} {:.0}", c.name, c.us))
        .collect();
    Some(format!("{:.0} µs ({})", cpu_total(v), parts.join(" · ")))
}

pub fn summary(r: &Report, dir: &Path) -> String {
    let mut s = String::new();
    let wake = r.machine.wake.describe().map_or(String::new(), |w| {
        format!(", a thread wake-up round trip {w}")
    });
    let _ = writeln!(
        s,
        "{} run {} ({} cpus{wake}, load {:.1} → {:.1})",
        r.scenario, r.run_id, r.machine.cpus, r.machine.load_start, r.machine.load_end
    );
    if !r.platform.chronoshard_version.is_empty() {
        let sharding = match r.params["sharding"].as_str() {
            Some(mode) if mode != "tenant" => format!(", {mode} sharding"),
            _ => String::new(),
        };
        let _ = writeln!(s, "  platform {}{sharding}", r.platform.chronoshard_version);
    }
    if let Some(c) = &r.create {
        let _ = writeln!(
            s,
            "  create   {}/{} at {:.0}/s (asked {:.0}/s, {} retried), latency {}",
            c.created,
            c.requested,
            c.achieved_per_s,
            c.target_per_s,
            c.retried,
            lat(&c.latency_ms)
        );
    }
    if let Some(f) = &r.fire {
        let _ = writeln!(
            s,
            "  fire     {} tickets at {:.0}/s, lateness {}",
            f.count,
            f.per_s,
            lat(&f.lateness_ms)
        );
    }
    if let Some(f) = &r.start {
        let _ = writeln!(
            s,
            "  start    {} tickets at {:.0}/s, lateness {}",
            f.count,
            f.per_s,
            lat(&f.lateness_ms)
        );
    }
    if let Some(f) = &r.fairness {
        let _ = writeln!(
            s,
            "  tenants  fire lateness of the big tenant {}: {}; of the others: {}",
            f.big_tenant,
            lat(&f.big),
            lat(&f.others)
        );
    }
    if let Some(g) = &r.growth {
        let _ = writeln!(s, "  growth   {}", growth_line(g));
        for p in &g.phases {
            let _ = writeln!(
                s,
                "  {:<8} {} fires at {:.0}/s, {} executions at {:.0}/s, fire lateness {}",
                p.name,
                p.fire.count,
                p.fire.per_s,
                p.start.count,
                p.start.per_s,
                lat(&p.fire.lateness_ms)
            );
        }
    }
    if let Some(e) = &r.end_to_end {
        let _ = writeln!(
            s,
            "  e2e      {} jobs in {:.2} s: {:.0} jobs/s",
            e.completed, e.window_s, e.per_s
        );
        if let Some(cpu) = cpu_line(&e.cpu_us_per_job) {
            let _ = writeln!(s, "  cpu      per job, over that window: {cpu}");
        }
    }
    if let Some(raw) = &r.raw {
        let _ = writeln!(
            s,
            "  raw      {} round trips at {:.0}/s, {}",
            raw.count,
            raw.per_s,
            lat(&raw.round_trip_ms)
        );
        if let Some(cpu) = cpu_line(&raw.cpu_us_per_round_trip) {
            let _ = writeln!(s, "  cpu      per raw round trip: {cpu}");
        }
    }
    for v in &r.server {
        let _ = writeln!(s, "  server   {}", server_line(v));
    }
    for x in &r.ratios {
        let _ = writeln!(s, "  ratio    {}: {:.0}%", x.what, x.ratio * 100.0);
    }
    if let Some(c) = &r.correctness {
        let _ = writeln!(
            s,
            "  checked  {} owed, {} executed, {} missed, {} reported missed/skipped, {} with two tickets, {} executed twice ({} after a worker death)",
            c.expected, c.executed, c.missed, c.reported_not_fired, c.occurrences_with_two_tickets, c.tickets_executed_twice, c.executed_twice_after_worker_death
        );
    }
    for p in &r.processes {
        let _ = writeln!(
            s,
            "  process  {} ({}): {:.2} cores, peak RSS {:.0} MiB",
            p.name,
            p.pid,
            p.cpu_cores,
            p.peak_rss_bytes as f64 / (1 << 20) as f64
        );
    }
    for t in &r.targets {
        let verdict = match t.met {
            Some(true) => "met",
            Some(false) => "NOT MET",
            None => "not judged",
        };
        let _ = writeln!(
            s,
            "  target   {}: {} (target {}) {verdict}",
            t.what, t.measured, t.target
        );
    }
    for w in &r.warnings {
        let _ = writeln!(s, "  warning  {w}");
    }
    let _ = write!(s, "  report   {}/report.html", dir.display());
    s
}

/// True when the run added shards and the growth did not finish (the process then exits
/// non-zero).
pub fn growth_unfinished(r: &Report) -> bool {
    r.growth.as_ref().is_some_and(|g| g.ended_s.is_none())
}

/// True when the run found an occurrence lost or doubled (the process then exits non-zero).
pub fn lost_or_doubled(r: &Report) -> bool {
    r.correctness.as_ref().is_some_and(|c| {
        c.missed > 0
            || c.reported_not_fired > 0
            || c.occurrences_with_two_tickets > 0
            || c.tickets_executed_twice > c.executed_twice_after_worker_death
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{RoundTrip, WakeCost};

    #[test]
    fn cpu_line_puts_the_total_first_and_the_largest_process_next() {
        let c = |name: &str, us: f64| CpuPerUnit {
            name: name.into(),
            pid: 1,
            us,
        };
        assert_eq!(cpu_line(&[]), None);
        assert_eq!(
            cpu_line(&[c("worker", 34.4), c("dev", 116.2), c("nats-server", 54.0)]).unwrap(),
            "205 µs (dev 116 · nats-server 54 · worker 34)"
        );
    }

    #[test]
    fn summary_states_the_wake_up_cost_when_it_was_measured() {
        let mut r = Report {
            scenario: "spread".into(),
            run_id: "r1".into(),
            ..Default::default()
        };
        r.machine.cpus = 2;
        let first = |r: &Report| {
            summary(r, Path::new("out"))
                .lines()
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(first(&r), "spread run r1 (2 cpus, load 0.0 → 0.0)");
        let trip = |cpu_us, wall_us| Some(RoundTrip { cpu_us, wall_us });
        r.machine.wake = WakeCost {
            cross_core: trip(68.24, 91.0),
            same_core: trip(3.9, 4.06),
        };
        assert_eq!(
            first(&r),
            "spread run r1 (2 cpus, a thread wake-up round trip 68.2 µs CPU (91.0 µs wall) \
             across two cores, 3.9 µs CPU (4.1 µs wall) on one core, load 0.0 → 0.0)"
        );
        r.machine.wake.cross_core = None;
        assert_eq!(
            first(&r),
            "spread run r1 (2 cpus, a thread wake-up round trip 3.9 µs CPU (4.1 µs wall) on one \
             core, load 0.0 → 0.0)"
        );
    }
}
