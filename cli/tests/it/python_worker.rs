//! The Python example worker (examples/python-worker/worker.py, written from docs/protocol.md
//! alone) as a process against a dev platform: a success, a failure retried into the dead
//! letters, a checkpoint carried to the next attempt, malformed dispatch messages reported and
//! dead-lettered, a redelivery of an attempt another worker started reported `lost:`, and a clean
//! stop on SIGTERM that releases unfinished work to the next worker. Checked through the REST API.
//!
//! Needs python3 with nats-py. scripts/test.sh provides it (into .tools/python, passed on as
//! CHRONOSHARD_PYTHONPATH); without it this test fails and says so.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::common::{worker::HandWorker, *};
use async_nats::{
    jetstream::{self, consumer::pull, AckKind},
    HeaderMap,
};
use chronoshard::dev::Platform;
use chronoshard_wire::{names, ResultKind, Ticket};
use futures::StreamExt;
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use serde_json::{json, Value};

const WORKER_PY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/python-worker/worker.py"
);

const HOW_TO_INSTALL: &str =
    "run scripts/test.sh (it installs nats-py into .tools/python and sets \
     CHRONOSHARD_PYTHONPATH), or `pip install -r examples/python-worker/requirements.txt`";

/// `python3`, with PYTHONPATH from CHRONOSHARD_PYTHONPATH when that is set.
fn python3() -> Command {
    let mut cmd = Command::new("python3");
    if let Some(path) = std::env::var_os("CHRONOSHARD_PYTHONPATH").filter(|p| !p.is_empty()) {
        cmd.env("PYTHONPATH", path);
    }
    cmd
}

/// Fails the test, saying what to do, when python3 or nats-py is missing.
fn require_python_with_nats() {
    match python3().args(["-c", "import nats"]).output() {
        Err(e) => panic!(
            "python3 cannot be run ({e}); this test needs python3 with nats-py: {HOW_TO_INSTALL}"
        ),
        Ok(out) if !out.status.success() => panic!(
            "python3 cannot import nats-py ({}); {HOW_TO_INSTALL}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Ok(_) => {}
    }
}

/// The worker process; killed when dropped.
struct PythonWorker {
    child: Child,
    log: PathBuf,
}

impl PythonWorker {
    fn start(p: &Platform, dir: &Path, queue: &str, id: &str, extra: &[&str]) -> PythonWorker {
        let log = dir.join(format!("{id}.log"));
        let child = python3()
            .arg(WORKER_PY)
            .args(["--nats", &p.nats_url, "--queue", queue, "--worker-id", id])
            .args(extra)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("python3 {WORKER_PY} does not start: {e}"));
        PythonWorker { child, log }
    }

    fn signal(&self, s: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), s).unwrap();
    }

    /// Waits (up to 30 s) for the process to exit and returns its exit code.
    async fn exited(&mut self) -> Option<i32> {
        let status = wait_for("the python worker to exit", Duration::from_secs(30), || {
            let exited = self.child.try_wait().unwrap();
            async move { exited }
        })
        .await;
        match status {
            Ok(status) => status.code(),
            Err(e) => panic!("{e}{}", self.log()),
        }
    }

    /// What the worker logged so far, for assertion messages.
    fn log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("({e})"));
        format!("\n--- {} ---\n{text}--- end of log ---", self.log.display())
    }
}

impl Drop for PythonWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates a job on queue `held` and takes its ticket off the queue by hand.
async fn held_ticket(api: &Api, hand: &mut HandWorker, name: &str) -> (String, Ticket) {
    let job = api
        .create(
            &json!({"tenant": "acme", "name": name, "schedule": {"delay": "0s"},
                        "target": {"type": "queue", "queue": "held"}}),
        )
        .await;
    let ticket = hand.next_ticket(LONG).await;
    assert_eq!(ticket.job_id.to_string(), job);
    (job, ticket)
}

/// Publishes `body` on the worker's queue with the headers the shard sets on `t`'s message.
async fn publish_as(js: &jetstream::Context, t: &Ticket, body: String) {
    let mut headers = HeaderMap::new();
    headers.insert(names::HDR_TICKET_ID, t.ticket_id.to_string().as_str());
    headers.insert(names::HDR_ATTEMPT, t.attempt.to_string().as_str());
    headers.insert(names::HDR_SHARD, t.shard.to_string().as_str());
    js.publish_with_headers(names::dispatch_subject("py"), headers, body.into())
        .await
        .unwrap()
        .await
        .unwrap();
}

fn py_job(name: &str, payload: Value, max_attempts: u32) -> Value {
    json!({"tenant": "acme", "name": name, "schedule": {"delay": "0s"},
           "target": {"type": "queue", "queue": "py"}, "payload": payload,
           "retry": {"max_attempts": max_attempts, "backoff": "fixed", "initial": "100ms"}})
}

/// Waits for a run of the job with this status and returns its ticket as `GET /v1/tickets/{id}`
/// shows it; on a timeout the test fails with the runs seen and the worker's log.
async fn ticket_of_run(api: &Api, w: &PythonWorker, job: &str, status: &str) -> Value {
    let found = wait_for(&format!("a {status} run of {job}"), LONG, || async {
        api.past_runs(job)
            .await
            .into_iter()
            .find(|r| r["status"] == status)
    })
    .await;
    let run = match found {
        Ok(run) => run,
        Err(e) => panic!("{e}; runs: {:?}{}", api.past_runs(job).await, w.log()),
    };
    let id = run["ticket_ids"][0].as_str().unwrap();
    let (code, t) = api.get(&format!("/v1/tickets/{id}")).await;
    assert_eq!(code, 200, "{t}");
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_example_worker_follows_the_protocol() {
    require_python_with_nats();
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let js = jetstream::new(async_nats::connect(&p.nats_url).await.unwrap());

    // A ticket that another worker (the hand) took off the shared consumer, started and gave
    // back unfinished, as one that died would after ack_wait: the Python worker gets delivery 2,
    // asks the shard ("Redeliveries"), reports the attempt lost, and the retry runs.
    let mut hand = HandWorker::start(&p.nats_url, "held").await;
    let shared = js
        .get_stream(names::DISPATCH_STREAM)
        .await
        .unwrap()
        .create_consumer(pull::Config {
            durable_name: Some("worker-py".into()),
            filter_subject: names::dispatch_subject("py"),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 10000,
            ..Default::default()
        })
        .await
        .unwrap();
    let ghosted = api.create(&py_job("py-ghosted", json!({}), 2)).await;
    let mut batch = shared
        .fetch()
        .max_messages(1)
        .expires(LONG)
        .messages()
        .await
        .unwrap();
    let msg = batch.next().await.expect("the ticket arrives").unwrap();
    let t: Ticket = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(t.job_id.to_string(), ghosted);
    hand.report(&t, ResultKind::Started, None).await;
    wait_for("the hand's start to be recorded", LONG, || async {
        let (_, v) = api.get(&format!("/v1/tickets/{}", t.ticket_id)).await;
        (v["attempts"][0]["worker"] == "hand").then_some(())
    })
    .await
    .unwrap();
    msg.ack_with(AckKind::Nak(None)).await.unwrap();

    // Malformed messages on the worker's queue, with the headers of real tickets taken off
    // another queue by hand (as the shard sets them): a body cut short, and a whole ticket of a
    // protocol version newer than the worker's. And one that names no ticket at all.
    let cut_short = held_ticket(&api, &mut hand, "cut-short").await;
    publish_as(&js, &cut_short.1, "{\"v\": 1, \"ticket_id\": ".into()).await;
    let newer = held_ticket(&api, &mut hand, "newer").await;
    let mut body = serde_json::to_value(&newer.1).unwrap();
    body["v"] = json!(2);
    publish_as(&js, &newer.1, body.to_string()).await;
    js.publish(names::dispatch_subject("py"), "not json".into())
        .await
        .unwrap()
        .await
        .unwrap();

    let mut w = PythonWorker::start(&p, dir.path(), "py", "py-1", &["--grace", "1"]);
    let ok = api.create(&py_job("py-ok", json!({}), 1)).await;
    let boom = api
        .create(&py_job("py-boom", json!({"fail": "boom"}), 2))
        .await;
    let resume = api
        .create(&py_job("py-resume", json!({"checkpoint_demo": true}), 2))
        .await;

    // The malformed messages: reported failed (permanent) by the worker, so dead letters.
    for (job, ticket) in [&cut_short, &newer] {
        let letter = wait_for("the malformed ticket to be a dead letter", LONG, || async {
            let (_, page) = api.get("/v1/dlq").await;
            page["items"]
                .as_array()?
                .iter()
                .find(|l| l["job_id"] == job.as_str())
                .cloned()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}{}", w.log()));
        let error = letter["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("malformed ticket: "),
            "{letter}{}",
            w.log()
        );
        let (_, t) = api.get(&format!("/v1/tickets/{}", ticket.ticket_id)).await;
        assert_eq!(t["attempts"][0]["worker"], "py-1", "{t}{}", w.log());
    }

    // A success, recorded with the worker's id.
    let t = ticket_of_run(&api, &w, &ok, "succeeded").await;
    let attempts = t["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{t}{}", w.log());
    assert_eq!(attempts[0]["status"], "succeeded", "{t}{}", w.log());
    assert_eq!(attempts[0]["worker"], "py-1", "{t}{}", w.log());

    // A failure, retried once, then a dead letter.
    let t = ticket_of_run(&api, &w, &boom, "dead").await;
    let attempts = t["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{t}{}", w.log());
    for a in attempts {
        assert_eq!(a["status"], "failed", "{t}{}", w.log());
        assert_eq!(a["error"], "boom", "{t}{}", w.log());
        assert_eq!(a["worker"], "py-1", "{t}{}", w.log());
    }

    // The checkpoint of attempt 1 reaches attempt 2, which resumes from it.
    let t = ticket_of_run(&api, &w, &resume, "succeeded").await;
    let attempts = t["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{t}{}", w.log());
    assert_eq!(
        attempts[0]["error"],
        "interrupted at step 1",
        "{t}{}",
        w.log()
    );
    assert_eq!(attempts[1]["status"], "succeeded", "{t}{}", w.log());
    assert_eq!(t["checkpoint"], json!({"step": 1}), "{t}{}", w.log());
    let output = attempts[1]["output"].as_str().unwrap_or_default();
    assert!(output.starts_with("resumed at step 2"), "{t}{}", w.log());

    // The redelivered attempt another worker started: reported lost, then run again.
    let t = ticket_of_run(&api, &w, &ghosted, "succeeded").await;
    let attempts = t["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{t}{}", w.log());
    let error = attempts[0]["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("lost: worker hand stopped while running this attempt"),
        "{t}{}",
        w.log()
    );
    assert_eq!(attempts[1]["status"], "succeeded", "{t}{}", w.log());
    assert_eq!(attempts[1]["worker"], "py-1", "{t}{}", w.log());

    // SIGTERM while a ticket runs: past the grace (1 s) it is released and NAKed, the worker
    // exits 0, and the next worker runs the same attempt.
    let mut drained = py_job("py-drained", json!({"sleep_ms": 4000}), 1);
    drained["timeout"] = json!("60s");
    let drained = api.create(&drained).await;
    ticket_of_run(&api, &w, &drained, "running").await;
    w.signal(Signal::SIGTERM);
    assert_eq!(w.exited().await, Some(0), "{}", w.log());
    let log = w.log();
    assert!(log.contains("resumed at step 2"), "{log}");
    assert!(log.contains("names no ticket"), "{log}");
    assert!(log.contains("released"), "{log}");
    assert!(!log.contains("Traceback"), "{log}");
    let mut next = PythonWorker::start(&p, dir.path(), "py", "py-2", &[]);
    let t = ticket_of_run(&api, &next, &drained, "succeeded").await;
    let attempts = t["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "the same attempt: {t}{}", next.log());
    assert_eq!(attempts[0]["worker"], "py-2", "{t}{}", next.log());
    next.signal(Signal::SIGTERM);
    assert_eq!(next.exited().await, Some(0), "{}", next.log());
    p.stop().await.unwrap();
}

/// The example answers a shard's questions about its attempts: `running` while it runs one,
/// and a replaced run's handler is stopped (overlap `replace`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_example_worker_answers_probes_and_stops_a_replaced_run() {
    require_python_with_nats();
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let mut w = PythonWorker::start(&p, dir.path(), "py", "py-1", &[]);
    let job = api
        .create(
            &json!({"tenant": "acme", "name": "py-replaced", "schedule": {"every": "3s"},
            "target": {"type": "queue", "queue": "py"}, "payload": {"sleep_ms": 600000},
            "overlap": "replace", "timeout": "900s"}),
        )
        .await;
    let first = ticket_of_run(&api, &w, &job, "running").await;
    let ticket_id = first["ticket_id"].as_str().unwrap().to_string();
    let client = async_nats::connect(&p.nats_url).await.unwrap();
    let ask = |op: &str| {
        let body = json!({"op": op, "ticket_id": ticket_id, "attempt": 1}).to_string();
        let client = client.clone();
        async move {
            let msg = client
                .request(names::worker_attempts_subject("py-1"), body.into())
                .await
                .expect("the python worker answers");
            let reply: Value = serde_json::from_slice(&msg.payload).unwrap();
            assert_eq!(reply["worker_id"], "py-1", "{reply}");
            reply["state"].as_str().unwrap().to_string()
        }
    };
    assert_eq!(ask("probe").await, "running", "{}", w.log());
    // The next occurrence replaces the run: the handler is stopped, long before its ten minutes.
    // The run that was running is replaced by the next one (an earlier one may have been
    // replaced before the worker took it, on a slow start).
    let cancelled = wait_for("the running run to be replaced", LONG, || async {
        let (status, t) = api.get(&format!("/v1/tickets/{ticket_id}")).await;
        assert_eq!(status, 200, "{t}");
        (t["status"] == "cancelled").then_some(t)
    })
    .await
    .unwrap();
    crate::overlap::assert_replaced(&cancelled, "py-1");
    wait_for("the replaced handler to stop", LONG, || async {
        (ask("probe").await == "unknown").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}{}", w.log()));
    let (status, body) = api.post(&format!("/v1/jobs/{job}/pause"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let log = w.log();
    assert!(log.contains("cancelled by its shard"), "{log}");
    w.signal(Signal::SIGTERM);
    assert_eq!(w.exited().await, Some(0), "{}", w.log());
    p.stop().await.unwrap();
}
