//! The watchdog's probe: a request to the worker that started a silent attempt
//! (`chronoshard.workers.<id>.attempts`), in a task of its own so a slow or absent worker never
//! holds the shard loop; the answer goes back to the loop as a command, which judges it
//! (`watchdog::after_probe`). `ask` serves `cancel` too. This module must not read or write the
//! store.

use std::time::Duration;

use chronoshard_wire::{
    names,
    rpc::{AttemptReply, AttemptRequest, AttemptState},
};
use tokio::sync::mpsc;
use tracing::debug;
use uuid::Uuid;

use super::{watchdog, Command};

/// A probe's outcome, for the shard loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Probed {
    pub ticket: Uuid,
    pub attempt: u32,
    pub worker: String,
    pub answer: watchdog::Answer,
}

/// Asks `worker` about the attempt and hands the answer to the shard loop.
pub(crate) fn probe(
    client: async_nats::Client,
    loop_tx: mpsc::WeakSender<Command>,
    worker: String,
    ticket: Uuid,
    attempt: u32,
) {
    tokio::spawn(async move {
        let req = AttemptRequest::Probe {
            ticket_id: ticket,
            attempt,
        };
        let answer = match ask(&client, &worker, &req).await {
            Some(AttemptState::Running) => watchdog::Answer::Running,
            Some(AttemptState::Finished) => watchdog::Answer::Finished,
            Some(AttemptState::Unknown) => watchdog::Answer::NotRunning,
            None => watchdog::Answer::Silent,
        };
        debug!(ticket_id = %ticket, attempt, %worker, ?answer, "watchdog probe answered");
        // The shard closed meanwhile: whoever opens it next checks the attempt again.
        if let Some(tx) = loop_tx.upgrade() {
            let probed = Probed {
                ticket,
                attempt,
                worker,
                answer,
            };
            let _ = tx.send(Command::Probed(probed)).await;
        }
    });
}

/// One request with the probe's deadline; `None` for no answer, no responder or a reply that
/// cannot be read.
pub(super) async fn ask(
    client: &async_nats::Client,
    worker: &str,
    req: &AttemptRequest,
) -> Option<AttemptState> {
    let body = serde_json::to_vec(req).expect("request serialises");
    let subject = names::worker_attempts_subject(worker);
    let wait = Duration::from_millis(watchdog::PROBE_TIMEOUT_MS as u64);
    let msg = tokio::time::timeout(wait, client.request(subject, body.into()))
        .await
        .ok()?
        .ok()?;
    serde_json::from_slice::<AttemptReply>(&msg.payload)
        .ok()
        .map(|r| r.state)
}
