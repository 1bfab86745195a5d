//! What the API reads about occurrences and tickets: a job's runs, one ticket with its attempts,
//! dead letters, and the rule that derives an occurrence's status from its items.

use std::collections::BTreeMap;

use chronoshard_wire::{
    from_millis, AttemptView, DeadLetter, RunStatus, RunView, Ticket, TicketView,
};
use sqlx::Row;
use uuid::Uuid;

use super::{parse_uuid, Result, Store, StoreError};

pub(super) fn status_of(s: &str) -> Result<RunStatus> {
    RunStatus::parse(s).ok_or_else(|| StoreError::Corrupt(format!("status {s:?}")))
}

pub(super) fn ticket_from_json(body: &str) -> Result<Ticket> {
    serde_json::from_str(body).map_err(|e| StoreError::Corrupt(format!("ticket body: {e}")))
}

impl Store {
    /// Dead letters, newest first, strictly older than the cursor `(dead_at, ticket id)`,
    /// optionally one tenant's.
    pub async fn dead_letters(
        &self,
        tenant: Option<&str>,
        before: Option<(i64, Uuid)>,
        limit: u32,
    ) -> Result<Vec<DeadLetter>> {
        let (before_at, before_id) = match before {
            Some((at, id)) => (at, id.to_string()),
            None => (i64::MAX, String::new()),
        };
        let rows = sqlx::query(
            "SELECT t.id, t.body, t.attempt, t.dead_at, a.error FROM tickets t \
             LEFT JOIN attempts a ON a.ticket_id = t.id AND a.attempt = t.attempt \
             WHERE t.dead_at IS NOT NULL AND (t.dead_at < $1 OR (t.dead_at = $2 AND ($3 = '' OR t.id < $4))) \
             AND ($5 IS NULL OR t.job_id IN (SELECT id FROM jobs WHERE tenant = $6)) \
             ORDER BY t.dead_at DESC, t.id DESC LIMIT $7",
        )
        .bind(before_at)
        .bind(before_at)
        .bind(&before_id)
        .bind(&before_id)
        .bind(tenant)
        .bind(tenant)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let t = ticket_from_json(&r.try_get::<String, _>("body")?)?;
                Ok(DeadLetter {
                    ticket_id: t.ticket_id,
                    job_id: t.job_id,
                    tenant: t.tenant,
                    shard: t.shard,
                    scheduled_at: t.scheduled_at,
                    item: t.item,
                    queue: t.queue,
                    attempts: r.try_get::<i64, _>("attempt")? as u32,
                    error: r.try_get("error")?,
                    dead_at: from_millis(r.try_get("dead_at")?),
                })
            })
            .collect()
    }

    /// Runs of a job, newest first, strictly before `before` when given.
    pub async fn runs(
        &self,
        job_id: Uuid,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<RunView>> {
        let id = job_id.to_string();
        let rows = sqlx::query(
            "SELECT scheduled_at, status, reason, attempts, range_end, count, updated_at FROM runs \
             WHERE job_id = $1 AND scheduled_at < $2 ORDER BY scheduled_at DESC LIMIT $3",
        )
        .bind(&id)
        .bind(before.unwrap_or(i64::MAX))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        let (Some(newest), Some(oldest)) = (rows.first(), rows.last()) else {
            return Ok(Vec::new());
        };
        let (hi, lo): (i64, i64) = (
            newest.try_get("scheduled_at")?,
            oldest.try_get("scheduled_at")?,
        );
        let mut ids: BTreeMap<i64, Vec<Uuid>> = BTreeMap::new();
        for r in sqlx::query(
            "SELECT id, scheduled_at FROM tickets WHERE job_id = $1 AND scheduled_at BETWEEN $2 AND $3 ORDER BY item",
        )
        .bind(&id)
        .bind(lo)
        .bind(hi)
        .fetch_all(&self.pool)
        .await?
        {
            ids.entry(r.try_get("scheduled_at")?).or_default().push(parse_uuid(&r.try_get::<String, _>("id")?)?);
        }
        rows.iter()
            .map(|r| {
                let at: i64 = r.try_get("scheduled_at")?;
                Ok(RunView {
                    job_id,
                    scheduled_at: from_millis(at),
                    status: status_of(&r.try_get::<String, _>("status")?)?,
                    reason: r.try_get("reason")?,
                    attempts: r.try_get::<i64, _>("attempts")? as u32,
                    ticket_ids: ids.remove(&at).unwrap_or_default(),
                    range_end: r.try_get::<Option<i64>, _>("range_end")?.map(from_millis),
                    count: r.try_get::<Option<i64>, _>("count")?.map(|c| c as u64),
                    updated_at: from_millis(r.try_get("updated_at")?),
                    warnings: Vec::new(),
                })
            })
            .collect()
    }

    /// One ticket with all its attempts.
    pub async fn ticket(&self, ticket_id: Uuid) -> Result<Option<TicketView>> {
        let tid = ticket_id.to_string();
        let Some(row) = sqlx::query(
            "SELECT body, status, epoch, checkpoint, reason FROM tickets WHERE id = $1",
        )
        .bind(&tid)
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        let body: String = row.try_get("body")?;
        let t: Ticket = ticket_from_json(&body)?;
        let ms =
            |r: &sqlx::any::AnyRow, c: &str| -> Result<Option<chrono::DateTime<chrono::Utc>>> {
                Ok(r.try_get::<Option<i64>, _>(c)?.map(from_millis))
            };
        let attempts = sqlx::query(
            "SELECT attempt, status, created_at, published_at, started_at, finished_at, worker, error, http_status, \
             output, heartbeat_at FROM attempts WHERE ticket_id = $1 ORDER BY attempt",
        )
        .bind(&tid)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| {
            Ok(AttemptView {
                attempt: r.try_get::<i64, _>("attempt")? as u32,
                status: status_of(&r.try_get::<String, _>("status")?)?,
                created_at: from_millis(r.try_get("created_at")?),
                published_at: ms(r, "published_at")?,
                started_at: ms(r, "started_at")?,
                finished_at: ms(r, "finished_at")?,
                progress_at: ms(r, "heartbeat_at")?,
                worker: r.try_get("worker")?,
                error: r.try_get("error")?,
                http_status: r.try_get::<Option<i64>, _>("http_status")?.map(|s| s as u16),
                output: r.try_get("output")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
        Ok(Some(TicketView {
            ticket_id,
            job_id: t.job_id,
            tenant: t.tenant,
            shard: t.shard,
            epoch: row.try_get::<i64, _>("epoch")? as u64,
            scheduled_at: t.scheduled_at,
            item: t.item,
            queue: t.queue,
            status: status_of(&row.try_get::<String, _>("status")?)?,
            reason: row.try_get("reason")?,
            trace_id: t.trace_id,
            checkpoint: row
                .try_get::<Option<String>, _>("checkpoint")?
                .and_then(|c| serde_json::from_str(&c).ok()),
            attempts,
        }))
    }
}

/// The status of an occurrence from the statuses of its item tickets: running while any item runs,
/// succeeded when all did; once all ended, dead, failed or cancelled when one was, and failed
/// when a workflow's step was skipped (a step it depended on failed, and was replayed since).
pub fn run_status(items: &[RunStatus]) -> RunStatus {
    if items.iter().any(|s| !s.is_final()) {
        if items.contains(&RunStatus::Running) {
            RunStatus::Running
        } else if items.contains(&RunStatus::Retrying) {
            RunStatus::Retrying
        } else {
            RunStatus::Dispatched
        }
    } else if items.contains(&RunStatus::Dead) {
        RunStatus::Dead
    } else if items.contains(&RunStatus::Failed) {
        RunStatus::Failed
    } else if items.contains(&RunStatus::Cancelled) {
        RunStatus::Cancelled
    } else if items.contains(&RunStatus::Skipped) {
        RunStatus::Failed
    } else {
        RunStatus::Succeeded
    }
}
