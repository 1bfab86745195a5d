//! `/v1/settings`: the cluster's live settings, read and changed. A change is validated here
//! (a problem naming the field), written by compare-and-swap with a version one higher, and
//! applied by every node and replica that watches the entry, without a restart.

use axum::{extract::State, Json};
use chronoshard_cluster::Error as ClusterError;
use chronoshard_wire::settings::{Settings, VersionedSettings};
use serde_json::Value;

use super::{
    body::{self, JsonBody},
    error::ApiError,
    AppState,
};

/// The settings in force, with their version.
#[utoipa::path(get, path = "/v1/settings", tag = "cluster",
    responses((status = 200, body = VersionedSettings)), security(("bearer" = [])))]
pub async fn get_settings(
    State(state): State<AppState>,
) -> Result<Json<VersionedSettings>, ApiError> {
    let (current, _) = read(&state).await?;
    Ok(Json(current))
}

/// Changes settings: the fields given replace their values, the others keep theirs. With
/// `"version"`, the change applies only if the settings are still at that version (409
/// otherwise). Answers the new settings and version.
#[utoipa::path(put, path = "/v1/settings", tag = "cluster", request_body = Settings,
    responses((status = 200, body = VersionedSettings)),
    security(("bearer" = [])))]
pub async fn put_settings(
    State(state): State<AppState>,
    JsonBody(mut changes): JsonBody<serde_json::Map<String, Value>>,
) -> Result<Json<VersionedSettings>, ApiError> {
    let expected = match changes.remove("version") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| ApiError::field("version", "must be a whole number"))?,
        ),
    };
    let (current, revision) = read(&state).await?;
    if expected.is_some_and(|v| v != current.version) {
        return Err(ApiError::Conflict(format!(
            "the settings are at version {}, not {}",
            current.version,
            expected.unwrap_or_default()
        )));
    }
    let mut merged = serde_json::to_value(current.settings).expect("settings serialise");
    let fields = merged.as_object_mut().expect("settings are an object");
    for (k, v) in changes {
        fields.insert(k, v); // an unknown name is refused by the parse below, by name
    }
    let settings: Settings = body::parse(merged.to_string().as_bytes())?;
    settings
        .validate()
        .map_err(|e| ApiError::field(e.field, e.rule))?;
    if settings == current.settings {
        return Ok(Json(current));
    }
    let next = VersionedSettings {
        version: current.version + 1,
        settings,
        updated_at: chrono::Utc::now(),
    };
    match state.cluster.put_settings(&next, revision).await {
        Ok(_) => {
            tracing::info!(version = next.version, "settings changed");
            Ok(Json(next))
        }
        Err(ClusterError::Conflict { .. }) => Err(ApiError::Conflict(
            "the settings changed meanwhile; read them again".into(),
        )),
        Err(e) => Err(ApiError::Unavailable(e.to_string())),
    }
}

async fn read(state: &AppState) -> Result<(VersionedSettings, u64), ApiError> {
    state
        .cluster
        .settings()
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?
        .ok_or_else(|| ApiError::Unavailable("the cluster has no settings yet".into()))
}
