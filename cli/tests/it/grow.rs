//! Adding shards while jobs fire, every role a separate process: `POST /v1/shards {"add": 4}`
//! takes a 4-shard cluster to 8 while every-second jobs and one-shots of 100 tenants fire. The
//! tenants whose place changed move to the added shards; every occurrence owed runs exactly
//! once, and every moved tenant's jobs are readable and changeable on their new shard. A node
//! that joins afterwards takes its share of the shards.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use crate::common::{cluster::*, wait_for};
use chrono::Utc;
use serde_json::json;

const TENANTS: usize = 100;
/// Every-second jobs: two per tenant.
const TICKERS_PER_TENANT: usize = 2;
/// One-shots: 18 per tenant, due over the minute the test runs.
const ONE_SHOTS_PER_TENANT: usize = 18;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shards_added_under_load_move_tenants_without_a_lost_or_doubled_fire() {
    let began = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut d = Deployment::start(1).await;
    d.control_plane("cp-1", &["--shards", "4"]).await;
    for n in ["node-a", "node-b"] {
        d.node(n).await;
    }
    d.worker("worker-1", dir.path());
    let api = d.api("cp-1");
    wait_settled(&api, &["node-a", "node-b"]).await;

    let tenant = |i: usize| format!("grow-{i:03}");
    let tickers = create_all(
        &api,
        (0..TENANTS * TICKERS_PER_TENANT)
            .map(|i| {
                json!({"tenant": tenant(i % TENANTS), "name": "tick", "schedule": {"every": "1s"},
                    "catchup": {"policy": "all", "window": "1h"}, "target": d.target("tick")})
            })
            .collect(),
    )
    .await;
    let start = Utc::now();
    let one_shots = create_all(
        &api,
        (0..TENANTS * ONE_SHOTS_PER_TENANT)
            .map(|i| {
                let at = start + chrono::Duration::milliseconds(5_000 + (i as i64 * 29) % 40_000);
                json!({"tenant": tenant(i % TENANTS), "name": "once", "schedule": {"at": at},
                    "target": d.target("once")})
            })
            .collect(),
    )
    .await;
    assert_eq!(tickers.len() + one_shots.len(), 2_000);
    eprintln!("created after {:?}", began.elapsed());

    // Firing before the growth.
    wait_for("ticks to run before the growth", SETTLE, || async {
        (d.executions().len() > 2 * tickers.len()).then_some(())
    })
    .await
    .unwrap();
    let grow_at = Utc::now();
    let (status, map) = api.post("/v1/shards", &json!({"add": 4})).await;
    assert_eq!(status, 202, "{map}");
    assert_eq!(map["shard_count"], 8, "{map}");
    assert_eq!(map["growth"]["from"], 4, "{map}");
    // A second growth while one is under way is refused, as is a bad count.
    let (status, busy) = api.post("/v1/shards", &json!({"add": 1})).await;
    assert_eq!(
        (status, busy["code"].as_str()),
        (409, Some("conflict")),
        "{busy}"
    );
    let (status, bad) = api.post("/v1/shards", &json!({"add": 0})).await;
    assert_eq!(
        (status, bad["code"].as_str()),
        (400, Some("invalid_field")),
        "{bad}"
    );

    // Creates keep coming while tenants move: each lands where its tenant is placed.
    let during = std::sync::Mutex::new(BTreeMap::new());
    let grown_at = std::sync::Mutex::new(Utc::now());
    let pending_max = std::sync::Mutex::new(0f64);
    let grown = wait_for("the growth to finish", Duration::from_secs(240), || async {
        *grown_at.lock().unwrap() = Utc::now();
        let pending = api.metric_sum("chronoshard_growth_shards_pending").await;
        {
            let mut max = pending_max.lock().unwrap();
            *max = max.max(pending);
        }
        let i = during.lock().unwrap().len();
        let at = Utc::now() + chrono::Duration::seconds(2);
        let body = json!({"tenant": tenant(i % TENANTS), "name": "during", "schedule": {"at": at},
            "target": d.target("once")});
        let created = create_all(&api, vec![body]).await;
        during.lock().unwrap().extend(created);
        let (_, map) = api.get("/v1/shards").await;
        map.get("growth").is_none().then_some(map)
    })
    .await
    .unwrap();
    let during = during.into_inner().unwrap();
    assert_eq!(grown["shard_count"], 8);
    let owners = wait_settled(&api, &["node-a", "node-b"]).await;
    assert_eq!(owners.values().map(|s| s.len()).sum::<usize>(), 8);
    // A node that joins under the same load takes its share of the 8 shards; the occurrences
    // checked below span its join too.
    d.node("node-c").await;
    let owners = wait_settled(&api, &["node-a", "node-b", "node-c"]).await;
    assert!(!owners["node-c"].is_empty(), "{owners:?}");

    // The growth really moved tenants: jobs now answer from added shards.
    let mut moved: BTreeSet<String> = BTreeSet::new();
    for (id, (t, before)) in tickers.iter().chain(&one_shots) {
        let (status, job) = api.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(status, 200, "{job}");
        let now = job["shard"].as_u64().unwrap();
        if now != *before {
            assert!(
                (4..8).contains(&now),
                "{id} moved from {before} to an old shard {now}"
            );
            moved.insert(t.clone());
        }
    }
    assert!(
        moved.len() >= 10,
        "about half of the tenants move to 4 added shards: {moved:?}"
    );
    let moves = api
        .metric_sum_with("chronoshard_tenant_moves_total", r#"result="done""#)
        .await;
    assert!(
        moves >= moved.len() as f64,
        "the leader counted its moves: {moves} for {} tenants seen moved",
        moved.len()
    );
    // While tenants moved, the leader showed old shards still to seal (at most all 4).
    let pending_max = pending_max.into_inner().unwrap();
    assert!((1.0..=4.0).contains(&pending_max), "{pending_max}");
    let timed = api
        .metric_sum("chronoshard_tenant_move_seconds_count")
        .await;
    assert!(timed >= 1.0, "the leader timed its moves: {timed}");
    let (_, _, text) = api.send(reqwest::Method::GET, "/metrics", None).await;
    let text = text.as_str().unwrap_or_default().to_string();
    assert!(
        text.lines()
            .any(|l| l == "chronoshard_growth_shards_pending 0"),
        "the leader shows no old shard left to seal"
    );

    eprintln!("grown after {:?}", began.elapsed());

    // Every owed occurrence ran exactly once.
    let upto = Utc::now() + chrono::Duration::seconds(1);
    let mut ticks = Vec::new();
    for job in tickers.keys() {
        ticks.push((job, runs_up_to(&api, job, upto).await));
    }
    for job in one_shots.keys().chain(during.keys()) {
        wait_for(&format!("one-shot {job} to succeed"), SETTLE, || async {
            let runs = runs(&api, job).await;
            (runs.len() == 1 && runs[0]["status"] == "succeeded").then_some(())
        })
        .await
        .unwrap();
    }
    let per = d.executions();
    for (job, runs) in &ticks {
        each_once(&per, job, runs);
    }
    eprintln!("checked after {:?}", began.elapsed());
    // How late the ticks ran (the sink's receipt after the due time) before, during and after.
    let grown_at = grown_at.into_inner().unwrap();
    let phase = |at: chrono::DateTime<Utc>| usize::from(at >= grow_at) + usize::from(at > grown_at);
    print_lateness(
        "the growth",
        ["before", "during", "after"],
        &per,
        |job| tickers.contains_key(job),
        phase,
    );
    eprintln!("growth took {} ms", (grown_at - grow_at).num_milliseconds());
    for job in one_shots.keys().chain(during.keys()) {
        let n: usize = per
            .iter()
            .filter(|((j, _), _)| j == job)
            .map(|(_, v)| v.len())
            .sum();
        assert_eq!(n, 1, "one-shot {job} executed {n} times");
    }

    // A moved tenant's jobs can be changed where they are now, and its new jobs go there too.
    let t = moved.iter().next().unwrap();
    let (id, _) = tickers.iter().find(|(_, (tt, _))| tt == t).unwrap();
    let (status, paused) = api.post(&format!("/v1/jobs/{id}/pause"), &json!({})).await;
    assert_eq!(
        (status, paused["state"].as_str()),
        (200, Some("paused")),
        "{paused}"
    );
    let (status, page) = api.get(&format!("/v1/jobs?tenant={t}&limit=100")).await;
    assert_eq!(status, 200);
    let listed = page["jobs"].as_array().unwrap();
    assert_eq!(
        listed.len(),
        TICKERS_PER_TENANT
            + ONE_SHOTS_PER_TENANT
            + during.values().filter(|(tt, _)| tt == t).count(),
        "every job of {t} listed once after its move"
    );
    let fresh = create_all(
        &api,
        vec![json!({"tenant": t, "name": "after", "schedule": {"delay": "1s"}, "target": d.target("once")})],
    )
    .await;
    let shard_now = listed[0]["shard"].as_u64().unwrap();
    assert!(
        fresh.values().all(|(_, s)| *s == shard_now),
        "{fresh:?} on {shard_now}"
    );

    eprintln!(
        "grew 4 -> 8 shards under {} jobs; {} of {TENANTS} tenants moved; {} creates during the growth",
        tickers.len() + one_shots.len(),
        moved.len(),
        during.len()
    );
}

/// Which node a test kills while a tenant is frozen mid-move.
#[derive(Clone, Copy, Debug)]
enum Victim {
    /// The owner of the shard the tenant leaves.
    Source,
    /// The owner of the shard it goes to.
    Target,
}

/// Adds shards under every-second jobs and kills (-9) the owner of the source or the target
/// shard of a move while its tenant is frozen; the growth finishes on the surviving node, and
/// every occurrence owed runs once.
async fn a_move_survives_a_kill_of(victim: Victim) {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Deployment::start(1).await;
    d.control_plane("cp-1", &["--shards", "4"]).await;
    for n in ["node-a", "node-b"] {
        d.node(n).await;
    }
    d.worker("worker-1", dir.path());
    let api = d.api("cp-1");
    wait_settled(&api, &["node-a", "node-b"]).await;
    let tickers = create_all(
        &api,
        (0..60)
            .map(|i| {
                json!({"tenant": format!("kill-{i:02}"), "name": "tick", "schedule": {"every": "1s"},
                    "catchup": {"policy": "all", "window": "1h"}, "target": d.target("tick")})
            })
            .collect(),
    )
    .await;
    wait_for("ticks to run before the growth", SETTLE, || async {
        (d.executions().len() > 2 * tickers.len()).then_some(())
    })
    .await
    .unwrap();
    let (status, map) = api.post("/v1/shards", &json!({"add": 4})).await;
    assert_eq!(status, 202, "{map}");

    // A move with its tenant frozen, and the node that owns the shard the test kills.
    let (moving, owner) = wait_for(
        "a tenant frozen mid-move",
        Duration::from_secs(60),
        || async {
            let (_, map) = api.get("/v1/shards").await;
            let m = map["growth"]["moving"].clone();
            if m["phase"] != "frozen" {
                return None;
            }
            let shard = match victim {
                Victim::Source => &m["source"],
                Victim::Target => &m["target"],
            };
            let owner = map["shards"]
                .as_array()?
                .iter()
                .find(|a| a["shard"] == *shard)?["owner"]
                .as_str()?
                .to_string();
            Some((m, owner))
        },
    )
    .await
    .unwrap();
    let killed_at = Utc::now();
    d.nodes
        .get_mut(&owner)
        .unwrap()
        .signal(nix::sys::signal::Signal::SIGKILL);
    let survivor = if owner == "node-a" {
        "node-b"
    } else {
        "node-a"
    };

    let grown = wait_for("the growth to finish", Duration::from_secs(240), || async {
        let (_, map) = api.get("/v1/shards").await;
        map.get("growth").is_none().then_some(map)
    })
    .await
    .unwrap();
    assert_eq!(grown["shard_count"], 8);
    wait_settled(&api, &[survivor]).await;

    // The frozen tenants live on their new shard, every job of theirs readable there.
    let key_tenants: Vec<&str> = moving["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(!key_tenants.is_empty(), "{moving}");
    for (id, (t, _)) in &tickers {
        let (status, job) = api.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(status, 200, "{job}");
        if key_tenants.contains(&t.as_str()) {
            assert_eq!(job["shard"], moving["target"], "{job}");
        }
    }
    // Occurrences fell due while the node was dead, and each ran once.
    let upto = Utc::now() + chrono::Duration::seconds(1);
    let mut ticks = Vec::new();
    for job in tickers.keys() {
        ticks.push((job, runs_up_to(&api, job, upto).await));
    }
    let per = d.executions();
    let mut due_after_kill = 0;
    for (job, runs) in &ticks {
        let times = each_once(&per, job, runs);
        due_after_kill += times.iter().filter(|t| **t > killed_at).count();
    }
    assert!(due_after_kill > 0, "occurrences fell due after the kill");
    eprintln!(
        "{victim:?} owner {owner} killed while {key_tenants:?} moved from {} to {}; {due_after_kill} occurrences due after the kill ran once",
        moving["source"], moving["target"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_move_finishes_when_its_source_node_is_killed() {
    a_move_survives_a_kill_of(Victim::Source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_move_finishes_when_its_target_node_is_killed() {
    a_move_survives_a_kill_of(Victim::Target).await;
}
