//! The shard's firing, between its agenda (`agenda.rs`, what is due in memory) and its edges
//! (the store, the dispatcher, NATS): fire a job's occurrence when it falls due (catch-up plan,
//! overlap policy, outbox write, publish), publish a retry attempt whose backoff ended, or let
//! the watchdog judge a started attempt that has not reported. Also what follows applied results
//! (timers to arm, a buffered occurrence to release), loading the wheel from the database and
//! re-arming all of it when a shard opens. `Firer` holds the edges and no state of its own: the
//! agenda is lent to each call by the event loop, its only owner.

use chronoshard_telemetry::tenants;
use chronoshard_wire::{
    from_millis, ids, trace_id_of, JobState, Overlap, ResultKind, RunStatus, Ticket, TicketResult,
    PROTOCOL_VERSION,
};
use std::time::SystemTime;

use chronoshard_telemetry::traces;
use tracing::{debug, warn};
use uuid::Uuid;

use super::{
    agenda::Agenda,
    cancel, dispatcher, machine,
    moves::Leaving,
    plan, probe,
    store::{Applied, FireOutcome, FireRequest, Fired, FollowUp, JobRow, Store},
    timers::{Due, Timer},
    watchdog, workflow, Command, ShardContext, ShardError, ShardMetrics,
};

/// Delay before a fire or timer that failed (not fenced) is tried again.
const FIRE_RETRY_MS: i64 = 1_000;
/// Most occurrences fired in one transaction: a storm is written in batches (one commit, one
/// epoch check, one job read each), and tickets are handed over batch by batch.
const FIRE_BATCH: usize = 128;
/// Batches fired before the loop serves a waiting API write or result again.
const FIRE_BATCHES_PER_TURN: usize = 4;

/// The `fire` span of each ticket written since `start`, when traces are exported.
fn trace_fired(tickets: &[Ticket], start: SystemTime) {
    if !traces::exporting() {
        return;
    }
    for t in tickets {
        traces::record_fire(&t.into(), t.scheduled_at.timestamp_millis(), start);
    }
}

/// The edges firing writes to and publishes on. Cheap to borrow; the event loop owns it.
pub(super) struct Firer {
    pub store: Store,
    pub dispatcher: dispatcher::Handle,
    pub ctx: ShardContext,
    pub metrics: ShardMetrics,
    /// The loop's own queue, for answers of tasks it starts (probes); weak, so it never keeps
    /// the loop alive.
    pub loop_tx: tokio::sync::mpsc::WeakSender<Command>,
    /// Jobs that left this shard, for the sender to deliver (`handoffs.rs`).
    pub handoffs: super::handoffs::Outbox,
}

impl Firer {
    /// The fire lead now (`ShardConfig::fire_lead`), in ms: read afresh, as the setting is live.
    pub fn lead(&self) -> i64 {
        self.ctx.config().fire_lead.as_millis() as i64
    }

    /// Fires what is due: retries and watchdog checks, and occurrences by priority with tenants
    /// taking turns. At most `FIRE_BATCH × FIRE_BATCHES_PER_TURN` occurrences per call: the rest
    /// of a storm waits in the agenda's backlog, so the loop serves API writes and results in
    /// between. A tenant leaving this shard fires on its new one.
    pub async fn fire_due(
        &self,
        agenda: &mut Agenda,
        leaving: &Leaving,
        now: i64,
    ) -> Result<(), ShardError> {
        let others = agenda.take_due(now, |id| leaving.holds_back(id));
        for _ in 0..FIRE_BATCHES_PER_TURN {
            let chunk = agenda.next_batch(FIRE_BATCH, |id| leaving.holds_back(id));
            if chunk.is_empty() {
                break;
            }
            // The time of this batch, not of the pass: a long pass must not date its last
            // tickets in the past (the outbox rescan would take them for stuck ones).
            let now = self.ctx.clock.now_ms();
            match self.fire_jobs(agenda, &chunk, now).await {
                Ok(()) => {}
                Err(e) if e.is_fenced() => return Err(e),
                Err(e) => {
                    // Nothing was written: fire the same occurrences again shortly.
                    warn!(count = chunk.len(), error = %e, "fire failed; retrying in 1 s");
                    for d in chunk {
                        agenda.timers.track_at(d, now + FIRE_RETRY_MS);
                    }
                }
            }
        }
        for timer in others {
            match self.on_timer(agenda, timer, now).await {
                Ok(()) => {}
                Err(e) if e.is_fenced() => return Err(e),
                Err(e) => {
                    warn!(?timer, error = %e, "timer failed; retrying in 1 s");
                    agenda.timers.arm(now + FIRE_RETRY_MS, timer);
                }
            }
        }
        Ok(())
    }

    /// Fires due occurrences of several jobs (each job's catch-up plan) in one transaction and
    /// tracks each job's next occurrence.
    async fn fire_jobs(
        &self,
        agenda: &mut Agenda,
        due: &[Due],
        now: i64,
    ) -> Result<(), ShardError> {
        let ids: Vec<Uuid> = due.iter().map(|d| d.job).collect();
        let jobs = self.store.get_jobs(&ids).await?;
        let mut planned = Vec::with_capacity(due.len());
        for d in due {
            let Some(job) = jobs.get(&d.job) else {
                continue;
            };
            if agenda.is_paused(&job.tenant) {
                // Left as it is: resuming the tenant moves the job to its next occurrence.
                continue;
            }
            if job.state != JobState::Active || job.next_fire_at != Some(d.at) {
                // The job changed after this entry was loaded: follow its real next occurrence.
                if let (JobState::Active, Some(next)) = (job.state, job.next_fire_at) {
                    agenda.track(Due::of(job, next), self.lead());
                }
                continue;
            }
            if d.at > now && job.spec.overlap != Overlap::Allow {
                // The other policies judge the job's active runs, which only the due time may do.
                agenda.timers.track_at(*d, d.at);
                continue;
            }
            let schedule = match machine::schedule_of(job) {
                Ok(s) => s,
                Err(e) => {
                    warn!(job_id = %job.id, error = %e, "stored schedule no longer compiles; job left unfired");
                    continue;
                }
            };
            planned.push((
                job,
                d.at,
                // Fired ahead of time (`fire_lead`), an occurrence is planned as at its due time.
                plan::plan(&schedule, d.at, now.max(d.at), &job.spec.catchup),
            ));
        }
        let requests = planned
            .iter()
            .map(|(job, at, p)| FireRequest {
                job_id: job.id,
                expected_next: Some(*at),
                next_fire_at: p.next,
                not_fired: &p.not_fired,
                occurrences: p
                    .fire
                    .iter()
                    .map(|t| (*t, self.tickets_for(job, *t)))
                    .collect(),
                overlap: job.spec.overlap,
            })
            .collect();
        let start = SystemTime::now();
        let outcomes = self.store.fire_batch(requests, now).await?;
        // Handed over in one piece: one hand-over per job filled the dispatcher's channel
        // within a batch, and tickets that find it full are left for the dispatcher to read
        // back from the database (`dispatcher::Handle::publish`).
        let mut tickets = Vec::new();
        for ((job, _, p), out) in planned.iter().zip(outcomes) {
            if out.stale {
                continue;
            }
            for nf in &p.not_fired {
                self.metrics.not_fired(nf.status, &nf.reason, nf.count);
            }
            self.after_fire(&job.tenant, &out);
            let early: Vec<(Uuid, i64)> = out
                .tickets
                .iter()
                .map(|t| (t.ticket_id, t.scheduled_at.timestamp_millis()))
                .filter(|(_, at)| *at > now)
                .collect();
            agenda.note_fired_ahead(job.id, &job.tenant, early);
            tickets.extend(out.tickets);
            if let Some(next) = p.next {
                agenda.track(Due::of(job, next), self.lead());
            }
        }
        trace_fired(&tickets, start);
        self.dispatcher.publish(tickets);
        Ok(())
    }

    /// Fires one occurrence of a job at `now`, outside its schedule (trigger now), under the
    /// job's overlap policy. Returns what happened and the ticket ids written.
    pub async fn fire_now(&self, job: &JobRow, now: i64) -> Result<(Fired, Vec<Uuid>), ShardError> {
        // A trigger is an occurrence of its own: one landing on the very millisecond of an
        // occurrence already recorded (fired, or fired ahead) takes the next free one.
        let mut at = now;
        loop {
            let (fired, ids) = self.fire_at(job, at, now).await?;
            if fired != Fired::Exists || at >= now + 2 {
                return Ok((fired, ids));
            }
            at += 1;
        }
    }

    /// Fires one occurrence of `job` at `at`, outside its schedule.
    async fn fire_at(
        &self,
        job: &JobRow,
        at: i64,
        now: i64,
    ) -> Result<(Fired, Vec<Uuid>), ShardError> {
        let tickets = self.tickets_for(job, at);
        let start = SystemTime::now();
        let out = self
            .store
            .fire(
                FireRequest {
                    job_id: job.id,
                    expected_next: None,
                    next_fire_at: None,
                    not_fired: &[],
                    occurrences: vec![(at, tickets)],
                    overlap: job.spec.overlap,
                },
                now,
            )
            .await?;
        self.after_fire(&job.tenant, &out);
        let ids = out.tickets.iter().map(|t| t.ticket_id).collect();
        trace_fired(&out.tickets, start);
        self.dispatcher.publish(out.tickets);
        let fired = out
            .occurrences
            .into_iter()
            .next()
            .map(|(_, f)| f)
            .unwrap_or(Fired::Exists);
        Ok((fired, ids))
    }

    /// Counts what one fire transaction did, and tells the workers of the attempts it replaced
    /// (overlap `replace`) to stop them.
    fn after_fire(&self, tenant: &str, out: &FireOutcome) {
        let mut fired = 0;
        for (_, f) in &out.occurrences {
            match f {
                Fired::Ticketed => fired += 1,
                Fired::Skipped(reason) => self.metrics.not_fired(RunStatus::Skipped, reason, 1),
                Fired::Buffered | Fired::Exists => {}
            }
        }
        self.metrics.fires.inc_by(fired);
        self.count_tenant(&tenants::TENANT_FIRES_TOTAL, tenant, fired);
        self.metrics.replaced.inc_by(out.replaced);
        for c in &out.cancel {
            let cluster = &self.ctx.cluster;
            cancel::stop(cluster.client.clone(), cluster.js.clone(), c.clone());
        }
    }

    /// Counts `n` events of `tenant`, under the label the `metrics_tenants` setting allows it.
    fn count_tenant(&self, counter: &prometheus::IntCounterVec, tenant: &str, n: u64) {
        let limit = self.ctx.settings.borrow().settings.metrics_tenants;
        tenants::count(counter, &self.metrics.label, tenant, limit, n);
    }

    /// One ticket per item of the occurrence at `at`, first attempt. A workflow's items are its
    /// steps: a step that waits for others is written waiting (`workflow::step_ticket`).
    pub fn tickets_for(&self, job: &JobRow, at: i64) -> Vec<Ticket> {
        let items = job.spec.shard_items.max(1);
        (0..items)
            .map(|item| {
                // Ends with the job's routing key, so the ticket is found on this shard.
                let ticket_id = ids::mint(ids::routing_key(job.id));
                let ticket = Ticket {
                    v: PROTOCOL_VERSION,
                    ticket_id,
                    job_id: job.id,
                    tenant: job.tenant.clone(),
                    shard: self.ctx.shard,
                    epoch: self.ctx.epoch,
                    scheduled_at: from_millis(at),
                    attempt: 1,
                    item,
                    items,
                    queue: job.spec.target.queue().to_string(),
                    target: job.spec.target.clone(),
                    payload: job.spec.payload.clone(),
                    timeout_ms: job.spec.timeout.as_millis() as u64,
                    priority: job.spec.priority,
                    trace_id: trace_id_of(ticket_id),
                    checkpoint: None,
                };
                match &job.spec.workflow {
                    Some(w) => workflow::step_ticket(ticket, w),
                    None => ticket,
                }
            })
            .collect()
    }

    /// A retry whose backoff ended, or a watchdog check.
    async fn on_timer(
        &self,
        agenda: &mut Agenda,
        timer: Timer,
        now: i64,
    ) -> Result<(), ShardError> {
        match timer {
            Timer::Occurrence { .. } => Ok(()),
            Timer::Retry { ticket, attempt } => {
                // Gone when the attempt was replaced, replayed or published by the outbox scan.
                if let Some(t) = self.store.pending_attempt(ticket, attempt).await? {
                    self.dispatcher.publish(vec![t]);
                }
                Ok(())
            }
            Timer::Deadline { ticket, attempt } => {
                self.watch(agenda, ticket, attempt, None, now).await
            }
            Timer::Advance { job, at } => workflow::advance(self, job, at, now).await,
        }
    }

    /// The watchdog's check of a started attempt with no result: wait, probe its worker, or fail
    /// it as lost. `probed` is the answer of a probe this check started earlier.
    pub async fn watch(
        &self,
        agenda: &mut Agenda,
        ticket: Uuid,
        attempt: u32,
        probed: Option<probe::Probed>,
        now: i64,
    ) -> Result<(), ShardError> {
        let Some(open) = self.store.open_attempt(ticket, attempt).await? else {
            return Ok(());
        };
        // Not started: the delivery is JetStream's to repeat, not the watchdog's.
        let Some(started) = open.started_at else {
            return Ok(());
        };
        let (progress, timeout) = (open.progress_at, open.timeout_ms);
        let mut verdict = watchdog::verdict(started, progress, timeout, now);
        if verdict == watchdog::Verdict::Probe {
            let worker = open.worker.as_deref();
            verdict = match (worker, probed) {
                // An answer about another worker is stale: a redelivery started meanwhile.
                (Some(w), Some(p)) if p.worker == w => {
                    watchdog::after_probe(worker, p.answer, started, progress, timeout, now)
                }
                (Some(w), _) => {
                    let client = self.ctx.cluster.client.clone();
                    probe::probe(client, self.loop_tx.clone(), w.to_string(), ticket, attempt);
                    return Ok(());
                }
                (None, _) => watchdog::after_probe(
                    None,
                    watchdog::Answer::Silent,
                    started,
                    progress,
                    timeout,
                    now,
                ),
            };
        }
        match verdict {
            watchdog::Verdict::WaitUntil(at) => {
                agenda.timers.arm(at, Timer::Deadline { ticket, attempt })
            }
            watchdog::Verdict::Probe => unreachable!("a probe is judged by after_probe"),
            watchdog::Verdict::Lost(reason) => {
                let mut lost = TicketResult::about(
                    ticket,
                    attempt,
                    self.ctx.shard,
                    ResultKind::Failed,
                    "watchdog",
                    from_millis(now),
                );
                lost.error = Some(reason.clone());
                let applied = self.store.apply_results(&[lost], now).await?;
                if applied.changed > 0 {
                    warn!(ticket_id = %ticket, attempt, %reason, "attempt lost");
                    self.metrics.lost.inc();
                }
                self.follow(agenda, applied, now).await?;
            }
        }
        Ok(())
    }

    /// Arms the timers applied results call for and releases buffered occurrences.
    pub async fn follow(
        &self,
        agenda: &mut Agenda,
        applied: Applied,
        now: i64,
    ) -> Result<(), ShardError> {
        self.metrics.dead.inc_by(applied.dead as u64);
        for tenant in &applied.failed_tenants {
            self.count_tenant(&tenants::TENANT_FAILURES_TOTAL, tenant, 1);
        }
        for tenant in &applied.dead_tenants {
            self.count_tenant(&tenants::TENANT_DEAD_LETTERS_TOTAL, tenant, 1);
        }
        for f in applied.follow_ups {
            match f {
                FollowUp::Retry {
                    ticket,
                    attempt,
                    at,
                } => {
                    self.metrics.retries.inc();
                    agenda.timers.arm(at, Timer::Retry { ticket, attempt });
                }
                FollowUp::Started {
                    ticket,
                    attempt,
                    started_at,
                    timeout_ms,
                } => agenda.timers.arm(
                    watchdog::first_check(started_at, timeout_ms),
                    Timer::Deadline { ticket, attempt },
                ),
                FollowUp::RunEnded { job } => self.release_buffered(job, now).await?,
                // In the loop's timers rather than at once: a failed advance is tried again a
                // second later like any timer, and a tenant leaving the shard holds it back
                // (its new shard carries the run on when it opens the tenant's rows).
                FollowUp::StepEnded { job, at } => {
                    agenda.timers.arm(now, Timer::Advance { job, at })
                }
            }
        }
        Ok(())
    }

    /// Fires a `buffer_one` job's buffered occurrence if its active run has ended.
    pub(super) async fn release_buffered(&self, job_id: Uuid, now: i64) -> Result<(), ShardError> {
        let Some(job) = self.store.get_job(job_id).await? else {
            return Ok(());
        };
        if job.buffered_at.is_none() {
            return Ok(());
        }
        let start = SystemTime::now();
        let tickets = self
            .store
            .release_buffered(job_id, |at| self.tickets_for(&job, at), now)
            .await?;
        if !tickets.is_empty() {
            debug!(job_id = %job_id, "buffered occurrence released");
            self.metrics.fires.inc();
            self.count_tenant(&tenants::TENANT_FIRES_TOTAL, &job.tenant, 1);
            trace_fired(&tickets, start);
            self.dispatcher.publish(tickets);
        }
        Ok(())
    }

    /// Re-arms what an earlier owner left open: tickets it fired ahead (so a pause can still
    /// withdraw them), retry timers of attempts still in their backoff,
    /// watchdog checks of started attempts, buffered occurrences whose run ended meanwhile,
    /// workflow runs whose steps were left waiting after the step before them ended.
    /// Retries already due are the dispatcher's outbox scan's to publish.
    pub async fn recover(&self, agenda: &mut Agenda, now: i64) -> Result<(), ShardError> {
        self.recover_matching(agenda, now, &|_| true).await
    }

    /// Puts back into the wheel what the store holds for the routing keys `keep` accepts: the
    /// tickets fired ahead, retry timers and watchdog checks, buffered occurrences, and (for
    /// rows that arrived after the wheel was loaded) the occurrences due within what is loaded.
    pub async fn recover_matching(
        &self,
        agenda: &mut Agenda,
        now: i64,
        keep: &(dyn Fn(u16) -> bool + Sync),
    ) -> Result<(), ShardError> {
        let of = |id: Uuid| keep(chronoshard_wire::ids::routing_key(id));
        agenda.paused_are(self.store.paused_tenants().await?);
        for (job, tenant, ticket, at) in self.store.fired_ahead(now).await? {
            if of(job) {
                agenda.note_fired_ahead(job, &tenant, vec![(ticket, at)]);
            }
        }
        for a in self.store.open_attempts().await? {
            let (ticket, attempt) = (a.ticket, a.attempt);
            if !of(ticket) {
                continue;
            }
            match (a.published_at, a.started_at, a.not_before) {
                (_, Some(started), _) => agenda.timers.arm(
                    watchdog::first_check(started, a.timeout_ms),
                    Timer::Deadline { ticket, attempt },
                ),
                (None, None, Some(at)) if at > now => {
                    agenda.timers.arm(at, Timer::Retry { ticket, attempt })
                }
                _ => {}
            }
        }
        for job in self.store.jobs_with_buffered().await? {
            if of(job) {
                self.release_buffered(job, now).await?;
            }
        }
        for (job, at) in self.store.waiting_runs().await? {
            if of(job) {
                workflow::advance(self, job, at, now).await?;
            }
        }
        if let Some(until) = agenda.timers.loaded_until() {
            for row in self.store.due_jobs(None, until).await? {
                if of(row.id) {
                    agenda.track(Due::from_row(&row), self.lead());
                }
            }
        }
        Ok(())
    }

    /// Moves jobs due within the horizon from the database into the wheel, unless the agenda
    /// knows nothing new can be there (`Agenda::start_load`).
    pub async fn load(&self, agenda: &mut Agenda, now: i64) -> Result<(), ShardError> {
        let until = now + self.ctx.config().horizon.as_millis() as i64;
        let stamp = self.store.wal_stamp();
        if !agenda.start_load(now, stamp, until) {
            return Ok(());
        }
        let due = (self.store)
            .due_jobs(agenda.timers.loaded_until(), until)
            .await?;
        let next_beyond = self.store.next_due_after(until).await?;
        if !due.is_empty() {
            debug!(
                count = due.len(),
                until, "loaded occurrences into the wheel"
            );
        }
        let due = due.iter().map(Due::from_row);
        agenda.loaded(until, stamp, next_beyond, due, self.lead());
        Ok(())
    }
}
