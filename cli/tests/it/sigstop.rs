//! A shard node frozen (SIGSTOP) past its heartbeat TTL loses its shards to the other nodes,
//! which fence it (each move raises the shard's epoch in the shard's database). Resumed
//! (SIGCONT), the frozen node still holds those shards in memory with occurrences overdue: its
//! first write is refused as stale, it drops the shards by itself, and no occurrence gets a
//! second ticket or a second execution.

use crate::common::{cluster::*, wait_for};
use chrono::Utc;
use nix::sys::signal::Signal;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_frozen_past_its_ttl_is_fenced_when_it_resumes_and_drops_its_shards() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Deployment::start(1).await;
    d.control_plane("cp-1", &["--shards", "4"]).await;
    let names = ["node-a", "node-b"];
    for n in names {
        d.node(n).await;
    }
    d.worker("worker-1", dir.path());
    let api = d.api("cp-1");
    wait_settled(&api, &names).await;
    let jobs = every_second_jobs(&d, &api, 4, 1).await;
    let owners = wait_settled(&api, &names).await;
    let frozen_shards = owners["node-a"].clone();
    assert!(
        !frozen_shards.is_empty(),
        "node-a owns shards before it freezes"
    );
    let epochs_before = epochs(&api).await;

    let frozen_at = Utc::now();
    d.nodes["node-a"].signal(Signal::SIGSTOP);
    // node-b takes every shard, under new epochs, while node-a sleeps.
    let map = wait_for("node-b to own every shard", SETTLE, || async {
        let (_, map) = api.get("/v1/shards").await;
        let shards = map["shards"].as_array()?.clone();
        shards
            .iter()
            .all(|a| a["owner"] == "node-b")
            .then_some(shards)
    })
    .await
    .unwrap();
    for a in &map {
        let shard = a["shard"].as_u64().unwrap();
        if frozen_shards.contains(&shard) {
            assert!(
                a["epoch"].as_u64() > epochs_before.get(&shard).copied(),
                "{a}"
            );
        }
    }
    // Occurrences of node-a's old shards fall due and fire on node-b while node-a is frozen.
    let on_a: Vec<&String> = jobs
        .iter()
        .filter(|(_, s)| frozen_shards.contains(s))
        .map(|(j, _)| j)
        .collect();
    wait_for("node-b to run node-a's jobs", SETTLE, || async {
        for job in &on_a {
            let runs = runs(&api, job).await;
            let moved = runs.iter().any(|r| {
                r["status"] == "succeeded"
                    && at(&r["scheduled_at"]) > frozen_at + chrono::Duration::seconds(3)
            });
            if !moved {
                return None;
            }
        }
        Some(())
    })
    .await
    .unwrap();

    d.nodes["node-a"].signal(Signal::SIGCONT);
    let resumed = Utc::now();
    // Its own shards' writes are refused as stale and it drops them, each under the epoch it
    // held (once live again it may take shards anew, under newer epochs).
    let a = &d.nodes["node-a"];
    wait_for(
        "node-a to find its shards fenced and drop them",
        SETTLE,
        || async {
            let fenced = a
                .lines()
                .iter()
                .filter(|l| l.contains("is fenced: this node holds epoch"))
                .count();
            let ended = ["shard stopped", "shard closed"]
                .iter()
                .flat_map(|m| a.records(m))
                .filter_map(|r| {
                    let span = &r["span"];
                    Some((span["shard_id"].as_u64()?, span["epoch"].as_u64()?))
                })
                .collect::<Vec<_>>();
            let all_dropped = frozen_shards
                .iter()
                .all(|s| ended.contains(&(*s, epochs_before[s])));
            (fenced > 0 && all_dropped).then_some(())
        },
    )
    .await
    .unwrap();
    eprintln!(
        "node-a frozen {:?}, then fenced and closed its {} shards",
        (resumed - frozen_at).to_std().unwrap(),
        frozen_shards.len()
    );
    // No occurrence got a second ticket or ran twice, before, during or after.
    let upto = Utc::now() + chrono::Duration::seconds(2);
    for job in jobs.keys() {
        every_occurrence_once(&d, &api, job, upto).await;
    }
}
