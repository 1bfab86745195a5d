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
pub use executor::Outcome;
pub use handler::{Handler, Handlers, Job, JobError, QueueLimits};
