//! `/v1/tenants/{tenant}`: a tenant's state, and pause, resume and trigger of all its jobs at once.
//! In a `tenant` cluster a tenant lives in one shard, so each request goes to that shard alone; in
//! a `time_window` cluster its jobs spread over every shard, so each request goes to all of them
//! and their answers are added up (`merged`).

use axum::{extract::State, http::StatusCode, response::IntoResponse, Json};
use chronoshard_wire::rpc::{ShardReply, ShardRequest, TenantView};

use super::{auth::Caller, body::PathTenant, error::ApiError, AppState};

/// Sends a tenant request to the tenant's shard; another tenant's name answers 404 to a tenant
/// token.
async fn tenant_call(
    state: &AppState,
    caller: &Caller,
    tenant: &str,
    req: ShardRequest,
) -> Result<TenantView, ApiError> {
    caller.sees(tenant, "tenant")?;
    let spread = state.router.spreads_tenants();
    let replies = match spread {
        true => state.router.call_all(&req).await,
        false => vec![
            (state.router)
                .call(crate::routing::Route::Tenant(tenant), &req)
                .await,
        ],
    };
    let mut views = Vec::with_capacity(replies.len());
    // A shard that failed fails the request; those that answered applied it (a pause or resume
    // sent again completes it).
    for reply in replies {
        match reply? {
            ShardReply::Tenant { tenant } => views.push(tenant),
            other => {
                return Err(ApiError::Internal(format!(
                    "unexpected shard reply {other:?}"
                )))
            }
        }
    }
    let view = match spread {
        true => merged(views),
        false => views.pop(),
    };
    view.ok_or_else(|| ApiError::Internal("no shard answered".into()))
}

/// One view of a tenant from its views on several shards: paused if it is paused on every one
/// (since the earliest pause), on how many of them it is, its jobs and triggered occurrences
/// added up.
fn merged(views: Vec<TenantView>) -> Option<TenantView> {
    let shards = views.len() as u32;
    let paused_shards = views.iter().filter(|v| v.paused).count() as u32;
    let mut views = views.into_iter();
    let mut all = views.next()?;
    (all.paused_shards, all.shards) = (Some(paused_shards), Some(shards));
    for v in views {
        all.paused &= v.paused;
        all.paused_at = match (all.paused_at, v.paused_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        all.jobs += v.jobs;
        all.triggered = match (all.triggered, v.triggered) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
    }
    if !all.paused {
        all.paused_at = None;
    }
    Some(all)
}

/// A tenant: whether it is paused and how many jobs it has.
#[utoipa::path(get, path = "/v1/tenants/{tenant}", tag = "tenants", params(("tenant" = String, Path, pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses((status = 200, body = TenantView)),
    security(("bearer" = [])))]
pub async fn get_tenant(
    State(state): State<AppState>,
    caller: Caller,
    PathTenant(tenant): PathTenant,
) -> Result<Json<TenantView>, ApiError> {
    let req = ShardRequest::GetTenant {
        tenant: tenant.clone(),
    };
    Ok(Json(tenant_call(&state, &caller, &tenant, req).await?))
}

/// Pause a tenant: none of its jobs fires until it is resumed; each job keeps its own state.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/pause", tag = "tenants", params(("tenant" = String, Path, pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses((status = 200, body = TenantView)),
    security(("bearer" = [])))]
pub async fn pause_tenant(
    State(state): State<AppState>,
    caller: Caller,
    PathTenant(tenant): PathTenant,
) -> Result<Json<TenantView>, ApiError> {
    let req = ShardRequest::PauseTenant {
        tenant: tenant.clone(),
    };
    Ok(Json(tenant_call(&state, &caller, &tenant, req).await?))
}

/// Resume a tenant: each of its active jobs continues from its first occurrence after now
/// (no catch-up for the paused time). Jobs paused on their own stay paused.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/resume", tag = "tenants", params(("tenant" = String, Path, pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses((status = 200, body = TenantView)),
    security(("bearer" = [])))]
pub async fn resume_tenant(
    State(state): State<AppState>,
    caller: Caller,
    PathTenant(tenant): PathTenant,
) -> Result<Json<TenantView>, ApiError> {
    let req = ShardRequest::ResumeTenant {
        tenant: tenant.clone(),
    };
    Ok(Json(tenant_call(&state, &caller, &tenant, req).await?))
}

/// Fire every active job of the tenant now, each under its overlap policy; `triggered` counts
/// the occurrences that fired.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/trigger", tag = "tenants", params(("tenant" = String, Path, pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses((status = 202, body = TenantView)),
    security(("bearer" = [])))]
pub async fn trigger_tenant(
    State(state): State<AppState>,
    caller: Caller,
    PathTenant(tenant): PathTenant,
) -> Result<impl IntoResponse, ApiError> {
    let req = ShardRequest::TriggerTenant {
        tenant: tenant.clone(),
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(tenant_call(&state, &caller, &tenant, req).await?),
    ))
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};

    use super::*;

    fn view(paused_at: Option<i64>, jobs: u64, triggered: Option<u64>) -> TenantView {
        TenantView {
            tenant: "acme".into(),
            paused: paused_at.is_some(),
            paused_at: paused_at.map(|s| Utc.timestamp_opt(s, 0).unwrap()),
            jobs,
            triggered,
            paused_shards: None,
            shards: None,
        }
    }

    /// `view` as merged from `shards` shards, `paused` of them paused.
    fn of(view: TenantView, paused: u32, shards: u32) -> Option<TenantView> {
        Some(TenantView {
            paused_shards: Some(paused),
            shards: Some(shards),
            ..view
        })
    }

    #[test]
    fn a_tenant_spread_over_shards_is_the_sum_of_its_shards() {
        assert_eq!(merged(Vec::new()), None);
        let one = view(Some(5), 3, None);
        assert_eq!(merged(vec![one.clone()]), of(one, 1, 1));
        let paused = merged(vec![view(Some(9), 3, None), view(Some(5), 0, None)]);
        assert_eq!(
            paused,
            of(view(Some(5), 3, None), 2, 2),
            "since the earliest pause"
        );
        // Paused on one shard only (a pause that failed elsewhere): not paused, and says so.
        let partly = merged(vec![view(Some(9), 2, Some(2)), view(None, 4, Some(1))]);
        assert_eq!(partly, of(view(None, 6, Some(3)), 1, 2));
    }
}
