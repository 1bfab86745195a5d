//! `chronoshard control-plane`: one control-plane replica against a platform's NATS. Run two or
//! more: each serves the whole REST API, and the one holding the leader lease assigns shards.
//! The first replica to start creates the cluster with its `--shards`, `--sharding`,
//! `--replicas` and initial live settings; a later replica given other creation values refuses
//! to start. SIGTERM or Ctrl-C stops it cleanly (a leader hands the lease over at once); exit 0.
//!
//! It only wires `chronoshard_control_plane::ControlPlane` to a listener and NATS; what the
//! control plane does is not decided here.

use std::{net::SocketAddr, path::PathBuf};

use anyhow::Context;
use chronoshard_cluster::Connections;
use chronoshard_control_plane::{ControlPlane, Options};
use chronoshard_wire::{job::check_token, rpc::Sharding, settings::Settings};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// The settings of `chronoshard control-plane`, defined once (`crate::config`: each is a flag,
/// a `CHRONOSHARD_*` variable and a key of the config file).
#[derive(clap::Args, Serialize, Debug, Clone)]
pub struct ControlPlaneArgs {
    #[command(flatten)]
    #[serde(skip)]
    pub file: crate::config::ConfigFlags,
    /// NATS server URL of the platform (several, comma-separated, for a NATS cluster).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats: String,
    /// Address of the REST API (port 0 picks a free one and prints it).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http: SocketAddr,
    /// This replica's id (1-64 of A-Z a-z 0-9 _ -), unique among the replicas.
    #[arg(long)]
    pub id: String,
    /// The admin bearer token (never printed by --dump-config, nor by --help from its
    /// variable). Give this or --token-file.
    #[arg(long, hide_env_values = true)]
    #[serde(skip)]
    pub token: Option<String>,
    /// A file holding the admin bearer token.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Shard count of a new cluster (default 8); a replica joining a cluster created with
    /// another count refuses to start.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    /// Sharding mode of a new cluster (default tenant); checked like --shards.
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharding: Option<Sharding>,
    /// Length in seconds of the windows of due time a new `time_window` cluster is cut into
    /// (default 60); checked like --shards.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=86_400))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_secs: Option<u32>,
    /// Copies JetStream keeps of every stream and bucket: 1 on one NATS server, 3 on a 3-node
    /// NATS cluster. A new cluster gets this many (default 1); given to a replica of an existing
    /// cluster, its streams and buckets are brought to this count (left alone when not given).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=5))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u8>,
    /// Directory this replica loads assignment-strategy plugins from, by name
    /// (`POST /v1/plugins {"name": "N"}` opens DIR/N.so; a replica loads the active strategy
    /// from here by itself). Without it only the built-in strategies exist. Make it writable by
    /// the operator alone: a plugin runs inside the control plane.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin_dir: Option<PathBuf>,
    /// The cluster's live settings when this replica creates it; after that they change
    /// through `PUT /v1/settings` only.
    #[command(flatten)]
    #[serde(flatten)]
    pub settings: Settings,
}

impl ControlPlaneArgs {
    /// The replica's options, or why these settings cannot run one.
    pub fn options(&self) -> anyhow::Result<Options> {
        check_token("id", &self.id, 64)
            .map_err(|e| anyhow::anyhow!("--id {:?}: {}", self.id, e.message))?;
        let token = match (&self.token, &self.token_file) {
            (Some(t), None) => t.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --token-file {}", path.display()))?
                .trim()
                .to_string(),
            (Some(_), Some(_)) => anyhow::bail!("--token and --token-file both given: give one"),
            (None, None) => anyhow::bail!(
                "the admin token is missing: give --token TOKEN (or CHRONOSHARD_TOKEN) or \
                 --token-file FILE"
            ),
        };
        anyhow::ensure!(!token.is_empty(), "the admin token is empty");
        self.settings
            .validate()
            .map_err(|e| anyhow::anyhow!("--{}: {}", e.field.replace('_', "-"), e.rule))?;
        let mut opts = Options::new(&self.id, token);
        opts.shard_count = self.shards;
        opts.sharding = self.sharding;
        opts.window_secs = self.window_secs;
        opts.replicas = self.replicas.map(usize::from);
        opts.settings = self.settings;
        opts.plugin_dir = self.plugin_dir.clone();
        Ok(opts)
    }
}

/// Runs the replica until `shutdown` fires.
pub async fn run(args: ControlPlaneArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let opts = args.options()?;
    let listener = tokio::net::TcpListener::bind(args.http)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (use --http to pick another)",
                args.http
            )
        })?;
    let nats = Connections::connect(&args.nats, &format!("control-plane {}", args.id))
        .await
        .with_context(|| format!("cannot connect to NATS at {}", args.nats))?;
    let (handle, task) = ControlPlane::start(opts, nats, listener, shutdown.clone())
        .await
        .context("cannot start the control plane")?;
    println!("chronoshard control-plane {} is ready", args.id);
    println!("  url:    http://{}", handle.addr);
    println!("  nats:   {}", args.nats);
    println!(
        "  shards: {} ({} sharding)",
        handle.shard_count, handle.sharding
    );
    if let Some(dir) = &args.plugin_dir {
        println!("  plugins: {}", dir.display());
    }
    task.await.context("the control plane task failed")?;
    println!("stopped");
    Ok(())
}
