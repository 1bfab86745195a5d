//! Occurrences beyond the wheel's horizon stay in the database and reach the wheel in time; a
//! one-shot in the past fires whatever its catch-up policy.

use chronoshard_wire::Dur;
use std::time::Duration;

use crate::common::*;
use chrono::{DateTime, Utc};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn occurrences_beyond_the_horizon_are_loaded_and_fire_without_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| {
        o.settings.horizon = Dur(Duration::from_millis(500));
        o.settings.load_every = Dur(Duration::from_millis(100));
    })
    .await;
    let api = Api::new(&p);
    let sink = HttpSink::start().await.unwrap();
    let target = |path: &str| json!({"type": "http", "url": sink.url(path)});
    // every occurrence of this job is beyond the horizon when the previous one fires
    let every = api.create(&json!({"tenant": "far", "name": "every-2s", "schedule": {"every": "2s"}, "target": target("/every")})).await;
    let later = (Utc::now() + chrono::Duration::seconds(3)).to_rfc3339();
    let one_shot = api.create(&json!({"tenant": "far-2", "name": "in-3s", "schedule": {"at": later}, "target": target("/later")})).await;
    let past = (Utc::now() - chrono::Duration::hours(2)).to_rfc3339();
    let overdue = api
        .create(
            &json!({"tenant": "far-3", "name": "overdue", "schedule": {"at": past},
            "catchup": {"policy": "skip", "window": "1m"}, "target": target("/overdue")}),
        )
        .await;
    let runs = wait_for("four runs of the every-2s job", LONG, || async {
        let runs = api.past_runs(&every).await;
        (runs.iter().filter(|r| r["status"] == "succeeded").count() >= 4).then_some(runs)
    })
    .await
    .unwrap();
    let mut times: Vec<DateTime<Utc>> = runs
        .iter()
        .map(|r| r["scheduled_at"].as_str().unwrap().parse().unwrap())
        .collect();
    times.sort();
    for w in times.windows(2) {
        assert_eq!(
            w[1] - w[0],
            chrono::Duration::seconds(2),
            "gap or duplicate in {times:?}"
        );
    }
    assert!(runs.iter().all(|r| r["status"] != "missed"), "{runs:?}");
    for (id, path) in [(&one_shot, "/later"), (&overdue, "/overdue")] {
        api.newest_run_succeeded(id).await;
        assert_eq!(
            sink.requests().iter().filter(|r| r.path == path).count(),
            1,
            "{path}"
        );
    }
    p.stop().await.unwrap();
}

/// An idle shard does not ask its database for occurrences while nothing is written (an idle
/// platform's loads stop), yet an occurrence that comes within the horizon with nothing written
/// meanwhile is loaded and fires on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_shards_skip_their_loads_and_still_load_what_comes_within_the_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| {
        o.settings.horizon = Dur(Duration::from_secs(1));
        o.settings.load_every = Dur(Duration::from_millis(100));
    })
    .await;
    let api = Api::new(&p);
    let sink = HttpSink::start().await.unwrap();
    let created = Utc::now();
    let due = created + chrono::Duration::seconds(5);
    let job = api
        .create(
            &json!({"tenant": "quiet", "name": "in-5s", "schedule": {"at": due},
            "target": {"type": "http", "url": sink.url("/quiet")}}),
        )
        .await;
    let loads = || api.metric_sum_with("chronoshard_db_seconds_count", r#"op="load""#);
    let after = |secs: i64| {
        let at = created + chrono::Duration::seconds(secs);
        wait_for("the clock", LONG, move || async move {
            (Utc::now() >= at).then_some(())
        })
    };
    // Between the load that follows the create and the one that finds the job within the
    // horizon, nothing is written: 8 shards loading every 100 ms would ask 16 times in 2 s.
    after(1).await.unwrap();
    let quiet_from = loads().await;
    after(3).await.unwrap();
    let quiet_to = loads().await;
    assert!(
        quiet_to - quiet_from <= 2.0,
        "idle shards asked their databases {} times",
        quiet_to - quiet_from
    );
    let ticket = api.ticket_of_run(&job, "succeeded").await;
    let started: DateTime<Utc> = ticket["attempts"][0]["started_at"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let late = started - due;
    assert!(
        late < chrono::Duration::milliseconds(500),
        "started {late} after it was due"
    );
    assert!(loads().await > quiet_to, "the occurrence was loaded");
    assert_eq!(sink.requests().len(), 1);
    p.stop().await.unwrap();
}
