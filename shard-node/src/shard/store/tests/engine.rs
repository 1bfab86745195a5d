//! Retries, dead letters and replay, the watchdog's reads, overlap policies, sharded occurrences
//! and tenant pauses, at the store level.

use chronoshard_wire::{Backoff, Dur, Overlap, RetrySpec, RunView};

use super::*;

pub(super) fn with_retry(mut j: JobRow, max_attempts: u32, backoff: Backoff) -> JobRow {
    j.spec.retry = RetrySpec {
        max_attempts,
        backoff,
        initial: Dur(std::time::Duration::from_secs(1)),
        max: Dur(std::time::Duration::from_secs(60)),
    };
    j
}

async fn run_at(s: &Store, j: &JobRow, at: i64) -> RunView {
    s.runs(j.id, None, 100)
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.scheduled_at == from_millis(at))
        .unwrap_or_else(|| panic!("no run at {at}"))
}

async fn a_failed_attempt_is_retried_under_the_same_ticket_until_it_is_dead(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = with_retry(job("t", 1000), 3, Backoff::Exponential);
    s.create_job(&j, None).await.unwrap();
    let t = fired(&s, &j, 1000).await;
    s.mark_published(&[acked(t.ticket_id, 1)], 1001)
        .await
        .unwrap();

    // attempt 1 fails at 2000: attempt 2 waits 1 s (initial), attempt 3 waits 2 s (doubled)
    let a = s
        .apply_results(&[report(&t, 1, ResultKind::Failed, 2000)], 2000)
        .await
        .unwrap();
    assert_eq!(
        a.follow_ups,
        vec![FollowUp::Retry {
            ticket: t.ticket_id,
            attempt: 2,
            at: 3000
        }]
    );
    assert_eq!(run_at(&s, &j, 1000).await.status, RunStatus::Retrying);
    // not in the outbox before its backoff ends, nor before then as a pending attempt
    assert!(s.unpublished(10_000, 2999, 10).await.unwrap().is_empty());
    let next = s.unpublished(10_000, 3000, 10).await.unwrap();
    assert_eq!(
        (next[0].ticket.ticket_id, next[0].ticket.attempt),
        (t.ticket_id, 2),
        "same ticket, next attempt"
    );
    assert_eq!(
        s.pending_attempt(t.ticket_id, 2)
            .await
            .unwrap()
            .unwrap()
            .attempt,
        2
    );
    assert!(s.pending_attempt(t.ticket_id, 1).await.unwrap().is_none());
    s.mark_published(&[acked(t.ticket_id, 2)], 3001)
        .await
        .unwrap();
    assert!(s.pending_attempt(t.ticket_id, 2).await.unwrap().is_none());

    // a failure of an attempt that is not current any more changes nothing
    let stale = s
        .apply_results(&[report(&t, 1, ResultKind::Failed, 3002)], 3002)
        .await
        .unwrap();
    assert_eq!((stale.changed, stale.follow_ups.len()), (0, 0));

    let a = s
        .apply_results(&[report(&t, 2, ResultKind::Failed, 4000)], 4000)
        .await
        .unwrap();
    assert_eq!(
        a.follow_ups,
        vec![FollowUp::Retry {
            ticket: t.ticket_id,
            attempt: 3,
            at: 6000
        }]
    );
    let a = s
        .apply_results(&[report(&t, 3, ResultKind::Failed, 7000)], 7000)
        .await
        .unwrap();
    assert_eq!(a.dead, 1);
    assert_eq!(
        a.follow_ups,
        vec![FollowUp::RunEnded { job: j.id }],
        "no fourth attempt"
    );
    let run = run_at(&s, &j, 1000).await;
    assert_eq!((run.status, run.attempts), (RunStatus::Dead, 3));
    assert_eq!(run.reason.as_deref(), Some("boom 3"));
    let view = s.ticket(t.ticket_id).await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Dead);
    let statuses: Vec<_> = view.attempts.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [RunStatus::Failed; 3]);

    let dlq = s.dead_letters(None, None, 10).await.unwrap();
    assert_eq!(dlq.len(), 1);
    assert_eq!(
        (dlq[0].ticket_id, dlq[0].attempts, dlq[0].error.as_deref()),
        (t.ticket_id, 3, Some("boom 3"))
    );

    // replay: attempt 4, out of the dead letters, with a fresh budget of 3
    let Replay::Replayed(r) = s.replay(t.ticket_id, 8000).await.unwrap() else {
        panic!("not replayed")
    };
    assert_eq!((r.ticket_id, r.attempt), (t.ticket_id, 4));
    assert!(s.dead_letters(None, None, 10).await.unwrap().is_empty());
    assert!(matches!(
        s.replay(t.ticket_id, 8001).await.unwrap(),
        Replay::NotDead
    ));
    assert!(matches!(
        s.replay(Uuid::now_v7(), 8001).await.unwrap(),
        Replay::NotFound
    ));
    assert_eq!(run_at(&s, &j, 1000).await.status, RunStatus::Dispatched);
    let a = s
        .apply_results(&[report(&t, 4, ResultKind::Failed, 9000)], 9000)
        .await
        .unwrap();
    assert!(
        matches!(a.follow_ups[..], [FollowUp::Retry { attempt: 5, .. }]),
        "{a:?}"
    );
}

async fn the_default_single_attempt_goes_straight_to_the_dead_letters(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = job("t", 1000);
    s.create_job(&j, None).await.unwrap();
    let t = fired(&s, &j, 1000).await;
    let a = s
        .apply_results(&[report(&t, 1, ResultKind::Failed, 1500)], 1500)
        .await
        .unwrap();
    assert_eq!(a.dead, 1);
    assert_eq!(run_at(&s, &j, 1000).await.status, RunStatus::Dead);
}

async fn a_deleted_jobs_failed_ticket_is_not_retried(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let mut j = with_retry(job("t", 1000), 5, Backoff::Fixed);
    s.create_job(&j, None).await.unwrap();
    let t = fired(&s, &j, 1000).await;
    j.state = JobState::Deleted;
    j.next_fire_at = None;
    s.update_job(&j, &[]).await.unwrap();
    let a = s
        .apply_results(&[report(&t, 1, ResultKind::Failed, 1500)], 1500)
        .await
        .unwrap();
    assert_eq!((a.dead, a.changed), (0, 1));
    assert!(!a
        .follow_ups
        .iter()
        .any(|f| matches!(f, FollowUp::Retry { .. })));
    assert_eq!(run_at(&s, &j, 1000).await.status, RunStatus::Failed);
}

async fn started_and_progress_reports_feed_the_watchdog(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = job("t", 1000);
    s.create_job(&j, None).await.unwrap();
    let t = fired(&s, &j, 1000).await;
    let a = s
        .apply_results(&[report(&t, 1, ResultKind::Started, 1100)], 1100)
        .await
        .unwrap();
    assert_eq!(
        a.follow_ups,
        vec![FollowUp::Started {
            ticket: t.ticket_id,
            attempt: 1,
            started_at: 1100,
            timeout_ms: 1000
        }]
    );
    s.apply_results(&[report(&t, 1, ResultKind::Progress, 5000)], 5000)
        .await
        .unwrap();
    // a report counts from when the shard applies it, whatever the worker's clock said
    s.apply_results(&[report(&t, 1, ResultKind::Progress, 4000)], 5001)
        .await
        .unwrap();
    let open = s.open_attempt(t.ticket_id, 1).await.unwrap().unwrap();
    assert_eq!(
        (open.started_at, open.progress_at, open.timeout_ms),
        (Some(1100), Some(5001), 1000)
    );
    assert_eq!(s.open_attempts().await.unwrap(), vec![open]);
    // the worker died; JetStream delivered the attempt to another, which reports its start:
    // the watchdog's clock starts again
    let mut again = report(&t, 1, ResultKind::Started, 40_000);
    again.worker = "w2".into();
    let a = s.apply_results(&[again], 40_000).await.unwrap();
    assert!(
        matches!(
            a.follow_ups[..],
            [FollowUp::Started {
                started_at: 40_000,
                ..
            }]
        ),
        "{a:?}"
    );
    let open = s.open_attempt(t.ticket_id, 1).await.unwrap().unwrap();
    assert_eq!((open.started_at, open.progress_at), (Some(40_000), None));
    // the watchdog's verdict is applied as a failure; the real result, late, changes nothing
    let mut lost = report(&t, 1, ResultKind::Failed, 60_000);
    lost.worker = "watchdog".into();
    assert_eq!(s.apply_results(&[lost], 60_000).await.unwrap().changed, 1);
    let late = s
        .apply_results(&[report(&t, 1, ResultKind::Succeeded, 61_000)], 61_000)
        .await
        .unwrap();
    assert_eq!(late.changed, 0);
    assert!(s.open_attempt(t.ticket_id, 1).await.unwrap().is_none());
    let view = s.ticket(t.ticket_id).await.unwrap().unwrap();
    assert_eq!(view.attempts[0].worker.as_deref(), Some("watchdog"));
}

async fn a_retry_waiting_for_its_backoff_survives_a_new_owner(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = with_retry(job("t", 1000), 2, Backoff::Fixed);
    s.create_job(&j, None).await.unwrap();
    let t = fired(&s, &j, 1000).await;
    s.apply_results(&[report(&t, 1, ResultKind::Failed, 1500)], 1500)
        .await
        .unwrap();
    drop(s);
    let s = open(&db, 2).await.unwrap();
    let open = s.open_attempts().await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(
        (open[0].attempt, open[0].not_before, open[0].published_at),
        (2, Some(2500), None)
    );
}

async fn fire_at(s: &Store, j: &JobRow, at: i64) -> FireOutcome {
    fire(s, j, None, None, vec![ticket(j, at, 1)], at)
        .await
        .unwrap()
}

async fn overlap_forbid_skips_while_a_run_is_active(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let mut j = job("t", 1000);
    j.spec.overlap = Overlap::Forbid;
    s.create_job(&j, None).await.unwrap();
    let t = fired(&s, &j, 1000).await;
    let out = fire_at(&s, &j, 2000).await;
    assert!(out.tickets.is_empty());
    assert_eq!(
        out.occurrences,
        vec![(2000, Fired::Skipped(reason::OVERLAP_SKIPPED))]
    );
    let run = run_at(&s, &j, 2000).await;
    assert_eq!(run.status, RunStatus::Skipped);
    assert_eq!(run.reason.as_deref(), Some(reason::OVERLAP_SKIPPED));
    // once the run ended, the next occurrence fires
    s.apply_results(&[report(&t, 1, ResultKind::Succeeded, 2500)], 2500)
        .await
        .unwrap();
    assert_eq!(fire_at(&s, &j, 3000).await.tickets.len(), 1);
}

async fn overlap_buffer_one_holds_one_occurrence_and_releases_it_when_the_run_ends(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let mut j = job("t", 1000);
    j.spec.overlap = Overlap::BufferOne;
    s.create_job(&j, None).await.unwrap();
    let t = fired(&s, &j, 1000).await;
    assert_eq!(
        fire_at(&s, &j, 2000).await.occurrences,
        vec![(2000, Fired::Buffered)]
    );
    assert_eq!(
        fire_at(&s, &j, 3000).await.occurrences,
        vec![(3000, Fired::Skipped(reason::BUFFER_FULL))]
    );
    assert_eq!(run_at(&s, &j, 2000).await.status, RunStatus::Scheduled);
    assert_eq!(s.jobs_with_buffered().await.unwrap(), vec![j.id]);
    // still active: nothing is released
    let none = s
        .release_buffered(j.id, |at| vec![ticket(&j, at, 1)], 2600)
        .await
        .unwrap();
    assert!(none.is_empty());
    let a = s
        .apply_results(&[report(&t, 1, ResultKind::Succeeded, 3500)], 3500)
        .await
        .unwrap();
    assert_eq!(a.follow_ups, vec![FollowUp::RunEnded { job: j.id }]);
    let released = s
        .release_buffered(j.id, |at| vec![ticket(&j, at, 1)], 3600)
        .await
        .unwrap();
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].scheduled_at, from_millis(2000));
    let run = run_at(&s, &j, 2000).await;
    assert_eq!(
        (run.status, run.ticket_ids.len()),
        (RunStatus::Dispatched, 1)
    );
    assert!(s.jobs_with_buffered().await.unwrap().is_empty());
    // released once only
    assert!(s
        .release_buffered(j.id, |at| vec![ticket(&j, at, 1)], 3700)
        .await
        .unwrap()
        .is_empty());
}

async fn overlap_replace_cancels_the_active_run_and_ignores_its_late_result(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let mut j = with_retry(job("t", 1000), 3, Backoff::Fixed);
    j.spec.overlap = Overlap::Replace;
    s.create_job(&j, None).await.unwrap();
    // published, not started yet: taken back from the stream by its sequence
    let unstarted = fired(&s, &j, 500).await;
    s.mark_published(&[acked(unstarted.ticket_id, 1)], 600)
        .await
        .unwrap();
    let out = fire_at(&s, &j, 1000).await;
    let cancelled = |ticket, worker: Option<&str>, publish_seq| Cancelled {
        ticket,
        attempt: 1,
        worker: worker.map(str::to_string),
        publish_seq,
        reason: reason::REPLACED,
    };
    assert_eq!(out.replaced, 1);
    assert_eq!(
        out.cancel,
        vec![cancelled(unstarted.ticket_id, None, Some(1000))]
    );
    // started: its worker is told to stop
    let old = out.tickets[0].clone();
    s.mark_published(&[acked(old.ticket_id, 1)], 1050)
        .await
        .unwrap();
    s.apply_results(&[report(&old, 1, ResultKind::Started, 1100)], 1100)
        .await
        .unwrap();
    let out = fire_at(&s, &j, 2000).await;
    assert_eq!((out.tickets.len(), out.replaced), (1, 1));
    assert_eq!(out.cancel, vec![cancelled(old.ticket_id, Some("w"), None)]);
    for (at, t) in [(500, &unstarted), (1000, &old)] {
        let run = run_at(&s, &j, at).await;
        assert_eq!(run.status, RunStatus::Cancelled);
        assert_eq!(run.reason.as_deref(), Some(reason::REPLACED));
        let view = s.ticket(t.ticket_id).await.unwrap().unwrap();
        assert_eq!(view.status, RunStatus::Cancelled);
        assert_eq!(view.attempts[0].status, RunStatus::Cancelled);
        assert_eq!(view.attempts[0].error.as_deref(), Some(reason::REPLACED));
    }
    let late = s
        .apply_results(&[report(&old, 1, ResultKind::Failed, 2100)], 2100)
        .await
        .unwrap();
    assert_eq!(
        (late.changed, late.follow_ups.len()),
        (0, 0),
        "no retry of a replaced run"
    );
    assert_eq!(run_at(&s, &j, 2000).await.status, RunStatus::Dispatched);
}

async fn a_sharded_occurrence_succeeds_when_every_item_does(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = job("t", 1000);
    s.create_job(&j, None).await.unwrap();
    let items: Vec<Ticket> = (0..3)
        .map(|i| {
            let mut t = ticket(&j, 1000, 1);
            (t.item, t.items) = (i, 3);
            t
        })
        .collect();
    let out = fire(&s, &j, None, None, items, 1000).await.unwrap();
    assert_eq!(out.tickets.len(), 3);
    for (i, t) in out.tickets.iter().enumerate() {
        s.apply_results(
            &[report(t, 1, ResultKind::Succeeded, 2000 + i as i64)],
            2000,
        )
        .await
        .unwrap();
        let expect = if i < 2 {
            RunStatus::Dispatched
        } else {
            RunStatus::Succeeded
        };
        assert_eq!(run_at(&s, &j, 1000).await.status, expect, "after item {i}");
    }
    assert_eq!(run_at(&s, &j, 1000).await.ticket_ids.len(), 3);
}

async fn one_dead_item_makes_the_occurrence_dead(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = job("t", 1000);
    s.create_job(&j, None).await.unwrap();
    let items: Vec<Ticket> = (0..2)
        .map(|i| {
            let mut t = ticket(&j, 1000, 1);
            (t.item, t.items) = (i, 2);
            t
        })
        .collect();
    let out = fire(&s, &j, None, None, items, 1000).await.unwrap();
    s.apply_results(
        &[report(&out.tickets[0], 1, ResultKind::Failed, 1100)],
        1100,
    )
    .await
    .unwrap();
    assert_eq!(run_at(&s, &j, 1000).await.status, RunStatus::Dispatched);
    s.apply_results(
        &[report(&out.tickets[1], 1, ResultKind::Succeeded, 1200)],
        1200,
    )
    .await
    .unwrap();
    assert_eq!(run_at(&s, &j, 1000).await.status, RunStatus::Dead);
}

async fn a_paused_tenants_jobs_are_not_loaded(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let (a, b) = (job("a", 1000), job("b", 1000));
    s.create_job(&a, None).await.unwrap();
    s.create_job(&b, None).await.unwrap();
    assert!(s.pause_tenant("a", &[], 10).await.unwrap());
    assert!(
        !s.pause_tenant("a", &[], 11).await.unwrap(),
        "paused already"
    );
    let due: Vec<Uuid> = s
        .due_jobs(None, 5000)
        .await
        .unwrap()
        .iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(due, vec![b.id]);
    let view = s.tenant("a").await.unwrap();
    assert_eq!((view.paused, view.jobs), (true, 1));
    assert_eq!(s.paused_tenants().await.unwrap(), vec!["a".to_string()]);
    let mut moved = a.clone();
    moved.next_fire_at = Some(4000);
    assert!(s.resume_tenant("a", &[moved.clone()], 20).await.unwrap());
    // a second resume changes nothing, not even the jobs it is given
    moved.next_fire_at = Some(9000);
    assert!(!s.resume_tenant("a", &[moved], 21).await.unwrap());
    let due = s.due_jobs(None, 5000).await.unwrap();
    assert_eq!(due.len(), 2);
    assert!(due.iter().any(|d| d.id == a.id && d.at == 4000), "{due:?}");
    assert_eq!(s.active_jobs_of("a").await.unwrap()[0].id, a.id);
}

async fn dead_letters_page_by_cursor_and_filter_by_tenant(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let mut dead = Vec::new();
    for (i, tenant) in ["a", "a", "b", "a", "b"].iter().enumerate() {
        let j = job(tenant, 1000);
        s.create_job(&j, None).await.unwrap();
        let t = fired(&s, &j, 1000).await;
        // two letters die in the same millisecond: the id breaks the tie
        let at = 2000 + (i as i64 / 2);
        s.apply_results(&[report(&t, 1, ResultKind::Failed, at)], at)
            .await
            .unwrap();
        dead.push(t.ticket_id);
    }
    let mut seen = Vec::new();
    let mut before = None;
    loop {
        let page = s.dead_letters(None, before, 2).await.unwrap();
        seen.extend(page.iter().map(|d| d.ticket_id));
        match page.last() {
            Some(d) if page.len() == 2 => {
                before = Some((d.dead_at.timestamp_millis(), d.ticket_id))
            }
            _ => break,
        }
    }
    let mut expect = dead.clone();
    expect.reverse();
    assert_eq!(seen, expect, "every letter once, newest first");
    let only_b = s.dead_letters(Some("b"), None, 10).await.unwrap();
    assert_eq!(
        only_b.iter().map(|d| d.ticket_id).collect::<Vec<_>>(),
        vec![dead[4], dead[2]]
    );
}

async fn a_buffered_occurrence_is_not_overtaken_before_its_release(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let mut j = job("t", 1000);
    j.spec.overlap = Overlap::BufferOne;
    s.create_job(&j, None).await.unwrap();
    let t = fired(&s, &j, 1000).await;
    assert_eq!(
        fire_at(&s, &j, 2000).await.occurrences,
        vec![(2000, Fired::Buffered)]
    );
    // the run ends; before the buffered one is released, the next occurrence falls due
    s.apply_results(&[report(&t, 1, ResultKind::Succeeded, 2500)], 2500)
        .await
        .unwrap();
    assert_eq!(
        fire_at(&s, &j, 3000).await.occurrences,
        vec![(3000, Fired::Skipped(reason::BUFFER_FULL))]
    );
    let released = s
        .release_buffered(j.id, |at| vec![ticket(&j, at, 1)], 3100)
        .await
        .unwrap();
    assert_eq!(released[0].scheduled_at, from_millis(2000));
}

async fn replace_leaves_an_occurrence_of_the_same_instant_alone(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let mut j = job("t", 1000);
    j.spec.overlap = Overlap::Replace;
    s.create_job(&j, None).await.unwrap();
    // a trigger at 1000, then the scheduled occurrence of the same millisecond
    fired(&s, &j, 1000).await;
    let out = fire_at(&s, &j, 1000).await;
    assert_eq!(
        (out.occurrences, out.replaced),
        (vec![(1000, Fired::Exists)], 0)
    );
    assert_eq!(run_at(&s, &j, 1000).await.status, RunStatus::Dispatched);
}

async fn a_batch_fires_each_job_once_and_a_stale_entry_spoils_nothing(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let (a, b) = (job("t", 1000), job("u", 1000));
    s.create_job(&a, None).await.unwrap();
    s.create_job(&b, None).await.unwrap();
    let jobs = s.get_jobs(&[a.id, b.id, Uuid::now_v7()]).await.unwrap();
    assert_eq!(jobs.len(), 2, "unknown ids are left out");
    let request = |j: &JobRow, expected: i64| FireRequest {
        job_id: j.id,
        expected_next: Some(expected),
        next_fire_at: Some(2000),
        not_fired: &[],
        occurrences: vec![(expected, vec![ticket(j, expected, 1)])],
        overlap: Overlap::Allow,
    };
    // b's entry is stale (its next occurrence is 1000, not 999)
    let outs = s
        .fire_batch(vec![request(&a, 1000), request(&b, 999)], 1000)
        .await
        .unwrap();
    assert_eq!((outs[0].tickets.len(), outs[0].stale), (1, false));
    assert_eq!((outs[1].tickets.len(), outs[1].stale), (0, true));
    assert_eq!(
        s.get_job(a.id).await.unwrap().unwrap().next_fire_at,
        Some(2000)
    );
    assert_eq!(
        s.get_job(b.id).await.unwrap().unwrap().next_fire_at,
        Some(1000)
    );
    assert!(s.runs(b.id, None, 10).await.unwrap().is_empty());
}

/// A batch of simple requests larger than one statement of each read and write (on SQLite all
/// of them in a few trips): every job moves on once, a duplicate and stale entries write nothing
/// (one of them for a job whose right entry comes after it), an occurrence with a run already
/// gets no ticket, and a last occurrence completes its job.
async fn a_large_simple_batch_writes_every_chunk(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let jobs: Vec<JobRow> = (0..250).map(|_| job("t", 1000)).collect();
    let new: Vec<(&JobRow, Option<&str>)> = jobs.iter().map(|j| (j, None)).collect();
    s.create_jobs(&new).await.unwrap();
    // jobs[1] has a run at 1000 already (a trigger in that millisecond)
    fire(
        &s,
        &jobs[1],
        None,
        None,
        vec![ticket(&jobs[1], 1000, 1)],
        1000,
    )
    .await
    .unwrap();
    let request = |j: &JobRow, expected: i64, next: Option<i64>| FireRequest {
        job_id: j.id,
        expected_next: Some(expected),
        next_fire_at: next,
        not_fired: &[],
        occurrences: vec![(expected, vec![ticket(j, expected, 1)])],
        overlap: Overlap::Allow,
    };
    let mut requests: Vec<FireRequest> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| request(j, 1000, (i != 2).then_some(2000)))
        .collect();
    requests[3] = request(&jobs[3], 999, Some(2000)); // stale
                                                      // jobs[4] at an occurrence it is not at, before its right entry
    requests.insert(4, request(&jobs[4], 2000, Some(3000)));
    requests.push(request(&jobs[0], 1000, Some(2000))); // a duplicate wheel entry
    let outs = s.fire_batch(requests, 1000).await.unwrap();
    assert_eq!(outs.len(), 252);
    let ticketed: Vec<usize> = (0..outs.len())
        .filter(|i| outs[*i].tickets.len() == 1)
        .collect();
    assert_eq!(
        ticketed.len(),
        248,
        "all but the existing, stale and duplicate"
    );
    assert!(outs[3].stale && outs[4].stale && outs[251].stale);
    assert!(!outs[0].stale && !outs[5].stale);
    assert_eq!(outs[1].occurrences, vec![(1000, Fired::Exists)]);
    for (i, j) in jobs.iter().enumerate() {
        let row = s.get_job(j.id).await.unwrap().unwrap();
        let want = match i {
            2 => (None, JobState::Completed),
            3 => (Some(1000), JobState::Active),
            _ => (Some(2000), JobState::Active),
        };
        assert_eq!((row.next_fire_at, row.state), want, "job {i}");
    }
    let count = |table: &str| {
        let sql = format!("SELECT COUNT(*) FROM {table}");
        let pool = s.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    // the 248 fired now and jobs[1]'s earlier one
    assert_eq!(
        (
            count("runs").await,
            count("tickets").await,
            count("attempts").await
        ),
        (249, 249, 249)
    );
}

async fn a_mixed_batch_keeps_its_order_and_writes_one_ticket_per_occurrence(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let (a, c) = (job("t", 1000), job("t", 1000));
    let mut b = job("t", 1000);
    b.spec.overlap = Overlap::Forbid;
    for j in [&a, &b, &c] {
        s.create_job(j, None).await.unwrap();
    }
    // c has a run at 1000 already (a trigger in that millisecond)
    fire(&s, &c, None, None, vec![ticket(&c, 1000, 1)], 1000)
        .await
        .unwrap();
    let request = |j: &JobRow| FireRequest {
        job_id: j.id,
        expected_next: Some(1000),
        next_fire_at: Some(2000),
        not_fired: &[],
        occurrences: vec![(1000, vec![ticket(j, 1000, 1)])],
        overlap: j.spec.overlap,
    };
    // a twice (a duplicate wheel entry), b under a policy, c with its run
    let outs = s
        .fire_batch(
            vec![request(&a), request(&b), request(&a), request(&c)],
            1000,
        )
        .await
        .unwrap();
    let seen: Vec<(bool, usize, Vec<Fired>)> = outs
        .iter()
        .map(|o| {
            let fired = o.occurrences.iter().map(|(_, f)| f.clone()).collect();
            (o.stale, o.tickets.len(), fired)
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            (false, 1, vec![Fired::Ticketed]),
            (false, 1, vec![Fired::Ticketed]),
            (true, 0, vec![]),
            (false, 0, vec![Fired::Exists]),
        ]
    );
    assert_eq!(outs[0].tickets[0].job_id, a.id);
    assert_eq!(outs[1].tickets[0].job_id, b.id);
    for j in [&a, &b, &c] {
        let runs = s.runs(j.id, None, 10).await.unwrap();
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!(runs[0].ticket_ids.len(), 1, "{runs:?}");
        assert_eq!(
            s.get_job(j.id).await.unwrap().unwrap().next_fire_at,
            Some(2000)
        );
    }
}

store_tests!(
    a_mixed_batch_keeps_its_order_and_writes_one_ticket_per_occurrence,
    a_batch_fires_each_job_once_and_a_stale_entry_spoils_nothing,
    a_large_simple_batch_writes_every_chunk,
    a_buffered_occurrence_is_not_overtaken_before_its_release,
    replace_leaves_an_occurrence_of_the_same_instant_alone,
    a_failed_attempt_is_retried_under_the_same_ticket_until_it_is_dead,
    the_default_single_attempt_goes_straight_to_the_dead_letters,
    a_deleted_jobs_failed_ticket_is_not_retried,
    started_and_progress_reports_feed_the_watchdog,
    a_retry_waiting_for_its_backoff_survives_a_new_owner,
    overlap_forbid_skips_while_a_run_is_active,
    overlap_buffer_one_holds_one_occurrence_and_releases_it_when_the_run_ends,
    overlap_replace_cancels_the_active_run_and_ignores_its_late_result,
    a_sharded_occurrence_succeeds_when_every_item_does,
    one_dead_item_makes_the_occurrence_dead,
    a_paused_tenants_jobs_are_not_loaded,
    dead_letters_page_by_cursor_and_filter_by_tenant,
);
