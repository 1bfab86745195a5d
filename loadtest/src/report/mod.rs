//! What one run found, as data: the JSON result (`report.json`, this module's types serialized)
//! and the HTML report rendered from the same value (`html.rs`). Nothing here measures anything;
//! the runner fills these in from the probes, so the JSON and the HTML can never disagree.
//!
//! Times are milliseconds (`_ms`) or seconds (`_s`) as named; instants are RFC 3339 UTC.
//! The layout is versioned (`version`); fields are only ever added.

pub mod html;
pub mod text;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Bumped when a field changes meaning or goes away (adding one does not bump it).
pub const VERSION: u32 = 1;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub version: u32,
    pub run_id: String,
    /// `burst`, `spread`, `cron-fleet`, `tenants`, `fault`, `grow` or `raw`.
    pub scenario: String,
    /// The command line's scenario settings, as given.
    pub params: serde_json::Value,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub machine: Machine,
    pub platform: PlatformInfo,
    /// Creating the jobs through `POST /v1/jobs` (absent for `raw`).
    pub create: Option<CreateStats>,
    /// Scheduled time → ticket published on the dispatch stream (seen by a NATS subscriber).
    pub fire: Option<PhaseStats>,
    /// Scheduled time → executor start (the no-op queue handler, or the HTTP sink).
    pub start: Option<PhaseStats>,
    /// Fire → executor → result recorded by the shard.
    pub end_to_end: Option<Throughput>,
    pub correctness: Option<Correctness>,
    /// The same machine's JetStream ceiling, measured in this run (`--raw`, or the `raw` scenario).
    pub raw: Option<RawStats>,
    /// Platform figures as a fraction of the raw ceiling (1.0 = as fast as bare JetStream).
    pub ratios: Vec<Ratio>,
    pub processes: Vec<ProcessStats>,
    pub timeline: Timeline,
    pub fire_histogram: Option<Histogram>,
    /// `tenants`: fire lateness of the big tenant (half of all jobs) and of all the others.
    #[serde(default)]
    pub fairness: Option<Fairness>,
    /// `grow`: the shards added while the jobs fired, and the figures before, during and after.
    #[serde(default)]
    pub growth: Option<Growth>,
    pub start_histogram: Option<Histogram>,
    /// What the run did to the platform and when (faults, phases), for the plots' annotations.
    pub events: Vec<Event>,
    /// The platform's own histograms over the run (its `/metrics`), beside the probes' figures.
    #[serde(default)]
    pub server: Vec<ServerView>,
    /// Each measured figure next to its target.
    pub targets: Vec<TargetCheck>,
    /// Anything that makes the figures less trustworthy (a creator that fell behind, a scrape that
    /// failed, the platform was not started by this run).
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    pub hostname: String,
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_bytes: u64,
    pub kernel: String,
    /// 1-minute load average at the start and at the end of the run.
    pub load_start: f64,
    pub load_end: f64,
    /// What a wake-up costs on this machine, measured at the start of the run.
    #[serde(default)]
    pub wake: WakeCost,
}

/// What a wake-up costs: round trips between two threads that each sleep until the other wakes
/// it (two wake-ups each), as every hand-off between the platform's threads and processes is.
/// When jobs come one at a time a job crosses threads dozens of times, so this is a large part
/// of what a job costs at low and middling rates, and it says how far CPU figures measured on
/// one machine carry to another. On one machine it differs between a wake-up that reaches a
/// sleeping core and one that is a switch on a single core: 43–60 against 3.6–5.4 µs of CPU per
/// round trip on the VM of BENCHMARKS.md.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WakeCost {
    /// The threads on two CPUs: each wake-up reaches a CPU that sleeps. None (`null`) with one
    /// CPU.
    pub cross_core: Option<RoundTrip>,
    /// Both threads on one core: each wake-up is a switch on that core.
    pub same_core: Option<RoundTrip>,
}

impl WakeCost {
    /// "68.2 µs CPU (91.0 µs wall) across two cores, 3.9 µs CPU (4.1 µs wall) on one core"
    /// (per round trip); None when neither part was measured.
    pub fn describe(&self) -> Option<String> {
        let part = |t: &Option<RoundTrip>, on: &str| {
            t.map(|t| format!("{:.1} µs CPU ({:.1} µs wall) {on}", t.cpu_us, t.wall_us))
        };
        let parts: Vec<String> = [
            part(&self.cross_core, "across two cores"),
            part(&self.same_core, "on one core"),
        ]
        .into_iter()
        .flatten()
        .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

/// One round trip, medians of the batches.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RoundTrip {
    /// CPU of both threads (µs).
    pub cpu_us: f64,
    /// Wall time (µs).
    pub wall_us: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PlatformInfo {
    pub url: String,
    pub nats_url: String,
    /// nats-server's version as its INFO reports it.
    pub nats_version: String,
    /// `chronoshard --version` of the binary the run started (it names the commit); empty
    /// when the run was given a platform.
    #[serde(default)]
    pub chronoshard_version: String,
    /// True when this run started the platform's processes itself.
    pub spawned: bool,
    pub shard_nodes: usize,
    pub workers: usize,
}

/// Percentiles of a set of samples, in milliseconds. Empty sets have `count` 0 and zeros.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    pub count: u64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CreateStats {
    pub requested: u64,
    pub created: u64,
    /// Requests answered with an error or not at all (after their tries); the first few
    /// messages are in `errors`.
    pub failed: u64,
    /// Creates that needed more than one try (5xx or no answer, repeated under the same
    /// `Idempotency-Key`); their latency includes every try.
    #[serde(default)]
    pub retried: u64,
    pub errors: Vec<String>,
    /// The open-loop rate asked for (0 = as fast as `concurrency` allows).
    pub target_per_s: f64,
    pub achieved_per_s: f64,
    /// Intended send time → response, so a slow server shows as latency, not as a lower rate.
    pub latency_ms: Percentiles,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PhaseStats {
    /// Distinct tickets whose first attempt was seen in this phase (retries are not counted).
    pub count: u64,
    /// First to last event of the phase.
    pub per_s: f64,
    pub lateness_ms: Percentiles,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Throughput {
    pub completed: u64,
    /// From the first ticket published to the last result recorded.
    pub window_s: f64,
    pub per_s: f64,
    /// CPU per completed job over that window, of each process watched through all of it (a
    /// process killed or started inside the window is left out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_us_per_job: Vec<CpuPerUnit>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Correctness {
    /// Occurrences the scenario's jobs must produce inside the measured window.
    pub expected: u64,
    /// Of those, occurrences that got at least one ticket published / executed.
    pub fired: u64,
    pub executed: u64,
    /// Expected occurrences never executed (and not reported `missed`/`skipped` by the platform).
    pub missed: u64,
    /// Occurrences the platform itself reported `missed` or `skipped`. Every load-test job asks
    /// for `catchup: all` and `overlap: allow`, so these are lost occurrences too (the run fails);
    /// they are counted apart because the platform at least said so.
    pub reported_not_fired: u64,
    /// Occurrences that got two or more distinct ticket ids: must be 0.
    pub occurrences_with_two_tickets: u64,
    /// Tickets whose executor started more than once.
    pub tickets_executed_twice: u64,
    /// Occurrences whose executor started more than once (under one ticket or several).
    #[serde(default)]
    pub occurrences_executed_twice: u64,
    /// Of those, the ones whose earlier execution was on a worker killed before it finished
    /// (the only allowed reason).
    pub executed_twice_after_worker_death: u64,
    /// Up to 20 examples of each problem above, for a human to follow up.
    pub examples: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RawStats {
    pub count: u64,
    /// The rate asked for (0 = as fast as the pipeline allows).
    pub target_per_s: f64,
    /// Publish of the first job → consume of the last result.
    pub per_s: f64,
    /// Intended publish time → result consumed.
    pub round_trip_ms: Percentiles,
    /// CPU per round trip of each process watched while it ran (this tool, which runs the raw
    /// publisher and consumers, and the nats-server when its pid is known).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_us_per_round_trip: Vec<CpuPerUnit>,
}

/// The CPU (user + system) one process spent per unit of work: per job end to end, or per raw
/// round trip.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuPerUnit {
    pub name: String,
    pub pid: u32,
    pub us: f64,
}

impl CpuPerUnit {
    /// `cpu_s` seconds spent over `units` (at least one) units of work.
    pub fn of(name: &str, pid: u32, cpu_s: f64, units: u64) -> CpuPerUnit {
        CpuPerUnit {
            name: name.to_string(),
            pid,
            us: cpu_s.max(0.0) * 1e6 / units.max(1) as f64,
        }
    }
}

/// The sum of a list of `CpuPerUnit`.
pub fn cpu_total(v: &[CpuPerUnit]) -> f64 {
    v.iter().map(|c| c.us).sum()
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Ratio {
    pub what: String,
    pub platform: f64,
    pub raw: f64,
    pub ratio: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessStats {
    pub name: String,
    pub pid: u32,
    /// User + system CPU used during the run.
    pub cpu_s: f64,
    /// `cpu_s` over the run's duration: 1.0 = one core busy all the time.
    pub cpu_cores: f64,
    /// Largest resident set seen during the run (sampled), and the kernel's high-water mark.
    pub peak_rss_bytes: u64,
    pub hwm_rss_bytes: u64,
}

/// Per-bucket figures over the run, for the plots. `t_s` is the bucket's start, seconds since the
/// run's `started_at`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Timeline {
    pub bucket_ms: u64,
    pub buckets: Vec<Bucket>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Bucket {
    pub t_s: f64,
    pub created: u64,
    /// Tickets published, executor starts and results recorded in this bucket.
    pub fired: u64,
    pub started: u64,
    pub completed: u64,
    /// Fire lateness of the tickets published in this bucket (absent when none were).
    pub fire_p50_ms: Option<f64>,
    pub fire_p99_ms: Option<f64>,
    pub fire_max_ms: Option<f64>,
    pub start_p99_ms: Option<f64>,
}

/// Counts per lateness range: `counts[i]` samples fell in `[bounds_ms[i], bounds_ms[i+1])`; the
/// last count is everything at or above the last bound. Bounds grow logarithmically.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Histogram {
    pub bounds_ms: Vec<f64>,
    pub counts: Vec<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Fairness {
    pub big_tenant: String,
    pub big: Percentiles,
    pub others: Percentiles,
}

/// Shards added while the jobs fired (`grow`). Times are seconds since the run's `started_at`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Growth {
    /// The shard count before, the shards asked for, and the count once the growth was done
    /// (`None` when it did not finish before the drain deadline).
    pub shards_from: u32,
    pub shards_added: u32,
    pub shards_after: Option<u32>,
    /// `POST /v1/shards` sent.
    pub started_s: f64,
    /// The first `GET /v1/shards` (polled every 50 ms) without `growth`.
    pub ended_s: Option<f64>,
    pub duration_s: Option<f64>,
    /// The shard node process started during the growth (ready), and when it first owned
    /// shards (`GET /v1/nodes`).
    pub node: String,
    pub node_joined_s: Option<f64>,
    pub node_owned_shards_s: Option<f64>,
    /// Tenants moved to the added shards: the largest `growth.tenants_moved` seen, or the
    /// distinct tenants of the moves seen (`moving`, `recent`), whichever is more. Moves that
    /// finish after the last poll that still showed the growth are not seen, so this can be
    /// low by the last one or two.
    pub tenants_moved: u64,
    /// `before` (up to the POST), `during` (POST until the growth was done) and `after`.
    pub phases: Vec<GrowthPhase>,
}

/// Fires and executor starts (first attempts) of one phase of a growth, by when they happened.
/// `per_s` is over the phase's span: from its start (or the first event, for `before`) to its
/// end (or the last event, for `after`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GrowthPhase {
    pub name: String,
    /// The phase's bounds; open (`None`) before the first and after the last event.
    pub from_s: Option<f64>,
    pub to_s: Option<f64>,
    pub fire: PhaseStats,
    pub start: PhaseStats,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Event {
    pub t_s: f64,
    pub what: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TargetCheck {
    pub what: String,
    /// The target as a sentence, e.g. `p99 < 3 ms`.
    pub target: String,
    pub measured: String,
    /// `None` when this run cannot tell (e.g. the figure was not measured).
    pub met: Option<bool>,
}

/// A histogram of the platform over this run, summed over the series that match.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerView {
    /// What it measures, as docs/metrics.md says.
    pub what: String,
    /// The metric and the labels selected (`name{label="value"}`).
    pub metric: String,
    pub count: u64,
    /// Each finite bucket bound in ms with the share of observations at or under it.
    pub within: Vec<(f64, f64)>,
    /// The bucket bounds (ms) the 99th and 99.9th percentiles lie above and at or under; no
    /// upper bound when they are above the last finite one.
    pub p99_ms: (f64, Option<f64>),
    pub p999_ms: (f64, Option<f64>),
}

impl ServerView {
    /// The share of observations at or under `ms`, if that is a bucket bound.
    pub fn share_within(&self, ms: f64) -> Option<f64> {
        self.within
            .iter()
            .find(|(b, _)| (b - ms).abs() < 1e-9)
            .map(|&(_, s)| s)
    }
}
