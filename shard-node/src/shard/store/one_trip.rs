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

use super::{Params, Result, Store, StoreError};

/// The body of a trip: the statement of each of `items` (its SQL with SQLite's `?`s), in order.
/// Bind their values in the same order.
pub(super) fn statements<T>(items: &[T], sql: impl Fn(&T, &mut Params) -> String) -> String {
    items
        .iter()
        .map(|i| sql(i, &mut Params::anonymous()))
        .collect::<Vec<_>>()
        .join("; ")
}

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
        let rows = self.run_armed(&mut armed, q).await?;
        armed.release();
        Ok(rows)
    }

    /// The SQL of the first trip of a two-trip transaction: the opening, then `body` (the
    /// reads), with the transaction left open. Its query is `one_trip_query`'s.
    pub(super) fn open_trip_sql(body: &str) -> String {
        format!("{OPEN}{body}")
    }

    /// Runs an `open_trip_sql` query whose body is `reads` statements returning one row each
    /// (e.g. a `json_rows_of` select): returns the open transaction and those rows, in order.
    /// Fenced when another owner's epoch is in the database.
    pub(super) async fn open_trip<'q>(
        &self,
        q: Query<'q, Any, AnyArguments<'q>>,
        reads: usize,
    ) -> Result<(OpenTrip<'_>, Vec<AnyRow>)> {
        let mut armed = Armed(Some(self.pool.acquire().await?));
        let rows = self.run_armed(&mut armed, q).await?;
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
    /// The SQL of the second trip: `body` (the writes; may be empty), then `COMMIT`. Bind the
    /// body's values to `sqlx::query` of it in order (no epoch: the first trip checked it).
    pub(super) fn commit_sql(body: &str) -> String {
        if body.is_empty() {
            "COMMIT".to_string()
        } else {
            format!("{body}; COMMIT")
        }
    }

    /// Runs writes (`statements`, no `COMMIT`) whose row count the caller checks before it
    /// commits: returns the transaction, still open, and the rows they changed. A trip of its
    /// own, so a wrong count can still be rolled back (drop the transaction). After an error
    /// there is no transaction left.
    pub(super) async fn write<'q>(
        mut self,
        q: Query<'q, Any, AnyArguments<'q>>,
    ) -> Result<(Self, u64)> {
        match q.execute(&mut **self.armed.conn()).await {
            Ok(done) => Ok((self, done.rows_affected())),
            Err(e) => Err(self.store.failed(&mut self.armed, e).await),
        }
    }

    /// Runs a `commit_sql` query: the writes are committed, or none of the transaction is.
    pub(super) async fn commit<'q>(
        mut self,
        q: Query<'q, Any, AnyArguments<'q>>,
    ) -> Result<Vec<AnyRow>> {
        let rows = self.store.run_armed(&mut self.armed, q).await?;
        self.armed.release();
        Ok(rows)
    }
}
