//! OpenTelemetry traces from the production roles, each a separate process exporting over
//! OTLP/HTTP (JSON) to a receiver the test runs: the spans of one ticket arrive from the control
//! plane, the shard node and the worker in the trace whose id is the ticket id, each with the
//! right parent across the processes (fire → publish → attempt → result, the executor's HTTP
//! call under the attempt), and the create request's span carries and links its job. The
//! processes are stopped cleanly before the spans are read, so what arrived is what their
//! shutdown flushed. Without an endpoint (or with the SDK disabled) nothing is exported.

use std::{collections::HashMap, time::Duration};

use crate::common;
use crate::common::{cluster::*, process::command, Api};
use chronoshard_test_util::HttpSink;
use nix::sys::signal::Signal;
use serde_json::{json, Value};

/// One span as an OTLP/JSON export carries it, with its process's `service.name`.
#[derive(Clone, Debug)]
struct Span {
    service: String,
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    attributes: HashMap<String, Value>,
    /// (trace id, span id) of each link.
    links: Vec<(String, String)>,
}

impl Span {
    /// An attribute's value as text (OTLP/JSON wraps each in `{"stringValue": …}`, `{"intValue":
    /// …}`, …).
    fn attr(&self, key: &str) -> Option<String> {
        let v = self.attributes.get(key)?.as_object()?.values().next()?;
        Some(match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// Every span the receiver got on `/v1/traces`.
fn spans(receiver: &HttpSink) -> Vec<Span> {
    let mut out = Vec::new();
    for r in receiver.requests() {
        assert_eq!(r.path, "/v1/traces", "only traces are exported");
        assert_eq!(r.headers["content-type"], "application/json");
        let body: Value = serde_json::from_slice(&r.body).expect("OTLP/JSON");
        for rs in body["resourceSpans"].as_array().unwrap() {
            let service = rs["resource"]["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["key"] == "service.name")
                .map(|a| text(&a["value"]["stringValue"]))
                .unwrap();
            for ss in rs["scopeSpans"].as_array().unwrap() {
                for s in ss["spans"].as_array().unwrap() {
                    out.push(Span {
                        service: service.clone(),
                        trace_id: text(&s["traceId"]),
                        span_id: text(&s["spanId"]),
                        parent: text(&s["parentSpanId"]),
                        name: text(&s["name"]),
                        attributes: s["attributes"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|a| (text(&a["key"]), a["value"].clone()))
                            .collect(),
                        links: s["links"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|l| (text(&l["traceId"]), text(&l["spanId"])))
                            .collect(),
                    });
                }
            }
        }
    }
    out
}

fn one<'a>(spans: &'a [Span], what: &str, pick: impl Fn(&Span) -> bool) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| pick(s)).collect();
    assert_eq!(found.len(), 1, "one {what}: {found:#?}");
    found[0]
}

/// A control plane, a shard node and a worker, each with its own `env`; waits until the node
/// owns every shard.
async fn deployment(dir: &std::path::Path, env: [&[(&str, &str)]; 3]) -> (Deployment, Api) {
    let mut d = Deployment::start(1).await;
    let owned = |vars: &[(&str, &str)]| {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    d.env = owned(env[0]);
    d.control_plane("cp-1", &["--shards", "2"]).await;
    d.env = owned(env[1]);
    d.node("node-1").await;
    d.env = owned(env[2]);
    d.worker("worker-1", dir);
    let api = d.api("cp-1");
    wait_settled(&api, &["node-1"]).await;
    (d, api)
}

/// Creates a one-shot job (with `traceparent` as the caller's span) and waits until its ticket
/// succeeded; returns the job id and the ticket id.
async fn run_one_ticket(d: &Deployment, api: &Api, traceparent: &str) -> (String, String) {
    let body = json!({"tenant": "acme", "name": "traced", "schedule": {"delay": "0s"},
        "target": d.target("traced")});
    let resp = api
        .http
        .post(format!("{}/v1/jobs", api.base))
        .bearer_auth(&api.token)
        .header("traceparent", traceparent)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let job: Value = resp.json().await.unwrap();
    let job = text(&job["id"]);
    let ticket = api.ticket_of_run(&job, "succeeded").await;
    (job, text(&ticket["ticket_id"]))
}

/// SIGTERM to the worker, the node, then the control plane; each exits 0.
async fn stop_cleanly(d: &mut Deployment) {
    let mut all: Vec<&mut common::process::Process> = d.workers.values_mut().collect();
    all.extend(d.nodes.values_mut());
    all.extend(d.control_planes.values_mut().map(|(p, _)| p));
    for p in all {
        p.signal(Signal::SIGTERM);
        assert_eq!(
            p.exited(Duration::from_secs(30)).await,
            Some(0),
            "{}",
            p.name
        );
    }
}

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tickets_spans_arrive_from_every_role_in_the_trace_named_by_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = HttpSink::start().await.unwrap();
    let endpoint = receiver.url("");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        // Nothing is sent on a timer within the test: the spans arrive by the flush at exit.
        ("OTEL_BSP_SCHEDULE_DELAY", "3600000"),
    ];
    let (mut d, api) = deployment(dir.path(), [&env, &env, &env]).await;
    let (job, ticket) =
        run_one_ticket(&d, &api, &format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")).await;
    // A ticket whose target fails twice: two attempts, dead-lettered.
    let failing = HttpSink::start().await.unwrap();
    failing.respond_with(500);
    let retried = api
        .create(
            &json!({"tenant": "acme", "name": "retried", "schedule": {"delay": "0s"},
            "target": {"type": "http", "url": failing.url("/retried")},
            "retry": {"max_attempts": 2, "backoff": "fixed", "initial": "100ms"}}),
        )
        .await;
    let dead = api.ticket_of_run(&retried, "dead").await;
    assert_eq!(
        failing.requests().len(),
        2,
        "the target failed both attempts"
    );
    stop_cleanly(&mut d).await;

    let all = spans(&receiver);
    let trace = ticket.replace('-', "");
    let job_trace = job.replace('-', "");
    let of_ticket: Vec<Span> = all
        .iter()
        .filter(|s| s.trace_id == trace)
        .cloned()
        .collect();
    let fire = one(&of_ticket, "fire", |s| s.name == "fire");
    assert_eq!(fire.service, "chronoshard-shard-node");
    assert_eq!(fire.parent, "", "the fire span is the trace's root");
    assert_eq!(fire.attr("chronoshard.job.id"), Some(job.clone()));
    assert_eq!(fire.attr("chronoshard.ticket.id"), Some(ticket.clone()));
    let publish = one(&of_ticket, "publish", |s| s.name == "publish");
    assert_eq!(publish.service, "chronoshard-shard-node");
    assert_eq!(publish.parent, fire.span_id);
    assert_eq!(
        publish.attr("messaging.destination.name").unwrap(),
        "chronoshard.dispatch.http"
    );
    let attempt = one(&of_ticket, "attempt", |s| s.name == "attempt");
    assert_eq!(attempt.service, "chronoshard-worker");
    assert_eq!(
        attempt.parent, publish.span_id,
        "across NATS, from the ticket's header"
    );
    assert_eq!(attempt.attr("chronoshard.outcome").unwrap(), "succeeded");
    assert_eq!(attempt.attr("chronoshard.worker").unwrap(), "worker-1");
    let result = one(&of_ticket, "succeeded result", |s| {
        s.name == "result" && s.attr("chronoshard.result.kind").as_deref() == Some("succeeded")
    });
    assert_eq!(result.service, "chronoshard-shard-node");
    assert_eq!(
        result.parent, attempt.span_id,
        "across NATS, from the result's header"
    );
    assert!(
        of_ticket
            .iter()
            .all(|s| s.name != "result" || s.parent == attempt.span_id),
        "every report of the attempt is its child: {of_ticket:#?}"
    );
    // The executor's call names the attempt as its parent.
    let calls = d.sink.requests();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].headers["traceparent"],
        format!("00-{trace}-{}-01", attempt.span_id)
    );

    // The create request: a child of the caller's span, carrying the job id and linking the
    // job's span, which links back to it; the ticket's fire span links the job's span too.
    let request = one(&all, "create request", |s| {
        s.name == "POST /v1/jobs" && s.trace_id == CALLER_TRACE
    });
    assert_eq!(request.service, "chronoshard-control-plane");
    assert_eq!(
        (request.trace_id.as_str(), request.parent.as_str()),
        (CALLER_TRACE, CALLER_SPAN)
    );
    assert_eq!(request.attr("chronoshard.job.id"), Some(job.clone()));
    assert_eq!(request.attr("http.response.status_code").unwrap(), "201");
    let job_span = one(&all, "job span", |s| {
        s.name == "job" && s.trace_id == job_trace
    });
    assert_eq!(job_span.service, "chronoshard-control-plane");
    assert_eq!(
        (job_span.trace_id.as_str(), job_span.parent.as_str()),
        (job_trace.as_str(), "")
    );
    let to_job = (job_span.trace_id.clone(), job_span.span_id.clone());
    assert_eq!(request.links, vec![to_job.clone()]);
    assert_eq!(fire.links, vec![to_job]);
    assert_eq!(
        job_span.links,
        vec![(request.trace_id.clone(), request.span_id.clone())]
    );

    // Each attempt of the retried ticket: its own publish under the one fire, its own
    // execution, and its failed result under that execution.
    let dead_trace = text(&dead["ticket_id"]).replace('-', "");
    let of_dead: Vec<Span> = all
        .iter()
        .filter(|s| s.trace_id == dead_trace)
        .cloned()
        .collect();
    let fire = one(&of_dead, "the retried ticket's fire", |s| s.name == "fire");
    let named = |name: &str| -> Vec<&Span> { of_dead.iter().filter(|s| s.name == name).collect() };
    let (publishes, attempts) = (named("publish"), named("attempt"));
    assert_eq!((publishes.len(), attempts.len()), (2, 2), "{of_dead:#?}");
    assert!(
        publishes.iter().all(|p| p.parent == fire.span_id),
        "{of_dead:#?}"
    );
    for attempt in &attempts {
        assert_eq!(attempt.attr("chronoshard.outcome").unwrap(), "failed");
        assert!(
            publishes.iter().any(|p| p.span_id == attempt.parent),
            "each attempt is a child of a publish: {of_dead:#?}"
        );
        assert!(
            of_dead.iter().any(|s| s.name == "result"
                && s.parent == attempt.span_id
                && s.attr("chronoshard.result.kind").as_deref() == Some("failed")),
            "each attempt's failure is applied under it: {of_dead:#?}"
        );
    }
    assert_ne!(attempts[0].parent, attempts[1].parent, "{of_dead:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_an_endpoint_or_with_the_sdk_disabled_nothing_is_exported() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = HttpSink::start().await.unwrap();
    let endpoint = receiver.url("");
    // Everything but an endpoint; and an endpoint with the SDK disabled.
    let no_endpoint = [
        ("OTEL_SERVICE_NAME", "quiet"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
    ];
    let disabled = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_SDK_DISABLED", "true"),
    ];
    let (mut d, api) = deployment(dir.path(), [&disabled, &no_endpoint, &disabled]).await;
    let (_, ticket) =
        run_one_ticket(&d, &api, &format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")).await;
    // The executor's call names the attempt as before traces existed.
    let calls = d.sink.requests();
    assert_eq!(
        calls[0].headers["traceparent"],
        format!("00-{}-8000000000000001-01", ticket.replace('-', ""))
    );
    // A clean stop is when anything buffered would be sent.
    stop_cleanly(&mut d).await;
    assert_eq!(receiver.requests().len(), 0);
}

#[tokio::test]
async fn a_grpc_exporter_is_refused_at_start_saying_what_works() {
    let out = command(&["worker", "--id", "w-1", "--nats", "nats://127.0.0.1:9"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\"") && err.contains("http/json"),
        "{err}"
    );
}
