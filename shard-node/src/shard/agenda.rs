//! What this shard will fire, as it is held in memory: the wheel (`timers.rs`) with each job's
//! next occurrence, the retry timers and the watchdog's checks; the occurrences taken from the
//! wheel and not fired yet (a storm is fired a few batches per turn of the loop); the tickets
//! fired ahead of their time until they are due; the paused tenants; and where the last load from
//! the database stopped; and, in a `time_window` cluster that grew, the jobs whose next occurrence
//! a newer layout places on another shard, which leave instead of being tracked.
//!
//! Pure: no store, no NATS, no clock (callers pass `now` and the fire lead). The event loop owns
//! the one instance and lends it to firing (`fire.rs`), writes (`writes.rs`) and tenant moves
//! (`moves.rs`); what the database says is theirs to read and bring here.

use std::collections::{HashMap, HashSet};

use chronoshard_placement::WindowPlacement;
use uuid::Uuid;

use super::{
    fair::FairQueue,
    machine,
    store::{JobRow, Leave, WalStamp},
    timers::{Due, Timer, Timers},
};

pub(super) struct Agenda {
    /// The wheel: occurrences, retries and watchdog checks.
    pub timers: Timers,
    /// Occurrences taken from the wheel and not fired yet, highest priority first, tenants
    /// taking turns.
    backlog: FairQueue<u32, Due>,
    /// Tickets fired ahead of their time (`fire_lead`), by job, until they are due: a pause or
    /// delete takes back those not due yet.
    staged: HashMap<Uuid, Staged>,
    /// Tenants paused now (the store's `paused_tenants`, kept here so a fire needs no query).
    paused: HashSet<String>,
    /// At the last load that asked the database: the WAL's stamp before it, and the earliest
    /// occurrence beyond what it loaded.
    last_load: (Option<WalStamp>, Option<i64>),
    /// A `time_window` cluster's layouts and this shard's number.
    placement: Option<(WindowPlacement, u32)>,
    /// Jobs whose next occurrence the placement puts on another shard, to hand off, each with
    /// when it was last asked for (`asked`), so that jobs waiting for a run cannot keep the
    /// others from being asked.
    leaving: HashMap<Uuid, (Leave, u64)>,
    asked: u64,
    /// The version of the cluster config the placement is from.
    placed_version: u64,
    /// When `leaving` is handed off next (`i64::MIN`: at once).
    hand_off_at: i64,
}

/// How soon jobs that could not leave yet (a run in progress) are asked again.
const HAND_OFF_RETRY_MS: i64 = 100;

/// A job's tickets fired ahead of their time: (ticket id, due time).
struct Staged {
    tenant: String,
    tickets: Vec<(Uuid, i64)>,
}

impl Agenda {
    pub fn new(timers: Timers) -> Agenda {
        Agenda {
            timers,
            backlog: FairQueue::default(),
            staged: HashMap::new(),
            paused: HashSet::new(),
            last_load: (None, None),
            placement: None,
            leaving: HashMap::new(),
            asked: 0,
            placed_version: 0,
            hand_off_at: i64::MAX,
        }
    }

    /// Follows the cluster's layouts (`None` outside a `time_window` cluster). Jobs tracked
    /// already stay: a layout is added for windows beyond what a shard has loaded.
    pub fn place_by(&mut self, placement: Option<WindowPlacement>, shard: u32, version: u64) {
        self.placement = placement.map(|p| (p, shard));
        self.placed_version = version;
    }

    /// The version of the cluster config jobs are placed by here.
    pub fn placed_version(&self) -> u64 {
        self.placed_version
    }

    /// Puts a job's next occurrence in the wheel if it falls within what is loaded, `lead` ms
    /// before it is due (firing puts it back at its due time if it may not fire early). When
    /// the placement puts that occurrence on another shard, the job is also marked to leave: it
    /// stays in the wheel until it has left (a job with a run in progress waits for the run to
    /// end, and an occurrence due meanwhile fires here), so no occurrence waits on a hand-off.
    /// Occurrences beyond what is loaded are not looked at: the job leaves when its occurrence
    /// enters the horizon.
    pub fn track(&mut self, due: Due, lead: i64) {
        let job = due.job;
        let loaded = self
            .timers
            .loaded_until()
            .is_some_and(|until| due.at <= until);
        let target = (self.placement.as_ref())
            .filter(|_| loaded)
            .map(|(p, me)| {
                (
                    p.shard_of(chronoshard_wire::ids::routing_key(job), due.at),
                    *me,
                )
            })
            .and_then(|(target, me)| (target != me).then_some(target));
        match target {
            Some(target) => {
                self.leaving.insert(job, (Leave { job, target }, 0));
                self.hand_off_at = i64::MIN;
            }
            None => {
                self.leaving.remove(&job);
            }
        }
        self.timers.track(due, lead);
    }

    /// Whether jobs may change shard here (a `time_window` cluster).
    pub fn places(&self) -> bool {
        self.placement.is_some()
    }

    /// Whether jobs wait to leave and it is time to ask for them.
    pub fn hand_off_due(&self, now: i64) -> bool {
        !self.leaving.is_empty() && now >= self.hand_off_at
    }

    /// When `hand_off_due` turns true next, if jobs wait to leave.
    pub fn next_hand_off(&self) -> Option<i64> {
        (!self.leaving.is_empty()).then_some(self.hand_off_at)
    }

    /// Up to `n` of the jobs waiting to leave, those asked for longest ago first.
    pub fn leaving(&mut self, n: usize) -> Vec<Leave> {
        let mut all: Vec<(u64, Uuid)> = self.leaving.iter().map(|(j, (_, a))| (*a, *j)).collect();
        if all.len() > n && n > 0 {
            all.select_nth_unstable(n - 1);
        }
        self.asked += 1;
        let mut out = Vec::with_capacity(n.min(all.len()));
        for (_, job) in all.into_iter().take(n) {
            let entry = self.leaving.get_mut(&job).expect("listed");
            entry.1 = self.asked;
            out.push(entry.0);
        }
        out
    }

    /// Forgets that these jobs were to leave (gone, no longer active, or of a paused tenant):
    /// they stay in the wheel, and are looked at again when tracked again.
    pub fn stay(&mut self, jobs: impl IntoIterator<Item = Uuid>) {
        for job in jobs {
            self.leaving.remove(&job);
        }
    }

    /// Takes the jobs that left out of the wheel; those still here (or all, after a failed
    /// attempt) are asked again a little later.
    pub fn handed_off(&mut self, jobs: impl IntoIterator<Item = Uuid>, now: i64) {
        for job in jobs {
            self.leaving.remove(&job);
            self.timers.untrack(job);
        }
        self.hand_off_at = now + HAND_OFF_RETRY_MS;
    }

    /// Results were applied: a job that waited for its run to end may leave now.
    pub fn runs_ended(&mut self) {
        if !self.leaving.is_empty() {
            self.hand_off_at = i64::MIN;
        }
    }

    /// Makes the wheel hold what the state machine says of a job.
    pub fn follow(&mut self, job: &JobRow, wheel: machine::Wheel, lead: i64) {
        match wheel {
            machine::Wheel::Track(at) => self.track(Due::of(job, at), lead),
            machine::Wheel::Untrack => {
                self.leaving.remove(&job.id);
                self.timers.untrack(job.id)
            }
        }
    }

    /// Starts a load up to `until`: forgets the tickets fired ahead that are due by `now`, and
    /// says whether the database must be asked. It need not be when the WAL is unchanged since
    /// the last load that asked (`stamp`: nothing was committed) and the next occurrence beyond
    /// that load is still beyond `until`; then only the watermark moves.
    pub fn start_load(&mut self, now: i64, stamp: Option<WalStamp>, until: i64) -> bool {
        self.staged.retain(|_, s| {
            s.tickets.retain(|(_, at)| *at > now);
            !s.tickets.is_empty()
        });
        let (last_stamp, next_beyond) = self.last_load;
        if stamp.is_some() && stamp == last_stamp && next_beyond.is_none_or(|at| at > until) {
            self.timers.loaded(until);
            return false;
        }
        true
    }

    /// Takes in what a load that asked the database found: the occurrences due up to `until`,
    /// and the earliest one beyond (`next_beyond`), under the WAL's stamp taken before it.
    pub fn loaded(
        &mut self,
        until: i64,
        stamp: Option<WalStamp>,
        next_beyond: Option<i64>,
        due: impl IntoIterator<Item = Due>,
        lead: i64,
    ) {
        self.last_load = (stamp, next_beyond);
        // Raise the watermark first: `track` ignores entries beyond it.
        self.timers.loaded(until);
        for d in due {
            self.track(d, lead);
        }
    }

    /// Takes what is due by `now` from the wheel: occurrences join the backlog (those
    /// `held_back` are dropped: their tenant fires on another shard now), the retry and watchdog
    /// timers are returned.
    pub fn take_due(&mut self, now: i64, held_back: impl Fn(Uuid) -> bool) -> Vec<Timer> {
        let mut others = Vec::new();
        let backlog = &mut self.backlog;
        self.timers.take_due(now, |timer| match timer {
            _ if held_back(timer.id()) => {}
            Timer::Occurrence {
                job,
                at,
                priority,
                tenant,
            } => backlog.push(
                priority,
                tenant,
                Due {
                    job,
                    at,
                    priority,
                    tenant,
                },
            ),
            other => others.push(other),
        });
        others
    }

    /// Up to `n` occurrences of the backlog in firing order, less those `held_back`.
    pub fn next_batch(&mut self, n: usize, held_back: impl Fn(Uuid) -> bool) -> Vec<Due> {
        std::iter::from_fn(|| self.backlog.pop())
            .take(n)
            .filter(|d| !held_back(d.job))
            .collect()
    }

    /// Whether occurrences wait in the backlog (the loop goes round at once).
    pub fn has_backlog(&self) -> bool {
        !self.backlog.is_empty()
    }

    /// Remembers a job's tickets fired ahead of their time, so a pause can withdraw them.
    pub fn note_fired_ahead(&mut self, job: Uuid, tenant: &str, tickets: Vec<(Uuid, i64)>) {
        if tickets.is_empty() {
            return;
        }
        self.staged
            .entry(job)
            .or_insert_with(|| Staged {
                tenant: tenant.to_string(),
                tickets: Vec::new(),
            })
            .tickets
            .extend(tickets);
    }

    /// Whether the job has an occurrence fired ahead that is not due yet.
    pub fn fired_ahead(&self, job: Uuid, now: i64) -> bool {
        self.staged
            .get(&job)
            .is_some_and(|s| s.tickets.iter().any(|(_, at)| *at > now))
    }

    /// Takes out the tickets fired ahead of the jobs `pick` selects (by job and tenant), with
    /// their due times: the caller withdraws the ones not due yet from the dispatcher.
    pub fn take_fired_ahead(&mut self, pick: impl Fn(Uuid, &str) -> bool) -> Vec<(Uuid, i64)> {
        let mut tickets = Vec::new();
        self.staged.retain(|job, s| {
            let take = pick(*job, &s.tenant);
            if take {
                tickets.extend(s.tickets.iter().copied());
            }
            !take
        });
        tickets
    }

    /// Takes the jobs `pick` selects out of the wheel; returns how many were in it.
    pub fn untrack_where(&mut self, pick: impl Fn(Uuid) -> bool) -> usize {
        let jobs: Vec<Uuid> = self
            .timers
            .tracked()
            .filter(|j| pick(**j))
            .copied()
            .collect();
        for job in &jobs {
            self.timers.untrack(*job);
        }
        jobs.len()
    }

    pub fn is_paused(&self, tenant: &str) -> bool {
        self.paused.contains(tenant)
    }

    /// Records a tenant paused (`true`) or resumed.
    pub fn set_paused(&mut self, tenant: &str, paused: bool) {
        if paused {
            self.paused.insert(tenant.to_string());
        } else {
            self.paused.remove(tenant);
        }
    }

    /// The paused tenants, as the store lists them when the shard opens.
    pub fn paused_are(&mut self, tenants: Vec<String>) {
        self.paused = tenants.into_iter().collect();
    }
}

#[cfg(test)]
mod tests;
