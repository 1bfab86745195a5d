//! Keeping the shard map right. Every replica follows the node registry (so a replica that
//! becomes the leader knows at once which nodes live); only the leader plans and writes changes
//! (`plan`), each a compare-and-swap on the shard's key that raises its epoch, so even two
//! control planes writing at once could not both win.
//!
//! Where shards should be is the active strategy's answer, asked through the strategy host
//! (`crate::strategy`, on a thread of its own under a deadline). When it gives none (an error,
//! a panic, a missed deadline, an invalid assignment), the pass goes on with `plan::fallback`:
//! shards stay with live owners that take shards and the others still find a node, so failover
//! never depends on a plugin. Each such pass is logged and counted.
//!
//! A pass runs when the live set changes, when a node's TTL runs out (a timer, so a lost node
//! is noticed on time, not on the next tick), when the settings, the active strategy or the
//! leadership change, and every second (to follow moves in flight and drains).

pub mod plan;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, HashSet},
    time::Duration,
};

use async_nats::jetstream::kv;
use chronoshard_cluster::{Cluster, Error as ClusterError};
use chronoshard_plugin_api::Assignment;
use chronoshard_telemetry::metrics;
use chronoshard_wire::{
    rpc::{ClusterConfig, NodeInfo, ShardAssignment},
    settings::VersionedSettings,
    strategy::VersionedStrategy,
};
use futures::{FutureExt, StreamExt};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    leader::Leadership,
    liveness::{Liveness, View},
    strategy::{self, Registry},
};

/// The longest time between two passes of the leader.
pub const PASS_EVERY: Duration = Duration::from_secs(1);

/// What the assignment loop needs.
pub struct Assigner {
    pub cluster: Cluster,
    /// The cluster config: its shard count grows when shards are added.
    pub config: watch::Receiver<ClusterConfig>,
    pub min_nodes: usize,
    pub settings: watch::Receiver<VersionedSettings>,
    pub leadership: watch::Receiver<Leadership>,
    /// The active strategy and its config, as the cluster state says.
    pub strategy: watch::Receiver<VersionedStrategy>,
    /// The strategies this replica can run.
    pub registry: Registry,
}

/// The strategy that failed on the last pass and why, so a strategy that keeps failing is said
/// once, not every second.
type Failing = Option<(String, &'static str)>;

impl Assigner {
    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut liveness = Liveness::new(Instant::now());
        let mut watch = None;
        let mut live_before: Vec<String> = Vec::new();
        let mut next_pass = Instant::now();
        let mut failing: Failing = None;
        loop {
            if watch.is_none() {
                match self.cluster.watch_nodes().await {
                    Ok(w) => watch = Some(w),
                    Err(e) => warn!(error = %e, "cannot watch the node registry; retrying"),
                }
            }
            let s = self.settings.borrow().settings;
            let now = Instant::now();
            let mut wake = next_pass;
            if let Some(expiry) = liveness.next_expiry(s.heartbeat_ttl.0, now) {
                wake = wake.min(expiry);
            }
            let mut due = false;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                change = next_change(&mut watch) => {
                    apply_change(change, &mut liveness, &mut watch, s.heartbeat_ttl.0)
                }
                _ = tokio::time::sleep_until(wake) => due = true,
                _ = self.settings.changed() => due = true,
                _ = self.strategy.changed() => due = true,
                _ = self.leadership.changed() => due = true,
                _ = self.config.changed() => due = true,
            }
            // Heartbeats that queued while a pass ran (a strategy call may take up to its
            // deadline) are taken before liveness is judged: a node is lost when its heartbeats
            // stop, not when this loop was busy.
            while let Some(change) = next_change(&mut watch).now_or_never() {
                apply_change(change, &mut liveness, &mut watch, s.heartbeat_ttl.0);
                if watch.is_none() {
                    break;
                }
            }
            let now = Instant::now();
            let view = liveness.view(s.heartbeat_ttl.0, now);
            if self.leadership.borrow().is_leading() {
                let ages = &metrics::NODE_HEARTBEAT_AGE_GAUGE;
                ages.reset();
                for (node, age) in liveness.ages(now) {
                    ages.with_label_values(&[node]).set(age.as_secs_f64());
                }
            }
            let View::Live(live) = view else {
                continue;
            };
            let ids: Vec<String> = live.iter().map(|n| n.node_id.clone()).collect();
            if ids != live_before {
                due = true;
                live_before = ids;
            }
            if !due || !self.leadership.borrow().is_leading() {
                continue;
            }
            next_pass = now + PASS_EVERY;
            if let Err(e) = self.pass(&live, &mut failing).await {
                warn!(error = %e, "shard assignment pass failed");
            }
        }
    }

    /// One pass: read the map and the drains, plan, write the moves while still leading.
    async fn pass(&self, live: &[NodeInfo], failing: &mut Failing) -> Result<usize, ClusterError> {
        let shard_count = self.config.borrow().shard_count;
        let current = self.cluster.assignments().await?;
        let draining: HashSet<String> = self
            .cluster
            .drains()
            .await?
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let owners: BTreeMap<u32, String> = current
            .iter()
            .map(|(a, _)| (a.shard, a.owner.clone()))
            .collect();
        let settings = self.settings.borrow().settings;
        let input = plan::Input {
            shard_count,
            owners: &owners,
            live,
            draining: &draining,
            settings: &settings,
            min_nodes: self.min_nodes,
        };
        let active = self.strategy.borrow().clone();
        let Some(asked) = plan::strategy_input(&input, &active.config) else {
            count_unowned(shard_count, &owners, live);
            return Ok(0);
        };
        let desired = self.desired(&active.name, asked, &input, failing).await;
        let moves = plan::plan(&input, &desired);
        // What the map holds once this pass's writes land: unowned is counted after them.
        let mut after = owners.clone();
        let mut changes = 0;
        for m in moves {
            // The lease may run out during a pass: no write after that.
            if !self.leadership.borrow().is_leading() {
                break;
            }
            let existing = current.iter().find(|(a, _)| a.shard == m.shard);
            let a = ShardAssignment {
                shard: m.shard,
                owner: m.to.clone(),
                epoch: existing.map_or(1, |(a, _)| a.epoch + 1),
            };
            match self
                .cluster
                .put_assignment(&a, existing.map(|(_, rev)| *rev))
                .await
            {
                Ok(_) => {
                    info!(
                        shard = m.shard,
                        from = m.from.as_deref().unwrap_or("-"),
                        to = %m.to,
                        epoch = a.epoch,
                        reason = m.reason.label(),
                        "shard assigned"
                    );
                    metrics::SHARD_MOVES_TOTAL
                        .with_label_values(&[m.reason.label()])
                        .inc();
                    after.insert(m.shard, m.to.clone());
                    changes += 1;
                }
                // Someone else wrote the key since it was read: the next pass sees it.
                Err(ClusterError::Conflict { .. }) => {}
                Err(e) => {
                    count_unowned(shard_count, &after, live);
                    return Err(e);
                }
            }
        }
        count_unowned(shard_count, &after, live);
        Ok(changes)
    }

    /// The active strategy's answer, or the fallback's when it gives none.
    async fn desired(
        &self,
        name: &str,
        asked: strategy::Input,
        input: &plan::Input<'_>,
        failing: &mut Failing,
    ) -> Assignment {
        let error = match self.registry.assign(name, asked).await {
            Ok(answer) => {
                if let Some((name, _)) = failing.take() {
                    info!(strategy = %name, "strategy answers again");
                }
                return answer;
            }
            Err(e) => e,
        };
        let reason = error.reason();
        metrics::STRATEGY_ERRORS_TOTAL
            .with_label_values(&[name, reason])
            .inc();
        let now = Some((name.to_string(), reason));
        if *failing != now {
            warn!(
                strategy = name,
                reason,
                error = %error,
                "strategy gave no usable answer; shards stay with their live owners and \
                 the others are placed by the built-in fallback"
            );
            *failing = now;
        } else {
            debug!(strategy = name, reason, error = %error, "strategy still failing");
        }
        plan::fallback(input)
    }
}

/// A change of the node registry.
enum Change {
    Heartbeat(NodeInfo),
    Left(String),
}

/// Records a change of the node registry in `liveness`; an ended watch is dropped, to be
/// opened again.
fn apply_change(
    change: Option<Change>,
    liveness: &mut Liveness,
    watch: &mut Option<kv::Watch>,
    ttl: std::time::Duration,
) {
    match change {
        Some(Change::Heartbeat(info)) => liveness.heartbeat(info, ttl, Instant::now()),
        Some(Change::Left(node)) => liveness.left(&node, Instant::now()),
        None => *watch = None,
    }
}

/// The next change of the node registry, or None when the watch ended (or there is none: then
/// after a pause, so the caller's retry does not spin).
async fn next_change(watch: &mut Option<kv::Watch>) -> Option<Change> {
    let Some(w) = watch else {
        tokio::time::sleep(PASS_EVERY).await;
        return None;
    };
    loop {
        match w.next().await {
            Some(Ok(e)) => match e.operation {
                kv::Operation::Put => match serde_json::from_slice::<NodeInfo>(&e.value) {
                    Ok(info) => return Some(Change::Heartbeat(info)),
                    Err(err) => warn!(node = %e.key, error = %err, "unreadable node heartbeat"),
                },
                kv::Operation::Delete | kv::Operation::Purge => return Some(Change::Left(e.key)),
            },
            Some(Err(e)) => warn!(error = %e, "node registry watch error"),
            None => return None,
        }
    }
}

/// Sets `chronoshard_shards_unowned` from the map as this pass leaves it: 0 for each live node,
/// and each shard whose owner is not live counted under that owner (`none` when it has none).
fn count_unowned(shard_count: u32, owners: &BTreeMap<u32, String>, live: &[NodeInfo]) {
    let gauge = &metrics::SHARDS_UNOWNED_GAUGE;
    gauge.reset();
    for n in live {
        gauge.with_label_values(&[&n.node_id]).set(0);
    }
    let live_ids: HashSet<&str> = live.iter().map(|n| n.node_id.as_str()).collect();
    for shard in 0..shard_count {
        let owner = owners.get(&shard).map_or("none", String::as_str);
        if !live_ids.contains(owner) {
            gauge.with_label_values(&[owner]).inc();
        }
    }
}
