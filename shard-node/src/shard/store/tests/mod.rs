use chrono::Utc;
use chronoshard_wire::{
    from_millis, JobSpec, JobState, ResultKind, RunStatus, Ticket, TicketResult, PROTOCOL_VERSION,
};
use sqlx::Row;
use uuid::Uuid;

use super::*;

/// Runs each named test (an `async fn(TestDb)`) on SQLite, one `#[test]` each, and all of them in
/// one `#[test]` on a PostgreSQL server started for it (one server instead of one per test).
macro_rules! store_tests {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::TestDb::sqlite()).await
                }
            )*
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn every_test_on_postgres() {
            let pg = chronoshard_test_util::Postgres::start()
                .await
                .expect("a PostgreSQL server starts (see crates/test-util/src/postgres.rs)");
            $(
                eprintln!("on postgres: {}", stringify!($name));
                $name(TestDb::postgres(&pg).await).await;
            )*
        }
    };
}

mod engine;
mod handoffs;
mod moves;
mod one_trip;
mod outbox;
mod reference;
mod results;
mod worker;
mod workflows;

/// A JetStream ack of an attempt (the sequence is made up: only the sweep reads it).
fn acked(ticket: Uuid, attempt: u32) -> Acked {
    Acked {
        ticket,
        attempt,
        seq: attempt as u64 * 1000,
    }
}

fn spec(tenant: &str) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "tenant": tenant, "name": "n", "schedule": {"every": "1s"},
        "target": {"type": "queue", "queue": "q"}
    }))
    .unwrap()
}

/// Fires `tickets` (grouped into occurrences by their scheduled time) as the shard loop does.
async fn fire(
    s: &Store,
    j: &JobRow,
    expected: Option<i64>,
    next: Option<i64>,
    tickets: Vec<Ticket>,
    now: i64,
) -> Result<FireOutcome> {
    let mut occurrences: Vec<(i64, Vec<Ticket>)> = Vec::new();
    for t in tickets {
        let at = t.scheduled_at.timestamp_millis();
        match occurrences.iter_mut().find(|(a, _)| *a == at) {
            Some((_, v)) => v.push(t),
            None => occurrences.push((at, vec![t])),
        }
    }
    s.fire(
        FireRequest {
            job_id: j.id,
            expected_next: expected,
            next_fire_at: next,
            not_fired: &[],
            occurrences,
            overlap: j.spec.overlap,
        },
        now,
    )
    .await
}

/// A worker's report on an attempt.
fn report(t: &Ticket, attempt: u32, kind: ResultKind, at: i64) -> TicketResult {
    let mut r = TicketResult::about(t.ticket_id, attempt, 0, kind, "w", from_millis(at));
    r.error = (kind == ResultKind::Failed).then(|| format!("boom {attempt}"));
    r
}

/// Fires one occurrence of `j` at `at` and returns its ticket.
async fn fired(s: &Store, j: &JobRow, at: i64) -> Ticket {
    let mut out = fire(s, j, None, None, vec![ticket(j, at, 1)], at)
        .await
        .unwrap();
    assert_eq!(out.tickets.len(), 1, "{out:?}");
    out.tickets.remove(0)
}

fn job(tenant: &str, next: i64) -> JobRow {
    JobRow {
        id: Uuid::now_v7(),
        tenant: tenant.into(),
        spec: spec(tenant),
        state: JobState::Active,
        created_at: 0,
        updated_at: 0,
        anchor_at: 0,
        next_fire_at: Some(next),
        buffered_at: None,
    }
}

fn ticket(job: &JobRow, at: i64, epoch: u64) -> Ticket {
    let id = Uuid::now_v7();
    Ticket {
        v: PROTOCOL_VERSION,
        ticket_id: id,
        job_id: job.id,
        tenant: job.tenant.clone(),
        shard: 0,
        epoch,
        scheduled_at: from_millis(at),
        attempt: 1,
        item: 0,
        items: 1,
        queue: "q".into(),
        target: job.spec.target.clone(),
        payload: serde_json::Value::Null,
        timeout_ms: 1000,
        priority: 5,
        trace_id: chronoshard_wire::trace_id_of(id),
        checkpoint: None,
    }
}

/// A shard database for one test: an SQLite file in a temp dir, or a fresh Postgres database.
struct TestDb {
    dbs: Databases,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        TestDb {
            dbs: Databases::Sqlite(dir.path().to_path_buf()),
            _dir: Some(dir),
        }
    }

    async fn postgres(pg: &chronoshard_test_util::Postgres) -> TestDb {
        TestDb {
            dbs: Databases::Postgres(pg.create_database().await.unwrap()),
            _dir: None,
        }
    }
}

async fn open(db: &TestDb, epoch: u64) -> Result<Store> {
    Store::open(&db.dbs, 0, epoch, "node-a", 0).await
}

/// A shard database that applied the first migration before its comments were reworded opens
/// as before, with its jobs, and is recorded as having applied the current text.
#[tokio::test]
async fn a_database_from_before_a_reworded_migration_opens_with_its_data() {
    let db = TestDb::sqlite();
    let s = open(&db, 1).await.unwrap();
    let j = job("t", 1000);
    s.create_job(&j, None).await.unwrap();
    let (version, before) = REWORDED[0];
    let before = from_hex(before);
    sqlx::query("UPDATE _sqlx_migrations SET checksum = $1 WHERE version = $2")
        .bind(before.clone())
        .bind(version)
        .execute(&s.pool)
        .await
        .unwrap();
    s.close().await;

    let s = open(&db, 2).await.expect("the older database opens");
    assert_eq!(s.get_job(j.id).await.unwrap().unwrap().id, j.id);
    let now: Vec<u8> =
        sqlx::query_scalar("SELECT checksum FROM _sqlx_migrations WHERE version = $1")
            .bind(version)
            .fetch_one(&s.pool)
            .await
            .unwrap();
    assert_ne!(now, before);
    let file = SQLITE_MIGRATOR
        .iter()
        .find(|m| m.version == version)
        .unwrap();
    assert_eq!(now, file.checksum.to_vec());
}

async fn an_older_epoch_is_fenced_once_a_newer_owner_opens(db: TestDb) {
    let old = open(&db, 1).await.unwrap();
    let j = job("t", 1000);
    old.create_job(&j, None).await.unwrap();
    let new = open(&db, 2).await.unwrap();
    // every write path of the old owner is refused, and nothing it tried is visible
    let err = old.create_job(&job("t", 5), None).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Fenced {
                mine: 1,
                current: 2,
                ..
            }
        ),
        "{err}"
    );
    let err = fire(
        &old,
        &j,
        Some(1000),
        Some(2000),
        vec![ticket(&j, 1000, 1)],
        1000,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }));
    assert!(matches!(
        old.mark_published(&[acked(Uuid::now_v7(), 1)], 0).await,
        Err(StoreError::Fenced { .. })
    ));
    let stale = report(&ticket(&j, 1000, 1), 1, ResultKind::Succeeded, 1100);
    assert!(matches!(
        old.apply_results(&[stale], 1100).await,
        Err(StoreError::Fenced { .. })
    ));
    assert_eq!(
        new.list_jobs(JobKind::Job, None, None, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    // a refused write leaves no transaction open: the old owner still reads, and is refused again
    assert_eq!(
        old.list_jobs(JobKind::Job, None, None, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(matches!(
        old.create_job(&job("t", 7), None).await,
        Err(StoreError::Fenced { current: 2, .. })
    ));
    // an older owner cannot even reopen
    assert!(matches!(open(&db, 1).await, Err(StoreError::Fenced { .. })));
    fire(
        &new,
        &j,
        Some(1000),
        Some(2000),
        vec![ticket(&j, 1000, 2)],
        1000,
    )
    .await
    .unwrap();
}

async fn one_ticket_per_occurrence_and_stale_entries_write_nothing(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = job("t", 1000);
    s.create_job(&j, None).await.unwrap();
    let out = fire(
        &s,
        &j,
        Some(1000),
        Some(2000),
        vec![ticket(&j, 1000, 1)],
        1000,
    )
    .await
    .unwrap();
    assert_eq!(out.tickets.len(), 1);
    // the same wheel entry firing again (a duplicate or a retry after a crash) is stale
    let again = fire(
        &s,
        &j,
        Some(1000),
        Some(2000),
        vec![ticket(&j, 1000, 1)],
        1001,
    )
    .await
    .unwrap();
    assert!(again.stale && again.tickets.is_empty());
    // a trigger at an instant that already has an occurrence writes no second ticket
    let trig = fire(&s, &j, None, None, vec![ticket(&j, 1000, 1)], 1002)
        .await
        .unwrap();
    assert!(trig.tickets.is_empty());
    let runs = s.runs(j.id, None, 10).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].ticket_ids, vec![out.tickets[0].ticket_id]);
    assert_eq!(
        s.get_job(j.id).await.unwrap().unwrap().next_fire_at,
        Some(2000)
    );
}

async fn results_apply_once_and_move_the_run(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = job("t", 1000);
    s.create_job(&j, None).await.unwrap();
    let t = fire(&s, &j, Some(1000), None, vec![ticket(&j, 1000, 1)], 1000)
        .await
        .unwrap()
        .tickets
        .remove(0);
    assert_eq!(
        s.get_job(j.id).await.unwrap().unwrap().state,
        JobState::Completed
    );
    assert_eq!(s.unpublished(2000, 2000, 10).await.unwrap().len(), 1);
    s.mark_published(&[acked(t.ticket_id, 1)], 1001)
        .await
        .unwrap();
    assert!(s.unpublished(2000, 2000, 10).await.unwrap().is_empty());
    let result = |kind| TicketResult {
        http_status: Some(200),
        ..TicketResult::about(t.ticket_id, 1, 0, kind, "w", Utc::now())
    };
    assert_eq!(
        s.apply_results(&[result(ResultKind::Started)], 1002)
            .await
            .unwrap()
            .changed,
        1
    );
    assert_eq!(
        s.runs(j.id, None, 1).await.unwrap()[0].status,
        RunStatus::Running
    );
    let done = result(ResultKind::Succeeded);
    assert_eq!(
        s.apply_results(&[done.clone(), done.clone()], 1003)
            .await
            .unwrap()
            .changed,
        1
    );
    // a late duplicate of `started` does not move a finished attempt back
    assert_eq!(
        s.apply_results(&[result(ResultKind::Started), done], 1004)
            .await
            .unwrap()
            .changed,
        0
    );
    let view = s.ticket(t.ticket_id).await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Succeeded);
    assert_eq!(view.attempts[0].http_status, Some(200));
    assert_eq!(
        s.runs(j.id, None, 1).await.unwrap()[0].status,
        RunStatus::Succeeded
    );
}

async fn idempotency_keys_return_the_first_job_or_refuse_a_different_one(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = job("t", 1000);
    assert_eq!(
        s.create_job(&j, Some("k")).await.unwrap(),
        CreateOutcome::Created
    );
    let mut again = job("t", 1000);
    again.spec = j.spec.clone();
    assert!(
        matches!(s.create_job(&again, Some("k")).await.unwrap(), CreateOutcome::Existing(r) if r.id == j.id)
    );
    let mut other = job("t", 1000);
    other.spec.name = "other".into();
    assert_eq!(
        s.create_job(&other, Some("k")).await.unwrap(),
        CreateOutcome::KeyReused
    );
    // the same key under another tenant is another job
    assert_eq!(
        s.create_job(&job("u", 1000), Some("k")).await.unwrap(),
        CreateOutcome::Created
    );
}

/// Creates written together in one transaction answer exactly as one at a time would, each
/// seeing those before it: a repeated id or key creates once, a key reused for another spec is
/// refused, and an older fenced store writes none of them.
async fn creates_in_one_transaction_see_each_other(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let first = job("t", 1000);
    let mut same_key = job("t", 1000);
    same_key.spec = first.spec.clone();
    let mut other_spec = job("t", 1000);
    other_spec.spec.name = "other".into();
    let plain = job("t", 2000);
    let outcomes = s
        .create_jobs(&[
            (&first, Some("k")),
            (&first, Some("k")),
            (&same_key, Some("k")),
            (&other_spec, Some("k")),
            (&plain, None),
        ])
        .await
        .unwrap();
    assert_eq!(outcomes[0], CreateOutcome::Created);
    assert!(matches!(&outcomes[1], CreateOutcome::Existing(r) if r.id == first.id));
    assert!(matches!(&outcomes[2], CreateOutcome::Existing(r) if r.id == first.id));
    assert_eq!(outcomes[3], CreateOutcome::KeyReused);
    assert_eq!(outcomes[4], CreateOutcome::Created);
    let stored = s
        .list_jobs(JobKind::Job, Some("t"), None, 10)
        .await
        .unwrap();
    let mut ids: Vec<Uuid> = stored.iter().map(|j| j.id).collect();
    ids.sort();
    let mut want = vec![first.id, plain.id];
    want.sort();
    assert_eq!(ids, want, "two jobs written, nothing else");

    // A later call meets the stored jobs: new rows around repeats of stored ones.
    let mut again_by_key = job("t", 1000);
    again_by_key.spec = first.spec.clone();
    let fresh = job("t", 4000);
    let outcomes = s
        .create_jobs(&[
            (&plain, None),
            (&fresh, Some("k2")),
            (&again_by_key, Some("k")),
            (&other_spec, Some("k")),
        ])
        .await
        .unwrap();
    assert!(matches!(&outcomes[0], CreateOutcome::Existing(r) if **r == plain));
    assert_eq!(outcomes[1], CreateOutcome::Created);
    assert!(matches!(&outcomes[2], CreateOutcome::Existing(r) if r.id == first.id));
    assert_eq!(outcomes[3], CreateOutcome::KeyReused);
    assert_eq!(
        s.list_jobs(JobKind::Job, Some("t"), None, 10)
            .await
            .unwrap()
            .len(),
        3
    );

    let newer = open(&db, 2).await.unwrap();
    let late = job("t", 3000);
    let err = s.create_jobs(&[(&late, None)]).await.unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    assert!(newer.get_job(late.id).await.unwrap().is_none());
}

/// SQLite is built as `.cargo/config.toml` says: a page cache per connection, not one pool
/// behind a global mutex for every shard of the process, and no global allocation counter.
#[tokio::test]
async fn sqlite_keeps_one_page_cache_per_connection() {
    let db = TestDb::sqlite();
    let s = open(&db, 1).await.unwrap();
    let options: Vec<String> = sqlx::query_scalar("PRAGMA compile_options")
        .fetch_all(&s.pool)
        .await
        .unwrap();
    assert!(
        !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
        "one page cache pool for every connection: {options:?}"
    );
    assert!(
        options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
        "allocations counted under a global mutex: {options:?}"
    );
}

/// What a shard reads when it opens must not read every job: at 10 million jobs a scan took
/// 7.7 s per shard, and the shard took no writes meanwhile. (SQLite's plan; Postgres has the
/// same index from the same migration.)
#[tokio::test]
async fn opening_a_shard_reads_buffered_jobs_by_index() {
    let db = TestDb::sqlite();
    let s = open(&db, 1).await.unwrap();
    let plan: Vec<String> = sqlx::query(&format!(
        "EXPLAIN QUERY PLAN {}",
        super::tickets::BUFFERED_JOBS
    ))
    .fetch_all(&s.pool)
    .await
    .unwrap()
    .iter()
    .map(|r| r.try_get::<String, _>("detail").unwrap())
    .collect();
    // A partial index holds only the buffered jobs: scanning it reads those alone.
    assert!(
        plan.iter().any(|d| d.contains("jobs_buffered"))
            && plan
                .iter()
                .filter(|d| d.contains(" jobs"))
                .all(|d| d.contains("USING INDEX jobs_buffered")),
        "every read of jobs goes through the index: {plan:?}"
    );
}

/// Rows read as one JSON value (`select_json_rows`) come back as stored: text that needs escaping,
/// nulls, integers beyond 2^53; no rows is an empty list on both backends.
async fn rows_read_as_json_keep_every_value(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let mut j = job("t \"quoted\" \\ é 東\n", -1);
    j.spec.name = "a \"name\"\twith\\escapes\u{1F600}".into();
    j.created_at = i64::MAX - 1;
    j.updated_at = i64::MIN + 1;
    j.anchor_at = (1 << 53) + 1;
    let mut done = job("t", 5);
    done.state = JobState::Completed;
    done.next_fire_at = None;
    for job in [&j, &done] {
        s.create_job(job, None).await.unwrap();
    }
    let read = s.get_jobs(&[j.id, done.id]).await.unwrap();
    assert_eq!(read.get(&j.id), Some(&j));
    assert_eq!(read.get(&done.id), Some(&done));
    assert!(s.get_jobs(&[Uuid::now_v7()]).await.unwrap().is_empty());
}

#[test]
fn rows_that_do_not_decode_are_a_corrupt_store_not_a_panic() {
    for text in ["", "[[1, 2]", "[[\"id\", \"not a number\"]]", "{\"a\": 1}"] {
        let err = json_rows::<(String, i64)>(text).unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt(ref m) if m.starts_with("rows as JSON")),
            "{text:?}: {err}"
        );
    }
    assert_eq!(
        json_rows::<(String, Option<i64>)>("[[\"a\", null], [\"b\", 9007199254740993]]").unwrap(),
        vec![
            ("a".to_string(), None),
            ("b".to_string(), Some(9_007_199_254_740_993))
        ]
    );
}

/// Without its epoch row a shard database accepts no write: there is no owner to check against.
async fn a_database_without_its_epoch_row_refuses_writes(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    sqlx::query("DELETE FROM shard_meta")
        .execute(&s.pool)
        .await
        .unwrap();
    let err = s.create_job(&job("t", 5), None).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Fenced {
                mine: 1,
                current: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(s
        .list_jobs(JobKind::Job, None, None, 10)
        .await
        .unwrap()
        .is_empty());
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM shard_meta")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "the refused write inserted nothing");
}

store_tests!(
    a_database_without_its_epoch_row_refuses_writes,
    rows_read_as_json_keep_every_value,
    an_older_epoch_is_fenced_once_a_newer_owner_opens,
    one_ticket_per_occurrence_and_stale_entries_write_nothing,
    results_apply_once_and_move_the_run,
    idempotency_keys_return_the_first_job_or_refuse_a_different_one,
    creates_in_one_transaction_see_each_other,
);
