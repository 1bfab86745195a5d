//! The shard bucket: the cluster config, the live settings, the active strategy, the shard map
//! and the drain marks.

use async_nats::jetstream::kv;
use chronoshard_wire::{
    names,
    rpc::{ClusterConfig, ShardAssignment},
    settings::{Settings, VersionedSettings},
    strategy::VersionedStrategy,
};

use crate::{
    nats,
    read::{decode, get_json, latest, to_bytes},
    Cluster, Error, Result,
};

impl Cluster {
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

    /// The cluster config with the KV revision of its entry.
    pub async fn config_entry(&self) -> Result<Option<(ClusterConfig, u64)>> {
        self.versioned(
            names::CLUSTER_CONFIG_KEY,
            "read cluster config",
            "cluster config",
        )
        .await
    }

    /// Replaces the cluster config if its entry is still at `revision` (`Error::Conflict`
    /// otherwise); the caller raises its version.
    pub async fn put_config(&self, c: &ClusterConfig, revision: u64) -> Result<u64> {
        self.update(
            names::CLUSTER_CONFIG_KEY,
            c,
            revision,
            "cluster config",
            "write cluster config",
        )
        .await
    }

    /// The live settings with the KV revision of their entry, if a control plane wrote them.
    pub async fn settings(&self) -> Result<Option<(VersionedSettings, u64)>> {
        self.versioned(names::SETTINGS_KEY, "read settings", "settings")
            .await
    }

    /// Writes `initial` as version 1 unless settings exist; returns the settings in force.
    pub async fn init_settings(&self, initial: Settings) -> Result<VersionedSettings> {
        let first = VersionedSettings {
            version: 1,
            settings: initial,
            updated_at: chrono::Utc::now(),
        };
        if self
            .create_once(names::SETTINGS_KEY, &first, "write settings")
            .await?
        {
            return Ok(first);
        }
        Ok(self.settings().await?.map(|(s, _)| s).unwrap_or(first))
    }

    /// Replaces the settings if their entry is still at `revision`.
    pub async fn put_settings(&self, s: &VersionedSettings, revision: u64) -> Result<u64> {
        self.update(
            names::SETTINGS_KEY,
            s,
            revision,
            "settings",
            "write settings",
        )
        .await
    }

    /// A watch over the settings: their current value, then every change.
    pub async fn watch_settings(&self) -> Result<kv::Watch> {
        self.watch_key(names::SETTINGS_KEY, "watch settings").await
    }

    /// The active assignment strategy with the KV revision of its entry, if a control plane
    /// wrote it.
    pub async fn strategy(&self) -> Result<Option<(VersionedStrategy, u64)>> {
        self.versioned(names::STRATEGY_KEY, "read the strategy", "strategy")
            .await
    }

    /// Writes `balanced` with an empty config as version 1 unless a strategy entry exists (a
    /// cluster created before strategies were kept in KV gets it from its next control plane);
    /// returns the entry in force.
    pub async fn init_strategy(&self) -> Result<VersionedStrategy> {
        let first = VersionedStrategy::default_at(1);
        if self
            .create_once(names::STRATEGY_KEY, &first, "write the strategy")
            .await?
        {
            return Ok(first);
        }
        Ok(self.strategy().await?.map(|(s, _)| s).unwrap_or(first))
    }

    /// Replaces the active strategy if its entry is still at `revision`.
    pub async fn put_strategy(&self, s: &VersionedStrategy, revision: u64) -> Result<u64> {
        self.update(
            names::STRATEGY_KEY,
            s,
            revision,
            "strategy",
            "write the strategy",
        )
        .await
    }

    /// A key's value with its revision, if it holds one.
    async fn versioned<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
        reading: &'static str,
        what: &'static str,
    ) -> Result<Option<(T, u64)>> {
        match self
            .buckets
            .shards
            .entry(key)
            .await
            .map_err(nats(reading))?
        {
            Some(e) if e.operation == kv::Operation::Put => {
                Ok(Some((decode(&e.value, what)?, e.revision)))
            }
            _ => Ok(None),
        }
    }

    /// Writes `value` unless the key exists; whether it wrote it.
    async fn create_once<T: serde::Serialize>(
        &self,
        key: &str,
        value: &T,
        writing: &'static str,
    ) -> Result<bool> {
        match self.buckets.shards.create(key, to_bytes(value)).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(nats(writing)(e)),
        }
    }

    /// Replaces a key's value if it is still at `revision`.
    async fn update<T: serde::Serialize>(
        &self,
        key: &str,
        value: &T,
        revision: u64,
        what: &'static str,
        writing: &'static str,
    ) -> Result<u64> {
        self.buckets
            .shards
            .update(key, to_bytes(value), revision)
            .await
            .map_err(|e| match e.kind() {
                kv::UpdateErrorKind::WrongLastRevision => Error::Conflict { what },
                _ => nats(writing)(e),
            })
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
        let conflict = || Error::Conflict { what: "shard map" };
        match revision {
            None => self
                .buckets
                .shards
                .create(&key, to_bytes(a))
                .await
                .map_err(|e| match e.kind() {
                    kv::CreateErrorKind::AlreadyExists => conflict(),
                    _ => nats("write shard map")(e),
                }),
            Some(rev) => self
                .buckets
                .shards
                .update(&key, to_bytes(a), rev)
                .await
                .map_err(|e| match e.kind() {
                    kv::UpdateErrorKind::WrongLastRevision => conflict(),
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

    /// Marks a node as draining (its shards move away and it takes none).
    pub async fn drain(&self, node_id: &str) -> Result<()> {
        let at = to_bytes(&chrono::Utc::now());
        self.buckets
            .shards
            .put(names::drain_key(node_id), at)
            .await
            .map_err(nats("mark a drain"))?;
        Ok(())
    }

    /// Returns a node to service.
    pub async fn undrain(&self, node_id: &str) -> Result<()> {
        self.buckets
            .shards
            .purge(names::drain_key(node_id))
            .await
            .map_err(nats("clear a drain"))
    }

    /// The nodes marked as draining, with the time each drain was asked for.
    pub async fn drains(&self) -> Result<Vec<(String, chrono::DateTime<chrono::Utc>)>> {
        let mut out = Vec::new();
        for (key, value, _) in latest(&self.buckets.shards, "read drains").await? {
            if let Some(node) = key.strip_prefix("drain.") {
                out.push((node.to_string(), decode(&value, "drain")?));
            }
        }
        Ok(out)
    }
}
