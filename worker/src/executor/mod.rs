//! Executors: what turns a ticket into an outcome. Each returns an `Outcome` and never panics
//! the worker; a failure of the target is a failed outcome, not an error of the worker. The
//! built-in ones are handlers (`crate::handler`) on the queues `http` and `shell`.

use std::sync::Arc;

use crate::handler::{BoxFuture, Handler, Handlers, Job, QueueLimits};

pub mod http;
pub mod shell;
pub mod ssrf;

/// How one attempt ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub ok: bool,
    pub error: Option<String>,
    pub http_status: Option<u16>,
    /// What the execution printed (shell: stdout then stderr), cut to the executor's limit.
    pub output: Option<String>,
    /// A failure retrying cannot fix: the shard dead-letters the ticket at once.
    pub permanent: bool,
}

impl Outcome {
    pub fn succeeded() -> Outcome {
        Outcome {
            ok: true,
            ..Outcome::default()
        }
    }

    pub fn failed(error: impl Into<String>) -> Outcome {
        Outcome {
            ok: false,
            error: Some(error.into()),
            ..Outcome::default()
        }
    }
}

impl Handler for http::HttpExecutor {
    fn call(&self, job: Job) -> BoxFuture<Outcome> {
        let me = self.clone();
        Box::pin(async move { me.execute(job.ticket(), job.cancelled()).await })
    }
}

/// The shell executor with its options, as a handler.
#[derive(Clone, Debug)]
pub struct Shell(pub Arc<shell::ShellOptions>);

impl Handler for Shell {
    fn call(&self, job: Job) -> BoxFuture<Outcome> {
        let opts = self.0.clone();
        Box::pin(async move { shell::execute(&opts, job.ticket(), job.cancelled()).await })
    }
}

/// The built-in executors a worker serves.
#[derive(Clone, Debug)]
pub struct Builtins {
    /// The `http` queue, through this SSRF guard.
    pub http: ssrf::SsrfGuard,
    /// The `shell` queue, consumed only when `shell.enabled`.
    pub shell: shell::ShellOptions,
    /// Concurrency and start rate of each of the two queues.
    pub limits: QueueLimits,
}

impl Builtins {
    /// Registers them: `http` always, `shell` when enabled.
    pub fn register(self, handlers: Handlers) -> Result<Handlers, reqwest::Error> {
        let agent = concat!("chronoshard-worker/", env!("CARGO_PKG_VERSION"));
        let http = http::HttpExecutor::new(self.http, agent)?;
        let mut handlers = handlers.queue_with("http", http, self.limits);
        if self.shell.enabled {
            handlers = handlers.queue_with("shell", Shell(Arc::new(self.shell)), self.limits);
        }
        Ok(handlers)
    }
}
