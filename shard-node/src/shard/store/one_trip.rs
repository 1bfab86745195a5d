//! SQLite write transactions that reach the connection's thread once.
//!
//! sqlx runs each SQLite connection on a thread of its own, and every statement is a hand-off to
//! that thread and back: `BEGIN`, the epoch check, the writes and `COMMIT` are four or more trips,
//! each a thread wake-up on both sides. On a busy machine each wake-up is also a wait for a core,
//! so a small transaction spends more on the trips than in SQLite. Here the whole transaction is
//! one multi-statement string, run by one `fetch_all`: sqlx steps its statements one after the
//! other on the connection's thread, binding the anonymous `?`s in order across them.
//!
//! The epoch check must stop the writes that follow it within the same string, so it fails
//! instead of reporting zero rows: a statement that violates a NOT NULL constraint `OR
//! ROLLBACK` when the epoch differs or the row is missing, which rolls the transaction back and
//! ends the string with an error. Any other error may leave the transaction open: it is rolled
//! back before the connection is used again, and a call dropped midway closes the connection
//! instead of returning it to the pool (a new one is opened on the next use).
//!
//! Postgres does not run multi-statement strings with parameters; its callers keep the
//! statement-by-statement path. This module must not know what the writes are.

use sqlx::{
    any::{AnyArguments, AnyRow},
    pool::PoolConnection,
    query::Query,
    Any, Executor,
};

use super::{Result, Store, StoreError};

/// The opening of a one-trip transaction; its placeholder takes the store's epoch. A missing
/// `shard_meta` row counts as fenced, as in `Store::write`, and so does a missing epoch value
/// (`IS NOT`: a NULL bound by mistake fails the check instead of passing it).
const OPEN: &str = "BEGIN IMMEDIATE; \
    UPDATE OR ROLLBACK shard_meta SET epoch = NULL WHERE id = 1 AND epoch IS NOT ?; \
    INSERT OR ROLLBACK INTO shard_meta (id, shard, epoch, owner, opened_at) \
    SELECT 1, NULL, NULL, NULL, NULL WHERE NOT EXISTS (SELECT 1 FROM shard_meta WHERE id = 1); ";

/// Closes the connection it holds when dropped armed: a call dropped while its transaction may
/// be open must not hand that transaction to the next user of the pool.
struct Armed(Option<PoolConnection<Any>>);

impl Armed {
    fn conn(&mut self) -> &mut PoolConnection<Any> {
        self.0.as_mut().expect("armed connection")
    }

    /// Lets the connection go back to the pool when dropped.
    fn disarm(mut self) {
        self.0.take();
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        if let Some(conn) = self.0.as_mut() {
            conn.close_on_drop();
        }
    }
}

impl Store {
    /// Whether `one_trip` may be used: SQLite shards only.
    pub(super) fn one_trip_available(&self) -> bool {
        self.checkpointer.is_some()
    }

    /// The query of a `one_trip_sql` string with the epoch check's value bound: bind the body's
    /// values to it in order.
    pub(super) fn one_trip_query<'q>(&self, sql: &'q str) -> Query<'q, Any, AnyArguments<'q>> {
        sqlx::query(sql).bind(self.epoch as i64)
    }

    /// The SQL of a one-trip transaction around `body` (statements separated by `;`, anonymous
    /// `?` placeholders).
    pub(super) fn one_trip_sql(body: &str) -> String {
        format!("{OPEN}{body}; COMMIT")
    }

    /// Runs a `one_trip_sql` query and returns the rows its statements returned, in order.
    /// Fenced when another owner's epoch is in the database (nothing was written).
    pub(super) async fn one_trip<'q>(
        &self,
        q: Query<'q, Any, AnyArguments<'q>>,
    ) -> Result<Vec<AnyRow>> {
        let mut armed = Armed(Some(self.pool.acquire().await?));
        let e = match q.fetch_all(&mut **armed.conn()).await {
            Ok(rows) => {
                armed.disarm();
                return Ok(rows);
            }
            Err(e) => e,
        };
        // The epoch check rolled back already; a failed write did not. The connection goes
        // back to the pool only once no transaction is open on it: after this rollback, or
        // when there was none to roll back. Otherwise it is closed (dropped still armed).
        match armed.conn().execute("ROLLBACK").await {
            Ok(_) => {
                armed.disarm();
            }
            Err(r) if r.to_string().contains("no transaction is active") => {
                armed.disarm();
            }
            Err(_) => drop(armed),
        }
        let current: Option<i64> = sqlx::query_scalar("SELECT epoch FROM shard_meta WHERE id = 1")
            .fetch_optional(&self.pool)
            .await?;
        match current {
            Some(c) if c as u64 == self.epoch => Err(e.into()),
            other => Err(StoreError::Fenced {
                shard: self.shard,
                mine: self.epoch,
                current: other.unwrap_or_default() as u64,
            }),
        }
    }
}
