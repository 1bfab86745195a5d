//! What a shard tells about its load besides its wheel, every `COUNT_EVERY`: the ticket attempts
//! it has in flight, counted per queue into `chronoshard_attempts_open` (where the node's
//! heartbeat reads them back for the assignment strategy); those of them that wait on a queue no
//! live worker serves, into `chronoshard_tickets_unserved` with a log line when a queue starts or
//! stops being one; and its database connections in use and idle. It only reads the store.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use chronoshard_telemetry::metrics;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{served::Served, store::Store};

/// How often the open attempts are counted. The count walks the partial index of unfinished
/// attempts, so it costs what is in flight, not what the shard has ever run.
const COUNT_EVERY: Duration = Duration::from_secs(1);

/// Counts until `stop`; the gauges read 0 once the shard has closed.
pub(super) fn start(store: Store, served: Arc<Served>, stop: CancellationToken) -> JoinHandle<()> {
    let shard = store.shard().to_string();
    let open = metrics::ATTEMPTS_OPEN_GAUGE.with_label_values(&[&shard]);
    let unserved = metrics::TICKETS_UNSERVED_GAUGE.with_label_values(&[&shard]);
    let used = metrics::DB_CONNECTIONS_GAUGE.with_label_values(&[&shard, "used"]);
    let idle = metrics::DB_CONNECTIONS_GAUGE.with_label_values(&[&shard, "idle"]);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(COUNT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Queues this shard has said have tickets and no worker.
        let mut warned = BTreeSet::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            let (in_use, free) = store.connections();
            used.set(in_use.into());
            idle.set(free.into());
            let by_queue = match store.open_attempts_by_queue().await {
                Ok(counts) => counts,
                // A closed or fenced store: the shard is stopping, and says why itself.
                Err(e) => {
                    debug!(error = %e, "counting open attempts failed");
                    continue;
                }
            };
            open.set(by_queue.iter().map(|(_, n)| *n as i64).sum());
            let mut waiting = 0;
            let mut now_unserved = BTreeSet::new();
            for (queue, n) in by_queue {
                if served.unserved(&queue).await {
                    waiting += n as i64;
                    if !warned.contains(&queue) {
                        warn!(%shard, %queue, tickets = n, "tickets wait on a queue that no live worker serves");
                    }
                    now_unserved.insert(queue);
                }
            }
            for queue in warned.difference(&now_unserved) {
                info!(%shard, %queue, "the queue's tickets are no longer waiting without a worker");
            }
            warned = now_unserved;
            unserved.set(waiting);
        }
        for gauge in [&open, &unserved, &used, &idle] {
            gauge.set(0);
        }
    })
}
