//! The fire transaction's fast path: many jobs' single on-time occurrences under `overlap: allow`
//! (the common case of a storm or a steady rate) written with a handful of multi-row statements
//! per batch instead of four statements per occurrence. Each statement is a round trip (to
//! SQLite's worker thread, or over the network to Postgres), and the round trips were most of a
//! fire's cost. The rules are those of `Store::fire_in`: a stale job writes nothing, an occurrence
//! with a run already is `Exists`, and tickets are written only with their run.

use std::collections::HashSet;

use uuid::Uuid;

use super::{
    json_rows, json_rows_of, parse_uuid, rows_per_statement,
    tickets::{FireOutcome, FireRequest, Fired},
    Params, Result, StoreError, Tx,
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
///
/// The jobs that will move are read first, as one JSON value (`json_rows_of`), rather than
/// returned by the update row by row: the transaction holds the write lock, so nothing changes
/// in between, and the update must move exactly those.
async fn move_jobs(tx: &mut Tx, requests: &[FireRequest<'_>], now: i64) -> Result<HashSet<Uuid>> {
    let mut moved = HashSet::new();
    for chunk in requests.chunks(rows_per_statement(4)) {
        let sql = format!(
            "SELECT {} FROM jobs JOIN (VALUES {}) AS v ON jobs.id = v.column1 \
             WHERE jobs.next_fire_at = v.column2 AND jobs.state = 'active'",
            json_rows_of(tx, "jobs.id"),
            Params::new(tx).rows(chunk.len(), 2)
        );
        let mut q = sqlx::query_scalar::<_, String>(&sql);
        for r in chunk {
            q = q.bind(r.job_id.to_string()).bind(r.expected_next);
        }
        let rows = q.fetch_one(&mut **tx).await?;
        let ready = json_rows::<(String,)>(&rows)?
            .into_iter()
            .map(|(id,)| parse_uuid(&id))
            .collect::<Result<HashSet<Uuid>>>()?;
        if ready.is_empty() {
            continue;
        }
        let mut p = Params::new(tx);
        // VALUES columns are `column1..4` on both backends.
        let sql = format!(
            "UPDATE jobs SET next_fire_at = v.column2, state = v.column3, updated_at = {} \
             FROM (VALUES {}) AS v \
             WHERE jobs.id = v.column1 AND jobs.next_fire_at = v.column4 AND jobs.state = 'active'",
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
        let updated = q.execute(&mut **tx).await?.rows_affected();
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
        let sql = format!(
            "SELECT {} FROM runs JOIN (VALUES {}) AS v \
             ON runs.job_id = v.column1 AND runs.scheduled_at = v.column2",
            json_rows_of(tx, "runs.job_id, runs.scheduled_at"),
            Params::new(tx).rows(chunk.len(), 2)
        );
        let mut q = sqlx::query_scalar::<_, String>(&sql);
        for (job, at) in chunk {
            q = q.bind(job).bind(*at);
        }
        let rows = q.fetch_one(&mut **tx).await?;
        let existing: HashSet<(String, i64)> = json_rows(&rows)?.into_iter().collect();
        let mut new = HashSet::new();
        for (job, at) in chunk {
            if !existing.contains(&(job.clone(), *at)) {
                new.insert((parse_uuid(job)?, *at));
            }
        }
        if new.is_empty() {
            continue;
        }
        let sql = format!(
            "INSERT INTO runs (job_id, scheduled_at, status, attempts, created_at, updated_at) \
             VALUES {} ON CONFLICT DO NOTHING",
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
        let inserted = q.execute(&mut **tx).await?.rows_affected();
        as_read(inserted, new.len(), "runs created")?;
        created.extend(new);
    }
    Ok(created)
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
