//! Answers a shard's questions about this worker's attempts on
//! `chronoshard.workers.<id>.attempts`: whether one still runs here (the watchdog asks before it
//! declares an attempt lost) and to stop one that was replaced. Reads the running attempts and
//! the journal; it never reports results itself: a cancelled handler ends and its attempt is
//! reported as any other.

use chronoshard_wire::rpc::{AttemptReply, AttemptRequest, AttemptState};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use uuid::Uuid;

use super::delivery::Running;
use crate::journal::{Journal, Seen};

/// What the agent knows of one attempt.
pub(super) fn state_of(
    running: &Running,
    journal: &Journal,
    ticket: Uuid,
    attempt: u32,
) -> AttemptState {
    if running.contains(ticket, attempt) {
        return AttemptState::Running;
    }
    match journal.seen_attempt(ticket, attempt) {
        Seen::Finished(_) => AttemptState::Finished,
        // Interrupted: it started in an earlier life of this worker and runs no more.
        Seen::New | Seen::Interrupted => AttemptState::Unknown,
    }
}

/// The answer to one request; a cancel stops the handler before it is answered.
pub(super) fn answer(
    running: &Running,
    journal: &Journal,
    worker_id: &str,
    req: &AttemptRequest,
) -> AttemptReply {
    let state = match req {
        AttemptRequest::Probe { ticket_id, attempt } => {
            let state = state_of(running, journal, *ticket_id, *attempt);
            debug!(ticket_id = %ticket_id, attempt, ?state, "probed by the watchdog");
            state
        }
        AttemptRequest::Cancel {
            ticket_id,
            attempt,
            reason,
        } => {
            let state = state_of(running, journal, *ticket_id, *attempt);
            if running.cancel(*ticket_id, *attempt) {
                info!(ticket_id = %ticket_id, attempt, %reason, "attempt cancelled by its shard");
            }
            state
        }
    };
    AttemptReply {
        worker_id: worker_id.to_string(),
        state,
    }
}

/// Serves the subject until the worker has stopped. A request that cannot be read is logged and
/// left unanswered: the asking shard treats silence as it would a worker that is gone.
pub(super) async fn serve(
    client: async_nats::Client,
    mut requests: async_nats::Subscriber,
    worker_id: String,
    running: Running,
    journal: Journal,
    stopped: CancellationToken,
) {
    loop {
        let msg = tokio::select! {
            m = requests.next() => match m { Some(m) => m, None => return },
            _ = stopped.cancelled() => return,
        };
        let req: AttemptRequest = match serde_json::from_slice(&msg.payload) {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "unreadable attempt request ignored");
                continue;
            }
        };
        let reply = answer(&running, &journal, &worker_id, &req);
        if let Some(to) = msg.reply {
            let body = serde_json::to_vec(&reply).expect("reply serialises");
            let _ = client.publish(to, body.into()).await;
        }
    }
}
