//! The worker agent: one pull consumer per registered queue, fetching only as many tickets as
//! the queue's concurrency and start rate allow, each run through `run::run_one`; a heartbeat in
//! the cluster's worker registry; the drain on shutdown.
//!
//! It owns the worker's NATS traffic and its journal file. It never writes to a shard database
//! and never decides retries: results go to the owning shard, which does.

mod acked;
mod attempts;
mod delivery;
mod limit;
mod redelivery;
mod report;
mod run;

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    },
    time::Duration,
};

use async_nats::jetstream::{
    consumer::{pull, AckPolicy, PullConsumer},
    AckKind,
};
use chronoshard_cluster::{Cluster, Connections, HEARTBEAT_EVERY};
use chronoshard_wire::{names, rpc::WorkerInfo};
use futures::StreamExt;
use tokio::{sync::Semaphore, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

pub(crate) use report::Reporter;

pub use limit::TokenBucket;

use crate::{
    handler::{Handlers, Registered},
    journal::Journal,
};

/// Redelivery delay of an unacknowledged ticket; a running ticket extends it with progress acks
/// every third of it, so only a worker that died lets its tickets go to another.
pub const ACK_WAIT: Duration = Duration::from_secs(30);

/// The most tickets one fetch asks for.
const MAX_FETCH: usize = 256;
/// How long one fetch waits for tickets before asking again.
const FETCH_EXPIRES: Duration = Duration::from_secs(5);
/// The longest pause between progress reports of a running attempt (the watchdog wants a sign
/// of life within 60 s).
const MAX_BEAT: Duration = Duration::from_secs(20);
/// How long an execution runs before its start is reported on its own (see
/// `Options::start_report_delay`).
pub const START_REPORT_DELAY: Duration = Duration::from_millis(100);

/// How to run a worker.
#[derive(Clone, Debug)]
pub struct Options {
    pub worker_id: String,
    /// What executes each queue; the queues consumed are the ones registered here.
    pub handlers: Handlers,
    /// The ticket journal file (`<data dir>/<worker id>.journal` by convention).
    pub journal: PathBuf,
    /// How long in-flight tickets may finish after shutdown is requested; then their handlers
    /// are told to stop and their deliveries go back to JetStream for another worker.
    pub drain_grace: Duration,
    /// The consumers' ack wait (see `ACK_WAIT`); tests shorten it.
    pub ack_wait: Duration,
    /// An execution that ends within this delay is reported by its final result alone, which
    /// carries its start time: one report instead of two, for the short jobs that make up most
    /// of a high rate. A longer one reports `started` when the delay is over. Zero reports every
    /// start at once.
    pub start_report_delay: Duration,
}

impl Options {
    pub fn new(worker_id: impl Into<String>, data_dir: impl Into<PathBuf>) -> Options {
        let worker_id = worker_id.into();
        let journal = data_dir.into().join(format!("{worker_id}.journal"));
        Options {
            worker_id,
            handlers: Handlers::new(),
            journal,
            drain_grace: Duration::from_secs(10),
            ack_wait: ACK_WAIT,
            start_report_delay: START_REPORT_DELAY,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cluster state: {0}")]
    Cluster(#[from] chronoshard_cluster::Error),
    #[error("{what}: {reason}")]
    Nats { what: &'static str, reason: String },
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    #[error("worker {0} has no handler registered: nothing to consume")]
    NoQueues(String),
    #[error("worker id {0:?} must be 1-64 characters of A-Z a-z 0-9 _ -")]
    InvalidId(String),
    #[error("queue name {0:?} must be 1-64 characters of A-Z a-z 0-9 _ -")]
    InvalidQueue(String),
    #[error("queue {0:?} has limits but no handler")]
    NoHandler(String),
}

/// What every delivery of one queue shares.
#[derive(Clone)]
pub(crate) struct Ctx {
    client: async_nats::Client,
    reporter: Reporter,
    journal: Journal,
    queue: String,
    /// The queue consumer's ack wait (the first creator's setting counts, not ours).
    ack_wait: Duration,
    /// How often a running attempt acks progress and reports it: a third of the ack wait, and
    /// at least every 20 s for the shard's watchdog (it looks for a sign of life in 60 s).
    beat: Duration,
    start_report_delay: Duration,
    running: delivery::Running,
    /// Acks the deliveries of reported attempts, then lets the journal forget them.
    acked: acked::Acked,
    /// Fires when the drain grace is over: running handlers are told to stop.
    hard_stop: CancellationToken,
}

/// A worker process's agent (`Worker::start`).
///
/// It runs on the runtime of the task that starts it. Handlers that wait on I/O (HTTP calls,
/// queries) are served as well by a current-thread runtime, which spends less CPU per job than
/// the multi-thread default, since a job then wakes no other thread: measured with a no-op
/// handler at 1,667 jobs/s, 121 against 151 µs of CPU per job. Handlers that compute need the
/// multi-thread runtime (or `spawn_blocking`).
pub struct Worker;

impl Worker {
    /// Starts consuming; runs until `shutdown` fires, then drains: no new fetches, in-flight
    /// tickets finish and report within the drain grace, the rest go back to JetStream.
    pub async fn start(
        opts: Options,
        nats: impl Into<Connections>,
        shutdown: CancellationToken,
    ) -> Result<JoinHandle<()>, Error> {
        if !names::valid_worker_id(&opts.worker_id) {
            return Err(Error::InvalidId(opts.worker_id));
        }
        if opts.handlers.queues().is_empty() {
            return Err(Error::NoQueues(opts.worker_id));
        }
        if let Some(q) = opts
            .handlers
            .queues()
            .into_iter()
            .find(|q| !names::valid_worker_id(q))
        {
            return Err(Error::InvalidQueue(q));
        }
        if let Some((q, _)) = opts.handlers.iter().find(|(_, r)| r.is_empty()) {
            return Err(Error::NoHandler(q.clone()));
        }
        // Shutdown of the process, or a drain request through the API: the same drain.
        let shutdown = shutdown.child_token();
        let journal = Journal::open(&opts.journal)?;
        let nats = nats.into();
        let cluster = Cluster::connect(nats.data).await?;
        let membership = Cluster::connect(nats.membership).await?;
        let reporter = Reporter::new(cluster.js.clone(), &opts.worker_id);
        send_unreported(&journal, &reporter).await;
        let stream = cluster
            .js
            .get_stream(names::DISPATCH_STREAM)
            .await
            .map_err(|e| nats_error("dispatch stream", e))?;
        let hard_stop = CancellationToken::new();
        let in_flight = Arc::new(AtomicU32::new(0));
        let running = delivery::Running::default();
        let mut queues = Vec::new();
        let mut consumers = Vec::new();
        let mut ackers = Vec::new();
        for (queue, reg) in opts.handlers.iter() {
            let mut consumer: PullConsumer = stream
                .get_or_create_consumer(
                    &names::worker_consumer(queue),
                    pull::Config {
                        durable_name: Some(names::worker_consumer(queue)),
                        filter_subject: names::dispatch_subject(queue),
                        ack_policy: AckPolicy::Explicit,
                        ack_wait: opts.ack_wait,
                        max_ack_pending: 10_000,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| nats_error("worker consumer", e))?;
            let ack_wait = consumer
                .info()
                .await
                .map_err(|e| nats_error("worker consumer info", e))?
                .config
                .ack_wait;
            // One per consumer: acks are confirmed in the order one consumer applies them.
            let (acked, acking) = acked::Acked::start(cluster.client.clone(), journal.clone());
            ackers.push(acking);
            let ctx = Ctx {
                client: cluster.client.clone(),
                reporter: reporter.clone(),
                journal: journal.clone(),
                queue: queue.clone(),
                ack_wait,
                beat: (ack_wait / 3).clamp(Duration::from_millis(100), MAX_BEAT),
                start_report_delay: opts.start_report_delay,
                running: running.clone(),
                acked,
                hard_stop: hard_stop.clone(),
            };
            let permits = Arc::new(Semaphore::new(reg.limits.concurrency.max(1)));
            queues.push((permits.clone(), reg.limits.concurrency.max(1)));
            // Ends by itself on shutdown; in-flight work is tracked by the permits.
            consumers.push(tokio::spawn(consume(
                ctx,
                reg.clone(),
                consumer,
                permits,
                in_flight.clone(),
                shutdown.clone(),
            )));
        }
        let drain_requests = cluster
            .client
            .subscribe(names::worker_drain_subject(&opts.worker_id))
            .await
            .map_err(|e| nats_error("drain subscription", e))?;
        let attempt_requests = cluster
            .client
            .subscribe(names::worker_attempts_subject(&opts.worker_id))
            .await
            .map_err(|e| nats_error("attempts subscription", e))?;
        let stopped = CancellationToken::new();
        tokio::spawn(attempts::serve(
            cluster.client.clone(),
            attempt_requests,
            opts.worker_id.clone(),
            running.clone(),
            journal.clone(),
            stopped.clone(),
        ));
        tokio::spawn(answer_drain(
            cluster.client.clone(),
            drain_requests,
            opts.worker_id.clone(),
            in_flight.clone(),
            shutdown.clone(),
            stopped.clone(),
        ));
        let span = tracing::info_span!("worker", worker_id = %opts.worker_id);
        // The heartbeat goes on while the worker drains: it still runs tickets.
        let beating = tokio::spawn(heartbeat(
            membership.clone(),
            WorkerInfo {
                worker_id: opts.worker_id.clone(),
                queues: opts.handlers.queues(),
                heartbeat_at: chrono::Utc::now(),
                in_flight: 0,
            },
            in_flight.clone(),
            stopped.clone(),
        ));
        Ok(tokio::spawn(
            async move {
                shutdown.cancelled().await;
                info!(
                    in_flight = in_flight.load(Ordering::Relaxed),
                    "worker draining"
                );
                let drained = async {
                    for (permits, all) in &queues {
                        // Every permit back means every in-flight ticket of the queue reported.
                        let _ = permits.acquire_many(*all as u32).await;
                    }
                };
                if tokio::time::timeout(opts.drain_grace, drained)
                    .await
                    .is_err()
                {
                    warn!(
                        in_flight = in_flight.load(Ordering::Relaxed),
                        "drain grace over: unfinished tickets go back to JetStream"
                    );
                    hard_stop.cancel();
                    for (permits, all) in &queues {
                        let _ = permits.acquire_many(*all as u32).await;
                    }
                }
                // The journal (and its lock) is free once the last task holding it has ended.
                for c in consumers {
                    let _ = c.await;
                }
                // The last acks go out once every delivery task is gone.
                for a in ackers {
                    let _ = a.await;
                }
                stopped.cancel();
                // No heartbeat may land after the registry entry is removed.
                let _ = beating.await;
                let _ = membership.forget_worker(&opts.worker_id).await;
                info!("worker stopped");
            }
            .instrument(span),
        ))
    }
}

/// Records the worker in the cluster's registry every second until it has stopped.
async fn heartbeat(
    cluster: Cluster,
    mut info: WorkerInfo,
    in_flight: Arc<AtomicU32>,
    stopped: CancellationToken,
) {
    let mut beat = tokio::time::interval(HEARTBEAT_EVERY);
    loop {
        tokio::select! {
            _ = stopped.cancelled() => return,
            _ = beat.tick() => {}
        }
        info.heartbeat_at = chrono::Utc::now();
        info.in_flight = in_flight.load(Ordering::Relaxed);
        if let Err(e) = cluster.heartbeat_worker(&info).await {
            warn!(error = %e, "worker heartbeat failed");
        }
    }
}

/// Answers drain requests until the worker has stopped: the first one starts the drain; a
/// repeated one is answered too.
async fn answer_drain(
    client: async_nats::Client,
    mut requests: async_nats::Subscriber,
    worker_id: String,
    in_flight: Arc<AtomicU32>,
    shutdown: CancellationToken,
    stopped: CancellationToken,
) {
    loop {
        let req = tokio::select! {
            r = requests.next() => match r { Some(r) => r, None => return },
            _ = stopped.cancelled() => return,
        };
        info!("drain requested");
        shutdown.cancel();
        if let Some(reply) = req.reply {
            let answer = chronoshard_wire::rpc::DrainReply {
                worker_id: worker_id.clone(),
                draining: true,
                in_flight: in_flight.load(Ordering::Relaxed),
            };
            let body = serde_json::to_vec(&answer).expect("reply serialises");
            let _ = client.publish(reply, body.into()).await;
        }
    }
}

fn nats_error(what: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Nats {
        what,
        reason: e.to_string(),
    }
}

/// Sends the results the journal holds that were never stored (the worker stopped between
/// finishing an attempt and its report being acknowledged).
async fn send_unreported(journal: &Journal, reporter: &Reporter) {
    for u in journal.unreported() {
        let r = reporter.final_report(u.ticket_id, u.attempt, u.shard, &u.outcome);
        match reporter.store(&r).await {
            Ok(()) => {
                info!(ticket_id = %u.ticket_id, attempt = u.attempt, "journalled result sent after restart");
                let _ = journal.reported(u.ticket_id, u.attempt);
            }
            Err(e) => warn!(ticket_id = %u.ticket_id, error = %e, "journalled result not sent"),
        }
    }
}

/// Fetches tickets of one queue while permits (concurrency) and tokens (start rate) allow, and
/// starts each in its own task holding one permit.
async fn consume(
    ctx: Ctx,
    reg: Registered,
    consumer: PullConsumer,
    permits: Arc<Semaphore>,
    in_flight: Arc<AtomicU32>,
    shutdown: CancellationToken,
) {
    let mut rate = reg
        .limits
        .rate_per_second
        .map(|r| TokenBucket::new(r, tokio::time::Instant::now()));
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return,
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
        };
        let mut held = vec![first];
        while held.len() < MAX_FETCH {
            match permits.clone().try_acquire_owned() {
                Ok(p) => held.push(p),
                Err(_) => break,
            }
        }
        if let Some(bucket) = &mut rate {
            let n = tokio::select! {
                _ = shutdown.cancelled() => return,
                n = bucket.acquire(held.len()) => n,
            };
            held.truncate(n);
        }
        let batch = consumer
            .fetch()
            .max_messages(held.len())
            .expires(FETCH_EXPIRES)
            .messages()
            .await;
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => {
                warn!(queue = %ctx.queue, error = %e, "fetch failed; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    // Pause before asking a failing server again.
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        loop {
            let msg = tokio::select! {
                _ = shutdown.cancelled() => {
                    // The slots go back now: what the fetch still brings is not run here.
                    drop(held);
                    return hand_back(batch).await;
                }
                m = batch.next() => match m {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => { warn!(queue = %ctx.queue, error = %e, "fetch ended"); break }
                    None => break,
                },
            };
            let Some(permit) = held.pop() else {
                // More than asked for cannot come; hand it back rather than overrun the limit.
                let _ = msg.ack_with(AckKind::Nak(None)).await;
                continue;
            };
            let (ctx, reg) = (ctx.clone(), reg.clone());
            let counted = InFlight::new(&in_flight);
            tokio::spawn(async move {
                run::run_one(&ctx, &reg, msg).await;
                // The context (with the journal) goes before the permit that says "done".
                drop(ctx);
                drop(counted);
                drop(permit);
            });
        }
    }
}

/// Hands back tickets a fetch brought that this worker will not start, so another worker gets
/// them now instead of after the ack wait. The fetch's pull request stays open on the server
/// until it expires, so whatever it still brings until then is handed back too.
async fn hand_back(mut batch: pull::Batch) {
    let until = tokio::time::Instant::now() + FETCH_EXPIRES + Duration::from_secs(1);
    while let Ok(Some(m)) = tokio::time::timeout_at(until, batch.next()).await {
        if let Ok(m) = m {
            // Delayed, so it does not come straight back into this still-open pull request.
            let _ = m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
        }
    }
}

/// Counts a delivery in flight for as long as it lives (a panic in its task included).
struct InFlight(Arc<AtomicU32>);

impl InFlight {
    fn new(count: &Arc<AtomicU32>) -> InFlight {
        count.fetch_add(1, Ordering::Relaxed);
        InFlight(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Handlers, Job, QueueLimits};

    #[tokio::test]
    async fn a_worker_with_a_bad_id_queue_or_handler_set_does_not_start() {
        let nats = chronoshard_test_util::Nats::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ok = |_job: Job| async move { Ok(()) };
        let cases = [
            ("has.dot", Handlers::new().queue("q", ok), "worker id"),
            ("w", Handlers::new(), "no handler registered"),
            ("w", Handlers::new().queue("a b", ok), "queue name"),
            (
                "w",
                Handlers::new()
                    .queue("q", ok)
                    .limits("typo", QueueLimits::default()),
                "has limits but no handler",
            ),
        ];
        for (id, handlers, says) in cases {
            let mut opts = Options::new(id, dir.path());
            opts.handlers = handlers;
            let client = nats.client().await.unwrap();
            let err = Worker::start(opts, client, CancellationToken::new())
                .await
                .err()
                .unwrap_or_else(|| panic!("{id} started"));
            assert!(err.to_string().contains(says), "{err}");
        }
    }
}
