//! Adding shards while jobs fire. `POST /v1/shards` writes the growth into the cluster config
//! (`plan::begin`); the assigner gives the added shards owners; the leader then moves, old
//! shard by old shard, every tenant whose routing key now places it on an added shard.
//!
//! One move, for the tenants sharing one routing key: the old shard freezes the key (it stops
//! firing those tenants and answers their writes with `Moving`, which the router retries), the
//! rows are copied a page at a time into the new shard's staging table, the new shard commits
//! them in one transaction and starts firing them, the config switches the API to the new
//! shard, and the old shard deletes its copy and forwards what still arrives for the key. Each
//! step is written so that doing it again changes nothing: a leader that dies, or a node that is
//! killed, mid-move is followed by one that starts the move again from the config and the shard
//! databases. Once an old shard's tenants have moved, every key that leaves it (also keys no
//! tenant uses yet) is frozen, what was created meanwhile moved, and the shard is sealed.
//!
//! A `time_window` cluster moves nothing here: the growth's config adds a layout for later
//! windows, and each shard hands a job to its new shard when the job's next occurrence reaches
//! that layout. The leader only readies the added shards: it waits for their owners and gives
//! them the tenants paused on the old shards (every shard records a tenant's pause), then ends
//! the growth.
//!
//! Owns the order of the steps; it must not touch shard databases except through shard
//! requests, nor write the shard map (the assigner's).

pub mod plan;

use std::time::{Duration, Instant};

use chronoshard_cluster::{Cluster, Error as ClusterError};
use chronoshard_telemetry::metrics;
use chronoshard_wire::{
    growth::{ExportCursor, MovePhase, TenantMove},
    rpc::{ClusterConfig, KeyTarget, ShardReply, ShardRequest, TenantJobs},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    leader::Leadership,
    routing::{CallError, Route, Router},
};
use plan::Step;

/// Bytes of rows one export page carries at most (well under NATS's 1 MB message limit once
/// framed as JSON).
const PAGE_BYTES: u32 = 256 * 1024;
/// Pause after a failed step before the growth is taken up again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("shard {shard}: {source}")]
    Call { shard: u32, source: CallError },
    #[error("shard {shard} answered {reply}")]
    Reply { shard: u32, reply: String },
    #[error("this replica no longer leads")]
    NotLeading,
}

/// What moving tenants needs.
pub struct Grower {
    pub cluster: Cluster,
    pub router: Router,
    pub config: watch::Receiver<ClusterConfig>,
    pub leadership: watch::Receiver<Leadership>,
    /// The live settings (a `time_window` growth reads the horizon).
    pub settings: crate::SettingsRx,
}

impl Grower {
    /// Moves tenants whenever this replica leads and shards are being added, until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        loop {
            let growing = self.config.borrow().growth.is_some();
            let pending = &metrics::GROWTH_SHARDS_PENDING_GAUGE;
            if growing && self.leadership.borrow().is_leading() {
                let outcome = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = self.grow() => r,
                };
                match outcome {
                    Ok(()) => pending.set(0),
                    Err(e) => {
                        warn!(error = %e, "adding shards: a step failed; taking it up again");
                        metrics::TENANT_MOVES_TOTAL
                            .with_label_values(&["retried"])
                            .inc();
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(RETRY_AFTER) => {}
                        }
                    }
                }
                continue;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.config.changed() => {}
                _ = self.leadership.changed() => {}
            }
        }
    }

    /// Seals every old shard in turn; returns once the growth is over.
    async fn grow(&self) -> Result<(), MoveError> {
        loop {
            let config = self.config.borrow().clone();
            let Some(g) = &config.growth else {
                return Ok(());
            };
            if let Some(windows) = &config.windows {
                self.ready_added(g.from, config.shard_count).await?;
                // Readying took longer than `begin`'s margin: the layout starts past the horizon
                // and one more window from now, as `begin` placed it.
                let horizon = self.settings.borrow().settings.horizon.0;
                let window_ms = i64::from(windows.window_secs.max(1)) * 1_000;
                let clear =
                    chrono::Utc::now().timestamp_millis() + horizon.as_millis() as i64 + window_ms;
                let earliest = plan::first_window_after(windows, clear);
                return self.step(Step::Laid { earliest }).await;
            }
            metrics::GROWTH_SHARDS_PENDING_GAUGE.set(i64::from(g.from) - g.sealed.len() as i64);
            let Some(source) = (0..g.from).find(|s| !g.sealed.contains(s)) else {
                return Ok(());
            };
            for added in g.from..config.shard_count {
                self.ask(added, &ShardRequest::Ping).await?;
            }
            self.seal(source).await?;
        }
    }

    /// Waits for owners of the shards `from..to` added to a `time_window` cluster and pauses on
    /// them every tenant paused on an older shard.
    async fn ready_added(&self, from: u32, to: u32) -> Result<(), MoveError> {
        for added in from..to {
            self.ask(added, &ShardRequest::Ping).await?;
        }
        let mut paused = std::collections::BTreeSet::new();
        for old in 0..from {
            match self.ask(old, &ShardRequest::ListPaused).await? {
                ShardReply::Paused { tenants } => paused.extend(tenants),
                other => return Err(unexpected(old, other)),
            }
        }
        for added in from..to {
            for tenant in &paused {
                let pause = ShardRequest::PauseTenant {
                    tenant: tenant.clone(),
                };
                self.ask(added, &pause).await?;
            }
        }
        info!(
            from,
            to,
            paused = paused.len(),
            "added shards ready; jobs move to them at the new layout's first window"
        );
        Ok(())
    }

    /// Moves every tenant leaving `source`, then freezes its other leaving keys, moves what
    /// was created meanwhile, and seals it.
    async fn seal(&self, source: u32) -> Result<(), MoveError> {
        let leaving = self.router.placement().leaving(source);
        let unfinished = (self.config.borrow().growth.as_ref()).and_then(|g| g.moving.clone());
        if let Some(m) = unfinished {
            // A move taken up again after a failure: its tenants first.
            if m.source == source {
                self.move_key(
                    &m.tenants,
                    KeyTarget {
                        key: m.key,
                        target: m.target,
                    },
                    source,
                )
                .await?;
            }
        }
        self.move_listed(source, &leaving).await?;
        self.ask(
            source,
            &ShardRequest::FreezeKeys {
                moves: leaving.clone(),
            },
        )
        .await?;
        self.move_listed(source, &leaving).await?;
        let keys: Vec<u16> = leaving.iter().map(|k| k.key).collect();
        self.step(Step::Seal { source, keys }).await?;
        self.ask(
            source,
            &ShardRequest::ReleaseKeys {
                moves: leaving,
                tenants: Vec::new(),
            },
        )
        .await?;
        info!(shard = source, "every tenant leaving this shard has moved");
        Ok(())
    }

    /// Moves every tenant `source` lists now whose key is `leaving` and not moved yet.
    async fn move_listed(&self, source: u32, leaving: &[KeyTarget]) -> Result<(), MoveError> {
        let listed = self.tenants(source).await?;
        let moved = self.moved();
        for (key, (target, tenants)) in plan::groups(&listed, leaving, &moved) {
            self.move_key(&tenants, KeyTarget { key, target }, source)
                .await?;
        }
        Ok(())
    }

    /// Moves the tenants of one routing key from `source` to `to.target`.
    async fn move_key(
        &self,
        listed: &[String],
        to: KeyTarget,
        source: u32,
    ) -> Result<(), MoveError> {
        let started = Instant::now();
        let KeyTarget { key, target } = to;
        let mut m = TenantMove {
            key,
            tenants: listed.to_vec(),
            source,
            target,
            phase: MovePhase::Frozen,
            started_at: chrono::Utc::now(),
            finished_at: None,
            rows: 0,
        };
        self.step(Step::Freeze(m.clone())).await?;
        self.ask(source, &ShardRequest::FreezeKeys { moves: vec![to] })
            .await?;
        // Frozen now: the tenant set of the key cannot change any more.
        let tenants: Vec<String> = self
            .tenants(source)
            .await?
            .into_iter()
            .map(|t| t.tenant)
            .filter(|t| chronoshard_wire::ids::tenant_key(t) == key)
            .collect();
        m.tenants = tenants.clone();
        let mut cursor = ExportCursor::default();
        let mut seq = 0u32;
        loop {
            let req = ShardRequest::ExportTenants {
                tenants: tenants.clone(),
                cursor,
                max_bytes: PAGE_BYTES,
            };
            let (pages, next) = match self.ask(source, &req).await? {
                ShardReply::Exported { pages, next } => (pages, next),
                other => return Err(unexpected(source, other)),
            };
            self.ask(target, &ShardRequest::StageImport { key, seq, pages })
                .await?;
            seq += 1;
            match next {
                Some(c) => cursor = c,
                None => break,
            }
        }
        let rows = match self
            .ask(target, &ShardRequest::CommitImport { key })
            .await?
        {
            ShardReply::MoveStep { rows } => rows,
            other => return Err(unexpected(target, other)),
        };
        self.step(Step::Committed { key, rows }).await?;
        let frozen = started.elapsed();
        self.ask(
            source,
            &ShardRequest::ReleaseKeys {
                moves: vec![to],
                tenants: tenants.clone(),
            },
        )
        .await?;
        self.step(Step::Done {
            now: chrono::Utc::now(),
        })
        .await?;
        metrics::TENANT_MOVES_TOTAL
            .with_label_values(&["done"])
            .inc();
        metrics::TENANT_MOVE_SECONDS_HISTOGRAM.observe(frozen.as_secs_f64());
        info!(
            ?tenants,
            key,
            from = source,
            to = target,
            rows,
            frozen_ms = frozen.as_millis() as u64,
            "tenant moved to an added shard"
        );
        Ok(())
    }

    fn moved(&self) -> Vec<u16> {
        self.config
            .borrow()
            .growth
            .as_ref()
            .map(|g| g.moved.clone())
            .unwrap_or_default()
    }

    async fn tenants(&self, shard: u32) -> Result<Vec<TenantJobs>, MoveError> {
        match self.ask(shard, &ShardRequest::ListTenants).await? {
            ShardReply::Tenants { tenants } => Ok(tenants),
            other => Err(unexpected(shard, other)),
        }
    }

    /// One request to a shard's owner (retried while the shard has none), refused once this
    /// replica no longer leads.
    async fn ask(&self, shard: u32, req: &ShardRequest) -> Result<ShardReply, MoveError> {
        if !self.leadership.borrow().is_leading() {
            return Err(MoveError::NotLeading);
        }
        match self.router.call(Route::Shard(shard), req).await {
            Ok(ShardReply::Error(e)) => Err(MoveError::Reply {
                shard,
                reply: e.message,
            }),
            Ok(reply) => Ok(reply),
            Err(source) => Err(MoveError::Call { shard, source }),
        }
    }

    /// Writes a step into the config (compare-and-swap on the entry read just before), then
    /// waits until this replica's own view has it, so the router places by it.
    async fn step(&self, step: Step) -> Result<(), MoveError> {
        loop {
            if !self.leadership.borrow().is_leading() {
                return Err(MoveError::NotLeading);
            }
            let Some((current, revision)) = self.cluster.config_entry().await? else {
                return Ok(());
            };
            let Some(next) = plan::apply(&current, step.clone()) else {
                return Ok(());
            };
            match self.cluster.put_config(&next, revision).await {
                Ok(_) => {
                    seen(&self.config, next.version).await;
                    return Ok(());
                }
                Err(ClusterError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Waits (up to 5 s) until this replica's view of the config has `version`, so that what
/// follows a config write (routing, an answer to the caller) sees it.
pub async fn seen(config: &watch::Receiver<ClusterConfig>, version: u64) {
    let mut config = config.clone();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        config.wait_for(|c| c.version >= version),
    )
    .await;
}

fn unexpected(shard: u32, reply: ShardReply) -> MoveError {
    MoveError::Reply {
        shard,
        reply: format!("{reply:?}"),
    }
}
