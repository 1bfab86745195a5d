//! `chronoshard shard-node`: one shard node process against a running platform's NATS. It
//! registers under its node id, runs exactly the shards the control plane assigns to it (SQLite
//! files under `DATA/shards`, or Postgres schemas), and on SIGTERM or Ctrl-C closes them and
//! leaves the node registry, so the control plane reassigns them at once; exit 0. Settings come
//! from flags, `CHRONOSHARD_*` variables and a TOML file (`crate::config`); `--dump-config`
//! prints the result as such a file.
//!
//! It only wires `chronoshard_shard_node::ShardNode` to a NATS connection; what a node does, and
//! who owns which shard, is not decided here.

use std::{path::PathBuf, time::Duration};

use anyhow::Context;
use chronoshard_cluster::{Cluster, HEARTBEAT_EVERY};
use chronoshard_shard_node::{Connections, Databases, Options, ShardConfig, ShardNode};
use chronoshard_wire::{duration::Dur, job::check_token};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// Flags of `chronoshard shard-node` (each also read from a `CHRONOSHARD_*` variable).
#[derive(clap::Args, Debug, Clone)]
pub struct ShardNodeArgs {
    /// A TOML file with these settings (keys as the flags, `_` for `-`); flags and variables
    /// override it.
    #[arg(long, env = "CHRONOSHARD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print the settings in effect as a TOML config file and exit.
    #[arg(long)]
    pub dump_config: bool,
    /// NATS server URL of the platform.
    #[arg(
        long,
        env = "CHRONOSHARD_NATS",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats: String,
    /// Node id (1-64 of A-Z a-z 0-9 _ -): unique among the platform's shard nodes, and kept
    /// across restarts, since shard assignments follow it.
    #[arg(long, env = "CHRONOSHARD_NODE_ID")]
    pub node_id: String,
    /// The platform's data directory on this machine: the shard databases are the SQLite files
    /// in DATA/shards, as `chronoshard dev --data DATA` keeps them. Give this or --postgres.
    #[arg(long, env = "CHRONOSHARD_DATA")]
    pub data: Option<PathBuf>,
    /// Keep the shard databases in this PostgreSQL database (one schema per shard, e.g.
    /// `postgres://user@db:5432/chronoshard`), so nodes on several machines can own any shard.
    /// Give this or --data.
    #[arg(long, env = "CHRONOSHARD_POSTGRES")]
    pub postgres: Option<String>,
    /// Occurrences due within this long are held in memory; later ones stay in the database.
    #[arg(long, env = "CHRONOSHARD_HORIZON",
          default_value_t = Dur(ShardConfig::default().horizon))]
    pub horizon: Dur,
    /// How often each shard moves occurrences entering the horizon from its database into memory.
    #[arg(long, env = "CHRONOSHARD_LOAD_EVERY",
          default_value_t = Dur(ShardConfig::default().load_every))]
    pub load_every: Dur,
    /// Tickets each shard may have awaiting a JetStream ack at once.
    #[arg(long, env = "CHRONOSHARD_PUBLISH_WINDOW",
          default_value_t = ShardConfig::default().publish_window as u32,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub publish_window: u32,
    /// Occurrences of `overlap: allow` jobs are fired this long before they are due and
    /// published at their due time (0s: fired at the due time).
    #[arg(long, env = "CHRONOSHARD_FIRE_LEAD",
          default_value_t = Dur(ShardConfig::default().fire_lead))]
    pub fire_lead: Dur,
    /// A published ticket no worker has started after this long is looked for in the dispatch
    /// stream, and sent again if the stream lost it.
    #[arg(long, env = "CHRONOSHARD_RESEND_AFTER",
          default_value_t = Dur(ShardConfig::default().resend_after))]
    pub resend_after: Dur,
}

/// `chronoshard shard-node`'s config file: every flag, by the flag's name with `_` for `-`.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeFile {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub horizon: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_every: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish_window: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fire_lead: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resend_after: Option<Dur>,
}

impl NodeFile {
    /// The file's settings as defaults of the flags (arg id → values).
    pub fn as_defaults(&self) -> Vec<(&'static str, Vec<String>)> {
        use crate::config::{given, one, path};
        given([
            ("nats", one(&self.nats)),
            ("node_id", one(&self.node_id)),
            ("data", path(&self.data)),
            ("postgres", one(&self.postgres)),
            ("horizon", one(&self.horizon)),
            ("load_every", one(&self.load_every)),
            ("publish_window", one(&self.publish_window)),
            ("fire_lead", one(&self.fire_lead)),
            ("resend_after", one(&self.resend_after)),
        ])
    }

    /// The settings in effect, as a file.
    pub fn of(a: &ShardNodeArgs) -> NodeFile {
        NodeFile {
            nats: Some(a.nats.clone()),
            node_id: Some(a.node_id.clone()),
            data: a.data.clone(),
            postgres: a.postgres.clone(),
            horizon: Some(a.horizon),
            load_every: Some(a.load_every),
            publish_window: Some(a.publish_window),
            fire_lead: Some(a.fire_lead),
            resend_after: Some(a.resend_after),
        }
    }
}

impl ShardNodeArgs {
    /// The node's options, or why these settings cannot run a node.
    pub fn options(&self) -> anyhow::Result<Options> {
        check_token("node-id", &self.node_id, 64)
            .map_err(|e| anyhow::anyhow!("--node-id {:?}: {}", self.node_id, e.message))?;
        let databases = match (&self.data, &self.postgres) {
            (Some(dir), None) => Databases::Sqlite(dir.join("shards")),
            (None, Some(url)) => {
                anyhow::ensure!(
                    url.starts_with("postgres://") || url.starts_with("postgresql://"),
                    "--postgres must be a postgres:// URL"
                );
                Databases::Postgres(url.clone())
            }
            (Some(_), Some(_)) => anyhow::bail!(
                "--data and --postgres both given (flags, CHRONOSHARD_DATA / CHRONOSHARD_POSTGRES \
                 or the config file): the shard databases are in one place, give only one"
            ),
            (None, None) => anyhow::bail!(
                "where are the shard databases? give --data DIR (SQLite files in DIR/shards, \
                 the directory `chronoshard dev --data DIR` uses) or --postgres URL"
            ),
        };
        anyhow::ensure!(
            !self.load_every.0.is_zero(),
            "--load-every must be longer than 0s"
        );
        anyhow::ensure!(
            self.horizon.0 >= self.load_every.0 && self.horizon.0 > self.fire_lead.0,
            "--horizon must be at least --load-every and longer than --fire-lead"
        );
        anyhow::ensure!(
            !self.resend_after.0.is_zero(),
            "--resend-after must be longer than 0s"
        );
        Ok(Options {
            node_id: self.node_id.clone(),
            databases,
            // A node process has no control plane in it: every call reaches it over NATS.
            local: Default::default(),
            // Every field: a new knob of the shard config is a compile error here until this
            // command decides whether operators set it.
            shard: ShardConfig {
                horizon: self.horizon.0,
                load_every: self.load_every.0,
                publish_window: self.publish_window as usize,
                fire_lead: self.fire_lead.0,
                resend_after: self.resend_after.0,
            },
        })
    }
}

/// Runs the node until `shutdown` fires, then closes its shards and deregisters it.
pub async fn run(args: ShardNodeArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let opts = args.options()?;
    let place = match &opts.databases {
        Databases::Sqlite(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create the shard directory {}", dir.display()))?;
            format!("SQLite files in {}", dir.display())
        }
        Databases::Postgres(url) => format!("PostgreSQL {}", without_password(url)),
    };
    let nats = Connections::connect(&args.nats, &opts.node_id)
        .await
        .with_context(|| format!("cannot connect to NATS at {}", args.nats))?;
    let cluster = Cluster::connect(nats.membership.clone())
        .await
        .with_context(|| {
            format!(
                "cannot set up the cluster state in NATS at {} (is JetStream enabled?)",
                args.nats
            )
        })?;
    refuse_a_live_namesake(&cluster, &opts.node_id).await?;
    let node_id = opts.node_id.clone();
    let (_, mut task) = ShardNode::start(opts, nats, shutdown.clone())
        .await
        .context("cannot start the shard node")?;
    println!("chronoshard shard-node {node_id} is ready");
    println!("  nats:   {}", args.nats);
    println!("  shards: {place}");
    let ended = tokio::select! {
        ended = &mut task => ended,
        _ = shutdown.cancelled() => {
            println!("stopping: closing the shards and leaving the node registry");
            task.await
        }
    };
    ended.context("the shard node task failed")?;
    println!("stopped");
    Ok(())
}

/// Refuses to start while another process runs a node under the same id: both would run the same
/// shards under the same epoch, which fencing cannot tell apart. A node listed under the id that
/// does not heartbeat again within two heartbeat periods is a dead one (killed, its entry not yet
/// expired), and this process takes its place.
async fn refuse_a_live_namesake(cluster: &Cluster, node_id: &str) -> anyhow::Result<()> {
    let last_beat = || async {
        let nodes = cluster
            .live_nodes()
            .await
            .context("cannot read the node registry")?;
        anyhow::Ok(
            nodes
                .into_iter()
                .find(|n| n.node_id == node_id)
                .map(|n| n.heartbeat_at),
        )
    };
    let Some(first) = last_beat().await? else {
        return Ok(());
    };
    tracing::info!(
        node_id,
        "a node with this id is listed; checking that it is gone"
    );
    let deadline = tokio::time::Instant::now() + 2 * HEARTBEAT_EVERY + Duration::from_millis(500);
    while tokio::time::Instant::now() < deadline {
        // Watching for a heartbeat: how a node shows it is alive.
        tokio::time::sleep(Duration::from_millis(200)).await;
        match last_beat().await? {
            None => return Ok(()),
            Some(t) if t != first => anyhow::bail!(
                "node id {node_id} is in use: a live shard node heartbeats under it; \
                 give each node its own --node-id"
            ),
            Some(_) => {}
        }
    }
    Ok(())
}

/// A Postgres URL fit for printing.
fn without_password(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        Err(_) => "(unparsable URL)".into(),
    }
}
