//! What the worker protocol's additions do to the shard database: checkpoints carried to the
//! next attempt and to a replay, permanent failures, captured output, and released attempts.

use chronoshard_wire::Backoff;
use serde_json::json;

use super::{engine::with_retry, *};

async fn a_checkpoint_reaches_the_next_attempt_and_a_replay(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = with_retry(job("t", 1000), 2, Backoff::Fixed);
    s.create_job(&j, None).await.unwrap();
    let t = fired(&s, &j, 1000).await;
    let mut progress = report(&t, 1, ResultKind::Progress, 1500);
    progress.checkpoint = Some(json!({"rows": 10}));
    s.apply_results(&[report(&t, 1, ResultKind::Started, 1100), progress], 1500)
        .await
        .unwrap();
    s.apply_results(&[report(&t, 1, ResultKind::Failed, 2000)], 2000)
        .await
        .unwrap();
    let next = s.pending_attempt(t.ticket_id, 2).await.unwrap().unwrap();
    assert_eq!(next.checkpoint, Some(json!({"rows": 10})));

    // A late checkpoint of attempt 1 does not overwrite what attempt 2 records.
    let mut late = report(&t, 1, ResultKind::Progress, 2100);
    late.checkpoint = Some(json!({"rows": 11}));
    let mut newer = report(&t, 2, ResultKind::Failed, 3000);
    newer.checkpoint = Some(json!({"rows": 20}));
    s.apply_results(&[late, newer], 3000).await.unwrap();
    // A copy of the final report, with another checkpoint, comes after the end: ignored.
    let mut copy = report(&t, 2, ResultKind::Failed, 3500);
    copy.checkpoint = Some(json!({"rows": 99}));
    s.apply_results(&[copy], 3500).await.unwrap();
    let view = s.ticket(t.ticket_id).await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Dead);
    assert_eq!(view.checkpoint, Some(json!({"rows": 20})));
    let Replay::Replayed(replayed) = s.replay(t.ticket_id, 4000).await.unwrap() else {
        panic!("a dead letter is replayed")
    };
    assert_eq!(replayed.attempt, 3);
    assert_eq!(replayed.checkpoint, Some(json!({"rows": 20})));
}

async fn a_permanent_failure_is_dead_at_once_and_keeps_its_output(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = with_retry(job("t", 1000), 5, Backoff::Fixed);
    s.create_job(&j, None).await.unwrap();
    let t = fired(&s, &j, 1000).await;
    let mut failed = report(&t, 1, ResultKind::Failed, 2000);
    failed.permanent = true;
    failed.output = Some("bad input\n".into());
    let a = s.apply_results(&[failed], 2000).await.unwrap();
    assert_eq!(a.dead, 1);
    let view = s.ticket(t.ticket_id).await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Dead);
    assert_eq!(view.attempts.len(), 1);
    assert_eq!(view.attempts[0].output.as_deref(), Some("bad input\n"));
}

async fn a_release_unstarts_the_attempt_only_for_the_worker_running_it(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = job("t", 1000);
    s.create_job(&j, None).await.unwrap();
    let t = fired(&s, &j, 1000).await;
    s.apply_results(&[report(&t, 1, ResultKind::Started, 1100)], 1100)
        .await
        .unwrap();
    let mut other = report(&t, 1, ResultKind::Released, 1200);
    other.worker = "another".into();
    assert_eq!(s.apply_results(&[other], 1200).await.unwrap().changed, 0);
    let open_attempt = s.open_attempt(t.ticket_id, 1).await.unwrap().unwrap();
    assert_eq!(open_attempt.started_at, Some(1100));

    let released = report(&t, 1, ResultKind::Released, 1300);
    assert_eq!(s.apply_results(&[released], 1300).await.unwrap().changed, 1);
    let open_attempt = s.open_attempt(t.ticket_id, 1).await.unwrap().unwrap();
    assert_eq!(open_attempt.started_at, None);
    let view = s.ticket(t.ticket_id).await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Dispatched);
    assert_eq!(view.attempts[0].worker, None);
    // Another worker takes the delivery over and finishes it.
    let mut start = report(&t, 1, ResultKind::Started, 2000);
    start.worker = "w2".into();
    let mut done = report(&t, 1, ResultKind::Succeeded, 2500);
    done.worker = "w2".into();
    s.apply_results(&[start, done], 2500).await.unwrap();
    let view = s.ticket(t.ticket_id).await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Succeeded);
    assert_eq!(view.attempts[0].worker.as_deref(), Some("w2"));
}

store_tests!(
    a_checkpoint_reaches_the_next_attempt_and_a_replay,
    a_permanent_failure_is_dead_at_once_and_keeps_its_output,
    a_release_unstarts_the_attempt_only_for_the_worker_running_it,
);
