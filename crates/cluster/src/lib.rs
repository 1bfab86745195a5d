//! The JetStream topology every process relies on (streams, KV buckets) and typed access to the
//! cluster state kept in KV: the cluster config and live settings, the shard map, drains, node,
//! worker and control-plane heartbeats, the leader lease and the job index.
//!
//! The control plane creates the topology (`Cluster::create`, with the replica count operators
//! chose); every other role opens it (`Cluster::connect`) and waits for a control plane when it
//! is not there yet, so no node or worker can create a stream with the wrong replica count. This
//! crate must not decide anything (who owns a shard, who leads, is the control plane's decision):
//! it reads and writes state and nothing else. `local` is the one piece that is not in KV: the map
//! of shards served in this process (see its doc).

mod follow;
mod lease;
mod live_queues;
mod local;
mod read;
mod registry;
mod shard_map;
#[cfg(test)]
mod tests;
mod tokens;

use std::{sync::Arc, time::Duration};

use async_nats::jetstream::{
    self,
    kv::{self, Store},
    stream::{self, DiscardPolicy, RetentionPolicy, StorageType},
    Context,
};
use chronoshard_wire::names;
use tracing::{info, warn};

pub use lease::{LeaseEntry, LeaseWatch};
pub use live_queues::LiveQueues;
pub use local::{LocalCall, LocalShards, Registration};

/// How long a worker stays listed after its last heartbeat.
pub const HEARTBEAT_TTL: Duration = Duration::from_secs(6);
/// How often workers send a heartbeat (shard nodes follow the cluster settings instead).
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// How long a shard node's or control plane's entry stays in its registry after its last
/// heartbeat: long enough past any heartbeat TTL the settings allow for the API to show a lost
/// node as lost before it disappears. Liveness itself is decided by the settings' TTL.
pub const REGISTRY_KEEP: Duration = Duration::from_secs(60);
/// Publish acks one connection may await at once (all shards of a node share a connection).
pub const MAX_ACKS_IN_FLIGHT: usize = 1 << 17;
/// Largest dispatch backlog the stream holds before publishes are refused (`discard: new`), so a
/// flood of due tickets slows the shard nodes instead of growing without bound.
pub const DISPATCH_MAX_BYTES: i64 = 1 << 30;
/// How often a role that opens the cluster checks whether a control plane has created it.
const WAIT_FOR_TOPOLOGY: Duration = Duration::from_millis(500);

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
    /// Opens both to `url` (one server, or several separated by commas: the servers of a NATS
    /// cluster), named `name` and `name membership` (as nats-server lists them).
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
    let servers = server_addrs(url)?;
    let label = name.clone();
    async_nats::ConnectOptions::new()
        .name(name)
        .event_callback(move |event| {
            note_event(&label, &event);
            std::future::ready(())
        })
        .connect(servers)
        .await
        .map_err(nats("connect"))
}

/// The servers of a NATS URL list: `nats://a:4222,nats://b:4222` (a client connects to one of them
/// and fails over to the others, and to those the cluster announces).
pub fn server_addrs(url: &str) -> Result<Vec<async_nats::ServerAddr>> {
    url.split(',')
        .map(|u| u.trim().parse::<async_nats::ServerAddr>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(nats("parse the NATS URL"))
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
    control: Store,
    /// Opened on first use: only clusters with `JobIds::Indexed` have one.
    job_index: tokio::sync::OnceCell<Store>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").finish_non_exhaustive()
    }
}

/// How the control plane lays the streams and buckets out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// Copies JetStream keeps of every stream and bucket: 1 on one server, 3 on a 3-node NATS
    /// cluster (a server may then die without losing or blocking anything). Streams and buckets
    /// created now get this many (1 when not given); existing ones are brought to it when given
    /// and left as they are when not, so a replica started without it changes nothing.
    pub replicas: Option<usize>,
}

impl Topology {
    fn count(&self) -> usize {
        self.replicas.unwrap_or(1)
    }

    fn streams(&self) -> [stream::Config; 2] {
        [
            stream::Config {
                name: names::DISPATCH_STREAM.into(),
                subjects: vec![names::DISPATCH_SUBJECTS.into()],
                retention: RetentionPolicy::WorkQueue,
                storage: StorageType::File,
                discard: DiscardPolicy::New,
                max_bytes: DISPATCH_MAX_BYTES,
                duplicate_window: Duration::from_secs(120),
                num_replicas: self.count(),
                ..Default::default()
            },
            stream::Config {
                name: names::RESULT_STREAM.into(),
                subjects: vec![names::RESULT_SUBJECTS.into()],
                retention: RetentionPolicy::WorkQueue,
                storage: StorageType::File,
                duplicate_window: Duration::from_secs(120),
                num_replicas: self.count(),
                ..Default::default()
            },
        ]
    }

    fn bucket(&self, name: &str, history: i64, max_age: Duration) -> kv::Config {
        kv::Config {
            bucket: name.to_string(),
            history,
            max_age,
            storage: StorageType::File,
            num_replicas: self.count(),
            ..Default::default()
        }
    }

    /// Nodes, shards, workers, control.
    fn buckets(&self) -> [kv::Config; 4] {
        [
            self.bucket(names::NODES_BUCKET, 1, REGISTRY_KEEP),
            self.bucket(names::SHARDS_BUCKET, 5, Duration::ZERO),
            self.bucket(names::WORKERS_BUCKET, 1, HEARTBEAT_TTL),
            self.bucket(names::CONTROL_BUCKET, 1, REGISTRY_KEEP),
        ]
    }
}

/// A JetStream context whose publishes never wait for another's ack permit.
fn context(client: async_nats::Client) -> Context {
    // Publishers bound their own windows; the context must never make a publish wait for an
    // ack permit another shard's dispatcher holds (that can deadlock), so a full context is
    // an error the dispatcher retries, and the limit is far above the sum of the windows.
    jetstream::ContextBuilder::new()
        .backpressure_on_inflight(false)
        .max_ack_inflight(MAX_ACKS_IN_FLIGHT)
        .ack_timeout(Duration::from_secs(10))
        .build(client)
}

impl Cluster {
    /// Creates the streams and buckets that do not exist yet, with `topology`'s replica count,
    /// brings existing ones to it, and returns handles on them. The control plane's call.
    pub async fn create(client: async_nats::Client, topology: &Topology) -> Result<Cluster> {
        let js = context(client.clone());
        for config in topology.streams() {
            ensure_stream(&js, config, topology).await?;
        }
        let [nodes, shards, workers, control] = topology.buckets();
        let buckets = Buckets {
            nodes: ensure_bucket(&js, nodes, topology).await?,
            shards: ensure_bucket(&js, shards, topology).await?,
            workers: ensure_bucket(&js, workers, topology).await?,
            control: ensure_bucket(&js, control, topology).await?,
            job_index: tokio::sync::OnceCell::new(),
        };
        Ok(Cluster {
            buckets: Arc::new(buckets),
            js,
            client,
        })
    }

    /// The cluster config, if a control plane has created the cluster; reads only, creates and
    /// changes nothing (a replica checks its creation settings with this before it touches the
    /// topology).
    pub async fn existing_config(
        client: async_nats::Client,
    ) -> Result<Option<chronoshard_wire::rpc::ClusterConfig>> {
        let js = context(client);
        let Ok(shards) = js.get_key_value(names::SHARDS_BUCKET).await else {
            return Ok(None);
        };
        read::get_json(&shards, names::CLUSTER_CONFIG_KEY, "read cluster config").await
    }

    /// Opens the streams and buckets a control plane created, waiting (and saying so once) while
    /// there are none yet. Shard nodes and workers call this.
    pub async fn connect(client: async_nats::Client) -> Result<Cluster> {
        let js = context(client.clone());
        let mut said = false;
        loop {
            match Cluster::open(&js).await {
                Ok(buckets) => {
                    if said {
                        info!("the cluster state is there now");
                    }
                    return Ok(Cluster {
                        buckets: Arc::new(buckets),
                        js,
                        client,
                    });
                }
                Err(Missing::Not(e)) => return Err(e),
                Err(Missing::Yet(what)) => {
                    if !said {
                        info!(
                            missing = what,
                            "waiting for a control plane to create the cluster state"
                        );
                        said = true;
                    }
                    tokio::time::sleep(WAIT_FOR_TOPOLOGY).await;
                }
            }
        }
    }

    async fn open(js: &Context) -> Result<Buckets, Missing> {
        for name in [names::DISPATCH_STREAM, names::RESULT_STREAM] {
            stream_exists(js, name, name).await?;
        }
        let open = |name: &'static str| async move {
            stream_exists(js, &format!("KV_{name}"), name).await?;
            js.get_key_value(name)
                .await
                .map_err(|e| Missing::Not(nats("open a KV bucket")(e)))
        };
        Ok(Buckets {
            nodes: open(names::NODES_BUCKET).await?,
            shards: open(names::SHARDS_BUCKET).await?,
            workers: open(names::WORKERS_BUCKET).await?,
            control: open(names::CONTROL_BUCKET).await?,
            job_index: tokio::sync::OnceCell::new(),
        })
    }
}

/// Whether the stream `name` (`what` to a reader) is there: `Missing::Yet` when JetStream says
/// it is not, `Missing::Not` for any other failure (no JetStream, no connection).
async fn stream_exists(js: &Context, name: &str, what: &'static str) -> Result<(), Missing> {
    match js.get_stream(name).await {
        Ok(_) => Ok(()),
        Err(e) => match e.kind() {
            jetstream::context::GetStreamErrorKind::JetStream(j) if j.code() == 404 => {
                Err(Missing::Yet(what))
            }
            _ => Err(Missing::Not(nats("open the cluster state")(e))),
        },
    }
}

/// Why the topology could not be opened.
enum Missing {
    /// A control plane has not created this yet.
    Yet(&'static str),
    Not(Error),
}

/// Creates a stream, or brings an existing one to its max age (and the replica count, when the
/// topology gives one).
async fn ensure_stream(js: &Context, config: stream::Config, t: &Topology) -> Result<()> {
    match js.get_stream(&config.name).await {
        Ok(_) => align(js, &config.name, t.replicas, config.max_age).await,
        Err(_) => {
            js.create_stream(config)
                .await
                .map_err(nats("create a stream"))?;
            Ok(())
        }
    }
}

/// Brings the stream `name` (a bucket is the stream `KV_<bucket>`) to `max_age`, and to
/// `replicas` copies if given; JetStream moves the data itself.
async fn align(js: &Context, name: &str, replicas: Option<usize>, max_age: Duration) -> Result<()> {
    let mut existing = js.get_stream(name).await.map_err(nats("read a stream"))?;
    let have = existing
        .info()
        .await
        .map_err(nats("read a stream"))?
        .config
        .clone();
    let replicas = replicas.unwrap_or(have.num_replicas);
    if have.num_replicas == replicas && have.max_age == max_age {
        return Ok(());
    }
    warn!(
        stream = %name,
        replicas = have.num_replicas,
        wanted = replicas,
        "changing the stream's replica count or max age"
    );
    js.update_stream(stream::Config {
        num_replicas: replicas,
        max_age,
        ..have
    })
    .await
    .map_err(nats("update a stream"))?;
    Ok(())
}

async fn ensure_bucket(js: &Context, config: kv::Config, t: &Topology) -> Result<Store> {
    match js.get_key_value(&config.bucket).await {
        Ok(store) => {
            let stream = format!("KV_{}", config.bucket);
            align(js, &stream, t.replicas, config.max_age).await?;
            Ok(store)
        }
        Err(_) => js
            .create_key_value(config)
            .await
            .map_err(nats("create a KV bucket")),
    }
}
