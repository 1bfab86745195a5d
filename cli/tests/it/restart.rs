//! Stopping the platform and starting it again on the same data dir keeps jobs, history and firing.

use crate::common::*;
use chrono::Utc;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_on_the_same_data_dir_keeps_jobs_history_and_firing() {
    let dir = tempfile::tempdir().unwrap();
    let sink = HttpSink::start().await.unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let every = api
        .create(
            &json!({"tenant": "persist", "name": "tick", "schedule": {"every": "1s"},
            "target": {"type": "http", "url": sink.url("/tick")}}),
        )
        .await;
    // due while the platform is down, so it must fire after the restart
    let later = (Utc::now() + chrono::Duration::seconds(4)).to_rfc3339();
    let one_shot = api
        .create(
            &json!({"tenant": "persist-2", "name": "later", "schedule": {"at": later},
            "target": {"type": "http", "url": sink.url("/later")}}),
        )
        .await;
    let before = wait_for("two runs before the restart", LONG, || async {
        let runs = api.past_runs(&every).await;
        (runs.iter().filter(|r| r["status"] == "succeeded").count() >= 2).then_some(runs)
    })
    .await
    .unwrap();
    p.stop().await.unwrap();
    // The platform stays down until the one-shot is due.
    let due = chrono::DateTime::parse_from_rfc3339(&later).unwrap();
    wait_for(
        "the one-shot to fall due during the downtime",
        LONG,
        || async { (Utc::now() > due).then_some(()) },
    )
    .await
    .unwrap();
    assert!(
        sink.requests().iter().all(|r| r.path != "/later"),
        "nothing ran the one-shot while the platform was down"
    );

    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let (status, job) = api.get(&format!("/v1/jobs/{every}")).await;
    assert_eq!(
        (status, job["state"].as_str()),
        (200, Some("active")),
        "{job}"
    );
    // history from before the restart is still there, and new runs follow it
    let after = wait_for("new runs after the restart", LONG, || async {
        let runs = api.past_runs(&every).await;
        (runs.iter().filter(|r| r["status"] == "succeeded").count() >= before.len() + 2)
            .then_some(runs)
    })
    .await
    .unwrap();
    for old in &before {
        assert!(
            after
                .iter()
                .any(|r| r["scheduled_at"] == old["scheduled_at"]),
            "lost run {old}"
        );
    }
    let mut times: Vec<&str> = after
        .iter()
        .map(|r| r["scheduled_at"].as_str().unwrap())
        .collect();
    let n = times.len();
    times.dedup();
    assert_eq!(times.len(), n, "an occurrence appears twice");
    // the one-shot that fell due during the downtime fired exactly once
    api.newest_run_succeeded(&one_shot).await;
    assert_eq!(api.past_runs(&one_shot).await.len(), 1);
    assert_eq!(
        sink.requests()
            .iter()
            .filter(|r| r.path == "/later")
            .count(),
        1
    );
    p.stop().await.unwrap();
}
