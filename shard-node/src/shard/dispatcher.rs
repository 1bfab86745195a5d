//! Publishing written tickets to JetStream: the outbox's sending half. Tickets arrive after their
//! rows are committed; publishes are pipelined with at most `publish_window` acks outstanding; acks
//! are recorded in batches; refused or timed-out publishes are retried with the same `Nats-Msg-Id`
//! so JetStream drops a copy it already has. When the window is full the channel fills and the
//! shard loop waits: the node slows down instead of growing an unbounded queue.
//!
//! Tickets that were written but never acknowledged (a crash, a publish lost with the connection)
//! are found again by scanning the outbox at start and periodically.

use std::{
    collections::{HashSet, VecDeque},
    time::Duration,
};

use super::fair::FairQueue;

use async_nats::jetstream::{context::PublishAckFuture, message::PublishMessage};
use bytes::Bytes;
use chronoshard_telemetry::metrics;
use chronoshard_wire::{names, Ticket};
use futures::{stream::FuturesUnordered, FutureExt, StreamExt};
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};
use uuid::Uuid;

use super::{
    store::{Store, StoreError},
    ShardContext,
};

/// Written tickets older than this with no ack are published again by the periodic outbox scan.
const RESCAN_AGE_MS: i64 = 30_000;
const RESCAN_EVERY: Duration = Duration::from_secs(10);
const RETRY_AFTER: Duration = Duration::from_millis(500);
const FLUSH_EVERY: Duration = Duration::from_millis(20);

pub(crate) struct Handle {
    tx: Option<mpsc::Sender<Vec<Ticket>>>,
    task: Option<JoinHandle<()>>,
}

impl Handle {
    /// Hands committed tickets over for publishing; waits while the pipeline is full.
    pub async fn publish(&self, tickets: Vec<Ticket>) {
        if tickets.is_empty() {
            return;
        }
        if let Some(tx) = &self.tx {
            // A closed channel means the shard is stopping: the rows stay in the outbox.
            let _ = tx.send(tickets).await;
        }
    }

    /// Stops accepting tickets and waits for the dispatcher to record what was acknowledged.
    pub async fn closed(&mut self) {
        self.tx.take();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

pub(crate) fn start(store: Store, ctx: ShardContext, stop: CancellationToken) -> Handle {
    let (tx, rx) = mpsc::channel(64);
    let span = tracing::info_span!("dispatcher", shard_id = ctx.shard);
    let task = tokio::spawn(
        async move {
            let shard = ctx.shard;
            if let Err(e) = Dispatcher::new(store, ctx).run(rx, stop.clone()).await {
                warn!(shard, error = %e, "dispatcher stopped; stopping shard");
                stop.cancel();
            }
        }
        .instrument(span),
    );
    Handle {
        tx: Some(tx),
        task: Some(task),
    }
}

type Inflight =
    std::pin::Pin<Box<dyn std::future::Future<Output = (Ticket, Result<(), String>)> + Send>>;

struct Dispatcher {
    store: Store,
    ctx: ShardContext,
    shard_label: String,
    /// Tickets waiting for a place in the publish window: highest priority first, tenants taking
    /// turns within a priority.
    queue: FairQueue<String, Ticket>,
    retry: VecDeque<(tokio::time::Instant, Ticket)>,
    /// Tickets queued or in flight, so an outbox scan does not queue them twice.
    pending: HashSet<(Uuid, u32)>,
    acked: Vec<(Uuid, u32)>,
    /// Consecutive failed publishes: the retry backoff grows with it.
    failures: u32,
}

impl Dispatcher {
    fn new(store: Store, ctx: ShardContext) -> Self {
        Dispatcher {
            store,
            shard_label: ctx.shard.to_string(),
            ctx,
            queue: FairQueue::default(),
            retry: VecDeque::new(),
            pending: HashSet::new(),
            acked: Vec::new(),
            failures: 0,
        }
    }

    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Vec<Ticket>>,
        stop: CancellationToken,
    ) -> Result<(), StoreError> {
        let window = self.ctx.config.publish_window.max(1);
        let mut inflight: FuturesUnordered<Inflight> = FuturesUnordered::new();
        let now = self.ctx.clock.now_ms();
        let recovered = self.store.unpublished(now + 1, now, 100_000).await?;
        if !recovered.is_empty() {
            info!(
                count = recovered.len(),
                "publishing tickets written but never acknowledged"
            );
        }
        self.enqueue(recovered);
        let mut flush = tokio::time::interval(FLUSH_EVERY);
        let mut rescan = tokio::time::interval(RESCAN_EVERY);
        rescan.reset();
        let mut open = true;
        loop {
            while inflight.len() < window {
                let Some(t) = self.queue.pop() else {
                    break;
                };
                let fut = self.send(t).await;
                inflight.push(fut);
            }
            self.report_backlog(inflight.len());
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                Some((t, res)) = inflight.next(), if !inflight.is_empty() => self.on_ack(t, res),
                batch = rx.recv(), if open && self.queue.len() < window * 4 => match batch {
                    Some(b) => self.enqueue(b),
                    None => open = false,
                },
                _ = flush.tick() => {
                    tolerate(self.flush().await)?;
                    let now = tokio::time::Instant::now();
                    while self.retry.front().is_some_and(|(at, _)| *at <= now) {
                        let (_, t) = self.retry.pop_front().expect("front exists");
                        self.push(t);
                    }
                    if !open && self.queue.is_empty() && self.retry.is_empty() && inflight.is_empty() {
                        break;
                    }
                }
                _ = rescan.tick() => {
                    let now = self.ctx.clock.now_ms();
                    let old = self.store.unpublished(now - RESCAN_AGE_MS, now, 10_000).await;
                    if let Some(old) = tolerate(old)? {
                        self.enqueue(old);
                    }
                }

            }
        }
        // Record acks that already arrived; unacknowledged tickets stay in the outbox.
        let deadline = tokio::time::sleep(Duration::from_secs(2));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                Some((t, res)) = inflight.next(), if !inflight.is_empty() => self.on_ack(t, res),
                _ = &mut deadline => break,
                else => break,
            }
        }
        self.report_backlog(0);
        match self.flush().await {
            Err(StoreError::Fenced { .. }) | Ok(()) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn enqueue(&mut self, tickets: Vec<Ticket>) {
        for t in tickets {
            if self.pending.insert((t.ticket_id, t.attempt)) {
                self.push(t);
            }
        }
    }

    fn push(&mut self, t: Ticket) {
        self.queue.push(t.priority, t.tenant.clone(), t);
    }

    async fn send(&self, t: Ticket) -> Inflight {
        let body = Bytes::from(serde_json::to_vec(&t).expect("ticket serialises"));
        let msg = PublishMessage::build()
            .payload(body)
            .message_id(format!("{}:{}", t.ticket_id, t.attempt))
            .header(names::HDR_TICKET_ID, t.ticket_id.to_string().as_str())
            .header(names::HDR_ATTEMPT, t.attempt.to_string().as_str());
        match self
            .ctx
            .cluster
            .js
            .send_publish(names::dispatch_subject(&t.queue), msg)
            .await
        {
            Ok(ack) => async move { (t, wait_ack(ack).await) }.boxed(),
            Err(e) => {
                let e = e.to_string();
                async move { (t, Err(e)) }.boxed()
            }
        }
    }

    fn on_ack(&mut self, t: Ticket, res: Result<(), String>) {
        match res {
            Ok(()) => {
                self.failures = 0;
                self.pending.remove(&(t.ticket_id, t.attempt));
                let late = (self.ctx.clock.now_ms() - t.scheduled_at.timestamp_millis()).max(0)
                    as f64
                    / 1000.0;
                metrics::FIRE_LATENESS_SECONDS
                    .with_label_values(&[&self.shard_label])
                    .observe(late);
                metrics::TICKETS_PUBLISHED_TOTAL
                    .with_label_values(&[&self.shard_label])
                    .inc();
                self.acked.push((t.ticket_id, t.attempt));
            }
            Err(e) => {
                metrics::PUBLISH_ERRORS_TOTAL
                    .with_label_values(&[&self.shard_label])
                    .inc();
                self.failures += 1;
                // One line per doubling of the failure streak, not one per ticket.
                if self.failures.is_power_of_two() {
                    warn!(ticket_id = %t.ticket_id, failures = self.failures, error = %e, "ticket publish failed; retrying with backoff");
                }
                let backoff = RETRY_AFTER * 2u32.pow(self.failures.ilog2().min(4));
                self.retry
                    .push_back((tokio::time::Instant::now() + backoff, t));
            }
        }
    }

    async fn flush(&mut self) -> Result<(), StoreError> {
        if self.acked.is_empty() {
            return Ok(());
        }
        self.store
            .mark_published(&self.acked, self.ctx.clock.now_ms())
            .await?;
        self.acked.clear();
        Ok(())
    }

    fn report_backlog(&self, inflight: usize) {
        let backlog = self.queue.len() + self.retry.len() + inflight;
        metrics::DISPATCH_BACKLOG_GAUGE
            .with_label_values(&[&self.shard_label])
            .set(backlog as i64);
    }
}

/// Store errors other than fencing are logged and survived: the outbox keeps the tickets, and the
/// next flush or scan tries again. Fencing stops the dispatcher (another node owns the shard).
fn tolerate<T>(r: Result<T, StoreError>) -> Result<Option<T>, StoreError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e @ StoreError::Fenced { .. }) => Err(e),
        Err(e) => {
            warn!(error = %e, "dispatcher store access failed; will retry");
            Ok(None)
        }
    }
}

async fn wait_ack(ack: PublishAckFuture) -> Result<(), String> {
    ack.await.map(|_| ()).map_err(|e| e.to_string())
}
