//! A worker the test drives by hand over NATS, as docs/protocol.md describes one: it takes the
//! tickets of one queue and reports only what the test tells it to, so a test can play a worker
//! that dies mid-run or answers late.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, AckKind};
use chronoshard_wire::{names, ResultKind, Ticket, TicketResult, PROTOCOL_VERSION};
use futures::StreamExt;

pub struct HandWorker {
    js: jetstream::Context,
    messages: pull::Stream,
}

impl HandWorker {
    /// Consumes `chronoshard.dispatch.<queue>` with its own durable consumer.
    pub async fn start(nats_url: &str, queue: &str) -> HandWorker {
        let client = async_nats::connect(nats_url).await.expect("nats connects");
        let js = jetstream::new(client);
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
        HandWorker { js, messages }
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
        let mut r = TicketResult::new(t, kind, "hand", chrono::Utc::now());
        r.error = error.map(str::to_string);
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
