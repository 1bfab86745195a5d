//! `chronoshard`: the one binary. Subcommands only; each is a library call.

use chronoshard::{
    config,
    dev::{DevArgs, Platform},
};
use chronoshard_telemetry::traces::{Role, Traces};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "chronoshard",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("CHRONOSHARD_COMMIT"), ")"),
    about = "Sharded job scheduling platform: its roles, and a client of its REST API"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the whole platform on this machine: nats-server, control plane, shard nodes, workers.
    Dev(DevArgs),
    /// Run one control-plane replica against a platform's NATS: the REST API, and (while it
    /// holds the leader lease) shard assignment. SIGTERM stops it; a leader hands over at once.
    ControlPlane(chronoshard::control_plane::ControlPlaneArgs),
    /// Run one worker against a platform's NATS: the built-in `http` executor, and `shell` when
    /// enabled. SIGTERM drains it (in-flight tickets finish within the grace) and exits 0.
    Worker(chronoshard::worker::WorkerArgs),
    /// Run one shard node against a platform's NATS: it owns the shards the control plane assigns
    /// to it, in SQLite files under DATA/shards (the directory of `chronoshard dev --data DATA`)
    /// or in PostgreSQL. SIGTERM closes its shards and deregisters it; exit 0.
    ShardNode(chronoshard::node::ShardNodeArgs),
    /// The client verbs (`jobs`, `runs`, `tickets`, `dlq`, `preview`, `shards`, `nodes`,
    /// `workers`): calls of a platform's REST API; docs/cli.md.
    #[command(flatten)]
    Client(chronoshard::client::ClientCommand),
}

/// The production roles: configured by flags, variables and a file (`config`).
const ROLES: &[&str] = &["control-plane", "shard-node", "worker"];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = parse()?;
    let json = std::env::var("CHRONOSHARD_LOG_JSON").is_ok_and(|v| v == "1");
    let traces = match traced_role(&cli.command) {
        Some(role) => chronoshard_telemetry::init(json, role)?,
        // A client verb logs nothing: stdout is its output.
        None if matches!(cli.command, Command::Client(_)) => Traces::off(),
        None => {
            chronoshard_telemetry::init_logging(json);
            Traces::off()
        }
    };
    let ran = run(cli.command).await;
    // After the role stopped: its last spans are sent before the process ends.
    traces.shutdown();
    ran
}

/// The role whose spans this process exports (when the `OTEL_*` variables ask for it): none for
/// a client verb or `--dump-config`.
fn traced_role(command: &Command) -> Option<Role> {
    match command {
        Command::Dev(_) => Some(Role::Dev),
        Command::ControlPlane(a) if !a.file.dump_config => Some(Role::ControlPlane),
        Command::ShardNode(a) if !a.file.dump_config => Some(Role::ShardNode),
        Command::Worker(a) if !a.file.dump_config => Some(Role::Worker),
        _ => None,
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        // Its own exit codes (docs/cli.md), its errors already printed.
        Command::Client(verb) => std::process::exit(chronoshard::client::run(verb).await.into()),
        Command::Dev(args) => {
            let opts = args.options()?;
            let data = opts.data.clone();
            let platform = Platform::start(opts).await?;
            println!("chronoshard dev is ready");
            println!("  url:    {}", platform.url);
            println!("  docs:   {}/docs", platform.url);
            println!("  token:  {}", platform.token);
            println!("  data:   {}", data.display());
            println!(
                "  shards: {} ({} sharding)",
                platform.shard_count, platform.sharding
            );
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
        Command::ControlPlane(args) if args.file.dump_config => {
            args.options()?;
            print!("{}", config::dump(&args)?);
        }
        Command::ControlPlane(args) => {
            chronoshard::control_plane::run(args, stop_on_signal()).await?;
        }
        Command::Worker(args) if args.file.dump_config => {
            args.options()?;
            print!("{}", config::dump(&args)?);
        }
        Command::Worker(args) => {
            chronoshard::worker::run(args, stop_on_signal()).await?;
        }
        Command::ShardNode(args) if args.file.dump_config => {
            args.options()?;
            print!("{}", config::dump(&args)?);
        }
        Command::ShardNode(args) => {
            chronoshard::node::run(args, stop_on_signal()).await?;
        }
    }
    Ok(())
}

/// A token cancelled by SIGINT or SIGTERM. Listening starts before the role says it is ready,
/// so a signal right after is a stop.
fn stop_on_signal() -> tokio_util::sync::CancellationToken {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let signal = shutdown_signal();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        signal.await;
        stop.cancel();
    });
    shutdown
}

/// Parses the command line; a production role's settings get their variables and its config
/// file (if any) as the defaults of its flags.
fn parse() -> anyhow::Result<Cli> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut cmd = Cli::command();
    // Only the subcommand given reads a file (a flag's value may spell another's name).
    if let Some(sub) = args.get(1).and_then(|a| a.to_str()) {
        if ROLES.contains(&sub) {
            let mut role = cmd
                .find_subcommand(sub)
                .cloned()
                .map(config::with_env)
                .expect("a role is a subcommand");
            if let Some(path) = config::path_for(sub, &args) {
                role = config::with_file(role, &path)?;
            }
            cmd = cmd.mut_subcommand(sub, |_| role);
        }
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
