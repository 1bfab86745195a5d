//! JetStream refusing tickets (its dispatch stream full): the shard keeps firing into its outbox
//! and answering API writes, memory stays bounded, the backlog is exported, and once JetStream
//! accepts again every ticket is published exactly once.

use std::collections::HashMap;

use crate::common::{worker::HandWorker, *};
use async_nats::jetstream;
use chronoshard_wire::names;
use serde_json::json;

/// Sets the dispatch stream's message limit (-1: none); with `discard: new`, publishes beyond it
/// are refused.
async fn limit_dispatch_stream(nats_url: &str, max_messages: i64) {
    let js = jetstream::new(async_nats::connect(nats_url).await.unwrap());
    let mut stream = js.get_stream(names::DISPATCH_STREAM).await.unwrap();
    let mut config = stream.info().await.unwrap().config.clone();
    config.max_messages = max_messages;
    js.update_stream(config).await.unwrap();
}

async fn backlog(api: &Api) -> i64 {
    api.metric_sum("chronoshard_dispatch_backlog").await as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refusing_jetstream_slows_dispatch_without_losing_or_doubling_tickets() {
    let dir = tempfile::tempdir().unwrap();
    // a small window, so the hand-over channel fills after a few dozen fires
    let p = platform_with(dir.path(), |o| o.settings.publish_window = 4).await;
    let api = Api::new(&p);
    limit_dispatch_stream(&p.nats_url, 1).await;
    let job = |i: usize| {
        json!({"tenant": "flood", "name": format!("j{i}"), "schedule": {"delay": "0s"},
            "target": {"type": "queue", "queue": "stuck"}})
    };
    // the first ticket fills the stream; the rest are refused, yet every create (a write through
    // the same shard loop that fires) is answered
    let mut jobs = Vec::new();
    for i in 0..300 {
        jobs.push(api.create(&job(i)).await);
    }
    let seen = wait_for("the backlog to be exported", LONG, || async {
        let b = backlog(&api).await;
        (b >= 299).then_some(b)
    })
    .await
    .unwrap();
    assert!(seen <= 300, "backlog {seen}");
    let refused = api.metric_sum("chronoshard_publish_errors_total").await;
    assert!(
        refused >= 1.0,
        "the refused publishes are counted: {refused}"
    );
    // runs are recorded as dispatched while their tickets wait in the outbox
    let runs = api.past_runs(&jobs[299]).await;
    assert_eq!(runs[0]["status"], "dispatched", "{runs:?}");

    limit_dispatch_stream(&p.nats_url, -1).await;
    let mut hand = HandWorker::start(&p.nats_url, "stuck").await;
    let mut per_job: HashMap<String, Vec<String>> = HashMap::new();
    for _ in 0..300 {
        let t = hand.next_ticket(LONG).await;
        per_job
            .entry(t.job_id.to_string())
            .or_default()
            .push(format!("{}:{}", t.ticket_id, t.attempt));
    }
    for j in &jobs {
        assert_eq!(per_job.get(j).map(Vec::len), Some(1), "job {j}");
    }
    wait_for("the backlog to drain", LONG, || async {
        (backlog(&api).await == 0).then_some(())
    })
    .await
    .unwrap();
    // and nothing more arrives: no ticket was published twice
    let extra =
        tokio::time::timeout(std::time::Duration::from_secs(2), hand.next_ticket(LONG)).await;
    assert!(extra.is_err(), "a ticket arrived twice: {:?}", extra.ok());
    p.stop().await.unwrap();
}
