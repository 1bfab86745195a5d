//! The no-op executor: a worker built on the worker SDK whose handler only writes down that it
//! started (and, with `--work`, then waits that long, to stand for work a kill can interrupt),
//! so a run measures the platform without any executor cost. It runs as its own process
//! (`chronoshard-loadtest noop-worker`, started by the runner) so that the `fault` scenario can
//! kill it with SIGKILL like any real worker.
//!
//! Each start is one line appended to the worker's log with a single `write` (no user-space
//! buffer): a line written before a SIGKILL is in the kernel and survives it, so a second start
//! of the same ticket after a crash is always visible to the check.

use std::{
    io::{BufRead, Write},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use anyhow::Context;
use chronoshard_worker::{Connections, Handlers, Job, JobError, Options, QueueLimits, Worker};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Start;
use crate::progress::{now_us, us_of};

/// Settings of one no-op worker process.
#[derive(Clone, Debug, clap::Args)]
pub struct NoopWorkerArgs {
    /// NATS URL of the platform.
    #[arg(long)]
    pub nats: String,
    /// Worker id (stable across a restart, so its journal is found again).
    #[arg(long)]
    pub id: String,
    /// The queue to consume.
    #[arg(long)]
    pub queue: String,
    /// Directory of the worker's journal.
    #[arg(long)]
    pub data: PathBuf,
    /// File the starts are appended to.
    #[arg(long)]
    pub log: PathBuf,
    /// Tickets run at once.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// The queue consumer's ack wait.
    #[arg(long, default_value = "30s")]
    pub ack_wait: chronoshard_wire::Dur,
    /// How long each execution takes after its start is logged (simulated work; 0 = none).
    #[arg(long, default_value = "0ms")]
    pub work: chronoshard_wire::Dur,
}

/// Runs the worker until `shutdown` (SIGTERM in the child), then drains it.
pub async fn run(args: NoopWorkerArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.log)
        .with_context(|| format!("cannot open {}", args.log.display()))?;
    let log = Arc::new(Mutex::new(log));
    let by = format!("{}/{}", args.id, std::process::id());
    let work = args.work.0;
    let handler = move |job: Job| {
        let (log, by) = (log.clone(), by.clone());
        async move {
            let t = job.ticket();
            let line = format!(
                "S {} {} {} {} {} {}\n",
                t.ticket_id,
                t.job_id,
                us_of(t.scheduled_at),
                t.attempt,
                now_us(),
                by
            );
            // One write per line: see the module doc.
            log.lock()
                .map_err(|_| JobError::new("start log poisoned"))?
                .write_all(line.as_bytes())?;
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            Ok::<(), JobError>(())
        }
    };
    let mut opts = Options::new(&args.id, &args.data);
    opts.ack_wait = args.ack_wait.0;
    opts.handlers = Handlers::new().queue_with(
        &args.queue,
        handler,
        QueueLimits {
            concurrency: args.concurrency,
            rate_per_second: None,
        },
    );
    let nats = Connections::connect(&args.nats, &args.id)
        .await
        .with_context(|| format!("cannot connect to {}", args.nats))?;
    let task = Worker::start(opts, nats, shutdown).await?;
    println!("ready");
    task.await?;
    Ok(())
}

/// Reads the starts a no-op worker logged. A last line cut by a SIGKILL mid-write is skipped.
pub fn read_starts(path: &Path) -> anyhow::Result<Vec<Start>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let mut starts = Vec::new();
    for line in std::io::BufReader::new(file).lines() {
        if let Some(s) = parse(&line?) {
            starts.push(s);
        }
    }
    Ok(starts)
}

fn parse(line: &str) -> Option<Start> {
    let mut f = line.split(' ');
    if f.next()? != "S" {
        return None;
    }
    let start = Start {
        ticket_id: f.next()?.parse::<Uuid>().ok()?,
        job_id: f.next()?.parse::<Uuid>().ok()?,
        scheduled_us: f.next()?.parse().ok()?,
        attempt: f.next()?.parse().ok()?,
        at_us: f.next()?.parse().ok()?,
        by: f.next()?.to_string(),
    };
    f.next().is_none().then_some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_whole_lines_and_skips_a_cut_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("starts.log");
        let (t, j) = (Uuid::now_v7(), Uuid::now_v7());
        std::fs::write(
            &path,
            format!("S {t} {j} 100 1 250 w-1/42\nS {t} {j} 100 2 900 w-1/43\nS {t} {j} 1"),
        )
        .unwrap();
        let starts = read_starts(&path).unwrap();
        assert_eq!(starts.len(), 2);
        assert_eq!(starts[1].attempt, 2);
        assert_eq!(starts[1].by, "w-1/43");
        assert!(read_starts(&dir.path().join("none")).unwrap().is_empty());
    }
}
