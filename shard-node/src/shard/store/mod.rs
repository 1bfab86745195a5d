//! The shard database: one SQLite file per shard. It owns every durable fact about the shard's
//! jobs, occurrences, tickets and attempts, and enforces the two invariants the rest of the node
//! relies on: one ticket per occurrence item (unique keys), and writes only by the current owner
//! (every write transaction starts by checking the epoch in `shard_meta`).
//!
//! It must not know about NATS, the wheel or the clock: callers pass `now`.

mod jobs;
mod results;
mod tenants;
mod tickets;
mod views;

use std::{path::Path, str::FromStr, time::Duration};

use sqlx::{
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
    Sqlite, SqlitePool, Transaction,
};

pub use jobs::{CreateOutcome, DueRow, JobRow};
pub use results::{Applied, FollowUp, OpenAttempt, Replay};
pub use tickets::{reason, FireOutcome, FireRequest, Fired, NotFiredRow};
pub use views::run_status;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

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
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A handle on one shard's database, bound to the epoch under which it was opened. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: SqlitePool,
    shard: u32,
    epoch: u64,
}

impl Store {
    /// Opens (creating if needed) the database, migrates it and records `epoch` as the owner's.
    /// Fails with `Fenced` when the database already carries a newer epoch.
    pub async fn open(path: &Path, shard: u32, epoch: u64, owner: &str, now: i64) -> Result<Store> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Db(sqlx::Error::Io(e)))?;
        }
        let opts = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // WAL + NORMAL survives a process crash; only an OS crash may lose the last commits,
            // the same exposure a JetStream ack has (NATS-NOTES.md).
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(false);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await?;
        MIGRATOR.run(&pool).await?;
        // The first statement writes, so SQLite takes the write lock at once and the busy
        // timeout applies (a read first would fail at once when upgraded under contention).
        let mut tx = pool.begin().await?;
        let claimed = sqlx::query(
            "UPDATE shard_meta SET epoch = ?, owner = ?, opened_at = ? WHERE id = 1 AND epoch <= ?",
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
            sqlx::query("INSERT INTO shard_meta (id, shard, epoch, owner, opened_at) VALUES (1, ?, ?, ?, ?)")
                .bind(shard as i64)
                .bind(epoch as i64)
                .bind(owner)
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Store { pool, shard, epoch })
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Starts a write transaction that holds the database's write lock and has checked the epoch.
    /// The no-op update takes SQLite's write lock at once, so no newer owner can slip in between
    /// the check and the writes that follow it.
    async fn write(&self) -> Result<Transaction<'static, Sqlite>> {
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query("UPDATE shard_meta SET epoch = epoch WHERE id = 1 AND epoch = ?")
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
    }
}

fn parse_uuid(s: &str) -> Result<uuid::Uuid> {
    uuid::Uuid::parse_str(s).map_err(|e| StoreError::Corrupt(format!("uuid {s:?}: {e}")))
}

#[cfg(test)]
mod tests;
