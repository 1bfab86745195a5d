//! Write requests applied in the shard's event loop: a job's create (with the tenant's create
//! rate and job quota), patch, pause, resume, delete and trigger; tenant-wide pause, resume and
//! trigger; the replay of a dead letter. What a request does to a job is the state machine's
//! (`machine.rs`); here the job is read, the machine applied, the result written and the wheel
//! told. The transport that brings the requests is `rpc.rs`.
//!
//! `Writes` is a request's view of the shard: the firing edges, the agenda and the tenant
//! limits, lent by the event loop for one request. It must not fire what is due (that is the
//! loop's turn) nor touch the tenant-move key set (`moves.rs`).

use chronoshard_wire::{
    from_millis,
    rpc::{RpcError, RpcErrorCode, ShardReply, ShardRequest},
    JobSpec, RunStatus, RunView,
};
use std::collections::HashMap;
use tokio::sync::oneshot;
use tracing::info;
use uuid::Uuid;

use super::{
    agenda::Agenda,
    fire::Firer,
    limits, machine,
    rpc::{conflict, error_reply, invalid, missing_job, not_found, view},
    store::{reason, CreateOutcome, Fired, JobRow, KeyLeft, Replay, RetryRun, StoreError},
    workflow, ShardError,
};

/// A create request waiting in the shard's queue, with where its answer goes.
pub(super) struct Create {
    pub job_id: Uuid,
    pub spec: JobSpec,
    pub idempotency_key: Option<String>,
    pub reply: oneshot::Sender<ShardReply>,
}

/// What the tenant limits remember between requests.
#[derive(Default)]
pub(super) struct Quota {
    /// Each tenant's create rate (`tenant_create_rate`).
    create_rate: limits::CreateRate,
    /// Jobs that can still fire, per tenant, counted for the create batch being written
    /// (`tenant_max_jobs`); cleared per batch.
    batch_jobs: HashMap<String, u64>,
}

/// A write request's view of the shard (see the module docs).
pub(super) struct Writes<'a> {
    pub fire: &'a Firer,
    pub agenda: &'a mut Agenda,
    pub quota: &'a mut Quota,
}

impl Writes<'_> {
    /// Applies a write request inside the event loop.
    pub async fn handle(&mut self, req: ShardRequest) -> Result<ShardReply, ShardError> {
        let now = self.fire.ctx.clock.now_ms();
        let shard = self.fire.ctx.shard;
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
            ShardRequest::RetryWorkflowRun { run_id } => return self.retry_run(*run_id, now).await,
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
        let Some(job) = self.fire.store.get_job(job_id).await? else {
            return Ok(missing_job(&self.fire.store, job_id).await?);
        };
        let request = match &req {
            ShardRequest::TriggerJob { .. } => {
                if let Err(refused) = machine::live(&job) {
                    return Ok(conflict(&refused.to_string()));
                }
                return self.trigger(&job, now).await;
            }
            ShardRequest::PatchJob { patch, .. } => {
                // A run in progress advances by the steps it started with.
                if patch.workflow.is_some() && self.fire.store.has_active_run(job.id).await? {
                    return Ok(conflict(
                        "a run of the workflow is in progress: its steps can change once it ended",
                    ));
                }
                machine::Request::Patch(patch)
            }
            ShardRequest::DeleteJob { .. } => machine::Request::Delete,
            ShardRequest::PauseJob { .. } => machine::Request::Pause {
                fired_ahead: self.agenda.fired_ahead(job.id, now),
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
            self.withdraw_early(|id, _| id == job.id)
        } else {
            Vec::new()
        };
        match self.fire.store.update_job(&job, &unfire).await {
            Ok(true) => {}
            Ok(false) => {
                self.fire.dispatcher.restore(&unfire);
                return Ok(not_found("job"));
            }
            Err(e) => {
                self.fire.dispatcher.restore(&unfire);
                return Err(e.into());
            }
        }
        self.agenda.follow(&job, effects.wheel, self.fire.lead());
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

    /// Withdraws the tickets fired ahead of their time of the jobs `pick` selects (by job and
    /// tenant) that are not due yet: the dispatcher will not publish them. The caller takes them
    /// back in the database (`unfire`) in the transaction of the pause or delete, and gives them
    /// back to the dispatcher (`Handle::restore`) if that fails. So a pause or delete holds for
    /// every occurrence not due when it is applied, as without a lead.
    fn withdraw_early(&mut self, pick: impl Fn(Uuid, &str) -> bool) -> Vec<Uuid> {
        let tickets = self.agenda.take_fired_ahead(pick);
        self.fire.dispatcher.withdraw(&tickets)
    }

    /// The answer to a create whose idempotency key's job left this shard (in a `time_window`
    /// cluster that grew): creating it here would make a second one. While the job is on its
    /// way the caller asks again (`Moving`); once it has arrived, it looks for the key where the
    /// job went (`Moved`).
    async fn key_left(&self, tenant: &str, key: Option<&str>) -> Option<ShardReply> {
        let key = key.filter(|_| self.agenda.places())?;
        let refusal = |code, message| Some(ShardReply::Error(RpcError::new(code, message)));
        match self.fire.store.key_left(tenant, key).await {
            Ok(None) => None,
            Ok(Some(KeyLeft::Moving)) => refusal(
                RpcErrorCode::Moving,
                "the job of this idempotency key is moving to another shard",
            ),
            Ok(Some(KeyLeft::Moved)) => refusal(
                RpcErrorCode::Moved,
                "the job of this idempotency key moved to another shard",
            ),
            Err(e) => Some(error_reply(&e.into())),
        }
    }

    /// Creates queued together, answered each: one transaction for all of them.
    pub async fn create_batch(&mut self, batch: Vec<Create>) -> Result<(), ShardError> {
        let now = self.fire.ctx.clock.now_ms();
        self.quota.batch_jobs.clear();
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
            // Before the limits: a create sent again must not spend a rate token here.
            if let Some(refused) = self.key_left(&row.tenant, key.as_deref()).await {
                replies.push(Some(refused));
                continue;
            }
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
            let outcomes = match self.fire.store.create_jobs(&jobs).await {
                Ok(o) => o,
                Err(e) => {
                    let e = ShardError::from(e);
                    return (answered(replies, || error_reply(&e)), Err(e));
                }
            };
            for ((i, row, _), outcome) in rows.iter().zip(outcomes) {
                replies[*i] = Some(match outcome {
                    CreateOutcome::Created => {
                        self.fire.metrics.jobs_created.inc();
                        (self.agenda).follow(row, machine::wheel_of(row), self.fire.lead());
                        ShardReply::Job {
                            job: view(row, self.fire.ctx.shard),
                            created: true,
                        }
                    }
                    CreateOutcome::Existing(existing) => ShardReply::Job {
                        job: view(&existing, self.fire.ctx.shard),
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
        let (fired, ticket_ids) = self.fire.fire_now(job, now).await?;
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
        match self.fire.store.repeats_a_create(row, key).await {
            Ok(true) => None,
            Ok(false) => Some(refused),
            Err(e) => Some(error_reply(&ShardError::from(e))),
        }
    }

    /// The tenant's create rate and job quota, or this shard's part of them when every shard
    /// holds some of the tenant's jobs (`ShardContext::tenant_share`): the quota is divided so
    /// that the parts add up to it (the control plane sends a create refused for it to another
    /// shard), the rate rounded up, so a tenant may create up to one more per shard each second.
    async fn limit(&mut self, tenant: &str, now: i64) -> Option<ShardReply> {
        let s = self.fire.ctx.settings.borrow().settings;
        let share = self.fire.ctx.tenant_share();
        let (rate, burst) = (s.tenant_create_rate, s.tenant_create_burst);
        let (rate_here, burst_here) = (rate.div_ceil(share), burst.div_ceil(share).max(1));
        if let Err(wait_ms) = (self.quota.create_rate).admit(tenant, now, rate_here, burst_here) {
            let here = match share {
                1 => String::new(),
                n => format!(" (each of the {n} shards admits its part)"),
            };
            return Some(ShardReply::Error(RpcError {
                retry_after_ms: Some(wait_ms),
                ..RpcError::new(
                    RpcErrorCode::RateLimited,
                    format!("tenant {tenant:?} creates more than {rate} jobs per second{here}"),
                )
            }));
        }
        if s.tenant_max_jobs == 0 {
            return None;
        }
        let quota_here = part(s.tenant_max_jobs, share, self.fire.ctx.shard);
        let held = match self.quota.batch_jobs.get(tenant) {
            Some(n) => *n,
            None => match self.fire.store.live_jobs(tenant).await {
                Ok(n) => n,
                Err(e) => {
                    self.quota.create_rate.give_back(tenant, burst_here);
                    return Some(error_reply(&ShardError::from(e)));
                }
            },
        };
        if held >= quota_here {
            self.quota.create_rate.give_back(tenant, burst_here);
            let quota = s.tenant_max_jobs;
            return Some(ShardReply::Error(RpcError::new(
                RpcErrorCode::QuotaExceeded,
                match share {
                    1 => format!(
                        "tenant {tenant:?} has {held} jobs that can still fire, its quota is {quota}"
                    ),
                    n => format!(
                        "tenant {tenant:?} has {held} jobs that can still fire on shard {}, \
                         its part of the quota of {quota} over {n} shards",
                        self.fire.ctx.shard
                    ),
                },
            )));
        }
        self.quota.batch_jobs.insert(tenant.to_string(), held + 1);
        None
    }

    async fn pause_tenant(&mut self, tenant: &str, now: i64) -> Result<ShardReply, ShardError> {
        let unfire = self.withdraw_early(|_, t| t == tenant);
        match self.fire.store.pause_tenant(tenant, &unfire, now).await {
            Ok(true) => info!(tenant, "tenant paused"),
            Ok(false) => {}
            Err(e) => {
                self.fire.dispatcher.restore(&unfire);
                return Err(e.into());
            }
        }
        // The tenant's wheel entries stay; they fire nothing while it is paused (`fire_jobs`).
        self.agenda.set_paused(tenant, true);
        self.tenant_reply(tenant, None).await
    }

    /// Resumes a tenant: each active job whose next occurrence passed during the pause continues
    /// from its first occurrence after now (no catch-up for the paused time, as a resumed job).
    /// One transaction, so a crash cannot leave jobs to catch up the whole pause.
    async fn resume_tenant(&mut self, tenant: &str, now: i64) -> Result<ShardReply, ShardError> {
        let mut jobs = self.fire.store.active_jobs_of(tenant).await?;
        let mut moved = Vec::new();
        for job in &mut jobs {
            if let Some(resumed) = machine::tenant_resumed(job, now) {
                *job = resumed;
                moved.push(job.clone());
            }
        }
        if self.fire.store.resume_tenant(tenant, &moved, now).await? {
            info!(tenant, moved = moved.len(), "tenant resumed");
            self.agenda.set_paused(tenant, false);
            for job in &jobs {
                (self.agenda).follow(job, machine::wheel_of(job), self.fire.lead());
            }
        }
        self.tenant_reply(tenant, None).await
    }

    /// Fires every active job of the tenant once, now, each under its overlap policy.
    async fn trigger_tenant(&mut self, tenant: &str, now: i64) -> Result<ShardReply, ShardError> {
        if self.agenda.is_paused(tenant) {
            return Ok(conflict("the tenant is paused: resume it first"));
        }
        let mut fired = 0;
        for job in self.fire.store.active_jobs_of(tenant).await? {
            if let (Fired::Ticketed, _) = self.fire.fire_now(&job, now).await? {
                fired += 1;
            }
        }
        self.tenant_reply(tenant, Some(fired)).await
    }

    async fn tenant_reply(
        &self,
        tenant: &str,
        triggered: Option<u64>,
    ) -> Result<ShardReply, ShardError> {
        let mut view = self.fire.store.tenant(tenant).await?;
        view.triggered = triggered;
        Ok(ShardReply::Tenant { tenant: view })
    }

    /// Publishes a dead letter again as its next attempt.
    async fn replay(&mut self, ticket: Uuid, now: i64) -> Result<ShardReply, ShardError> {
        match self.fire.store.replay(ticket, now).await? {
            Replay::NotFound => Ok(not_found("ticket")),
            Replay::NotDead => Ok(ShardReply::Error(RpcError::new(
                RpcErrorCode::Conflict,
                "the ticket is not a dead letter",
            ))),
            Replay::Replayed(t) => {
                info!(ticket_id = %ticket, attempt = t.attempt, "dead letter replayed");
                self.fire.dispatcher.publish(vec![*t]);
                match self.fire.store.ticket(ticket).await? {
                    Some(view) => Ok(ShardReply::Ticket { ticket: view }),
                    None => Ok(not_found("ticket")),
                }
            }
        }
    }
}

impl Writes<'_> {
    /// Retries a workflow run from its failed steps (`Store::retry_run`), publishes them, and
    /// releases the steps that wait for nothing else any more.
    async fn retry_run(&mut self, run_id: Uuid, now: i64) -> Result<ShardReply, ShardError> {
        let Some(run) = self.fire.store.workflow_run(run_id).await? else {
            return Ok(not_found("workflow run"));
        };
        let steps = match self.fire.store.get_job(run.run.job_id).await? {
            Some(j) => j.spec.workflow.map_or(0, |w| w.steps.len()),
            None => return Ok(not_found("workflow run")),
        };
        match self.fire.store.retry_run(run_id, steps, now).await? {
            RetryRun::NotFound => Ok(not_found("workflow run")),
            RetryRun::NotFailed => Ok(conflict(
                "only a run that ended with a failed or skipped step, and was not replaced by a \
                 newer one, can be retried",
            )),
            RetryRun::Changed => Ok(conflict(
                "the workflow's steps changed since this run began: it cannot be retried",
            )),
            RetryRun::Retried(tickets) => {
                info!(run_id = %run_id, steps = tickets.len(), "workflow run retried");
                self.fire.dispatcher.publish(tickets);
                let Some(run) = self.fire.store.workflow_run(run_id).await? else {
                    return Ok(not_found("workflow run"));
                };
                let (job, at) = (run.run.job_id, run.run.scheduled_at.timestamp_millis());
                workflow::advance(self.fire, job, at, now).await?;
                let Some(run) = self.fire.store.workflow_run(run_id).await? else {
                    return Ok(not_found("workflow run"));
                };
                match self.fire.store.get_job(job).await? {
                    Some(j) => Ok(ShardReply::WorkflowRuns {
                        workflow: view(&j, self.fire.ctx.shard),
                        runs: vec![run],
                    }),
                    None => Ok(not_found("workflow")),
                }
            }
        }
    }
}

/// Shard `shard`'s part of `total` divided over `share` shards: the parts add up to `total`.
fn part(total: u64, share: u32, shard: u32) -> u64 {
    let share = u64::from(share.max(1));
    total / share + u64::from(u64::from(shard) % share < total % share)
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

#[cfg(test)]
mod tests {
    use chronoshard_wire::{
        job::FieldError,
        rpc::{RpcErrorCode, ShardReply},
    };

    use super::{answered, part};
    use crate::shard::{
        rpc::{error_reply, invalid},
        store::StoreError,
        ShardError,
    };

    #[test]
    fn a_quota_is_divided_into_parts_that_add_up_to_it() {
        for (total, share) in [(50, 4), (3, 8), (0, 8), (64, 8), (7, 1)] {
            let parts: Vec<u64> = (0..share).map(|s| part(total, share, s)).collect();
            assert_eq!(
                parts.iter().sum::<u64>(),
                total,
                "{total} over {share}: {parts:?}"
            );
            assert!(parts.iter().max().unwrap() - parts.iter().min().unwrap() <= 1);
        }
    }

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
}
