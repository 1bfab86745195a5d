//! Draining a shard node under load, as an operator does before stopping a machine:
//! `POST /v1/nodes/{id}/drain` moves its shards to the other nodes (never more than `max_moves`
//! in flight) while every-second jobs fire and one-shots keep being created; the node then shows
//! `drained`, takes no new shard, and stops cleanly. Nothing is lost or doubled.
//! `POST /v1/nodes/{id}/undrain` returns it to service.

use std::time::Duration;

use crate::common::{cluster::*, wait_for};
use chrono::Utc;
use nix::sys::signal::Signal;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drained_node_gives_its_shards_away_under_load_without_a_lost_or_doubled_fire() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Deployment::start(1).await;
    d.control_plane("cp-1", &["--shards", "8", "--max-moves", "2"])
        .await;
    let names = ["node-a", "node-b", "node-c"];
    for n in names {
        d.node(n).await;
    }
    d.worker("worker-1", dir.path());
    let api = d.api("cp-1");
    let jobs = every_second_jobs(&d, &api, 8, 1).await;
    let owners = wait_settled(&api, &names).await;
    let had = owners["node-a"].clone();
    assert!(!had.is_empty(), "node-a owns shards before the drain");

    // An unknown node is a 404 and marks nothing.
    let (status, body) = api.post("/v1/nodes/node-zz/drain", &json!({})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );

    let (status, view) = api.post("/v1/nodes/node-a/drain", &json!({})).await;
    assert_eq!(status, 202, "{view}");
    assert_eq!(view["status"], "draining");
    // One-shots keep coming while the shards move: each runs once. A move is in flight while
    // its new owner has not opened the shard yet.
    let seen = std::sync::Mutex::new((Vec::new(), 0usize));
    wait_for("node-a to be drained", Duration::from_secs(60), || async {
        let body = json!({"tenant": format!("burst-{}", Utc::now().timestamp_micros() % 97),
            "name": "once", "schedule": {"delay": "1s"}, "target": d.target("once")});
        let (s, job) = api.post("/v1/jobs", &body).await;
        assert_eq!(s, 201, "{job}");
        let (_, nodes) = api.get("/v1/nodes").await;
        let nodes = nodes["nodes"].as_array().unwrap().clone();
        let pending: usize = nodes
            .iter()
            .map(|n| {
                let open = n["shards"].as_array().unwrap();
                let assigned = n["assigned"].as_array().unwrap();
                assigned.iter().filter(|s| !open.contains(s)).count()
            })
            .sum();
        let mut seen = seen.lock().unwrap();
        seen.0.push(job["id"].as_str().unwrap().to_string());
        seen.1 = seen.1.max(pending);
        nodes
            .iter()
            .any(|n| n["node_id"] == "node-a" && n["status"] == "drained")
            .then_some(())
    })
    .await
    .unwrap();
    let (one_shots, in_flight_max) = seen.into_inner().unwrap();
    assert!(
        in_flight_max <= 2,
        "at most max_moves shards were in flight: {in_flight_max}"
    );
    let owners = wait_settled(&api, &["node-b", "node-c"]).await;
    assert_eq!(owners.values().map(|s| s.len()).sum::<usize>(), 8);
    let drained = api
        .metric_sum_with("chronoshard_shard_moves_total", r#"reason="drain""#)
        .await;
    assert_eq!(
        drained,
        had.len() as f64,
        "the leader counted each drained shard"
    );
    // Drained, it stops cleanly; the others keep everything.
    let a = d.nodes.get_mut("node-a").unwrap();
    a.signal(Signal::SIGTERM);
    assert_eq!(a.exited(SETTLE).await, Some(0));

    for job in &one_shots {
        wait_for(
            &format!("one-shot {job} to succeed once"),
            SETTLE,
            || async {
                let runs = runs(&api, job).await;
                (runs.len() == 1 && runs[0]["status"] == "succeeded").then_some(())
            },
        )
        .await
        .unwrap();
        let per = d.executions();
        let n: usize = per
            .iter()
            .filter(|((j, _), _)| j == job)
            .map(|(_, v)| v.len())
            .sum();
        assert_eq!(n, 1, "one-shot {job} executed {n} times");
    }
    let upto = Utc::now() + chrono::Duration::seconds(1);
    for job in jobs.keys() {
        every_occurrence_once(&d, &api, job, upto).await;
    }
    eprintln!(
        "drained node-a's {} shards; {} one-shots created meanwhile; at most {in_flight_max} moves in flight",
        had.len(),
        one_shots.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_undrained_node_takes_shards_again_and_a_drained_one_takes_none() {
    let mut d = Deployment::start(1).await;
    d.control_plane("cp-1", &["--shards", "4"]).await;
    for n in ["node-a", "node-b"] {
        d.node(n).await;
    }
    let api = d.api("cp-1");
    wait_settled(&api, &["node-a", "node-b"]).await;
    let (status, _) = api.post("/v1/nodes/node-b/drain", &json!({})).await;
    assert_eq!(status, 202);
    wait_for("node-b drained", SETTLE, || async {
        let (_, nodes) = api.get("/v1/nodes").await;
        nodes["nodes"]
            .as_array()?
            .iter()
            .any(|n| n["node_id"] == "node-b" && n["status"] == "drained")
            .then_some(())
    })
    .await
    .unwrap();
    // A node that joins now takes shards; the drained one still none.
    d.node("node-c").await;
    let owners = wait_settled(&api, &["node-a", "node-c"]).await;
    assert!(!owners["node-c"].is_empty());
    let (status, view) = api.post("/v1/nodes/node-b/undrain", &json!({})).await;
    assert_eq!(status, 200, "{view}");
    let owners = wait_settled(&api, &["node-a", "node-b", "node-c"]).await;
    assert!(!owners["node-b"].is_empty(), "{owners:?}");
}
