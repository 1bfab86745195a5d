//! Overlap policies end to end: `replace` stops the execution it replaces (the HTTP executor
//! aborts its call, an SDK handler's token fires; the shell executor's case is in
//! `worker_process`) and records it cancelled; a worker answers a shard's probes.

use std::time::Duration;

use crate::{common::*, worker_sdk::sdk_worker};
use chronoshard_wire::{
    names,
    rpc::{AttemptReply, AttemptRequest, AttemptState},
};
use chronoshard_worker::{Handlers, Job, JobError};
use serde_json::{json, Value};

/// The ticket of the job's first cancelled run, once it shows one: the run and its one attempt
/// are `cancelled` as replaced, and the attempt was started by `worker` (it really ran).
pub async fn first_run_cancelled(api: &Api, job: &str, worker: &str) -> Value {
    let ticket = api.ticket_of_run(job, "cancelled").await;
    assert_replaced(&ticket, worker);
    ticket
}

/// Checks that the ticket's one attempt was started by `worker` and cancelled as replaced.
pub fn assert_replaced(ticket: &Value, worker: &str) {
    let attempt = &ticket["attempts"][0];
    assert_eq!(attempt["status"], "cancelled", "{ticket}");
    assert_eq!(
        attempt["error"], "replaced by a newer occurrence",
        "{ticket}"
    );
    assert_eq!(attempt["worker"], worker, "{ticket}");
    assert!(attempt["started_at"].is_string(), "{ticket}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replace_aborts_the_http_call_of_the_run_it_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let sink = HttpSink::start().await.unwrap();
    // Every call would take a minute: each run is still running when the next one is due.
    sink.respond_after(Duration::from_secs(60));
    let job = api
        .create(
            &json!({"tenant": "acme", "name": "slow-hook", "schedule": {"every": "3s"},
            "target": {"type": "http", "url": sink.url("/slow")},
            "overlap": "replace", "timeout": "120s"}),
        )
        .await;
    // The first call is cut off when the second occurrence replaces its run, long before the
    // sink would have answered it.
    let aborted = wait_for("a replaced call to be aborted", LONG, || async {
        sink.aborted().into_iter().next()
    })
    .await
    .unwrap();
    let calls = wait_for("the replacing occurrence's call", LONG, || async {
        let calls = sink.requests();
        (calls.len() >= 2).then_some(calls)
    })
    .await
    .unwrap();
    let replaced = aborted.headers["idempotency-key"].clone();
    assert_eq!(replaced, calls[0].headers["idempotency-key"]);
    let (status, _) = api.post(&format!("/v1/jobs/{job}/pause"), &json!({})).await;
    assert_eq!(status, 200);
    let ticket = first_run_cancelled(&api, &job, "worker-1").await;
    assert_eq!(ticket["ticket_id"], replaced.as_str(), "{ticket}");
    p.stop().await.unwrap();
}

type Events = tokio::sync::mpsc::UnboundedReceiver<(&'static str, uuid::Uuid)>;

async fn next(events: &mut Events) -> (&'static str, uuid::Uuid) {
    let got = tokio::time::timeout(LONG, events.recv()).await;
    got.expect("an event in time").expect("channel open")
}

/// Asks worker `worker` about an attempt, as a shard does.
async fn ask(client: &async_nats::Client, worker: &str, req: &AttemptRequest) -> AttemptState {
    let body = serde_json::to_vec(req).unwrap();
    let msg = client
        .request(names::worker_attempts_subject(worker), body.into())
        .await
        .expect("the worker answers");
    let reply: AttemptReply = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(reply.worker_id, worker);
    reply.state
}

/// An SDK worker answers a shard's questions about its attempts: `running` while its handler
/// runs one; a replace fires the handler's cancellation token; `unknown` once it is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_sdk_handler_is_told_to_stop_and_its_worker_answers_probes() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let handlers = Handlers::new().queue("patient", move |job: Job| {
        let tx = tx.clone();
        async move {
            let id = job.ticket().ticket_id;
            let _ = tx.send(("started", id));
            job.cancelled().cancelled().await;
            let _ = tx.send(("told to stop", id));
            Err(JobError::new("stopped as told"))
        }
    });
    let (_stop, _task) = sdk_worker(&p, &dir.path().join("w"), "sdk-1", handlers).await;
    let job = api
        .create(
            &json!({"tenant": "acme", "name": "patient", "schedule": {"every": "3s"},
            "target": {"type": "queue", "queue": "patient"}, "overlap": "replace",
            "timeout": "120s"}),
        )
        .await;
    let (what, first) = next(&mut events).await;
    assert_eq!(what, "started");
    let client = async_nats::connect(&p.nats_url).await.unwrap();
    let probe = AttemptRequest::Probe {
        ticket_id: first,
        attempt: 1,
    };
    assert_eq!(ask(&client, "sdk-1", &probe).await, AttemptState::Running);
    let other = AttemptRequest::Probe {
        ticket_id: first,
        attempt: 2,
    };
    assert_eq!(ask(&client, "sdk-1", &other).await, AttemptState::Unknown);
    // The next occurrence replaces the run: the handler of the first is told to stop.
    let stopped = loop {
        match next(&mut events).await {
            ("told to stop", id) => break id,
            ("started", _) => continue,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(stopped, first);
    let (status, body) = api.post(&format!("/v1/jobs/{job}/pause"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    first_run_cancelled(&api, &job, "sdk-1").await;
    wait_for("the worker to be done with the attempt", LONG, || async {
        (ask(&client, "sdk-1", &probe).await == AttemptState::Unknown).then_some(())
    })
    .await
    .unwrap();
    p.stop().await.unwrap();
}

/// Replaced runs whose tickets wait in the stream (no worker serves the queue yet) are taken
/// back from it: a worker that comes later runs only the run that replaced them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replaced_tickets_still_queued_are_taken_back_from_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let job = api
        .create(
            &json!({"tenant": "acme", "name": "queued", "schedule": {"every": "1s"},
            "target": {"type": "queue", "queue": "later"}, "overlap": "replace"}),
        )
        .await;
    // Two runs replaced while their tickets were published and waiting.
    let replaced: Vec<Value> = wait_for("two replaced runs", LONG, || async {
        let runs: Vec<Value> = api
            .past_runs(&job)
            .await
            .into_iter()
            .filter(|r| r["status"] == "cancelled")
            .collect();
        (runs.len() >= 2).then_some(runs)
    })
    .await
    .unwrap();
    let (status, body) = api.post(&format!("/v1/jobs/{job}/pause"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let mut taken_back = Vec::new();
    for run in &replaced {
        let id = run["ticket_ids"][0].as_str().unwrap();
        let (_, t) = api.get(&format!("/v1/tickets/{id}")).await;
        assert!(t["attempts"][0]["published_at"].is_string(), "{t}");
        taken_back.push(id.to_string());
    }
    // What the stream still holds for the queue: only runs that were not replaced.
    let client = async_nats::connect(&p.nats_url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream(names::DISPATCH_STREAM).await.unwrap();
    let queued = wait_for("the replaced tickets to leave the stream", LONG, || async {
        let mut stream = stream.clone();
        let waiting = stream.info().await.ok()?.state.messages;
        let live: u64 = api
            .past_runs(&job)
            .await
            .iter()
            .filter(|r| r["status"] == "dispatched")
            .count() as u64;
        (waiting == live).then_some(waiting)
    })
    .await
    .unwrap();
    let mut hand = crate::common::worker::HandWorker::start(&p.nats_url, "later").await;
    for _ in 0..queued {
        let t = hand.next_ticket(LONG).await;
        assert!(
            !taken_back.contains(&t.ticket_id.to_string()),
            "a replaced ticket was delivered: {t:?}"
        );
    }
    p.stop().await.unwrap();
}
