//! A workflow run's steps as the store holds them: reading a run's step tickets, and the one
//! transaction that carries out what `shard::workflow::dag::advance` decided (dispatch waiting
//! steps, skip them, cancel steps in progress), conditioned on each step's state so that doing it
//! twice changes nothing. It decides nothing itself.

use chronoshard_wire::{rpc::RunSteps, RunStatus, RunView, Ticket};
use sqlx::Row;
use uuid::Uuid;

use super::{
    results::sync_run,
    tickets::{cancel_open, ticket_json, Cancelled, OpenOf},
    views::{status_of, ticket_from_json},
    Result, Store,
};

/// One step of a run: its ticket (the body as dispatched, or to be dispatched), its status and
/// the output of its last finished attempt.
#[derive(Clone, Debug)]
pub struct StepRow {
    pub ticket: Ticket,
    pub status: RunStatus,
    pub output: Option<String>,
}

/// What one advance wrote: the steps released (to publish) and the attempts cancelled (to stop
/// where they run).
#[derive(Debug, Default)]
pub struct Advanced {
    pub released: Vec<Ticket>,
    pub cancelled: Vec<Cancelled>,
    pub skipped: usize,
}

/// Why `fail_fast` stopped a step.
pub const FAILED_FAST: &str = "cancelled: another step of the run failed (fail_fast)";

impl Store {
    /// The step tickets of the run of `job` at `at`, by item.
    pub async fn run_steps(&self, job: Uuid, at: i64) -> Result<Vec<StepRow>> {
        let rows = sqlx::query(
            "SELECT t.body, t.status, a.output FROM tickets t \
             LEFT JOIN attempts a ON a.ticket_id = t.id AND a.attempt = t.attempt \
             WHERE t.job_id = $1 AND t.scheduled_at = $2 ORDER BY t.item",
        )
        .bind(job.to_string())
        .bind(at)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(StepRow {
                    ticket: ticket_from_json(&r.try_get::<String, _>("body")?)?,
                    status: status_of(&r.try_get::<String, _>("status")?)?,
                    output: r.try_get("output")?,
                })
            })
            .collect()
    }

    /// Runs an advance may still owe something: those with steps waiting, and a workflow's runs
    /// with a step failed for good while others still run (`fail_fast` cancels them). (job,
    /// scheduled time), for a shard that opens to advance each. The second kind is looked for
    /// among the runs in progress only (a run stays in progress while a step runs), so the cost
    /// follows what is in flight, not how many dead letters the shard has kept.
    pub async fn waiting_runs(&self) -> Result<Vec<(Uuid, i64)>> {
        let rows = sqlx::query(
            "SELECT DISTINCT job_id, scheduled_at FROM tickets WHERE status = 'waiting' \
             UNION SELECT r.job_id, r.scheduled_at FROM runs r \
             JOIN jobs j ON j.id = r.job_id AND j.kind = 'workflow' \
             WHERE r.status IN ('dispatched', 'running', 'retrying') \
             AND EXISTS (SELECT 1 FROM tickets d WHERE d.job_id = r.job_id \
                 AND d.scheduled_at = r.scheduled_at AND d.dead_at IS NOT NULL) \
             AND EXISTS (SELECT 1 FROM tickets o WHERE o.job_id = r.job_id \
                 AND o.scheduled_at = r.scheduled_at \
                 AND o.status IN ('dispatched', 'running', 'retrying'))",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    super::parse_uuid(&r.try_get::<String, _>("job_id")?)?,
                    r.try_get("scheduled_at")?,
                ))
            })
            .collect()
    }

    /// In one transaction: dispatches `release` (waiting step tickets, now as their first
    /// attempt), records `skip` (ticket, reason) as skipped and `cancel` as cancelled, each only
    /// if the step is still in the state the decision saw; then the run's status follows.
    pub async fn advance_steps(
        &self,
        release: Vec<Ticket>,
        skip: &[(Uuid, String)],
        cancel: &[Uuid],
        now: i64,
    ) -> Result<Advanced> {
        let mut tx = self.write().await?;
        let mut out = Advanced::default();
        let mut touched = None;
        for t in release {
            let id = t.ticket_id.to_string();
            let n = sqlx::query(
                "UPDATE tickets SET status = 'dispatched', attempt = $1, body = $2, updated_at = $3 \
                 WHERE id = $4 AND status = 'waiting'",
            )
            .bind(t.attempt as i64)
            .bind(ticket_json(&t)?)
            .bind(now)
            .bind(&id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 1 {
                super::results::insert_attempt(&mut tx, &id, t.attempt, now).await?;
                touched = Some(id);
                out.released.push(t);
            }
        }
        for (ticket, reason) in skip {
            let id = ticket.to_string();
            let n = sqlx::query(
                "UPDATE tickets SET status = 'skipped', reason = $1, updated_at = $2 \
                 WHERE id = $3 AND status = 'waiting'",
            )
            .bind(reason)
            .bind(now)
            .bind(&id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 1 {
                touched = Some(id);
                out.skipped += 1;
            }
        }
        for ticket in cancel {
            let id = ticket.to_string();
            let stopped = cancel_step(&mut tx, &id, now).await?;
            if !stopped.is_empty() {
                touched = Some(id);
                out.cancelled.extend(stopped);
            }
        }
        if let Some(id) = touched {
            sync_run(&mut tx, &id, None, now).await?;
        }
        tx.commit().await?;
        Ok(out)
    }
}

/// Cancels a step's open attempt (`fail_fast`): the attempt and the ticket end `cancelled`.
/// Returns the attempt, for the shard to stop it where it is.
async fn cancel_step(tx: &mut super::Tx, id: &str, now: i64) -> Result<Vec<Cancelled>> {
    let open = cancel_open(tx, OpenOf::Ticket(id), FAILED_FAST, now).await?;
    if !open.is_empty() {
        sqlx::query(
            "UPDATE tickets SET status = 'cancelled', reason = $1, updated_at = $2 WHERE id = $3",
        )
        .bind(FAILED_FAST)
        .bind(now)
        .bind(id)
        .execute(&mut **tx)
        .await?;
    }
    Ok(open)
}

impl Store {
    /// Runs of workflow `job`, newest first, strictly before `before`, with their steps.
    pub async fn workflow_runs(
        &self,
        job: Uuid,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<RunSteps>> {
        let mut out = Vec::new();
        for run in self.runs(job, before, limit).await? {
            out.push(self.with_steps(run).await?);
        }
        Ok(out)
    }

    /// The run whose id is `run_id` (its first step's ticket id), with its steps.
    pub async fn workflow_run(&self, run_id: Uuid) -> Result<Option<RunSteps>> {
        let Some(first) = self.ticket(run_id).await? else {
            return Ok(None);
        };
        if first.item != 0 {
            return Ok(None);
        }
        let at = first.scheduled_at.timestamp_millis();
        let runs = self.runs(first.job_id, Some(at + 1), 1).await?;
        match runs.into_iter().next() {
            Some(run) if run.scheduled_at == first.scheduled_at => {
                Ok(Some(self.with_steps(run).await?))
            }
            _ => Ok(None),
        }
    }

    async fn with_steps(&self, run: RunView) -> Result<RunSteps> {
        let mut steps = Vec::with_capacity(run.ticket_ids.len());
        for id in &run.ticket_ids {
            if let Some(t) = self.ticket(*id).await? {
                steps.push(t);
            }
        }
        steps.sort_by_key(|t| t.item);
        Ok(RunSteps { run, steps })
    }
}

/// The answer to retrying a workflow run.
#[derive(Debug)]
pub enum RetryRun {
    NotFound,
    /// No step of the run failed or was skipped, a step is still in progress, or the run was
    /// replaced by a newer one (overlap `replace`).
    NotFailed,
    /// The workflow's steps changed since the run began (its number of steps differs).
    Changed,
    /// The failed steps' next attempts, written: publish them.
    Retried(Vec<Ticket>),
}

impl Store {
    /// Retries the run whose id is `run_id` (of a workflow of `steps` steps) from its failed
    /// steps, in one transaction: each step that ran and ended dead, failed or cancelled gets its
    /// next attempt with a fresh retry budget; the steps that never ran (skipped, or cancelled
    /// while they waited) wait again. Refused while a step is still in progress, so that no step
    /// runs twice at once.
    pub async fn retry_run(&self, run_id: Uuid, steps: usize, now: i64) -> Result<RetryRun> {
        let mut tx = self.write().await?;
        let Some(first) = sqlx::query(
            "SELECT t.job_id, t.scheduled_at, r.status FROM tickets t \
             JOIN runs r ON r.job_id = t.job_id AND r.scheduled_at = t.scheduled_at \
             WHERE t.id = $1 AND t.item = 0",
        )
        .bind(run_id.to_string())
        .fetch_optional(&mut *tx)
        .await?
        else {
            return Ok(RetryRun::NotFound);
        };
        let (job, at): (String, i64) = (first.try_get("job_id")?, first.try_get("scheduled_at")?);
        if status_of(&first.try_get::<String, _>("status")?)? == RunStatus::Cancelled {
            return Ok(RetryRun::NotFailed);
        }
        let rows = sqlx::query(
            "SELECT id, status, attempt, body, checkpoint FROM tickets \
             WHERE job_id = $1 AND scheduled_at = $2 ORDER BY item",
        )
        .bind(&job)
        .bind(at)
        .fetch_all(&mut *tx)
        .await?;
        if rows.len() != steps {
            return Ok(RetryRun::Changed);
        }
        let mut statuses = Vec::with_capacity(rows.len());
        for r in &rows {
            statuses.push(status_of(&r.try_get::<String, _>("status")?)?);
        }
        let failed = |s: &RunStatus| {
            matches!(
                s,
                RunStatus::Dead | RunStatus::Failed | RunStatus::Cancelled | RunStatus::Skipped
            )
        };
        if !statuses.iter().all(RunStatus::is_final) || !statuses.iter().any(failed) {
            return Ok(RetryRun::NotFailed);
        }
        let mut written = Vec::new();
        for (r, s) in rows.iter().zip(&statuses) {
            let id: String = r.try_get("id")?;
            let ran = r.try_get::<i64, _>("attempt")? > 0;
            if failed(s) && ran {
                written.push(super::results::rerun(&mut tx, &id, r, now).await?);
            } else if failed(s) {
                sqlx::query(
                    "UPDATE tickets SET status = 'waiting', reason = NULL, updated_at = $1 WHERE id = $2",
                )
                .bind(now)
                .bind(&id)
                .execute(&mut *tx)
                .await?;
            }
        }
        sync_run(&mut tx, &run_id.to_string(), None, now).await?;
        tx.commit().await?;
        Ok(RetryRun::Retried(written))
    }
}

impl Store {
    /// Whether a run of `job` is still in progress (a workflow's steps may not change then).
    pub async fn has_active_run(&self, job: Uuid) -> Result<bool> {
        let found: Option<i64> = sqlx::query_scalar(
            "SELECT scheduled_at FROM runs WHERE job_id = $1 \
             AND status IN ('dispatched', 'running', 'retrying') LIMIT 1",
        )
        .bind(job.to_string())
        .fetch_optional(&self.pool)
        .await?;
        Ok(found.is_some())
    }
}
