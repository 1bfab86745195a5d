//! Worker results and what follows from them: attempt and ticket status, the next attempt of a
//! failed ticket (retry policy) or its dead letter, the run's status, and the replay of a dead
//! letter. Each result is applied at most once: every change is conditioned on the attempt's
//! state, so a re-sent or redelivered result changes nothing.
//!
//! The store decides retries because the next attempt must be written in the same transaction
//! as the failure; the shard loop only arms the timers the returned `FollowUp`s name.
//!
//! A batch is applied set-based (`batch`, `rows`): the rows it touches are read once, the
//! results are applied to that copy one after the other with the rules below, and the changed
//! rows are written back with one multi-row statement per table. The rules, per result:
//!
//! - `progress`: keeps the checkpoint (see `checkpoint` below) and records the shard's time as the
//!   open attempt's last sign of life.
//! - `started` of an open attempt: running, by this worker, from the shard's time (a second start
//!   is a redelivery to another worker: the watchdog's clock starts again); the watchdog is
//!   armed. A start reported after the end (reports can cross) only records the worker's start
//!   time if none is recorded, and changes no status.
//! - `released`: the open attempt goes back to dispatched, only if it is recorded with this worker
//!   (a late release must not erase the start of the worker that took the delivery over).
//! - `succeeded` / `failed` of an open attempt: finished; a failed current attempt gets its next
//!   attempt if the retry policy allows (and the job is not deleted), else the ticket is a dead
//!   letter; a failed attempt that is no longer current changes only that attempt.
//! - checkpoint: kept for the ticket's next attempt only from the current attempt while it is
//!   open: a late report of an attempt given up on, or a copy of a final report, must not
//!   overwrite what a successor (or a replay) is to receive.
//! - after each change of an attempt's status the ticket takes its current attempt's status, and
//!   the status of the occurrence (run) is computed again from all its item tickets.

mod batch;
mod rows;

use std::collections::HashSet;

use chronoshard_wire::{RunStatus, Ticket, TicketResult};
use sqlx::Row;
use uuid::Uuid;

use super::{
    tickets::ticket_json,
    views::{run_status, status_of, ticket_from_json},
    Result, Store, StoreError, Tx,
};

/// Timeout of tickets written before the column existed.
const DEFAULT_TIMEOUT_MS: i64 = 30_000;

/// Something the shard loop must do after results were applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FollowUp {
    /// Publish this attempt of a ticket at `at` (its retry backoff ends then).
    Retry { ticket: Uuid, attempt: u32, at: i64 },
    /// An attempt started: the watchdog checks it for a result.
    Started {
        ticket: Uuid,
        attempt: u32,
        started_at: i64,
        timeout_ms: i64,
    },
    /// A run of the job ended: a buffered occurrence may fire now.
    RunEnded { job: Uuid },
    /// A step of a workflow's run ended (succeeded, or failed for good): the steps after it
    /// may run, or be skipped.
    StepEnded { job: Uuid, at: i64 },
}

/// What `apply_results` did.
#[derive(Debug, Default)]
pub struct Applied {
    /// Results that changed something (re-sent ones do not).
    pub changed: usize,
    /// Attempts that failed for good: their tickets are dead letters now.
    pub dead: usize,
    /// The tenant of each failed attempt of a live job's current attempt, and of each dead
    /// letter (`dead` of them), for the tenant-labelled metrics.
    pub failed_tenants: Vec<String>,
    pub dead_tenants: Vec<String>,
    pub follow_ups: Vec<FollowUp>,
    /// The jobs of `RunEnded` follow-ups that held a buffered occurrence (`overlap: buffer_one`)
    /// when the results were applied: only their release can fire anything. A job without one
    /// cannot get one before the shard loop looks: buffering needs an active run, and the end
    /// of that run is followed up again.
    pub buffered: HashSet<Uuid>,
    /// Attempts that got their final result in this batch: a watchdog check of them would find
    /// it (an attempt never reopens).
    pub finished: HashSet<(Uuid, u32)>,
}

impl Applied {
    /// Drops the follow-ups the shard loop would act on only to find nothing to do: the
    /// watchdog check of an attempt started and finished in this batch (one read of the
    /// attempt each), and the end of a run whose job has nothing buffered (one read of the job
    /// each). See `buffered` and `finished`.
    pub fn drop_idle_follow_ups(&mut self) {
        let (buffered, finished) = (&self.buffered, &self.finished);
        self.follow_ups.retain(|f| match f {
            FollowUp::RunEnded { job } => buffered.contains(job),
            FollowUp::Started {
                ticket, attempt, ..
            } => !finished.contains(&(*ticket, *attempt)),
            FollowUp::Retry { .. } | FollowUp::StepEnded { .. } => true,
        });
    }
}

/// An attempt without a final result, as the watchdog and the loader see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenAttempt {
    pub ticket: Uuid,
    pub attempt: u32,
    pub not_before: Option<i64>,
    pub published_at: Option<i64>,
    pub started_at: Option<i64>,
    pub progress_at: Option<i64>,
    pub timeout_ms: i64,
    /// The worker that reported the start, which the watchdog asks before it gives up.
    pub worker: Option<String>,
}

/// The answer to a replay request.
#[derive(Debug)]
pub enum Replay {
    NotFound,
    /// The ticket is not a dead letter (never was, or was replayed already).
    NotDead,
    /// The next attempt, written: publish it.
    Replayed(Box<Ticket>),
}

impl Store {
    /// Applies worker results in one transaction.
    pub async fn apply_results(&self, results: &[TicketResult], now: i64) -> Result<Applied> {
        if results.is_empty() {
            return Ok(Applied::default());
        }
        let _timer = self.timer("apply_results");
        if self.one_trip_available() {
            return batch::apply_in_two_trips(self, results, now).await;
        }
        let mut tx = self.write().await?;
        let out = batch::apply(&mut tx, results, now).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// Attempts that have no final result yet, oldest first: armed as retry and watchdog timers
    /// when the shard opens.
    pub async fn open_attempts(&self) -> Result<Vec<OpenAttempt>> {
        let rows = sqlx::query(
            "SELECT a.ticket_id, a.attempt, a.not_before, a.published_at, a.started_at, a.heartbeat_at, a.worker, t.timeout_ms \
             FROM attempts a JOIN tickets t ON t.id = a.ticket_id AND t.attempt = a.attempt \
             WHERE a.finished_at IS NULL ORDER BY a.created_at",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(open_from_row).collect()
    }

    /// One attempt if it is still the ticket's current one and has no final result.
    pub async fn open_attempt(&self, ticket: Uuid, attempt: u32) -> Result<Option<OpenAttempt>> {
        let row = sqlx::query(
            "SELECT a.ticket_id, a.attempt, a.not_before, a.published_at, a.started_at, a.heartbeat_at, a.worker, t.timeout_ms \
             FROM attempts a JOIN tickets t ON t.id = a.ticket_id AND t.attempt = a.attempt \
             WHERE a.ticket_id = $1 AND a.attempt = $2 AND a.finished_at IS NULL",
        )
        .bind(ticket.to_string())
        .bind(attempt as i64)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(open_from_row).transpose()
    }

    /// The ticket as its current attempt is published, if that attempt is `attempt`, is not
    /// published yet and has no result: what a retry timer publishes.
    pub async fn pending_attempt(&self, ticket: Uuid, attempt: u32) -> Result<Option<Ticket>> {
        let body: Option<String> = sqlx::query_scalar(
            "SELECT t.body FROM tickets t JOIN attempts a ON a.ticket_id = t.id AND a.attempt = t.attempt \
             WHERE t.id = $1 AND t.attempt = $2 AND a.published_at IS NULL AND a.finished_at IS NULL",
        )
        .bind(ticket.to_string())
        .bind(attempt as i64)
        .fetch_optional(&self.pool)
        .await?;
        body.as_deref().map(ticket_from_json).transpose()
    }

    /// Takes a dead letter out of the dead-letter list and writes its next attempt, with the
    /// job's retry budget counted afresh from it.
    pub async fn replay(&self, ticket: Uuid, now: i64) -> Result<Replay> {
        let mut tx = self.write().await?;
        let tid = ticket.to_string();
        let row =
            sqlx::query("SELECT attempt, body, checkpoint, dead_at FROM tickets WHERE id = $1")
                .bind(&tid)
                .fetch_optional(&mut *tx)
                .await?;
        let Some(row) = row else {
            return Ok(Replay::NotFound);
        };
        if row.try_get::<Option<i64>, _>("dead_at")?.is_none() {
            return Ok(Replay::NotDead);
        }
        let t = rerun(&mut tx, &tid, &row, now).await?;
        sync_run(&mut tx, &tid, None, now).await?;
        tx.commit().await?;
        Ok(Replay::Replayed(Box::new(t)))
    }
}

/// Writes the next attempt of a ticket that ended (`row`: its `attempt`, `body`, `checkpoint`)
/// with a fresh retry budget counted from it, and returns it to publish. The run's status is the
/// caller's to sync.
pub(super) async fn rerun(
    tx: &mut Tx,
    tid: &str,
    row: &sqlx::any::AnyRow,
    now: i64,
) -> Result<Ticket> {
    let made: i64 = row.try_get("attempt")?;
    let t = next_attempt(
        &row.try_get::<String, _>("body")?,
        row.try_get::<Option<String>, _>("checkpoint")?.as_deref(),
        made as u32 + 1,
    )?;
    sqlx::query(
        "UPDATE tickets SET attempt = $1, attempt_base = $2, status = 'dispatched', dead_at = NULL, \
         reason = NULL, body = $3, updated_at = $4 WHERE id = $5",
    )
    .bind(t.attempt as i64)
    .bind(made)
    .bind(ticket_json(&t)?)
    .bind(now)
    .bind(tid)
    .execute(&mut **tx)
    .await?;
    insert_attempt(tx, tid, t.attempt, now).await?;
    Ok(t)
}

/// Records attempt `attempt` of ticket `tid` as dispatched (a rerun's, or a waiting workflow
/// step's first).
pub(super) async fn insert_attempt(tx: &mut Tx, tid: &str, attempt: u32, now: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO attempts (ticket_id, attempt, status, created_at) VALUES ($1, $2, 'dispatched', $3)",
    )
    .bind(tid)
    .bind(attempt as i64)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn open_from_row(r: &sqlx::any::AnyRow) -> Result<OpenAttempt> {
    Ok(OpenAttempt {
        ticket: super::parse_uuid(&r.try_get::<String, _>("ticket_id")?)?,
        attempt: r.try_get::<i64, _>("attempt")? as u32,
        not_before: r.try_get("not_before")?,
        published_at: r.try_get("published_at")?,
        started_at: r.try_get("started_at")?,
        progress_at: r.try_get("heartbeat_at")?,
        timeout_ms: r
            .try_get::<Option<i64>, _>("timeout_ms")?
            .unwrap_or(DEFAULT_TIMEOUT_MS),
        worker: r.try_get("worker")?,
    })
}

/// The ticket's body for its next attempt: the same ticket, the next attempt number, and the
/// last checkpoint any attempt recorded.
fn next_attempt(body: &str, checkpoint: Option<&str>, attempt: u32) -> Result<Ticket> {
    let mut t = ticket_from_json(body)?;
    t.attempt = attempt;
    t.checkpoint = checkpoint
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| StoreError::Corrupt(format!("checkpoint: {e}")))?;
    Ok(t)
}

/// Sets the status (and attempt count) of the run a ticket belongs to from all its item tickets
/// (one ticket at a time: the replay's; a batch of results computes runs in `batch`).
pub(super) async fn sync_run(tx: &mut Tx, tid: &str, error: Option<&str>, now: i64) -> Result<()> {
    let row = sqlx::query("SELECT job_id, scheduled_at FROM tickets WHERE id = $1")
        .bind(tid)
        .fetch_optional(&mut **tx)
        .await?;
    let Some(row) = row else { return Ok(()) };
    let (job, sched): (String, i64) = (row.try_get("job_id")?, row.try_get("scheduled_at")?);
    let items =
        sqlx::query("SELECT status, attempt FROM tickets WHERE job_id = $1 AND scheduled_at = $2")
            .bind(&job)
            .bind(sched)
            .fetch_all(&mut **tx)
            .await?;
    let mut statuses = Vec::with_capacity(items.len());
    let mut attempts = 0i64;
    for i in &items {
        statuses.push(status_of(&i.try_get::<String, _>("status")?)?);
        attempts = attempts.max(i.try_get("attempt")?);
    }
    let status = run_status(&statuses);
    let failed = matches!(status, RunStatus::Failed | RunStatus::Dead);
    sqlx::query(
        "UPDATE runs SET status = $1, attempts = $2, reason = CASE WHEN $3 THEN COALESCE($4, reason) ELSE NULL END, \
         updated_at = $5 WHERE job_id = $6 AND scheduled_at = $7",
    )
    .bind(status.as_str())
    .bind(attempts)
    .bind(failed)
    .bind(error)
    .bind(now)
    .bind(&job)
    .bind(sched)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
