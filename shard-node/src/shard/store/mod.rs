//! The shard database: one SQLite file per shard on one machine, or one Postgres schema per shard
//! when nodes on several machines must reach every shard. It owns every durable fact about the
//! shard's jobs, occurrences, tickets and attempts, and enforces the two invariants the rest of the
//! node relies on: one ticket per occurrence item (unique keys), and writes only by the current
//! owner (every write transaction starts by checking the epoch in `shard_meta`).
//!
//! One set of queries serves both backends through sqlx's `Any` driver: placeholders are `$n`
//! (SQLite reads them by number too; statements built for many rows are written with their
//! values by one builder, `sql::Sql`), integers are 64-bit, and the only backend-specific SQL
//! outside the two migration folders is `select_json_rows`'s aggregate and SQLite's one-trip
//! transactions (`one_trip`: a whole write
//! transaction as one multi-statement string, for creates and ack marking). It must not know
//! about NATS, the wheel or the clock: callers pass `now`.

mod bulk;
mod checkpoint;
mod handoffs;
mod jobs;
mod migrations;
mod moves;
mod one_trip;
mod outbox;
mod results;
mod sql;
mod tenants;
mod tickets;
mod views;
mod workflows;

use std::path::PathBuf;

use sqlx::{
    any::{AnyConnectOptions, AnyPoolOptions},
    Any, AnyConnection, AnyPool, Connection, Database, Executor, Sqlite, Transaction,
};

pub use checkpoint::{Checkpoint, WalStamp};
pub use handoffs::{HandOff, KeyLeft, Leave, Left, Taken};
pub use jobs::{CreateOutcome, DueRow, JobKind, JobRow};
pub use moves::{Cell, ExportCursor, Imported, KeyMove, MovePage, MovedTable, PAGE_OVERHEAD};
pub use outbox::{Acked, Outgoing, Unstarted};
pub use results::{Applied, FollowUp, OpenAttempt, Replay};
pub use tickets::{reason, Cancelled, FireOutcome, FireRequest, Fired, NotFiredRow};
pub use views::run_status;
pub use workflows::{Advanced, RetryRun, StepRow};

use migrations::{POSTGRES_MIGRATOR, SQLITE_MIGRATOR};

/// SQLite migrations whose comments were reworded after databases had applied them: (version,
/// SHA-384 of the text they applied). sqlx refuses a database whose applied text differs from
/// the file, so such a database's record is moved to the new text; what it ran is unchanged.
const REWORDED: &[(i64, &str)] = &[(
    1,
    "4374bc78090b86083ab33945b72327e0d9f602bcc2f67e6f8375c74283e8bf0d882882b841e8fe910ed72153177265fa",
)];

/// Bytes of a hex string written in this file.
fn from_hex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Records a reworded migration (`REWORDED`) as applied with its current text.
async fn accept_reworded(pool: &AnyPool, migrator: &sqlx::migrate::Migrator) -> Result<()> {
    let applied: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_one(pool)
    .await?;
    if applied == 0 {
        return Ok(());
    }
    for (version, before) in REWORDED {
        let Some(now) = migrator.iter().find(|m| m.version == *version) else {
            continue;
        };
        let before = from_hex(before);
        sqlx::query(
            "UPDATE _sqlx_migrations SET checksum = $1 WHERE version = $2 AND checksum = $3",
        )
        .bind(now.checksum.to_vec())
        .bind(*version)
        .bind(before)
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// A write transaction on a shard database (epoch checked).
pub(super) type Tx = Transaction<'static, Any>;

/// Where a node's shard databases live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Databases {
    /// One SQLite file per shard, `<dir>/shard-<id>.db`: one machine.
    Sqlite(PathBuf),
    /// One schema per shard, `shard_<id>`, in this Postgres database (a `postgres://` URL): any
    /// node that reaches the database can own any shard.
    Postgres(String),
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another node opened this shard with a newer epoch: this node must stop writing.
    #[error("shard {shard} is fenced: this node holds epoch {mine}, the database has {current}")]
    Fenced { shard: u32, mine: u64, current: u64 },
    #[error("shard database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("shard database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("corrupt row in shard database: {0}")]
    Corrupt(String),
    /// A page or cursor of a tenant move does not fit the table it names: nothing was written.
    #[error("tenant move refused: {0}")]
    BadMove(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A handle on one shard's database, bound to the epoch under which it was opened. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    /// SQLite only: the connection that runs checkpoints (`checkpoint`).
    checkpointer: Option<checkpoint::Checkpointer>,
    shard: u32,
    epoch: u64,
}

impl Store {
    /// Opens (creating if needed) the shard's database, migrates it and records `epoch` as the
    /// owner's. Fails with `Fenced` when the database already carries a newer epoch.
    pub async fn open(
        dbs: &Databases,
        shard: u32,
        epoch: u64,
        owner: &str,
        now: i64,
    ) -> Result<Store> {
        static DRIVERS: std::sync::Once = std::sync::Once::new();
        DRIVERS.call_once(sqlx::any::install_default_drivers);
        let (pool, checkpointer, migrator) = match dbs {
            Databases::Sqlite(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| StoreError::Db(sqlx::Error::Io(e)))?;
                let path = dir.join(format!("shard-{shard}.db"));
                let url = format!("sqlite://{}?mode=rwc", path.display());
                // One connection: SQLite has one writer anyway, and a second connection would
                // wait on the lock in SQLite's busy handler (sleeping 1, 2, 5, 10 ms…) instead
                // of queueing, and lose its page cache whenever the other one writes.
                // No ping before each use (sqlx's default): a file opened in this process does
                // not hang up, and for SQLite a ping is one more trip to the connection's
                // thread, on every transaction and every read.
                let pool = AnyPoolOptions::new()
                    .max_connections(1)
                    .test_before_acquire(false)
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            // WAL + NORMAL survives a process crash; only an OS crash may lose
                            // the last commits, the same exposure a JetStream ack has
                            // (it acknowledges before it writes to disk).
                            conn.execute("PRAGMA journal_mode = WAL").await?;
                            conn.execute("PRAGMA synchronous = NORMAL").await?;
                            conn.execute("PRAGMA busy_timeout = 10000").await?;
                            // Checkpoints (which fsync) are `checkpoint`'s, on a connection of
                            // their own: one run by a commit stalls the shard's writes for tens
                            // of milliseconds. This threshold (40 MB) only bounds the WAL if
                            // the checkpointer stops.
                            conn.execute("PRAGMA wal_autocheckpoint = 10000").await?;
                            Ok(())
                        })
                    })
                    .connect_with(url.parse::<AnyConnectOptions>()?)
                    .await?;
                let checkpointer = AnyPoolOptions::new()
                    .max_connections(1)
                    .test_before_acquire(false)
                    .connect_with(url.parse::<AnyConnectOptions>()?)
                    .await?;
                let checkpointer = checkpoint::Checkpointer::new(checkpointer, &path);
                accept_reworded(&pool, &SQLITE_MIGRATOR).await?;
                (pool, Some(checkpointer), &SQLITE_MIGRATOR)
            }
            Databases::Postgres(url) => {
                let schema = format!("shard_{shard}");
                let mut conn = sqlx::AnyConnection::connect(url).await?;
                // Two nodes may race to create it; whoever loses finds it there.
                if let Err(e) = conn
                    .execute(format!("CREATE SCHEMA IF NOT EXISTS {schema}").as_str())
                    .await
                {
                    tracing::debug!(error = %e, schema, "create schema");
                }
                conn.close().await?;
                let set_path = format!("SET search_path TO {schema}");
                let pool = AnyPoolOptions::new()
                    .max_connections(4)
                    .after_connect(move |conn, _| {
                        let set_path = set_path.clone();
                        Box::pin(async move {
                            conn.execute(set_path.as_str()).await?;
                            // A transaction left open by a node that froze (SIGSTOP, a paused VM) holds the
                            // row lock of `shard_meta`, which the next owner's open waits for: Postgres ends
                            // such a transaction after this long idle, so a frozen node delays a failover by
                            // at most this much (and its writes are fenced when it resumes).
                            conn.execute("SET idle_in_transaction_session_timeout = '3s'")
                                .await?;
                            Ok(())
                        })
                    })
                    .connect(url)
                    .await?;
                (pool, None, &POSTGRES_MIGRATOR)
            }
        };
        migrator.run(&pool).await?;
        // The first statement writes, so SQLite takes the write lock at once and the busy
        // timeout applies (a read first would fail at once when upgraded under contention);
        // in Postgres it locks the row, so a newer owner waits for an older one's transaction.
        let mut tx = pool.begin().await?;
        let claimed = sqlx::query(
            "UPDATE shard_meta SET epoch = $1, owner = $2, opened_at = $3 WHERE id = 1 AND epoch <= $4",
        )
        .bind(epoch as i64)
        .bind(owner)
        .bind(now)
        .bind(epoch as i64)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if claimed == 0 {
            let current: Option<i64> =
                sqlx::query_scalar("SELECT epoch FROM shard_meta WHERE id = 1")
                    .fetch_optional(&mut *tx)
                    .await?;
            if let Some(c) = current {
                return Err(StoreError::Fenced {
                    shard,
                    mine: epoch,
                    current: c as u64,
                });
            }
            sqlx::query("INSERT INTO shard_meta (id, shard, epoch, owner, opened_at) VALUES (1, $1, $2, $3, $4)")
                .bind(shard as i64)
                .bind(epoch as i64)
                .bind(owner)
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Store {
            pool,
            checkpointer,
            shard,
            epoch,
        })
    }

    /// Copies committed WAL frames into an SQLite shard's database file without blocking its
    /// writer (a passive checkpoint on a connection of its own), unless nothing was written since
    /// the last one. None for Postgres, which checkpoints itself.
    pub async fn checkpoint(&self) -> Result<Option<Checkpoint>> {
        match &self.checkpointer {
            Some(c) => c.run().await.map(Some),
            None => Ok(None),
        }
    }

    /// What tells, without a query, whether anything was committed since it was last read: the
    /// WAL file's stamp of an SQLite shard. None for Postgres (and before an SQLite shard's first
    /// write): ask the database.
    pub fn wal_stamp(&self) -> Option<WalStamp> {
        self.checkpointer.as_ref()?.stamp()
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// Times one of the shard's main operations into `chronoshard_db_seconds` until dropped.
    fn timer(&self, op: &str) -> prometheus::HistogramTimer {
        chronoshard_telemetry::metrics::DB_SECONDS_HISTOGRAM
            .with_label_values(&[&self.shard.to_string(), op])
            .start_timer()
    }

    /// The pool's connections: (in use, idle).
    pub fn connections(&self) -> (u32, u32) {
        let idle = self.pool.num_idle() as u32;
        (self.pool.size().saturating_sub(idle), idle)
    }

    /// A connection of the pool, in use until dropped.
    #[cfg(test)]
    pub async fn hold_connection(&self) -> sqlx::pool::PoolConnection<sqlx::Any> {
        self.pool.acquire().await.unwrap()
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Starts a write transaction that holds the database's write lock and has checked the epoch.
    /// The no-op update takes SQLite's write lock (Postgres: the `shard_meta` row lock) at once,
    /// so no newer owner can slip in between the check and the writes that follow it.
    async fn write(&self) -> Result<Tx> {
        let mut tx = self.pool.begin().await?;
        let updated =
            sqlx::query("UPDATE shard_meta SET epoch = epoch WHERE id = 1 AND epoch = $1")
                .bind(self.epoch as i64)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        if updated == 0 {
            let current: i64 = sqlx::query_scalar("SELECT epoch FROM shard_meta WHERE id = 1")
                .fetch_optional(&mut *tx)
                .await?
                .unwrap_or_default();
            return Err(StoreError::Fenced {
                shard: self.shard,
                mine: self.epoch,
                current: current as u64,
            });
        }
        Ok(tx)
    }

    pub async fn close(&self) {
        self.pool.close().await;
        if let Some(c) = &self.checkpointer {
            c.pool().close().await;
        }
    }
}

fn is_sqlite(conn: &AnyConnection) -> bool {
    conn.backend_name() == <Sqlite as Database>::NAME
}

/// The select list of a query that returns all its rows as one value: a JSON array of arrays,
/// `cols` in order (decode it with `json_rows`). For the reads of the fire and result paths,
/// which return a row per job or ticket: sqlx's SQLite driver sends each row from the
/// connection's thread through a channel and copies it into an `AnyRow` value by value, and
/// those hand-overs cost more than the query (128 jobs read by id: 8.6 µs a row as rows, 5.4 µs
/// as one JSON value, their specs parsed in both; `sqlite3_step` was under half of the shard
/// node's SQLite threads while firing).
fn json_select(sqlite: bool, cols: &str) -> String {
    if sqlite {
        format!("json_group_array(json_array({cols}))")
    } else {
        format!("COALESCE(json_agg(json_build_array({cols})), '[]')::text")
    }
}

/// The rows of a `select_json_rows` query, each as `T` (a tuple of its columns' types in order).
pub(super) fn json_rows<T: serde::de::DeserializeOwned>(text: &str) -> Result<Vec<T>> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("rows as JSON: {e}")))
}

fn parse_uuid(s: &str) -> Result<uuid::Uuid> {
    uuid::Uuid::parse_str(s).map_err(|e| StoreError::Corrupt(format!("uuid {s:?}: {e}")))
}

#[cfg(test)]
mod tests;
