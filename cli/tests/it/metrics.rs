//! The metrics move with their events, on a dev platform (one `/metrics` for every part): a job
//! that succeeds, one whose attempts fail until they are dead-lettered, and slow jobs whose
//! occurrences overlap (skipped, replacing) move the counters and histograms of creating, firing,
//! publishing, executing and applying results, per shard and per tenant; the gauges of a running
//! platform are there with their true values. Metrics whose
//! events need a fault (a full stream, a killed worker, a lost node) are asserted by the tests
//! of those faults; `every_metric_is_asserted_by_a_test` keeps the list whole.

use std::{collections::BTreeMap, path::Path};

use crate::common::*;
use serde_json::json;

/// Every sample on `/metrics`: `name{labels}` → value.
async fn samples(api: &Api) -> BTreeMap<String, f64> {
    let (_, _, text) = api.send(reqwest::Method::GET, "/metrics", None).await;
    text.as_str()
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The sum over the series of `name` whose labels contain `label`.
fn sum(samples: &BTreeMap<String, f64>, name: &str, label: &str) -> f64 {
    samples
        .iter()
        .filter(|(s, _)| s.split('{').next() == Some(name) && s.contains(label))
        .map(|(_, v)| v)
        .sum()
}

/// The series of `name`, for a failed assertion's message.
fn series<'a>(samples: &'a BTreeMap<String, f64>, name: &str) -> Vec<(&'a String, &'a f64)> {
    (samples.iter())
        .filter(|(s, _)| s.split('{').next() == Some(name))
        .collect()
}

/// Counters and histogram counts this test's events move: (series name, a part of its labels).
const MOVED: &[(&str, &str)] = &[
    ("chronoshard_jobs_created_total", ""),
    ("chronoshard_fires_total", ""),
    ("chronoshard_fire_lateness_seconds_count", ""),
    ("chronoshard_fire_send_lateness_seconds_count", ""),
    ("chronoshard_tickets_published_total", ""),
    ("chronoshard_results_applied_total", r#"kind="started""#),
    ("chronoshard_results_applied_total", r#"kind="succeeded""#),
    ("chronoshard_results_applied_total", r#"kind="failed""#),
    ("chronoshard_retries_total", ""),
    ("chronoshard_dead_letters_total", ""),
    ("chronoshard_tenant_fires_total", r#"tenant="acme""#),
    (
        "chronoshard_tenant_attempts_failed_total",
        r#"tenant="acme""#,
    ),
    ("chronoshard_tenant_dead_letters_total", r#"tenant="acme""#),
    ("chronoshard_http_requests_total", r#"route="/v1/jobs""#),
    ("chronoshard_http_request_duration_seconds_count", ""),
    ("chronoshard_worker_executions_total", r#"outcome="failed""#),
    ("chronoshard_worker_execution_seconds_count", ""),
    ("chronoshard_start_lateness_seconds_count", ""),
    (
        "chronoshard_occurrences_not_fired_total",
        r#"reason="overlap:"#,
    ),
    ("chronoshard_runs_replaced_total", ""),
    ("chronoshard_publish_seconds_count", ""),
    ("chronoshard_db_seconds_count", r#"op="create""#),
    ("chronoshard_db_seconds_count", r#"op="fire""#),
    ("chronoshard_db_seconds_count", r#"op="apply_results""#),
    ("chronoshard_db_seconds_count", r#"op="load""#),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_platforms_metrics_move_with_their_events() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, failing) = (
        HttpSink::start().await.unwrap(),
        HttpSink::start().await.unwrap(),
    );
    failing.respond_with(500);
    let slow = HttpSink::start().await.unwrap();
    slow.respond_after(std::time::Duration::from_secs(3));
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let before = samples(&api).await;

    let http = |sink: &HttpSink| json!({"type": "http", "url": sink.url("/t")});
    let fine = api
        .create(
            &json!({"tenant": "acme", "name": "fine", "schedule": {"every": "1s"},
                        "target": http(&ok)}),
        )
        .await;
    let bad = api
        .create(
            &json!({"tenant": "acme", "name": "bad", "schedule": {"delay": "0s"},
                        "target": http(&failing),
                        "retry": {"max_attempts": 2, "backoff": "fixed", "initial": "100ms"}}),
        )
        .await;
    // Runs of 3 s every second: the next occurrence is skipped, or replaces the running one.
    let mut recurring = vec![fine.clone()];
    for overlap in ["forbid", "replace"] {
        recurring.push(
            api.create(
                &json!({"tenant": "acme", "name": overlap, "schedule": {"every": "1s"},
                               "target": http(&slow), "overlap": overlap}),
            )
            .await,
        );
    }
    // A slow run is open for seconds: the count of open attempts shows it.
    wait_for("open attempts to be counted", LONG, || async {
        (api.metric_sum("chronoshard_attempts_open").await >= 1.0).then_some(())
    })
    .await
    .unwrap();
    api.newest_run_succeeded(&fine).await;
    wait_for("the failing job's dead letter", LONG, || async {
        let (_, dead) = api.get("/v1/dlq?tenant=acme").await;
        dead["items"]
            .as_array()?
            .iter()
            .any(|d| d["job_id"] == bad.as_str())
            .then_some(())
    })
    .await
    .unwrap();
    // The sink really answered 500 to both attempts.
    assert_eq!(failing.requests().len(), 2);

    let after = wait_for("every counter to move", LONG, || async {
        let after = samples(&api).await;
        MOVED
            .iter()
            .all(|(n, l)| sum(&after, n, l) > sum(&before, n, l))
            .then_some(after)
    })
    .await;
    let after = match after {
        Ok(after) => after,
        Err(e) => {
            let now = samples(&api).await;
            let still: Vec<_> = MOVED
                .iter()
                .filter(|(n, l)| sum(&now, n, l) <= sum(&before, n, l))
                .collect();
            panic!("{e}: these did not move: {still:?}");
        }
    };
    let dead = "chronoshard_dead_letters_total";
    assert_eq!(sum(&after, dead, ""), 1.0, "{:?}", series(&after, dead));
    let failed = "chronoshard_tenant_attempts_failed_total";
    assert_eq!(
        sum(&after, failed, "acme"),
        2.0,
        "{:?}",
        series(&after, failed)
    );

    // What the platform's start moved, and the gauges of a running platform.
    assert!(
        sum(
            &after,
            "chronoshard_shard_moves_total",
            r#"reason="initial""#
        ) >= 8.0
    );
    assert!(
        sum(
            &after,
            "chronoshard_nats_client_events_total",
            r#"event="connected""#
        ) >= 1.0
    );
    for (gauge, value) in [
        ("chronoshard_control_plane_leader", 1.0),
        ("chronoshard_shards_open", 8.0),
        ("chronoshard_shards_unowned", 0.0),
    ] {
        assert_eq!(sum(&after, gauge, ""), value, "{:?}", series(&after, gauge));
    }
    assert!(
        sum(&after, "chronoshard_wheel_entries", "") >= 3.0,
        "the every-1s jobs: {:?}",
        series(&after, "chronoshard_wheel_entries")
    );
    assert!(sum(&after, "chronoshard_node_cpu_cores", "") > 0.0);
    // A shard's pool has a connection open once it has run anything.
    let conns = "chronoshard_db_connections";
    assert!(sum(&after, conns, "") >= 1.0, "{:?}", series(&after, conns));
    for gauge in [
        "chronoshard_attempts_open",
        "chronoshard_dispatch_backlog",
        "chronoshard_tickets_unserved",
        "chronoshard_node_cpu_cores",
        "chronoshard_clock_offset_seconds",
    ] {
        assert!(
            after.keys().any(|s| s.starts_with(&format!("{gauge}{{"))),
            "{gauge} is exported"
        );
    }
    let ages: Vec<f64> = after
        .iter()
        .filter(|(s, _)| s.starts_with("chronoshard_node_heartbeat_age_seconds{"))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(ages.len(), 2, "both nodes");
    assert!(ages.iter().all(|a| *a < 5.0), "{ages:?}");

    // The recurring jobs deleted, the wheel holds what it held before them, and once the last
    // slow run ends no attempt is open.
    for job in &recurring {
        let (status, _, body) = api
            .send(reqwest::Method::DELETE, &format!("/v1/jobs/{job}"), None)
            .await;
        assert_eq!(status, 204, "{body}");
    }
    let wheel_before = sum(&before, "chronoshard_wheel_entries", "");
    let emptied = wait_for("the wheel and the open attempts to empty", LONG, || async {
        let now = samples(&api).await;
        (sum(&now, "chronoshard_wheel_entries", "") == wheel_before
            && sum(&now, "chronoshard_attempts_open", "") == 0.0)
            .then_some(())
    })
    .await;
    if let Err(e) = emptied {
        let now = samples(&api).await;
        let gauges: Vec<_> = now
            .iter()
            .filter(|(s, v)| {
                (s.starts_with("chronoshard_wheel_entries")
                    || s.starts_with("chronoshard_attempts_open"))
                    && **v != 0.0
            })
            .collect();
        panic!("{e}: wheel before {wheel_before}, now {gauges:?}");
    }
    p.stop().await.unwrap();
}

/// Each metric the platform defines is named by a test that asserts it moves (this file for the
/// common events, the fault tests for the others). The dashboards test, which only checks that
/// each panel has data, does not count.
#[test]
fn every_metric_is_asserted_by_a_test() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut defined = Vec::new();
    for file in ["metrics.rs", "tenants.rs"] {
        let code = std::fs::read_to_string(root.join("crates/telemetry/src").join(file)).unwrap();
        defined.extend(
            code.lines()
                .filter(|l| l.starts_with("pub const") && l.contains("= \"chronoshard_"))
                .filter_map(|l| l.split('"').nth(1).map(str::to_string)),
        );
    }
    assert!(defined.len() > 30, "{defined:?}");
    let mut tests = String::new();
    for dir in ["cli/tests/it", "loadtest/tests"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if name.ends_with(".rs") && name != "dashboards.rs" {
                tests += &std::fs::read_to_string(&path).unwrap();
            }
        }
    }
    let untested: Vec<&String> = defined
        .iter()
        .filter(|m| !tests.contains(m.trim_end_matches("_total")))
        .collect();
    assert!(untested.is_empty(), "no test asserts {untested:?}");
}
