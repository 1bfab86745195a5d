//! Adding shards to a running cluster: the progress record the cluster config carries while
//! tenants move to the shards that were added, and the rows a move carries from one shard
//! database to another. Data only: where tenants go is the control plane's placement, how rows
//! are read and written the shard store's.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Shards being added: present in the cluster config from `POST /v1/shards` until every tenant
/// whose place changed lives on its new shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Growth {
    /// The shard count before: a tenant that has not moved yet is still placed by it.
    pub from: u32,
    pub started_at: DateTime<Utc>,
    /// Old shards whose leaving tenants have all moved (every routing key of theirs that
    /// changed place, including keys no tenant uses yet).
    #[serde(default)]
    pub sealed: Vec<u32>,
    /// Routing keys moved one by one (with their tenants) from shards not sealed yet.
    #[serde(default)]
    pub moved: Vec<u16>,
    /// The move under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving: Option<TenantMove>,
    /// Tenants moved so far.
    #[serde(default)]
    pub tenants_moved: u64,
    /// The latest finished moves, oldest first (at most `RECENT_MOVES`).
    #[serde(default)]
    pub recent: Vec<TenantMove>,
}

/// How many finished moves `Growth::recent` keeps.
pub const RECENT_MOVES: usize = 20;

/// The move of the tenants that share one routing key from their old shard to their new one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantMove {
    /// The routing key the tenants share (almost always one tenant per key).
    pub key: u16,
    pub tenants: Vec<String>,
    pub source: u32,
    pub target: u32,
    pub phase: MovePhase,
    pub started_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// Rows copied (jobs, runs, tickets, attempts, pause).
    #[serde(default)]
    pub rows: u64,
}

/// Where a tenant move is. From `frozen` until `done` the tenants' jobs fire on neither shard
/// (an occurrence due meanwhile fires late on the new one) and their writes wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MovePhase {
    /// The old shard stopped firing the tenants and taking their writes; rows are being copied.
    Frozen,
    /// The new shard holds the rows and fires the tenants; the API is switching over.
    Committed,
    /// The API sends the tenants' calls to the new shard; the old one deleted its copy.
    Done,
}

/// A cell of a copied row: every shard column is a 64-bit integer or text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Cell {
    Int(i64),
    Text(String),
    Null,
}

/// The shard tables a move copies, in the order their rows are copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MovedTable {
    #[default]
    PausedTenants,
    Jobs,
    Runs,
    Tickets,
    Attempts,
}

/// Rows of one table, each in the table's fixed column order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MovePage {
    pub table: MovedTable,
    pub rows: Vec<Vec<Cell>>,
}

/// Where an export of a tenant's rows continues; the default starts at the beginning.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExportCursor {
    /// The table being exported.
    pub table: MovedTable,
    /// The primary key of the last row of `table` exported; None before its first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Vec<Cell>>,
}

/// A routing key leaving a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyMove {
    /// Its rows are being copied to the target: its tenants must not change here.
    Frozen,
    /// Its rows live on the target and were deleted here.
    Gone,
}
