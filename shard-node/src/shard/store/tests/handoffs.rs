//! Jobs handed between shards at a `time_window` layout's edge: a job leaves its shard in one
//! transaction and is kept there until the target confirms; the target takes it once however
//! often it is sent; a stale copy does not bring back a job that moved on, while the job coming
//! back is taken in; a confirmation is for one hand-off only; a job whose idempotency key
//! another job holds on the target is taken without it; jobs of a paused tenant or no longer
//! active stay; and a fenced owner hands nothing off.

use super::*;
use crate::shard::store::{HandOff, KeyLeft, Leave};

async fn open_shard(db: &TestDb, shard: u32, epoch: u64) -> Store {
    Store::open(&db.dbs, shard, epoch, "node-a", 0)
        .await
        .unwrap()
}

async fn job_count(s: &Store) -> usize {
    s.list_jobs(JobKind::Job, None, None, 100)
        .await
        .unwrap()
        .len()
}

async fn leave(s: &Store, job: Uuid, target: u32) -> HandOff {
    let mut left = s.hand_off(&[Leave { job, target }], 0).await.unwrap();
    assert_eq!(left.handed.len(), 1, "{job} left");
    left.handed.remove(0)
}

fn ack(h: &HandOff) -> [(Uuid, i64); 1] {
    [(h.job, h.seq)]
}

async fn a_job_leaves_in_one_step_and_arrives_once(db: TestDb) {
    let (source, target) = (open_shard(&db, 0, 1).await, open_shard(&db, 1, 1).await);
    let t0 = 1_000_000;
    let j = job("acme", t0 + 5_000);
    source.create_job(&j, Some("k1")).await.unwrap();
    // A job with a run in progress stays until the run ends.
    let busy = job("acme", t0);
    source.create_job(&busy, None).await.unwrap();
    fired(&source, &busy, t0).await;
    let before = source.get_job(j.id).await.unwrap().unwrap();
    let to = |job: Uuid| Leave { job, target: 1 };
    let asked = [to(j.id), to(busy.id), to(Uuid::now_v7())];
    let left = source.hand_off(&asked, t0).await.unwrap();
    // The unknown id is dropped; the busy job waits.
    assert_eq!(left.dropped, vec![asked[2].job]);
    let left = left.handed;
    assert_eq!(left.iter().map(|h| h.job).collect::<Vec<_>>(), vec![j.id]);
    assert_eq!(source.get_job(j.id).await.unwrap(), None);
    assert!(source.get_job(busy.id).await.unwrap().is_some());
    assert!(source.handing_off(j.id).await.unwrap());
    assert_eq!(
        source.key_left("acme", "k1").await.unwrap(),
        Some(KeyLeft::Moving)
    );
    assert!(!source.handing_off(busy.id).await.unwrap());
    // What a next owner of the source would send again: the same.
    let unacked = source.unacked_handoffs(i64::MAX).await.unwrap();
    assert_eq!(unacked, left);
    assert!(source.unacked_handoffs(t0 - 1).await.unwrap().is_empty());

    for inserted in [1, 0] {
        let (taken, n) = target.import_jobs(left[0].pages.clone()).await.unwrap();
        assert_eq!((taken.held, taken.stale, n), (vec![j.id], vec![], inserted));
        assert_eq!(job_count(&target).await, 1);
    }
    assert_eq!(target.get_job(j.id).await.unwrap(), Some(before.clone()));
    assert_eq!(target.job_by_key("acme", "k1").await.unwrap(), Some(before));

    source.ack_handoffs(&ack(&left[0])).await.unwrap();
    assert!(!source.handing_off(j.id).await.unwrap());
    assert_eq!(
        source.key_left("acme", "k1").await.unwrap(),
        Some(KeyLeft::Moved)
    );
    assert!(source.unacked_handoffs(i64::MAX).await.unwrap().is_empty());
}

async fn a_stale_copy_is_dropped_and_a_job_coming_back_is_taken(db: TestDb) {
    let (a, b, c) = (
        open_shard(&db, 0, 1).await,
        open_shard(&db, 1, 1).await,
        open_shard(&db, 2, 1).await,
    );
    let j = job("acme", 5_000);
    a.create_job(&j, None).await.unwrap();
    let first = leave(&a, j.id, 1).await;
    b.import_jobs(first.pages.clone()).await.unwrap();
    // b hands it on to c and c confirms.
    let second = leave(&b, j.id, 2).await;
    c.import_jobs(second.pages.clone()).await.unwrap();
    // An answer to an earlier hand-off does not confirm this one.
    b.ack_handoffs(&[(j.id, second.seq - 1)]).await.unwrap();
    assert!(b.handing_off(j.id).await.unwrap());
    b.ack_handoffs(&ack(&second)).await.unwrap();
    // a's copy, sent again late, is stale on b: dropped, and confirmed so a stops sending it.
    let (taken, _) = b.import_jobs(first.pages.clone()).await.unwrap();
    assert_eq!((taken.held, taken.stale), (vec![], vec![j.id]));
    assert_eq!(b.get_job(j.id).await.unwrap(), None);
    // c hands it back to b (a change moved its next occurrence): b takes it.
    let back = leave(&c, j.id, 1).await;
    let (taken, _) = b.import_jobs(back.pages).await.unwrap();
    assert_eq!((taken.held, taken.stale), (vec![j.id], vec![]));
    assert!(b.get_job(j.id).await.unwrap().is_some());
    assert!(b.unacked_handoffs(i64::MAX).await.unwrap().is_empty());
    // ... and back to a, which had sent it first.
    let home = leave(&b, j.id, 0).await;
    let (taken, _) = a.import_jobs(home.pages).await.unwrap();
    assert_eq!(taken.held, vec![j.id]);
}

async fn a_job_whose_key_is_taken_on_the_target_arrives_without_it(db: TestDb) {
    let (source, target) = (open_shard(&db, 0, 1).await, open_shard(&db, 1, 1).await);
    let j = job("acme", 5_000);
    source.create_job(&j, Some("k1")).await.unwrap();
    let other = job("acme", 5_000);
    target.create_job(&other, Some("k1")).await.unwrap();
    let left = leave(&source, j.id, 1).await;
    let (taken, n) = target.import_jobs(left.pages).await.unwrap();
    assert_eq!((taken.held, taken.stale, n), (vec![j.id], vec![], 1));
    assert!(target.get_job(j.id).await.unwrap().is_some());
    assert_eq!(
        target.job_by_key("acme", "k1").await.unwrap().map(|r| r.id),
        Some(other.id)
    );
}

async fn jobs_of_a_paused_tenant_or_not_active_stay(db: TestDb) {
    let source = open_shard(&db, 0, 1).await;
    let held = job("paused-co", 5_000);
    source.create_job(&held, None).await.unwrap();
    source.pause_tenant("paused-co", &[], 0).await.unwrap();
    let mut done = job("acme", 5_000);
    source.create_job(&done, None).await.unwrap();
    done.state = JobState::Completed;
    done.next_fire_at = None;
    assert!(source.update_job(&done, &[]).await.unwrap());
    let asked = [held.id, done.id].map(|job| Leave { job, target: 1 });
    let left = source.hand_off(&asked, 0).await.unwrap();
    assert!(left.handed.is_empty());
    let mut dropped = left.dropped;
    dropped.sort();
    let mut expect = vec![held.id, done.id];
    expect.sort();
    assert_eq!(dropped, expect);
    assert_eq!(job_count(&source).await, 2);
}

async fn a_fenced_owner_hands_nothing_off(db: TestDb) {
    let old = open_shard(&db, 0, 1).await;
    let j = job("acme", 5_000);
    old.create_job(&j, None).await.unwrap();
    let _new = open_shard(&db, 0, 2).await;
    let to = Leave {
        job: j.id,
        target: 1,
    };
    assert!(matches!(
        old.hand_off(&[to], 0).await,
        Err(StoreError::Fenced { .. })
    ));
    assert!(old.get_job(j.id).await.unwrap().is_some());
    assert!(!old.handing_off(j.id).await.unwrap());
}

/// More jobs than one statement binds leave in one call.
async fn many_jobs_leave_at_once(db: TestDb) {
    let source = open_shard(&db, 0, 1).await;
    let mut leaving = Vec::new();
    for _ in 0..1_200 {
        let j = job("acme", 5_000);
        source.create_job(&j, None).await.unwrap();
        leaving.push(Leave {
            job: j.id,
            target: 1,
        });
    }
    let left = source.hand_off(&leaving, 0).await.unwrap();
    assert_eq!(left.handed.len(), 1_200);
    assert_eq!(job_count(&source).await, 0);
    let acks: Vec<(Uuid, i64)> = left.handed.iter().map(|h| (h.job, h.seq)).collect();
    source.ack_handoffs(&acks).await.unwrap();
    assert!(source.unacked_handoffs(i64::MAX).await.unwrap().is_empty());
}

store_tests!(
    a_job_leaves_in_one_step_and_arrives_once,
    a_stale_copy_is_dropped_and_a_job_coming_back_is_taken,
    a_job_whose_key_is_taken_on_the_target_arrives_without_it,
    jobs_of_a_paused_tenant_or_not_active_stay,
    a_fenced_owner_hands_nothing_off,
    many_jobs_leave_at_once,
);
