//! A production deployment on this machine, every role a separate `chronoshard` process: NATS
//! (one server, or a 3-node cluster), PostgreSQL for the shard databases, control-plane
//! replicas (with `--plugin-dir` and other flags), shard nodes (with zones and labels) and
//! workers, and an HTTP sink the jobs call. What a test checks about
//! it (exactly-once, failover times) is written once here.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::Duration,
};

use chrono::{DateTime, Utc};
use chronoshard_test_util::{HttpSink, Nats, NatsCluster, Postgres};
use serde_json::{json, Value};

use super::{process::Process, wait_for, Api, LONG};

/// The NATS of a deployment.
pub enum NatsServers {
    One(Nats),
    Cluster(NatsCluster),
}

impl NatsServers {
    pub fn url(&self) -> String {
        match self {
            NatsServers::One(n) => n.url(),
            NatsServers::Cluster(c) => c.url(),
        }
    }
}

pub const TOKEN: &str = "prod-test-token";

/// The processes and servers of one deployment.
pub struct Deployment {
    pub nats: NatsServers,
    pub pg: Postgres,
    /// The shard nodes' database.
    pub pg_url: String,
    pub sink: HttpSink,
    pub control_planes: BTreeMap<String, (Process, String)>,
    pub nodes: BTreeMap<String, Process>,
    pub workers: BTreeMap<String, Process>,
    /// NATS stream and bucket replicas the control planes ask for.
    pub replicas: u8,
    /// Variables given to each process started from now on.
    pub env: Vec<(String, String)>,
}

impl Deployment {
    /// NATS (`servers` of them: 1, or a cluster), PostgreSQL and the sink; no process yet.
    pub async fn start(servers: usize) -> Deployment {
        let nats = if servers == 1 {
            NatsServers::One(Nats::start().await.unwrap())
        } else {
            NatsServers::Cluster(NatsCluster::start(servers).await.unwrap())
        };
        let pg = Postgres::start().await.unwrap();
        let pg_url = pg.create_database().await.unwrap();
        Deployment {
            nats,
            pg,
            pg_url,
            sink: HttpSink::start().await.unwrap(),
            control_planes: BTreeMap::new(),
            nodes: BTreeMap::new(),
            workers: BTreeMap::new(),
            replicas: if servers >= 3 { 3 } else { 1 },
            env: Vec::new(),
        }
    }

    /// Starts a control-plane replica and waits until it serves; `extra` are more flags.
    pub async fn control_plane(&mut self, id: &str, extra: &[&str]) {
        let nats = self.nats.url();
        let replicas = self.replicas.to_string();
        let mut args = vec![
            "control-plane",
            "--id",
            id,
            "--nats",
            &nats,
            "--http",
            "127.0.0.1:0",
            "--token",
            TOKEN,
            "--replicas",
            &replicas,
        ];
        args.extend_from_slice(extra);
        let p = self.process(id, &args);
        p.printed(&format!("chronoshard control-plane {id} is ready"))
            .await;
        p.printed("url:").await;
        let url = p
            .lines()
            .iter()
            .find_map(|l| l.trim().strip_prefix("url:").map(|u| u.trim().to_string()))
            .expect("the url is printed");
        self.control_planes.insert(id.to_string(), (p, url));
    }

    /// Starts a shard node on the PostgreSQL database and waits until it says it is ready.
    pub async fn node(&mut self, id: &str) {
        self.node_with(id, &[]).await
    }

    /// Like `node`, with more flags (`--zone`, `--label KEY=VALUE`).
    pub async fn node_with(&mut self, id: &str, extra: &[&str]) {
        let (nats, pg) = (self.nats.url(), self.pg_url.clone());
        let mut args = vec![
            "shard-node",
            "--node-id",
            id,
            "--nats",
            &nats,
            "--postgres",
            &pg,
        ];
        args.extend_from_slice(extra);
        let p = self.process(id, &args);
        p.printed(&format!("chronoshard shard-node {id} is ready"))
            .await;
        self.nodes.insert(id.to_string(), p);
    }

    /// Starts a worker that may call the sink on loopback.
    pub fn worker(&mut self, id: &str, data: &std::path::Path) {
        self.worker_with(id, data, &[]);
    }

    /// Like `worker`, with more flags (`--metrics ADDR`).
    pub fn worker_with(&mut self, id: &str, data: &std::path::Path, extra: &[&str]) {
        let nats = self.nats.url();
        let data = data.join(id);
        let mut args = vec![
            "worker",
            "--id",
            id,
            "--nats",
            &nats,
            "--data",
            data.to_str().unwrap(),
            "--http-allow",
            "127.0.0.1",
        ];
        args.extend_from_slice(extra);
        let p = self.process(id, &args);
        self.workers.insert(id.to_string(), p);
    }

    /// Every process's `/metrics` as a Prometheus scrape target, under its role as the job:
    /// the control planes' API, and the shard nodes and workers started with `--metrics`.
    pub async fn metrics_targets(&self) -> Vec<chronoshard_test_util::prometheus::Target> {
        use chronoshard_test_util::prometheus::Target;
        let mut targets: Vec<Target> = self
            .control_planes
            .values()
            .map(|(_, url)| Target::new("control-plane", &format!("{url}/metrics")))
            .collect();
        for p in self.nodes.values() {
            targets.push(Target::new("shard-node", &p.metrics_url().await));
        }
        for p in self.workers.values() {
            targets.push(Target::new("worker", &p.metrics_url().await));
        }
        targets
    }

    /// `chronoshard ARGS` as `id`, with the deployment's variables.
    fn process(&self, id: &str, args: &[&str]) -> Process {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Process::start_with(id, args, &env)
    }

    /// A client of one replica's API.
    pub fn api(&self, replica: &str) -> Api {
        Api::at(&self.control_planes[replica].1, TOKEN)
    }

    /// The HTTP target of a job named `name`.
    pub fn target(&self, name: &str) -> Value {
        json!({"type": "http", "url": self.sink.url(&format!("/{name}")), "method": "POST"})
    }

    /// Executions the sink saw, per occurrence (job id, scheduled at).
    pub fn executions(&self) -> HashMap<(String, String), Vec<DateTime<Utc>>> {
        executions_in(&self.sink)
    }
}

/// Executions `sink` saw, per occurrence (job id, scheduled at).
pub fn executions_in(sink: &HttpSink) -> HashMap<(String, String), Vec<DateTime<Utc>>> {
    let mut per: HashMap<(String, String), Vec<DateTime<Utc>>> = HashMap::new();
    for r in sink.requests() {
        let h = &r.headers;
        per.entry((
            h["x-chronoshard-job-id"].clone(),
            h["x-chronoshard-scheduled-at"].clone(),
        ))
        .or_default()
        .push(r.received_at.into());
    }
    per
}

/// Shard → owner, when the map gives every shard to one of `nodes` and each of them is live
/// with exactly its shards open (so old owners closed what moved away).
pub async fn settled(api: &Api, nodes: &[&str]) -> Option<BTreeMap<String, BTreeSet<u64>>> {
    let (s1, map) = api.get("/v1/shards").await;
    let (s2, live) = api.get("/v1/nodes").await;
    if s1 != 200 || s2 != 200 {
        return None;
    }
    let shards = map["shards"].as_array()?;
    if shards.len() as u64 != map["shard_count"].as_u64()? {
        return None;
    }
    let mut assigned: BTreeMap<String, BTreeSet<u64>> = nodes
        .iter()
        .map(|n| (n.to_string(), BTreeSet::new()))
        .collect();
    for a in shards {
        assigned
            .get_mut(a["owner"].as_str()?)?
            .insert(a["shard"].as_u64()?);
    }
    let open: BTreeMap<String, BTreeSet<u64>> = live["nodes"]
        .as_array()?
        .iter()
        .filter(|n| n["status"] != "lost")
        .map(|n| {
            let shards = n["shards"].as_array().unwrap();
            let shards = shards.iter().map(|s| s.as_u64().unwrap()).collect();
            (n["node_id"].as_str().unwrap().to_string(), shards)
        })
        .filter(|(_, s): &(String, BTreeSet<u64>)| !s.is_empty())
        .collect();
    let busy: BTreeMap<String, BTreeSet<u64>> = assigned
        .iter()
        .filter(|(_, s)| !s.is_empty())
        .map(|(n, s)| (n.clone(), s.clone()))
        .collect();
    (open == busy).then_some(assigned)
}

/// Waits until `nodes` hold every shard, each of them at least one.
pub async fn wait_settled(api: &Api, nodes: &[&str]) -> BTreeMap<String, BTreeSet<u64>> {
    wait_for(
        &format!("{nodes:?} to own and open every shard"),
        Duration::from_secs(60),
        || async {
            settled(api, nodes)
                .await
                .filter(|m| m.values().all(|s| !s.is_empty()))
        },
    )
    .await
    .unwrap()
}

/// Creates every-second jobs (catch-up `all`, so every occurrence of an outage fires) over
/// tenants until each of the `shards` shards holds `per_shard` of them; returns job id → shard.
pub async fn every_second_jobs(
    d: &Deployment,
    api: &Api,
    shards: u64,
    per_shard: usize,
) -> BTreeMap<String, u64> {
    let mut jobs = BTreeMap::new();
    let mut count: HashMap<u64, usize> = HashMap::new();
    for i in 0..400 {
        if (0..shards).all(|s| count.get(&s).copied().unwrap_or(0) >= per_shard) {
            return jobs;
        }
        let tenant = format!("tenant-{i}");
        let body = json!({"tenant": tenant, "name": "tick", "schedule": {"every": "1s"},
            "catchup": {"policy": "all", "window": "1h"}, "target": d.target("tick")});
        let (status, job) = api.post("/v1/jobs", &body).await;
        assert_eq!(status, 201, "{job}");
        let shard = job["shard"].as_u64().unwrap();
        if count.get(&shard).copied().unwrap_or(0) >= per_shard {
            let id = job["id"].as_str().unwrap();
            let (s, _, _) = api
                .send(reqwest::Method::DELETE, &format!("/v1/jobs/{id}"), None)
                .await;
            assert!(s < 300, "delete {id}: {s}");
            continue;
        }
        *count.entry(shard).or_default() += 1;
        jobs.insert(job["id"].as_str().unwrap().to_string(), shard);
    }
    panic!("400 tenants did not cover {shards} shards: {count:?}");
}

pub fn at(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

/// Checks that every occurrence of the every-second `job` from its first up to `upto` fired
/// once: one run each, succeeded, with one ticket and one attempt, spaced by exactly 1 s, and
/// that the sink got each of them once. Returns the scheduled times checked.
pub async fn every_occurrence_once(
    d: &Deployment,
    api: &Api,
    job: &str,
    upto: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    let runs = runs_up_to(api, job, upto).await;
    each_once(&d.executions(), job, &runs)
}

/// The runs of the every-second `job` up to `upto`, once all of them succeeded and a later one
/// exists.
pub async fn runs_up_to(api: &Api, job: &str, upto: DateTime<Utc>) -> Vec<Value> {
    wait_for(
        &format!("every tick of {job} up to {upto} to succeed"),
        Duration::from_secs(90),
        || async {
            let (status, page) = api.get(&format!("/v1/jobs/{job}/runs?limit=500")).await;
            if status != 200 {
                return None;
            }
            let runs: Vec<Value> = page["runs"].as_array()?.clone();
            let newest = runs
                .iter()
                .filter(|r| r["status"] != "scheduled")
                .map(|r| at(&r["scheduled_at"]))
                .max()?;
            let upto_runs: Vec<Value> = runs
                .into_iter()
                .filter(|r| r["status"] != "scheduled" && at(&r["scheduled_at"]) <= upto)
                .collect();
            (newest > upto && upto_runs.iter().all(|r| r["status"] == "succeeded"))
                .then_some(upto_runs)
        },
    )
    .await
    .unwrap()
}

/// Checks that `runs` of the every-second `job` are one per second, each with one ticket and
/// one attempt, and that `executions` (the sink's) has each of them once.
pub fn each_once(
    executions: &HashMap<(String, String), Vec<DateTime<Utc>>>,
    job: &str,
    runs: &[Value],
) -> Vec<DateTime<Utc>> {
    let mut times: Vec<DateTime<Utc>> = runs.iter().map(|r| at(&r["scheduled_at"])).collect();
    times.sort();
    for w in times.windows(2) {
        assert_eq!(
            (w[1] - w[0]).num_milliseconds(),
            1000,
            "job {job}: each occurrence there once: {times:?}"
        );
    }
    for r in runs {
        assert_eq!(r["ticket_ids"].as_array().unwrap().len(), 1, "{r}");
        assert_eq!(r["attempts"], 1, "{r}");
    }
    for t in &times {
        let key = (job.to_string(), chronoshard_wire::rfc3339(*t));
        let n = executions.get(&key).map_or(0, |v| v.len());
        assert_eq!(n, 1, "job {job} at {t}: executed {n} times");
    }
    times
}

/// When the sink got the occurrence of `job` scheduled at `t`.
pub fn executed_at(d: &Deployment, job: &str, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
    d.executions()
        .get(&(job.to_string(), chronoshard_wire::rfc3339(t)))
        .and_then(|v| v.first().copied())
}

/// Every run of `job` as the API shows it, not merely scheduled; none while the API answers
/// otherwise (a 503 while a shard moves or NATS fails over: callers wait for a condition).
pub async fn runs(api: &Api, job: &str) -> Vec<Value> {
    let (status, page) = api.get(&format!("/v1/jobs/{job}/runs?limit=500")).await;
    if status != 200 {
        return Vec::new();
    }
    page["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["status"] != "scheduled")
        .cloned()
        .collect()
}

pub const SETTLE: Duration = LONG;

/// Each shard's epoch in the shard map.
pub async fn epochs(api: &Api) -> HashMap<u64, u64> {
    let (_, map) = api.get("/v1/shards").await;
    map["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["shard"].as_u64().unwrap(), a["epoch"].as_u64().unwrap()))
        .collect()
}

/// Creates `n` jobs at once, a few requests in flight; returns their ids with their shards.
pub async fn create_all(api: &Api, bodies: Vec<Value>) -> BTreeMap<String, (String, u64)> {
    use futures::StreamExt;
    futures::stream::iter(bodies)
        .map(|body| async move {
            let job = create_keyed(api, &body).await;
            (
                job["id"].as_str().unwrap().to_string(),
                (
                    job["tenant"].as_str().unwrap().to_string(),
                    job["shard"].as_u64().unwrap(),
                ),
            )
        })
        .buffer_unordered(8)
        .collect()
        .await
}

/// Creates a job as a client that retries does: with an `Idempotency-Key`, sent again with the
/// same key while the answer is 503 (a shard too busy to answer in time, or a tenant's move
/// taken up again after a failed step, as under a growth on a loaded machine), so that a copy
/// the shard created anyway is the job answered. The deadline is a growth's, not a request's:
/// on a machine twice as slow as usual one tenant's creates were refused for over 30 s.
async fn create_keyed(api: &Api, body: &Value) -> Value {
    let key = uuid::Uuid::now_v7().to_string();
    let began = std::time::Instant::now();
    let job = wait_for("a create to be answered", 4 * LONG, || async {
        let resp = api
            .http
            .post(format!("{}/v1/jobs", api.base))
            .bearer_auth(&api.token)
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("request sent");
        let status = resp.status().as_u16();
        let job: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
        match status {
            // 200: a resend that found the job its first copy created.
            200 | 201 => Some(job),
            503 => None,
            _ => panic!("create answered {status}: {job}"),
        }
    })
    .await
    .unwrap();
    if began.elapsed() > LONG {
        eprintln!("a create was answered after {:?}", began.elapsed());
    }
    job
}

/// Prints how late the jobs `of` ran (the sink's first receipt after the due time) in each of
/// three phases that `phase` gives a due time, as p50, p99 and max. Printed, not asserted:
/// timing is the load test's business.
pub fn print_lateness(
    what: &str,
    names: [&str; 3],
    executions: &HashMap<(String, String), Vec<DateTime<Utc>>>,
    of: impl Fn(&str) -> bool,
    phase: impl Fn(DateTime<Utc>) -> usize,
) {
    let mut late: [Vec<i64>; 3] = Default::default();
    for ((job, at), got) in executions {
        if !of(job) {
            continue;
        }
        let at: DateTime<Utc> = at.parse().unwrap();
        late[phase(at).min(2)].push((got[0] - at).num_milliseconds());
    }
    for (name, l) in names.iter().zip(&mut late) {
        l.sort_unstable();
        let q = |f: f64| {
            l.get(((l.len() as f64 - 1.0) * f) as usize)
                .copied()
                .unwrap_or(0)
        };
        eprintln!(
            "tick lateness {name} {what}: {} ticks, p50 {} ms, p99 {} ms, max {} ms",
            l.len(),
            q(0.5),
            q(0.99),
            q(1.0)
        );
    }
}
