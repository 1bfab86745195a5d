//! The `raw` command: only the JetStream ceiling, on a given nats-server or on one started here
//! (in a temp dir, on a free port, stopped at the end).

use std::path::PathBuf;

use anyhow::Context;
use chrono::Utc;

use crate::{
    args::RawArgs,
    machine,
    raw::{self, RawOptions},
    report::{self, PlatformInfo, Report},
    run::new_run_id,
};

pub async fn run(args: RawArgs) -> anyhow::Result<(Report, PathBuf)> {
    let run_id = new_run_id();
    let dir = args.out.join(format!("raw-{run_id}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut report = Report {
        version: report::VERSION,
        run_id: run_id.clone(),
        scenario: "raw".into(),
        params: serde_json::json!({"count": args.count, "rate": args.rate, "window": args.window}),
        started_at: Utc::now(),
        ..Default::default()
    };
    let (machine, wake_warning) = machine::measured().await;
    report.machine = machine;
    report.warnings.extend(wake_warning);
    let mut own = None;
    let nats_url = match &args.nats {
        Some(url) => url.clone(),
        None => {
            let binary = chronoshard_natsd::find()?;
            let opts = chronoshard_natsd::Options::in_dir(&dir.join("nats"));
            let server = chronoshard_natsd::Server::start(binary, &opts).await?;
            report.platform.nats_version = server.binary.version.clone();
            let url = server.url();
            own = Some(server);
            url
        }
    };
    report.platform = PlatformInfo {
        nats_url: nats_url.clone(),
        spawned: own.is_some(),
        ..report.platform
    };
    // What a round trip costs: this process (publisher and consumers) and the nats-server when
    // it is this run's own.
    let mut watched = vec![("chronoshard-loadtest".to_string(), std::process::id())];
    if let Some(pid) = own.as_ref().and_then(|s| s.pid()) {
        watched.push(("nats-server".into(), pid));
    }
    let before = crate::probe::procs::CpuSnapshot::take(&watched);
    let measured = raw::run(&RawOptions {
        nats_url,
        run_id,
        count: args.count,
        rate_per_s: args.rate,
        window: args.window.max(1),
        timeout: std::time::Duration::from_secs(300),
    })
    .await
    .map(|mut m| {
        m.cpu_us_per_round_trip = before.cpu_since(args.count);
        m
    });
    if let Some(mut server) = own {
        let _ = server.stop().await;
        let _ = std::fs::remove_dir_all(dir.join("nats"));
    }
    report.raw = Some(measured?);
    report.machine.load_end = machine::load();
    report.finished_at = Utc::now();
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(dir.join("report.html"), report::html::render(&report))?;
    Ok((report, dir))
}
