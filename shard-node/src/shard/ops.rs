//! Writes beyond a single job, applied in the shard loop: tenant-wide pause, resume and trigger,
//! and the replay of a dead letter.

use chronoshard_wire::rpc::{RpcError, RpcErrorCode, ShardReply};
use tracing::info;
use uuid::Uuid;

use super::{
    machine,
    rpc::{conflict, not_found},
    store::{Fired, Replay},
    Shard, ShardError,
};

impl Shard {
    pub(super) async fn pause_tenant(
        &mut self,
        tenant: &str,
        now: i64,
    ) -> Result<ShardReply, ShardError> {
        let unfire = self.withdraw_early(|_, s| s.tenant == tenant);
        match self.store.pause_tenant(tenant, &unfire, now).await {
            Ok(true) => info!(tenant, "tenant paused"),
            Ok(false) => {}
            Err(e) => {
                self.dispatcher.restore(&unfire);
                return Err(e.into());
            }
        }
        // The tenant's wheel entries stay; they fire nothing while it is paused (`fire_job`).
        self.paused.insert(tenant.to_string());
        self.tenant_reply(tenant, None).await
    }

    /// Resumes a tenant: each active job whose next occurrence passed during the pause continues
    /// from its first occurrence after now (no catch-up for the paused time, as a resumed job).
    /// One transaction, so a crash cannot leave jobs to catch up the whole pause.
    pub(super) async fn resume_tenant(
        &mut self,
        tenant: &str,
        now: i64,
    ) -> Result<ShardReply, ShardError> {
        let mut jobs = self.store.active_jobs_of(tenant).await?;
        let mut moved = Vec::new();
        for job in &mut jobs {
            if let Some(resumed) = machine::tenant_resumed(job, now) {
                *job = resumed;
                moved.push(job.clone());
            }
        }
        if self.store.resume_tenant(tenant, &moved, now).await? {
            info!(tenant, moved = moved.len(), "tenant resumed");
            self.paused.remove(tenant);
            for job in &jobs {
                self.follow_wheel(job, machine::wheel_of(job));
            }
        }
        self.tenant_reply(tenant, None).await
    }

    /// Fires every active job of the tenant once, now, each under its overlap policy.
    pub(super) async fn trigger_tenant(
        &mut self,
        tenant: &str,
        now: i64,
    ) -> Result<ShardReply, ShardError> {
        if self.paused.contains(tenant) {
            return Ok(conflict("the tenant is paused: resume it first"));
        }
        let mut fired = 0;
        for job in self.store.active_jobs_of(tenant).await? {
            if let (Fired::Ticketed, _) = self.fire_now(&job, now).await? {
                fired += 1;
            }
        }
        self.tenant_reply(tenant, Some(fired)).await
    }

    async fn tenant_reply(
        &self,
        tenant: &str,
        triggered: Option<u64>,
    ) -> Result<ShardReply, ShardError> {
        let mut view = self.store.tenant(tenant).await?;
        view.triggered = triggered;
        Ok(ShardReply::Tenant { tenant: view })
    }

    /// Publishes a dead letter again as its next attempt.
    pub(super) async fn replay(
        &mut self,
        ticket: Uuid,
        now: i64,
    ) -> Result<ShardReply, ShardError> {
        match self.store.replay(ticket, now).await? {
            Replay::NotFound => Ok(not_found("ticket")),
            Replay::NotDead => Ok(ShardReply::Error(RpcError::new(
                RpcErrorCode::Conflict,
                "the ticket is not a dead letter",
            ))),
            Replay::Replayed(t) => {
                info!(ticket_id = %ticket, attempt = t.attempt, "dead letter replayed");
                self.dispatcher.publish(vec![*t]);
                match self.store.ticket(ticket).await? {
                    Some(view) => Ok(ShardReply::Ticket { ticket: view }),
                    None => Ok(not_found("ticket")),
                }
            }
        }
    }
}
