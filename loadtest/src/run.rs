//! One run of a scenario, start to finish: bring up (or reach) the platform, start the probes and
//! workers, optionally measure the raw ceiling, create the jobs, inject faults, wait until every
//! owed occurrence is done (`drain.rs`; or the drain deadline passes), read every job's runs back,
//! then check, summarize and write the report. This module orders the steps and holds the small
//! steps no other module owns (fault injection, adding shards and a node, deleting the cron
//! fleet, reading runs).

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use chronoshard_wire::rpc::Sharding;
use futures::{stream, StreamExt};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{
    api::Api,
    args::{GrowSettings, Kill, RunArgs, Settings, Target},
    check::{check, Evidence},
    create::{create_all, CreateOptions},
    drain, machine,
    platform::{find_chronoshard, Platform, SpawnOptions},
    probe::{self, noop::NoopWorkerArgs, procs, sink::HttpSink},
    progress::{now_us, spawn_progress, Counters},
    raw::{self, RawOptions},
    report::{self, Event, PlatformInfo, Report},
    scenario::{self, Kind, Shape},
    summary::{self, GrowthSeen, Records},
};

/// Shared by the steps of a run.
struct Ctx {
    run_id: String,
    dir: PathBuf,
    start_us: i64,
    counters: Arc<Counters>,
    phase: Arc<Mutex<String>>,
    events: Vec<Event>,
    warnings: Vec<String>,
}

impl Ctx {
    fn phase(&self, p: &str) {
        if let Ok(mut g) = self.phase.lock() {
            *g = p.to_string();
        }
    }

    fn event(&mut self, what: String) {
        eprintln!("{what}");
        self.events.push(Event {
            t_s: (now_us() - self.start_us) as f64 / 1e6,
            what,
        });
    }
}

/// A short random id: names this run's tenants, queue and output directory.
pub fn new_run_id() -> String {
    Uuid::new_v4().simple().to_string()[..8].to_string()
}

pub async fn run(kind: Kind, args: RunArgs) -> anyhow::Result<(Report, PathBuf)> {
    let settings = Settings::resolve(kind, &args);
    let run_id = new_run_id();
    let dir = args.common.out.join(format!("{}-{run_id}", kind.name()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut ctx = Ctx {
        run_id: run_id.clone(),
        dir: dir.clone(),
        start_us: now_us(),
        counters: Arc::new(Counters::default()),
        phase: Arc::new(Mutex::new("starting".into())),
        events: Vec::new(),
        warnings: Vec::new(),
    };
    let started_at = Utc::now();
    let (machine, wake_warning) = machine::measured().await;
    ctx.warnings.extend(wake_warning);
    let mut report = Report {
        version: report::VERSION,
        run_id: run_id.clone(),
        scenario: kind.name().into(),
        params: serde_json::to_value(&settings)?,
        started_at,
        machine,
        ..Default::default()
    };
    eprintln!("run {run_id}: {} {}", kind.name(), report.params);
    let stop_progress = CancellationToken::new();
    let progress = spawn_progress(
        ctx.counters.clone(),
        ctx.phase.clone(),
        ctx.start_us,
        stop_progress.clone(),
    );

    // Registered before any process starts, so a SIGINT or SIGTERM from here on stops what this
    // run started instead of killing this process alone and leaving the platform running.
    let interrupt = interrupted()?;
    tokio::pin!(interrupt);
    let mut platform = tokio::select! {
        p = reach_platform(kind, &args, &settings, &dir) => p?,
        why = &mut interrupt => bail!("interrupted by {why} while the platform was starting"),
    };
    let result = tokio::select! {
        r = drive(&mut ctx, &mut report, &mut platform, kind, &args, &settings) => r,
        why = &mut interrupt => Err(anyhow::anyhow!(
            "interrupted by {why}: stopped the processes this run started; no report written"
        )),
    };
    ctx.phase("stopping");
    platform.stop().await;
    stop_progress.cancel();
    let _ = progress.await;
    result?;
    if !args.common.keep_data && report.platform.spawned {
        let _ = std::fs::remove_dir_all(dir.join("platform"));
    }
    report.events = std::mem::take(&mut ctx.events);
    report.warnings = std::mem::take(&mut ctx.warnings);
    report.machine.load_end = machine::load();
    report.finished_at = Utc::now();
    write(&report, &dir)?;
    Ok((report, dir))
}

/// Resolves with the signal's name at the first SIGINT or SIGTERM.
pub fn interrupted() -> anyhow::Result<impl std::future::Future<Output = &'static str>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        }
    })
}

async fn reach_platform(
    kind: Kind,
    args: &RunArgs,
    s: &Settings,
    dir: &std::path::Path,
) -> anyhow::Result<Platform> {
    let c = &args.common;
    if let (Some(url), Some(token), Some(nats)) = (&c.url, &c.token, &c.nats) {
        if kind == Kind::Fault && s.kill != Some(Kill::Worker) {
            bail!("fault with --kill node|both needs a platform this run starts (leave out --url), or use --kill worker");
        }
        if kind == Kind::Grow {
            bail!("grow starts a shard node process: it needs a platform this run starts (leave out --url)");
        }
        return Ok(Platform::external(url, token, nats, dir));
    }
    if kind == Kind::Grow && s.sharding == Some(Sharding::TimeWindow) {
        bail!("grow measures tenants moving while jobs fire; a time_window cluster moves jobs only from the added layout's first window, a horizon and a window after the add, beyond what this run fires: use --sharding tenant");
    }
    if matches!(s.kill, Some(Kill::Worker | Kill::Both))
        && (s.target != Target::Noop || s.workers == 0)
    {
        bail!("fault with --kill worker|both kills a no-op worker: it needs --target noop and --workers 1 or more");
    }
    // `grow` runs a node as its own process too, as a cluster of separate nodes would.
    let kills_node = matches!(s.kill, Some(Kill::Node | Kill::Both));
    let node_processes = if kills_node || kind == Kind::Grow {
        s.shard_nodes.max(2) - 1
    } else {
        0
    };
    let opts = SpawnOptions {
        chronoshard: find_chronoshard(c.chronoshard.as_deref())?,
        dir: dir.to_path_buf(),
        dev_nodes: s.shard_nodes.max(1 + node_processes) - node_processes,
        node_processes,
        dev_workers: if s.target == Target::Http {
            s.workers
        } else {
            0
        },
        shards: s.shards,
        sharding: s.sharding.unwrap_or_default(),
    };
    eprintln!(
        "starting {} ({} shard nodes in it, {} as their own processes)",
        opts.chronoshard.display(),
        opts.dev_nodes,
        opts.node_processes
    );
    Platform::spawn(&opts).await
}

async fn drive(
    ctx: &mut Ctx,
    report: &mut Report,
    platform: &mut Platform,
    kind: Kind,
    args: &RunArgs,
    s: &Settings,
) -> anyhow::Result<()> {
    let api = Api::new(&platform.url, &platform.token);
    // A platform this run started has already said it is ready; a given one gets a few seconds.
    let patience = Duration::from_secs(if platform.spawned { 60 } else { 5 });
    wait_until("the platform is ready", patience, || api.ready()).await?;
    if platform.spawned {
        ctx.phase("waiting for every node to own shards");
        let want = platform.shard_nodes;
        wait_until(
            "every shard node owns shards",
            Duration::from_secs(60),
            || nodes_balanced(&api, want),
        )
        .await?;
    }
    report.platform = PlatformInfo {
        url: platform.url.clone(),
        nats_url: platform.nats_url.clone(),
        nats_version: platform.nats_version.clone(),
        chronoshard_version: platform.chronoshard_version.clone(),
        spawned: platform.spawned,
        shard_nodes: platform.shard_nodes,
        workers: s.workers,
    };
    // Read before anything of this run reaches the platform: the views are what it gained.
    let metrics_before = api.metrics().await;
    // Watched from here on: this process and any named with `--pid`, beside the platform's.
    if let Ok(mut w) = platform.watched.lock() {
        w.push(("chronoshard-loadtest".into(), std::process::id()));
        w.extend(args.common.pids.iter().cloned());
    }
    if args.common.raw {
        ctx.phase("raw ceiling");
        // The processes whose CPU a raw round trip costs: this one (it runs the raw publisher
        // and consumers) and the nats-server, with the platform idle beside them.
        let watched = platform
            .watched
            .lock()
            .map(|w| w.clone())
            .unwrap_or_default();
        report.raw = Some(
            measure_raw(
                &platform.nats_url,
                &ctx.run_id,
                s.jobs.max(50_000),
                &watched,
            )
            .await?,
        );
    }

    // Probes first, so nothing the platform does is missed.
    let stop_probes = CancellationToken::new();
    let dropped = probe::nats::Dropped::default();
    let feed = Arc::new(probe::nats::Feed::default());
    let watcher = probe::nats::watch(
        &platform.nats_url,
        &dropped,
        ctx.run_id.clone(),
        ctx.counters.clone(),
        feed.clone(),
        stop_probes.clone(),
    )
    .await?;
    let queue = format!("lt-{}", ctx.run_id);
    let (target, sink) = match s.target {
        Target::Noop => {
            for i in 1..=s.workers {
                let id = format!("lt-{}-w{i}", ctx.run_id);
                platform
                    .start_worker(&NoopWorkerArgs {
                        nats: platform.nats_url.clone(),
                        log: ctx.dir.join(format!("{id}.starts")),
                        data: ctx.dir.join("workers"),
                        id,
                        queue: queue.clone(),
                        concurrency: s.worker_concurrency,
                        ack_wait: args.common.worker_ack_wait,
                        work: args.common.work,
                    })
                    .await?;
            }
            (json!({"type": "queue", "queue": queue}), None)
        }
        Target::Http => {
            let sink = HttpSink::start(stop_probes.clone()).await?;
            (
                json!({"type": "http", "url": sink.url, "method": "POST"}),
                Some(sink),
            )
        }
    };
    let sampler = procs::spawn_sampler(platform.watched.clone(), stop_probes.clone());

    // The jobs: due only once every one of them can exist.
    let rate = if s.create_rate > 0.0 {
        s.create_rate
    } else {
        3_000.0
    };
    let lead = Duration::from_secs_f64(s.jobs as f64 / rate * 1.25 + 3.0);
    let first_due = Utc::now() + chrono::Duration::from_std(lead)?;
    let window = Duration::from_millis(s.window_ms);
    let plan = scenario::plan(
        &Shape {
            kind,
            jobs: s.jobs,
            tenants: s.tenants,
            window,
            first_due,
        },
        &ctx.run_id,
        &target,
    );
    ctx.phase("creating jobs");
    let specs = plan.specs.clone();
    let created = create_all(
        &api,
        specs,
        &CreateOptions {
            rate_per_s: s.create_rate,
            concurrency: s.create_concurrency,
        },
        &ctx.counters,
    )
    .await;
    let late = created
        .answered_us
        .iter()
        .filter(|&&t| t > us(first_due))
        .count();
    if late > 0 {
        ctx.warnings.push(format!(
            "{late} jobs were created after the first due time: raise --create-rate or lower --jobs"
        ));
    }
    if created.stats.failed > 0 {
        ctx.warnings.push(format!(
            "{} of {} creates failed (first: {})",
            created.stats.failed,
            created.stats.requested,
            created.stats.errors.first().cloned().unwrap_or_default()
        ));
    }
    ctx.event(format!(
        "created {} jobs at {:.0}/s; first due at +{:.1}s",
        created.stats.created,
        created.stats.achieved_per_s,
        (us(first_due) - ctx.start_us) as f64 / 1e6
    ));
    if created.max_send_delay_ms > 50.0 || created.stats.achieved_per_s < 0.95 * s.create_rate {
        ctx.warnings.push(format!(
            "the creator fell behind its schedule (up to {:.0} ms; {:.0}/s of {:.0}/s): the API, or --create-concurrency, limited the rate",
            created.max_send_delay_ms, created.stats.achieved_per_s, s.create_rate
        ));
    }
    let last_due = plan.last_due().unwrap_or(first_due);
    let jobs: Vec<(Uuid, &scenario::Owed)> = created
        .ids
        .iter()
        .zip(&plan.owed)
        .filter_map(|(id, owed)| id.map(|id| (id, owed)))
        .collect();
    let mut remaining = drain::Remaining::new(feed.clone(), jobs.iter().map(|(j, o)| (*j, *o)));
    let deadline =
        last_due + chrono::Duration::from_std(args.common.drain_timeout.0).unwrap_or_default();

    ctx.phase("firing");
    let mut killed = HashMap::new();
    if let Some(kill) = s.kill {
        inject_faults(ctx, platform, kill, s, first_due, window, &mut killed).await?;
    }
    let growth = match s.grow {
        Some(g) => Some(grow(ctx, platform, &api, g, first_due, window, deadline).await?),
        None => None,
    };
    if kind == Kind::CronFleet {
        // Deleting cancels what is not fired yet: only once every owed second has its ticket.
        let unfired = drain::until_fired(&mut remaining, deadline).await;
        let failed = delete_jobs(&api, &created.ids).await;
        ctx.event(format!(
            "cron jobs deleted ({unfired} owed occurrences had no ticket yet)"
        ));
        if failed > 0 {
            ctx.warnings.push(format!(
                "{failed} cron jobs could not be deleted: delete them by hand"
            ));
        }
    }
    ctx.phase("draining");
    let js = async_nats::jetstream::new(async_nats::connect(&platform.nats_url).await?);
    let queue = (s.target == Target::Noop).then_some(queue.as_str());
    let drained = drain::until_done(&mut remaining, &js, queue, deadline).await;
    if drained.undone > 0 {
        ctx.warnings.push(format!(
            "drain timeout: {} owed occurrences had no success {:?} after the last was due",
            drained.undone, args.common.drain_timeout.0
        ));
    }
    if let Some(why) = drained.not_quiet {
        ctx.warnings
            .push(format!("the platform was not quiet at the end: {why}"));
    }
    let recorded_us = drained.recorded_us;
    match probe::metrics::over_run(&metrics_before, &api.metrics().await) {
        Ok(views) => report.server = views,
        Err(warning) => ctx.warnings.push(warning),
    }

    stop_probes.cancel();
    let watched = watcher.await?;
    let sampled = sampler.await?;
    let mut starts = match sink {
        Some(sink) => {
            if sink.unparsed() > 0 {
                ctx.warnings.push(format!(
                    "the HTTP sink got {} requests without the executor headers (not counted as starts)",
                    sink.unparsed()
                ));
            }
            let v = sink.starts();
            sink.stop().await;
            v
        }
        None => Vec::new(),
    };
    for entry in std::fs::read_dir(&ctx.dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "starts") {
            starts.extend(probe::noop::read_starts(&path)?);
        }
    }
    if dropped.get() > 0 {
        ctx.warnings.push(format!(
            "the watcher fell behind nats-server {} times (slow consumer): some tickets or results were not seen",
            dropped.get()
        ));
    }

    ctx.phase("verifying");
    let runs = if args.common.no_verify {
        None
    } else {
        Some(read_runs(&api, &jobs, &mut ctx.warnings).await)
    };
    report.correctness = Some(check(&Evidence {
        jobs: jobs.clone(),
        fired: &watched.fired,
        starts: &starts,
        completed: &watched.completed,
        killed: &killed,
        runs: runs.as_ref(),
    }));

    let records = Records {
        created_us: created.answered_us.clone(),
        fired: watched.fired,
        starts,
        completed: watched.completed,
        recorded_us,
    };
    let (fire, mut fire_samples) = summary::fire_phase(&records);
    let (start, mut start_samples) = summary::start_phase(&records);
    report.fire_histogram = Some(fire_samples.histogram());
    report.start_histogram = Some(start_samples.histogram());
    report.fire = Some(fire);
    if kind == Kind::Tenants {
        report.fairness = Some(summary::fairness(
            &records,
            &scenario::tenant_name(&ctx.run_id, 0),
        ));
    }
    report.start = Some(start);
    if let Some(g) = &growth {
        report.growth = Some(summary::growth(&records, g, ctx.start_us));
    }
    report.end_to_end = summary::end_to_end(&records, &sampled.cpu);
    report.create = Some(created.stats);
    report.timeline = summary::timeline(
        &records,
        ctx.start_us,
        args.common.bucket.0.as_millis() as u64,
    );
    report.processes = sampled.processes;
    report.ratios = summary::ratios(report);
    report.targets = summary::targets(report);
    Ok(())
}

fn us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

async fn wait_until_time(t: DateTime<Utc>) {
    let wait = (t - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait).await;
}

/// Polls `check` every 100 ms until it is true, for at most `timeout`.
async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn nodes_balanced(api: &Api, want: usize) -> bool {
    let Ok(v) = api.nodes().await else {
        return false;
    };
    // A node the control plane has lost stays listed for a while: it does not count.
    let nodes: Vec<Value> = v["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["status"] != "lost")
        .cloned()
        .collect();
    nodes.len() >= want
        && nodes
            .iter()
            .all(|n| n["shards"].as_array().is_some_and(|s| !s.is_empty()))
}

async fn measure_raw(
    nats: &str,
    run_id: &str,
    count: u64,
    watched: &[(String, u32)],
) -> anyhow::Result<report::RawStats> {
    let before = procs::CpuSnapshot::take(watched);
    let mut stats = raw::run(&RawOptions {
        nats_url: nats.to_string(),
        run_id: format!("{run_id}_ceiling"),
        count,
        rate_per_s: 0.0,
        window: 1024,
        timeout: Duration::from_secs(120),
    })
    .await?;
    stats.cpu_us_per_round_trip = before.cpu_since(count);
    eprintln!(
        "raw ceiling: {:.0} round trips/s, p99 {:.2} ms",
        stats.per_s, stats.round_trip_ms.p99
    );
    Ok(stats)
}

async fn inject_faults(
    ctx: &mut Ctx,
    platform: &mut Platform,
    kill: Kill,
    s: &Settings,
    first_due: DateTime<Utc>,
    window: Duration,
    killed: &mut HashMap<String, i64>,
) -> anyhow::Result<()> {
    let at = |f: f64| first_due + chrono::Duration::from_std(window.mul_f64(f)).unwrap_or_default();
    if matches!(kill, Kill::Node | Kill::Both) {
        wait_until_time(at(s.kill_at)).await;
        let node = platform.kill_node(0).await?;
        ctx.event(format!("killed shard node {node} (SIGKILL)"));
    }
    if matches!(kill, Kill::Worker | Kill::Both) {
        let when = if kill == Kill::Both {
            (s.kill_at + 1.0) / 2.0
        } else {
            s.kill_at
        };
        wait_until_time(at(when)).await;
        let (label, at_us) = platform.kill_and_restart_worker(0).await?;
        ctx.event(format!(
            "killed worker {label} (SIGKILL) and started it again"
        ));
        killed.insert(label, at_us);
    }
    Ok(())
}

/// `grow`: at `grow_at` of the window adds shards, at `join_at` starts one more shard node
/// process, and follows the growth (`GET /v1/shards` every 50 ms) until it is done or the drain
/// deadline passes.
async fn grow(
    ctx: &mut Ctx,
    platform: &mut Platform,
    api: &Api,
    g: GrowSettings,
    first_due: DateTime<Utc>,
    window: Duration,
    deadline: DateTime<Utc>,
) -> anyhow::Result<GrowthSeen> {
    let at = |f: f64| first_due + chrono::Duration::from_std(window.mul_f64(f)).unwrap_or_default();
    wait_until_time(at(g.grow_at)).await;
    let started_us = now_us();
    let map = api.add_shards(g.add_shards).await?;
    let shards_from = map["growth"]["from"]
        .as_u64()
        .or(map["shard_count"]
            .as_u64()
            .map(|n| n.saturating_sub(g.add_shards as u64)))
        .unwrap_or(0) as u32;
    let want = shards_from + g.add_shards;
    ctx.event(format!(
        "adding {} shards (POST /v1/shards): {shards_from} → {want}",
        g.add_shards
    ));
    let follow = async {
        let mut seen = GrowthSeen {
            shards_from,
            shards_added: g.add_shards,
            started_us,
            ..Default::default()
        };
        let mut tenants = std::collections::HashSet::new();
        let mut error = None;
        while Utc::now() < deadline {
            match api.shards().await {
                Ok(v) => {
                    let growth = &v["growth"];
                    let count = v["shard_count"].as_u64().unwrap_or(0) as u32;
                    if growth.is_null() && count >= want {
                        seen.ended_us = Some(now_us());
                        seen.shards_after = Some(count);
                        break;
                    }
                    let moved = growth["tenants_moved"].as_u64().unwrap_or(0);
                    seen.tenants_moved = seen.tenants_moved.max(moved);
                    let moves = growth["recent"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .chain(std::iter::once(&growth["moving"]));
                    for m in moves.filter(|m| m["phase"] == "done") {
                        for t in m["tenants"].as_array().into_iter().flatten() {
                            tenants.insert(t.as_str().unwrap_or_default().to_string());
                        }
                    }
                }
                Err(e) => {
                    error.get_or_insert_with(|| e.to_string());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen.tenants_moved = seen.tenants_moved.max(tenants.len() as u64);
        (seen, error)
    };
    let join = async {
        wait_until_time(at(g.join_at)).await;
        let node = platform.add_node().await?;
        let joined_us = now_us();
        // The leader gives the new node shards: when it first owns some.
        let owns = || async {
            api.nodes().await.is_ok_and(|v| {
                v["nodes"].as_array().into_iter().flatten().any(|n| {
                    n["node_id"] == node.as_str()
                        && n["shards"].as_array().is_some_and(|s| !s.is_empty())
                })
            })
        };
        let owned = wait_until("the joined node owns shards", Duration::from_secs(60), owns)
            .await
            .ok()
            .map(|()| now_us());
        anyhow::Ok((node, joined_us, owned))
    };
    let ((mut seen, error), joined) = tokio::join!(follow, join);
    let (node, joined_us, owned_us) = joined?;
    seen.node = node.clone();
    seen.joined_us = Some(joined_us);
    seen.owned_us = owned_us;
    let t = |us: i64| (us - ctx.start_us) as f64 / 1e6;
    let mut events = vec![Event {
        t_s: t(joined_us),
        what: format!("shard node {node} joined (its own process)"),
    }];
    match owned_us {
        Some(us) => events.push(Event {
            t_s: t(us),
            what: format!("shard node {node} owns shards"),
        }),
        None => ctx.warnings.push(format!(
            "the joined shard node {node} owned no shard within 60 s"
        )),
    }
    match seen.ended_us {
        Some(us) => events.push(Event {
            t_s: t(us),
            what: format!(
                "growth done: {} shards, {} tenants moved in {:.2} s",
                seen.shards_after.unwrap_or(want),
                seen.tenants_moved,
                (us - started_us) as f64 / 1e6
            ),
        }),
        None => ctx.warnings.push(format!(
            "the growth to {want} shards had not finished at the drain deadline{}",
            error
                .map(|e| format!(" (a poll failed: {e})"))
                .unwrap_or_default()
        )),
    }
    events.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    for e in &events {
        eprintln!("{}", e.what);
    }
    ctx.events.extend(events);
    ctx.events.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    Ok(seen)
}

/// Deletes the jobs; how many could not be.
async fn delete_jobs(api: &Api, ids: &[Option<Uuid>]) -> usize {
    stream::iter(ids.iter().flatten().copied())
        .map(|id| {
            let api = api.clone();
            async move { api.delete_job(id).await.is_err() }
        })
        .buffer_unordered(64)
        .filter(|failed| futures::future::ready(*failed))
        .count()
        .await
}

async fn read_runs(
    api: &Api,
    jobs: &[(Uuid, &scenario::Owed)],
    warnings: &mut Vec<String>,
) -> HashMap<Uuid, Vec<chronoshard_wire::RunView>> {
    let results: Vec<_> = stream::iter(jobs.iter().map(|(id, _)| *id))
        .map(|id| {
            let api = api.clone();
            async move { (id, api.runs(id).await) }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let mut runs = HashMap::new();
    let mut failed = 0;
    for (id, r) in results {
        match r {
            Ok(v) => {
                runs.insert(id, v);
            }
            Err(e) => {
                failed += 1;
                if failed == 1 {
                    warnings.push(format!("reading runs failed: {e}"));
                }
            }
        }
    }
    if failed > 0 {
        warnings.push(format!("runs of {failed} jobs could not be read"));
    }
    runs
}

fn write(report: &Report, dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    std::fs::write(dir.join("report.html"), report::html::render(report))?;
    Ok(())
}
