//! This shard's side of adding shards: routing keys whose tenants leave it (frozen while their
//! rows are copied, gone once they live on their new shard) and rows arriving for tenants that
//! join it.
//!
//! Every move request is applied by the event loop (`Leaving::apply`), so a freeze is
//! ordered with fires and API writes: nothing of a frozen tenant is fired or written after it.
//! The results consumer applies batches beside the loop; it holds `Leaving::gate` shared while
//! it applies one, and a freeze takes it exclusively, so no result of a frozen tenant is applied
//! after its freeze either. Results for a frozen key wait (redelivered later), results for a gone
//! key are sent on to its new shard. Owns the key set and those rules; how rows are copied is
//! the store's (`store/moves.rs`), the order of the steps the control plane's.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        RwLock,
    },
};

use chronoshard_wire::{
    growth::KeyMove,
    ids,
    rpc::{KeyTarget, RpcError, RpcErrorCode, ShardReply, ShardRequest, TenantJobs},
};
use tracing::info;
use uuid::Uuid;

use super::{agenda::Agenda, fire::Firer, ShardError};

/// The routing keys leaving this shard, as its database records them.
#[derive(Debug, Default)]
pub struct Leaving {
    keys: RwLock<HashMap<u16, (u32, KeyMove)>>,
    /// Whether `keys` holds any: the fire path asks per occurrence, and almost always none do.
    any: AtomicBool,
    /// Held shared by the results consumer while it applies a batch, exclusively by a freeze.
    pub gate: tokio::sync::RwLock<()>,
}

impl Leaving {
    pub fn new(moves: Vec<(u16, u32, KeyMove)>) -> Leaving {
        let l = Leaving::default();
        l.set(moves);
        l
    }

    fn set(&self, moves: impl IntoIterator<Item = (u16, u32, KeyMove)>) {
        let mut keys = self.keys.write().expect("leaving keys");
        for (key, target, state) in moves {
            keys.insert(key, (target, state));
        }
        self.any.store(!keys.is_empty(), Ordering::Release);
    }

    /// Whether no key leaves this shard.
    pub fn is_empty(&self) -> bool {
        !self.any.load(Ordering::Acquire)
    }

    /// Where a key went and whether it is gone or still frozen; None for a key that stays.
    pub fn get(&self, key: u16) -> Option<(u32, KeyMove)> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.keys.read().expect("leaving keys").get(&key).copied()
    }

    /// Whether the job or ticket `id` belongs to a tenant that is leaving or gone.
    pub fn holds_back(&self, id: Uuid) -> bool {
        self.get(ids::routing_key(id)).is_some()
    }

    /// The refusal of a request about a tenant that is leaving (any write) or gone (anything),
    /// or None when the request may be served here.
    pub fn refusal(&self, req: &ShardRequest) -> Option<ShardReply> {
        self.refuse(req.routing_key(ids::tenant_key)?, req.is_write())
    }

    /// The refusal of a create of job `id` (see `refusal`).
    pub fn refuse_create(&self, id: Uuid) -> Option<ShardReply> {
        self.refuse(ids::routing_key(id), true)
    }

    fn refuse(&self, key: u16, write: bool) -> Option<ShardReply> {
        let (target, state) = self.get(key)?;
        if state == KeyMove::Frozen && !write {
            return None;
        }
        Some(ShardReply::Error(RpcError::new(
            RpcErrorCode::Moving,
            match state {
                KeyMove::Frozen => format!("the tenant is moving to shard {target}"),
                KeyMove::Gone => format!("the tenant moved to shard {target}"),
            },
        )))
    }
}

/// Whether a request is a step of a tenant move (applied by `Leaving::apply`).
pub(super) fn is_move(req: &ShardRequest) -> bool {
    matches!(
        req,
        ShardRequest::FreezeKeys { .. }
            | ShardRequest::StageImport { .. }
            | ShardRequest::CommitImport { .. }
            | ShardRequest::ReleaseKeys { .. }
    )
}

/// The tenants with rows here, as the control plane asks for them.
pub(super) fn tenant_list(rows: Vec<(String, u64)>) -> ShardReply {
    ShardReply::Tenants {
        tenants: rows
            .into_iter()
            .map(|(tenant, jobs)| TenantJobs { tenant, jobs })
            .collect(),
    }
}

impl Leaving {
    /// Applies a step of a tenant move, in the event loop: `fire` for the store, the agenda for
    /// the wheel entries of the tenants that leave or arrive.
    pub(super) async fn apply(
        &self,
        fire: &Firer,
        agenda: &mut Agenda,
        req: ShardRequest,
    ) -> Result<ShardReply, ShardError> {
        let now = fire.ctx.clock.now_ms();
        let store = &fire.store;
        let rows = match req {
            ShardRequest::FreezeKeys { moves } => {
                let _results_held = self.gate.write().await;
                let fresh: Vec<KeyTarget> = moves
                    .into_iter()
                    .filter(|m| self.get(m.key).is_none_or(|(_, s)| s == KeyMove::Frozen))
                    .collect();
                store.set_key_moves(&fresh, KeyMove::Frozen, now).await?;
                self.set(fresh.iter().map(|m| (m.key, m.target, KeyMove::Frozen)));
                let frozen = agenda.untrack_where(|job| self.holds_back(job));
                if !fresh.is_empty() {
                    info!(
                        keys = fresh.len(),
                        jobs_held = frozen,
                        "tenants frozen to move"
                    );
                }
                0
            }
            ShardRequest::StageImport { key, seq, pages } => {
                let rows = pages.iter().map(|p| p.rows.len() as u64).sum();
                store.stage_import(key, seq, &pages, now).await?;
                rows
            }
            ShardRequest::CommitImport { key } => {
                let imported = store.commit_import(key, now).await?;
                if !imported.jobs.is_empty() {
                    fire.recover_matching(agenda, now, &|k| k == key).await?;
                    info!(
                        key,
                        jobs = imported.jobs.len(),
                        rows = imported.rows,
                        "tenants moved in"
                    );
                }
                imported.rows
            }
            ShardRequest::ReleaseKeys { moves, tenants } => {
                let mut rows = 0;
                for m in &moves {
                    let mine: Vec<String> = (tenants.iter())
                        .filter(|t| ids::tenant_key(t) == m.key)
                        .cloned()
                        .collect();
                    if !mine.is_empty() {
                        rows += (store.release_tenants(m.key, m.target, &mine, now)).await?;
                    }
                }
                let rest: Vec<KeyTarget> = (moves.iter())
                    .filter(|m| self.get(m.key) != Some((m.target, KeyMove::Gone)))
                    .copied()
                    .collect();
                store.set_key_moves(&rest, KeyMove::Gone, now).await?;
                self.set(moves.iter().map(|m| (m.key, m.target, KeyMove::Gone)));
                agenda.take_fired_ahead(|job, _| self.holds_back(job));
                rows
            }
            other => {
                return Ok(ShardReply::Error(RpcError::new(
                    RpcErrorCode::Internal,
                    format!("not a move request: {other:?}"),
                )))
            }
        };
        Ok(ShardReply::MoveStep { rows })
    }
}
