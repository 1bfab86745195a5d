//! Acks confirmed in groups. An attempt's delivery is acknowledged once its result is stored,
//! and the journal may forget the attempt only once the server has that ack: an ack lost on the
//! way brings the delivery back, and the journal then answers it with the stored outcome
//! instead of running the work again.
//!
//! A double ack (an ack that the server answers once its consumer applied it) per delivery cost
//! a reply message per ticket, for the worker and for nats-server (and async-nats subscribes a
//! fresh inbox for each). Here the acks that wait together are sent plain and only the last of
//! them as a request: a consumer applies the acks of one connection in the order they were sent
//! (nats-server queues them per consumer), so the answer to the last confirms all of them. It
//! does not if the connection was re-established in between (plain acks written before may be
//! lost), or if the answer is an error status (no responders): then the group stays journalled.
//! Every delivery of one `Acked` must come from one consumer (the agent has one per queue) and
//! arrive on `client`'s connection. What neither way gives is durability: a nats-server crash
//! can lose an applied ack, and the delivery then comes back to a journal that has forgotten it
//! (the shard is asked, see `redelivery`).
//!
//! It owns the acking task and nothing else.

use std::sync::{atomic::Ordering, Arc};

use async_nats::jetstream::Message;
use tokio::{sync::mpsc, task::JoinHandle};
use tracing::warn;
use uuid::Uuid;

use crate::journal::Journal;

type Done = (Uuid, u32, Arc<Message>);

/// The ack a consumer answers when it is sent as a request (JetStream's "AckAck").
const ACK: &str = "+ACK";

/// Where reported attempts are handed to have their deliveries acked. Cloning shares the task.
#[derive(Clone)]
pub struct Acked(mpsc::UnboundedSender<Done>);

impl Acked {
    /// Starts the acking task of one consumer's deliveries, which came on `client`; it ends
    /// once every `Acked` is dropped and what was handed to it is acked.
    pub fn start(client: async_nats::Client, journal: Journal) -> (Acked, JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Acked(tx), tokio::spawn(ack_in_groups(client, journal, rx)))
    }

    /// Acks the delivery of this attempt, whose result is stored.
    pub fn ack(&self, ticket_id: Uuid, attempt: u32, delivery: Arc<Message>) {
        // Only a stopped task refuses: the delivery then comes back after the ack wait, and
        // the journal answers it with the stored outcome.
        let _ = self.0.send((ticket_id, attempt, delivery));
    }
}

async fn ack_in_groups(
    client: async_nats::Client,
    journal: Journal,
    mut done: mpsc::UnboundedReceiver<Done>,
) {
    let stats = client.statistics();
    let mut group = Vec::new();
    while done.recv_many(&mut group, usize::MAX).await > 0 {
        let (last_id, last_attempt, last) = group.pop().expect("recv_many gave one at least");
        let connects = stats.connects.load(Ordering::Acquire);
        let mut sent = Vec::with_capacity(group.len() + 1);
        for (ticket_id, attempt, delivery) in group.drain(..) {
            if delivery.ack().await.is_ok() {
                sent.push((ticket_id, attempt));
            }
        }
        let Some(ack) = last.reply.clone() else {
            warn!("a delivery without an ack subject: not a JetStream message");
            continue;
        };
        // An error status (no responders) comes back as an error.
        match client.request(ack, ACK.into()).await {
            Ok(_) if stats.connects.load(Ordering::Acquire) == connects => {
                sent.push((last_id, last_attempt));
                for (ticket_id, attempt) in sent {
                    let _ = journal.reported(ticket_id, attempt);
                }
            }
            // Kept in the journal: a redelivery is answered with the stored outcome.
            Ok(_) => warn!(
                acks = sent.len() + 1,
                "reconnected while acking; those attempts stay journalled"
            ),
            Err(e) => warn!(
                error = %e,
                acks = sent.len() + 1,
                "acks not confirmed; their attempts stay journalled"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_nats::jetstream::{self, consumer::pull, stream};
    use futures::StreamExt;

    use super::*;
    use crate::{executor::Outcome, journal::Seen};

    /// A stream with `n` messages, their deliveries (unacked) and the consumer.
    async fn delivered(
        client: async_nats::Client,
        n: usize,
    ) -> (Vec<Arc<Message>>, jetstream::consumer::PullConsumer) {
        let js = jetstream::new(client);
        let stream = js
            .create_stream(stream::Config {
                name: "T".into(),
                subjects: vec!["t".into()],
                ..Default::default()
            })
            .await
            .unwrap();
        for i in 0..n {
            js.publish("t", i.to_string().into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        let consumer = stream
            .create_consumer(pull::Config {
                durable_name: Some("c".into()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut batch = consumer.fetch().max_messages(n).messages().await.unwrap();
        let mut out = Vec::new();
        while let Some(m) = batch.next().await {
            out.push(Arc::new(m.unwrap()));
        }
        assert_eq!(out.len(), n);
        (out, consumer)
    }

    /// Hands each delivery, as its ticket's, to a new acking task, which ends once it has acked
    /// them all.
    fn ack_all(
        client: async_nats::Client,
        journal: &Journal,
        tickets: &[chronoshard_wire::Ticket],
        msgs: Vec<Arc<Message>>,
    ) -> JoinHandle<()> {
        let (acked, task) = Acked::start(client, journal.clone());
        for (t, m) in tickets.iter().zip(msgs) {
            acked.ack(t.ticket_id, t.attempt, m);
        }
        task
    }

    fn finished(journal: &Journal) -> chronoshard_wire::Ticket {
        let t = crate::test_ticket(1);
        journal.start(&t).unwrap();
        journal.finish(&t, &Outcome::succeeded()).unwrap();
        t
    }

    #[tokio::test]
    async fn every_delivery_is_acked_and_forgotten_once_the_server_confirmed() {
        let nats = chronoshard_test_util::Nats::start().await.unwrap();
        let client = nats.client().await.unwrap();
        let (msgs, mut consumer) = delivered(client.clone(), 20).await;
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(&dir.path().join("w.journal")).unwrap();
        let tickets: Vec<_> = (0..21).map(|_| finished(&journal)).collect();
        let task = ack_all(client, &journal, &tickets, msgs);
        // The task ends once everything handed to it is acked and confirmed.
        task.await.unwrap();
        for t in &tickets[..20] {
            assert_eq!(journal.seen(t), Seen::New, "confirmed: forgotten");
        }
        let kept = journal.seen(&tickets[20]);
        assert_eq!(
            kept,
            Seen::Finished(Outcome::succeeded()),
            "never acked: kept"
        );
        assert_eq!(consumer.info().await.unwrap().num_ack_pending, 0);
    }

    #[tokio::test]
    async fn acks_the_server_never_confirmed_leave_their_attempts_journalled() {
        let nats = chronoshard_test_util::Nats::start().await.unwrap();
        let client = async_nats::ConnectOptions::new()
            .request_timeout(Some(Duration::from_secs(1)))
            .connect(nats.url())
            .await
            .unwrap();
        let (msgs, _consumer) = delivered(client.clone(), 3).await;
        drop(nats);
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(&dir.path().join("w.journal")).unwrap();
        let tickets: Vec<_> = (0..3).map(|_| finished(&journal)).collect();
        let task = ack_all(client, &journal, &tickets, msgs);
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("an ack without a server fails in time")
            .unwrap();
        for t in &tickets {
            assert_eq!(journal.seen(t), Seen::Finished(Outcome::succeeded()));
        }
    }

    /// A group whose last ack is answered "no responders" (its consumer is gone) is not
    /// confirmed.
    #[tokio::test]
    async fn acks_answered_with_an_error_status_leave_their_attempts_journalled() {
        let nats = chronoshard_test_util::Nats::start().await.unwrap();
        let client = nats.client().await.unwrap();
        let (msgs, _consumer) = delivered(client.clone(), 3).await;
        jetstream::new(client.clone())
            .get_stream("T")
            .await
            .unwrap()
            .delete_consumer("c")
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(&dir.path().join("w.journal")).unwrap();
        let tickets: Vec<_> = (0..3).map(|_| finished(&journal)).collect();
        let task = ack_all(client, &journal, &tickets, msgs);
        task.await.unwrap();
        for t in &tickets {
            assert_eq!(journal.seen(t), Seen::Finished(Outcome::succeeded()));
        }
    }
}
