//! Whether a dispatch queue has a live worker, as a shard asks it: the node's view of the worker
//! registry first, then, for a queue no registered worker names (workers in other languages need
//! not register), whether anyone pulls from the queue's consumer. That answer is kept for
//! `RECHECK`, so many requests about one queue cost one look. It only reads; what to do about an
//! unserved queue (warn, count) is decided by its callers.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chronoshard_cluster::{Cluster, LiveQueues};
use chronoshard_wire::warning::Warning;
use tokio::sync::watch;
use tracing::debug;

/// How long a look at a queue's consumer stands.
const RECHECK: Duration = Duration::from_secs(1);

pub(crate) struct Served {
    live: watch::Receiver<LiveQueues>,
    cluster: Cluster,
    pulled: Mutex<HashMap<String, (bool, Instant)>>,
}

impl Served {
    pub fn new(live: watch::Receiver<LiveQueues>, cluster: Cluster) -> Arc<Served> {
        Arc::new(Served {
            live,
            cluster,
            pulled: Mutex::default(),
        })
    }

    /// Whether no live worker is known to serve `queue`. Unknown (the registry not read yet, or
    /// the consumer could not be read) counts as served: a warning must be true.
    pub async fn unserved(&self, queue: &str) -> bool {
        if !self.live.borrow().unserved(queue) {
            return false;
        }
        if let Some((pulled, at)) = self.lock().get(queue) {
            if at.elapsed() < RECHECK {
                return !pulled;
            }
        }
        match self.cluster.queue_pulled(queue).await {
            Ok(pulled) => {
                self.lock()
                    .insert(queue.to_string(), (pulled, Instant::now()));
                !pulled
            }
            Err(e) => {
                debug!(queue, error = %e, "cannot read the queue's consumer");
                false
            }
        }
    }

    /// The warning an answer about a job or run on `queue` carries, if any.
    pub async fn warning(&self, queue: &str) -> Option<Warning> {
        self.unserved(queue)
            .await
            .then(|| Warning::queue_unserved(queue))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (bool, Instant)>> {
        self.pulled.lock().unwrap_or_else(|e| e.into_inner())
    }
}
