//! `/v1/tokens`: API tokens for one tenant or an admin. Admin only (the authentication layer
//! keeps tenant tokens out). The secret exists in the create answer alone; the cluster state
//! keeps its hash, and nothing here logs either.

use axum::{extract::State, http::StatusCode, response::IntoResponse, Json};
use chrono::Utc;
use chronoshard_wire::{
    job::check_token,
    token::{CreatedToken, TokenRecord, TokenSpec, TokenView},
};
use serde::{Deserialize, Serialize};
use tracing::info;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::{
    auth,
    body::{JsonBody, Params, PathId},
    cluster::unavailable,
    error::ApiError,
    AppState,
};

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    /// Oldest first.
    pub tokens: Vec<TokenView>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TokensQuery {
    /// Only the tokens of this tenant.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub tenant: Option<String>,
}

/// Create a token. The answer carries the token itself, once; keep it.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = TokenSpec,
    responses((status = 201, description = "Created; `token` is shown this once", body = CreatedToken)),
    security(("bearer" = [])))]
pub async fn create_token(
    State(state): State<AppState>,
    JsonBody(spec): JsonBody<TokenSpec>,
) -> Result<impl IntoResponse, ApiError> {
    let now = Utc::now();
    spec.validate(now)
        .map_err(|e| ApiError::field(e.field, e.message))?;
    let id = Uuid::new_v4();
    let (token, secret_sha256) = auth::mint(id);
    let record = TokenRecord {
        id,
        tenant: spec.tenant,
        name: spec.name,
        created_at: now,
        expires_at: spec.expires_at,
        secret_sha256,
    };
    state
        .cluster
        .create_token(&record)
        .await
        .map_err(unavailable)?;
    state.tokens.insert(record.clone());
    info!(token_id = %id, tenant = record.tenant.as_deref().unwrap_or("(admin)"), "API token created");
    let view = TokenView::from(&record);
    Ok((
        StatusCode::CREATED,
        [(axum::http::header::LOCATION, format!("/v1/tokens/{id}"))],
        Json(CreatedToken { token, view }),
    ))
}

/// The tokens (never their secrets), oldest first.
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", params(TokensQuery),
    responses((status = 200, body = TokenList)),
    security(("bearer" = [])))]
pub async fn list_tokens(
    State(state): State<AppState>,
    Params(q): Params<TokensQuery>,
) -> Result<Json<TokenList>, ApiError> {
    if let Some(t) = &q.tenant {
        check_token("tenant", t, 64).map_err(|e| ApiError::field(e.field, e.message))?;
    }
    let mut records = state.cluster.tokens().await.map_err(unavailable)?;
    records.retain(|r| q.tenant.is_none() || r.tenant == q.tenant);
    records.sort_by_key(|r| (r.created_at, r.id));
    Ok(Json(TokenList {
        tokens: records.iter().map(TokenView::from).collect(),
    }))
}

/// Revoke a token: it stops working on every replica (at once on this one, within the time a
/// cluster-state change takes to reach the others).
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens", params(("id" = Uuid, Path)),
    responses((status = 204)),
    security(("bearer" = [])))]
pub async fn revoke_token(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<StatusCode, ApiError> {
    let existed = state.cluster.revoke_token(&id).await.map_err(unavailable)?;
    state.tokens.remove(&id);
    if !existed {
        return Err(ApiError::NotFound("token"));
    }
    info!(token_id = %id, "API token revoked");
    Ok(StatusCode::NO_CONTENT)
}
