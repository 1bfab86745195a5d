//! Answering the control plane on the shard's request subject: the transport. Reads are served
//! straight from the store; writes go to the shard's event loop (`Command`), which applies them
//! (`writes.rs`), because they change the wheel. Also the replies every part of the shard gives.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use chronoshard_wire::{
    from_millis,
    rpc::{RpcError, RpcErrorCode, ShardReply, ShardRequest},
    Job, JobState, RunStatus, RunView,
};
use futures::StreamExt;
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;
use tracing::{warn, Instrument};

use super::{
    machine,
    moves::{self, Leaving},
    served::Served,
    store::{JobKind, JobRow, Store, StoreError},
    upcoming, Command, ShardContext, ShardError,
};

/// How many upcoming fire times a job view lists.
const UPCOMING: usize = 5;

pub(crate) async fn start(
    store: Store,
    ctx: ShardContext,
    leaving: Arc<Leaving>,
    served: Arc<Served>,
    commands: mpsc::Sender<Command>,
    wheel_len: Arc<AtomicU64>,
    stop: CancellationToken,
) -> Result<JoinHandle<()>, ShardError> {
    let client = ctx.cluster.client.clone();
    let mut sub = client
        .subscribe(super::rpc_subject(ctx.shard))
        .await
        .map_err(|e| ShardError::Nats {
            shard: ctx.shard,
            what: "subscribe to shard requests",
            reason: e.to_string(),
        })?;
    // Registered once it takes requests over NATS too; `None` only when a newer epoch of this
    // shard serves here already, whose loop then answers local callers.
    let mut local = ctx.local.serve(ctx.shard, ctx.epoch);
    let server = Server {
        store,
        ctx,
        leaving,
        served,
        commands,
        wheel_len,
    };
    let span = tracing::info_span!("rpc", shard_id = server.ctx.shard);
    Ok(tokio::spawn(
        async move {
            loop {
                let from_local = async {
                    match &mut local {
                        Some((_, calls)) => calls.recv().await,
                        None => std::future::pending().await,
                    }
                };
                let msg = tokio::select! {
                    _ = stop.cancelled() => break,
                    m = sub.next() => match m { Some(m) => m, None => break },
                    Some((req, reply)) = from_local => {
                        let server = server.clone();
                        // Answered whatever it is: the caller reads `Fenced` / `NotOwner` as it
                        // reads silence over NATS.
                        tokio::spawn(async move {
                            let _ = reply.send(Some(serve(req, &server).await));
                        });
                        continue;
                    }
                };
                let Some(reply_to) = msg.reply.clone() else {
                    continue;
                };
                let (server, client) = (server.clone(), client.clone());
                tokio::spawn(async move {
                    let reply = match serde_json::from_slice::<ShardRequest>(&msg.payload) {
                        Ok(req) => serve(req, &server).await,
                        Err(e) => ShardReply::Error(RpcError::new(
                            RpcErrorCode::Validation,
                            format!("bad request: {e}"),
                        )),
                    };
                    // A node that lost the shard stays silent, so the caller hears only the
                    // new owner (or times out) and never applies a write twice.
                    if let ShardReply::Error(RpcError {
                        code: RpcErrorCode::Fenced | RpcErrorCode::NotOwner,
                        ..
                    }) = &reply
                    {
                        return;
                    }
                    let body = serde_json::to_vec(&reply).expect("reply serialises");
                    if let Err(e) = client.publish(reply_to, body.into()).await {
                        warn!(error = %e, "could not send shard reply");
                    }
                });
            }
            if let Some((registration, mut calls)) = local {
                // Calls still queued (or being queued: `recv` waits for a send under way) were
                // not taken: say so, and the callers ask again.
                drop(registration);
                calls.close();
                while let Some((_, reply)) = calls.recv().await {
                    let _ = reply.send(None);
                }
            }
            let _ = sub.unsubscribe().await;
        }
        .instrument(span),
    ))
}

/// What answering a request needs, over NATS or from this process; cloned into each request's
/// task.
#[derive(Clone)]
struct Server {
    store: Store,
    ctx: ShardContext,
    leaving: Arc<Leaving>,
    served: Arc<Served>,
    commands: mpsc::Sender<Command>,
    wheel_len: Arc<AtomicU64>,
}

async fn serve(req: ShardRequest, server: &Server) -> ShardReply {
    let Server {
        store,
        ctx,
        leaving,
        served,
        commands,
        wheel_len,
    } = server;
    // Writes are refused by the event loop, in order with the freeze; a read of a tenant that
    // is gone would find nothing here.
    if !req.is_write() {
        if let Some(refused) = leaving.refusal(&req) {
            return refused;
        }
    }
    let read = async {
        Ok::<_, ShardError>(match req {
            ShardRequest::GetJob { job_id } => match store.get_job(job_id).await? {
                Some(row) => ShardReply::Job {
                    job: view(&row, ctx.shard),
                    created: false,
                },
                None => missing_job(store, job_id).await?,
            },
            ShardRequest::FindKey {
                ref tenant,
                ref idempotency_key,
            } => match store.job_by_key(tenant, idempotency_key).await? {
                Some(row) => ShardReply::Job {
                    job: view(&row, ctx.shard),
                    created: false,
                },
                None if store.key_left(tenant, idempotency_key).await?
                    == Some(super::store::KeyLeft::Moving) =>
                {
                    ShardReply::Error(RpcError::new(
                        RpcErrorCode::Moving,
                        "the job is moving to another shard",
                    ))
                }
                None => not_found("job"),
            },
            ShardRequest::ListPaused => ShardReply::Paused {
                tenants: store.paused_tenants().await?,
            },
            ShardRequest::ListJobs {
                ref tenant,
                after,
                limit,
                workflows,
            } => ShardReply::Jobs {
                jobs: store
                    .list_jobs(
                        if workflows {
                            JobKind::Workflow
                        } else {
                            JobKind::Job
                        },
                        tenant.as_deref(),
                        after,
                        limit,
                    )
                    .await?
                    .iter()
                    .map(|r| view(r, ctx.shard))
                    .collect(),
            },
            ShardRequest::ListRuns {
                job_id,
                before,
                limit,
            } => {
                // A job that moved to another shard left its past runs here.
                let job = store.get_job(job_id).await?;
                let mut runs = Vec::new();
                // The next occurrence is shown as `scheduled` on the first page.
                if let Some((None, Some(next), JobState::Active, job)) =
                    (job.as_ref()).map(|j| (before, j.next_fire_at, j.state, j))
                {
                    runs.push(RunView {
                        job_id,
                        scheduled_at: from_millis(next),
                        status: RunStatus::Scheduled,
                        reason: None,
                        attempts: 0,
                        ticket_ids: Vec::new(),
                        range_end: None,
                        count: None,
                        updated_at: from_millis(job.updated_at),
                        warnings: Vec::new(),
                    });
                }
                runs.extend(
                    store
                        .runs(job_id, before.map(|b| b.timestamp_millis()), limit)
                        .await?,
                );
                let Some(job) = job else {
                    return Ok(match runs.is_empty() {
                        true => missing_job(store, job_id).await?,
                        false => ShardReply::Runs { runs },
                    });
                };
                let waiting = [
                    RunStatus::Scheduled,
                    RunStatus::Dispatched,
                    RunStatus::Retrying,
                ];
                if let Some(warning) = served.warning(job.spec.target.queue()).await {
                    for run in runs.iter_mut().filter(|r| waiting.contains(&r.status)) {
                        run.warnings.push(warning.clone());
                    }
                }
                ShardReply::Runs { runs }
            }
            ShardRequest::GetTicket { ticket_id } => match store.ticket(ticket_id).await? {
                Some(ticket) => ShardReply::Ticket { ticket },
                None => not_found("ticket"),
            },
            ShardRequest::ListWorkflowRuns {
                workflow_id,
                before,
                limit,
            } => match store.get_job(workflow_id).await? {
                Some(job) if job.spec.workflow.is_some() => ShardReply::WorkflowRuns {
                    workflow: view(&job, ctx.shard),
                    runs: store
                        .workflow_runs(workflow_id, before.map(|b| b.timestamp_millis()), limit)
                        .await?,
                },
                _ => not_found("workflow"),
            },
            ShardRequest::GetWorkflowRun { run_id } => match store.workflow_run(run_id).await? {
                Some(run) => match store.get_job(run.run.job_id).await? {
                    Some(job) if job.spec.workflow.is_some() => ShardReply::WorkflowRuns {
                        workflow: view(&job, ctx.shard),
                        runs: vec![run],
                    },
                    _ => not_found("workflow run"),
                },
                None => not_found("workflow run"),
            },
            ShardRequest::ListDeadLetters {
                ref tenant,
                before,
                limit,
            } => ShardReply::DeadLetters {
                items: store.dead_letters(tenant.as_deref(), before, limit).await?,
            },
            ShardRequest::GetTenant { ref tenant } => ShardReply::Tenant {
                tenant: store.tenant(tenant).await?,
            },
            ShardRequest::ListTenants => moves::tenant_list(store.tenants().await?),
            ShardRequest::ExportTenants {
                ref tenants,
                ref cursor,
                max_bytes,
            } => {
                let (pages, next) = store
                    .export_tenants(tenants, cursor, max_bytes as usize)
                    .await?;
                ShardReply::Exported { pages, next }
            }
            ShardRequest::Ping => ShardReply::Pong {
                shard: ctx.shard,
                epoch: ctx.epoch,
                wheel_len: wheel_len.load(Ordering::Relaxed),
            },
            write => {
                let (tx, rx) = oneshot::channel();
                if commands.send(Command::Request(write, tx)).await.is_err() {
                    return Ok(unavailable());
                }
                rx.await.unwrap_or_else(|_| unavailable())
            }
        })
    };
    let mut reply = read.await.unwrap_or_else(|e| error_reply(&e));
    if let ShardReply::Job { job, .. } = &mut reply {
        if job.state != JobState::Deleted {
            job.warnings
                .extend(served.warning(job.spec.target.queue()).await);
        }
    }
    reply
}

/// The answer about a job this shard does not hold: `Moving` while it is on its way to another
/// shard (the caller asks again and finds it there), else not found.
pub(super) async fn missing_job(store: &Store, id: uuid::Uuid) -> Result<ShardReply, StoreError> {
    Ok(match store.handing_off(id).await? {
        true => ShardReply::Error(RpcError::new(
            RpcErrorCode::Moving,
            "the job is moving to another shard",
        )),
        false => not_found("job"),
    })
}

pub(super) fn not_found(what: &str) -> ShardReply {
    ShardReply::Error(RpcError::new(
        RpcErrorCode::NotFound,
        format!("{what} not found"),
    ))
}

fn unavailable() -> ShardReply {
    ShardReply::Error(RpcError::new(RpcErrorCode::NotOwner, "shard is closing"))
}

pub(super) fn conflict(message: &str) -> ShardReply {
    ShardReply::Error(RpcError::new(RpcErrorCode::Conflict, message))
}

pub(crate) fn error_reply(e: &ShardError) -> ShardReply {
    let code = match e {
        ShardError::Store(StoreError::Fenced { .. }) => RpcErrorCode::Fenced,
        // The shard closed its database while the request ran (it is stopping or moving): not
        // an answer about the job, so the caller asks the owner again.
        ShardError::Store(StoreError::Db(sqlx::Error::PoolClosed)) => RpcErrorCode::NotOwner,
        _ => RpcErrorCode::Internal,
    };
    ShardReply::Error(RpcError::new(code, e.to_string()))
}

/// A job as the API shows it.
pub(crate) fn view(row: &JobRow, shard: u32) -> Job {
    let next = match row.state {
        JobState::Active => machine::schedule_of(row)
            .map(|s| upcoming(&s, row.next_fire_at, UPCOMING))
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    Job {
        id: row.id,
        spec: row.spec.clone(),
        state: row.state,
        shard,
        created_at: from_millis(row.created_at),
        updated_at: from_millis(row.updated_at),
        next_fire_times: next,
        warnings: Vec::new(),
    }
}

pub(super) fn invalid(fe: chronoshard_wire::job::FieldError) -> ShardReply {
    ShardReply::Error(RpcError {
        field: Some(fe.field),
        ..RpcError::new(RpcErrorCode::Validation, fe.message)
    })
}

#[cfg(test)]
mod tests {
    use chronoshard_wire::rpc::{RpcErrorCode, ShardReply};

    use super::error_reply;
    use crate::shard::{store::StoreError, ShardError};

    /// A request that found the shard's database closed (the shard stopping or moving) is not
    /// an internal error: the caller hears what it hears from a node that lost the shard.
    #[test]
    fn a_closed_database_is_answered_as_not_the_owner() {
        let closed = ShardError::Store(StoreError::Db(sqlx::Error::PoolClosed));
        let other = ShardError::Store(StoreError::Corrupt("x".into()));
        let code = |r: ShardReply| match r {
            ShardReply::Error(e) => e.code,
            other => panic!("an error reply, not {other:?}"),
        };
        assert_eq!(code(error_reply(&closed)), RpcErrorCode::NotOwner);
        assert_eq!(code(error_reply(&other)), RpcErrorCode::Internal);
    }
}
