//! A `time_window` cluster (`chronoshard dev --sharding time_window`): one tenant's jobs spread
//! over every shard, each is found, changed and deleted by its id, a keyed create sent again
//! finds its job, lists and tenant-wide pause, resume and trigger cover every shard, and the
//! tenant's job quota holds across the shards as one number.

use std::collections::{BTreeMap, BTreeSet};

use crate::common::*;
use chrono::{DateTime, Utc};
use chronoshard_wire::{rpc::Sharding, settings::Settings};
use reqwest::Method;
use serde_json::{json, Value};

fn tick(tenant: &str, sink: &HttpSink) -> Value {
    json!({"tenant": tenant, "name": "tick", "schedule": {"every": "1s"},
        "target": {"type": "http", "url": sink.url("/tick"), "method": "POST"}})
}

/// When the job last ran (the newest scheduled time of its past runs), if it ran.
async fn newest_run(api: &Api, job: &str) -> Option<DateTime<Utc>> {
    (api.past_runs(job).await.iter())
        .filter_map(|r| r["scheduled_at"].as_str()?.parse().ok())
        .max()
}

/// Waits until every job in `jobs` has run at an occurrence after `after`.
async fn all_ran_after(api: &Api, jobs: &[String], after: DateTime<Utc>, what: &str) {
    wait_for(what, LONG, || async {
        for j in jobs {
            if newest_run(api, j).await.is_none_or(|t| t <= after) {
                return None;
            }
        }
        Some(())
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_time_window_cluster_spreads_a_tenant_and_answers_for_it_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let sink = HttpSink::start().await.unwrap();
    let p = platform_with(dir.path(), |o| {
        o.shards = 4;
        o.sharding = Sharding::TimeWindow;
        o.settings = Settings {
            tenant_create_rate: 0,
            ..Settings::DEFAULT
        };
    })
    .await;
    let api = Api::new(&p);
    let (_, shards) = api.get("/v1/shards").await;
    assert_eq!(shards["sharding"], "time_window", "{shards}");
    assert_eq!(
        shards["windows"],
        json!({"window_secs": 60, "layouts": [{"from_window": 0, "shards": 4}]})
    );

    // One tenant's jobs land on every shard (random keys: 24 jobs miss a shard once in 250
    // runs, 100 practically never).
    let mut jobs = Vec::new();
    let mut on = BTreeSet::new();
    while jobs.len() < 24 || (on.len() < 4 && jobs.len() < 100) {
        let (status, job) = api.post("/v1/jobs", &tick("acme", &sink)).await;
        assert_eq!(status, 201, "{job}");
        on.insert(job["shard"].as_u64().unwrap());
        jobs.push(job["id"].as_str().unwrap().to_string());
    }
    assert_eq!(on.len(), 4, "acme's jobs are on shards {on:?}");
    let acme = jobs.len() as u64;
    let other = api.create(&tick("globex", &sink)).await;

    // A create sent again with its idempotency key finds the job it made.
    let key_create = || async {
        let body = tick("acme", &sink).to_string();
        let req = api
            .http
            .post(format!("{}/v1/jobs", api.base))
            .bearer_auth(&api.token)
            .header("content-type", "application/json")
            .header("idempotency-key", "nightly-1")
            .body(body);
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json::<Value>().await.unwrap())
    };
    let (first, made) = key_create().await;
    let (again, found) = key_create().await;
    assert_eq!((first, again), (201, 200), "{made} {found}");
    assert_eq!(made["id"], found["id"]);
    jobs.push(made["id"].as_str().unwrap().to_string());

    // By id: read, change, delete.
    let (status, job) = api.get(&format!("/v1/jobs/{}", jobs[3])).await;
    assert_eq!((status, &job["tenant"]), (200, &json!("acme")));
    let patch = json!({"name": "renamed"}).to_string();
    let (status, _, patched) = api
        .send(
            Method::PATCH,
            &format!("/v1/jobs/{}", jobs[3]),
            Some(&patch),
        )
        .await;
    assert_eq!((status, &patched["name"]), (200, &json!("renamed")));
    let gone = jobs.pop().unwrap();
    let (status, _, _) = api
        .send(Method::DELETE, &format!("/v1/jobs/{gone}"), None)
        .await;
    assert_eq!(status, 204);
    let (status, job) = api.get(&format!("/v1/jobs/{gone}")).await;
    assert_eq!((status, &job["state"]), (200, &json!("deleted")));

    // A tenant's list covers every shard.
    let (status, page) = api.get("/v1/jobs?tenant=acme&limit=100").await;
    assert_eq!(status, 200, "{page}");
    let listed: BTreeSet<&str> = (page["jobs"].as_array().unwrap().iter())
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, jobs.iter().map(String::as_str).collect());

    let started = Utc::now();
    all_ran_after(&api, &jobs, started, "every acme job to run").await;

    // Paused on every shard: globex keeps running, acme does not.
    let (status, view) = api.post("/v1/tenants/acme/pause", &json!({})).await;
    assert_eq!(
        (status, &view["paused"], &view["jobs"]),
        (200, &json!(true), &json!(acme))
    );
    let paused = Utc::now();
    let quiet_until = paused + chrono::Duration::seconds(4);
    all_ran_after(
        &api,
        std::slice::from_ref(&other),
        quiet_until,
        "globex to run past the pause",
    )
    .await;
    for j in &jobs {
        // An occurrence fired ahead within the pause's second may still run.
        let newest = newest_run(&api, j).await.unwrap();
        assert!(
            newest <= paused + chrono::Duration::seconds(1),
            "{j} ran at {newest}"
        );
    }
    let (_, view) = api.get("/v1/tenants/acme").await;
    assert_eq!(
        (&view["paused"], &view["paused_shards"], &view["shards"]),
        (&json!(true), &json!(4), &json!(4)),
        "{view}"
    );

    let (status, view) = api.post("/v1/tenants/acme/resume", &json!({})).await;
    assert_eq!((status, &view["paused"]), (200, &json!(false)), "{view}");
    assert_eq!(view["paused_shards"], 0, "{view}");
    all_ran_after(
        &api,
        &jobs,
        quiet_until,
        "every acme job to run after the resume",
    )
    .await;

    // Trigger fires each active acme job once, wherever it lives.
    let (status, view) = api.post("/v1/tenants/acme/trigger", &json!({})).await;
    assert_eq!((status, &view["triggered"]), (202, &json!(acme)), "{view}");

    // The quota (30 jobs) holds for the tenant, not per shard: 30 creates succeed, each shard
    // holding its part (8, 8, 7, 7) whatever shards the random ids fell on first, and the next
    // is refused.
    api.set_settings(json!({"tenant_create_rate": 0, "tenant_max_jobs": 30}))
        .await;
    let mut capped = BTreeMap::new();
    for _ in 0..30 {
        let (status, job) = api.post("/v1/jobs", &tick("capped", &sink)).await;
        assert_eq!(status, 201, "{job}");
        *capped.entry(job["shard"].as_u64().unwrap()).or_insert(0) += 1;
    }
    assert_eq!(capped, BTreeMap::from([(0, 8), (1, 8), (2, 7), (3, 7)]));
    let (status, problem) = api.post("/v1/jobs", &tick("capped", &sink)).await;
    assert_eq!(
        (status, &problem["code"]),
        (429, &json!("quota_exceeded")),
        "{problem}"
    );
    let (_, view) = api.get("/v1/tenants/capped").await;
    assert_eq!(view["jobs"], 30, "{view}");
    p.stop().await.unwrap();
}

/// `chronoshard dev --sharding time_window` grows too: with SQLite shards, and hand-offs between
/// shards of one process called directly rather than over NATS. Every occurrence of every job
/// runs once across the new layout's edge, and the jobs that moved answer from added shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dev_platform_grows_and_fires_each_occurrence_once_across_the_edge() {
    use crate::common::cluster::{each_once, executions_in, runs_up_to};
    let dir = tempfile::tempdir().unwrap();
    let sink = HttpSink::start().await.unwrap();
    let p = platform_with(dir.path(), |o| {
        o.shards = 2;
        o.sharding = Sharding::TimeWindow;
        o.window_secs = 2;
        o.settings = Settings {
            horizon: chronoshard_wire::Dur(std::time::Duration::from_secs(3)),
            ..Settings::DEFAULT
        };
    })
    .await;
    let api = Api::new(&p);
    let mut jobs = BTreeMap::new();
    for _ in 0..24 {
        let mut body = tick("acme", &sink);
        body["catchup"] = json!({"policy": "all", "window": "1h"});
        let (status, job) = api.post("/v1/jobs", &body).await;
        assert_eq!(status, 201, "{job}");
        jobs.insert(
            job["id"].as_str().unwrap().to_string(),
            job["shard"].as_u64().unwrap(),
        );
    }
    let ids: Vec<String> = jobs.keys().cloned().collect();
    all_ran_after(&api, &ids, Utc::now(), "every job to run").await;
    let (status, map) = api.post("/v1/shards", &json!({"add": 2})).await;
    assert_eq!((status, &map["shard_count"]), (202, &json!(4)), "{map}");
    // The layout is in force once the growth ended (it starts later if that took long).
    let map = wait_for("the growth to end", LONG, || async {
        let (_, map) = api.get("/v1/shards").await;
        map.get("growth").is_none().then_some(map)
    })
    .await
    .unwrap();
    let from = map["windows"]["layouts"][1]["from_window"]
        .as_i64()
        .unwrap();
    let edge = DateTime::from_timestamp(from * 2, 0).unwrap();
    let upto = edge + chrono::Duration::seconds(2);
    wait_for("the clock to pass the edge", LONG, || async {
        (Utc::now() > upto + chrono::Duration::seconds(1)).then_some(())
    })
    .await
    .unwrap();
    let mut checked = Vec::new();
    for job in &ids {
        checked.push((job, runs_up_to(&api, job, upto).await));
    }
    let executions = executions_in(&sink);
    for (job, runs) in &checked {
        let times = each_once(&executions, job, runs);
        assert!(
            times[0] < edge - chrono::Duration::seconds(3),
            "{job} ran from before"
        );
    }
    let mut moved = 0;
    for (id, before) in &jobs {
        let (_, job) = api.get(&format!("/v1/jobs/{id}")).await;
        let now = job["shard"].as_u64().unwrap();
        assert!(
            now == *before || now >= 2,
            "{id} moved from {before} to {now}"
        );
        moved += usize::from(now != *before);
    }
    assert!(moved > 0, "no job moved to an added shard");
    // Each of them left its shard once, arrived once, and was confirmed once.
    for step in ["left", "arrived", "confirmed"] {
        let n = (api.metric_sum_with(
            "chronoshard_job_handoffs_total",
            &format!("step=\"{step}\""),
        ))
        .await;
        assert_eq!(n, moved as f64, "{step}");
    }
    p.stop().await.unwrap();
}

/// The production roles as separate processes: a control plane that creates a `time_window`
/// cluster, two shard nodes and a worker. One tenant's every-second jobs spread over both nodes;
/// `kill -9` of one of them fails its shards over, and every occurrence of every job, those due
/// while its shards had no owner included, executes exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tenants_jobs_on_a_killed_node_fail_over_and_fire_once() {
    use crate::common::cluster::*;
    let dir = tempfile::tempdir().unwrap();
    let mut d = Deployment::start(1).await;
    (d.control_plane("cp-1", &["--shards", "4", "--sharding", "time_window"])).await;
    let names = ["node-a", "node-b"];
    for n in names {
        d.node(n).await;
    }
    d.worker("worker-1", dir.path());
    let api = d.api("cp-1");
    let owners = wait_settled(&api, &names).await;
    let mut jobs = BTreeMap::new();
    for _ in 0..16 {
        let body = json!({"tenant": "acme", "name": "tick", "schedule": {"every": "1s"},
            "catchup": {"policy": "all", "window": "1h"}, "target": d.target("tick")});
        let (status, job) = api.post("/v1/jobs", &body).await;
        assert_eq!(status, 201, "{job}");
        jobs.insert(
            job["id"].as_str().unwrap().to_string(),
            job["shard"].as_u64().unwrap(),
        );
    }
    let started = Utc::now();
    let on = |node: &str| -> Vec<String> {
        (jobs.iter())
            .filter(|(_, s)| owners[node].contains(s))
            .map(|(j, _)| j.clone())
            .collect()
    };
    let (victims, others) = (on("node-a"), on("node-b"));
    assert!(
        !victims.is_empty() && !others.is_empty(),
        "acme spreads over both nodes: {jobs:?}"
    );
    all_ran_after(&api, &victims, started, "node-a's jobs to run").await;

    let killed_at = Utc::now();
    d.nodes.get_mut("node-a").unwrap().kill9().await;
    wait_settled(&api, &["node-b"]).await;
    let settled_at = Utc::now();
    // The fault happened: an occurrence of each of node-a's jobs fell due while its shard had
    // no owner, and ran.
    for job in &victims {
        let due = wait_for(&format!("{job}'s run due in the outage"), LONG, || async {
            let runs = runs(&api, job).await;
            runs.iter()
                .filter(|r| r["status"] == "succeeded")
                .map(|r| at(&r["scheduled_at"]))
                .find(|t| *t > killed_at && *t < settled_at)
        })
        .await
        .unwrap();
        assert!(
            executed_at(&d, job, due).is_some(),
            "{job} at {due} executed"
        );
    }
    let upto = Utc::now() + chrono::Duration::seconds(1);
    for job in jobs.keys() {
        let checked = every_occurrence_once(&d, &api, job, upto).await;
        assert!(checked[0] <= killed_at, "{job} ran from before the kill");
    }
}
