//! `chronoshard-loadtest`: subcommands only; each is a library call.

use chronoshard_loadtest::{
    args::{Cli, Command},
    probe::noop,
    raw_only,
    report::text,
    run,
};
use clap::Parser;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,async_nats=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let kind = cli.command.kind();
    match cli.command {
        Command::NoopWorker(args) => {
            let shutdown = CancellationToken::new();
            let stop = shutdown.clone();
            let interrupt = run::interrupted()?;
            tokio::spawn(async move {
                interrupt.await;
                stop.cancel();
            });
            noop::run(args, shutdown).await
        }
        Command::Raw(args) => {
            let (report, dir) = raw_only::run(args).await?;
            println!("{}", text::summary(&report, &dir));
            Ok(())
        }
        Command::Burst(args)
        | Command::Spread(args)
        | Command::CronFleet(args)
        | Command::Tenants(args)
        | Command::Fault(args)
        | Command::Grow(args) => {
            let kind = kind.expect("a scenario command has a kind");
            let (report, dir) = run::run(kind, args).await?;
            println!("{}", text::summary(&report, &dir));
            if text::lost_or_doubled(&report) {
                anyhow::bail!("occurrences were lost or doubled: see the report");
            }
            if text::growth_unfinished(&report) {
                anyhow::bail!("the shards added did not finish moving tenants: see the report");
            }
            Ok(())
        }
    }
}
