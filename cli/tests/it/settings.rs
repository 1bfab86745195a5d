//! The cluster's live settings through the API: read, changed (validated, with a problem naming
//! the field, and versioned), and applied by every node without a restart; `GET /v1/cluster`
//! shows the one replica of `chronoshard dev` leading.

use crate::common::*;
use serde_json::{json, Value};

async fn put(api: &Api, body: &Value) -> (u16, Value) {
    let (s, _, v) = api
        .send(
            reqwest::Method::PUT,
            "/v1/settings",
            Some(&body.to_string()),
        )
        .await;
    (s, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn settings_are_validated_versioned_and_applied_by_every_node_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let (status, s) = api.get("/v1/settings").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["version"], 1);
    assert_eq!(s["settings"]["heartbeat_every"], "500ms");

    // Refused, naming the field, and nothing changes.
    let cases = [
        (json!({"heartbeat_ttl": "1ms"}), 400, "heartbeat_ttl"),
        (json!({"heartbeat_tll": "2s"}), 400, "heartbeat_tll"),
        (json!({"horizon": 5}), 400, "horizon"),
        (json!({"horizon": "soon"}), 400, "horizon"),
        (json!({"publish_window": 0}), 400, "publish_window"),
        (json!({"version": "one"}), 400, "version"),
        (json!({"version": 7, "horizon": "10m"}), 409, ""),
    ];
    for (body, code, field) in cases {
        let (s, problem) = put(&api, &body).await;
        assert_eq!(s, code, "{body}: {problem}");
        if code == 400 {
            assert_eq!(problem["field"], field, "{body}: {problem}");
            assert_eq!(problem["code"], "invalid_field", "{problem}");
        } else {
            assert_eq!(problem["code"], "conflict", "{problem}");
        }
    }
    let (status, _, problem) = api
        .send(reqwest::Method::PUT, "/v1/settings", Some("{not json"))
        .await;
    assert_eq!(
        (status, &problem["code"]),
        (400, &json!("invalid_json")),
        "{problem}"
    );
    let (_, same) = api.get("/v1/settings").await;
    assert_eq!(same["version"], 1, "{same}");

    // Slower heartbeats: version 2, reported by every node, and heartbeats really slower.
    let (status, changed) = put(
        &api,
        &json!({"version": 1, "heartbeat_every": "2s", "heartbeat_ttl": "8s"}),
    )
    .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["version"], 2);
    assert_eq!(changed["settings"]["heartbeat_every"], "2s");
    assert_eq!(
        changed["settings"]["horizon"], "5m",
        "the rest keeps its value"
    );
    wait_for("every node to run version 2", LONG, || async {
        let (_, nodes) = api.get("/v1/nodes").await;
        let nodes = nodes["nodes"].as_array()?.clone();
        (nodes.len() == 2 && nodes.iter().all(|n| n["settings_version"] == 2)).then_some(())
    })
    .await
    .unwrap();
    let slow = wait_for("a heartbeat older than a second", LONG, || async {
        let (_, nodes) = api.get("/v1/nodes").await;
        let oldest = nodes["nodes"]
            .as_array()?
            .iter()
            .filter_map(|n| n["heartbeat_age_s"].as_f64())
            .fold(0.0, f64::max);
        (oldest > 1.2).then_some(oldest)
    })
    .await
    .unwrap();
    // Still live under the new TTL.
    let (_, nodes) = api.get("/v1/nodes").await;
    assert!(
        nodes["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["status"] == "live"),
        "{nodes}"
    );
    // The same value again changes nothing.
    let (_, again) = put(&api, &json!({"heartbeat_every": "2s"})).await;
    assert_eq!(again["version"], 2);

    let (_, cluster) = api.get("/v1/cluster").await;
    assert_eq!(cluster["leader"], "control-plane", "{cluster}");
    assert_eq!(cluster["settings_version"], 2, "{cluster}");
    assert_eq!(cluster["lease"]["holder"], "control-plane");
    assert_eq!(
        api.metric_sum_with(
            "chronoshard_control_plane_leader",
            "replica=\"control-plane\""
        )
        .await,
        1.0
    );
    eprintln!("with 2 s heartbeats a node's heartbeat was seen {slow:.1} s old");
    p.stop().await.unwrap();
}
