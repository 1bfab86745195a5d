//! The fire transaction's fast path: many jobs' single on-time occurrences under `overlap: allow`
//! (the common case of a storm or a steady rate) written with a handful of multi-row statements
//! per batch instead of four statements per occurrence. Each statement is a round trip (to
//! SQLite's worker thread, or over the network to Postgres), and the round trips were most of a
//! fire's cost. The rules are those of `Store::fire_in`: a stale job writes nothing, an occurrence
//! with a run already is `Exists`, and tickets are written only with their run.
//!
//! `fire_simple` runs the statements one at a time in a transaction; on SQLite,
//! `fire_simple_in_three_trips` sends every read in one trip (the opening with it), every write
//! in a second and `COMMIT` once their row count is checked (`one_trip`). Each statement is
//! built by one function and bound by another, for both.

use std::collections::HashSet;

use sqlx::{
    any::{AnyArguments, AnyRow},
    query::Query,
    Any, Row,
};
use uuid::Uuid;

use super::{
    json_rows, one_trip,
    one_trip::OpenTrip,
    parse_uuid, rows_per_statement,
    tickets::{FireOutcome, FireRequest, Fired},
    Params, Result, Store, StoreError, Tx,
};
use chronoshard_wire::{Overlap, Ticket};

type Q<'q> = Query<'q, Any, AnyArguments<'q>>;

/// Whether the fast path may write this request: one occurrence, nothing to record as not
/// fired, no overlap policy to judge, and a next occurrence to move from.
pub(super) fn is_simple(req: &FireRequest<'_>) -> bool {
    req.overlap == Overlap::Allow
        && req.not_fired.is_empty()
        && req.occurrences.len() == 1
        && req.expected_next.is_some()
}

/// Writes simple requests (see `is_simple`) in `tx`; one outcome per request, in order.
pub(super) async fn fire_simple(
    tx: &mut Tx,
    requests: Vec<FireRequest<'_>>,
    now: i64,
) -> Result<Vec<FireOutcome>> {
    let mut moved = move_jobs(tx, &requests, now).await?;
    let mut outs: Vec<FireOutcome> = Vec::with_capacity(requests.len());
    let mut runs: Vec<(String, i64)> = Vec::new();
    for req in &requests {
        // Taken out of `moved`: a second request for the same job in one batch is stale, as it
        // would be one by one (the first moved the job on); so is one for an occurrence the job
        // is not at, even if the job moved for another request.
        if req
            .expected_next
            .is_some_and(|at| moved.remove(&(req.job_id, at)))
        {
            runs.push((req.job_id.to_string(), req.occurrences[0].0));
            outs.push(FireOutcome::default());
        } else {
            outs.push(FireOutcome {
                stale: true,
                ..Default::default()
            });
        }
    }
    let created = insert_runs(tx, &runs, now).await?;
    let mut tickets: Vec<Ticket> = Vec::new();
    for (req, out) in requests.into_iter().zip(outs.iter_mut()) {
        if out.stale {
            continue;
        }
        let (at, item_tickets) = req.occurrences.into_iter().next().expect("one occurrence");
        if created.contains(&(req.job_id, at)) {
            out.occurrences.push((at, Fired::Ticketed));
            out.tickets = item_tickets;
            tickets.extend(out.tickets.iter().cloned());
        } else {
            out.occurrences.push((at, Fired::Exists));
        }
    }
    insert_tickets(tx, &tickets, now).await?;
    Ok(outs)
}

/// Moves each job from its expected next occurrence to the one after; returns the jobs moved,
/// with the occurrence they moved from (the others were stale: changed since the wheel entry
/// was made).
///
/// The jobs that will move are read first, as one JSON value (`json_rows_of`), rather than
/// returned by the update row by row: the transaction holds the write lock, so nothing changes
/// in between, and the update must move exactly those.
async fn move_jobs(
    tx: &mut Tx,
    requests: &[FireRequest<'_>],
    now: i64,
) -> Result<HashSet<(Uuid, i64)>> {
    let mut moved = HashSet::new();
    for chunk in requests.chunks(rows_per_statement(4)) {
        let sql = ready_sql(&mut Params::new(tx), chunk.len());
        let row = bind_ready(sqlx::query(&sql), chunk)
            .fetch_one(&mut **tx)
            .await?;
        let ready = ready_of(&row)?;
        if ready.is_empty() {
            continue;
        }
        let sql = move_sql(&mut Params::new(tx), chunk.len());
        let updated = bind_move(sqlx::query(&sql), chunk, now)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        as_read(updated, ready.len(), "jobs moved on")?;
        moved.extend(ready);
    }
    Ok(moved)
}

/// Inserts `dispatched` runs; returns those created (the others existed already). The existing
/// ones are read first (usually none), for the reason `move_jobs` reads before it writes.
async fn insert_runs(
    tx: &mut Tx,
    runs: &[(String, i64)],
    now: i64,
) -> Result<HashSet<(Uuid, i64)>> {
    let mut created = HashSet::new();
    for chunk in runs.chunks(rows_per_statement(6)) {
        let sql = runs_read_sql(&mut Params::new(tx), chunk.len());
        let row = bind_runs(sqlx::query(&sql), chunk)
            .fetch_one(&mut **tx)
            .await?;
        let existing = existing_of(&row)?;
        let mut new = HashSet::new();
        for (job, at) in chunk {
            if !existing.contains(&(job.clone(), *at)) {
                new.insert((parse_uuid(job)?, *at));
            }
        }
        if new.is_empty() {
            continue;
        }
        let sql = runs_insert_sql(&mut Params::new(tx), chunk.len());
        let inserted = bind_new_runs(sqlx::query(&sql), chunk, now)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        as_read(inserted, new.len(), "runs created")?;
        created.extend(new);
    }
    Ok(created)
}

/// Writes first-attempt tickets and their attempt rows.
pub(super) async fn insert_tickets(tx: &mut Tx, tickets: &[Ticket], now: i64) -> Result<()> {
    for chunk in tickets.chunks(rows_per_statement(12)) {
        let sql = tickets_sql(&mut Params::new(tx), chunk.len());
        bind_tickets(sqlx::query(&sql), chunk, now)?
            .execute(&mut **tx)
            .await?;
        let sql = attempts_sql(&mut Params::new(tx), chunk.len());
        bind_attempts(sqlx::query(&sql), chunk, now)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// `fire_simple` on SQLite in three trips: the opening with the reads of the jobs that will move
/// and of the runs that exist, then the writes, whose row count must be what the reads said
/// (the write lock is held in between; a wrong count rolls everything back, as in
/// `fire_simple`), then `COMMIT`.
pub(super) async fn fire_simple_in_three_trips(
    store: &Store,
    requests: Vec<FireRequest<'_>>,
    now: i64,
) -> Result<Vec<FireOutcome>> {
    let runs: Vec<(String, i64)> = requests
        .iter()
        .map(|r| (r.job_id.to_string(), r.occurrences[0].0))
        .collect();
    let job_chunks: Vec<&[FireRequest<'_>]> = requests.chunks(rows_per_statement(4)).collect();
    let run_chunks: Vec<&[(String, i64)]> = runs.chunks(rows_per_statement(2)).collect();
    let sql = Store::open_trip_sql(&format!(
        "{}; {}",
        one_trip::statements(&job_chunks, |c, p| ready_sql(p, c.len())),
        one_trip::statements(&run_chunks, |c, p| runs_read_sql(p, c.len())),
    ));
    let q = job_chunks
        .iter()
        .fold(store.one_trip_query(&sql), |q, c| bind_ready(q, c));
    let q = run_chunks.iter().fold(q, |q, c| bind_runs(q, c));
    let (open, found) = store
        .open_trip(q, job_chunks.len() + run_chunks.len())
        .await?;
    let (found_jobs, found_runs) = found.split_at(job_chunks.len());
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
    let (mut moved, mut new_runs, mut tickets) = (Vec::new(), Vec::new(), Vec::new());
    let mut outs = Vec::with_capacity(requests.len());
    for (req, run) in requests.into_iter().zip(runs) {
        // Taken out of `ready`: a second request for the same job in one batch is stale, as in
        // `fire_simple`.
        if !req
            .expected_next
            .is_some_and(|at| ready.remove(&(req.job_id, at)))
        {
            outs.push(FireOutcome {
                stale: true,
                ..Default::default()
            });
            continue;
        }
        moved.push((req.job_id, req.expected_next, req.next_fire_at));
        let (at, item_tickets) = req.occurrences.into_iter().next().expect("one occurrence");
        let mut out = FireOutcome::default();
        if existing.contains(&run) {
            out.occurrences.push((at, Fired::Exists));
        } else {
            new_runs.push(run);
            out.occurrences.push((at, Fired::Ticketed));
            tickets.extend(item_tickets.iter().cloned());
            out.tickets = item_tickets;
        }
        outs.push(out);
    }
    let move_chunks: Vec<&[Moved]> = moved.chunks(rows_per_statement(4)).collect();
    let new_chunks: Vec<&[(String, i64)]> = new_runs.chunks(rows_per_statement(6)).collect();
    let ticket_chunks: Vec<&[Ticket]> = tickets.chunks(rows_per_statement(12)).collect();
    let body = [
        one_trip::statements(&move_chunks, |c, p| move_sql(p, c.len())),
        one_trip::statements(&new_chunks, |c, p| runs_insert_sql(p, c.len())),
        one_trip::statements(&ticket_chunks, |c, p| {
            format!("{}; {}", tickets_sql(p, c.len()), attempts_sql(p, c.len()))
        }),
    ]
    .into_iter()
    .filter(|s| !s.is_empty())
    .collect::<Vec<_>>()
    .join("; ");
    let mut open = open;
    if !body.is_empty() {
        let q = move_chunks
            .iter()
            .fold(sqlx::query(&body), |q, c| bind_moved(q, c, now));
        let mut q = new_chunks.iter().fold(q, |q, c| bind_new_runs(q, c, now));
        for c in &ticket_chunks {
            q = bind_attempts(bind_tickets(q, c, now)?, c, now);
        }
        let written;
        (open, written) = open.write(q).await?;
        as_read(
            written,
            moved.len() + new_runs.len() + 2 * tickets.len(),
            "jobs moved on, runs created, tickets and attempts written",
        )?;
    }
    open.commit(sqlx::query(&OpenTrip::commit_sql(""))).await?;
    Ok(outs)
}

/// A job to move on: its id, the occurrence it must still be at, and the next one.
type Moved = (Uuid, Option<i64>, Option<i64>);

/// The jobs of `n` requests (id, expected next occurrence) that are still at that occurrence and
/// active, as one JSON value of (id, occurrence): a request moves its job only if it is for the
/// occurrence the job is at.
fn ready_sql(p: &mut Params, n: usize) -> String {
    format!(
        "SELECT {} FROM jobs JOIN (VALUES {}) AS v ON jobs.id = v.column1 \
         WHERE jobs.next_fire_at = v.column2 AND jobs.state = 'active'",
        p.json_rows_of("jobs.id, jobs.next_fire_at"),
        p.rows(n, 2)
    )
}

fn bind_ready<'q>(mut q: Q<'q>, chunk: &[FireRequest<'_>]) -> Q<'q> {
    for r in chunk {
        q = q.bind(r.job_id.to_string()).bind(r.expected_next);
    }
    q
}

fn ready_of(row: &AnyRow) -> Result<HashSet<(Uuid, i64)>> {
    json_rows::<(String, i64)>(&row.try_get::<String, _>(0)?)?
        .into_iter()
        .map(|(id, at)| Ok((parse_uuid(&id)?, at)))
        .collect()
}

/// Moves `n` jobs on (id, next occurrence, state, expected occurrence), those still at the
/// expected one and active only; its first value is the time.
fn move_sql(p: &mut Params, n: usize) -> String {
    // VALUES columns are `column1..4` on both backends.
    format!(
        "UPDATE jobs SET next_fire_at = v.column2, state = v.column3, updated_at = {} \
         FROM (VALUES {}) AS v \
         WHERE jobs.id = v.column1 AND jobs.next_fire_at = v.column4 AND jobs.state = 'active'",
        p.one(),
        p.rows(n, 4)
    )
}

fn bind_move<'q>(q: Q<'q>, chunk: &[FireRequest<'_>], now: i64) -> Q<'q> {
    let moved: Vec<Moved> = chunk
        .iter()
        .map(|r| (r.job_id, r.expected_next, r.next_fire_at))
        .collect();
    bind_moved(q, &moved, now)
}

fn bind_moved<'q>(mut q: Q<'q>, chunk: &[Moved], now: i64) -> Q<'q> {
    q = q.bind(now);
    for (job, expected, next) in chunk {
        let state = if next.is_some() {
            "active"
        } else {
            "completed"
        };
        q = q
            .bind(job.to_string())
            .bind(*next)
            .bind(state)
            .bind(*expected);
    }
    q
}

/// The runs of `n` occurrences (job id, scheduled time) that exist, as one JSON value.
fn runs_read_sql(p: &mut Params, n: usize) -> String {
    format!(
        "SELECT {} FROM runs JOIN (VALUES {}) AS v \
         ON runs.job_id = v.column1 AND runs.scheduled_at = v.column2",
        p.json_rows_of("runs.job_id, runs.scheduled_at"),
        p.rows(n, 2)
    )
}

fn bind_runs<'q>(mut q: Q<'q>, chunk: &'q [(String, i64)]) -> Q<'q> {
    for (job, at) in chunk {
        q = q.bind(job.as_str()).bind(*at);
    }
    q
}

fn existing_of(row: &AnyRow) -> Result<HashSet<(String, i64)>> {
    Ok(json_rows(&row.try_get::<String, _>(0)?)?
        .into_iter()
        .collect())
}

/// Inserts `n` `dispatched` runs; an existing one is left alone.
fn runs_insert_sql(p: &mut Params, n: usize) -> String {
    format!(
        "INSERT INTO runs (job_id, scheduled_at, status, attempts, created_at, updated_at) \
         VALUES {} ON CONFLICT DO NOTHING",
        p.rows(n, 6)
    )
}

fn bind_new_runs<'q>(mut q: Q<'q>, chunk: &'q [(String, i64)], now: i64) -> Q<'q> {
    for (job, at) in chunk {
        q = q
            .bind(job.as_str())
            .bind(*at)
            .bind("dispatched")
            .bind(1i64)
            .bind(now)
            .bind(now);
    }
    q
}

fn tickets_sql(p: &mut Params, n: usize) -> String {
    format!(
        "INSERT INTO tickets (id, job_id, scheduled_at, item, status, attempt, epoch, queue, body, timeout_ms, created_at, updated_at) \
         VALUES {}",
        p.rows(n, 12)
    )
}

fn bind_tickets<'q>(mut q: Q<'q>, chunk: &'q [Ticket], now: i64) -> Result<Q<'q>> {
    for t in chunk {
        q = q
            .bind(t.ticket_id.to_string())
            .bind(t.job_id.to_string())
            .bind(t.scheduled_at.timestamp_millis())
            .bind(t.item as i64)
            .bind("dispatched")
            .bind(t.attempt as i64)
            .bind(t.epoch as i64)
            .bind(&t.queue)
            .bind(super::tickets::ticket_json(t)?)
            .bind(t.timeout_ms as i64)
            .bind(now)
            .bind(now);
    }
    Ok(q)
}

/// The first attempts of `n` tickets. Takes the tickets' chunks (12 columns to its 5): a little
/// below its best size, one loop.
fn attempts_sql(p: &mut Params, n: usize) -> String {
    format!(
        "INSERT INTO attempts (ticket_id, attempt, status, created_at, not_before) VALUES {}",
        p.rows(n, 5)
    )
}

fn bind_attempts<'q>(mut q: Q<'q>, chunk: &[Ticket], now: i64) -> Q<'q> {
    for t in chunk {
        q = q
            .bind(t.ticket_id.to_string())
            .bind(t.attempt as i64)
            .bind("dispatched")
            .bind(now)
            .bind(super::tickets::not_before(t, now));
    }
    q
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
