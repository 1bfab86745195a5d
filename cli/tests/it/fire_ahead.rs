//! Occurrences are fired (written) a lead ahead of their time and published when they are due; a
//! pause or delete applied before then takes them back, as if they had not been fired.

use chronoshard_wire::Dur;
use std::time::Duration;

use crate::common::{worker::HandWorker, *};
use chrono::Utc;
use chronoshard_wire::Ticket;
use serde_json::{json, Value};

fn one_shot(tenant: &str, name: &str, in_ms: i64) -> Value {
    let at = Utc::now() + chrono::Duration::milliseconds(in_ms);
    json!({"tenant": tenant, "name": name, "schedule": {"at": at.to_rfc3339()},
        "target": {"type": "queue", "queue": "ahead"}})
}

async fn the_only_run(api: &Api, job: &str) -> Value {
    let (status, page) = api.get(&format!("/v1/jobs/{job}/runs")).await;
    assert_eq!(status, 200, "{page}");
    let runs = page["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{page}");
    runs[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_occurrence_fired_ahead_is_published_on_time_and_taken_back_by_a_pause_before() {
    let dir = tempfile::tempdir().unwrap();
    // a lead far longer than the test's set-up, so every occurrence is fired at once
    let p = platform_with(dir.path(), |o| {
        o.settings.fire_lead = Dur(Duration::from_secs(20))
    })
    .await;
    let api = Api::new(&p);
    let mut hand = HandWorker::start(&p.nats_url, "ahead").await;
    let kept = api.create(&one_shot("acme", "kept", 4000)).await;
    let paused = api.create(&one_shot("acme", "paused", 4000)).await;
    let deleted = api.create(&one_shot("acme", "deleted", 4000)).await;
    let tenant_paused = api.create(&one_shot("umbrella", "tenant", 4000)).await;
    for job in [&kept, &paused, &deleted, &tenant_paused] {
        wait_for("the occurrence to be fired ahead", LONG, || async {
            (!api.past_runs(job).await.is_empty()).then_some(())
        })
        .await
        .unwrap();
    }

    let (status, body) = api
        .post(&format!("/v1/jobs/{paused}/pause"), &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = api
        .send(
            reqwest::Method::DELETE,
            &format!("/v1/jobs/{deleted}"),
            None,
        )
        .await;
    assert!(status < 300, "{body}");
    let (status, body) = api.post("/v1/tenants/umbrella/pause", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    // due after the others on the same queue: when it arrives, they would have
    let marker = api.create(&one_shot("acme", "marker", 5000)).await;

    let first: Ticket = hand.next_ticket(LONG).await;
    let received = Utc::now();
    assert_eq!(first.job_id.to_string(), kept);
    assert!(
        received >= first.scheduled_at,
        "published at {received}, before its time {}",
        first.scheduled_at
    );
    let second = hand.next_ticket(LONG).await;
    assert_eq!(
        second.job_id.to_string(),
        marker,
        "only the kept occurrence and the marker are published"
    );
    // as if they had not been fired: no run, no ticket (a pause keeps no record of the occurrences
    // it stops, with or without a lead)
    for job in [&paused, &deleted, &tenant_paused] {
        let (status, page) = api.get(&format!("/v1/jobs/{job}/runs")).await;
        assert_eq!(status, 200, "{page}");
        let fired: Vec<&Value> = page["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["status"] != "scheduled")
            .collect();
        assert!(fired.is_empty(), "{page}");
    }
    assert_eq!(the_only_run(&api, &kept).await["status"], "dispatched");
    // the tenant's one-shot was kept for after its resume, as it would have been without a lead
    let (status, body) = api.post("/v1/tenants/umbrella/resume", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let third = hand.next_ticket(LONG).await;
    assert_eq!(third.job_id.to_string(), tenant_paused);
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_restart_a_pause_before_due_still_takes_back_an_occurrence_fired_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let lead =
        |o: &mut chronoshard::dev::DevOptions| o.settings.fire_lead = Dur(Duration::from_secs(30));
    let p = platform_with(dir.path(), lead).await;
    let api = Api::new(&p);
    let job = api.create(&one_shot("acme", "restarted", 10_000)).await;
    wait_for("the occurrence to be fired ahead", LONG, || async {
        (!api.past_runs(&job).await.is_empty()).then_some(())
    })
    .await
    .unwrap();
    p.stop().await.unwrap();

    // the new owner of the shard did not fire it, but knows it was fired ahead
    let p = platform_with(dir.path(), lead).await;
    let api = Api::new(&p);
    let (status, body) = api.post(&format!("/v1/jobs/{job}/pause"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let mut hand = HandWorker::start(&p.nats_url, "ahead").await;
    let marker = api.create(&one_shot("acme", "marker", 11_000)).await;
    let first = hand.next_ticket(LONG).await;
    assert_eq!(
        first.job_id.to_string(),
        marker,
        "the paused occurrence never came"
    );
    assert!(api.past_runs(&job).await.is_empty());
    p.stop().await.unwrap();
}
