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
//! A transaction that must read before it knows what to write takes two trips: `open_trip` runs
//! the opening and the reads and leaves the transaction open (`OpenTrip`), `OpenTrip::commit`
//! runs the writes and `COMMIT`. The connection stays out of the pool in between, and closes if
//! the `OpenTrip` is dropped before its commit. Writes whose row count must be checked before
//! they are committed take a third trip (`OpenTrip::write`, then a bare `COMMIT`).
//!
//! Postgres does not run multi-statement strings with parameters; its callers keep the
//! statement-by-statement path. This module must not know what the reads and writes are.

use sqlx::{
    any::{AnyArguments, AnyRow},
    pool::PoolConnection,
    query::Query,
    Any, Executor,
};

use super::{sql::Sql, Result, Store, StoreError};

/// The opening of a one-trip transaction, around the store's epoch. A missing `shard_meta` row
/// counts as fenced, as in `Store::write`, and so does a missing epoch value (`IS NOT`: a NULL
/// bound by mistake fails the check instead of passing it).
const OPEN_BEFORE_EPOCH: &str = "BEGIN IMMEDIATE; \
    UPDATE OR ROLLBACK shard_meta SET epoch = NULL WHERE id = 1 AND epoch IS NOT ";
const OPEN_AFTER_EPOCH: &str = "; \
    INSERT OR ROLLBACK INTO shard_meta (id, shard, epoch, owner, opened_at) \
    SELECT 1, NULL, NULL, NULL, NULL WHERE NOT EXISTS (SELECT 1 FROM shard_meta WHERE id = 1)";

/// Closes the connection it holds when dropped armed: a call dropped while its transaction may
/// be open must not hand that transaction to the next user of the pool.
struct Armed(Option<PoolConnection<Any>>);

impl Armed {
    fn conn(&mut self) -> &mut PoolConnection<Any> {
        self.0.as_mut().expect("armed connection")
    }

    /// Returns the connection to the pool: no transaction is open on it.
    fn release(&mut self) {
        self.0.take();
    }

    /// Closes the connection: a transaction may still be open on it.
    fn close(&mut self) {
        if let Some(mut conn) = self.0.take() {
            conn.close_on_drop();
        }
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        self.close();
    }
}

/// A write transaction opened by `open_trip` (write lock held, epoch checked), waiting for its
/// writes: `commit` them, or drop it to close the connection and so roll it back.
pub(super) struct OpenTrip<'s> {
    store: &'s Store,
    armed: Armed,
}

impl Store {
    /// Whether `one_trip` may be used: SQLite shards only.
    pub(super) fn one_trip_available(&self) -> bool {
        self.checkpointer.is_some()
    }

    /// A one-trip transaction's opening, epoch check included: push its statements after it
    /// (each begun with `Sql::statement`), then run it with `one_trip` or `open_trip`.
    pub(super) fn trip<'q>(&self) -> Sql<'q> {
        let mut sql = Sql::sqlite();
        sql.push(OPEN_BEFORE_EPOCH)
            .push_bind(self.epoch as i64)
            .push(OPEN_AFTER_EPOCH);
        sql
    }

    /// Runs a `trip` and its statements, then `COMMIT`, in one trip; returns the rows its
    /// statements returned, in order. Fenced when another owner's epoch is in the database
    /// (nothing was written).
    pub(super) async fn one_trip(&self, mut trip: Sql<'_>) -> Result<Vec<AnyRow>> {
        trip.statement().push("COMMIT");
        let (sql, args) = trip.build();
        let mut armed = Armed(Some(self.pool.acquire().await?));
        let rows = self
            .run_armed(&mut armed, sqlx::query_with(&sql, args))
            .await?;
        armed.release();
        Ok(rows)
    }

    /// Runs a `trip` whose statements are `reads` returning one row each (e.g. a
    /// `select_json_rows` select) and leaves the transaction open: returns it and those rows, in
    /// order. Fenced when another owner's epoch is in the database.
    pub(super) async fn open_trip(
        &self,
        mut trip: Sql<'_>,
        reads: usize,
    ) -> Result<(OpenTrip<'_>, Vec<AnyRow>)> {
        let (sql, args) = trip.build();
        let mut armed = Armed(Some(self.pool.acquire().await?));
        let rows = self
            .run_armed(&mut armed, sqlx::query_with(&sql, args))
            .await?;
        if rows.len() != reads {
            // dropped armed: the connection closes, and the transaction with it
            return Err(StoreError::Corrupt(format!(
                "{reads} reads returned {} rows",
                rows.len()
            )));
        }
        Ok((OpenTrip { store: self, armed }, rows))
    }

    /// Runs `q` on the armed connection. On an error the connection has left `armed`: back to
    /// the pool once no transaction is open on it, else closed.
    async fn run_armed<'q>(
        &self,
        armed: &mut Armed,
        q: Query<'q, Any, AnyArguments<'q>>,
    ) -> Result<Vec<AnyRow>> {
        match q.fetch_all(&mut **armed.conn()).await {
            Ok(rows) => Ok(rows),
            Err(e) => Err(self.failed(armed, e).await),
        }
    }

    /// What a failed trip returns, once its transaction is rolled back and its connection has
    /// left `armed`.
    async fn failed(&self, armed: &mut Armed, e: sqlx::Error) -> StoreError {
        // The epoch check rolled back already; a failed write did not. The connection goes
        // back to the pool only once no transaction is open on it: after this rollback, or
        // when there was none to roll back. Otherwise it is closed.
        match armed.conn().execute("ROLLBACK").await {
            Ok(_) => armed.release(),
            // The rollback failed: either none was open, or the connection is broken. A BEGIN
            // tells which without reading an error's text: it succeeds only outside a
            // transaction on a working connection.
            Err(_) => match armed.conn().execute("BEGIN").await {
                Ok(_) if armed.conn().execute("ROLLBACK").await.is_ok() => armed.release(),
                _ => armed.close(),
            },
        }
        let current: Option<i64> =
            match sqlx::query_scalar("SELECT epoch FROM shard_meta WHERE id = 1")
                .fetch_optional(&self.pool)
                .await
            {
                Ok(c) => c,
                Err(read) => return read.into(),
            };
        match current {
            Some(c) if c as u64 == self.epoch => e.into(),
            other => StoreError::Fenced {
                shard: self.shard,
                mine: self.epoch,
                current: other.unwrap_or_default() as u64,
            },
        }
    }
}

impl OpenTrip<'_> {
    /// Runs writes (`Sql::sqlite` statements, no `COMMIT`) whose row count the caller checks
    /// before it commits: returns the transaction, still open, and the rows they changed. A trip
    /// of its own, so a wrong count can still be rolled back (drop the transaction). After an
    /// error there is no transaction left.
    pub(super) async fn write(mut self, mut writes: Sql<'_>) -> Result<(Self, u64)> {
        let (sql, args) = writes.build();
        match sqlx::query_with(&sql, args)
            .execute(&mut **self.armed.conn())
            .await
        {
            Ok(done) => Ok((self, done.rows_affected())),
            Err(e) => Err(self.store.failed(&mut self.armed, e).await),
        }
    }

    /// Runs `writes` (`Sql::sqlite` statements, possibly none) and `COMMIT` in one trip: the
    /// writes are committed, or none of the transaction is.
    pub(super) async fn commit(mut self, mut writes: Sql<'_>) -> Result<Vec<AnyRow>> {
        writes.statement().push("COMMIT");
        let (sql, args) = writes.build();
        let rows = self
            .store
            .run_armed(&mut self.armed, sqlx::query_with(&sql, args))
            .await?;
        self.armed.release();
        Ok(rows)
    }
}
