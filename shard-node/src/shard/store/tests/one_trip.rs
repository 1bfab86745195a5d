//! The failure paths of SQLite's one-trip and two-trip transactions (`store/one_trip.rs`):
//! whatever stops one midway, nothing of it is written and the next write finds no transaction
//! left open.

use sqlx::{Connection, Executor};

use super::*;
use crate::shard::store::sql::Sql;

/// `body` pushed as one statement after what `sql` holds, its `?`s bound to `values` in order.
fn with<'q>(mut sql: Sql<'q>, body: &str, values: &[&'q str]) -> Sql<'q> {
    let parts: Vec<&str> = body.split('?').collect();
    assert_eq!(parts.len(), values.len() + 1, "one value per placeholder");
    sql.statement();
    for (i, part) in parts.iter().enumerate() {
        sql.push(part);
        if let Some(v) = values.get(i) {
            sql.push_bind(*v);
        }
    }
    sql
}

/// A paused tenant written first, then a statement that fails (a job without its NOT NULL
/// columns): the first write must not survive.
const FAILS_AFTER_A_WRITE: &str = "INSERT INTO paused_tenants (tenant, paused_at) VALUES (?, 1); \
     INSERT INTO jobs (id) VALUES ('no-tenant')";

async fn paused(s: &Store) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM paused_tenants")
        .fetch_one(&s.pool)
        .await
        .unwrap()
}

/// The next write on the connection commits: no transaction was left open on it.
async fn takes_a_write(s: &Store) {
    s.create_job(&job("t", 1000), None).await.unwrap();
    assert_eq!(
        s.list_jobs(JobKind::Job, None, None, 10)
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn a_failed_statement_rolls_back_the_writes_before_it() {
    let db = TestDb::sqlite();
    let s = open(&db, 1).await.unwrap();
    let Err(err) = s
        .one_trip(with(s.trip(), FAILS_AFTER_A_WRITE, &["t"]))
        .await
    else {
        panic!("a job without a tenant was written");
    };
    assert!(matches!(err, StoreError::Db(_)), "not fenced: {err}");
    assert_eq!(paused(&s).await, 0, "the write before the failure is gone");
    // the connection is not left inside the failed transaction
    takes_a_write(&s).await;
}

/// A call dropped while SQLite runs it (here: during a slow statement between a write and the
/// commit) leaves no open transaction behind for the next user of the connection.
#[tokio::test]
async fn a_call_dropped_midway_leaves_no_transaction_open() {
    let db = TestDb::sqlite();
    let s = open(&db, 1).await.unwrap();
    let trip = with(
        s.trip(),
        "INSERT INTO paused_tenants (tenant, paused_at) VALUES (?, 1); \
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5000000) \
         SELECT COUNT(*) FROM c",
        &["t"],
    );
    let mut call = Box::pin(s.one_trip(trip));
    // Polled until SQLite runs it (its transaction holds the write lock), then dropped.
    let Databases::Sqlite(dir) = &db.dbs else {
        unreachable!("one-trip transactions are SQLite's")
    };
    let url = format!("sqlite://{}", dir.join("shard-0.db").display());
    let mut probe = sqlx::AnyConnection::connect(&url).await.unwrap();
    probe.execute("PRAGMA busy_timeout = 0").await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        assert!(
            futures::poll!(call.as_mut()).is_pending(),
            "finished too soon"
        );
        if probe.execute("BEGIN IMMEDIATE").await.is_err() {
            break;
        }
        probe.execute("ROLLBACK").await.unwrap();
        assert!(
            std::time::Instant::now() < deadline,
            "the call never took the write lock"
        );
        tokio::task::yield_now().await;
    }
    drop(call);
    takes_a_write(&s).await;
    assert_eq!(paused(&s).await, 0, "the dropped call's write is gone");
}

/// The first trip of a two-trip transaction writes (the results path only reads there, but any
/// statement would be undone the same way).
const WRITES_IN_THE_FIRST_TRIP: &str =
    "INSERT INTO paused_tenants (tenant, paused_at) VALUES (?, 1); SELECT COUNT(*) FROM jobs";

#[tokio::test]
async fn a_failed_second_trip_rolls_back_the_first() {
    let db = TestDb::sqlite();
    let s = open(&db, 1).await.unwrap();
    let (open_tx, rows) = s
        .open_trip(with(s.trip(), WRITES_IN_THE_FIRST_TRIP, &["t"]), 1)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "the first trip's rows come back");
    let writes = with(
        Sql::sqlite(),
        "INSERT INTO jobs (id) VALUES ('no-tenant')",
        &[],
    );
    let Err(err) = open_tx.commit(writes).await else {
        panic!("a job without a tenant was written");
    };
    assert!(matches!(err, StoreError::Db(_)), "not fenced: {err}");
    assert_eq!(paused(&s).await, 0, "the first trip's write is gone");
    takes_a_write(&s).await;
}

/// A two-trip transaction dropped between its trips (its caller cancelled while it applied the
/// reads) must not go back to the pool open: the next write would fail to begin, and its
/// rollback would take the dropped transaction's writes with it.
#[tokio::test]
async fn a_transaction_dropped_between_its_trips_is_rolled_back() {
    let db = TestDb::sqlite();
    let s = open(&db, 1).await.unwrap();
    let (open_tx, _) = s
        .open_trip(with(s.trip(), WRITES_IN_THE_FIRST_TRIP, &["t"]), 1)
        .await
        .unwrap();
    drop(open_tx);
    takes_a_write(&s).await;
    assert_eq!(
        paused(&s).await,
        0,
        "the dropped transaction's write is gone"
    );
}

/// Empty writes still commit what the first trip did.
#[tokio::test]
async fn a_second_trip_without_writes_commits() {
    let db = TestDb::sqlite();
    let s = open(&db, 1).await.unwrap();
    let (open_tx, _) = s
        .open_trip(with(s.trip(), WRITES_IN_THE_FIRST_TRIP, &["t"]), 1)
        .await
        .unwrap();
    open_tx.commit(Sql::sqlite()).await.unwrap();
    assert_eq!(paused(&s).await, 1);
}

/// Writes whose count is checked before the commit (`OpenTrip::write`) are undone when the
/// caller finds the count wrong and drops the transaction.
#[tokio::test]
async fn checked_writes_dropped_before_the_commit_are_rolled_back() {
    let db = TestDb::sqlite();
    let s = open(&db, 1).await.unwrap();
    let (open_tx, _) = s
        .open_trip(with(s.trip(), "SELECT COUNT(*) FROM jobs", &[]), 1)
        .await
        .unwrap();
    let (open_tx, written) = open_tx
        .write(with(
            Sql::sqlite(),
            "INSERT INTO paused_tenants (tenant, paused_at) VALUES (?, 1); \
             INSERT INTO paused_tenants (tenant, paused_at) VALUES (?, 1)",
            &["t", "u"],
        ))
        .await
        .unwrap();
    assert_eq!(written, 2, "the rows both statements changed");
    drop(open_tx);
    assert_eq!(paused(&s).await, 0, "nothing was committed");
    takes_a_write(&s).await;
}

/// Checked writes that fail leave nothing written and no transaction open.
#[tokio::test]
async fn checked_writes_that_fail_leave_nothing_behind() {
    let db = TestDb::sqlite();
    let s = open(&db, 1).await.unwrap();
    let (open_tx, _) = s
        .open_trip(with(s.trip(), "SELECT COUNT(*) FROM jobs", &[]), 1)
        .await
        .unwrap();
    let Err(err) = open_tx
        .write(with(Sql::sqlite(), FAILS_AFTER_A_WRITE, &["t"]))
        .await
    else {
        panic!("a job without a tenant was written");
    };
    assert!(matches!(err, StoreError::Db(_)), "not fenced: {err}");
    assert_eq!(paused(&s).await, 0, "the write before the failure is gone");
    takes_a_write(&s).await;
}
