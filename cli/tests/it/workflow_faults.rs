//! Workflow runs under faults, every role a separate process on PostgreSQL: a shard node killed
//! with `kill -9` while a step runs (its result is applied, and the steps after it released, by
//! the node that takes the shard over), and a worker killed while it runs a step. Afterwards no
//! step of any run is lost and none ran twice (per attempt), and every step ran only after the
//! steps it waits for had finished.

use std::{collections::HashMap, time::Duration};

use crate::common::{cluster::*, wait_for, Api, LONG};
use chrono::{DateTime, Utc};
use chronoshard_test_util::Recorded;
use serde_json::{json, Value};

/// How long the sink takes to answer each step's call.
const STEP: Duration = Duration::from_millis(700);

/// a → (b, c) → d, each an HTTP call to the sink at `/wf/<step>`.
fn diamond(d: &Deployment, schedule: Value, retry: u32) -> Value {
    let step = |name: &str, after: &[&str]| {
        json!({"name": name, "target": d.target(&format!("wf/{name}")), "after": after,
               "retry": {"max_attempts": retry, "backoff": "fixed", "initial": "100ms"},
               "timeout": "30s"})
    };
    json!({"tenant": "etl", "name": "diamond", "schedule": schedule,
           "catchup": {"policy": "all", "window": "1h"},
           "steps": [step("a", &[]), step("b", &["a"]), step("c", &["a"]), step("d", &["b", "c"])]})
}

/// The step a recorded call is for.
fn step_of(r: &Recorded) -> &str {
    r.path.trim_start_matches("/wf/")
}

fn time(r: &Recorded) -> DateTime<Utc> {
    r.received_at.into()
}

/// The sink's calls per run (scheduled time) and step.
fn calls(d: &Deployment) -> HashMap<String, HashMap<String, Vec<Recorded>>> {
    let mut per: HashMap<String, HashMap<String, Vec<Recorded>>> = HashMap::new();
    for r in d.sink.requests() {
        let run = r.headers["x-chronoshard-scheduled-at"].clone();
        per.entry(run)
            .or_default()
            .entry(step_of(&r).to_string())
            .or_default()
            .push(r);
    }
    per
}

/// The workflow's runs once none is in progress any more.
async fn ended_runs(api: &Api, id: &str) -> Vec<Value> {
    wait_for("every run to end", Duration::from_secs(90), || async {
        let (status, page) = api.get(&format!("/v1/workflows/{id}/runs?limit=500")).await;
        let runs = page["runs"].as_array()?.clone();
        let busy = |r: &Value| {
            ["dispatched", "running", "retrying", "waiting"]
                .contains(&r["status"].as_str().unwrap())
        };
        (status == 200 && !runs.is_empty() && !runs.iter().any(busy)).then_some(runs)
    })
    .await
    .unwrap()
}

/// Checks that in every run each step called the sink once per attempt (the attempt header),
/// and only once every step it waits for had answered.
fn each_step_once_in_order(d: &Deployment, runs: &[Value]) {
    let per = calls(d);
    for run in runs {
        assert_eq!(run["status"], "succeeded", "{run}");
        let at = run["scheduled_at"].as_str().unwrap();
        let steps = per.get(at).unwrap_or_else(|| panic!("no call of run {at}"));
        for (name, rs) in steps {
            let mut attempts: Vec<&str> = rs
                .iter()
                .map(|r| r.headers["x-chronoshard-attempt"].as_str())
                .collect();
            attempts.sort();
            let n = attempts.len();
            attempts.dedup();
            assert_eq!(
                attempts.len(),
                n,
                "run {at} step {name}: an attempt ran twice"
            );
        }
        assert_eq!(
            steps.len(),
            4,
            "run {at}: every step ran: {:?}",
            steps.keys()
        );
        let last = |s: &str| steps[s].iter().map(time).max().unwrap();
        let first = |s: &str| steps[s].iter().map(time).min().unwrap();
        for (step, after) in [("b", "a"), ("c", "a"), ("d", "b"), ("d", "c")] {
            assert!(
                first(step) >= last(after) + STEP,
                "run {at}: {step} called before {after} answered"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_node_killed_mid_run_loses_no_step_and_runs_none_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Deployment::start(1).await;
    d.control_plane("cp-1", &["--shards", "4"]).await;
    let names = ["node-a", "node-b"];
    for n in names {
        d.node(n).await;
    }
    d.worker("worker-1", dir.path());
    d.sink.respond_after(STEP);
    let api = d.api("cp-1");
    wait_settled(&api, &names).await;
    let (status, w) = api
        .post("/v1/workflows", &diamond(&d, json!({"every": "2s"}), 1))
        .await;
    assert_eq!(status, 201, "{w}");
    let id = w["id"].as_str().unwrap().to_string();
    let shard = w["shard"].as_u64().unwrap();
    // Kill the owner of the workflow's shard just after a middle step was called, so that step
    // answers while its node is dead.
    wait_for("two runs to succeed", LONG, || async {
        let (_, page) = api.get(&format!("/v1/workflows/{id}/runs")).await;
        let done = page["runs"]
            .as_array()?
            .iter()
            .filter(|r| r["status"] == "succeeded")
            .count();
        (done >= 2).then_some(())
    })
    .await
    .unwrap();
    let owners = wait_settled(&api, &names).await;
    let victim = names
        .into_iter()
        .find(|n| owners[*n].contains(&shard))
        .expect("a node owns the workflow's shard");
    let seen = d.sink.requests().len();
    let middle = wait_for("a middle step to be called", LONG, || async {
        let rs = d.sink.requests();
        rs[seen.min(rs.len())..]
            .iter()
            .find(|r| ["b", "c"].contains(&step_of(r)))
            .cloned()
    })
    .await
    .unwrap();
    d.nodes.get_mut(victim).unwrap().kill9().await;
    let killed_at = Utc::now();
    let survivor: Vec<&str> = names.into_iter().filter(|n| *n != victim).collect();
    wait_settled(&api, &survivor).await;
    // Runs go on after the failover; then stop new ones and let the last ones end.
    wait_for(
        "two runs started after the kill to succeed",
        Duration::from_secs(60),
        || async {
            let (_, page) = api.get(&format!("/v1/workflows/{id}/runs")).await;
            let after = page["runs"]
                .as_array()?
                .iter()
                .filter(|r| r["status"] == "succeeded" && at(&r["scheduled_at"]) > killed_at)
                .count();
            (after >= 2).then_some(())
        },
    )
    .await
    .unwrap();
    let (status, _) = api
        .post(&format!("/v1/workflows/{id}/pause"), &json!({}))
        .await;
    assert_eq!(status, 200);
    let runs = ended_runs(&api, &id).await;
    // The fault really happened: the middle step answered after its node died, and the step
    // after it was called after that, so the node that took the shard over applied its result
    // and released what followed.
    assert!(
        time(&middle) + STEP > killed_at,
        "the step was still running at the kill"
    );
    let run_at = middle.headers["x-chronoshard-scheduled-at"].clone();
    let d_calls = &calls(&d)[&run_at]["d"];
    assert!(
        time(&d_calls[0]) > killed_at,
        "d was released after the kill"
    );
    println!(
        "workflow failover: {} runs checked, {} started after the kill",
        runs.len(),
        runs.iter()
            .filter(|r| at(&r["scheduled_at"]) > killed_at)
            .count()
    );
    each_step_once_in_order(&d, &runs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_mid_step_retries_that_step_alone_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Deployment::start(1).await;
    d.control_plane("cp-1", &["--shards", "2"]).await;
    d.node("node-a").await;
    d.worker("worker-1", dir.path());
    d.sink.respond_after(STEP);
    let api = d.api("cp-1");
    wait_settled(&api, &["node-a"]).await;
    let (status, w) = api
        .post(
            "/v1/workflows",
            &diamond(&d, json!({"cron": "0 0 1 1 *"}), 2),
        )
        .await;
    assert_eq!(status, 201, "{w}");
    let id = w["id"].as_str().unwrap().to_string();
    let (status, _) = api
        .post(&format!("/v1/workflows/{id}/trigger"), &json!({}))
        .await;
    assert_eq!(status, 202);
    let middle = wait_for("a middle step to be called", LONG, || async {
        d.sink
            .requests()
            .into_iter()
            .find(|r| ["b", "c"].contains(&step_of(r)))
    })
    .await
    .unwrap();
    d.workers.get_mut("worker-1").unwrap().kill9().await;
    let killed_at = Utc::now();
    assert!(
        time(&middle) + STEP > killed_at,
        "the step was still running at the kill"
    );
    // The same worker comes back on its journal.
    d.worker("worker-1", dir.path());
    let runs = ended_runs(&api, &id).await;
    assert_eq!(runs.len(), 1);
    // The steps the sink saw running at the kill (b, c or both: they run side by side) ran
    // again as their second attempt. A step the worker had started but whose call had not
    // reached the sink yet is retried too: its first attempt was dispatched before the kill
    // and failed. The others ran once.
    let running: Vec<String> = d
        .sink
        .requests()
        .iter()
        .filter(|r| time(r) < killed_at && time(r) + STEP > killed_at)
        .map(|r| step_of(r).to_string())
        .collect();
    assert!(running.contains(&step_of(&middle).to_string()));
    for step in runs[0]["steps"].as_array().unwrap() {
        let name = step["name"].as_str().unwrap().to_string();
        let attempts = step["attempts"].as_array().unwrap();
        assert_eq!(step["status"], "succeeded", "{step}");
        if running.contains(&name) {
            assert_eq!(attempts.len(), 2, "{step}");
        }
        if attempts.len() == 2 {
            let first = &attempts[0];
            let created: DateTime<Utc> = first["created_at"].as_str().unwrap().parse().unwrap();
            assert!(first["status"] == "failed" && created < killed_at, "{step}");
        } else {
            assert_eq!(attempts.len(), 1, "{step}");
        }
    }
    each_step_once_in_order(&d, &runs);
}
