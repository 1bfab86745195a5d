//! The result application as it was before it became set-based (one statement per row, one
//! result after the other), kept as the oracle the batch path is compared with
//! (`results::a_batch_applies_exactly_like_one_result_at_a_time`). Only the tests use it.

use chronoshard_wire::{JobSpec, ResultKind, RunStatus, Ticket, TicketResult};
use sqlx::Row;
use uuid::Uuid;

use super::super::{
    tickets::ticket_json,
    views::{run_status, status_of, ticket_from_json},
    Applied, FollowUp, Result, Store, StoreError, Tx,
};
use crate::shard::retry;

const DEFAULT_TIMEOUT_MS: i64 = 30_000;

/// `Store::apply_results` as it was: one result after the other, in one transaction.
pub(super) async fn apply_results(
    s: &Store,
    results: &[TicketResult],
    now: i64,
) -> Result<Applied> {
    let mut tx = s.write().await?;
    let mut out = Applied::default();
    for r in results {
        apply_one(&mut tx, r, now, &mut out).await?;
    }
    tx.commit().await?;
    Ok(out)
}

async fn apply_one(tx: &mut Tx, r: &TicketResult, now: i64, out: &mut Applied) -> Result<()> {
    let tid = r.ticket_id.to_string();
    let at = r.at.timestamp_millis();
    match r.kind {
        // The watchdog compares these times with the shard's clock, so they are the shard's
        // (the time the report is applied), not the worker's, which may be off.
        ResultKind::Progress => {
            save_checkpoint(tx, r).await?;
            sqlx::query(
                "UPDATE attempts SET heartbeat_at = $1 \
                 WHERE ticket_id = $2 AND attempt = $3 AND finished_at IS NULL",
            )
            .bind(now)
            .bind(&tid)
            .bind(r.attempt as i64)
            .execute(&mut **tx)
            .await?;
            Ok(())
        }
        ResultKind::Started => {
            // A second start of an open attempt is its redelivery to another worker after the
            // first one died: the watchdog's clock starts again with it.
            let n = sqlx::query(
                "UPDATE attempts SET started_at = $1, worker = $2, status = 'running', heartbeat_at = NULL \
                 WHERE ticket_id = $3 AND attempt = $4 AND finished_at IS NULL",
            )
            .bind(now)
            .bind(&r.worker)
            .bind(&tid)
            .bind(r.attempt as i64)
            .execute(&mut **tx)
            .await?
            .rows_affected();
            if n == 0 {
                // A start reported after the end (reports of one attempt can cross) is still
                // worth recording; it changes no status.
                sqlx::query(
                    "UPDATE attempts SET started_at = $1, worker = COALESCE(worker, $2) \
                     WHERE ticket_id = $3 AND attempt = $4 AND started_at IS NULL",
                )
                .bind(at)
                .bind(&r.worker)
                .bind(&tid)
                .bind(r.attempt as i64)
                .execute(&mut **tx)
                .await?;
                return Ok(());
            }
            out.changed += 1;
            let timeout: Option<i64> =
                sqlx::query_scalar("SELECT timeout_ms FROM tickets WHERE id = $1")
                    .bind(&tid)
                    .fetch_optional(&mut **tx)
                    .await?
                    .flatten();
            out.follow_ups.push(FollowUp::Started {
                ticket: r.ticket_id,
                attempt: r.attempt,
                started_at: now,
                timeout_ms: timeout.unwrap_or(DEFAULT_TIMEOUT_MS),
            });
            follow_attempt(tx, &tid, r.attempt, now).await?;
            sync_run(tx, &tid, None, now).await?;
            Ok(())
        }
        ResultKind::Released => {
            // Only the worker the attempt is recorded with can hand it back: a late release
            // must not erase the start of the worker that took the delivery over.
            let n = sqlx::query(
                "UPDATE attempts SET started_at = NULL, worker = NULL, heartbeat_at = NULL, status = 'dispatched' \
                 WHERE ticket_id = $1 AND attempt = $2 AND finished_at IS NULL AND worker = $3",
            )
            .bind(&tid)
            .bind(r.attempt as i64)
            .bind(&r.worker)
            .execute(&mut **tx)
            .await?
            .rows_affected();
            if n > 0 {
                out.changed += 1;
                follow_attempt(tx, &tid, r.attempt, now).await?;
                sync_run(tx, &tid, None, now).await?;
            }
            Ok(())
        }
        ResultKind::Succeeded | ResultKind::Failed => {
            save_checkpoint(tx, r).await?;
            let status = r.kind.as_str();
            let n = sqlx::query(
                "UPDATE attempts SET finished_at = $1, status = $2, worker = $3, error = $4, http_status = $5, \
                 output = $6, published_at = COALESCE(published_at, $7), \
                 started_at = COALESCE(started_at, $10) \
                 WHERE ticket_id = $8 AND attempt = $9 AND finished_at IS NULL",
            )
            .bind(at)
            .bind(status)
            .bind(&r.worker)
            .bind(&r.error)
            .bind(r.http_status.map(i64::from))
            .bind(&r.output)
            .bind(now)
            .bind(&tid)
            .bind(r.attempt as i64)
            .bind(r.started_at.map(|s| s.timestamp_millis()))
            .execute(&mut **tx)
            .await?
            .rows_affected();
            if n == 0 {
                return Ok(());
            }
            out.changed += 1;
            if r.kind == ResultKind::Failed {
                after_failure(tx, r, now, out).await?;
            } else {
                follow_attempt(tx, &tid, r.attempt, now).await?;
            }
            if let Some(job) = sync_run(tx, &tid, r.error.as_deref(), now).await? {
                out.follow_ups.push(FollowUp::RunEnded { job });
            }
            Ok(())
        }
    }
}

/// Keeps a report's checkpoint for the ticket's next attempt. Only the current attempt's count,
/// and only while it is open: a late report of an attempt given up on, or a copy of a final
/// report, must not overwrite what a successor (or a replay) is to receive.
async fn save_checkpoint(tx: &mut Tx, r: &TicketResult) -> Result<()> {
    let Some(checkpoint) = &r.checkpoint else {
        return Ok(());
    };
    sqlx::query(
        "UPDATE tickets SET checkpoint = $1 WHERE id = $2 AND attempt = $3 AND EXISTS \
         (SELECT 1 FROM attempts a WHERE a.ticket_id = tickets.id AND a.attempt = tickets.attempt \
         AND a.finished_at IS NULL)",
    )
    .bind(checkpoint.to_string())
    .bind(r.ticket_id.to_string())
    .bind(r.attempt as i64)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The ticket's body for its next attempt: the same ticket, the next attempt number, and the
/// last checkpoint any attempt recorded.
fn next_attempt(row: &sqlx::any::AnyRow, attempt: u32) -> Result<Ticket> {
    let mut t = ticket_from_json(&row.try_get::<String, _>("body")?)?;
    t.attempt = attempt;
    t.checkpoint = row
        .try_get::<Option<String>, _>("checkpoint")?
        .map(|c| serde_json::from_str(&c))
        .transpose()
        .map_err(|e| StoreError::Corrupt(format!("checkpoint: {e}")))?;
    Ok(t)
}

/// The ticket takes its current attempt's status.
async fn follow_attempt(tx: &mut Tx, tid: &str, attempt: u32, now: i64) -> Result<()> {
    sqlx::query(
        "UPDATE tickets SET status = (SELECT status FROM attempts a WHERE a.ticket_id = tickets.id \
         AND a.attempt = tickets.attempt), updated_at = $1 WHERE id = $2 AND attempt = $3",
    )
    .bind(now)
    .bind(tid)
    .bind(attempt as i64)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A failed current attempt: write the next one if the retry policy allows, else the ticket is a
/// dead letter. A failure of an attempt that is no longer current (replaced, or lost and retried
/// already) changes only that attempt. Tickets of a deleted job are not retried.
async fn after_failure(tx: &mut Tx, r: &TicketResult, now: i64, out: &mut Applied) -> Result<()> {
    let tid = r.ticket_id.to_string();
    let row = sqlx::query(
        "SELECT t.attempt, t.attempt_base, t.body, t.checkpoint, j.spec, j.state FROM tickets t \
         LEFT JOIN jobs j ON j.id = t.job_id WHERE t.id = $1",
    )
    .bind(&tid)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(row) = row else { return Ok(()) };
    let current: i64 = row.try_get("attempt")?;
    if current != r.attempt as i64 {
        return Ok(());
    }
    let base: i64 = row.try_get("attempt_base")?;
    let state: Option<String> = row.try_get("state")?;
    let spec: Option<String> = row.try_get("spec")?;
    let spec: Option<JobSpec> = spec
        .map(|s| serde_json::from_str(&s))
        .transpose()
        .map_err(|e| StoreError::Corrupt(format!("job spec: {e}")))?;
    let made = (current - base).max(1) as u32;
    match (spec, state.as_deref()) {
        (Some(spec), Some(state)) if state != "deleted" => {
            if !r.permanent && retry::allows_another(&spec.retry, made) {
                let delay =
                    retry::delay(&spec.retry, made, retry::jitter_of(r.ticket_id, r.attempt));
                let at = now + delay.as_millis() as i64;
                let t = next_attempt(&row, r.attempt + 1)?;
                sqlx::query(
                    "INSERT INTO attempts (ticket_id, attempt, status, created_at, not_before) \
                     VALUES ($1, $2, 'retrying', $3, $4) ON CONFLICT DO NOTHING",
                )
                .bind(&tid)
                .bind(t.attempt as i64)
                .bind(now)
                .bind(at)
                .execute(&mut **tx)
                .await?;
                sqlx::query(
                    "UPDATE tickets SET attempt = $1, status = 'retrying', body = $2, updated_at = $3 WHERE id = $4",
                )
                .bind(t.attempt as i64)
                .bind(ticket_json(&t)?)
                .bind(now)
                .bind(&tid)
                .execute(&mut **tx)
                .await?;
                out.follow_ups.push(FollowUp::Retry {
                    ticket: r.ticket_id,
                    attempt: t.attempt,
                    at,
                });
            } else {
                sqlx::query(
                    "UPDATE tickets SET status = 'dead', dead_at = $1, updated_at = $2 WHERE id = $3",
                )
                .bind(now)
                .bind(now)
                .bind(&tid)
                .execute(&mut **tx)
                .await?;
                out.dead += 1;
            }
        }
        _ => follow_attempt(tx, &tid, r.attempt, now).await?,
    }
    Ok(())
}

/// Sets the status (and attempt count) of the run a ticket belongs to from all its item tickets.
/// Returns the job when the run has ended.
async fn sync_run(tx: &mut Tx, tid: &str, error: Option<&str>, now: i64) -> Result<Option<Uuid>> {
    let row = sqlx::query("SELECT job_id, scheduled_at FROM tickets WHERE id = $1")
        .bind(tid)
        .fetch_optional(&mut **tx)
        .await?;
    let Some(row) = row else { return Ok(None) };
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
    if status.is_final() {
        Ok(Some(super::parse_uuid(&job)?))
    } else {
        Ok(None)
    }
}
