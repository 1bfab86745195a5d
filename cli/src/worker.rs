//! `chronoshard worker`: one worker process serving the built-in executors (`http`, and `shell`
//! when enabled) against a running platform's NATS. SIGTERM or Ctrl-C drains it: no new tickets,
//! in-flight ones finish and report within the grace, the rest go back to JetStream, exit 0.
//! Settings come from flags, `CHRONOSHARD_*` variables and a TOML file (`crate::config`);
//! `--dump-config` prints the result as such a file.

use std::path::PathBuf;

use anyhow::Context;
use chronoshard_cluster::Connections;
use chronoshard_wire::duration::Dur;
use chronoshard_worker::{
    executor::{shell::ShellOptions, ssrf::SsrfGuard, Builtins},
    Handlers, Options, QueueLimits, Worker,
};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// The settings of `chronoshard worker`, defined once (`crate::config`: each is a flag, a
/// `CHRONOSHARD_*` variable and a key of the config file).
#[derive(clap::Args, Serialize, Debug, Clone)]
pub struct WorkerArgs {
    #[command(flatten)]
    #[serde(skip)]
    pub file: crate::config::ConfigFlags,
    /// NATS server URL of the platform (several, comma-separated, for a NATS cluster).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats: String,
    /// Worker id: unique among the platform's workers (it names the journal file).
    #[arg(long, env = "CHRONOSHARD_WORKER_ID")]
    pub id: String,
    /// Directory of the ticket journal; keep it across restarts of this worker.
    #[arg(
        long,
        env = "CHRONOSHARD_WORKER_DATA",
        default_value = "./chronoshard-worker"
    )]
    pub data: PathBuf,
    /// Tickets of each queue run at once.
    #[arg(long, env = "CHRONOSHARD_WORKER_CONCURRENCY", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub concurrency: u32,
    /// Tickets of each queue started per second at most (default: no limit).
    #[arg(long, env = "CHRONOSHARD_WORKER_RATE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// How long in-flight tickets may finish after SIGTERM (e.g. `30s`).
    #[arg(long, default_value = "10s")]
    pub drain_grace: Dur,
    /// An execution that ends within this time is reported by its final result alone; a longer
    /// one reports `started` when it is over (so its run shows `running`). `0s` reports every
    /// start at once.
    #[arg(long, default_value = "100ms")]
    pub start_report_delay: Dur,
    /// HTTP targets allowed although private, loopback or link-local: a CIDR block
    /// (`10.1.0.0/16`), an address, or a host name. Repeat the flag for more.
    #[arg(long, value_delimiter = ',')]
    pub http_allow: Vec<String>,
    /// Serve the `shell` queue (off by default).
    #[arg(long)]
    pub shell: bool,
    /// Commands shell jobs may run, exactly as the job names them. Repeat for more.
    #[arg(long, value_delimiter = ',')]
    pub shell_allow: Vec<String>,
    /// CPU seconds a shell command may use.
    #[arg(long, default_value_t = 60)]
    pub shell_cpu_seconds: u64,
    /// Address space a shell command may map, in MiB.
    #[arg(long, default_value_t = 512)]
    pub shell_memory_mb: u64,
    /// Files a shell command may have open.
    #[arg(long, default_value_t = 256)]
    pub shell_open_files: u64,
    /// Bytes of a shell command's output kept with its attempt (at most 65536).
    #[arg(long, default_value_t = 64 * 1024,
          value_parser = clap::value_parser!(u32).range(0..=65_536))]
    pub shell_output_limit: u32,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. `0.0.0.0:9464`). Unset: none.
    #[arg(long, value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<std::net::SocketAddr>,
}

impl WorkerArgs {
    pub fn options(&self) -> anyhow::Result<Options> {
        let mut opts = Options::new(&self.id, &self.data);
        opts.drain_grace = self.drain_grace.0;
        opts.start_report_delay = self.start_report_delay.0;
        if self.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
            anyhow::bail!("--rate must be a positive number of tickets per second");
        }
        opts.handlers = Builtins {
            http: SsrfGuard::new(&self.http_allow).context("--http-allow")?,
            shell: ShellOptions {
                enabled: self.shell,
                allow: self.shell_allow.clone(),
                cpu_seconds: self.shell_cpu_seconds,
                memory_bytes: self.shell_memory_mb.saturating_mul(1024 * 1024),
                open_files: self.shell_open_files,
                output_limit: self.shell_output_limit as usize,
            },
            limits: QueueLimits {
                concurrency: self.concurrency as usize,
                rate_per_second: self.rate,
            },
        }
        .register(Handlers::new())?;
        Ok(opts)
    }
}

/// Runs the worker until `shutdown` fires, then drains it.
pub async fn run(args: WorkerArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let opts = args.options()?;
    let nats = Connections::connect(&args.nats, &format!("chronoshard-worker {}", args.id))
        .await
        .with_context(|| format!("cannot connect to NATS at {}", args.nats))?;
    let metrics = crate::config::serve_metrics(args.metrics, &shutdown).await?;
    if let Some(addr) = metrics {
        println!(
            "chronoshard worker {}: metrics at http://{addr}/metrics",
            args.id
        );
    }
    let task = Worker::start(opts, nats, shutdown).await?;
    task.await.context("worker task")?;
    Ok(())
}
