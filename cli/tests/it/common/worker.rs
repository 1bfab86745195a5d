//! A worker the test drives by hand over NATS, as docs/protocol.md describes one: it takes the
//! tickets of one queue and reports only what the test tells it to, so a test can play a worker
//! that dies mid-run or answers late.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, AckKind};
use chronoshard_wire::{
    names,
    rpc::{AttemptReply, AttemptRequest, AttemptState},
    ResultKind, Ticket, TicketResult, PROTOCOL_VERSION,
};
use futures::StreamExt;

/// The worker id a hand worker reports with.
pub const HAND: &str = "hand";

pub struct HandWorker {
    client: async_nats::Client,
    js: jetstream::Context,
    messages: pull::Stream,
}

/// Requests a shard sends about the hand worker's attempts (probes, cancels), for the test to
/// answer or leave unanswered.
pub struct AttemptRequests(async_nats::Subscriber, async_nats::Client);

impl AttemptRequests {
    /// The next request, with where to answer it.
    pub async fn next(&mut self, within: Duration) -> (AttemptRequest, async_nats::Subject) {
        let msg = tokio::time::timeout(within, self.0.next())
            .await
            .expect("a request arrives in time")
            .expect("subscription open");
        let req = serde_json::from_slice(&msg.payload).expect("an attempt request");
        (req, msg.reply.expect("a request wants a reply"))
    }

    pub async fn answer(&self, to: async_nats::Subject, state: AttemptState) {
        let reply = AttemptReply {
            worker_id: HAND.into(),
            state,
        };
        let body = serde_json::to_vec(&reply).expect("json");
        self.1.publish(to, body.into()).await.expect("reply sent");
    }
}

impl HandWorker {
    /// Consumes `chronoshard.dispatch.<queue>` with its own durable consumer.
    pub async fn start(nats_url: &str, queue: &str) -> HandWorker {
        let client = async_nats::connect(nats_url).await.expect("nats connects");
        let js = jetstream::new(client.clone());
        let stream = js
            .get_stream(names::DISPATCH_STREAM)
            .await
            .expect("dispatch stream");
        let consumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(format!("hand-{queue}")),
                filter_subject: names::dispatch_subject(queue),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await
            .expect("consumer");
        let messages = consumer.messages().await.expect("messages");
        HandWorker {
            client,
            js,
            messages,
        }
    }

    /// Subscribes to what shards ask this worker about its attempts.
    pub async fn attempt_requests(&self) -> AttemptRequests {
        let sub = self
            .client
            .subscribe(names::worker_attempts_subject(HAND))
            .await
            .expect("subscribed");
        self.client.flush().await.expect("flushed");
        AttemptRequests(sub, self.client.clone())
    }

    /// The next ticket (acknowledged at once: this worker keeps no delivery open).
    pub async fn next_ticket(&mut self, within: Duration) -> Ticket {
        self.take(within, AckKind::Ack).await
    }

    /// Takes the next ticket and terminates its delivery without reporting anything, as a worker
    /// that cannot handle it might.
    pub async fn reject_next(&mut self, within: Duration) -> Ticket {
        self.take(within, AckKind::Term).await
    }

    async fn take(&mut self, within: Duration, ack: AckKind) -> Ticket {
        let msg = tokio::time::timeout(within, self.messages.next())
            .await
            .expect("a ticket arrives in time")
            .expect("stream open")
            .expect("message");
        msg.ack_with(ack).await.expect("ack");
        serde_json::from_slice(&msg.payload).expect("a ticket")
    }

    /// Reports a result for the ticket's attempt, as a worker would.
    pub async fn report(&self, t: &Ticket, kind: ResultKind, error: Option<&str>) {
        let mut r = TicketResult::new(t, kind, HAND, chrono::Utc::now());
        r.error = error.map(str::to_string);
        self.send(t, r).await
    }

    /// Reports the ticket's attempt succeeded with `output`.
    pub async fn succeed_with(&self, t: &Ticket, output: &str) {
        let mut r = TicketResult::new(t, ResultKind::Succeeded, HAND, chrono::Utc::now());
        r.output = Some(output.to_string());
        self.send(t, r).await
    }

    async fn send(&self, t: &Ticket, r: TicketResult) {
        let msg = jetstream::message::PublishMessage::build()
            .payload(serde_json::to_vec(&r).expect("json").into())
            .message_id(r.dedup_id());
        self.js
            .send_publish(names::result_subject(t.shard), msg)
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
}
