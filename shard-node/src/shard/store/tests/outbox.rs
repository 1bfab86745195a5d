//! Publish marks with stream sequences, and what the lost-ticket sweep reads and writes.

use super::*;

async fn published(s: &Store, t: &Ticket, seq: u64, at: i64) {
    let a = Acked {
        ticket: t.ticket_id,
        attempt: t.attempt,
        seq,
    };
    s.mark_published(&[a], at).await.unwrap();
}

async fn an_unstarted_attempt_is_put_back_into_the_outbox_once(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let j = job("t", 1000);
    s.create_job(&j, None).await.unwrap();
    let t = fired(&s, &j, 1000).await;
    published(&s, &t, 42, 1001).await;

    // only attempts published before the cut-off are listed
    assert!(s.unstarted(None, 1001, 10).await.unwrap().is_empty());
    let listed = s.unstarted(None, 5000, 10).await.unwrap();
    let u = Unstarted {
        ticket: t.ticket_id,
        attempt: 1,
        published_at: 1001,
        seq: Some(42),
        resends: 0,
    };
    assert_eq!(listed, vec![u.clone()]);

    let again = s.resend(&u).await.unwrap().expect("put back");
    assert_eq!((again.ticket.ticket_id, again.resends), (t.ticket_id, 1));
    let outbox = s.unpublished(6000, 6000, 10).await.unwrap();
    assert_eq!(outbox, vec![again]);
    assert!(s.unstarted(None, 5000, 10).await.unwrap().is_empty());
    // a second sweep acting on what it read before changes nothing
    assert!(s.resend(&u).await.unwrap().is_none());

    published(&s, &t, 43, 6001).await;
    let listed = s.unstarted(None, 9000, 10).await.unwrap();
    assert_eq!(
        (listed[0].seq, listed[0].resends, listed[0].published_at),
        (Some(43), 1, 6001)
    );
}

async fn a_started_or_finished_attempt_is_never_resent(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let (a, b) = (job("t", 1000), job("t", 1000));
    for j in [&a, &b] {
        s.create_job(j, None).await.unwrap();
    }
    let (ta, tb) = (fired(&s, &a, 1000).await, fired(&s, &b, 1000).await);
    published(&s, &ta, 1, 1001).await;
    published(&s, &tb, 2, 1001).await;
    let listed = s.unstarted(None, 5000, 10).await.unwrap();
    assert_eq!(listed.len(), 2);
    s.apply_results(
        &[
            report(&ta, 1, ResultKind::Started, 1500),
            report(&tb, 1, ResultKind::Succeeded, 1500),
        ],
        1500,
    )
    .await
    .unwrap();
    for u in &listed {
        assert!(s.resend(u).await.unwrap().is_none(), "{u:?}");
    }
    assert!(s.unstarted(None, 5000, 10).await.unwrap().is_empty());
    assert!(s.unpublished(6000, 6000, 10).await.unwrap().is_empty());
}

async fn the_sweep_pages_through_unstarted_attempts_by_cursor(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    // more acks than one marking statement takes
    let jobs: Vec<JobRow> = (0..503).map(|_| job("t", 1000)).collect();
    let mut acks = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        s.create_job(j, None).await.unwrap();
        let t = fired(&s, j, 1000).await;
        acks.push(Acked {
            ticket: t.ticket_id,
            attempt: 1,
            seq: i as u64 + 1,
        });
    }
    s.mark_published(&acks, 1001).await.unwrap();
    assert!(s.unpublished(9000, 9000, 1000).await.unwrap().is_empty());

    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = s.unstarted(cursor, 5000, 200).await.unwrap();
        if page.is_empty() {
            break;
        }
        cursor = page.last().map(|u| (u.published_at, u.ticket));
        seen.extend(page.into_iter().map(|u| (u.ticket, u.seq.unwrap())));
    }
    let mut want: Vec<(Uuid, u64)> = acks.iter().map(|a| (a.ticket, a.seq)).collect();
    want.sort();
    assert_eq!(seen.len(), want.len(), "every attempt once");
    seen.sort();
    assert_eq!(seen, want, "each with the sequence its ack named");
}

async fn a_ticket_written_ahead_waits_for_its_time_and_can_be_withdrawn(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let (a, b) = (job("t", 5000), job("t", 5000));
    for j in [&a, &b] {
        s.create_job(j, None).await.unwrap();
    }
    // both fired at 4800, 200 ms ahead of their time
    let ta = fire(&s, &a, Some(5000), None, vec![ticket(&a, 5000, 1)], 4800)
        .await
        .unwrap()
        .tickets
        .remove(0);
    let tb = fire(&s, &b, Some(5000), None, vec![ticket(&b, 5000, 1)], 4800)
        .await
        .unwrap()
        .tickets
        .remove(0);
    assert!(
        s.unpublished(9000, 4999, 10).await.unwrap().is_empty(),
        "not in the outbox before its time"
    );
    assert_eq!(s.unpublished(9000, 5000, 10).await.unwrap().len(), 2);

    // b was published (it could not be withdrawn any more); a is withdrawn
    published(&s, &tb, 7, 5000).await;
    let why = reason::PAUSED_BEFORE_DUE;
    assert_eq!(
        s.withdraw(&[ta.ticket_id, tb.ticket_id], why, 4900)
            .await
            .unwrap(),
        1
    );
    let run = s.runs(a.id, None, 10).await.unwrap().remove(0);
    assert_eq!(
        (run.status, run.reason.as_deref(), run.attempts),
        (RunStatus::Skipped, Some(why), 0)
    );
    assert!(run.ticket_ids.is_empty(), "{run:?}");
    assert!(s.ticket(ta.ticket_id).await.unwrap().is_none());
    assert_eq!(
        s.runs(b.id, None, 10).await.unwrap()[0].status,
        RunStatus::Dispatched
    );
    let outbox = s.unpublished(9000, 9000, 10).await.unwrap();
    assert!(outbox.is_empty(), "{outbox:?}");
    // withdrawing again, or an unknown ticket, changes nothing
    assert_eq!(
        s.withdraw(&[ta.ticket_id, Uuid::now_v7()], why, 4950)
            .await
            .unwrap(),
        0
    );
}

async fn a_checkpoint_copies_the_wal_beside_the_writer(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    for _ in 0..20 {
        let j = job("t", 1000);
        s.create_job(&j, None).await.unwrap();
        fired(&s, &j, 1000).await;
    }
    match (&db.dbs, s.checkpoint().await.unwrap()) {
        (Databases::Sqlite(_), Some((wal, copied))) => {
            assert!(wal > 0, "the writes went to the WAL");
            assert_eq!(copied, wal, "every frame copied");
        }
        (Databases::Postgres(_), None) => {}
        (dbs, got) => panic!("{dbs:?}: {got:?}"),
    }
}

store_tests!(
    a_checkpoint_copies_the_wal_beside_the_writer,
    a_ticket_written_ahead_waits_for_its_time_and_can_be_withdrawn,
    an_unstarted_attempt_is_put_back_into_the_outbox_once,
    a_started_or_finished_attempt_is_never_resent,
    the_sweep_pages_through_unstarted_attempts_by_cursor,
);
