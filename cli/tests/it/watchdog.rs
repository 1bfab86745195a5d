//! The watchdog does not take silence for death: before it declares a silent attempt lost it asks
//! the worker that started it, and keeps the attempt while that worker says it runs it.

use std::{collections::HashMap, time::Duration};

use crate::common::{
    worker::{HandWorker, HAND},
    *,
};
use chronoshard_wire::{
    rpc::{AttemptRequest, AttemptState},
    ResultKind,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_attempt_is_kept_while_its_worker_runs_it_and_lost_when_it_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let mut hand = HandWorker::start(&p.nats_url, "probed").await;
    let mut probes = hand.attempt_requests().await;
    // Timeout 30 s: first check 40 s after the start, a probe once the attempt has been silent
    // for 60 s, the hard limit at 70 s.
    let spec = |name: &str| {
        json!({"tenant": "acme", "name": name, "schedule": {"delay": "0s"},
            "target": {"type": "queue", "queue": "probed"}, "timeout": "30s",
            "retry": {"max_attempts": 2, "backoff": "fixed", "initial": "100ms"}})
    };
    let mut jobs = HashMap::new();
    for name in ["running", "not-running", "silent"] {
        jobs.insert(api.create(&spec(name)).await, name);
    }
    let mut tickets = HashMap::new();
    for _ in 0..3 {
        let t = hand.next_ticket(LONG).await;
        // the worker starts each attempt, then reports nothing more
        hand.report(&t, ResultKind::Started, None).await;
        tickets.insert(jobs[&t.job_id.to_string()], t);
    }

    // Each is probed once silent for a minute: one answer each, and one left unanswered.
    let mut probed = Vec::new();
    while probed.len() < 3 {
        let (req, reply) = probes.next(Duration::from_secs(120)).await;
        let AttemptRequest::Probe { ticket_id, attempt } = req else {
            panic!("a probe, not {req:?}")
        };
        let (name, t) = tickets
            .iter()
            .find(|(_, t)| t.ticket_id == ticket_id)
            .expect("a probe of one of the attempts");
        assert_eq!(attempt, 1);
        if probed.contains(name) {
            continue;
        }
        match *name {
            "running" => {
                probes.answer(reply, AttemptState::Running).await;
                // it finishes well after the probe, before the hard limit
                hand.report(t, ResultKind::Succeeded, None).await;
            }
            "not-running" => probes.answer(reply, AttemptState::Unknown).await,
            _ => {}
        }
        probed.push(*name);
    }

    // The two the worker does not vouch for are lost and retried; the one it runs is not.
    let mut retried = Vec::new();
    for _ in 0..2 {
        let t = hand.next_ticket(LONG).await;
        assert_eq!(t.attempt, 2, "{t:?}");
        retried.push(jobs[&t.job_id.to_string()]);
    }
    retried.sort();
    assert_eq!(retried, ["not-running", "silent"]);
    for (name, says) in [
        (
            "not-running",
            "worker hand says it does not run this attempt",
        ),
        ("silent", "worker hand did not answer the watchdog's probe"),
    ] {
        let (_, view) = api
            .get(&format!("/v1/tickets/{}", tickets[name].ticket_id))
            .await;
        let first = &view["attempts"][0];
        assert_eq!(first["worker"], "watchdog", "{view}");
        let error = first["error"].as_str().unwrap();
        assert!(
            error.starts_with("lost: ") && error.contains(says),
            "{view}"
        );
    }
    let kept = jobs.iter().find(|(_, n)| **n == "running").unwrap().0;
    let run = api.newest_run_succeeded(kept).await;
    assert_eq!(run["attempts"], 1, "{run}");
    let (_, view) = api
        .get(&format!("/v1/tickets/{}", tickets["running"].ticket_id))
        .await;
    assert_eq!(view["attempts"][0]["worker"], HAND, "{view}");
    p.stop().await.unwrap();
}
