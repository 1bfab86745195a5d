//! An SQLite shard's WAL checkpoints, run beside its writer on a connection of their own. A WAL
//! nothing wrote to since the last complete checkpoint is left alone without asking SQLite: an
//! idle shard then costs no trip to a connection's thread, and an idle node no CPU, for its
//! checkpoints. The file's size and modification time tell, read with one `stat`: every commit
//! appends frames, and a WAL restarted from its beginning is rewritten, so either changes.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::SystemTime,
};

use sqlx::{AnyPool, Row};

use super::Result;

/// What a checkpoint did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkpoint {
    /// Nothing was written since the last complete checkpoint: SQLite was not asked.
    Unchanged,
    /// The WAL held `wal` frames, of which `copied` are now in the database file.
    Ran { wal: i64, copied: i64 },
}

/// The size and modification time of a WAL file: it changes with every commit.
pub type WalStamp = (u64, SystemTime);

#[derive(Clone, Debug)]
pub(super) struct Checkpointer {
    pool: AnyPool,
    wal: PathBuf,
    /// The WAL's stamp taken before the last checkpoint that copied every frame.
    clean: Arc<Mutex<Option<WalStamp>>>,
}

impl Checkpointer {
    /// Checkpoints on `pool` for the database file `db`.
    pub fn new(pool: AnyPool, db: &Path) -> Checkpointer {
        let mut wal = db.as_os_str().to_owned();
        wal.push("-wal");
        Checkpointer {
            pool,
            wal: wal.into(),
            clean: Arc::default(),
        }
    }

    /// The WAL's stamp now (None while there is no WAL file).
    pub fn stamp(&self) -> Option<WalStamp> {
        stamp(&self.wal)
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// A passive checkpoint, unless the WAL is as it was before the last complete one. The stamp
    /// is taken before SQLite is asked, so a commit that lands during the checkpoint changes it
    /// and is checkpointed next time.
    pub async fn run(&self) -> Result<Checkpoint> {
        let before = self.stamp();
        if before.is_some() && *self.lock() == before {
            return Ok(Checkpoint::Unchanged);
        }
        let row = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&self.pool)
            .await?;
        let (wal, copied): (i64, i64) = (row.try_get(1)?, row.try_get(2)?);
        // A reader that kept frames from being copied: ask again next time.
        *self.lock() = if copied == wal { before } else { None };
        Ok(Checkpoint::Ran { wal, copied })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<WalStamp>> {
        self.clean.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn stamp(path: &Path) -> Option<WalStamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}
