//! One shard owned by this node: its store, its time wheel, and the tasks that publish tickets,
//! apply results and answer the control plane. The event loop here is the only writer of the
//! wheel and the only place that fires; everything that changes a job's next occurrence goes
//! through it, so the wheel and the database never disagree for long.
//!
//! Where a ticket is born: `Shard::fire_due` → `plan` → `Store::fire` (outbox row) → dispatcher.

mod dispatcher;
pub mod plan;
mod results;
mod rpc;
pub mod store;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use chronoshard_schedule::Schedule;
use chronoshard_telemetry::metrics;
use chronoshard_timer::{TimerKey, TimerWheel};
use chronoshard_wire::{
    from_millis, names, to_millis, trace_id_of, JobState, Ticket, PROTOCOL_VERSION,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};
use uuid::Uuid;

use crate::clock::SharedClock;
use store::{JobRow, Store, StoreError};

/// Delay before a fire that failed (not fenced) is tried again.
const FIRE_RETRY_MS: i64 = 1_000;

/// Tunables of a shard.
#[derive(Clone, Debug)]
pub struct ShardConfig {
    /// Occurrences due within this horizon are held in memory; later ones stay in the database.
    pub horizon: Duration,
    /// How often the loader moves occurrences from the database into the wheel.
    pub load_every: Duration,
    /// Most tickets awaiting a JetStream ack at once.
    pub publish_window: usize,
}

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig {
            horizon: Duration::from_secs(300),
            load_every: Duration::from_secs(1),
            publish_window: 1024,
        }
    }
}

/// Everything a shard needs to run.
#[derive(Clone)]
pub struct ShardContext {
    pub shard: u32,
    pub epoch: u64,
    pub node_id: String,
    pub db_path: PathBuf,
    pub config: ShardConfig,
    pub cluster: chronoshard_cluster::Cluster,
    pub clock: SharedClock,
}

#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("shard {shard}: {what}: {reason}")]
    Nats {
        shard: u32,
        what: &'static str,
        reason: String,
    },
}

/// Writes that must go through the event loop because they change what the wheel holds.
pub(crate) enum Command {
    Request(
        chronoshard_wire::rpc::ShardRequest,
        oneshot::Sender<chronoshard_wire::rpc::ShardReply>,
    ),
}

/// Runs a shard until `cancel` fires or the shard is fenced by a newer owner.
pub async fn run(ctx: ShardContext, cancel: CancellationToken) -> Result<(), ShardError> {
    let span = tracing::info_span!("shard", shard_id = ctx.shard, epoch = ctx.epoch);
    run_inner(ctx, cancel).instrument(span).await
}

async fn run_inner(ctx: ShardContext, cancel: CancellationToken) -> Result<(), ShardError> {
    let now = ctx.clock.now_ms();
    let store = Store::open(&ctx.db_path, ctx.shard, ctx.epoch, &ctx.node_id, now).await?;
    // Child token: a fenced store or a failed task stops the whole shard, not the node.
    let stop = cancel.child_token();
    let wheel_len = Arc::new(AtomicU64::new(0));
    let dispatcher = dispatcher::start(store.clone(), ctx.clone(), stop.clone());
    let results = results::start(store.clone(), ctx.clone(), stop.clone()).await?;
    let (cmd_tx, cmd_rx) = mpsc::channel(1024);
    let rpc = rpc::start(
        store.clone(),
        ctx.clone(),
        cmd_tx,
        wheel_len.clone(),
        stop.clone(),
    )
    .await?;
    info!("shard open");
    let mut shard = Shard {
        wheel: TimerWheel::new(now.max(0) as u64),
        in_wheel: HashMap::new(),
        loaded_until: None,
        store: store.clone(),
        dispatcher,
        ctx: ctx.clone(),
        wheel_len,
        due: Vec::new(),
        metrics: ShardMetrics::new(ctx.shard),
    };
    let outcome = shard.event_loop(cmd_rx, stop.clone()).await;
    stop.cancel();
    let _ = tokio::join!(results, rpc);
    shard.dispatcher.closed().await;
    store.close().await;
    shard.metrics.wheel_entries.set(0);
    match &outcome {
        Ok(()) => info!("shard closed"),
        Err(e) => warn!(error = %e, "shard stopped"),
    }
    outcome
}

struct Shard {
    wheel: TimerWheel<(u128, i64)>,
    /// Job → its entry in the wheel, so a changed or deleted job's entry is cancelled.
    in_wheel: HashMap<Uuid, (i64, TimerKey)>,
    /// Every active job due at or before this instant is in the wheel (None: nothing loaded yet).
    loaded_until: Option<i64>,
    store: Store,
    dispatcher: dispatcher::Handle,
    ctx: ShardContext,
    wheel_len: Arc<AtomicU64>,
    due: Vec<(u64, (u128, i64))>,
    metrics: ShardMetrics,
}

/// This shard's metric handles, resolved once: the fire path must not format labels per fire.
struct ShardMetrics {
    label: String,
    wheel_entries: prometheus::IntGauge,
    fires: prometheus::IntCounter,
    jobs_created: prometheus::IntCounter,
}

impl ShardMetrics {
    fn new(shard: u32) -> ShardMetrics {
        let label = shard.to_string();
        ShardMetrics {
            wheel_entries: metrics::WHEEL_ENTRIES_GAUGE.with_label_values(&[&label]),
            fires: metrics::FIRES_TOTAL.with_label_values(&[&label]),
            jobs_created: metrics::JOBS_CREATED_TOTAL.with_label_values(&[&label]),
            label,
        }
    }
}

impl Shard {
    async fn event_loop(
        &mut self,
        mut commands: mpsc::Receiver<Command>,
        stop: CancellationToken,
    ) -> Result<(), ShardError> {
        let mut next_load = self.ctx.clock.now_ms();
        loop {
            let now = self.ctx.clock.now_ms();
            if now >= next_load {
                match self.load(now).await {
                    Ok(()) => {}
                    Err(e @ ShardError::Store(StoreError::Fenced { .. })) => return Err(e),
                    // The watermark did not move: the next pass loads the same window.
                    Err(e) => warn!(error = %e, "loading the wheel failed; retrying"),
                }
                next_load = now + self.ctx.config.load_every.as_millis() as i64;
            }
            self.fire_due(self.ctx.clock.now_ms()).await?;
            let wake = self
                .wheel
                .next_deadline()
                .map(|d| d as i64)
                .unwrap_or(i64::MAX)
                .min(next_load);
            let sleep = Duration::from_millis((wake - self.ctx.clock.now_ms()).max(0) as u64);
            tokio::select! {
                biased;
                _ = stop.cancelled() => return Ok(()),
                cmd = commands.recv() => match cmd {
                    // A caller that gave up must not have its write applied late.
                    Some(Command::Request(_, reply)) if reply.is_closed() => {}
                    Some(Command::Request(req, reply)) => {
                        match self.handle(req).await {
                            Ok(answer) => {
                                let _ = reply.send(answer);
                            }
                            // A fenced store means another node owns the shard now: stop.
                            Err(e @ ShardError::Store(StoreError::Fenced { .. })) => {
                                let _ = reply.send(rpc::error_reply(&e));
                                return Err(e);
                            }
                            Err(e) => {
                                let _ = reply.send(rpc::error_reply(&e));
                            }
                        }
                    }
                    None => return Ok(()),
                },
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// Moves jobs due within the horizon from the database into the wheel.
    async fn load(&mut self, now: i64) -> Result<(), ShardError> {
        let until = now + self.ctx.config.horizon.as_millis() as i64;
        let due = self.store.due_jobs(self.loaded_until, until).await?;
        if !due.is_empty() {
            debug!(
                count = due.len(),
                until, "loaded occurrences into the wheel"
            );
        }
        // Raise the watermark first: `track` ignores entries beyond it.
        self.loaded_until = Some(until);
        for (job, at) in due {
            self.track(job, at);
        }
        Ok(())
    }

    /// Puts a job's next occurrence in the wheel if it falls within what is loaded.
    fn track(&mut self, job: Uuid, at: i64) {
        if self.loaded_until.is_some_and(|until| at > until) {
            return;
        }
        if self
            .in_wheel
            .get(&job)
            .is_some_and(|(old_at, _)| *old_at == at)
        {
            return;
        }
        self.track_at(job, at, at);
    }

    /// Puts occurrence `at` of a job in the wheel, due at `deadline` (later than `at` when a
    /// failed fire is retried).
    fn track_at(&mut self, job: Uuid, at: i64, deadline: i64) {
        if let Some((_, key)) = self.in_wheel.remove(&job) {
            self.wheel.cancel(key);
        }
        let key = self
            .wheel
            .insert(deadline.max(0) as u64, (job.as_u128(), at));
        self.in_wheel.insert(job, (at, key));
        self.publish_wheel_len();
    }

    fn untrack(&mut self, job: Uuid) {
        if let Some((_, key)) = self.in_wheel.remove(&job) {
            self.wheel.cancel(key);
            self.publish_wheel_len();
        }
    }

    fn publish_wheel_len(&self) {
        let len = self.wheel.len() as u64;
        self.wheel_len.store(len, Ordering::Relaxed);
        self.metrics.wheel_entries.set(len as i64);
    }

    /// Fires every wheel entry that is due.
    async fn fire_due(&mut self, now: i64) -> Result<(), ShardError> {
        let mut due = std::mem::take(&mut self.due);
        self.wheel.advance(now.max(0) as u64, &mut due);
        for (_, (job, at)) in due.drain(..) {
            let job = Uuid::from_u128(job);
            if self.in_wheel.get(&job).is_some_and(|(t, _)| *t == at) {
                self.in_wheel.remove(&job);
            }
            match self.fire_job(job, at, now).await {
                Ok(()) => {}
                Err(e @ ShardError::Store(StoreError::Fenced { .. })) => return Err(e),
                Err(e) => {
                    // Nothing was written: fire the same occurrence again shortly.
                    warn!(job_id = %job, error = %e, "fire failed; retrying in 1 s");
                    self.track_at(job, at, now + FIRE_RETRY_MS);
                }
            }
        }
        self.due = due;
        self.publish_wheel_len();
        Ok(())
    }

    /// Fires one job's due occurrences (its catch-up plan) and tracks its next one.
    async fn fire_job(&mut self, job_id: Uuid, at: i64, now: i64) -> Result<(), ShardError> {
        let Some(job) = self.store.get_job(job_id).await? else {
            return Ok(());
        };
        if job.state != JobState::Active || job.next_fire_at != Some(at) {
            // The job changed after this entry was loaded: follow its real next occurrence.
            if let (JobState::Active, Some(next)) = (job.state, job.next_fire_at) {
                self.track(job_id, next);
            }
            return Ok(());
        }
        let schedule = match compile(&job) {
            Ok(s) => s,
            Err(e) => {
                warn!(job_id = %job_id, error = %e, "stored schedule no longer compiles; job left unfired");
                return Ok(());
            }
        };
        let p = plan::plan(&schedule, at, now, &job.spec.catchup);
        let tickets = p
            .fire
            .iter()
            .flat_map(|t| self.tickets_for(&job, *t))
            .collect();
        let out = self
            .store
            .fire(job_id, Some(at), p.next, &p.not_fired, tickets, now)
            .await?;
        if out.stale {
            return Ok(());
        }
        for nf in &p.not_fired {
            metrics::OCCURRENCES_NOT_FIRED_TOTAL
                .with_label_values(&[&self.metrics.label, nf.status.as_str(), &nf.reason])
                .inc_by(nf.count);
        }
        self.metrics.fires.inc_by(p.fire.len() as u64);
        self.dispatcher.publish(out.tickets).await;
        if let Some(next) = p.next {
            self.track(job_id, next);
        }
        Ok(())
    }

    /// One ticket per item of the occurrence at `at`, first attempt.
    fn tickets_for(&self, job: &JobRow, at: i64) -> Vec<Ticket> {
        let items = job.spec.shard_items.max(1);
        (0..items)
            .map(|item| {
                let ticket_id = Uuid::now_v7();
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
                    trace_id: trace_id_of(ticket_id),
                }
            })
            .collect()
    }
}

/// The evaluable schedule of a stored job, anchored when its schedule was set.
pub(crate) fn compile(job: &JobRow) -> Result<Schedule, chronoshard_wire::job::FieldError> {
    job.spec.schedule.compile(from_millis(job.anchor_at))
}

/// The first occurrence of a schedule that starts now: a one-shot in the past is due at once,
/// recurring schedules start with their first occurrence at or after `now`.
pub(crate) fn first_occurrence(schedule: &Schedule, now: i64) -> Option<i64> {
    match schedule {
        Schedule::At(t) => Some(to_millis(*t)),
        _ => schedule.next_after(from_millis(now - 1)).map(to_millis),
    }
}

/// The next `n` fire times starting with `first`.
pub(crate) fn upcoming(
    schedule: &Schedule,
    first: Option<i64>,
    n: usize,
) -> Vec<chrono::DateTime<chrono::Utc>> {
    let Some(first) = first else {
        return Vec::new();
    };
    let first = from_millis(first);
    let mut out = vec![first];
    out.extend(schedule.preview(first, n.saturating_sub(1)));
    out
}

pub(crate) fn rpc_subject(shard: u32) -> String {
    names::shard_rpc_subject(shard)
}
