//! The production topology on one machine, every part a separate process on loopback with its
//! own servers: a 3-node NATS cluster (streams and buckets with 3 replicas), two control-plane
//! replicas, three shard nodes on one PostgreSQL, two workers. Every-second jobs and one-shots
//! run while one nats-server, one shard node and the leading control plane are killed in turn
//! (`kill -9`): every owed occurrence executes, none is ticketed or executed twice, and the API
//! answers from the surviving replica, which leads.

use std::time::Duration;

use crate::common;
use crate::common::{
    cluster::{NatsServers, *},
    wait_for,
};
use chrono::Utc;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_platform_survives_a_nats_server_a_shard_node_and_the_leader_being_killed_in_turn() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Deployment::start(3).await;
    d.control_plane("cp-1", &["--shards", "8"]).await;
    d.control_plane("cp-2", &[]).await;
    let names = ["node-a", "node-b", "node-c"];
    for n in names {
        d.node(n).await;
    }
    d.worker("worker-1", dir.path());
    d.worker("worker-2", dir.path());
    let api1 = d.api("cp-1");
    let api2 = d.api("cp-2");
    wait_settled(&api1, &names).await;
    // One leader, seen alike by both replicas; its metric says so.
    let leader = wait_for("one leader both replicas agree on", SETTLE, || async {
        let (_, a) = api1.get("/v1/cluster").await;
        let (_, b) = api2.get("/v1/cluster").await;
        let l = a["leader"].as_str()?.to_string();
        (b["leader"] == l.as_str() && a["replicas"].as_array()?.len() == 2).then_some(l)
    })
    .await
    .unwrap();
    for (id, api) in [("cp-1", &api1), ("cp-2", &api2)] {
        let leads = api
            .metric_sum_with(
                "chronoshard_control_plane_leader",
                &format!("replica=\"{id}\""),
            )
            .await;
        assert_eq!(leads, if id == leader { 1.0 } else { 0.0 }, "{id}");
    }
    let (_, cluster) = api1.get("/v1/cluster").await;
    assert_eq!(cluster["config"]["shard_count"], 8);
    // A replica given another shard count refuses to start, saying what the cluster has.
    let out = common::process::command(&[
        "control-plane",
        "--id",
        "cp-x",
        "--nats",
        &d.nats.url(),
        "--token",
        TOKEN,
        "--http",
        "127.0.0.1:0",
        "--shards",
        "16",
    ])
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("created with --shards 8"),
        "{err}"
    );
    // It changed nothing on its way out: every stream and bucket still has three replicas.
    let js = async_nats::jetstream::new(
        async_nats::connect(d.nats.url().split(',').next().unwrap())
            .await
            .unwrap(),
    );
    for name in [
        "CHRONOSHARD_DISPATCH",
        "CHRONOSHARD_RESULTS",
        "KV_chronoshard_nodes",
        "KV_chronoshard_shards",
        "KV_chronoshard_workers",
        "KV_chronoshard_control",
    ] {
        let mut stream = js.get_stream(name).await.unwrap();
        let replicas = stream.info().await.unwrap().config.num_replicas;
        assert_eq!(replicas, 3, "{name}");
    }

    let jobs = every_second_jobs(&d, &api1, 8, 1).await;
    let started = Utc::now();
    let mut one_shots = Vec::new();
    let target = d.target("once");

    // 1. A nats-server dies (and comes back): R3 streams and buckets lose nothing.
    one_shots.extend(create_one_shots(&api1, &target, 1).await);
    let NatsServers::Cluster(nats) = &mut d.nats else {
        unreachable!()
    };
    nats.kill(0).await.unwrap();
    let dead_since = Utc::now();
    // A stream or consumer led by the dead server elects a new leader among its replicas; its
    // results are applied once it has one.
    wait_for(
        "occurrences to fire with a nats-server down",
        Duration::from_secs(60),
        || async {
            let all = futures::future::join_all(jobs.keys().map(|j| runs(&api2, j))).await;
            let after = dead_since + chrono::Duration::seconds(2);
            // Every job has run an occurrence due with the server down.
            all.iter()
                .all(|runs| {
                    runs.iter()
                        .any(|r| r["status"] == "succeeded" && at(&r["scheduled_at"]) > after)
                })
                .then_some(())
        },
    )
    .await
    .unwrap();
    nats.restart(0).await.unwrap();
    let nats_window = (dead_since, Utc::now());

    // 2. A shard node that owns shards dies: its shards move.
    one_shots.extend(create_one_shots(&api2, &target, 2).await);
    let owners = wait_settled(&api2, &names).await;
    assert!(
        !owners["node-b"].is_empty(),
        "node-b owns shards before it is killed"
    );
    let node_killed = Utc::now();
    d.nodes.get_mut("node-b").unwrap().kill9().await;
    wait_settled(&api2, &["node-a", "node-c"]).await;
    let node_window = (node_killed, Utc::now());

    // 3. The leading control plane dies: the other takes the lease within its TTL and keeps
    // the shard map right (a node lost now still fails over).
    one_shots.extend(create_one_shots(&api2, &target, 3).await);
    let survivor = if leader == "cp-1" { "cp-2" } else { "cp-1" };
    let api = d.api(survivor);
    let killed = std::time::Instant::now();
    let leader_killed = Utc::now();
    d.control_planes.get_mut(&leader).unwrap().0.kill9().await;
    wait_for("the surviving replica to lead", SETTLE, || async {
        let (_, c) = api.get("/v1/cluster").await;
        (c["leader"] == survivor).then_some(())
    })
    .await
    .unwrap();
    let took_over = killed.elapsed();
    let leader_window = (leader_killed, Utc::now());
    // The survivor's gauge follows its lease.
    wait_for("the survivor's leader gauge to read 1", SETTLE, || async {
        let leads = api
            .metric_sum_with(
                "chronoshard_control_plane_leader",
                &format!("replica=\"{survivor}\""),
            )
            .await;
        (leads == 1.0).then_some(())
    })
    .await
    .unwrap();
    assert!(
        took_over < Duration::from_secs(6),
        "took {took_over:?} (lease TTL 3 s)"
    );
    d.nodes.get_mut("node-c").unwrap().kill9().await;
    wait_settled(&api, &["node-a"]).await;
    one_shots.extend(create_one_shots(&api, &target, 4).await);

    // Every owed occurrence executed once, across all three faults.
    let upto = Utc::now() + chrono::Duration::seconds(1);
    let mut late = [Duration::ZERO; 3];
    let windows = [nats_window, node_window, leader_window];
    for job in jobs.keys() {
        let times = every_occurrence_once(&d, &api, job, upto).await;
        assert!(times[0] <= started);
        // What each fault cost: the worst lateness of an occurrence due during it.
        for t in times {
            for (i, (from, to)) in windows.iter().enumerate() {
                if t >= *from && t <= *to {
                    let ran = executed_at(&d, job, t).unwrap();
                    late[i] = late[i].max((ran - t).to_std().unwrap_or_default());
                }
            }
        }
    }
    eprintln!(
        "worst lateness of an occurrence due during each fault: nats-server killed {:?} \
         (down {:?}), shard node killed {:?}, leader killed {:?}",
        late[0],
        (nats_window.1 - nats_window.0).to_std().unwrap(),
        late[1],
        late[2]
    );
    for job in &one_shots {
        wait_for(&format!("one-shot {job}"), SETTLE, || async {
            let runs = runs(&api, job).await;
            (runs.len() == 1 && runs[0]["status"] == "succeeded").then_some(())
        })
        .await
        .unwrap();
        let n: usize = d
            .executions()
            .iter()
            .filter(|((j, _), _)| j == job)
            .map(|(_, v)| v.len())
            .sum();
        assert_eq!(n, 1, "one-shot {job} executed {n} times");
    }
    eprintln!("the surviving replica led {took_over:?} after the leader was killed");
}

/// Eight one-shots due in 2 s, over eight tenants (so over several shards).
async fn create_one_shots(
    api: &common::Api,
    target: &serde_json::Value,
    round: usize,
) -> Vec<String> {
    let mut ids = Vec::new();
    for t in 0..8 {
        let body = json!({"tenant": format!("os-{round}-{t}"), "name": "once",
            "schedule": {"delay": "2s"}, "target": target});
        let (s, job) = api.post("/v1/jobs", &body).await;
        assert_eq!(s, 201, "{job}");
        ids.push(job["id"].as_str().unwrap().to_string());
    }
    ids
}
