//! Moving tenants between shard databases, for online shard growth. The tenants sharing a routing
//! key move as one unit: the source shard exports their rows in pages of bounded size
//! (`export_tenants`), the control plane relays the pages, the target keeps them aside
//! (`stage_import`) and makes them its own in one transaction (`commit_import`), and the source
//! then deletes its copy (`release_tenants`) and remembers where the key went (`key_moves`).
//!
//! It owns the copy of those rows and the two tables that track a move (`staged_imports` on the
//! target, `key_moves` on the source). It must not decide when a key moves or where to, and it does
//! not stop other writers: while a key is frozen, its caller keeps the shard loop off the tenants'
//! rows. Every moved table is declared once, in `TABLES`, which export, import and delete follow
//! alike; a column added to one of those tables must be added there (a test compares the list with
//! both backends' schemas).

use std::collections::BTreeMap;

pub use chronoshard_wire::growth::{Cell, ExportCursor, KeyMove, MovePage, MovedTable};
use sqlx::{query_builder::Separated, Any, AnyConnection, QueryBuilder, Row};
use uuid::Uuid;

use super::{
    parse_uuid,
    sql::{rows_per_statement, Sql},
    Result, Store, StoreError, Tx,
};

/// The length of a cell's JSON, as serde_json writes it: what the cell adds to a page.
pub(super) fn json_len(cell: &Cell) -> usize {
    match cell {
        Cell::Int(i) => {
            let digits = i
                .unsigned_abs()
                .checked_ilog10()
                .map_or(1, |d| d as usize + 1);
            digits + usize::from(*i < 0)
        }
        Cell::Text(s) => {
            let escaped: usize = s
                .bytes()
                .map(|b| match b {
                    b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
                    0..=0x1f => 6,
                    _ => 1,
                })
                .sum();
            escaped + 2
        }
        Cell::Null => 4,
    }
}

/// A moved table's definition.
pub(super) fn def(table: MovedTable) -> &'static TableDef {
    &TABLES[table as usize]
}

/// The table exported after `table`.
fn next_table(table: MovedTable) -> Option<MovedTable> {
    TABLES.get(table as usize + 1).map(|d| d.table)
}

fn key_move_str(state: KeyMove) -> &'static str {
    match state {
        KeyMove::Frozen => "frozen",
        KeyMove::Gone => "gone",
    }
}

fn parse_key_move(s: &str) -> Option<KeyMove> {
    match s {
        "frozen" => Some(KeyMove::Frozen),
        "gone" => Some(KeyMove::Gone),
        _ => None,
    }
}

/// What a commit of staged pages wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Imported {
    /// The jobs of the staged pages, for the shard loop to schedule.
    pub jobs: Vec<Uuid>,
    /// Rows inserted (a row already present is skipped and not counted).
    pub rows: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Int,
    Text,
}

/// How a table's rows belong to the moving tenants.
#[derive(Clone, Copy, Debug)]
enum Owner {
    /// By their `tenant` column.
    Tenant,
    /// By `job_id`, a job of theirs.
    Job,
    /// By `ticket_id`, a ticket of one of their jobs.
    Ticket,
}

/// A moved table: its columns (every one of both backends' schemas, in the order of a page's
/// cells) and how its rows are found.
#[derive(Debug)]
pub(super) struct TableDef {
    pub(super) table: MovedTable,
    pub(super) name: &'static str,
    pub(super) columns: &'static [(&'static str, Kind)],
    /// The primary key is the first `key` columns.
    key: usize,
    owner: Owner,
}

use Kind::{Int, Text};

/// Every table a tenant has rows in, parents before children: the order of an export. A delete
/// goes the other way, since a child's rows are found through its parent's.
pub(super) const TABLES: [TableDef; 5] = [
    TableDef {
        table: MovedTable::PausedTenants,
        name: "paused_tenants",
        columns: &[("tenant", Text), ("paused_at", Int)],
        key: 1,
        owner: Owner::Tenant,
    },
    TableDef {
        table: MovedTable::Jobs,
        name: "jobs",
        columns: &[
            ("id", Text),
            ("tenant", Text),
            ("spec", Text),
            ("state", Text),
            ("created_at", Int),
            ("updated_at", Int),
            ("anchor_at", Int),
            ("next_fire_at", Int),
            ("idempotency_key", Text),
            ("buffered_at", Int),
            ("priority", Int),
            ("moves", Int),
            ("kind", Text),
        ],
        key: 1,
        owner: Owner::Tenant,
    },
    TableDef {
        table: MovedTable::Runs,
        name: "runs",
        columns: &[
            ("job_id", Text),
            ("scheduled_at", Int),
            ("status", Text),
            ("reason", Text),
            ("attempts", Int),
            ("range_end", Int),
            ("count", Int),
            ("created_at", Int),
            ("updated_at", Int),
        ],
        key: 2,
        owner: Owner::Job,
    },
    TableDef {
        table: MovedTable::Tickets,
        name: "tickets",
        columns: &[
            ("id", Text),
            ("job_id", Text),
            ("scheduled_at", Int),
            ("item", Int),
            ("status", Text),
            ("attempt", Int),
            ("epoch", Int),
            ("queue", Text),
            ("body", Text),
            ("created_at", Int),
            ("updated_at", Int),
            ("timeout_ms", Int),
            ("attempt_base", Int),
            ("dead_at", Int),
            ("checkpoint", Text),
            ("reason", Text),
        ],
        key: 1,
        owner: Owner::Job,
    },
    TableDef {
        table: MovedTable::Attempts,
        name: "attempts",
        columns: &[
            ("ticket_id", Text),
            ("attempt", Int),
            ("status", Text),
            ("created_at", Int),
            ("published_at", Int),
            ("started_at", Int),
            ("finished_at", Int),
            ("worker", Text),
            ("error", Text),
            ("http_status", Int),
            ("not_before", Int),
            ("heartbeat_at", Int),
            ("publish_seq", Int),
            ("resends", Int),
            ("output", Text),
        ],
        key: 2,
        owner: Owner::Ticket,
    },
];

/// The column of a ticket row that holds the dispatched ticket's JSON.
pub(super) const TICKET_BODY: usize = 8;

impl TableDef {
    /// The index of column `name` in a row's cells.
    pub(super) fn position(&self, name: &str) -> usize {
        (self.columns.iter().position(|(n, _)| *n == name)).expect("a column of the table")
    }

    pub(super) fn column_list(&self) -> String {
        let names: Vec<&str> = self.columns.iter().map(|(name, _)| *name).collect();
        names.join(", ")
    }

    fn key_list(&self) -> String {
        let names: Vec<&str> = self.columns[..self.key].iter().map(|(n, _)| *n).collect();
        names.join(", ")
    }

    /// Pushes the condition that selects the rows of `tenants` (not empty).
    fn push_owned_by<'a>(&self, qb: &mut QueryBuilder<'a, Any>, tenants: &'a [String]) {
        qb.push(match self.owner {
            Owner::Tenant => "tenant IN (",
            Owner::Job => "job_id IN (SELECT id FROM jobs WHERE tenant IN (",
            Owner::Ticket => {
                "ticket_id IN (SELECT id FROM tickets WHERE job_id IN \
                 (SELECT id FROM jobs WHERE tenant IN ("
            }
        });
        let mut list = qb.separated(", ");
        for t in tenants {
            list.push_bind(t.as_str());
        }
        qb.push(match self.owner {
            Owner::Tenant => ")",
            Owner::Job => "))",
            Owner::Ticket => ")))",
        });
    }

    /// The cells of a row read with `column_list`.
    pub(super) fn decode(&self, row: &sqlx::any::AnyRow) -> Result<Vec<Cell>> {
        self.columns
            .iter()
            .enumerate()
            .map(|(i, (_, kind))| {
                Ok(match kind {
                    Int => row
                        .try_get::<Option<i64>, _>(i)?
                        .map_or(Cell::Null, Cell::Int),
                    Text => row
                        .try_get::<Option<String>, _>(i)?
                        .map_or(Cell::Null, Cell::Text),
                })
            })
            .collect()
    }

    /// Refuses cells that do not fit the columns they would go into (`columns` from the first).
    fn check(&self, cells: &[Cell], columns: usize) -> Result<()> {
        if cells.len() != columns {
            return Err(StoreError::BadMove(format!(
                "{} cells for {} columns of {}",
                cells.len(),
                columns,
                self.name
            )));
        }
        for (i, (cell, (name, kind))) in cells.iter().zip(self.columns).enumerate() {
            match (cell, kind) {
                (Cell::Int(_), Int) | (Cell::Text(_), Text) => {}
                // a key column is never null
                (Cell::Null, _) if i >= self.key => {}
                _ => {
                    return Err(StoreError::BadMove(format!(
                        "{cell:?} does not fit {}.{name}",
                        self.name
                    )))
                }
            }
        }
        Ok(())
    }

    /// Refuses rows that do not fit the table, or tickets whose body is no ticket's JSON (which
    /// the commit must rewrite).
    pub(super) fn check_rows(&self, rows: &[Vec<Cell>]) -> Result<()> {
        for row in rows {
            self.check(row, self.columns.len())?;
            if self.table == MovedTable::Tickets {
                if let Cell::Text(body) = &row[TICKET_BODY] {
                    ticket_fields(body)?;
                }
            }
        }
        Ok(())
    }
}

/// Binds a cell (checked against its column by `TableDef::check`) as a value of its column's type.
fn bind_cell<'a>(list: &mut Separated<'_, 'a, Any, &'static str>, cell: &'a Cell, kind: Kind) {
    match (cell, kind) {
        (Cell::Int(i), _) => list.push_bind(*i),
        (Cell::Text(s), _) => list.push_bind(s.as_str()),
        (Cell::Null, Int) => list.push_bind(None::<i64>),
        (Cell::Null, Text) => list.push_bind(None::<&str>),
    };
}

/// Rows read per query by an export at first; each further read of the same call doubles it, up
/// to `MAX_READ`. A call stops at the first row that does not fit, and the rows read after it are
/// read again by the next call: small first reads waste little when rows are large.
const FIRST_READ: usize = 16;
const MAX_READ: usize = 512;

/// A page's JSON beyond its rows: `{"table":"paused_tenants","rows":[]}` and a separator.
pub const PAGE_OVERHEAD: usize = 40;

impl Store {
    /// Every tenant with rows here (jobs of any state, or a `paused_tenants` row), sorted by
    /// name (bytewise), each with its count of jobs not deleted.
    pub async fn tenants(&self) -> Result<Vec<(String, u64)>> {
        let jobs: Vec<(String, i64)> = sqlx::query_as(
            "SELECT tenant, SUM(CASE WHEN state = 'deleted' THEN 0 ELSE 1 END) FROM jobs GROUP BY tenant",
        )
        .fetch_all(&self.pool)
        .await?;
        let paused: Vec<String> = sqlx::query_scalar("SELECT tenant FROM paused_tenants")
            .fetch_all(&self.pool)
            .await?;
        let mut all: BTreeMap<String, u64> = paused.into_iter().map(|t| (t, 0)).collect();
        for (tenant, live) in jobs {
            all.insert(tenant, live as u64);
        }
        Ok(all.into_iter().collect())
    }

    /// The next pages of the rows of `tenants`, from `cursor`: `paused_tenants`, `jobs`, `runs`,
    /// `tickets`, `attempts` in that order (runs and tickets by `job_id` of the tenants' jobs,
    /// attempts by `ticket_id` of those tickets), each table in primary key order. At most one
    /// page per table; their rows' JSON stays within `max_bytes` (each page adds at most
    /// `PAGE_OVERHEAD`), except that a row larger than that comes alone: every call returns at
    /// least one row while any is left. Returns the pages and the cursor to continue from, None
    /// once every row was exported. Reads only.
    ///
    /// Each call reads from where the last one stopped, so pages taken at different times are one
    /// copy only if the tenants' rows do not change meanwhile (their key is frozen).
    pub async fn export_tenants(
        &self,
        tenants: &[String],
        cursor: &ExportCursor,
        max_bytes: usize,
    ) -> Result<(Vec<MovePage>, Option<ExportCursor>)> {
        if let Some(after) = &cursor.after {
            let def = def(cursor.table);
            def.check(after, def.key)?;
        }
        if tenants.is_empty() {
            return Ok((Vec::new(), None));
        }
        let mut conn = self.pool.acquire().await?;
        let mut pages = Vec::new();
        let mut at = cursor.clone();
        let (mut bytes, mut taken) = (0usize, 0usize);
        loop {
            let def = def(at.table);
            let mut page = MovePage {
                table: at.table,
                rows: Vec::new(),
            };
            let mut full = false;
            let mut limit = FIRST_READ;
            'table: loop {
                let rows = read_rows(&mut conn, def, tenants, at.after.as_deref(), limit).await?;
                let read = rows.len();
                for row in rows {
                    // the row's JSON and the comma before it
                    let size = row.iter().map(json_len).sum::<usize>() + row.len() + 2;
                    if taken > 0 && bytes + size > max_bytes {
                        full = true;
                        break 'table;
                    }
                    bytes += size;
                    taken += 1;
                    at.after = Some(row[..def.key].to_vec());
                    page.rows.push(row);
                }
                if read < limit {
                    break;
                }
                limit = (limit * 2).min(MAX_READ);
            }
            if !page.rows.is_empty() {
                pages.push(page);
            }
            if full {
                return Ok((pages, Some(at)));
            }
            match next_table(at.table) {
                Some(table) => at = ExportCursor { table, after: None },
                None => return Ok((pages, None)),
            }
        }
    }

    /// Keeps `pages`, sent for routing key `key` as number `seq`, until the move commits or is
    /// discarded. Sending the same `seq` again replaces what it sent before, so a resend after a
    /// lost reply changes nothing. Refuses a page whose rows do not fit its table.
    pub async fn stage_import(
        &self,
        key: u16,
        seq: u32,
        pages: &[MovePage],
        now: i64,
    ) -> Result<()> {
        for page in pages {
            def(page.table).check_rows(&page.rows)?;
        }
        let body = serde_json::to_string(pages)
            .map_err(|e| StoreError::BadMove(format!("pages as JSON: {e}")))?;
        let mut tx = self.write().await?;
        sqlx::query(
            "INSERT INTO staged_imports (key, seq, body, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (key, seq) DO UPDATE SET body = excluded.body, created_at = excluded.created_at",
        )
        .bind(i64::from(key))
        .bind(i64::from(seq))
        .bind(body)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Makes the staged pages of `key` this shard's rows, in one transaction: inserts their rows
    /// in `seq` order, skipping rows already present (so a commit repeated after a crash changes
    /// nothing), points each imported ticket's `body.shard` at this shard (its worker sends the
    /// results to the shard named there), and drops the staged pages. The rows keep their own
    /// times; `now` is not written. Returns the imported jobs (none when nothing was staged) and
    /// the rows inserted.
    pub async fn commit_import(&self, key: u16, _now: i64) -> Result<Imported> {
        let mut tx = self.write().await?;
        let mut imported = Imported::default();
        let mut after = -1i64;
        // One staged set at a time: a tenant's pages together may be large.
        while let Some((seq, body)) = sqlx::query_as::<_, (i64, String)>(
            "SELECT seq, body FROM staged_imports WHERE key = $1 AND seq > $2 ORDER BY seq LIMIT 1",
        )
        .bind(i64::from(key))
        .bind(after)
        .fetch_optional(&mut *tx)
        .await?
        {
            after = seq;
            let pages: Vec<MovePage> = serde_json::from_str(&body)
                .map_err(|e| StoreError::Corrupt(format!("staged pages of key {key}: {e}")))?;
            for page in pages {
                self.insert_page(&mut tx, page, &mut imported).await?;
            }
        }
        if after >= 0 {
            sqlx::query("DELETE FROM staged_imports WHERE key = $1")
                .bind(i64::from(key))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(imported)
    }

    /// Inserts one page's rows, skipping those present; tickets get this shard in their body.
    pub(super) async fn insert_page(
        &self,
        tx: &mut Tx,
        page: MovePage,
        out: &mut Imported,
    ) -> Result<()> {
        let def = def(page.table);
        def.check_rows(&page.rows)?;
        let mut rows = page.rows;
        match page.table {
            MovedTable::Tickets => {
                for row in &mut rows {
                    if let Cell::Text(body) = &row[TICKET_BODY] {
                        row[TICKET_BODY] = Cell::Text(with_shard(body, self.shard)?);
                    }
                }
            }
            MovedTable::Jobs => {
                for row in &rows {
                    if let Cell::Text(id) = &row[0] {
                        out.jobs.push(parse_uuid(id)?);
                    }
                }
            }
            _ => {}
        }
        for chunk in rows.chunks(rows_per_statement(def.columns.len())) {
            let mut qb = Sql::new(tx);
            qb.push(format!("INSERT INTO {} ({}) ", def.name, def.column_list()));
            qb.push_values(chunk, |mut list, row| {
                for (cell, (_, kind)) in row.iter().zip(def.columns) {
                    bind_cell(&mut list, cell, *kind);
                }
            });
            qb.push(" ON CONFLICT DO NOTHING");
            let (sql, args) = qb.build();
            out.rows += sqlx::query_with(&sql, args)
                .execute(&mut **tx)
                .await?
                .rows_affected();
        }
        Ok(())
    }

    /// Drops the staged pages of `key` (the move was rolled back); returns how many sets there
    /// were.
    pub async fn discard_import(&self, key: u16) -> Result<u64> {
        let mut tx = self.write().await?;
        let n = sqlx::query("DELETE FROM staged_imports WHERE key = $1")
            .bind(i64::from(key))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n)
    }

    /// Records routing key `key` as leaving this shard for shard `target`, in `state`.
    pub async fn set_key_move(
        &self,
        key: u16,
        target: u32,
        state: KeyMove,
        now: i64,
    ) -> Result<()> {
        let mut tx = self.write().await?;
        upsert_key_move(&mut tx, key, target, state, now).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records every key of `moves` as leaving for its target in `state`, in one transaction
    /// (an old shard's leaving keys are thousands when it is sealed).
    pub async fn set_key_moves(
        &self,
        moves: &[chronoshard_wire::rpc::KeyTarget],
        state: KeyMove,
        now: i64,
    ) -> Result<()> {
        if moves.is_empty() {
            return Ok(());
        }
        let mut tx = self.write().await?;
        for chunk in moves.chunks(rows_per_statement(4)) {
            let mut qb = Sql::new(&tx);
            qb.push("INSERT INTO key_moves (key, target, state, updated_at) ");
            qb.push_values(chunk, |mut row, m| {
                row.push_bind(i64::from(m.key))
                    .push_bind(i64::from(m.target))
                    .push_bind(key_move_str(state))
                    .push_bind(now);
            });
            qb.push(
                " ON CONFLICT (key) DO UPDATE SET target = excluded.target, \
                 state = excluded.state, updated_at = excluded.updated_at",
            );
            let (sql, args) = qb.build();
            sqlx::query_with(&sql, args).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Deletes every row of `tenants` (the rows `export_tenants` reads) and records `key` as gone
    /// to `target`, in one transaction: the rows and the record of where they went change
    /// together. Returns the rows deleted.
    pub async fn release_tenants(
        &self,
        key: u16,
        target: u32,
        tenants: &[String],
        now: i64,
    ) -> Result<u64> {
        let mut tx = self.write().await?;
        let mut deleted = 0;
        if !tenants.is_empty() {
            for def in TABLES.iter().rev() {
                let mut qb = Sql::new(&tx);
                qb.push(format!("DELETE FROM {} WHERE ", def.name));
                def.push_owned_by(&mut qb, tenants);
                let (sql, args) = qb.build();
                deleted += sqlx::query_with(&sql, args)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            }
        }
        upsert_key_move(&mut tx, key, target, KeyMove::Gone, now).await?;
        tx.commit().await?;
        Ok(deleted)
    }

    /// Forgets the move of `key` (rolled back: its tenants are this shard's again).
    pub async fn clear_key_move(&self, key: u16) -> Result<()> {
        let mut tx = self.write().await?;
        sqlx::query("DELETE FROM key_moves WHERE key = $1")
            .bind(i64::from(key))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Every routing key leaving this shard or gone from it, with its target shard, by key.
    pub async fn key_moves(&self) -> Result<Vec<(u16, u32, KeyMove)>> {
        let rows: Vec<(i64, i64, String)> =
            sqlx::query_as("SELECT key, target, state FROM key_moves ORDER BY key")
                .fetch_all(&self.pool)
                .await?;
        rows.into_iter()
            .map(|(key, target, state)| {
                let corrupt = || StoreError::Corrupt(format!("key move {key}: {target} {state}"));
                Ok((
                    u16::try_from(key).map_err(|_| corrupt())?,
                    u32::try_from(target).map_err(|_| corrupt())?,
                    parse_key_move(&state).ok_or_else(corrupt)?,
                ))
            })
            .collect()
    }
}

/// Reads up to `limit` rows of `def` owned by `tenants`, after the primary key `after`.
async fn read_rows(
    conn: &mut AnyConnection,
    def: &TableDef,
    tenants: &[String],
    after: Option<&[Cell]>,
    limit: usize,
) -> Result<Vec<Vec<Cell>>> {
    let mut qb = Sql::new(conn);
    qb.push(format!(
        "SELECT {} FROM {} WHERE ",
        def.column_list(),
        def.name
    ));
    def.push_owned_by(&mut qb, tenants);
    if let Some(after) = after {
        qb.push(format!(" AND ({}) > (", def.key_list()));
        let mut list = qb.separated(", ");
        for (cell, (_, kind)) in after.iter().zip(def.columns) {
            bind_cell(&mut list, cell, *kind);
        }
        qb.push(")");
    }
    qb.push(format!(" ORDER BY {} LIMIT ", def.key_list()));
    qb.push_bind(limit as i64);
    let (sql, args) = qb.build();
    let rows = sqlx::query_with(&sql, args).fetch_all(&mut *conn).await?;
    rows.iter().map(|r| def.decode(r)).collect()
}

async fn upsert_key_move(
    tx: &mut Tx,
    key: u16,
    target: u32,
    state: KeyMove,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO key_moves (key, target, state, updated_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (key) DO UPDATE SET target = excluded.target, state = excluded.state, \
         updated_at = excluded.updated_at",
    )
    .bind(i64::from(key))
    .bind(i64::from(target))
    .bind(key_move_str(state))
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A ticket's JSON with its `shard` set to `shard`; its other fields are kept as they are.
fn with_shard(body: &str, shard: u32) -> Result<String> {
    let mut ticket = ticket_fields(body)?;
    ticket.insert("shard".into(), shard.into());
    serde_json::to_string(&ticket).map_err(|e| StoreError::BadMove(e.to_string()))
}

/// The fields of a ticket's JSON.
fn ticket_fields(body: &str) -> Result<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_str(body) {
        Ok(serde_json::Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(StoreError::BadMove(format!(
            "ticket body is not an object: {body}"
        ))),
        Err(e) => Err(StoreError::BadMove(format!("ticket body: {e}"))),
    }
}
