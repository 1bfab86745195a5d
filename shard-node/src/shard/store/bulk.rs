//! The fire transaction's fast path: many jobs' single on-time occurrences under `overlap: allow`
//! (the common case of a storm or a steady rate) written with a handful of multi-row statements
//! per batch instead of four statements per occurrence. Each statement is a round trip (to
//! SQLite's worker thread, or over the network to Postgres), and the round trips were most of a
//! fire's cost. The rules are those of `Store::fire_in`: a stale job writes nothing, an occurrence
//! with a run already is `Exists`, and tickets are written only with their run.
//!
//! Both ways of running a batch push the same reads, decide with the same rules (`plan`) and
//! push the same writes: `fire_simple` runs the statements one at a time in a transaction; on
//! SQLite, `fire_simple_in_three_trips` sends every read in one trip (the opening with it),
//! every write in a second and `COMMIT` once their row count is checked (`one_trip`).

use std::collections::HashSet;

use sqlx::{any::AnyRow, Row};
use uuid::Uuid;

use super::{
    json_rows, parse_uuid,
    sql::{rows_per_statement, Each, Sql, Statements},
    tickets::{FireOutcome, FireRequest, Fired},
    Result, Store, StoreError, Tx,
};
use chronoshard_wire::{Overlap, Ticket};

/// Whether the fast path may write this request: one occurrence, nothing to record as not
/// fired, no overlap policy to judge, and a next occurrence to move from.
pub(super) fn is_simple(req: &FireRequest<'_>) -> bool {
    req.overlap == Overlap::Allow
        && req.not_fired.is_empty()
        && req.occurrences.len() == 1
        && req.expected_next.is_some()
        && !req.occurrences[0].1.iter().any(is_waiting)
}

/// A workflow step's ticket written when its run starts but not dispatched until the steps it
/// waits for have succeeded: it has no attempt yet (`attempt` 0), so no attempt row and no
/// publish.
pub(in crate::shard) fn is_waiting(t: &Ticket) -> bool {
    t.attempt == 0
}

/// Writes simple requests (see `is_simple`) in `tx`, one statement at a time; one outcome per
/// request, in order.
pub(super) async fn fire_simple(
    tx: &mut Tx,
    requests: Vec<FireRequest<'_>>,
    now: i64,
) -> Result<Vec<FireOutcome>> {
    let runs = occurrences(&requests);
    let mut reads = Each::new(tx);
    let jobs_read = push_reads(&mut reads, &requests, &runs);
    let mut found = Vec::with_capacity(reads.len());
    for mut sql in reads.into_statements() {
        let (text, args) = sql.build();
        found.push(sqlx::query_with(&text, args).fetch_one(&mut **tx).await?);
    }
    let plan = plan(requests, &found, jobs_read)?;
    let mut writes = Each::new(tx);
    push_writes(&mut writes, &plan, now)?;
    let mut written = 0;
    for mut sql in writes.into_statements() {
        let (text, args) = sql.build();
        written += sqlx::query_with(&text, args)
            .execute(&mut **tx)
            .await?
            .rows_affected();
    }
    plan.check(written)?;
    Ok(plan.outs)
}

/// Writes first-attempt tickets and their attempt rows.
pub(super) async fn insert_tickets(tx: &mut Tx, tickets: &[Ticket], now: i64) -> Result<()> {
    let mut writes = Each::new(tx);
    push_ticket_writes(&mut writes, tickets, now)?;
    for mut sql in writes.into_statements() {
        let (text, args) = sql.build();
        sqlx::query_with(&text, args).execute(&mut **tx).await?;
    }
    Ok(())
}

/// `fire_simple` on SQLite in three trips: the opening with the reads, then the writes, whose
/// row count must be what the reads said (the write lock is held in between; a wrong count
/// rolls everything back, as in `fire_simple`), then `COMMIT`.
pub(super) async fn fire_simple_in_three_trips(
    store: &Store,
    requests: Vec<FireRequest<'_>>,
    now: i64,
) -> Result<Vec<FireOutcome>> {
    let runs = occurrences(&requests);
    let mut trip = store.trip();
    let jobs_read = push_reads(&mut trip, &requests, &runs);
    let reads = jobs_read + runs.chunks(rows_per_statement(2)).len();
    let (open, found) = store.open_trip(trip, reads).await?;
    let plan = plan(requests, &found, jobs_read)?;
    let mut writes = Sql::sqlite();
    push_writes(&mut writes, &plan, now)?;
    let mut open = open;
    if !writes.is_empty() {
        let written;
        (open, written) = open.write(writes).await?;
        plan.check(written)?;
    }
    open.commit(Sql::sqlite()).await?;
    Ok(plan.outs)
}

/// The occurrence each request fires: (job id as stored, time).
fn occurrences(requests: &[FireRequest<'_>]) -> Vec<(String, i64)> {
    requests
        .iter()
        .map(|r| (r.job_id.to_string(), r.occurrences[0].0))
        .collect()
}

/// The reads of a batch: the jobs still at their expected occurrence (`push_ready`), then the
/// runs of `runs` that exist (`push_runs_read`), one row each. Returns how many of them read jobs.
fn push_reads<'q>(
    out: &mut impl Statements<'q>,
    requests: &[FireRequest<'_>],
    runs: &'q [(String, i64)],
) -> usize {
    let mut jobs_read = 0;
    for chunk in requests.chunks(rows_per_statement(4)) {
        push_ready(out.statement(), chunk);
        jobs_read += 1;
    }
    for chunk in runs.chunks(rows_per_statement(2)) {
        push_runs_read(out.statement(), chunk);
    }
    jobs_read
}

/// What a batch writes, decided from what its reads found, with one outcome per request.
struct Plan {
    outs: Vec<FireOutcome>,
    moved: Vec<Moved>,
    new_runs: Vec<(String, i64)>,
    tickets: Vec<Ticket>,
}

/// The rules of a batch: a request moves its job only if the job is still at the request's
/// occurrence (else it is stale and writes nothing), and only once (a second request for the
/// same job in one batch is stale, as it would be one by one); an occurrence with a run already
/// is `Exists`; tickets are written only with a new run. `found` holds the rows of `push_reads`,
/// the first `jobs_read` of them the jobs'.
fn plan(requests: Vec<FireRequest<'_>>, found: &[AnyRow], jobs_read: usize) -> Result<Plan> {
    let (found_jobs, found_runs) = found.split_at(jobs_read);
    // By job and occurrence: two requests for one job at different occurrences cannot both
    // move it.
    let mut ready = HashSet::new();
    for row in found_jobs {
        ready.extend(ready_of(row)?);
    }
    let mut existing = HashSet::new();
    for row in found_runs {
        existing.extend(existing_of(row)?);
    }
    let mut plan = Plan {
        outs: Vec::with_capacity(requests.len()),
        moved: Vec::new(),
        new_runs: Vec::new(),
        tickets: Vec::new(),
    };
    for req in requests {
        if !req
            .expected_next
            .is_some_and(|at| ready.remove(&(req.job_id, at)))
        {
            plan.outs.push(FireOutcome {
                stale: true,
                ..Default::default()
            });
            continue;
        }
        plan.moved.push(moved_of(&req));
        let (at, item_tickets) = req.occurrences.into_iter().next().expect("one occurrence");
        let run = (req.job_id.to_string(), at);
        let mut out = FireOutcome::default();
        if existing.contains(&run) {
            out.occurrences.push((at, Fired::Exists));
        } else {
            plan.new_runs.push(run);
            out.occurrences.push((at, Fired::Ticketed));
            plan.tickets.extend(item_tickets.iter().cloned());
            out.tickets = item_tickets;
        }
        plan.outs.push(out);
    }
    Ok(plan)
}

impl Plan {
    /// The writes changed exactly the rows the reads said they would: each moved job, new run,
    /// ticket and attempt once.
    fn check(&self, written: u64) -> Result<()> {
        as_read(
            written,
            self.moved.len() + self.new_runs.len() + 2 * self.tickets.len(),
            "jobs moved on, runs created, tickets and attempts written",
        )
    }
}

/// The writes of a plan: the jobs moved on, the new runs, their tickets and first attempts.
fn push_writes<'q>(out: &mut impl Statements<'q>, plan: &'q Plan, now: i64) -> Result<()> {
    for chunk in plan.moved.chunks(rows_per_statement(4)) {
        push_move(out.statement(), chunk, now);
    }
    for chunk in plan.new_runs.chunks(rows_per_statement(6)) {
        push_runs_insert(out.statement(), chunk, now);
    }
    push_ticket_writes(out, &plan.tickets, now)
}

/// Tickets and their first attempts.
fn push_ticket_writes<'q>(
    out: &mut impl Statements<'q>,
    tickets: &'q [Ticket],
    now: i64,
) -> Result<()> {
    for chunk in tickets.chunks(rows_per_statement(12)) {
        push_tickets(out.statement(), chunk, now)?;
        // A workflow's waiting steps have no attempt yet.
        let mut dispatched = chunk.iter().filter(|t| !is_waiting(t)).peekable();
        if dispatched.peek().is_some() {
            push_attempts(out.statement(), dispatched, now);
        }
    }
    Ok(())
}

/// A job to move on: its id, the occurrence it must still be at, and the next one.
type Moved = (Uuid, Option<i64>, Option<i64>);

fn moved_of(r: &FireRequest<'_>) -> Moved {
    (r.job_id, r.expected_next, r.next_fire_at)
}

/// The jobs of a chunk of requests (id, expected next occurrence) that are still at that
/// occurrence and active, as one JSON value of (id, occurrence): a request moves its job only if
/// it is for the occurrence the job is at.
fn push_ready(sql: &mut Sql<'_>, chunk: &[FireRequest<'_>]) {
    sql.select_json_rows("jobs.id, jobs.next_fire_at")
        .push(" FROM jobs JOIN (");
    sql.push_values(chunk, |mut row, r| {
        row.push_bind(r.job_id.to_string())
            .push_bind(r.expected_next);
    });
    sql.push(
        ") AS v ON jobs.id = v.column1 \
         WHERE jobs.next_fire_at = v.column2 AND jobs.state = 'active'",
    );
}

fn ready_of(row: &AnyRow) -> Result<HashSet<(Uuid, i64)>> {
    json_rows::<(String, i64)>(&row.try_get::<String, _>(0)?)?
        .into_iter()
        .map(|(id, at)| Ok((parse_uuid(&id)?, at)))
        .collect()
}

/// Moves jobs on: each to its next occurrence (or `completed` without one), if still at the
/// expected one and active.
fn push_move(sql: &mut Sql<'_>, chunk: &[Moved], now: i64) {
    // VALUES columns are `column1..4` on both backends.
    sql.statement()
        .push("UPDATE jobs SET next_fire_at = v.column2, state = v.column3, updated_at = ")
        .push_bind(now)
        .push(" FROM (");
    sql.push_values(chunk, |mut row, &(job, expected, next)| {
        let state = if next.is_some() {
            "active"
        } else {
            "completed"
        };
        row.push_bind(job.to_string())
            .push_bind(next)
            .push_bind(state)
            .push_bind(expected);
    });
    sql.push(
        ") AS v \
         WHERE jobs.id = v.column1 AND jobs.next_fire_at = v.column4 AND jobs.state = 'active'",
    );
}

/// The runs of a chunk of occurrences (job id, scheduled time) that exist, as one JSON value.
fn push_runs_read<'q>(sql: &mut Sql<'q>, chunk: &'q [(String, i64)]) {
    sql.select_json_rows("runs.job_id, runs.scheduled_at")
        .push(" FROM runs JOIN (");
    sql.push_values(chunk, |mut row, (job, at)| {
        row.push_bind(job.as_str()).push_bind(*at);
    });
    sql.push(") AS v ON runs.job_id = v.column1 AND runs.scheduled_at = v.column2");
}

fn existing_of(row: &AnyRow) -> Result<HashSet<(String, i64)>> {
    Ok(json_rows(&row.try_get::<String, _>(0)?)?
        .into_iter()
        .collect())
}

/// Inserts `dispatched` runs; an existing one is left alone.
fn push_runs_insert<'q>(sql: &mut Sql<'q>, chunk: &'q [(String, i64)], now: i64) {
    sql.statement()
        .push("INSERT INTO runs (job_id, scheduled_at, status, attempts, created_at, updated_at) ");
    sql.push_values(chunk, |mut row, (job, at)| {
        row.push_bind(job.as_str())
            .push_bind(*at)
            .push_bind("dispatched")
            .push_bind(1i64)
            .push_bind(now)
            .push_bind(now);
    });
    sql.push(" ON CONFLICT DO NOTHING");
}

fn push_tickets<'q>(sql: &mut Sql<'q>, chunk: &'q [Ticket], now: i64) -> Result<()> {
    let bodies = chunk
        .iter()
        .map(super::tickets::ticket_json)
        .collect::<Result<Vec<_>>>()?;
    sql.statement().push(
        "INSERT INTO tickets (id, job_id, scheduled_at, item, status, attempt, epoch, queue, body, \
         timeout_ms, created_at, updated_at) ",
    );
    sql.push_values(chunk.iter().zip(bodies), |mut row, (t, body)| {
        row.push_bind(t.ticket_id.to_string())
            .push_bind(t.job_id.to_string())
            .push_bind(t.scheduled_at.timestamp_millis())
            .push_bind(t.item as i64)
            .push_bind(if is_waiting(t) {
                "waiting"
            } else {
                "dispatched"
            })
            .push_bind(t.attempt as i64)
            .push_bind(t.epoch as i64)
            .push_bind(t.queue.as_str())
            .push_bind(body)
            .push_bind(t.timeout_ms as i64)
            .push_bind(now)
            .push_bind(now);
    });
    Ok(())
}

/// The first attempts of tickets. Takes the tickets' chunks (12 columns to its 5): a little
/// below its best size, one loop.
fn push_attempts<'t>(sql: &mut Sql<'_>, chunk: impl IntoIterator<Item = &'t Ticket>, now: i64) {
    sql.statement()
        .push("INSERT INTO attempts (ticket_id, attempt, status, created_at, not_before) ");
    sql.push_values(chunk, |mut row, t| {
        row.push_bind(t.ticket_id.to_string())
            .push_bind(t.attempt as i64)
            .push_bind("dispatched")
            .push_bind(now)
            .push_bind(super::tickets::not_before(t, now));
    });
}

/// A write that follows a read of which rows it changes must change exactly those (the
/// transaction holds the write lock in between); anything else is a store out of order.
fn as_read(changed: u64, read: usize, what: &str) -> Result<()> {
    if changed == read as u64 {
        Ok(())
    } else {
        Err(StoreError::Corrupt(format!(
            "{what}: {changed} rows where a read found {read}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_that_changed_other_rows_than_read_is_an_error() {
        assert!(as_read(3, 3, "runs created").is_ok());
        for (changed, read) in [(2, 3), (4, 3), (1, 0)] {
            let err = as_read(changed, read, "runs created").unwrap_err();
            assert!(
                matches!(err, StoreError::Corrupt(ref m) if m.starts_with("runs created:")),
                "{err}"
            );
        }
    }
}
