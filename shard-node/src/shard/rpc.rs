//! Answering the control plane on the shard's request subject. Reads are served straight from the
//! store; writes go through the shard's event loop (`Command`) because they change the wheel.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use chronoshard_wire::{
    from_millis,
    rpc::{RpcError, RpcErrorCode, ShardReply, ShardRequest},
    Job, JobSpec, JobState, RunStatus, RunView,
};
use futures::StreamExt;
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;
use tracing::{warn, Instrument};
use uuid::Uuid;

use super::{
    machine,
    moves::{self, Leaving},
    served::Served,
    store::{reason, CreateOutcome, Fired, JobRow, Store, StoreError},
    upcoming, Command, Shard, ShardContext, ShardError,
};

/// How many upcoming fire times a job view lists.
const UPCOMING: usize = 5;

/// A create request waiting in the shard's queue, with where its answer goes.
pub(super) struct Create {
    pub job_id: Uuid,
    pub spec: JobSpec,
    pub idempotency_key: Option<String>,
    pub reply: oneshot::Sender<ShardReply>,
}

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
                None => not_found("job"),
            },
            ShardRequest::ListJobs {
                ref tenant,
                after,
                limit,
            } => ShardReply::Jobs {
                jobs: store
                    .list_jobs(tenant.as_deref(), after, limit)
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
                let Some(job) = store.get_job(job_id).await? else {
                    return Ok(not_found("job"));
                };
                let mut runs = Vec::new();
                // The next occurrence is shown as `scheduled` on the first page.
                if let (None, Some(next), JobState::Active) = (before, job.next_fire_at, job.state)
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

impl Shard {
    /// Applies a write request inside the event loop.
    pub(super) async fn handle(&mut self, req: ShardRequest) -> Result<ShardReply, ShardError> {
        if super::moves::is_move(&req) {
            return self.handle_move(req).await;
        }
        let now = self.ctx.clock.now_ms();
        let shard = self.ctx.shard;
        let job_id = match &req {
            ShardRequest::PatchJob { job_id, .. }
            | ShardRequest::DeleteJob { job_id }
            | ShardRequest::PauseJob { job_id }
            | ShardRequest::ResumeJob { job_id }
            | ShardRequest::TriggerJob { job_id } => *job_id,
            ShardRequest::CreateJob {
                job_id,
                spec,
                idempotency_key,
            } => {
                return self
                    .create(*job_id, spec.clone(), idempotency_key.as_deref(), now)
                    .await;
            }
            ShardRequest::ReplayTicket { ticket_id } => return self.replay(*ticket_id, now).await,
            ShardRequest::PauseTenant { tenant } => return self.pause_tenant(tenant, now).await,
            ShardRequest::ResumeTenant { tenant } => return self.resume_tenant(tenant, now).await,
            ShardRequest::TriggerTenant { tenant } => {
                return self.trigger_tenant(tenant, now).await
            }
            _ => {
                return Ok(ShardReply::Error(RpcError::new(
                    RpcErrorCode::Internal,
                    "not a write request",
                )))
            }
        };
        let Some(job) = self.store.get_job(job_id).await? else {
            return Ok(not_found("job"));
        };
        let request = match &req {
            ShardRequest::TriggerJob { .. } => {
                if let Err(refused) = machine::live(&job) {
                    return Ok(conflict(&refused.to_string()));
                }
                return self.trigger(&job, now).await;
            }
            ShardRequest::PatchJob { patch, .. } => machine::Request::Patch(patch),
            ShardRequest::DeleteJob { .. } => machine::Request::Delete,
            ShardRequest::PauseJob { .. } => machine::Request::Pause {
                fired_ahead: self.fired_ahead(job.id, now),
            },
            ShardRequest::ResumeJob { .. } => machine::Request::Resume,
            _ => unreachable!("matched above"),
        };
        let (job, effects) = match machine::apply(&job, request, now) {
            Ok(next) => next,
            Err(machine::Refused::Invalid(fe)) => return Ok(invalid(fe)),
            Err(machine::Refused::Corrupt(why)) => return Err(StoreError::Corrupt(why).into()),
            Err(refused) => return Ok(conflict(&refused.to_string())),
        };
        let unfire = if effects.withdraw {
            self.withdraw_early(|id, _| *id == job.id)
        } else {
            Vec::new()
        };
        match self.store.update_job(&job, &unfire).await {
            Ok(true) => {}
            Ok(false) => {
                self.dispatcher.restore(&unfire);
                return Ok(not_found("job"));
            }
            Err(e) => {
                self.dispatcher.restore(&unfire);
                return Err(e.into());
            }
        }
        self.follow_wheel(&job, effects.wheel);
        Ok(ShardReply::Job {
            job: view(&job, shard),
            created: false,
        })
    }

    async fn create(
        &mut self,
        job_id: Uuid,
        spec: JobSpec,
        key: Option<&str>,
        now: i64,
    ) -> Result<ShardReply, ShardError> {
        let (mut replies, written) = self
            .create_many(vec![(job_id, spec, key.map(str::to_string))], now)
            .await;
        written?;
        Ok(replies.pop().expect("one reply per request"))
    }

    /// Creates queued together, answered each: one transaction for all of them.
    pub(super) async fn create_batch(&mut self, batch: Vec<Create>) -> Result<(), ShardError> {
        let now = self.ctx.clock.now_ms();
        self.batch_jobs.clear();
        let (requests, replies): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .map(|c| ((c.job_id, c.spec, c.idempotency_key), c.reply))
            .unzip();
        let (answers, written) = self.create_many(requests, now).await;
        for (reply, answer) in replies.into_iter().zip(answers) {
            let _ = reply.send(answer);
        }
        match written {
            Err(e) if e.is_fenced() => Err(e),
            _ => Ok(()),
        }
    }

    /// Validates and writes jobs; one reply per request, in order, and how the write went. An
    /// invalid spec, or one over its tenant's create rate or job quota, is answered without
    /// being written; the others are written in one transaction, and when it fails each of them
    /// is answered with its error.
    async fn create_many(
        &mut self,
        requests: Vec<(Uuid, JobSpec, Option<String>)>,
        now: i64,
    ) -> (Vec<ShardReply>, Result<(), ShardError>) {
        let mut replies: Vec<Option<ShardReply>> = Vec::with_capacity(requests.len());
        let mut rows = Vec::with_capacity(requests.len());
        for (i, (job_id, spec, key)) in requests.into_iter().enumerate() {
            let row = match machine::create(job_id, spec, now) {
                Ok(row) => row,
                Err(fe) => {
                    replies.push(Some(invalid(fe)));
                    continue;
                }
            };
            if let Some(refused) = self.over_limit(&row, key.as_deref(), now).await {
                replies.push(Some(refused));
                continue;
            }
            replies.push(None);
            rows.push((i, row, key));
        }
        if !rows.is_empty() {
            let jobs: Vec<(&JobRow, Option<&str>)> =
                rows.iter().map(|(_, r, k)| (r, k.as_deref())).collect();
            let outcomes = match self.store.create_jobs(&jobs).await {
                Ok(o) => o,
                Err(e) => {
                    let e = ShardError::from(e);
                    return (answered(replies, || error_reply(&e)), Err(e));
                }
            };
            for ((i, row, _), outcome) in rows.iter().zip(outcomes) {
                replies[*i] = Some(match outcome {
                    CreateOutcome::Created => {
                        self.metrics.jobs_created.inc();
                        self.follow_wheel(row, machine::wheel_of(row));
                        ShardReply::Job {
                            job: view(row, self.ctx.shard),
                            created: true,
                        }
                    }
                    CreateOutcome::Existing(existing) => ShardReply::Job {
                        job: view(&existing, self.ctx.shard),
                        created: false,
                    },
                    CreateOutcome::KeyReused => ShardReply::Error(RpcError::new(
                        RpcErrorCode::IdempotencyKeyReused,
                        "this Idempotency-Key was used for a different job",
                    )),
                });
            }
        }
        (
            answered(replies, || unreachable!("every row answered")),
            Ok(()),
        )
    }

    async fn trigger(&mut self, job: &JobRow, now: i64) -> Result<ShardReply, ShardError> {
        let (fired, ticket_ids) = self.fire_now(job, now).await?;
        let (status, reason) = match fired {
            Fired::Ticketed => (RunStatus::Dispatched, None),
            Fired::Buffered => (RunStatus::Scheduled, Some(reason::BUFFERED)),
            Fired::Skipped(why) => (RunStatus::Skipped, Some(why)),
            Fired::Exists => {
                return Ok(conflict(
                    "an occurrence of this job at this instant exists already",
                ))
            }
        };
        let run = RunView {
            job_id: job.id,
            scheduled_at: from_millis(now),
            status,
            reason: reason.map(str::to_string),
            attempts: u32::from(status == RunStatus::Dispatched),
            ticket_ids,
            range_end: None,
            count: None,
            updated_at: from_millis(now),
            warnings: Vec::new(),
        };
        Ok(ShardReply::Triggered { run })
    }
}

impl Shard {
    /// Why the create of `row` may not be written now (its tenant's create rate, then its job
    /// quota), or None. A create that passes counts against both; the quota's count of the
    /// tenant's jobs is read once per batch and kept up to date by the batch itself. A create
    /// that repeats an earlier one (a retry, a reused idempotency key) is never refused: it is
    /// answered with what the first one made.
    async fn over_limit(
        &mut self,
        row: &JobRow,
        key: Option<&str>,
        now: i64,
    ) -> Option<ShardReply> {
        let refused = self.limit(&row.tenant, now).await?;
        match self.store.repeats_a_create(row, key).await {
            Ok(true) => None,
            Ok(false) => Some(refused),
            Err(e) => Some(error_reply(&ShardError::from(e))),
        }
    }

    async fn limit(&mut self, tenant: &str, now: i64) -> Option<ShardReply> {
        let s = self.ctx.settings.borrow().settings;
        if let Err(wait_ms) =
            self.create_rate
                .admit(tenant, now, s.tenant_create_rate, s.tenant_create_burst)
        {
            return Some(ShardReply::Error(RpcError {
                retry_after_ms: Some(wait_ms),
                ..RpcError::new(
                    RpcErrorCode::RateLimited,
                    format!(
                        "tenant {tenant:?} creates more than {} jobs per second",
                        s.tenant_create_rate
                    ),
                )
            }));
        }
        if s.tenant_max_jobs == 0 {
            return None;
        }
        let held = match self.batch_jobs.get(tenant) {
            Some(n) => *n,
            None => match self.store.live_jobs(tenant).await {
                Ok(n) => n,
                Err(e) => return Some(error_reply(&ShardError::from(e))),
            },
        };
        if held >= s.tenant_max_jobs {
            return Some(ShardReply::Error(RpcError::new(
                RpcErrorCode::QuotaExceeded,
                format!(
                    "tenant {tenant:?} has {held} jobs that can still fire, its quota is {}",
                    s.tenant_max_jobs
                ),
            )));
        }
        self.batch_jobs.insert(tenant.to_string(), held + 1);
        None
    }
}

/// Every request's reply: the ones given, and `rest()` for the requests still unanswered.
fn answered(
    replies: Vec<Option<ShardReply>>,
    mut rest: impl FnMut() -> ShardReply,
) -> Vec<ShardReply> {
    replies
        .into_iter()
        .map(|r| r.unwrap_or_else(&mut rest))
        .collect()
}

fn invalid(fe: chronoshard_wire::job::FieldError) -> ShardReply {
    ShardReply::Error(RpcError {
        field: Some(fe.field),
        ..RpcError::new(RpcErrorCode::Validation, fe.message)
    })
}

#[cfg(test)]
mod tests {
    use chronoshard_wire::{
        job::FieldError,
        rpc::{RpcErrorCode, ShardReply},
    };

    use super::{answered, error_reply, invalid};
    use crate::shard::{store::StoreError, ShardError};

    /// A batch whose write failed answers its valid creates with the store's error; an invalid
    /// create in the same batch keeps its own validation error.
    #[test]
    fn an_invalid_create_keeps_its_reply_when_the_batch_write_fails() {
        let e = ShardError::Store(StoreError::Fenced {
            shard: 3,
            mine: 1,
            current: 2,
        });
        let bad = invalid(FieldError {
            field: "schedule.cron".into(),
            message: "not a cron expression".into(),
        });
        let replies = answered(vec![None, Some(bad), None], || error_reply(&e));
        let codes: Vec<_> = replies
            .iter()
            .map(|r| match r {
                ShardReply::Error(e) => (e.code, e.field.clone()),
                other => panic!("an error reply, not {other:?}"),
            })
            .collect();
        assert_eq!(
            codes,
            [
                (RpcErrorCode::Fenced, None),
                (RpcErrorCode::Validation, Some("schedule.cron".to_string())),
                (RpcErrorCode::Fenced, None),
            ]
        );
        assert!(
            matches!(&replies[1], ShardReply::Error(e) if e.message == "not a cron expression")
        );
    }

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
