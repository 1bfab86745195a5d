//! The active strategy on this replica: follows the cluster's strategy entry and keeps the
//! strategy it names loaded from this replica's own plugin directory, so whichever replica leads
//! next can call it at once. Loading happens here, off the assignment loop, so a library that is
//! slow to load, or missing on this replica, never holds a pass up (the loop uses its fallback
//! meanwhile). It writes no cluster state and decides nothing.

use std::time::Duration;

use chronoshard_wire::strategy::VersionedStrategy;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::strategy::Registry;

/// How long to wait before trying again to load an active strategy that could not be loaded
/// (its file may be copied in meanwhile).
pub const RETRY_LOAD: Duration = Duration::from_secs(10);

/// Loads the active strategy whenever the entry names one this replica does not have, until
/// `stop`; a failure is logged once per name and error (and recorded as the strategy's last
/// error), and tried again after `retry` ([`RETRY_LOAD`] in a control plane).
pub async fn keep_loaded(
    registry: Registry,
    mut active: watch::Receiver<VersionedStrategy>,
    retry: Duration,
    stop: CancellationToken,
) {
    let mut said: Option<(String, String)> = None;
    loop {
        let name = active.borrow_and_update().name.clone();
        let loaded = match registry.ensure(&name).await {
            Ok(_) => {
                if said.take().is_some() {
                    info!(strategy = %name, "active strategy loaded");
                }
                true
            }
            Err(e) => {
                let now = Some((name.clone(), e.to_string()));
                if said != now {
                    warn!(
                        strategy = %name,
                        error = %e,
                        "cannot load the active strategy on this replica; while it leads, \
                         the built-in fallback places shards"
                    );
                    said = now;
                }
                false
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = active.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(retry), if !loaded => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::{self, tests as plugins};

    /// Polls `check` until it holds (a poll interval, not synchronisation), for up to 10 s.
    async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
        let polled = async {
            loop {
                if let Some(v) = check() {
                    return v;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), polled)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }

    /// A replica told to use a plugin it cannot load yet records why, tries again, and has it
    /// once the file is there; a change of the entry is followed at once.
    #[tokio::test]
    async fn the_active_plugin_is_loaded_once_its_file_is_there() {
        let dir = plugins::plugin_dir(&[]);
        let registry = plugins::registry(&dir, plugins::GENEROUS);
        let (tx, rx) = watch::channel(VersionedStrategy::default_at(1));
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep_loaded(
            registry.clone(),
            rx,
            Duration::from_millis(50),
            stop.clone(),
        ));
        tx.send_modify(|s| {
            s.version = 2;
            s.name = "faulty".into();
        });
        eventually("the failed load to be recorded", || {
            (registry.last_error("faulty")?.reason == "load").then_some(())
        })
        .await;
        assert!(registry.info("faulty").is_none());
        let file = dir.path().join(strategy::plugin_file_name("faulty"));
        std::fs::copy(plugins::library("chronoshard-test-plugin-faulty"), file).unwrap();
        eventually("the plugin to be loaded on a retry", || {
            registry.info("faulty")
        })
        .await;
        stop.cancel();
        task.await.unwrap();
    }
}
