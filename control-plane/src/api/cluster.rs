//! `/v1/shards` and `/v1/nodes`: the shard map and the live nodes, read from cluster state.

use axum::{extract::State, Json};
use chrono::Utc;
use chronoshard_wire::rpc::ShardAssignment;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{error::ApiError, AppState};

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ShardMap {
    pub shard_count: u32,
    pub shards: Vec<ShardAssignment>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    pub node_id: String,
    /// Shards open on the node.
    pub shards: Vec<u32>,
    pub started_at: chrono::DateTime<Utc>,
    /// Seconds since the node's last heartbeat.
    pub heartbeat_age_s: f64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    pub nodes: Vec<NodeView>,
}

/// The shard map: each shard's owner and epoch.
#[utoipa::path(get, path = "/v1/shards", tag = "cluster", responses((status = 200, body = ShardMap)),
    security(("bearer" = [])))]
pub async fn list_shards(State(state): State<AppState>) -> Result<Json<ShardMap>, ApiError> {
    let shards = state
        .cluster
        .assignments()
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?;
    Ok(Json(ShardMap {
        shard_count: state.router.shard_count(),
        shards: shards.into_iter().map(|(a, _)| a).collect(),
    }))
}

/// Seconds since `t` (0 for a time ahead of this clock), as the registry views show ages.
pub(super) fn age_s(t: chrono::DateTime<Utc>) -> f64 {
    (Utc::now() - t).num_milliseconds().max(0) as f64 / 1000.0
}

/// Shard nodes with a live heartbeat.
#[utoipa::path(get, path = "/v1/nodes", tag = "cluster", responses((status = 200, body = NodeList)),
    security(("bearer" = [])))]
pub async fn list_nodes(State(state): State<AppState>) -> Result<Json<NodeList>, ApiError> {
    let mut nodes: Vec<NodeView> = state
        .cluster
        .live_nodes()
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?
        .into_iter()
        .map(|n| NodeView {
            heartbeat_age_s: age_s(n.heartbeat_at),
            node_id: n.node_id,
            shards: n.shards,
            started_at: n.started_at,
        })
        .collect();
    nodes.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    Ok(Json(NodeList { nodes }))
}
