//! Tenant-wide pause: a paused tenant's jobs do not fire, whatever their own state.

use chronoshard_wire::{from_millis, rpc::TenantView};

use uuid::Uuid;

use super::{JobRow, Result, Store};

impl Store {
    /// Tenants paused now.
    pub async fn paused_tenants(&self) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar("SELECT tenant FROM paused_tenants")
            .fetch_all(&self.pool)
            .await?)
    }

    /// Pauses a tenant and takes back `unfire`, its tickets fired ahead of their time; false when
    /// it was paused already.
    pub async fn pause_tenant(&self, tenant: &str, unfire: &[Uuid], now: i64) -> Result<bool> {
        let mut tx = self.write().await?;
        let n = sqlx::query(
            "INSERT INTO paused_tenants (tenant, paused_at) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(tenant)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        super::tickets::unfire(&mut tx, unfire).await?;
        tx.commit().await?;
        Ok(n == 1)
    }

    /// Resumes a tenant and, in the same transaction, moves its jobs to the next occurrences the
    /// caller computed (`moved`: each job with its new `next_fire_at` and state). False, with
    /// nothing changed, when the tenant was not paused.
    pub async fn resume_tenant(&self, tenant: &str, moved: &[JobRow], now: i64) -> Result<bool> {
        let mut tx = self.write().await?;
        let n = sqlx::query("DELETE FROM paused_tenants WHERE tenant = $1")
            .bind(tenant)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if n == 0 {
            return Ok(false);
        }
        for job in moved {
            sqlx::query(
                "UPDATE jobs SET next_fire_at = $1, state = $2, updated_at = $3 \
                 WHERE id = $4 AND state = 'active'",
            )
            .bind(job.next_fire_at)
            .bind(job.state.as_str())
            .bind(now)
            .bind(job.id.to_string())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    pub async fn tenant(&self, tenant: &str) -> Result<TenantView> {
        let paused_at: Option<i64> =
            sqlx::query_scalar("SELECT paused_at FROM paused_tenants WHERE tenant = $1")
                .bind(tenant)
                .fetch_optional(&self.pool)
                .await?;
        let jobs: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM jobs WHERE tenant = $1 AND state != 'deleted'",
        )
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        Ok(TenantView {
            tenant: tenant.to_string(),
            paused: paused_at.is_some(),
            paused_at: paused_at.map(from_millis),
            jobs: jobs as u64,
            triggered: None,
            paused_shards: None,
            shards: None,
        })
    }

    /// The tenant's jobs that can still fire (active or paused): what `tenant_max_jobs` limits.
    /// Read through the `jobs_tenant` index: it costs the tenant's jobs, which the quota bounds.
    pub async fn live_jobs(&self, tenant: &str) -> Result<u64> {
        let jobs: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM jobs WHERE tenant = $1 AND state IN ('active', 'paused')",
        )
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        Ok(jobs as u64)
    }
}
