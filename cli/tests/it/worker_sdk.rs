//! Workers built with the SDK (`chronoshard_worker::Handlers`) against a dev platform: handlers
//! by queue, a panicking handler, a permanent failure, checkpoints carried to the next attempt,
//! malformed dispatch messages, per-queue limits, and which reports an execution sends.

use std::{
    path::Path,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use crate::common::{worker::HandWorker, *};
use async_nats::{jetstream, HeaderMap};
use chronoshard::dev::Platform;
use chronoshard_wire::names;
use chronoshard_worker::{
    handler::BoxFuture, Handler, Handlers, Job, JobError, Options, Outcome, QueueLimits, Worker,
};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Starts an SDK worker on the platform's NATS; it stops when the returned token is cancelled
/// (or it is drained), and the returned task ends when it has.
pub(crate) async fn sdk_worker(
    p: &Platform,
    dir: &Path,
    id: &str,
    handlers: Handlers,
) -> (CancellationToken, JoinHandle<()>) {
    let mut opts = Options::new(id, dir);
    opts.handlers = handlers;
    let stop = CancellationToken::new();
    let client = async_nats::connect(&p.nats_url).await.unwrap();
    let task = Worker::start(opts, client, stop.clone()).await.unwrap();
    (stop, task)
}

fn job(name: &str, queue: &str, payload: Value, max_attempts: u32) -> Value {
    json!({"tenant": "acme", "name": name, "schedule": {"delay": "0s"},
           "target": {"type": "queue", "queue": queue}, "payload": payload,
           "retry": {"max_attempts": max_attempts, "backoff": "fixed", "initial": "100ms"}})
}

/// A handler whose `call` panics instead of returning a future.
struct PanicsAtCall;

impl Handler for PanicsAtCall {
    fn call(&self, _job: Job) -> BoxFuture<Outcome> {
        panic!("no future for you")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handlers_by_queue_panics_permanent_failures_and_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let payloads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = payloads.clone();
    let handlers = Handlers::new()
        .queue("greet", move |job: Job| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(job.payload().clone());
                Ok(())
            }
        })
        .queue("explode", |job: Job| async move {
            if job.payload()["panic"] == true {
                panic!("the handler blew up");
            }
            Ok(())
        })
        .queue("explode-early", PanicsAtCall)
        .job_type("typed", "welcome", |job: Job| async move {
            (job.payload()["to"] == "ada")
                .then_some(())
                .ok_or(JobError::new("the welcome handler got another payload"))
        })
        .job_type("typed", "farewell", |_job: Job| async move {
            Err(JobError::new("the farewell handler ran"))
        })
        .queue("reject", |_job: Job| async move {
            Err(JobError::permanent("the payload can never work"))
        })
        .queue("resume", |job: Job| async move {
            // The first attempt gets halfway, saves how far, and fails; the next one resumes.
            match job.checkpoint() {
                None => {
                    job.save_checkpoint(json!({"done": 50})).await?;
                    Err(JobError::new("interrupted halfway"))
                }
                Some(c) if c["done"] == 50 => Ok(()),
                Some(c) => Err(JobError::permanent(format!("unexpected checkpoint {c}"))),
            }
        });
    let (stop, _) = sdk_worker(&p, dir.path(), "sdk-1", handlers).await;

    let greet = api
        .create(&job("greet", "greet", json!({"name": "ada"}), 1))
        .await;
    let t = api.ticket_of_run(&greet, "succeeded").await;
    assert_eq!(t["attempts"][0]["worker"], "sdk-1", "{t}");
    assert_eq!(*payloads.lock().unwrap(), vec![json!({"name": "ada"})]);

    // A panic is a failed attempt with the panic's message; the worker goes on.
    let boom = api
        .create(&job("boom", "explode", json!({"panic": true}), 1))
        .await;
    let t = api.ticket_of_run(&boom, "dead").await;
    let error = t["attempts"][0]["error"].as_str().unwrap();
    assert_eq!(error, "handler panicked: the handler blew up", "{t}");
    let calm = api
        .create(&job("calm", "explode", json!({"panic": false}), 1))
        .await;
    api.ticket_of_run(&calm, "succeeded").await;
    // A handler that panics before it even returns its future: the same.
    let early = api
        .create(&job("early", "explode-early", json!({}), 1))
        .await;
    let t = api.ticket_of_run(&early, "dead").await;
    assert_eq!(
        t["attempts"][0]["error"], "handler panicked: no future for you",
        "{t}"
    );

    // One queue, a handler per job type; a job type nobody handles is a dead letter at once.
    let typed = |name: &str, job_type: &str| {
        json!({"tenant": "acme", "name": name, "schedule": {"delay": "0s"},
               "target": {"type": "queue", "queue": "typed", "job_type": job_type},
               "payload": {"to": "ada"}, "retry": {"max_attempts": 3}})
    };
    let welcome = api.create(&typed("welcome", "welcome")).await;
    api.ticket_of_run(&welcome, "succeeded").await;
    let unknown = api.create(&typed("unknown", "audit")).await;
    let t = api.ticket_of_run(&unknown, "dead").await;
    assert_eq!(
        t["attempts"][0]["error"], "no handler for job type \"audit\" on queue \"typed\"",
        "{t}"
    );
    assert_eq!(t["attempts"].as_array().unwrap().len(), 1, "{t}");

    // A permanent failure is a dead letter after one attempt although five are allowed.
    let rejected = api.create(&job("rejected", "reject", json!({}), 5)).await;
    let t = api.ticket_of_run(&rejected, "dead").await;
    assert_eq!(t["status"], "dead", "{t}");
    assert_eq!(t["attempts"].as_array().unwrap().len(), 1, "{t}");
    let (_, dlq) = api.get("/v1/dlq").await;
    let letter = dlq["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["job_id"] == rejected.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("not in the dead letters: {dlq}"));
    assert_eq!(letter["error"], "the payload can never work");

    // The checkpoint of attempt 1 reaches attempt 2.
    let resume = api.create(&job("resume", "resume", json!({}), 3)).await;
    let t = api.ticket_of_run(&resume, "succeeded").await;
    let attempts = t["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{t}");
    assert_eq!(attempts[0]["error"], "interrupted halfway");
    assert_eq!(attempts[1]["status"], "succeeded");
    assert_eq!(t["checkpoint"], json!({"done": 50}), "{t}");

    stop.cancel();
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_dispatch_message_is_dead_lettered_and_the_worker_stays_up() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let js = jetstream::new(async_nats::connect(&p.nats_url).await.unwrap());
    let ran = Arc::new(AtomicUsize::new(0));
    let count = ran.clone();
    let handlers = Handlers::new().queue("mixed", move |_job: Job| {
        let count = count.clone();
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    });

    // A real ticket, taken off its queue by hand, whose message then arrives mangled on the
    // worker's queue with the headers the shard sets.
    let victim = api
        .create(
            &json!({"tenant": "acme", "name": "victim", "schedule": {"delay": "0s"},
                    "target": {"type": "queue", "queue": "held"}}),
        )
        .await;
    let mut hand = HandWorker::start(&p.nats_url, "held").await;
    let t = hand.next_ticket(LONG).await;
    let mut headers = HeaderMap::new();
    headers.insert(names::HDR_TICKET_ID, t.ticket_id.to_string().as_str());
    headers.insert(names::HDR_ATTEMPT, t.attempt.to_string().as_str());
    headers.insert(names::HDR_SHARD, t.shard.to_string().as_str());
    let subject = names::dispatch_subject("mixed");
    js.publish_with_headers(
        subject.clone(),
        headers,
        "{\"v\": 1, \"ticket_id\": ".into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    // And one that names nothing at all.
    js.publish(subject, "not json".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let (stop, _) = sdk_worker(&p, dir.path(), "sdk-m", handlers).await;

    let letter = wait_for("the mangled ticket to be a dead letter", LONG, || async {
        let (_, page) = api.get("/v1/dlq").await;
        page["items"]
            .as_array()?
            .iter()
            .find(|l| l["job_id"] == victim.as_str())
            .cloned()
    })
    .await
    .unwrap();
    let error = letter["error"].as_str().unwrap();
    assert!(error.starts_with("malformed ticket: "), "{letter}");
    let metric = "chronoshard_worker_malformed_tickets_total";
    wait_for("both malformed messages counted", LONG, || async {
        (api.metric_sum(metric).await == 2.0).then_some(())
    })
    .await
    .unwrap();

    // The worker is still up and runs the next real ticket.
    let next = api
        .create(
            &json!({"tenant": "acme", "name": "next", "schedule": {"delay": "0s"},
                    "target": {"type": "queue", "queue": "mixed"}}),
        )
        .await;
    api.newest_run_succeeded(&next).await;
    assert_eq!(ran.load(Ordering::SeqCst), 1, "only the real ticket ran");
    stop.cancel();
    p.stop().await.unwrap();
}

/// The reports on `chronoshard.results.>` about one ticket, in order, until its final one.
async fn reports_of(
    results: &mut async_nats::Subscriber,
    seen: &mut Vec<chronoshard_wire::TicketResult>,
    ticket_id: &str,
) -> Vec<chronoshard_wire::TicketResult> {
    use futures::StreamExt;
    let is_final = |r: &chronoshard_wire::TicketResult| {
        r.ticket_id.to_string() == ticket_id
            && matches!(
                r.kind,
                chronoshard_wire::ResultKind::Succeeded | chronoshard_wire::ResultKind::Failed
            )
    };
    while !seen.iter().any(is_final) {
        let msg = tokio::time::timeout(LONG, results.next())
            .await
            .expect("the final report arrives in time")
            .expect("subscription open");
        seen.push(serde_json::from_slice(&msg.payload).expect("a report"));
    }
    seen.iter()
        .filter(|r| r.ticket_id.to_string() == ticket_id)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_short_execution_is_reported_once_and_a_long_one_reports_its_start_first() {
    use chronoshard_wire::ResultKind::{Started, Succeeded};
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let nats = async_nats::connect(&p.nats_url).await.unwrap();
    let mut results = nats.subscribe(names::RESULT_SUBJECTS).await.unwrap();
    nats.flush().await.unwrap();
    // The long handler holds until the test has seen its run `running`.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let handlers = Handlers::new()
        .queue("quick", |_job: Job| async { Ok(()) })
        .queue("long", move |_job: Job| {
            let g = g.clone();
            async move {
                let _pass = g.acquire().await;
                Ok(())
            }
        });
    let (stop, _) = sdk_worker(&p, dir.path(), "sdk-s", handlers).await;
    let mut seen = Vec::new();

    // Within the start-report delay: one report, the final one, carrying the start.
    let quick = api.create(&job("quick", "quick", json!({}), 1)).await;
    let t = api.ticket_of_run(&quick, "succeeded").await;
    let reports = reports_of(&mut results, &mut seen, t["ticket_id"].as_str().unwrap()).await;
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(reports[0].kind, Succeeded);
    let started = reports[0]
        .started_at
        .expect("the final report carries the start");
    assert!(started <= reports[0].at, "{reports:?}");
    let a = &t["attempts"][0];
    let shown: chrono::DateTime<chrono::Utc> = a["started_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(shown.timestamp_millis(), started.timestamp_millis(), "{t}");
    assert!(a["started_at"].as_str() <= a["finished_at"].as_str(), "{t}");

    // Longer: `started` once the delay is over (the run shows `running`), then the final result
    // without a start of its own.
    let long = api.create(&job("long", "long", json!({}), 1)).await;
    let running = api.ticket_of_run(&long, "running").await;
    let shard_start = running["attempts"][0]["started_at"]
        .as_str()
        .unwrap()
        .to_string();
    gate.add_permits(1);
    let t = api.ticket_of_run(&long, "succeeded").await;
    let reports = reports_of(&mut results, &mut seen, t["ticket_id"].as_str().unwrap()).await;
    let kinds: Vec<_> = reports.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, vec![Started, Succeeded], "{reports:?}");
    assert!(
        reports.iter().all(|r| r.started_at.is_none()),
        "{reports:?}"
    );
    assert_eq!(t["attempts"][0]["started_at"], shard_start.as_str(), "{t}");

    // Longer than a third of its queue's ack wait: progress reports, each applied by the shard.
    let beat_gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = beat_gate.clone();
    let mut opts = Options::new("sdk-beat", dir.path().join("beat"));
    opts.ack_wait = std::time::Duration::from_millis(900);
    opts.handlers = Handlers::new().queue("beating", move |_job: Job| {
        let g = g.clone();
        async move {
            let _pass = g.acquire().await;
            Ok(())
        }
    });
    let client = async_nats::connect(&p.nats_url).await.unwrap();
    Worker::start(opts, client, stop.clone()).await.unwrap();
    let applied = || api.metric_sum_with("chronoshard_results_applied_total", r#"kind="progress""#);
    let before = applied().await;
    let beating = api.create(&job("beating", "beating", json!({}), 1)).await;
    wait_for("a progress report to be applied", LONG, || async {
        (applied().await > before).then_some(())
    })
    .await
    .unwrap();
    beat_gate.add_permits(1);
    let t = api.ticket_of_run(&beating, "succeeded").await;
    let reports = reports_of(&mut results, &mut seen, t["ticket_id"].as_str().unwrap()).await;
    assert!(
        reports
            .iter()
            .any(|r| r.kind == chronoshard_wire::ResultKind::Progress),
        "{reports:?}"
    );

    stop.cancel();
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_runs_no_more_than_its_concurrency_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    // Handlers hold until the test has seen the queue full.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (n, pk, g) = (now.clone(), peak.clone(), gate.clone());
    let handlers = Handlers::new().queue_with(
        "narrow",
        move |_job: Job| {
            let (n, pk, g) = (n.clone(), pk.clone(), g.clone());
            async move {
                let running = n.fetch_add(1, Ordering::SeqCst) + 1;
                pk.fetch_max(running, Ordering::SeqCst);
                let _pass = g.acquire().await;
                n.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        },
        QueueLimits {
            concurrency: 2,
            rate_per_second: None,
        },
    );
    let (stop, _) = sdk_worker(&p, dir.path(), "sdk-n", handlers).await;
    let mut jobs = Vec::new();
    for i in 0..8 {
        jobs.push(
            api.create(&job(&format!("narrow-{i}"), "narrow", json!({}), 1))
                .await,
        );
    }
    wait_for("two tickets running", LONG, || async {
        (now.load(Ordering::SeqCst) == 2).then_some(())
    })
    .await
    .unwrap();
    gate.add_permits(100);
    for j in &jobs {
        api.newest_run_succeeded(j).await;
    }
    assert_eq!(peak.load(Ordering::SeqCst), 2, "never more than 2 at once");
    stop.cancel();
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_drained_through_the_api_finishes_its_ticket_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let handlers = Handlers::new().queue("slow", move |_job: Job| {
        let g = g.clone();
        async move {
            let _pass = g.acquire().await;
            Ok(())
        }
    });
    let (_stop, task) = sdk_worker(&p, dir.path(), "sdk-d", handlers).await;
    let listed = wait_for("the worker to be listed", LONG, || async {
        let (_, list) = api.get("/v1/workers").await;
        list["workers"]
            .as_array()?
            .iter()
            .find(|w| w["worker_id"] == "sdk-d")
            .cloned()
    })
    .await
    .unwrap();
    assert_eq!(listed["queues"], json!(["slow"]), "{listed}");

    let slow = api.create(&job("slow", "slow", json!({}), 1)).await;
    wait_for("the ticket to run", LONG, || async {
        let run = api.past_runs(&slow).await.into_iter().next()?;
        (run["status"] == "running").then_some(())
    })
    .await
    .unwrap();
    let (code, reply) = api.post("/v1/workers/sdk-d/drain", &json!({})).await;
    assert_eq!(code, 202, "{reply}");
    assert_eq!(
        reply,
        json!({"worker_id": "sdk-d", "draining": true, "in_flight": 1})
    );
    // Draining, it takes nothing new: a ticket due now waits in its queue.
    let waiting = api.create(&job("waiting", "slow", json!({}), 1)).await;
    gate.add_permits(10);
    api.newest_run_succeeded(&slow).await;
    tokio::time::timeout(LONG, task)
        .await
        .expect("the drained worker stops")
        .unwrap();
    let (_, list) = api.get("/v1/workers").await;
    assert!(
        !list.to_string().contains("sdk-d"),
        "a stopped worker leaves the list: {list}"
    );
    // Its ticket is published and waits for a worker of the queue.
    wait_for("the waiting ticket to be dispatched", LONG, || async {
        let run = api.past_runs(&waiting).await.into_iter().next()?;
        (run["status"] == "dispatched").then_some(())
    })
    .await
    .unwrap();

    let (code, problem) = api.post("/v1/workers/nobody/drain", &json!({})).await;
    assert_eq!((code, problem["code"].as_str()), (404, Some("not_found")));
    let (code, _) = api.post("/v1/workers/not.valid/drain", &json!({})).await;
    assert_eq!(code, 404);
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_result_lost_in_a_crash_is_sent_at_restart_and_a_result_sent_twice_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let job_id = api
        .create(
            &json!({"tenant": "acme", "name": "crashed", "schedule": {"delay": "0s"},
                    "target": {"type": "queue", "queue": "journalled"}}),
        )
        .await;
    // A worker took the ticket, started it, finished it and journalled the outcome, then died
    // before its result was stored.
    let mut hand = HandWorker::start(&p.nats_url, "journalled").await;
    let t = hand.next_ticket(LONG).await;
    hand.report(&t, chronoshard_wire::ResultKind::Started, None)
        .await;
    {
        let journal =
            chronoshard_worker::journal::Journal::open(&dir.path().join("sdk-j.journal")).unwrap();
        assert_eq!(
            journal.begin(&t).unwrap(),
            chronoshard_worker::journal::Seen::New
        );
        let outcome = chronoshard_worker::Outcome {
            output: Some("done before the crash".into()),
            ..chronoshard_worker::Outcome::succeeded()
        };
        journal.finish(&t, &outcome).unwrap();
    }
    // Restarted (any queue), it sends what its journal holds.
    let handlers = Handlers::new().queue("other", |_job: Job| async move { Ok(()) });
    let (stop, _) = sdk_worker(&p, dir.path(), "sdk-j", handlers).await;
    let ticket = api.ticket_of_run(&job_id, "succeeded").await;
    assert_eq!(ticket["attempts"][0]["output"], "done before the crash");
    assert_eq!(ticket["attempts"][0]["worker"], "sdk-j");

    // The same result again, and a contradicting one, under ids JetStream does not drop: the
    // run has its outcome already, and neither changes it.
    let js = jetstream::new(async_nats::connect(&p.nats_url).await.unwrap());
    for kind in ["succeeded", "failed"] {
        let copy = json!({"v": 1, "ticket_id": t.ticket_id, "attempt": 1, "shard": t.shard,
            "kind": kind, "worker": "impostor", "at": "2026-11-29T00:00:00Z", "error": "late"});
        js.publish(names::result_subject(t.shard), copy.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    // A marker result on the same subject, applied after the copies, says they were read.
    let marker = api
        .create(
            &json!({"tenant": "acme", "name": "marker", "schedule": {"delay": "0s"},
                    "target": {"type": "queue", "queue": "journalled"}}),
        )
        .await;
    let m = hand.next_ticket(LONG).await;
    assert_eq!(m.shard, t.shard, "one tenant, one shard");
    hand.report(&m, chronoshard_wire::ResultKind::Succeeded, None)
        .await;
    api.newest_run_succeeded(&marker).await;
    let again = api.ticket_of_run(&job_id, "succeeded").await;
    assert_eq!(again, ticket, "the copies changed nothing");
    stop.cancel();
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_starts_no_more_tickets_per_second_than_its_rate() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let starts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = starts.clone();
    let handlers = Handlers::new().queue_with(
        "metered",
        move |_job: Job| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push(std::time::Instant::now());
                Ok(())
            }
        },
        QueueLimits {
            concurrency: 64,
            rate_per_second: Some(5.0),
        },
    );
    let mut jobs = Vec::new();
    for i in 0..10 {
        jobs.push(
            api.create(&job(&format!("metered-{i}"), "metered", json!({}), 1))
                .await,
        );
    }
    // All ten wait in the queue before the worker starts, so only the rate spaces them.
    for j in &jobs {
        wait_for("the ticket to be dispatched", LONG, || async {
            let run = api.past_runs(j).await.into_iter().next()?;
            (run["status"] == "dispatched").then_some(())
        })
        .await
        .unwrap();
    }
    let (stop, _) = sdk_worker(&p, dir.path(), "sdk-r", handlers).await;
    for j in &jobs {
        api.newest_run_succeeded(j).await;
    }
    let starts = starts.lock().unwrap().clone();
    assert_eq!(starts.len(), 10);
    // A bucket of 5 (one second's worth) then one every 200 ms: the tenth starts at least
    // 5 × 200 ms after the first. Slowness only makes it later.
    let spread = *starts.iter().max().unwrap() - *starts.iter().min().unwrap();
    assert!(
        spread >= std::time::Duration::from_millis(950),
        "10 starts at 5/s took only {spread:?}"
    );
    stop.cancel();
    p.stop().await.unwrap();
}

/// A workflow whose steps are SDK handlers: what a handler sets as its output reaches the step
/// after it in `upstream`, as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handlers_output_reaches_the_next_workflow_step() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let got = Arc::new(std::sync::Mutex::new(None));
    let seen = got.clone();
    let handlers = Handlers::new()
        .job_type("steps", "count", |job: Job| async move {
            job.set_output(json!({"rows": 7}).to_string());
            Ok(())
        })
        .job_type("steps", "sum", move |job: Job| {
            let seen = seen.clone();
            async move {
                *seen.lock().unwrap() = Some(job.payload().clone());
                Ok(())
            }
        });
    let (stop, task) = sdk_worker(&p, &dir.path().join("w"), "sdk-1", handlers).await;
    let step = |name: &str, after: &[&str]| {
        json!({"name": name, "target": {"type": "queue", "queue": "steps", "job_type": name},
               "after": after})
    };
    let (status, w) = api
        .post(
            "/v1/workflows",
            &json!({"tenant": "acme", "name": "sdk", "schedule": {"delay": "0s"},
                    "steps": [step("count", &[]), step("sum", &["count"])]}),
        )
        .await;
    assert_eq!(status, 201, "{w}");
    let payload = wait_for("the second step to run", LONG, || async {
        got.lock().unwrap().clone()
    })
    .await
    .unwrap();
    assert_eq!(payload, json!({"upstream": {"count": {"rows": 7}}}));
    stop.cancel();
    task.await.unwrap();
    p.stop().await.unwrap();
}
