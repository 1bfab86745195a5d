//! Keeping the shard map right: every shard assigned to a live node by the built-in `balanced`
//! strategy, an owner change always bumping the shard's epoch. Writes are compare-and-swap on the
//! KV revision, so two control planes computing at once cannot both win.

use std::time::Duration;

use chronoshard_cluster::{Cluster, Error as ClusterError};
use chronoshard_plugin_api::{balanced, Assignment, Problem};
use chronoshard_wire::rpc::ShardAssignment;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

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
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = assign_once(&cluster, shard_count, min_nodes).await {
            warn!(error = %e, "shard assignment pass failed");
        }
    }
}

/// One pass: read nodes and the map, compute, write the differences. Returns the changes made.
pub async fn assign_once(
    cluster: &Cluster,
    shard_count: u32,
    min_nodes: usize,
) -> Result<usize, ClusterError> {
    let nodes: Vec<String> = cluster
        .live_nodes()
        .await?
        .into_iter()
        .map(|n| n.node_id)
        .collect();
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
