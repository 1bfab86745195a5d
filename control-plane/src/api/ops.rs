//! Operational endpoints, served without a token: liveness, readiness and metrics.

use axum::{extract::State, http::header, response::IntoResponse, Json};
use chronoshard_wire::rpc::{ShardReply, ShardRequest};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{error::ApiError, AppState, Problem};

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Status {
    pub status: String,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, body = Status)))]
pub async fn healthz() -> Json<Status> {
    Json(Status {
        status: "ok".into(),
    })
}

/// Ready: every shard has an owner that answers, so a job can be created and will fire.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, body = Status), (status = 503, body = Problem, content_type = "application/problem+json")))]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Status>, ApiError> {
    let count = state.router.shard_count();
    let replies = futures::future::join_all(
        (0..count).map(|s| state.router.call_once(s, &ShardRequest::Ping)),
    )
    .await;
    let missing: Vec<String> = replies
        .iter()
        .enumerate()
        .filter(|(_, r)| !matches!(r, Ok(ShardReply::Pong { .. })))
        .map(|(s, _)| s.to_string())
        .collect();
    if missing.is_empty() {
        Ok(Json(Status {
            status: "ready".into(),
        }))
    } else {
        Err(ApiError::Unavailable(format!(
            "shards not served yet: {}",
            missing.join(", ")
        )))
    }
}

/// Prometheus metrics of this process.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, content_type = "text/plain")))]
pub async fn metrics() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        chronoshard_telemetry::metrics::render(),
    )
}
