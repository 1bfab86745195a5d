//! What a shard tells about its load besides its wheel: the ticket attempts it has in flight,
//! counted every `COUNT_EVERY` into `chronoshard_attempts_open`, where the node's heartbeat reads
//! them back for the assignment strategy. It only reads the store.

use std::time::Duration;

use chronoshard_telemetry::metrics;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::store::Store;

/// How often the open attempts are counted. The count walks the partial index of unfinished
/// attempts, so it costs what is in flight, not what the shard has ever run.
const COUNT_EVERY: Duration = Duration::from_secs(1);

/// Counts until `stop`; the gauge reads 0 once the shard has closed.
pub(super) fn start(store: Store, stop: CancellationToken) -> JoinHandle<()> {
    let gauge = metrics::ATTEMPTS_OPEN_GAUGE.with_label_values(&[&store.shard().to_string()]);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(COUNT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            match store.open_attempts_count().await {
                Ok(n) => gauge.set(n as i64),
                // A closed or fenced store: the shard is stopping, and says why itself.
                Err(e) => debug!(error = %e, "counting open attempts failed"),
            }
        }
        gauge.set(0);
    })
}
