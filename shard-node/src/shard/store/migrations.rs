//! The shard database's schema migrations, one list per backend, embedded at compile time and run
//! by sqlx's migrator. It builds what `sqlx::migrate!` would (the same versions, descriptions and
//! SHA-384 checksums, so databases migrated by either agree) without sqlx's compile-time macro
//! crates, which cost every build of the workspace more than this list (docs/decisions.md). A new
//! migration is a file under `migrations/<backend>/` and a line here.

use std::{borrow::Cow, sync::LazyLock};

use sqlx::migrate::{Migration, MigrationType, Migrator};

/// (version, description as sqlx derives it from the file name, the file's text).
type File = (i64, &'static str, &'static str);

const SQLITE: &[File] = &[
    (
        1,
        "shard",
        include_str!("../../../../migrations/sqlite/0001_shard.sql"),
    ),
    (
        2,
        "engine",
        include_str!("../../../../migrations/sqlite/0002_engine.sql"),
    ),
    (
        3,
        "resend",
        include_str!("../../../../migrations/sqlite/0003_resend.sql"),
    ),
    (
        4,
        "worker",
        include_str!("../../../../migrations/sqlite/0004_worker.sql"),
    ),
    (
        5,
        "buffered",
        include_str!("../../../../migrations/sqlite/0005_buffered.sql"),
    ),
    (
        6,
        "moves",
        include_str!("../../../../migrations/sqlite/0006_moves.sql"),
    ),
    (
        7,
        "handoffs",
        include_str!("../../../../migrations/sqlite/0007_handoffs.sql"),
    ),
    (
        8,
        "workflows",
        include_str!("../../../../migrations/sqlite/0008_workflows.sql"),
    ),
];

const POSTGRES: &[File] = &[
    (
        1,
        "shard",
        include_str!("../../../../migrations/postgres/0001_shard.sql"),
    ),
    (
        2,
        "resend",
        include_str!("../../../../migrations/postgres/0002_resend.sql"),
    ),
    (
        3,
        "worker",
        include_str!("../../../../migrations/postgres/0003_worker.sql"),
    ),
    (
        4,
        "buffered",
        include_str!("../../../../migrations/postgres/0004_buffered.sql"),
    ),
    (
        5,
        "moves",
        include_str!("../../../../migrations/postgres/0005_moves.sql"),
    ),
    (
        6,
        "handoffs",
        include_str!("../../../../migrations/postgres/0006_handoffs.sql"),
    ),
    (
        7,
        "workflows",
        include_str!("../../../../migrations/postgres/0007_workflows.sql"),
    ),
];

pub(super) static SQLITE_MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| migrator(SQLITE));
pub(super) static POSTGRES_MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| migrator(POSTGRES));

fn migrator(files: &'static [File]) -> Migrator {
    let migrations = files
        .iter()
        .map(|(version, description, sql)| {
            Migration::new(
                *version,
                Cow::Borrowed(*description),
                MigrationType::Simple,
                Cow::Borrowed(*sql),
                sql.starts_with("-- no-transaction"),
            )
        })
        .collect::<Vec<_>>();
    Migrator {
        migrations: Cow::Owned(migrations),
        ..Migrator::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of a backend's folder is listed, in order, under the version its name gives.
    #[test]
    fn every_migration_file_is_listed() {
        for (dir, files) in [("sqlite", SQLITE), ("postgres", POSTGRES)] {
            let path = format!("{}/../migrations/{dir}", env!("CARGO_MANIFEST_DIR"));
            let mut names: Vec<String> = std::fs::read_dir(&path)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".sql"))
                .collect();
            names.sort();
            let listed: Vec<String> = files
                .iter()
                .map(|(v, d, _)| format!("{v:04}_{}.sql", d.replace(' ', "_")))
                .collect();
            assert_eq!(names, listed, "{dir}");
            for ((_, _, sql), name) in files.iter().zip(&names) {
                assert_eq!(
                    *sql,
                    std::fs::read_to_string(format!("{path}/{name}")).unwrap()
                );
            }
        }
    }
}
