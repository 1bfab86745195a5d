//! A shard node whose clock is off measures it against the NATS server, reports it (`GET
//! /v1/nodes`, `chronoshard_clock_offset_seconds`), and takes no shards while the offset is
//! beyond the bound; a looser bound (a live setting) lets it take its share.

use std::sync::Arc;

use crate::common::*;
use chronoshard_control_plane::{ControlPlane, Options as CpOptions};
use chronoshard_shard_node::{clock::Clock, Databases, Options, ShardNode};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The system clock, two seconds ahead.
struct Ahead;

impl Clock for Ahead {
    fn now_ms(&self) -> i64 {
        chrono::Utc::now().timestamp_millis() + 2_000
    }

    fn now_us(&self) -> i64 {
        chrono::Utc::now().timestamp_micros() + 2_000_000
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_whose_clock_is_off_takes_no_shards_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let nats = chronoshard_test_util::Nats::start().await.unwrap();
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut opts = CpOptions::new("cp", "t");
    opts.shard_count = Some(4);
    let (cp, _) = ControlPlane::start(
        opts,
        nats.client().await.unwrap(),
        listener,
        shutdown.clone(),
    )
    .await
    .unwrap();
    let node = |id: &str| Options {
        node_id: id.into(),
        databases: Databases::Sqlite(dir.path().join("shards")),
        local: Default::default(),
        zone: None,
        labels: Default::default(),
        max_shards: None,
    };
    ShardNode::start(node("good"), nats.client().await.unwrap(), shutdown.clone())
        .await
        .unwrap();
    ShardNode::start_with_clock(
        node("ahead"),
        nats.client().await.unwrap(),
        Arc::new(Ahead),
        shutdown.clone(),
    )
    .await
    .unwrap();
    let api = Api::at(&format!("http://{}", cp.addr), "t");
    let view = wait_for(
        "the node ahead to be excluded, the other to own all",
        LONG,
        || async {
            let (_, nodes) = api.get("/v1/nodes").await;
            let nodes = nodes["nodes"].as_array()?.clone();
            let ahead = nodes.iter().find(|n| n["node_id"] == "ahead")?.clone();
            let good = nodes.iter().find(|n| n["node_id"] == "good")?.clone();
            (ahead["status"] == "excluded" && good["shards"].as_array()?.len() == 4)
                .then_some(ahead)
        },
    )
    .await;
    let view = match view {
        Ok(v) => v,
        Err(e) => {
            let (_, nodes) = api.get("/v1/nodes").await;
            let (_, shards) = api.get("/v1/shards").await;
            panic!("{e}: nodes {nodes:#} shards {shards}");
        }
    };
    let offset = view["clock_offset_ms"].as_f64().unwrap();
    assert!((1_800.0..2_200.0).contains(&offset), "{view}");
    assert!(
        view["reason"].as_str().unwrap().contains("clock offset"),
        "{view}"
    );
    assert!(view["assigned"].as_array().unwrap().is_empty(), "{view}");
    let metric = api
        .metric_sum_with("chronoshard_clock_offset_seconds", "node=\"ahead\"")
        .await;
    assert!((1.8..2.2).contains(&metric), "{metric}");
    let good = api
        .metric_sum_with("chronoshard_clock_offset_seconds", "node=\"good\"")
        .await;
    assert!(good.abs() < 0.2, "{good}");

    // The live setting bounding the offset.
    let allow = |bound: &'static str| {
        let body = json!({ "max_clock_offset": bound }).to_string();
        let api = &api;
        async move {
            let (status, _, body) = api
                .send(reqwest::Method::PUT, "/v1/settings", Some(&body))
                .await;
            assert_eq!(status, 200, "{body}");
        }
    };
    // Allowed 5 s, it is fine: it takes its share.
    allow("5s").await;
    wait_for("the node ahead to take shards", LONG, || async {
        let (_, nodes) = api.get("/v1/nodes").await;
        let ahead = nodes["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["node_id"] == "ahead")?
            .clone();
        (ahead["status"] == "live" && !ahead["shards"].as_array()?.is_empty()).then_some(())
    })
    .await
    .unwrap();
    let rebalanced = api
        .metric_sum_with("chronoshard_shard_moves_total", r#"reason="rebalance""#)
        .await;
    assert!(rebalanced >= 1.0, "{rebalanced}");

    // Bound tight again, the node ahead loses the shards it took, for its clock.
    allow("1s").await;
    wait_for("the node ahead to give its shards back", LONG, || async {
        let (_, nodes) = api.get("/v1/nodes").await;
        let nodes = nodes["nodes"].as_array()?.clone();
        let ahead = nodes.iter().find(|n| n["node_id"] == "ahead")?;
        let good = nodes.iter().find(|n| n["node_id"] == "good")?;
        (ahead["status"] == "excluded" && good["shards"].as_array()?.len() == 4).then_some(())
    })
    .await
    .unwrap();
    let for_clock = api
        .metric_sum_with("chronoshard_shard_moves_total", r#"reason="clock""#)
        .await;
    assert!(for_clock >= 1.0, "{for_clock}");
    shutdown.cancel();
}
