//! `chronoshard`: the one binary. Subcommands only; each is a library call.

use std::{net::SocketAddr, path::PathBuf};

use chronoshard::{
    config,
    dev::{DevOptions, Platform},
    node::NodeFile,
    worker::WorkerFile,
};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "chronoshard",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("CHRONOSHARD_COMMIT"), ")"),
    about = "Sharded job scheduling platform"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the whole platform on this machine: nats-server, control plane, shard nodes, workers.
    Dev {
        /// Data directory: shard databases, JetStream store, admin token. Kept across restarts.
        #[arg(long, env = "CHRONOSHARD_DATA", default_value = "./chronoshard-data")]
        data: PathBuf,
        /// Address of the REST API.
        #[arg(long, env = "CHRONOSHARD_HTTP", default_value = "127.0.0.1:8080")]
        http: SocketAddr,
        /// Number of shard nodes.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
        shard_nodes: u16,
        /// Number of workers.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(0..=64))]
        workers: u16,
        /// Admin token (default: generated once and kept in DATA/admin-token).
        #[arg(long, env = "CHRONOSHARD_TOKEN")]
        token: Option<String>,
        /// Shard count of a new data directory.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
        shards: u32,
        /// Keep the shard databases in this PostgreSQL database (one schema per shard, e.g.
        /// `postgres://user@127.0.0.1:5432/chronoshard`) instead of SQLite files under DATA.
        #[arg(long, env = "CHRONOSHARD_POSTGRES")]
        postgres: Option<String>,
    },
    /// Run one worker against a platform's NATS: the built-in `http` executor, and `shell` when
    /// enabled. SIGTERM drains it (in-flight tickets finish within the grace) and exits 0.
    Worker(chronoshard::worker::WorkerArgs),
    /// Run one shard node against a platform's NATS: it owns the shards the control plane assigns
    /// to it, in SQLite files under DATA/shards (the directory of `chronoshard dev --data DATA`)
    /// or in PostgreSQL. SIGTERM closes its shards and deregisters it; exit 0.
    ShardNode(chronoshard::node::ShardNodeArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = parse()?;
    chronoshard_telemetry::init_logging(
        std::env::var("CHRONOSHARD_LOG_JSON").is_ok_and(|v| v == "1"),
    );
    match cli.command {
        Command::Dev {
            data,
            http,
            shard_nodes,
            workers,
            token,
            shards,
            postgres,
        } => {
            let mut opts = DevOptions::new(data);
            opts.http = http;
            opts.shard_nodes = shard_nodes as usize;
            opts.workers = workers as usize;
            opts.token = token;
            opts.shards = shards;
            opts.postgres = postgres;
            let data = opts.data.clone();
            let platform = Platform::start(opts).await?;
            println!("chronoshard dev is ready");
            println!("  url:    {}", platform.url);
            println!("  docs:   {}/docs", platform.url);
            println!("  token:  {}", platform.token);
            println!("  data:   {}", data.display());
            println!(
                "  nats:   {} (nats-server {})",
                platform.nats_url, platform.nats_version
            );
            println!("press Ctrl-C to stop");
            shutdown_signal().await;
            println!("stopping");
            platform.stop().await?;
            println!("stopped");
        }
        Command::Worker(args) if args.dump_config => {
            print!("{}", toml::to_string(&WorkerFile::of(&args))?);
        }
        Command::Worker(args) => {
            let shutdown = tokio_util::sync::CancellationToken::new();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                shutdown_signal().await;
                stop.cancel();
            });
            chronoshard::worker::run(args, shutdown).await?;
        }
        Command::ShardNode(args) if args.dump_config => {
            args.options()?;
            print!("{}", toml::to_string(&NodeFile::of(&args))?);
        }
        Command::ShardNode(args) => {
            let shutdown = tokio_util::sync::CancellationToken::new();
            // Listening before the node says it is ready, so a SIGTERM right after is a stop.
            let signal = shutdown_signal();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                signal.await;
                stop.cancel();
            });
            chronoshard::node::run(args, shutdown).await?;
        }
    }
    Ok(())
}

/// Parses the command line, with a role's config file (if any) as the defaults of its flags.
fn parse() -> anyhow::Result<Cli> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut cmd = Cli::command();
    // Only the subcommand given reads a file (a flag's value may spell another's name).
    match args.get(1).and_then(|a| a.to_str()) {
        Some(sub @ "worker") => {
            if let Some(path) = config::path_for(sub, &args) {
                let file: WorkerFile = config::load(&path)?;
                cmd = cmd.mut_subcommand(sub, |c| config::with_defaults(c, file.as_defaults()));
            }
        }
        Some(sub @ "shard-node") => {
            if let Some(path) = config::path_for(sub, &args) {
                let file: NodeFile = config::load(&path)?;
                cmd = cmd.mut_subcommand(sub, |c| config::with_defaults(c, file.as_defaults()));
            }
        }
        _ => {}
    }
    let matches = cmd.get_matches_from(args);
    Ok(Cli::from_arg_matches(&matches)?)
}

/// SIGINT (Ctrl-C) or SIGTERM. The handlers are installed when this is called, not when the
/// future is first polled, so a signal that comes in between is not lost.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    }
}
