//! Handing single jobs to another shard, in a `time_window` cluster that grew: a job whose next
//! occurrence falls in a window that a newer layout places on another shard leaves this one
//! (`hand_off`) and the other takes it (`import_jobs`). The source deletes the job's row and
//! keeps it in `handoffs` in the same transaction, so the job is in one shard's `jobs` at a time
//! or on its way; the row is sent until the target confirms (`ack_handoffs`), and a node taking
//! the shard over sends what was not confirmed (`unacked_handoffs`). Runs, tickets and attempts
//! stay where they happened.
//!
//! A job's row counts its hand-offs (`jobs.moves`), and a hand-off carries the count it makes:
//! a shard that handed the job on after taking it in knows a copy with a count not above its
//! own hand-off's for a stale one (sent again after the job moved on), and one above it for the
//! job coming back.
//!
//! It owns the `handoffs` table and the copy of a job's row. It must not decide which jobs leave
//! or where to (the shard loop asks the placement), and it does not send anything.

use std::collections::{HashMap, HashSet};

use chronoshard_wire::growth::{Cell, MovePage, MovedTable};
use sqlx::Row;
use uuid::Uuid;

use super::{
    moves::def,
    parse_uuid,
    sql::{rows_per_statement, Sql},
    Result, Store, StoreError,
};

/// A job that this shard gives to `target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leave {
    pub job: Uuid,
    pub target: u32,
}

/// A job on its way to another shard: what the target is sent until it confirms.
#[derive(Clone, Debug, PartialEq)]
pub struct HandOff {
    pub job: Uuid,
    pub target: u32,
    /// The job's move count after this hand-off: a confirmation is for this hand-off only.
    pub seq: i64,
    /// The job's row, its move count raised by this hand-off.
    pub pages: Vec<MovePage>,
}

/// What became of the jobs asked to leave.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Left {
    /// Taken off this shard, to send.
    pub handed: Vec<HandOff>,
    /// Not to hand off at all: gone, no longer active, or of a paused tenant (tracked again
    /// when they change).
    pub dropped: Vec<Uuid>,
}

/// Where the job a tenant created with an idempotency key went, when it left this shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyLeft {
    /// On its way: the target has not confirmed it.
    Moving,
    /// The target holds it.
    Moved,
}

/// What a target did with jobs handed to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Taken {
    /// The jobs it holds now (taken in, or held already from an earlier copy).
    pub held: Vec<Uuid>,
    /// Copies it dropped as stale: the job moved on from here since.
    pub stale: Vec<Uuid>,
}

/// The statuses of a run that is not over: a job with one stays until it is.
const OPEN_RUN: &str = "('dispatched', 'running', 'retrying')";

/// Pushes `(id, id, ...)` for `ids`.
fn push_ids<'a>(qb: &mut Sql<'a>, ids: &'a [String]) {
    qb.push("(");
    let mut list = qb.separated(", ");
    for id in ids {
        list.push_bind(id.as_str());
    }
    qb.push(")");
}

impl Store {
    /// Takes the jobs of `leaving` off this shard in one transaction: each job that is active,
    /// of a tenant not paused, with no run in progress and no buffered occurrence is deleted
    /// from `jobs` and recorded in `handoffs`, unconfirmed. Returns those, and the jobs not to
    /// hand off at all; the others (a run in progress) stay, to be asked again. The caller keeps
    /// `leaving` short (a few hundred): it runs in the shard loop.
    pub async fn hand_off(&self, leaving: &[Leave], now: i64) -> Result<Left> {
        if leaving.is_empty() {
            return Ok(Left::default());
        }
        let targets: HashMap<String, u32> = (leaving.iter())
            .map(|l| (l.job.to_string(), l.target))
            .collect();
        let ids: Vec<String> = targets.keys().cloned().collect();
        let chunk = rows_per_statement(1);
        // Read first, outside the write transaction: only the shard loop (the caller) changes
        // job rows or opens runs, so what is read stays true until the write; a turn that hands
        // nothing off writes nothing.
        let mut conn = self.pool.acquire().await?;
        let mut open = HashSet::new();
        for part in ids.chunks(chunk) {
            let mut qb = Sql::new(&conn);
            qb.push(format!(
                "SELECT DISTINCT job_id FROM runs WHERE status IN {OPEN_RUN} AND job_id IN "
            ));
            push_ids(&mut qb, part);
            let (sql, args) = qb.build();
            let found: Vec<String> = sqlx::query_scalar_with(&sql, args)
                .fetch_all(&mut *conn)
                .await?;
            open.extend(found);
        }
        let free: Vec<String> = ids.into_iter().filter(|id| !open.contains(id)).collect();
        let jobs = def(MovedTable::Jobs);
        let moves_at = jobs.position("moves");
        let key_at = jobs.position("idempotency_key");
        let buffered_at = jobs.position("buffered_at");
        let mut out = Vec::with_capacity(free.len());
        let mut live = HashSet::new();
        for part in free.chunks(chunk) {
            let mut qb = Sql::new(&conn);
            qb.push(format!(
                "SELECT {} FROM jobs WHERE state = 'active' \
                 AND tenant NOT IN (SELECT tenant FROM paused_tenants) AND id IN ",
                jobs.column_list()
            ));
            push_ids(&mut qb, part);
            let (sql, args) = qb.build();
            for row in sqlx::query_with(&sql, args).fetch_all(&mut *conn).await? {
                let mut cells = jobs.decode(&row)?;
                if let Cell::Text(id) = &cells[0] {
                    live.insert(id.clone());
                }
                // Waits for its run's end, like a job with a run in progress.
                if cells[buffered_at] != Cell::Null {
                    continue;
                }
                let (Cell::Text(id), Cell::Text(tenant), Cell::Int(moves)) =
                    (&cells[0], &cells[1], &cells[moves_at])
                else {
                    return Err(StoreError::Corrupt("a job row without id or tenant".into()));
                };
                let (job, tenant, seq) = (parse_uuid(id)?, tenant.clone(), moves + 1);
                let target = targets[id];
                let key = match &cells[key_at] {
                    Cell::Text(k) => Some(k.clone()),
                    _ => None,
                };
                cells[moves_at] = Cell::Int(seq);
                let pages = vec![MovePage {
                    table: MovedTable::Jobs,
                    rows: vec![cells],
                }];
                out.push((
                    tenant,
                    key,
                    seq,
                    HandOff {
                        job,
                        target,
                        seq,
                        pages,
                    },
                ));
            }
        }
        drop(conn);
        let dropped = free.iter().filter(|id| !live.contains(*id));
        let dropped = dropped.map(|id| parse_uuid(id)).collect::<Result<_>>()?;
        if out.is_empty() {
            return Ok(Left {
                handed: Vec::new(),
                dropped,
            });
        }
        let mut tx = self.write().await?;
        for part in out.chunks(rows_per_statement(8)) {
            let mut qb = Sql::new(&tx);
            qb.push(
                "INSERT INTO handoffs (job_id, target, seq, tenant, idempotency_key, body, acked, \
                 created_at) ",
            );
            qb.push_values(part, |mut row, (tenant, key, seq, h)| {
                let body = serde_json::to_string(&h.pages).expect("pages serialise");
                row.push_bind(h.job.to_string())
                    .push_bind(i64::from(h.target))
                    .push_bind(*seq)
                    .push_bind(tenant.as_str())
                    .push_bind(key.as_deref())
                    .push_bind(body)
                    .push_bind(0i64)
                    .push_bind(now);
            });
            qb.push(
                " ON CONFLICT (job_id) DO UPDATE SET target = excluded.target, \
                 seq = excluded.seq, tenant = excluded.tenant, \
                 idempotency_key = excluded.idempotency_key, body = excluded.body, acked = 0, \
                 created_at = excluded.created_at",
            );
            let (sql, args) = qb.build();
            sqlx::query_with(&sql, args).execute(&mut *tx).await?;
        }
        let gone: Vec<String> = out.iter().map(|(_, _, _, h)| h.job.to_string()).collect();
        for part in gone.chunks(chunk) {
            let mut qb = Sql::new(&tx);
            qb.push("DELETE FROM jobs WHERE id IN ");
            push_ids(&mut qb, part);
            let (sql, args) = qb.build();
            sqlx::query_with(&sql, args).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(Left {
            dropped,
            handed: out.into_iter().map(|(_, _, _, h)| h).collect(),
        })
    }

    /// The hand-offs no target has confirmed, made at or before `until` (ms), oldest first.
    pub async fn unacked_handoffs(&self, until: i64) -> Result<Vec<HandOff>> {
        let rows = sqlx::query(
            "SELECT job_id, target, seq, body FROM handoffs \
             WHERE acked = 0 AND created_at <= $1 ORDER BY created_at",
        )
        .bind(until)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let job = parse_uuid(&row.try_get::<String, _>(0)?)?;
                let corrupt = |e: String| StoreError::Corrupt(format!("hand-off of {job}: {e}"));
                Ok(HandOff {
                    job,
                    target: u32::try_from(row.try_get::<i64, _>(1)?)
                        .map_err(|e| corrupt(e.to_string()))?,
                    seq: row.try_get(2)?,
                    pages: serde_json::from_str(&row.try_get::<String, _>(3)?)
                        .map_err(|e| corrupt(e.to_string()))?,
                })
            })
            .collect()
    }

    /// Records that the targets hold these jobs now (or dropped a stale copy of them), each for
    /// the hand-off of the given move count only (a later hand-off of the same job is not
    /// confirmed by an answer to an earlier one). The job's row is no longer kept.
    pub async fn ack_handoffs(&self, jobs: &[(Uuid, i64)]) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let mut tx = self.write().await?;
        for part in jobs.chunks(rows_per_statement(2)) {
            let mut qb = Sql::new(&tx);
            qb.push("UPDATE handoffs SET acked = 1, body = '' WHERE ");
            let mut or = qb.separated(" OR ");
            for (job, seq) in part {
                or.push("(job_id = ")
                    .push_bind_unseparated(job.to_string())
                    .push_unseparated(" AND seq = ")
                    .push_bind_unseparated(*seq)
                    .push_unseparated(")");
            }
            let (sql, args) = qb.build();
            sqlx::query_with(&sql, args).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Whether job `id` left this shard and its target has not confirmed it yet: the job is in
    /// no shard's `jobs` for the moment.
    pub async fn handing_off(&self, id: Uuid) -> Result<bool> {
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM handoffs WHERE job_id = $1 AND acked = 0")
                .bind(id.to_string())
                .fetch_one(&self.pool)
                .await?;
        Ok(n > 0)
    }

    /// Where the job a tenant created with idempotency key `key` went, if it left this shard.
    pub async fn key_left(&self, tenant: &str, key: &str) -> Result<Option<KeyLeft>> {
        let acked: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(acked) FROM handoffs WHERE tenant = $1 AND idempotency_key = $2",
        )
        .bind(tenant)
        .bind(key)
        .fetch_one(&self.pool)
        .await?;
        Ok(acked.map(|a| match a {
            0 => KeyLeft::Moving,
            _ => KeyLeft::Moved,
        }))
    }

    /// Takes in jobs another shard handed here, in one transaction. A job held already is kept
    /// as it is (a copy sent again); a copy whose move count is not above that of this shard's
    /// own hand-off of the job is stale and dropped; a job coming back is taken in. A job whose
    /// idempotency key another job of its tenant holds here (two creates that raced a hand-off)
    /// is taken without its key, so both keep firing and neither is lost. Returns what it holds
    /// and dropped, and how many jobs it inserted.
    pub async fn import_jobs(&self, pages: Vec<MovePage>) -> Result<(Taken, u64)> {
        let jobs = def(MovedTable::Jobs);
        let moves_at = jobs.position("moves");
        let key_at = jobs.position("idempotency_key");
        let mut tx = self.write().await?;
        let mut taken = Taken::default();
        let mut rows = Vec::new();
        for page in pages {
            if page.table != MovedTable::Jobs {
                return Err(StoreError::BadMove(format!(
                    "a hand-off carries job rows only, not {:?}",
                    page.table
                )));
            }
            jobs.check_rows(&page.rows)?;
            rows.extend(page.rows);
        }
        let mut fresh = Vec::with_capacity(rows.len());
        for mut row in rows {
            let (Cell::Text(id), Cell::Text(tenant), Cell::Int(moves)) =
                (&row[0], &row[1], &row[moves_at])
            else {
                return Err(StoreError::BadMove(
                    "a job row without id, tenant or move count".into(),
                ));
            };
            let (job, moves) = (parse_uuid(id)?, *moves);
            let left: Option<i64> =
                sqlx::query_scalar("SELECT seq FROM handoffs WHERE job_id = $1")
                    .bind(id.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
            if let Cell::Text(key) = &row[key_at] {
                let holder: Option<String> = sqlx::query_scalar(
                    "SELECT id FROM jobs WHERE tenant = $1 AND idempotency_key = $2",
                )
                .bind(tenant.as_str())
                .bind(key.as_str())
                .fetch_optional(&mut *tx)
                .await?;
                if holder.is_some_and(|h| h != *id) {
                    tracing::warn!(%job, key = key.as_str(),
                        "a job arrived whose idempotency key another job holds here; taken without it");
                    row[key_at] = Cell::Null;
                }
            }
            match left {
                Some(seq) if seq >= moves => taken.stale.push(job),
                Some(_) => {
                    sqlx::query("DELETE FROM handoffs WHERE job_id = $1")
                        .bind(job.to_string())
                        .execute(&mut *tx)
                        .await?;
                    fresh.push((job, row));
                }
                None => fresh.push((job, row)),
            }
        }
        let ids: Vec<Uuid> = fresh.iter().map(|(j, _)| *j).collect();
        let page = MovePage {
            table: MovedTable::Jobs,
            rows: fresh.into_iter().map(|(_, r)| r).collect(),
        };
        let mut inserted = super::Imported::default();
        self.insert_page(&mut tx, page, &mut inserted).await?;
        let id_strings: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        for part in id_strings.chunks(rows_per_statement(1)) {
            let mut qb = Sql::new(&tx);
            qb.push("SELECT id FROM jobs WHERE id IN ");
            push_ids(&mut qb, part);
            let (sql, args) = qb.build();
            let held: Vec<String> = sqlx::query_scalar_with(&sql, args)
                .fetch_all(&mut *tx)
                .await?;
            for id in held {
                taken.held.push(parse_uuid(&id)?);
            }
        }
        tx.commit().await?;
        Ok((taken, inserted.rows))
    }
}
