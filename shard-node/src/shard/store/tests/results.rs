//! Batches of results as the results consumer hands them over: several reports of one attempt,
//! duplicates, unknown tickets, reports that cross, failures among successes and sharded
//! occurrences in one batch. Each scenario also runs on a twin database through the former
//! one-result-at-a-time path (`reference`), and both must leave the same rows and report the
//! same changes.

use chronoshard_wire::{Backoff, Overlap};
use serde_json::json;

use super::{engine::with_retry, reference, *};

/// A shard database and its twin (another shard of the same `TestDb`), which applies results
/// through `reference`.
struct Twins {
    s: Store,
    r: Store,
}

impl Twins {
    async fn open(db: &TestDb) -> Twins {
        Twins {
            s: open(db, 1).await.unwrap(),
            r: Store::open(&db.dbs, 1, 1, "node-a", 0).await.unwrap(),
        }
    }

    /// Creates `j` and fires its occurrence at `at` (with `items` item tickets) in both, and
    /// marks the first attempts published at `at + 1`.
    async fn fire(&self, j: &JobRow, at: i64, items: u32) -> Vec<Ticket> {
        let tickets: Vec<Ticket> = (0..items)
            .map(|i| {
                let mut t = ticket(j, at, 1);
                (t.item, t.items) = (i, items);
                t
            })
            .collect();
        for s in [&self.s, &self.r] {
            let _ = s.create_job(j, None).await.unwrap();
            let out = fire(s, j, None, None, tickets.clone(), at).await.unwrap();
            assert_eq!(out.tickets.len(), tickets.len());
            let acks: Vec<Acked> = tickets.iter().map(|t| acked(t.ticket_id, 1)).collect();
            s.mark_published(&acks, at + 1).await.unwrap();
        }
        tickets
    }

    /// Applies `batch` to both, checks they agree, and returns what the batch path reported.
    async fn apply(&self, batch: &[TicketResult], now: i64) -> Applied {
        let got = self.s.apply_results(batch, now).await.unwrap();
        let want = reference::apply_results(&self.r, batch, now).await.unwrap();
        assert_eq!(
            (got.changed, got.dead, &got.follow_ups),
            (want.changed, want.dead, &want.follow_ups),
            "what was applied, batch {batch:#?}"
        );
        let (a, b) = (dump(&self.s).await, dump(&self.r).await);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x, y, "rows after batch {batch:#?}");
        }
        assert_eq!(a.len(), b.len());
        got
    }
}

/// Every row results may change, as text.
async fn dump(s: &Store) -> Vec<String> {
    let tables = [
        "SELECT id, job_id, scheduled_at, item, status, attempt, epoch, queue, body, checkpoint, \
         dead_at, attempt_base, timeout_ms, created_at, updated_at FROM tickets ORDER BY id",
        "SELECT ticket_id, attempt, status, created_at, published_at, started_at, finished_at, worker, \
         error, http_status, not_before, heartbeat_at, publish_seq, resends, output FROM attempts \
         ORDER BY ticket_id, attempt",
        "SELECT job_id, scheduled_at, status, reason, attempts, range_end, count, created_at, updated_at \
         FROM runs ORDER BY job_id, scheduled_at",
    ];
    let mut out = Vec::new();
    for sql in tables {
        let (cols, rest) = sql["SELECT ".len()..].split_once(" FROM ").unwrap();
        let cols: Vec<String> = cols
            .split(", ")
            .map(|c| format!("CAST({c} AS TEXT)"))
            .collect();
        let text = format!("SELECT {} FROM {rest}", cols.join(", "));
        for row in sqlx::query(&text).fetch_all(&s.pool).await.unwrap() {
            let values: Vec<Option<String>> =
                (0..cols.len()).map(|i| row.try_get(i).unwrap()).collect();
            out.push(format!("{values:?}"));
        }
    }
    out
}

fn by(mut r: TicketResult, worker: &str) -> TicketResult {
    r.worker = worker.into();
    r
}

async fn started_and_succeeded_of_one_attempt_in_one_batch(db: TestDb) {
    let tw = Twins::open(&db).await;
    let j = job("t", 1000);
    let t = tw.fire(&j, 1000, 1).await.remove(0);
    let mut done = report(&t, 1, ResultKind::Succeeded, 1200);
    done.http_status = Some(204);
    let a = tw
        .apply(&[report(&t, 1, ResultKind::Started, 1100), done], 1300)
        .await;
    assert_eq!((a.changed, a.dead), (2, 0));
    assert_eq!(
        a.follow_ups,
        vec![
            FollowUp::Started {
                ticket: t.ticket_id,
                attempt: 1,
                started_at: 1300,
                timeout_ms: 1000
            },
            FollowUp::RunEnded { job: j.id }
        ]
    );
    let view = tw.s.ticket(t.ticket_id).await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Succeeded);
    let at = &view.attempts[0];
    assert_eq!(
        (at.started_at, at.finished_at, at.published_at),
        (
            Some(from_millis(1300)),
            Some(from_millis(1200)),
            Some(from_millis(1001))
        )
    );
    assert_eq!(
        (at.worker.as_deref(), at.http_status),
        (Some("w"), Some(204))
    );
    assert!(tw.s.open_attempt(t.ticket_id, 1).await.unwrap().is_none());
    let run = &tw.s.runs(j.id, None, 1).await.unwrap()[0];
    assert_eq!((run.status, run.attempts), (RunStatus::Succeeded, 1));
}

async fn duplicates_in_one_batch_apply_once(db: TestDb) {
    let tw = Twins::open(&db).await;
    let j = job("t", 1000);
    let t = tw.fire(&j, 1000, 1).await.remove(0);
    let start = report(&t, 1, ResultKind::Started, 1100);
    let done = report(&t, 1, ResultKind::Succeeded, 1200);
    let batch = [
        start.clone(),
        start.clone(),
        done.clone(),
        done.clone(),
        start.clone(),
    ];
    let a = tw.apply(&batch, 1300).await;
    // the second start of the open attempt restarts its watchdog (a redelivery); the copies
    // after the end change nothing
    assert_eq!(a.changed, 3);
    assert_eq!(a.follow_ups.len(), 3, "{a:?}");
    assert!(matches!(a.follow_ups[2], FollowUp::RunEnded { .. }));
    let again = tw.apply(&batch, 1400).await;
    assert_eq!((again.changed, again.follow_ups.len()), (0, 0));
    let view = tw.s.ticket(t.ticket_id).await.unwrap().unwrap();
    assert_eq!(
        (view.status, view.attempts.len()),
        (RunStatus::Succeeded, 1)
    );
}

async fn a_result_for_an_unknown_ticket_changes_nothing(db: TestDb) {
    let tw = Twins::open(&db).await;
    let j = job("t", 1000);
    let t = tw.fire(&j, 1000, 1).await.remove(0);
    let mut unknown = ticket(&j, 1000, 1);
    unknown.ticket_id = Uuid::now_v7();
    let mut progress = report(&unknown, 1, ResultKind::Progress, 1100);
    progress.checkpoint = Some(json!({"rows": 1}));
    let batch = [
        report(&unknown, 1, ResultKind::Started, 1100),
        progress,
        report(&unknown, 1, ResultKind::Released, 1150),
        report(&t, 1, ResultKind::Succeeded, 1200),
        report(&unknown, 1, ResultKind::Succeeded, 1200),
        report(&unknown, 2, ResultKind::Failed, 1200),
    ];
    let a = tw.apply(&batch, 1300).await;
    assert_eq!((a.changed, a.dead), (1, 0));
    assert_eq!(a.follow_ups, vec![FollowUp::RunEnded { job: j.id }]);
    assert!(tw.s.ticket(unknown.ticket_id).await.unwrap().is_none());
    assert_eq!(
        tw.s.ticket(t.ticket_id).await.unwrap().unwrap().status,
        RunStatus::Succeeded
    );
}

async fn a_late_started_after_succeeded_records_only_the_start_time(db: TestDb) {
    let tw = Twins::open(&db).await;
    let j = job("t", 1000);
    let t = tw.fire(&j, 1000, 1).await.remove(0);
    // in one batch: the end first, then its start (the reports crossed)
    let a = tw
        .apply(
            &[
                by(report(&t, 1, ResultKind::Succeeded, 2000), "w1"),
                by(report(&t, 1, ResultKind::Started, 1500), "w2"),
            ],
            2100,
        )
        .await;
    assert_eq!(a.changed, 1);
    assert_eq!(a.follow_ups, vec![FollowUp::RunEnded { job: j.id }]);
    let view = tw.s.ticket(t.ticket_id).await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Succeeded);
    let at = &view.attempts[0];
    // the worker's own start time (no shard time to compare with), and the finishing worker
    assert_eq!(at.started_at, Some(from_millis(1500)));
    assert_eq!(at.worker.as_deref(), Some("w1"));
    // in two batches, and a second late start that finds the start recorded
    let k = job("t", 1000);
    let u = tw.fire(&k, 1000, 1).await.remove(0);
    tw.apply(&[report(&u, 1, ResultKind::Succeeded, 2000)], 2100)
        .await;
    let late = tw
        .apply(
            &[
                report(&u, 1, ResultKind::Started, 1500),
                report(&u, 1, ResultKind::Started, 1600),
            ],
            2200,
        )
        .await;
    assert_eq!((late.changed, late.follow_ups.len()), (0, 0));
    let view = tw.s.ticket(u.ticket_id).await.unwrap().unwrap();
    assert_eq!(view.attempts[0].started_at, Some(from_millis(1500)));
    assert_eq!(view.status, RunStatus::Succeeded);
}

async fn a_final_result_carrying_the_start_records_it_only_when_none_was_reported(db: TestDb) {
    let tw = Twins::open(&db).await;
    let j = job("t", 1000);
    // a short execution: its final result alone, with the start by the worker's clock
    let t = tw.fire(&j, 1000, 1).await.remove(0);
    let mut done = report(&t, 1, ResultKind::Succeeded, 1200);
    done.started_at = Some(from_millis(1150));
    let a = tw.apply(&[done], 1300).await;
    assert_eq!(a.follow_ups, vec![FollowUp::RunEnded { job: j.id }]);
    let view = tw.s.ticket(t.ticket_id).await.unwrap().unwrap();
    let at = &view.attempts[0];
    assert_eq!(
        (view.status, at.started_at, at.finished_at),
        (
            RunStatus::Succeeded,
            Some(from_millis(1150)),
            Some(from_millis(1200))
        )
    );
    // a start already recorded (the shard's time) is kept; a failure carries it the same way
    let k = job("u", 1000);
    let u = tw.fire(&k, 1000, 1).await.remove(0);
    tw.apply(&[report(&u, 1, ResultKind::Started, 1100)], 1110)
        .await;
    let mut failed = report(&u, 1, ResultKind::Failed, 1200);
    failed.started_at = Some(from_millis(1090));
    tw.apply(&[failed], 1300).await;
    let view = tw.s.ticket(u.ticket_id).await.unwrap().unwrap();
    assert_eq!(view.attempts[0].started_at, Some(from_millis(1110)));
}

async fn a_failure_with_retry_in_a_batch_of_successes(db: TestDb) {
    let tw = Twins::open(&db).await;
    let a = with_retry(job("t", 1000), 3, Backoff::Fixed);
    let (b, c) = (job("t", 1000), job("u", 1000));
    let ta = tw.fire(&a, 1000, 1).await.remove(0);
    let tb = tw.fire(&b, 1000, 1).await.remove(0);
    let tc = tw.fire(&c, 1000, 1).await.remove(0);
    let mut failed = report(&ta, 1, ResultKind::Failed, 1900);
    failed.checkpoint = Some(json!({"page": 7}));
    let batch = [
        report(&ta, 1, ResultKind::Started, 1100),
        report(&tb, 1, ResultKind::Started, 1100),
        report(&tc, 1, ResultKind::Started, 1100),
        report(&tb, 1, ResultKind::Succeeded, 1800),
        failed,
        report(&tc, 1, ResultKind::Succeeded, 1950),
    ];
    let applied = tw.apply(&batch, 2000).await;
    assert_eq!((applied.changed, applied.dead), (6, 0));
    let retry = FollowUp::Retry {
        ticket: ta.ticket_id,
        attempt: 2,
        at: 3000,
    };
    assert_eq!(
        applied.follow_ups[3..],
        [
            FollowUp::RunEnded { job: b.id },
            retry,
            FollowUp::RunEnded { job: c.id }
        ]
    );
    let next =
        tw.s.pending_attempt(ta.ticket_id, 2)
            .await
            .unwrap()
            .unwrap();
    assert_eq!(next.checkpoint, Some(json!({"page": 7})));
    let view = tw.s.ticket(ta.ticket_id).await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Retrying);
    assert_eq!(
        view.attempts.iter().map(|a| a.status).collect::<Vec<_>>(),
        [RunStatus::Failed, RunStatus::Retrying]
    );
    let open = tw.s.open_attempt(ta.ticket_id, 2).await.unwrap().unwrap();
    assert_eq!((open.not_before, open.published_at), (Some(3000), None));
    let run = &tw.s.runs(a.id, None, 1).await.unwrap()[0];
    assert_eq!((run.status, run.attempts), (RunStatus::Retrying, 2));
    for j in [&b, &c] {
        assert_eq!(
            tw.s.runs(j.id, None, 1).await.unwrap()[0].status,
            RunStatus::Succeeded
        );
    }
    // the retried attempt runs and fails for good in one batch, with a copy of the old failure
    let batch = [
        report(&ta, 2, ResultKind::Started, 3100),
        report(&ta, 1, ResultKind::Failed, 1900),
        report(&ta, 2, ResultKind::Failed, 3200),
        report(&ta, 3, ResultKind::Started, 3300),
        report(&ta, 3, ResultKind::Failed, 3400),
    ];
    let applied = tw.apply(&batch, 3500).await;
    assert_eq!((applied.changed, applied.dead), (4, 1), "{applied:?}");
    let run = &tw.s.runs(a.id, None, 1).await.unwrap()[0];
    assert_eq!(
        (run.status, run.attempts, run.reason.as_deref()),
        (RunStatus::Dead, 3, Some("boom 3"))
    );
}

async fn a_sharded_occurrence_whose_items_finish_in_one_batch(db: TestDb) {
    let tw = Twins::open(&db).await;
    let j = job("t", 1000);
    let items = tw.fire(&j, 1000, 3).await;
    let batch = [
        report(&items[0], 1, ResultKind::Started, 1100),
        report(&items[1], 1, ResultKind::Started, 1100),
        report(&items[0], 1, ResultKind::Succeeded, 1200),
        report(&items[2], 1, ResultKind::Started, 1100),
        report(&items[1], 1, ResultKind::Succeeded, 1200),
        report(&items[2], 1, ResultKind::Succeeded, 1300),
    ];
    let a = tw.apply(&batch, 1400).await;
    assert_eq!(a.changed, 6);
    let ended: Vec<_> = a
        .follow_ups
        .iter()
        .filter(|f| matches!(f, FollowUp::RunEnded { .. }))
        .collect();
    assert_eq!(ended, [&FollowUp::RunEnded { job: j.id }], "ends once");
    let run = &tw.s.runs(j.id, None, 1).await.unwrap()[0];
    assert_eq!(
        (run.status, run.ticket_ids.len()),
        (RunStatus::Succeeded, 3)
    );
    // another occurrence: one item dead, one running then succeeded, in one batch
    let items = tw.fire(&j, 2000, 2).await;
    let a = tw
        .apply(
            &[
                report(&items[1], 1, ResultKind::Started, 2100),
                report(&items[0], 1, ResultKind::Failed, 2150),
                report(&items[1], 1, ResultKind::Succeeded, 2200),
            ],
            2300,
        )
        .await;
    assert_eq!((a.changed, a.dead), (3, 1));
    let run =
        tw.s.runs(j.id, None, 10)
            .await
            .unwrap()
            .into_iter()
            .find(|r| r.scheduled_at == from_millis(2000))
            .unwrap();
    assert_eq!(run.status, RunStatus::Dead);
}

async fn the_shard_loop_gets_only_follow_ups_with_something_to_do(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let mut b = job("t", 1000);
    b.spec.overlap = Overlap::BufferOne;
    s.create_job(&b, None).await.unwrap();
    let tb = fired(&s, &b, 1000).await;
    let out = fire(&s, &b, None, None, vec![ticket(&b, 2000, 1)], 2000)
        .await
        .unwrap();
    assert_eq!(out.occurrences, vec![(2000, Fired::Buffered)]);
    let (p, q) = (job("t", 1000), job("t", 1000));
    s.create_job(&p, None).await.unwrap();
    s.create_job(&q, None).await.unwrap();
    let (tp, tq) = (fired(&s, &p, 1000).await, fired(&s, &q, 1000).await);
    let mut a = s
        .apply_results(
            &[
                report(&tb, 1, ResultKind::Started, 2400),
                report(&tb, 1, ResultKind::Succeeded, 2500),
                report(&tp, 1, ResultKind::Started, 2400),
                report(&tp, 1, ResultKind::Succeeded, 2500),
                report(&tq, 1, ResultKind::Started, 2400),
            ],
            2500,
        )
        .await
        .unwrap();
    let started = |t: &Ticket| FollowUp::Started {
        ticket: t.ticket_id,
        attempt: 1,
        started_at: 2500,
        timeout_ms: 1000,
    };
    assert_eq!(
        a.follow_ups,
        vec![
            started(&tb),
            FollowUp::RunEnded { job: b.id },
            started(&tp),
            FollowUp::RunEnded { job: p.id },
            started(&tq),
        ]
    );
    // the buffered occurrence may be released, and the attempt still running is watched; the
    // others have nothing to do
    a.drop_idle_follow_ups();
    assert_eq!(
        a.follow_ups,
        vec![FollowUp::RunEnded { job: b.id }, started(&tq)]
    );
}

/// A small deterministic generator (xorshift), so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A batch larger than one statement of each read and write (ids per `IN` list, rows per
/// multi-row statement): every chunk is read and written, on SQLite within the same two trips.
async fn a_batch_larger_than_a_statement_applies_every_chunk(db: TestDb) {
    let tw = Twins::open(&db).await;
    let mut batch = Vec::new();
    for k in 0..300 {
        let j = with_retry(job("t", 1000), 3, Backoff::Fixed);
        let t = tw.fire(&j, 1000, 1).await.remove(0);
        batch.push(report(&t, 1, ResultKind::Started, 1100));
        // most fail (their next attempts are written), the others succeed
        let kind = if k % 10 == 0 {
            ResultKind::Succeeded
        } else {
            ResultKind::Failed
        };
        batch.push(report(&t, 1, kind, 1200));
    }
    let a = tw.apply(&batch, 1300).await;
    let retries = a
        .follow_ups
        .iter()
        .filter(|f| matches!(f, FollowUp::Retry { .. }))
        .count();
    assert_eq!((a.changed, a.dead, retries), (600, 0, 270));
}

async fn a_batch_applies_exactly_like_one_result_at_a_time(db: TestDb) {
    let tw = Twins::open(&db).await;
    let kinds = [
        ResultKind::Started,
        ResultKind::Started,
        ResultKind::Succeeded,
        ResultKind::Failed,
        ResultKind::Failed,
        ResultKind::Progress,
        ResultKind::Released,
    ];
    let mut now = 2000;
    for seed in 1..=3u64 {
        let mut rng = Rng(0x5eed_1234_abcd_0000 + seed);
        let mut jobs = Vec::new();
        for k in 0..5u64 {
            let mut j = with_retry(job("t", 1000), 1 + k as u32 % 3, Backoff::Fixed);
            if k == 3 {
                // a deleted job's tickets finish, and are not retried
                j.spec.retry.max_attempts = 3;
                let _ = tw.fire(&j, now, 1).await;
                j.state = JobState::Deleted;
                j.next_fire_at = None;
                for s in [&tw.s, &tw.r] {
                    s.update_job(&j, &[]).await.unwrap();
                }
            }
            jobs.push((j, 1 + (k % 3) as u32));
        }
        let mut unknown = ticket(&jobs[0].0, 1000, 1);
        unknown.ticket_id = Uuid::now_v7();
        let mut pool = vec![unknown];
        for round in 0..24 {
            if round % 6 == 0 {
                // new occurrences of every job (items of one occurrence share a batch often)
                for (j, items) in &jobs {
                    if j.state != JobState::Deleted {
                        pool.extend(tw.fire(j, now, *items).await);
                    }
                }
            }
            let n = 1 + rng.below(40) as usize;
            let batch: Vec<TicketResult> = (0..n)
                .map(|_| {
                    let recent = pool.len().min(12) as u64;
                    let i = if rng.below(3) > 0 {
                        pool.len() - 1 - rng.below(recent) as usize
                    } else {
                        rng.below(pool.len() as u64) as usize
                    };
                    let attempt = 1 + rng.below(3) as u32;
                    let kind = kinds[rng.below(kinds.len() as u64) as usize];
                    let mut r = report(&pool[i], attempt, kind, now - rng.below(900) as i64);
                    r.worker = format!("w{}", rng.below(2));
                    if rng.below(3) == 0 {
                        r.checkpoint = Some(json!({"n": rng.below(100)}));
                    }
                    r.permanent = kind == ResultKind::Failed && rng.below(5) == 0;
                    r.http_status = (rng.below(2) == 0).then_some(200);
                    r.output = (rng.below(3) == 0).then(|| format!("out {}", rng.below(9)));
                    if kind == ResultKind::Failed && rng.below(3) == 0 {
                        r.error = None;
                    }
                    r
                })
                .collect();
            tw.apply(&batch, now).await;
            now += 1000 + rng.below(3000) as i64;
        }
    }
}

store_tests!(
    started_and_succeeded_of_one_attempt_in_one_batch,
    duplicates_in_one_batch_apply_once,
    a_result_for_an_unknown_ticket_changes_nothing,
    a_late_started_after_succeeded_records_only_the_start_time,
    a_final_result_carrying_the_start_records_it_only_when_none_was_reported,
    a_failure_with_retry_in_a_batch_of_successes,
    a_sharded_occurrence_whose_items_finish_in_one_batch,
    the_shard_loop_gets_only_follow_ups_with_something_to_do,
    a_batch_applies_exactly_like_one_result_at_a_time,
    a_batch_larger_than_a_statement_applies_every_chunk,
);
