//! What a platform says about tickets nobody will run, and what it counts per tenant, with every
//! role a separate process: a shell job created while no worker serves the `shell` queue is
//! answered with a `queue_unserved` warning (on create, on read, on its waiting runs), the shard
//! node counts its waiting tickets in `chronoshard_tickets_unserved` and logs the queue once; a
//! queue whose consumer a worker in another language pulls from is served; when a shell worker
//! starts, the warnings and the count go away. The tenant metrics count fires, failed attempts
//! and dead letters under at most `metrics_tenants` tenant names.

use std::time::Duration;

use crate::common::{cluster::Deployment, process::Process, wait_for, Api};
use async_nats::jetstream::{self, consumer::pull};
use chronoshard_wire::names;
use serde_json::{json, Value};

const SOON: Duration = Duration::from_secs(30);

fn warning_codes(v: &Value) -> Vec<String> {
    v["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(|w| Some(w["code"].as_str()?.to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// The sum of `name` over the node's label sets that contain `label`.
async fn node_metric(node: &Api, name: &str, label: &str) -> f64 {
    node.metric_sum_with(name, label).await
}

#[tokio::test]
async fn tickets_without_a_worker_are_announced_counted_and_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Deployment::start(1).await;
    // One tenant keeps its name in the tenant metrics; the second counts as "(other)".
    d.control_plane("cp-1", &["--metrics-tenants", "1"]).await;
    d.node_with("node-1", &["--metrics", "127.0.0.1:0"]).await;
    let api = d.api("cp-1");
    let metrics = d.nodes["node-1"].metrics_url().await;
    let node = Api::at(metrics.trim_end_matches("/metrics"), "");

    let shell_job = |name: &str, tenant: &str, command: &str| {
        json!({"tenant": tenant, "name": name, "schedule": {"every": "1s"},
               "target": {"type": "shell", "command": command},
               "retry": {"max_attempts": 2, "backoff": "fixed", "initial": "100ms"}})
    };
    let (status, first) = api.post("/v1/jobs", &shell_job("ok", "acme", "true")).await;
    assert_eq!(status, 201, "{first}");
    let first_id = first["id"].as_str().unwrap().to_string();
    // Once the node has read the (empty) worker registry, the job reads with the warning.
    let job = wait_for("the job to read with a warning", SOON, || async {
        let (_, job) = api.get(&format!("/v1/jobs/{first_id}")).await;
        (warning_codes(&job) == ["queue_unserved"]).then_some(job)
    })
    .await
    .unwrap();
    let message = job["warnings"][0]["message"].as_str().unwrap();
    assert!(message.contains("\"shell\""), "{message}");

    // From then on a create is answered with it too.
    let (status, failing) = api
        .post("/v1/jobs", &shell_job("fails", "globex", "false"))
        .await;
    assert_eq!(status, 201, "{failing}");
    assert_eq!(warning_codes(&failing), ["queue_unserved"], "{failing}");
    let failing_id = failing["id"].as_str().unwrap().to_string();

    // Its occurrences fall due and wait: the waiting runs say why, the node counts them and
    // logs the queue once.
    let runs = wait_for("a dispatched run with the warning", SOON, || async {
        let (_, page) = api.get(&format!("/v1/jobs/{first_id}/runs")).await;
        let runs = page["runs"].as_array()?.clone();
        runs.iter()
            .any(|r| r["status"] == "dispatched" && warning_codes(r) == ["queue_unserved"])
            .then_some(runs)
    })
    .await
    .unwrap();
    assert!(
        runs.iter()
            .filter(|r| r["status"] == "dispatched")
            .all(|r| warning_codes(r) == ["queue_unserved"]),
        "{runs:?}"
    );
    wait_for("the node to count unserved tickets", SOON, || async {
        (node_metric(&node, "chronoshard_tickets_unserved", "").await >= 2.0).then_some(())
    })
    .await
    .unwrap();
    // One line per shard while the queue stays unserved, however many tickets wait.
    let lines = d.nodes["node-1"].records("tickets wait on a queue that no live worker serves");
    let mut shards: Vec<String> = lines
        .iter()
        .map(|r| format!("{}/{}", r["fields"]["shard"], r["fields"]["queue"]))
        .collect();
    assert!(!shards.is_empty());
    let said = shards.len();
    shards.sort();
    shards.dedup();
    assert_eq!(shards.len(), said, "{lines:?}");
    assert!(
        shards.iter().all(|s| s.ends_with("/\"shell\"")),
        "{shards:?}"
    );

    // A queue whose consumer is pulled from is served, registered worker or not. (Its job
    // fires in an hour: a ticket now would wait on the queue once this pull is gone.)
    let client = async_nats::connect(d.nats.url()).await.unwrap();
    let stream = jetstream::new(client)
        .get_stream(names::DISPATCH_STREAM)
        .await
        .unwrap();
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(names::worker_consumer("reports")),
            filter_subject: names::dispatch_subject("reports"),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    // A pull request held open, as an idle worker holds one.
    let pulling = consumer
        .batch()
        .max_messages(1)
        .expires(Duration::from_secs(60))
        .messages()
        .await
        .unwrap();
    wait_for("the pull request to wait", SOON, || async {
        let info = stream
            .consumer_info(names::worker_consumer("reports"))
            .await
            .ok()?;
        (info.num_waiting > 0).then_some(())
    })
    .await
    .unwrap();
    let queued = json!({"tenant": "acme", "name": "report", "schedule": {"delay": "1h"},
                        "target": {"type": "queue", "queue": "reports"}});
    let (status, job) = api.post("/v1/jobs", &queued).await;
    assert_eq!(status, 201, "{job}");
    assert!(warning_codes(&job).is_empty(), "{job}");
    drop(pulling);

    // A shell worker starts: the shell jobs run, the warnings and the count go away.
    let nats = d.nats.url();
    let data = dir.path().join("w1");
    let _worker = Process::start(
        "w1",
        &[
            "worker",
            "--id",
            "w1",
            "--nats",
            &nats,
            "--data",
            data.to_str().unwrap(),
            "--shell",
            "--shell-allow",
            "true,false",
        ],
    );
    wait_for("the warnings to go", SOON, || async {
        let (_, job) = api.get(&format!("/v1/jobs/{first_id}")).await;
        let (_, page) = api.get(&format!("/v1/jobs/{first_id}/runs")).await;
        let runs = page["runs"].as_array()?.clone();
        (warning_codes(&job).is_empty() && runs.iter().all(|r| warning_codes(r).is_empty()))
            .then_some(())
    })
    .await
    .unwrap();
    wait_for("no unserved ticket counted", SOON, || async {
        (node_metric(&node, "chronoshard_tickets_unserved", "").await == 0.0).then_some(())
    })
    .await
    .unwrap();
    api.newest_run_succeeded(&first_id).await;

    // The failing job's tickets fail twice each and are dead-lettered, under "(other)": the
    // bound of one tenant name went to acme, which fired first.
    wait_for("a dead letter of the failing job", SOON, || async {
        let dead = node_metric(
            &node,
            "chronoshard_tenant_dead_letters_total",
            r#"tenant="(other)""#,
        )
        .await;
        (dead >= 1.0).then_some(())
    })
    .await
    .unwrap();
    let failed = node_metric(
        &node,
        "chronoshard_tenant_attempts_failed_total",
        r#"tenant="(other)""#,
    )
    .await;
    assert!(failed >= 2.0, "two attempts per dead letter: {failed}");
    let acme_fires = node_metric(&node, "chronoshard_tenant_fires_total", r#"tenant="acme""#).await;
    assert!(acme_fires >= 1.0, "{acme_fires}");
    let globex = node_metric(&node, "chronoshard_tenant_fires_total", "globex").await;
    assert_eq!(globex, 0.0, "globex has no label of its own");
    assert_eq!(
        node_metric(
            &node,
            "chronoshard_tenant_attempts_failed_total",
            r#"tenant="acme""#
        )
        .await,
        0.0,
        "acme's job succeeds"
    );
    let (_, dead) = api.get("/v1/dlq?tenant=globex").await;
    assert!(
        dead["items"]
            .as_array()
            .is_some_and(|i| i.iter().any(|d| d["job_id"] == failing_id.as_str())),
        "{dead}"
    );
}
