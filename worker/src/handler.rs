//! The SDK: what a program registers to execute tickets of a queue, and what a handler gets.
//!
//! A handler receives a [`Job`] (the ticket, its payload, the checkpoint an earlier attempt left,
//! a cancellation token) and returns `Ok(())` or a [`JobError`]. It never acknowledges, reports or
//! journals anything itself: the agent (`crate::agent`) does, so every handler gets the delivery
//! guarantees of docs/protocol.md for free. Built-in executors (http, shell) are handlers too.
//!
//! ```no_run
//! use chronoshard_worker::{Handlers, Job, JobError};
//!
//! let handlers = Handlers::new().job_type("emails", "welcome", |job: Job| async move {
//!     let to = job.payload()["to"].as_str().ok_or(JobError::permanent("no `to`"))?;
//!     let sent_so_far = job.checkpoint().and_then(|c| c["sent"].as_u64()).unwrap_or(0);
//!     // ... send, and now and then:
//!     job.save_checkpoint(serde_json::json!({"sent": sent_so_far + 1})).await?;
//!     let _ = to;
//!     Ok(())
//! });
//! ```

use std::{
    collections::BTreeMap,
    fmt,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use chronoshard_wire::Ticket;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::{agent::Reporter, executor::Outcome};

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Executes tickets. Implemented for every `Fn(Job) -> impl Future<Output = Result<(), JobError>>`;
/// built-in executors implement it directly to return richer outcomes (HTTP status, output).
pub trait Handler: Send + Sync + 'static {
    fn call(&self, job: Job) -> BoxFuture<Outcome>;
}

impl<F, Fut> Handler for F
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), JobError>> + Send + 'static,
{
    fn call(&self, job: Job) -> BoxFuture<Outcome> {
        let output = job.output.clone();
        let fut = self(job);
        Box::pin(async move {
            let result = fut.await;
            let output = output.lock().unwrap_or_else(|e| e.into_inner()).take();
            match result {
                Ok(()) => Outcome {
                    output,
                    ..Outcome::succeeded()
                },
                Err(e) => Outcome {
                    permanent: e.permanent,
                    output,
                    ..Outcome::failed(e.message)
                },
            }
        })
    }
}

/// Why a handler failed. Any `std::error::Error` converts into a retryable one, so `?` works;
/// [`JobError::permanent`] marks a failure that retrying cannot fix (the ticket becomes a dead
/// letter at once).
#[derive(Debug)]
pub struct JobError {
    message: String,
    permanent: bool,
}

impl JobError {
    /// A failure the job's retry policy applies to.
    pub fn new(message: impl Into<String>) -> JobError {
        JobError {
            message: message.into(),
            permanent: false,
        }
    }

    /// A failure no retry can fix: the ticket goes to the dead letters now.
    pub fn permanent(message: impl Into<String>) -> JobError {
        JobError {
            message: message.into(),
            permanent: true,
        }
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl<E: std::error::Error> From<E> for JobError {
    fn from(e: E) -> JobError {
        JobError::new(e.to_string())
    }
}

/// One attempt of one ticket, as a handler sees it.
pub struct Job {
    ticket: Ticket,
    cancel: CancellationToken,
    reporter: Reporter,
    /// What `set_output` left, read when the handler returns.
    output: Arc<Mutex<Option<String>>>,
}

impl Job {
    pub(crate) fn new(ticket: Ticket, cancel: CancellationToken, reporter: Reporter) -> Job {
        Job {
            ticket,
            cancel,
            reporter,
            output: Arc::default(),
        }
    }

    /// What this attempt reports as its output when the handler returns (the last value set
    /// wins; the agent keeps at most 64 KiB). Shown with the attempt; a workflow step's output
    /// reaches the steps after it in their payload's `upstream`, as JSON when it is JSON.
    pub fn set_output(&self, output: impl Into<String>) {
        *self.output.lock().unwrap_or_else(|e| e.into_inner()) = Some(output.into());
    }

    pub fn ticket(&self) -> &Ticket {
        &self.ticket
    }

    /// The job's payload (`null` when it has none).
    pub fn payload(&self) -> &Value {
        &self.ticket.payload
    }

    /// The last checkpoint an earlier attempt of this ticket saved, to resume from.
    pub fn checkpoint(&self) -> Option<&Value> {
        self.ticket.checkpoint.as_ref()
    }

    /// Fires when the attempt should stop: its `timeout_ms` passed, the worker's drain grace
    /// ran out, or its shard cancelled it (a newer occurrence replaced it under
    /// `overlap: replace`). The handler then has 5 s to return; a success within them counts,
    /// otherwise the attempt is failed (`timed out after N ms`, `cancelled: …`) or, on a drain,
    /// handed back to another worker (from the last checkpoint saved).
    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Records progress (at most 64 KiB of JSON): stored in the results stream when this returns
    /// `Ok`, applied by the shard from there, and handed to the next attempt of this ticket (as
    /// `Job::checkpoint`), or to another worker taking this attempt over after a drain.
    pub async fn save_checkpoint(&self, checkpoint: Value) -> Result<(), JobError> {
        self.reporter
            .checkpoint(&self.ticket, checkpoint)
            .await
            .map_err(|e| JobError::new(format!("checkpoint not stored: {e}")))
    }
}

/// How many tickets of one queue run at once, and how many start per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueueLimits {
    pub concurrency: usize,
    /// Tickets started per second at most (`None`: no limit). A dispatch peak then waits in
    /// JetStream instead of flooding what the handler calls.
    pub rate_per_second: Option<f64>,
}

impl Default for QueueLimits {
    fn default() -> QueueLimits {
        QueueLimits {
            concurrency: 64,
            rate_per_second: None,
        }
    }
}

/// What serves one queue: handlers by job type (a queue target's `job_type`), the one for the
/// rest, and the queue's limits.
#[derive(Clone, Default)]
pub(crate) struct Registered {
    pub by_type: BTreeMap<String, Arc<dyn Handler>>,
    pub other: Option<Arc<dyn Handler>>,
    pub limits: QueueLimits,
}

impl Registered {
    /// Limits set for a queue no handler was registered for (a typo, most likely).
    pub fn is_empty(&self) -> bool {
        self.other.is_none() && self.by_type.is_empty()
    }

    /// The handler for this ticket, or why there is none.
    pub fn pick(&self, t: &Ticket) -> Result<Arc<dyn Handler>, String> {
        let job_type = match &t.target {
            chronoshard_wire::TargetSpec::Queue { job_type, .. } => job_type.as_deref(),
            _ => None,
        };
        if let Some(h) = job_type.and_then(|jt| self.by_type.get(jt)) {
            return Ok(h.clone());
        }
        self.other.clone().ok_or_else(|| match job_type {
            Some(jt) => format!("no handler for job type {jt:?} on queue {:?}", t.queue),
            None => format!(
                "no handler for tickets without a job type on queue {:?}",
                t.queue
            ),
        })
    }
}

/// The handlers of a worker: per queue, by job type and a catch-all. Every worker consuming a
/// queue should register the same ones (they share the queue's consumer); a ticket no handler
/// takes goes back a few times, for a worker that has one, then fails permanently.
#[derive(Clone, Default)]
pub struct Handlers {
    by_queue: BTreeMap<String, Registered>,
}

impl fmt::Debug for Handlers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limits: BTreeMap<_, _> = self.by_queue.iter().map(|(q, r)| (q, r.limits)).collect();
        f.debug_struct("Handlers").field("queues", &limits).finish()
    }
}

impl Handlers {
    pub fn new() -> Handlers {
        Handlers::default()
    }

    /// Executes tickets of `queue` (a job with target `{"type": "queue", "queue": ...}`) that
    /// no `job_type` handler takes. A second registration replaces the first.
    pub fn queue(mut self, queue: impl Into<String>, handler: impl Handler) -> Handlers {
        self.by_queue.entry(queue.into()).or_default().other = Some(Arc::new(handler));
        self
    }

    /// `queue`, and the queue's limits.
    pub fn queue_with(
        self,
        queue: impl Into<String>,
        handler: impl Handler,
        limits: QueueLimits,
    ) -> Handlers {
        let queue = queue.into();
        self.queue(queue.clone(), handler).limits(queue, limits)
    }

    /// Executes tickets of `queue` whose target names this `job_type`
    /// (`{"type": "queue", "queue": ..., "job_type": ...}`), as XXL-JOB routes a job to a named
    /// handler: one queue, and one set of limits, for several kinds of work.
    pub fn job_type(
        mut self,
        queue: impl Into<String>,
        job_type: impl Into<String>,
        handler: impl Handler,
    ) -> Handlers {
        self.by_queue
            .entry(queue.into())
            .or_default()
            .by_type
            .insert(job_type.into(), Arc::new(handler));
        self
    }

    /// Concurrency and start rate of a queue (the defaults until set).
    pub fn limits(mut self, queue: impl Into<String>, limits: QueueLimits) -> Handlers {
        self.by_queue.entry(queue.into()).or_default().limits = limits;
        self
    }

    pub fn queues(&self) -> Vec<String> {
        self.by_queue.keys().cloned().collect()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &Registered)> {
        self.by_queue.iter()
    }
}

/// The time an attempt may run: its `timeout_ms`, at least 1 ms.
pub(crate) fn time_limit(t: &Ticket) -> Duration {
    Duration::from_millis(t.timeout_ms.max(1))
}
