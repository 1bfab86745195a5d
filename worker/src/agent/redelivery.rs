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
    /// Never started, or the shard could not say: run it.
    Run,
    /// The attempt has ended or a later one exists: running it would only repeat work whose
    /// result counts nowhere.
    Over,
    /// Started by a worker that has not finished it and let its delivery lapse: that worker
    /// died during it. Reported failed as lost, so the next attempt runs under the retry policy.
    Orphaned { worker: String },
}

/// Asks the owner of the ticket's shard about the attempt.
pub async fn ask(client: &async_nats::Client, t: &Ticket) -> Redelivered {
    let body = serde_json::to_vec(&ShardRequest::GetTicket {
        ticket_id: t.ticket_id,
    })
    .expect("request serialises");
    let request = client.request(names::shard_rpc_subject(t.shard), body.into());
    let Ok(Ok(msg)) = tokio::time::timeout(ASK_TIMEOUT, request).await else {
        return Redelivered::Run;
    };
    match serde_json::from_slice::<ShardReply>(&msg.payload) {
        Ok(ShardReply::Ticket { ticket }) => {
            let current = ticket.attempts.iter().map(|a| a.attempt).max().unwrap_or(0);
            let Some(mine) = ticket.attempts.iter().find(|a| a.attempt == t.attempt) else {
                return Redelivered::Run;
            };
            if mine.finished_at.is_some() || current > t.attempt {
                return Redelivered::Over;
            }
            match (&mine.started_at, &mine.worker) {
                (Some(_), Some(worker)) => Redelivered::Orphaned {
                    worker: worker.clone(),
                },
                _ => Redelivered::Run,
            }
        }
        _ => Redelivered::Run,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use chronoshard_wire::{AttemptView, RunStatus, TicketView};
    use futures::StreamExt;
    use uuid::Uuid;

    fn ticket(attempt: u32) -> Ticket {
        crate::test_ticket(attempt)
    }

    fn attempt(n: u32, worker: Option<&str>, started: bool, finished: bool) -> AttemptView {
        AttemptView {
            attempt: n,
            status: RunStatus::Running,
            created_at: Utc::now(),
            published_at: Some(Utc::now()),
            started_at: started.then(Utc::now),
            finished_at: finished.then(Utc::now),
            worker: worker.map(str::to_string),
            error: None,
            http_status: None,
            output: None,
        }
    }

    /// A shard that answers every `GetTicket` with the given attempts.
    async fn shard(client: &async_nats::Client, attempts: Vec<AttemptView>) {
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
                    trace_id: String::new(),
                    checkpoint: None,
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
        let nats = chronoshard_test_util::Nats::start().await.unwrap();
        let client = nats.client().await.unwrap();
        // Nobody serves the shard: run it.
        assert_eq!(ask(&client, &ticket(1)).await, Redelivered::Run);

        let cases = [
            (vec![attempt(1, None, false, false)], 1, Redelivered::Run),
            (
                vec![attempt(1, Some("w-a"), true, false)],
                1,
                Redelivered::Orphaned {
                    worker: "w-a".into(),
                },
            ),
            (
                vec![attempt(1, Some("w-a"), true, true)],
                1,
                Redelivered::Over,
            ),
            (
                vec![
                    attempt(1, Some("w-a"), true, true),
                    attempt(2, None, false, false),
                ],
                1,
                Redelivered::Over,
            ),
        ];
        for (attempts, n, want) in cases {
            let nats = chronoshard_test_util::Nats::start().await.unwrap();
            let client = nats.client().await.unwrap();
            shard(&client, attempts.clone()).await;
            assert_eq!(ask(&client, &ticket(n)).await, want, "{attempts:?}");
        }
    }
}
