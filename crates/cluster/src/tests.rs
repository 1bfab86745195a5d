//! The cluster state read back whole (`latest`), against a nats-server of the test's own.

use chronoshard_wire::{
    names,
    rpc::{NodeInfo, ShardAssignment, WorkerInfo},
};

use super::{read::READ_ALL_FETCH, Cluster, Connections, Error, Topology};

fn node(id: &str) -> NodeInfo {
    NodeInfo {
        node_id: id.into(),
        started_at: chrono::Utc::now(),
        heartbeat_at: chrono::Utc::now(),
        shards: vec![],
        settings_version: 0,
        clock_offset_ms: None,
        zone: None,
        labels: Default::default(),
        wheel_size: 0,
        in_flight: 0,
        cpu_share: 0.0,
        max_shards: None,
    }
}

fn assignment(shard: u32, owner: &str, epoch: u64) -> ShardAssignment {
    ShardAssignment {
        shard,
        owner: owner.into(),
        epoch,
    }
}

/// Every key is read once, at its last value and revision, across more than one fetch; deleted
/// and purged keys are left out; an empty bucket, and one holding only a purge marker, read as
/// empty; no consumer is left behind.
#[tokio::test]
async fn the_whole_state_reads_back_at_its_last_revisions() {
    let nats = chronoshard_test_util::Nats::start().await.unwrap();
    let cluster = Cluster::create(nats.client().await.unwrap(), &Topology::default())
        .await
        .unwrap();
    assert!(cluster.assignments().await.unwrap().is_empty());
    assert!(cluster.live_workers().await.unwrap().is_empty());

    let shards = READ_ALL_FETCH as u32 + 100;
    let mut revisions = Vec::new();
    for shard in 0..shards {
        let a = assignment(shard, "node-a", 1);
        revisions.push(cluster.put_assignment(&a, None).await.unwrap());
    }
    // Every third shard moves: its key gets a second revision.
    for shard in (0..shards).step_by(3) {
        let a = assignment(shard, "node-b", 2);
        let rev = revisions[shard as usize];
        revisions[shard as usize] = cluster.put_assignment(&a, Some(rev)).await.unwrap();
    }
    // A deleted key (a `DEL` marker) is not read back.
    let gone = shards;
    cluster
        .put_assignment(&assignment(gone, "node-a", 1), None)
        .await
        .unwrap();
    cluster
        .buckets
        .shards
        .delete(names::shard_key(gone))
        .await
        .unwrap();
    let read = cluster.assignments().await.unwrap();
    assert_eq!(read.len(), shards as usize);
    for (i, (a, rev)) in read.iter().enumerate() {
        let moved = i % 3 == 0;
        let want = assignment(
            i as u32,
            if moved { "node-b" } else { "node-a" },
            if moved { 2 } else { 1 },
        );
        assert_eq!(a, &want);
        assert_eq!(*rev, revisions[i], "shard {i}");
    }
    // The revision read is the one a compare-and-swap needs; an older one loses.
    let a = assignment(1, "node-c", 3);
    cluster.put_assignment(&a, Some(read[1].1)).await.unwrap();
    assert!(matches!(
        cluster.put_assignment(&a, Some(read[1].1)).await,
        Err(Error::Conflict { .. })
    ));

    for id in ["n1", "n2", "n3"] {
        cluster.heartbeat_node(&node(id)).await.unwrap();
    }
    cluster.forget_node("n2").await.unwrap();
    let mut live: Vec<String> = cluster
        .nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.node_id)
        .collect();
    live.sort();
    assert_eq!(live, ["n1", "n3"]);

    let worker = WorkerInfo {
        worker_id: "w1".into(),
        queues: vec!["q".into()],
        heartbeat_at: chrono::Utc::now(),
        in_flight: 0,
    };
    cluster.heartbeat_worker(&worker).await.unwrap();
    assert_eq!(cluster.live_workers().await.unwrap(), [worker]);
    cluster.forget_worker("w1").await.unwrap();
    assert!(cluster.live_workers().await.unwrap().is_empty());

    for bucket in [
        &cluster.buckets.shards,
        &cluster.buckets.nodes,
        &cluster.buckets.workers,
    ] {
        let consumers = bucket
            .stream
            .clone()
            .info()
            .await
            .unwrap()
            .state
            .consumer_count;
        assert_eq!(
            consumers, 0,
            "a read left a consumer on {}",
            bucket.stream_name
        );
    }
}

/// A connection that loses its server says so: the client's events are counted per connection
/// (and logged), for both connections of a role.
#[tokio::test]
async fn a_lost_server_is_counted_as_a_disconnect_of_each_connection() {
    let nats = chronoshard_test_util::Nats::start().await.unwrap();
    let _conns = Connections::connect(&nats.url(), "events-test")
        .await
        .unwrap();
    let disconnects = |name: &str| {
        chronoshard_telemetry::metrics::NATS_EVENTS_TOTAL
            .with_label_values(&[name, "disconnected"])
            .get()
    };
    assert_eq!(disconnects("events-test"), 0);
    drop(nats);
    for name in ["events-test", "events-test membership"] {
        chronoshard_test_util::wait_for(
            "the disconnect to be counted",
            std::time::Duration::from_secs(10),
            || async { (disconnects(name) >= 1).then_some(()) },
        )
        .await
        .unwrap();
    }
}

/// A subscriber that falls behind and a server going away in lame duck mode are counted on the
/// connection they happen to.
///
/// async-nats queues at most 128 events per connection and drops the rest, and it raises one
/// slow-consumer event per dropped message: the lame duck notice is therefore watched on a
/// connection whose queue the flood did not fill, as it would be lost on the flooded one.
#[tokio::test]
async fn a_slow_consumer_and_a_lame_duck_server_are_counted() {
    let nats = chronoshard_test_util::Nats::start().await.unwrap();
    let flooded = Connections::connect(&nats.url(), "events-slow")
        .await
        .unwrap();
    let calm = Connections::connect(&nats.url(), "events-ldm")
        .await
        .unwrap();
    let count = |connection: &str, event: &str| {
        chronoshard_telemetry::metrics::NATS_EVENTS_TOTAL
            .with_label_values(&[connection, event])
            .get()
    };
    let wait = |connection: &'static str, event: &'static str| async move {
        chronoshard_test_util::wait_for(
            &format!("a {event} event on {connection}"),
            std::time::Duration::from_secs(20),
            || async { (count(connection, event) >= 1).then_some(()) },
        )
        .await
        .unwrap();
    };
    assert_eq!(count("events-slow", "slow_consumer"), 0);
    assert_eq!(count("events-ldm", "lame_duck_mode"), 0);

    // A subscription nobody reads holds 65,536 messages; more are dropped, and said so.
    let _unread = flooded.data.subscribe("slow").await.unwrap();
    flooded.data.flush().await.unwrap();
    let publisher = nats.client().await.unwrap();
    for _ in 0..70_000 {
        publisher.publish("slow", "x".into()).await.unwrap();
    }
    publisher.flush().await.unwrap();
    wait("events-slow", "slow_consumer").await;
    assert_eq!(count("events-ldm", "slow_consumer"), 0);

    nats.server.lame_duck();
    wait("events-ldm", "lame_duck_mode").await;
    drop(calm);
}

/// The active strategy: written once as `balanced` version 1 by the first control plane (a
/// second `init` keeps what is there), replaced by compare-and-swap only, and followed: a
/// follower holds version 0 until it reads the entry, then every newer version.
#[tokio::test]
async fn the_active_strategy_is_created_once_swapped_and_followed() {
    use chronoshard_wire::strategy::{VersionedStrategy, DEFAULT_STRATEGY};
    use tokio_util::sync::CancellationToken;

    let nats = chronoshard_test_util::Nats::start().await.unwrap();
    let cluster = Cluster::create(nats.client().await.unwrap(), &Topology::default())
        .await
        .unwrap();
    assert_eq!(cluster.strategy().await.unwrap(), None);
    let first = cluster.init_strategy().await.unwrap();
    assert_eq!((first.version, first.name.as_str()), (1, DEFAULT_STRATEGY));
    assert_eq!(first.config, serde_json::json!({}));
    let (read, revision) = cluster.strategy().await.unwrap().unwrap();
    assert_eq!(read, first);

    let stop = CancellationToken::new();
    let mut followed = cluster.follow_strategy(stop.clone());
    let next = VersionedStrategy {
        version: 2,
        name: "zone-affinity".into(),
        config: serde_json::json!({"strict": true}),
        updated_at: chrono::Utc::now(),
    };
    cluster.put_strategy(&next, revision).await.unwrap();
    assert!(matches!(
        cluster.put_strategy(&next, revision).await,
        Err(Error::Conflict { .. })
    ));
    // Another control plane starting now keeps the entry in force.
    assert_eq!(cluster.init_strategy().await.unwrap(), next);
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        followed.wait_for(|s| s.version == 2),
    )
    .await
    .expect("the follower sees version 2")
    .unwrap();
    assert_eq!(*followed.borrow(), next);
    stop.cancel();
}

/// A follower that has not read the cluster config yet takes the first one it reads, also a
/// config of an early version (no version field, read as 0), then only newer ones.
#[tokio::test]
async fn an_unread_cluster_config_is_replaced_by_any_config_read() {
    use chronoshard_wire::rpc::{ClusterConfig, Sharding};
    use tokio_util::sync::CancellationToken;

    let nats = chronoshard_test_util::Nats::start().await.unwrap();
    let cluster = Cluster::create(nats.client().await.unwrap(), &Topology::default())
        .await
        .unwrap();
    let bucket = cluster
        .js
        .get_key_value(names::SHARDS_BUCKET)
        .await
        .unwrap();
    bucket
        .put(names::CLUSTER_CONFIG_KEY, r#"{"shard_count":8}"#.into())
        .await
        .unwrap();
    let unread = ClusterConfig {
        version: 0,
        ..ClusterConfig::new(0, Sharding::Tenant)
    };
    let stop = CancellationToken::new();
    let mut followed = cluster.follow_config(unread, stop.clone());
    let wait = std::time::Duration::from_secs(10);
    let old = tokio::time::timeout(wait, followed.wait_for(|c| c.shard_count != 0))
        .await
        .expect("the follower reads the early version's config")
        .unwrap()
        .clone();
    assert_eq!((old.shard_count, old.version), (8, 0));
    let next = ClusterConfig::new(12, Sharding::TimeWindow);
    let value = serde_json::to_vec(&next).unwrap();
    bucket
        .put(names::CLUSTER_CONFIG_KEY, value.into())
        .await
        .unwrap();
    tokio::time::timeout(wait, followed.wait_for(|c| c.version == 1))
        .await
        .expect("the follower sees version 1")
        .unwrap();
    assert_eq!(*followed.borrow(), next);
    stop.cancel();
}

/// The followed queues are unknown until the registry is read, then follow workers that come
/// and go.
#[tokio::test]
async fn live_queues_follow_the_worker_registry() {
    let nats = chronoshard_test_util::Nats::start().await.unwrap();
    let cluster = Cluster::create(nats.client().await.unwrap(), &Topology::default())
        .await
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut live = cluster.follow_live_queues(stop.clone());
    assert!(!live.borrow().unserved("q"), "unknown is not unserved");
    let soon = std::time::Duration::from_secs(10);
    tokio::time::timeout(soon, live.wait_for(|l| l.unserved("q")))
        .await
        .expect("the registry is read within 10 s")
        .unwrap();

    let worker = WorkerInfo {
        worker_id: "w1".into(),
        queues: vec!["q".into(), "http".into()],
        heartbeat_at: chrono::Utc::now(),
        in_flight: 0,
    };
    cluster.heartbeat_worker(&worker).await.unwrap();
    tokio::time::timeout(
        soon,
        live.wait_for(|l| !l.unserved("q") && !l.unserved("http")),
    )
    .await
    .expect("the worker's queues show within 10 s")
    .unwrap();
    assert!(live.borrow().unserved("shell"));

    cluster.forget_worker("w1").await.unwrap();
    tokio::time::timeout(soon, live.wait_for(|l| l.unserved("q")))
        .await
        .expect("a worker that left stops serving within 10 s")
        .unwrap();
    stop.cancel();
}
