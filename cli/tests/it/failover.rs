//! Failover of a killed shard node, as operators run the platform: a control plane, three shard
//! nodes on one PostgreSQL and a worker, each a separate process. A node is killed with
//! `kill -9` five times (a different one each time, restarted after); each time the first
//! occurrence due after the kill on each of its shards must execute within 3 s of its due time.
//! Afterwards every occurrence of every job has executed exactly once. The measured times are
//! printed (BENCHMARKS.md records them).

use std::time::Duration;

use crate::common::{cluster::*, wait_for};
use chrono::Utc;

/// The failover target: the first occurrence due after a kill executes within this long of its
/// due time.
const FAILOVER: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_kill_9_of_a_node_is_failed_over_within_3_s_and_nothing_is_lost_or_doubled() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Deployment::start(1).await;
    d.control_plane("cp-1", &["--shards", "8"]).await;
    let names = ["node-a", "node-b", "node-c"];
    for n in names {
        d.node(n).await;
    }
    d.worker("worker-1", dir.path());
    let api = d.api("cp-1");
    wait_settled(&api, &names).await;
    let jobs = every_second_jobs(&d, &api, 8, 1).await;
    let started = Utc::now();
    let mut times = Vec::new();
    let mut failed_over = 0;
    for round in 0..5 {
        let victim = names[round % names.len()];
        let owners = wait_settled(&api, &names).await;
        let owned = owners[victim].clone();
        assert!(!owned.is_empty(), "{victim} owns shards before the kill");
        // Each of its jobs has run on it, so the kill interrupts something that was firing.
        let victims_jobs: Vec<&String> = jobs
            .iter()
            .filter(|(_, s)| owned.contains(s))
            .map(|(j, _)| j)
            .collect();
        let killed_at = Utc::now();
        d.nodes.get_mut(victim).unwrap().kill9().await;
        let survivors: Vec<&str> = names.iter().copied().filter(|n| *n != victim).collect();
        wait_settled(&api, &survivors).await;
        // The first occurrence of each of its jobs due after the kill: fell due while its shard
        // had no owner, executed late, but within the target.
        let mut worst = Duration::ZERO;
        for job in &victims_jobs {
            let first = wait_for(
                &format!("the first run of {job} due after the kill to succeed"),
                Duration::from_secs(30),
                || async {
                    let runs = runs(&api, job).await;
                    runs.iter()
                        .filter(|r| at(&r["scheduled_at"]) > killed_at)
                        .min_by_key(|r| at(&r["scheduled_at"]))
                        .filter(|r| r["status"] == "succeeded")
                        .map(|r| at(&r["scheduled_at"]))
                },
            )
            .await
            .unwrap();
            let ran = executed_at(&d, job, first).expect("the sink got it");
            worst = worst.max((ran - first).to_std().unwrap_or_default());
        }
        eprintln!(
            "round {round}: killed {victim} ({} shards), worst first-due lateness {worst:?}",
            owned.len()
        );
        times.push(worst);
        failed_over += owned.len();
        // Back in service for the next round (under the same id, taking its share again).
        d.node(victim).await;
    }
    // The leader counted each lost node's shards as failovers, and the shards a returning node
    // took back as a rebalance.
    let moves = |reason: &'static str| api.metric_sum_with("chronoshard_shard_moves_total", reason);
    let failovers = moves(r#"reason="failover""#).await;
    assert!(
        failovers >= failed_over as f64,
        "{failovers} < {failed_over}"
    );
    assert!(moves(r#"reason="rebalance""#).await >= 1.0);
    for (round, t) in times.iter().enumerate() {
        assert!(*t < FAILOVER, "round {round}: {t:?} (all: {times:?})");
    }
    let upto = Utc::now() + chrono::Duration::seconds(1);
    for job in jobs.keys() {
        let checked = every_occurrence_once(&d, &api, job, upto).await;
        assert!(
            checked[0] <= started,
            "{job} ran from before the first kill"
        );
    }
    eprintln!("failover times (first occurrence due after kill -9, due → executed): {times:?}");
}
