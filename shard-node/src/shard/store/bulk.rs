//! The fire transaction's fast path: many jobs' single on-time occurrences under `overlap: allow`
//! (the common case of a storm or a steady rate) written with a handful of multi-row statements
//! per batch instead of four statements per occurrence. Each statement is a round trip (to
//! SQLite's worker thread, or over the network to Postgres), and the round trips were most of a
//! fire's cost. The rules are those of `Store::fire_in`: a stale job writes nothing, an occurrence
//! with a run already is `Exists`, and tickets are written only with their run.

use std::collections::HashSet;

use sqlx::Row;
use uuid::Uuid;

use super::{
    parse_uuid, rows_per_statement,
    tickets::{FireOutcome, FireRequest, Fired},
    Params, Result, Tx,
};
use chronoshard_wire::{Overlap, Ticket};

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
        // would be one by one (the first moved the job on).
        if moved.remove(&req.job_id) {
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

/// Moves each job from its expected next occurrence to the one after; returns the jobs moved
/// (the others were stale: changed since the wheel entry was made).
async fn move_jobs(tx: &mut Tx, requests: &[FireRequest<'_>], now: i64) -> Result<HashSet<Uuid>> {
    let mut moved = HashSet::new();
    for chunk in requests.chunks(rows_per_statement(4)) {
        let mut p = Params::new(tx);
        let sql = format!(
            "UPDATE jobs SET next_fire_at = v.column2, state = v.column3, updated_at = {} \
             FROM (VALUES {}) AS v \
             WHERE jobs.id = v.column1 AND jobs.next_fire_at = v.column4 AND jobs.state = 'active' \
             RETURNING jobs.id",
            p.one(),
            p.rows(chunk.len(), 4)
        );
        let mut q = sqlx::query(&sql).bind(now);
        for r in chunk {
            let state = if r.next_fire_at.is_some() {
                "active"
            } else {
                "completed"
            };
            q = q
                .bind(r.job_id.to_string())
                .bind(r.next_fire_at)
                .bind(state)
                .bind(r.expected_next);
        }
        for row in q.fetch_all(&mut **tx).await? {
            moved.insert(parse_uuid(&row.try_get::<String, _>(0)?)?);
        }
    }
    Ok(moved)
}

/// Inserts `dispatched` runs; returns those created (the others existed already).
async fn insert_runs(
    tx: &mut Tx,
    runs: &[(String, i64)],
    now: i64,
) -> Result<HashSet<(Uuid, i64)>> {
    let mut created = HashSet::new();
    for chunk in runs.chunks(rows_per_statement(6)) {
        let sql = format!(
            "INSERT INTO runs (job_id, scheduled_at, status, attempts, created_at, updated_at) \
             VALUES {} ON CONFLICT DO NOTHING RETURNING job_id, scheduled_at",
            Params::new(tx).rows(chunk.len(), 6)
        );
        let mut q = sqlx::query(&sql);
        for (job, at) in chunk {
            q = q
                .bind(job)
                .bind(*at)
                .bind("dispatched")
                .bind(1i64)
                .bind(now)
                .bind(now);
        }
        for row in q.fetch_all(&mut **tx).await? {
            let job = parse_uuid(&row.try_get::<String, _>(0)?)?;
            created.insert((job, row.try_get::<i64, _>(1)?));
        }
    }
    Ok(created)
}

/// Writes first-attempt tickets and their attempt rows.
pub(super) async fn insert_tickets(tx: &mut Tx, tickets: &[Ticket], now: i64) -> Result<()> {
    // The attempts' statement (5 columns) takes the tickets' chunks (12): a little below its
    // best size, one loop.
    for chunk in tickets.chunks(rows_per_statement(12)) {
        let sql = format!(
            "INSERT INTO tickets (id, job_id, scheduled_at, item, status, attempt, epoch, queue, body, timeout_ms, created_at, updated_at) \
             VALUES {}",
            Params::new(tx).rows(chunk.len(), 12)
        );
        let mut q = sqlx::query(&sql);
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
        q.execute(&mut **tx).await?;
        let sql = format!(
            "INSERT INTO attempts (ticket_id, attempt, status, created_at, not_before) VALUES {}",
            Params::new(tx).rows(chunk.len(), 5)
        );
        let mut q = sqlx::query(&sql);
        for t in chunk {
            q = q
                .bind(t.ticket_id.to_string())
                .bind(t.attempt as i64)
                .bind("dispatched")
                .bind(now)
                .bind(super::tickets::not_before(t, now));
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}
