//! Who is calling: the bearer token of every `/v1` request becomes a `Caller`, the admin or one
//! tenant, or the request is refused. Owns the replica's copy of the token records (followed from
//! the cluster state) and the rules of what a tenant token reaches: the paths it may use here,
//! and the tenant checks the handlers apply through `Caller`. It must never log, echo or keep a
//! presented token or a secret.
//!
//! Tokens look like `cst_<id>_<secret>`: the id finds the record, whose SHA-256 of the secret is
//! compared in constant time. The configured admin token is compared as it is.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
    time::Duration,
};

use async_nats::jetstream::kv;
use axum::{
    extract::{FromRequestParts, Request, State},
    http::{header, request::Parts},
    middleware::Next,
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use chronoshard_cluster::Cluster;
use chronoshard_wire::token::TokenRecord;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tracing::warn;
use uuid::Uuid;

use super::{error::ApiError, AppState};

/// The caller of a `/v1` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    Admin,
    Tenant(Arc<str>),
}

/// The `/v1` paths a tenant token may use: its jobs, workflows, runs and tickets, its dead
/// letters, its tenant, schedule previews. Everything else (cluster, nodes, shards, workers, settings,
/// plugins, tokens, and any path added later) is the admin's.
const TENANT_PATHS: &[&str] = &[
    "/v1/jobs",
    "/v1/workflows",
    "/v1/workflow-runs/",
    "/v1/tickets/",
    "/v1/dlq",
    "/v1/tenants/",
    "/v1/schedule/",
];

/// Whether a tenant token may use `path` (a request's, or a route's template).
pub fn tenant_may_use(path: &str) -> bool {
    TENANT_PATHS.iter().any(|p| path.starts_with(p))
}

impl Caller {
    fn may_use(&self, path: &str) -> bool {
        match self {
            Caller::Admin => true,
            Caller::Tenant(_) => tenant_may_use(path),
        }
    }

    /// The tenant a tenant token is for; None for the admin.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Caller::Admin => None,
            Caller::Tenant(t) => Some(t),
        }
    }

    /// Whether the caller may see what belongs to `tenant`. What it may not see it is told does
    /// not exist (404, never 403), so ids and tenant names of others cannot be probed.
    pub fn sees(&self, tenant: &str, what: &'static str) -> Result<(), ApiError> {
        match self.tenant() {
            Some(own) if own != tenant => Err(ApiError::NotFound(what)),
            _ => Ok(()),
        }
    }

    /// The tenant a listing is limited to: for a tenant token its own (asking for another is a
    /// 404), for the admin what was asked.
    pub fn scope<'a>(&'a self, asked: Option<&'a str>) -> Result<Option<&'a str>, ApiError> {
        match (self.tenant(), asked) {
            (None, asked) => Ok(asked),
            (Some(own), None) => Ok(Some(own)),
            (Some(own), Some(asked)) if asked == own => Ok(Some(own)),
            (Some(_), Some(_)) => Err(ApiError::NotFound("tenant")),
        }
    }

    /// Whether the caller may create a job of `tenant`: a tenant token only in its own.
    pub fn may_create_in(&self, tenant: &str) -> Result<(), ApiError> {
        match self.tenant() {
            Some(own) if own != tenant => Err(ApiError::Forbidden(format!(
                "this token creates jobs of tenant {own:?} only"
            ))),
            _ => Ok(()),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or(ApiError::Unauthorized)
    }
}

/// This replica's copy of the token records, kept by a watch on the cluster state. A token
/// created or revoked through this replica counts here at once; on the others when the watch
/// delivers the change (milliseconds).
#[derive(Clone, Debug, Default)]
pub struct Tokens(Arc<RwLock<HashMap<Uuid, TokenRecord>>>);

impl Tokens {
    /// Follows the records in the cluster state until `stop`.
    pub fn follow(cluster: Cluster, stop: CancellationToken) -> Tokens {
        let tokens = Tokens::default();
        let kept = tokens.clone();
        tokio::spawn(async move {
            loop {
                let watch = tokio::select! {
                    _ = stop.cancelled() => return,
                    w = cluster.watch_tokens() => w,
                };
                match watch {
                    Ok(w) => {
                        if kept.apply(w, &stop).await {
                            return;
                        }
                    }
                    Err(e) => warn!(error = %e, "cannot watch the API tokens; retrying"),
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        });
        tokens
    }

    /// Applies the watch's entries until it ends (false) or `stop` (true).
    async fn apply(&self, mut w: kv::Watch, stop: &CancellationToken) -> bool {
        loop {
            let entry = tokio::select! {
                _ = stop.cancelled() => return true,
                e = w.next() => e,
            };
            match entry {
                Some(Ok(e)) => {
                    let id = e.key.strip_prefix("token.").and_then(|s| s.parse().ok());
                    match (e.operation, id) {
                        (kv::Operation::Put, _) => match serde_json::from_slice(&e.value) {
                            Ok(record) => self.insert(record),
                            Err(err) => {
                                warn!(key = %e.key, error = %err, "unreadable token record ignored")
                            }
                        },
                        (_, Some(id)) => self.remove(&id),
                        (_, None) => {}
                    }
                }
                Some(Err(e)) => {
                    warn!(error = %e, "token watch failed; watching again");
                    return false;
                }
                None => return false,
            }
        }
    }

    pub fn insert(&self, record: TokenRecord) {
        self.0
            .write()
            .expect("tokens lock")
            .insert(record.id, record);
    }

    pub fn remove(&self, id: &Uuid) {
        self.0.write().expect("tokens lock").remove(id);
    }

    /// The caller a presented `cst_` token stands for at `now`, if it is a live token's.
    fn caller(&self, presented: &str, now: DateTime<Utc>) -> Option<Caller> {
        let (id, secret) = split(presented)?;
        let tokens = self.0.read().expect("tokens lock");
        let record = tokens.get(&id)?;
        let hash = hash_secret(secret);
        if !constant_time_eq(hash.as_bytes(), record.secret_sha256.as_bytes()) {
            return None;
        }
        if record.expires_at.is_some_and(|at| at <= now) {
            return None;
        }
        Some(match &record.tenant {
            Some(t) => Caller::Tenant(Arc::from(t.as_str())),
            None => Caller::Admin,
        })
    }
}

const PREFIX: &str = "cst_";

/// A new token for record `id`: the string to hand out once, and the hash to keep.
pub fn mint(id: Uuid) -> (String, String) {
    // Two version-4 UUIDs: 244 bits from the operating system's random source.
    let secret = format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple());
    let hash = hash_secret(&secret);
    (format!("{PREFIX}{}_{secret}", id.simple()), hash)
}

fn split(presented: &str) -> Option<(Uuid, &str)> {
    let (id, secret) = presented.strip_prefix(PREFIX)?.split_once('_')?;
    Some((Uuid::try_parse(id).ok()?, secret))
}

fn hash_secret(secret: &str) -> String {
    format!("{:x}", Sha256::digest(secret.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `/v1` needs a token: the configured admin token or a live one from `/v1/tokens`; a tenant
/// token only on the tenant paths. Operational endpoints and the docs need none.
pub(super) async fn authenticate(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    if !path.starts_with("/v1/") {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let caller = presented.and_then(|t| {
        if constant_time_eq(t.as_bytes(), state.admin_token.as_bytes()) {
            Some(Caller::Admin)
        } else {
            state.tokens.caller(t, Utc::now())
        }
    });
    match caller {
        None => {
            let mut resp = ApiError::Unauthorized.into_response();
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            resp
        }
        Some(c) if !c.may_use(path) => ApiError::Forbidden(
            "a tenant token reaches its tenant's jobs, workflows, runs, tickets and dead letters only"
                .into(),
        )
        .into_response(),
        Some(c) => {
            req.extensions_mut().insert(c);
            next.run(req).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(tenant: Option<&str>, expires_at: Option<DateTime<Utc>>) -> (Tokens, String) {
        let id = Uuid::new_v4();
        let (token, hash) = mint(id);
        let tokens = Tokens::default();
        tokens.insert(TokenRecord {
            id,
            tenant: tenant.map(str::to_string),
            name: None,
            created_at: Utc::now(),
            expires_at,
            secret_sha256: hash,
        });
        (tokens, token)
    }

    #[test]
    fn a_minted_token_stands_for_its_tenant_until_revoked_or_expired() {
        let now = Utc::now();
        let (tokens, token) = record(Some("acme"), Some(now + chrono::Duration::hours(1)));
        assert!(!token.contains(
            &tokens
                .0
                .read()
                .unwrap()
                .values()
                .next()
                .unwrap()
                .secret_sha256
        ));
        assert_eq!(
            tokens.caller(&token, now),
            Some(Caller::Tenant("acme".into()))
        );
        assert_eq!(
            tokens.caller(&token, now + chrono::Duration::hours(2)),
            None,
            "expired"
        );
        let mut forged = token.clone();
        forged.pop();
        forged.push(if token.ends_with('0') { '1' } else { '0' });
        assert_eq!(tokens.caller(&forged, now), None, "another secret");
        assert_eq!(tokens.caller("cst_nothing", now), None);
        assert_eq!(tokens.caller("", now), None);
        let id = split(&token).unwrap().0;
        tokens.remove(&id);
        assert_eq!(tokens.caller(&token, now), None, "revoked");

        let (admins, admin) = record(None, None);
        assert_eq!(admins.caller(&admin, now), Some(Caller::Admin));
    }

    #[test]
    fn a_tenant_token_reaches_its_tenant_paths_and_its_tenant_only() {
        let t = Caller::Tenant("acme".into());
        for path in [
            "/v1/jobs",
            "/v1/jobs/x/runs",
            "/v1/workflows",
            "/v1/workflows/x/runs",
            "/v1/workflow-runs/x/retry",
            "/v1/tickets/x",
            "/v1/dlq",
            "/v1/dlq/x/replay",
            "/v1/tenants/acme",
            "/v1/schedule/preview",
        ] {
            assert!(t.may_use(path), "{path}");
        }
        for path in [
            "/v1/cluster",
            "/v1/nodes",
            "/v1/shards",
            "/v1/workers",
            "/v1/settings",
            "/v1/plugins",
            "/v1/strategy",
            "/v1/tokens",
            "/v1/tokens/x",
            "/v1/anything-new",
        ] {
            assert!(!t.may_use(path), "{path}");
            assert!(Caller::Admin.may_use(path), "{path}");
        }
        assert!(t.sees("acme", "job").is_ok());
        assert!(matches!(
            t.sees("other", "job"),
            Err(ApiError::NotFound("job"))
        ));
        assert!(Caller::Admin.sees("other", "job").is_ok());
        assert_eq!(t.scope(None).unwrap(), Some("acme"));
        assert_eq!(t.scope(Some("acme")).unwrap(), Some("acme"));
        assert!(matches!(
            t.scope(Some("other")),
            Err(ApiError::NotFound("tenant"))
        ));
        assert_eq!(Caller::Admin.scope(Some("other")).unwrap(), Some("other"));
        assert_eq!(Caller::Admin.scope(None).unwrap(), None);
        assert!(matches!(
            t.may_create_in("other"),
            Err(ApiError::Forbidden(_))
        ));
        assert!(t.may_create_in("acme").is_ok());
    }
}
