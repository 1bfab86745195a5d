//! `/v1/jobs` and `/v1/tickets`: routing job operations to the shard that owns the job's tenant.

use axum::{
    extract::State,
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    Json,
};
use chrono::{DateTime, Utc};
use chronoshard_schedule::spec::check_job;
use chronoshard_wire::{
    job::check_token,
    rpc::{JobIds, RpcErrorCode, ShardReply, ShardRequest},
    Job, JobPatch, JobSpec, RunView, TicketView,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use chronoshard_telemetry::traces;

use crate::routing::{CallError, Route};

use super::{
    auth::Caller,
    body::{self, JsonBody, Params, PathId},
    error::ApiError,
    AppState,
};

/// A page of jobs.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobPage {
    pub jobs: Vec<Job>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// A page of runs, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunPage {
    pub runs: Vec<RunView>,
    /// Pass as `before` to get older runs; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<DateTime<Utc>>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListJobsQuery {
    /// Only this tenant's jobs.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub tenant: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(format = Uuid)]
    pub cursor: Option<String>,
    /// 1–500, default 50.
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RunsQuery {
    /// Only runs scheduled strictly before this instant (RFC 3339).
    pub before: Option<DateTime<Utc>>,
    /// 1–500, default 50.
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

pub(super) fn limit(l: Option<u32>) -> Result<u32, ApiError> {
    match l.unwrap_or(50) {
        l @ 1..=500 => Ok(l),
        _ => Err(ApiError::field("limit", "must be 1-500")),
    }
}

pub(super) fn job_reply(reply: ShardReply) -> Result<(Job, bool), ApiError> {
    match reply {
        ShardReply::Job { job, created } => Ok((job, created)),
        other => Err(ApiError::Internal(format!(
            "unexpected shard reply {other:?}"
        ))),
    }
}

/// Create a job.
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", request_body = JobSpec,
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeating a create with the same key returns the first job")),
    responses((status = 201, description = "Created", body = Job),
               (status = 200, description = "An earlier create with this Idempotency-Key", body = Job)),
    security(("bearer" = [])))]
pub async fn create_job(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(spec): JsonBody<JobSpec>,
) -> Result<impl IntoResponse, ApiError> {
    let start = std::time::SystemTime::now();
    if spec.workflow.is_some() {
        return Err(not_a_job_field());
    }
    // Checked here too, so a bad request never reaches a shard.
    check_job(&spec, Utc::now()).map_err(|e| ApiError::field(e.field, e.message))?;
    caller.may_create_in(&spec.tenant)?;
    body::check_payload(&spec.payload)?;
    let key = idempotency_key(&headers)?;
    let job_id = new_job_id(&state, &spec.tenant, key.as_deref()).await?;
    let (job_id, reply) = create_call(&state, job_id, spec, key).await?;
    let (job, created) = job_reply(reply)?;
    // A create resent after a timeout finds the job its first copy created: still this
    // request's job.
    let status = if created || job.id == job_id {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    if created {
        traces::job_created(job.id, &job.spec.tenant, job.shard, start);
    }
    Ok((
        status,
        [(axum::http::header::LOCATION, format!("/v1/jobs/{}", job.id))],
        Json(job),
    ))
}

/// The id of a job (or workflow) about to be created. In a cluster whose ids carry no routing
/// key it is indexed first: an index entry whose create failed is harmless (the job reads as not
/// found), a job without an entry would be unreachable by id.
pub(super) async fn new_job_id(
    state: &AppState,
    tenant: &str,
    key: Option<&str>,
) -> Result<Uuid, ApiError> {
    let job_id = state.router.mint_job_id(tenant, key);
    if state.router.job_ids() == JobIds::Indexed {
        state
            .cluster
            .index_job(&job_id.to_string(), tenant)
            .await
            .map_err(|e| ApiError::Unavailable(e.to_string()))?;
    }
    Ok(job_id)
}

/// The request's `Idempotency-Key` header, if any.
pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get("idempotency-key") {
        Some(v) => Ok(Some(
            v.to_str()
                .ok()
                .filter(|k| !k.is_empty() && k.len() <= 255)
                .ok_or_else(|| {
                    ApiError::field("Idempotency-Key", "must be 1-255 visible ASCII characters")
                })?
                .to_string(),
        )),
        None => Ok(None),
    }
}

/// Sends a create to its shard: the tenant's, or in a time_window cluster the job's own (its id
/// says which). There, a shard holding its part of the tenant's job quota refuses; a create
/// without an idempotency key then goes to another shard with a new id, until one has room or
/// every shard refused. Returns the id that was created.
pub(super) async fn create_call(
    state: &AppState,
    mut job_id: Uuid,
    spec: JobSpec,
    key: Option<String>,
) -> Result<(Uuid, ShardReply), ApiError> {
    let tenant = spec.tenant.clone();
    let spreads = state.router.spreads_tenants();
    let movable = spreads && key.is_none();
    // A keyed create goes to the shard its key was looked for beside, even if the layout in
    // force changes meanwhile; if the job of its key moved away from there since, the key is
    // looked for again.
    let mut pinned = None;
    let mut looked = 0;
    if let Some(k) = key.as_deref().filter(|_| spreads) {
        let here = state.router.shard_for_new_job(job_id);
        if let Some(found) = keyed_elsewhere(state, job_id, here, &tenant, k).await? {
            return Ok((job_id, found));
        }
        pinned = Some(here);
        looked = 1;
    }
    let mut req = ShardRequest::CreateJob {
        job_id,
        spec,
        idempotency_key: key,
    };
    let mut tried = Vec::new();
    loop {
        let route = match (pinned, spreads) {
            (Some(here), _) => Route::Shard(here),
            (None, true) => Route::NewJob(job_id),
            (None, false) => Route::Tenant(&tenant),
        };
        match state.router.call(route, &req).await {
            Err(CallError::Shard(e)) if e.code == RpcErrorCode::Moved && looked < 3 => {
                let k = key_of(&req);
                if let Some(found) = keyed_elsewhere(state, job_id, u32::MAX, &tenant, k).await? {
                    return Ok((job_id, found));
                }
                looked += 1;
            }
            Err(CallError::Shard(e)) if e.code == RpcErrorCode::QuotaExceeded && movable => {
                tried.push(state.router.shard_for_new_job(job_id));
                match state.router.mint_job_id_avoiding(&tenant, &tried) {
                    Some(id) => job_id = id,
                    None => return Err(CallError::Shard(e).into()),
                }
                if let ShardRequest::CreateJob { job_id: id, .. } = &mut req {
                    *id = job_id;
                }
            }
            reply => return Ok((job_id, reply?)),
        }
    }
}

/// The idempotency key of a create request.
fn key_of(req: &ShardRequest) -> &str {
    match req {
        ShardRequest::CreateJob {
            idempotency_key: Some(k),
            ..
        } => k,
        _ => "",
    }
}

/// In a `time_window` cluster that grew, the job created earlier with idempotency key `key` on
/// a shard other than `here` that its key had (its create went by an older layout, or it
/// moved): a create sent again answers with it rather than create it twice.
async fn keyed_elsewhere(
    state: &AppState,
    job_id: Uuid,
    here: u32,
    tenant: &str,
    key: &str,
) -> Result<Option<ShardReply>, ApiError> {
    let find = ShardRequest::FindKey {
        tenant: tenant.to_string(),
        idempotency_key: key.to_string(),
    };
    for shard in state.router.placement().shards_for_id(job_id) {
        if shard == here {
            continue;
        }
        match state.router.call(shard, &find).await {
            Ok(reply @ ShardReply::Job { .. }) => return Ok(Some(reply)),
            Err(e) if e.is_not_found() => {}
            Ok(other) => {
                return Err(ApiError::Internal(format!(
                    "unexpected shard reply {other:?}"
                )))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// List jobs, oldest first, cursor-paginated.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", params(ListJobsQuery),
    responses((status = 200, body = JobPage)),
    security(("bearer" = [])))]
pub async fn list_jobs(
    State(state): State<AppState>,
    caller: Caller,
    Params(q): Params<ListJobsQuery>,
) -> Result<Json<JobPage>, ApiError> {
    let limit = limit(q.limit)?;
    let tenant = caller.scope(q.tenant.as_deref())?;
    let (jobs, next_cursor) = list(&state, tenant, q.cursor.as_deref(), limit, false).await?;
    Ok(Json(JobPage { jobs, next_cursor }))
}

/// A page of jobs (or of workflows' jobs) from every shard the listing may span, by id.
pub(super) async fn list(
    state: &AppState,
    tenant: Option<&str>,
    cursor: Option<&str>,
    limit: u32,
    workflows: bool,
) -> Result<(Vec<Job>, Option<String>), ApiError> {
    let after = match cursor {
        Some(c) => Some(
            Uuid::parse_str(c)
                .map_err(|_| ApiError::field("cursor", "not a cursor returned by this API"))?,
        ),
        None => None,
    };
    let req = ShardRequest::ListJobs {
        tenant: tenant.map(str::to_string),
        after,
        limit,
        workflows,
    };
    let replies = tenant_or_all(state, tenant, &req).await?;
    let mut jobs = Vec::new();
    for r in replies {
        match r? {
            // While a tenant moves both shards may list it: the one it is placed on answers.
            ShardReply::Jobs { jobs: j } => {
                jobs.extend(j.into_iter().filter(|j| state.router.holds(j.shard, j.id)))
            }
            other => {
                return Err(ApiError::Internal(format!(
                    "unexpected shard reply {other:?}"
                )))
            }
        }
    }
    jobs.sort_by_key(|j| j.id);
    jobs.truncate(limit as usize);
    let next_cursor = (jobs.len() == limit as usize)
        .then(|| jobs.last().map(|j| j.id.to_string()))
        .flatten();
    Ok((jobs, next_cursor))
}

/// Where an existing job lives: by its id, or in an older cluster by its tenant from the job
/// index.
async fn job_route(state: &AppState, id: Uuid) -> Result<Route<'static>, ApiError> {
    if state.router.shard_for_id(id).is_some() {
        return Ok(Route::Id(id));
    }
    let tenant = state
        .cluster
        .job_tenant(&id.to_string())
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?
        .ok_or(ApiError::NotFound("job"))?;
    Ok(Route::Shard(state.router.shard_for_tenant(&tenant)))
}

/// Sends a request about job `id` to its shard. For a tenant token the job is read first, and
/// one of another tenant answers 404 like a job that does not exist.
pub(super) async fn job_call(
    state: &AppState,
    caller: &Caller,
    id: Uuid,
    req: ShardRequest,
) -> Result<ShardReply, ApiError> {
    let route = job_route(state, id).await?;
    if caller.tenant().is_some() {
        let read = state
            .router
            .call(route, &ShardRequest::GetJob { job_id: id })
            .await?;
        let (job, _) = job_reply(read)?;
        caller.sees(&job.spec.tenant, "job")?;
        if matches!(req, ShardRequest::GetJob { .. }) {
            return Ok(ShardReply::Job {
                job,
                created: false,
            });
        }
    }
    Ok(state.router.call(route, &req).await?)
}

/// The `workflow` field is a workflow's, never a job's.
fn not_a_job_field() -> ApiError {
    ApiError::field(
        "workflow",
        "unknown field: workflows are created and changed at /v1/workflows",
    )
}

/// Read a job.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = Uuid, Path)),
    responses((status = 200, body = Job)),
    security(("bearer" = [])))]
pub async fn get_job(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
) -> Result<Json<Job>, ApiError> {
    let (job, _) =
        job_reply(job_call(&state, &caller, id, ShardRequest::GetJob { job_id: id }).await?)?;
    if job.spec.workflow.is_some() {
        return Err(ApiError::NotFound("job"));
    }
    Ok(Json(job))
}

/// Change a job. A new schedule recomputes future occurrences; ticketed ones run as they are.
#[utoipa::path(patch, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = Uuid, Path)), request_body = JobPatch,
    responses((status = 200, body = Job)),
    security(("bearer" = [])))]
pub async fn patch_job(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
    JsonBody(patch): JsonBody<JobPatch>,
) -> Result<Json<Job>, ApiError> {
    if let Some(payload) = &patch.payload {
        body::check_payload(payload)?;
    }
    if patch.workflow.is_some() {
        return Err(not_a_job_field());
    }
    Ok(Json(
        job_reply(
            job_call(
                &state,
                &caller,
                id,
                ShardRequest::PatchJob { job_id: id, patch },
            )
            .await?,
        )?
        .0,
    ))
}

/// Delete a job: future occurrences are cancelled, tickets in flight finish, history stays readable.
#[utoipa::path(delete, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = Uuid, Path)),
    responses((status = 204)),
    security(("bearer" = [])))]
pub async fn delete_job(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
) -> Result<StatusCode, ApiError> {
    job_reply(job_call(&state, &caller, id, ShardRequest::DeleteJob { job_id: id }).await?)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Pause a job: it makes no occurrences until resumed.
#[utoipa::path(post, path = "/v1/jobs/{id}/pause", tag = "jobs", params(("id" = Uuid, Path)),
    responses((status = 200, body = Job)),
    security(("bearer" = [])))]
pub async fn pause_job(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
) -> Result<Json<Job>, ApiError> {
    Ok(Json(
        job_reply(job_call(&state, &caller, id, ShardRequest::PauseJob { job_id: id }).await?)?.0,
    ))
}

/// Resume a paused job from its first occurrence after now (no catch-up for the paused time).
#[utoipa::path(post, path = "/v1/jobs/{id}/resume", tag = "jobs", params(("id" = Uuid, Path)),
    responses((status = 200, body = Job)),
    security(("bearer" = [])))]
pub async fn resume_job(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
) -> Result<Json<Job>, ApiError> {
    Ok(Json(
        job_reply(job_call(&state, &caller, id, ShardRequest::ResumeJob { job_id: id }).await?)?.0,
    ))
}

/// Fire a job now, outside its schedule.
#[utoipa::path(post, path = "/v1/jobs/{id}/trigger", tag = "jobs", params(("id" = Uuid, Path)),
    responses((status = 202, body = RunView)),
    security(("bearer" = [])))]
pub async fn trigger_job(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    match job_call(&state, &caller, id, ShardRequest::TriggerJob { job_id: id }).await? {
        ShardReply::Triggered { run } => Ok((StatusCode::ACCEPTED, Json(run))),
        other => Err(ApiError::Internal(format!(
            "unexpected shard reply {other:?}"
        ))),
    }
}

/// A job's occurrences, newest first; the next one appears as `scheduled` on the first page.
#[utoipa::path(get, path = "/v1/jobs/{id}/runs", tag = "jobs", params(("id" = Uuid, Path), RunsQuery),
    responses((status = 200, body = RunPage)),
    security(("bearer" = [])))]
pub async fn list_runs(
    State(state): State<AppState>,
    caller: Caller,
    PathId(id): PathId,
    Params(q): Params<RunsQuery>,
) -> Result<Json<RunPage>, ApiError> {
    let limit = limit(q.limit)?;
    let req = ShardRequest::ListRuns {
        job_id: id,
        before: q.before,
        limit,
    };
    let shards = state.router.placement().shards_for_id(id);
    let reply = match shards.len() {
        1 => job_call(&state, &caller, id, req).await?,
        _ => {
            job_call(&state, &caller, id, ShardRequest::GetJob { job_id: id }).await?;
            runs_of_moved_job(&state, &shards, &req, limit).await?
        }
    };
    match reply {
        ShardReply::Runs { runs } => {
            let past = runs
                .iter()
                .filter(|r| r.status != chronoshard_wire::RunStatus::Scheduled)
                .count();
            let next_before = (past == limit as usize)
                .then(|| runs.last().map(|r| r.scheduled_at))
                .flatten();
            Ok(Json(RunPage { runs, next_before }))
        }
        other => Err(ApiError::Internal(format!(
            "unexpected shard reply {other:?}"
        ))),
    }
}

/// The runs of a job of a `time_window` cluster that grew, from every shard it may have run on
/// (its history stays where it ran), newest first: the page the shards' pages make together.
async fn runs_of_moved_job(
    state: &AppState,
    shards: &[u32],
    req: &ShardRequest,
    limit: u32,
) -> Result<ShardReply, ApiError> {
    let mut runs = Vec::new();
    let mut found = false;
    for &shard in shards {
        match state.router.call(shard, req).await {
            Ok(ShardReply::Runs { runs: r }) => {
                found = true;
                runs.extend(r);
            }
            Err(e) if e.is_not_found() => {}
            Ok(other) => {
                return Err(ApiError::Internal(format!(
                    "unexpected shard reply {other:?}"
                )))
            }
            Err(e) => return Err(e.into()),
        }
    }
    if !found {
        return Err(ApiError::NotFound("job"));
    }
    let scheduled =
        |r: &chronoshard_wire::RunView| r.status == chronoshard_wire::RunStatus::Scheduled;
    // What is scheduled first (only the shard holding the job has any), then the past newest
    // first; `limit` past runs at most.
    runs.sort_by_key(|r| (!scheduled(r), std::cmp::Reverse(r.scheduled_at)));
    let ahead = runs.iter().take_while(|r| scheduled(r)).count();
    runs.truncate(ahead + limit as usize);
    Ok(ShardReply::Runs { runs })
}

/// One ticket with its attempts and trace id.
#[utoipa::path(get, path = "/v1/tickets/{ticket_id}", tag = "jobs", params(("ticket_id" = Uuid, Path)),
    responses((status = 200, body = TicketView)),
    security(("bearer" = [])))]
pub async fn get_ticket(
    State(state): State<AppState>,
    caller: Caller,
    PathId(ticket_id): PathId,
) -> Result<Json<TicketView>, ApiError> {
    let ticket = find_ticket(&state, ticket_id).await?;
    caller.sees(&ticket.tenant, "ticket")?;
    Ok(Json(ticket))
}

/// Sends a read to the shard of `tenant`, or to every shard when no tenant is given or the
/// tenant's jobs spread over the shards (`time_window`).
pub(super) async fn tenant_or_all(
    state: &AppState,
    tenant: Option<&str>,
    req: &ShardRequest,
) -> Result<Vec<Result<ShardReply, ApiError>>, ApiError> {
    if let Some(t) = tenant {
        check_token("tenant", t, 64).map_err(|e| ApiError::field(e.field, e.message))?;
    }
    Ok(match tenant.filter(|_| !state.router.spreads_tenants()) {
        Some(t) => {
            vec![state
                .router
                .call(Route::Tenant(t), req)
                .await
                .map_err(ApiError::from)]
        }
        None => (state.router.call_all(req).await.into_iter())
            .map(|r| r.map_err(ApiError::from))
            .collect(),
    })
}

/// Finds a ticket: on the shard its id leads to, or in a cluster whose ids carry no routing key
/// on whichever shard has it (every shard is asked; exactly one can have it).
pub(super) async fn find_ticket(state: &AppState, ticket_id: Uuid) -> Result<TicketView, ApiError> {
    if state.router.shard_for_id(ticket_id).is_some() {
        return match state
            .router
            .call(Route::Id(ticket_id), &ShardRequest::GetTicket { ticket_id })
            .await?
        {
            ShardReply::Ticket { ticket } => Ok(ticket),
            other => Err(ApiError::Internal(format!(
                "unexpected shard reply {other:?}"
            ))),
        };
    }
    let mut unavailable = None;
    for reply in state
        .router
        .call_all(&ShardRequest::GetTicket { ticket_id })
        .await
    {
        match reply {
            Ok(ShardReply::Ticket { ticket }) => return Ok(ticket),
            Err(e) if e.is_not_found() => {}
            Ok(_) => {}
            Err(e) => unavailable = Some(ApiError::from(e)),
        }
    }
    Err(unavailable.unwrap_or(ApiError::NotFound("ticket")))
}
