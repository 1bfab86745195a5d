//! The job policies end to end, through a platform, a worker and a target, with the runs they
//! record: overlap `forbid`, catch-up `latest` and `skip` after a downtime, `shard_items`, and
//! priorities when more is due at once than a shard fires in one turn.

use std::{collections::HashSet, time::Duration};

use crate::common::{worker::HandWorker, *};
use chrono::{DateTime, Utc};
use chronoshard_wire::ResultKind;
use futures::StreamExt;
use serde_json::{json, Value};

fn at(run: &Value, field: &str) -> DateTime<Utc> {
    run[field].as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forbid_skips_occurrences_while_a_run_is_active_and_fires_again_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let mut hand = HandWorker::start(&p.nats_url, "held").await;
    let job = api
        .create(
            &json!({"tenant": "acme", "name": "held", "schedule": {"every": "1s"},
            "target": {"type": "queue", "queue": "held"}, "overlap": "forbid", "timeout": "60s"}),
        )
        .await;
    let first = hand.next_ticket(LONG).await;
    hand.report(&first, ResultKind::Started, None).await;
    // While it runs, the next occurrences are recorded skipped, each with its row.
    let skipped = wait_for("two occurrences skipped", LONG, || async {
        let runs = api.past_runs(&job).await;
        let skipped: Vec<Value> = runs
            .into_iter()
            .filter(|r| r["status"] == "skipped")
            .collect();
        (skipped.len() >= 2).then_some(skipped)
    })
    .await
    .unwrap();
    for row in &skipped {
        assert_eq!(
            row["reason"], "overlap: the previous run is still active",
            "{row}"
        );
        assert!(row["ticket_ids"].as_array().unwrap().is_empty(), "{row}");
        assert!(at(row, "scheduled_at") > first.scheduled_at, "{row}");
    }
    let last_skipped = skipped.iter().map(|r| at(r, "scheduled_at")).max().unwrap();
    hand.report(&first, ResultKind::Succeeded, None).await;
    // Once it ended, the next occurrence fires.
    let second = hand.next_ticket(LONG).await;
    assert_ne!(second.ticket_id, first.ticket_id);
    assert!(second.scheduled_at > last_skipped);
    hand.report(&second, ResultKind::Succeeded, None).await;
    let second_at = second
        .scheduled_at
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    wait_for("the second run to succeed", LONG, || async {
        api.past_runs(&job)
            .await
            .into_iter()
            .find(|r| r["scheduled_at"] == second_at.as_str() && r["status"] == "succeeded")
    })
    .await
    .unwrap();
    p.stop().await.unwrap();
}

/// Two every-second jobs, one per policy, through a 6 s downtime of the whole platform. An
/// occurrence up to 2 s late fires whatever the policy, so the test judges only those due more
/// than 2 s before the platform was started again: surely late for the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn catch_up_latest_fires_the_newest_missed_occurrence_and_skip_fires_none() {
    let dir = tempfile::tempdir().unwrap();
    let sink = HttpSink::start().await.unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let mut jobs = Vec::new();
    for policy in ["latest", "skip"] {
        let job = api
            .create(
                &json!({"tenant": format!("catchup-{policy}"), "name": policy,
                "schedule": {"every": "1s"}, "catchup": {"policy": policy, "window": "1h"},
                "target": {"type": "http", "url": sink.url(&format!("/{policy}"))}}),
            )
            .await;
        jobs.push((policy, job));
    }
    wait_for("both jobs to run", LONG, || async {
        let paths: HashSet<String> = sink.requests().into_iter().map(|r| r.path).collect();
        (paths.len() == 2).then_some(())
    })
    .await
    .unwrap();
    let (p, down) = Downtime::of(p, dir.path()).await;
    let (down_at, late_before, up_at) = (down.down_at, down.late_before, down.up_at);
    let api = Api::new(&p);
    let late = |t: &DateTime<Utc>| down.late(t);
    for (policy, job) in &jobs {
        wait_for("a run due after the restart", LONG, || async {
            api.past_runs(job)
                .await
                .into_iter()
                .find(|r| r["status"] == "succeeded" && at(r, "scheduled_at") > up_at)
        })
        .await
        .unwrap();
        let runs = api.past_runs(job).await;
        let path = format!("/{policy}");
        let called: Vec<DateTime<Utc>> = sink
            .requests()
            .into_iter()
            .filter(|r| r.path == path)
            .map(|r| r.headers["x-chronoshard-scheduled-at"].parse().unwrap())
            .filter(late)
            .collect();
        let not_fired = if *policy == "latest" {
            "missed"
        } else {
            "skipped"
        };
        let end_of = |r: &Value| {
            if r["range_end"].is_string() {
                at(r, "range_end")
            } else {
                at(r, "scheduled_at")
            }
        };
        // one row for the consecutive ones, overlapping the late window
        let row = runs
            .iter()
            .find(|r| {
                r["status"] == not_fired
                    && at(r, "scheduled_at") < late_before
                    && end_of(r) > down_at
            })
            .unwrap_or_else(|| panic!("{policy}: no {not_fired} row in {runs:?}"));
        let count = row["count"].as_u64().unwrap_or(1);
        assert!(count >= 3, "{policy}: {row}");
        // The metric counts them under the same status.
        let status = format!(r#"status="{not_fired}""#);
        wait_for("the not-fired occurrences to be counted", LONG, || async {
            let counted = api
                .metric_sum_with("chronoshard_occurrences_not_fired_total", &status)
                .await;
            (counted >= count as f64).then_some(())
        })
        .await
        .unwrap();
        let end = end_of(row);
        // nothing recorded as not fired was called
        assert!(
            called
                .iter()
                .all(|t| *t < at(row, "scheduled_at") || *t > end),
            "{policy}: {called:?} within {row}"
        );
        if *policy == "latest" {
            // of the late ones, at most the newest fired, after the missed ones
            assert!(called.len() <= 1, "latest fired {called:?}");
            assert!(called.iter().all(|t| *t > end), "{called:?} {row}");
        } else {
            assert!(called.is_empty(), "skip fired {called:?}");
        }
    }
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shard_items_make_one_ticket_per_item_and_the_run_waits_for_all_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let mut hand = HandWorker::start(&p.nats_url, "split").await;
    let job = api
        .create(
            &json!({"tenant": "acme", "name": "split", "schedule": {"delay": "0s"},
            "target": {"type": "queue", "queue": "split"}, "shard_items": 3,
            "retry": {"max_attempts": 2, "backoff": "fixed", "initial": "100ms"}}),
        )
        .await;
    let mut tickets = Vec::new();
    for _ in 0..3 {
        tickets.push(hand.next_ticket(LONG).await);
    }
    tickets.sort_by_key(|t| t.item);
    let items: Vec<(u32, u32)> = tickets.iter().map(|t| (t.item, t.items)).collect();
    assert_eq!(items, [(0, 3), (1, 3), (2, 3)]);
    assert_eq!(
        tickets
            .iter()
            .map(|t| t.ticket_id)
            .collect::<HashSet<_>>()
            .len(),
        3
    );
    // items 0 and 2 succeed, item 1 fails once: the run is not over until its retry succeeds
    hand.report(&tickets[0], ResultKind::Succeeded, None).await;
    hand.report(&tickets[2], ResultKind::Succeeded, None).await;
    hand.report(&tickets[1], ResultKind::Failed, Some("item 1 broke"))
        .await;
    let retry = hand.next_ticket(LONG).await;
    assert_eq!((retry.ticket_id, retry.attempt), (tickets[1].ticket_id, 2));
    let run = &api.past_runs(&job).await[0];
    assert_ne!(run["status"], "succeeded", "{run}");
    hand.report(&retry, ResultKind::Succeeded, None).await;
    let run = api.newest_run_succeeded(&job).await;
    let ids: HashSet<&str> = run["ticket_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let want: HashSet<String> = tickets.iter().map(|t| t.ticket_id.to_string()).collect();
    assert_eq!(ids, want.iter().map(String::as_str).collect());
    // a run's attempts are its items' most: item 1 needed two
    assert_eq!(run["attempts"], 2, "{run}");
    p.stop().await.unwrap();
}

/// 700 one-shots of one tenant due in the same instant: more than a shard fires in one turn of
/// its loop (4 batches of 128), so the backlog is ordered by priority.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_a_backlog_higher_priorities_are_published_first() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let mut hand = HandWorker::start(&p.nats_url, "crowd").await;
    let due = (Utc::now() + chrono::Duration::seconds(25)).to_rfc3339();
    let specs: Vec<Value> = (0..700)
        .map(|i| {
            // every tenth one is urgent; created in between the others
            let priority = if i % 10 == 0 { 9 } else { 1 };
            json!({"tenant": "crowd", "name": format!("j{i}"), "schedule": {"at": due},
                "target": {"type": "queue", "queue": "crowd"}, "priority": priority})
        })
        .collect();
    let created: Vec<String> = futures::stream::iter(specs.iter().map(|s| api.create(s)))
        .buffer_unordered(16)
        .collect()
        .await;
    assert_eq!(created.len(), 700);
    assert!(
        Utc::now() < due.parse::<DateTime<Utc>>().unwrap(),
        "created before they fall due"
    );
    let mut order = Vec::new();
    for _ in 0..700 {
        order.push(hand.next_ticket(Duration::from_secs(60)).await.priority);
    }
    // the 70 urgent ones are the first 70 published
    let urgent: Vec<usize> = order
        .iter()
        .enumerate()
        .filter(|(_, p)| **p == 9)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(urgent, (0..70).collect::<Vec<_>>(), "{order:?}");
    p.stop().await.unwrap();
}
