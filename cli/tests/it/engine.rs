//! The engine's policies end to end: retries with backoff, dead letters and replay, the timeout
//! watchdog, overlap buffering, and tenant-wide pause, resume and trigger.

use std::time::Duration;

use crate::common::{worker::HandWorker, *};
use chronoshard_wire::ResultKind;
use serde_json::{json, Value};

async fn ticket(api: &Api, id: &str) -> Value {
    let (status, t) = api.get(&format!("/v1/tickets/{id}")).await;
    assert_eq!(status, 200, "{t}");
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_target_is_retried_dead_lettered_and_replayed_under_one_ticket() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let sink = HttpSink::start().await.unwrap();
    sink.respond_with(500);
    let job = api
        .create(&json!({"tenant": "acme", "name": "flaky", "schedule": {"delay": "100ms"},
            "target": {"type": "http", "url": sink.url("/flaky")},
            "retry": {"max_attempts": 3, "backoff": "exponential", "initial": "200ms", "max": "1s"}}))
        .await;
    let run = wait_for("the run to be dead", LONG, || async {
        api.past_runs(&job)
            .await
            .into_iter()
            .find(|r| r["status"] == "dead")
    })
    .await
    .unwrap();
    assert_eq!(run["attempts"], 3, "{run}");
    let ticket_id = run["ticket_ids"][0].as_str().unwrap().to_string();
    let calls = sink.requests();
    assert_eq!(calls.len(), 3);
    for (i, c) in calls.iter().enumerate() {
        assert_eq!(
            c.headers["idempotency-key"], ticket_id,
            "one ticket for every attempt"
        );
        assert_eq!(c.headers["x-chronoshard-attempt"], (i + 1).to_string());
    }
    // the backoff doubles: 200 ms, then 400 ms (measured at the target, so at least that)
    let gap = |a: usize, b: usize| {
        calls[b]
            .received_at
            .duration_since(calls[a].received_at)
            .unwrap()
    };
    assert!(gap(0, 1) >= Duration::from_millis(200), "{:?}", gap(0, 1));
    assert!(gap(1, 2) >= Duration::from_millis(400), "{:?}", gap(1, 2));

    let (status, page) = api.get("/v1/dlq?tenant=acme").await;
    assert_eq!(status, 200, "{page}");
    let letter = &page["items"][0];
    assert_eq!(letter["ticket_id"], ticket_id.as_str());
    assert_eq!(letter["attempts"], 3);
    assert!(
        letter["error"].as_str().unwrap().contains("500"),
        "{letter}"
    );
    let (_, all) = api.get("/v1/dlq").await;
    assert_eq!(all["items"].as_array().unwrap().len(), 1, "{all}");

    // the target is fixed; the replay runs attempt 4 and it succeeds
    sink.respond_with(200);
    let (status, replayed) = api
        .post(&format!("/v1/dlq/{ticket_id}/replay"), &json!({}))
        .await;
    assert_eq!(status, 202, "{replayed}");
    let run = api.newest_run_succeeded(&job).await;
    assert_eq!(run["attempts"], 4);
    let t = ticket(&api, &ticket_id).await;
    let statuses: Vec<&str> = t["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["failed", "failed", "failed", "succeeded"]);
    let (_, page) = api.get("/v1/dlq").await;
    assert!(page["items"].as_array().unwrap().is_empty(), "{page}");
    // a replay of a ticket that is not a dead letter, or of none at all, is refused
    let (status, problem) = api
        .post(&format!("/v1/dlq/{ticket_id}/replay"), &json!({}))
        .await;
    assert_eq!((status, problem["code"].as_str()), (409, Some("conflict")));
    let (status, _) = api
        .post(
            "/v1/dlq/0190a0a0-0000-7000-8000-000000000000/replay",
            &json!({}),
        )
        .await;
    assert_eq!(status, 404);
    let (status, problem) = api.get("/v1/dlq?cursor=nonsense").await;
    assert_eq!((status, problem["field"].as_str()), (400, Some("cursor")));
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_attempt_whose_worker_goes_silent_is_declared_lost_and_retried() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let mut hand = HandWorker::start(&p.nats_url, "ghost").await;
    let job = api
        .create(
            &json!({"tenant": "acme", "name": "vanishing", "schedule": {"delay": "0s"},
            "target": {"type": "queue", "queue": "ghost"}, "timeout": "1s",
            "retry": {"max_attempts": 2, "backoff": "fixed", "initial": "100ms"}}),
        )
        .await;
    let first = hand.next_ticket(LONG).await;
    assert_eq!(first.attempt, 1);
    // the worker starts the attempt, then is never heard of again
    hand.report(&first, ResultKind::Started, None).await;
    // timeout 1 s + 10 s slack, then the hard limit (2 × timeout + slack = 12 s)
    let second = hand.next_ticket(Duration::from_secs(40)).await;
    assert_eq!((second.ticket_id, second.attempt), (first.ticket_id, 2));
    hand.report(&second, ResultKind::Succeeded, None).await;
    let run = api.newest_run_succeeded(&job).await;
    assert_eq!(run["attempts"], 2);
    let t = ticket(&api, &first.ticket_id.to_string()).await;
    let lost = &t["attempts"][0];
    assert_eq!(lost["worker"], "watchdog", "{t}");
    assert!(lost["error"].as_str().unwrap().starts_with("lost:"), "{t}");
    let (_, _, metrics) = api.send(reqwest::Method::GET, "/metrics", None).await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .lines()
            .any(|l| l.starts_with("chronoshard_attempts_lost_total") && l.ends_with(" 1")),
        "the loss is counted"
    );
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buffer_one_holds_a_second_occurrence_until_the_first_run_ends() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let mut hand = HandWorker::start(&p.nats_url, "slow").await;
    let job = api
        .create(
            &json!({"tenant": "acme", "name": "exclusive", "schedule": {"every": "1h"},
            "target": {"type": "queue", "queue": "slow"}, "overlap": "buffer_one"}),
        )
        .await;
    let first = hand.next_ticket(LONG).await;
    hand.report(&first, ResultKind::Started, None).await;
    wait_for("the first run to be running", LONG, || async {
        let runs = api.past_runs(&job).await;
        runs.iter().any(|r| r["status"] == "running").then_some(())
    })
    .await
    .unwrap();
    let (status, run) = api
        .post(&format!("/v1/jobs/{job}/trigger"), &json!({}))
        .await;
    assert_eq!(status, 202, "{run}");
    assert_eq!(run["status"], "scheduled", "{run}");
    assert!(run["reason"].as_str().unwrap().starts_with("buffered"));
    let (_, third) = api
        .post(&format!("/v1/jobs/{job}/trigger"), &json!({}))
        .await;
    assert_eq!(third["status"], "skipped", "{third}");
    // the first run ends: the buffered occurrence is dispatched
    hand.report(&first, ResultKind::Succeeded, None).await;
    let second = hand.next_ticket(LONG).await;
    assert_eq!(second.scheduled_at.to_rfc3339(), {
        let at: chrono::DateTime<chrono::Utc> =
            run["scheduled_at"].as_str().unwrap().parse().unwrap();
        at.to_rfc3339()
    });
    assert_ne!(second.ticket_id, first.ticket_id);
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_tenant_fires_nothing_until_resumed_and_can_be_triggered_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let sink = HttpSink::start().await.unwrap();
    let every = |tenant: &str| {
        json!({"tenant": tenant, "name": "tick", "schedule": {"every": "300ms"},
            "target": {"type": "http", "url": sink.url(&format!("/{tenant}"))}})
    };
    let quiet = api.create(&every("quiet")).await;
    let busy = api.create(&every("busy")).await;
    api.newest_run_succeeded(&quiet).await;
    let (status, view) = api.post("/v1/tenants/quiet/pause", &json!({})).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        (view["paused"].as_bool(), view["jobs"].as_u64()),
        (Some(true), Some(1))
    );
    // One shard holds a tenant here: no count of paused shards.
    assert!(view.get("paused_shards").is_none(), "{view}");
    let calls = |path: &str| sink.requests().iter().filter(|r| r.path == path).count();
    // a fire already under way when the pause landed may still arrive: count from after it
    let busy_before = api.past_runs(&busy).await.len();
    let quiet_before = calls("/quiet");
    // while the other tenant's job fires five more times, the paused one fires nothing
    wait_for("five more fires of the busy tenant", LONG, || async {
        (api.past_runs(&busy).await.len() >= busy_before + 5).then_some(())
    })
    .await
    .unwrap();
    assert!(
        calls("/quiet") <= quiet_before + 1,
        "paused tenant kept firing"
    );
    let settled = calls("/quiet");
    wait_for("three more fires of the busy tenant", LONG, || async {
        (api.past_runs(&busy).await.len() >= busy_before + 8).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(calls("/quiet"), settled, "paused tenant kept firing");
    // a tenant-wide trigger is refused while paused
    let (status, _) = api.post("/v1/tenants/quiet/trigger", &json!({})).await;
    assert_eq!(status, 409);
    let (status, view) = api.post("/v1/tenants/quiet/resume", &json!({})).await;
    assert_eq!((status, view["paused"].as_bool()), (200, Some(false)));
    wait_for("the resumed tenant to fire again", LONG, || async {
        (calls("/quiet") > settled).then_some(())
    })
    .await
    .unwrap();
    let (status, view) = api.post("/v1/tenants/busy/trigger", &json!({})).await;
    assert_eq!(
        (status, view["triggered"].as_u64()),
        (202, Some(1)),
        "{view}"
    );
    let (status, view) = api.get("/v1/tenants/busy").await;
    assert_eq!((status, view["paused"].as_bool()), (200, Some(false)));
    let (status, problem) = api.get("/v1/tenants/not.a.tenant").await;
    assert_eq!((status, problem["field"].as_str()), (400, Some("tenant")));
    p.stop().await.unwrap();
}
