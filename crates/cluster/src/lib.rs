//! The JetStream topology every process relies on (streams, KV buckets) and typed access to the
//! cluster state kept in KV: the cluster config, the shard map, node and worker heartbeats and the
//! job index.
//!
//! Every role calls `Cluster::connect`, which creates what is missing and leaves what exists, so
//! any process can start first. This crate must not decide anything (who owns a shard is the
//! control plane's decision): it reads and writes state and nothing else. `local` is the one
//! piece that is not in KV: the map of shards served in this process (see its doc).

mod local;
#[cfg(test)]
mod tests;

use std::{sync::Arc, time::Duration};

use async_nats::jetstream::{
    self,
    kv::{self, Store},
    stream::{self, DiscardPolicy, RetentionPolicy, StorageType},
    Context,
};
use bytes::Bytes;
use chronoshard_wire::{
    names,
    rpc::{ClusterConfig, NodeInfo, ShardAssignment, WorkerInfo},
};
use futures::TryStreamExt;
use serde::{de::DeserializeOwned, Serialize};
use tracing::{info, warn};

pub use local::{LocalCall, LocalShards, Registration};

/// How long a node or worker stays listed after its last heartbeat.
pub const HEARTBEAT_TTL: Duration = Duration::from_secs(6);
/// How often nodes and workers send a heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// Publish acks one connection may await at once (all shards of a node share a connection).
pub const MAX_ACKS_IN_FLIGHT: usize = 1 << 17;
/// Largest dispatch backlog the stream holds before publishes are refused (`discard: new`), so a
/// flood of due tickets slows the shard nodes instead of growing without bound.
pub const DISPATCH_MAX_BYTES: i64 = 1 << 30;

/// A role's two connections to NATS (shard nodes and workers).
///
/// Membership (heartbeats, the shard map) has its own: a connection's messages reach the server
/// in order, so a heartbeat sent on the connection that carries the tickets or results waits
/// behind every message published before it. Under a burst a node's heartbeats came late
/// enough for the control plane to move every shard of a healthy node.
#[derive(Clone, Debug)]
pub struct Connections {
    /// Tickets, results and shard requests.
    pub data: async_nats::Client,
    /// Heartbeats and the shard map.
    pub membership: async_nats::Client,
}

impl Connections {
    /// Opens both to `url`, named `name` and `name membership` (as nats-server lists them).
    pub async fn connect(url: &str, name: &str) -> Result<Connections> {
        Ok(Connections {
            data: open(url, name.to_string()).await?,
            membership: open(url, format!("{name} membership")).await?,
        })
    }
}

/// Opens one connection named `name` whose client events (disconnects, reconnects, slow
/// consumers, errors) are logged and counted: under load they explain stalls that nothing else
/// shows, and async-nats reports them nowhere unless asked.
async fn open(url: &str, name: String) -> Result<async_nats::Client> {
    let label = name.clone();
    async_nats::ConnectOptions::new()
        .name(name)
        .event_callback(move |event| {
            note_event(&label, &event);
            std::future::ready(())
        })
        .connect(url)
        .await
        .map_err(nats("connect"))
}

fn note_event(connection: &str, event: &async_nats::Event) {
    use async_nats::Event;
    let name = match event {
        Event::Connected => "connected",
        Event::Disconnected => "disconnected",
        Event::LameDuckMode => "lame_duck_mode",
        Event::Draining => "draining",
        Event::Closed => "closed",
        Event::SlowConsumer(_) => "slow_consumer",
        Event::ServerError(_) => "server_error",
        Event::ClientError(_) => "client_error",
    };
    chronoshard_telemetry::metrics::NATS_EVENTS_TOTAL
        .with_label_values(&[connection, name])
        .inc();
    match event {
        // What a start and a clean stop bring.
        Event::Connected | Event::Draining | Event::Closed => {
            info!(connection, %event, "nats client event")
        }
        _ => warn!(connection, %event, "nats client event"),
    }
}

impl From<async_nats::Client> for Connections {
    /// One connection for both: enough for tests that publish little.
    fn from(client: async_nats::Client) -> Self {
        Connections {
            data: client.clone(),
            membership: client,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Nats {
        what: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{what}: stored value is not valid JSON: {source}")]
    Decode {
        what: &'static str,
        source: serde_json::Error,
    },
    /// A compare-and-swap lost: someone else changed the key first.
    #[error("{what}: changed concurrently")]
    Conflict { what: &'static str },
}

fn nats<E: std::error::Error + Send + Sync + 'static>(
    what: &'static str,
) -> impl FnOnce(E) -> Error {
    move |e| Error::Nats {
        what,
        source: Box::new(e),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Handles on the streams and buckets of one cluster. Cheap to clone: the API clones it per
/// request and a shard per message, so the bucket handles sit behind one `Arc` (a KV `Store`
/// clone deep-copies its stream's whole info, measured as half of the API's allocations).
#[derive(Clone)]
pub struct Cluster {
    pub client: async_nats::Client,
    pub js: Context,
    buckets: Arc<Buckets>,
}

struct Buckets {
    nodes: Store,
    shards: Store,
    workers: Store,
    /// Opened on first use: only clusters with `JobIds::Indexed` have one.
    job_index: tokio::sync::OnceCell<Store>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").finish_non_exhaustive()
    }
}

impl Cluster {
    /// Creates the streams and buckets that do not exist yet and returns handles on them.
    pub async fn connect(client: async_nats::Client) -> Result<Cluster> {
        // Publishers bound their own windows; the context must never make a publish wait for an
        // ack permit another shard's dispatcher holds (that can deadlock), so a full context is
        // an error the dispatcher retries, and the limit is far above the sum of the windows.
        let js = jetstream::ContextBuilder::new()
            .backpressure_on_inflight(false)
            .max_ack_inflight(MAX_ACKS_IN_FLIGHT)
            .ack_timeout(Duration::from_secs(10))
            .build(client.clone());
        js.get_or_create_stream(stream::Config {
            name: names::DISPATCH_STREAM.into(),
            subjects: vec![names::DISPATCH_SUBJECTS.into()],
            retention: RetentionPolicy::WorkQueue,
            storage: StorageType::File,
            discard: DiscardPolicy::New,
            max_bytes: DISPATCH_MAX_BYTES,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .map_err(nats("create dispatch stream"))?;
        js.get_or_create_stream(stream::Config {
            name: names::RESULT_STREAM.into(),
            subjects: vec![names::RESULT_SUBJECTS.into()],
            retention: RetentionPolicy::WorkQueue,
            storage: StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .map_err(nats("create result stream"))?;
        let buckets = Buckets {
            nodes: ensure_bucket(&js, bucket(names::NODES_BUCKET, 1, HEARTBEAT_TTL)).await?,
            shards: ensure_bucket(&js, bucket(names::SHARDS_BUCKET, 5, Duration::ZERO)).await?,
            workers: ensure_bucket(&js, bucket(names::WORKERS_BUCKET, 1, HEARTBEAT_TTL)).await?,
            job_index: tokio::sync::OnceCell::new(),
        };
        Ok(Cluster {
            buckets: Arc::new(buckets),
            js,
            client,
        })
    }

    /// The cluster config, if a control plane has written it.
    pub async fn config(&self) -> Result<Option<ClusterConfig>> {
        get_json(
            &self.buckets.shards,
            names::CLUSTER_CONFIG_KEY,
            "read cluster config",
        )
        .await
    }

    /// Writes the config unless one exists; returns the config in force.
    pub async fn init_config(&self, wanted: &ClusterConfig) -> Result<ClusterConfig> {
        match self
            .buckets
            .shards
            .create(names::CLUSTER_CONFIG_KEY, to_bytes(wanted))
            .await
        {
            Ok(_) => Ok(wanted.clone()),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                Ok(self.config().await?.unwrap_or_else(|| wanted.clone()))
            }
            Err(e) => Err(nats("write cluster config")(e)),
        }
    }

    /// Every shard assignment with its KV revision (for compare-and-swap updates).
    pub async fn assignments(&self) -> Result<Vec<(ShardAssignment, u64)>> {
        let mut out = Vec::new();
        for (key, value, revision) in latest(&self.buckets.shards, "read shard map").await? {
            if key.starts_with("shard.") {
                out.push((decode(&value, "shard map")?, revision));
            }
        }
        out.sort_by_key(|(a, _): &(ShardAssignment, u64)| a.shard);
        Ok(out)
    }

    /// Writes an assignment if the key is still at `revision` (None: the key must not exist).
    pub async fn put_assignment(&self, a: &ShardAssignment, revision: Option<u64>) -> Result<u64> {
        let key = names::shard_key(a.shard);
        match revision {
            None => self
                .buckets
                .shards
                .create(&key, to_bytes(a))
                .await
                .map_err(|e| match e.kind() {
                    kv::CreateErrorKind::AlreadyExists => Error::Conflict { what: "shard map" },
                    _ => nats("write shard map")(e),
                }),
            Some(rev) => self
                .buckets
                .shards
                .update(&key, to_bytes(a), rev)
                .await
                .map_err(|e| match e.kind() {
                    kv::UpdateErrorKind::WrongLastRevision => Error::Conflict { what: "shard map" },
                    _ => nats("write shard map")(e),
                }),
        }
    }

    /// A watch over the shard map: the current value of every key, then every change.
    pub async fn watch_shard_map(&self) -> Result<kv::Watch> {
        self.buckets
            .shards
            .watch_with_history("shard.*")
            .await
            .map_err(nats("watch shard map"))
    }

    /// A watch over the node registry: the current entry of every node, then every heartbeat and
    /// removal.
    pub async fn watch_nodes(&self) -> Result<kv::Watch> {
        self.buckets
            .nodes
            .watch_with_history(">")
            .await
            .map_err(nats("watch nodes"))
    }

    pub async fn heartbeat_node(&self, info: &NodeInfo) -> Result<()> {
        self.buckets
            .nodes
            .put(&info.node_id, to_bytes(info))
            .await
            .map_err(nats("node heartbeat"))?;
        Ok(())
    }

    /// Nodes whose heartbeat has not expired.
    pub async fn live_nodes(&self) -> Result<Vec<NodeInfo>> {
        all_json(&self.buckets.nodes, "list nodes").await
    }

    pub async fn heartbeat_worker(&self, info: &WorkerInfo) -> Result<()> {
        self.buckets
            .workers
            .put(&info.worker_id, to_bytes(info))
            .await
            .map_err(nats("worker heartbeat"))?;
        Ok(())
    }

    pub async fn live_workers(&self) -> Result<Vec<WorkerInfo>> {
        all_json(&self.buckets.workers, "list workers").await
    }

    /// Removes a node or worker from the registry at once (clean shutdown).
    pub async fn forget_node(&self, node_id: &str) -> Result<()> {
        self.buckets
            .nodes
            .purge(node_id)
            .await
            .map_err(nats("remove node"))
    }

    pub async fn forget_worker(&self, worker_id: &str) -> Result<()> {
        self.buckets
            .workers
            .purge(worker_id)
            .await
            .map_err(nats("remove worker"))
    }

    /// The job index of a cluster with `JobIds::Indexed`.
    async fn job_index(&self) -> Result<&Store> {
        self.buckets
            .job_index
            .get_or_try_init(|| {
                ensure_bucket(&self.js, bucket(names::JOB_INDEX_BUCKET, 1, Duration::ZERO))
            })
            .await
    }

    /// Records which tenant a job belongs to, so a job is found from its id alone (clusters
    /// with `JobIds::Indexed`).
    pub async fn index_job(&self, job_id: &str, tenant: &str) -> Result<()> {
        self.job_index()
            .await?
            .put(job_id, Bytes::copy_from_slice(tenant.as_bytes()))
            .await
            .map_err(nats("index job"))?;
        Ok(())
    }

    /// The tenant of a job, if the job was ever created.
    pub async fn job_tenant(&self, job_id: &str) -> Result<Option<String>> {
        let v = self
            .job_index()
            .await?
            .get(job_id)
            .await
            .map_err(nats("read job index"))?;
        Ok(v.map(|b| String::from_utf8_lossy(&b).into_owned()))
    }
}

/// A file-backed KV bucket's config; `max_age` zero keeps entries for ever.
fn bucket(name: &str, history: i64, max_age: Duration) -> kv::Config {
    kv::Config {
        bucket: name.to_string(),
        history,
        max_age,
        storage: StorageType::File,
        ..Default::default()
    }
}

async fn ensure_bucket(js: &Context, config: kv::Config) -> Result<Store> {
    match js.get_key_value(&config.bucket).await {
        Ok(store) => Ok(store),
        Err(_) => js
            .create_key_value(config)
            .await
            .map_err(nats("create KV bucket")),
    }
}

fn to_bytes<T: Serialize>(v: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(v).expect("cluster state serialises"))
}

async fn get_json<T: DeserializeOwned>(
    kv: &Store,
    key: &str,
    what: &'static str,
) -> Result<Option<T>> {
    kv.get(key)
        .await
        .map_err(nats(what))?
        .map(|b| decode(&b, what))
        .transpose()
}

async fn all_json<T: DeserializeOwned>(kv: &Store, what: &'static str) -> Result<Vec<T>> {
    latest(kv, what)
        .await?
        .iter()
        .map(|(_, value, _)| decode(value, what))
        .collect()
}

fn decode<T: DeserializeOwned>(value: &[u8], what: &'static str) -> Result<T> {
    serde_json::from_slice(value).map_err(|source| Error::Decode { what, source })
}

/// Longest wait for a bucket's current values (`latest`).
const READ_ALL_WITHIN: Duration = Duration::from_secs(10);
/// Messages asked for per fetch of `latest`.
const READ_ALL_FETCH: usize = 1024;

/// Every key of a bucket that holds a value, with the value and its revision, sorted by key.
///
/// Listing the keys (`Store::keys`) and then reading each was one request per key: at 1,024
/// shards, the control plane's assignment loop sent over a thousand requests every second. Here
/// a pull consumer delivers the last message of each key, values included, in stream order; a
/// later message of a key replaces an earlier one and a delete, purge or expiry marker removes
/// it, so a change made while the read runs is seen as the last word. Fetches that do not wait
/// (`no_wait`) end the read once one brings nothing: an entry that expires before it is
/// delivered cannot leave the read waiting for it (the hang async-nats fixed in its own
/// `keys()`). The consumer is deleted afterwards; one left by a failed read goes after 5 s idle.
async fn latest(kv: &Store, what: &'static str) -> Result<Vec<(String, Bytes, u64)>> {
    let consumer = kv
        .stream
        .create_consumer(jetstream::consumer::pull::Config {
            filter_subject: format!("{}>", kv.prefix),
            deliver_policy: jetstream::consumer::DeliverPolicy::LastPerSubject,
            ack_policy: jetstream::consumer::AckPolicy::None,
            inactive_threshold: Duration::from_secs(5),
            memory_storage: true,
            ..Default::default()
        })
        .await
        .map_err(nats(what))?;
    let read = async {
        let mut keys: std::collections::BTreeMap<String, (Bytes, u64)> = Default::default();
        loop {
            let mut batch = consumer
                .fetch()
                .max_messages(READ_ALL_FETCH)
                .messages()
                .await
                .map_err(nats(what))?;
            let mut got = 0;
            while let Some(m) = batch
                .try_next()
                .await
                .map_err(|e| Error::Nats { what, source: e })?
            {
                got += 1;
                let revision = m
                    .info()
                    .map_err(|e| Error::Nats {
                        what,
                        source: e.to_string().into(),
                    })?
                    .stream_sequence;
                let Some(key) = m.subject.strip_prefix(kv.prefix.as_str()) else {
                    continue;
                };
                if is_put(&m) {
                    keys.insert(key.to_string(), (m.payload.clone(), revision));
                } else {
                    keys.remove(key);
                }
            }
            if got == 0 {
                return Ok(keys);
            }
        }
    };
    let keys = tokio::time::timeout(READ_ALL_WITHIN, read).await;
    let _ = kv
        .stream
        .delete_consumer(&consumer.cached_info().name)
        .await;
    Ok(keys
        .map_err(nats(what))??
        .into_iter()
        .map(|(key, (value, revision))| (key, value, revision))
        .collect())
}

/// A KV message that sets a value, not a delete, purge or expiry marker.
fn is_put(m: &jetstream::Message) -> bool {
    let Some(headers) = m.headers.as_ref() else {
        return true;
    };
    match headers.get("KV-Operation") {
        Some(op) => op.as_str() == "PUT",
        None => headers.get("Nats-Marker-Reason").is_none(),
    }
}
