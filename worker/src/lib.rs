//! The worker: pulls tickets for its queues from JetStream, executes them, and reports results
//! to the owning shard. It acknowledges a ticket only after its result is stored in the result
//! stream, so a crash re-delivers the ticket rather than losing it.
//!
//! It owns execution only: it never writes to a shard database and never decides retries.

pub mod executor;

use std::{sync::Arc, time::Duration};

use async_nats::jetstream::{consumer::pull, message::PublishMessage, AckKind};
use bytes::Bytes;
use chronoshard_cluster::{Cluster, HEARTBEAT_EVERY};
use chronoshard_telemetry::metrics;
use chronoshard_wire::{
    names, rpc::WorkerInfo, ResultKind, Ticket, TicketResult, PROTOCOL_VERSION,
};
use futures::StreamExt;
use tokio::{sync::Semaphore, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

/// Redelivery delay of an unacknowledged ticket; a running ticket extends it with progress acks
/// every third of it, so only a worker that died lets its tickets go to another.
pub const ACK_WAIT: Duration = Duration::from_secs(30);

/// How to run a worker.
#[derive(Clone, Debug)]
pub struct Options {
    pub worker_id: String,
    /// Queues to consume; the built-in HTTP executor serves `http`.
    pub queues: Vec<String>,
    /// Tickets executed at once.
    pub concurrency: usize,
    /// How long in-flight tickets may finish after shutdown is requested.
    pub drain_grace: Duration,
}

impl Options {
    pub fn new(worker_id: impl Into<String>) -> Options {
        Options {
            worker_id: worker_id.into(),
            queues: vec!["http".into()],
            concurrency: 64,
            drain_grace: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cluster state: {0}")]
    Cluster(#[from] chronoshard_cluster::Error),
    #[error("{what}: {reason}")]
    Nats { what: &'static str, reason: String },
}

pub struct Worker;

impl Worker {
    /// Starts consuming; runs until `shutdown` fires, then drains in-flight tickets.
    pub async fn start(
        opts: Options,
        client: async_nats::Client,
        shutdown: CancellationToken,
    ) -> Result<JoinHandle<()>, Error> {
        let cluster = Cluster::connect(client).await?;
        let stream = cluster
            .js
            .get_stream(names::DISPATCH_STREAM)
            .await
            .map_err(|e| Error::Nats {
                what: "dispatch stream",
                reason: e.to_string(),
            })?;
        let http = reqwest::Client::builder()
            .user_agent(concat!("chronoshard-worker/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Nats {
                what: "http client",
                reason: e.to_string(),
            })?;
        let permits = Arc::new(Semaphore::new(opts.concurrency.max(1)));
        let mut tasks = Vec::new();
        for queue in &opts.queues {
            let consumer = stream
                .get_or_create_consumer(
                    &names::worker_consumer(queue),
                    pull::Config {
                        durable_name: Some(names::worker_consumer(queue)),
                        filter_subject: names::dispatch_subject(queue),
                        ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
                        ack_wait: ACK_WAIT,
                        max_ack_pending: 10_000,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| Error::Nats {
                    what: "worker consumer",
                    reason: e.to_string(),
                })?;
            let messages = consumer.messages().await.map_err(|e| Error::Nats {
                what: "pull",
                reason: e.to_string(),
            })?;
            let ctx = Ctx {
                cluster: cluster.clone(),
                http: http.clone(),
                worker_id: opts.worker_id.clone(),
                queue: queue.clone(),
            };
            tasks.push(tokio::spawn(consume(
                ctx,
                messages,
                permits.clone(),
                shutdown.clone(),
            )));
        }
        let span = tracing::info_span!("worker", worker_id = %opts.worker_id);
        Ok(tokio::spawn(
            async move {
                let mut beat = tokio::time::interval(HEARTBEAT_EVERY);
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = beat.tick() => {
                            let info = WorkerInfo {
                                worker_id: opts.worker_id.clone(),
                                queues: opts.queues.clone(),
                                heartbeat_at: chrono::Utc::now(),
                                in_flight: opts.concurrency.max(1).saturating_sub(permits.available_permits()) as u32,
                            };
                            if let Err(e) = cluster.heartbeat_worker(&info).await {
                                warn!(error = %e, "worker heartbeat failed");
                            }
                        }
                    }
                }
                for t in tasks {
                    let _ = t.await;
                }
                // Every permit back means every in-flight ticket finished.
                let all = opts.concurrency.max(1) as u32;
                let _ = tokio::time::timeout(opts.drain_grace, permits.acquire_many(all)).await;
                let _ = cluster.forget_worker(&opts.worker_id).await;
                info!("worker stopped");
            }
            .instrument(span),
        ))
    }
}

#[derive(Clone)]
struct Ctx {
    cluster: Cluster,
    http: reqwest::Client,
    worker_id: String,
    queue: String,
}

async fn consume(
    ctx: Ctx,
    mut messages: pull::Stream,
    permits: Arc<Semaphore>,
    shutdown: CancellationToken,
) {
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return release_prefetched(messages).await,
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
        };
        let msg = tokio::select! {
            _ = shutdown.cancelled() => return release_prefetched(messages).await,
            m = messages.next() => match m {
                Some(Ok(m)) => m,
                Some(Err(e)) => { warn!(error = %e, "dispatch stream error"); continue }
                None => return,
            },
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            run_one(&ctx, msg).await;
            drop(permit);
        });
    }
}

/// Runs `work`, telling JetStream every `ACK_WAIT / 3` that the delivery is still in progress
/// (so it is not delivered to another worker) and the shard that the attempt is alive (so its
/// timeout watchdog waits up to the hard limit instead of declaring it lost).
async fn with_progress<T>(
    ctx: &Ctx,
    ticket: &Ticket,
    msg: &async_nats::jetstream::Message,
    work: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(work);
    let mut beat = tokio::time::interval(ACK_WAIT / 3);
    beat.reset();
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = beat.tick() => {
                let _ = msg.ack_with(AckKind::Progress).await;
                // Its store ack is not awaited: a lost progress report only shortens the
                // watchdog's patience.
                let _ = report(ctx, ticket, ResultKind::Progress, None, None, None).await;
            }
        }
    }
}

/// Hands back tickets the pull stream fetched but this worker will not start, so another worker
/// gets them now instead of after `ack_wait`.
async fn release_prefetched(mut messages: pull::Stream) {
    let until = tokio::time::Instant::now() + Duration::from_millis(300);
    while let Ok(Some(m)) = tokio::time::timeout_at(until, messages.next()).await {
        if let Ok(m) = m {
            let _ = m.ack_with(AckKind::Nak(None)).await;
        }
    }
}

/// Executes one delivered ticket and reports it; acknowledges the delivery once the final result
/// is stored.
async fn run_one(ctx: &Ctx, msg: async_nats::jetstream::Message) {
    let ticket: Ticket = match serde_json::from_slice(&msg.payload) {
        Ok(t) => t,
        Err(e) => {
            warn!(error = %e, subject = %msg.subject, "malformed ticket dropped");
            let _ = msg.ack_with(AckKind::Term).await;
            return;
        }
    };
    let span =
        tracing::info_span!("ticket", ticket_id = %ticket.ticket_id, attempt = ticket.attempt);
    async {
        let started = chrono::Utc::now();
        let late = (started - ticket.scheduled_at)
            .num_microseconds()
            .unwrap_or(0)
            .max(0) as f64
            / 1e6;
        metrics::START_LATENESS_SECONDS
            .with_label_values(&[&ctx.queue])
            .observe(late);
        // The `started` report is not awaited: the final one follows on the same connection and
        // subject, so it cannot overtake it.
        let delivery = msg.info().ok().map(|i| i.delivered as u64);
        let _ = report(ctx, &ticket, ResultKind::Started, None, None, delivery).await;
        let timer = std::time::Instant::now();
        let outcome = with_progress(
            ctx,
            &ticket,
            &msg,
            executor::http::execute(&ctx.http, &ticket),
        )
        .await;
        metrics::EXECUTION_SECONDS
            .with_label_values(&[&ctx.queue])
            .observe(timer.elapsed().as_secs_f64());
        let kind = if outcome.ok {
            ResultKind::Succeeded
        } else {
            ResultKind::Failed
        };
        metrics::EXECUTIONS_TOTAL
            .with_label_values(&[
                ctx.queue.as_str(),
                if outcome.ok { "succeeded" } else { "failed" },
            ])
            .inc();
        for attempt in 0..5 {
            if let Ok(ack) = report(
                ctx,
                &ticket,
                kind,
                outcome.error.clone(),
                outcome.http_status,
                None,
            )
            .await
            {
                if ack.await.is_ok() {
                    let _ = msg.ack().await;
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
        }
        warn!("result could not be stored; the ticket will be delivered again");
        let _ = msg
            .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
            .await;
    }
    .instrument(span)
    .await
}

async fn report(
    ctx: &Ctx,
    t: &Ticket,
    kind: ResultKind,
    error: Option<String>,
    http_status: Option<u16>,
    delivery: Option<u64>,
) -> Result<
    async_nats::jetstream::context::PublishAckFuture,
    async_nats::jetstream::context::PublishError,
> {
    let result = TicketResult {
        v: PROTOCOL_VERSION,
        ticket_id: t.ticket_id,
        attempt: t.attempt,
        shard: t.shard,
        kind,
        worker: ctx.worker_id.clone(),
        at: chrono::Utc::now(),
        error,
        http_status,
        delivery,
    };
    let msg = PublishMessage::build()
        .payload(Bytes::from(
            serde_json::to_vec(&result).expect("result serialises"),
        ))
        .message_id(result.dedup_id());
    ctx.cluster
        .js
        .send_publish(names::result_subject(t.shard), msg)
        .await
}
