//! The worker: pulls tickets for its queues from JetStream, executes them, and reports results
//! to the owning shard. It journals each ticket before running it and acknowledges a delivery
//! only after its result is stored, so a crash re-delivers the ticket rather than losing it, and
//! a restarted worker does not run an attempt it already ran.
//!
//! - `handler`: the SDK — what a program registers per queue and what a handler receives;
//! - `agent`: consuming, limits, reporting, drain (`Worker::start`);
//! - `journal`: the local ticket journal;
//! - `executor`: the built-in executors (http, shell).
//!
//! It owns execution only: it never writes to a shard database and never decides retries.

pub mod agent;
pub mod executor;
pub mod handler;
pub mod journal;

pub use agent::{Error, Options, Worker, ACK_WAIT};
pub use chronoshard_cluster::Connections;
pub use executor::Outcome;
pub use handler::{Handler, Handlers, Job, JobError, QueueLimits};

/// A ticket for unit tests: queue `q`, shard 3, 1 s timeout.
#[cfg(test)]
pub(crate) fn test_ticket(attempt: u32) -> chronoshard_wire::Ticket {
    let id = uuid::Uuid::now_v7();
    chronoshard_wire::Ticket {
        v: 1,
        ticket_id: id,
        job_id: uuid::Uuid::now_v7(),
        tenant: "t".into(),
        shard: 3,
        epoch: 1,
        scheduled_at: chrono::Utc::now(),
        attempt,
        item: 0,
        items: 1,
        queue: "q".into(),
        target: chronoshard_wire::TargetSpec::Queue {
            queue: "q".into(),
            job_type: None,
        },
        payload: serde_json::Value::Null,
        timeout_ms: 1000,
        priority: 5,
        trace_id: chronoshard_wire::trace_id_of(id),
        checkpoint: None,
    }
}
