//! Heartbeat registries: shard nodes, workers and control-plane replicas, and the job index.

use std::time::Duration;

use async_nats::jetstream::kv::Store;
use bytes::Bytes;
use chronoshard_wire::{
    names,
    rpc::{NodeInfo, ReplicaInfo, WorkerInfo},
};

use crate::{
    nats,
    read::{all_json, decode, latest, to_bytes},
    Cluster, Result,
};

impl Cluster {
    /// Puts a node's heartbeat; returns the entry's revision.
    pub async fn heartbeat_node(&self, info: &NodeInfo) -> Result<u64> {
        self.buckets
            .nodes
            .put(&info.node_id, to_bytes(info))
            .await
            .map_err(nats("node heartbeat"))
    }

    /// A watch over the node registry: the current entry of every node, then every heartbeat and
    /// removal.
    pub async fn watch_nodes(&self) -> Result<async_nats::jetstream::kv::Watch> {
        self.buckets
            .nodes
            .watch_with_history(">")
            .await
            .map_err(nats("watch nodes"))
    }

    /// Every node in the registry: live ones and, for a minute after their last heartbeat, lost
    /// ones (whether a node is live is the settings' TTL's call, not this list's).
    pub async fn nodes(&self) -> Result<Vec<NodeInfo>> {
        all_json(&self.buckets.nodes, "list nodes").await
    }

    /// Removes a node from the registry at once (clean shutdown).
    pub async fn forget_node(&self, node_id: &str) -> Result<()> {
        self.buckets
            .nodes
            .purge(node_id)
            .await
            .map_err(nats("remove node"))
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

    pub async fn forget_worker(&self, worker_id: &str) -> Result<()> {
        self.buckets
            .workers
            .purge(worker_id)
            .await
            .map_err(nats("remove worker"))
    }

    /// Puts a control-plane replica's heartbeat.
    pub async fn heartbeat_replica(&self, info: &ReplicaInfo) -> Result<()> {
        self.buckets
            .control
            .put(names::replica_key(&info.id), to_bytes(info))
            .await
            .map_err(nats("replica heartbeat"))?;
        Ok(())
    }

    /// Every control-plane replica that put a heartbeat within the last minute.
    pub async fn replicas(&self) -> Result<Vec<ReplicaInfo>> {
        let mut out = Vec::new();
        for (key, value, _) in latest(&self.buckets.control, "list replicas").await? {
            if key.starts_with("replica.") {
                out.push(decode(&value, "replica")?);
            }
        }
        Ok(out)
    }

    pub async fn forget_replica(&self, id: &str) -> Result<()> {
        self.buckets
            .control
            .purge(names::replica_key(id))
            .await
            .map_err(nats("remove replica"))
    }

    /// The job index of a cluster with `JobIds::Indexed`.
    async fn job_index(&self) -> Result<&Store> {
        self.buckets
            .job_index
            .get_or_try_init(|| async {
                let topology = crate::Topology::default();
                let config = topology.bucket(names::JOB_INDEX_BUCKET, 1, Duration::ZERO);
                crate::ensure_bucket(&self.js, config, &topology).await
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

impl Cluster {
    /// Puts a clock probe for `id` (an entry of its own, so no heartbeat waits for it); returns
    /// its revision. With `probe_time`, a node measures its clock against the NATS server's.
    pub async fn clock_probe(&self, id: &str) -> Result<u64> {
        self.buckets
            .control
            .put(format!("clock.{id}"), Bytes::new())
            .await
            .map_err(nats("clock probe"))
    }

    /// When the NATS server stored revision `revision` of `id`'s clock probe, by its clock
    /// (None when the entry has moved on since).
    pub async fn probe_time(
        &self,
        id: &str,
        revision: u64,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
        let entry = self
            .buckets
            .control
            .entry(format!("clock.{id}"))
            .await
            .map_err(nats("read a clock probe"))?;
        Ok(entry.filter(|e| e.revision == revision).map(|e| {
            chrono::DateTime::from_timestamp_nanos(e.created.unix_timestamp_nanos() as i64)
        }))
    }
}
