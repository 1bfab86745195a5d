//! Handing single jobs to another shard, in a `time_window` cluster that grew: a job whose next
//! occurrence falls in a window that a newer layout places on another shard leaves this one
//! (`hand_off`) and the other takes it (`import_jobs`). The source deletes the job's row and
//! keeps it in `handoffs` in the same transaction, so the job is in one shard's `jobs` at a time
//! or on its way; the row is sent until the target confirms (`ack_handoffs`), and a node taking
//! the shard over sends what was not confirmed (`unacked_handoffs`). Runs, tickets and attempts
//! stay where they happened.
//!
//! It owns the `handoffs` table and the copy of a job's row. It must not decide which jobs leave
//! or where to (the shard loop asks the placement), and it does not send anything.

use std::collections::HashSet;

use chronoshard_wire::growth::{Cell, MovePage, MovedTable};
use sqlx::Row;
use uuid::Uuid;

use super::{
    moves::{def, Imported},
    parse_uuid,
    sql::Sql,
    Result, Store, StoreError,
};

/// A job that this shard gives to `target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leave {
    pub job: Uuid,
    pub target: u32,
    /// The first window of the layout that places the job's next occurrence on `target`.
    pub layout: i64,
}

/// A job on its way to another shard: what the target is sent until it confirms.
#[derive(Clone, Debug, PartialEq)]
pub struct HandOff {
    pub job: Uuid,
    pub target: u32,
    pub layout: i64,
    /// The job's row, and its tenant's pause when paused here (so the target holds it too).
    pub pages: Vec<MovePage>,
}

/// The statuses of a run that is not over: a job with one stays until it is.
const OPEN_RUN: &str = "('dispatched', 'running', 'retrying')";

impl Store {
    /// Takes the jobs of `leaving` off this shard in one transaction: each job that is active,
    /// has no run in progress and no buffered occurrence is deleted from `jobs` and recorded in
    /// `handoffs`, unconfirmed. Returns those; the others stay, to be asked again.
    pub async fn hand_off(&self, leaving: &[Leave], now: i64) -> Result<Vec<HandOff>> {
        if leaving.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.write().await?;
        let ids: Vec<String> = leaving.iter().map(|l| l.job.to_string()).collect();
        let mut qb = Sql::new(&tx);
        qb.push(format!(
            "SELECT DISTINCT job_id FROM runs WHERE status IN {OPEN_RUN} AND job_id IN ("
        ));
        let mut list = qb.separated(", ");
        for id in &ids {
            list.push_bind(id.as_str());
        }
        qb.push(")");
        let (sql, args) = qb.build();
        let open: HashSet<String> = sqlx::query_scalar_with(&sql, args)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .collect();
        let jobs = def(MovedTable::Jobs);
        let mut qb = Sql::new(&tx);
        qb.push(format!(
            "SELECT {} FROM jobs WHERE state = 'active' AND buffered_at IS NULL AND id IN (",
            jobs.column_list()
        ));
        let mut list = qb.separated(", ");
        for id in ids.iter().filter(|id| !open.contains(*id)) {
            list.push_bind(id.as_str());
        }
        qb.push(")");
        let (sql, args) = qb.build();
        let rows = match ids.len() == open.len() {
            true => Vec::new(),
            false => sqlx::query_with(&sql, args).fetch_all(&mut *tx).await?,
        };
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let cells = jobs.decode(row)?;
            let (Cell::Text(id), Cell::Text(tenant)) = (&cells[0], &cells[1]) else {
                return Err(StoreError::Corrupt("a job row without id or tenant".into()));
            };
            let job = parse_uuid(id)?;
            let leave = leaving.iter().find(|l| l.job == job).expect("asked for");
            let key = match &cells[jobs.position("idempotency_key")] {
                Cell::Text(k) => Some(k.clone()),
                _ => None,
            };
            let mut pages = Vec::with_capacity(2);
            let paused: Option<i64> =
                sqlx::query_scalar("SELECT paused_at FROM paused_tenants WHERE tenant = $1")
                    .bind(tenant.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
            if let Some(at) = paused {
                pages.push(MovePage {
                    table: MovedTable::PausedTenants,
                    rows: vec![vec![Cell::Text(tenant.clone()), Cell::Int(at)]],
                });
            }
            let tenant = tenant.clone();
            pages.push(MovePage {
                table: MovedTable::Jobs,
                rows: vec![cells],
            });
            let body = serde_json::to_string(&pages).expect("pages serialise");
            sqlx::query(
                "INSERT INTO handoffs (job_id, target, layout, tenant, idempotency_key, body, \
                 acked, created_at) VALUES ($1, $2, $3, $4, $5, $6, 0, $7) \
                 ON CONFLICT (job_id) DO UPDATE SET target = excluded.target, \
                 layout = excluded.layout, tenant = excluded.tenant, \
                 idempotency_key = excluded.idempotency_key, body = excluded.body, acked = 0, \
                 created_at = excluded.created_at",
            )
            .bind(job.to_string())
            .bind(i64::from(leave.target))
            .bind(leave.layout)
            .bind(tenant)
            .bind(key)
            .bind(body)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM jobs WHERE id = $1")
                .bind(job.to_string())
                .execute(&mut *tx)
                .await?;
            out.push(HandOff {
                job,
                target: leave.target,
                layout: leave.layout,
                pages,
            });
        }
        tx.commit().await?;
        Ok(out)
    }

    /// The hand-offs no target has confirmed, made at or before `until` (ms), oldest first.
    pub async fn unacked_handoffs(&self, until: i64) -> Result<Vec<HandOff>> {
        let rows = sqlx::query(
            "SELECT job_id, target, layout, body FROM handoffs \
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
                    layout: row.try_get(2)?,
                    pages: serde_json::from_str(&row.try_get::<String, _>(3)?)
                        .map_err(|e| corrupt(e.to_string()))?,
                })
            })
            .collect()
    }

    /// Records that the targets hold these jobs now.
    pub async fn ack_handoffs(&self, jobs: &[Uuid]) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let mut tx = self.write().await?;
        let mut qb = Sql::new(&tx);
        qb.push("UPDATE handoffs SET acked = 1 WHERE job_id IN (");
        let mut list = qb.separated(", ");
        for job in jobs {
            list.push_bind(job.to_string());
        }
        qb.push(")");
        let (sql, args) = qb.build();
        sqlx::query_with(&sql, args).execute(&mut *tx).await?;
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

    /// Whether the job a tenant created with idempotency key `key` is on its way elsewhere.
    pub async fn handing_off_key(&self, tenant: &str, key: &str) -> Result<bool> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM handoffs WHERE tenant = $1 AND idempotency_key = $2 AND acked = 0",
        )
        .bind(tenant)
        .bind(key)
        .fetch_one(&self.pool)
        .await?;
        Ok(n > 0)
    }

    /// Takes in jobs another shard handed here under the layout starting at window `layout`, in
    /// one transaction. A job present already is kept as it is (a copy sent again); a job that
    /// left this shard under a layout as new or newer is not taken back (a stale copy); a job
    /// that left under an older one comes back. Returns the jobs now held.
    pub async fn import_jobs(&self, layout: i64, pages: Vec<MovePage>) -> Result<Imported> {
        let mut tx = self.write().await?;
        let mut imported = Imported::default();
        for mut page in pages {
            if page.table == MovedTable::Jobs {
                let mut kept = Vec::with_capacity(page.rows.len());
                for row in page.rows {
                    let Some(Cell::Text(id)) = row.first() else {
                        return Err(StoreError::BadMove("a job row without its id".into()));
                    };
                    let left: Option<i64> =
                        sqlx::query_scalar("SELECT layout FROM handoffs WHERE job_id = $1")
                            .bind(id.as_str())
                            .fetch_optional(&mut *tx)
                            .await?;
                    match left {
                        Some(newer) if newer >= layout => continue,
                        Some(_) => {
                            sqlx::query("DELETE FROM handoffs WHERE job_id = $1")
                                .bind(id.as_str())
                                .execute(&mut *tx)
                                .await?;
                        }
                        None => {}
                    }
                    kept.push(row);
                }
                page.rows = kept;
            }
            self.insert_page(&mut tx, page, &mut imported).await?;
        }
        tx.commit().await?;
        Ok(imported)
    }
}
