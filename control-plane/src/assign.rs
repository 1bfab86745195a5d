//! Keeping the shard map right: every shard assigned to a live node by the built-in `balanced`
//! strategy, an owner change always bumping the shard's epoch. Writes are compare-and-swap on the
//! KV revision, so two control planes computing at once cannot both win.

use std::time::Duration;

use async_nats::jetstream::kv;
use chronoshard_cluster::{Cluster, Error as ClusterError, HEARTBEAT_EVERY, HEARTBEAT_TTL};
use chronoshard_plugin_api::{balanced, Assignment, Problem};
use chronoshard_wire::rpc::ShardAssignment;
use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::liveness::{Change, Liveness};

pub const ASSIGN_EVERY: Duration = Duration::from_secs(1);

/// Runs the assignment loop until `shutdown`.
///
/// `min_nodes`: while the shard map is still empty, wait for this many nodes before the first
/// assignment, so a cluster that starts several nodes at once does not move every shard twice.
pub async fn run(
    cluster: Cluster,
    shard_count: u32,
    min_nodes: usize,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(ASSIGN_EVERY);
    let mut liveness = Liveness::new(HEARTBEAT_TTL, Instant::now());
    let mut watch = None;
    loop {
        if watch.is_none() {
            match cluster.watch_nodes().await {
                Ok(w) => watch = Some(w),
                Err(e) => warn!(error = %e, "cannot watch the node registry; retrying"),
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            entry = next_change(&mut watch) => match entry {
                Some((node, change)) => liveness.saw(&node, change, Instant::now()),
                // Re-created on the next turn; what was seen so far stays.
                None => watch = None,
            },
            _ = tick.tick() => {
                let now = Instant::now();
                if !liveness.complete(HEARTBEAT_EVERY, now) {
                    continue;
                }
                let nodes = liveness.live(now);
                if let Err(e) = assign_once(&cluster, shard_count, min_nodes, nodes).await {
                    warn!(error = %e, "shard assignment pass failed");
                }
            }
        }
    }
}

/// The next change of the node registry, or None when the watch ended (or there is none: then
/// after a pause, so the caller's retry does not spin).
async fn next_change(watch: &mut Option<kv::Watch>) -> Option<(String, Change)> {
    let Some(w) = watch else {
        tokio::time::sleep(ASSIGN_EVERY).await;
        return None;
    };
    loop {
        match w.next().await {
            Some(Ok(e)) => {
                let change = match e.operation {
                    kv::Operation::Put => Change::Heartbeat,
                    kv::Operation::Delete | kv::Operation::Purge => Change::Left,
                };
                return Some((e.key, change));
            }
            Some(Err(e)) => warn!(error = %e, "node registry watch error"),
            None => return None,
        }
    }
}

/// One pass: given the live nodes, read the map, compute, write the differences. Returns the
/// changes made.
pub async fn assign_once(
    cluster: &Cluster,
    shard_count: u32,
    min_nodes: usize,
    nodes: Vec<String>,
) -> Result<usize, ClusterError> {
    let current = cluster.assignments().await?;
    if nodes.is_empty() || (current.is_empty() && nodes.len() < min_nodes) {
        return Ok(0);
    }
    let previous: Assignment = current
        .iter()
        .map(|(a, _)| (a.shard, a.owner.clone()))
        .collect();
    let desired = balanced(
        &Problem {
            shards: (0..shard_count).collect(),
            nodes,
        },
        &previous,
    );
    let mut changes = 0;
    for (shard, owner) in desired {
        let existing = current.iter().find(|(a, _)| a.shard == shard);
        if existing.is_some_and(|(a, _)| a.owner == owner) {
            continue;
        }
        let epoch = existing.map(|(a, _)| a.epoch + 1).unwrap_or(1);
        let a = ShardAssignment {
            shard,
            owner: owner.clone(),
            epoch,
        };
        match cluster
            .put_assignment(&a, existing.map(|(_, rev)| *rev))
            .await
        {
            Ok(_) => {
                info!(shard, owner = %owner, epoch, "shard assigned");
                changes += 1;
            }
            Err(ClusterError::Conflict { .. }) => {} // another control plane got there first
            Err(e) => return Err(e),
        }
    }
    Ok(changes)
}
