//! One platform, real components: jobs go REST → shard → wheel → JetStream → worker → HTTP target
//! → result, and are visible through the API.

use std::collections::{HashMap, HashSet};

use crate::common::*;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_one_shots_over_four_tenants_each_run_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let sink = HttpSink::start().await.unwrap();
    let start = Utc::now();
    let mut jobs: HashMap<String, DateTime<Utc>> = HashMap::new();
    for i in 0..200u32 {
        let tenant = format!("tenant-{}", i % 4);
        // due within the next 3 s; half as `at`, half as `delay`
        let offset_ms = 300 + (i as i64 * 2_700 / 200);
        let schedule = if i % 2 == 0 {
            json!({"at": (start + chrono::Duration::milliseconds(offset_ms)).to_rfc3339()})
        } else {
            json!({"delay": format!("{offset_ms}ms")})
        };
        let body = json!({"tenant": tenant, "name": format!("one-shot-{i}"), "schedule": schedule,
            "target": {"type": "http", "url": sink.url(&format!("/hook/{i}")), "method": "POST"},
            "payload": {"i": i}});
        let (status, job) = api.post("/v1/jobs", &body).await;
        assert_eq!(status, 201, "{job}");
        let due: DateTime<Utc> = job["next_fire_times"][0].as_str().unwrap().parse().unwrap();
        jobs.insert(job["id"].as_str().unwrap().to_string(), due);
    }
    // every job reaches the target...
    wait_for("200 requests at the sink", LONG, || async {
        (sink.requests().len() >= 200).then_some(())
    })
    .await
    .unwrap();
    // ...and every run is recorded as succeeded
    for (id, due) in &jobs {
        let runs = wait_for("a succeeded run", LONG, || async {
            let runs = api.past_runs(id).await;
            (runs.len() == 1 && runs[0]["status"] == "succeeded").then_some(runs)
        })
        .await
        .unwrap();
        assert_eq!(
            runs[0]["scheduled_at"]
                .as_str()
                .unwrap()
                .parse::<DateTime<Utc>>()
                .unwrap(),
            *due
        );
        assert_eq!(runs[0]["attempts"], 1);
    }
    let requests = sink.requests();
    assert_eq!(requests.len(), 200, "a job ran twice");
    let mut per_job: HashMap<String, usize> = HashMap::new();
    let mut keys = HashSet::new();
    for r in &requests {
        let h = &r.headers;
        *per_job
            .entry(h["x-chronoshard-job-id"].clone())
            .or_default() += 1;
        assert!(
            keys.insert(h["idempotency-key"].clone()),
            "two requests with one idempotency key"
        );
        assert_eq!(h["x-chronoshard-attempt"], "1");
        let scheduled: DateTime<Utc> = h["x-chronoshard-scheduled-at"].parse().unwrap();
        assert_eq!(scheduled, jobs[&h["x-chronoshard-job-id"]]);
        let tp: Vec<&str> = h["traceparent"].split('-').collect();
        assert_eq!(
            (tp.len(), tp[0], tp[1].len()),
            (4, "00", 32),
            "{}",
            h["traceparent"]
        );
        assert_eq!(h["content-type"], "application/json");
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(format!("/hook/{}", body["i"]), r.path);
    }
    assert_eq!(per_job.len(), 200);
    assert!(per_job.values().all(|n| *n == 1));
    // the ticket of one run shows its attempt, the worker and the trace id derived from its id
    let (id, _) = jobs.iter().next().unwrap();
    let ticket_id = api.past_runs(id).await[0]["ticket_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    let (status, ticket) = api.get(&format!("/v1/tickets/{ticket_id}")).await;
    assert_eq!(status, 200, "{ticket}");
    assert_eq!(ticket["status"], "succeeded");
    assert_eq!(ticket["trace_id"], ticket_id.replace('-', ""));
    assert_eq!(ticket["attempts"][0]["worker"], "worker-1");
    assert_eq!(ticket["attempts"][0]["http_status"], 200);
    let r = requests
        .iter()
        .find(|r| r.headers["idempotency-key"] == ticket_id)
        .unwrap();
    assert!(r.headers["traceparent"].contains(&ticket_id.replace('-', "")));
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_four_schedule_kinds_fire_and_tenants_spread_over_shards() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let sink = HttpSink::start().await.unwrap();
    let target =
        |name: &str| json!({"type": "http", "url": sink.url(&format!("/{name}")), "method": "PUT"});
    let at = (Utc::now() + chrono::Duration::milliseconds(500)).to_rfc3339();
    let kinds = [
        (
            "cron",
            json!({"cron": "* * * * * *", "timezone": "America/New_York"}),
        ),
        ("every", json!({"every": "1s"})),
        ("at", json!({"at": at})),
        ("delay", json!({"delay": "700ms"})),
    ];
    let mut ids = Vec::new();
    let mut shards = HashSet::new();
    for (i, (name, schedule)) in kinds.iter().enumerate() {
        let body = json!({"tenant": format!("kind-{i}"), "name": name, "schedule": schedule, "target": target(name)});
        let (status, job) = api.post("/v1/jobs", &body).await;
        assert_eq!(status, 201, "{job}");
        shards.insert(job["shard"].as_u64().unwrap());
        ids.push((name.to_string(), job["id"].as_str().unwrap().to_string()));
    }
    for (name, id) in &ids {
        let min = if name == "cron" || name == "every" {
            2
        } else {
            1
        };
        wait_for(
            &format!("{name} job to succeed {min} times"),
            LONG,
            || async {
                let ok = api
                    .past_runs(id)
                    .await
                    .iter()
                    .filter(|r| r["status"] == "succeeded")
                    .count();
                (ok >= min).then_some(())
            },
        )
        .await
        .unwrap();
        let hits = sink
            .requests()
            .iter()
            .filter(|r| r.path == format!("/{name}") && r.method == "PUT")
            .count();
        assert!(hits >= min, "{name}: {hits} requests");
    }
    // a one-shot that fired is completed and lists no further fire times
    let (_, job) = api.get(&format!("/v1/jobs/{}", ids[2].1)).await;
    assert_eq!(
        (
            job["state"].as_str(),
            job["next_fire_times"].as_array().unwrap().len()
        ),
        (Some("completed"), 0)
    );
    // the job list sees all four, across shards, and paginates
    let (status, page) = api.get("/v1/jobs?limit=3").await;
    assert_eq!(status, 200);
    assert_eq!(page["jobs"].as_array().unwrap().len(), 3);
    let (_, rest) = api
        .get(&format!(
            "/v1/jobs?limit=3&cursor={}",
            page["next_cursor"].as_str().unwrap()
        ))
        .await;
    assert_eq!(rest["jobs"].as_array().unwrap().len(), 1);
    assert!(rest.get("next_cursor").is_none());
    let (_, one) = api.get("/v1/jobs?tenant=kind-1").await;
    assert_eq!(one["jobs"][0]["name"], "every");
    let (_, shard_map) = api.get("/v1/shards").await;
    assert_eq!(shard_map["shards"].as_array().unwrap().len(), 8);
    let (_, nodes) = api.get("/v1/nodes").await;
    assert_eq!(nodes["nodes"].as_array().unwrap().len(), 2);
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_resume_trigger_patch_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let sink = HttpSink::start().await.unwrap();
    let id = api
        .create(&json!({"tenant": "ops", "name": "daily", "schedule": {"cron": "0 0 3 * * *", "timezone": "Europe/Berlin"},
            "target": {"type": "http", "url": sink.url("/daily")}}))
        .await;
    let (s, run) = api
        .post(&format!("/v1/jobs/{id}/trigger"), &json!({}))
        .await;
    assert_eq!(s, 202, "{run}");
    api.newest_run_succeeded(&id).await;
    let (s, job) = api.post(&format!("/v1/jobs/{id}/pause"), &json!({})).await;
    assert_eq!((s, job["state"].as_str()), (200, Some("paused")));
    assert!(job["next_fire_times"].as_array().unwrap().is_empty());
    let (s, job) = api.post(&format!("/v1/jobs/{id}/resume"), &json!({})).await;
    assert_eq!((s, job["state"].as_str()), (200, Some("active")));
    let (s, _, job) = api
        .send(
            reqwest::Method::PATCH,
            &format!("/v1/jobs/{id}"),
            Some(r#"{"schedule": {"every": "1h"}, "name": "hourly"}"#),
        )
        .await;
    assert_eq!((s, job["name"].as_str()), (200, Some("hourly")), "{job}");
    let times: Vec<DateTime<Utc>> = job["next_fire_times"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(times[1] - times[0], chrono::Duration::hours(1));
    let (s, _, _) = api
        .send(reqwest::Method::DELETE, &format!("/v1/jobs/{id}"), None)
        .await;
    assert_eq!(s, 204);
    // history stays readable; the job can no longer change
    let (s, job) = api.get(&format!("/v1/jobs/{id}")).await;
    assert_eq!((s, job["state"].as_str()), (200, Some("deleted")));
    assert!(!api.past_runs(&id).await.is_empty());
    let (s, problem) = api.post(&format!("/v1/jobs/{id}/resume"), &json!({})).await;
    assert_eq!((s, problem["code"].as_str()), (409, Some("conflict")));
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotency_key_returns_the_first_job() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let body = json!({"tenant": "idem", "name": "x", "schedule": {"every": "1h"}, "target": {"type": "queue", "queue": "q"}});
    let send = |b: Value| {
        api.http
            .post(format!("{}/v1/jobs", api.base))
            .bearer_auth(&api.token)
            .header("Idempotency-Key", "abc-1")
            .json(&b)
            .send()
    };
    let first = send(body.clone()).await.unwrap();
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.unwrap();
    let again = send(body.clone()).await.unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.json::<Value>().await.unwrap()["id"], first["id"]);
    let mut other = body.clone();
    other["name"] = json!("y");
    let reused = send(other).await.unwrap();
    assert_eq!(reused.status(), 422);
    assert_eq!(
        reused.json::<Value>().await.unwrap()["code"],
        "idempotency_key_reused"
    );
    p.stop().await.unwrap();
}
