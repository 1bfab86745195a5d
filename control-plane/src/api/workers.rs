//! `/v1/workers`: the live workers from their heartbeats, and draining one of them.

use std::time::Duration;

use axum::{
    extract::{Path, State},
    http::StatusCode,
    Json,
};
use chronoshard_wire::{names, rpc::DrainReply};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{error::ApiError, AppState};

/// How long a worker may take to acknowledge a drain request.
const DRAIN_ANSWER: Duration = Duration::from_secs(5);

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkerView {
    pub worker_id: String,
    /// Queues the worker consumes.
    pub queues: Vec<String>,
    /// Tickets it was running at its last heartbeat.
    pub in_flight: u32,
    /// Seconds since its last heartbeat (every second; gone after 6 s without one).
    pub heartbeat_age_s: f64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkerList {
    pub workers: Vec<WorkerView>,
}

/// Workers with a live heartbeat.
#[utoipa::path(get, path = "/v1/workers", tag = "cluster",
    responses((status = 200, body = WorkerList)), security(("bearer" = [])))]
pub async fn list_workers(State(state): State<AppState>) -> Result<Json<WorkerList>, ApiError> {
    let mut workers: Vec<WorkerView> = state
        .cluster
        .live_workers()
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?
        .into_iter()
        .map(|w| WorkerView {
            heartbeat_age_s: super::cluster::age_s(w.heartbeat_at),
            worker_id: w.worker_id,
            queues: w.queues,
            in_flight: w.in_flight,
        })
        .collect();
    workers.sort_by(|a, b| a.worker_id.cmp(&b.worker_id));
    Ok(Json(WorkerList { workers }))
}

/// Drains a worker: it stops taking tickets, finishes (and reports) what it runs within its
/// drain grace, hands back what it could not finish, and stops (a `chronoshard worker` process
/// exits 0). Answered once the worker has acknowledged the request.
#[utoipa::path(post, path = "/v1/workers/{worker_id}/drain", tag = "cluster",
    params(("worker_id" = String, Path, description = "the worker's id")),
    responses((status = 202, body = DrainReply)),
    security(("bearer" = [])))]
pub async fn drain_worker(
    State(state): State<AppState>,
    Path(worker_id): Path<String>,
) -> Result<(StatusCode, Json<DrainReply>), ApiError> {
    if !names::valid_worker_id(&worker_id) {
        return Err(ApiError::NotFound("worker"));
    }
    let request = state
        .cluster
        .client
        .request(names::worker_drain_subject(&worker_id), "".into());
    match tokio::time::timeout(DRAIN_ANSWER, request).await {
        Ok(Ok(msg)) => serde_json::from_slice::<DrainReply>(&msg.payload)
            .map(|r| (StatusCode::ACCEPTED, Json(r)))
            .map_err(|e| ApiError::Internal(format!("bad drain reply from {worker_id}: {e}"))),
        Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
            Err(ApiError::NotFound("worker"))
        }
        Ok(Err(e)) => Err(ApiError::Unavailable(format!("worker {worker_id}: {e}"))),
        Err(_) => Err(ApiError::Unavailable(format!(
            "worker {worker_id} did not answer within {DRAIN_ANSWER:?}"
        ))),
    }
}
