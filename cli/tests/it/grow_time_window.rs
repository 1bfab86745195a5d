//! Adding shards to a `time_window` cluster while jobs fire, every role a separate process:
//! `POST /v1/shards {"add": 4}` takes 4 shards to 8 with a layout for later windows (2-second
//! windows here). Nothing moves at once; at the layout's first window each job whose key the
//! new layout places on an added shard is handed there. Every occurrence runs exactly once
//! across the edge, a moved job is readable and changeable where it is now with its history
//! from both shards, a keyed create sent again finds its job, and a paused tenant stays paused
//! on the added shards, while a node that joins takes its share of the shards. (A horizon of a
//! few seconds brings the edge close: a growth's layout starts a horizon and a window ahead.)
//! The second test kills (-9) a node just before the edge, so hand-offs from and to its shards
//! are cut, and every occurrence still runs once.

use std::collections::{BTreeMap, BTreeSet};

use crate::common::{cluster::*, wait_for, Api, LONG};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

/// How many jobs fire while the cluster grows.
#[derive(Clone, Copy)]
struct Load {
    tenants: usize,
    /// Every-second jobs of each tenant.
    tickers: usize,
    /// One-shots created before the growth, due over the 40 s after they are created.
    early: usize,
    /// One-shots created after it, due in the 3 s after the edge.
    late: usize,
}

/// The cluster, its every-second jobs (id → shard at creation) and one-shots.
struct Setup {
    d: Deployment,
    api: Api,
    tickers: BTreeMap<String, u64>,
    one_shots: BTreeMap<String, (String, u64)>,
    keyed: (Value, String),
    /// When the added layout's first window starts.
    edge: DateTime<Utc>,
    owners: BTreeMap<String, BTreeSet<u64>>,
}

/// A 4-shard cluster with 2-second windows and a horizon of `horizon_secs`, under load, grown
/// to 8 shards.
async fn grown(dir: &std::path::Path, horizon_secs: i64, load: Load) -> Setup {
    let mut d = Deployment::start(1).await;
    let horizon = format!("{horizon_secs}s");
    let flags = [
        "--shards",
        "4",
        "--sharding",
        "time_window",
        "--window-secs",
        "2",
        "--horizon",
        &horizon,
    ];
    d.control_plane("cp-1", &flags).await;
    for n in ["node-a", "node-b"] {
        d.node(n).await;
    }
    d.worker("worker-1", dir);
    let api = d.api("cp-1");
    wait_settled(&api, &["node-a", "node-b"]).await;

    let tenant = |i: usize| format!("tw-{:03}", i % load.tenants);
    let tickers = (0..load.tenants * load.tickers).map(|i| {
        json!({"tenant": tenant(i), "name": "tick", "schedule": {"every": "1s"},
            "catchup": {"policy": "all", "window": "1h"}, "target": d.target("tick")})
    });
    let tickers: BTreeMap<String, u64> = (create_all(&api, tickers.collect()).await.into_iter())
        .map(|(id, (_, shard))| (id, shard))
        .collect();
    let start = Utc::now();
    let early = (0..load.early).map(|i| {
        let at = start + chrono::Duration::milliseconds(5_000 + (i as i64 * 29) % 40_000);
        json!({"tenant": tenant(i), "name": "once", "schedule": {"at": at}, "target": d.target("once")})
    });
    let mut one_shots = create_all(&api, early.collect()).await;
    let keyed_body = json!({"tenant": tenant(0), "name": "keyed", "schedule": {"every": "1s"},
        "target": d.target("keyed")});
    let keyed_id = create_keyed(&api, &keyed_body, 201).await;
    // A tenant paused before the growth, with jobs created while paused.
    let (status, t) = api.post("/v1/tenants/tw-paused/pause", &json!({})).await;
    assert_eq!((status, &t["paused"]), (200, &json!(true)), "{t}");
    for _ in 0..8 {
        let held = json!({"tenant": "tw-paused", "name": "held", "schedule": {"every": "1s"},
            "target": d.target("held")});
        api.create(&held).await;
    }
    wait_for("ticks to run before the growth", LONG, || async {
        let ticks = d
            .executions()
            .keys()
            .filter(|(j, _)| tickers.contains_key(j))
            .count();
        (ticks > 2 * tickers.len()).then_some(())
    })
    .await
    .unwrap();

    let (status, map) = api.post("/v1/shards", &json!({"add": 4})).await;
    assert_eq!(status, 202, "{map}");
    assert_eq!(map["shard_count"], 8, "{map}");
    let layouts = map["windows"]["layouts"].as_array().unwrap().clone();
    assert_eq!(layouts.len(), 2, "{map}");
    assert_eq!(layouts[1]["shards"], 8, "{map}");
    let first = |map: &Value| {
        let from = map["windows"]["layouts"][1]["from_window"]
            .as_i64()
            .unwrap();
        DateTime::from_timestamp(from * 2, 0).unwrap()
    };
    let planned = first(&map);
    let lead = planned - Utc::now();
    // A horizon and a window (2 s) ahead, rounded up to the next window.
    let (horizon_ms, window_ms) = (horizon_secs * 1_000, 2_000);
    assert!(
        (horizon_ms + window_ms - 1_000..=horizon_ms + 2 * window_ms)
            .contains(&lead.num_milliseconds()),
        "the layout starts {lead} from now"
    );
    let map = wait_for("the growth to end", LONG, || async {
        let (_, map) = api.get("/v1/shards").await;
        map.get("growth").is_none().then_some(map)
    })
    .await
    .unwrap();
    assert_eq!(map["shard_count"], 8);
    // The layout starts where planned, or later if readying the added shards took longer than
    // the margin (then a horizon after the growth ended).
    let edge = first(&map);
    assert!(edge >= planned, "{edge} before {planned}");
    // One-shots due just after the edge, created under the old layout.
    let late = (0..load.late).map(|i| {
        let at = edge + chrono::Duration::milliseconds(500 + (i as i64 * 97) % 3_000);
        json!({"tenant": tenant(i), "name": "once", "schedule": {"at": at}, "target": d.target("once")})
    });
    one_shots.extend(create_all(&api, late.collect()).await);
    let owners = wait_settled(&api, &["node-a", "node-b"]).await;
    assert_eq!(owners.values().map(|s| s.len()).sum::<usize>(), 8);
    Setup {
        d,
        api,
        tickers,
        one_shots,
        keyed: (keyed_body, keyed_id),
        edge,
        owners,
    }
}

/// Sends a create with idempotency key "tw-key"; returns the job id after checking the status.
async fn create_keyed(api: &Api, body: &Value, expect: u16) -> String {
    let resp = (api.http.post(format!("{}/v1/jobs", api.base)))
        .bearer_auth(&api.token)
        .header("content-type", "application/json")
        .header("idempotency-key", "tw-key")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), expect);
    let job: Value = resp.json().await.unwrap();
    job["id"].as_str().unwrap().to_string()
}

/// The tickers that now answer from another shard than they were created on.
async fn moved(api: &Api, tickers: &BTreeMap<String, u64>) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    for (id, before) in tickers {
        let (status, job) = api.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(status, 200, "{job}");
        let now = job["shard"].as_u64().unwrap();
        if now != *before {
            assert!(
                (4..8).contains(&now),
                "{id} moved from {before} to an old shard {now}"
            );
            out.insert(id.clone(), (*before, now));
        }
    }
    out
}

/// Checks every ticker and one-shot ran each occurrence once, across the edge.
async fn each_ran_once(s: &Setup) {
    let upto = s.edge + chrono::Duration::seconds(3);
    wait_for("the clock to pass the edge", LONG, || async {
        (Utc::now() > upto + chrono::Duration::seconds(1)).then_some(())
    })
    .await
    .unwrap();
    let mut ticks = Vec::with_capacity(s.tickers.len());
    for job in s.tickers.keys() {
        ticks.push((job, runs_up_to(&s.api, job, upto).await));
    }
    for job in s.one_shots.keys() {
        wait_for(&format!("one-shot {job} to succeed"), LONG, || async {
            let runs = runs(&s.api, job).await;
            (runs.len() == 1 && runs[0]["status"] == "succeeded").then_some(())
        })
        .await
        .unwrap();
    }
    // What the sink received, read once: thousands of jobs' executions.
    let executions = s.d.executions();
    for (job, runs) in &ticks {
        let times = each_once(&executions, job, runs);
        assert!(
            times[0] < s.edge - chrono::Duration::seconds(3),
            "{job} ran from before the growth"
        );
    }
    let mut per_one_shot: BTreeMap<&str, usize> = BTreeMap::new();
    for ((job, _), got) in &executions {
        *per_one_shot.entry(job.as_str()).or_default() += got.len();
    }
    for job in s.one_shots.keys() {
        let n = per_one_shot.get(job.as_str()).copied().unwrap_or(0);
        assert_eq!(n, 1, "one-shot {job} executed {n} times");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_change_shard_at_the_new_layouts_edge_and_fire_once() {
    let dir = tempfile::tempdir().unwrap();
    let load = Load {
        tenants: 100,
        tickers: 2,
        early: 1_600,
        late: 200,
    };
    let mut s = grown(dir.path(), 10, load).await;
    // Nothing has moved yet: the every-second jobs leave after their last occurrence before
    // the edge, a second before it. Each job is read before then, or not at all.
    let mut looked = 0;
    for (id, before) in s.tickers.iter().take(20) {
        if Utc::now() >= s.edge - chrono::Duration::milliseconds(1_200) {
            break;
        }
        let (status, job) = s.api.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(
            (status, job["shard"].as_u64()),
            (200, Some(*before)),
            "{id} moved early"
        );
        looked += 1;
    }
    eprintln!("{looked} jobs read where they were created, before the edge");
    // A node that joins under the same load, around the edge, takes its share of the shards.
    s.d.node("node-c").await;
    let owners = wait_settled(&s.api, &["node-a", "node-b", "node-c"]).await;
    assert!(!owners["node-c"].is_empty(), "{owners:?}");
    each_ran_once(&s).await;

    let moved = moved(&s.api, &s.tickers).await;
    assert!(
        (50..=150).contains(&moved.len()),
        "about half of {} jobs move to the 4 added shards: {}",
        s.tickers.len(),
        moved.len()
    );
    // One-shots created under the old layout and due after the edge moved too.
    let mut late_moved = 0;
    for (id, (_, before)) in &s.one_shots {
        let (status, job) = s.api.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(status, 200, "{job}");
        late_moved += usize::from(job["shard"].as_u64() != Some(*before));
    }
    assert!(late_moved > 0, "no one-shot moved");
    // A moved job's history is whole: runs from before the edge (its old shard's) and after.
    let (job, _) = moved.iter().next().unwrap();
    let all = runs(&s.api, job).await;
    let times: Vec<DateTime<Utc>> = all.iter().map(|r| at(&r["scheduled_at"])).collect();
    assert!(times.iter().any(|t| *t < s.edge) && times.iter().any(|t| *t >= s.edge));
    // It can be changed where it is now.
    let (status, paused) = s
        .api
        .post(&format!("/v1/jobs/{job}/pause"), &json!({}))
        .await;
    assert_eq!(
        (status, paused["state"].as_str()),
        (200, Some("paused")),
        "{paused}"
    );
    let (status, resumed) = s
        .api
        .post(&format!("/v1/jobs/{job}/resume"), &json!({}))
        .await;
    assert_eq!(
        (status, resumed["state"].as_str()),
        (200, Some("active")),
        "{resumed}"
    );
    // A tenant's list shows each of its jobs once.
    let (status, page) = s.api.get("/v1/jobs?tenant=tw-001&limit=100").await;
    assert_eq!(status, 200);
    let listed: BTreeSet<&str> = (page["jobs"].as_array().unwrap().iter())
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), page["jobs"].as_array().unwrap().len());
    let once = (s.one_shots.values())
        .filter(|(t, _)| t == "tw-001")
        .count();
    assert_eq!(
        listed.len(),
        load.tickers + once,
        "every job of tw-001 once"
    );
    // A keyed create sent again finds its job, wherever it is now.
    let (body, id) = &s.keyed;
    assert_eq!(&create_keyed(&s.api, body, 200).await, id);
    // The paused tenant is paused on the added shards too, and its job never ran.
    let (_, t) = s.api.get("/v1/tenants/tw-paused").await;
    assert_eq!(
        (&t["paused"], &t["paused_shards"], &t["shards"]),
        (&json!(true), &json!(8), &json!(8)),
        "{t}"
    );
    let held = (s.d.sink.requests().iter())
        .filter(|r| r.path == "/held")
        .count();
    assert_eq!(held, 0, "the paused tenant's job ran");
    eprintln!(
        "{} of {} jobs moved at the edge {}",
        moved.len(),
        s.tickers.len(),
        s.edge
    );
    // How late the every-second jobs ran (the sink's receipt after the due time) before, around
    // (the 2 s either side) and after the edge. Printed, not asserted: timing is the load
    // test's business.
    let around = chrono::Duration::seconds(2);
    let phase =
        |at: DateTime<Utc>| usize::from(at >= s.edge - around) + usize::from(at >= s.edge + around);
    let executions = s.d.executions();
    print_lateness(
        "the edge",
        ["before", "around", "after"],
        &executions,
        |job| s.tickers.contains_key(job),
        phase,
    );
}

/// A node killed (-9) just before the edge, so that the last occurrence before it (when the
/// every-second jobs are handed off) falls due while the node's shards have no owner: hand-offs
/// from its shards come from their next owner, those to its shards are sent again until the
/// shards have one. Every occurrence still runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_killed_at_the_edge_loses_no_hand_off() {
    let dir = tempfile::tempdir().unwrap();
    // Enough every-second jobs that some surely move from node-b's shards to node-a's: with
    // four, none did in one run of the whole suite.
    let load = Load {
        tenants: 10,
        tickers: 12,
        early: 0,
        late: 20,
    };
    let mut s = grown(dir.path(), 12, load).await;
    let victim_shards = s.owners["node-a"].clone();
    let last_before = s.edge - chrono::Duration::seconds(1);
    assert!(
        Utc::now() < last_before - chrono::Duration::seconds(1),
        "set up too slowly"
    );
    wait_for("just before the hand-offs", LONG, || async {
        (Utc::now() >= last_before - chrono::Duration::milliseconds(300)).then_some(())
    })
    .await
    .unwrap();
    let killed_at = Utc::now();
    s.d.nodes.get_mut("node-a").unwrap().kill9().await;
    wait_settled(&s.api, &["node-b"]).await;
    let settled_at = Utc::now();
    // The fault happened: the hand-offs fell due while node-a's shards had no owner.
    assert!(
        killed_at < last_before && last_before < settled_at,
        "{killed_at} {last_before} {settled_at}"
    );
    each_ran_once(&s).await;
    // node-b sent hand-offs to node-a's shards while they had no owner, and sent them again.
    let node_b = &s.d.nodes["node-b"];
    let resent = node_b.logged("handing jobs off failed; sending again");
    let left_over = node_b.logged("sending hand-offs a previous owner left");
    eprintln!(
        "node-b: {resent} hand-off batches sent again, {left_over} shards with hand-offs left"
    );
    assert!(resent > 0, "no hand-off reached a shard without owner");
    let moved = moved(&s.api, &s.tickers).await;
    let through_victim = (moved.values())
        .filter(|(from, to)| victim_shards.contains(from) || victim_shards.contains(to))
        .count();
    assert!(
        through_victim > 0,
        "some job moved from or to node-a's shards {victim_shards:?}: {moved:?}"
    );
    eprintln!(
        "{through_victim} of {} moved jobs went through node-a's shards",
        moved.len()
    );
}
