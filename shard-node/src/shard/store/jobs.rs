//! Job rows: create (with idempotency keys), read, list, update, and the due-job scan the loader uses.

use std::collections::{HashMap, HashSet};

use chronoshard_wire::{JobSpec, JobState};
use sqlx::{AnyConnection, Row};
use uuid::Uuid;

use super::{
    json_rows, parse_uuid,
    sql::{rows_per_statement, Sql},
    Result, Store, StoreError,
};

/// A job as stored: its spec, lifecycle state and next unfired occurrence.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRow {
    pub id: Uuid,
    pub tenant: String,
    pub spec: JobSpec,
    pub state: JobState,
    pub created_at: i64,
    pub updated_at: i64,
    /// When the current schedule was set; `delay` and the default `start_at` count from it.
    pub anchor_at: i64,
    pub next_fire_at: Option<i64>,
    /// `overlap: buffer_one`: the occurrence waiting for the active run to end.
    pub buffered_at: Option<i64>,
}

#[derive(Debug, PartialEq)]
pub enum CreateOutcome {
    Created,
    /// The tenant already created a job with this idempotency key and the same spec.
    Existing(Box<JobRow>),
    /// The key was used before with a different spec.
    KeyReused,
}

const JOB_COLUMNS: &str =
    "id, tenant, spec, state, created_at, updated_at, anchor_at, next_fire_at, buffered_at";

/// A job's next occurrence as the loader hands it to the wheel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueRow {
    pub id: Uuid,
    pub at: i64,
    pub priority: u8,
    pub tenant: String,
}

/// A job's `JOB_COLUMNS` in order.
type JobColumns = (
    String,
    String,
    String,
    String,
    i64,
    i64,
    i64,
    Option<i64>,
    Option<i64>,
);

fn job_from_row(row: &sqlx::any::AnyRow) -> Result<JobRow> {
    job_from_columns((
        row.try_get("id")?,
        row.try_get("tenant")?,
        row.try_get("spec")?,
        row.try_get("state")?,
        row.try_get("created_at")?,
        row.try_get("updated_at")?,
        row.try_get("anchor_at")?,
        row.try_get("next_fire_at")?,
        row.try_get("buffered_at")?,
    ))
}

fn job_from_columns(c: JobColumns) -> Result<JobRow> {
    let (id, tenant, spec, state, created_at, updated_at, anchor_at, next_fire_at, buffered_at) = c;
    Ok(JobRow {
        id: parse_uuid(&id)?,
        tenant,
        spec: serde_json::from_str(&spec)
            .map_err(|e| StoreError::Corrupt(format!("job spec: {e}")))?,
        state: JobState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("job state {state:?}")))?,
        created_at,
        updated_at,
        anchor_at,
        next_fire_at,
        buffered_at,
    })
}

impl Store {
    /// Inserts a job. With an idempotency key the tenant already used, returns the earlier job
    /// (same spec) or `KeyReused` (different spec) and writes nothing.
    pub async fn create_job(
        &self,
        job: &JobRow,
        idempotency_key: Option<&str>,
    ) -> Result<CreateOutcome> {
        let mut outcomes = self.create_jobs(&[(job, idempotency_key)]).await?;
        Ok(outcomes.pop().expect("one outcome per job"))
    }

    /// `create_job` for several jobs in one transaction (one commit for a burst of creates),
    /// one outcome per job in order. Each sees the ones before it: the same id or key twice in
    /// one call creates once.
    pub async fn create_jobs(
        &self,
        jobs: &[(&JobRow, Option<&str>)],
    ) -> Result<Vec<CreateOutcome>> {
        let _timer = self.timer("create");
        if self.one_trip_available()
            && !jobs.is_empty()
            && jobs.len() <= rows_per_statement(INSERT_COLUMNS)
        {
            return self.create_in_one_trip(jobs).await;
        }
        let mut tx = self.write().await?;
        let outcomes = create_in(&mut tx, jobs).await?;
        tx.commit().await?;
        Ok(outcomes)
    }

    /// `create_jobs` on SQLite for up to one statement's rows: the insert in a one-trip
    /// transaction (`one_trip`), then, for the rare row it skipped, the lookups of what it
    /// collided with. They may come after the commit: a delete only marks a job row, and the one
    /// thing that removes one, a hand-off to another shard, runs in the shard loop as creates
    /// do, so what a skipped row collided with is still there.
    async fn create_in_one_trip(
        &self,
        jobs: &[(&JobRow, Option<&str>)],
    ) -> Result<Vec<CreateOutcome>> {
        let mut trip = self.trip();
        push_insert(&mut trip, jobs)?;
        let rows = self.one_trip(trip).await?;
        let mut inserted: HashSet<Uuid> = HashSet::with_capacity(rows.len());
        for row in rows {
            inserted.insert(parse_uuid(&row.try_get::<String, _>("id")?)?);
        }
        if inserted.len() == jobs.len() {
            return Ok(jobs.iter().map(|_| CreateOutcome::Created).collect());
        }
        let mut conn = self.pool.acquire().await?;
        outcomes_of(&mut conn, jobs, inserted).await
    }

    /// Whether a create of `job` repeats an earlier one (the same id, or the tenant's same
    /// idempotency key): such a create is answered with what the first made, so no limit on new
    /// creates applies to it.
    pub async fn repeats_a_create(&self, job: &JobRow, key: Option<&str>) -> Result<bool> {
        let mut conn = self.pool.acquire().await?;
        Ok(earlier(&mut conn, job, key).await?.is_some())
    }

    /// The job `tenant` created with idempotency key `key`, if this shard holds it.
    pub async fn job_by_key(&self, tenant: &str, key: &str) -> Result<Option<JobRow>> {
        let sql =
            format!("SELECT {JOB_COLUMNS} FROM jobs WHERE tenant = $1 AND idempotency_key = $2");
        let row = sqlx::query(&sql)
            .bind(tenant)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    pub async fn get_job(&self, id: Uuid) -> Result<Option<JobRow>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1");
        let row = sqlx::query(&sql)
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    /// Several jobs by id (those that exist), in one query (the fire path's read: its rows come
    /// back as one JSON value, see `select_json_rows`).
    pub async fn get_jobs(&self, ids: &[Uuid]) -> Result<HashMap<Uuid, JobRow>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let mut conn = self.pool.acquire().await?;
        let mut sql = Sql::new(&conn);
        sql.select_json_rows(JOB_COLUMNS)
            .push(" FROM jobs WHERE id IN (");
        sql.list(ids.iter().map(Uuid::to_string)).push(")");
        let (text, args) = sql.build();
        let rows: String = sqlx::query_scalar_with(&text, args)
            .fetch_one(&mut *conn)
            .await?;
        json_rows::<JobColumns>(&rows)?
            .into_iter()
            .map(|c| job_from_columns(c).map(|j| (j.id, j)))
            .collect()
    }

    /// Jobs ordered by id (UUIDv7, so by creation time), after the cursor, optionally one tenant's;
    /// deleted jobs are left out.
    pub async fn list_jobs(
        &self,
        kind: JobKind,
        tenant: Option<&str>,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<JobRow>> {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE state != 'deleted' AND kind = $1 \
             AND ($2 IS NULL OR tenant = $3) AND id > $4 ORDER BY id LIMIT $5"
        );
        let after = after.map(|u| u.to_string()).unwrap_or_default();
        let rows = sqlx::query(&sql)
            .bind(kind.as_str())
            .bind(tenant)
            .bind(tenant)
            .bind(after)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// Replaces a job's spec, state and next occurrence. Returns false when the job is gone.
    /// Writes a job's new spec, state and next occurrence, and in the same transaction takes back
    /// `unfire`: its tickets fired ahead that a pause or delete withdrew.
    pub async fn update_job(&self, job: &JobRow, unfire: &[Uuid]) -> Result<bool> {
        let mut tx = self.write().await?;
        let n = sqlx::query("UPDATE jobs SET spec = $1, state = $2, next_fire_at = $3, updated_at = $4, anchor_at = $5, priority = $6 WHERE id = $7")
            .bind(serde_json::to_string(&job.spec).map_err(|e| StoreError::Corrupt(e.to_string()))?)
            .bind(job.state.as_str())
            .bind(job.next_fire_at)
            .bind(job.updated_at)
            .bind(job.anchor_at)
            .bind(job.spec.priority as i64)
            .bind(job.id.to_string())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if n == 1 {
            super::tickets::unfire(&mut tx, unfire).await?;
        }
        tx.commit().await?;
        Ok(n == 1)
    }

    /// Active jobs whose next occurrence falls in `(after, until]` (`after` None: no lower bound),
    /// for the loader that fills the wheel. Jobs of paused tenants are left out.
    pub async fn due_jobs(&self, after: Option<i64>, until: i64) -> Result<Vec<DueRow>> {
        let _timer = self.timer("load");
        let rows = sqlx::query(
            "SELECT id, next_fire_at, priority, tenant FROM jobs WHERE next_fire_at IS NOT NULL AND state = 'active' \
             AND next_fire_at > $1 AND next_fire_at <= $2 \
             AND tenant NOT IN (SELECT tenant FROM paused_tenants) ORDER BY next_fire_at",
        )
        .bind(after.unwrap_or(i64::MIN))
        .bind(until)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(DueRow {
                    id: parse_uuid(&r.try_get::<String, _>("id")?)?,
                    at: r.try_get("next_fire_at")?,
                    priority: r.try_get::<i64, _>("priority")?.clamp(0, 9) as u8,
                    tenant: r.try_get("tenant")?,
                })
            })
            .collect()
    }

    /// The earliest occurrence `due_jobs` would return after `after`, if any: how far the wheel's
    /// loads may go without finding anything new while nothing is written.
    pub async fn next_due_after(&self, after: i64) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT MIN(next_fire_at) FROM jobs WHERE next_fire_at IS NOT NULL AND state = 'active' \
             AND next_fire_at > $1 AND tenant NOT IN (SELECT tenant FROM paused_tenants)",
        )
        .bind(after)
        .fetch_one(&self.pool)
        .await?)
    }

    /// A tenant's active jobs, for tenant-wide resume and trigger.
    pub async fn active_jobs_of(&self, tenant: &str) -> Result<Vec<JobRow>> {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE tenant = $1 AND state = 'active' ORDER BY id"
        );
        let rows = sqlx::query(&sql).bind(tenant).fetch_all(&self.pool).await?;
        rows.iter().map(job_from_row).collect()
    }
}

/// Columns a create writes, in the order `insert_new` binds them.
const INSERT_COLUMNS: usize = 11;

/// Inserts every job whose id and key are new, with multi-row statements that skip conflicts,
/// then looks up what each skipped one collided with. A burst of new jobs thus costs one
/// statement per chunk instead of three per job (two lookups and an insert, each a round trip),
/// and the rare repeat pays its lookups alone. Rows go in in order, so of two with the same id
/// or key in one call the first is created and the second finds it, as one by one.
async fn create_in(
    tx: &mut super::Tx,
    jobs: &[(&JobRow, Option<&str>)],
) -> Result<Vec<CreateOutcome>> {
    let mut inserted: HashSet<Uuid> = HashSet::with_capacity(jobs.len());
    for chunk in jobs.chunks(rows_per_statement(INSERT_COLUMNS)) {
        insert_new(tx, chunk, &mut inserted).await?;
    }
    outcomes_of(tx, jobs, inserted).await
}

/// The outcome of each create, given the ids the inserts created; a skipped row looks up the
/// job it collided with.
async fn outcomes_of(
    conn: &mut AnyConnection,
    jobs: &[(&JobRow, Option<&str>)],
    mut inserted: HashSet<Uuid>,
) -> Result<Vec<CreateOutcome>> {
    let mut outcomes = Vec::with_capacity(jobs.len());
    for (job, key) in jobs {
        // Taken out as it is answered: an id repeated within the call was inserted by its first
        // row only, and the repeat finds that row below.
        if inserted.remove(&job.id) {
            outcomes.push(CreateOutcome::Created);
            continue;
        }
        outcomes.push(match earlier(conn, job, *key).await? {
            Some(existing) if existing.spec == job.spec => {
                CreateOutcome::Existing(Box::new(existing))
            }
            Some(_) => CreateOutcome::KeyReused,
            None => {
                return Err(StoreError::Corrupt(format!(
                    "job {} was neither created nor found",
                    job.id
                )))
            }
        });
    }
    Ok(outcomes)
}

/// One multi-row insert that skips rows whose id or (tenant, key) exists; adds the ids it
/// created to `inserted`.
async fn insert_new(
    tx: &mut super::Tx,
    chunk: &[(&JobRow, Option<&str>)],
    inserted: &mut HashSet<Uuid>,
) -> Result<()> {
    let mut sql = Sql::new(tx);
    push_insert(&mut sql, chunk)?;
    let (text, args) = sql.build();
    for row in sqlx::query_with(&text, args).fetch_all(&mut **tx).await? {
        inserted.insert(parse_uuid(&row.try_get::<String, _>("id")?)?);
    }
    Ok(())
}

/// What a row of `jobs` holds: a job, or a workflow (whose spec has steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobKind {
    Job,
    Workflow,
}

impl JobKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            JobKind::Job => "job",
            JobKind::Workflow => "workflow",
        }
    }
}

fn kind_of(spec: &chronoshard_wire::JobSpec) -> &'static str {
    match spec.workflow {
        Some(_) => JobKind::Workflow.as_str(),
        None => JobKind::Job.as_str(),
    }
}

/// The multi-row insert of `jobs` that skips conflicts and returns the ids it created.
fn push_insert<'q>(sql: &mut Sql<'q>, jobs: &[(&'q JobRow, Option<&'q str>)]) -> Result<()> {
    let specs = jobs
        .iter()
        .map(|(job, _)| {
            serde_json::to_string(&job.spec).map_err(|e| StoreError::Corrupt(e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    sql.statement().push(
        "INSERT INTO jobs (id, tenant, spec, state, created_at, updated_at, anchor_at, \
         next_fire_at, idempotency_key, priority, kind) ",
    );
    sql.push_values(jobs.iter().zip(specs), |mut row, ((job, key), spec)| {
        row.push_bind(job.id.to_string())
            .push_bind(job.tenant.as_str())
            .push_bind(spec)
            .push_bind(job.state.as_str())
            .push_bind(job.created_at)
            .push_bind(job.updated_at)
            .push_bind(job.anchor_at)
            .push_bind(job.next_fire_at)
            .push_bind(*key)
            .push_bind(job.spec.priority as i64)
            .push_bind(kind_of(&job.spec));
    });
    sql.push(" ON CONFLICT DO NOTHING RETURNING id");
    Ok(())
}

/// The job a create collided with: the same id (a retried request) first, then the same key
/// (a repeated one).
async fn earlier(
    conn: &mut AnyConnection,
    job: &JobRow,
    key: Option<&str>,
) -> Result<Option<JobRow>> {
    let by_id = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1");
    let mut row = sqlx::query(&by_id)
        .bind(job.id.to_string())
        .fetch_optional(&mut *conn)
        .await?;
    if let (None, Some(key)) = (&row, key) {
        let by_key =
            format!("SELECT {JOB_COLUMNS} FROM jobs WHERE tenant = $1 AND idempotency_key = $2");
        row = sqlx::query(&by_key)
            .bind(&job.tenant)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?;
    }
    row.as_ref().map(job_from_row).transpose()
}
