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
use chronoshard_wire::{names, ResultKind, Ticket, TicketResult};
use serde_json::Value;

use crate::executor::Outcome;

/// How often a final result is tried before the delivery is handed back (NAK).
const FINAL_TRIES: u32 = 5;

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
        let msg = PublishMessage::build()
            .payload(Bytes::from(
                serde_json::to_vec(r).expect("result serialises"),
            ))
            .message_id(r.dedup_id());
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
        r.error = outcome.error.clone();
        r.http_status = outcome.http_status;
        r.output = outcome.output.clone();
        r.permanent = !outcome.ok && outcome.permanent;
        r
    }

    /// Stores the final report of an attempt, tried a few times with a growing pause.
    pub async fn finish(&self, t: &Ticket, outcome: &Outcome) -> Result<(), String> {
        let r = self.final_report(t.ticket_id, t.attempt, t.shard, outcome);
        self.store_retrying(&r).await
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
