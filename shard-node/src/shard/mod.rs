//! One shard owned by this node: its store, its time wheel, and the tasks that publish tickets,
//! apply results and answer the control plane. The event loop here is the only writer of the
//! wheel and the only place that fires; everything that changes a job's next occurrence goes
//! through it, so the wheel and the database never disagree for long.
//!
//! Where a ticket is born: `fire::Firer::fire_due` → `plan` → `Store::fire` (outbox row) →
//! dispatcher. The wheel (`timers.rs`, pure) also holds the retry timers (a failed attempt's
//! backoff) and the watchdog's checks of started attempts; `fire.rs` handles all three when they
//! fall due.
//!
//! The event loop (`Shard`, here) owns the shard's memory, the `agenda` (pure), and lends it for
//! each command to the part that applies it: firing (`fire.rs`), write requests (`writes.rs`,
//! whose rules are the job state machine's, `machine.rs`), tenant moves (`moves.rs`).

mod agenda;
mod cancel;
mod dispatcher;
pub mod fair;
mod fire;
mod handoffs;
mod limits;
pub mod machine;
mod moves;
pub mod plan;
mod probe;
mod results;
pub mod retry;
mod rpc;
mod served;
pub mod store;
pub mod sweep;
mod timers;
mod upkeep;
pub mod watchdog;
pub mod workflow;
mod writes;

use std::{
    sync::{atomic::AtomicU64, Arc},
    time::Duration,
};

use chronoshard_schedule::Schedule;
use chronoshard_telemetry::metrics;
use chronoshard_wire::{
    from_millis, names,
    rpc::{ShardReply, ShardRequest},
    settings::{Settings, VersionedSettings},
    Dur,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use crate::clock::SharedClock;
use agenda::Agenda;
use chronoshard_placement::WindowPlacement;
use fire::Firer;
use store::{Applied, Store, StoreError};
use timers::Timers;

/// Tunables of a shard: its part of the cluster's live settings, read afresh where used so a
/// change applies without reopening the shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardConfig {
    /// Occurrences due within this horizon are held in memory; later ones stay in the database.
    pub horizon: Duration,
    /// How often the loader moves occurrences from the database into the wheel.
    pub load_every: Duration,
    /// Most tickets awaiting a JetStream ack at once.
    pub publish_window: usize,
    /// Occurrences of jobs with `overlap: allow` are fired (run, ticket and attempt written) this
    /// long before they are due and published at their due millisecond, so the database write is
    /// not part of their lateness. Zero fires at the due time.
    pub fire_lead: Duration,
    /// A published ticket no worker has started after this long is looked for in the dispatch
    /// stream, and sent again if the stream lost it (`sweep.rs`).
    pub resend_after: Duration,
}

impl From<&Settings> for ShardConfig {
    fn from(s: &Settings) -> Self {
        ShardConfig {
            horizon: s.horizon.0,
            load_every: s.load_every.0,
            publish_window: s.publish_window as usize,
            fire_lead: s.fire_lead.0,
            resend_after: s.resend_after.0,
        }
    }
}

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig::from(&Settings::DEFAULT)
    }
}

/// The cluster's settings as a shard follows them.
pub type SettingsRx = tokio::sync::watch::Receiver<VersionedSettings>;

/// A settings channel that never changes, holding `config` over the defaults (benches, tests).
pub fn fixed_settings(config: ShardConfig) -> SettingsRx {
    let settings = Settings {
        horizon: Dur(config.horizon),
        load_every: Dur(config.load_every),
        publish_window: config.publish_window as u32,
        fire_lead: Dur(config.fire_lead),
        resend_after: Dur(config.resend_after),
        ..Settings::DEFAULT
    };
    tokio::sync::watch::channel(VersionedSettings {
        version: 0,
        settings,
        updated_at: chrono::Utc::now(),
    })
    .1
}

/// Everything a shard needs to run.
#[derive(Clone)]
pub struct ShardContext {
    pub shard: u32,
    pub epoch: u64,
    pub node_id: String,
    pub databases: store::Databases,
    /// The cluster's live settings (`config()` reads the shard's part).
    pub settings: SettingsRx,
    /// The cluster config as it changes (`tenant_share` reads it).
    pub cluster_config: tokio::sync::watch::Receiver<chronoshard_wire::rpc::ClusterConfig>,
    /// The queues live workers serve: a shard warns of tickets that wait on any other.
    pub live_queues: tokio::sync::watch::Receiver<chronoshard_cluster::LiveQueues>,
    pub cluster: chronoshard_cluster::Cluster,
    pub clock: SharedClock,
    /// This process's map of local shards, where the shard registers while it answers requests.
    pub local: chronoshard_cluster::LocalShards,
}

impl ShardContext {
    /// The shard's settings now.
    pub fn config(&self) -> ShardConfig {
        ShardConfig::from(&self.settings.borrow().settings)
    }

    /// How many shards share each tenant's limits: in a `time_window` cluster, where a tenant's
    /// jobs spread over the shards, those of the layout in force now (creates go by it: until a
    /// growth's new layout starts, the old shards alone take them and share the whole quota),
    /// each enforcing its part; one otherwise.
    pub fn tenant_share(&self) -> u32 {
        match self.cluster_config.borrow().windows_in_force() {
            Some(w) => w.shards_at(self.clock.now_ms()),
            None => 1,
        }
    }
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

impl ShardError {
    /// Another node owns the shard now: the shard must stop.
    pub fn is_fenced(&self) -> bool {
        matches!(self, ShardError::Store(StoreError::Fenced { .. }))
    }
}

/// Writes that must go through the event loop because they change what the wheel holds.
// A request is the common case and is moved once; boxing it would buy nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Command {
    Request(
        ShardRequest,
        oneshot::Sender<chronoshard_wire::rpc::ShardReply>,
    ),
    /// Results were applied: arm the retry and watchdog timers they call for.
    Applied(Applied),
    /// The worker of a silent attempt answered the watchdog's probe (or did not).
    Probed(probe::Probed),
}

/// Creates written in one transaction at most (see `Shard::on_command`).
const CREATE_BATCH: usize = 128;

/// Runs a shard until `cancel` fires or the shard is fenced by a newer owner.
pub async fn run(ctx: ShardContext, cancel: CancellationToken) -> Result<(), ShardError> {
    let span = tracing::info_span!("shard", shard_id = ctx.shard, epoch = ctx.epoch);
    run_inner(ctx, cancel).instrument(span).await
}

async fn run_inner(ctx: ShardContext, cancel: CancellationToken) -> Result<(), ShardError> {
    let now = ctx.clock.now_ms();
    let store = Store::open(&ctx.databases, ctx.shard, ctx.epoch, &ctx.node_id, now).await?;
    let leaving = Arc::new(moves::Leaving::new(store.key_moves().await?));
    // Child token: a fenced store or a failed task stops the whole shard, not the node.
    let stop = cancel.child_token();
    let wheel_len = Arc::new(AtomicU64::new(0));
    let dispatcher = dispatcher::start(store.clone(), ctx.clone(), stop.clone());
    let sweep = sweep::start(store.clone(), ctx.clone(), dispatcher.bell(), stop.clone());
    let served = served::Served::new(ctx.live_queues.clone(), ctx.cluster.clone());
    let upkeep = upkeep::start(store.clone(), served.clone(), stop.clone());
    let (handoffs, handing) = handoffs::start(store.clone(), ctx.clone(), stop.clone());
    let (cmd_tx, cmd_rx) = mpsc::channel(1024);
    let loop_tx = cmd_tx.downgrade();
    let results = results::start(
        store.clone(),
        ctx.clone(),
        leaving.clone(),
        cmd_tx.clone(),
        stop.clone(),
    )
    .await?;
    let rpc = rpc::start(
        store.clone(),
        ctx.clone(),
        leaving.clone(),
        served,
        cmd_tx,
        wheel_len.clone(),
        stop.clone(),
    )
    .await?;
    info!("shard open");
    let metrics = ShardMetrics::new(ctx.shard);
    let gauge = metrics::WHEEL_ENTRIES_GAUGE.with_label_values(&[metrics.label.as_str()]);
    let mut shard = Shard {
        agenda: Agenda::new(Timers::new(now, ctx.shard, wheel_len, gauge)),
        fire: Firer {
            store: store.clone(),
            dispatcher,
            ctx: ctx.clone(),
            metrics,
            loop_tx,
            handoffs,
        },
        quota: writes::Quota::default(),
        leaving,
    };
    let outcome = match shard.fire.recover(&mut shard.agenda, now).await {
        Ok(()) => shard.event_loop(cmd_rx, stop.clone()).await,
        Err(e) => Err(e),
    };
    stop.cancel();
    let _ = tokio::join!(results, rpc, sweep, upkeep, handing);
    shard.fire.dispatcher.closed().await;
    store.close().await;
    shard.agenda.timers.closed();
    match &outcome {
        Ok(()) => info!("shard closed"),
        Err(e) => warn!(error = %e, "shard stopped"),
    }
    outcome
}

/// The event loop's state: the agenda it lends, the edges firing uses, the tenant limits of
/// write requests, and the routing keys leaving this shard (shared with the results consumer and
/// the request server).
struct Shard {
    agenda: Agenda,
    fire: Firer,
    quota: writes::Quota,
    leaving: Arc<moves::Leaving>,
}

/// This shard's metric handles, resolved once: the fire path must not format labels per fire.
pub(super) struct ShardMetrics {
    label: String,
    fires: prometheus::IntCounter,
    jobs_created: prometheus::IntCounter,
    retries: prometheus::IntCounter,
    dead: prometheus::IntCounter,
    lost: prometheus::IntCounter,
    replaced: prometheus::IntCounter,
}

impl ShardMetrics {
    fn new(shard: u32) -> ShardMetrics {
        let label = shard.to_string();
        let l = [label.as_str()];
        ShardMetrics {
            fires: metrics::FIRES_TOTAL.with_label_values(&l),
            jobs_created: metrics::JOBS_CREATED_TOTAL.with_label_values(&l),
            retries: metrics::RETRIES_TOTAL.with_label_values(&l),
            dead: metrics::DEAD_LETTERS_TOTAL.with_label_values(&l),
            lost: metrics::ATTEMPTS_LOST_TOTAL.with_label_values(&l),
            replaced: metrics::RUNS_REPLACED_TOTAL.with_label_values(&l),
            label,
        }
    }

    /// Counts what one advance of a workflow run did to its steps.
    pub fn workflow_steps(&self, done: &store::Advanced) {
        for (state, n) in [
            ("released", done.released.len()),
            ("skipped", done.skipped),
            ("cancelled", done.cancelled.len()),
        ] {
            if n > 0 {
                metrics::WORKFLOW_STEPS_TOTAL
                    .with_label_values(&[&self.label, state])
                    .inc_by(n as u64);
            }
        }
    }

    /// Counts a workflow run that ended with `status`.
    pub fn workflow_run_ended(&self, status: chronoshard_wire::RunStatus) {
        metrics::WORKFLOW_RUNS_TOTAL
            .with_label_values(&[&self.label, status.as_str()])
            .inc();
    }

    pub fn not_fired(&self, status: chronoshard_wire::RunStatus, reason: &str, count: u64) {
        metrics::OCCURRENCES_NOT_FIRED_TOTAL
            .with_label_values(&[&self.label, status.as_str(), reason])
            .inc_by(count);
    }
}

impl Shard {
    async fn event_loop(
        &mut self,
        mut commands: mpsc::Receiver<Command>,
        stop: CancellationToken,
    ) -> Result<(), ShardError> {
        let clock = self.fire.ctx.clock.clone();
        let mut next_load = clock.now_ms();
        let mut config = self.fire.ctx.cluster_config.clone();
        self.place_by(&config.borrow_and_update());
        loop {
            // A steady stream of commands must not keep a new layout from being seen.
            if config.has_changed().unwrap_or(false) {
                self.place_by(&config.borrow_and_update());
            }
            let now = clock.now_ms();
            if self.agenda.hand_off_due(now) {
                let handed = self.fire.hand_off(&mut self.agenda, now).await;
                unless_fenced(handed, "handing jobs to another shard failed; retrying")?;
            }
            if now >= next_load {
                // The watermark did not move on a failure: the next pass loads the same window.
                let loaded = self.fire.load(&mut self.agenda, now).await;
                unless_fenced(loaded, "loading the wheel failed; retrying")?;
                next_load = now + self.fire.ctx.config().load_every.as_millis() as i64;
            }
            (self.fire)
                .fire_due(&mut self.agenda, &self.leaving, clock.now_ms())
                .await?;
            let wake = (self.agenda.timers.next_deadline())
                .unwrap_or(i64::MAX)
                .min(next_load)
                .min(self.agenda.next_hand_off().unwrap_or(i64::MAX));
            // With a backlog, go round at once (after a waiting command, if any). Otherwise
            // to the microsecond: the part of the current millisecond already gone counts.
            let sleep = if self.agenda.has_backlog() {
                Duration::ZERO
            } else {
                clock.until(wake)
            };
            tokio::select! {
                biased;
                _ = stop.cancelled() => return Ok(()),
                cmd = commands.recv() => match cmd {
                    Some(cmd) => self.on_command(cmd, &mut commands).await?,
                    None => return Ok(()),
                },
                Ok(()) = config.changed() => self.place_by(&config.borrow_and_update()),
                _ = crate::alarm::sleep(sleep) => {}
            }
        }
    }

    /// Follows the cluster config's layouts (a `time_window` cluster's).
    fn place_by(&mut self, config: &chronoshard_wire::rpc::ClusterConfig) {
        let placement = config.windows_in_force().as_ref().map(WindowPlacement::new);
        (self.agenda).place_by(placement, self.fire.ctx.shard, config.version);
    }

    /// Applies a command. A create takes every create queued right behind it along (up to
    /// `CREATE_BATCH`): one transaction for a burst of creates instead of one each. Returns an
    /// error only when the store is fenced (another node owns the shard now: stop).
    async fn on_command(
        &mut self,
        cmd: Command,
        queue: &mut mpsc::Receiver<Command>,
    ) -> Result<(), ShardError> {
        let mut next = Some(cmd);
        while let Some(cmd) = next.take() {
            match cmd {
                // A caller that gave up must not have its write applied late.
                Command::Request(_, reply) if reply.is_closed() => {}
                Command::Request(ShardRequest::CreateJob { .. }, _) => {
                    let batch;
                    (batch, next) = self.gather_creates(cmd, queue);
                    self.writes().create_batch(batch).await?;
                }
                Command::Request(req, reply) => {
                    let (answer, stop) = match self.request(req).await {
                        Ok(answer) => (answer, None),
                        Err(e) => (rpc::error_reply(&e), e.is_fenced().then_some(e)),
                    };
                    let _ = reply.send(answer);
                    if let Some(fenced) = stop {
                        return Err(fenced);
                    }
                }
                Command::Probed(probed) => {
                    let now = self.fire.ctx.clock.now_ms();
                    let (ticket, attempt) = (probed.ticket, probed.attempt);
                    let judged = (self.fire)
                        .watch(&mut self.agenda, ticket, attempt, Some(probed), now)
                        .await;
                    // Checked again when the shard reopens.
                    unless_fenced(judged, "judging a probed attempt failed")?;
                }
                Command::Applied(applied) => {
                    let now = self.fire.ctx.clock.now_ms();
                    let followed = self.fire.follow(&mut self.agenda, applied, now).await;
                    self.agenda.runs_ended();
                    // What was not armed is found again: due retries by the outbox scan,
                    // buffered occurrences by the next run end or reopening.
                    unless_fenced(followed, "following applied results failed")?;
                }
            }
        }
        Ok(())
    }

    /// The creates at the head of the queue, `first` included, up to `CREATE_BATCH`, less those
    /// whose caller gave up or whose tenant is moving away (answered here); and the first other
    /// command met, to be applied after them.
    fn gather_creates(
        &self,
        first: Command,
        queue: &mut mpsc::Receiver<Command>,
    ) -> (Vec<writes::Create>, Option<Command>) {
        let mut batch = Vec::new();
        let mut cmd = Some(first);
        while let Some(c) = cmd.take() {
            let Command::Request(
                ShardRequest::CreateJob {
                    job_id,
                    spec,
                    idempotency_key,
                },
                reply,
            ) = c
            else {
                return (batch, Some(c));
            };
            if !reply.is_closed() {
                match self.leaving.refuse_create(job_id) {
                    Some(refused) => {
                        let _ = reply.send(refused);
                    }
                    None => batch.push(writes::Create {
                        job_id,
                        spec,
                        idempotency_key,
                        reply,
                    }),
                }
            }
            if batch.len() < CREATE_BATCH {
                cmd = queue.try_recv().ok();
            }
        }
        (batch, None)
    }

    /// Applies a write request or a step of a tenant move, unless it is about a tenant leaving
    /// this shard.
    async fn request(&mut self, req: ShardRequest) -> Result<ShardReply, ShardError> {
        if let Some(refused) = self.leaving.refusal(&req) {
            return Ok(refused);
        }
        if moves::is_move(&req) {
            let leaving = self.leaving.clone();
            return leaving.apply(&self.fire, &mut self.agenda, req).await;
        }
        if let ShardRequest::ImportJobs { version, pages } = req {
            return self.fire.import(&mut self.agenda, version, pages).await;
        }
        self.writes().handle(req).await
    }

    /// A write request's view of the shard.
    fn writes(&mut self) -> writes::Writes<'_> {
        writes::Writes {
            fire: &self.fire,
            agenda: &mut self.agenda,
            quota: &mut self.quota,
        }
    }
}

/// A failure the shard survives is logged and left to what finds it again; a fenced store stops
/// the shard.
fn unless_fenced(result: Result<(), ShardError>, what: &str) -> Result<(), ShardError> {
    match result {
        Err(e) if e.is_fenced() => Err(e),
        Err(e) => {
            warn!(error = %e, "{what}");
            Ok(())
        }
        Ok(()) => Ok(()),
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
