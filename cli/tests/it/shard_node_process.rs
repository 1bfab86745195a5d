//! The `chronoshard shard-node` process as an operator runs it next to a `chronoshard dev`
//! platform, on its NATS and its data dir: it takes a fair share of the shards from the dev node
//! (the moved shards' epochs fence the old owner) and fires what is due on them; killed with
//! `kill -9`, its shards go back to the remaining node and every occurrence still fires exactly
//! once. SIGTERM stops it cleanly (exit 0, out of the node registry at once); a second process
//! cannot take a live node's id, but may take a killed one's at once; an unreachable NATS and
//! bad settings are clear errors.

use std::{
    collections::HashMap,
    path::Path,
    process::{Command, Output},
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::common::{
    cluster::{epochs, wait_settled},
    process::{command, Process},
    *,
};
use chrono::{DateTime, Utc};
use nix::sys::signal::Signal;
use serde_json::{json, Value};

/// A `chronoshard shard-node` child process.
struct NodeProcess(Process);

impl std::ops::Deref for NodeProcess {
    type Target = Process;
    fn deref(&self) -> &Process {
        &self.0
    }
}

impl std::ops::DerefMut for NodeProcess {
    fn deref_mut(&mut self) -> &mut Process {
        &mut self.0
    }
}

impl NodeProcess {
    fn start(nats: &str, data: &Path, id: &str) -> NodeProcess {
        let data = data.to_str().unwrap();
        NodeProcess(Process::start(
            id,
            &[
                "shard-node",
                "--nats",
                nats,
                "--node-id",
                id,
                "--data",
                data,
                "--metrics",
                "127.0.0.1:0",
            ],
        ))
    }

    async fn ready(&self) {
        self.printed(&format!("chronoshard shard-node {} is ready", self.name))
            .await;
    }
}

/// Runs `chronoshard` to its end (at most `within`).
async fn run_to_exit(mut cmd: Command, within: Duration) -> Output {
    let task = tokio::task::spawn_blocking(move || cmd.output().unwrap());
    tokio::time::timeout(within, task)
        .await
        .expect("the command exits in time")
        .unwrap()
}

/// Creates a job as a client that retries a 503 under one Idempotency-Key; returns the job and
/// how many 503s it got.
async fn create_retrying(api: &Api, body: &Value, key: &str) -> (Value, u32) {
    let unavailable = Mutex::new(0);
    let job = wait_for(
        &format!("the create {key} to be accepted"),
        LONG,
        || async {
            let resp = api
                .http
                .post(format!("{}/v1/jobs", api.base))
                .bearer_auth(&api.token)
                .header("Idempotency-Key", key)
                .json(body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let v: Value = resp.json().await.unwrap();
            match status {
                201 => Some(v),
                503 => {
                    *unavailable.lock().unwrap() += 1;
                    None
                }
                _ => panic!("create {key}: {status} {v}"),
            }
        },
    )
    .await
    .unwrap();
    let n = *unavailable.lock().unwrap();
    (job, n)
}

/// Waits until the job's only run has succeeded, and checks it had one ticket and one attempt.
async fn ran_once(api: &Api, job: &str, within: Duration) {
    let runs = wait_for(&format!("the run of {job} to succeed"), within, || async {
        let runs = api.past_runs(job).await;
        (runs.len() == 1 && runs[0]["status"] == "succeeded").then_some(runs)
    })
    .await
    .unwrap();
    assert_eq!(
        runs[0]["ticket_ids"].as_array().unwrap().len(),
        1,
        "{runs:?}"
    );
    assert_eq!(runs[0]["attempts"], 1, "{runs:?}");
}

fn at(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_node_process_takes_shards_and_a_kill_moves_them_back_with_every_occurrence_fired_once(
) {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| {
        o.shard_nodes = 1;
        o.workers = 1;
    })
    .await;
    let api = Api::new(&p);
    let sink = HttpSink::start().await.unwrap();
    wait_settled(&api, &["node-1"]).await;

    // Joining: the balanced strategy moves half the shards; each move bumps the epoch, which
    // shuts node-1 out of those shard databases.
    let started = Instant::now();
    let mut node = NodeProcess::start(&p.nats_url, dir.path(), "node-x");
    node.ready().await;
    let owners = wait_settled(&api, &["node-1", "node-x"]).await;
    // Its own metrics endpoint, as a process without an API serves them.
    let metrics = node.metrics_url().await;
    let shards_open = wait_for("node-x's metrics to show its 4 shards", LONG, || async {
        let text = reqwest::get(&metrics).await.ok()?.text().await.ok()?;
        text.lines()
            .any(|l| l == "chronoshard_shards_open{node=\"node-x\"} 4")
            .then_some(text)
    })
    .await
    .unwrap();
    assert!(shards_open.contains("chronoshard_node_cpu_cores{node=\"node-x\"}"));
    let joined_in = started.elapsed();
    let mine = owners["node-x"].clone();
    assert_eq!((mine.len(), owners["node-1"].len()), (4, 4), "{owners:?}");
    let e = epochs(&api).await;
    for (shard, epoch) in &e {
        assert_eq!(*epoch, if mine.contains(shard) { 2 } else { 1 }, "{e:?}");
    }

    let target = |name: &str| json!({"type": "http", "url": sink.url(&format!("/{name}")), "method": "POST"});
    let one_shot = |tenant: &str, name: &str, delay: &str| json!({"tenant": tenant, "name": name, "schedule": {"delay": delay}, "target": target(name)});
    let tenants: Vec<String> = (0..16).map(|i| format!("t-{i}")).collect();
    let mut one_shots = Vec::new();
    let mut shard_of = HashMap::new();
    for t in &tenants {
        let (status, job) = api
            .post("/v1/jobs", &one_shot(t, &format!("joined-{t}"), "2s"))
            .await;
        assert_eq!(status, 201, "{job}");
        shard_of.insert(t.clone(), job["shard"].as_u64().unwrap());
        one_shots.push(job["id"].as_str().unwrap().to_string());
    }
    let on_x: Vec<&String> = tenants
        .iter()
        .filter(|t| mine.contains(&shard_of[*t]))
        .collect();
    assert!(
        on_x.len() >= 2 && on_x.len() <= 14,
        "the tenants spread over both nodes: {shard_of:?}, node-x has {mine:?}"
    );
    // Every second, on one of node-x's shards, catching up every occurrence after an outage.
    let tick = api
        .create(
            &json!({"tenant": on_x[0], "name": "tick", "schedule": {"every": "1s"},
            "catchup": {"policy": "all", "window": "1h"}, "target": target("tick")}),
        )
        .await;
    for job in &one_shots {
        ran_once(&api, job, LONG).await;
    }
    wait_for("three runs of the tick job on node-x", LONG, || async {
        let ok = api.past_runs(&tick).await;
        (ok.iter().filter(|r| r["status"] == "succeeded").count() >= 3).then_some(())
    })
    .await
    .unwrap();

    // Due 4 s from now: after the kill, while node-x's shards have no owner yet.
    for t in &tenants {
        let (status, job) = api
            .post("/v1/jobs", &one_shot(t, &format!("across-{t}"), "4s"))
            .await;
        assert_eq!(status, 201, "{job}");
        one_shots.push(job["id"].as_str().unwrap().to_string());
    }
    node.signal(Signal::SIGKILL);
    assert_eq!(node.exited(LONG).await, None, "ended by SIGKILL");
    let killed = Instant::now();
    let killed_at = Utc::now();

    // Created while node-x's shards have no owner: the control plane waits for the new owner
    // (up to 12 s, longer than the failover), so no create is refused. The client would retry a
    // 503 under the same Idempotency-Key; it is counted and must not happen.
    let mut refused = 0;
    for t in &tenants {
        let name = format!("after-{t}");
        let (job, n) = create_retrying(&api, &one_shot(t, &name, "1s"), &name).await;
        refused += n;
        one_shots.push(job["id"].as_str().unwrap().to_string());
    }
    assert_eq!(refused, 0, "creates answered 503 during the failover");
    let owners = wait_settled(&api, &["node-1"]).await;
    let moved_back_in = killed.elapsed();
    assert_eq!(owners["node-1"].len(), 8);
    let e = epochs(&api).await;
    for (shard, epoch) in &e {
        assert_eq!(*epoch, if mine.contains(shard) { 3 } else { 1 }, "{e:?}");
    }

    // Nothing lost, nothing doubled: each one-shot ran once, with one ticket...
    for job in &one_shots {
        ran_once(&api, job, Duration::from_secs(90)).await;
    }
    let all_ran_in = killed.elapsed();
    // ...and each occurrence of the tick job from its first to a point past the outage fired
    // once, those due during the outage late, after the move.
    let cutoff =
        Utc::now().max(killed_at + chrono::Duration::seconds(3)) + chrono::Duration::seconds(2);
    let ticks = wait_for(
        "every tick up to the cutoff to succeed",
        Duration::from_secs(90),
        || async {
            let runs = api.past_runs(&tick).await;
            let newest = runs.iter().map(|r| at(&r["scheduled_at"])).max()?;
            let upto: Vec<Value> = runs
                .into_iter()
                .filter(|r| at(&r["scheduled_at"]) <= cutoff)
                .collect();
            (newest > cutoff && upto.iter().all(|r| r["status"] == "succeeded")).then_some(upto)
        },
    )
    .await
    .unwrap();
    let mut times: Vec<DateTime<Utc>> = ticks.iter().map(|r| at(&r["scheduled_at"])).collect();
    times.sort();
    for w in times.windows(2) {
        assert_eq!(
            (w[1] - w[0]).num_milliseconds(),
            1000,
            "the tick occurrences are each there once: {times:?}"
        );
    }
    assert!(
        times[0] < killed_at - chrono::Duration::seconds(2)
            && *times.last().unwrap() > killed_at + chrono::Duration::seconds(3),
        "the ticks checked span the outage: {times:?}, killed at {killed_at}"
    );
    for r in &ticks {
        assert_eq!(r["ticket_ids"].as_array().unwrap().len(), 1, "{r}");
        assert_eq!(r["attempts"], 1, "{r}");
    }

    // The one worker ran each ticket once.
    let requests = sink.requests();
    let mut per_ticket: HashMap<String, usize> = HashMap::new();
    let mut per_occurrence: HashMap<(String, String), usize> = HashMap::new();
    for r in &requests {
        let h = &r.headers;
        *per_ticket.entry(h["idempotency-key"].clone()).or_default() += 1;
        *per_occurrence
            .entry((
                h["x-chronoshard-job-id"].clone(),
                h["x-chronoshard-scheduled-at"].clone(),
            ))
            .or_default() += 1;
    }
    let twice: Vec<_> = per_occurrence.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "occurrences executed twice: {twice:?}");
    assert!(per_ticket.values().all(|n| *n == 1));
    for job in &one_shots {
        assert_eq!(
            requests
                .iter()
                .filter(|r| r.headers["x-chronoshard-job-id"] == *job)
                .count(),
            1,
            "job {job} reached its target once"
        );
    }
    eprintln!(
        "timing: node-x owned its shards {joined_in:?} after its start; its shards were open on \
         node-1 again {moved_back_in:?} after the kill; \
         every one-shot had run {all_ran_in:?} after the kill; {} ticks checked",
        ticks.len()
    );
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_stops_a_shard_node_cleanly_and_its_id_is_refused_while_it_lives_only() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| {
        o.shard_nodes = 1;
        o.workers = 0;
    })
    .await;
    let api = Api::new(&p);
    let start = |id: &str| NodeProcess::start(&p.nats_url, dir.path(), id);
    let mut node = start("node-y");
    node.ready().await;
    wait_settled(&api, &["node-1", "node-y"]).await;

    // A second process under a live node's id is refused.
    let mut cmd = command(&["shard-node", "--nats", &p.nats_url, "--node-id", "node-y"]);
    cmd.arg("--data").arg(dir.path());
    let out = run_to_exit(cmd, LONG).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("node id node-y is in use"), "{err}");

    // Killed, its entry is still listed (as lost, for a minute): a restart under the same id
    // does not wait for that, and takes the same shards back.
    node.signal(Signal::SIGKILL);
    node.exited(LONG).await;
    let restarted = Instant::now();
    let mut node = start("node-y");
    node.ready().await;
    let ready_in = restarted.elapsed();
    let owners = wait_settled(&api, &["node-1", "node-y"]).await;
    let mine = owners["node-y"].len();

    let stopping = Instant::now();
    node.signal(Signal::SIGTERM);
    assert_eq!(node.exited(LONG).await, Some(0), "a SIGTERM stop exits 0");
    let stopped_in = stopping.elapsed();
    node.printed("stopped").await;
    assert_eq!(node.logged("shard closed"), mine, "each shard closed");
    // Left the registry on its way out, not by its heartbeat expiring.
    let (_, nodes) = api.get("/v1/nodes").await;
    assert!(
        nodes["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["node_id"] != "node-y"),
        "{nodes}"
    );
    wait_settled(&api, &["node-1"]).await;
    eprintln!(
        "timing: a restart after kill -9 was ready in {ready_in:?}; SIGTERM to exit {stopped_in:?}; \
         every shard back on node-1 {:?} after the SIGTERM",
        stopping.elapsed()
    );
    p.stop().await.unwrap();
}

#[tokio::test]
async fn an_unreachable_nats_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    let mut cmd = command(&["shard-node", "--nats", &url, "--node-id", "n-1", "--data"]);
    cmd.arg(dir.path());
    let out = run_to_exit(cmd, LONG).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot connect to NATS at {url}")),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("is ready"));
}
