//! The command line. Scenario settings that depend on the scenario have no clap default: the
//! scenario's own default applies (`Settings::resolve`), and the report records what was used.

use std::path::PathBuf;

use chronoshard_wire::{rpc::Sharding, Dur};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{probe::noop::NoopWorkerArgs, scenario::Kind};

#[derive(Parser, Debug)]
#[command(
    name = "chronoshard-loadtest",
    version,
    about = "Load tests for chronoshard: how many jobs per second, how late they fire, and whether anything is lost or doubled"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// N one-shot jobs all due at the same instant: peak fire and end-to-end throughput.
    Burst(RunArgs),
    /// N one-shot jobs due uniformly over a window: lateness at a steady rate (default 5,000/s).
    Spread(RunArgs),
    /// K cron jobs each firing every second, counted over a window.
    CronFleet(RunArgs),
    /// A spread over many tenants, half of the jobs in one big tenant: fairness.
    Tenants(RunArgs),
    /// A spread during which a shard node process and a worker process are killed (SIGKILL):
    /// nothing may be lost or doubled. Starts the platform itself.
    Fault(RunArgs),
    /// A spread during which shards are added (`POST /v1/shards`) and a shard node joins:
    /// throughput and lateness before, during and after the growth. Starts the platform itself.
    Grow(RunArgs),
    /// Only the machine's JetStream ceiling: publish → consume → result publish → consume.
    Raw(RawArgs),
    /// (internal) A no-op worker process; started by the runner.
    #[command(hide = true)]
    NoopWorker(NoopWorkerArgs),
}

impl Command {
    pub fn kind(&self) -> Option<Kind> {
        Some(match self {
            Command::Burst(_) => Kind::Burst,
            Command::Spread(_) => Kind::Spread,
            Command::CronFleet(_) => Kind::CronFleet,
            Command::Tenants(_) => Kind::Tenants,
            Command::Fault(_) => Kind::Fault,
            Command::Grow(_) => Kind::Grow,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// A queue target run by this tool's no-op workers (the worker SDK, no executor cost).
    Noop,
    /// An HTTP target on this tool's sink, run by the platform's own workers.
    Http,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kill {
    Node,
    Worker,
    Both,
}

/// Where the platform is, and how this run watches and reports.
#[derive(Args, Clone, Debug)]
pub struct Common {
    /// REST API of a running platform. Without it, the run starts its own (`chronoshard dev`
    /// in a temp dir) and stops it at the end.
    #[arg(long, env = "CHRONOSHARD_URL", requires_all = ["token", "nats"])]
    pub url: Option<String>,
    /// Admin token of that platform (used only with --url).
    #[arg(long, env = "CHRONOSHARD_TOKEN")]
    pub token: Option<String>,
    /// NATS URL of that platform, where the probes and no-op workers connect (used only with
    /// --url).
    #[arg(long, env = "CHRONOSHARD_NATS")]
    pub nats: Option<String>,
    /// The `chronoshard` binary to start (default: next to this program, then PATH).
    #[arg(long)]
    pub chronoshard: Option<PathBuf>,
    /// Shard nodes of a platform this run starts.
    #[arg(long, default_value_t = 2)]
    pub shard_nodes: usize,
    /// Shards of a platform this run starts (default 8; `grow`: 4, the count before it adds).
    #[arg(long)]
    pub shards: Option<u32>,
    /// Sharding mode of a platform this run starts (default tenant; `grow` adds shards to
    /// `tenant` only).
    #[arg(long, value_enum, conflicts_with = "url")]
    pub sharding: Option<Sharding>,
    /// Who executes the tickets.
    #[arg(long, value_enum, default_value_t = Target::Noop)]
    pub target: Target,
    /// No-op worker processes.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Tickets each no-op worker runs at once.
    #[arg(long, default_value_t = 256)]
    pub worker_concurrency: usize,
    /// The no-op workers' ack wait: how long a delivery of a killed worker waits before it is
    /// delivered again (the platform's default is 30s).
    #[arg(long, default_value = "30s")]
    pub worker_ack_wait: Dur,
    /// How long each no-op execution lasts (0 = returns at once); with `fault`, work in flight
    /// is what a worker kill interrupts.
    #[arg(long, default_value = "0ms")]
    pub work: Dur,
    /// Also measure the raw JetStream ceiling in this run, and state figures as ratios to it.
    #[arg(long)]
    pub raw: bool,
    /// Reports go to OUT/<scenario>-<run id>/ (report.json, report.html, process logs).
    #[arg(long, default_value = "loadtest-results")]
    pub out: PathBuf,
    /// Width of the timeline's buckets.
    #[arg(long, default_value = "250ms")]
    pub bucket: Dur,
    /// How long to wait, after the last occurrence was due, for everything to finish.
    #[arg(long, default_value = "60s")]
    pub drain_timeout: Dur,
    /// Skip reading every job's runs through the API at the end (faster for huge runs; the
    /// platform's own `missed`/`skipped` records are then not consulted).
    #[arg(long)]
    pub no_verify: bool,
    /// Keep the data directory of a platform this run started (shard databases, JetStream
    /// store); by default only its logs stay.
    #[arg(long)]
    pub keep_data: bool,
    /// More processes to sample for CPU and memory, as NAME=PID (for a platform not started
    /// here).
    #[arg(long = "pid", value_parser = parse_pid)]
    pub pids: Vec<(String, u32)>,
}

/// A scenario's settings; absent ones take the scenario's default.
#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: Common,
    /// Jobs to create (cron-fleet: cron jobs).
    #[arg(long)]
    pub jobs: Option<u64>,
    /// Tenants the jobs are spread over.
    #[arg(long)]
    pub tenants: Option<u64>,
    /// Window the due times are spread over (cron-fleet: how long occurrences are counted).
    #[arg(long)]
    pub window: Option<Dur>,
    /// Job creations per second through the API (0 = as fast as --create-concurrency allows).
    #[arg(long)]
    pub create_rate: Option<f64>,
    /// Most create requests in flight.
    #[arg(long, default_value_t = 256)]
    pub create_concurrency: usize,
    /// fault: what to kill.
    #[arg(long, value_enum, default_value_t = Kill::Both)]
    pub kill: Kill,
    /// fault: when to kill, as a fraction of the window.
    #[arg(long, default_value_t = 0.3)]
    pub kill_at: f64,
    /// grow: shards to add (`POST /v1/shards {"add": N}`).
    #[arg(long, default_value_t = 4)]
    pub add_shards: u32,
    /// grow: when to add them, as a fraction of the window.
    #[arg(long, default_value_t = 0.3)]
    pub grow_at: f64,
    /// grow: when to start one more shard node process, as a fraction of the window.
    #[arg(long, default_value_t = 0.6)]
    pub join_at: f64,
}

#[derive(Args, Clone, Debug)]
pub struct RawArgs {
    /// NATS URL; without it the run starts its own nats-server (in a temp dir, stopped at the
    /// end).
    #[arg(long, env = "CHRONOSHARD_NATS")]
    pub nats: Option<String>,
    /// Accepted for symmetry with the scenarios; `raw` needs no `chronoshard` binary.
    #[arg(long, hide = true)]
    pub chronoshard: Option<PathBuf>,
    /// Round trips to measure.
    #[arg(long, default_value_t = 100_000)]
    pub count: u64,
    /// Open-loop rate (0 = as fast as the pipeline goes: the throughput ceiling).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Publish acks awaited at once.
    #[arg(long, default_value_t = 1024)]
    pub window: usize,
    #[arg(long, default_value = "loadtest-results")]
    pub out: PathBuf,
}

fn parse_pid(s: &str) -> Result<(String, u32), String> {
    let (name, pid) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected NAME=PID"))?;
    let pid = pid
        .parse()
        .map_err(|_| format!("`{pid}` is not a process id"))?;
    Ok((name.to_string(), pid))
}

/// A scenario's settings with its defaults filled in.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Settings {
    pub jobs: u64,
    pub tenants: u64,
    pub window_ms: u64,
    pub create_rate: f64,
    pub create_concurrency: usize,
    pub target: Target,
    pub workers: usize,
    pub worker_concurrency: usize,
    pub shard_nodes: usize,
    pub shards: u32,
    /// Absent for a platform the run did not start.
    pub sharding: Option<Sharding>,
    pub kill: Option<Kill>,
    pub kill_at: f64,
    /// `grow` only: shards added, and when (fractions of the window) they are added and a
    /// node joins.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grow: Option<GrowSettings>,
}

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct GrowSettings {
    pub add_shards: u32,
    pub grow_at: f64,
    pub join_at: f64,
}

impl Settings {
    pub fn resolve(kind: Kind, a: &RunArgs) -> Settings {
        // (jobs, tenants, window s, create rate/s)
        let (jobs, tenants, window, rate) = match kind {
            Kind::Burst => (20_000, 64, 0, 2_000.0),
            Kind::Spread => (25_000, 64, 5, 2_000.0),
            Kind::CronFleet => (1_000, 64, 20, 1_000.0),
            Kind::Tenants => (25_000, 500, 5, 2_000.0),
            Kind::Fault => (20_000, 64, 20, 2_000.0),
            Kind::Grow => (20_000, 200, 30, 2_000.0),
        };
        let shards = if kind == Kind::Grow { 4 } else { 8 };
        Settings {
            jobs: a.jobs.unwrap_or(jobs),
            tenants: a.tenants.unwrap_or(tenants).max(1),
            window_ms: a
                .window
                .map(|w| w.0.as_millis() as u64)
                .unwrap_or(window * 1000),
            create_rate: a.create_rate.unwrap_or(rate).max(0.0),
            create_concurrency: a.create_concurrency.max(1),
            target: a.common.target,
            workers: a.common.workers,
            worker_concurrency: a.common.worker_concurrency.max(1),
            shard_nodes: a.common.shard_nodes.max(1),
            shards: a.common.shards.unwrap_or(shards),
            sharding: match a.common.url {
                Some(_) => None,
                None => Some(a.common.sharding.unwrap_or_default()),
            },
            kill: (kind == Kind::Fault).then_some(a.kill),
            kill_at: a.kill_at.clamp(0.0, 1.0),
            grow: (kind == Kind::Grow).then(|| GrowSettings {
                add_shards: a.add_shards,
                grow_at: a.grow_at.clamp(0.0, 1.0),
                join_at: a.join_at.clamp(0.0, 1.0),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_defaults_apply_only_where_nothing_was_given() {
        let cli = Cli::try_parse_from(["lt", "spread", "--jobs", "10", "--window", "2s"]).unwrap();
        let Command::Spread(a) = &cli.command else {
            panic!("spread")
        };
        let s = Settings::resolve(Kind::Spread, a);
        assert_eq!((s.jobs, s.window_ms, s.tenants), (10, 2000, 64));
        assert_eq!(s.create_rate, 2000.0);
        assert!(s.kill.is_none());
        assert!(s.grow.is_none());
        assert_eq!(s.shards, 8);
    }

    #[test]
    fn grow_starts_from_4_shards_and_adds_4_at_30_percent() {
        let cli = Cli::try_parse_from(["lt", "grow"]).unwrap();
        let Command::Grow(a) = &cli.command else {
            panic!("grow")
        };
        let s = Settings::resolve(Kind::Grow, a);
        assert_eq!(
            (s.jobs, s.window_ms, s.tenants, s.shards),
            (20_000, 30_000, 200, 4)
        );
        let g = s.grow.unwrap();
        assert_eq!((g.add_shards, g.grow_at, g.join_at), (4, 0.3, 0.6));
    }

    #[test]
    fn bad_input_is_refused_with_the_reason() {
        let e = Cli::try_parse_from(["lt", "burst", "--pid", "nats"]).unwrap_err();
        assert!(e.to_string().contains("expected NAME=PID"), "{e}");
        let e = Cli::try_parse_from(["lt", "burst", "--url", "http://x"]).unwrap_err();
        assert!(e.to_string().contains("--token"), "{e}");
        let e = Cli::try_parse_from(["lt", "spread", "--window", "soon"]).unwrap_err();
        assert!(e.to_string().contains("soon"), "{e}");
    }
}
