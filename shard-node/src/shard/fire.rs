//! What the shard does when a wheel entry falls due: fire a job's occurrence (catch-up plan,
//! overlap policy, outbox write, publish), publish a retry attempt whose backoff ended, or let
//! the watchdog judge a started attempt that has not reported. Also what follows applied results
//! (timers to arm, a buffered occurrence to release) and re-arming all of it when a shard opens.

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
    cancel, machine, plan, probe,
    store::{Applied, FireOutcome, FireRequest, Fired, FollowUp, JobRow},
    timers::{Due, Timer},
    watchdog, Shard, ShardError,
};

/// Delay before a fire or timer that failed (not fenced) is tried again.
const FIRE_RETRY_MS: i64 = 1_000;
/// Most occurrences fired in one transaction: a storm is written in batches (one commit, one
/// epoch check, one job read each), and tickets are handed over batch by batch.
const FIRE_BATCH: usize = 128;
/// Batches fired before the loop serves a waiting API write or result again.
const FIRE_BATCHES_PER_TURN: usize = 4;

/// A job's tickets fired ahead of their time: (ticket id, due time).
pub(crate) struct Staged {
    pub tenant: String,
    pub tickets: Vec<(Uuid, i64)>,
}

/// The `fire` span of each ticket written since `start`, when traces are exported.
fn trace_fired(tickets: &[Ticket], start: SystemTime) {
    if !traces::exporting() {
        return;
    }
    for t in tickets {
        traces::record_fire(&t.into(), t.scheduled_at.timestamp_millis(), start);
    }
}

impl Shard {
    /// Fires what is due: retries and watchdog checks, and occurrences by priority with tenants
    /// taking turns. At most `FIRE_BATCH × FIRE_BATCHES_PER_TURN` occurrences per call: the rest
    /// of a storm waits in `backlog`, so the loop serves API writes and results in between.
    pub(super) async fn fire_due(&mut self, now: i64) -> Result<(), ShardError> {
        let mut others = Vec::new();
        let (leaving, backlog) = (&self.leaving, &mut self.backlog);
        self.timers.take_due(now, |timer| match timer {
            // A tenant leaving this shard fires on its new one.
            _ if leaving.holds_back(timer.id()) => {}
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
        for _ in 0..FIRE_BATCHES_PER_TURN {
            let chunk: Vec<Due> = std::iter::from_fn(|| self.backlog.pop())
                .take(FIRE_BATCH)
                .filter(|d| !self.leaving.holds_back(d.job))
                .collect();
            if chunk.is_empty() {
                break;
            }
            // The time of this batch, not of the pass: a long pass must not date its last
            // tickets in the past (the outbox rescan would take them for stuck ones).
            let now = self.ctx.clock.now_ms();
            match self.fire_jobs(&chunk, now).await {
                Ok(()) => {}
                Err(e) if e.is_fenced() => return Err(e),
                Err(e) => {
                    // Nothing was written: fire the same occurrences again shortly.
                    warn!(count = chunk.len(), error = %e, "fire failed; retrying in 1 s");
                    for d in chunk {
                        self.timers.track_at(d, now + FIRE_RETRY_MS);
                    }
                }
            }
        }
        for timer in others {
            match self.on_timer(timer, now).await {
                Ok(()) => {}
                Err(e) if e.is_fenced() => return Err(e),
                Err(e) => {
                    warn!(?timer, error = %e, "timer failed; retrying in 1 s");
                    self.timers.arm(now + FIRE_RETRY_MS, timer);
                }
            }
        }
        Ok(())
    }

    /// Fires due occurrences of several jobs (each job's catch-up plan) in one transaction and
    /// tracks each job's next occurrence.
    async fn fire_jobs(&mut self, due: &[Due], now: i64) -> Result<(), ShardError> {
        let ids: Vec<Uuid> = due.iter().map(|d| d.job).collect();
        let jobs = self.store.get_jobs(&ids).await?;
        let mut planned = Vec::with_capacity(due.len());
        for d in due {
            let Some(job) = jobs.get(&d.job) else {
                continue;
            };
            if self.paused.contains(&job.tenant) {
                // Left as it is: resuming the tenant moves the job to its next occurrence.
                continue;
            }
            if job.state != JobState::Active || job.next_fire_at != Some(d.at) {
                // The job changed after this entry was loaded: follow its real next occurrence.
                if let (JobState::Active, Some(next)) = (job.state, job.next_fire_at) {
                    self.track(Due::of(job, next));
                }
                continue;
            }
            if d.at > now && job.spec.overlap != Overlap::Allow {
                // The other policies judge the job's active runs, which only the due time may do.
                self.timers.track_at(*d, d.at);
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
            self.note_fired_ahead(job.id, &job.tenant, early);
            tickets.extend(out.tickets);
            if let Some(next) = p.next {
                self.track(Due::of(job, next));
            }
        }
        trace_fired(&tickets, start);
        self.dispatcher.publish(tickets);
        Ok(())
    }

    /// Remembers a job's tickets fired ahead of their time, so a pause can withdraw them.
    fn note_fired_ahead(&mut self, job: Uuid, tenant: &str, tickets: Vec<(Uuid, i64)>) {
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
    pub(super) fn fired_ahead(&self, job: Uuid, now: i64) -> bool {
        self.staged
            .get(&job)
            .is_some_and(|s| s.tickets.iter().any(|(_, at)| *at > now))
    }

    /// Withdraws the tickets fired ahead of their time of the jobs `pick` selects that are not
    /// due yet: the dispatcher will not publish them. The caller takes them back in the database
    /// (`unfire`) in the transaction of the pause or delete, and gives them back to the
    /// dispatcher (`Handle::restore`) if that fails. So a pause or delete holds for every
    /// occurrence not due when it is applied, as without a lead.
    pub(super) fn withdraw_early(&mut self, pick: impl Fn(&Uuid, &Staged) -> bool) -> Vec<Uuid> {
        let mut tickets = Vec::new();
        self.staged.retain(|job, s| {
            let take = pick(job, s);
            if take {
                tickets.extend(s.tickets.iter().copied());
            }
            !take
        });
        self.dispatcher.withdraw(&tickets)
    }

    /// Fires one occurrence of a job at `now`, outside its schedule (trigger now), under the
    /// job's overlap policy. Returns what happened and the ticket ids written.
    pub(super) async fn fire_now(
        &mut self,
        job: &JobRow,
        now: i64,
    ) -> Result<(Fired, Vec<Uuid>), ShardError> {
        let tickets = self.tickets_for(job, now);
        let start = SystemTime::now();
        let out = self
            .store
            .fire(
                FireRequest {
                    job_id: job.id,
                    expected_next: None,
                    next_fire_at: None,
                    not_fired: &[],
                    occurrences: vec![(now, tickets)],
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

    /// One ticket per item of the occurrence at `at`, first attempt.
    pub(super) fn tickets_for(&self, job: &JobRow, at: i64) -> Vec<Ticket> {
        let items = job.spec.shard_items.max(1);
        (0..items)
            .map(|item| {
                // Ends with the job's routing key, so the ticket is found on this shard.
                let ticket_id = ids::mint(ids::routing_key(job.id));
                Ticket {
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
                }
            })
            .collect()
    }

    /// A retry whose backoff ended, or a watchdog check.
    async fn on_timer(&mut self, timer: Timer, now: i64) -> Result<(), ShardError> {
        match timer {
            Timer::Occurrence { .. } => Ok(()),
            Timer::Retry { ticket, attempt } => {
                // Gone when the attempt was replaced, replayed or published by the outbox scan.
                if let Some(t) = self.store.pending_attempt(ticket, attempt).await? {
                    self.dispatcher.publish(vec![t]);
                }
                Ok(())
            }
            Timer::Deadline { ticket, attempt } => self.watch(ticket, attempt, None, now).await,
        }
    }

    /// The watchdog's check of a started attempt with no result: wait, probe its worker, or fail
    /// it as lost. `probed` is the answer of a probe this check started earlier.
    pub(super) async fn watch(
        &mut self,
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
                self.timers.arm(at, Timer::Deadline { ticket, attempt })
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
                self.follow(applied, now).await?;
            }
        }
        Ok(())
    }

    /// Arms the timers applied results call for and releases buffered occurrences.
    pub(super) async fn follow(&mut self, applied: Applied, now: i64) -> Result<(), ShardError> {
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
                    self.timers.arm(at, Timer::Retry { ticket, attempt });
                }
                FollowUp::Started {
                    ticket,
                    attempt,
                    started_at,
                    timeout_ms,
                } => self.timers.arm(
                    watchdog::first_check(started_at, timeout_ms),
                    Timer::Deadline { ticket, attempt },
                ),
                FollowUp::RunEnded { job } => self.release_buffered(job, now).await?,
            }
        }
        Ok(())
    }

    /// Fires a `buffer_one` job's buffered occurrence if its active run has ended.
    async fn release_buffered(&mut self, job_id: Uuid, now: i64) -> Result<(), ShardError> {
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
    /// watchdog checks of started attempts, buffered occurrences whose run ended meanwhile.
    /// Retries already due are the dispatcher's outbox scan's to publish.
    pub(super) async fn recover(&mut self, now: i64) -> Result<(), ShardError> {
        self.recover_matching(now, &|_| true).await
    }

    /// Puts back into the wheel what the store holds for the routing keys `keep` accepts: the
    /// tickets fired ahead, retry timers and watchdog checks, buffered occurrences, and (for
    /// rows that arrived after the wheel was loaded) the occurrences due within what is loaded.
    pub(super) async fn recover_matching(
        &mut self,
        now: i64,
        keep: &(dyn Fn(u16) -> bool + Sync),
    ) -> Result<(), ShardError> {
        let of = |id: Uuid| keep(chronoshard_wire::ids::routing_key(id));
        self.paused = self.store.paused_tenants().await?.into_iter().collect();
        for (job, tenant, ticket, at) in self.store.fired_ahead(now).await? {
            if of(job) {
                self.note_fired_ahead(job, &tenant, vec![(ticket, at)]);
            }
        }
        for a in self.store.open_attempts().await? {
            let (ticket, attempt) = (a.ticket, a.attempt);
            if !of(ticket) {
                continue;
            }
            match (a.published_at, a.started_at, a.not_before) {
                (_, Some(started), _) => self.timers.arm(
                    watchdog::first_check(started, a.timeout_ms),
                    Timer::Deadline { ticket, attempt },
                ),
                (None, None, Some(at)) if at > now => {
                    self.timers.arm(at, Timer::Retry { ticket, attempt })
                }
                _ => {}
            }
        }
        for job in self.store.jobs_with_buffered().await? {
            if of(job) {
                self.release_buffered(job, now).await?;
            }
        }
        if let Some(until) = self.timers.loaded_until() {
            for row in self.store.due_jobs(None, until).await? {
                if of(row.id) {
                    self.track(Due::from_row(&row));
                }
            }
        }
        Ok(())
    }
}
