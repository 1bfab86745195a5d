//! The elector under a simulated KV with random delays, lost answers, frozen and crashed
//! replicas: never two replicas acting as the leader at the same instant, and a leader again
//! soon after the last fault.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
    time::Duration,
};

use chronoshard_cluster::LeaseEntry;
use chronoshard_wire::rpc::LeaderLease;
use proptest::prelude::*;
use tokio::time::Instant;

use super::elector::{valid_for, Action, Elector};

const TTL: Duration = Duration::from_millis(3_000);

/// A small deterministic random source (the property's seed drives everything).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
    fn delay(&mut self, max_ms: u64) -> Duration {
        Duration::from_millis(self.below(max_ms + 1))
    }
}

#[derive(Debug)]
enum Event {
    /// The replica looks at its elector.
    Act(usize),
    /// A write reaches the KV.
    Apply {
        from: usize,
        lease: LeaderLease,
        expected: Option<u64>,
        sent: Duration,
    },
    /// The KV's answer reaches the writer (None: lost on the way).
    Answer {
        to: usize,
        outcome: Option<Result<u64, ()>>,
    },
    /// The watch delivers the key's new state.
    Notify { to: usize, entry: LeaseEntry },
}

struct Sim {
    rng: Rng,
    t0: Instant,
    now: Duration,
    queue: BinaryHeap<Reverse<(Duration, u64)>>,
    events: HashMap<u64, Event>,
    seq: u64,
    kv: Option<LeaseEntry>,
    revision: u64,
    electors: Vec<Elector>,
    /// Until when a replica is frozen (its events wait), and whether it crashed.
    frozen_until: Vec<Duration>,
    crashed: Vec<bool>,
    /// Per replica: (from, leading until) whenever its belief changed.
    beliefs: Vec<Vec<(Duration, Option<Duration>)>>,
    /// Per replica: when its next look is due (one at a time, as the runner's loop has).
    next_act: Vec<Option<Duration>>,
    /// Per replica: a write awaiting its answer (the runner waits for it, up to TTL / 6).
    writing: Vec<bool>,
    max_delay: u64,
}

impl Sim {
    fn new(replicas: usize, seed: u64, max_delay: u64) -> Sim {
        let mut sim = Sim {
            rng: Rng(seed | 1),
            t0: Instant::now(),
            now: Duration::ZERO,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            seq: 0,
            kv: None,
            revision: 0,
            electors: (0..replicas)
                .map(|i| Elector::new(format!("cp-{i}")))
                .collect(),
            frozen_until: vec![Duration::ZERO; replicas],
            crashed: vec![false; replicas],
            beliefs: vec![Vec::new(); replicas],
            next_act: vec![None; replicas],
            writing: vec![false; replicas],
            max_delay,
        };
        for i in 0..replicas {
            // Each replica starts by reading the key.
            sim.electors[i].saw(None, sim.t0);
            let at = sim.rng.delay(500);
            sim.act_at(i, at);
        }
        sim
    }

    fn act_at(&mut self, i: usize, at: Duration) {
        if self.next_act[i].is_some_and(|t| t <= at) {
            return;
        }
        self.next_act[i] = Some(at);
        self.push(at, Event::Act(i));
    }

    fn push(&mut self, at: Duration, e: Event) {
        self.seq += 1;
        self.events.insert(self.seq, e);
        self.queue.push(Reverse((at, self.seq)));
    }

    fn instant(&self, d: Duration) -> Instant {
        self.t0 + d
    }

    fn record(&mut self, i: usize) {
        let now = self.instant(self.now);
        let until = self.electors[i]
            .leading_until(now)
            .map(|u| u.duration_since(self.t0));
        self.beliefs[i].push((self.now, until));
    }

    fn run_until(&mut self, end: Duration) {
        while let Some(Reverse((at, seq))) = self.queue.peek().copied() {
            if at > end {
                break;
            }
            self.queue.pop();
            let e = self.events.remove(&seq).unwrap();
            let to = match &e {
                Event::Act(i) | Event::Answer { to: i, .. } | Event::Notify { to: i, .. } => {
                    Some(*i)
                }
                Event::Apply { .. } => None,
            };
            if let Some(i) = to {
                if self.crashed[i] {
                    continue;
                }
                if self.frozen_until[i] > at {
                    let thaw = self.frozen_until[i];
                    if matches!(e, Event::Act(_)) {
                        if self.next_act[i] != Some(at) {
                            continue; // superseded
                        }
                        self.next_act[i] = Some(thaw);
                    }
                    self.push(thaw, e);
                    continue;
                }
            }
            self.now = at;
            self.handle(e);
        }
        self.now = end;
    }

    fn handle(&mut self, e: Event) {
        let now = self.instant(self.now);
        match e {
            Event::Act(i) => {
                if self.next_act[i] != Some(self.now) || self.writing[i] {
                    return; // superseded by an earlier look, or waiting for a write's answer
                }
                self.next_act[i] = None;
                match self.electors[i].next(now) {
                    Action::Write { term, revision } => {
                        self.electors[i].sending(term, TTL, now);
                        let lease = LeaderLease {
                            holder: format!("cp-{i}"),
                            term,
                            ttl_ms: TTL.as_millis() as u64,
                            renewed_at: chrono::Utc::now(),
                        };
                        let at = self.now + self.rng.delay(self.max_delay);
                        self.push(
                            at,
                            Event::Apply {
                                from: i,
                                lease,
                                expected: revision,
                                sent: self.now,
                            },
                        );
                        self.writing[i] = true;
                    }
                    Action::WaitUntil(t) => {
                        let again = t
                            .duration_since(self.t0)
                            .max(self.now + Duration::from_millis(1));
                        self.act_at(i, again);
                    }
                    Action::Idle => {}
                }
                self.record(i);
            }
            Event::Apply {
                from,
                lease,
                expected,
                sent,
            } => {
                let current = self.kv.as_ref().map(|e| e.revision);
                let ok = match expected {
                    None => self.kv.as_ref().is_none_or(|e| e.lease.is_none()),
                    Some(rev) => current == Some(rev),
                };
                let outcome = if ok {
                    self.revision += 1;
                    let entry = LeaseEntry {
                        lease: Some(lease),
                        revision: self.revision,
                    };
                    self.kv = Some(entry.clone());
                    for to in 0..self.electors.len() {
                        let at = self.now + self.rng.delay(self.max_delay);
                        self.push(
                            at,
                            Event::Notify {
                                to,
                                entry: entry.clone(),
                            },
                        );
                    }
                    Ok(self.revision)
                } else {
                    Err(())
                };
                // One answer in ten is lost: the writer gives up after TTL / 6.
                let lost = self.rng.below(10) == 0;
                let delay = self.rng.delay(self.max_delay);
                let (at, outcome) = match lost {
                    true => (sent + TTL / 6, None),
                    false => (self.now + delay, Some(outcome)),
                };
                self.push(at.max(self.now), Event::Answer { to: from, outcome });
            }
            Event::Answer { to, outcome } => {
                self.writing[to] = false;
                let again = match outcome {
                    Some(Ok(rev)) => {
                        self.electors[to].wrote(rev);
                        self.now
                    }
                    Some(Err(())) => {
                        // The runner reads the key at once after a lost swap.
                        self.electors[to].conflict();
                        let current = self.kv.clone();
                        self.electors[to].saw(current, now);
                        self.now
                    }
                    None => {
                        self.electors[to].unanswered();
                        self.now + Duration::from_millis(100)
                    }
                };
                self.record(to);
                self.next_act[to] = None;
                self.act_at(to, again);
            }
            Event::Notify { to, entry } => {
                self.electors[to].saw(Some(entry), now);
                self.record(to);
                self.act_at(to, self.now);
            }
        }
    }

    /// Who believes it leads at `t`.
    fn leaders_at(&self, t: Duration) -> Vec<usize> {
        (0..self.electors.len())
            .filter(|&i| {
                let b = &self.beliefs[i];
                let k = b.partition_point(|(from, _)| *from <= t);
                k > 0 && b[k - 1].1.is_some_and(|until| t < until)
            })
            .collect()
    }

    /// Every instant at which some belief starts (overlaps begin at one of them).
    fn change_points(&self) -> Vec<Duration> {
        let mut v: Vec<Duration> = self.beliefs.iter().flatten().map(|(t, _)| *t).collect();
        v.sort();
        v.dedup();
        v
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn never_two_leaders_and_a_leader_again_after_the_faults(
        seed in any::<u64>(),
        replicas in 2usize..5,
        max_delay in 0u64..400,
        freeze_ms in 0u64..12_000,
        crash_leader in any::<bool>(),
    ) {
        let mut sim = Sim::new(replicas, seed, max_delay);
        sim.run_until(Duration::from_secs(10));
        let first = sim.leaders_at(Duration::from_secs(10));
        if first.len() != 1 {
            for (i, b) in sim.beliefs.iter().enumerate() {
                eprintln!("replica {i}: {:?}", &b[b.len().saturating_sub(8)..]);
            }
        }
        prop_assert_eq!(first.len(), 1, "one leader after 10 s: {:?}", first);
        let leader = first[0];
        // The leader is frozen (SIGSTOP) for a while, or killed.
        if crash_leader {
            sim.crashed[leader] = true;
        } else {
            sim.frozen_until[leader] = Duration::from_secs(10) + Duration::from_millis(freeze_ms);
        }
        sim.run_until(Duration::from_secs(40));
        for t in sim.change_points() {
            let at = sim.leaders_at(t);
            prop_assert!(at.len() <= 1, "two leaders at {:?}: {:?}", t, at);
        }
        if sim.leaders_at(Duration::from_secs(40)).len() != 1 {
            for (i, b) in sim.beliefs.iter().enumerate() {
                eprintln!("END replica {i} crashed={}: {:?} kv={:?}", sim.crashed[i], &b[b.len().saturating_sub(5)..], sim.kv);
            }
        }
        prop_assert_eq!(sim.leaders_at(Duration::from_secs(40)).len(), 1);
        if crash_leader {
            // Replaced within the TTL after its last renewal was seen, plus the delays of one
            // take-over write and its answer.
            let replaced = sim
                .change_points()
                .into_iter()
                .filter(|t| *t > Duration::from_secs(10))
                .find(|t| sim.leaders_at(*t).iter().any(|&i| i != leader))
                .expect("a new leader");
            let bound = Duration::from_secs(10) + TTL + Duration::from_millis(4 * max_delay + 100);
            prop_assert!(replaced <= bound, "replaced at {:?}, bound {:?}", replaced, bound);
        }
    }
}

#[test]
fn a_holder_acts_for_five_sixths_of_the_ttl_after_sending_and_renews_every_third() {
    let t0 = Instant::now();
    let mut e = Elector::new("a");
    e.saw(None, t0);
    assert_eq!(
        e.next(t0),
        Action::Write {
            term: 1,
            revision: None
        }
    );
    e.sending(1, TTL, t0);
    assert!(e.leading_until(t0).is_none(), "not before the write landed");
    e.wrote(7);
    assert_eq!(e.leading_until(t0), Some(t0 + valid_for(TTL)));
    assert_eq!(e.next(t0), Action::WaitUntil(t0 + TTL / 3));
    assert_eq!(
        e.next(t0 + TTL / 3),
        Action::Write {
            term: 1,
            revision: Some(7)
        }
    );
    // Two renewals missed: it stops acting at 5/6 of the TTL, before anyone may take over.
    assert!(e
        .leading_until(t0 + TTL * 5 / 6 - Duration::from_millis(1))
        .is_some());
    assert!(e.leading_until(t0 + TTL * 5 / 6).is_none());
}

#[test]
fn a_follower_takes_a_lease_unchanged_for_its_ttl_and_a_lost_swap_makes_it_follow() {
    let t0 = Instant::now();
    let lease = |holder: &str, term| LeaderLease {
        holder: holder.into(),
        term,
        ttl_ms: 3_000,
        renewed_at: chrono::Utc::now(),
    };
    let mut b = Elector::new("b");
    b.saw(
        Some(LeaseEntry {
            lease: Some(lease("a", 4)),
            revision: 9,
        }),
        t0,
    );
    assert_eq!(b.next(t0), Action::WaitUntil(t0 + TTL));
    // The same revision seen again does not restart the count.
    b.saw(
        Some(LeaseEntry {
            lease: Some(lease("a", 4)),
            revision: 9,
        }),
        t0 + TTL / 2,
    );
    assert_eq!(
        b.next(t0 + TTL),
        Action::Write {
            term: 5,
            revision: Some(9)
        }
    );
    b.sending(5, TTL, t0 + TTL);
    b.conflict();
    assert!(b.leading_until(t0 + TTL).is_none());
    // A renewal by the holder restarts the count.
    b.saw(
        Some(LeaseEntry {
            lease: Some(lease("a", 4)),
            revision: 10,
        }),
        t0 + TTL,
    );
    assert_eq!(b.next(t0 + TTL), Action::WaitUntil(t0 + 2 * TTL));
    // A released lease is taken at once.
    b.saw(
        Some(LeaseEntry {
            lease: None,
            revision: 11,
        }),
        t0 + TTL,
    );
    assert_eq!(
        b.next(t0 + TTL),
        Action::Write {
            term: 5,
            revision: None
        }
    );
    // Its own write seen by the watch before the answer: it leads from the sending.
    let sent = t0 + TTL + Duration::from_millis(5);
    b.sending(5, TTL, sent);
    b.saw(
        Some(LeaseEntry {
            lease: Some(lease("b", 5)),
            revision: 12,
        }),
        sent + Duration::from_millis(1),
    );
    assert_eq!(b.leading_until(sent), Some(sent + valid_for(TTL)));
    assert_eq!(b.held(), Some((5, 12)));
}
