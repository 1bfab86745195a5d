//! A shard's upkeep beside its loop: it checkpoints an SQLite shard's WAL, and tells what the
//! shard carries besides its wheel. Every `COUNT_EVERY` it counts the ticket attempts in flight
//! per queue into `chronoshard_attempts_open` (where the node's heartbeat reads them back for the
//! assignment strategy); those of them that wait on a queue no live worker serves, into
//! `chronoshard_tickets_unserved` with a log line when a queue starts or stops being one; and its
//! database connections in use and idle. Besides the checkpoint it only reads the store.
//!
//! An idle shard costs one wake-up a second here and no trip to its database: the checkpoint and
//! the count both look at the WAL's stamp first (a commit changes it), and the checkpoints come
//! every `CHECKPOINT_EVERY` only while something is written.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use chronoshard_telemetry::metrics;
use prometheus::IntGauge;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    served::Served,
    store::{Checkpoint, Store, WalStamp},
};

/// How often the open attempts are counted, and the upkeep's pace while nothing is written. The
/// count walks the partial index of unfinished attempts, so it costs what is in flight, not what
/// the shard has ever run.
const COUNT_EVERY: Duration = Duration::from_secs(1);

/// How often an SQLite shard's WAL is checkpointed while it is written to: beside its writer, so
/// no commit of the shard loop or the dispatcher pays for a checkpoint's fsync (measured: such
/// stalls were the fire lateness tail).
const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// Runs until `stop`; the gauges read 0 once the shard has closed.
pub(super) fn start(store: Store, served: Arc<Served>, stop: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut counts = Counts::new(store.clone(), served);
        let mut counted = None::<tokio::time::Instant>;
        let mut wait = Duration::ZERO;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
            let checkpoint = match store.checkpoint().await {
                Ok(c) => c,
                Err(e) => {
                    warn!(error = %e, "WAL checkpoint failed; the next one retries");
                    None
                }
            };
            if counted.is_none_or(|at| at.elapsed() >= COUNT_EVERY) {
                counted = Some(tokio::time::Instant::now());
                counts.count().await;
            }
            // Postgres checkpoints itself.
            wait = match checkpoint {
                Some(Checkpoint::Ran { .. }) => CHECKPOINT_EVERY,
                Some(Checkpoint::Unchanged) | None => COUNT_EVERY,
            };
        }
        counts.reset();
    })
}

/// The gauges of what a shard has in flight, and what it last counted.
struct Counts {
    store: Store,
    served: Arc<Served>,
    shard: String,
    open: IntGauge,
    unserved: IntGauge,
    connections: Connections,
    /// Queues this shard has said have tickets and no worker.
    warned: BTreeSet<String>,
    by_queue: Vec<(String, u64)>,
    counted_at: Option<WalStamp>,
}

impl Counts {
    fn new(store: Store, served: Arc<Served>) -> Counts {
        let shard = store.shard().to_string();
        Counts {
            open: metrics::ATTEMPTS_OPEN_GAUGE.with_label_values(&[&shard]),
            unserved: metrics::TICKETS_UNSERVED_GAUGE.with_label_values(&[&shard]),
            connections: Connections::of(&shard),
            store,
            served,
            shard,
            warned: BTreeSet::new(),
            by_queue: Vec::new(),
            counted_at: None,
        }
    }

    async fn count(&mut self) {
        self.connections.sample(&self.store);
        // Counted again only when something was committed since (an idle shard asks its
        // database nothing); the stamp is read first, so a commit during the count is counted
        // next time.
        let stamp = self.store.wal_stamp();
        if stamp.is_none() || stamp != self.counted_at {
            self.by_queue = match self.store.open_attempts_by_queue().await {
                Ok(counts) => counts,
                // A closed or fenced store: the shard is stopping, and says why itself.
                Err(e) => {
                    debug!(error = %e, "counting open attempts failed");
                    return;
                }
            };
            self.counted_at = stamp;
        }
        self.open
            .set(self.by_queue.iter().map(|(_, n)| *n as i64).sum());
        let shard = &self.shard;
        let mut waiting = 0;
        let mut now_unserved = BTreeSet::new();
        for (queue, n) in &self.by_queue {
            if self.served.unserved(queue).await {
                waiting += *n as i64;
                if !self.warned.contains(queue) {
                    warn!(%shard, %queue, tickets = n, "tickets wait on a queue that no live worker serves");
                }
                now_unserved.insert(queue.clone());
            }
        }
        for queue in self.warned.difference(&now_unserved) {
            info!(%shard, %queue, "the queue's tickets are no longer waiting without a worker");
        }
        self.warned = now_unserved;
        self.unserved.set(waiting);
    }

    fn reset(&self) {
        for gauge in [
            &self.open,
            &self.unserved,
            &self.connections.used,
            &self.connections.idle,
        ] {
            gauge.set(0);
        }
    }
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
