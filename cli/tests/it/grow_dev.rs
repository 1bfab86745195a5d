//! Adding shards to `chronoshard dev` (SQLite shard databases, calls between the control plane
//! and its in-process shards through channels): every-second jobs keep firing once each, a
//! paused tenant stays paused on its new shard, and the platform started again on the same data
//! keeps the shards it grew to.

use std::{collections::BTreeMap, time::Duration};

use crate::common::*;
use chrono::Utc;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dev_platform_grows_and_keeps_its_shards_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let sink = HttpSink::start().await.unwrap();
    let p = platform_with(dir.path(), |o| o.shards = 2).await;
    let api = Api::new(&p);
    let mut tickers = BTreeMap::new();
    for i in 0..24 {
        let tenant = format!("dev-{i:02}");
        let body = json!({"tenant": tenant, "name": "tick", "schedule": {"every": "1s"},
            "catchup": {"policy": "all", "window": "1h"},
            "target": {"type": "http", "url": sink.url("/tick"), "method": "POST"}});
        tickers.insert(api.create(&body).await, tenant);
    }
    // One tenant paused before the growth: none of its occurrences may run, here or there.
    let quiet = tickers.values().next().unwrap().clone();
    let (status, body) = api
        .post(&format!("/v1/tenants/{quiet}/pause"), &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let paused_at = Utc::now();
    wait_for("ticks before the growth", LONG, || async {
        (sink.requests().len() > 3 * tickers.len()).then_some(())
    })
    .await
    .unwrap();

    let (status, map) = api.post("/v1/shards", &json!({"add": 2})).await;
    assert_eq!(status, 202, "{map}");
    let grown = wait_for("the growth to finish", Duration::from_secs(60), || async {
        let (_, map) = api.get("/v1/shards").await;
        map.get("growth").is_none().then_some(map)
    })
    .await
    .unwrap();
    assert_eq!(grown["shard_count"], 4);
    let mut moved = 0;
    for id in tickers.keys() {
        let (_, job) = api.get(&format!("/v1/jobs/{id}")).await;
        moved += usize::from(job["shard"].as_u64().unwrap() >= 2);
    }
    assert!(moved > 0, "some tenants moved to the added shards");
    let (status, view) = api.get(&format!("/v1/tenants/{quiet}")).await;
    assert_eq!(
        (status, view["paused"].as_bool()),
        (200, Some(true)),
        "{view}"
    );

    // Every tick of the active tenants ran once, one per second; the paused one ran none since.
    let upto = Utc::now() + chrono::Duration::seconds(1);
    for (id, tenant) in &tickers {
        let runs = wait_for(&format!("ticks of {id} up to {upto}"), LONG, || async {
            let runs = api.past_runs(id).await;
            let newest = runs
                .iter()
                .filter_map(|r| r["scheduled_at"].as_str())
                .max()?;
            let newest: chrono::DateTime<Utc> = newest.parse().ok()?;
            let done = runs.iter().all(|r| r["status"] == "succeeded");
            (*tenant == quiet || (newest > upto && done)).then_some(runs)
        })
        .await
        .unwrap();
        let mut times: Vec<chrono::DateTime<Utc>> = runs
            .iter()
            .map(|r| r["scheduled_at"].as_str().unwrap().parse().unwrap())
            .collect();
        times.sort();
        if *tenant == quiet {
            assert!(times
                .iter()
                .all(|t| *t <= paused_at + chrono::Duration::seconds(1)));
            continue;
        }
        assert!(
            times
                .windows(2)
                .all(|w| (w[1] - w[0]).num_milliseconds() == 1000),
            "{id}: one run per second: {times:?}"
        );
        let calls = sink
            .requests()
            .iter()
            .filter(|r| r.headers["x-chronoshard-job-id"] == *id)
            .count();
        assert!(
            calls >= times.len(),
            "{id}: {calls} calls for {} runs",
            times.len()
        );
    }
    let mut per: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in sink.requests() {
        let h = &r.headers;
        *per.entry((
            h["x-chronoshard-job-id"].clone(),
            h["x-chronoshard-scheduled-at"].clone(),
        ))
        .or_default() += 1;
    }
    assert!(
        per.values().all(|n| *n == 1),
        "every occurrence called once"
    );

    // Started again on the same data, it has the shards it grew to.
    p.stop().await.unwrap();
    let p = platform_with(dir.path(), |o| o.shards = 2).await;
    let api = Api::new(&p);
    let (_, map) = api.get("/v1/shards").await;
    assert_eq!(map["shard_count"], 4, "{map}");
    for id in tickers.keys() {
        let (status, job) = api.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(status, 200, "{job}");
    }
    p.stop().await.unwrap();
    eprintln!(
        "{moved} of {} tenants moved to the added shards",
        tickers.len()
    );
}
