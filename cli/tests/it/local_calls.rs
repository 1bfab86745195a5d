//! The control plane of `chronoshard dev` calls the shards of its own nodes in the process: a
//! create or a read through the API puts nothing on the shards' NATS request subjects, which
//! stay served for everyone else (workers asking about a ticket, other control planes).

use std::collections::HashSet;

use crate::common::*;
use chronoshard_wire::{
    names,
    rpc::{ShardReply, ShardRequest},
};
use futures::{FutureExt, StreamExt};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_reaches_local_shards_without_nats_and_nats_still_reaches_them() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let job = |tenant: &str| {
        json!({"tenant": tenant, "name": "later", "schedule": {"delay": "1h"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/", "method": "POST"}})
    };
    // Until every shard answered once, a call may still find a shard only over NATS (it
    // registers here as it starts serving its subject).
    let mut answered = HashSet::new();
    for i in 0..256 {
        let (status, body) = api.post("/v1/jobs", &job(&format!("warm-{i}"))).await;
        assert_eq!(status, 201, "{body}");
        answered.insert(body["shard"].as_u64().unwrap());
        if answered.len() == 8 {
            break;
        }
    }
    assert_eq!(answered.len(), 8, "256 tenants reach every shard");

    let nats = async_nats::connect(&p.nats_url).await.unwrap();
    let mut sniff = nats.subscribe("chronoshard.shard.*.rpc").await.unwrap();
    nats.flush().await.unwrap();
    let mut ids = Vec::new();
    for i in 0..40 {
        let (status, body) = api.post("/v1/jobs", &job(&format!("t-{i}"))).await;
        assert_eq!(status, 201, "{body}");
        ids.push(body["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        let (status, body) = api.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["id"], id.as_str());
    }
    // A request published before the flush's answer has reached this subscription by then.
    nats.flush().await.unwrap();
    assert!(
        sniff.next().now_or_never().is_none(),
        "the API sent a shard request over NATS"
    );

    // The subject still answers callers outside the process, e.g. a worker asking about a job.
    let shard = answered.into_iter().next().unwrap() as u32;
    let body = serde_json::to_vec(&ShardRequest::Ping).unwrap();
    let reply = nats
        .request(names::shard_rpc_subject(shard), body.into())
        .await
        .unwrap();
    match serde_json::from_slice::<ShardReply>(&reply.payload).unwrap() {
        ShardReply::Pong { shard: s, .. } => assert_eq!(s, shard),
        other => panic!("a pong, not {other:?}"),
    }
    let seen = sniff
        .next()
        .now_or_never()
        .flatten()
        .expect("the ping went over NATS");
    assert_eq!(seen.subject.as_str(), names::shard_rpc_subject(shard));
}
