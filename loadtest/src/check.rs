//! Did the platform fire every occurrence it owed, once? Pure: compares what the scenario's jobs
//! owe (`scenario::Owed`) with what the probes saw (tickets published, executor starts) and what
//! the API reports (runs with their ticket ids and `missed`/`skipped` statuses).
//!
//! An occurrence is identified by (job id, scheduled time); a ticket by its id. The rules checked
//! are the platform's guarantees: one ticket per occurrence, always; a ticket's executor started twice only
//! when the process running the first start was killed before it could report.

use std::collections::{BTreeSet, HashMap, HashSet};

use chronoshard_wire::{RunStatus, RunView};
use uuid::Uuid;

use crate::{
    probe::{
        nats::{Completed, Fired},
        Start,
    },
    progress::us_of,
    report::Correctness,
    scenario::Owed,
};

const EXAMPLES: usize = 20;

/// Everything the check looks at.
#[derive(Debug)]
pub struct Evidence<'a> {
    /// Each created job and what it owes.
    pub jobs: Vec<(Uuid, &'a Owed)>,
    pub fired: &'a [Fired],
    pub starts: &'a [Start],
    /// The `succeeded` results seen.
    pub completed: &'a [Completed],
    /// `Start::by` of every executor process killed during the run, with when (µs).
    pub killed: &'a HashMap<String, i64>,
    /// Runs per job as the API lists them (absent when not asked).
    pub runs: Option<&'a HashMap<Uuid, Vec<RunView>>>,
}

type Occurrence = (Uuid, i64);

pub fn check(e: &Evidence) -> Correctness {
    let mut c = Correctness::default();
    let mut examples = Vec::new();
    let note = |examples: &mut Vec<String>, s: String| {
        if examples.len() < EXAMPLES {
            examples.push(s);
        }
    };

    // Every ticket id any source tied to each occurrence.
    let mut tickets: HashMap<Occurrence, BTreeSet<Uuid>> = HashMap::new();
    for f in e.fired {
        tickets
            .entry((f.job_id, f.scheduled_us))
            .or_default()
            .insert(f.ticket_id);
    }
    for s in e.starts {
        tickets
            .entry((s.job_id, s.scheduled_us))
            .or_default()
            .insert(s.ticket_id);
    }
    let mut not_fired: HashSet<Occurrence> = HashSet::new();
    let mut not_fired_ranges: Vec<(Uuid, i64, i64)> = Vec::new();
    if let Some(runs) = e.runs {
        for (job, list) in runs {
            for r in list {
                let t = us_of(r.scheduled_at);
                match r.status {
                    RunStatus::Missed | RunStatus::Skipped => {
                        not_fired.insert((*job, t));
                        if let Some(end) = r.range_end {
                            not_fired_ranges.push((*job, t, us_of(end)));
                        }
                    }
                    _ => {
                        tickets
                            .entry((*job, t))
                            .or_default()
                            .extend(r.ticket_ids.iter().copied());
                    }
                }
            }
        }
    }
    let reported = |o: &Occurrence| {
        not_fired.contains(o)
            || not_fired_ranges
                .iter()
                .any(|(j, from, to)| *j == o.0 && (*from..=*to).contains(&o.1))
    };

    let started: HashSet<Occurrence> = e
        .starts
        .iter()
        .map(|s| (s.job_id, s.scheduled_us))
        .collect();
    let fired: HashSet<Occurrence> = e.fired.iter().map(|f| (f.job_id, f.scheduled_us)).collect();
    for (job, owed) in &e.jobs {
        for t in owed.instants() {
            let o = (*job, us_of(t));
            c.expected += 1;
            c.fired += fired.contains(&o) as u64;
            if started.contains(&o) {
                c.executed += 1;
            } else if reported(&o) {
                c.reported_not_fired += 1;
            } else {
                c.missed += 1;
                note(&mut examples, format!("missed: job {job} at {t}"));
            }
        }
    }

    for ((job, t), ids) in &tickets {
        if ids.len() > 1 {
            c.occurrences_with_two_tickets += 1;
            let ids: Vec<String> = ids.iter().map(Uuid::to_string).collect();
            note(
                &mut examples,
                format!("two tickets: job {job} at {} µs: {}", t, ids.join(", ")),
            );
        }
    }

    let mut by_occurrence: HashMap<Occurrence, usize> = HashMap::new();
    for s in e.starts {
        *by_occurrence.entry((s.job_id, s.scheduled_us)).or_default() += 1;
    }
    c.occurrences_executed_twice = by_occurrence.values().filter(|&&n| n > 1).count() as u64;
    // When each attempt's success was first seen: a start is "mid-run" at a kill only if its
    // attempt had not succeeded before the kill.
    let mut succeeded: HashMap<(Uuid, u32), i64> = HashMap::new();
    for d in e.completed {
        let t = succeeded.entry((d.ticket_id, d.attempt)).or_insert(d.at_us);
        *t = (*t).min(d.at_us);
    }
    let interrupted = |s: &Start| match e.killed.get(&s.by) {
        Some(&killed_us) => succeeded
            .get(&(s.ticket_id, s.attempt))
            .is_none_or(|&done| done > killed_us),
        None => false,
    };
    let mut by_ticket: HashMap<Uuid, Vec<&Start>> = HashMap::new();
    for s in e.starts {
        by_ticket.entry(s.ticket_id).or_default().push(s);
    }
    for (ticket, mut starts) in by_ticket {
        if starts.len() < 2 {
            continue;
        }
        c.tickets_executed_twice += 1;
        starts.sort_by_key(|s| s.at_us);
        let excused = starts[..starts.len() - 1].iter().all(|s| interrupted(s));
        if excused {
            c.executed_twice_after_worker_death += 1;
        } else {
            let by: Vec<String> = starts
                .iter()
                .map(|s| format!("attempt {} by {}", s.attempt, s.by))
                .collect();
            note(
                &mut examples,
                format!("executed twice: ticket {ticket}: {}", by.join(", ")),
            );
        }
    }
    c.examples = examples;
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn start(ticket: Uuid, job: Uuid, t: DateTime<Utc>, by: &str, at_us: i64) -> Start {
        Start {
            ticket_id: ticket,
            job_id: job,
            scheduled_us: us_of(t),
            attempt: 1,
            at_us,
            by: by.into(),
        }
    }

    fn fired(ticket: Uuid, job: Uuid, t: DateTime<Utc>) -> Fired {
        Fired {
            ticket_id: ticket,
            job_id: job,
            tenant: "t".into(),
            scheduled_us: us_of(t),
            attempt: 1,
            at_us: us_of(t),
        }
    }

    #[test]
    fn a_clean_run_has_nothing_to_report() {
        let t = at("2026-11-29T12:00:00Z");
        let owed = Owed::Once(t);
        let (j, k) = (Uuid::now_v7(), Uuid::now_v7());
        let f = [fired(k, j, t)];
        let s = [start(k, j, t, "w/1", 5)];
        let killed = HashMap::new();
        let c = check(&Evidence {
            jobs: vec![(j, &owed)],
            fired: &f,
            starts: &s,
            completed: &[],
            killed: &killed,
            runs: None,
        });
        assert_eq!((c.expected, c.fired, c.executed, c.missed), (1, 1, 1, 0));
        assert_eq!(c.occurrences_with_two_tickets + c.tickets_executed_twice, 0);
        assert!(c.examples.is_empty());
    }

    #[test]
    fn finds_missed_doubled_and_re_executed() {
        let from = at("2026-11-29T12:00:00Z");
        let owed = Owed::EverySecond {
            from,
            to: at("2026-11-29T12:00:04Z"),
        };
        let j = Uuid::now_v7();
        let (k1, k2, k3) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let s1 = from + chrono::Duration::seconds(1);
        let s2 = from + chrono::Duration::seconds(2);
        // Second 0: one ticket started twice, the first time on a killed worker (excused).
        // Second 1: two tickets for one occurrence, and the second of them started twice by
        // live workers (not excused). Seconds 2 and 3: never started; the API reports 2 missed.
        let f = [fired(k1, j, from), fired(k2, j, s1), fired(k3, j, s1)];
        let s = [
            start(k1, j, from, "w/1", 10),
            start(k1, j, from, "w/2", 20),
            start(k3, j, s1, "w/2", 30),
            start(k3, j, s1, "w/3", 40),
        ];
        let killed: HashMap<String, i64> = [("w/1".to_string(), 15)].into();
        let runs = HashMap::from([(
            j,
            vec![RunView {
                job_id: j,
                scheduled_at: s2,
                status: RunStatus::Missed,
                reason: Some("node down".into()),
                attempts: 0,
                ticket_ids: vec![],
                range_end: None,
                count: None,
                updated_at: s2,
                warnings: Vec::new(),
            }],
        )]);
        let c = check(&Evidence {
            jobs: vec![(j, &owed)],
            fired: &f,
            starts: &s,
            completed: &[],
            killed: &killed,
            runs: Some(&runs),
        });
        assert_eq!(c.expected, 4);
        assert_eq!(c.fired, 2);
        assert_eq!(c.executed, 2);
        assert_eq!(c.reported_not_fired, 1);
        assert_eq!(c.missed, 1);
        assert_eq!(c.occurrences_with_two_tickets, 1);
        assert_eq!(c.tickets_executed_twice, 2);
        assert_eq!(c.executed_twice_after_worker_death, 1);
        assert_eq!(c.occurrences_executed_twice, 2);
        assert_eq!(c.examples.len(), 3, "{:?}", c.examples);
    }

    #[test]
    fn a_missed_range_from_the_api_covers_every_occurrence_in_it() {
        let from = at("2026-11-29T12:00:00Z");
        let owed = Owed::EverySecond {
            from,
            to: at("2026-11-29T12:00:03Z"),
        };
        let j = Uuid::now_v7();
        let runs = HashMap::from([(
            j,
            vec![RunView {
                job_id: j,
                scheduled_at: from,
                status: RunStatus::Skipped,
                reason: None,
                attempts: 0,
                ticket_ids: vec![],
                range_end: Some(at("2026-11-29T12:00:02Z")),
                count: Some(3),
                updated_at: from,
                warnings: Vec::new(),
            }],
        )]);
        let killed = HashMap::new();
        let c = check(&Evidence {
            jobs: vec![(j, &owed)],
            fired: &[],
            starts: &[],
            completed: &[],
            killed: &killed,
            runs: Some(&runs),
        });
        assert_eq!((c.reported_not_fired, c.missed), (3, 0));
    }

    #[test]
    fn a_start_that_succeeded_before_the_kill_is_not_excused() {
        let t = at("2026-11-29T12:00:00Z");
        let owed = Owed::Once(t);
        let (j, k) = (Uuid::now_v7(), Uuid::now_v7());
        let s = [start(k, j, t, "w/1", 10), start(k, j, t, "w/2", 90)];
        // The first start's success was seen at 20, the kill came at 50: the second start is
        // a re-execution of finished work, not a recovery.
        let done = [Completed {
            ticket_id: k,
            attempt: 1,
            at_us: 20,
        }];
        let killed: HashMap<String, i64> = [("w/1".to_string(), 50)].into();
        let c = check(&Evidence {
            jobs: vec![(j, &owed)],
            fired: &[],
            starts: &s,
            completed: &done,
            killed: &killed,
            runs: None,
        });
        assert_eq!(
            (
                c.tickets_executed_twice,
                c.executed_twice_after_worker_death
            ),
            (1, 0)
        );
        // Had the kill come before the success, it would be excused.
        let killed: HashMap<String, i64> = [("w/1".to_string(), 15)].into();
        let c = check(&Evidence {
            jobs: vec![(j, &owed)],
            fired: &[],
            starts: &s,
            completed: &done,
            killed: &killed,
            runs: None,
        });
        assert_eq!(c.executed_twice_after_worker_death, 1);
    }
}
