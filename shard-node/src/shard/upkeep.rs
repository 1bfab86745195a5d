//! What a shard tells about its load besides its wheel, every `COUNT_EVERY`: the ticket attempts
//! it has in flight, counted per queue into `chronoshard_attempts_open` (where the node's
//! heartbeat reads them back for the assignment strategy); those of them that wait on a queue no
//! live worker serves, into `chronoshard_tickets_unserved` with a log line when a queue starts or
//! stops being one; and its database connections in use and idle. It only reads the store.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use chronoshard_telemetry::metrics;
use prometheus::IntGauge;
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
    let connections = Connections::of(&shard);
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
            connections.sample(&store);
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
        for gauge in [&open, &unserved, &connections.used, &connections.idle] {
            gauge.set(0);
        }
    })
}

/// The gauges of a shard's database connections.
struct Connections {
    used: IntGauge,
    idle: IntGauge,
}

impl Connections {
    fn of(shard: &str) -> Connections {
        let gauge = |state| metrics::DB_CONNECTIONS_GAUGE.with_label_values(&[shard, state]);
        Connections {
            used: gauge("used"),
            idle: gauge("idle"),
        }
    }

    /// Reads the pool now: a connection counts as used while a statement or transaction holds it.
    fn sample(&self, store: &Store) {
        let (used, idle) = store.connections();
        self.used.set(used.into());
        self.idle.set(idle.into());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Databases;

    /// A connection held shows as used, and as idle again once given back to the pool.
    #[tokio::test]
    async fn the_connection_gauges_follow_a_connection_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let dbs = Databases::Sqlite(dir.path().to_path_buf());
        let store = Store::open(&dbs, 9_001, 1, "node-a", 0).await.unwrap();
        let gauges = Connections::of("9001");
        let read = |state| {
            metrics::DB_CONNECTIONS_GAUGE
                .with_label_values(&["9001", state])
                .get()
        };
        let held = store.hold_connection().await;
        gauges.sample(&store);
        assert!(read("used") >= 1, "used {}", read("used"));
        drop(held);
        // The pool takes a dropped connection back on a task of its own.
        chronoshard_test_util::wait_for(
            "the connection to be idle",
            Duration::from_secs(10),
            || async {
                gauges.sample(&store);
                (read("used") == 0 && read("idle") >= 1).then_some(())
            },
        )
        .await
        .unwrap();
    }
}
