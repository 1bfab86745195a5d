//! Following the live settings: a task that keeps a `watch` channel at the settings entry's
//! latest value, so a component reads the current settings without a request and wakes when they
//! change.

use std::time::Duration;

use async_nats::jetstream::kv;
use chronoshard_wire::settings::{Settings, VersionedSettings};
use futures::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{read::decode, Cluster};

impl Cluster {
    /// A channel that holds the cluster's settings and every change to them until `stop`.
    /// Until an entry is read it holds `fallback` as version 0 (a node that starts before any
    /// control plane has written settings runs with the defaults meanwhile).
    pub fn follow_settings(
        &self,
        fallback: Settings,
        stop: CancellationToken,
    ) -> watch::Receiver<VersionedSettings> {
        let (tx, rx) = watch::channel(VersionedSettings {
            version: 0,
            settings: fallback,
            updated_at: chrono::Utc::now(),
        });
        let cluster = self.clone();
        tokio::spawn(async move {
            loop {
                let watch = tokio::select! {
                    _ = stop.cancelled() => return,
                    w = cluster.watch_settings() => w,
                };
                match watch {
                    Ok(w) => {
                        if follow(w, &tx, &stop).await {
                            return;
                        }
                    }
                    Err(e) => warn!(error = %e, "cannot watch the settings; retrying"),
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
async fn follow(
    mut w: kv::Watch,
    tx: &watch::Sender<VersionedSettings>,
    stop: &CancellationToken,
) -> bool {
    loop {
        let entry = tokio::select! {
            _ = stop.cancelled() => return true,
            e = w.next() => e,
        };
        match entry {
            Some(Ok(e)) if e.operation == kv::Operation::Put => {
                match decode::<VersionedSettings>(&e.value, "settings") {
                    // Versions only go up: a replayed older entry changes nothing.
                    Ok(s) if s.version > tx.borrow().version => {
                        info!(version = s.version, "settings applied");
                        tx.send_replace(s);
                    }
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "settings entry unreadable; keeping the last one"),
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => warn!(error = %e, "settings watch error"),
            None => return false,
        }
    }
}
