//! `chronoshard shard-node`: one shard node process against a running platform's NATS. It
//! registers under its node id, runs exactly the shards the control plane assigns to it (SQLite
//! files under `DATA/shards`, or Postgres schemas), and on SIGTERM or Ctrl-C closes them and
//! leaves the node registry, so the control plane reassigns them at once; exit 0. Settings come
//! from flags, `CHRONOSHARD_*` variables and a TOML file (`crate::config`); `--dump-config`
//! prints the result as such a file.
//!
//! It only wires `chronoshard_shard_node::ShardNode` to a NATS connection; what a node does, and
//! who owns which shard, is not decided here.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use anyhow::Context;
use chronoshard_cluster::Cluster;
use chronoshard_shard_node::{Connections, Databases, Options, ShardNode};
use chronoshard_wire::{job::check_token, settings::Settings};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// The settings of `chronoshard shard-node`, defined once (`crate::config`: each is a flag, a
/// `CHRONOSHARD_*` variable and a key of the config file). What a shard does with its time
/// (horizon, publish window, heartbeats) is the cluster's live settings, not the node's.
#[derive(clap::Args, Serialize, Debug, Clone)]
pub struct ShardNodeArgs {
    #[command(flatten)]
    #[serde(skip)]
    pub file: crate::config::ConfigFlags,
    /// NATS server URL of the platform (several, comma-separated, for a NATS cluster).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats: String,
    /// Node id (1-64 of A-Z a-z 0-9 _ -): unique among the platform's shard nodes, and kept
    /// across restarts, since shard assignments follow it.
    #[arg(long)]
    pub node_id: String,
    /// The platform's data directory on this machine: the shard databases are the SQLite files
    /// in DATA/shards, as `chronoshard dev --data DATA` keeps them. Give this or --postgres.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<PathBuf>,
    /// Keep the shard databases in this PostgreSQL database (one schema per shard, e.g.
    /// `postgres://user@db:5432/chronoshard`), so nodes on several machines can own any shard.
    /// Give this or --data.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres: Option<String>,
    /// The node's failure domain (availability zone, rack; 1-64 of A-Z a-z 0-9 _ -), passed to
    /// the assignment strategy.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// A label for the assignment strategy, KEY=VALUE (each 1-64 of A-Z a-z 0-9 _ -); repeat
    /// the flag, or separate them with commas, for several. The zone-affinity example reads the
    /// zone whose databases a node reaches from `db_zone`.
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub label: Vec<String>,
    /// The most shards this node may own (at least 1); the control plane's assignment respects
    /// it. Unset: no limit.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_shards: Option<u32>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. `0.0.0.0:9464`). Unset: none.
    #[arg(long, value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<std::net::SocketAddr>,
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
        if let Some(zone) = &self.zone {
            check_token("zone", zone, 64)
                .map_err(|e| anyhow::anyhow!("--zone {zone:?}: {}", e.message))?;
        }
        Ok(Options {
            node_id: self.node_id.clone(),
            databases,
            // A node process has no control plane in it: every call reaches it over NATS.
            local: Default::default(),
            zone: self.zone.clone(),
            labels: labels(&self.label)?,
            max_shards: self.max_shards,
        })
    }
}

/// `KEY=VALUE` labels as a map; a key given twice is refused rather than one of them dropped.
fn labels(given: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    for label in given {
        let (key, value) = label
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--label {label:?}: must be KEY=VALUE"))?;
        for (part, text) in [("key", key), ("value", value)] {
            check_token(part, text, 64)
                .map_err(|e| anyhow::anyhow!("--label {label:?}: the {part} {}", e.message))?;
        }
        if labels.insert(key.to_string(), value.to_string()).is_some() {
            anyhow::bail!("--label {key}: given twice");
        }
    }
    Ok(labels)
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
                "cannot open the cluster state in NATS at {} (is JetStream enabled?)",
                args.nats
            )
        })?;
    refuse_a_live_namesake(&cluster, &opts.node_id).await?;
    let metrics = crate::config::serve_metrics(args.metrics, &shutdown).await?;
    let node_id = opts.node_id.clone();
    let (_, mut task) = ShardNode::start(opts, nats, shutdown.clone())
        .await
        .context("cannot start the shard node")?;
    println!("chronoshard shard-node {node_id} is ready");
    println!("  nats:   {}", args.nats);
    println!("  shards: {place}");
    if let Some(addr) = metrics {
        println!("  metrics: http://{addr}/metrics");
    }
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
/// does not heartbeat again within two heartbeat periods is a dead one (killed, its entry kept for
/// a while), and this process takes its place.
async fn refuse_a_live_namesake(cluster: &Cluster, node_id: &str) -> anyhow::Result<()> {
    let every = match cluster.settings().await {
        Ok(Some((s, _))) => s.settings.heartbeat_every.0,
        _ => Settings::DEFAULT.heartbeat_every.0,
    };
    let last_beat = || async {
        let nodes = cluster
            .nodes()
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
    let deadline = tokio::time::Instant::now() + 2 * every + Duration::from_millis(500);
    while tokio::time::Instant::now() < deadline {
        // Watching for a heartbeat: how a node shows it is alive.
        tokio::time::sleep(every / 4).await;
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
