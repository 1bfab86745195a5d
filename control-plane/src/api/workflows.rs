//! `/v1/workflows` and `/v1/workflow-runs`: a workflow travels to its shard as the job that
//! holds its steps (`WorkflowSpec::into_job`), so creating, reading and changing one go the way
//! a job's do (`jobs`); this module converts at the edges and refuses a job's id where a
//! workflow's is expected.

use axum::{
    extract::State,
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    Json,
};
use chrono::{DateTime, Utc};
use chronoshard_schedule::spec::check_job;
use chronoshard_wire::{
    rpc::{RpcError, RpcErrorCode, RunSteps, ShardReply, ShardRequest},
    Job, StepRun, Workflow, WorkflowPatch, WorkflowRun, WorkflowSpec,
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::routing::{CallError, Route};

use super::{
    auth::Caller,
    body::{self, JsonBody, Params, PathId},
    error::ApiError,
    jobs::{self, create_call, job_call, job_reply, limit, ListJobsQuery, RunsQuery},
    AppState,
};

/// A page of workflows.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkflowPage {
    pub workflows: Vec<Workflow>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// A page of a workflow's runs, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkflowRunPage {
    pub runs: Vec<WorkflowRun>,
    /// Pass as `before` to get older runs; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<DateTime<Utc>>,
}

fn workflow_of(job: &Job) -> Result<Workflow, ApiError> {
    Workflow::of_job(job).ok_or(ApiError::NotFound("workflow"))
}

/// A run as the API shows it: each step ticket named by the workflow's step of its item.
fn run_view(workflow: &Job, r: RunSteps) -> WorkflowRun {
    let names = workflow.spec.workflow.as_ref().map(|w| &w.steps);
    let steps: Vec<StepRun> = r
        .steps
        .into_iter()
        .map(|t| StepRun {
            name: names
                .and_then(|s| s.get(t.item as usize))
                .map_or_else(|| format!("step-{}", t.item), |s| s.name.clone()),
            status: t.status,
            reason: t.reason,
            ticket_id: t.ticket_id,
            started_at: t.attempts.iter().find_map(|a| a.started_at),
            finished_at: t.attempts.last().and_then(|a| a.finished_at),
            attempts: t.attempts,
        })
        .collect();
    WorkflowRun {
        run_id: steps.first().map(|s| s.ticket_id),
        workflow_id: workflow.id,
        scheduled_at: r.run.scheduled_at,
        status: r.run.status,
        reason: r.run.reason,
        range_end: r.run.range_end,
        count: r.run.count,
        updated_at: r.run.updated_at,
        steps,
    }
}

/// The workflow and runs of a shard's reply.
fn runs_reply(reply: ShardReply) -> Result<(Job, Vec<RunSteps>), ApiError> {
    match reply {
        ShardReply::WorkflowRuns { workflow, runs } => Ok((workflow, runs)),
        other => Err(ApiError::Internal(format!(
            "unexpected shard reply {other:?}"
        ))),
    }
}

/// Reads workflow `id` (404 for a job's id or another tenant's workflow), then sends `req`
/// about it, if any.
async fn workflow_call(
    state: &AppState,
    caller: &Caller,
    id: Uuid,
    req: Option<ShardRequest>,
) -> Result<(Workflow, Option<ShardReply>), ApiError> {
    let read = job_call(state, caller, id, ShardRequest::GetJob { job_id: id }).await;
    let (job, _) = job_reply(read.map_err(not_found_as_workflow)?)?;
    let workflow = workflow_of(&job)?;
    let reply = match req {
        Some(req) => Some(job_call(state, caller, id, req).await?),
        None => None,
    };
    Ok((workflow, reply))
}

fn not_found_as_workflow(e: ApiError) -> ApiError {
    match e {
        ApiError::NotFound(_) => ApiError::NotFound("workflow"),
        e => e,
    }
}

/// Create a workflow.
#[utoipa::path(post, path = "/v1/workflows", tag = "workflows", request_body = WorkflowSpec,
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeating a create with the same key returns the first workflow")),
    responses((status = 201, description = "Created", body = Workflow),
               (status = 200, description = "An earlier create with this Idempotency-Key", body = Workflow)),
    security(("bearer" = [])))]
pub async fn create_workflow(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(spec): JsonBody<WorkflowSpec>,
) -> Result<impl IntoResponse, ApiError> {
    if state.router.spreads_tenants() {
        return Err(ApiError::field(
            "tenant",
            "workflows need a cluster sharded by tenant (this one is sharded by time window)",
        ));
    }
    for step in &spec.steps {
        body::check_payload(&step.payload)?;
    }
    let job = spec.into_job();
    check_job(&job, Utc::now()).map_err(|e| ApiError::field(e.field, e.message))?;
    caller.may_create_in(&job.tenant)?;
    let key = jobs::idempotency_key(&headers)?;
    let id = jobs::new_job_id(&state, &job.tenant, key.as_deref()).await?;
    let (id, reply) = create_call(&state, id, job, key).await?;
    let (job, created) = job_reply(reply)?;
    let status = if created || job.id == id {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let workflow = workflow_of(&job)?;
    Ok((
        status,
        [(
            axum::http::header::LOCATION,
            format!("/v1/workflows/{}", job.id),
        )],
        Json(workflow),
    ))
}

/// List workflows.
#[utoipa::path(get, path = "/v1/workflows", tag = "workflows", params(ListJobsQuery),
    responses((status = 200, body = WorkflowPage)),
    security(("bearer" = [])))]
pub async fn list_workflows(
    State(state): State<AppState>,
    caller: Caller,
    Params(q): Params<ListJobsQuery>,
) -> Result<Json<WorkflowPage>, ApiError> {
    let limit = limit(q.limit)?;
    let tenant = caller.scope(q.tenant.as_deref())?;
    let (jobs, next_cursor) = jobs::list(&state, tenant, q.cursor.as_deref(), limit, true).await?;
    let workflows = jobs.iter().filter_map(Workflow::of_job).collect();
    Ok(Json(WorkflowPage {
        workflows,
        next_cursor,
    }))
}

/// Read a workflow.
#[utoipa::path(get, path = "/v1/workflows/{id}", tag = "workflows", params(("id" = Uuid, Path)),
    responses((status = 200, body = Workflow)),
    security(("bearer" = [])))]
pub async fn get_workflow(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
) -> Result<Json<Workflow>, ApiError> {
    Ok(Json(workflow_call(&state, &caller, id, None).await?.0))
}

/// Change a workflow. New steps are refused (409) while a run is in progress.
#[utoipa::path(patch, path = "/v1/workflows/{id}", tag = "workflows", params(("id" = Uuid, Path)), request_body = WorkflowPatch,
    responses((status = 200, body = Workflow)),
    security(("bearer" = [])))]
pub async fn patch_workflow(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
    JsonBody(patch): JsonBody<WorkflowPatch>,
) -> Result<Json<Workflow>, ApiError> {
    for step in patch.steps.iter().flatten() {
        body::check_payload(&step.payload)?;
    }
    let (current, _) = workflow_call(&state, &caller, id, None).await?;
    let def = chronoshard_wire::WorkflowDef {
        steps: current.spec.steps,
        fail_fast: current.spec.fail_fast,
    };
    let req = ShardRequest::PatchJob {
        job_id: id,
        patch: patch.to_job_patch(&def),
    };
    let (job, _) = job_reply(job_call(&state, &caller, id, req).await?)?;
    Ok(Json(workflow_of(&job)?))
}

/// Delete a workflow: no run starts any more; steps in flight finish, runs stay readable.
#[utoipa::path(delete, path = "/v1/workflows/{id}", tag = "workflows", params(("id" = Uuid, Path)),
    responses((status = 204)),
    security(("bearer" = [])))]
pub async fn delete_workflow(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
) -> Result<StatusCode, ApiError> {
    workflow_call(
        &state,
        &caller,
        id,
        Some(ShardRequest::DeleteJob { job_id: id }),
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The workflow after a request that answers with its job.
async fn changed(
    state: &AppState,
    caller: &Caller,
    id: Uuid,
    req: ShardRequest,
) -> Result<Json<Workflow>, ApiError> {
    let (_, reply) = workflow_call(state, caller, id, Some(req)).await?;
    let reply = reply.ok_or_else(|| ApiError::Internal("no reply".into()))?;
    Ok(Json(workflow_of(&job_reply(reply)?.0)?))
}

/// Pause a workflow: no run starts until it is resumed (runs in progress go on).
#[utoipa::path(post, path = "/v1/workflows/{id}/pause", tag = "workflows", params(("id" = Uuid, Path)),
    responses((status = 200, body = Workflow)),
    security(("bearer" = [])))]
pub async fn pause_workflow(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
) -> Result<Json<Workflow>, ApiError> {
    changed(&state, &caller, id, ShardRequest::PauseJob { job_id: id }).await
}

/// Resume a paused workflow from its first run time after now.
#[utoipa::path(post, path = "/v1/workflows/{id}/resume", tag = "workflows", params(("id" = Uuid, Path)),
    responses((status = 200, body = Workflow)),
    security(("bearer" = [])))]
pub async fn resume_workflow(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
) -> Result<Json<Workflow>, ApiError> {
    changed(&state, &caller, id, ShardRequest::ResumeJob { job_id: id }).await
}

/// Start a run now, outside the schedule (under the overlap policy).
#[utoipa::path(post, path = "/v1/workflows/{id}/trigger", tag = "workflows", params(("id" = Uuid, Path)),
    responses((status = 202, body = chronoshard_wire::RunView)),
    security(("bearer" = [])))]
pub async fn trigger_workflow(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    match workflow_call(
        &state,
        &caller,
        id,
        Some(ShardRequest::TriggerJob { job_id: id }),
    )
    .await?
    .1
    {
        Some(ShardReply::Triggered { run }) => Ok((StatusCode::ACCEPTED, Json(run))),
        other => Err(ApiError::Internal(format!(
            "unexpected shard reply {other:?}"
        ))),
    }
}

/// A workflow's runs, newest first, with every step's state, attempts, ticket id and timings.
#[utoipa::path(get, path = "/v1/workflows/{id}/runs", tag = "workflows", params(("id" = Uuid, Path), RunsQuery),
    responses((status = 200, body = WorkflowRunPage)),
    security(("bearer" = [])))]
pub async fn list_workflow_runs(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
    Params(q): Params<RunsQuery>,
) -> Result<Json<WorkflowRunPage>, ApiError> {
    let limit = limit(q.limit)?;
    let req = ShardRequest::ListWorkflowRuns {
        workflow_id: id,
        before: q.before,
        limit,
    };
    let (_, reply) = workflow_call(&state, &caller, id, Some(req)).await?;
    let (job, runs) = runs_reply(reply.ok_or_else(|| ApiError::Internal("no reply".into()))?)?;
    let runs: Vec<WorkflowRun> = runs.into_iter().map(|r| run_view(&job, r)).collect();
    let next_before = (runs.len() == limit as usize)
        .then(|| runs.last().map(|r| r.scheduled_at))
        .flatten();
    Ok(Json(WorkflowRunPage { runs, next_before }))
}

/// Sends a request about a run to its workflow's shard (a run id leads there) and checks the
/// caller may see it.
async fn run_call(
    state: &AppState,
    caller: &Caller,
    run_id: Uuid,
    req: ShardRequest,
) -> Result<Json<WorkflowRun>, ApiError> {
    let reply = match state.router.shard_for_id(run_id) {
        Some(_) => state.router.call(Route::Id(run_id), &req).await,
        // Ids without a routing key: whichever shard has the run answers.
        None => {
            let mut replies = state.router.call_all(&req).await;
            replies.sort_by_key(|r| match r {
                Ok(_) => 0,
                Err(e) if !e.is_not_found() => 1,
                Err(_) => 2,
            });
            replies
                .into_iter()
                .next()
                .unwrap_or(Err(CallError::Shard(RpcError::new(
                    RpcErrorCode::NotFound,
                    "no such workflow run",
                ))))
        }
    };
    let reply = reply.map_err(ApiError::from).map_err(|e| match e {
        ApiError::NotFound(_) => ApiError::NotFound("workflow run"),
        e => e,
    })?;
    let (job, runs) = runs_reply(reply)?;
    caller.sees(&job.spec.tenant, "workflow run")?;
    let run = runs
        .into_iter()
        .next()
        .ok_or(ApiError::NotFound("workflow run"))?;
    Ok(Json(run_view(&job, run)))
}

/// One run of a workflow: every step's state, attempts, ticket id and timings.
#[utoipa::path(get, path = "/v1/workflow-runs/{run_id}", tag = "workflows", params(("run_id" = Uuid, Path)),
    responses((status = 200, body = WorkflowRun)),
    security(("bearer" = [])))]
pub async fn get_workflow_run(
    State(state): State<AppState>,
    caller: Caller,
    PathId(run_id): PathId,
) -> Result<Json<WorkflowRun>, ApiError> {
    run_call(
        &state,
        &caller,
        run_id,
        ShardRequest::GetWorkflowRun { run_id },
    )
    .await
}

/// Retry a run that ended with a failed step: the failed steps run again (with fresh retry
/// budgets) under the same run, and the steps skipped after them run once they succeed.
#[utoipa::path(post, path = "/v1/workflow-runs/{run_id}/retry", tag = "workflows", params(("run_id" = Uuid, Path)),
    responses((status = 200, body = WorkflowRun)),
    security(("bearer" = [])))]
pub async fn retry_workflow_run(
    State(state): State<AppState>,
    caller: Caller,
    PathId(run_id): PathId,
) -> Result<Json<WorkflowRun>, ApiError> {
    // The caller may see the run before it may change it.
    let _seen = run_call(
        &state,
        &caller,
        run_id,
        ShardRequest::GetWorkflowRun { run_id },
    )
    .await?;
    run_call(
        &state,
        &caller,
        run_id,
        ShardRequest::RetryWorkflowRun { run_id },
    )
    .await
}
