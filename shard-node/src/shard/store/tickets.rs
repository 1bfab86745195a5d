//! Occurrences, tickets and attempts: the fire transaction (the outbox write), publish marks,
//! worker results, and the run and ticket views.

use std::collections::BTreeMap;

use chronoshard_wire::{
    from_millis, AttemptView, ResultKind, RunStatus, RunView, Ticket, TicketResult, TicketView,
};
use sqlx::Row;
use uuid::Uuid;

use super::{parse_uuid, Result, Store, StoreError};

/// A missed or skipped occurrence, or a range of consecutive ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotFiredRow {
    pub first: i64,
    pub last: i64,
    pub count: u64,
    pub status: RunStatus,
    pub reason: String,
}

/// What one fire transaction did for one job.
#[derive(Debug, Default)]
pub struct FireOutcome {
    /// The job's next occurrence was not the one the caller fired: the wheel entry was stale and
    /// nothing was written.
    pub stale: bool,
    /// Tickets written, to be published.
    pub tickets: Vec<Ticket>,
}

fn status_of(s: &str) -> Result<RunStatus> {
    RunStatus::parse(s).ok_or_else(|| StoreError::Corrupt(format!("status {s:?}")))
}

fn ticket_json(t: &Ticket) -> Result<String> {
    serde_json::to_string(t).map_err(|e| StoreError::Corrupt(e.to_string()))
}

impl Store {
    /// Records occurrences of one job in one transaction: moves the job's next occurrence from
    /// `expected_next` to `next_fire_at` (only if it still is `expected_next`: a stale wheel entry
    /// changes nothing), records not-fired occurrences, and writes a run, tickets and first attempts
    /// for each fired one. With `expected_next` None (trigger now) the job row is left alone.
    /// An occurrence that already has a run row is not ticketed again.
    pub async fn fire(
        &self,
        job_id: Uuid,
        expected_next: Option<i64>,
        next_fire_at: Option<i64>,
        not_fired: &[NotFiredRow],
        tickets: Vec<Ticket>,
        now: i64,
    ) -> Result<FireOutcome> {
        let mut tx = self.write().await?;
        let id = job_id.to_string();
        if let Some(expected) = expected_next {
            let state = if next_fire_at.is_some() {
                "active"
            } else {
                "completed"
            };
            let n = sqlx::query(
                "UPDATE jobs SET next_fire_at = ?, state = ?, updated_at = ? \
                 WHERE id = ? AND next_fire_at = ? AND state = 'active'",
            )
            .bind(next_fire_at)
            .bind(state)
            .bind(now)
            .bind(&id)
            .bind(expected)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 0 {
                return Ok(FireOutcome {
                    stale: true,
                    tickets: Vec::new(),
                });
            }
        }
        for nf in not_fired {
            let ranged = nf.count > 1;
            sqlx::query(
                "INSERT INTO runs (job_id, scheduled_at, status, reason, attempts, range_end, count, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, 0, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            )
            .bind(&id)
            .bind(nf.first)
            .bind(nf.status.as_str())
            .bind(&nf.reason)
            .bind(ranged.then_some(nf.last))
            .bind(ranged.then_some(nf.count as i64))
            .bind(now)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        let mut written = Vec::with_capacity(tickets.len());
        let mut occurrence_ok: BTreeMap<i64, bool> = BTreeMap::new();
        for t in tickets {
            let at = t.scheduled_at.timestamp_millis();
            let ok = match occurrence_ok.get(&at) {
                Some(ok) => *ok,
                None => {
                    let n = sqlx::query(
                        "INSERT INTO runs (job_id, scheduled_at, status, attempts, created_at, updated_at) \
                         VALUES (?, ?, 'dispatched', 1, ?, ?) ON CONFLICT DO NOTHING",
                    )
                    .bind(&id)
                    .bind(at)
                    .bind(now)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    occurrence_ok.insert(at, n == 1);
                    n == 1
                }
            };
            if !ok {
                continue;
            }
            let tid = t.ticket_id.to_string();
            sqlx::query(
                "INSERT INTO tickets (id, job_id, scheduled_at, item, status, attempt, epoch, queue, body, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, 'dispatched', ?, ?, ?, ?, ?, ?)",
            )
            .bind(&tid)
            .bind(&id)
            .bind(at)
            .bind(t.item as i64)
            .bind(t.attempt as i64)
            .bind(t.epoch as i64)
            .bind(&t.queue)
            .bind(ticket_json(&t)?)
            .bind(now)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query("INSERT INTO attempts (ticket_id, attempt, status, created_at) VALUES (?, ?, 'dispatched', ?)")
                .bind(&tid)
                .bind(t.attempt as i64)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            written.push(t);
        }
        tx.commit().await?;
        Ok(FireOutcome {
            stale: false,
            tickets: written,
        })
    }

    /// Marks attempts as acknowledged by JetStream.
    pub async fn mark_published(&self, acked: &[(Uuid, u32)], now: i64) -> Result<()> {
        if acked.is_empty() {
            return Ok(());
        }
        let mut tx = self.write().await?;
        for (ticket, attempt) in acked {
            sqlx::query("UPDATE attempts SET published_at = ? WHERE ticket_id = ? AND attempt = ? AND published_at IS NULL")
                .bind(now)
                .bind(ticket.to_string())
                .bind(*attempt as i64)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Tickets whose current attempt was written before `before` and never acknowledged by
    /// JetStream: the outbox to publish again after a crash or a failed publish.
    pub async fn unpublished(&self, before: i64, limit: u32) -> Result<Vec<Ticket>> {
        let rows = sqlx::query(
            "SELECT t.body FROM attempts a JOIN tickets t ON t.id = a.ticket_id AND t.attempt = a.attempt \
             WHERE a.published_at IS NULL AND a.created_at < ? AND a.finished_at IS NULL \
             ORDER BY a.created_at LIMIT ?",
        )
        .bind(before)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let body: String = r.try_get("body")?;
                serde_json::from_str(&body)
                    .map_err(|e| StoreError::Corrupt(format!("ticket body: {e}")))
            })
            .collect()
    }

    /// Applies worker results in one transaction. A result for an attempt that already has it
    /// (re-sent, redelivered) changes nothing. Returns how many results changed something.
    pub async fn apply_results(&self, results: &[TicketResult], now: i64) -> Result<usize> {
        let mut tx = self.write().await?;
        let mut applied = 0;
        for r in results {
            let tid = r.ticket_id.to_string();
            let at = r.at.timestamp_millis();
            let n = match r.kind {
                ResultKind::Started => sqlx::query(
                    "UPDATE attempts SET started_at = ?, worker = ?, \
                     status = CASE WHEN finished_at IS NULL THEN 'running' ELSE status END \
                     WHERE ticket_id = ? AND attempt = ? AND started_at IS NULL",
                )
                .bind(at)
                .bind(&r.worker)
                .bind(&tid)
                .bind(r.attempt as i64)
                .execute(&mut *tx)
                .await?
                .rows_affected(),
                ResultKind::Succeeded | ResultKind::Failed => {
                    let status = if r.kind == ResultKind::Succeeded {
                        "succeeded"
                    } else {
                        "failed"
                    };
                    sqlx::query(
                        "UPDATE attempts SET finished_at = ?, status = ?, worker = ?, error = ?, http_status = ?, \
                         published_at = COALESCE(published_at, ?) \
                         WHERE ticket_id = ? AND attempt = ? AND finished_at IS NULL",
                    )
                    .bind(at)
                    .bind(status)
                    .bind(&r.worker)
                    .bind(&r.error)
                    .bind(r.http_status.map(i64::from))
                    .bind(now)
                    .bind(&tid)
                    .bind(r.attempt as i64)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected()
                }
            };
            if n == 0 {
                continue;
            }
            applied += 1;
            // The ticket follows its current attempt; the run follows all its tickets.
            sqlx::query(
                "UPDATE tickets SET status = (SELECT status FROM attempts a WHERE a.ticket_id = tickets.id \
                 AND a.attempt = tickets.attempt), updated_at = ? WHERE id = ? AND attempt = ?",
            )
            .bind(now)
            .bind(&tid)
            .bind(r.attempt as i64)
            .execute(&mut *tx)
            .await?;
            let row = sqlx::query("SELECT job_id, scheduled_at FROM tickets WHERE id = ?")
                .bind(&tid)
                .fetch_optional(&mut *tx)
                .await?;
            let Some(row) = row else { continue };
            let (job, sched): (String, i64) =
                (row.try_get("job_id")?, row.try_get("scheduled_at")?);
            let statuses: Vec<String> = sqlx::query_scalar(
                "SELECT status FROM tickets WHERE job_id = ? AND scheduled_at = ?",
            )
            .bind(&job)
            .bind(sched)
            .fetch_all(&mut *tx)
            .await?;
            let statuses = statuses
                .iter()
                .map(|s| status_of(s))
                .collect::<Result<Vec<_>>>()?;
            sqlx::query(
                "UPDATE runs SET status = ?, updated_at = ? WHERE job_id = ? AND scheduled_at = ?",
            )
            .bind(run_status(&statuses).as_str())
            .bind(now)
            .bind(&job)
            .bind(sched)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(applied)
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
             WHERE job_id = ? AND scheduled_at < ? ORDER BY scheduled_at DESC LIMIT ?",
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
            "SELECT id, scheduled_at FROM tickets WHERE job_id = ? AND scheduled_at BETWEEN ? AND ? ORDER BY item",
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
                })
            })
            .collect()
    }

    /// One ticket with all its attempts.
    pub async fn ticket(&self, ticket_id: Uuid) -> Result<Option<TicketView>> {
        let tid = ticket_id.to_string();
        let Some(row) = sqlx::query("SELECT body, status, epoch FROM tickets WHERE id = ?")
            .bind(&tid)
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        let body: String = row.try_get("body")?;
        let t: Ticket = serde_json::from_str(&body)
            .map_err(|e| StoreError::Corrupt(format!("ticket body: {e}")))?;
        let ms = |r: &sqlx::sqlite::SqliteRow,
                  c: &str|
         -> Result<Option<chrono::DateTime<chrono::Utc>>> {
            Ok(r.try_get::<Option<i64>, _>(c)?.map(from_millis))
        };
        let attempts = sqlx::query(
            "SELECT attempt, status, created_at, published_at, started_at, finished_at, worker, error, http_status \
             FROM attempts WHERE ticket_id = ? ORDER BY attempt",
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
                worker: r.try_get("worker")?,
                error: r.try_get("error")?,
                http_status: r.try_get::<Option<i64>, _>("http_status")?.map(|s| s as u16),
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
            trace_id: t.trace_id,
            attempts,
        }))
    }
}

/// The status of an occurrence from the statuses of its item tickets: running while any item runs,
/// succeeded when all did, failed when all ended and one failed.
pub fn run_status(items: &[RunStatus]) -> RunStatus {
    if items.iter().any(|s| !s.is_final()) {
        if items.contains(&RunStatus::Running) {
            RunStatus::Running
        } else if items.contains(&RunStatus::Retrying) {
            RunStatus::Retrying
        } else {
            RunStatus::Dispatched
        }
    } else if items
        .iter()
        .any(|s| matches!(s, RunStatus::Failed | RunStatus::Dead))
    {
        if items.contains(&RunStatus::Dead) {
            RunStatus::Dead
        } else {
            RunStatus::Failed
        }
    } else {
        RunStatus::Succeeded
    }
}
