//! A nats-server restart in the middle of a run loses nothing: tickets written while JetStream is
//! away are published once it is back, and every occurrence has one run. After a clean restart
//! nothing runs twice; after a crash a repeat may only be the same ticket and attempt.

use std::collections::HashMap;

use crate::common::*;
use chrono::Utc;
use serde_json::json;

async fn run_through_restart(kill: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut p = platform(dir.path()).await;
    let api = Api::new(&p);
    let sink = HttpSink::start().await.unwrap();
    let start = Utc::now();
    let mut ids = Vec::new();
    let mut due_at = Vec::new();
    for i in 0..60i64 {
        // due over the next 6 s, so some fall due while nats-server is down
        let due = start + chrono::Duration::milliseconds(500 + i * 100);
        due_at.push(due);
        let at = due.to_rfc3339();
        ids.push(
            api.create(&json!({"tenant": format!("t{}", i % 3), "name": format!("j{i}"), "schedule": {"at": at},
                "target": {"type": "http", "url": sink.url(&format!("/j/{i}"))}}))
                .await,
        );
    }
    wait_for("some jobs to run before the restart", LONG, || async {
        (sink.requests().len() >= 5).then_some(())
    })
    .await
    .unwrap();
    p.stop_nats(kill).await.unwrap();
    let down_at = Utc::now();
    // The outage lasts until five occurrences fell due during it.
    let due_during: Vec<usize> = wait_for(
        "occurrences to fall due during the outage",
        LONG,
        || async {
            let now = Utc::now();
            let due: Vec<usize> = (0..60)
                .filter(|i| (down_at..now).contains(&due_at[*i]))
                .collect();
            (due.len() >= 5).then_some(due)
        },
    )
    .await
    .unwrap();
    p.start_nats().await.unwrap();
    for id in &ids {
        api.newest_run_succeeded(id).await;
    }
    let mut per_path: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for r in sink.requests() {
        let key = (
            r.headers["idempotency-key"].clone(),
            r.headers["x-chronoshard-attempt"].clone(),
        );
        per_path.entry(r.path).or_default().push(key);
    }
    assert_eq!(per_path.len(), 60, "some jobs never reached the target");
    for i in &due_during {
        assert!(
            per_path.contains_key(&format!("/j/{i}")),
            "j{i} was due during the outage"
        );
    }
    let twice: Vec<_> = per_path
        .iter()
        .filter(|(_, calls)| calls.len() > 1)
        .collect();
    if kill {
        // A crashed JetStream can forget an acknowledgement it had not yet written to disk (it
        // acknowledges first), so a delivery may come again, to a worker whose journal has not
        // seen it: a repeat is allowed only as the same ticket and attempt, i.e. under the same
        // Idempotency-Key.
        for (path, calls) in &twice {
            assert!(
                calls.iter().all(|c| *c == calls[0]),
                "{path}: different tickets {calls:?}"
            );
        }
        eprintln!("executions repeated after the crash: {}", twice.len());
    } else {
        assert!(twice.is_empty(), "executed more than once: {twice:?}");
    }
    for id in &ids {
        assert_eq!(api.past_runs(id).await.len(), 1);
    }
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nats_server_restart_loses_and_duplicates_nothing() {
    run_through_restart(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nats_server_crash_loses_nothing_and_repeats_only_the_same_ticket() {
    run_through_restart(true).await;
}
