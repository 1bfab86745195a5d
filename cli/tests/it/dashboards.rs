//! The Grafana dashboards of grafana/dashboards/ against a real Prometheus scraping a running
//! platform, every role a separate process serving its own /metrics (a control plane, two shard
//! nodes with `--metrics`, a worker with `--metrics`) under a load that succeeds, fails, retries,
//! dead-letters, overlaps and sends a malformed ticket. Every panel's every query, with Grafana's
//! variables replaced by what Grafana would send, evaluates without error and returns a finite
//! value, and every template variable resolves to at least one value. A query may fall back to
//! `or vector(0)` only where the event it counts truthfully did not happen in such a run (the
//! list `RARE` says which and why); every metric name a dashboard uses is defined in
//! crates/telemetry/src/metrics.rs and listed in docs/metrics.md.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::common;
use crate::common::{
    cluster::{wait_settled, Deployment},
    wait_for, Api,
};
use chronoshard_test_util::{
    prometheus::{Prometheus, PrometheusOptions},
    HttpSink,
};
use serde_json::{json, Value};

/// Events a healthy run under this test's load does not have, so the panels counting them show
/// their `or vector(0)`: (metric, a part of the selector, why it has no series).
const RARE: &[(&str, &str, &str)] = &[
    (
        "chronoshard_publish_errors_total",
        "",
        "JetStream refuses no publish here",
    ),
    (
        "chronoshard_result_pulls_renewed_total",
        "",
        "no result pull stalls for 4 s here",
    ),
    (
        "chronoshard_strategy_errors_total",
        "",
        "the built-in strategy does not fail",
    ),
    (
        "chronoshard_worker_not_run_again_total",
        "",
        "no worker dies mid-run here",
    ),
    (
        "chronoshard_http_requests_total",
        "status=~\"5..\"",
        "a healthy API answers no 5xx",
    ),
    (
        "chronoshard_tenant_fires_total",
        "tenant=\"(other)\"",
        "the run has fewer tenants than the bound counted by name",
    ),
];

/// What the load is for, each seen by Prometheus before the panels are checked: results that
/// fail, retries, dead letters, overlapping runs skipped and replaced, a malformed ticket, a
/// refused request.
const LOAD_DID: &[&str] = &[
    r#"sum(chronoshard_worker_executions_total{outcome="failed"}) > 0"#,
    "sum(chronoshard_retries_total) > 0",
    "sum(chronoshard_dead_letters_total) > 0",
    "sum(chronoshard_runs_replaced_total) > 0",
    r#"sum(chronoshard_occurrences_not_fired_total{status="skipped"}) > 0"#,
    "sum(chronoshard_worker_malformed_tickets_total) > 0",
    r#"sum(chronoshard_http_requests_total{status=~"4.."}) > 0"#,
];

/// What Grafana puts for its own variables: a rate window of four 1 s scrapes and more, the
/// step of a short time range, and the time range itself is set per check.
const RATE_INTERVAL: &str = "10s";
const INTERVAL: &str = "2s";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One query of one panel.
#[derive(Debug)]
struct PanelQuery {
    dashboard: String,
    panel: String,
    ref_id: String,
    expr: String,
}

/// A dashboard's file name, its template variables (name → query) and its panels' queries.
struct Dashboard {
    file: String,
    variables: BTreeMap<String, String>,
    queries: Vec<PanelQuery>,
}

fn dashboards() -> Vec<Dashboard> {
    let dir = repo().join("grafana/dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files.iter().map(|f| dashboard(f)).collect()
}

fn dashboard(file: &Path) -> Dashboard {
    let d: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let title = d["title"].as_str().unwrap().to_string();
    assert!(
        d["schemaVersion"].as_u64().unwrap() >= 36,
        "{title}: schemaVersion"
    );
    let mut variables = BTreeMap::new();
    for v in d["templating"]["list"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap().to_string();
        match v["type"].as_str().unwrap() {
            "datasource" => assert_eq!(v["query"], "prometheus", "{title}: {name}"),
            "query" => {
                let q = v["query"]["query"].as_str().or(v["query"].as_str());
                variables.insert(name, q.unwrap().to_string());
            }
            other => panic!("{title}: variable {name} of type {other} is not checked here"),
        }
    }
    let mut queries = Vec::new();
    let mut panels: Vec<Value> = d["panels"].as_array().unwrap().clone();
    while let Some(p) = panels.pop() {
        // A collapsed row holds its panels inside it.
        panels.extend(p["panels"].as_array().cloned().unwrap_or_default());
        let panel = p["title"].as_str().unwrap_or_default().to_string();
        for t in p["targets"].as_array().into_iter().flatten() {
            assert_eq!(
                p["datasource"]["uid"], "${datasource}",
                "{title}: {panel}: the datasource comes from the variable"
            );
            queries.push(PanelQuery {
                dashboard: title.clone(),
                panel: panel.clone(),
                ref_id: t["refId"].as_str().unwrap().to_string(),
                expr: t["expr"].as_str().unwrap().to_string(),
            });
        }
    }
    assert!(!queries.is_empty(), "{title} has no queries");
    Dashboard {
        file: file.file_name().unwrap().to_string_lossy().into_owned(),
        variables,
        queries,
    }
}

/// The `chronoshard_*` names an expression uses, a histogram's series named by the histogram.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("chronoshard_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.insert(base.to_string());
        rest = &tail[end..];
    }
    names
}

/// Metric names defined in metrics.rs and listed in docs/metrics.md, each file read as text.
fn defined_metrics() -> BTreeSet<String> {
    let code = ["metrics.rs", "tenants.rs"]
        .map(|f| std::fs::read_to_string(repo().join("crates/telemetry/src").join(f)).unwrap())
        .join("\n");
    let docs = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    let consts: BTreeSet<String> = code
        .lines()
        .filter(|l| l.starts_with("pub const") && l.contains(": &str = \""))
        .filter_map(|l| l.split('"').nth(1).map(str::to_string))
        .collect();
    consts
        .into_iter()
        .filter(|n| docs.contains(&format!("| `{n}` |")))
        .collect()
}

/// `expr` with Grafana's variables replaced: its own, and the dashboard's (all values, as the
/// default "All" sends them).
fn substitute(expr: &str, variables: &BTreeMap<String, String>, range: &str) -> String {
    let mut out = expr
        .replace("$__rate_interval", RATE_INTERVAL)
        .replace("$__interval", INTERVAL)
        .replace("$__range", range);
    // Longest names first, so `$shard` never eats the start of a longer name.
    let mut names: Vec<&String> = variables.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for n in names {
        out = out
            .replace(&format!("${{{n}}}"), ".*")
            .replace(&format!("${n}"), ".*");
    }
    assert!(!out.contains('$'), "an unknown variable in {expr}");
    out
}

/// The values a `label_values(...)` variable query resolves to.
async fn resolve(prom: &Prometheus, query: &str) -> Vec<String> {
    let args = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a label_values() query: {query}"));
    let (matcher, label) = match args.rsplit_once(',') {
        Some((m, l)) => (Some(m.trim()), l.trim()),
        None => (None, args.trim()),
    };
    prom.label_values(label, matcher).await.unwrap()
}

/// Whether the query returns at least one finite value; its error if Prometheus refuses it.
async fn has_data(prom: &Prometheus, expr: &str) -> Result<bool, String> {
    match prom.query(expr).await {
        Ok(samples) => Ok(samples.iter().any(|s| s.value.is_finite())),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_panel_of_every_dashboard_shows_data_from_a_platform_under_load() {
    let boards = checked_dashboards();
    let dir = tempfile::tempdir().unwrap();
    let (d, prom) = watched_platform(dir.path()).await;
    let started = Instant::now();
    prom.wait_all_up(Duration::from_secs(20)).await.unwrap();
    let api = d.api("cp-1");
    let sinks = load(&d, &api).await;
    let traffic = api_traffic(&d);
    let range = || format!("{}s", started.elapsed().as_secs().max(10));
    for expr in LOAD_DID {
        wait_for(
            &format!("the load to show: {expr}"),
            Duration::from_secs(30),
            || async { has_data(&prom, expr).await.unwrap().then_some(()) },
        )
        .await
        .unwrap();
    }
    let all: Vec<(&PanelQuery, &BTreeMap<String, String>)> = boards
        .iter()
        .flat_map(|b| b.queries.iter().map(move |q| (q, &b.variables)))
        .collect();
    // Until every query has data, or the deadline: then the list says which lack it.
    let waited = wait_for(
        "every panel query to return data",
        Duration::from_secs(60),
        || async {
            failing(&prom, &all, &range())
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    let failed = failing(&prom, &all, &range()).await;
    assert!(
        waited.is_ok() && failed.is_empty(),
        "{} of {} panel queries fail:\n{}",
        failed.len(),
        all.len(),
        failed.join("\n")
    );
    check_fallbacks(&prom, &all, &range()).await;
    for b in &boards {
        for (name, query) in &b.variables {
            let values = resolve(&prom, query).await;
            assert!(
                !values.is_empty(),
                "{}: ${name} ({query}) has no value",
                b.file
            );
            eprintln!("{}: ${name} = {values:?}", b.file);
        }
    }
    traffic.store(false, Ordering::Relaxed);
    eprintln!(
        "{} panel queries of {} dashboards returned data {:?} after Prometheus started \
         (sinks: {} ok, {} failing, {} slow requests)",
        all.len(),
        boards.len(),
        started.elapsed(),
        d.sink.requests().len(),
        sinks[0].requests().len(),
        sinks[1].requests().len()
    );
}

/// Every dashboard, once each metric name it uses is known to be defined.
fn checked_dashboards() -> Vec<Dashboard> {
    let defined = defined_metrics();
    let boards = dashboards();
    assert_eq!(boards.len(), 5, "overview, shards, workers, api, tenants");
    for b in &boards {
        let panels = b.queries.iter().map(|q| (&q.panel, &q.expr));
        for (place, expr) in panels.chain(&b.variables) {
            let unknown: Vec<String> = metric_names(expr)
                .into_iter()
                .filter(|n| !defined.contains(n))
                .collect();
            assert!(unknown.is_empty(), "{}: {place}: {unknown:?}", b.file);
        }
    }
    boards
}

/// A control plane, two shard nodes and a worker, each a process serving its /metrics, and a
/// Prometheus scraping all four.
async fn watched_platform(dir: &Path) -> (Deployment, Prometheus) {
    let mut d = Deployment::start(1).await;
    d.control_plane("cp-1", &["--shards", "4"]).await;
    let metrics = ["--metrics", "127.0.0.1:0"];
    d.node_with("node-a", &metrics).await;
    d.node_with("node-b", &metrics).await;
    d.worker_with("worker-1", dir, &metrics);
    wait_settled(&d.api("cp-1"), &["node-a", "node-b"]).await;
    let options = PrometheusOptions {
        targets: d.metrics_targets().await,
        ..Default::default()
    };
    let prom = Prometheus::start(options).await.unwrap();
    (d, prom)
}

/// The queries that have no data now or that Prometheus refuses, each with why.
async fn failing(
    prom: &Prometheus,
    all: &[(&PanelQuery, &BTreeMap<String, String>)],
    range: &str,
) -> Vec<String> {
    let mut failed = Vec::new();
    for (q, vars) in all {
        let expr = substitute(&q.expr, vars, range);
        let why = match has_data(prom, &expr).await {
            Ok(true) => continue,
            Ok(false) => format!("no data: {expr}"),
            Err(e) => e,
        };
        failed.push(format!(
            "{} / {} / {}: {why}",
            q.dashboard, q.panel, q.ref_id
        ));
    }
    failed
}

/// A query that falls back to `or vector(0)` and has no data without it counts an event the
/// run truthfully did not have: one of `RARE`. Says which panels show such a zero.
async fn check_fallbacks(
    prom: &Prometheus,
    all: &[(&PanelQuery, &BTreeMap<String, String>)],
    range: &str,
) {
    for (q, vars) in all {
        if !q.expr.contains(" or vector(0)") {
            continue;
        }
        let raw = substitute(&q.expr.replace(" or vector(0)", ""), vars, range);
        if has_data(prom, &raw).await.unwrap() {
            continue;
        }
        let why = RARE
            .iter()
            .find(|(metric, part, _)| q.expr.contains(metric) && q.expr.contains(part))
            .map(|(m, _, why)| format!("{m}: {why}"))
            .unwrap_or_else(|| {
                panic!(
                    "{} / {} / {}: data only from its `or vector(0)`, for no event listed \
                     as rare: {}",
                    q.dashboard, q.panel, q.ref_id, q.expr
                )
            });
        eprintln!(
            "{} / {} / {}: 0 from `or vector(0)` ({why})",
            q.dashboard, q.panel, q.ref_id
        );
    }
}

/// Jobs that succeed, fail into retries and dead letters, overlap a slow run (skipped and
/// replaced), a workflow, a refused create and a malformed ticket. Returns the failing and the slow sink.
async fn load(d: &Deployment, api: &Api) -> [HttpSink; 2] {
    let failing = HttpSink::start().await.unwrap();
    failing.respond_with(500);
    let slow = HttpSink::start().await.unwrap();
    slow.respond_after(Duration::from_secs(3));
    let target = |sink: &HttpSink| json!({"type": "http", "url": sink.url("/"), "method": "POST"});
    let every = |tenant: &str, target: Value| json!({"tenant": tenant, "name": "tick", "schedule": {"every": "1s"}, "target": target});
    for t in 0..6 {
        api.create(&every(&format!("ok-{t}"), d.target("tick")))
            .await;
    }
    for t in 0..2 {
        let mut job = every(&format!("failing-{t}"), target(&failing));
        job["retry"] = json!({"max_attempts": 2, "backoff": "fixed", "initial": "1s", "max": "1s"});
        api.create(&job).await;
    }
    for overlap in ["forbid", "replace"] {
        let mut job = every(&format!("slow-{overlap}"), target(&slow));
        job["overlap"] = json!(overlap);
        api.create(&job).await;
    }
    // A workflow whose runs succeed: its second step is released by the first one's end.
    let step = |name: &str, after: &[&str]| json!({"name": name, "target": d.target("wf"), "after": after});
    let (status, w) = api
        .post(
            "/v1/workflows",
            &json!({"tenant": "ok-1", "name": "flow", "schedule": {"every": "2s"},
                    "steps": [step("a", &[]), step("b", &["a"])]}),
        )
        .await;
    assert_eq!(status, 201, "{w}");
    let (status, _) = api
        .post(
            "/v1/jobs",
            &json!({"tenant": "ok-0", "name": "no schedule"}),
        )
        .await;
    assert_eq!(status, 400);
    // A dispatch message without a ticket or its headers: the worker terminates it.
    let js = async_nats::jetstream::new(async_nats::connect(d.nats.url()).await.unwrap());
    let subject = chronoshard_wire::names::dispatch_subject("http");
    js.publish(subject, "not a ticket".into())
        .await
        .unwrap()
        .await
        .unwrap();
    [failing, slow]
}

/// Reads of the API several times a second until the flag is cleared, so its request panels
/// have a rate; as a dashboard's users would cause.
fn api_traffic(d: &Deployment) -> Arc<AtomicBool> {
    let on = Arc::new(AtomicBool::new(true));
    let api = d.api("cp-1");
    let running = on.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        while running.load(Ordering::Relaxed) {
            tick.tick().await;
            for path in ["/v1/jobs?tenant=ok-0", "/v1/shards", "/v1/jobs/not-a-job"] {
                let url = format!("{}{path}", api.base);
                // Answered or not: the platform stops under this task at the test's end.
                let _ = api.http.get(url).bearer_auth(&api.token).send().await;
            }
        }
    });
    on
}

/// `bash scripts/monitor.sh ARGS`, its output collected; SIGTERM (which stops its Prometheus and
/// Alertmanager) on drop.
struct Script {
    child: std::process::Child,
    out: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Script {
    fn start(args: &[&str]) -> Script {
        let mut child = std::process::Command::new("bash")
            .arg(repo().join("scripts/monitor.sh"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = Arc::new(std::sync::Mutex::new(Vec::new()));
        for from in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let into = out.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(from).lines().map_while(Result::ok) {
                    into.lock().unwrap().push(line);
                }
            });
        }
        Script { child, out }
    }

    fn output(&self) -> String {
        self.out.lock().unwrap().join("\n")
    }

    fn terminate(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        self.terminate();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- scripts/monitor.sh said ---\n{}", self.output());
        }
    }
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// scripts/monitor.sh beside a dev platform: its Prometheus scrapes dev's /metrics and has the
/// alert rules loaded, its Alertmanager is ready and known to Prometheus; SIGTERM stops both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_script_watches_a_dev_platform_with_prometheus_and_alertmanager() {
    let dir = tempfile::tempdir().unwrap();
    let platform = common::platform(&dir.path().join("dev")).await;
    let dev = platform.url.trim_start_matches("http://").to_string();
    let (prom_addr, am_addr) = (free_addr(), free_addr());
    let state = dir.path().join("monitor");
    let script = Script::start(&[
        "--target",
        &dev,
        "--state",
        state.to_str().unwrap(),
        "--prometheus",
        &prom_addr,
        "--alertmanager",
        &am_addr,
        "--scrape-interval",
        "1s",
    ]);
    wait_for("monitor.sh to say it is up", common::LONG, || async {
        script.output().contains("Ctrl-C stops both").then_some(())
    })
    .await
    .unwrap();
    let out = script.output();
    for said in [&prom_addr, &am_addr, "grafana/README.md"] {
        assert!(out.contains(said), "{said} in:\n{out}");
    }
    let prom =
        chronoshard_test_util::prometheus::Client::new(&format!("http://{prom_addr}")).unwrap();
    let wait = Duration::from_secs(20);
    prom.wait_target_up(&format!("http://{dev}/metrics"), wait)
        .await
        .unwrap();
    // The target is up after its first scrape, whose series are queryable a moment later.
    let leader = wait_for("dev's one replica in prometheus", wait, || async {
        let series = prom.query("chronoshard_control_plane_leader").await.ok()?;
        (!series.is_empty()).then_some(series)
    })
    .await
    .unwrap();
    assert_eq!(leader.len(), 1, "dev's one replica: {leader:?}");
    let rules = prom.api("/api/v1/rules", &[]).await.unwrap();
    let alerts: Vec<&str> = rules["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(alerts.contains(&"ChronoshardNoLeader"), "{alerts:?}");
    // Prometheus finds its Alertmanager through discovery, within its 5 s update period.
    wait_for("prometheus to know the alertmanager", wait, || async {
        let am = prom.api("/api/v1/alertmanagers", &[]).await.ok()?;
        am["activeAlertmanagers"]
            .as_array()?
            .iter()
            .any(|a| a["url"].as_str().is_some_and(|u| u.contains(&am_addr)))
            .then_some(())
    })
    .await
    .unwrap();
    let am = reqwest::get(format!("http://{am_addr}/-/ready"))
        .await
        .unwrap();
    assert_eq!(am.status(), 200);

    script.terminate();
    wait_for("both servers to stop", wait, || async {
        let p = reqwest::get(format!("http://{prom_addr}/-/ready")).await;
        let a = reqwest::get(format!("http://{am_addr}/-/ready")).await;
        (p.is_err() && a.is_err()).then_some(())
    })
    .await
    .unwrap();
}
