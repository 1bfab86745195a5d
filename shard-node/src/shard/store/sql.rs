//! Statements built for many rows: the SQL and its values written by one builder (sqlx's
//! `QueryBuilder`), so that a placeholder and its value cannot disagree by position, for either
//! backend. It owns the placeholder rules and the `select_json_rows` aggregate; it must not know
//! which statements the store builds.
//!
//! `QueryBuilder<Any>` writes every placeholder as an anonymous `?`, since `Any`'s arguments do
//! not know which backend they are for. SQLite takes them as they are; for Postgres they are
//! numbered `$1, $2, …` in order when the statement is built.
//!
//! Why not `$n` on SQLite too: SQLite treats `$n` as a named parameter, and sqlx binds each
//! parameter after asking SQLite for its name, which SQLite finds by a linear scan of the
//! statement's named parameters. Binding n of them is O(n²): a 480-parameter statement scans
//! about 115,000 entries, and `sqlite3_bind_parameter_name` was 4% of `chronoshard dev`'s CPU
//! while firing and applying results (perf, 2026-11-30). Anonymous `?`s have no name to look for.
//! sqlx mis-numbers a statement that mixes the two kinds, so every placeholder of a statement
//! comes from its builder.

use std::ops::{Deref, DerefMut};

use sqlx::{any::AnyArguments, Any, AnyConnection, Execute, QueryBuilder};

use super::is_sqlite;

/// Parameters one multi-row statement binds at most: a few hundred keep a statement's binding
/// and its rows well below a round trip, and both backends far from their limits.
const STATEMENT_PARAMS: usize = 480;

/// Rows of `cols` columns per multi-row statement (see `STATEMENT_PARAMS`).
pub(super) const fn rows_per_statement(cols: usize) -> usize {
    let rows = STATEMENT_PARAMS / cols;
    if rows == 0 {
        1
    } else {
        rows
    }
}

/// One statement (or, on SQLite, several separated by `;`) with its values, for one backend.
/// Push SQL and bind values through the `QueryBuilder` it derefs to.
pub(super) struct Sql<'a> {
    qb: QueryBuilder<'a, Any>,
    sqlite: bool,
}

impl<'a> Sql<'a> {
    /// A statement for `conn`'s backend.
    pub(super) fn new(conn: &AnyConnection) -> Self {
        Self::for_backend(is_sqlite(conn))
    }

    /// A statement for SQLite, built before a connection is at hand (SQLite's one-trip
    /// transactions).
    pub(super) fn sqlite() -> Self {
        Self::for_backend(true)
    }

    fn for_backend(sqlite: bool) -> Self {
        Sql {
            qb: QueryBuilder::new(String::new()),
            sqlite,
        }
    }

    /// Starts a statement: after whatever the builder holds, a `;` first (SQLite runs the
    /// statements of one string in order).
    pub(super) fn statement(&mut self) -> &mut Self {
        let sql = self.qb.sql().trim_end();
        if !sql.is_empty() && !sql.ends_with(';') {
            self.qb.push("; ");
        }
        self
    }

    /// Whether nothing was pushed.
    pub(super) fn is_empty(&self) -> bool {
        self.qb.sql().is_empty()
    }

    /// Starts a statement `SELECT` of `cols` as the rows of a query aggregated into one JSON
    /// value (an array of arrays), which a caller reads with `json_rows`; push its `FROM` next.
    /// One value in one row costs one step of the driver, where n rows cost n.
    pub(super) fn select_json_rows(&mut self, cols: &str) -> &mut Self {
        let aggregate = super::json_select(self.sqlite, cols);
        self.statement().push("SELECT ").push(aggregate);
        self
    }

    /// `?, ?, …`: one placeholder per value, each bound.
    pub(super) fn list<T>(&mut self, values: impl IntoIterator<Item = T>) -> &mut Self
    where
        T: 'a + sqlx::Encode<'a, Any> + sqlx::Type<Any>,
    {
        let mut list = self.qb.separated(", ");
        for v in values {
            list.push_bind(v);
        }
        self
    }

    /// The SQL, with Postgres's placeholders numbered, and the values bound in order. The
    /// builder is spent.
    pub(super) fn build(&mut self) -> (String, AnyArguments<'_>) {
        let sql = if self.sqlite {
            self.qb.sql().to_owned()
        } else {
            numbered(self.qb.sql())
        };
        let mut query = self.qb.build();
        let args = query
            .take_arguments()
            .expect("QueryBuilder encodes its values as they are pushed")
            .unwrap_or_default();
        (sql, args)
    }
}

impl<'a> Deref for Sql<'a> {
    type Target = QueryBuilder<'a, Any>;
    fn deref(&self) -> &Self::Target {
        &self.qb
    }
}

impl DerefMut for Sql<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.qb
    }
}

/// Where a caller's statements go: each into a builder of its own (`Each`: run one by one,
/// e.g. in a transaction) or one after the other into one builder (`Sql`: one SQLite trip). The
/// same pushing code serves both.
pub(super) trait Statements<'a> {
    /// A builder for the next statement.
    fn statement(&mut self) -> &mut Sql<'a>;
}

impl<'a> Statements<'a> for Sql<'a> {
    fn statement(&mut self) -> &mut Sql<'a> {
        Sql::statement(self)
    }
}

/// Statements each in a builder of its own, for one backend.
pub(super) struct Each<'a> {
    sqlite: bool,
    all: Vec<Sql<'a>>,
}

impl<'a> Each<'a> {
    pub(super) fn new(conn: &AnyConnection) -> Self {
        Each {
            sqlite: is_sqlite(conn),
            all: Vec::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.all.len()
    }

    pub(super) fn into_statements(self) -> Vec<Sql<'a>> {
        self.all
    }
}

impl<'a> Statements<'a> for Each<'a> {
    fn statement(&mut self) -> &mut Sql<'a> {
        self.all.push(Sql::for_backend(self.sqlite));
        self.all.last_mut().expect("just pushed")
    }
}

/// `sql` with its `?` placeholders written `$1`, `$2`, … in order. The store's statements have
/// no `?` inside a literal.
pub(super) fn numbered(sql: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(sql.len() + sql.len() / 4);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            let _ = write!(out, "${n}");
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Placeholders come out in binding order, one per value: anonymous on SQLite, numbered on
    /// Postgres, across the values, lists and statements of one builder.
    #[test]
    fn placeholders_and_values_come_from_one_builder() {
        for (sqlite, expected) in [
            (
                true,
                "UPDATE t SET x = ? FROM (VALUES (?, ?), (?, ?)) AS v; SELECT 1 WHERE a IN (?, ?, ?)",
            ),
            (
                false,
                "UPDATE t SET x = $1 FROM (VALUES ($2, $3), ($4, $5)) AS v; SELECT 1 WHERE a IN ($6, $7, $8)",
            ),
        ] {
            let mut sql = Sql::for_backend(sqlite);
            assert!(sql.is_empty());
            sql.statement()
                .push("UPDATE t SET x = ")
                .push_bind(7i64)
                .push(" FROM (");
            sql.push_values([(1i64, "a"), (2, "b")], |mut row, (n, s)| {
                row.push_bind(n).push_bind(s);
            });
            sql.push(") AS v");
            sql.statement().push("SELECT 1 WHERE a IN (");
            sql.list(["x", "y", "z"]).push(")");
            let (text, args) = sql.build();
            assert_eq!(text, expected);
            assert_eq!(sqlx::Arguments::len(&args), 8);
        }
    }

    #[test]
    fn numbering_leaves_a_statement_without_placeholders_alone() {
        assert_eq!(numbered("SELECT 1"), "SELECT 1");
        assert_eq!(numbered("SELECT ?, ?"), "SELECT $1, $2");
    }

    #[test]
    fn a_statement_holds_at_least_one_row() {
        assert_eq!(rows_per_statement(4), 120);
        assert_eq!(rows_per_statement(13), 36);
        assert_eq!(rows_per_statement(1000), 1);
    }
}
