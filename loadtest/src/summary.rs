//! From the probes' raw records to the report's figures: phase statistics, the timeline, and each
//! figure next to its target (the platform's targets for a 2-core machine). Pure: no clock, no I/O.

use std::collections::HashSet;

use uuid::Uuid;

use crate::{
    probe::{
        nats::{Completed, Fired},
        procs::CpuSeries,
        Start,
    },
    report::{
        cpu_total, Bucket, CpuPerUnit, Fairness, Growth, GrowthPhase, PhaseStats, Ratio, Report,
        TargetCheck, Throughput, Timeline,
    },
    stats::{Buckets, Samples},
};

/// Everything the probes recorded, restricted to this run's tickets.
#[derive(Debug, Default)]
pub struct Records {
    pub created_us: Vec<i64>,
    pub fired: Vec<Fired>,
    pub starts: Vec<Start>,
    pub completed: Vec<Completed>,
    /// When the results stream was seen empty after the last completion: every result recorded.
    pub recorded_us: Option<i64>,
}

/// An event of a first attempt, counted once per ticket: (at, lateness).
fn first_attempts<'a>(
    events: impl Iterator<Item = (Uuid, u32, i64, i64)> + 'a,
) -> impl Iterator<Item = (i64, i64)> + 'a {
    let mut seen = HashSet::new();
    events.filter_map(move |(ticket, attempt, scheduled_us, at_us)| {
        (attempt == 1 && seen.insert(ticket)).then_some((at_us, at_us - scheduled_us))
    })
}

fn fires(r: &Records) -> impl Iterator<Item = (i64, i64)> + '_ {
    first_attempts(
        r.fired
            .iter()
            .map(|f| (f.ticket_id, f.attempt, f.scheduled_us, f.at_us)),
    )
}

fn starts(r: &Records) -> impl Iterator<Item = (i64, i64)> + '_ {
    first_attempts(
        r.starts
            .iter()
            .map(|s| (s.ticket_id, s.attempt, s.scheduled_us, s.at_us)),
    )
}

/// Lateness of first attempts, and the rate from the first to the last event.
pub fn phase(events: impl Iterator<Item = (i64, i64)>) -> (PhaseStats, Samples) {
    let mut samples = Samples::new();
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    for (at, lateness) in events {
        samples.push(lateness);
        first = first.min(at);
        last = last.max(at);
    }
    let count = samples.len() as u64;
    let per_s = if count > 1 && last > first {
        count as f64 / ((last - first) as f64 / 1e6)
    } else {
        0.0
    };
    (
        PhaseStats {
            count,
            per_s,
            lateness_ms: samples.percentiles(),
        },
        samples,
    )
}

pub fn fire_phase(r: &Records) -> (PhaseStats, Samples) {
    phase(fires(r))
}

pub fn start_phase(r: &Records) -> (PhaseStats, Samples) {
    phase(starts(r))
}

/// Fire lateness of one tenant's first attempts against everyone else's.
pub fn fairness(r: &Records, big_tenant: &str) -> Fairness {
    let (mut big, mut others) = (Samples::new(), Samples::new());
    let mut seen = HashSet::new();
    for f in &r.fired {
        if f.attempt == 1 && seen.insert(f.ticket_id) {
            let side = if f.tenant == big_tenant {
                &mut big
            } else {
                &mut others
            };
            side.push(f.at_us - f.scheduled_us);
        }
    }
    Fairness {
        big_tenant: big_tenant.to_string(),
        big: big.percentiles(),
        others: others.percentiles(),
    }
}

/// What a run saw of a growth (`grow`), in µs on the probes' clock.
#[derive(Clone, Debug, Default)]
pub struct GrowthSeen {
    pub shards_from: u32,
    pub shards_added: u32,
    pub shards_after: Option<u32>,
    /// `POST /v1/shards` sent, and the first poll that no longer saw the growth.
    pub started_us: i64,
    pub ended_us: Option<i64>,
    pub node: String,
    pub joined_us: Option<i64>,
    pub owned_us: Option<i64>,
    pub tenants_moved: u64,
}

/// The events of `events` at or after `from` and before `to` (open ends: none), and their rate
/// over the phase's span, closed by the first or last event where the phase is open.
fn phase_between(
    events: impl Iterator<Item = (i64, i64)>,
    from: Option<i64>,
    to: Option<i64>,
) -> PhaseStats {
    let inside: Vec<(i64, i64)> = events
        .filter(|&(at, _)| from.is_none_or(|f| at >= f) && to.is_none_or(|t| at < t))
        .collect();
    let first = inside.iter().map(|e| e.0).min();
    let last = inside.iter().map(|e| e.0).max();
    let (mut stats, _) = phase(inside.into_iter());
    stats.per_s = match (from.or(first), to.or(last)) {
        (Some(a), Some(b)) if b > a && stats.count > 0 => {
            stats.count as f64 / ((b - a) as f64 / 1e6)
        }
        _ => 0.0,
    };
    stats
}

/// A growth's figures: fires and executor starts (first attempts) before the shards were added,
/// while tenants moved, and after; times relative to `start_us` (the run's start).
pub fn growth(r: &Records, g: &GrowthSeen, start_us: i64) -> Growth {
    let s = |us: i64| (us - start_us) as f64 / 1e6;
    let bounds = [
        ("before", None, Some(g.started_us)),
        ("during", Some(g.started_us), g.ended_us),
        // A growth that never finished leaves nothing after it.
        ("after", Some(g.ended_us.unwrap_or(i64::MAX)), None),
    ];
    let phases = bounds
        .into_iter()
        .map(|(name, from, to)| GrowthPhase {
            name: name.into(),
            from_s: from.filter(|&f| f != i64::MAX).map(s),
            to_s: to.map(s),
            fire: phase_between(fires(r), from, to),
            start: phase_between(starts(r), from, to),
        })
        .collect();
    Growth {
        shards_from: g.shards_from,
        shards_added: g.shards_added,
        shards_after: g.shards_after,
        started_s: s(g.started_us),
        ended_s: g.ended_us.map(s),
        duration_s: g.ended_us.map(|e| (e - g.started_us) as f64 / 1e6),
        node: g.node.clone(),
        node_joined_s: g.joined_us.map(s),
        node_owned_shards_s: g.owned_us.map(s),
        tenants_moved: g.tenants_moved,
        phases,
    }
}

/// The end-to-end window (µs): first ticket published → last result recorded.
fn end_to_end_window(r: &Records) -> Option<(i64, i64)> {
    let first = r.fired.iter().map(|f| f.at_us).min()?;
    let last_result = r.completed.iter().map(|c| c.at_us).max()?;
    let end = r.recorded_us.unwrap_or(last_result).max(last_result);
    Some((first, end.max(first + 1)))
}

/// Jobs completed over the end-to-end window, and what each watched process spent per job in it.
pub fn end_to_end(r: &Records, cpu: &[CpuSeries]) -> Option<Throughput> {
    let (first, end) = end_to_end_window(r)?;
    let window_s = (end - first) as f64 / 1e6;
    let completed = r.completed.len() as u64;
    Some(Throughput {
        completed,
        window_s,
        per_s: completed as f64 / window_s,
        cpu_us_per_job: cpu_per_unit(cpu, first, end, completed),
    })
}

/// CPU per unit of work of each process whose samples cover `from_us..to_us`.
fn cpu_per_unit(cpu: &[CpuSeries], from_us: i64, to_us: i64, units: u64) -> Vec<CpuPerUnit> {
    if units == 0 {
        return Vec::new();
    }
    cpu.iter()
        .filter_map(|c| {
            let s = c.cpu_between(from_us, to_us)?;
            Some(CpuPerUnit::of(&c.name, c.pid, s, units))
        })
        .collect()
}

pub fn timeline(r: &Records, start_us: i64, bucket_ms: u64) -> Timeline {
    let mut fired = Buckets::new(bucket_ms);
    for (at, late) in fires(r) {
        fired.push(at - start_us, late);
    }
    let mut started = Buckets::new(bucket_ms);
    for (at, late) in starts(r) {
        started.push(at - start_us, late);
    }
    let count = |times: &mut dyn Iterator<Item = i64>| {
        let mut b = Buckets::new(bucket_ms);
        for t in times {
            b.push(t - start_us, 0);
        }
        b
    };
    let mut created = count(&mut r.created_us.iter().copied());
    let mut completed = count(&mut r.completed.iter().map(|c| c.at_us));
    let n = [&fired, &started, &created, &completed]
        .iter()
        .map(|b| b.len())
        .max()
        .unwrap_or(0);
    let len = |b: &mut Buckets, i| b.get_mut(i).map(|s| s.len() as u64).unwrap_or(0);
    let q = |b: &mut Buckets, i, q| {
        b.get_mut(i)
            .and_then(|s| s.quantile_us(q))
            .map(|v| v as f64 / 1000.0)
    };
    let buckets = (0..n)
        .map(|i| Bucket {
            t_s: (i as u64 * bucket_ms) as f64 / 1000.0,
            created: len(&mut created, i),
            fired: len(&mut fired, i),
            started: len(&mut started, i),
            completed: len(&mut completed, i),
            fire_p50_ms: q(&mut fired, i, 0.5),
            fire_p99_ms: q(&mut fired, i, 0.99),
            fire_max_ms: q(&mut fired, i, 1.0),
            start_p99_ms: q(&mut started, i, 0.99),
        })
        .collect();
    Timeline { bucket_ms, buckets }
}

/// Platform figures as fractions of the raw ceiling measured in the same run.
pub fn ratios(report: &Report) -> Vec<Ratio> {
    let Some(raw) = &report.raw else {
        return Vec::new();
    };
    let mut v = Vec::new();
    let mut add = |what: &str, platform: f64| {
        if raw.per_s > 0.0 && platform > 0.0 {
            v.push(Ratio {
                what: what.into(),
                platform,
                raw: raw.per_s,
                ratio: platform / raw.per_s,
            });
        }
    };
    if let Some(e) = &report.end_to_end {
        add("end-to-end jobs/s vs raw round trips/s", e.per_s);
    }
    if let Some(f) = &report.fire {
        add("fires/s vs raw round trips/s", f.per_s);
    }
    // CPU, the other way round: what a raw round trip costs the machine as a share of what a
    // job costs it. On a machine whose cores are all busy (a closed-loop burst) this is about
    // the throughput ratio, and its parts say which process costs what. Only when every
    // process watched in the run lived through the whole window: one killed in it (`fault`)
    // would leave its share out and flatter the platform.
    let raw_us = cpu_total(&raw.cpu_us_per_round_trip);
    let whole = |e: &Throughput| {
        report
            .processes
            .iter()
            .all(|p| e.cpu_us_per_job.iter().any(|c| c.pid == p.pid))
    };
    if let Some(job_us) = report
        .end_to_end
        .as_ref()
        .filter(|e| whole(e))
        .map(|e| cpu_total(&e.cpu_us_per_job))
        .filter(|us| *us > 0.0 && raw_us > 0.0)
    {
        v.push(Ratio {
            what: "raw round trip's CPU as a share of an end-to-end job's".into(),
            platform: job_us,
            raw: raw_us,
            ratio: raw_us / job_us,
        });
    }
    v
}

fn check(what: &str, target: &str, measured: String, met: Option<bool>) -> TargetCheck {
    TargetCheck {
        what: what.into(),
        target: target.into(),
        measured,
        met,
    }
}

/// Each figure of this run next to its target. Lateness targets are stated at 5,000 fires/s, so
/// runs at another rate report the figure with its rate and `met: None`.
pub fn targets(report: &Report) -> Vec<TargetCheck> {
    let mut t = Vec::new();
    let at_5k = |per_s: f64| (4_500.0..=5_500.0).contains(&per_s);
    let burst = report.scenario == "burst";
    if let Some(f) = report.fire.as_ref().filter(|_| !burst) {
        let rate = format!("at {:.0} fires/s", f.per_s);
        let judged = at_5k(f.per_s);
        let l = f.lateness_ms;
        t.push(check(
            "fire lateness p99",
            "< 3 ms at 5,000 fires/s",
            format!("{:.2} ms {rate}", l.p99),
            judged.then_some(l.p99 < 3.0),
        ));
        t.push(check(
            "fire lateness p99.9",
            "< 10 ms at 5,000 fires/s",
            format!("{:.2} ms {rate}", l.p999),
            judged.then_some(l.p999 < 10.0),
        ));
    }
    if let Some(s) = report.start.as_ref().filter(|_| !burst) {
        t.push(check(
            "start lateness p99",
            "< 5 ms at 5,000 fires/s",
            format!("{:.2} ms at {:.0} starts/s", s.lateness_ms.p99, s.per_s),
            at_5k(s.per_s).then_some(s.lateness_ms.p99 < 5.0),
        ));
    }
    if let Some(c) = &report.create {
        t.push(check(
            "job creation through the API",
            "5,000/s with p99 < 10 ms",
            format!(
                "{:.0}/s (asked {:.0}/s), p99 {:.2} ms",
                c.achieved_per_s, c.target_per_s, c.latency_ms.p99
            ),
            (c.target_per_s >= 5_000.0)
                .then_some(c.achieved_per_s >= 4_750.0 && c.latency_ms.p99 < 10.0),
        ));
    }
    if let Some(e) = &report.end_to_end {
        t.push(check(
            "end-to-end throughput",
            "> 36,900 jobs/s (Graphile Worker, the best peer measured)",
            format!("{:.0} jobs/s", e.per_s),
            burst.then_some(e.per_s > 36_900.0),
        ));
        if let Some(r) = report
            .ratios
            .iter()
            .find(|r| r.what.starts_with("end-to-end"))
        {
            t.push(check(
                "end-to-end throughput vs the raw ceiling",
                ">= 80% of raw",
                format!(
                    "{:.0}% ({:.0} of {:.0}/s)",
                    r.ratio * 100.0,
                    r.platform,
                    r.raw
                ),
                burst.then_some(r.ratio >= 0.8),
            ));
        }
    }
    if let Some(f) = &report.fairness {
        // Fair share: the small tenants' jobs are no later than the big one's (1 ms of slack
        // for noise).
        t.push(check(
            "no tenant starves another",
            "the other tenants' fire lateness p99 <= the big tenant's",
            format!(
                "others p99 {:.2} ms, big tenant p99 {:.2} ms",
                f.others.p99, f.big.p99
            ),
            (f.big.count > 0 && f.others.count > 0).then_some(f.others.p99 <= f.big.p99 + 1.0),
        ));
    }
    if let Some(g) = &report.growth {
        t.push(check(
            "shards added while jobs fire",
            "the growth finishes",
            match (g.duration_s, g.shards_after) {
                (Some(d), Some(n)) => format!(
                    "{} → {n} shards in {d:.2} s, {} tenants moved",
                    g.shards_from, g.tenants_moved
                ),
                _ => "not finished by the drain deadline".to_string(),
            },
            Some(g.duration_s.is_some()),
        ));
    }
    if let Some(c) = &report.correctness {
        let lost = c.missed + c.reported_not_fired;
        t.push(check(
            "missed occurrences",
            "0",
            format!(
                "{lost} ({} never executed, {} reported missed or skipped)",
                c.missed, c.reported_not_fired
            ),
            Some(lost == 0),
        ));
        t.push(check(
            "occurrences with two tickets",
            "0",
            c.occurrences_with_two_tickets.to_string(),
            Some(c.occurrences_with_two_tickets == 0),
        ));
        let unexcused = c.tickets_executed_twice - c.executed_twice_after_worker_death;
        t.push(check(
            "tickets executed twice without a worker death",
            "0",
            format!(
                "{unexcused} (of {} executed twice)",
                c.tickets_executed_twice
            ),
            Some(unexcused == 0),
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fired(ticket: Uuid, attempt: u32, scheduled_us: i64, at_us: i64) -> Fired {
        Fired {
            ticket_id: ticket,
            job_id: ticket,
            tenant: "t".into(),
            scheduled_us,
            attempt,
            at_us,
        }
    }

    #[test]
    fn lateness_counts_first_attempts_once() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let r = Records {
            fired: vec![
                fired(a, 1, 1_000_000, 1_002_000),
                fired(a, 1, 1_000_000, 1_900_000), // the same publish seen again
                fired(a, 2, 1_000_000, 9_000_000), // a retry: not lateness
                fired(b, 1, 2_000_000, 2_001_000),
            ],
            ..Default::default()
        };
        let (p, _) = fire_phase(&r);
        assert_eq!(p.count, 2);
        assert_eq!((p.lateness_ms.p50, p.lateness_ms.max), (1.0, 2.0));
        assert!((p.per_s - 2.0 / 0.999).abs() < 1e-9);
        let tl = timeline(&r, 0, 1000);
        assert_eq!(tl.buckets.len(), 3);
        assert_eq!(tl.buckets[1].fired, 1);
        assert_eq!(tl.buckets[2].fire_max_ms, Some(1.0));
        assert_eq!(tl.buckets[0].fire_p99_ms, None);
    }

    /// One job fired at 1 s and completed at `done_us`.
    fn one_job(done_us: i64) -> Records {
        let a = Uuid::now_v7();
        Records {
            fired: vec![fired(a, 1, 0, 1_000_000)],
            completed: vec![Completed {
                ticket_id: a,
                attempt: 1,
                at_us: done_us,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn end_to_end_runs_to_the_last_recorded_result() {
        let r = Records {
            recorded_us: Some(3_000_000),
            ..one_job(1_500_000)
        };
        let e = end_to_end(&r, &[]).unwrap();
        assert_eq!((e.completed, e.window_s, e.per_s), (1, 2.0, 0.5));
        assert!(e.cpu_us_per_job.is_empty());
        assert!(end_to_end(&Records::default(), &[]).is_none());
    }

    /// CPU per job is over the end-to-end window only, for the processes sampled through all
    /// of it.
    #[test]
    fn cpu_per_job_counts_the_window_and_whole_processes_only() {
        let r = one_job(3_000_000);
        let series = |name: &str, points: Vec<(i64, u64)>| CpuSeries {
            name: name.into(),
            pid: 7,
            points,
        };
        let cpu = [
            // 50 ticks before the window, 200 in it (2 s of CPU for the one job), 80 after.
            series(
                "busy",
                vec![(0, 0), (1_000_000, 50), (3_000_000, 250), (4_000_000, 330)],
            ),
            // Killed inside the window: left out.
            series("killed", vec![(0, 0), (2_000_000, 100)]),
        ];
        let e = end_to_end(&r, &cpu).unwrap();
        assert_eq!(e.cpu_us_per_job.len(), 1);
        assert_eq!(e.cpu_us_per_job[0].name, "busy");
        assert!((e.cpu_us_per_job[0].us - 2_000_000.0).abs() < 1e-6);
    }

    #[test]
    fn the_cpu_ratio_needs_both_sides() {
        let cpu = |us: f64| {
            vec![CpuPerUnit {
                name: "p".into(),
                pid: 1,
                us,
            }]
        };
        let mut report = Report {
            raw: Some(crate::report::RawStats {
                per_s: 1000.0,
                cpu_us_per_round_trip: cpu(50.0),
                ..Default::default()
            }),
            end_to_end: Some(Throughput {
                completed: 10,
                window_s: 1.0,
                per_s: 10.0,
                cpu_us_per_job: cpu(200.0),
            }),
            ..Default::default()
        };
        let is_cpu = |r: &Ratio| r.what.starts_with("raw round trip's CPU");
        let r = ratios(&report);
        let c = r.iter().find(|r| is_cpu(r)).unwrap();
        assert_eq!((c.platform, c.raw, c.ratio), (200.0, 50.0, 0.25));
        // A process of the run missing from the window (killed in it): no ratio.
        report.processes = vec![crate::report::ProcessStats {
            name: "killed".into(),
            pid: 2,
            ..Default::default()
        }];
        assert!(!ratios(&report).iter().any(is_cpu));
        report.processes.clear();
        // Either side unmeasured: no ratio.
        let e2e = report.end_to_end.as_mut().unwrap();
        e2e.cpu_us_per_job.clear();
        assert!(!ratios(&report).iter().any(is_cpu));
        report.end_to_end.as_mut().unwrap().cpu_us_per_job = cpu(200.0);
        report.raw.as_mut().unwrap().cpu_us_per_round_trip.clear();
        assert!(!ratios(&report).iter().any(is_cpu));
    }

    /// Fires and starts fall into the phase they happened in; a phase's rate is over its span.
    #[test]
    fn a_growth_splits_the_run_in_three_phases() {
        let mut r = Records::default();
        for i in 0..10i64 {
            let t = Uuid::now_v7();
            // One fire a second from 1 s on, 2 ms late; started 1 ms later.
            let at = 1_000_000 + i * 1_000_000;
            r.fired.push(fired(t, 1, at - 2_000, at));
            r.starts.push(Start {
                ticket_id: t,
                job_id: t,
                attempt: 1,
                scheduled_us: at - 2_000,
                at_us: at + 1_000,
                by: "w".into(),
            });
        }
        let g = GrowthSeen {
            shards_from: 4,
            shards_added: 4,
            shards_after: Some(8),
            started_us: 3_500_000,
            ended_us: Some(6_500_000),
            tenants_moved: 7,
            ..Default::default()
        };
        let out = growth(&r, &g, 500_000);
        assert_eq!(
            (out.started_s, out.ended_s, out.duration_s),
            (3.0, Some(6.0), Some(3.0))
        );
        let counts: Vec<(&str, u64, u64)> = out
            .phases
            .iter()
            .map(|p| (p.name.as_str(), p.fire.count, p.start.count))
            .collect();
        assert_eq!(
            counts,
            [("before", 3, 3), ("during", 3, 3), ("after", 4, 4)]
        );
        // 3 fires from the first (1 s) to the POST (3.5 s); 3 over the 3 s of the growth.
        assert!((out.phases[0].fire.per_s - 3.0 / 2.5).abs() < 1e-9);
        assert!((out.phases[1].fire.per_s - 1.0).abs() < 1e-9);
        assert_eq!(out.phases[1].fire.lateness_ms.max, 2.0);
        assert_eq!(
            (out.phases[2].from_s, out.phases[2].to_s),
            (Some(6.0), None)
        );
        // Not finished: everything from the POST on is `during`, nothing `after`.
        let open = growth(
            &r,
            &GrowthSeen {
                ended_us: None,
                ..g
            },
            500_000,
        );
        assert_eq!(open.phases[1].fire.count, 7);
        assert_eq!(open.phases[2].fire.count, 0);
        assert_eq!(open.phases[2].from_s, None);
    }

    #[test]
    fn lateness_targets_are_judged_only_near_5000_per_second() {
        let mut report = Report {
            scenario: "spread".into(),
            fire: Some(PhaseStats {
                count: 10,
                per_s: 5_010.0,
                lateness_ms: crate::report::Percentiles {
                    p99: 2.0,
                    p999: 12.0,
                    ..Default::default()
                },
            }),
            ..Default::default()
        };
        let t = targets(&report);
        assert_eq!(t[0].met, Some(true));
        assert_eq!(t[1].met, Some(false));
        report.fire.as_mut().unwrap().per_s = 900.0;
        assert_eq!(targets(&report)[0].met, None);
    }
}
