//! Scale benchmark of one shard node (the target: "10 million scheduled jobs on one node with
//! memory bounded by the wheel horizon, not the job count", BENCHMARKS.md). Run it with
//! `cargo bench -p chronoshard-shard-node --bench scale`.
//!
//! For each N of `SCALE_BENCH_JOBS`, one after the other on the same machine:
//!
//! 1. A nats-server of its own (the `Nats` fixture of `chronoshard-test-util`), the cluster
//!    config, and every shard assigned to one node id with epoch 1, as the fire bench does.
//! 2. N one-shot jobs (`schedule: {"at": …}`, target queue `scale`, several tenants per shard)
//!    written straight into the shard SQLite files through `Store::open` + `Store::create_jobs`
//!    (`SCALE_BENCH_BATCH` jobs per transaction, the store call the shard writes creates queued
//!    together with), shards in parallel. Job i is in
//!    shard i % shards and due at an offset drawn uniformly (a fixed hash of i) from the next
//!    `SCALE_BENCH_DAYS` days. Jobs whose offset is under two hours are written last, counted from
//!    just before the node starts plus `SCALE_BENCH_GAP_S`, so no job is overdue when the node
//!    starts however long the seeding took, and the wheel holds what it holds in steady state:
//!    the jobs due within the horizon (300 s by default), about N × 300 s / 30 days. Printed: the
//!    seeding rate and the bytes of the shard files on disk.
//! 3. The node in a process of its own (`node.rs`), so neither the seeding nor the bench's own
//!    memory is counted: the bench binary runs itself again (`std::env::current_exe`, with
//!    `SCALE_BENCH_NODE` set), and that process starts `ShardNode::start` on the shard files and
//!    the same nats-server with the default `ShardConfig`. It waits, with a deadline, until
//!    - every shard is open: it answers a `Ping` on its request subject (the reply comes once
//!      its store is open and its request handler runs), then
//!    - every shard's event loop runs: it answers a `TriggerJob` for a job that does not exist
//!      (a write request, served by the event loop after the shard's recovery and first load; it
//!      writes nothing), and
//!    - every shard's `chronoshard_wheel_entries` gauge holds at least the jobs due by the node's
//!      start plus the horizon (the bench counts them).
//!
//!    Then it reads its `/proc/self/status`: VmRSS ("settled"; also RssAnon, the heap and
//!    stacks), and VmHWM (peak) after sampling VmRSS every 200 ms for `SCALE_BENCH_OBSERVE_S`
//!    more seconds (loader passes and checkpoints go on meanwhile). Printed: the time from
//!    `ShardNode::start` until every shard answered `Ping` ("open") and until settled, RSS
//!    settled, the highest RSS sample, peak RSS, the wheel entries and the fires in that time.
//!
//! The figure is the ratio: RSS at the largest N against RSS at N = 0. Plain lines, and JSON in
//! `$CARGO_TARGET_DIR/bench-scale.json` (else `target/bench-scale.json`) with the machine, the date
//! and the nats-server version. The seeded files of an N are deleted before the next N starts.
//! Before seeding, the bench checks the free disk space against the bytes per job of the
//! previous N (2 KB before the first) and skips an N that would not fit with a 50% margin.
//!
//! Environment (defaults in brackets):
//! - `SCALE_BENCH_JOBS` [0,100000,1000000,10000000]: the N, comma-separated.
//! - `SCALE_BENCH_SHARDS` [8], `SCALE_BENCH_TENANTS` [4]: shards, and tenants per shard.
//! - `SCALE_BENCH_BATCH` [1000]: jobs per seeding transaction.
//! - `SCALE_BENCH_DAYS` [30]: the due times span this many days.
//! - `SCALE_BENCH_GAP_S` [60]: the earliest due time lies this long after the last seeding pass
//!   started (the pass itself, a `sync` of what it wrote, and the node's start come within it). A
//!   node that takes longer to settle fires jobs meanwhile (counted and printed).
//! - `SCALE_BENCH_OBSERVE_S` [10]: RSS sampling after settling.
//! - `SCALE_BENCH_TIMEOUT_S` [1800]: the deadline for the node to open and settle.
//! - `SCALE_BENCH_DIR` [the system temp dir]: where the shard files are written.
//! - `SCALE_BENCH_POSTGRES` [0]: 1 keeps the shards in PostgreSQL instead (one schema per shard,
//!   as `Databases::Postgres`): a server of the bench's own (initdb into the system temp dir,
//!   default settings), a new database per N; "disk" is then `pg_database_size`.
//! - `SCALE_BENCH_RATE` [unset]: the firing mode (`firing.rs`): the jobs fire this many times a
//!   second together instead of being due over days, `SCALE_BENCH_CRON_PERCENT` [10] of them
//!   hourly cron jobs; a no-op worker in the bench's process runs the tickets, and the node's
//!   fire lateness and the worker's start lateness are measured over `SCALE_BENCH_OBSERVE_S` from
//!   the earliest occurrence (`SCALE_BENCH_GAP_S` after the last seeding pass began: make it
//!   longer than the node takes to settle, or the first fires come before the window).
//!
//! Not measured: jobs created through the API while the node runs (the shard's create path),
//! more than one node, a worker in a process of its own.

use std::{
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use chrono::Utc;
use chronoshard_cluster::Cluster;
use chronoshard_shard_node::{Databases, ShardConfig};
use chronoshard_test_util::Nats;
use chronoshard_wire::settings::Settings;

// `Seed::create_jobs` (one-shots only) serves fire.rs; this bench seeds cron jobs as well.
#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;
mod firing;
mod node;

use common::{assign_all, cores, cpu_model, env_num, finish, loadavg, runtime, Seed};
use firing::{Firing, NoopWorker};
use node::{mem_total_kib, NodeFigures, NodeParams, NODE_ENV};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const NODE: &str = "scale-node";
/// The jobs' target queue.
const QUEUE: &str = "scale";
/// Due offsets under this are written last, counted from just before the node starts.
const NEAR_MS: i64 = 2 * 3_600_000;
/// Poll interval of the wait loops (the conditions decide, not the interval).
const POLL: Duration = Duration::from_millis(50);
/// Progress lines while seeding.
const PROGRESS_EVERY: Duration = Duration::from_secs(60);

fn main() -> Res<()> {
    let began = Instant::now();
    let rt = runtime()?;
    match std::env::var(NODE_ENV) {
        Ok(params) => rt.block_on(node::node_process(serde_json::from_str(&params)?, began)),
        Err(_) => rt.block_on(run()),
    }
}

#[derive(Clone, Debug)]
struct Config {
    jobs: Vec<usize>,
    shards: u32,
    tenants: usize,
    batch: usize,
    span_ms: i64,
    gap_ms: i64,
    observe: Duration,
    timeout: Duration,
    dir: std::path::PathBuf,
    postgres: bool,
    /// The firing mode (`firing.rs`), when `SCALE_BENCH_RATE` is set.
    firing: Option<Firing>,
}

impl Config {
    fn from_env() -> Res<Config> {
        let jobs = std::env::var("SCALE_BENCH_JOBS")
            .unwrap_or_else(|_| "0,100000,1000000,10000000".into())
            .split(',')
            .map(|s| {
                s.trim()
                    .replace('_', "")
                    .parse()
                    .map_err(|_| format!("SCALE_BENCH_JOBS: {s:?} is not a number"))
            })
            .collect::<Result<Vec<usize>, _>>()?;
        Ok(Config {
            jobs,
            shards: env_num("SCALE_BENCH_SHARDS", 8u32)?.max(1),
            tenants: env_num("SCALE_BENCH_TENANTS", 4usize)?.max(1),
            batch: env_num("SCALE_BENCH_BATCH", 1000usize)?.max(1),
            span_ms: env_num("SCALE_BENCH_DAYS", 30i64)?.max(1) * 86_400_000,
            gap_ms: env_num("SCALE_BENCH_GAP_S", 60i64)? * 1000,
            observe: Duration::from_secs(env_num("SCALE_BENCH_OBSERVE_S", 10)?),
            timeout: Duration::from_secs(env_num("SCALE_BENCH_TIMEOUT_S", 1800)?),
            dir: std::env::var_os("SCALE_BENCH_DIR")
                .map(Into::into)
                .unwrap_or_else(std::env::temp_dir),
            postgres: env_num("SCALE_BENCH_POSTGRES", 0u32)? != 0,
            firing: Firing::from_env()?,
        })
    }

    fn gap(&self) -> Duration {
        Duration::from_millis(self.gap_ms.max(0) as u64)
    }

    /// The span (ms) the one-shots of `n` jobs are due over.
    fn span_ms(&self, n: usize) -> Res<i64> {
        match self.firing {
            Some(f) => f.one_shot_span_ms(n),
            None => Ok(self.span_ms),
        }
    }
}

async fn run() -> Res<()> {
    let cfg = Config::from_env()?;
    let started = Utc::now();
    let horizon = ShardConfig::default().horizon;
    let backend = if cfg.postgres { "postgres" } else { "sqlite" };
    let due = match cfg.firing {
        Some(f) => format!(
            "firing {}/s ({}% hourly cron jobs, the rest one-shots), a no-op worker",
            f.rate, f.cron_percent
        ),
        None => format!("due over {} days", cfg.span_ms / 86_400_000),
    };
    println!(
        "scale bench: {} cores ({}), {} MiB RAM, load average {}; N = {:?}, {} shards on {backend}, {} tenants per shard, {due}, horizon {} s",
        cores(),
        cpu_model(),
        mem_total_kib() / 1024,
        loadavg(),
        cfg.jobs,
        cfg.shards,
        cfg.tenants,
        horizon.as_secs()
    );
    let mut report = serde_json::json!({
        "bench": "shard-node scale",
        "command": "cargo bench -p chronoshard-shard-node --bench scale",
        "date": started.to_rfc3339(),
        "machine": {
            "cores": cores(), "cpu_model": cpu_model(), "mem_total_kib": mem_total_kib(),
            "load_average_before": loadavg(),
        },
        "shards": cfg.shards,
        "backend": backend,
        "tenants_per_shard": cfg.tenants,
        "seed_jobs_per_transaction": cfg.batch,
        "due_span_days": cfg.firing.is_none().then_some(cfg.span_ms / 86_400_000),
        "firing": cfg.firing.map(|f| serde_json::json!({"rate_per_s": f.rate, "cron_percent": f.cron_percent})),
        "horizon_s": horizon.as_secs(),
        "gap_s": cfg.gap_ms / 1000,
        "observe_s": cfg.observe.as_secs(),
    });
    let mut runs = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let mut bytes_per_job = 2048.0;
    let mut rows: Vec<Row> = Vec::new();
    let pg = if cfg.postgres {
        Some(chronoshard_test_util::Postgres::start().await?)
    } else {
        None
    };
    for &n in &cfg.jobs {
        let need = (n as f64 * bytes_per_job * 1.5) as u64 + (256 << 20);
        // The Postgres server keeps its data where the fixture ran initdb.
        let disk = pg.as_ref().map_or(cfg.dir.as_path(), |pg| pg.data_dir());
        let avail = disk_available(disk);
        if avail.is_some_and(|a| a < need) {
            let msg = format!(
                "N = {n}: skipped, needs about {} MiB on {} and {} MiB are free",
                need >> 20,
                disk.display(),
                avail.unwrap_or(0) >> 20
            );
            println!("{msg}");
            failures.push(msg);
            continue;
        }
        match measure(&cfg, n, pg.as_ref()).await {
            Ok(row) => {
                if n > 0 {
                    bytes_per_job = row.disk_bytes as f64 / n as f64;
                }
                report["nats_server"] = row.nats_version.clone().into();
                runs.push(row.json());
                rows.push(row);
            }
            Err(e) => {
                let msg = format!("N = {n}: {e}");
                println!("FAILED {msg}");
                failures.push(msg);
            }
        }
    }
    print_table(&rows);
    let base = rows.iter().find(|r| r.jobs == 0);
    let top = rows.iter().max_by_key(|r| r.jobs);
    if let (Some(b), Some(t)) = (base, top) {
        if t.jobs > 0 {
            let ratio = t.node.rss_kib as f64 / b.node.rss_kib as f64;
            let peak = t.node.hwm_kib as f64 / b.node.hwm_kib as f64;
            println!(
                "RSS settled at N = {}: {:.2}× that at N = 0 (peak {:.2}×)",
                t.jobs, ratio, peak
            );
            report["rss_ratio_largest_to_zero"] = ((ratio * 100.0).round() / 100.0).into();
            report["peak_rss_ratio_largest_to_zero"] = ((peak * 100.0).round() / 100.0).into();
        }
    }
    report["runs"] = runs.into();
    report["failures"] = failures.clone().into();
    report["machine"]["load_average_after"] = loadavg().into();
    finish(&report, "bench-scale.json", &failures)
}

/// One N: what seeding took and what the node process reported.
struct Row {
    jobs: usize,
    seed_secs: f64,
    disk_bytes: u64,
    expected_wheel: u64,
    nats_version: String,
    node: NodeFigures,
    /// The worker's start lateness over the node's window (firing mode).
    starts: Option<serde_json::Value>,
}

impl Row {
    fn seed_rate(&self) -> f64 {
        self.jobs as f64 / self.seed_secs.max(1e-9)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "jobs": self.jobs,
            "seed_s": (self.seed_secs * 10.0).round() / 10.0,
            "seed_jobs_per_s": self.seed_rate().round(),
            "disk_bytes": self.disk_bytes,
            "disk_bytes_per_job": (self.jobs > 0).then(|| (self.disk_bytes as f64 / self.jobs as f64).round()),
            "wheel_entries_expected_at_least": self.expected_wheel,
            "node": serde_json::to_value(&self.node).unwrap_or_default(),
            "start_lateness": self.starts,
        })
    }
}

/// One N on the backend `pg` selects; its files or its database are removed afterwards, whatever
/// happened, so the next N has the disk space.
async fn measure(cfg: &Config, n: usize, pg: Option<&chronoshard_test_util::Postgres>) -> Res<Row> {
    println!("\n# N = {n}");
    let data = tempfile::tempdir_in(&cfg.dir)?;
    let dbs = match pg {
        Some(pg) => Databases::Postgres(pg.create_database().await?),
        None => Databases::Sqlite(data.path().to_path_buf()),
    };
    let row = measure_on(cfg, n, &dbs, data.path()).await;
    data.close()?;
    if let (Some(pg), Databases::Postgres(url)) = (pg, &dbs) {
        drop_database(pg, url).await?;
    }
    row
}

async fn measure_on(cfg: &Config, n: usize, dbs: &Databases, data: &Path) -> Res<Row> {
    let nats = Nats::start().await?;
    let cluster = Cluster::create(nats.client().await?, &Default::default()).await?;
    assign_all(&cluster, cfg.shards, NODE, Settings::DEFAULT).await?;
    let began = Instant::now();
    // Pass 1: every job due two hours or more from now; pass 2: the nearer ones, counted from now.
    let (far, _) = seed(cfg, dbs, n, Pass::Far, began).await?;
    let (near, near_due) = seed(cfg, dbs, n, Pass::Near, began).await?;
    let seed_secs = began.elapsed().as_secs_f64();
    if far + near != n as u64 {
        return Err(format!("seeded {far} + {near} jobs of {n}").into());
    }
    let disk_bytes = match dbs {
        Databases::Sqlite(dir) => dir_bytes(dir)?,
        Databases::Postgres(url) => database_bytes(url).await?,
    };
    println!(
        "seeded: {n} jobs in {seed_secs:.1} s ({:.0} jobs/s, {near} of them in the last pass), {:.1} MiB on disk ({} bytes per job)",
        n as f64 / seed_secs.max(1e-9),
        disk_bytes as f64 / 1048576.0,
        if n > 0 { (disk_bytes / n as u64).to_string() } else { "-".into() }
    );
    // The seeding's writes reach the disk before the node starts: else the kernel writes back
    // gigabytes while the node is watched, and throttles every process's writes meanwhile.
    let synced = Instant::now();
    tokio::process::Command::new("sync").status().await?;
    println!("sync: {:.1} s", synced.elapsed().as_secs_f64());
    // The node's first load takes every job due by its start plus the horizon, at least.
    let until = Utc::now().timestamp_millis() + ShardConfig::default().horizon.as_millis() as i64;
    let expected: Vec<u64> = near_due
        .iter()
        .map(|due| due.iter().filter(|at| **at <= until).count() as u64)
        .collect();
    let expected_wheel: u64 = expected.iter().sum();
    let params = NodeParams {
        url: nats.url(),
        data: data.display().to_string(),
        postgres: match dbs {
            Databases::Postgres(url) => Some(url.clone()),
            Databases::Sqlite(_) => None,
        },
        shards: cfg.shards,
        expected,
        observe_ms: cfg.observe.as_millis() as u64,
        timeout_ms: cfg.timeout.as_millis() as u64,
        first_due_ms: cfg.firing.and(near_due.iter().flatten().min().copied()),
    };
    let worker = match cfg.firing {
        Some(_) => Some(NoopWorker::start(&nats.url(), QUEUE).await?),
        None => None,
    };
    let deadline = cfg.timeout + cfg.observe + Duration::from_secs(120) + cfg.gap();
    let node = node::run_node_process(&params, deadline).await?;
    let starts = match worker {
        Some(w) => Some(firing::starts(w, &node).await?),
        None => None,
    };
    println!(
        "node: every shard open {} ms after start (open → event loop up to {} ms), settled after {} ms ({} ms after its process started); wheel entries {} (expected at least {expected_wheel}), fires meanwhile {}",
        node.open_ms, node.recovery_ms(), node.settled_ms, node.process_settled_ms, node.wheel_entries, node.fires
    );
    println!(
        "node RSS: settled {:.1} MiB (anon {:.1}), highest sample {:.1}, end {:.1}, peak (VmHWM) {:.1} MiB; {} threads",
        mib(node.rss_kib),
        mib(node.rss_anon_kib),
        mib(node.rss_max_sampled_kib),
        mib(node.rss_end_kib),
        mib(node.hwm_kib),
        node.threads
    );
    let nats_version = nats.server.binary.version.clone();
    drop(cluster);
    drop(nats);
    Ok(Row {
        jobs: n,
        seed_secs,
        disk_bytes,
        expected_wheel,
        nats_version,
        node,
        starts,
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    Far,
    Near,
}

/// Writes the pass's jobs of every shard, shards in parallel; returns how many it wrote and,
/// per shard, their due times (the near pass only).
async fn seed(
    cfg: &Config,
    dbs: &Databases,
    n: usize,
    pass: Pass,
    began: Instant,
) -> Res<(u64, Vec<Vec<i64>>)> {
    let now = Utc::now().timestamp_millis();
    let (span, gap, firing) = (cfg.span_ms(n)?, cfg.gap_ms, cfg.firing);
    let done = Arc::new(AtomicU64::new(0));
    let seed = Seed {
        owner: NODE,
        name: "scale-bench",
        queue: QUEUE,
        tenants: cfg.tenants,
        batch: cfg.batch,
    };
    let shards = cfg.shards as usize;
    let mut tasks = Vec::new();
    for shard in 0..shards {
        let (dbs, done) = (dbs.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            // Job i = shard + k × shards.
            let due = (shard..n).step_by(shards).enumerate().filter_map(|(k, i)| {
                let i = i as u64;
                if let Some(f) = firing.filter(|f| f.is_cron(i)) {
                    // Within the hour after the gap: always the near pass.
                    let (expr, at) = f.cron(i, now + gap);
                    return (pass == Pass::Near).then_some((k, at, Some(expr)));
                }
                let offset = due_offset(i, span);
                match pass {
                    Pass::Far if offset >= NEAR_MS => Some((k, now + offset, None)),
                    Pass::Near if offset < NEAR_MS => Some((k, now + gap + offset, None)),
                    _ => None,
                }
            });
            let mut near = Vec::new();
            seed.create_scheduled(&dbs, shard as u32, due, |_, at| {
                done.fetch_add(1, Ordering::Relaxed);
                if pass == Pass::Near {
                    near.push(at);
                }
            })
            .await?;
            Res::Ok(near)
        }));
    }
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    let all = futures::future::try_join_all(tasks);
    tokio::pin!(all);
    let near = loop {
        tokio::select! {
            r = &mut all => break r?,
            _ = tick.tick() => {
                let secs = began.elapsed().as_secs_f64();
                let d = done.load(Ordering::Relaxed);
                println!("  seeding: {d} jobs of this pass after {secs:.0} s, load average {}", loadavg());
            }
        }
    };
    let near = near.into_iter().collect::<Res<Vec<_>>>()?;
    Ok((done.load(Ordering::Relaxed), near))
}

/// Job `i`'s due offset in `[0, span)` ms: a fixed hash (splitmix64), uniform over the span.
fn due_offset(i: u64, span: i64) -> i64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % span as u64) as i64
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Drops an N's database, so the next N has the disk space back.
async fn drop_database(pg: &chronoshard_test_util::Postgres, url: &str) -> Res<()> {
    use sqlx::{Connection, Executor};
    let name = url
        .rsplit('/')
        .next()
        .ok_or("a database URL without a name")?;
    let mut conn = sqlx::PgConnection::connect(&pg.url("postgres")).await?;
    conn.execute(format!("DROP DATABASE {name} WITH (FORCE)").as_str())
        .await?;
    conn.close().await?;
    Ok(())
}

/// The size of a Postgres database, every shard schema in it.
async fn database_bytes(url: &str) -> Res<u64> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let bytes: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
        .fetch_one(&mut conn)
        .await?;
    conn.close().await?;
    Ok(bytes as u64)
}

/// Bytes of the files in `dir` (the shard databases, their WAL and shared-memory files).
fn dir_bytes(dir: &Path) -> Res<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir)? {
        let m = e?.metadata()?;
        if m.is_file() {
            total += m.len();
        }
    }
    Ok(total)
}

/// Free bytes on the file system holding `dir` (`df`), if it can tell.
fn disk_available(dir: &Path) -> Option<u64> {
    let out = std::process::Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(dir)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)?
        .trim()
        .parse()
        .ok()
}

fn print_table(rows: &[Row]) {
    println!("\n| N | seeding | disk | open | open → event loop (slowest shard) | settled | RSS settled | RSS highest | peak RSS | wheel entries |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {:.0} jobs/s ({:.0} s) | {:.1} MiB | {} ms | {} ms | {} ms | {:.1} MiB | {:.1} MiB | {:.1} MiB | {} |",
            r.jobs,
            r.seed_rate(),
            r.seed_secs,
            r.disk_bytes as f64 / 1048576.0,
            r.node.open_ms,
            r.node.recovery_ms(),
            r.node.settled_ms,
            mib(r.node.rss_kib),
            mib(r.node.rss_max_sampled_kib),
            mib(r.node.hwm_kib),
            r.node.wheel_entries
        );
    }
}
