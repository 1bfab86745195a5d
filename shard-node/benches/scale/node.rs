//! The node process of the scale bench: the bench runs its own binary again with `NODE_ENV` set,
//! and that process starts the node on the seeded shards, waits until it settled, observes it,
//! and prints what it measured about itself as one line the bench reads (`NodeFigures`). Its
//! memory is the node's alone: neither the seeding nor the bench's worker is in it.

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use chrono::Utc;
use chronoshard_shard_node::{Databases, Options, ShardNode};
use chronoshard_telemetry::metrics;
use chronoshard_wire::{
    names,
    rpc::{ShardReply, ShardRequest},
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

use super::{common::fires_total, firing, Res, NODE, POLL};

/// Set (to the node's parameters, as JSON) in the node process.
pub(crate) const NODE_ENV: &str = "SCALE_BENCH_NODE";
/// The node process's line with its figures starts with this.
const RESULT_PREFIX: &str = "SCALE_NODE_RESULT ";

fn wheel_entries(shard: u32) -> i64 {
    metrics::WHEEL_ENTRIES_GAUGE
        .with_label_values(&[&shard.to_string()])
        .get()
}

/// What the node process measured about itself.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct NodeFigures {
    /// From `ShardNode::start` until every shard answered `Ping`.
    pub open_ms: u64,
    /// From `ShardNode::start` until every event loop answered and every wheel was loaded.
    pub settled_ms: u64,
    /// From the process's `main` until settled (runtime, NATS connection, start).
    pub process_settled_ms: u64,
    /// When each shard first answered `Ping` / the event-loop probe (ms after start).
    pub shard_open_ms: Vec<u64>,
    pub shard_loop_ms: Vec<u64>,
    pub rss_kib: u64,
    pub rss_anon_kib: u64,
    /// The highest VmRSS sample over the observation window.
    pub rss_max_sampled_kib: u64,
    pub rss_end_kib: u64,
    /// VmHWM at the end of the observation window.
    pub hwm_kib: u64,
    pub wheel_entries: i64,
    pub wheel_entries_end: i64,
    pub fires: u64,
    pub threads: u64,
    /// Firing mode: the observation window (ms since the epoch), what fired in it and the fire
    /// lateness of those fires (`firing::Buckets::json`), at the send and at JetStream's ack.
    pub window_from_ms: i64,
    pub window_until_ms: i64,
    pub window_fires: u64,
    pub fire_send_lateness: serde_json::Value,
    pub fire_lateness: serde_json::Value,
}

impl NodeFigures {
    /// The longest time a shard took from answering `Ping` to answering from its event loop:
    /// its recovery (`Shard::recover`) and first load.
    pub fn recovery_ms(&self) -> u64 {
        self.shard_open_ms
            .iter()
            .zip(&self.shard_loop_ms)
            .map(|(o, l)| l.saturating_sub(*o))
            .max()
            .unwrap_or(0)
    }
}

/// What the node process needs.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct NodeParams {
    pub url: String,
    pub data: String,
    /// The database of the shards, when they are in Postgres (else SQLite files in `data`).
    pub postgres: Option<String>,
    pub shards: u32,
    /// Per shard, the wheel entries its first load must at least make.
    pub expected: Vec<u64>,
    pub observe_ms: u64,
    pub timeout_ms: u64,
    /// Firing mode: the earliest occurrence (ms since the epoch); the observation starts there.
    pub first_due_ms: Option<i64>,
}

/// Runs this binary again as the node process and returns what it reported.
pub(crate) async fn run_node_process(params: &NodeParams, deadline: Duration) -> Res<NodeFigures> {
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .env(NODE_ENV, serde_json::to_string(params)?)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout of the node process")?;
    let read = async {
        let mut lines = BufReader::new(stdout).lines();
        let mut figures = None;
        while let Some(line) = lines.next_line().await? {
            match line.strip_prefix(RESULT_PREFIX) {
                Some(json) => figures = Some(serde_json::from_str::<NodeFigures>(json)?),
                None => println!("  node process: {line}"),
            }
        }
        let status = child.wait().await?;
        Res::Ok((figures, status))
    };
    let (figures, status) = tokio::time::timeout(deadline, read)
        .await
        .map_err(|_| format!("the node process did not finish within {deadline:?}"))??;
    match (figures, status.success()) {
        (Some(f), true) => Ok(f),
        (_, _) => Err(format!("the node process ended with {status} and no figures").into()),
    }
}

/// The node process: starts the node on the seeded files, waits until it settled, measures
/// itself, stops the node and prints its figures as one line.
pub(crate) async fn node_process(p: NodeParams, began: Instant) -> Res<()> {
    let shutdown = CancellationToken::new();
    let client = async_nats::connect(&p.url).await?;
    // A connection of its own for the probes, as a control plane would have.
    let probe = async_nats::connect(&p.url).await?;
    let opts = Options {
        node_id: NODE.into(),
        databases: match &p.postgres {
            Some(url) => Databases::Postgres(url.clone()),
            None => Databases::Sqlite(p.data.clone().into()),
        },
        local: Default::default(),
        zone: None,
        labels: Default::default(),
        max_shards: None,
    };
    let start = Instant::now();
    let (_handle, task) = ShardNode::start(opts, client, shutdown.clone()).await?;
    let deadline = start + Duration::from_millis(p.timeout_ms);
    let shards = p.shards as usize;
    let gauge = |s: usize| wheel_entries(s as u32);
    // Every shard probed at once, so one shard's wait does not delay what another's shows.
    let probes = (0..shards).map(|s| probe_shard(&probe, s, start, deadline));
    let mut open = Vec::with_capacity(shards);
    let mut looped = Vec::with_capacity(shards);
    for r in futures::future::join_all(probes).await {
        let (o, l) = r?;
        open.push(o);
        looped.push(l);
    }
    // The event loops answer after their first load; a failed load is retried a second later
    // (with a warning), so the wheels are checked as well.
    while !(0..shards).all(|s| gauge(s) >= p.expected[s] as i64) {
        if Instant::now() > deadline {
            let wheel: Vec<i64> = (0..shards).map(gauge).collect();
            return Err(format!(
                "wheels not loaded after {} ms: {wheel:?} of at least {:?}",
                p.timeout_ms, p.expected
            )
            .into());
        }
        tokio::time::sleep(POLL).await;
    }
    let settled = Instant::now();
    let status = proc_status();
    let mut f = NodeFigures {
        open_ms: open.iter().copied().max().unwrap_or(0),
        settled_ms: settled.duration_since(start).as_millis() as u64,
        process_settled_ms: settled.duration_since(began).as_millis() as u64,
        shard_open_ms: open,
        shard_loop_ms: looped,
        rss_kib: status.get("VmRSS"),
        rss_anon_kib: status.get("RssAnon"),
        rss_max_sampled_kib: status.get("VmRSS"),
        wheel_entries: (0..shards).map(gauge).sum(),
        ..NodeFigures::default()
    };
    println!(
        "settled after {} ms (pid {}), RSS {} kB; observing for {} ms",
        f.settled_ms,
        std::process::id(),
        f.rss_kib,
        p.observe_ms
    );
    observe(&p, &mut f).await;
    f.wheel_entries_end = (0..shards).map(gauge).sum();
    println!("{RESULT_PREFIX}{}", serde_json::to_string(&f)?);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), task).await??;
    Ok(())
}

/// The observation window: VmRSS sampled, and what fired in the window with its lateness
/// (firing mode: the window opens a second before the earliest occurrence, a time of day and not
/// a condition, since a shard may publish a ticket ahead of its time, `fire_lead`).
async fn observe(p: &NodeParams, f: &mut NodeFigures) {
    let fires = || fires_total(p.shards);
    if let Some(first) = p.first_due_ms {
        let wait = first - 1000 - Utc::now().timestamp_millis();
        tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)).await;
    }
    let (fired_before, late_before) = (fires(), firing::lateness(p.shards));
    f.window_from_ms = Utc::now().timestamp_millis();
    if p.first_due_ms.is_some() {
        println!("observation window open");
    }
    // An observation window, not synchronisation: VmRSS sampled while the node goes on.
    let until = Instant::now() + Duration::from_millis(p.observe_ms);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        f.rss_max_sampled_kib = f.rss_max_sampled_kib.max(proc_status().get("VmRSS"));
    }
    f.window_until_ms = Utc::now().timestamp_millis();
    f.window_fires = fires() - fired_before;
    if p.first_due_ms.is_some() {
        let (send, ack) = firing::lateness(p.shards);
        f.fire_send_lateness = send.since(&late_before.0).json();
        f.fire_lateness = ack.since(&late_before.1).json();
    }
    let end = proc_status();
    f.rss_end_kib = end.get("VmRSS");
    f.hwm_kib = end.get("VmHWM");
    f.threads = end.get("Threads");
    f.fires = fired_before + f.window_fires;
}

/// Waits until shard `s` answers `Ping` (its store is open and its requests are served), then a
/// `TriggerJob` for a job that does not exist (a write request: the event loop answers it, after
/// the shard's recovery and first load, with "not found" and writes nothing). Returns when each
/// came, in ms after `start`.
async fn probe_shard(
    probe: &async_nats::Client,
    s: usize,
    start: Instant,
    deadline: Instant,
) -> Res<(u64, u64)> {
    let ms = || start.elapsed().as_millis() as u64;
    let nothing = ShardRequest::TriggerJob {
        job_id: uuid::Uuid::nil(),
    };
    let mut open = None;
    loop {
        if open.is_none() {
            if let Some(ShardReply::Pong { .. }) = ask(probe, s, &ShardRequest::Ping).await {
                open = Some(ms());
            }
        }
        if let Some(o) = open {
            if ask(probe, s, &nothing).await.is_some() {
                return Ok((o, ms()));
            }
        }
        if Instant::now() > deadline {
            return Err(
                format!("shard {s}: open at {open:?} ms, its event loop did not answer").into(),
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One request to a shard; None when nobody answered in time (or nobody listens yet).
async fn ask(client: &async_nats::Client, shard: usize, req: &ShardRequest) -> Option<ShardReply> {
    let body = serde_json::to_vec(req).ok()?;
    let subject = names::shard_rpc_subject(shard as u32);
    let reply = tokio::time::timeout(Duration::from_secs(5), client.request(subject, body.into()))
        .await
        .ok()?
        .ok()?;
    serde_json::from_slice(&reply.payload).ok()
}

/// `/proc/self/status` fields in kB (and plain counts such as `Threads`).
struct ProcStatus(String);

impl ProcStatus {
    fn get(&self, field: &str) -> u64 {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }
}

fn proc_status() -> ProcStatus {
    ProcStatus(std::fs::read_to_string("/proc/self/status").unwrap_or_default())
}

pub(crate) fn mem_total_kib() -> u64 {
    ProcStatus(std::fs::read_to_string("/proc/meminfo").unwrap_or_default()).get("MemTotal")
}
