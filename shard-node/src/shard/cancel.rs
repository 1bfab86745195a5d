//! Stopping what `overlap: replace` or a workflow's `fail_fast` cancelled, after the store
//! recorded it: a started attempt's
//! worker is told to stop it (`chronoshard.workers.<id>.attempts`), and a ticket no worker has
//! started yet is taken back from the dispatch stream, so that a worker that comes later does not
//! run a cancelled attempt. Each runs in a task of its own; a failure is logged, never retried:
//! the attempt is recorded cancelled already, and its result, should it run, is ignored. This
//! module must not read or write the store.

use async_nats::jetstream::{self, stream::RawMessageErrorKind};
use chronoshard_wire::{names, rpc::AttemptRequest};
use tracing::{debug, warn};

use super::{dispatcher, probe, store::Cancelled};

/// Stops one cancelled attempt where it is.
pub(crate) fn stop(client: async_nats::Client, js: jetstream::Context, c: Cancelled) {
    tokio::spawn(async move {
        match (&c.worker, c.publish_seq) {
            (Some(worker), _) => tell_worker(&client, worker, &c).await,
            (None, Some(seq)) => take_back(&js, seq, &c).await,
            // Not published yet: the outbox does not publish a finished attempt.
            (None, None) => {}
        }
    });
}

async fn tell_worker(client: &async_nats::Client, worker: &str, c: &Cancelled) {
    let req = AttemptRequest::Cancel {
        ticket_id: c.ticket,
        attempt: c.attempt,
        reason: c.reason.into(),
    };
    match probe::ask(client, worker, &req).await {
        Some(state) => {
            debug!(ticket_id = %c.ticket, attempt = c.attempt, worker, ?state, "attempt cancelled")
        }
        None => {
            warn!(ticket_id = %c.ticket, attempt = c.attempt, worker, "the worker of a cancelled attempt did not answer its cancel")
        }
    }
}

/// Deletes the ticket's message, if the sequence still holds it (a recreated stream numbers from
/// 1 again, and a worker may have taken it meanwhile).
async fn take_back(js: &jetstream::Context, seq: u64, c: &Cancelled) {
    let Ok(stream) = js.get_stream_no_info(names::DISPATCH_STREAM).await else {
        warn!(ticket_id = %c.ticket, "dispatch stream unavailable: a cancelled ticket stays queued");
        return;
    };
    match stream.get_raw_message(seq).await {
        Ok(m) if dispatcher::carries(&m.headers, c.ticket, c.attempt) => {
            match stream.delete_message(seq).await {
                Ok(_) => {
                    debug!(ticket_id = %c.ticket, seq, "cancelled ticket taken back from the stream")
                }
                Err(e) => {
                    warn!(ticket_id = %c.ticket, seq, error = %e, "a cancelled ticket stays queued")
                }
            }
        }
        // The sequence holds another ticket (a recreated stream).
        Ok(_) => {}
        // Taken by a worker meanwhile (it reports its start, and its result is ignored), or gone.
        Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => {}
        Err(e) => warn!(ticket_id = %c.ticket, seq, error = %e, "a cancelled ticket stays queued"),
    }
}
