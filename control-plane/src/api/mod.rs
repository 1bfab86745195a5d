//! The REST API (v1): routes, authentication, request metrics, the OpenAPI document and Swagger
//! UI. Handlers live one file per resource; every error goes through `error::ApiError`.
//!
//! Handlers only translate HTTP to shard requests and back: they must not touch shard databases
//! or decide anything a shard decides.

pub mod auth;
pub mod body;
pub mod cluster;
pub mod dlq;
pub mod error;
pub mod jobs;
pub mod ops;
pub mod plugins;
pub mod schedule;
pub mod settings;
pub mod shards;
pub mod spec;
pub mod tenants;
pub mod tokens;
pub mod workers;
pub mod workflows;

use std::{sync::Arc, time::Instant};

use axum::{
    extract::{MatchedPath, Request},
    middleware::{self, Next},
    response::Response,
    Router,
};
use chronoshard_cluster::Cluster;
use chronoshard_telemetry::{metrics, traces};
use tracing::Instrument;
use utoipa::{
    openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme},
    Modify, OpenApi,
};
use utoipa_axum::{router::OpenApiRouter, routes};
use utoipa_swagger_ui::SwaggerUi;

pub use error::{ApiError, Problem};

use crate::routing::Router as ShardRouter;

/// What every handler can reach. Axum clones the state for every request (twice, with the
/// authentication layer), so it is one shared allocation: its parts hold NATS clients whose
/// clone and drop cost a dozen atomic operations each.
#[derive(Clone, Debug)]
pub struct AppState(Arc<Shared>);

#[derive(Debug)]
pub struct Shared {
    pub router: ShardRouter,
    pub cluster: Cluster,
    /// The configured admin token.
    pub admin_token: Arc<str>,
    /// The tokens made through `/v1/tokens`, as this replica follows them.
    pub tokens: auth::Tokens,
    /// This replica's id.
    pub replica: String,
    /// The cluster config as it changes (shards added, tenants moved).
    pub config: tokio::sync::watch::Receiver<chronoshard_wire::rpc::ClusterConfig>,
    pub settings: crate::SettingsRx,
    pub leadership: tokio::sync::watch::Receiver<crate::leader::Leadership>,
    /// The strategies this replica can run (`/v1/plugins`).
    pub registry: crate::strategy::Registry,
    /// The active strategy as the cluster state says.
    pub strategy: tokio::sync::watch::Receiver<chronoshard_wire::strategy::VersionedStrategy>,
}

impl AppState {
    pub fn new(shared: Shared) -> AppState {
        AppState(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "chronoshard",
        version = "1",
        description = "Sharded job scheduling: create cron, interval, one-shot and delayed jobs; read their runs and tickets. \
Errors are application/problem+json (RFC 9457) with a stable `code`; input errors name the `field`."
    ),
    modifiers(&BearerAuth),
    components(schemas(Problem)),
    tags(
        (name = "jobs", description = "Jobs, their runs and tickets"),
        (name = "workflows", description = "Workflows: steps that wait for each other as a graph, their runs, and retrying a failed run"),
        (name = "dlq", description = "Dead letters: tickets whose attempts ran out, and their replay"),
        (name = "tenants", description = "Tenant-wide pause, resume and trigger"),
        (name = "schedule", description = "Schedule evaluation"),
        (name = "cluster", description = "Control-plane replicas and the leader, shards, nodes, workers and live settings"),
        (name = "tokens", description = "API tokens for one tenant or an admin: create (the secret is shown once), list, revoke"),
        (name = "plugins", description = "Assignment strategies: the built-ins and plugins, loading a plugin from the plugin directory, activating a strategy"),
        (name = "operations", description = "Health, readiness, metrics (no token)")
    )
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(jobs::create_job, jobs::list_jobs))
        .routes(routes!(jobs::get_job, jobs::patch_job, jobs::delete_job))
        .routes(routes!(jobs::pause_job))
        .routes(routes!(jobs::resume_job))
        .routes(routes!(jobs::trigger_job))
        .routes(routes!(jobs::list_runs))
        .routes(routes!(jobs::get_ticket))
        .routes(routes!(
            workflows::create_workflow,
            workflows::list_workflows
        ))
        .routes(routes!(
            workflows::get_workflow,
            workflows::patch_workflow,
            workflows::delete_workflow
        ))
        .routes(routes!(workflows::pause_workflow))
        .routes(routes!(workflows::resume_workflow))
        .routes(routes!(workflows::trigger_workflow))
        .routes(routes!(workflows::list_workflow_runs))
        .routes(routes!(workflows::get_workflow_run))
        .routes(routes!(workflows::retry_workflow_run))
        .routes(routes!(dlq::list_dead_letters))
        .routes(routes!(dlq::replay))
        .routes(routes!(tenants::get_tenant))
        .routes(routes!(tenants::pause_tenant))
        .routes(routes!(tenants::resume_tenant))
        .routes(routes!(tenants::trigger_tenant))
        .routes(routes!(schedule::preview))
        .routes(routes!(shards::list_shards, shards::add_shards))
        .routes(routes!(cluster::list_nodes))
        .routes(routes!(cluster::drain_node))
        .routes(routes!(cluster::undrain_node))
        .routes(routes!(cluster::get_cluster))
        .routes(routes!(settings::get_settings, settings::put_settings))
        .routes(routes!(plugins::list_plugins, plugins::load_plugin))
        .routes(routes!(plugins::put_strategy))
        .routes(routes!(workers::list_workers))
        .routes(routes!(workers::drain_worker))
        .routes(routes!(tokens::create_token, tokens::list_tokens))
        .routes(routes!(tokens::revoke_token))
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
}

/// The OpenAPI document, generated from the handlers (committed as openapi/openapi.json).
pub fn openapi() -> utoipa::openapi::OpenApi {
    spec::finish(api_router().split_for_parts().1)
}

/// The OpenAPI document as served at `/openapi.json`.
pub fn document() -> serde_json::Value {
    spec::json(&openapi())
}

/// The whole HTTP application.
pub fn app(state: AppState) -> Router {
    let (router, api) = api_router().split_for_parts();
    let doc = spec::json(&spec::finish(api));
    router
        .route_layer(middleware::from_fn(record))
        .merge(SwaggerUi::new("/docs").external_url_unchecked("/openapi.json", doc))
        .fallback(|| async { ApiError::NotFound("route") })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(body::MAX_BODY))
        .layer(middleware::from_fn(limit_uri))
        .with_state(state)
}

/// Refuses a request whose target (path and query) is longer than `body::MAX_URI`, before
/// anything reads it.
async fn limit_uri(req: Request, next: Next) -> Response {
    let len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if len > body::MAX_URI {
        return axum::response::IntoResponse::into_response(ApiError::UriTooLong(body::MAX_URI));
    }
    next.run(req).await
}

/// Counts requests and their duration by route template (not by raw path: ids would explode the
/// label set), each in its `request` span when traces are exported.
async fn record(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().to_string();
    let parent = req
        .headers()
        .get(chronoshard_wire::names::TRACEPARENT)
        .and_then(|v| v.to_str().ok());
    let span = traces::request_span(&method, &route, parent);
    let start = Instant::now();
    let resp = next.run(req).instrument(span.clone()).await;
    traces::respond(&span, resp.status().as_u16());
    metrics::HTTP_DURATION_SECONDS
        .with_label_values(&[&method, &route])
        .observe(start.elapsed().as_secs_f64());
    metrics::HTTP_REQUESTS_TOTAL
        .with_label_values(&[&method, &route, resp.status().as_str()])
        .inc();
    resp
}
