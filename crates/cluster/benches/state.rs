//! Reading the whole shard map, as the control plane's assignment loop does every second:
//! `Cluster::assignments` (one ordered consumer delivering each key's last value) against what it
//! did before, listing the keys and then reading each (one request per shard). Run it with
//! `cargo bench -p chronoshard-cluster --bench state`; it starts a nats-server of its own.
//!
//! Environment (defaults in brackets): `STATE_BENCH_SHARDS` [1024], `STATE_BENCH_READS` [20]
//! (reads of each kind, alternating). Printed: the median and the slowest read of each kind.

use std::time::{Duration, Instant};

use chronoshard_cluster::Cluster;
use chronoshard_wire::{names, rpc::ShardAssignment};
use futures::TryStreamExt;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn env_num(name: &str, default: usize) -> Res<usize> {
    match std::env::var(name) {
        Ok(v) => Ok(v.parse().map_err(|e| format!("{name}={v}: {e}"))?),
        Err(_) => Ok(default),
    }
}

fn main() -> Res<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> Res<()> {
    let shards = env_num("STATE_BENCH_SHARDS", 1024)? as u32;
    let reads = env_num("STATE_BENCH_READS", 20)?.max(1);
    let nats = chronoshard_test_util::Nats::start().await?;
    let cluster = Cluster::create(nats.client().await?, &Default::default()).await?;
    for shard in 0..shards {
        let a = ShardAssignment {
            shard,
            owner: "node-1".into(),
            epoch: 1,
        };
        cluster.put_assignment(&a, None).await?;
    }
    let kv = cluster.js.get_key_value(names::SHARDS_BUCKET).await?;
    let (mut one_by_one, mut at_once) = (Vec::new(), Vec::new());
    for _ in 0..reads {
        let t = Instant::now();
        let keys: Vec<String> = kv.keys().await?.try_collect().await?;
        let mut read = 0;
        for key in keys.iter().filter(|k| k.starts_with("shard.")) {
            read += usize::from(kv.entry(key).await?.is_some());
        }
        one_by_one.push(t.elapsed());
        check(read, shards)?;

        let t = Instant::now();
        let read = cluster.assignments().await?.len();
        at_once.push(t.elapsed());
        check(read, shards)?;
    }
    println!("shard map of {shards} shards, {reads} reads each, alternating:");
    print("keys, then a get per key", &mut one_by_one);
    print("Cluster::assignments", &mut at_once);
    Ok(())
}

fn check(read: usize, shards: u32) -> Res<()> {
    if read == shards as usize {
        Ok(())
    } else {
        Err(format!("read {read} shards of {shards}").into())
    }
}

fn print(what: &str, times: &mut [Duration]) {
    times.sort();
    println!(
        "  {what:<28} median {:>8.2} ms, slowest {:>8.2} ms",
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3
    );
}
