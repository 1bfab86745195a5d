//! The rows a batch of results reads and writes, and the few statements that move them: one
//! read per table for the whole batch (tickets with every item of their occurrences, attempts,
//! and for failures the retry policy), and one multi-row statement per table and chunk for what
//! changed. Every statement is a round trip (to SQLite's worker thread, or over the network to
//! Postgres); one per row was most of a result's cost.
//!
//! It decides nothing: `batch` applies the rules to these rows. Writes go by primary key and
//! carry the rows' new values, which is right only because the caller's transaction has held the
//! shard's write lock since before the read.

use std::collections::HashMap;

use sqlx::Row;
use uuid::Uuid;

use super::super::{json_rows, json_rows_of, parse_uuid, rows_per_statement, Params, Result, Tx};

/// Ids per `IN (…)` list.
const ID_CHUNK: usize = 256;

/// A ticket of the batch, or another item of one of their occurrences.
#[derive(Debug)]
pub(super) struct TicketRow {
    pub job_id: String,
    pub scheduled_at: i64,
    pub status: String,
    pub attempt: i64,
    pub timeout_ms: Option<i64>,
    /// The run's reason as read.
    pub run_reason: Option<String>,
    /// The job holds a buffered occurrence.
    pub buffered: bool,
    /// Set by this batch (else the stored value stays): checkpoint, dead letter time, body.
    pub checkpoint: Option<String>,
    pub dead_at: Option<i64>,
    pub body: Option<String>,
    /// `updated_at` becomes the batch's `now`.
    pub touched: bool,
    pub dirty: bool,
}

/// What a failure needs beyond `TicketRow`: read only for tickets with a failure in the batch.
#[derive(Debug)]
pub(super) struct FailureRow {
    pub attempt_base: i64,
    pub body: String,
    pub checkpoint: Option<String>,
    pub spec: Option<String>,
    pub state: Option<String>,
}

/// An attempt of a ticket of the batch (every column a result may change).
#[derive(Debug, Default)]
pub(super) struct AttemptRow {
    pub status: String,
    pub published_at: Option<i64>,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub worker: Option<String>,
    pub error: Option<String>,
    pub http_status: Option<i64>,
    pub output: Option<String>,
    pub heartbeat_at: Option<i64>,
    /// Written by this batch (a retry), to be inserted: `created_at` is `now`, with this
    /// `not_before`.
    pub inserted: Option<Option<i64>>,
    pub dirty: bool,
}

/// The new state of a run (occurrence).
#[derive(Debug)]
pub(super) struct RunRow {
    pub status: &'static str,
    pub attempts: i64,
    pub reason: Option<String>,
}

/// Occurrences are keyed by job id (as stored) and scheduled time.
pub(super) type Occurrence = (String, i64);

/// The tickets `ids` and every item ticket of their occurrences, by id.
pub(super) async fn read_tickets(tx: &mut Tx, ids: &[String]) -> Result<HashMap<Uuid, TicketRow>> {
    let mut out = HashMap::new();
    for chunk in ids.chunks(ID_CHUNK) {
        let sql = format!(
            "SELECT {} \
             FROM tickets t JOIN tickets i ON i.job_id = t.job_id AND i.scheduled_at = t.scheduled_at \
             LEFT JOIN runs r ON r.job_id = i.job_id AND r.scheduled_at = i.scheduled_at \
             LEFT JOIN jobs j ON j.id = i.job_id WHERE t.id IN ({})",
            json_rows_of(tx, "i.id, i.job_id, i.scheduled_at, i.status, i.attempt, i.timeout_ms, r.reason, j.buffered_at"),
            Params::new(tx).list(chunk.len())
        );
        let mut q = sqlx::query_scalar::<_, String>(&sql);
        for id in chunk {
            q = q.bind(id);
        }
        type Columns = (
            String,
            String,
            i64,
            String,
            i64,
            Option<i64>,
            Option<String>,
            Option<i64>,
        );
        let rows = q.fetch_one(&mut **tx).await?;
        for (id, job_id, scheduled_at, status, attempt, timeout_ms, run_reason, buffered_at) in
            json_rows::<Columns>(&rows)?
        {
            let id = parse_uuid(&id)?;
            if out.contains_key(&id) {
                // an item of an occurrence two tickets of the batch belong to
                continue;
            }
            out.insert(
                id,
                TicketRow {
                    job_id,
                    scheduled_at,
                    status,
                    attempt,
                    timeout_ms,
                    run_reason,
                    buffered: buffered_at.is_some(),
                    checkpoint: None,
                    dead_at: None,
                    body: None,
                    touched: false,
                    dirty: false,
                },
            );
        }
    }
    Ok(out)
}

/// Every attempt of the tickets `ids`.
pub(super) async fn read_attempts(
    tx: &mut Tx,
    ids: &[String],
) -> Result<HashMap<(Uuid, i64), AttemptRow>> {
    let mut out = HashMap::new();
    for chunk in ids.chunks(ID_CHUNK) {
        let sql = format!(
            "SELECT {} FROM attempts WHERE ticket_id IN ({})",
            json_rows_of(
                tx,
                "ticket_id, attempt, status, published_at, started_at, finished_at, worker, error, \
                 http_status, output, heartbeat_at"
            ),
            Params::new(tx).list(chunk.len())
        );
        let mut q = sqlx::query_scalar::<_, String>(&sql);
        for id in chunk {
            q = q.bind(id);
        }
        type Columns = (
            String,
            i64,
            String,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<String>,
            Option<String>,
            Option<i64>,
            Option<String>,
            Option<i64>,
        );
        let rows = q.fetch_one(&mut **tx).await?;
        for c in json_rows::<Columns>(&rows)? {
            out.insert(
                (parse_uuid(&c.0)?, c.1),
                AttemptRow {
                    status: c.2,
                    published_at: c.3,
                    started_at: c.4,
                    finished_at: c.5,
                    worker: c.6,
                    error: c.7,
                    http_status: c.8,
                    output: c.9,
                    heartbeat_at: c.10,
                    inserted: None,
                    dirty: false,
                },
            );
        }
    }
    Ok(out)
}

/// The retry state of the tickets `ids` and their jobs.
pub(super) async fn read_failures(
    tx: &mut Tx,
    ids: &[String],
) -> Result<HashMap<Uuid, FailureRow>> {
    let mut out = HashMap::new();
    for chunk in ids.chunks(ID_CHUNK) {
        let sql = format!(
            "SELECT t.id, t.attempt_base, t.body, t.checkpoint, j.spec, j.state FROM tickets t \
             LEFT JOIN jobs j ON j.id = t.job_id WHERE t.id IN ({})",
            Params::new(tx).list(chunk.len())
        );
        let mut q = sqlx::query(&sql);
        for id in chunk {
            q = q.bind(id);
        }
        for r in q.fetch_all(&mut **tx).await? {
            out.insert(
                parse_uuid(&r.try_get::<String, _>(0)?)?,
                FailureRow {
                    attempt_base: r.try_get(1)?,
                    body: r.try_get(2)?,
                    checkpoint: r.try_get(3)?,
                    spec: r.try_get(4)?,
                    state: r.try_get(5)?,
                },
            );
        }
    }
    Ok(out)
}

/// Inserts the attempts written by this batch (none exists: all of their tickets' attempts were
/// read), with every column as the batch left it.
pub(super) async fn insert_attempts(
    tx: &mut Tx,
    rows: &[((Uuid, i64), &AttemptRow)],
    now: i64,
) -> Result<()> {
    for chunk in rows.chunks(rows_per_statement(13)) {
        let sql = format!(
            "INSERT INTO attempts (ticket_id, attempt, status, created_at, not_before, published_at, \
             started_at, finished_at, worker, error, http_status, output, heartbeat_at) VALUES {} \
             ON CONFLICT DO NOTHING",
            Params::new(tx).rows(chunk.len(), 13)
        );
        let mut q = sqlx::query(&sql);
        for ((ticket, attempt), a) in chunk {
            q = q
                .bind(ticket.to_string())
                .bind(*attempt)
                .bind(a.status.as_str())
                .bind(now)
                .bind(a.inserted.flatten())
                .bind(a.published_at)
                .bind(a.started_at)
                .bind(a.finished_at)
                .bind(a.worker.as_deref())
                .bind(a.error.as_deref())
                .bind(a.http_status)
                .bind(a.output.as_deref())
                .bind(a.heartbeat_at);
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Writes changed attempts.
pub(super) async fn update_attempts(
    tx: &mut Tx,
    rows: &[((Uuid, i64), &AttemptRow)],
) -> Result<()> {
    for chunk in rows.chunks(rows_per_statement(11)) {
        // VALUES columns are `column1..n` on both backends.
        let sql = format!(
            "UPDATE attempts SET status = v.column3, published_at = v.column4, started_at = v.column5, \
             finished_at = v.column6, worker = v.column7, error = v.column8, http_status = v.column9, \
             output = v.column10, heartbeat_at = v.column11 FROM (VALUES {}) AS v \
             WHERE attempts.ticket_id = v.column1 AND attempts.attempt = v.column2",
            Params::new(tx).rows(chunk.len(), 11)
        );
        let mut q = sqlx::query(&sql);
        for ((ticket, attempt), a) in chunk {
            q = q
                .bind(ticket.to_string())
                .bind(*attempt)
                .bind(a.status.as_str())
                .bind(a.published_at)
                .bind(a.started_at)
                .bind(a.finished_at)
                .bind(a.worker.as_deref())
                .bind(a.error.as_deref())
                .bind(a.http_status)
                .bind(a.output.as_deref())
                .bind(a.heartbeat_at);
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Writes changed tickets: status and attempt, and what the batch set of checkpoint, dead
/// letter time, body and update time (the rest keeps its stored value).
pub(super) async fn update_tickets(
    tx: &mut Tx,
    rows: &[(Uuid, &TicketRow)],
    now: i64,
) -> Result<()> {
    for chunk in rows.chunks(rows_per_statement(7)) {
        let sql = format!(
            "UPDATE tickets SET status = v.column2, attempt = v.column3, \
             checkpoint = COALESCE(v.column4, tickets.checkpoint), dead_at = COALESCE(v.column5, tickets.dead_at), \
             body = COALESCE(v.column6, tickets.body), updated_at = COALESCE(v.column7, tickets.updated_at) \
             FROM (VALUES {}) AS v WHERE tickets.id = v.column1",
            Params::new(tx).rows(chunk.len(), 7)
        );
        let mut q = sqlx::query(&sql);
        for (id, t) in chunk {
            q = q
                .bind(id.to_string())
                .bind(t.status.as_str())
                .bind(t.attempt)
                .bind(t.checkpoint.as_deref())
                .bind(t.dead_at)
                .bind(t.body.as_deref())
                .bind(t.touched.then_some(now));
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Writes the new state of runs (an occurrence without a run row has none to write).
pub(super) async fn update_runs(
    tx: &mut Tx,
    rows: &[(&Occurrence, &RunRow)],
    now: i64,
) -> Result<()> {
    for chunk in rows.chunks(rows_per_statement(5)) {
        let mut p = Params::new(tx);
        let sql = format!(
            "UPDATE runs SET status = v.column3, attempts = v.column4, reason = v.column5, updated_at = {} \
             FROM (VALUES {}) AS v WHERE runs.job_id = v.column1 AND runs.scheduled_at = v.column2",
            p.one(),
            p.rows(chunk.len(), 5)
        );
        let mut q = sqlx::query(&sql).bind(now);
        for ((job, at), r) in chunk {
            q = q
                .bind(job.as_str())
                .bind(*at)
                .bind(r.status)
                .bind(r.attempts)
                .bind(r.reason.as_deref());
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}
