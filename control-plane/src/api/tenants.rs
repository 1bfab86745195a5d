//! `/v1/tenants/{tenant}`: a tenant's state, and pause, resume and trigger of all its jobs at once.
//! A tenant lives in one shard (tenant sharding), so each request goes to that shard alone.

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
    match state
        .router
        .call(crate::routing::Route::Tenant(tenant), &req)
        .await?
    {
        ShardReply::Tenant { tenant } => Ok(tenant),
        other => Err(ApiError::Internal(format!(
            "unexpected shard reply {other:?}"
        ))),
    }
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
