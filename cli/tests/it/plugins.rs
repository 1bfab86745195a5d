//! Assignment-strategy plugins in a production deployment, every role a separate process: a
//! control plane started with `--plugin-dir`, shard nodes with zones and labels, a worker, and
//! every-second jobs firing throughout. The zone-affinity example, loaded with
//! `POST /v1/plugins` and activated with `PUT /v1/strategy`, moves each shard to a node of its
//! zone, and keeps doing so on the next leader, which loads it from its own plugin directory; a
//! plugin that panics, answers an invalid assignment or hangs moves nothing, takes nothing
//! down, and a node killed meanwhile still fails over. Loading anything but a plain name from the directory is refused
//! with a problem document. No occurrence is lost or doubled.

use std::{
    collections::{BTreeMap, BTreeSet},
    env::consts::{DLL_PREFIX, DLL_SUFFIX},
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Duration,
};

use crate::common::{cluster::*, process::Process, wait_for, Api};
use chrono::Utc;
use reqwest::Method;
use serde_json::{json, Value};

/// The plugin crates these tests load.
const ZONE_AFFINITY: &str = "chronoshard-plugin-zone-affinity";
const FAULTY: &str = "chronoshard-test-plugin-faulty";

/// Builds the plugin crates once per test binary, into `target/test-plugins` (beside the
/// workspace's own target dir, as the control plane's host tests do, so this build never waits
/// on the lock of the build running these tests); the directory holding the libraries.
fn built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let target = root.join("target").join("test-plugins");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(root)
            .args(["build", "--locked", "--quiet", "--target-dir"])
            .arg(&target)
            .args(["-p", ZONE_AFFINITY, "-p", FAULTY])
            .status()
            .expect("cargo could not be run");
        assert!(status.success(), "building the plugins failed: {status}");
        target.join("debug")
    })
}

/// The library cargo made for `krate`.
fn library(krate: &str) -> PathBuf {
    built().join(format!(
        "{DLL_PREFIX}{}{DLL_SUFFIX}",
        krate.replace('-', "_")
    ))
}

/// A plugin directory holding `krate` as `<name>.so`.
fn plugin_dir(krate: &str, name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        library(krate),
        dir.path().join(format!("{name}{DLL_SUFFIX}")),
    )
    .unwrap();
    dir
}

async fn put(api: &Api, path: &str, body: &Value) -> (u16, Value) {
    let (status, _, v) = api.send(Method::PUT, path, Some(&body.to_string())).await;
    (status, v)
}

async fn load(api: &Api, name: &str) -> (u16, Value) {
    api.post("/v1/plugins", &json!({ "name": name })).await
}

/// The failed passes of strategy `name`, for `reason` or every reason.
async fn strategy_errors(api: &Api, name: &str, reason: Option<&str>) -> f64 {
    let (_, _, text) = api.send(Method::GET, "/metrics", None).await;
    let strategy = format!("strategy=\"{name}\"");
    let reason = reason.map(|r| format!("reason=\"{r}\""));
    text.as_str()
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("chronoshard_strategy_errors_total{") && l.contains(&strategy))
        .filter(|l| reason.as_ref().is_none_or(|r| l.contains(r.as_str())))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The failed passes of strategy `faulty` counted for `reason`.
async fn faulty_errors(api: &Api, reason: &str) -> f64 {
    strategy_errors(api, "faulty", Some(reason)).await
}

/// Whether `faulty` failed for `reason` in two passes at least (so it was not only the first
/// one) and `GET /v1/plugins` shows `last` as its last error.
async fn failing_with(api: &Api, reason: &str, last: &str) -> Option<()> {
    let shown = listed(api, "faulty").await["last_error"]["reason"].clone();
    (faulty_errors(api, reason).await >= 2.0 && shown == last).then_some(())
}

/// `GET /v1/plugins`' entry for strategy `name`.
async fn listed(api: &Api, name: &str) -> Value {
    let (status, list) = api.get("/v1/plugins").await;
    assert_eq!(status, 200, "{list}");
    list["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Asserts a problem document with this status and code (and field, when given).
fn problem(answer: (u16, Value), status: u16, code: &str, field: Option<&str>) -> Value {
    let (got, body) = answer;
    assert_eq!((got, body["code"].as_str()), (status, Some(code)), "{body}");
    assert_eq!(body["field"].as_str(), field, "{body}");
    assert!(
        body["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "{body}"
    );
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_zone_affinity_plugin_moves_shards_to_their_zones_without_a_lost_or_doubled_fire() {
    let work = tempfile::tempdir().unwrap();
    let plugins = plugin_dir(ZONE_AFFINITY, "zone-affinity");
    // A library outside the directory, reachable through a symlink inside it.
    let elsewhere = tempfile::tempdir().unwrap();
    let outside = elsewhere.path().join(format!("evil{DLL_SUFFIX}"));
    std::fs::copy(library(ZONE_AFFINITY), &outside).unwrap();
    let escape = plugins.path().join(format!("escape{DLL_SUFFIX}"));
    std::os::unix::fs::symlink(&outside, escape).unwrap();

    let mut d = Deployment::start(1).await;
    let dir = plugins.path().to_str().unwrap();
    d.control_plane("cp-1", &["--shards", "4", "--plugin-dir", dir])
        .await;
    // node-c has no db_zone label: the example takes its zone instead.
    d.node_with("node-a", &["--label", "db_zone=east"]).await;
    d.node_with("node-b", &["--label", "db_zone=west", "--label", "rack=r1"])
        .await;
    d.node_with("node-c", &["--zone", "west"]).await;
    d.worker("worker-1", work.path());
    let api = d.api("cp-1");
    let names = ["node-a", "node-b", "node-c"];
    wait_settled(&api, &names).await;
    let jobs = every_second_jobs(&d, &api, 4, 1).await;

    let (status, list) = api.get("/v1/plugins").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        (&list["active"]["name"], &list["active"]["version"]),
        (&json!("balanced"), &json!(1))
    );
    assert_eq!(list["active"]["config"], json!({}));
    assert_eq!(list["plugin_dir"], json!(dir));
    assert_eq!(list["strategies"].as_array().unwrap().len(), 5, "{list}");
    let (_, nodes) = api.get("/v1/nodes").await;
    let b = nodes["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == "node-b");
    assert_eq!(
        b.unwrap()["labels"],
        json!({"db_zone": "west", "rack": "r1"})
    );

    // Only a plain name of a usable file in the directory loads.
    problem(load(&api, "../x").await, 400, "invalid_field", Some("name"));
    problem(load(&api, "a/b").await, 400, "invalid_field", Some("name"));
    let body = problem(load(&api, "escape").await, 422, "plugin_unusable", None);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("outside the plugin directory"),
        "{body}"
    );
    problem(load(&api, "missing").await, 404, "not_found", None);
    problem(load(&api, "balanced").await, 409, "conflict", None);
    assert_eq!(
        listed(&api, "escape").await,
        Value::Null,
        "nothing was loaded"
    );

    let (status, loaded) = load(&api, "zone-affinity").await;
    assert_eq!(status, 201, "{loaded}");
    assert_eq!(
        (&loaded["origin"], &loaded["abi_version"]),
        (&json!("file"), &json!(1))
    );
    assert_eq!(loaded["active"], false);
    assert_eq!(
        load(&api, "zone-affinity").await.0,
        200,
        "loading again changes nothing"
    );

    // A config the plugin refuses is a 400 naming `config`, with the plugin's own message.
    let activate = |config: Value| json!({"name": "zone-affinity", "config": config});
    let refused = put(
        &api,
        "/v1/strategy",
        &activate(json!({"shard_zones": {"0": ""}})),
    )
    .await;
    let body = problem(refused, 400, "invalid_field", Some("config"));
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("shard 0 has an empty zone"),
        "{body}"
    );
    let typo = put(
        &api,
        "/v1/strategy",
        &activate(json!({"zone_lable": "db_zone"})),
    )
    .await;
    problem(typo, 400, "invalid_field", Some("config"));
    let unknown = put(&api, "/v1/strategy", &json!({"name": "nope", "config": {}})).await;
    problem(unknown, 404, "not_found", None);
    let (_, list) = api.get("/v1/plugins").await;
    assert_eq!(
        list["active"]["version"], 1,
        "nothing refused was activated"
    );

    let zones = json!({"shard_zones": {"0": "east", "1": "east", "2": "west", "3": "west"}});
    let (status, active) = put(&api, "/v1/strategy", &activate(zones.clone())).await;
    assert_eq!(status, 200, "{active}");
    assert_eq!(
        (&active["version"], &active["name"]),
        (&json!(2), &json!("zone-affinity"))
    );
    let again = put(&api, "/v1/strategy", &activate(zones.clone())).await;
    assert_eq!(
        (again.0, &again.1["version"]),
        (200, &json!(2)),
        "the same again: no change"
    );

    let owners = wait_for("the shard map to follow the zones", SETTLE, || async {
        let owners = settled(&api, &names).await?;
        let west: BTreeSet<u64> = owners["node-b"].union(&owners["node-c"]).copied().collect();
        let zoned = owners["node-a"] == BTreeSet::from([0, 1])
            && west == BTreeSet::from([2, 3])
            && owners["node-b"].len() == 1;
        zoned.then_some(owners)
    })
    .await
    .unwrap();
    let listed_now = listed(&api, "zone-affinity").await;
    assert_eq!(listed_now["active"], true, "{listed_now}");
    assert!(listed_now.get("last_error").is_none(), "{listed_now}");
    assert_eq!(
        api.metric_sum("chronoshard_strategy_errors_total").await,
        0.0
    );

    // A replica that starts now loads the active plugin from its own plugin directory by
    // itself, and keeps placing shards by zone once it leads.
    d.control_plane("cp-2", &["--plugin-dir", dir]).await;
    let api2 = d.api("cp-2");
    wait_for("cp-2 to load the active strategy", SETTLE, || async {
        let (_, list) = api2.get("/v1/plugins").await;
        let active = &list["active"];
        (active["name"] == "zone-affinity" && active["loaded"] == true).then_some(())
    })
    .await
    .unwrap();
    d.control_planes.get_mut("cp-1").unwrap().0.kill9().await;
    wait_for("cp-2 to lead", SETTLE, || async {
        let (_, cluster) = api2.get("/v1/cluster").await;
        (cluster["leader"] == "cp-2").then_some(())
    })
    .await
    .unwrap();
    d.node_with("node-d", &["--label", "db_zone=east"]).await;
    let all = ["node-a", "node-b", "node-c", "node-d"];
    let shared = wait_for(
        "the east shards to spread over node-a and node-d",
        SETTLE,
        || async {
            let owners = settled(&api2, &all).await?;
            let east: BTreeSet<u64> = owners["node-a"].union(&owners["node-d"]).copied().collect();
            let west: BTreeSet<u64> = owners["node-b"].union(&owners["node-c"]).copied().collect();
            let spread = owners.values().all(|s| s.len() == 1);
            (east == BTreeSet::from([0, 1]) && west == BTreeSet::from([2, 3]) && spread)
                .then_some(owners)
        },
    )
    .await
    .unwrap();
    assert_eq!(
        api2.metric_sum("chronoshard_strategy_errors_total").await,
        0.0
    );

    let upto = Utc::now() + chrono::Duration::seconds(1);
    for job in jobs.keys() {
        every_occurrence_once(&d, &api2, job, upto).await;
    }
    eprintln!(
        "zone-affinity placed the shards as {owners:?}, then on the next leader as {shared:?}"
    );

    // A plugin directory that is not there stops a control plane at start, saying why.
    let nats = d.nats.url();
    let args = [
        "control-plane",
        "--id",
        "cp-3",
        "--nats",
        &nats,
        "--http",
        "127.0.0.1:0",
        "--token",
        TOKEN,
        "--plugin-dir",
        "/nonexistent/plugins",
    ];
    let mut bad = Process::start("cp-3", &args);
    assert_ne!(bad.exited(SETTLE).await, Some(0));
    bad.printed("--plugin-dir /nonexistent/plugins: no such directory")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panicking_or_hanging_plugin_moves_no_shard_and_a_killed_node_still_fails_over() {
    let work = tempfile::tempdir().unwrap();
    let plugins = plugin_dir(FAULTY, "faulty");
    let mut d = Deployment::start(1).await;
    let dir = plugins.path().to_str().unwrap();
    d.control_plane("cp-1", &["--shards", "4", "--plugin-dir", dir])
        .await;
    let names = ["node-a", "node-b", "node-c"];
    for n in names {
        d.node(n).await;
    }
    d.worker("worker-1", work.path());
    let api = d.api("cp-1");
    let before = wait_settled(&api, &names).await;
    let jobs = every_second_jobs(&d, &api, 4, 1).await;
    let epochs_before = epochs(&api).await;

    // Activated without a load first: the replica loads it on the way.
    let faulty = |config: Value| json!({"name": "faulty", "config": config});
    let (status, active) = put(&api, "/v1/strategy", &faulty(json!({"mode": "panic"}))).await;
    assert_eq!(status, 200, "{active}");
    wait_for("passes with a panicking strategy", SETTLE, || {
        failing_with(&api, "panicked", "panicked")
    })
    .await
    .unwrap();
    assert!(d.control_planes.get_mut("cp-1").unwrap().0.running());
    assert_eq!(epochs(&api).await, epochs_before, "no shard moved");
    assert_eq!(settled(&api, &names).await, Some(before.clone()));

    // An answer that leaves a shard out is refused by the host, and nothing moves either.
    let missing = faulty(json!({"mode": "missing-shard"}));
    assert_eq!(put(&api, "/v1/strategy", &missing).await.0, 200);
    wait_for("passes with an invalid answer", SETTLE, || {
        failing_with(&api, "invalid_assignment", "invalid_assignment")
    })
    .await
    .unwrap();
    let last = listed(&api, "faulty").await["last_error"]["message"].clone();
    assert!(last.as_str().unwrap().contains("is not assigned"), "{last}");
    assert_eq!(epochs(&api).await, epochs_before, "no shard moved");

    // A node dies meanwhile: its shards fail over all the same, and only they move.
    let victim = before["node-c"].clone();
    d.nodes.get_mut("node-c").unwrap().kill9().await;
    let after = wait_settled(&api, &["node-a", "node-b"]).await;
    let epochs_after = epochs(&api).await;
    for (shard, epoch) in &epochs_before {
        let moved = victim.contains(shard);
        assert_eq!(
            epochs_after[shard],
            epoch + moved as u64,
            "shard {shard}: {after:?}"
        );
    }

    // A strategy that hangs misses the deadline and is disabled; nothing moves meanwhile.
    let hang = faulty(json!({"mode": "sleep", "sleep_ms": 3_000}));
    assert_eq!(put(&api, "/v1/strategy", &hang).await.0, 200);
    wait_for("the hanging strategy to be disabled", SETTLE, || async {
        let entry = listed(&api, "faulty").await;
        (entry["disabled"] == true && entry["last_error"]["reason"] == "timeout").then_some(())
    })
    .await
    .unwrap();
    // Refused calls of a disabled strategy leave the missed deadline as its last error.
    wait_for("passes with a disabled strategy", SETTLE, || {
        failing_with(&api, "disabled", "timeout")
    })
    .await
    .unwrap();
    assert_eq!(epochs(&api).await, epochs_after, "no shard moved");
    let again = put(&api, "/v1/strategy", &faulty(json!({"mode": "ok"}))).await;
    problem(again, 409, "strategy_disabled", None);
    // Said once per change of reason, not every pass.
    let said: Vec<Value> = d.control_planes["cp-1"]
        .0
        .records("strategy gave no usable answer; shards stay with their live owners and the others are placed by the built-in fallback")
        .iter()
        .map(|r| r["fields"]["reason"].clone())
        .collect();
    let reasons = ["panicked", "invalid_assignment", "timeout", "disabled"];
    assert_eq!(said, reasons.map(|r| json!(r)));

    // Back to a built-in: a node that joins takes its share again.
    let (status, _) = put(
        &api,
        "/v1/strategy",
        &json!({"name": "balanced", "config": {}}),
    )
    .await;
    assert_eq!(status, 200);
    d.node("node-d").await;
    wait_settled(&api, &["node-a", "node-b", "node-d"]).await;
    let (_, list) = api.get("/v1/plugins").await;
    assert_eq!(list["active"]["name"], "balanced");
    assert_eq!(list["active"]["version"], 5);

    let upto = Utc::now() + chrono::Duration::seconds(1);
    for job in jobs.keys() {
        every_occurrence_once(&d, &api, job, upto).await;
    }
    let moved: BTreeMap<_, _> = epochs(&api).await.into_iter().collect();
    eprintln!(
        "node-c's shards {victim:?} failed over under a faulty strategy; epochs now {moved:?}"
    );
}

/// `GET /v1/nodes` by node id.
async fn nodes_by_id(api: &Api) -> BTreeMap<String, Value> {
    let (status, list) = api.get("/v1/nodes").await;
    assert_eq!(status, 200, "{list}");
    list["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["node_id"].as_str().unwrap().to_string(), n.clone()))
        .collect()
}

/// What `least-loaded` and `two-level` weigh comes from the nodes' heartbeats: the attempts their
/// shards have in flight and the CPU their processes use; a node's `--max-shards` holds under the
/// built-in default and under `least-loaded` when a drained node's shards need a new home.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_report_their_load_and_their_shard_limit_holds() {
    let mut d = Deployment::start(1).await;
    d.control_plane("cp-1", &["--shards", "4"]).await;
    d.node_with("node-a", &["--max-shards", "1"]).await;
    d.node("node-b").await;
    let api = d.api("cp-1");
    let owned = wait_settled(&api, &["node-a", "node-b"]).await;
    assert_eq!((owned["node-a"].len(), owned["node-b"].len()), (1, 3));
    assert_eq!(nodes_by_id(&api).await["node-a"]["max_shards"], 1);

    // Tickets for a queue no worker serves stay in flight on the shards that fired them.
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..12 {
        let body = json!({"tenant": format!("load-{i}"), "name": "stuck",
            "schedule": {"delay": "0s"}, "target": {"type": "queue", "queue": "nobody"}});
        let (status, job) = api.post("/v1/jobs", &body).await;
        assert_eq!(status, 201, "{job}");
        let shard = job["shard"].as_u64().unwrap();
        let owner = owned.iter().find(|(_, s)| s.contains(&shard)).unwrap().0;
        *expected.entry(owner.clone()).or_default() += 1;
    }
    let seen = wait_for(
        "each node to report its attempts in flight and its CPU",
        Duration::from_secs(30),
        || async {
            let nodes = nodes_by_id(&api).await;
            let all = ["node-a", "node-b"].iter().all(|id| {
                let n = &nodes[*id];
                n["in_flight"].as_u64() == Some(expected.get(*id).copied().unwrap_or(0))
                    && n["cpu_cores"].as_f64().is_some_and(|c| c > 0.0)
            });
            all.then_some(nodes)
        },
    )
    .await
    .unwrap();
    eprintln!(
        "in flight {:?}, cores {:?}",
        expected,
        seen.values()
            .map(|n| n["cpu_cores"].clone())
            .collect::<Vec<_>>()
    );

    let (status, body) = put(
        &api,
        "/v1/strategy",
        &json!({"name": "least-loaded", "config": {}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // node-b's shards need a new home: node-a has no room, so all go to the node that joined.
    d.node("node-c").await;
    let (status, body) = api.post("/v1/nodes/node-b/drain", &json!({})).await;
    assert!(status < 300, "{status} {body}");
    let owned = wait_settled(&api, &["node-a", "node-c"]).await;
    assert_eq!((owned["node-a"].len(), owned["node-c"].len()), (1, 3));
    assert_eq!(listed(&api, "least-loaded").await["active"], true);
    assert_eq!(strategy_errors(&api, "least-loaded", None).await, 0.0);

    // node-c dies with 3 shards that no live node may take (node-a is full, node-b drained):
    // the leader counts them as unowned until node-b is back in service.
    // The shards each lost node last owned, as the leader counts them.
    let unowned = || async {
        let (_, _, text) = api.send(Method::GET, "/metrics", None).await;
        let mut by_node = BTreeMap::new();
        for l in text.as_str()?.lines() {
            let Some(rest) = l.strip_prefix("chronoshard_shards_unowned{node=\"") else {
                continue;
            };
            let (node, value) = rest.split_once("\"} ")?;
            by_node.insert(node.to_string(), value.parse::<f64>().ok()?);
        }
        Some(by_node)
    };
    let before = unowned().await.expect("the leader's metrics");
    assert_eq!(before.get("node-c"), Some(&0.0), "{before:?}");
    assert!(before.values().all(|n| *n == 0.0), "{before:?}");
    d.nodes.get_mut("node-c").unwrap().kill9().await;
    wait_for(
        "the leader to count node-c's 3 shards unowned",
        Duration::from_secs(30),
        || async {
            let now = unowned().await?;
            (now.get("node-c") == Some(&3.0) && now.values().sum::<f64>() == 3.0).then_some(())
        },
    )
    .await
    .unwrap();
    let (status, body) = api.post("/v1/nodes/node-b/undrain", &json!({})).await;
    assert!(status < 300, "{status} {body}");
    wait_settled(&api, &["node-a", "node-b"]).await;
    wait_for("no unowned shard", Duration::from_secs(30), || async {
        (unowned().await?.values().sum::<f64>() == 0.0).then_some(())
    })
    .await
    .unwrap();
}
