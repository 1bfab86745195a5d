//! Jobs handed between shards at a `time_window` layout's edge: a job leaves its shard in one
//! transaction and is kept there until the target confirms; the target takes it once however
//! often it is sent; a stale copy does not bring back a job that moved on; and a fenced owner
//! hands nothing off.

use super::*;
use crate::shard::store::Leave;

async fn open_shard(db: &TestDb, shard: u32, epoch: u64) -> Store {
    Store::open(&db.dbs, shard, epoch, "node-a", 0)
        .await
        .unwrap()
}

async fn job_count(s: &Store) -> usize {
    s.list_jobs(None, None, 100).await.unwrap().len()
}

async fn a_job_leaves_in_one_step_and_arrives_once(db: TestDb) {
    let (source, target) = (open_shard(&db, 0, 1).await, open_shard(&db, 1, 1).await);
    let t0 = 1_000_000;
    let j = job("acme", t0 + 5_000);
    source.create_job(&j, Some("k1")).await.unwrap();
    source.pause_tenant("acme", &[], t0).await.unwrap();
    // A job with a run in progress stays until the run ends.
    let busy = job("acme", t0);
    source.create_job(&busy, None).await.unwrap();
    fired(&source, &busy, t0).await;
    let before = source.get_job(j.id).await.unwrap().unwrap();
    let leave = |job: Uuid| Leave {
        job,
        target: 1,
        layout: 10,
    };
    let left = (source.hand_off(&[leave(j.id), leave(busy.id), leave(Uuid::now_v7())], t0))
        .await
        .unwrap();
    assert_eq!(left.iter().map(|h| h.job).collect::<Vec<_>>(), vec![j.id]);
    assert_eq!(source.get_job(j.id).await.unwrap(), None);
    assert!(source.get_job(busy.id).await.unwrap().is_some());
    assert!(source.handing_off(j.id).await.unwrap());
    assert!(source.handing_off_key("acme", "k1").await.unwrap());
    assert!(!source.handing_off(busy.id).await.unwrap());
    // What a next owner of the source would send again: the same.
    let unacked = source.unacked_handoffs(i64::MAX).await.unwrap();
    assert_eq!(unacked, left);
    assert!(source.unacked_handoffs(t0 - 1).await.unwrap().is_empty());

    for _ in 0..2 {
        let imported = target.import_jobs(10, left[0].pages.clone()).await.unwrap();
        assert_eq!(imported.jobs, vec![j.id]);
        assert_eq!(job_count(&target).await, 1);
    }
    assert_eq!(target.get_job(j.id).await.unwrap(), Some(before.clone()));
    assert_eq!(target.job_by_key("acme", "k1").await.unwrap(), Some(before));
    assert_eq!(
        target.paused_tenants().await.unwrap(),
        vec!["acme".to_string()]
    );

    source.ack_handoffs(&[j.id]).await.unwrap();
    assert!(!source.handing_off(j.id).await.unwrap());
    assert!(source.unacked_handoffs(i64::MAX).await.unwrap().is_empty());
}

async fn a_stale_copy_does_not_bring_back_a_job_that_moved_on(db: TestDb) {
    let (source, target) = (open_shard(&db, 0, 1).await, open_shard(&db, 1, 1).await);
    let t0 = 1_000_000;
    let j = job("acme", t0 + 5_000);
    source.create_job(&j, None).await.unwrap();
    let leave = Leave {
        job: j.id,
        target: 1,
        layout: 10,
    };
    let copy = source.hand_off(&[leave], t0).await.unwrap().remove(0);
    target.import_jobs(10, copy.pages.clone()).await.unwrap();
    // A newer layout (from window 20) places the job on shard 2.
    let onward = Leave {
        job: j.id,
        target: 2,
        layout: 20,
    };
    assert_eq!(target.hand_off(&[onward], t0).await.unwrap().len(), 1);
    target.ack_handoffs(&[j.id]).await.unwrap();
    // The first copy, sent again late, is not taken back.
    let imported = target.import_jobs(10, copy.pages.clone()).await.unwrap();
    assert!(imported.jobs.is_empty());
    assert_eq!(target.get_job(j.id).await.unwrap(), None);
    // A still newer layout placing it here again brings it back.
    target.import_jobs(30, copy.pages).await.unwrap();
    assert!(target.get_job(j.id).await.unwrap().is_some());
    assert!(target.unacked_handoffs(i64::MAX).await.unwrap().is_empty());
}

async fn a_fenced_owner_hands_nothing_off(db: TestDb) {
    let old = open_shard(&db, 0, 1).await;
    let j = job("acme", 5_000);
    old.create_job(&j, None).await.unwrap();
    let _new = open_shard(&db, 0, 2).await;
    let leave = Leave {
        job: j.id,
        target: 1,
        layout: 10,
    };
    assert!(matches!(
        old.hand_off(&[leave], 0).await,
        Err(StoreError::Fenced { .. })
    ));
    assert!(old.get_job(j.id).await.unwrap().is_some());
    assert!(!old.handing_off(j.id).await.unwrap());
}

store_tests!(
    a_job_leaves_in_one_step_and_arrives_once,
    a_stale_copy_does_not_bring_back_a_job_that_moved_on,
    a_fenced_owner_hands_nothing_off,
);
