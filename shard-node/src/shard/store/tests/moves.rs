//! Tenant moves between shard databases: the rows of a group of tenants exported from a source
//! shard in pages, staged and committed on a target shard, then released on the source; the
//! record of keys leaving a shard; and fencing of every write a move makes.

use std::collections::BTreeSet;

use chronoshard_wire::Backoff;
use serde_json::json;
use sqlx::{any::AnyRow, Column};

use super::{engine::with_retry, *};
use crate::shard::store::moves::{TABLES, TICKET_BODY};

/// The shard tenants move from (`open` opens shard 0) and the one they move to.
const SOURCE: u32 = 0;
const TARGET: u32 = 1;
/// The routing key of the moving group (any 16-bit value: the store only files moves under it).
const KEY: u16 = 0xbeef;

async fn open_target(db: &TestDb, epoch: u64) -> Result<Store> {
    Store::open(&db.dbs, TARGET, epoch, "node-b", 0).await
}

/// Gives `tenant` jobs in every state and fired runs: a retry waiting for its backoff (after a
/// checkpoint), a dead letter, a success, a range of missed occurrences, an idempotency key, a
/// paused job, a deleted job and one not due for long. Returns its jobs.
async fn busy_tenant(s: &Store, tenant: &str, t0: i64) -> Vec<JobRow> {
    let retrying = with_retry(job(tenant, t0), 3, Backoff::Exponential);
    s.create_job(&retrying, Some("nightly-report"))
        .await
        .unwrap();
    let t = fired(s, &retrying, t0).await;
    s.mark_published(&[acked(t.ticket_id, 1)], t0 + 1)
        .await
        .unwrap();
    let mut progress = report(&t, 1, ResultKind::Progress, t0 + 20);
    progress.checkpoint = Some(json!({"rows": 10, "cursor": "k\"7"}));
    let failed = report(&t, 1, ResultKind::Failed, t0 + 30);
    s.apply_results(
        &[
            report(&t, 1, ResultKind::Started, t0 + 10),
            progress,
            failed,
        ],
        t0 + 30,
    )
    .await
    .unwrap();

    let dead = job(tenant, t0);
    s.create_job(&dead, None).await.unwrap();
    let t = fired(s, &dead, t0).await;
    s.mark_published(&[acked(t.ticket_id, 1)], t0 + 1)
        .await
        .unwrap();
    let mut failed = report(&t, 1, ResultKind::Failed, t0 + 40);
    failed.output = Some("line 1\nline \"2\"\t\u{7}".into());
    s.apply_results(&[failed], t0 + 40).await.unwrap();

    let ok = job(tenant, t0 + 5);
    s.create_job(&ok, None).await.unwrap();
    s.fire(
        FireRequest {
            job_id: ok.id,
            expected_next: None,
            next_fire_at: None,
            not_fired: &[NotFiredRow {
                first: t0 - 3000,
                last: t0 - 1000,
                count: 3,
                status: RunStatus::Missed,
                reason: "missed while the shard was down".into(),
            }],
            occurrences: vec![(t0, vec![ticket(&ok, t0, 1)])],
            overlap: ok.spec.overlap,
        },
        t0,
    )
    .await
    .unwrap();
    let t = s.only_ticket_of(ok.id).await;
    s.mark_published(&[acked(t, 1)], t0 + 1).await.unwrap();
    let started = TicketResult::about(t, 1, 0, ResultKind::Started, "w-1", from_millis(t0 + 2));
    let mut done = TicketResult::about(t, 1, 0, ResultKind::Succeeded, "w-1", from_millis(t0 + 9));
    done.http_status = Some(204);
    s.apply_results(&[started, done], t0 + 9).await.unwrap();

    let mut paused = job(tenant, t0);
    paused.state = JobState::Paused;
    paused.next_fire_at = None;
    s.create_job(&paused, None).await.unwrap();

    let mut deleted = job(tenant, t0);
    s.create_job(&deleted, None).await.unwrap();
    deleted.state = JobState::Deleted;
    deleted.next_fire_at = None;
    assert!(s.update_job(&deleted, &[]).await.unwrap());

    let mut later = job(tenant, t0 + 86_400_000);
    later.spec.name = "a \"name\"\\ é 東\n\u{1F600}".into();
    later.created_at = (1 << 53) + 1;
    later.updated_at = i64::MAX - 1;
    s.create_job(&later, Some("k\u{7f}2")).await.unwrap();

    vec![retrying, dead, ok, paused, deleted, later]
}

impl Store {
    /// The one ticket of a job fired once.
    async fn only_ticket_of(&self, job: Uuid) -> Uuid {
        let id: String = sqlx::query_scalar("SELECT id FROM tickets WHERE job_id = $1")
            .bind(job.to_string())
            .fetch_one(&self.pool)
            .await
            .unwrap();
        Uuid::parse_str(&id).unwrap()
    }
}

/// A value as text, whatever its column's type.
fn value(row: &AnyRow, i: usize) -> String {
    match row.try_get::<Option<i64>, _>(i) {
        Ok(v) => format!("{v:?}"),
        Err(_) => format!("{:?}", row.try_get::<Option<String>, _>(i).unwrap()),
    }
}

/// Every row `tenants` have, all columns (found by SQL of its own, not by the code under test),
/// in primary key order, one line per row; with the shards the ticket bodies name, which the
/// lines leave out.
async fn dump(s: &Store, tenants: &[&str]) -> (Vec<String>, BTreeSet<u64>) {
    let list = tenants
        .iter()
        .map(|t| format!("'{t}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let queries = [
        format!("SELECT * FROM paused_tenants WHERE tenant IN ({list}) ORDER BY tenant"),
        format!("SELECT * FROM jobs WHERE tenant IN ({list}) ORDER BY id"),
        format!(
            "SELECT r.* FROM runs r JOIN jobs j ON j.id = r.job_id WHERE j.tenant IN ({list}) \
             ORDER BY r.job_id, r.scheduled_at"
        ),
        format!(
            "SELECT t.* FROM tickets t JOIN jobs j ON j.id = t.job_id WHERE j.tenant IN ({list}) \
             ORDER BY t.id"
        ),
        format!(
            "SELECT a.* FROM attempts a JOIN tickets t ON t.id = a.ticket_id \
             JOIN jobs j ON j.id = t.job_id WHERE j.tenant IN ({list}) ORDER BY a.ticket_id, a.attempt"
        ),
    ];
    let (mut lines, mut shards) = (Vec::new(), BTreeSet::new());
    for sql in queries {
        let table = sql
            .split(" FROM ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        for row in sqlx::query(&sql).fetch_all(&s.pool).await.unwrap() {
            let cells: Vec<String> = row
                .columns()
                .iter()
                .map(|c| {
                    if table == "tickets" && c.name() == "body" {
                        let mut body: serde_json::Value =
                            serde_json::from_str(&row.try_get::<String, _>(c.ordinal()).unwrap())
                                .unwrap();
                        let shard = body.as_object_mut().unwrap().remove("shard").unwrap();
                        shards.insert(shard.as_u64().unwrap());
                        format!("{}={body}", c.name())
                    } else {
                        format!("{}={}", c.name(), value(&row, c.ordinal()))
                    }
                })
                .collect();
            lines.push(format!("{table}: {}", cells.join(" ")));
        }
    }
    (lines, shards)
}

/// Every page of an export with `max_bytes`, each call's pages and cursor sent through JSON as
/// the control plane relays them. Checks each call's size bound.
async fn export_all(s: &Store, tenants: &[String], max_bytes: usize) -> Vec<Vec<MovePage>> {
    let mut calls = Vec::new();
    let mut cursor = ExportCursor::default();
    loop {
        let (pages, next) = s.export_tenants(tenants, &cursor, max_bytes).await.unwrap();
        let json = serde_json::to_string(&pages).unwrap();
        let rows: usize = pages.iter().map(|p| p.rows.len()).sum();
        assert!(
            json.len() <= max_bytes.saturating_add(pages.len() * PAGE_OVERHEAD) || rows == 1,
            "{} bytes of pages for max_bytes {max_bytes}: {json}",
            json.len()
        );
        assert_eq!(serde_json::from_str::<Vec<MovePage>>(&json).unwrap(), pages);
        calls.push(serde_json::from_str(&json).unwrap());
        match next {
            Some(next) => {
                assert!(rows > 0, "a call that continues exported something");
                cursor = serde_json::from_str(&serde_json::to_string(&next).unwrap()).unwrap();
            }
            None => return calls,
        }
    }
}

/// The rows of every call, table by table.
fn rows_by_table(calls: &[Vec<MovePage>]) -> Vec<(MovedTable, Vec<Cell>)> {
    calls
        .iter()
        .flatten()
        .flat_map(|p| p.rows.iter().map(move |r| (p.table, r.clone())))
        .collect()
}

/// The whole move of tenants `a` and `p` (paused) from one shard to another: export in many
/// small pages or in one, staging (a resend included), commit (a repeat included), then the
/// release on the source. What the target holds afterwards is row for row what the source held,
/// except the shard the tickets name; the target's own tenant and the source's staying one are
/// untouched.
async fn a_group_of_tenants_moves_row_for_row(db: TestDb) {
    let src = open(&db, 1).await.unwrap();
    let dst = open_target(&db, 1).await.unwrap();
    let t0 = 1_000_000;
    let a = busy_tenant(&src, "a", t0).await;
    busy_tenant(&src, "b", t0).await;
    let p = job("p", t0 + 7);
    src.create_job(&p, None).await.unwrap();
    assert!(src.pause_tenant("p", &[], t0 + 50).await.unwrap());
    busy_tenant(&dst, "c", t0).await;
    assert_eq!(
        src.tenants().await.unwrap(),
        vec![("a".into(), 5), ("b".into(), 5), ("p".into(), 1)],
        "every tenant with its jobs not deleted"
    );

    let moving = vec!["a".to_string(), "p".to_string()];
    let (before, shards) = dump(&src, &["a", "p"]).await;
    assert_eq!(shards, BTreeSet::from([SOURCE as u64]));
    let (b_before, _) = dump(&src, &["b"]).await;
    let (c_before, _) = dump(&dst, &["c"]).await;

    // Small pages: many calls, each within the bound; one large call: the same rows.
    let small = export_all(&src, &moving, 600).await;
    assert!(small.len() > 10, "{} calls", small.len());
    let large = export_all(&src, &moving, usize::MAX).await;
    assert_eq!(large.len(), 1);
    assert_eq!(rows_by_table(&small), rows_by_table(&large));
    assert_eq!(rows_by_table(&large).len(), before.len());
    let one_row = export_all(&src, &moving, 0).await;
    assert_eq!(one_row.len(), before.len(), "one row per call at least");
    assert_eq!(rows_by_table(&one_row), rows_by_table(&large));

    // Staged pages are not the target's yet; a resend of a seq replaces it.
    for (seq, pages) in small.iter().enumerate() {
        dst.stage_import(KEY, seq as u32, pages, t0 + 100)
            .await
            .unwrap();
    }
    dst.stage_import(KEY, 3, &small[3], t0 + 101).await.unwrap();
    assert!(dump(&dst, &["a", "p"]).await.0.is_empty());
    assert_eq!(dst.tenants().await.unwrap(), vec![("c".into(), 5)]);

    let imported = dst.commit_import(KEY, t0 + 200).await.unwrap();
    assert_eq!(imported.rows as usize, before.len());
    let mut ids = imported.jobs.clone();
    ids.sort();
    let mut want: Vec<Uuid> = a.iter().chain([&p]).map(|j| j.id).collect();
    want.sort();
    assert_eq!(ids, want, "every job of the group, deleted ones too");

    let (after, shards) = dump(&dst, &["a", "p"]).await;
    assert_eq!(
        after, before,
        "the target holds the tenants' rows as the source did"
    );
    assert_eq!(
        shards,
        BTreeSet::from([TARGET as u64]),
        "tickets send their results to the target"
    );
    assert_eq!(dump(&dst, &["c"]).await.0, c_before);

    // A commit repeated changes nothing: with nothing staged, or with every page sent again
    // (the commit happened, its reply was lost).
    assert_eq!(
        dst.commit_import(KEY, t0 + 300).await.unwrap(),
        Imported::default()
    );
    dst.stage_import(KEY, 0, &large[0], t0 + 400).await.unwrap();
    let again = dst.commit_import(KEY, t0 + 400).await.unwrap();
    assert_eq!(again.rows, 0);
    assert_eq!(dump(&dst, &["a", "p"]).await.0, before);

    // The target's loader finds the imported jobs as the source's did (p's are paused), and its
    // outbox sends the waiting retry with the target in the ticket.
    let horizon = t0 + 100_000_000;
    let due = |rows: Vec<DueRow>| -> Vec<(Uuid, i64)> {
        let mut v: Vec<(Uuid, i64)> = rows
            .into_iter()
            .filter(|r| r.tenant != "c" && r.tenant != "b")
            .map(|r| (r.id, r.at))
            .collect();
        v.sort();
        v
    };
    let on_target = due(dst.due_jobs(None, horizon).await.unwrap());
    assert_eq!(on_target, due(src.due_jobs(None, horizon).await.unwrap()));
    assert_eq!(on_target.len(), 4, "a's active jobs: {on_target:?}");
    let retry = dst.unpublished(horizon, horizon, 100).await.unwrap();
    let retry: Vec<&Outgoing> = retry.iter().filter(|o| o.ticket.tenant == "a").collect();
    assert_eq!(retry.len(), 1);
    assert_eq!(
        (
            retry[0].ticket.job_id,
            retry[0].ticket.attempt,
            retry[0].ticket.shard
        ),
        (a[0].id, 2, TARGET)
    );
    assert_eq!(
        dst.tenants().await.unwrap(),
        vec![("a".into(), 5), ("c".into(), 5), ("p".into(), 1)]
    );

    // The source lets go of exactly the group's rows.
    src.set_key_move(KEY, TARGET, KeyMove::Frozen, t0 + 500)
        .await
        .unwrap();
    assert_eq!(
        src.key_moves().await.unwrap(),
        vec![(KEY, TARGET, KeyMove::Frozen)]
    );
    let deleted = src
        .release_tenants(KEY, TARGET, &moving, t0 + 600)
        .await
        .unwrap();
    assert_eq!(deleted as usize, before.len());
    assert!(dump(&src, &["a", "p"]).await.0.is_empty());
    assert_eq!(dump(&src, &["b"]).await.0, b_before);
    assert_eq!(src.tenants().await.unwrap(), vec![("b".into(), 5)]);
    assert!(src.paused_tenants().await.unwrap().is_empty());
    assert_eq!(
        src.key_moves().await.unwrap(),
        vec![(KEY, TARGET, KeyMove::Gone)]
    );
    assert_eq!(
        src.export_tenants(&moving, &ExportCursor::default(), usize::MAX)
            .await
            .unwrap(),
        (Vec::new(), None)
    );
}

/// Keys leaving a shard are kept in its database: a new owner finds them. Clearing one forgets
/// it, and a rolled back import drops its staged pages.
async fn key_moves_and_staged_pages_outlive_the_owner(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    s.set_key_move(7, 3, KeyMove::Frozen, 10).await.unwrap();
    s.set_key_move(2, 4, KeyMove::Frozen, 10).await.unwrap();
    s.set_key_move(2, 5, KeyMove::Gone, 11).await.unwrap();
    s.set_key_move(u16::MAX, u32::MAX, KeyMove::Gone, 12)
        .await
        .unwrap();
    let page = MovePage {
        table: MovedTable::PausedTenants,
        rows: vec![vec![Cell::Text("z".into()), Cell::Int(5)]],
    };
    s.stage_import(9, 0, std::slice::from_ref(&page), 10)
        .await
        .unwrap();
    s.stage_import(9, 1, std::slice::from_ref(&page), 10)
        .await
        .unwrap();
    s.close().await;

    let s = open(&db, 2).await.unwrap();
    assert_eq!(
        s.key_moves().await.unwrap(),
        vec![
            (2, 5, KeyMove::Gone),
            (7, 3, KeyMove::Frozen),
            (u16::MAX, u32::MAX, KeyMove::Gone)
        ]
    );
    s.clear_key_move(7).await.unwrap();
    s.clear_key_move(7).await.unwrap();
    assert_eq!(s.key_moves().await.unwrap().len(), 2);

    assert_eq!(s.discard_import(9).await.unwrap(), 2);
    assert_eq!(s.discard_import(9).await.unwrap(), 0);
    assert_eq!(s.commit_import(9, 20).await.unwrap(), Imported::default());
    assert!(s.paused_tenants().await.unwrap().is_empty());
}

/// A sealed shard's leaving keys (thousands) are written in one transaction, and written again
/// as gone; a newer owner's database refuses them.
async fn many_keys_leave_at_once(db: TestDb) {
    use chronoshard_wire::rpc::KeyTarget;
    let s = open(&db, 1).await.unwrap();
    let moves: Vec<KeyTarget> = (0..5000u16)
        .map(|key| KeyTarget {
            key: key * 13,
            target: 8 + u32::from(key % 4),
        })
        .collect();
    s.set_key_moves(&moves, KeyMove::Frozen, 10).await.unwrap();
    s.set_key_moves(&moves[..10], KeyMove::Gone, 11)
        .await
        .unwrap();
    s.set_key_moves(&[], KeyMove::Gone, 11).await.unwrap();
    let stored = s.key_moves().await.unwrap();
    assert_eq!(stored.len(), 5000);
    let gone = stored
        .iter()
        .filter(|(_, _, m)| *m == KeyMove::Gone)
        .count();
    assert_eq!(gone, 10);
    assert!(stored.contains(&(13 * 4999, 8 + 4999 % 4, KeyMove::Frozen)));
    let _newer = open(&db, 2).await.unwrap();
    assert!(matches!(
        s.set_key_moves(&moves[..1], KeyMove::Gone, 12).await,
        Err(StoreError::Fenced { .. })
    ));
}

/// Every write of a move is refused once a newer owner opened the shard, and leaves nothing.
async fn every_write_of_a_move_is_fenced(db: TestDb) {
    let old = open(&db, 1).await.unwrap();
    let j = job("a", 1000);
    old.create_job(&j, None).await.unwrap();
    let tenants = vec!["a".to_string()];
    let (pages, _) = old
        .export_tenants(&tenants, &ExportCursor::default(), usize::MAX)
        .await
        .unwrap();
    old.stage_import(1, 0, &pages, 10).await.unwrap();
    let new = open(&db, 2).await.unwrap();

    let fenced = |r: Result<()>| {
        assert!(
            matches!(
                r,
                Err(StoreError::Fenced {
                    mine: 1,
                    current: 2,
                    ..
                })
            ),
            "{r:?}"
        )
    };
    fenced(old.stage_import(2, 0, &pages, 20).await);
    fenced(old.commit_import(1, 20).await.map(drop));
    fenced(old.discard_import(1).await.map(drop));
    fenced(old.set_key_move(1, 3, KeyMove::Frozen, 20).await);
    fenced(old.release_tenants(1, 3, &tenants, 20).await.map(drop));
    fenced(old.clear_key_move(1).await);

    assert!(new.key_moves().await.unwrap().is_empty());
    assert!(new.get_job(j.id).await.unwrap().is_some());
    // reads are not fenced: the old owner still exports
    assert_eq!(
        old.export_tenants(&tenants, &ExportCursor::default(), usize::MAX)
            .await
            .unwrap()
            .0,
        pages
    );
    // the staged pages are still there for the new owner
    assert_eq!(new.discard_import(1).await.unwrap(), 1);
    assert_eq!(new.discard_import(2).await.unwrap(), 0);
}

/// Pages and cursors that do not fit their table are refused before anything is written.
async fn pages_that_do_not_fit_their_table_are_refused(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let bad = [
        // too few cells
        MovePage {
            table: MovedTable::PausedTenants,
            rows: vec![vec![Cell::Text("t".into())]],
        },
        // text in an integer column
        MovePage {
            table: MovedTable::PausedTenants,
            rows: vec![vec![Cell::Text("t".into()), Cell::Text("5".into())]],
        },
        // a null key
        MovePage {
            table: MovedTable::PausedTenants,
            rows: vec![vec![Cell::Null, Cell::Int(5)]],
        },
    ];
    for page in bad {
        let err = s.stage_import(1, 0, &[page], 0).await.unwrap_err();
        assert!(matches!(err, StoreError::BadMove(_)), "{err}");
    }
    assert_eq!(s.discard_import(1).await.unwrap(), 0);
    let cursor = ExportCursor {
        table: MovedTable::Runs,
        after: Some(vec![Cell::Text("j".into())]),
    };
    let err = s
        .export_tenants(&["t".into()], &cursor, 100)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::BadMove(_)), "{err}");
    // a null where the column allows it is fine
    let ok = MovePage {
        table: MovedTable::Runs,
        rows: vec![vec![
            Cell::Text(Uuid::now_v7().to_string()),
            Cell::Int(5),
            Cell::Text("missed".into()),
            Cell::Null,
            Cell::Int(0),
            Cell::Null,
            Cell::Null,
            Cell::Int(1),
            Cell::Int(1),
        ]],
    };
    s.stage_import(1, 0, &[ok], 0).await.unwrap();
}

/// The moved tables' declared columns are every column both backends have, with the same types:
/// a column added by a migration and not to `TABLES` would not move.
async fn the_moved_columns_are_the_schemas_columns(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    for def in &TABLES {
        let sql = match db.dbs {
            Databases::Sqlite(_) => format!(
                "SELECT name, type FROM pragma_table_info('{}') ORDER BY cid",
                def.name
            ),
            Databases::Postgres(_) => format!(
                "SELECT column_name::text, data_type::text FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = '{}' ORDER BY ordinal_position",
                def.name
            ),
        };
        let columns: Vec<(String, String)> = sqlx::query_as(&sql).fetch_all(&s.pool).await.unwrap();
        let columns: Vec<(String, String)> = columns
            .into_iter()
            .map(|(name, ty)| {
                let kind = match ty.to_ascii_lowercase().as_str() {
                    "integer" | "bigint" => "int",
                    "text" => "text",
                    other => panic!("{}.{name} is {other}", def.name),
                };
                (name, kind.to_string())
            })
            .collect();
        let declared: Vec<(String, String)> = def
            .columns
            .iter()
            .map(|(name, kind)| (name.to_string(), format!("{kind:?}").to_lowercase()))
            .collect();
        assert_eq!(columns, declared, "{}", def.name);
    }
}

store_tests!(
    a_group_of_tenants_moves_row_for_row,
    many_keys_leave_at_once,
    key_moves_and_staged_pages_outlive_the_owner,
    every_write_of_a_move_is_fenced,
    pages_that_do_not_fit_their_table_are_refused,
    the_moved_columns_are_the_schemas_columns,
);

/// Cells go through JSON unchanged, and a page's size is counted as serde_json writes it.
#[test]
fn cells_keep_their_values_and_size_through_json() {
    let cells = vec![
        Cell::Int(0),
        Cell::Int(-1),
        Cell::Int(9),
        Cell::Int(10),
        Cell::Int(i64::MAX),
        Cell::Int(i64::MIN),
        Cell::Int((1 << 53) + 1),
        Cell::Text(String::new()),
        Cell::Text("42".into()),
        Cell::Text("null".into()),
        Cell::Text("\"q\" \\ / \n\r\t\u{8}\u{c}\u{0}\u{1f}\u{7f} é 東 \u{1F600}".into()),
        Cell::Null,
    ];
    for cell in &cells {
        let json = serde_json::to_string(cell).unwrap();
        assert_eq!(
            crate::shard::store::moves::json_len(cell),
            json.len(),
            "{json}"
        );
        assert_eq!(&serde_json::from_str::<Cell>(&json).unwrap(), cell);
    }
    let page = MovePage {
        table: MovedTable::Attempts,
        rows: vec![cells.clone(), cells],
    };
    let json = serde_json::to_string(&page).unwrap();
    assert_eq!(serde_json::from_str::<MovePage>(&json).unwrap(), page);
    assert!(
        json.starts_with(r#"{"table":"attempts","rows":[[0,-1,9,10,"#),
        "{json}"
    );
    // numbers that are not 64-bit integers are no cell
    for json in ["1.5", "18446744073709551615", "true", "[1]"] {
        assert!(serde_json::from_str::<Cell>(json).is_err(), "{json}");
    }
    for def in &TABLES {
        let empty = MovePage {
            table: def.table,
            rows: Vec::new(),
        };
        assert!(serde_json::to_string(&[&empty]).unwrap().len() <= PAGE_OVERHEAD);
    }
    let cursor = ExportCursor {
        table: MovedTable::Runs,
        after: Some(vec![Cell::Text("j".into()), Cell::Int(-5)]),
    };
    let json = serde_json::to_string(&cursor).unwrap();
    assert_eq!(json, r#"{"table":"runs","after":["j",-5]}"#);
    assert_eq!(serde_json::from_str::<ExportCursor>(&json).unwrap(), cursor);
}

#[test]
fn tables_are_listed_in_moved_table_order() {
    for (i, def) in TABLES.iter().enumerate() {
        assert_eq!(def.table as usize, i, "TABLES is in MovedTable order");
    }
    assert_eq!(
        TABLES[MovedTable::Tickets as usize].columns[TICKET_BODY].0,
        "body"
    );
}
