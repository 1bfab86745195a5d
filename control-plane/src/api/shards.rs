//! `/v1/shards`: the shard map, and adding shards while jobs fire. Adding writes the growth into
//! the cluster config; the leader's `grow` task moves the tenants (this handler moves nothing).

use axum::{extract::State, http::StatusCode, Json};
use chronoshard_wire::{
    growth::Growth,
    rpc::{ShardAssignment, Sharding, Windows},
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{body::JsonBody, cluster::unavailable, error::ApiError, AppState};
use crate::grow::plan::{self, GrowError};

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ShardMap {
    /// Shards that exist: 0 to `shard_count - 1`.
    pub shard_count: u32,
    pub sharding: Sharding,
    pub shards: Vec<ShardAssignment>,
    /// Present while added shards take over their tenants: which old shards are done, the move
    /// under way and the latest finished ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<Growth>,
    /// A `time_window` cluster's window length and layouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<Windows>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddShards {
    /// How many shards to add.
    #[schema(minimum = 1)]
    pub add: u32,
}

/// The shard map: each shard's owner and epoch, and the growth under way.
#[utoipa::path(get, path = "/v1/shards", tag = "cluster", responses((status = 200, body = ShardMap)),
    security(("bearer" = [])))]
pub async fn list_shards(State(state): State<AppState>) -> Result<Json<ShardMap>, ApiError> {
    let shards = state.cluster.assignments().await.map_err(unavailable)?;
    let config = state.config.borrow().clone();
    Ok(Json(ShardMap {
        shard_count: config.shard_count,
        sharding: config.sharding,
        shards: shards.into_iter().map(|(a, _)| a).collect(),
        growth: config.growth,
        windows: config.windows,
    }))
}

/// Adds shards while jobs fire. The added shards get owners at once. In a `tenant` cluster the
/// tenants whose place on the hash ring is now an added shard then move one by one (each frozen
/// for the time its rows are copied: its occurrences due meanwhile fire late, none is lost or
/// doubled, and its writes wait). In a `time_window` cluster a layout over all the shards is
/// added from the first window after the horizon and one more window, and each job moves alone
/// when its next occurrence reaches it. Answers at once with the map; `growth` shows the
/// progress.
#[utoipa::path(post, path = "/v1/shards", tag = "cluster", request_body = AddShards,
    responses((status = 202, body = ShardMap)),
    security(("bearer" = [])))]
pub async fn add_shards(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<AddShards>,
) -> Result<(StatusCode, Json<ShardMap>), ApiError> {
    loop {
        let (current, revision) = state
            .cluster
            .config_entry()
            .await
            .map_err(unavailable)?
            .ok_or_else(|| ApiError::Unavailable("the cluster config is not written yet".into()))?;
        let horizon = state.settings.borrow().settings.horizon.0;
        let next = plan::begin(&current, body.add, chrono::Utc::now(), horizon)?;
        match state.cluster.put_config(&next, revision).await {
            Ok(_) => {
                tracing::info!(
                    from = current.shard_count,
                    to = next.shard_count,
                    "shards added"
                );
                crate::grow::seen(&state.config, next.version).await;
                return Ok((StatusCode::ACCEPTED, list_shards(State(state)).await?));
            }
            Err(chronoshard_cluster::Error::Conflict { .. }) => continue,
            Err(e) => return Err(unavailable(e)),
        }
    }
}

impl From<GrowError> for ApiError {
    fn from(e: GrowError) -> ApiError {
        match e {
            GrowError::Count { .. } => ApiError::field("add", e.to_string()),
            GrowError::Busy { .. } | GrowError::IndexedIds => ApiError::Conflict(e.to_string()),
        }
    }
}
