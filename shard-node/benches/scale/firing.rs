//! The scale bench's firing mode (`SCALE_BENCH_RATE` set): the N jobs are due at a steady rate
//! instead of over days, a share of them are hourly cron jobs, and a no-op worker in the bench's
//! own process runs the tickets, so the node is measured while it fires, applies results and holds
//! the N jobs, against the everyday-rate lateness targets.
//!
//! - Job `i` is a cron job when a fixed hash of it falls under `SCALE_BENCH_CRON_PERCENT`:
//!   `S M * * * *` (UTC) at its own second of the hour, so it fires every hour and its schedule
//!   is evaluated at each fire. The rest are one-shots spread uniformly over the span that makes
//!   every job together fire `rate` times a second: the cron jobs fire `crons / 3600` a second,
//!   the one-shots the remainder. N of one run and N of another therefore fire at the same rate,
//!   and what differs between them is the job count alone.
//! - The earliest occurrence is `SCALE_BENCH_GAP_S` after the seeding's last pass began. The node
//!   process waits until a second before that instant (after it settled) and observes for
//!   `SCALE_BENCH_OBSERVE_S` from there: its fire lateness (the node's own histograms, read
//!   before and after, so only the window's fires count), its fires and its RSS. The worker
//!   writes down each first attempt's start lateness (handler start minus the ticket's scheduled
//!   time); the report keeps the tickets scheduled within the window.
//!
//! It owns only what the firing mode adds; seeding and the node process stay in `main.rs`.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use chronoshard_telemetry::metrics;
use chronoshard_worker::{Connections, Handlers, Job, JobError, Options, QueueLimits, Worker};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{
    common::{env_num, Percentiles},
    due_offset, NodeFigures, Res,
};

/// An hour in ms: a cron job's period.
const HOUR_MS: i64 = 3_600_000;
/// Mixed into a job's index for the cron-or-not hash, so the choice does not follow its due time.
const CRON_SALT: u64 = 0x00C0_FFEE;

/// What the firing mode needs to place the jobs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Firing {
    /// Occurrences a second, every job together.
    pub rate: f64,
    /// Share of the jobs that are hourly cron jobs, in percent.
    pub cron_percent: u64,
}

impl Firing {
    /// `Some` when `SCALE_BENCH_RATE` is set.
    pub fn from_env() -> Res<Option<Firing>> {
        let rate: f64 = env_num("SCALE_BENCH_RATE", 0.0)?;
        if rate <= 0.0 {
            return Ok(None);
        }
        let cron_percent = env_num("SCALE_BENCH_CRON_PERCENT", 10u64)?;
        if cron_percent > 100 {
            return Err(format!("SCALE_BENCH_CRON_PERCENT={cron_percent} is over 100").into());
        }
        let firing = Firing { rate, cron_percent };
        firing.check_crons()?;
        Ok(Some(firing))
    }

    /// The seeding writes a cron job's first occurrence itself: a few are checked against the
    /// schedule evaluation the shard runs, so a wrong one fails the bench instead of firing late.
    fn check_crons(&self) -> Res<()> {
        let from = chrono::Utc::now().timestamp_millis();
        for i in 0..1000 {
            let (expr, at) = self.cron(i, from);
            let cron = chronoshard_schedule::Cron::parse(&expr, "UTC")?;
            let before = chrono::DateTime::from_timestamp_millis(at - 1).ok_or("a time")?;
            let next = cron.next_after(before).map(|t| t.timestamp_millis());
            if next != Some(at) || at < from || at >= from + HOUR_MS {
                return Err(format!("cron {expr:?}: seeded {at}, evaluated {next:?}").into());
            }
        }
        Ok(())
    }

    pub fn is_cron(&self, i: u64) -> bool {
        due_offset(i ^ CRON_SALT, 100) < self.cron_percent as i64
    }

    /// The span (ms) over which the one-shots of `n` jobs are spread, so that they and the cron
    /// jobs fire `rate` a second together; an error when the cron jobs alone fire faster.
    pub fn one_shot_span_ms(&self, n: usize) -> Res<i64> {
        let crons = n as f64 * self.cron_percent as f64 / 100.0;
        let one_shots = n as f64 - crons;
        let left = self.rate - crons * 1000.0 / HOUR_MS as f64;
        if left <= 0.0 {
            return Err(format!(
                "{crons:.0} hourly cron jobs alone fire {:.0}/s, more than SCALE_BENCH_RATE={}",
                crons * 1000.0 / HOUR_MS as f64,
                self.rate
            )
            .into());
        }
        Ok(((one_shots / left) * 1000.0).max(1.0) as i64)
    }

    /// Job `i`'s cron expression and its first occurrence at or after `from` (ms).
    pub fn cron(&self, i: u64, from: i64) -> (String, i64) {
        let second = due_offset(i, HOUR_MS) / 1000;
        let expr = format!("{} {} * * * *", second % 60, second / 60);
        let hour = from - from.rem_euclid(HOUR_MS);
        let mut at = hour + second * 1000;
        if at < from {
            at += HOUR_MS;
        }
        (expr, at)
    }
}

/// A histogram's cumulative bucket counts (every shard together), to subtract one reading from
/// a later one.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Buckets {
    /// (upper bound in seconds, cumulative count), ascending, `+Inf` last.
    pub counts: Vec<(f64, u64)>,
}

impl Buckets {
    pub fn read(h: &prometheus::HistogramVec, shards: u32) -> Buckets {
        let mut counts: Vec<(f64, u64)> = Vec::new();
        for s in 0..shards {
            let m = prometheus::core::Metric::metric(&h.with_label_values(&[&s.to_string()]));
            let h = m.get_histogram();
            if counts.is_empty() {
                counts = h
                    .get_bucket()
                    .iter()
                    .map(|b| (b.upper_bound(), 0))
                    .collect();
                counts.push((f64::INFINITY, 0));
            }
            for (c, b) in counts.iter_mut().zip(h.get_bucket()) {
                c.1 += b.cumulative_count();
            }
            if let Some(inf) = counts.last_mut() {
                inf.1 += h.get_sample_count();
            }
        }
        Buckets { counts }
    }

    /// What was observed after `earlier`.
    pub fn since(&self, earlier: &Buckets) -> Buckets {
        let counts = self
            .counts
            .iter()
            .zip(earlier.counts.iter().chain(std::iter::repeat(&(0.0, 0))))
            .map(|(a, b)| (a.0, a.1.saturating_sub(b.1)))
            .collect();
        Buckets { counts }
    }

    pub fn total(&self) -> u64 {
        self.counts.last().map_or(0, |c| c.1)
    }

    /// The share of observations at or under `le` seconds (a bucket bound).
    pub fn within(&self, le: f64) -> f64 {
        let at = self.counts.iter().find(|c| c.0 >= le).map_or(0, |c| c.1);
        at as f64 / self.total().max(1) as f64
    }

    /// The smallest bucket bound (ms) that holds at least `q` of the observations: the quantile
    /// is at or under it. None when nothing was observed, or when only `+Inf` holds it.
    pub fn quantile_bound_ms(&self, q: f64) -> Option<f64> {
        let need = (q * self.total() as f64).ceil().max(1.0) as u64;
        self.counts
            .iter()
            .find(|c| c.1 >= need)
            .map(|c| c.0 * 1000.0)
            .filter(|ms| ms.is_finite())
    }

    pub fn json(&self) -> serde_json::Value {
        let bound = |q| self.quantile_bound_ms(q);
        serde_json::json!({
            "count": self.total(),
            "within_3ms": self.within(0.003),
            "within_10ms": self.within(0.01),
            "p99_at_most_ms": bound(0.99),
            "p999_at_most_ms": bound(0.999),
        })
    }
}

/// The node's fire lateness histograms (at the send and at JetStream's ack), read together.
pub(crate) fn lateness(shards: u32) -> (Buckets, Buckets) {
    (
        Buckets::read(&metrics::FIRE_SEND_LATENESS_SECONDS, shards),
        Buckets::read(&metrics::FIRE_LATENESS_SECONDS, shards),
    )
}

/// The no-op worker: runs every ticket of `queue` at once and writes down each first attempt's
/// (scheduled ms, start lateness µs).
pub(crate) struct NoopWorker {
    starts: Arc<Mutex<Vec<(i64, i64)>>>,
    /// Stops the worker when the bench leaves a run early, on an error.
    stop: DropGuard,
    task: JoinHandle<()>,
    _journal: tempfile::TempDir,
}

impl NoopWorker {
    pub async fn start(url: &str, queue: &str) -> Res<NoopWorker> {
        let starts = Arc::new(Mutex::new(Vec::new()));
        let seen = starts.clone();
        let handler = move |job: Job| {
            let seen = seen.clone();
            async move {
                let t = job.ticket();
                if t.attempt == 1 {
                    let now = chrono::Utc::now();
                    let late = (now - t.scheduled_at)
                        .num_microseconds()
                        .unwrap_or(i64::MAX);
                    seen.lock()
                        .map_err(|_| JobError::new("start list poisoned"))?
                        .push((t.scheduled_at.timestamp_millis(), late));
                }
                Ok::<(), JobError>(())
            }
        };
        let journal = tempfile::tempdir()?;
        let mut opts = Options::new("scale-bench-worker", journal.path());
        let limits = QueueLimits {
            concurrency: 256,
            rate_per_second: None,
        };
        opts.handlers = Handlers::new().queue_with(queue, handler, limits);
        let stop = CancellationToken::new();
        let nats = Connections::connect(url, "scale-bench-worker").await?;
        let task = Worker::start(opts, nats, stop.clone()).await?;
        Ok(NoopWorker {
            starts,
            stop: stop.drop_guard(),
            task,
            _journal: journal,
        })
    }

    /// Stops the worker; returns the start lateness (ms) of the first attempts scheduled in
    /// `[from, until)` ms.
    async fn stop(self, from: i64, until: i64) -> Res<Vec<f64>> {
        drop(self.stop);
        tokio::time::timeout(Duration::from_secs(60), self.task).await??;
        let starts = self.starts.lock().map_err(|_| "start list poisoned")?;
        Ok(starts
            .iter()
            .filter(|(at, _)| (from..until).contains(at))
            .map(|(_, us)| *us as f64 / 1000.0)
            .collect())
    }
}

/// Stops the worker and sums up the start lateness of the first attempts scheduled in the
/// node's observation window; prints it with the node's fire lateness.
pub(crate) async fn starts(worker: NoopWorker, node: &NodeFigures) -> Res<serde_json::Value> {
    let mut late = worker
        .stop(node.window_from_ms, node.window_until_ms)
        .await?;
    let within_5ms = late.iter().filter(|ms| **ms <= 5.0).count() as f64 / late.len().max(1) as f64;
    let p = Percentiles::of(&mut late);
    // Hundredths of a millisecond, not `Percentiles::json`'s tenths: these are exact samples.
    let ms = |x: f64| x.is_finite().then(|| (x * 100.0).round() / 100.0);
    let window_s = (node.window_until_ms - node.window_from_ms) as f64 / 1000.0;
    let starts = serde_json::json!({
        "count": late.len(), "p50_ms": ms(p.p50), "p99_ms": ms(p.p99), "p999_ms": ms(p.p999),
        "max_ms": ms(p.max), "within_5ms": within_5ms,
    });
    println!(
        "firing: {} fires in {window_s:.1} s ({:.0}/s; {} before the window); fire lateness at the send {}, at JetStream's ack {}; start lateness {starts}",
        node.window_fires,
        node.window_fires as f64 / window_s.max(1e-9),
        node.fires - node.window_fires,
        node.fire_send_lateness,
        node.fire_lateness,
    );
    Ok(starts)
}
