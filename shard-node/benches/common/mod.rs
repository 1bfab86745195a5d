//! What the shard-node benches share: the cluster state that hands every shard to one node, jobs
//! (one-shot, or cron) written straight into a shard's database through its store (the rows the
//! shard's create request would write), percentiles, and the facts about the machine a report
//! names. Each bench includes it
//! with `mod common;` (a directory without `main.rs`, so Cargo does not take it for a bench; a
//! bench in a directory of its own names the path).

use std::path::{Path, PathBuf};

use chronoshard_cluster::Cluster;
use chronoshard_shard_node::{
    shard::store::{CreateOutcome, JobRow, Store},
    Databases,
};
use chronoshard_wire::{
    from_millis,
    rpc::{ClusterConfig, ShardAssignment},
    settings::Settings,
    JobSpec, JobState,
};
use uuid::Uuid;

use super::Res;

/// Writes the cluster config (`shards` shards) and live settings, and assigns every shard to
/// `node` with epoch 1.
pub(crate) async fn assign_all(
    cluster: &Cluster,
    shards: u32,
    node: &str,
    settings: Settings,
) -> Res<()> {
    cluster
        .init_config(&ClusterConfig::new(shards, Default::default()))
        .await?;
    cluster.init_settings(settings).await?;
    for shard in 0..shards {
        let a = ShardAssignment {
            shard,
            owner: node.into(),
            epoch: 1,
        };
        cluster.put_assignment(&a, None).await?;
    }
    Ok(())
}

/// The jobs a bench creates: who opens the stores, and what the jobs look like.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seed {
    /// Node id recorded as the shard's owner (epoch 1), as the node that later opens it.
    pub owner: &'static str,
    /// The jobs' `name`.
    pub name: &'static str,
    /// Target queue of every job.
    pub queue: &'static str,
    /// Tenants per shard: job `k` of shard `s` belongs to `bench-s{s}-t{k % tenants}`.
    pub tenants: usize,
    /// Jobs per transaction (`Store::create_jobs`, as the shard writes creates queued together);
    /// 1 is a transaction per job, as a lone create request.
    pub batch: usize,
}

impl Seed {
    fn row(&self, tenant: &str, at: i64, cron: Option<&str>, now: i64) -> Res<JobRow> {
        let schedule = match cron {
            Some(expr) => serde_json::json!({"cron": expr}),
            None => serde_json::json!({"at": from_millis(at).to_rfc3339()}),
        };
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "tenant": tenant,
            "name": self.name,
            "schedule": schedule,
            "target": {"type": "queue", "queue": self.queue},
        }))?;
        Ok(JobRow {
            id: Uuid::now_v7(),
            tenant: tenant.into(),
            spec,
            state: JobState::Active,
            created_at: now,
            updated_at: now,
            anchor_at: now,
            next_fire_at: Some(at),
            buffered_at: None,
        })
    }

    /// Creates one shard's one-shot jobs `(k, due ms)`: see `create_scheduled`.
    pub(crate) async fn create_jobs(
        &self,
        dbs: &Databases,
        shard: u32,
        due: impl IntoIterator<Item = (usize, i64)>,
        created: impl FnMut(Uuid, i64),
    ) -> Res<()> {
        let due = due.into_iter().map(|(k, at)| (k, at, None));
        self.create_scheduled(dbs, shard, due, created).await
    }

    /// Creates one shard's jobs `(k, next occurrence ms, cron expression)` through its store,
    /// `batch` per transaction (`Store::create_jobs`, the shard's own create path), calls
    /// `created(id, due)` for each, then closes the store. A job without a cron expression is a
    /// one-shot at its occurrence; a cron job's occurrence must be one its expression matches (in
    /// UTC), since it is written as the job's next fire time.
    pub(crate) async fn create_scheduled(
        &self,
        dbs: &Databases,
        shard: u32,
        due: impl IntoIterator<Item = (usize, i64, Option<String>)>,
        mut created: impl FnMut(Uuid, i64),
    ) -> Res<()> {
        let now = chrono::Utc::now().timestamp_millis();
        let store = Store::open(dbs, shard, 1, self.owner, now).await?;
        let batch = self.batch.max(1);
        let mut rows: Vec<JobRow> = Vec::with_capacity(batch);
        let mut due = due.into_iter().peekable();
        while let Some((k, at, cron)) = due.next() {
            let tenant = format!("bench-s{shard}-t{}", k % self.tenants.max(1));
            rows.push(self.row(&tenant, at, cron.as_deref(), now)?);
            if rows.len() == batch || due.peek().is_none() {
                let jobs: Vec<(&JobRow, Option<&str>)> = rows.iter().map(|r| (r, None)).collect();
                for (outcome, row) in store.create_jobs(&jobs).await?.iter().zip(&rows) {
                    if *outcome != CreateOutcome::Created {
                        return Err(format!("job {} was not created: {outcome:?}", row.id).into());
                    }
                    created(row.id, row.next_fire_at.unwrap_or(at));
                }
                rows.clear();
            }
        }
        store.close().await;
        Ok(())
    }
}

/// Fires (ticket rows written) counted by the node's metrics, over every shard: the bench runs
/// the node in its own process, so its metrics are the bench's.
pub(crate) fn fires_total(shards: u32) -> u64 {
    (0..shards)
        .map(|s| {
            chronoshard_telemetry::metrics::FIRES_TOTAL
                .with_label_values(&[&s.to_string()])
                .get()
        })
        .sum()
}

/// Nearest-rank percentiles of a sample.
pub(crate) struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles (NaN for an empty sample).
    pub fn of(v: &mut [f64]) -> Percentiles {
        v.sort_by(f64::total_cmp);
        let q = |p: f64| {
            if v.is_empty() {
                return f64::NAN;
            }
            let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
            v[rank - 1]
        };
        Percentiles {
            p50: q(0.5),
            p99: q(0.99),
            p999: q(0.999),
            max: q(1.0),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        let r = |x: f64| (x * 10.0).round() / 10.0;
        serde_json::json!({"p50": r(self.p50), "p99": r(self.p99), "p99_9": r(self.p999), "max": r(self.max)})
    }
}

pub(crate) fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `$CARGO_TARGET_DIR/<file>`, else `target/<file>` of the workspace.
pub(crate) fn output_path(file: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join(file)
}

/// The bench's runtime, with the node's warnings (failed fires, publish retries) logged and its
/// info lines not, unless `RUST_LOG` says otherwise.
pub(crate) fn runtime() -> Res<tokio::runtime::Runtime> {
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "warn");
    }
    chronoshard_telemetry::init_logging(false);
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Writes `report` as pretty JSON to `output_path(file)` and says where; then, when anything
/// failed, prints each failure and ends the process with status 1 (a bench run is judged by its
/// exit status as well as read).
pub(crate) fn finish(report: &serde_json::Value, file: &str, failures: &[String]) -> Res<()> {
    let path = output_path(file);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, serde_json::to_string_pretty(report)? + "\n")?;
    println!("written: {}", path.display());
    if !failures.is_empty() {
        for f in failures {
            println!("FAILURE: {f}");
        }
        std::process::exit(1);
    }
    Ok(())
}

/// A number from the environment variable `name`, or `default` when it is not set.
pub(crate) fn env_num<T: std::str::FromStr>(name: &str, default: T) -> Res<T> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a number").into()),
        Err(_) => Ok(default),
    }
}
