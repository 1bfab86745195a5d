//! The rows a batch of results reads and writes, and the few statements that move them: one
//! read per table for the whole batch (tickets with every item of their occurrences, attempts,
//! and for failures the retry policy), each returning its rows as one JSON value, and one
//! multi-row statement per table and chunk for what changed. Every statement is a round trip (to
//! SQLite's worker thread, or over the network to Postgres) when run on its own, as `read` and
//! `write` do; on SQLite the caller pushes all the reads into one string and all the writes into
//! another (`Read::push`, `Write::push`), two trips in all.
//!
//! It decides nothing: `batch` applies the rules to these rows. Writes go by primary key and
//! carry the rows' new values, which is right only because the caller's transaction has held the
//! shard's write lock since before the read.

use std::collections::HashMap;

use sqlx::{any::AnyRow, Row};
use uuid::Uuid;

use super::super::{
    json_rows, parse_uuid,
    sql::{rows_per_statement, Sql},
    JobKind, Result, Tx,
};

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
    /// The job is a workflow: the end of this ticket (a step) may let others run.
    pub workflow: bool,
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

/// What a batch read: its tickets with every item ticket of their occurrences, their attempts,
/// and the retry state of the tickets with a failure.
#[derive(Debug, Default)]
pub(super) struct Fetched {
    pub tickets: HashMap<Uuid, TicketRow>,
    pub attempts: HashMap<(Uuid, i64), AttemptRow>,
    pub failures: HashMap<Uuid, FailureRow>,
}

#[derive(Clone, Copy, Debug)]
enum Table {
    Tickets,
    Attempts,
    Failures,
}

/// One read statement: a table's rows for a chunk of ticket ids, as one JSON value in one row.
#[derive(Clone, Copy, Debug)]
pub(super) struct Read<'a> {
    table: Table,
    ids: &'a [String],
}

/// The reads of a batch of the tickets `ids`, of which `failing` have a failure in it.
pub(super) fn reads<'a>(ids: &'a [String], failing: &'a [String]) -> Vec<Read<'a>> {
    let chunks = |table, ids: &'a [String]| {
        ids.chunks(ID_CHUNK)
            .map(move |ids| Read { table, ids })
            .collect::<Vec<_>>()
    };
    let mut out = chunks(Table::Tickets, ids);
    out.extend(chunks(Table::Attempts, ids));
    out.extend(chunks(Table::Failures, failing));
    out
}

/// Runs `reads` one statement each, in `tx`.
pub(super) async fn read(tx: &mut Tx, reads: &[Read<'_>]) -> Result<Fetched> {
    let mut out = Fetched::default();
    for r in reads {
        let mut sql = Sql::new(tx);
        r.push(&mut sql);
        let (text, args) = sql.build();
        let row = sqlx::query_with(&text, args).fetch_one(&mut **tx).await?;
        r.parse(&row, &mut out)?;
    }
    Ok(out)
}

impl<'a> Read<'a> {
    /// Pushes this read as a statement of its own.
    pub fn push(&self, sql: &mut Sql<'a>) {
        let (cols, from) = match self.table {
            Table::Tickets => (
                "i.id, i.job_id, i.scheduled_at, i.status, i.attempt, i.timeout_ms, r.reason, \
                 j.buffered_at, j.kind",
                " FROM tickets t JOIN tickets i ON i.job_id = t.job_id AND i.scheduled_at = t.scheduled_at \
                 LEFT JOIN runs r ON r.job_id = i.job_id AND r.scheduled_at = i.scheduled_at \
                 LEFT JOIN jobs j ON j.id = i.job_id WHERE t.id IN (",
            ),
            Table::Attempts => (
                "ticket_id, attempt, status, published_at, started_at, finished_at, worker, error, \
                 http_status, output, heartbeat_at",
                " FROM attempts WHERE ticket_id IN (",
            ),
            Table::Failures => (
                "t.id, t.attempt_base, t.body, t.checkpoint, j.spec, j.state",
                " FROM tickets t LEFT JOIN jobs j ON j.id = t.job_id WHERE t.id IN (",
            ),
        };
        sql.select_json_rows(cols).push(from);
        sql.list(self.ids.iter().map(String::as_str)).push(")");
    }

    /// Adds the rows of this read's result row to `into`.
    pub fn parse(&self, row: &AnyRow, into: &mut Fetched) -> Result<()> {
        let text: String = row.try_get(0)?;
        match self.table {
            Table::Tickets => parse_tickets(&text, &mut into.tickets),
            Table::Attempts => parse_attempts(&text, &mut into.attempts),
            Table::Failures => parse_failures(&text, &mut into.failures),
        }
    }
}

fn parse_tickets(text: &str, out: &mut HashMap<Uuid, TicketRow>) -> Result<()> {
    type Columns = (
        String,
        String,
        i64,
        String,
        i64,
        Option<i64>,
        Option<String>,
        Option<i64>,
        Option<String>,
    );
    for (id, job_id, scheduled_at, status, attempt, timeout_ms, run_reason, buffered_at, kind) in
        json_rows::<Columns>(text)?
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
                workflow: kind.as_deref() == Some(JobKind::Workflow.as_str()),
                checkpoint: None,
                dead_at: None,
                body: None,
                touched: false,
                dirty: false,
            },
        );
    }
    Ok(())
}

fn parse_attempts(text: &str, out: &mut HashMap<(Uuid, i64), AttemptRow>) -> Result<()> {
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
    for c in json_rows::<Columns>(text)? {
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
    Ok(())
}

fn parse_failures(text: &str, out: &mut HashMap<Uuid, FailureRow>) -> Result<()> {
    type Columns = (
        String,
        i64,
        String,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    for (id, attempt_base, body, checkpoint, spec, state) in json_rows::<Columns>(text)? {
        out.insert(
            parse_uuid(&id)?,
            FailureRow {
                attempt_base,
                body,
                checkpoint,
                spec,
                state,
            },
        );
    }
    Ok(())
}

/// An attempt row to write, by (ticket, attempt).
pub(super) type AttemptWrite<'a> = ((Uuid, i64), &'a AttemptRow);

/// One write statement: a chunk of changed rows of one table.
#[derive(Debug)]
pub(super) enum Write<'a> {
    /// Attempts written by this batch (none exists: all of their tickets' attempts were read),
    /// with every column as the batch left it.
    InsertAttempts(&'a [AttemptWrite<'a>]),
    UpdateAttempts(&'a [AttemptWrite<'a>]),
    /// Status and attempt, and what the batch set of checkpoint, dead letter time, body and
    /// update time (the rest keeps its stored value).
    Tickets(&'a [(Uuid, &'a TicketRow)]),
    /// The new state of runs (an occurrence without a run row has none to write).
    Runs(&'a [(&'a Occurrence, &'a RunRow)]),
}

/// The writes of a batch, chunked so no statement binds too many values.
pub(super) fn writes<'a>(
    inserted: &'a [AttemptWrite<'a>],
    updated: &'a [AttemptWrite<'a>],
    tickets: &'a [(Uuid, &'a TicketRow)],
    runs: &'a [(&'a Occurrence, &'a RunRow)],
) -> Vec<Write<'a>> {
    let mut out: Vec<Write<'a>> = Vec::new();
    out.extend(
        inserted
            .chunks(rows_per_statement(13))
            .map(Write::InsertAttempts),
    );
    out.extend(
        updated
            .chunks(rows_per_statement(11))
            .map(Write::UpdateAttempts),
    );
    out.extend(tickets.chunks(rows_per_statement(7)).map(Write::Tickets));
    out.extend(runs.chunks(rows_per_statement(5)).map(Write::Runs));
    out
}

/// Runs `writes` one statement each, in `tx`.
pub(super) async fn write(tx: &mut Tx, writes: &[Write<'_>], now: i64) -> Result<()> {
    for w in writes {
        let mut sql = Sql::new(tx);
        w.push(&mut sql, now);
        let (text, args) = sql.build();
        sqlx::query_with(&text, args).execute(&mut **tx).await?;
    }
    Ok(())
}

impl<'a> Write<'a> {
    /// Pushes this write as a statement of its own.
    pub fn push(&self, sql: &mut Sql<'a>, now: i64) {
        sql.statement();
        match *self {
            Write::InsertAttempts(rows) => {
                sql.push(
                    "INSERT INTO attempts (ticket_id, attempt, status, created_at, not_before, \
                     published_at, started_at, finished_at, worker, error, http_status, output, \
                     heartbeat_at) ",
                );
                sql.push_values(rows, |mut row, ((ticket, attempt), a)| {
                    row.push_bind(ticket.to_string())
                        .push_bind(*attempt)
                        .push_bind(a.status.as_str())
                        .push_bind(now)
                        .push_bind(a.inserted.flatten());
                    push_progress(&mut row, a);
                });
                sql.push(" ON CONFLICT DO NOTHING");
            }
            // VALUES columns are `column1..n` on both backends.
            Write::UpdateAttempts(rows) => {
                sql.push(
                    "UPDATE attempts SET status = v.column3, published_at = v.column4, \
                     started_at = v.column5, finished_at = v.column6, worker = v.column7, \
                     error = v.column8, http_status = v.column9, output = v.column10, \
                     heartbeat_at = v.column11 FROM (",
                );
                sql.push_values(rows, |mut row, ((ticket, attempt), a)| {
                    row.push_bind(ticket.to_string())
                        .push_bind(*attempt)
                        .push_bind(a.status.as_str());
                    push_progress(&mut row, a);
                });
                sql.push(
                    ") AS v WHERE attempts.ticket_id = v.column1 AND attempts.attempt = v.column2",
                );
            }
            Write::Tickets(rows) => {
                sql.push(
                    "UPDATE tickets SET status = v.column2, attempt = v.column3, \
                     checkpoint = COALESCE(v.column4, tickets.checkpoint), \
                     dead_at = COALESCE(v.column5, tickets.dead_at), \
                     body = COALESCE(v.column6, tickets.body), \
                     updated_at = COALESCE(v.column7, tickets.updated_at) FROM (",
                );
                sql.push_values(rows, |mut row, (id, t)| {
                    row.push_bind(id.to_string())
                        .push_bind(t.status.as_str())
                        .push_bind(t.attempt)
                        .push_bind(t.checkpoint.as_deref())
                        .push_bind(t.dead_at)
                        .push_bind(t.body.as_deref())
                        .push_bind(t.touched.then_some(now));
                });
                sql.push(") AS v WHERE tickets.id = v.column1");
            }
            Write::Runs(rows) => {
                sql.push(
                    "UPDATE runs SET status = v.column3, attempts = v.column4, \
                     reason = v.column5, updated_at = ",
                )
                .push_bind(now)
                .push(" FROM (");
                sql.push_values(rows, |mut row, ((job, at), r)| {
                    row.push_bind(job.as_str())
                        .push_bind(*at)
                        .push_bind(r.status)
                        .push_bind(r.attempts)
                        .push_bind(r.reason.as_deref());
                });
                sql.push(") AS v WHERE runs.job_id = v.column1 AND runs.scheduled_at = v.column2");
            }
        }
    }
}

/// An attempt's columns from `published_at` to `heartbeat_at`, in the order both attempt
/// statements list them.
fn push_progress<'q>(
    row: &mut sqlx::query_builder::Separated<'_, 'q, sqlx::Any, &'static str>,
    a: &'q AttemptRow,
) {
    row.push_bind(a.published_at)
        .push_bind(a.started_at)
        .push_bind(a.finished_at)
        .push_bind(a.worker.as_deref())
        .push_bind(a.error.as_deref())
        .push_bind(a.http_status)
        .push_bind(a.output.as_deref())
        .push_bind(a.heartbeat_at);
}
