//! Fire benchmark of one shard node against a real nats-server and real SQLite shard databases
//! (figures in BENCHMARKS.md, "Firing into JetStream"). Run it with
//! `CARGO_TARGET_DIR=… cargo bench -p chronoshard-shard-node --bench fire`.
//!
//! Each phase starts its own `nats-server -js` (the `Nats` fixture of `chronoshard-test-util`, on
//! a free port with a temp store), writes the cluster config and assigns every shard to one node
//! id with epoch 1, creates one-shot jobs (`schedule: {"at": …}`, target queue `bench`) straight
//! into each shard's SQLite file through `Store::open` + `Store::create_jobs`, one job per
//! transaction (the rows the shard's create request would write), then starts `ShardNode::start` on those files, waits until every
//! shard is open and every job is in its wheel (the `chronoshard_wheel_entries` gauge), and lets
//! the jobs fall due. Jobs are spread over several tenants per shard. Nothing consumes the
//! tickets: the dispatch stream keeps them (it is limited by bytes only, 1 GiB, far above what
//! these sizes write).
//!
//! 1. **Fire throughput**: `FIRE_BENCH_JOBS` jobs all due at the same instant T0. Measured: the
//!    fires per second the node sustains into JetStream, `N / (last_ts − T0)`, where `last_ts` is
//!    the dispatch stream's time of its last stored message once it holds all N tickets (a
//!    ticket is stored when JetStream acknowledges it). Also printed: when the first ticket was
//!    stored, when the shards had written every ticket row (the `chronoshard_fires_total`
//!    counter), and the rate between 10% and 90% of the tickets (polls of stream info every
//!    50 ms), to tell start-up from the steady rate. No subscriber runs in this phase.
//! 2. **Fire lateness**: `FIRE_BENCH_RATE × FIRE_BENCH_SECONDS` jobs due uniformly at that rate,
//!    job i at T0 + i/rate (millisecond resolution). A core NATS subscription on
//!    `chronoshard.dispatch.>` (its own connection, its own thread and runtime) timestamps every
//!    ticket on receipt; lateness = receive time − `scheduled_at`. Printed: p50, p99, p99.9, max
//!    (ms) and the count, which must equal the number of jobs; a missing job, a repeated ticket
//!    id or a job with two tickets is reported as a failure (exit status 1). The lateness is
//!    also split at the ticket id's UUIDv7 timestamp (taken by the shard just before its fire
//!    transaction, ms resolution): wheel-to-fire and fire-to-receipt (with a `fire_lead` the
//!    first part is negative: the ticket was written ahead of its time and held until due).
//!
//! Figures are printed as plain lines and written as JSON to `$CARGO_TARGET_DIR/bench-fire.json`
//! (else `target/bench-fire.json`), with the machine (cores, CPU model), the nats-server version
//! and the date. T0 and receive times both come from the system clock (`chrono::Utc::now`); the
//! stream's timestamps come from nats-server on the same machine and clock.
//!
//! Environment (defaults in brackets):
//! - `FIRE_BENCH_JOBS` [40000]: jobs of the throughput phase (0 skips it).
//! - `FIRE_BENCH_RATE` [5000]: fires per second asked of the lateness phase.
//! - `FIRE_BENCH_SECONDS` [5]: duration of the lateness phase (0 skips it).
//! - `FIRE_BENCH_SHARDS` [8], `FIRE_BENCH_TENANTS` [4]: shards, and tenants per shard.
//! - `FIRE_BENCH_FIRE_LEAD_MS` [the node's default, 200]: the shards' `fire_lead` (occurrences
//!   are written this long before they are due and published on time; 0 writes them when due).
//!   Throughput counts from T0 − fire_lead, when firing starts.
//! - `FIRE_BENCH_LEAD_MS`: time from the start of the job set-up to T0; by default estimated
//!   from a short calibration of the create rate. The bench fails (and says so) when the set-up
//!   and the node start did not finish before T0.
//! - `FIRE_BENCH_TIMEOUT_S` [60]: give up when no new ticket arrived for this long (counted
//!   from T0, or from the last due time in the lateness phase).
//!
//! The defaults keep a run under two minutes on a 2-core machine where the node sustains
//! 1,000–1,500 fires/s (measured 2026-11-29): larger sizes (`FIRE_BENCH_JOBS=160000
//! FIRE_BENCH_SECONDS=20`) measure the same rates but take about 7 minutes there, mostly in
//! creating the jobs and in draining the backlogs. When the node fires slower than
//! `FIRE_BENCH_RATE`, the lateness figures measure that backlog (they grow with
//! `FIRE_BENCH_SECONDS`), so the phase also prints the rate it achieved. Repeated ticket ids are
//! printed with when they were received, to tell a periodic cause from a retry.
//!
//! Not measured: the REST API and the control plane (jobs are not created through them), the
//! consumption of tickets by workers and the start lateness of executions, result handling,
//! recurring schedules (cron/every; their fire path also evaluates the schedule), more than one
//! node, a replicated NATS cluster. The bench process also runs nats-server, the subscriber and
//! the node on the same cores, as `chronoshard dev` does; the node's database writes go to the
//! temp directory's disk (WAL, `synchronous=NORMAL`, so no fsync per commit).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use chrono::Utc;
use chronoshard_cluster::Cluster;
use chronoshard_shard_node::{Databases, Handle, Options, ShardConfig, ShardNode};
use chronoshard_telemetry::metrics;
use chronoshard_test_util::Nats;
use chronoshard_wire::{names, settings::Settings, Dur, Ticket};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

mod common;
// Beside this file, not in `benches/` (where Cargo would take it for a bench of its own).
#[path = "fire/measure.rs"]
mod measure;

use common::{
    assign_all, cores, cpu_model, env_num, finish, fires_total, loadavg, runtime, Percentiles, Seed,
};
use measure::{collect, steady_rate};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const NODE: &str = "bench-node";
const QUEUE: &str = "bench";
/// The jobs of every phase (tenants per shard from `FIRE_BENCH_TENANTS`).
const SEED: Seed = Seed {
    owner: NODE,
    name: "fire-bench",
    queue: QUEUE,
    tenants: 4,
    batch: 1,
};
/// Poll interval of the wait loops (the conditions decide, not the interval).
const POLL: Duration = Duration::from_millis(50);

fn main() -> Res<()> {
    runtime()?.block_on(run())
}

#[derive(Clone, Debug)]
struct Config {
    jobs: usize,
    rate: usize,
    seconds: usize,
    shards: u32,
    tenants: usize,
    lead_ms: Option<i64>,
    /// The node's `fire_lead`: occurrences are fired (written) this long before they are due.
    fire_lead: Duration,
    timeout: Duration,
}

fn fire_lead_ms(cfg: &Config) -> i64 {
    cfg.fire_lead.as_millis() as i64
}

impl Config {
    fn from_env() -> Res<Config> {
        let lead_ms = match std::env::var("FIRE_BENCH_LEAD_MS") {
            Ok(_) => Some(env_num("FIRE_BENCH_LEAD_MS", 0i64)?),
            Err(_) => None,
        };
        Ok(Config {
            jobs: env_num("FIRE_BENCH_JOBS", 40_000)?,
            rate: env_num("FIRE_BENCH_RATE", 5_000)?,
            seconds: env_num("FIRE_BENCH_SECONDS", 5)?,
            shards: env_num("FIRE_BENCH_SHARDS", 8u32)?.max(1),
            fire_lead: Duration::from_millis(env_num(
                "FIRE_BENCH_FIRE_LEAD_MS",
                ShardConfig::default().fire_lead.as_millis() as u64,
            )?),
            tenants: env_num("FIRE_BENCH_TENANTS", 4usize)?.max(1),
            lead_ms,
            timeout: Duration::from_secs(env_num("FIRE_BENCH_TIMEOUT_S", 60)?),
        })
    }
}

async fn run() -> Res<()> {
    let cfg = Config::from_env()?;
    let started = Utc::now();
    let load_before = loadavg();
    println!(
        "fire bench: {} cores ({}), load average {load_before}",
        cores(),
        cpu_model()
    );
    // Jobs created per second by one store, to choose how far ahead T0 lies.
    let create_rate = calibrate().await?;
    println!("set-up: one store creates {create_rate:.0} jobs/s");
    let mut report = serde_json::json!({
        "bench": "shard-node fire",
        "command": "cargo bench -p chronoshard-shard-node --bench fire",
        "date": started.to_rfc3339(),
        "machine": {"cores": cores(), "cpu_model": cpu_model(), "load_average_before": load_before},
        "shards": cfg.shards,
        "tenants_per_shard": cfg.tenants,
    });
    let mut failed = Vec::new();
    if cfg.jobs > 0 {
        let t = throughput(&cfg, create_rate).await?;
        report["nats_server"] = t.nats_version.clone().into();
        report["throughput"] = t.json;
        failed.extend(t.failures);
    }
    if cfg.rate > 0 && cfg.seconds > 0 {
        let l = lateness(&cfg, create_rate).await?;
        report["nats_server"] = l.nats_version.clone().into();
        report["lateness"] = l.json;
        failed.extend(l.failures);
    }
    report["machine"]["load_average_after"] = loadavg().into();
    report["failures"] = failed.clone().into();
    println!("load average after: {}", loadavg());
    finish(&report, "bench-fire.json", &failed)
}

struct PhaseReport {
    nats_version: String,
    json: serde_json::Value,
    failures: Vec<String>,
}

/// Phase 1: every job due at T0; how fast the tickets reach the dispatch stream.
async fn throughput(cfg: &Config, create_rate: f64) -> Res<PhaseReport> {
    let n = cfg.jobs;
    println!(
        "\n# throughput: {n} one-shot jobs due at T0 over {} shards",
        cfg.shards
    );
    let lead = lead_ms(cfg, n, create_rate);
    let t0 = Utc::now().timestamp_millis() + lead;
    let env = Env::start(cfg, |_| t0, n).await?;
    let fires_before = fires_total(cfg.shards);
    let node = env.start_node().await?;
    env.wait_loaded(cfg.shards, &node, t0 - fire_lead_ms(cfg))
        .await?;
    let mut stream = env.cluster.js.get_stream(names::DISPATCH_STREAM).await?;
    // Gives up once no ticket was stored for `timeout` (counting from T0).
    let mut progress = (0u64, t0);
    // (ms since T0, messages in the stream), one sample per poll once the first ticket is stored.
    let mut samples: Vec<(i64, u64)> = Vec::new();
    let mut fires_done_ms = None;
    let state = loop {
        let state = stream.info().await?.state.clone();
        let now = Utc::now().timestamp_millis();
        if state.messages > 0 {
            samples.push((now - t0, state.messages));
        }
        if fires_done_ms.is_none() && fires_total(cfg.shards) - fires_before >= n as u64 {
            fires_done_ms = Some(now - t0);
        }
        if state.messages >= n as u64 {
            break state;
        }
        if state.messages > progress.0 {
            progress = (state.messages, now.max(t0));
        }
        if now - progress.1 > cfg.timeout.as_millis() as i64 {
            return Err(format!(
                "timed out: {} of {n} tickets in the stream, none new for {:?}",
                state.messages, cfg.timeout
            )
            .into());
        }
        tokio::time::sleep(POLL).await;
    };
    let fires = fires_total(cfg.shards) - fires_before;
    let last_ms = (state.last_timestamp.unix_timestamp_nanos() / 1_000_000) as i64 - t0;
    let first_ms = (state.first_timestamp.unix_timestamp_nanos() / 1_000_000) as i64 - t0;
    // Firing starts `fire_lead` before T0: the rate counts from then.
    let rate = n as f64 / ((last_ms + fire_lead_ms(cfg)).max(1) as f64 / 1000.0);
    let steady = steady_rate(&samples, n as u64);
    let version = env.nats.server.binary.version.clone();
    env.stop(node).await?;
    let mut failures = Vec::new();
    if state.messages != n as u64 {
        failures.push(format!(
            "throughput: the stream holds {} tickets for {n} jobs",
            state.messages
        ));
    }
    if fires != n as u64 {
        failures.push(format!("throughput: {fires} fires counted for {n} jobs"));
    }
    println!(
        "fires/s: {rate:.0} ({n} tickets stored in {last_ms} ms after T0, firing from T0 − {} ms)",
        fire_lead_ms(cfg)
    );
    println!("first ticket stored at T0 + {first_ms} ms");
    match fires_done_ms {
        Some(ms) => println!(
            "every ticket row written by T0 + {ms} ms (±{} ms)",
            POLL.as_millis()
        ),
        None => println!("ticket rows written: {fires} of {n}"),
    }
    if let Some(s) = steady {
        println!("steady rate (10%–90% of tickets): {s:.0} fires/s");
    }
    Ok(PhaseReport {
        nats_version: version,
        json: serde_json::json!({
            "jobs": n,
            "fires_per_second": rate.round(),
            "last_ticket_ms_after_t0": last_ms,
            "first_ticket_ms_after_t0": first_ms,
            "all_ticket_rows_written_ms_after_t0": fires_done_ms,
            "steady_fires_per_second_10_90": steady.map(f64::round),
            "stream_messages": state.messages,
            "fires_counted": fires,
            "lead_ms": lead,
            "fire_lead_ms": fire_lead_ms(cfg),
        }),
        failures,
    })
}

/// Phase 2: jobs due at `rate` per second; lateness of every ticket as a subscriber sees it.
async fn lateness(cfg: &Config, create_rate: f64) -> Res<PhaseReport> {
    let n = cfg.rate * cfg.seconds;
    println!(
        "\n# lateness: {n} one-shot jobs due at {} per second for {} s over {} shards",
        cfg.rate, cfg.seconds, cfg.shards
    );
    let lead = lead_ms(cfg, n, create_rate);
    let t0 = Utc::now().timestamp_millis() + lead;
    let rate = cfg.rate as i64;
    let env = Env::start(cfg, |i| t0 + i as i64 * 1000 / rate, n).await?;
    let last_due = t0 + (n as i64 - 1) * 1000 / rate;
    let last_due_at = Instant::now()
        + Duration::from_millis((last_due - Utc::now().timestamp_millis()).max(0) as u64);
    let timeout = cfg.timeout;
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let url = env.nats.url();
    std::thread::spawn(move || {
        let _ = done_tx.send(collect(url, n, last_due_at, timeout, ready_tx));
    });
    if ready_rx.await.is_err() {
        // The collector ended before subscribing: its error says why.
        done_rx.await??;
        return Err("the ticket subscriber stopped before subscribing".into());
    }
    let node = env.start_node().await?;
    env.wait_loaded(cfg.shards, &node, t0 - fire_lead_ms(cfg))
        .await?;
    let collected = done_rx.await??;
    let mut stream = env.cluster.js.get_stream(names::DISPATCH_STREAM).await?;
    let stored = stream.info().await?.state.messages;
    let version = env.nats.server.binary.version.clone();
    let expected: HashMap<Uuid, i64> = env.jobs.iter().map(|j| (j.id, j.at)).collect();
    env.stop(node).await?;

    let mut failures = Vec::new();
    // Ticket id → when it was first received (ms after T0).
    let mut seen_tickets: HashMap<Uuid, i64> = HashMap::new();
    // A repeated ticket id: when it was first received and when again (ms after T0).
    let mut repeats: Vec<(i64, i64)> = Vec::new();
    let mut tickets_of_job: HashMap<Uuid, u32> = HashMap::new();
    let (mut repeated, mut foreign, mut wrong_time) = (0u64, 0u64, 0u64);
    let mut late = Vec::with_capacity(n);
    let mut to_fire = Vec::with_capacity(n);
    let mut to_receipt = Vec::with_capacity(n);
    // The worst lateness per 250 ms of due time, to tell a periodic stall from a steady tail.
    let mut worst_by_window: HashMap<i64, f64> = HashMap::new();
    for (recv_us, payload) in &collected.messages {
        let t: Ticket = serde_json::from_slice(payload)?;
        let recv_ms = *recv_us / 1000 - t0;
        if let Some(first) = seen_tickets.insert(t.ticket_id, recv_ms) {
            seen_tickets.insert(t.ticket_id, first);
            repeated += 1;
            repeats.push((first, recv_ms));
            continue;
        }
        *tickets_of_job.entry(t.job_id).or_default() += 1;
        let at = t.scheduled_at.timestamp_millis();
        match expected.get(&t.job_id) {
            None => foreign += 1,
            Some(want) if *want != at => wrong_time += 1,
            Some(_) => {}
        }
        let l = (*recv_us - at * 1000) as f64 / 1000.0;
        late.push(l);
        let w = worst_by_window.entry((at - t0) / 250 * 250).or_default();
        *w = w.max(l);
        if let Some((secs, nanos)) = t.ticket_id.get_timestamp().map(|ts| ts.to_unix()) {
            let fired_ms = secs as i64 * 1000 + (nanos / 1_000_000) as i64;
            to_fire.push((fired_ms - at) as f64);
            to_receipt.push(*recv_us as f64 / 1000.0 - fired_ms as f64);
        }
    }
    let missing = expected
        .keys()
        .filter(|j| !tickets_of_job.contains_key(j))
        .count();
    let doubled = tickets_of_job.values().filter(|c| **c > 1).count();
    let received = collected.messages.len();
    // Fires per second achieved: tickets received over the time from T0 to the last receipt.
    let achieved = collected
        .messages
        .last()
        .map(|(us, _)| received as f64 / ((*us / 1000 - t0).max(1) as f64 / 1000.0));
    for (what, count) in [
        ("jobs without a ticket", missing as u64),
        ("repeated ticket ids", repeated),
        ("jobs with more than one ticket", doubled as u64),
        ("tickets of unknown jobs", foreign),
        ("tickets with a wrong scheduled_at", wrong_time),
        (
            "slow-consumer events of the subscriber",
            collected.slow_consumer,
        ),
    ] {
        if count > 0 {
            failures.push(format!("lateness: {count} {what}"));
        }
    }
    if stored != n as u64 {
        failures.push(format!(
            "lateness: the stream holds {stored} tickets for {n} jobs"
        ));
    }
    let p = Percentiles::of(&mut late);
    let mut windows: Vec<(i64, f64)> = worst_by_window.into_iter().collect();
    windows.sort_by(|a, b| b.1.total_cmp(&a.1));
    windows.truncate(5);
    let pf = Percentiles::of(&mut to_fire);
    let pr = Percentiles::of(&mut to_receipt);
    println!(
        "lateness ms: p50 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
        p.p50, p.p99, p.p999, p.max
    );
    println!(
        "  worst 250 ms windows of due time (ms after T0: max ms): {}",
        windows
            .iter()
            .map(|(w, l)| format!("{w}: {l:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  of which due → fire (ticket id time, ms resolution): p50 {:.0}  p99 {:.0}  p99.9 {:.0}  max {:.0}",
        pf.p50, pf.p99, pf.p999, pf.max
    );
    println!(
        "  of which fire → receipt: p50 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
        pr.p50, pr.p99, pr.p999, pr.max
    );
    if !repeats.is_empty() {
        // When the repeats came, to tell a periodic cause (the outbox scan) from a retry.
        let mut at: Vec<String> = repeats
            .iter()
            .map(|(first, again)| format!("{first}→{again}"))
            .collect();
        at.truncate(20);
        println!(
            "repeated ticket ids, received at T0 + ms (first→again): {}",
            at.join(" ")
        );
    }
    if let Some(a) = achieved {
        println!("achieved: {a:.0} fires/s (received tickets / (last receipt − T0))");
    }
    println!(
        "count: {} tickets received for {n} jobs ({received} messages, {missing} jobs missing, {repeated} repeated ids, {doubled} jobs with two tickets); stream holds {stored}",
        seen_tickets.len()
    );
    Ok(PhaseReport {
        nats_version: version,
        json: serde_json::json!({
            "jobs": n,
            "rate_per_second": cfg.rate,
            "achieved_fires_per_second": achieved.map(f64::round),
            "seconds": cfg.seconds,
            "lateness_ms": p.json(),
            "worst_windows_ms_after_t0": windows.iter().map(|(w, l)| serde_json::json!({"window": w, "max_ms": l})).collect::<Vec<_>>(),
            "due_to_fire_ms": pf.json(),
            "fire_to_receipt_ms": pr.json(),
            "tickets_received": seen_tickets.len(),
            "messages_received": received,
            "missing_jobs": missing,
            "repeated_ticket_ids": repeated,
            "repeats_ms_after_t0": repeats.iter().take(100).map(|(a, b)| [*a, *b]).collect::<Vec<_>>(),
            "jobs_with_several_tickets": doubled,
            "stream_messages": stored,
            "slow_consumer_events": collected.slow_consumer,
            "lead_ms": lead,
            "fire_lead_ms": fire_lead_ms(cfg),
        }),
        failures,
    })
}

/// One job the bench created: its id and due time.
struct BenchJob {
    id: Uuid,
    at: i64,
}

/// A nats-server, the cluster state assigning every shard to `NODE`, and the shard databases
/// holding the phase's jobs.
struct Env {
    nats: Nats,
    cluster: Cluster,
    data: tempfile::TempDir,
    jobs: Vec<BenchJob>,
    shutdown: CancellationToken,
    shards: u32,
}

impl Env {
    /// Job `i` (of `n`) is due at `at(i)`, in shard `i % shards`.
    async fn start(cfg: &Config, at: impl Fn(usize) -> i64, n: usize) -> Res<Env> {
        let began = Instant::now();
        let nats = Nats::start().await?;
        let cluster = Cluster::create(nats.client().await?, &Default::default()).await?;
        let settings = Settings {
            fire_lead: Dur(cfg.fire_lead),
            ..Settings::DEFAULT
        };
        assign_all(&cluster, cfg.shards, NODE, settings).await?;
        let data = tempfile::tempdir()?;
        let mut per_shard: Vec<Vec<(usize, i64)>> = vec![Vec::new(); cfg.shards as usize];
        for i in 0..n {
            per_shard[i % cfg.shards as usize].push((i / cfg.shards as usize, at(i)));
        }
        let mut tasks = Vec::new();
        for (shard, due) in per_shard.into_iter().enumerate() {
            let dbs = Databases::Sqlite(data.path().to_path_buf());
            let seed = Seed {
                tenants: cfg.tenants,
                ..SEED
            };
            tasks.push(tokio::spawn(async move {
                let mut jobs = Vec::with_capacity(due.len());
                seed.create_jobs(&dbs, shard as u32, due, |id, at| {
                    jobs.push(BenchJob { id, at })
                })
                .await?;
                Res::Ok(jobs)
            }));
        }
        let mut jobs = Vec::with_capacity(n);
        for t in tasks {
            jobs.extend(t.await??);
        }
        println!(
            "set-up: {n} jobs created in {:.1} s",
            began.elapsed().as_secs_f64()
        );
        Ok(Env {
            nats,
            cluster,
            data,
            jobs,
            shutdown: CancellationToken::new(),
            shards: cfg.shards,
        })
    }

    async fn start_node(&self) -> Res<(Handle, tokio::task::JoinHandle<()>)> {
        let opts = Options {
            node_id: NODE.into(),
            databases: Databases::Sqlite(self.data.path().to_path_buf()),
            local: Default::default(),
            zone: None,
            labels: Default::default(),
            max_shards: None,
        };
        let client = self.nats.client().await?;
        Ok(ShardNode::start(opts, client, self.shutdown.clone()).await?)
    }

    /// Waits until every shard is open and has all its jobs in its wheel; fails if that happens
    /// after `t0` (when firing starts: the lead was too short to measure from T0).
    async fn wait_loaded(
        &self,
        shards: u32,
        node: &(Handle, tokio::task::JoinHandle<()>),
        t0: i64,
    ) -> Res<()> {
        // Job i is in shard i % shards.
        let n = self.jobs.len();
        let want: Vec<i64> = (0..shards as usize)
            .map(|s| n.saturating_sub(s).div_ceil(shards as usize) as i64)
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let open = node.0.open_shards().len() == shards as usize;
            let loaded = (0..shards).all(|s| {
                metrics::WHEEL_ENTRIES_GAUGE
                    .with_label_values(&[&s.to_string()])
                    .get()
                    >= want[s as usize]
            });
            let now = Utc::now().timestamp_millis();
            if open && loaded {
                if now >= t0 {
                    return Err(format!(
                        "the set-up ended {} ms after T0: raise FIRE_BENCH_LEAD_MS",
                        now - t0
                    )
                    .into());
                }
                println!(
                    "node: {shards} shards open, every job in a wheel, {} ms before T0",
                    t0 - now
                );
                return Ok(());
            }
            if Instant::now() > deadline || now >= t0 {
                return Err(format!(
                    "shards open: {:?}; not every job was in a wheel before T0 (raise FIRE_BENCH_LEAD_MS)",
                    node.0.open_shards()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(self, node: (Handle, tokio::task::JoinHandle<()>)) -> Res<()> {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), node.1).await??;
        // The gauges are process-wide: the next phase must start from zero.
        for s in 0..self.shards {
            metrics::WHEEL_ENTRIES_GAUGE
                .with_label_values(&[&s.to_string()])
                .set(0);
        }
        Ok(())
    }
}

/// Jobs one store creates per second (a scratch database, far-future jobs).
async fn calibrate() -> Res<f64> {
    let dir = tempfile::tempdir()?;
    let at = Utc::now().timestamp_millis() + 86_400_000;
    let due: Vec<(usize, i64)> = (0..1000).map(|k| (k, at)).collect();
    let began = Instant::now();
    SEED.create_jobs(
        &Databases::Sqlite(dir.path().to_path_buf()),
        0,
        due.iter().copied(),
        |_, _| {},
    )
    .await?;
    Ok(due.len() as f64 / began.elapsed().as_secs_f64())
}

/// Time from now to T0: twice the job set-up at the calibrated rate (shards are created in
/// parallel, one per core) plus 3 s for the node's start and load.
fn lead_ms(cfg: &Config, n: usize, create_rate: f64) -> i64 {
    if let Some(ms) = cfg.lead_ms {
        return ms;
    }
    let parallel = (cores().min(cfg.shards as usize)).max(1) as f64;
    let setup_s = n as f64 / (create_rate * parallel);
    ((setup_s * 2.0 + 3.0) * 1000.0) as i64
}
