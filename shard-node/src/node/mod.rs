//! The shard node: registers itself, follows the shard map and the live settings, and runs
//! exactly the shards the map gives it, each under the epoch written there. It decides nothing
//! about ownership itself.
//!
//! - `heartbeat`: its registry entry, with its load and its clock offset measured against the
//!   NATS server;
//! - `cpu`: the CPU the process uses, in cores;
//! - `offset`: the offset estimate (pure).

mod cpu;
mod heartbeat;
pub mod offset;

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use chronoshard_cluster::{Cluster, Connections, LiveQueues};
use chronoshard_wire::{
    rpc::{ClusterConfig, ShardAssignment, Sharding},
    settings::Settings,
};
use futures::StreamExt;
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use crate::{
    clock::{SharedClock, SystemClock},
    shard::{self, store::Databases, SettingsRx, ShardContext},
};

/// How often the node restarts shards whose task ended while they are still assigned to it.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// How to run a shard node.
#[derive(Clone, Debug)]
pub struct Options {
    /// Stable id: shard assignments follow it across restarts.
    pub node_id: String,
    /// Where the shard databases live (SQLite files in a directory, or Postgres schemas).
    pub databases: Databases,
    /// Where this node's shards also take requests from callers in the same process (the
    /// control plane of `chronoshard dev`); a default one is private to the node.
    pub local: chronoshard_cluster::LocalShards,
    /// The node's failure domain, carried in its heartbeat for the assignment strategy.
    pub zone: Option<String>,
    /// The operator's labels of the node, carried in its heartbeat for the assignment strategy.
    pub labels: BTreeMap<String, String>,
    /// The most shards the node may own, carried in its heartbeat: the control plane's assignment
    /// respects it (None: no limit).
    pub max_shards: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cluster state: {0}")]
    Cluster(#[from] chronoshard_cluster::Error),
}

/// A view of a running node, for tests and the dev supervisor. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Handle {
    open: watch::Receiver<Vec<u32>>,
}

impl Handle {
    /// Shards currently open on this node.
    pub fn open_shards(&self) -> Vec<u32> {
        self.open.borrow().clone()
    }
}

struct Running {
    epoch: u64,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), shard::ShardError>>,
}

pub struct ShardNode;

impl ShardNode {
    /// Starts the node; it runs until `shutdown` fires, then closes its shards and deregisters.
    pub async fn start(
        opts: Options,
        nats: impl Into<Connections>,
        shutdown: CancellationToken,
    ) -> Result<(Handle, JoinHandle<()>), Error> {
        Self::start_with_clock(opts, nats, Arc::new(SystemClock), shutdown).await
    }

    pub async fn start_with_clock(
        opts: Options,
        nats: impl Into<Connections>,
        clock: SharedClock,
        shutdown: CancellationToken,
    ) -> Result<(Handle, JoinHandle<()>), Error> {
        let nats = nats.into();
        let cluster = Cluster::connect(nats.data).await?;
        let membership = Cluster::connect(nats.membership).await?;
        let (open_tx, open_rx) = watch::channel(Vec::new());
        let span = tracing::info_span!("shard_node", node_id = %opts.node_id);
        // Until the cluster's settings are read the defaults apply (a control plane writes them
        // when it creates the cluster, before any node can have shards).
        let settings = membership.follow_settings(Settings::DEFAULT, shutdown.clone());
        let live_queues = membership.follow_live_queues(shutdown.clone());
        // No shards until read: no shard opens before (`reconcile`).
        let unread = ClusterConfig {
            version: 0,
            ..ClusterConfig::new(0, Sharding::Tenant)
        };
        let config = membership.follow_config(unread, shutdown.clone());
        let node = Node {
            opts,
            cluster,
            membership,
            settings,
            config,
            live_queues,
            clock,
            running: HashMap::new(),
            desired: HashMap::new(),
            stopping: HashMap::new(),
            open_tx,
        };
        let task = tokio::spawn(node.run(shutdown).instrument(span));
        Ok((Handle { open: open_rx }, task))
    }
}

struct Node {
    opts: Options,
    /// On the data connection: what the shards use.
    cluster: Cluster,
    /// On the membership connection: heartbeats and the shard map.
    membership: Cluster,
    settings: SettingsRx,
    /// The cluster config (its sharding mode and shard count), shared by the node's shards.
    config: watch::Receiver<ClusterConfig>,
    /// The queues live workers serve, shared by the node's shards.
    live_queues: watch::Receiver<LiveQueues>,
    clock: SharedClock,
    running: HashMap<u32, Running>,
    /// Shards the map assigns to this node, with their epochs.
    desired: HashMap<u32, u64>,
    /// Shard tasks told to stop and not yet finished.
    stopping: HashMap<u32, JoinHandle<()>>,
    open_tx: watch::Sender<Vec<u32>>,
}

impl Node {
    async fn run(mut self, shutdown: CancellationToken) {
        let stop_heartbeat = CancellationToken::new();
        let heartbeat = tokio::spawn(
            heartbeat::Heartbeat {
                membership: self.membership.clone(),
                node_id: self.opts.node_id.clone(),
                zone: self.opts.zone.clone(),
                labels: self.opts.labels.clone(),
                max_shards: self.opts.max_shards,
                clock: self.clock.clone(),
                open: self.open_tx.subscribe(),
                settings: self.settings.clone(),
            }
            .run(stop_heartbeat.clone())
            .in_current_span(),
        );
        // Restarts shards whose task ended while assigned here.
        let mut retry = tokio::time::interval(RETRY_EVERY);
        let mut watch = None;
        // Shards wanted before the config was read open as soon as it is.
        let mut config = self.config.clone();
        loop {
            if watch.is_none() {
                match self.membership.watch_shard_map().await {
                    Ok(w) => watch = Some(w),
                    Err(e) => warn!(error = %e, "cannot watch the shard map; retrying"),
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = retry.tick() => self.reconcile(),
                Ok(()) = config.changed() => self.reconcile(),
                entry = next_entry(&mut watch) => match entry {
                    Some(entry) => self.on_assignment(entry),
                    None => watch = None,
                },
            }
        }
        // Shards close first, while the node is still listed: its shards move only once they
        // are closed, so their last writes (acks recorded, results applied) are not fenced by
        // the next owner.
        self.desired.clear();
        self.reconcile();
        for (_, task) in self.stopping.drain() {
            let _ = task.await;
        }
        let _ = self.open_tx.send(Vec::new());
        // No heartbeat may follow the removal: it would list the node again.
        stop_heartbeat.cancel();
        let _ = heartbeat.await;
        let _ = self.membership.forget_node(&self.opts.node_id).await;
        info!("shard node stopped");
    }

    /// Follows one entry of the shard map: a shard assigned here is wanted, one assigned
    /// elsewhere (or unassigned) is not.
    fn on_assignment(&mut self, entry: async_nats::jetstream::kv::Entry) {
        use async_nats::jetstream::kv::Operation;
        let shard = entry
            .key
            .strip_prefix("shard.")
            .and_then(|s| s.parse::<u32>().ok());
        match (
            entry.operation,
            serde_json::from_slice::<ShardAssignment>(&entry.value),
        ) {
            (Operation::Put, Ok(a)) if a.owner == self.opts.node_id => {
                self.desired.insert(a.shard, a.epoch);
            }
            // Another owner, or the assignment was deleted.
            _ => {
                if let Some(s) = shard {
                    self.desired.remove(&s);
                }
            }
        }
        // History replays several entries per key at once: act on the last.
        if entry.delta == 0 {
            self.reconcile();
        }
    }

    fn open_shards(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .running
            .iter()
            .filter(|(_, r)| !r.task.is_finished())
            .map(|(s, _)| *s)
            .collect();
        v.sort_unstable();
        v
    }

    /// Starts the shards assigned here and stops the others; restarts a shard whose task ended
    /// while it is still assigned here (after a fault, the next heartbeat tick retries).
    fn reconcile(&mut self) {
        let stale: Vec<u32> = self
            .running
            .iter()
            .filter(|(s, r)| self.desired.get(s) != Some(&r.epoch) || r.task.is_finished())
            .map(|(s, _)| *s)
            .collect();
        for s in stale {
            let r = self.running.remove(&s).expect("listed");
            r.cancel.cancel();
            let task = tokio::spawn(async move {
                if let Ok(Err(e)) = r.task.await {
                    warn!(shard = s, error = %e, "shard ended with an error");
                }
            });
            self.stopping.insert(s, task);
        }
        self.stopping.retain(|_, t| !t.is_finished());
        let known = self.config.borrow().shard_count;
        if known == 0 {
            // A shard needs the cluster's sharding mode (a tenant's limits are shared by every
            // shard in a time_window cluster); a later reconcile opens it.
            return;
        }
        for (&shard, &epoch) in &self.desired {
            // A shard added by a growth this node has not read yet would place jobs by older
            // layouts; a later reconcile opens it.
            if shard >= known {
                continue;
            }
            // The shard opens again only once its previous task here is gone (a later reconcile
            // retries), so two loops of this node never share one shard.
            if self.running.contains_key(&shard) || self.stopping.contains_key(&shard) {
                continue;
            }
            let cancel = CancellationToken::new();
            let ctx = ShardContext {
                shard,
                epoch,
                node_id: self.opts.node_id.clone(),
                databases: self.opts.databases.clone(),
                settings: self.settings.clone(),
                cluster_config: self.config.clone(),
                live_queues: self.live_queues.clone(),
                cluster: self.cluster.clone(),
                clock: self.clock.clone(),
                local: self.opts.local.clone(),
            };
            let task = tokio::spawn(shard::run(ctx, cancel.clone()));
            self.running.insert(
                shard,
                Running {
                    epoch,
                    cancel,
                    task,
                },
            );
        }
        let _ = self.open_tx.send(self.open_shards());
    }
}

async fn next_entry(
    watch: &mut Option<async_nats::jetstream::kv::Watch>,
) -> Option<async_nats::jetstream::kv::Entry> {
    match watch {
        Some(w) => loop {
            match w.next().await {
                Some(Ok(e)) => return Some(e),
                Some(Err(e)) => warn!(error = %e, "shard map watch error"),
                None => return None,
            }
        },
        None => {
            tokio::time::sleep(Duration::from_secs(1)).await;
            None
        }
    }
}
