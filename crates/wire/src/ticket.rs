//! The execution ticket a shard node dispatches, the result a worker sends back, and the views of
//! runs and tickets the API returns. docs/protocol.md documents these shapes for other languages.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::TargetSpec;

/// Version of the dispatch and result message schemas (`v` field).
pub const PROTOCOL_VERSION: u32 = 1;

/// One attempt to execute one occurrence (or one item of a sharded occurrence), as published on
/// `chronoshard.dispatch.<queue>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Ticket {
    pub v: u32,
    /// UUIDv7; the same for every attempt of this occurrence item. Executors use it as their
    /// idempotency key.
    pub ticket_id: Uuid,
    pub job_id: Uuid,
    pub tenant: String,
    pub shard: u32,
    /// Ownership epoch of the shard node that wrote the ticket.
    pub epoch: u64,
    pub scheduled_at: DateTime<Utc>,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Item index (0-based) and item count of a sharded occurrence; 0 and 1 otherwise.
    pub item: u32,
    pub items: u32,
    pub queue: String,
    pub target: TargetSpec,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    pub timeout_ms: u64,
    /// The job's priority (0 lowest, 9 highest): a shard with more due than it can publish at once
    /// publishes higher priorities first. Absent in tickets written before it existed: 5.
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// W3C trace id (32 hex digits): the ticket id's bytes, so a trace is found from a ticket id.
    pub trace_id: String,
    /// The last checkpoint an earlier attempt of this ticket recorded (a `progress` report's
    /// `checkpoint`), so this attempt can resume instead of starting over. Absent when none was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub checkpoint: Option<serde_json::Value>,
}

impl Ticket {
    /// The W3C `traceparent` for the executor call; the parent span is derived from the attempt so
    /// each attempt is its own span in the ticket's trace.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{:016x}-01",
            self.trace_id,
            u64::from(self.attempt) | (1 << 63)
        )
    }
}

fn default_priority() -> u8 {
    5
}

/// The trace id that belongs to a ticket id.
pub fn trace_id_of(ticket_id: Uuid) -> String {
    ticket_id.simple().to_string()
}

/// What a worker reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResultKind {
    /// The executor started the attempt.
    Started,
    /// The attempt is still running (sent every `ack_wait / 3`, 10 s by default); the shard's
    /// timeout watchdog waits for an attempt whose worker still reports progress.
    Progress,
    /// The attempt ended; `outcome` says how.
    Succeeded,
    Failed,
    /// The worker stopped the attempt unfinished (its drain grace ran out) and handed the
    /// delivery back: the attempt counts as not started, and another worker runs it.
    Released,
}

impl ResultKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            ResultKind::Started => "started",
            ResultKind::Progress => "progress",
            ResultKind::Succeeded => "succeeded",
            ResultKind::Failed => "failed",
            ResultKind::Released => "released",
        }
    }
}

/// A worker's report about one attempt, published on `chronoshard.results.<shard>`. The pair
/// (ticket_id, attempt, kind) is its de-duplication key: re-sent results are applied once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TicketResult {
    pub v: u32,
    pub ticket_id: Uuid,
    pub attempt: u32,
    pub shard: u32,
    pub kind: ResultKind,
    pub worker: String,
    pub at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// How many times JetStream has delivered this attempt's dispatch message (1 the first
    /// time); part of a `started` report's de-duplication id, so the start of a redelivery to
    /// another worker is not dropped as a copy of the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<u64>,
    /// What the execution printed (a shell command's stdout and stderr), cut to the worker's
    /// limit; kept with the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// With `failed`: retrying cannot help (a malformed ticket, a handler's permanent error), so
    /// the ticket becomes a dead letter at once whatever attempts are left.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub permanent: bool,
    /// With `progress` (or `failed`): the handler's progress so far, any JSON. The shard keeps the
    /// last one per ticket and hands it to the next attempt as the ticket's `checkpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub checkpoint: Option<serde_json::Value>,
    /// With `succeeded` or `failed` when the worker did not report `started` (an execution that
    /// ended within its start-report delay): when the execution began, by the worker's clock.
    /// The shard records it as the attempt's start when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
}

impl TicketResult {
    /// A report on the ticket's attempt with no optional field set.
    pub fn new(t: &Ticket, kind: ResultKind, worker: &str, at: DateTime<Utc>) -> TicketResult {
        TicketResult::about(t.ticket_id, t.attempt, t.shard, kind, worker, at)
    }

    /// A report on an attempt known by its ids only.
    pub fn about(
        ticket_id: Uuid,
        attempt: u32,
        shard: u32,
        kind: ResultKind,
        worker: &str,
        at: DateTime<Utc>,
    ) -> TicketResult {
        TicketResult {
            v: PROTOCOL_VERSION,
            ticket_id,
            attempt,
            shard,
            kind,
            worker: worker.to_string(),
            at,
            error: None,
            http_status: None,
            delivery: None,
            output: None,
            permanent: false,
            checkpoint: None,
            started_at: None,
        }
    }

    /// The `Nats-Msg-Id` that lets JetStream drop a re-sent result within its duplicate window.
    /// Progress reports repeat by design, so theirs carries the report's time; a start carries
    /// the delivery count.
    pub fn dedup_id(&self) -> String {
        match self.kind {
            ResultKind::Progress => format!(
                "{}:{}:Progress:{}",
                self.ticket_id,
                self.attempt,
                self.at.timestamp_millis()
            ),
            ResultKind::Started | ResultKind::Released => match self.delivery {
                Some(d) => format!("{}:{}:{:?}:{d}", self.ticket_id, self.attempt, self.kind),
                None => format!("{}:{}:{:?}", self.ticket_id, self.attempt, self.kind),
            },
            kind => format!("{}:{}:{:?}", self.ticket_id, self.attempt, kind),
        }
    }
}

/// Status of an occurrence (a run) and of a ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Scheduled,
    /// A workflow step whose upstream steps have not all succeeded yet: its ticket is written,
    /// not published.
    Waiting,
    Dispatched,
    Running,
    Succeeded,
    Failed,
    Retrying,
    Dead,
    Skipped,
    Missed,
    /// Replaced by a newer occurrence (overlap `replace`); its worker was told to stop it.
    Cancelled,
}

impl RunStatus {
    pub const ALL: [RunStatus; 11] = [
        RunStatus::Scheduled,
        RunStatus::Waiting,
        RunStatus::Dispatched,
        RunStatus::Running,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Retrying,
        RunStatus::Dead,
        RunStatus::Skipped,
        RunStatus::Missed,
        RunStatus::Cancelled,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            RunStatus::Scheduled => "scheduled",
            RunStatus::Waiting => "waiting",
            RunStatus::Dispatched => "dispatched",
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Retrying => "retrying",
            RunStatus::Dead => "dead",
            RunStatus::Skipped => "skipped",
            RunStatus::Missed => "missed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// No further result can change a run in this status.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            RunStatus::Succeeded
                | RunStatus::Failed
                | RunStatus::Dead
                | RunStatus::Skipped
                | RunStatus::Missed
                | RunStatus::Cancelled
        )
    }
}

/// One occurrence of a job, as `GET /v1/jobs/{id}/runs` lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunView {
    pub job_id: Uuid,
    pub scheduled_at: DateTime<Utc>,
    pub status: RunStatus,
    /// Why a run was skipped, missed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub attempts: u32,
    pub ticket_ids: Vec<Uuid>,
    /// A range of consecutive missed or skipped occurrences recorded as one row: the last one's
    /// time and how many there were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_end: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    pub updated_at: DateTime<Utc>,
    /// What stands in the way of a run that has not started (no live worker serves its queue).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<crate::warning::Warning>,
}

/// One attempt of a ticket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AttemptView {
    pub attempt: u32,
    pub status: RunStatus,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// When the shard applied the attempt's last `progress` report (its own clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// What the execution printed (a shell command's stdout and stderr), cut to the worker's
    /// output limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

/// A ticket whose attempts are exhausted (`GET /v1/dlq`): it stays here until it is replayed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DeadLetter {
    pub ticket_id: Uuid,
    pub job_id: Uuid,
    pub tenant: String,
    pub shard: u32,
    pub scheduled_at: DateTime<Utc>,
    pub item: u32,
    pub queue: String,
    /// Attempts made, the last one included.
    pub attempts: u32,
    /// The last attempt's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub dead_at: DateTime<Utc>,
}

/// `GET /v1/tickets/{ticket_id}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TicketView {
    pub ticket_id: Uuid,
    pub job_id: Uuid,
    pub tenant: String,
    pub shard: u32,
    pub epoch: u64,
    pub scheduled_at: DateTime<Utc>,
    pub item: u32,
    pub queue: String,
    pub status: RunStatus,
    /// Why a workflow step was skipped or cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub trace_id: String,
    /// The last checkpoint an attempt recorded; the next attempt receives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub checkpoint: Option<serde_json::Value>,
    pub attempts: Vec<AttemptView>,
}
