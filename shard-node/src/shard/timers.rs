//! The shard's time wheel and what the shard knows of it: each job's one occurrence entry, the
//! retry and watchdog timers, and how far occurrences are loaded. Pure: no store, no clock
//! (callers pass `now` and deadlines), no NATS; the shard loop is its only user, and what falls
//! due is the loop's to fire (`fire.rs`).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use chronoshard_timer::{TimerKey, TimerWheel};
use uuid::Uuid;

use super::{fair::tenant_tag, store::DueRow, store::JobRow};

/// An entry of the shard's wheel: 32 bytes (a wheel entry with it: see the assertion below).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timer {
    /// A job's next occurrence; priority and a tenant tag order a storm of them.
    Occurrence {
        job: Uuid,
        at: i64,
        priority: u8,
        tenant: u32,
    },
    /// A retry attempt whose backoff ends now.
    Retry { ticket: Uuid, attempt: u32 },
    /// The watchdog's check of a started attempt.
    Deadline { ticket: Uuid, attempt: u32 },
    /// A workflow run to carry on (a step of it ended): see `workflow::advance`.
    Advance { job: Uuid, at: i64 },
}

impl Timer {
    /// The job or ticket the timer is about (its routing key is its tenant's).
    pub fn id(&self) -> Uuid {
        match *self {
            Timer::Occurrence { job, .. } | Timer::Advance { job, .. } => job,
            Timer::Retry { ticket, .. } | Timer::Deadline { ticket, .. } => ticket,
        }
    }
}

// The wheel's entry budget (under 64 bytes per pending entry) holds for this payload:
// 48 bytes (deadline, sequence number and this 32-byte payload, since the wheel stores entries
// by value).
const _: () = assert!(chronoshard_timer::entry_bytes::<Timer>() < 64);

/// A job's next occurrence, as the wheel tracks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Due {
    pub job: Uuid,
    pub at: i64,
    pub priority: u8,
    pub tenant: u32,
}

impl Due {
    pub fn of(job: &JobRow, at: i64) -> Due {
        Due {
            job: job.id,
            at,
            priority: job.spec.priority,
            tenant: tenant_tag(&job.tenant),
        }
    }

    pub fn from_row(row: &DueRow) -> Due {
        Due {
            job: row.id,
            at: row.at,
            priority: row.priority,
            tenant: tenant_tag(&row.tenant),
        }
    }

    pub fn timer(&self) -> Timer {
        Timer::Occurrence {
            job: self.job,
            at: self.at,
            priority: self.priority,
            tenant: self.tenant,
        }
    }
}

/// When an occurrence due at `at` leaves the wheel to be fired ahead: at least `lead` before,
/// rounded down to a quarter of the lead, so the occurrences of a quarter are fired in one
/// transaction instead of one per millisecond; each shard's quarters start at its own offset, so
/// the shards of a node do not all write in the same millisecond (measured: the aligned bursts
/// doubled the lateness p99). No lead: at the due time.
pub(crate) fn early_deadline(at: i64, lead: i64, shard: u32) -> i64 {
    if lead <= 0 {
        return at;
    }
    let quarter = (lead / 4).max(1);
    let offset = (shard % 8) as i64 * quarter / 8;
    (at - lead - offset).div_euclid(quarter) * quarter + offset
}

/// The wheel with its bookkeeping: at most one occurrence entry per job (a changed job's entry
/// is replaced, a deleted one's cancelled), and the count of occurrences it holds published for
/// the shard's status and its gauge.
pub(crate) struct Timers {
    wheel: TimerWheel<Timer>,
    /// Job → its occurrence entry in the wheel.
    in_wheel: HashMap<Uuid, (i64, TimerKey)>,
    /// Every active job due at or before this instant is in the wheel (None: nothing loaded yet).
    loaded_until: Option<i64>,
    shard: u32,
    /// Occurrences held, for the shard's status (read by the request server) and the gauge.
    len: Arc<AtomicU64>,
    gauge: prometheus::IntGauge,
    /// Reused by `take_due`.
    due: Vec<(u64, Timer)>,
}

impl Timers {
    pub fn new(now: i64, shard: u32, len: Arc<AtomicU64>, gauge: prometheus::IntGauge) -> Timers {
        Timers {
            wheel: TimerWheel::new(now.max(0) as u64),
            in_wheel: HashMap::new(),
            loaded_until: None,
            shard,
            len,
            gauge,
            due: Vec::new(),
        }
    }

    pub fn loaded_until(&self) -> Option<i64> {
        self.loaded_until
    }

    /// Every active job due at or before `until` is now in the wheel (or being put there: raise
    /// it before tracking what was loaded, as `track` ignores what lies beyond).
    pub fn loaded(&mut self, until: i64) {
        self.loaded_until = Some(until);
    }

    /// Puts a job's next occurrence in the wheel if it falls within what is loaded, `lead` ms
    /// before it is due (see `early_deadline`); an entry for the same occurrence stays as it is.
    pub fn track(&mut self, due: Due, lead: i64) {
        if self.loaded_until.is_some_and(|until| due.at > until) {
            return;
        }
        if self
            .in_wheel
            .get(&due.job)
            .is_some_and(|(old_at, _)| *old_at == due.at)
        {
            return;
        }
        self.track_at(due, early_deadline(due.at, lead, self.shard));
    }

    /// Puts an occurrence in the wheel, due at `deadline` (later than the occurrence when a
    /// failed fire is retried), in place of the job's entry.
    pub fn track_at(&mut self, due: Due, deadline: i64) {
        if let Some((_, key)) = self.in_wheel.remove(&due.job) {
            self.wheel.cancel(key);
        }
        let key = self.wheel.insert(deadline.max(0) as u64, due.timer());
        self.in_wheel.insert(due.job, (due.at, key));
        self.publish_len();
    }

    /// Takes a job's occurrence entry out of the wheel.
    pub fn untrack(&mut self, job: Uuid) {
        if let Some((_, key)) = self.in_wheel.remove(&job) {
            self.wheel.cancel(key);
            self.publish_len();
        }
    }

    /// Arms a retry or watchdog timer (not tied to a job's occurrence entry).
    pub fn arm(&mut self, at: i64, timer: Timer) {
        self.wheel.insert(at.max(0) as u64, timer);
    }

    /// The jobs with an occurrence entry.
    pub fn tracked(&self) -> impl Iterator<Item = &Uuid> {
        self.in_wheel.keys()
    }

    /// When the earliest entry falls due.
    pub fn next_deadline(&self) -> Option<i64> {
        self.wheel.next_deadline().map(|d| d as i64)
    }

    /// Hands every entry due by `now` to `each`, in deadline order; an occurrence handed over is
    /// no longer its job's entry.
    pub fn take_due(&mut self, now: i64, mut each: impl FnMut(Timer)) {
        let mut due = std::mem::take(&mut self.due);
        self.wheel.advance(now.max(0) as u64, &mut due);
        for (_, timer) in due.drain(..) {
            if let Timer::Occurrence { job, at, .. } = timer {
                if self.in_wheel.get(&job).is_some_and(|(t, _)| *t == at) {
                    self.in_wheel.remove(&job);
                }
            }
            each(timer);
        }
        self.due = due;
        self.publish_len();
    }

    /// Publishes how many occurrences the wheel holds; its retry and watchdog timers, which
    /// linger until their deadline even after their attempt finished, are not counted.
    fn publish_len(&self) {
        let len = self.in_wheel.len() as u64;
        self.len.store(len, Ordering::Relaxed);
        self.gauge.set(len as i64);
    }

    /// Clears the gauge when the shard closes.
    pub fn closed(&self) {
        self.gauge.set(0);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// Track job `0` at `1` (within what is loaded or not).
        Track(u8, i64),
        Untrack(u8),
        /// Arm a retry of ticket `0` at `1`.
        Arm(u8, i64),
        /// Move the clock on by this much and take what is due.
        Advance(i64),
        /// Raise the loaded watermark by this much.
        Load(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..6, 0i64..2_000).prop_map(|(j, at)| Op::Track(j, at)),
            1 => (0u8..6).prop_map(Op::Untrack),
            1 => (0u8..6, 0i64..2_000).prop_map(|(t, at)| Op::Arm(t, at)),
            3 => (0i64..300).prop_map(Op::Advance),
            1 => (0i64..500).prop_map(Op::Load),
        ]
    }

    fn id(n: u8) -> Uuid {
        Uuid::from_u128(n as u128 + 1)
    }

    fn due(job: u8, at: i64) -> Due {
        Due {
            job: id(job),
            at,
            priority: 0,
            tenant: 0,
        }
    }

    fn gauge() -> prometheus::IntGauge {
        prometheus::IntGauge::new("test_wheel_entries", "test").unwrap()
    }

    proptest! {
        /// Against a model of the rules: a job has at most its latest occurrence in the wheel,
        /// nothing beyond the loaded watermark goes in, an untracked job's entry never comes out,
        /// what comes out is due (occurrences at their early deadline), in deadline order, each
        /// once, and the published count is the occurrences held.
        #[test]
        fn the_wheel_holds_one_entry_per_job_and_hands_out_what_is_due(
            ops in proptest::collection::vec(op(), 1..80),
            lead in prop_oneof![Just(0i64), 1i64..400],
            shard in 0u32..16,
        ) {
            let len = Arc::new(AtomicU64::new(0));
            let gauge = gauge();
            let mut timers = Timers::new(0, shard, len.clone(), gauge.clone());
            let (mut now, mut until) = (0i64, 1_000i64);
            timers.loaded(until);
            // job → its tracked occurrence; armed retries by ticket with their times
            let mut tracked: HashMap<Uuid, i64> = HashMap::new();
            let mut armed: Vec<(i64, Uuid)> = Vec::new();
            for op in ops {
                match op {
                    Op::Track(j, at) => {
                        timers.track(due(j, at), lead);
                        if at <= until {
                            tracked.insert(id(j), at);
                        }
                    }
                    Op::Untrack(j) => {
                        timers.untrack(id(j));
                        tracked.remove(&id(j));
                    }
                    Op::Arm(t, at) => {
                        timers.arm(at, Timer::Retry { ticket: id(t), attempt: 1 });
                        armed.push((at, id(t)));
                    }
                    Op::Load(by) => {
                        until += by;
                        timers.loaded(until);
                    }
                    Op::Advance(by) => {
                        now += by;
                        let mut out = Vec::new();
                        timers.take_due(now, |t| out.push(t));
                        let deadline = |at: i64| early_deadline(at, lead, shard).max(0);
                        let expected: HashSet<(Uuid, i64)> = tracked
                            .iter()
                            .filter(|(_, at)| deadline(**at) <= now)
                            .map(|(j, at)| (*j, *at))
                            .collect();
                        let mut got = HashSet::new();
                        let mut retries = Vec::new();
                        let mut last = i64::MIN;
                        for t in out {
                            match t {
                                Timer::Occurrence { job, at, .. } => {
                                    prop_assert!(deadline(at) >= last, "in deadline order");
                                    last = deadline(at);
                                    prop_assert!(got.insert((job, at)), "handed out twice");
                                }
                                Timer::Retry { ticket, .. } => retries.push(ticket),
                                Timer::Deadline { .. } | Timer::Advance { .. } => {
                                    prop_assert!(false, "never armed")
                                }
                            }
                        }
                        prop_assert_eq!(&got, &expected);
                        for (job, _) in &got {
                            tracked.remove(job);
                        }
                        let mut due_retries: Vec<Uuid> =
                            armed.iter().filter(|(at, _)| (*at).max(0) <= now).map(|(_, t)| *t).collect();
                        armed.retain(|(at, _)| (*at).max(0) > now);
                        due_retries.sort();
                        retries.sort();
                        prop_assert_eq!(retries, due_retries);
                    }
                }
                prop_assert_eq!(len.load(Ordering::Relaxed), tracked.len() as u64);
                prop_assert_eq!(gauge.get(), tracked.len() as i64);
            }
        }
    }

    proptest! {
        #[test]
        fn an_occurrence_leaves_the_wheel_a_lead_ahead_at_its_shards_quarter(
            at in -1_000_000i64..1_000_000_000_000,
            lead in 1i64..10_000,
            shard in 0u32..64,
        ) {
            let d = early_deadline(at, lead, shard);
            let quarter = (lead / 4).max(1);
            prop_assert!(d <= at - lead, "at least the lead ahead");
            prop_assert!(d > at - lead - quarter, "at most a quarter more");
            let offset = (shard % 8) as i64 * quarter / 8;
            prop_assert_eq!((d - offset).rem_euclid(quarter), 0);
        }

        #[test]
        fn without_a_lead_an_occurrence_leaves_when_due(at in any::<i64>(), shard in any::<u32>()) {
            prop_assert_eq!(early_deadline(at, 0, shard), at);
        }
    }
}
