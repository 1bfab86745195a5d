//! The control plane: the REST API, routing of job operations to shard owners, the leader lease
//! among replicas, and the shard map (which live node owns which shard, under which epoch).
//!
//! - `api`: HTTP handlers, one file per resource, and the one error-to-HTTP mapping;
//! - `routing`: tenant → shard (consistent hashing) and request-reply to the owner;
//! - `leader`: the lease that makes exactly one replica the leader;
//! - `assign`: the leader's loop that keeps every shard assigned (`assign::plan` is pure);
//! - `strategy`: the strategy host (built-in strategies and plugins, called under a deadline);
//! - `active`: keeps the strategy the cluster state names loaded on this replica;
//! - `liveness`: which nodes are alive, from the registry's changes (pure).
//!
//! It keeps no database of its own: cluster state lives in JetStream KV, jobs in shard databases.
//! Every replica serves the whole API; only the leader writes the shard map.

pub mod active;
pub mod api;
pub mod assign;
pub mod grow;
pub mod leader;
pub mod liveness;
pub mod routing;
pub mod strategy;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use chronoshard_cluster::{Cluster, Connections, Topology};
use chronoshard_wire::{
    rpc::{ClusterConfig, ReplicaInfo, Sharding},
    settings::{Settings, VersionedSettings},
};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

/// Shards of a new cluster when nobody says.
pub const DEFAULT_SHARDS: u32 = 8;

/// How to run a control-plane replica.
#[derive(Clone, Debug)]
pub struct Options {
    /// This replica's id, unique among the replicas (`GET /v1/cluster` lists them by it).
    pub id: String,
    /// Bearer token with full access.
    pub admin_token: String,
    /// Shard count of a new cluster (None: `DEFAULT_SHARDS`); given for an existing cluster, it
    /// must be the cluster's.
    pub shard_count: Option<u32>,
    /// Sharding mode of a new cluster (None: tenant); given for an existing one, it must match.
    pub sharding: Option<Sharding>,
    /// Window length of a new `time_window` cluster, in seconds (None: the default); given for
    /// an existing one, it must match.
    pub window_secs: Option<u32>,
    /// Stream and bucket replicas (see `Topology`): None leaves existing ones as they are.
    pub replicas: Option<usize>,
    /// The live settings a new cluster starts with.
    pub settings: Settings,
    /// Nodes to wait for before the first assignment of a new cluster.
    pub min_nodes: usize,
    /// Shards of nodes in this process, called without NATS (`chronoshard dev` shares one
    /// with its nodes); a default one is empty and every call goes over NATS.
    pub local: chronoshard_cluster::LocalShards,
    /// Where strategy plugins are loaded from, by name (`--plugin-dir`); None: the built-in
    /// strategies only.
    pub plugin_dir: Option<PathBuf>,
    /// Longest a strategy call may take; a strategy that misses it is disabled.
    pub strategy_deadline: Duration,
}

impl Options {
    /// A replica with these ids and the defaults for everything else.
    pub fn new(id: impl Into<String>, admin_token: impl Into<String>) -> Options {
        Options {
            id: id.into(),
            admin_token: admin_token.into(),
            shard_count: None,
            sharding: None,
            window_secs: None,
            replicas: None,
            settings: Settings::DEFAULT,
            min_nodes: 1,
            local: Default::default(),
            plugin_dir: None,
            strategy_deadline: strategy::DEFAULT_DEADLINE,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cluster state: {0}")]
    Cluster(#[from] chronoshard_cluster::Error),
    #[error("http: {0}")]
    Io(#[from] std::io::Error),
    /// A creation setting given to a replica differs from the cluster's.
    #[error(
        "the cluster was created with {setting} {cluster}, this replica was given {given}; \
             start it with {setting} {cluster} (or without it)"
    )]
    Mismatch {
        setting: &'static str,
        cluster: String,
        given: String,
    },
    #[error("invalid settings: {0}")]
    Settings(#[from] chronoshard_wire::settings::SettingsError),
    /// The plugin directory is not a directory this process can read.
    #[error("--plugin-dir {}: {reason}", path.display())]
    PluginDir { path: PathBuf, reason: String },
}

/// A running control-plane replica.
#[derive(Clone, Debug)]
pub struct Handle {
    pub addr: SocketAddr,
    /// The cluster's shard count and sharding mode when this replica started.
    pub shard_count: u32,
    pub sharding: Sharding,
    pub leadership: watch::Receiver<leader::Leadership>,
}

impl Handle {
    /// Whether this replica leads now.
    pub fn is_leading(&self) -> bool {
        self.leadership.borrow().is_leading()
    }
}

pub struct ControlPlane;

impl ControlPlane {
    /// Creates or joins the cluster, serves the API on `listener`, and takes part in the leader
    /// election until `shutdown`. The API's shard requests go on the data connection; the
    /// election, the registry and the shard map on the membership one, so an API flood cannot
    /// delay a failover.
    pub async fn start(
        opts: Options,
        nats: impl Into<Connections>,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(Handle, JoinHandle<()>), Error> {
        let nats = nats.into();
        opts.settings.validate()?;
        if let Some(dir) = &opts.plugin_dir {
            check_plugin_dir(dir)?;
        }
        // A replica that will refuse to start must not change the cluster it refuses to join.
        if let Some(config) = Cluster::existing_config(nats.data.clone()).await? {
            check(&config, &opts)?;
        }
        let topology = Topology {
            replicas: opts.replicas,
        };
        let cluster = Cluster::create(nats.data.clone(), &topology).await?;
        let membership = Cluster::connect(nats.membership).await?;
        let config = join_or_create(&cluster, &opts).await?;
        let config = membership.follow_config(config, shutdown.clone());
        let initial = cluster.init_settings(opts.settings).await?;
        let settings = membership.follow_settings(initial.settings, shutdown.clone());
        cluster.init_strategy().await?;
        let active = membership.follow_strategy(shutdown.clone());
        let registry = strategy::Registry::new(strategy::Options {
            plugin_dir: opts.plugin_dir.clone(),
            deadline: opts.strategy_deadline,
        });
        let addr = listener.local_addr()?;
        let (leader_tx, leadership) = watch::channel(leader::Leadership::default());
        let span = tracing::info_span!("control_plane", replica = %opts.id);
        let election = tokio::spawn(
            leader::run(
                membership.clone(),
                opts.id.clone(),
                settings.clone(),
                leader_tx,
                shutdown.clone(),
            )
            .instrument(span.clone()),
        );
        let assigner = tokio::spawn(
            assign::Assigner {
                cluster: membership.clone(),
                config: config.clone(),
                min_nodes: opts.min_nodes,
                settings: settings.clone(),
                leadership: leadership.clone(),
                strategy: active.clone(),
                registry: registry.clone(),
            }
            .run(shutdown.clone())
            .instrument(span.clone()),
        );
        let loader = tokio::spawn(
            active::keep_loaded(
                registry.clone(),
                active.clone(),
                active::RETRY_LOAD,
                shutdown.clone(),
            )
            .instrument(span.clone()),
        );
        let beat = tokio::spawn(
            replica_heartbeat(membership.clone(), opts.id.clone(), addr, shutdown.clone())
                .instrument(span.clone()),
        );
        let router = routing::Router::new(nats.data, config.clone(), opts.local.clone());
        let grower = tokio::spawn(
            grow::Grower {
                cluster: membership.clone(),
                router: router.clone(),
                config: config.clone(),
                leadership: leadership.clone(),
                settings: settings.clone(),
            }
            .run(shutdown.clone())
            .instrument(span.clone()),
        );
        let (shard_count, sharding) = {
            let c = config.borrow();
            (c.shard_count, c.sharding)
        };
        let state = api::AppState::new(api::Shared {
            router,
            cluster: cluster.clone(),
            admin_token: Arc::from(opts.admin_token.as_str()),
            tokens: api::auth::Tokens::follow(cluster.clone(), shutdown.clone()),
            replica: opts.id.clone(),
            config: config.clone(),
            settings,
            leadership: leadership.clone(),
            registry,
            strategy: active,
        });
        let app = api::app(state);
        let stop = shutdown.clone();
        let task = tokio::spawn(
            async move {
                info!(%addr, shards = shard_count, "control plane listening");
                if let Err(e) = axum::serve(listener, app)
                    .with_graceful_shutdown(stop.cancelled_owned())
                    .await
                {
                    tracing::error!(error = %e, "http server failed");
                }
                let _ = tokio::join!(assigner, election, beat, loader, grower);
            }
            .instrument(span),
        );
        Ok((
            Handle {
                addr,
                shard_count,
                sharding,
                leadership,
            },
            task,
        ))
    }
}

/// The cluster's config: created from the options when there is none, else checked against them.
async fn join_or_create(cluster: &Cluster, opts: &Options) -> Result<ClusterConfig, Error> {
    let mut wanted = ClusterConfig::new(
        opts.shard_count.unwrap_or(DEFAULT_SHARDS),
        opts.sharding.unwrap_or_default(),
    );
    if let (Some(w), Some(secs)) = (wanted.windows.as_mut(), opts.window_secs) {
        w.window_secs = secs;
    }
    let config = cluster.init_config(&wanted).await?;
    check(&config, opts)?;
    Ok(config)
}

/// Refuses creation settings that differ from the cluster's. A cluster that grew accepts the
/// shard count it was created with as well as the one it has now.
fn check(config: &ClusterConfig, opts: &Options) -> Result<(), Error> {
    if let Some(given) = opts
        .shard_count
        .filter(|n| *n != config.shard_count && *n != config.initial_shard_count())
    {
        return Err(Error::Mismatch {
            setting: "--shards",
            cluster: config.shard_count.to_string(),
            given: given.to_string(),
        });
    }
    if let Some(given) = opts.sharding.filter(|s| *s != config.sharding) {
        return Err(Error::Mismatch {
            setting: "--sharding",
            cluster: config.sharding.to_string(),
            given: given.to_string(),
        });
    }
    let window = config.windows.as_ref().map(|w| w.window_secs);
    if let Some(given) = opts.window_secs.filter(|s| window.is_some_and(|w| w != *s)) {
        return Err(Error::Mismatch {
            setting: "--window-secs",
            cluster: window.unwrap_or_default().to_string(),
            given: given.to_string(),
        });
    }
    Ok(())
}

/// Refuses a plugin directory that is not a readable directory, at start rather than at the
/// first load.
fn check_plugin_dir(dir: &std::path::Path) -> Result<(), Error> {
    let refuse = |reason: String| Error::PluginDir {
        path: dir.to_path_buf(),
        reason,
    };
    match std::fs::read_dir(dir) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(refuse("no such directory".into()))
        }
        Err(e) => Err(refuse(e.to_string())),
    }
}

/// How often a replica puts its heartbeat (for `GET /v1/cluster`; the lease decides leadership).
const REPLICA_HEARTBEAT: Duration = Duration::from_secs(1);

/// Puts this replica's entry until `stop`, then removes it.
async fn replica_heartbeat(
    cluster: Cluster,
    id: String,
    addr: SocketAddr,
    stop: CancellationToken,
) {
    let started_at = chrono::Utc::now();
    let mut every = tokio::time::interval(REPLICA_HEARTBEAT);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = every.tick() => {}
        }
        let info = ReplicaInfo {
            id: id.clone(),
            http: addr.to_string(),
            started_at,
            heartbeat_at: chrono::Utc::now(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        };
        if let Err(e) = cluster.heartbeat_replica(&info).await {
            warn!(error = %e, "replica heartbeat failed");
        }
    }
    let _ = cluster.forget_replica(&id).await;
}

/// The settings a replica has now (`GET /v1/settings`).
pub type SettingsRx = watch::Receiver<VersionedSettings>;
