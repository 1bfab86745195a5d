//! Which dispatch queues some live worker serves. Two sources, since workers in other languages
//! need not register: the worker registry (chronoshard's own workers), kept current by reading it
//! every `HEARTBEAT_EVERY` — a KV watch would not do, as an entry that expires with the bucket's
//! TTL (a killed worker) leaves no delete marker for a watch to see, and the registry is small —
//! and, for a queue no registered worker names, the queue's durable consumer: a worker that
//! pulls holds a pull request open on it or has messages delivered and not yet acknowledged.

use std::{collections::BTreeSet, sync::Arc};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use async_nats::jetstream::context::ConsumerInfoErrorKind;
use chronoshard_wire::names;

use crate::{nats, Cluster, Result, HEARTBEAT_EVERY};

/// The queues live workers served at the last read of the registry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LiveQueues {
    /// The registry has not been read yet (or never could be): nothing is known to be unserved.
    #[default]
    Unknown,
    Known(Arc<BTreeSet<String>>),
}

impl LiveQueues {
    /// Whether the registry was read and no worker in it serves `queue`.
    pub fn unserved(&self, queue: &str) -> bool {
        match self {
            LiveQueues::Unknown => false,
            LiveQueues::Known(queues) => !queues.contains(queue),
        }
    }
}

impl Cluster {
    /// A channel that holds the queues live workers serve, read again every `HEARTBEAT_EVERY`
    /// until `stop`. A failed read keeps the last value.
    pub fn follow_live_queues(&self, stop: CancellationToken) -> watch::Receiver<LiveQueues> {
        let (tx, rx) = watch::channel(LiveQueues::Unknown);
        let cluster = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match cluster.live_workers().await {
                    Ok(workers) => {
                        let queues = workers.into_iter().flat_map(|w| w.queues).collect();
                        let now = LiveQueues::Known(Arc::new(queues));
                        tx.send_if_modified(|held| {
                            let changed = *held != now;
                            *held = now;
                            changed
                        });
                    }
                    Err(e) => debug!(error = %e, "reading the worker registry failed"),
                }
            }
        });
        rx
    }

    /// Whether some client pulls from `queue`'s consumer now: a pull request waits on it, or
    /// messages it delivered are not acknowledged yet (a worker busy with them). No consumer:
    /// no worker ever served the queue.
    pub async fn queue_pulled(&self, queue: &str) -> Result<bool> {
        let stream = self
            .js
            .get_stream_no_info(names::DISPATCH_STREAM)
            .await
            .map_err(nats("read the dispatch stream"))?;
        match stream.consumer_info(names::worker_consumer(queue)).await {
            Ok(info) => Ok(info.num_waiting > 0 || info.num_ack_pending > 0),
            Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => Ok(false),
            Err(e) => Err(nats("read a queue's consumer")(e)),
        }
    }
}
