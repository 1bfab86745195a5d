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

async fn a_ticket_written_ahead_waits_for_its_time_and_can_be_taken_back(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let (mut a, b, c) = (job("t", 5000), job("t", 5000), job("u", 5000));
    for j in [&a, &b, &c] {
        s.create_job(j, None).await.unwrap();
    }
    // all fired at 4800, 200 ms ahead of their time; c is recurring, a and b complete
    let mut ahead = Vec::new();
    for (j, next) in [(&a, None), (&b, None), (&c, Some(6000))] {
        let t = fire(&s, j, Some(5000), next, vec![ticket(j, 5000, 1)], 4800)
            .await
            .unwrap()
            .tickets
            .remove(0);
        ahead.push(t);
    }
    let (ta, tb, tc) = (&ahead[0], &ahead[1], &ahead[2]);
    assert!(
        s.unpublished(9000, 4999, 10).await.unwrap().is_empty(),
        "not in the outbox before its time"
    );
    assert_eq!(s.unpublished(9000, 5000, 10).await.unwrap().len(), 3);

    // what a new owner of the shard must be able to withdraw too
    let mut ahead_rows = s.fired_ahead(4900).await.unwrap();
    ahead_rows.sort_by_key(|(_, _, t, _)| *t);
    let mut want: Vec<(Uuid, String, Uuid, i64)> = [(&a, ta), (&b, tb), (&c, tc)]
        .iter()
        .map(|(j, t)| (j.id, j.tenant.clone(), t.ticket_id, 5000))
        .collect();
    want.sort_by_key(|(_, _, t, _)| *t);
    assert_eq!(ahead_rows, want);
    assert!(s.fired_ahead(5000).await.unwrap().is_empty(), "due by then");

    // b was published: it cannot be taken back any more
    published(&s, tb, 7, 5000).await;
    // a is paused before its time, taking back its ticket (and b's, which stays)
    a.state = JobState::Paused;
    a.next_fire_at = None;
    assert!(s
        .update_job(&a, &[ta.ticket_id, tb.ticket_id])
        .await
        .unwrap());
    assert!(
        s.runs(a.id, None, 10).await.unwrap().is_empty(),
        "as if never fired"
    );
    assert!(s.ticket(ta.ticket_id).await.unwrap().is_none());
    let a_now = s.get_job(a.id).await.unwrap().unwrap();
    assert_eq!((a_now.state, a_now.next_fire_at), (JobState::Paused, None));
    assert_eq!(
        s.runs(b.id, None, 10).await.unwrap()[0].status,
        RunStatus::Dispatched
    );
    // c's tenant is paused before its time: c goes back to that occurrence, to fire after the resume
    assert!(s.pause_tenant("u", &[tc.ticket_id], 4900).await.unwrap());
    assert!(s.runs(c.id, None, 10).await.unwrap().is_empty());
    let c_now = s.get_job(c.id).await.unwrap().unwrap();
    assert_eq!(
        (c_now.state, c_now.next_fire_at),
        (JobState::Active, Some(5000))
    );
    let outbox = s.unpublished(9000, 9000, 10).await.unwrap();
    assert!(outbox.is_empty(), "{outbox:?}");
    // taking back again, or an unknown ticket, changes nothing
    let mut again = a.clone();
    again.updated_at = 4950;
    assert!(s
        .update_job(&again, &[ta.ticket_id, Uuid::now_v7()])
        .await
        .unwrap());
    assert!(s.runs(a.id, None, 10).await.unwrap().is_empty());
}

async fn a_checkpoint_copies_the_wal_beside_the_writer(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    for _ in 0..20 {
        let j = job("t", 1000);
        s.create_job(&j, None).await.unwrap();
        fired(&s, &j, 1000).await;
    }
    match (&db.dbs, s.checkpoint().await.unwrap()) {
        (Databases::Sqlite(_), Some(Checkpoint::Ran { wal, copied })) => {
            assert!(wal > 0, "the writes went to the WAL");
            assert_eq!(copied, wal, "every frame copied");
        }
        (Databases::Postgres(_), None) => return,
        (dbs, got) => panic!("{dbs:?}: {got:?}"),
    }
    // Nothing written since: SQLite is not asked again, until the next write.
    assert_eq!(s.checkpoint().await.unwrap(), Some(Checkpoint::Unchanged));
    assert_eq!(s.checkpoint().await.unwrap(), Some(Checkpoint::Unchanged));
    let j = job("t", 1000);
    s.create_job(&j, None).await.unwrap();
    match s.checkpoint().await.unwrap() {
        Some(Checkpoint::Ran { wal, copied }) => {
            assert!(wal > 0 && copied == wal, "{wal} {copied}")
        }
        got => panic!("after a write: {got:?}"),
    }
}

async fn an_attempt_is_in_flight_from_its_fire_until_its_final_result(db: TestDb) {
    let s = open(&db, 1).await.unwrap();
    let (a, b) = (job("t", 1000), job("t", 1000));
    for j in [&a, &b] {
        s.create_job(j, None).await.unwrap();
    }
    assert_eq!(s.open_attempts_by_queue().await.unwrap(), []);
    let (ta, tb) = (fired(&s, &a, 1000).await, fired(&s, &b, 1000).await);
    // Unpublished, then published: in flight either way.
    assert_eq!(s.open_attempts_by_queue().await.unwrap(), [("q".into(), 2)]);
    published(&s, &ta, 1, 1001).await;
    s.apply_results(&[report(&ta, 1, ResultKind::Started, 1500)], 1500)
        .await
        .unwrap();
    assert_eq!(
        s.open_attempts_by_queue().await.unwrap(),
        [("q".into(), 2)],
        "started is running"
    );
    s.apply_results(
        &[
            report(&ta, 1, ResultKind::Succeeded, 1600),
            report(&tb, 1, ResultKind::Succeeded, 1600),
        ],
        1600,
    )
    .await
    .unwrap();
    assert_eq!(s.open_attempts_by_queue().await.unwrap(), []);
}

store_tests!(
    an_attempt_is_in_flight_from_its_fire_until_its_final_result,
    a_checkpoint_copies_the_wal_beside_the_writer,
    a_ticket_written_ahead_waits_for_its_time_and_can_be_taken_back,
    an_unstarted_attempt_is_put_back_into_the_outbox_once,
    a_started_or_finished_attempt_is_never_resent,
    the_sweep_pages_through_unstarted_attempts_by_cursor,
);
