//! `/v1/cluster` and `/v1/nodes`: the replicas and the leader, the
//! nodes with their state, and draining a node. Read from cluster state; a drain is a mark in KV
//! that the leader acts on (this handler moves nothing itself).

use std::collections::{BTreeMap, HashSet};

use axum::{
    extract::{Path, State},
    Json,
};
use chrono::Utc;
use chronoshard_wire::{
    rpc::{ClusterConfig, NodeInfo},
    settings::Settings,
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{error::ApiError, AppState};
use crate::assign::plan::{excluded, Reason};

/// Where a node stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// Heartbeating and taking shards.
    Live,
    /// Asked to drain; its shards are moving away.
    Draining,
    /// Drained: it owns and runs no shard and can be stopped.
    Drained,
    /// Heartbeating but taking no shards (see `reason`).
    Excluded,
    /// No heartbeat within the heartbeat TTL: its shards moved (or are moving) to other nodes.
    Lost,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    pub node_id: String,
    pub status: NodeStatus,
    /// Why the node is excluded or lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Shards open on the node (its last heartbeat).
    pub shards: Vec<u32>,
    /// Shards the shard map gives it.
    pub assigned: Vec<u32>,
    pub started_at: chrono::DateTime<Utc>,
    /// Seconds since the node's last heartbeat.
    pub heartbeat_age_s: f64,
    /// Version of the cluster settings the node runs.
    pub settings_version: u64,
    /// The node's clock minus the NATS server's, in milliseconds (absent until measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_ms: Option<f64>,
    /// The node's failure domain (`--zone`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The node's labels (`--label KEY=VALUE`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Occurrences held in the time wheels of its open shards (its last heartbeat).
    #[serde(default)]
    pub wheel_size: u64,
    /// Ticket attempts its open shards have in flight: unpublished, queued or running (its last
    /// heartbeat).
    #[serde(default)]
    pub in_flight: u64,
    /// CPU its process used between its two latest heartbeats, in cores.
    #[serde(default)]
    pub cpu_cores: f64,
    /// The most shards it may own (`--max-shards`); absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_shards: Option<u32>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    pub nodes: Vec<NodeView>,
}

pub(super) fn unavailable(e: chronoshard_cluster::Error) -> ApiError {
    ApiError::Unavailable(e.to_string())
}

/// Seconds since `t` (0 for a time ahead of this clock), as the registry views show ages.
pub(super) fn age_s(t: chrono::DateTime<Utc>) -> f64 {
    (Utc::now() - t).num_milliseconds().max(0) as f64 / 1000.0
}

/// The shard nodes in the registry: live ones, and for a minute lost ones.
#[utoipa::path(get, path = "/v1/nodes", tag = "cluster", responses((status = 200, body = NodeList)),
    security(("bearer" = [])))]
pub async fn list_nodes(State(state): State<AppState>) -> Result<Json<NodeList>, ApiError> {
    // The map first: heartbeats read after it are at least as new, so a move the map shows is
    // never counted as not open yet because of an older heartbeat.
    let assigned = state.cluster.assignments().await.map_err(unavailable)?;
    let draining = draining(&state).await?;
    let nodes = state.cluster.nodes().await.map_err(unavailable)?;
    let settings = state.settings.borrow().settings;
    let mut by_owner: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (a, _) in &assigned {
        by_owner.entry(a.owner.as_str()).or_default().push(a.shard);
    }
    let mut views: Vec<NodeView> = nodes
        .into_iter()
        .map(|n| {
            let mine = by_owner
                .get(n.node_id.as_str())
                .cloned()
                .unwrap_or_default();
            view(n, mine, &draining, &settings)
        })
        .collect();
    views.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    Ok(Json(NodeList { nodes: views }))
}

async fn draining(state: &AppState) -> Result<HashSet<String>, ApiError> {
    Ok(state
        .cluster
        .drains()
        .await
        .map_err(unavailable)?
        .into_iter()
        .map(|(n, _)| n)
        .collect())
}

/// A node's view. Its heartbeat's age is corrected by its own clock offset, so a node whose
/// clock runs ahead does not look younger than it is.
fn view(n: NodeInfo, assigned: Vec<u32>, draining: &HashSet<String>, s: &Settings) -> NodeView {
    let offset = n.clock_offset_ms.unwrap_or(0.0);
    let by_its_clock = (Utc::now() - n.heartbeat_at)
        .num_microseconds()
        .unwrap_or(i64::MAX);
    let age = (by_its_clock as f64 / 1e6 + offset / 1000.0).max(0.0);
    let ttl = s.heartbeat_ttl.0.as_secs_f64();
    let (status, reason) = if age >= ttl {
        let why = format!(
            "no heartbeat for {age:.1} s (the heartbeat TTL is {})",
            s.heartbeat_ttl
        );
        (NodeStatus::Lost, Some(why))
    } else {
        match excluded(&n, draining, s) {
            Some(Reason::Drain) if assigned.is_empty() && n.shards.is_empty() => {
                (NodeStatus::Drained, None)
            }
            Some(Reason::Drain) => (NodeStatus::Draining, None),
            Some(_) => {
                let why = format!(
                    "clock offset {offset:.0} ms is beyond the {} the settings allow: \
                     it takes no shards until its clock is fixed",
                    s.max_clock_offset
                );
                (NodeStatus::Excluded, Some(why))
            }
            None => (NodeStatus::Live, None),
        }
    };
    NodeView {
        status,
        reason,
        shards: n.shards,
        assigned,
        started_at: n.started_at,
        heartbeat_age_s: age,
        settings_version: n.settings_version,
        clock_offset_ms: n.clock_offset_ms,
        zone: n.zone,
        labels: n.labels,
        wheel_size: n.wheel_size,
        in_flight: n.in_flight,
        cpu_cores: n.cpu_share,
        max_shards: n.max_shards,
        node_id: n.node_id,
    }
}

/// One node's view, or 404.
async fn node(state: &AppState, id: &str) -> Result<NodeView, ApiError> {
    let Json(list) = list_nodes(State(state.clone())).await?;
    list.nodes
        .into_iter()
        .find(|n| n.node_id == id)
        .ok_or(ApiError::NotFound("node"))
}

/// Drains a node: the leader moves its shards to other nodes (at most `max_moves` at a time,
/// each fenced by a new epoch, so nothing fires twice and nothing is left unfired) and gives it
/// none; once it owns and runs none it shows `drained` and can be stopped. Answers at once with
/// the node as it is now.
#[utoipa::path(post, path = "/v1/nodes/{node_id}/drain", tag = "cluster",
    params(("node_id" = String, Path, description = "the node's id")),
    responses((status = 202, body = NodeView)),
    security(("bearer" = [])))]
pub async fn drain_node(
    State(state): State<AppState>,
    Path(node_id): Path<String>,
) -> Result<(axum::http::StatusCode, Json<NodeView>), ApiError> {
    node(&state, &node_id).await?;
    state.cluster.drain(&node_id).await.map_err(unavailable)?;
    tracing::info!(node_id, "node drain asked for");
    Ok((
        axum::http::StatusCode::ACCEPTED,
        Json(node(&state, &node_id).await?),
    ))
}

/// Returns a drained (or draining) node to service: it takes shards again.
#[utoipa::path(post, path = "/v1/nodes/{node_id}/undrain", tag = "cluster",
    params(("node_id" = String, Path, description = "the node's id")),
    responses((status = 200, body = NodeView)),
    security(("bearer" = [])))]
pub async fn undrain_node(
    State(state): State<AppState>,
    Path(node_id): Path<String>,
) -> Result<Json<NodeView>, ApiError> {
    node(&state, &node_id).await?;
    state.cluster.undrain(&node_id).await.map_err(unavailable)?;
    tracing::info!(node_id, "node returned to service");
    Ok(Json(node(&state, &node_id).await?))
}

/// The leader lease as this replica sees it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LeaseView {
    pub holder: String,
    pub term: u64,
    pub ttl_ms: u64,
    /// The holder's clock at its last renewal.
    pub renewed_at: chrono::DateTime<Utc>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReplicaView {
    pub id: String,
    /// Where its REST API listens.
    pub http: String,
    pub started_at: chrono::DateTime<Utc>,
    pub heartbeat_age_s: f64,
    pub version: String,
    /// Whether it holds the leader lease.
    pub leader: bool,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClusterView {
    /// The leading replica's id (null while no replica leads, e.g. during a failover).
    pub leader: Option<String>,
    /// The lease as last written (it may name a holder that is gone until its TTL runs out).
    pub lease: Option<LeaseView>,
    /// The replica that answered this request.
    pub answered_by: String,
    pub replicas: Vec<ReplicaView>,
    pub config: ClusterConfig,
    /// Version of the live settings in force.
    pub settings_version: u64,
}

/// The control-plane replicas, which one leads, and its lease.
#[utoipa::path(get, path = "/v1/cluster", tag = "cluster", responses((status = 200, body = ClusterView)),
    security(("bearer" = [])))]
pub async fn get_cluster(State(state): State<AppState>) -> Result<Json<ClusterView>, ApiError> {
    let lease = state.cluster.lease().await.map_err(unavailable)?;
    let leader = state.leadership.borrow().leader.clone().map(|(id, _)| id);
    let mut replicas: Vec<ReplicaView> = state
        .cluster
        .replicas()
        .await
        .map_err(unavailable)?
        .into_iter()
        .map(|r| ReplicaView {
            heartbeat_age_s: age_s(r.heartbeat_at),
            leader: leader.as_deref() == Some(r.id.as_str()),
            id: r.id,
            http: r.http,
            started_at: r.started_at,
            version: r.version,
        })
        .collect();
    replicas.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(Json(ClusterView {
        leader,
        lease: lease.and_then(|e| e.lease).map(|l| LeaseView {
            holder: l.holder,
            term: l.term,
            ttl_ms: l.ttl_ms,
            renewed_at: l.renewed_at,
        }),
        answered_by: state.replica.clone(),
        replicas,
        config: state.config.borrow().clone(),
        settings_version: state.settings.borrow().version,
    }))
}
