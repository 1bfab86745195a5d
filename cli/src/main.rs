//! `chronoshard`: the one binary. Subcommands only; each is a library call.

use std::{net::SocketAddr, path::PathBuf};

use chronoshard::{
    config,
    dev::{DevOptions, Platform},
    worker::WorkerFile,
};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "chronoshard",
    version,
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
    }
    Ok(())
}

/// Parses the command line, with a role's config file (if any) as the defaults of its flags.
fn parse() -> anyhow::Result<Cli> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut cmd = Cli::command();
    if let Some(path) = config::path_for("worker", &args) {
        let file: WorkerFile = config::load(&path)?;
        cmd = cmd.mut_subcommand("worker", |c| config::with_defaults(c, file.as_defaults()));
    }
    let matches = cmd.get_matches_from(args);
    Ok(Cli::from_arg_matches(&matches)?)
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
