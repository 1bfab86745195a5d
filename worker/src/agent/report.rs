//! Sending reports to the owning shard's results subject (docs/protocol.md "Reporting").

use std::{
    sync::{
        atomic::{AtomicI64, Ordering},
        Arc,
    },
    time::Duration,
};

use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use chronoshard_telemetry::traces;
use chronoshard_wire::{names, ResultKind, Ticket, TicketResult};
use serde_json::Value;

use crate::executor::Outcome;

/// How often a result is tried before `store_retrying` gives up.
const FINAL_TRIES: u32 = 5;
/// Longest error text sent (bytes); longer ones are cut.
pub const MAX_ERROR: usize = 4 * 1024;
/// Longest output sent (bytes); longer ones are cut.
pub const MAX_OUTPUT: usize = 64 * 1024;
/// Largest checkpoint accepted (bytes of JSON): the next attempt's ticket carries it.
pub const MAX_CHECKPOINT: usize = 64 * 1024;

/// `text` cut to at most `max` bytes at a character boundary, marked when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[cut {} bytes]", &text[..end], text.len() - end)
}

/// Publishes one worker's reports. Cloning shares it.
#[derive(Clone)]
pub struct Reporter {
    js: jetstream::Context,
    worker_id: Arc<str>,
    /// The last progress report's time in ms: progress de-duplication ids carry it, so two
    /// checkpoints within one millisecond must not share one.
    last_progress_ms: Arc<AtomicI64>,
}

impl Reporter {
    pub fn new(js: jetstream::Context, worker_id: &str) -> Reporter {
        Reporter {
            js,
            worker_id: worker_id.into(),
            last_progress_ms: Arc::new(AtomicI64::new(0)),
        }
    }

    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    pub fn result(&self, t: &Ticket, kind: ResultKind) -> TicketResult {
        TicketResult::new(t, kind, &self.worker_id, Utc::now())
    }

    /// Publishes without waiting for JetStream's ack (started and progress reports: the final
    /// result follows on the same connection and subject, so it cannot overtake them).
    pub async fn send(
        &self,
        r: &TicketResult,
    ) -> Result<PublishAckFuture, jetstream::context::PublishError> {
        let mut msg = PublishMessage::build()
            .payload(Bytes::from(
                serde_json::to_vec(r).expect("result serialises"),
            ))
            .message_id(r.dedup_id());
        // Sent from within the attempt's span: the shard's `result` span is its child.
        if let Some(parent) = traces::current_traceparent() {
            msg = msg.header(names::TRACEPARENT, parent.as_str());
        }
        self.js
            .send_publish(names::result_subject(r.shard), msg)
            .await
    }

    /// Publishes and waits until JetStream stored it.
    pub async fn store(&self, r: &TicketResult) -> Result<(), String> {
        self.send(r)
            .await
            .map_err(|e| e.to_string())?
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// A progress report, timed after every earlier one of this worker.
    pub fn progress(&self, t: &Ticket) -> TicketResult {
        let now = Utc::now().timestamp_millis();
        let next = |prev: i64| now.max(prev + 1);
        let prev = self
            .last_progress_ms
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| Some(next(p)))
            .unwrap_or_else(|p| p);
        let at = DateTime::from_timestamp_millis(next(prev)).unwrap_or_else(Utc::now);
        TicketResult::new(t, ResultKind::Progress, &self.worker_id, at)
    }

    /// Stores a checkpoint (a progress report carrying it).
    pub async fn checkpoint(&self, t: &Ticket, checkpoint: Value) -> Result<(), String> {
        let size = checkpoint.to_string().len();
        if size > MAX_CHECKPOINT {
            return Err(format!(
                "a checkpoint may have {MAX_CHECKPOINT} bytes of JSON, this one has {size}"
            ));
        }
        let mut r = self.progress(t);
        r.checkpoint = Some(checkpoint);
        self.store(&r).await
    }

    /// The final report of an attempt with this outcome.
    pub fn final_report(
        &self,
        ticket_id: uuid::Uuid,
        attempt: u32,
        shard: u32,
        outcome: &Outcome,
    ) -> TicketResult {
        let kind = if outcome.ok {
            ResultKind::Succeeded
        } else {
            ResultKind::Failed
        };
        let mut r =
            TicketResult::about(ticket_id, attempt, shard, kind, &self.worker_id, Utc::now());
        // Bounded, so a report always fits in a NATS message (1 MiB by default) with room to
        // spare, whatever a handler or a command produced.
        r.error = outcome.error.as_deref().map(|e| cut(e, MAX_ERROR));
        r.http_status = outcome.http_status;
        r.output = outcome.output.as_deref().map(|o| cut(o, MAX_OUTPUT));
        r.permanent = !outcome.ok && outcome.permanent;
        r
    }

    pub async fn store_retrying(&self, r: &TicketResult) -> Result<(), String> {
        let mut last = String::new();
        for attempt in 0..FINAL_TRIES {
            match self.store(r).await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            // Backoff between tries of a publish JetStream refused; not a synchronisation.
            tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_texts_are_cut_at_a_character_boundary() {
        assert_eq!(cut("short", 10), "short");
        let long = "é".repeat(10); // 20 bytes
        let c = cut(&long, 5);
        assert_eq!(c, "éé…[cut 16 bytes]");
    }
}
