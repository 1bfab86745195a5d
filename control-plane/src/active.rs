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
/// `stop`; a failure is logged once per name and error, and tried again every [`RETRY_LOAD`].
pub async fn keep_loaded(
    registry: Registry,
    mut active: watch::Receiver<VersionedStrategy>,
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
            _ = tokio::time::sleep(RETRY_LOAD), if !loaded => {}
        }
    }
}
