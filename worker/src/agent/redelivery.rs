//! A delivery JetStream hands out again (its `delivered` count is above 1) may be of an attempt
//! that is over, or that another worker started and died running. Before running one that its own
//! journal does not know, the worker asks the owning shard what became of the attempt, so every
//! worker treats a redelivery the same way, whichever of them receives it.
//!
//! It only reads (a `GetTicket` request to the shard); when the shard does not answer in time the
//! delivery is run, since at-least-once delivery must not depend on the shard being reachable.

use std::time::Duration;

use chronoshard_wire::{
    names,
    rpc::{ShardReply, ShardRequest},
    Ticket,
};

/// How long the shard may take to answer before the delivery is simply run.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// What to do with a redelivered attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Redelivered {
    /// Never started (or handed back), or the shard could not say: run it, resuming from the
    /// checkpoint the shard holds (newer than the one the message was published with).
    Run {
        checkpoint: Option<serde_json::Value>,
    },
    /// The attempt has ended or a later one exists: running it would only repeat work whose
    /// result counts nowhere.
    Over,
    /// Started by a worker that showed a sign of life within half the ack wait: it is probably
    /// running it still (its progress acks were late). Hand the delivery back for a while.
    Alive,
    /// Started by a worker whose last sign of life is older: that worker died during it.
    /// Reported failed as lost, so the next attempt runs under the retry policy.
    Orphaned { worker: String },
}

/// Asks the owner of the ticket's shard about the attempt. `ack_wait` is the queue consumer's:
/// a worker alive sends progress every third of it, one dead lets it pass.
pub async fn ask(client: &async_nats::Client, t: &Ticket, ack_wait: Duration) -> Redelivered {
    let keep = Redelivered::Run { checkpoint: None };
    let body = serde_json::to_vec(&ShardRequest::GetTicket {
        ticket_id: t.ticket_id,
    })
    .expect("request serialises");
    let request = client.request(names::shard_rpc_subject(t.shard), body.into());
    let Ok(Ok(msg)) = tokio::time::timeout(ASK_TIMEOUT, request).await else {
        return keep;
    };
    let Ok(ShardReply::Ticket { ticket }) = serde_json::from_slice::<ShardReply>(&msg.payload)
    else {
        return keep;
    };
    let current = ticket.attempts.iter().map(|a| a.attempt).max().unwrap_or(0);
    let Some(mine) = ticket.attempts.iter().find(|a| a.attempt == t.attempt) else {
        return keep;
    };
    if mine.finished_at.is_some() || current > t.attempt {
        return Redelivered::Over;
    }
    match (mine.started_at, &mine.worker) {
        (Some(started), Some(worker)) => {
            // Shard times against this worker's clock: clocks are assumed to agree to well
            // within half the ack wait (15 s by default).
            let last_sign = mine.progress_at.map_or(started, |p| p.max(started));
            let quiet = (chrono::Utc::now() - last_sign)
                .to_std()
                .unwrap_or_default();
            if quiet < ack_wait / 2 {
                Redelivered::Alive
            } else {
                Redelivered::Orphaned {
                    worker: worker.clone(),
                }
            }
        }
        _ => Redelivered::Run {
            checkpoint: ticket.checkpoint,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use chronoshard_wire::{AttemptView, RunStatus, TicketView};
    use futures::StreamExt;
    use serde_json::json;
    use uuid::Uuid;

    fn ticket(attempt: u32) -> Ticket {
        crate::test_ticket(attempt)
    }

    /// An attempt as the shard shows it; `started` is how long ago it started, if it did.
    fn attempt(n: u32, worker: Option<&str>, started: Option<i64>, finished: bool) -> AttemptView {
        AttemptView {
            attempt: n,
            status: RunStatus::Running,
            created_at: Utc::now(),
            published_at: Some(Utc::now()),
            started_at: started.map(|ago| Utc::now() - chrono::Duration::seconds(ago)),
            finished_at: finished.then(Utc::now),
            progress_at: None,
            worker: worker.map(str::to_string),
            error: None,
            http_status: None,
            output: None,
        }
    }

    /// A shard that answers every `GetTicket` with the given attempts.
    async fn shard(
        client: &async_nats::Client,
        attempts: Vec<AttemptView>,
        checkpoint: Option<serde_json::Value>,
    ) {
        let mut sub = client.subscribe(names::shard_rpc_subject(3)).await.unwrap();
        let replier = client.clone();
        tokio::spawn(async move {
            while let Some(req) = sub.next().await {
                let Ok(ShardRequest::GetTicket { ticket_id }) =
                    serde_json::from_slice(&req.payload)
                else {
                    continue;
                };
                let ticket = TicketView {
                    ticket_id,
                    job_id: Uuid::now_v7(),
                    tenant: "t".into(),
                    shard: 3,
                    epoch: 1,
                    scheduled_at: Utc::now(),
                    item: 0,
                    queue: "q".into(),
                    status: RunStatus::Running,
                    reason: None,
                    trace_id: String::new(),
                    checkpoint: checkpoint.clone(),
                    attempts: attempts.clone(),
                };
                let body = serde_json::to_vec(&ShardReply::Ticket { ticket }).unwrap();
                let _ = replier.publish(req.reply.unwrap(), body.into()).await;
            }
        });
        client.flush().await.unwrap();
    }

    #[tokio::test]
    async fn what_the_shard_knows_decides_a_redelivery() {
        let wait = Duration::from_secs(30);
        let nats = chronoshard_test_util::Nats::start().await.unwrap();
        let client = nats.client().await.unwrap();
        // Nobody serves the shard: run it.
        let run = Redelivered::Run { checkpoint: None };
        assert_eq!(ask(&client, &ticket(1), wait).await, run);

        let saved = json!({"step": 4});
        let mut quiet_but_reporting = attempt(1, Some("w-a"), Some(60), false);
        quiet_but_reporting.progress_at = Some(Utc::now() - chrono::Duration::seconds(2));
        let cases = [
            (
                vec![attempt(1, None, None, false)],
                Redelivered::Run {
                    checkpoint: Some(saved.clone()),
                },
            ),
            (
                vec![attempt(1, Some("w-a"), Some(40), false)],
                Redelivered::Orphaned {
                    worker: "w-a".into(),
                },
            ),
            (
                vec![attempt(1, Some("w-a"), Some(3), false)],
                Redelivered::Alive,
            ),
            (vec![quiet_but_reporting], Redelivered::Alive),
            (
                vec![attempt(1, Some("w-a"), Some(40), true)],
                Redelivered::Over,
            ),
            (
                vec![
                    attempt(1, Some("w-a"), Some(40), true),
                    attempt(2, None, None, false),
                ],
                Redelivered::Over,
            ),
        ];
        for (attempts, want) in cases {
            let nats = chronoshard_test_util::Nats::start().await.unwrap();
            let client = nats.client().await.unwrap();
            shard(&client, attempts.clone(), Some(saved.clone())).await;
            assert_eq!(ask(&client, &ticket(1), wait).await, want, "{attempts:?}");
        }
    }
}
