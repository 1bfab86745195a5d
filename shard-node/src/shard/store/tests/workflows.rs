//! A workflow run's steps in the store: a run starts with its root steps dispatched and the
//! others waiting (no attempt, not published); the end of a step is followed up; an advance is
//! conditioned on each step's state, so doing it twice changes nothing; skips and cancels end
//! the run; a step fails under its own retry policy; a failed run is retried from its failed
//! steps; and a fenced owner advances nothing.

use chronoshard_wire::{WorkflowSpec, PROTOCOL_VERSION};

use super::*;
use crate::shard::store::{Replay, RetryRun};

/// A workflow `a → b`, with `c` on its own; `a` may be tried twice.
fn workflow(at: i64) -> JobRow {
    let spec: WorkflowSpec = serde_json::from_value(serde_json::json!({
        "tenant": "acme", "name": "wf", "schedule": {"every": "1h"},
        "steps": [
            {"name": "a", "target": {"type": "queue", "queue": "q"}, "retry": {"max_attempts": 2}},
            {"name": "b", "target": {"type": "queue", "queue": "q"}, "after": ["a"],
             "payload": {"table": "t"}},
            {"name": "c", "target": {"type": "queue", "queue": "q"}}
        ]
    }))
    .unwrap();
    let mut j = job("acme", at);
    j.spec = spec.into_job();
    j
}

/// The tickets of a run at `at`, as the shard writes them: `b` waiting.
fn step_tickets(j: &JobRow, at: i64) -> Vec<Ticket> {
    (0..3)
        .map(|item| {
            let mut t = ticket(j, at, 1);
            t.item = item;
            t.items = 3;
            t.attempt = if item == 1 { 0 } else { 1 };
            t
        })
        .collect()
}

/// Starts a run at `at`: returns the tickets published (a and c) and all three.
async fn start(s: &Store, j: &JobRow, at: i64) -> (Vec<Ticket>, Vec<Ticket>) {
    s.create_job(j, None).await.unwrap();
    let all = step_tickets(j, at);
    let out = fire(s, j, None, None, all.clone(), at).await.unwrap();
    (out.tickets, all)
}

fn statuses(steps: &[StepRow]) -> Vec<RunStatus> {
    steps.iter().map(|s| s.status).collect()
}

fn released(t: &Ticket) -> Ticket {
    let mut t = t.clone();
    t.attempt = 1;
    t.payload = serde_json::json!({"table": "t", "upstream": {"a": "out"}});
    t
}

async fn run_status(s: &Store, j: &JobRow, at: i64) -> RunStatus {
    s.runs(j.id, Some(at + 1), 1).await.unwrap()[0].status
}

async fn a_run_starts_with_its_roots_dispatched_and_the_rest_waiting(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = workflow(1_000);
    let (published, all) = start(&s, &j, 1_000).await;
    let items: Vec<u32> = published.iter().map(|t| t.item).collect();
    assert_eq!(items, vec![0, 2], "b waits: not published");
    let steps = s.run_steps(j.id, 1_000).await.unwrap();
    assert_eq!(
        statuses(&steps),
        vec![
            RunStatus::Dispatched,
            RunStatus::Waiting,
            RunStatus::Dispatched
        ]
    );
    let waiting = s.ticket(all[1].ticket_id).await.unwrap().unwrap();
    assert!(waiting.attempts.is_empty(), "{waiting:?}");
    assert_eq!(s.waiting_runs().await.unwrap(), vec![(j.id, 1_000)]);
    assert_eq!(run_status(&s, &j, 1_000).await, RunStatus::Dispatched);
    assert_eq!(
        s.list_jobs(JobKind::Workflow, None, None, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(s
        .list_jobs(JobKind::Job, None, None, 10)
        .await
        .unwrap()
        .is_empty());
}

async fn a_step_end_is_followed_up_and_an_advance_applies_once(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = workflow(1_000);
    let (_, all) = start(&s, &j, 1_000).await;
    let mut done = report(&all[0], 1, ResultKind::Succeeded, 1_100);
    done.output = Some("out".into());
    let applied = s.apply_results(&[done], 1_100).await.unwrap();
    assert!(
        applied.follow_ups.contains(&FollowUp::StepEnded {
            job: j.id,
            at: 1_000
        }),
        "{applied:?}"
    );
    let steps = s.run_steps(j.id, 1_000).await.unwrap();
    assert_eq!(steps[0].output.as_deref(), Some("out"));
    for expected in [1, 0] {
        let out = s
            .advance_steps(vec![released(&all[1])], &[], &[], 1_200)
            .await
            .unwrap();
        assert_eq!(out.released.len(), expected, "released once");
    }
    let b = s.ticket(all[1].ticket_id).await.unwrap().unwrap();
    assert_eq!((b.status, b.attempts.len()), (RunStatus::Dispatched, 1));
    assert!(s.waiting_runs().await.unwrap().is_empty());
    let results = [
        report(&released(&all[1]), 1, ResultKind::Succeeded, 1_300),
        report(&all[2], 1, ResultKind::Succeeded, 1_300),
    ];
    s.apply_results(&results, 1_300).await.unwrap();
    assert_eq!(run_status(&s, &j, 1_000).await, RunStatus::Succeeded);
}

async fn a_step_fails_under_its_own_retry_policy_and_skips_end_the_run(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = workflow(1_000);
    let (_, all) = start(&s, &j, 1_000).await;
    // a may be tried twice (the workflow's own job-level policy allows one attempt).
    let a = s
        .apply_results(&[report(&all[0], 1, ResultKind::Failed, 1_100)], 1_100)
        .await
        .unwrap();
    assert!(
        matches!(a.follow_ups[0], FollowUp::Retry { attempt: 2, .. }),
        "{a:?}"
    );
    let a = s
        .apply_results(&[report(&all[0], 2, ResultKind::Failed, 1_200)], 1_200)
        .await
        .unwrap();
    assert_eq!(a.dead, 1);
    let out = s
        .advance_steps(
            Vec::new(),
            &[(all[1].ticket_id, "a died".into())],
            &[],
            1_300,
        )
        .await
        .unwrap();
    assert_eq!(out.skipped, 1);
    let b = s.ticket(all[1].ticket_id).await.unwrap().unwrap();
    assert_eq!(b.reason.as_deref(), Some("a died"));
    // c still runs: the run has not ended, and a shard that opens now finds it (`fail_fast`
    // would cancel c).
    assert_eq!(run_status(&s, &j, 1_000).await, RunStatus::Dispatched);
    assert_eq!(s.waiting_runs().await.unwrap(), vec![(j.id, 1_000)]);
    let out = s
        .advance_steps(Vec::new(), &[], &[all[2].ticket_id], 1_400)
        .await
        .unwrap();
    assert_eq!(out.cancelled.len(), 1);
    assert_eq!(out.cancelled[0].ticket, all[2].ticket_id);
    assert_eq!(run_status(&s, &j, 1_000).await, RunStatus::Dead);
    assert!(s.waiting_runs().await.unwrap().is_empty());
    // A late success of the cancelled step changes nothing.
    let late = s
        .apply_results(&[report(&all[2], 1, ResultKind::Succeeded, 1_500)], 1_500)
        .await
        .unwrap();
    assert_eq!(late.changed, 0);
}

async fn a_failed_run_is_retried_from_its_failed_steps(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = workflow(1_000);
    let (_, all) = start(&s, &j, 1_000).await;
    let run_id = all[0].ticket_id;
    assert!(matches!(
        s.retry_run(run_id, 3, 1_050).await.unwrap(),
        RetryRun::NotFailed
    ));
    end_badly(&s, &all).await;
    assert_eq!(run_status(&s, &j, 1_000).await, RunStatus::Dead);
    let RetryRun::Retried(again) = s.retry_run(run_id, 3, 1_400).await.unwrap() else {
        panic!("retried")
    };
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].ticket_id, again[0].attempt), (run_id, 3));
    let steps = s.run_steps(j.id, 1_000).await.unwrap();
    assert_eq!(
        statuses(&steps),
        vec![
            RunStatus::Dispatched,
            RunStatus::Waiting,
            RunStatus::Succeeded
        ]
    );
    assert_eq!(run_status(&s, &j, 1_000).await, RunStatus::Dispatched);
    // The retry counts its budget afresh: a failure of attempt 3 is retried.
    let a = s
        .apply_results(&[report(&again[0], 3, ResultKind::Failed, 1_500)], 1_500)
        .await
        .unwrap();
    assert!(
        matches!(a.follow_ups[0], FollowUp::Retry { attempt: 4, .. }),
        "{a:?}"
    );
    // Only a run's id (its first step's ticket) names it.
    assert!(matches!(
        s.retry_run(all[1].ticket_id, 3, 1_600).await.unwrap(),
        RetryRun::NotFound
    ));
    assert!(matches!(
        s.retry_run(Uuid::now_v7(), 3, 1_600).await.unwrap(),
        RetryRun::NotFound
    ));
}

/// `a` dies, `b` is skipped, `c` succeeds: the run as the tests below start from.
async fn dead_run(s: &Store, j: &JobRow) -> Vec<Ticket> {
    let (_, all) = start(s, j, 1_000).await;
    end_badly(s, &all).await;
    all
}

/// Ends the started run of `all` as `dead_run` says.
async fn end_badly(s: &Store, all: &[Ticket]) {
    for (attempt, at) in [(1, 1_100), (2, 1_200)] {
        s.apply_results(&[report(&all[0], attempt, ResultKind::Failed, at)], at)
            .await
            .unwrap();
    }
    s.apply_results(&[report(&all[2], 1, ResultKind::Succeeded, 1_250)], 1_250)
        .await
        .unwrap();
    s.advance_steps(
        Vec::new(),
        &[(all[1].ticket_id, "a died".into())],
        &[],
        1_300,
    )
    .await
    .unwrap();
}

async fn a_replayed_step_leaves_the_run_failed_and_a_retry_runs_what_it_skipped(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = workflow(1_000);
    let all = dead_run(&s, &j).await;
    let Replay::Replayed(again) = s.replay(all[0].ticket_id, 1_400).await.unwrap() else {
        panic!("replayed")
    };
    s.apply_results(&[report(&again, 3, ResultKind::Succeeded, 1_500)], 1_500)
        .await
        .unwrap();
    // b never ran: the run did not succeed.
    assert_eq!(run_status(&s, &j, 1_000).await, RunStatus::Failed);
    // A retry reruns nothing that ran, and b waits again (the shard then releases it).
    let RetryRun::Retried(rerun) = s.retry_run(all[0].ticket_id, 3, 1_600).await.unwrap() else {
        panic!("retried")
    };
    assert!(rerun.is_empty(), "{rerun:?}");
    let steps = s.run_steps(j.id, 1_000).await.unwrap();
    assert_eq!(steps[1].status, RunStatus::Waiting);
    assert_eq!(s.waiting_runs().await.unwrap(), vec![(j.id, 1_000)]);
    // A run whose workflow has other steps now is not retried.
    assert!(matches!(
        s.retry_run(all[0].ticket_id, 2, 1_700).await.unwrap(),
        RetryRun::Changed
    ));
}

async fn a_run_withdrawn_before_it_was_due_takes_its_waiting_steps_along(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = workflow(5_000);
    s.create_job(&j, None).await.unwrap();
    let all = step_tickets(&j, 5_000);
    // Written ahead of its time (`fire_lead`), then withdrawn by a pause before it was due.
    fire(&s, &j, Some(5_000), Some(3_605_000), all.clone(), 4_900)
        .await
        .unwrap();
    let mut tx = s.write().await.unwrap();
    super::super::tickets::unfire(&mut tx, &[all[0].ticket_id, all[2].ticket_id])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(s.run_steps(j.id, 5_000).await.unwrap().is_empty());
    assert!(s.runs(j.id, None, 10).await.unwrap().is_empty());
    assert!(s.waiting_runs().await.unwrap().is_empty());
    assert!(!s.has_active_run(j.id).await.unwrap());
}

async fn a_replaced_run_is_not_retried(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let mut j = workflow(1_000);
    j.spec.overlap = chronoshard_wire::Overlap::Replace;
    let (_, all) = start(&s, &j, 1_000).await;
    // The next run replaces this one while a runs and b waits.
    let next: Vec<Ticket> = step_tickets(&j, 2_000);
    let out = fire(&s, &j, None, None, next, 2_000).await.unwrap();
    assert_eq!(out.replaced, 1);
    let steps = s.run_steps(j.id, 1_000).await.unwrap();
    assert!(
        steps.iter().all(|s| s.status == RunStatus::Cancelled),
        "{steps:?}"
    );
    assert!(matches!(
        s.retry_run(all[0].ticket_id, 3, 2_100).await.unwrap(),
        RetryRun::NotFailed
    ));
}

async fn a_fenced_owner_advances_nothing(db: TestDb) {
    let old = open(&db, 1).await.unwrap();
    let j = workflow(1_000);
    let (_, all) = start(&old, &j, 1_000).await;
    let new = open(&db, 2).await.unwrap();
    let err = old
        .advance_steps(vec![released(&all[1])], &[], &[], 1_100)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    let steps = new.run_steps(j.id, 1_000).await.unwrap();
    assert_eq!(steps[1].status, RunStatus::Waiting);
    assert_eq!(steps[1].ticket.attempt, 0);
    assert_eq!(steps[1].ticket.v, PROTOCOL_VERSION);
}

store_tests!(
    a_replayed_step_leaves_the_run_failed_and_a_retry_runs_what_it_skipped,
    a_run_withdrawn_before_it_was_due_takes_its_waiting_steps_along,
    a_replaced_run_is_not_retried,
    a_run_starts_with_its_roots_dispatched_and_the_rest_waiting,
    a_step_end_is_followed_up_and_an_advance_applies_once,
    a_step_fails_under_its_own_retry_policy_and_skips_end_the_run,
    a_failed_run_is_retried_from_its_failed_steps,
    a_fenced_owner_advances_nothing,
);
