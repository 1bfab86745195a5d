//! The fire transaction (the outbox write) with the overlap policies, the release of a buffered
//! occurrence.

use chronoshard_wire::{Overlap, RunStatus, Ticket};
use sqlx::Row;
use uuid::Uuid;

use super::{Result, Store, StoreError, Tx};

/// Why an occurrence did not fire or waits; shown as the run's `reason` and used as a metric label.
pub mod reason {
    pub const OVERLAP_SKIPPED: &str = "overlap: the previous run is still active";
    pub const BUFFER_FULL: &str = "overlap: an occurrence is already buffered";
    pub const BUFFERED: &str = "buffered: waits for the previous run to end";
    pub const REPLACED: &str = "replaced by a newer occurrence";
    pub const JOB_DELETED: &str = "job deleted before the buffered occurrence could run";
}

/// A missed or skipped occurrence, or a range of consecutive ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotFiredRow {
    pub first: i64,
    pub last: i64,
    pub count: u64,
    pub status: RunStatus,
    pub reason: String,
}

/// One fire transaction for one job.
#[derive(Debug)]
pub struct FireRequest<'a> {
    pub job_id: Uuid,
    /// The job's next occurrence as the caller saw it; None (trigger now) leaves the job row alone.
    pub expected_next: Option<i64>,
    /// The job's next occurrence after this fire (None: the schedule is complete).
    pub next_fire_at: Option<i64>,
    /// Occurrences not fired by the catch-up policy.
    pub not_fired: &'a [NotFiredRow],
    /// Occurrences to fire, oldest first, each with its item tickets (first attempt).
    pub occurrences: Vec<(i64, Vec<Ticket>)>,
    pub overlap: Overlap,
}

/// What happened to one occurrence of a fire request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fired {
    /// Its tickets were written.
    Ticketed,
    /// It has a run already (fired before): nothing written.
    Exists,
    /// Recorded as `scheduled`: it fires when the job's active run ends (`buffer_one`).
    Buffered,
    /// Recorded as `skipped` with this reason (`forbid`, or `buffer_one` with one buffered).
    Skipped(&'static str),
}

/// What one fire transaction did for one job.
#[derive(Debug, Default)]
pub struct FireOutcome {
    /// The job's next occurrence was not the one the caller fired: the wheel entry was stale and
    /// nothing was written.
    pub stale: bool,
    /// Tickets written, to be published.
    pub tickets: Vec<Ticket>,
    /// Per requested occurrence, in order.
    pub occurrences: Vec<(i64, Fired)>,
    /// Active runs ended as `cancelled` by `overlap: replace`.
    pub replaced: u64,
    /// Their open attempts, to be stopped where they are.
    pub cancel: Vec<Cancelled>,
}

/// An open attempt ended by `overlap: replace`, and where its execution may be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cancelled {
    pub ticket: Uuid,
    pub attempt: u32,
    /// The worker that reported its start: it is told to stop.
    pub worker: Option<String>,
    /// Not started and published: its message's sequence in the dispatch stream, where it is
    /// taken back from.
    pub publish_seq: Option<u64>,
    /// Why it was cancelled, for the worker told to stop it.
    pub reason: &'static str,
}

pub(super) fn ticket_json(t: &Ticket) -> Result<String> {
    serde_json::to_string(t).map_err(|e| StoreError::Corrupt(e.to_string()))
}

const ACTIVE: &str = "('dispatched', 'running', 'retrying')";

/// The jobs holding a buffered occurrence (read by an index: see migration `jobs_buffered`).
pub(super) const BUFFERED_JOBS: &str = "SELECT id FROM jobs WHERE buffered_at IS NOT NULL";

impl Store {
    /// Records occurrences of one job in one transaction: moves the job's next occurrence from
    /// `expected_next` to `next_fire_at` (only if it still is `expected_next`: a stale wheel entry
    /// changes nothing), records not-fired occurrences, and for each occurrence to fire applies the
    /// overlap policy against the job's active runs, then writes a run, tickets and first attempts.
    /// An occurrence that already has a run row is not ticketed again.
    pub async fn fire(&self, req: FireRequest<'_>, now: i64) -> Result<FireOutcome> {
        let mut outs = self.fire_batch(vec![req], now).await?;
        Ok(outs.pop().unwrap_or_default())
    }

    /// Several fire requests (of different jobs) in one transaction; one outcome per request, in
    /// order. A stale request writes nothing and does not affect the others.
    pub async fn fire_batch(
        &self,
        requests: Vec<FireRequest<'_>>,
        now: i64,
    ) -> Result<Vec<FireOutcome>> {
        let _timer = self.timer("fire");
        if self.one_trip_available()
            && !requests.is_empty()
            && requests.iter().all(super::bulk::is_simple)
        {
            return super::bulk::fire_simple_in_three_trips(self, requests, now).await;
        }
        let mut tx = self.write().await?;
        let (simple, other): (Vec<_>, Vec<_>) = requests
            .into_iter()
            .enumerate()
            .partition(|(_, r)| super::bulk::is_simple(r));
        let mut outs: Vec<(usize, FireOutcome)> = Vec::with_capacity(simple.len() + other.len());
        let (order, simple): (Vec<usize>, Vec<_>) = simple.into_iter().unzip();
        let fast = super::bulk::fire_simple(&mut tx, simple, now).await?;
        outs.extend(order.into_iter().zip(fast));
        for (i, req) in other {
            outs.push((i, self.fire_in(&mut tx, req, now).await?));
        }
        tx.commit().await?;
        outs.sort_by_key(|(i, _)| *i);
        Ok(outs.into_iter().map(|(_, o)| o).collect())
    }

    async fn fire_in(&self, tx: &mut Tx, req: FireRequest<'_>, now: i64) -> Result<FireOutcome> {
        let id = req.job_id.to_string();
        if let Some(expected) = req.expected_next {
            let state = if req.next_fire_at.is_some() {
                "active"
            } else {
                "completed"
            };
            let n = sqlx::query(
                "UPDATE jobs SET next_fire_at = $1, state = $2, updated_at = $3 \
                 WHERE id = $4 AND next_fire_at = $5 AND state = 'active'",
            )
            .bind(req.next_fire_at)
            .bind(state)
            .bind(now)
            .bind(&id)
            .bind(expected)
            .execute(&mut **tx)
            .await?
            .rows_affected();
            if n == 0 {
                return Ok(FireOutcome {
                    stale: true,
                    ..Default::default()
                });
            }
        }
        for nf in req.not_fired {
            insert_not_fired(tx, &id, nf, now).await?;
        }
        let mut out = FireOutcome::default();
        for (at, tickets) in req.occurrences {
            let fired = self
                .fire_one(tx, &id, at, req.overlap, tickets, now, &mut out)
                .await?;
            out.occurrences.push((at, fired));
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    async fn fire_one(
        &self,
        tx: &mut Tx,
        id: &str,
        at: i64,
        overlap: Overlap,
        tickets: Vec<Ticket>,
        now: i64,
        out: &mut FireOutcome,
    ) -> Result<Fired> {
        if overlap != Overlap::Allow {
            // An occurrence recorded already (a trigger in the same millisecond) is left as it
            // is: no policy may act for it.
            let exists: Option<i64> = sqlx::query_scalar(
                "SELECT scheduled_at FROM runs WHERE job_id = $1 AND scheduled_at = $2",
            )
            .bind(id)
            .bind(at)
            .fetch_optional(&mut **tx)
            .await?;
            if exists.is_some() {
                return Ok(Fired::Exists);
            }
            let active: Vec<i64> = sqlx::query_scalar(&format!(
                "SELECT scheduled_at FROM runs WHERE job_id = $1 AND status IN {ACTIVE}"
            ))
            .bind(id)
            .fetch_all(&mut **tx)
            .await?;
            // A buffered occurrence occupies the job until it is released, even in the moment
            // between the end of the run it waited for and its release: a newer one must not
            // overtake it.
            let buffered: Option<i64> = if overlap == Overlap::BufferOne {
                sqlx::query_scalar("SELECT buffered_at FROM jobs WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&mut **tx)
                    .await?
                    .flatten()
            } else {
                None
            };
            if !active.is_empty() || buffered.is_some() {
                match overlap {
                    Overlap::Allow => {}
                    Overlap::Forbid => {
                        return skip(tx, id, at, reason::OVERLAP_SKIPPED, now).await;
                    }
                    Overlap::BufferOne => {
                        if buffered.is_some() {
                            return skip(tx, id, at, reason::BUFFER_FULL, now).await;
                        }
                        sqlx::query(
                            "INSERT INTO runs (job_id, scheduled_at, status, reason, attempts, created_at, updated_at) \
                             VALUES ($1, $2, 'scheduled', $3, 0, $4, $5)",
                        )
                        .bind(id)
                        .bind(at)
                        .bind(reason::BUFFERED)
                        .bind(now)
                        .bind(now)
                        .execute(&mut **tx)
                        .await?;
                        sqlx::query("UPDATE jobs SET buffered_at = $1 WHERE id = $2")
                            .bind(at)
                            .bind(id)
                            .execute(&mut **tx)
                            .await?;
                        return Ok(Fired::Buffered);
                    }
                    Overlap::Replace => {
                        for old in active {
                            out.cancel.extend(replace_run(tx, id, old, now).await?);
                            out.replaced += 1;
                        }
                    }
                }
            }
        }
        let n = sqlx::query(
            "INSERT INTO runs (job_id, scheduled_at, status, attempts, created_at, updated_at) \
             VALUES ($1, $2, 'dispatched', 1, $3, $4) ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(at)
        .bind(now)
        .bind(now)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        if n == 0 {
            return Ok(Fired::Exists);
        }
        super::bulk::insert_tickets(tx, &tickets, now).await?;
        // A workflow's waiting steps are published when they are released, not now.
        out.tickets
            .extend(tickets.into_iter().filter(|t| !super::bulk::is_waiting(t)));
        Ok(Fired::Ticketed)
    }

    /// Fires the occurrence a `buffer_one` job holds, once the job has no active run. Returns the
    /// tickets to publish (empty when nothing was buffered or a run is still active).
    pub async fn release_buffered(
        &self,
        job_id: Uuid,
        tickets: impl FnOnce(i64) -> Vec<Ticket>,
        now: i64,
    ) -> Result<Vec<Ticket>> {
        let mut tx = self.write().await?;
        let id = job_id.to_string();
        let row = sqlx::query("SELECT buffered_at, state FROM jobs WHERE id = $1")
            .bind(&id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else {
            return Ok(Vec::new());
        };
        let (Some(at), state): (Option<i64>, String) =
            (row.try_get("buffered_at")?, row.try_get("state")?)
        else {
            return Ok(Vec::new());
        };
        let active: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT scheduled_at FROM runs WHERE job_id = $1 AND status IN {ACTIVE} LIMIT 1"
        ))
        .bind(&id)
        .fetch_optional(&mut *tx)
        .await?;
        if active.is_some() {
            return Ok(Vec::new());
        }
        sqlx::query("UPDATE jobs SET buffered_at = NULL WHERE id = $1")
            .bind(&id)
            .execute(&mut *tx)
            .await?;
        let mut written = Vec::new();
        if state == "deleted" {
            sqlx::query(
                "UPDATE runs SET status = 'skipped', reason = $1, updated_at = $2 \
                 WHERE job_id = $3 AND scheduled_at = $4 AND status = 'scheduled'",
            )
            .bind(reason::JOB_DELETED)
            .bind(now)
            .bind(&id)
            .bind(at)
            .execute(&mut *tx)
            .await?;
        } else {
            let n = sqlx::query(
                "UPDATE runs SET status = 'dispatched', reason = NULL, attempts = 1, updated_at = $1 \
                 WHERE job_id = $2 AND scheduled_at = $3 AND status = 'scheduled'",
            )
            .bind(now)
            .bind(&id)
            .bind(at)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 1 {
                let tickets = tickets(at);
                super::bulk::insert_tickets(&mut tx, &tickets, now).await?;
                written.extend(tickets.into_iter().filter(|t| !super::bulk::is_waiting(t)));
            }
        }
        tx.commit().await?;
        Ok(written)
    }

    /// Jobs holding a buffered occurrence: after a restart their release is checked again.
    pub async fn jobs_with_buffered(&self) -> Result<Vec<Uuid>> {
        let ids: Vec<String> = sqlx::query_scalar(BUFFERED_JOBS)
            .fetch_all(&self.pool)
            .await?;
        ids.iter().map(|s| super::parse_uuid(s)).collect()
    }
}

async fn insert_not_fired(tx: &mut Tx, id: &str, nf: &NotFiredRow, now: i64) -> Result<()> {
    let ranged = nf.count > 1;
    sqlx::query(
        "INSERT INTO runs (job_id, scheduled_at, status, reason, attempts, range_end, count, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, 0, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
    )
    .bind(id)
    .bind(nf.first)
    .bind(nf.status.as_str())
    .bind(&nf.reason)
    .bind(ranged.then_some(nf.last))
    .bind(ranged.then_some(nf.count as i64))
    .bind(now)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn skip(tx: &mut Tx, id: &str, at: i64, why: &'static str, now: i64) -> Result<Fired> {
    let nf = NotFiredRow {
        first: at,
        last: at,
        count: 1,
        status: RunStatus::Skipped,
        reason: why.to_string(),
    };
    insert_not_fired(tx, id, &nf, now).await?;
    Ok(Fired::Skipped(why))
}

/// Ends an active run as `cancelled` (overlap `replace`): its open attempts are finished, so a
/// late result of the replaced execution changes nothing. Returns those attempts, for the shard
/// to stop them where they are (a worker running one, a message waiting in the stream).
async fn replace_run(tx: &mut Tx, id: &str, at: i64, now: i64) -> Result<Vec<Cancelled>> {
    let open = cancel_open(tx, OpenOf::Run(id, at), reason::REPLACED, now).await?;
    sqlx::query(&format!(
        "UPDATE tickets SET status = 'cancelled', updated_at = $1 WHERE job_id = $2 AND scheduled_at = $3 \
         AND (status IN {ACTIVE} OR status = 'waiting')"
    ))
    .bind(now)
    .bind(id)
    .bind(at)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "UPDATE runs SET status = 'cancelled', reason = $1, updated_at = $2 WHERE job_id = $3 AND scheduled_at = $4",
    )
    .bind(reason::REPLACED)
    .bind(now)
    .bind(id)
    .bind(at)
    .execute(&mut **tx)
    .await?;
    Ok(open)
}

/// Whose open attempts `cancel_open` finishes.
#[derive(Clone, Copy)]
pub(super) enum OpenOf<'a> {
    /// One ticket's: a workflow step that `fail_fast` stops.
    Ticket(&'a str),
    /// Every item ticket's of the run of job `.0` at `.1`: overlap `replace`.
    Run(&'a str, i64),
}

impl<'a> OpenOf<'a> {
    /// The condition on `tickets t`, its placeholders numbered from `first`.
    fn on_tickets(self, first: usize) -> String {
        match self {
            OpenOf::Ticket(_) => format!("t.id = ${first}"),
            OpenOf::Run(..) => format!("t.job_id = ${first} AND t.scheduled_at = ${}", first + 1),
        }
    }

    /// Binds the condition's values, in its placeholders' order.
    fn bind(
        self,
        q: sqlx::query::Query<'a, sqlx::Any, sqlx::any::AnyArguments<'a>>,
    ) -> sqlx::query::Query<'a, sqlx::Any, sqlx::any::AnyArguments<'a>> {
        match self {
            OpenOf::Ticket(tid) => q.bind(tid),
            OpenOf::Run(job, at) => q.bind(job).bind(at),
        }
    }
}

/// Finishes the open attempts of `of` as cancelled, for `why`, so that a late result of them
/// changes nothing: one select and one update whatever their number. Returns them, for the
/// shard to stop them where they are (a worker running one, a message waiting in the stream).
/// The tickets' own status is the caller's.
pub(super) async fn cancel_open(
    tx: &mut Tx,
    of: OpenOf<'_>,
    why: &'static str,
    now: i64,
) -> Result<Vec<Cancelled>> {
    let select = format!(
        "SELECT a.ticket_id, a.attempt, a.started_at, a.worker, a.publish_seq FROM attempts a \
         JOIN tickets t ON t.id = a.ticket_id WHERE a.finished_at IS NULL AND {}",
        of.on_tickets(1)
    );
    let open = of
        .bind(sqlx::query(&select))
        .fetch_all(&mut **tx)
        .await?
        .iter()
        .map(|r| {
            let started = r.try_get::<Option<i64>, _>("started_at")?.is_some();
            let seq = r.try_get::<Option<i64>, _>("publish_seq")?;
            Ok(Cancelled {
                ticket: super::parse_uuid(&r.try_get::<String, _>("ticket_id")?)?,
                attempt: r.try_get::<i64, _>("attempt")? as u32,
                worker: if started { r.try_get("worker")? } else { None },
                publish_seq: seq.filter(|_| !started).map(|s| s as u64),
                reason: why,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if !open.is_empty() {
        let update = format!(
            "UPDATE attempts SET finished_at = $1, status = 'cancelled', error = $2 \
             WHERE finished_at IS NULL AND ticket_id IN (SELECT t.id FROM tickets t WHERE {})",
            of.on_tickets(3)
        );
        of.bind(sqlx::query(&update).bind(now).bind(why))
            .execute(&mut **tx)
            .await?;
    }
    Ok(open)
}

/// Takes back tickets written ahead of their time and never published, as if their occurrence
/// had not been fired yet (the pause or delete that withdraws them came before it was due): their
/// attempt, ticket and run rows go, and a job still active (or completed by that fire) is moved
/// back to the occurrence, so a tenant pause keeps it for after the resume, as it would have
/// without the lead. A job paused or deleted in the same transaction is left as it is.
pub(super) async fn unfire(tx: &mut Tx, tickets: &[Uuid]) -> Result<()> {
    for t in tickets {
        let tid = t.to_string();
        let row = sqlx::query("SELECT job_id, scheduled_at FROM tickets WHERE id = $1")
            .bind(&tid)
            .fetch_optional(&mut **tx)
            .await?;
        let Some(row) = row else {
            continue;
        };
        let (job, at): (String, i64) = (row.try_get("job_id")?, row.try_get("scheduled_at")?);
        let gone = sqlx::query(
            "DELETE FROM attempts WHERE ticket_id = $1 AND published_at IS NULL AND finished_at IS NULL",
        )
        .bind(&tid)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        if gone == 0 {
            continue;
        }
        sqlx::query("DELETE FROM tickets WHERE id = $1")
            .bind(&tid)
            .execute(&mut **tx)
            .await?;
        // A workflow's steps that wait (no attempt yet) go with the steps they wait for.
        sqlx::query(
            "DELETE FROM tickets WHERE job_id = $1 AND scheduled_at = $2 AND status = 'waiting'",
        )
        .bind(&job)
        .bind(at)
        .execute(&mut **tx)
        .await?;
        // The run goes with its last item's ticket.
        sqlx::query(
            "DELETE FROM runs WHERE job_id = $1 AND scheduled_at = $2 \
             AND NOT EXISTS (SELECT 1 FROM tickets WHERE job_id = $3 AND scheduled_at = $4)",
        )
        .bind(&job)
        .bind(at)
        .bind(&job)
        .bind(at)
        .execute(&mut **tx)
        .await?;
        sqlx::query(
            "UPDATE jobs SET next_fire_at = $1, state = 'active' WHERE id = $2 \
             AND state IN ('active', 'completed') AND (next_fire_at IS NULL OR next_fire_at > $3)",
        )
        .bind(at)
        .bind(&job)
        .bind(at)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// A ticket written ahead of its time (the shard's `fire_lead`) is published when it is due: the
/// outbox scans must not take it earlier.
pub(super) fn not_before(t: &Ticket, now: i64) -> Option<i64> {
    let at = t.scheduled_at.timestamp_millis();
    (at > now).then_some(at)
}
