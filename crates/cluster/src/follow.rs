//! Following a versioned entry of the cluster state (the live settings, the active strategy): a
//! task that keeps a `watch` channel at the entry's latest value, so a component reads the
//! current value without a request and wakes when it changes.

use std::time::Duration;

use async_nats::jetstream::kv;
use chronoshard_wire::{
    names,
    rpc::ClusterConfig,
    settings::{Settings, VersionedSettings},
    strategy::VersionedStrategy,
};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{nats, read::decode, Cluster, Result};

/// An entry whose version only goes up.
trait Versioned: DeserializeOwned + Send + Sync + 'static {
    /// What the entry is, for errors and logs.
    const WHAT: &'static str;
    fn version(&self) -> u64;
    /// Logs that this value is now the one in force.
    fn applied(&self);
    /// Whether this is a stand-in for an entry not read yet, which any entry read replaces
    /// whatever its version.
    fn unread(&self) -> bool {
        false
    }
}

impl Versioned for VersionedSettings {
    const WHAT: &'static str = "settings";

    fn version(&self) -> u64 {
        self.version
    }

    fn applied(&self) {
        info!(version = self.version, "settings applied");
    }
}

impl Versioned for VersionedStrategy {
    const WHAT: &'static str = "strategy";

    fn version(&self) -> u64 {
        self.version
    }

    fn applied(&self) {
        info!(version = self.version, strategy = %self.name, "strategy applied");
    }
}

impl Versioned for ClusterConfig {
    const WHAT: &'static str = "cluster config";

    fn version(&self) -> u64 {
        self.version
    }

    fn applied(&self) {
        tracing::debug!(
            version = self.version,
            shards = self.shard_count,
            "cluster config applied"
        );
    }

    /// A cluster has shards; a config of none stands for one not read yet (a cluster of an
    /// early version has version 0, so a version cannot say it).
    fn unread(&self) -> bool {
        self.shard_count == 0
    }
}

impl Cluster {
    /// A channel that holds the cluster config and every change to it (shards added, tenants
    /// moved) until `stop`, starting from `current` (one of no shards until it is read).
    pub fn follow_config(
        &self,
        current: ClusterConfig,
        stop: CancellationToken,
    ) -> watch::Receiver<ClusterConfig> {
        self.follow(names::CLUSTER_CONFIG_KEY, current, stop)
    }

    /// A channel that holds the cluster's settings and every change to them until `stop`.
    /// Until an entry is read it holds `fallback` as version 0 (a node that starts before any
    /// control plane has written settings runs with the defaults meanwhile).
    pub fn follow_settings(
        &self,
        fallback: Settings,
        stop: CancellationToken,
    ) -> watch::Receiver<VersionedSettings> {
        let initial = VersionedSettings {
            version: 0,
            settings: fallback,
            updated_at: chrono::Utc::now(),
        };
        self.follow(names::SETTINGS_KEY, initial, stop)
    }

    /// A channel that holds the cluster's active strategy and every change to it until `stop`;
    /// `balanced` with an empty config, as version 0, until the entry is read.
    pub fn follow_strategy(&self, stop: CancellationToken) -> watch::Receiver<VersionedStrategy> {
        self.follow(names::STRATEGY_KEY, VersionedStrategy::default_at(0), stop)
    }

    /// A watch over one key of the shard bucket: its current value, then every change.
    pub(crate) async fn watch_key(&self, key: &str, what: &'static str) -> Result<kv::Watch> {
        self.buckets
            .shards
            .watch_with_history(key)
            .await
            .map_err(nats(what))
    }

    fn follow<T: Versioned>(
        &self,
        key: &'static str,
        initial: T,
        stop: CancellationToken,
    ) -> watch::Receiver<T> {
        let (tx, rx) = watch::channel(initial);
        let cluster = self.clone();
        tokio::spawn(async move {
            loop {
                let watch = tokio::select! {
                    _ = stop.cancelled() => return,
                    w = cluster.watch_key(key, T::WHAT) => w,
                };
                match watch {
                    Ok(w) => {
                        if apply(w, &tx, &stop).await {
                            return;
                        }
                    }
                    Err(e) => {
                        warn!(entry = T::WHAT, error = %e, "cannot watch a cluster entry; retrying")
                    }
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        });
        rx
    }
}

/// Applies the watch's entries until it ends (false) or `stop` (true).
async fn apply<T: Versioned>(
    mut w: kv::Watch,
    tx: &watch::Sender<T>,
    stop: &CancellationToken,
) -> bool {
    loop {
        let entry = tokio::select! {
            _ = stop.cancelled() => return true,
            e = w.next() => e,
        };
        match entry {
            Some(Ok(e)) if e.operation == kv::Operation::Put => {
                match decode::<T>(&e.value, T::WHAT) {
                    // Versions only go up: a replayed older entry changes nothing.
                    Ok(v) if v.version() > tx.borrow().version() || tx.borrow().unread() => {
                        v.applied();
                        tx.send_replace(v);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        warn!(entry = T::WHAT, error = %e, "cluster entry unreadable; keeping the last one")
                    }
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => warn!(entry = T::WHAT, error = %e, "cluster entry watch error"),
            None => return false,
        }
    }
}
