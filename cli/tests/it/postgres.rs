//! The platform with its shard databases in PostgreSQL (one schema per shard) instead of SQLite:
//! jobs fire once, retries and dead letters work, and a restart keeps everything. The server is
//! the test's own (crates/test-util/src/postgres.rs).

use crate::common::*;
use chronoshard_test_util::Postgres;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shards_on_postgres_fire_once_dead_letter_and_survive_a_restart() {
    let pg = Postgres::start().await.expect("a PostgreSQL server starts");
    let url = pg.create_database().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let with_pg = |o: &mut chronoshard::dev::DevOptions| o.postgres = Some(url.clone());
    let p = platform_with(dir.path(), with_pg).await;
    let api = Api::new(&p);
    let sink = HttpSink::start().await.unwrap();
    let mut jobs = Vec::new();
    for i in 0..40 {
        let body = json!({"tenant": format!("pg-{}", i % 8), "name": format!("once-{i}"),
            "schedule": {"delay": format!("{}ms", 200 + i * 25)},
            "target": {"type": "http", "url": sink.url(&format!("/once/{i}"))}});
        jobs.push(api.create(&body).await);
    }
    for job in &jobs {
        let run = api.newest_run_succeeded(job).await;
        assert_eq!(run["attempts"], 1, "{run}");
    }
    let failing = api
        .create(
            &json!({"tenant": "pg-0", "name": "fails", "schedule": {"delay": "0s"},
            "target": {"type": "http", "url": sink.url("/fails")},
            "retry": {"max_attempts": 2, "backoff": "fixed", "initial": "100ms"}}),
        )
        .await;
    wait_for("40 calls and the failing job's first one", LONG, || async {
        (sink.requests().len() >= 41).then_some(())
    })
    .await
    .unwrap();
    // the job above already succeeded once (every call answered 200): make the next ones fail
    sink.respond_with(503);
    let (status, run) = api
        .post(&format!("/v1/jobs/{failing}/trigger"), &json!({}))
        .await;
    assert_eq!(status, 202, "{run}");
    let dead = wait_for("a dead letter", LONG, || async {
        let (_, page) = api.get("/v1/dlq?tenant=pg-0").await;
        page["items"].as_array().and_then(|a| a.first().cloned())
    })
    .await
    .unwrap();
    assert_eq!(dead["attempts"], 2, "{dead}");
    for i in 0..40 {
        let path = format!("/once/{i}");
        let n = sink.requests().iter().filter(|r| r.path == path).count();
        assert_eq!(n, 1, "{path} called {n} times");
    }
    p.stop().await.unwrap();
    assert!(
        !dir.path().join("shards").exists(),
        "no SQLite shard files were written"
    );

    // everything lives in Postgres: a restart reads it back
    let p = platform_with(dir.path(), with_pg).await;
    let api = Api::new(&p);
    for job in &jobs {
        let runs = api.past_runs(job).await;
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!(runs[0]["status"], "succeeded");
    }
    let (_, page) = api.get("/v1/dlq").await;
    assert_eq!(page["items"][0]["ticket_id"], dead["ticket_id"], "{page}");
    p.stop().await.unwrap();
}
