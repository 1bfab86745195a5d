//! Workflows end to end on a dev platform, with the test as the worker (`HandWorker`): steps run
//! in the order their `after` edges give, branches in parallel, outputs reach the steps after
//! them; a step that dies skips what depends on it while other branches finish, `fail_fast`
//! cancels them, and a retry reruns the run from its failed step. Bad definitions get a 400 that
//! names the step. The catch-up policies apply to whole runs.

use std::collections::{BTreeSet, HashMap};

use crate::common::{worker::HandWorker, *};
use chrono::{DateTime, Utc};
use chronoshard_wire::{ResultKind, Ticket};
use serde_json::{json, Value};

const QUEUE: &str = "etl";

fn step(name: &str, after: &[&str]) -> Value {
    json!({"name": name, "target": {"type": "queue", "queue": QUEUE, "job_type": name},
           "payload": {"step": name}, "after": after})
}

/// A workflow that runs only when triggered (its cron falls once a year).
async fn create(api: &Api, name: &str, steps: Vec<Value>, extra: Value) -> String {
    let mut body = json!({"tenant": "acme", "name": name, "schedule": {"cron": "0 0 1 1 *"},
                          "steps": steps});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, w) = api.post("/v1/workflows", &body).await;
    assert_eq!(status, 201, "{w}");
    w["id"].as_str().unwrap().to_string()
}

async fn trigger(api: &Api, id: &str) {
    let (status, run) = api
        .post(&format!("/v1/workflows/{id}/trigger"), &json!({}))
        .await;
    assert_eq!(status, 202, "{run}");
}

/// The step a ticket is for.
fn name(t: &Ticket) -> String {
    t.payload["step"].as_str().unwrap().to_string()
}

/// The workflow's newest run, once `done` holds for it.
async fn run_when(api: &Api, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    wait_for(what, LONG, || async {
        let (status, page) = api.get(&format!("/v1/workflows/{id}/runs")).await;
        assert_eq!(status, 200, "{page}");
        page["runs"].get(0).filter(|r| done(r)).cloned()
    })
    .await
    .unwrap()
}

fn step_of<'a>(run: &'a Value, name: &str) -> &'a Value {
    run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no step {name} in {run}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_etl_workflow_runs_its_steps_in_order_and_hands_outputs_on() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let mut hand = HandWorker::start(&p.nats_url, QUEUE).await;
    let id = create(
        &api,
        "nightly-etl",
        vec![
            step("extract", &[]),
            step("validate", &[]),
            step("clean", &["extract", "validate"]),
            step("transform", &["clean"]),
            step("load", &["transform"]),
            step("report", &["load"]),
            step("archive", &["load"]),
        ],
        json!({}),
    )
    .await;
    trigger(&api, &id).await;
    // The two steps that wait for nothing come first, together.
    let a = hand.next_ticket(LONG).await;
    let b = hand.next_ticket(LONG).await;
    let firsts: BTreeSet<String> = [name(&a), name(&b)].into();
    assert_eq!(firsts, ["extract".into(), "validate".into()].into());
    let by: HashMap<String, Ticket> = [(name(&a), a), (name(&b), b)].into();
    hand.succeed_with(&by["extract"], "{\"rows\": 42}").await;
    // With extract done, clean still waits for validate.
    let run = run_when(&api, &id, "extract's success applied", |r| {
        step_of(r, "extract")["status"] == "succeeded"
    })
    .await;
    assert_eq!(step_of(&run, "clean")["status"], "waiting", "{run}");
    assert_eq!(step_of(&run, "report")["status"], "waiting", "{run}");
    hand.succeed_with(&by["validate"], "checked").await;
    let clean = hand.next_ticket(LONG).await;
    assert_eq!(name(&clean), "clean");
    assert_eq!(
        clean.payload,
        json!({"step": "clean", "upstream": {"extract": {"rows": 42}, "validate": "checked"}})
    );
    assert_eq!(clean.attempt, 1);
    let mut last = clean;
    for next in ["transform", "load"] {
        hand.report(&last, ResultKind::Succeeded, None).await;
        let t = hand.next_ticket(LONG).await;
        assert_eq!(name(&t), next);
        last = t;
    }
    hand.succeed_with(&last, "loaded").await;
    // report and archive run in parallel: both arrive before either is reported.
    let x = hand.next_ticket(LONG).await;
    let y = hand.next_ticket(LONG).await;
    let ends: BTreeSet<String> = [name(&x), name(&y)].into();
    assert_eq!(ends, ["archive".into(), "report".into()].into());
    assert_eq!(x.payload["upstream"], json!({"load": "loaded"}));
    hand.report(&x, ResultKind::Succeeded, None).await;
    hand.report(&y, ResultKind::Succeeded, None).await;
    let run = run_when(&api, &id, "the run to succeed", |r| {
        r["status"] == "succeeded"
    })
    .await;
    let steps = run["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 7);
    for s in steps {
        assert_eq!(s["status"], "succeeded", "{s}");
        assert_eq!(s["attempts"].as_array().unwrap().len(), 1, "{s}");
        assert!(s["finished_at"].is_string(), "{s}");
    }
    // The run reads the same by its id, which is its first step's ticket id.
    let run_id = run["run_id"].as_str().unwrap();
    assert_eq!(run_id, steps[0]["ticket_id"].as_str().unwrap());
    let (status, one) = api.get(&format!("/v1/workflow-runs/{run_id}")).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one, run);
    assert_eq!(
        api.metric_sum_with("chronoshard_workflow_steps_total", "state=\"released\"")
            .await,
        5.0
    );
    assert_eq!(
        api.metric_sum_with("chronoshard_workflow_runs_total", "state=\"succeeded\"")
            .await,
        1.0
    );
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_step_skips_what_follows_other_branches_finish_and_a_retry_reruns_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let mut hand = HandWorker::start(&p.nats_url, QUEUE).await;
    // a → b → c, and d on its own.
    let id = create(
        &api,
        "branches",
        vec![
            step("a", &[]),
            step("b", &["a"]),
            step("c", &["b"]),
            step("d", &[]),
        ],
        json!({}),
    )
    .await;
    trigger(&api, &id).await;
    let first = hand.next_ticket(LONG).await;
    let second = hand.next_ticket(LONG).await;
    let by: HashMap<String, Ticket> = [(name(&first), first), (name(&second), second)].into();
    // a fails for good (one attempt); d is still running.
    hand.report(&by["d"], ResultKind::Started, None).await;
    hand.report(&by["a"], ResultKind::Failed, Some("source down"))
        .await;
    let run = run_when(&api, &id, "b and c skipped", |r| {
        step_of(r, "c")["status"] == "skipped"
    })
    .await;
    assert_eq!(step_of(&run, "a")["status"], "dead", "{run}");
    for s in ["b", "c"] {
        assert_eq!(
            step_of(&run, s)["reason"],
            "upstream step \"a\" ended dead",
            "{run}"
        );
        assert!(step_of(&run, s)["attempts"].as_array().unwrap().is_empty());
    }
    assert_eq!(step_of(&run, "d")["status"], "running", "{run}");
    assert_ne!(run["status"], "dead", "d still runs: {run}");
    hand.report(&by["d"], ResultKind::Succeeded, None).await;
    let run = run_when(&api, &id, "the run to end dead", |r| r["status"] == "dead").await;
    // Retried from its failed step: a runs again under the same ticket, then b and c; d not.
    let run_id = run["run_id"].as_str().unwrap().to_string();
    let (status, retried) = api
        .post(&format!("/v1/workflow-runs/{run_id}/retry"), &json!({}))
        .await;
    assert_eq!(status, 200, "{retried}");
    assert_eq!(step_of(&retried, "b")["status"], "waiting", "{retried}");
    let again = hand.next_ticket(LONG).await;
    assert_eq!((name(&again), again.attempt), ("a".into(), 2));
    assert_eq!(again.ticket_id, by["a"].ticket_id);
    hand.report(&again, ResultKind::Succeeded, None).await;
    for next in ["b", "c"] {
        let t = hand.next_ticket(LONG).await;
        assert_eq!(name(&t), next);
        hand.report(&t, ResultKind::Succeeded, None).await;
    }
    let run = run_when(&api, &id, "the retried run to succeed", |r| {
        r["status"] == "succeeded"
    })
    .await;
    assert_eq!(run["run_id"], run_id.as_str());
    assert_eq!(step_of(&run, "d")["attempts"].as_array().unwrap().len(), 1);
    // A run that succeeded has nothing to retry.
    let (status, problem) = api
        .post(&format!("/v1/workflow-runs/{run_id}/retry"), &json!({}))
        .await;
    assert_eq!(status, 409, "{problem}");
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fail_fast_cancels_the_other_branches_and_skips_what_waits() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let mut hand = HandWorker::start(&p.nats_url, QUEUE).await;
    let mut asked = hand.attempt_requests().await;
    let id = create(
        &api,
        "fast",
        vec![step("a", &[]), step("b", &[]), step("c", &["b"])],
        json!({"fail_fast": true}),
    )
    .await;
    trigger(&api, &id).await;
    let first = hand.next_ticket(LONG).await;
    let second = hand.next_ticket(LONG).await;
    let by: HashMap<String, Ticket> = [(name(&first), first), (name(&second), second)].into();
    hand.report(&by["b"], ResultKind::Started, None).await;
    run_when(&api, &id, "b's start applied", |r| {
        step_of(r, "b")["status"] == "running"
    })
    .await;
    hand.report(&by["a"], ResultKind::Failed, Some("boom"))
        .await;
    // The worker running b is told to stop it.
    let (req, _) = asked.next(LONG).await;
    match req {
        chronoshard_wire::rpc::AttemptRequest::Cancel { ticket_id, .. } => {
            assert_eq!(ticket_id, by["b"].ticket_id)
        }
        other => panic!("{other:?}"),
    }
    let run = run_when(&api, &id, "the run to end", |r| r["status"] == "dead").await;
    assert_eq!(step_of(&run, "b")["status"], "cancelled", "{run}");
    assert_eq!(step_of(&run, "c")["status"], "skipped", "{run}");
    assert!(
        step_of(&run, "c")["reason"]
            .as_str()
            .unwrap()
            .contains("failed fast"),
        "{run}"
    );
    // b's late success changes nothing.
    hand.report(&by["b"], ResultKind::Succeeded, None).await;
    let (_, page) = api.get(&format!("/v1/workflows/{id}/runs")).await;
    assert_eq!(page["runs"][0]["status"], "dead", "{page}");
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_definitions_get_a_400_naming_the_step_and_jobs_stay_apart() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let bad = |steps: Vec<Value>| json!({"tenant": "acme", "name": "bad", "schedule": {"every": "1h"}, "steps": steps});
    for (steps, field, words) in [
        (
            vec![step("a", &["c"]), step("b", &["a"]), step("c", &["b"])],
            "steps[",
            "closes the cycle",
        ),
        (
            vec![step("a", &["zz"])],
            "steps[0].after",
            "unknown step \"zz\"",
        ),
        (
            vec![step("a", &[]), step("a", &[])],
            "steps[1].name",
            "duplicate",
        ),
        (vec![], "steps", "1-100"),
    ] {
        let (status, problem) = api.post("/v1/workflows", &bad(steps)).await;
        assert_eq!(status, 400, "{problem}");
        assert!(
            problem["field"].as_str().unwrap().starts_with(field),
            "{problem}"
        );
        assert!(
            problem["detail"].as_str().unwrap().contains(words),
            "{problem}"
        );
    }
    let id = create(&api, "one", vec![step("a", &[])], json!({})).await;
    // A workflow is not a job, and a job's body cannot carry steps.
    let (status, _) = api.get(&format!("/v1/jobs/{id}")).await;
    assert_eq!(status, 404);
    let (_, jobs) = api.get("/v1/jobs?tenant=acme").await;
    assert!(jobs["jobs"].as_array().unwrap().is_empty(), "{jobs}");
    let (_, listed) = api.get("/v1/workflows?tenant=acme").await;
    assert_eq!(listed["workflows"][0]["id"], id.as_str(), "{listed}");
    let job = api
        .create(
            &json!({"tenant": "acme", "name": "j", "schedule": {"cron": "0 0 1 1 *"},
                        "target": {"type": "queue", "queue": "other"}}),
        )
        .await;
    let (status, _) = api.get(&format!("/v1/workflows/{job}")).await;
    assert_eq!(status, 404);
    let (status, problem) = api
        .post(
            "/v1/jobs",
            &json!({"tenant": "acme", "name": "j", "schedule": {"every": "1h"},
                    "target": {"type": "queue", "queue": QUEUE},
                    "workflow": {"steps": [step("a", &[])]}}),
        )
        .await;
    assert_eq!(status, 400, "{problem}");
    assert_eq!(problem["field"], "workflow", "{problem}");
    // Changing the steps while a run is in progress is refused; after it ended it works.
    let mut hand = HandWorker::start(&p.nats_url, QUEUE).await;
    trigger(&api, &id).await;
    let t = hand.next_ticket(LONG).await;
    let patch = json!({"steps": [step("a", &[]), step("b", &["a"])]});
    let (status, _, problem) = api
        .send(
            reqwest::Method::PATCH,
            &format!("/v1/workflows/{id}"),
            Some(&patch.to_string()),
        )
        .await;
    assert_eq!(status, 409, "{problem}");
    hand.report(&t, ResultKind::Succeeded, None).await;
    run_when(&api, &id, "the run to succeed", |r| {
        r["status"] == "succeeded"
    })
    .await;
    let (status, _, changed) = api
        .send(
            reqwest::Method::PATCH,
            &format!("/v1/workflows/{id}"),
            Some(&patch.to_string()),
        )
        .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["steps"].as_array().unwrap().len(), 2, "{changed}");
    p.stop().await.unwrap();
}

/// A client of the API at `url` with a new token for `tenant`.
async fn token_for(admin: &Api, url: &str, tenant: &str) -> Api {
    let (status, made) = admin.post("/v1/tokens", &json!({"tenant": tenant})).await;
    assert_eq!(status, 201, "{made}");
    Api::at(url, made["token"].as_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_token_reaches_its_own_workflows_and_runs_only() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let admin = Api::new(&p);
    let mut hand = HandWorker::start(&p.nats_url, QUEUE).await;
    let id = create(&admin, "mine", vec![step("a", &[])], json!({})).await;
    trigger(&admin, &id).await;
    let t = hand.next_ticket(LONG).await;
    hand.report(&t, ResultKind::Failed, Some("no")).await;
    let run = run_when(&admin, &id, "the run to end dead", |r| {
        r["status"] == "dead"
    })
    .await;
    let run_id = run["run_id"].as_str().unwrap().to_string();
    let (acme, other) = (
        token_for(&admin, &p.url, "acme").await,
        token_for(&admin, &p.url, "other").await,
    );
    // Its own tenant's: read, list, runs, one run, retry.
    for path in [
        format!("/v1/workflows/{id}"),
        format!("/v1/workflows/{id}/runs"),
        format!("/v1/workflow-runs/{run_id}"),
        "/v1/workflows?tenant=acme".to_string(),
    ] {
        let (status, body) = acme.get(&path).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (status, body) = acme
        .post(&format!("/v1/workflow-runs/{run_id}/retry"), &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    // Another tenant's token is told nothing exists, and cannot create in acme.
    for path in [
        format!("/v1/workflows/{id}"),
        format!("/v1/workflows/{id}/runs"),
        format!("/v1/workflow-runs/{run_id}"),
    ] {
        let (status, body) = other.get(&path).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (status, _) = other
        .post(&format!("/v1/workflow-runs/{run_id}/retry"), &json!({}))
        .await;
    assert_eq!(status, 404);
    let (_, listed) = other.get("/v1/workflows").await;
    assert!(
        listed["workflows"].as_array().unwrap().is_empty(),
        "{listed}"
    );
    let body = json!({"tenant": "acme", "name": "x", "schedule": {"every": "1h"},
                      "steps": [step("a", &[])]});
    let (status, _) = other.post("/v1/workflows", &body).await;
    assert_eq!(status, 403);
    p.stop().await.unwrap();
}

/// Overlap applies to whole runs: while a run's second step still runs, the runs that fall due
/// are recorded skipped (no run id, no steps); once it ended, the next one starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlap_forbid_skips_runs_due_while_a_run_is_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let mut hand = HandWorker::start(&p.nats_url, QUEUE).await;
    let body = json!({"tenant": "acme", "name": "forbid", "schedule": {"every": "1s"},
                      "overlap": "forbid", "steps": [step("a", &[]), step("b", &["a"])]});
    let (status, w) = api.post("/v1/workflows", &body).await;
    assert_eq!(status, 201, "{w}");
    let id = w["id"].as_str().unwrap().to_string();
    let a = hand.next_ticket(LONG).await;
    hand.report(&a, ResultKind::Succeeded, None).await;
    let b = hand.next_ticket(LONG).await;
    assert_eq!((name(&b), b.scheduled_at), ("b".into(), a.scheduled_at));
    hand.report(&b, ResultKind::Started, None).await;
    // b holds the run open: the next occurrences are skipped, whole.
    let skipped = wait_for("two runs skipped", LONG, || async {
        let (_, page) = api.get(&format!("/v1/workflows/{id}/runs")).await;
        let skipped: Vec<Value> = page["runs"]
            .as_array()?
            .iter()
            .filter(|r| r["status"] == "skipped")
            .cloned()
            .collect();
        (skipped.len() >= 2).then_some(skipped)
    })
    .await
    .unwrap();
    for r in &skipped {
        assert_eq!(
            r["reason"], "overlap: the previous run is still active",
            "{r}"
        );
        assert!(r["run_id"].is_null(), "{r}");
        assert!(r["steps"].as_array().unwrap().is_empty(), "{r}");
    }
    hand.report(&b, ResultKind::Succeeded, None).await;
    // The run ended; a later occurrence starts a run of its own.
    let next = hand.next_ticket(LONG).await;
    assert_eq!(name(&next), "a");
    assert!(next.scheduled_at > a.scheduled_at);
    let first = a
        .scheduled_at
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let (_, page) = api.get(&format!("/v1/workflows/{id}/runs?limit=500")).await;
    let runs = page["runs"].as_array().unwrap();
    let started: Vec<&Value> = runs.iter().filter(|r| r["run_id"].is_string()).collect();
    assert!(
        runs.iter()
            .any(|r| r["scheduled_at"] == first.as_str() && r["status"] == "succeeded"),
        "{page}"
    );
    assert!(started.len() >= 2, "{page}");
    p.stop().await.unwrap();
}

/// Two every-second workflows, one per catch-up policy, through a 6 s downtime of the whole
/// platform: the policy applies to whole runs. An occurrence up to 2 s late fires whatever the
/// policy, so the test judges only those due more than 2 s before the platform was started again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn catch_up_latest_and_skip_apply_to_whole_runs() {
    let dir = tempfile::tempdir().unwrap();
    let sink = HttpSink::start().await.unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let mut flows = Vec::new();
    for policy in ["latest", "skip"] {
        let http = |s: &str| json!({"type": "http", "url": sink.url(&format!("/{policy}/{s}"))});
        let body = json!({"tenant": format!("catchup-{policy}"), "name": policy,
                          "schedule": {"every": "1s"}, "catchup": {"policy": policy, "window": "1h"},
                          "steps": [{"name": "a", "target": http("a")},
                                    {"name": "b", "target": http("b"), "after": ["a"]}]});
        let (status, w) = api.post("/v1/workflows", &body).await;
        assert_eq!(status, 201, "{w}");
        flows.push((policy, w["id"].as_str().unwrap().to_string()));
    }
    wait_for("both workflows to run to their last step", LONG, || async {
        let paths: BTreeSet<String> = sink.requests().into_iter().map(|r| r.path).collect();
        (paths.contains("/latest/b") && paths.contains("/skip/b")).then_some(())
    })
    .await
    .unwrap();
    let (p, down) = Downtime::of(p, dir.path()).await;
    let (down_at, late_before, up_at) = (down.down_at, down.late_before, down.up_at);
    let api = Api::new(&p);
    let at = |r: &Value, f: &str| -> DateTime<Utc> { r[f].as_str().unwrap().parse().unwrap() };
    let late = |t: &DateTime<Utc>| down.late(t);
    for (policy, id) in &flows {
        let runs = wait_for("a run due after the restart to succeed", LONG, || async {
            let (_, page) = api.get(&format!("/v1/workflows/{id}/runs?limit=500")).await;
            let runs = page["runs"].as_array()?.clone();
            runs.iter()
                .any(|r| r["status"] == "succeeded" && at(r, "scheduled_at") > up_at)
                .then_some(runs)
        })
        .await
        .unwrap();
        let not_fired = if *policy == "latest" {
            "missed"
        } else {
            "skipped"
        };
        let end_of = |r: &Value| match r["range_end"].is_string() {
            true => at(r, "range_end"),
            false => at(r, "scheduled_at"),
        };
        let row = runs
            .iter()
            .find(|r| {
                r["status"] == not_fired
                    && at(r, "scheduled_at") < late_before
                    && end_of(r) > down_at
            })
            .unwrap_or_else(|| panic!("{policy}: no {not_fired} row in {runs:?}"));
        assert!(row["count"].as_u64().unwrap_or(1) >= 3, "{policy}: {row}");
        assert!(
            row["run_id"].is_null() && row["steps"] == json!([]),
            "{row}"
        );
        // No step of a run recorded as not fired was called; a late run that fired ran whole.
        let called = |step: &str| -> Vec<DateTime<Utc>> {
            let path = format!("/{policy}/{step}");
            let mut v: Vec<DateTime<Utc>> = sink
                .requests()
                .into_iter()
                .filter(|r| r.path == path)
                .map(|r| r.headers["x-chronoshard-scheduled-at"].parse().unwrap())
                .filter(late)
                .collect();
            v.sort();
            v
        };
        let a = called("a");
        let end = end_of(row);
        assert!(
            a.iter().all(|t| *t < at(row, "scheduled_at") || *t > end),
            "{policy}: {a:?} within {row}"
        );
        if *policy == "latest" {
            assert!(a.len() <= 1, "latest started {a:?}");
            assert!(a.iter().all(|t| *t > end), "{a:?} {row}");
            wait_for(
                "a late run that started to reach its last step",
                LONG,
                || async { (called("b") == a).then_some(()) },
            )
            .await
            .unwrap();
        } else {
            assert!(a.is_empty() && called("b").is_empty(), "skip started {a:?}");
        }
    }
    p.stop().await.unwrap();
}
