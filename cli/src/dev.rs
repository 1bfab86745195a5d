//! `chronoshard dev`: the whole platform on one machine. A nats-server child process with
//! JetStream, the control plane, shard nodes with one SQLite database per shard, and workers.
//! The parts share this process but talk to each other only through NATS, each over its own
//! connection, exactly as separate processes do.
//!
//! Layout of the data directory:
//! - `admin-token`: the generated admin token (kept so it survives restarts);
//! - `nats/`: the JetStream store and `nats-server.log`;
//! - `shards/shard-<n>.db`: one SQLite database per shard;
//! - `workers/worker-<n>.journal`: each worker's ticket journal.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context;
use chronoshard_control_plane::{ControlPlane, Options as ControlPlaneOptions};
use chronoshard_shard_node::{Connections, Options as NodeOptions, ShardNode};
use chronoshard_wire::{rpc::Sharding, settings::Settings};
use chronoshard_worker::{
    executor::{shell::ShellOptions, ssrf::SsrfGuard, Builtins},
    Handlers, Options as WorkerOptions, QueueLimits, Worker,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The flags of `chronoshard dev`.
#[derive(clap::Args, Debug, Clone)]
pub struct DevArgs {
    /// Data directory: shard databases, JetStream store, admin token. Kept across restarts.
    #[arg(long, env = "CHRONOSHARD_DATA", default_value = "./chronoshard-data")]
    pub data: PathBuf,
    /// Address of the REST API.
    #[arg(long, env = "CHRONOSHARD_HTTP", default_value = "127.0.0.1:8080")]
    pub http: SocketAddr,
    /// Number of shard nodes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub shard_nodes: u16,
    /// Number of workers.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub workers: u16,
    /// Admin token (default: generated once and kept in DATA/admin-token).
    #[arg(long, env = "CHRONOSHARD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Shard count of a new data directory.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub shards: u32,
    /// Sharding mode of a new data directory.
    #[arg(long, value_enum, default_value_t = Sharding::Tenant)]
    pub sharding: Sharding,
    /// Length in seconds of the windows of due time of a new `time_window` data directory.
    #[arg(long, default_value_t = chronoshard_wire::rpc::Windows::DEFAULT_WINDOW_SECS,
        value_parser = clap::value_parser!(u32).range(1..=86_400))]
    pub window_secs: u32,
    /// Keep the shard databases in this PostgreSQL database (one schema per shard, e.g.
    /// `postgres://user@127.0.0.1:5432/chronoshard`) instead of SQLite files under DATA.
    #[arg(long, env = "CHRONOSHARD_POSTGRES")]
    pub postgres: Option<String>,
    /// Directory assignment-strategy plugins are loaded from, by name (`POST /v1/plugins
    /// {"name": "N"}` opens DIR/N.so). Without it only the built-in strategies exist.
    #[arg(long, env = "CHRONOSHARD_PLUGIN_DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// The live settings of a new data directory (after that, `PUT /v1/settings`).
    #[command(flatten)]
    pub settings: Settings,
}

impl DevArgs {
    pub fn options(&self) -> anyhow::Result<DevOptions> {
        self.settings
            .validate()
            .map_err(|e| anyhow::anyhow!("--{}: {}", e.field.replace('_', "-"), e.rule))?;
        Ok(DevOptions {
            data: self.data.clone(),
            http: self.http,
            shard_nodes: self.shard_nodes as usize,
            workers: self.workers as usize,
            token: self.token.clone(),
            shards: self.shards,
            sharding: self.sharding,
            window_secs: self.window_secs,
            settings: self.settings,
            postgres: self.postgres.clone(),
            plugin_dir: self.plugin_dir.clone(),
        })
    }
}

/// Options of `chronoshard dev`.
#[derive(Clone, Debug)]
pub struct DevOptions {
    pub data: PathBuf,
    pub http: SocketAddr,
    pub shard_nodes: usize,
    pub workers: usize,
    /// Admin token; generated (and kept in the data dir) when absent.
    pub token: Option<String>,
    /// Shards of a new data dir; an existing one keeps its count.
    pub shards: u32,
    pub sharding: Sharding,
    /// Window length of a new `time_window` data dir, in seconds.
    pub window_secs: u32,
    /// The live settings of a new data dir.
    pub settings: Settings,
    /// Shard databases in this Postgres database (a schema each) instead of SQLite files.
    pub postgres: Option<String>,
    /// Where strategy plugins are loaded from (None: built-in strategies only).
    pub plugin_dir: Option<PathBuf>,
}

impl DevOptions {
    pub fn new(data: impl Into<PathBuf>) -> DevOptions {
        DevOptions {
            data: data.into(),
            http: ([127, 0, 0, 1], 8080).into(),
            shard_nodes: 2,
            workers: 1,
            token: None,
            shards: 8,
            sharding: Sharding::Tenant,
            window_secs: chronoshard_wire::rpc::Windows::DEFAULT_WINDOW_SECS,
            settings: Settings::DEFAULT,
            postgres: None,
            plugin_dir: None,
        }
    }
}

/// A running dev platform.
pub struct Platform {
    /// `http://<addr>` of the REST API.
    pub url: String,
    pub token: String,
    pub nats_url: String,
    pub nats_version: String,
    /// The cluster's shard count and sharding mode when it started.
    pub shard_count: u32,
    pub sharding: Sharding,
    nats: chronoshard_natsd::Server,
    nats_opts: chronoshard_natsd::Options,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Platform {
    /// Starts every part and waits until `/readyz` answers 200.
    pub async fn start(opts: DevOptions) -> anyhow::Result<Platform> {
        std::fs::create_dir_all(&opts.data)
            .with_context(|| format!("cannot create data dir {}", opts.data.display()))?;
        let token = admin_token(&opts.data, opts.token.as_deref())?;
        let binary = chronoshard_natsd::find()?;
        let nats_opts = chronoshard_natsd::Options::in_dir(&opts.data.join("nats"));
        // A directory that has run before keeps its cluster's shard count and mode.
        let is_new = !nats_opts.store_dir.exists();
        let nats = chronoshard_natsd::Server::start(binary, &nats_opts).await?;
        let nats_url = nats.url();
        let connect = |name: String| {
            let url = nats_url.clone();
            async move {
                Connections::connect(&url, &name)
                    .await
                    .with_context(|| format!("{name}: cannot connect to nats-server"))
            }
        };
        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        let listener = tokio::net::TcpListener::bind(opts.http)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {} (use --http to pick another address)",
                    opts.http
                )
            })?;
        // The control plane calls the shards of these nodes directly, not over NATS.
        let local = chronoshard_cluster::LocalShards::default();
        // The same control plane as `chronoshard control-plane`, one replica, creating the
        // cluster of a new data directory with these values (an existing one keeps its own).
        let mut cp_opts = ControlPlaneOptions::new("control-plane", token.clone());
        cp_opts.shard_count = Some(opts.shards).filter(|_| is_new);
        cp_opts.sharding = Some(opts.sharding).filter(|_| is_new);
        cp_opts.window_secs = Some(opts.window_secs).filter(|_| is_new);
        cp_opts.settings = opts.settings;
        cp_opts.min_nodes = opts.shard_nodes;
        cp_opts.local = local.clone();
        cp_opts.plugin_dir = opts.plugin_dir.clone();
        let (cp, task) = ControlPlane::start(
            cp_opts,
            connect("control-plane".into()).await?,
            listener,
            shutdown.clone(),
        )
        .await?;
        tasks.push(task);
        for i in 1..=opts.shard_nodes {
            let node = NodeOptions {
                node_id: format!("node-{i}"),
                databases: match &opts.postgres {
                    Some(url) => chronoshard_shard_node::Databases::Postgres(url.clone()),
                    None => chronoshard_shard_node::Databases::Sqlite(opts.data.join("shards")),
                },
                local: local.clone(),
                zone: None,
                labels: Default::default(),
                max_shards: None,
            };
            let nats = connect(format!("node-{i}")).await?;
            let (_, task) = ShardNode::start(node, nats, shutdown.clone()).await?;
            tasks.push(task);
        }
        for i in 1..=opts.workers {
            let id = format!("worker-{i}");
            let mut worker = WorkerOptions::new(&id, opts.data.join("workers"));
            // A local playground: its targets are usually on this machine.
            worker.handlers = Builtins {
                http: SsrfGuard::default().allow_loopback(),
                shell: ShellOptions::default(),
                limits: QueueLimits::default(),
            }
            .register(Handlers::new())?;
            tasks.push(Worker::start(worker, connect(id.clone()).await?, shutdown.clone()).await?);
        }
        let platform = Platform {
            url: format!("http://{}", cp.addr),
            token,
            nats_url: nats.url(),
            nats_version: nats.binary.version.clone(),
            shard_count: cp.shard_count,
            sharding: cp.sharding,
            nats,
            nats_opts,
            shutdown,
            tasks,
        };
        platform.wait_ready(Duration::from_secs(60)).await?;
        Ok(platform)
    }

    async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let url = format!("{}/readyz", self.url);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last = match client.get(&url).send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(e) => e.to_string(),
            };
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("platform not ready after {timeout:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every part, then the nats-server child.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        let all = join_all(std::mem::take(&mut self.tasks));
        if tokio::time::timeout(Duration::from_secs(20), all)
            .await
            .is_err()
        {
            tracing::warn!("some parts did not stop within 20 s");
        }
        self.nats.stop().await.context("stopping nats-server")?;
        Ok(())
    }

    /// Stops the nats-server child, as an operator (or a crash) would: `kill` makes it a crash
    /// (SIGKILL). Every part reconnects on its own once `start_nats` brings it back.
    pub async fn stop_nats(&mut self, kill: bool) -> anyhow::Result<()> {
        if kill {
            self.nats.kill().await?;
        } else {
            self.nats.stop().await?;
        }
        Ok(())
    }

    /// Starts nats-server again on the same port and store after `stop_nats`.
    pub async fn start_nats(&mut self) -> anyhow::Result<()> {
        let mut opts = self.nats_opts.clone();
        opts.port = self.nats.addr().port();
        self.nats = chronoshard_natsd::Server::start(self.nats.binary.clone(), &opts).await?;
        Ok(())
    }
}

async fn join_all(tasks: Vec<JoinHandle<()>>) {
    for t in tasks {
        let _ = t.await;
    }
}

/// The admin token: the one given, else the one kept in the data dir, else a new one (kept).
fn admin_token(data: &Path, given: Option<&str>) -> anyhow::Result<String> {
    if let Some(t) = given {
        anyhow::ensure!(!t.trim().is_empty(), "--token must not be empty");
        return Ok(t.to_string());
    }
    let path = data.join("admin-token");
    if let Ok(t) = std::fs::read_to_string(&path) {
        if !t.trim().is_empty() {
            return Ok(t.trim().to_string());
        }
    }
    let token = format!("cs_{}", uuid::Uuid::new_v4().simple());
    std::fs::write(&path, &token).with_context(|| format!("cannot write {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    }
    Ok(token)
}
