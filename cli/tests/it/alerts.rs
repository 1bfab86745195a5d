//! The alert rules and the Alertmanager config of alerts/, end to end: a real Prometheus scrapes
//! every process of a platform (each role a separate process) and evaluates
//! alerts/chronoshard.rules.yml; a real Alertmanager routes with alerts/alertmanager.yml to a
//! webhook this test records.
//!
//! Two changes make it run in a minute: a rule's `for` given in minutes waits that many seconds
//! instead (`for: 5m` → `for: 5s`; those in seconds stay), and a group's first notification
//! waits 1 s. The expressions, the labels, the grouping and the inhibitions are the files' own.
//!
//! - Fifty jobs of one tenant fail: the webhook gets one notification for that tenant's failing
//!   attempts, holding one alert, not fifty.
//! - A shard node that owned shards no other node may take is killed: the node-down alert is
//!   sent, and the unowned-shards alert of that node fires but is held back by it. The silence
//!   docs/operations.md gives for a node's maintenance then silences both.

use std::{collections::BTreeMap, path::Path, time::Duration};

use crate::common::{
    cluster::{wait_settled, Deployment},
    wait_for,
};
use chronoshard_test_util::{Alertmanager, HttpSink, Prometheus, PrometheusOptions};
use serde_json::{json, Value};

const SOON: Duration = Duration::from_secs(60);

/// The rules with minute-long `for`s turned into as many seconds.
fn quick_rules(repo: &Path, dir: &Path) -> std::path::PathBuf {
    let rules = std::fs::read_to_string(repo.join("alerts/chronoshard.rules.yml")).unwrap();
    let quick: String = rules
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(d) if d.ends_with('m') => l.replace(d, &format!("{}s", &d[..d.len() - 1])),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert_ne!(quick, rules, "the rules have minute-long waits to shorten");
    let path = dir.join("rules.yml");
    std::fs::write(&path, quick).unwrap();
    path
}

/// The Alertmanager config sending to `webhook`, first notifications after 1 s.
fn quick_alertmanager(repo: &Path, dir: &Path, webhook: &str) -> std::path::PathBuf {
    let config = std::fs::read_to_string(repo.join("alerts/alertmanager.yml")).unwrap();
    let url = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("- url: "))
        .expect("a webhook receiver")
        .to_string();
    let quick: String = config
        .replace(&url, webhook)
        .lines()
        .map(|l| match l.find("group_wait: ") {
            Some(at) => format!("{}group_wait: 1s", &l[..at]),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = dir.join("alertmanager.yml");
    std::fs::write(&path, quick).unwrap();
    path
}

/// The notifications the webhook got: (alert name of the group, the group's alerts' labels).
fn notifications(webhook: &HttpSink) -> Vec<(String, Vec<BTreeMap<String, String>>)> {
    webhook
        .requests()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .map(|n| {
            let name = n["groupLabels"]["alertname"].as_str().unwrap_or("").into();
            let alerts = n["alerts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| serde_json::from_value(a["labels"].clone()).unwrap_or_default())
                .collect();
            (name, alerts)
        })
        .collect()
}

fn sent(webhook: &HttpSink, alert: &str) -> Vec<Vec<BTreeMap<String, String>>> {
    notifications(webhook)
        .into_iter()
        .filter(|(name, _)| name == alert)
        .map(|(_, alerts)| alerts)
        .collect()
}

#[tokio::test]
async fn one_notification_per_tenant_and_a_dead_node_holds_back_its_shards_alert() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = tempfile::tempdir().unwrap();
    let mut d = Deployment::start(1).await;
    d.control_plane("cp-1", &["--shards", "4"]).await;
    // node-a may hold only 2 of the 4 shards: node-b's 2 have nowhere to go when it dies.
    d.node_with("node-a", &["--metrics", "127.0.0.1:0", "--max-shards", "2"])
        .await;
    d.node_with("node-b", &["--metrics", "127.0.0.1:0"]).await;
    d.worker_with("worker-1", dir.path(), &["--metrics", "127.0.0.1:0"]);
    let api = d.api("cp-1");
    let owned = wait_settled(&api, &["node-a", "node-b"]).await;
    assert_eq!((owned["node-a"].len(), owned["node-b"].len()), (2, 2));

    let webhook = HttpSink::start().await.unwrap();
    let am_config = quick_alertmanager(&repo, dir.path(), &webhook.url("/alerts"));
    let am = Alertmanager::start(&am_config).await.unwrap();
    let prom = Prometheus::start(PrometheusOptions {
        targets: d.metrics_targets().await,
        rule_files: vec![quick_rules(&repo, dir.path())],
        alertmanager: Some(am.url.clone()),
    })
    .await
    .unwrap();
    prom.wait_all_up(Duration::from_secs(20)).await.unwrap();

    // Fifty jobs of acme call a target that answers 500; globex's job succeeds.
    d.sink.respond_with(500);
    let healthy = HttpSink::start().await.unwrap();
    for i in 0..50 {
        let job = json!({"tenant": "acme", "name": format!("failing-{i}"),
                         "schedule": {"every": "1s"}, "target": d.target("failing")});
        let (status, body) = api.post("/v1/jobs", &job).await;
        assert_eq!(status, 201, "{body}");
    }
    let job = json!({"tenant": "globex", "name": "fine", "schedule": {"every": "1s"},
                     "target": {"type": "http", "url": healthy.url("/fine")}});
    assert_eq!(api.post("/v1/jobs", &job).await.0, 201);

    let failing = "ChronoshardTenantAttemptsFailing";
    wait_for("the tenant's failures to be notified", SOON, || async {
        (!sent(&webhook, failing).is_empty()).then_some(())
    })
    .await
    .unwrap();
    // The fault happened: many of acme's attempts failed, on more than one job.
    let failed = prom
        .query(r#"sum(chronoshard_tenant_attempts_failed_total{tenant="acme"})"#)
        .await
        .unwrap();
    assert!(failed[0].value >= 50.0, "{failed:?}");
    // Prometheus goes on scraping and evaluating while the jobs keep failing (another hundred
    // failures seen): an alert per job, or per anything but the tenant, would be sent by now,
    // each in its own group after its 1 s wait.
    let more = failed[0].value + 100.0;
    wait_for("a hundred more failures to be scraped", SOON, || async {
        let now = prom
            .query(r#"sum(chronoshard_tenant_attempts_failed_total{tenant="acme"})"#)
            .await
            .ok()?;
        (now.first()?.value >= more).then_some(())
    })
    .await
    .unwrap();
    let evaluated = prom
        .query(r#"ALERTS{alertname="ChronoshardTenantAttemptsFailing", alertstate="firing"}"#)
        .await
        .unwrap();
    assert_eq!(evaluated.len(), 1, "{evaluated:?}");
    let notified = sent(&webhook, failing);
    assert_eq!(notified.len(), 1, "one notification: {notified:?}");
    assert_eq!(notified[0].len(), 1, "holding one alert: {notified:?}");
    assert_eq!(notified[0][0]["tenant"], "acme");
    // Every other alert the failures raised is one notification too, never one per job.
    let mut per_group: BTreeMap<String, usize> = BTreeMap::new();
    for (name, alerts) in notifications(&webhook) {
        *per_group.entry(name).or_default() += 1;
        assert!(alerts.len() < 50, "{alerts:?}");
    }
    assert!(per_group.values().all(|n| *n == 1), "{per_group:?}");
    assert!(
        !per_group.contains_key("ChronoshardNodeDown"),
        "{per_group:?}"
    );

    // node-b dies with its 2 shards.
    d.nodes.get_mut("node-b").unwrap().kill9().await;
    wait_for("the node-down notification", SOON, || async {
        let down = sent(&webhook, "ChronoshardNodeDown");
        down.iter()
            .any(|alerts| alerts.iter().any(|a| a["node"] == "node-b"))
            .then_some(())
    })
    .await
    .unwrap();
    // Its shards' alert fires (Prometheus has it firing) and Alertmanager holds it back.
    let held = wait_for("node-b's unowned-shards alert, inhibited", SOON, || async {
        let alerts = am.alerts().await.ok()?;
        alerts
            .into_iter()
            .find(|a| {
                a["labels"]["alertname"] == "ChronoshardShardsUnowned"
                    && a["labels"]["node"] == "node-b"
            })
            .filter(|a| {
                a["status"]["inhibitedBy"]
                    .as_array()
                    .is_some_and(|by| !by.is_empty())
            })
    })
    .await;
    let held = match held {
        Ok(held) => held,
        Err(e) => panic!(
            "{e}\nshards {}\nnodes {}\nPrometheus has {:?}\nleader metrics: {:?}",
            api.get("/v1/shards").await.1,
            api.get("/v1/nodes").await.1,
            prom.query("ALERTS").await,
            prom.query("chronoshard_shards_unowned").await,
        ),
    };
    assert_eq!(held["status"]["state"], "suppressed", "{held}");
    let firing = prom
        .query(r#"ALERTS{alertname="ChronoshardShardsUnowned", alertstate="firing"}"#)
        .await
        .unwrap();
    assert_eq!(firing.len(), 1, "{firing:?}");
    assert_eq!(firing[0].labels["node"], "node-b");
    assert!(
        sent(&webhook, "ChronoshardShardsUnowned").is_empty(),
        "{:?}",
        notifications(&webhook)
    );

    // The silence docs/operations.md gives for a node's maintenance, run as written for node-b,
    // silences both of its alerts.
    documented_silence(&repo, &am.url, "node-b");
    wait_for("node-b's alerts to be silenced", SOON, || async {
        let alerts = am.alerts().await.ok()?;
        let silenced = |name: &str| {
            alerts.iter().any(|a| {
                a["labels"]["alertname"] == name
                    && a["labels"]["node"] == "node-b"
                    && a["status"]["silencedBy"]
                        .as_array()
                        .is_some_and(|by| !by.is_empty())
            })
        };
        (silenced("ChronoshardNodeDown") && silenced("ChronoshardShardsUnowned")).then_some(())
    })
    .await
    .unwrap();
}

/// Runs the `amtool silence add` of docs/operations.md against `alertmanager`, for `node`
/// instead of the example's m3.
fn documented_silence(repo: &Path, alertmanager: &str, node: &str) {
    let ops = std::fs::read_to_string(repo.join("docs/operations.md")).unwrap();
    let command = ops
        .split("```sh\n")
        .filter_map(|block| block.split("```").next())
        .find(|block| block.starts_with("amtool") && block.contains("silence add"))
        .expect("docs/operations.md shows an amtool silence")
        .replace("\\\n", " ");
    let example = "http://alertmanager:9093";
    assert!(
        command.contains(example) && command.contains("m3"),
        "{command}"
    );
    let command = command.replace(example, alertmanager).replace("m3", node);
    // amtool comes with Alertmanager (Debian's prometheus-alertmanager).
    let amtool = std::env::var_os("CHRONOSHARD_ALERTMANAGER")
        .map(std::path::PathBuf::from)
        .and_then(|am| Some(am.parent()?.join("amtool")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "amtool".into());
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} {}",
            amtool.display(),
            &command["amtool".len()..]
        ))
        .output()
        .expect("amtool runs");
    assert!(
        out.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
