//! Watching the platform from outside, through its public contract only: tickets as they are
//! published (`nats.rs`), executor starts in the no-op workers (`noop.rs`) or the HTTP sink
//! (`sink.rs`), the CPU and memory of the processes involved (`procs.rs`), and the platform's
//! own histograms on its `/metrics` (`metrics.rs`). Probes record
//! events with wall-clock microseconds; they judge nothing (`check.rs` and `stats.rs` do).

pub mod metrics;
pub mod nats;
pub mod noop;
pub mod procs;
pub mod sink;

use uuid::Uuid;

/// An executor started a ticket's attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    pub ticket_id: Uuid,
    pub job_id: Uuid,
    pub scheduled_us: i64,
    pub attempt: u32,
    pub at_us: i64,
    /// Which executor process ran it (`<worker id>/<pid>`; `sink` for the HTTP sink), so a
    /// second start can be traced to a killed process.
    pub by: String,
}
