//! What crosses a process boundary in chronoshard: the job spec that clients send, the execution
//! ticket a shard node dispatches, the result a worker reports, the requests the control plane
//! routes to shard nodes, and the names of NATS subjects, streams and KV buckets.
//!
//! This crate holds data and naming only. It must not do I/O and must not grow logic that belongs
//! to one component: evaluation of schedules lives in `chronoshard-schedule`, storage in the shard
//! node. Everything here is serialised as JSON; field names are part of the public contract
//! (openapi/openapi.json, docs/protocol.md), so they are only ever extended, never renamed.

pub mod duration;
pub mod growth;
pub mod ids;
pub mod job;
pub mod names;
pub mod rpc;
mod schedule_schema;
pub mod settings;
pub mod strategy;
pub mod ticket;
pub mod token;
pub mod warning;
pub mod workflow;

pub use duration::Dur;
pub use job::{
    Backoff, CatchupPolicy, CatchupSpec, Job, JobPatch, JobSpec, JobState, Overlap, RetrySpec,
    ScheduleKind, ScheduleSpec, TargetSpec,
};
pub use ticket::{
    trace_id_of, AttemptView, DeadLetter, ResultKind, RunStatus, RunView, Ticket, TicketResult,
    TicketView, PROTOCOL_VERSION,
};
pub use workflow::{
    StepRun, StepSpec, Workflow, WorkflowDef, WorkflowPatch, WorkflowRun, WorkflowSpec,
};

/// Milliseconds since the Unix epoch, the one time unit used on the wire inside the platform.
pub type Millis = i64;

/// Converts a UTC timestamp into milliseconds since the epoch.
pub fn to_millis(t: chrono::DateTime<chrono::Utc>) -> Millis {
    t.timestamp_millis()
}

/// Converts milliseconds since the epoch into a UTC timestamp (clamped to chrono's range).
pub fn from_millis(ms: Millis) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
}

/// Formats a timestamp as the contract wants it: RFC 3339, UTC, `Z`, whole seconds unless the
/// instant has a sub-second part.
pub fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}
