//! `/v1/plugins` and `/v1/strategy`: the assignment strategies this replica can run, loading a
//! plugin by name from this replica's plugin directory, and activating a strategy with its
//! config. Loading, checking and calling strategies is the strategy host's (`crate::strategy`);
//! which strategy is active lives in the cluster state, written here by compare-and-swap and
//! followed by every replica, which loads the named plugin from its own plugin directory. These
//! handlers move no shard: the leader's next pass does.

use axum::{extract::State, http::StatusCode, Json};
use chronoshard_cluster::Error as ClusterError;
use chronoshard_wire::strategy::VersionedStrategy;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{body::JsonBody, error::ApiError, AppState};
use crate::strategy::{Failure, Origin, StrategyInfo};

/// Where a strategy comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PluginOrigin {
    /// Linked into the control plane.
    Builtin,
    /// Loaded from a file of the plugin directory.
    File,
}

/// A strategy's last failure on the replica that answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LastError {
    pub at: chrono::DateTime<chrono::Utc>,
    /// The kind of failure, as in `chronoshard_strategy_errors_total`: `load`, `not_loaded`,
    /// `disabled`, `timeout`, `panicked`, `failed`, `bad_config`, `input`, `bad_reply`,
    /// `invalid_assignment` or `host`.
    pub reason: String,
    /// The error in full.
    pub message: String,
}

/// A strategy this replica can run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PluginView {
    /// The name it is activated by.
    pub name: String,
    pub origin: PluginOrigin,
    /// The library's file, for a plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The plugin ABI version it was built for.
    pub abi_version: u32,
    /// Refused since a call missed its deadline (a restart of this replica enables it again).
    pub disabled: bool,
    /// Whether it is the cluster's active strategy.
    pub active: bool,
    /// Its last failure on this replica (a load, or a call), if any; kept after it answers
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<LastError>,
}

/// The cluster's active strategy, and how it stands on the replica that answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ActiveStrategy {
    pub name: String,
    /// Its config (`null`: the strategy's defaults).
    #[schema(value_type = Object)]
    pub config: Value,
    /// Goes up by one with every activation.
    pub version: u64,
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// Whether this replica has it loaded (each replica loads it from its own plugin directory).
    pub loaded: bool,
    /// Its last failure on this replica, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<LastError>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PluginList {
    pub active: ActiveStrategy,
    /// Every strategy this replica can run, by name: the built-ins and the plugins loaded here.
    pub strategies: Vec<PluginView>,
    /// This replica's plugin directory (null: it runs built-in strategies only).
    pub plugin_dir: Option<String>,
    /// The replica that answered. Plugins are loaded per replica, and only the leader calls the
    /// active strategy, so the leader's answer shows the failures of assignment passes.
    pub answered_by: String,
}

/// A plugin to load from the plugin directory.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadPlugin {
    /// The plugin's name: the file `<plugin-dir>/<name>.so`. 1-64 of A-Z a-z 0-9 _ - . (not
    /// first, never `..`); never a path.
    pub name: String,
}

/// The strategy to activate.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivateStrategy {
    /// A built-in strategy, or a plugin in the plugin directory (loaded on the way if needed).
    pub name: String,
    /// The strategy's config, checked by the strategy before it is activated (absent or
    /// `null`: its defaults).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub config: Value,
}

/// The strategies this replica can run, and the active one with its config.
#[utoipa::path(get, path = "/v1/plugins", tag = "plugins",
    responses((status = 200, body = PluginList)), security(("bearer" = [])))]
pub async fn list_plugins(State(state): State<AppState>) -> Json<PluginList> {
    let current = state.strategy.borrow().clone();
    let strategies = state
        .registry
        .list()
        .into_iter()
        .map(|info| view(info, &current.name))
        .collect();
    let active = ActiveStrategy {
        loaded: state.registry.info(&current.name).is_some(),
        last_error: state.registry.last_error(&current.name).map(last_error),
        name: current.name,
        config: current.config,
        version: current.version,
        updated_at: current.updated_at,
    };
    Json(PluginList {
        active,
        strategies,
        plugin_dir: state.registry.plugin_dir().map(|d| d.display().to_string()),
        answered_by: state.replica.clone(),
    })
}

/// Loads a plugin by name from this replica's plugin directory (`<plugin-dir>/<name>.so`),
/// after checking its ABI version. Only this replica loads it; the others load it from their
/// own plugin directories when it is activated. Loading a plugin that is loaded already changes
/// nothing (200); a library is never replaced while the process runs.
#[utoipa::path(post, path = "/v1/plugins", tag = "plugins", request_body = LoadPlugin,
    responses((status = 201, description = "loaded now", body = PluginView),
              (status = 200, description = "it was loaded already", body = PluginView)),
    security(("bearer" = [])))]
pub async fn load_plugin(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<LoadPlugin>,
) -> Result<(StatusCode, Json<PluginView>), ApiError> {
    let existed = state.registry.info(&body.name).is_some();
    let info = state.registry.load(&body.name).await?;
    let status = if existed {
        StatusCode::OK
    } else {
        tracing::info!(strategy = %body.name, "strategy plugin loaded through the API");
        StatusCode::CREATED
    };
    let active = state.strategy.borrow().name.clone();
    Ok((status, Json(view(info, &active))))
}

/// Activates a strategy with its config, for the whole cluster: the strategy checks the config
/// first, then the cluster state records it with a version one higher. The leader's next pass
/// uses it, and every replica loads it from its own plugin directory, without a restart.
/// Activating what is active already, with the same config, changes nothing.
#[utoipa::path(put, path = "/v1/strategy", tag = "plugins", request_body = ActivateStrategy,
    responses((status = 200, description = "the active strategy now", body = VersionedStrategy)),
    security(("bearer" = [])))]
pub async fn put_strategy(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<ActivateStrategy>,
) -> Result<Json<VersionedStrategy>, ApiError> {
    let ActivateStrategy { name, config } = body;
    // Loaded on the way, so an operator can activate a plugin on any replica that has the file;
    // `load` (not `ensure`): a refused name is the caller's error, not the strategy's record.
    if state.registry.info(&name).is_none() {
        state.registry.load(&name).await?;
    }
    state.registry.validate_config(&name, &config).await?;
    let unavailable = |e: ClusterError| ApiError::Unavailable(e.to_string());
    let (current, revision) = state
        .cluster
        .strategy()
        .await
        .map_err(unavailable)?
        .ok_or_else(|| ApiError::Unavailable("the cluster has no strategy entry yet".into()))?;
    if current.name == name && current.config == config {
        return Ok(Json(current));
    }
    let next = VersionedStrategy {
        version: current.version + 1,
        name,
        config,
        updated_at: chrono::Utc::now(),
    };
    match state.cluster.put_strategy(&next, revision).await {
        Ok(_) => {
            tracing::info!(version = next.version, strategy = %next.name, "strategy activated");
            Ok(Json(next))
        }
        Err(ClusterError::Conflict { .. }) => Err(ApiError::Conflict(
            "the active strategy changed meanwhile; read it again".into(),
        )),
        Err(e) => Err(unavailable(e)),
    }
}

fn view(info: StrategyInfo, active: &str) -> PluginView {
    let (origin, path) = match info.origin {
        Origin::Builtin => (PluginOrigin::Builtin, None),
        Origin::File { path } => (PluginOrigin::File, Some(path.display().to_string())),
    };
    PluginView {
        active: info.name == active,
        name: info.name,
        origin,
        path,
        abi_version: info.abi_version,
        disabled: info.disabled,
        last_error: info.last_error.map(last_error),
    }
}

fn last_error(f: Failure) -> LastError {
    LastError {
        at: f.at,
        reason: f.reason.to_string(),
        message: f.message,
    }
}
