//! The control plane: the REST API, routing of job operations to shard owners, and the shard
//! map (which live node owns which shard, under which epoch).
//!
//! - `api`: HTTP handlers, one file per resource, and the one error-to-HTTP mapping;
//! - `routing`: tenant → shard (consistent hashing) and request-reply to the owner;
//! - `assign`: the loop that keeps every shard assigned;
//! - `liveness`: which nodes are alive, from the registry's changes (pure).
//!
//! It keeps no database of its own: cluster state lives in JetStream KV, jobs in shard databases.

pub mod api;
pub mod assign;
pub mod liveness;
pub mod routing;
pub mod strategy;

use std::{net::SocketAddr, sync::Arc};

use chronoshard_cluster::{Cluster, Connections};
use chronoshard_wire::rpc::ClusterConfig;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// How to run a control plane.
#[derive(Clone, Debug)]
pub struct Options {
    /// Bearer token with full access.
    pub admin_token: String,
    /// Shard count for a new cluster; an existing cluster keeps its own.
    pub shard_count: u32,
    /// Nodes to wait for before the first assignment of a new cluster.
    pub min_nodes: usize,
    /// Shards of nodes in this process, called without NATS (`chronoshard dev` shares one
    /// with its nodes); a default one is empty and every call goes over NATS.
    pub local: chronoshard_cluster::LocalShards,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cluster state: {0}")]
    Cluster(#[from] chronoshard_cluster::Error),
    #[error("http: {0}")]
    Io(#[from] std::io::Error),
}

/// A running control plane.
#[derive(Clone, Debug)]
pub struct Handle {
    pub addr: SocketAddr,
    pub shard_count: u32,
}

pub struct ControlPlane;

impl ControlPlane {
    /// Serves the API on `listener` and keeps the shard map assigned until `shutdown`. The API's
    /// shard requests go on the data connection; the assignment loop reads the registry and
    /// writes the shard map on the membership one, so an API flood cannot delay a failover.
    pub async fn start(
        opts: Options,
        nats: impl Into<Connections>,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(Handle, JoinHandle<()>), Error> {
        let nats = nats.into();
        let cluster = Cluster::connect(nats.data.clone()).await?;
        let membership = Cluster::connect(nats.membership).await?;
        let config = cluster
            .init_config(&ClusterConfig::new(opts.shard_count))
            .await?;
        let addr = listener.local_addr()?;
        let state = api::AppState::new(api::Shared {
            router: routing::Router::new(
                nats.data,
                config.shard_count,
                config.job_ids,
                opts.local.clone(),
            ),
            cluster: cluster.clone(),
            admin_token: Arc::from(opts.admin_token.as_str()),
        });
        let assigner = tokio::spawn(assign::run(
            membership,
            config.shard_count,
            opts.min_nodes,
            shutdown.clone(),
        ));
        let app = api::app(state);
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            info!(%addr, shards = config.shard_count, "control plane listening");
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
            {
                tracing::error!(error = %e, "http server failed");
            }
            let _ = assigner.await;
        });
        Ok((
            Handle {
                addr,
                shard_count: config.shard_count,
            },
            task,
        ))
    }
}
