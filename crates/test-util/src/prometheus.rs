//! A Prometheus server started for a test: the `prometheus` binary with a config of its own in a
//! temp dir, its TSDB in that dir, listening on a free loopback port, scraping the given targets
//! every second and, when asked, evaluating rule files every second and sending alerts to an
//! Alertmanager. Killed on drop. It never uses or touches a Prometheus the machine already runs
//! (Debian's package may start one as a service). `Client` asks any Prometheus's HTTP API, this
//! fixture's or one a script under test started.
//!
//! Binary: `$CHRONOSHARD_PROMETHEUS`, else `prometheus` on PATH (Debian's `prometheus` package;
//! `ensure_prometheus_tools` in scripts/lib.sh installs it and sets the variable).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use serde_json::{json, Value};

/// What went wrong starting or asking the test's Prometheus.
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    #[error(
        "the prometheus binary was not found: install Debian's `prometheus` package \
         (scripts/lib.sh ensure_prometheus_tools does) or set CHRONOSHARD_PROMETHEUS to it"
    )]
    NotFound,
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("the scrape target {0:?} is not an http://HOST:PORT/PATH URL")]
    BadTarget(String),
    #[error("prometheus did not become ready: {reason}; its log ends with:\n{log}")]
    NotReady { reason: String, log: String },
    #[error("asking prometheus {what}: {source}")]
    Http {
        what: String,
        source: reqwest::Error,
    },
    #[error("prometheus refused {what}: {error}")]
    Refused { what: String, error: String },
    #[error("prometheus answered {what} with a result this fixture does not read: {result}")]
    Unreadable { what: String, result: String },
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
}

type Result<T> = std::result::Result<T, PrometheusError>;

/// One endpoint to scrape: its job label and its metrics URL (`http://127.0.0.1:PORT/metrics`).
#[derive(Clone, Debug)]
pub struct Target {
    pub job: String,
    pub url: String,
}

impl Target {
    pub fn new(job: &str, url: &str) -> Target {
        Target {
            job: job.to_string(),
            url: url.to_string(),
        }
    }
}

/// What the server scrapes, evaluates and where it sends alerts.
#[derive(Clone, Debug, Default)]
pub struct PrometheusOptions {
    pub targets: Vec<Target>,
    /// Alerting and recording rule files, loaded as they are.
    pub rule_files: Vec<PathBuf>,
    /// An Alertmanager's base URL (`http://127.0.0.1:PORT`) to send firing alerts to.
    pub alertmanager: Option<String>,
}

/// One series of a query's answer: its labels and its value at the query's time.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A running Prometheus; its HTTP API through `Deref` to `Client`.
#[derive(Debug)]
pub struct Prometheus {
    client: Client,
    child: tokio::process::Child,
    dir: tempfile::TempDir,
}

impl std::ops::Deref for Prometheus {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

/// The HTTP API of a Prometheus: this fixture's, or one a script under test started.
#[derive(Clone, Debug)]
pub struct Client {
    /// `http://HOST:PORT`.
    pub url: String,
    http: reqwest::Client,
}

impl Prometheus {
    /// Writes the config, starts the server and waits until it is ready (config loaded, TSDB
    /// open). Scrapes and rule evaluations run every second.
    pub async fn start(options: PrometheusOptions) -> Result<Prometheus> {
        let binary = find()?;
        let dir = tempfile::tempdir().map_err(io("creating a temp dir"))?;
        let config = dir.path().join("prometheus.yml");
        // JSON is YAML: no YAML writer needed.
        let text = config_json(&options)?.to_string();
        std::fs::write(&config, text).map_err(io("writing prometheus.yml"))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(io("finding a free port"))?
            .port();
        let log = std::fs::File::create(dir.path().join("prometheus.log"))
            .map_err(io("creating the log file"))?;
        let child = tokio::process::Command::new(&binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(io(&format!("starting {}", binary.display())))?;
        let prometheus = Prometheus {
            client: Client::new(&format!("http://127.0.0.1:{port}"))?,
            child,
            dir,
        };
        let ready = prometheus.wait_ready(Duration::from_secs(30)).await;
        ready.map_err(|e| PrometheusError::NotReady {
            reason: e.to_string(),
            log: prometheus.log_tail(),
        })?;
        Ok(prometheus)
    }

    /// The last lines Prometheus logged, for a failure message.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("prometheus.log"));
        let log = log.unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The directory holding its config, log and data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Client {
    /// A client of the Prometheus at `url` (`http://HOST:PORT`).
    pub fn new(url: &str) -> Result<Client> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build();
        Ok(Client {
            url: url.trim_end_matches('/').to_string(),
            http: http.map_err(|source| PrometheusError::Http {
                what: "for a client".into(),
                source,
            })?,
        })
    }

    /// Waits until `/-/ready` answers 200: the config is loaded and the TSDB open.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let ready = format!("{}/-/ready", self.url);
        let what = format!("{ready} to answer 200");
        crate::wait_for(&what, timeout, || async {
            let resp = self.http.get(&ready).send().await.ok()?;
            resp.status().is_success().then_some(())
        })
        .await
        .map_err(|_| PrometheusError::Timeout(timeout, what))
    }

    /// Evaluates `expr` now (`/api/v1/query`): one sample per series of an instant vector, one
    /// without labels for a scalar. An expression Prometheus refuses is `Refused` with its error.
    pub async fn query(&self, expr: &str) -> Result<Vec<Sample>> {
        let data = self.api("/api/v1/query", &[("query", expr)]).await?;
        let what = || format!("query {expr:?}");
        let result = &data["result"];
        match data["resultType"].as_str() {
            Some("vector") => result
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| sample(&s["metric"], &s["value"]))
                .collect::<Option<Vec<_>>>(),
            Some("scalar") => sample(&Value::Null, result).map(|s| vec![s]),
            _ => None,
        }
        .ok_or_else(|| PrometheusError::Unreadable {
            what: what(),
            result: data.to_string(),
        })
    }

    /// The values of `label` on the series `matcher` selects (`/api/v1/label/NAME/values`), as
    /// Grafana's `label_values(matcher, label)` finds them; `None` looks at every series.
    pub async fn label_values(&self, label: &str, matcher: Option<&str>) -> Result<Vec<String>> {
        let path = format!("/api/v1/label/{label}/values");
        let params: Vec<(&str, &str)> = matcher.map(|m| ("match[]", m)).into_iter().collect();
        let data = self.api(&path, &params).await?;
        let values = data.as_array().map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        });
        values.ok_or_else(|| PrometheusError::Unreadable {
            what: format!("the values of {label}"),
            result: data.to_string(),
        })
    }

    /// Scrape targets by their URL, with whether the latest scrape succeeded (`health` "up").
    pub async fn targets(&self) -> Result<BTreeMap<String, bool>> {
        let data = self.api("/api/v1/targets", &[("state", "active")]).await?;
        let targets = data["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(targets
            .iter()
            .filter_map(|t| {
                let url = t["scrapeUrl"].as_str()?.to_string();
                Some((url, t["health"] == "up"))
            })
            .collect())
    }

    /// Waits until the target scraped at `url` has been scraped successfully.
    pub async fn wait_target_up(&self, url: &str, timeout: Duration) -> Result<()> {
        let what = format!("prometheus to scrape {url} successfully");
        crate::wait_for(&what, timeout, || async {
            let targets = self.targets().await.ok()?;
            targets.get(url).copied().filter(|up| *up).map(|_| ())
        })
        .await
        .map_err(|_| PrometheusError::Timeout(timeout, what))
    }

    /// Waits until every configured target has been scraped successfully.
    pub async fn wait_all_up(&self, timeout: Duration) -> Result<()> {
        let what = "every target to be scraped successfully".to_string();
        crate::wait_for(&what, timeout, || async {
            let targets = self.targets().await.ok()?;
            (!targets.is_empty() && targets.values().all(|up| *up)).then_some(())
        })
        .await
        .map_err(|_| PrometheusError::Timeout(timeout, what))
    }

    /// GETs an API path (`/api/v1/rules`) and returns its `data`, or the error Prometheus gave.
    pub async fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Value> {
        let what = format!("{path} {params:?}");
        let http = |source| PrometheusError::Http {
            what: what.clone(),
            source,
        };
        let resp = self.http.get(format!("{}{path}", self.url)).query(params);
        let body: Value = resp
            .send()
            .await
            .map_err(http)?
            .json()
            .await
            .map_err(http)?;
        if body["status"] != "success" {
            return Err(PrometheusError::Refused {
                what,
                error: format!("{}: {}", body["errorType"], body["error"]),
            });
        }
        Ok(body["data"].clone())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// The server's config: one scrape job per target job, the rule files, the Alertmanager.
fn config_json(options: &PrometheusOptions) -> Result<Value> {
    let mut jobs: BTreeMap<(&str, String, String), Vec<String>> = BTreeMap::new();
    for t in &options.targets {
        let (scheme, address, path) = split_url(&t.url)?;
        jobs.entry((&t.job, scheme, path))
            .or_default()
            .push(address);
    }
    // Prometheus wants job names unique; one job scraped over two paths gets a suffix.
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let scrape_configs: Vec<Value> = jobs
        .into_iter()
        .map(|((job, scheme, path), addresses)| {
            let n = seen.entry(job).or_default();
            *n += 1;
            let name = if *n == 1 {
                job.to_string()
            } else {
                format!("{job}-{n}")
            };
            json!({"job_name": name, "scheme": scheme, "metrics_path": path,
                   "static_configs": [{"targets": addresses}]})
        })
        .collect();
    let mut config = json!({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": scrape_configs,
        "rule_files": options.rule_files,
    });
    if let Some(am) = &options.alertmanager {
        let (scheme, address, path) = split_url(am)?;
        config["alerting"] = json!({"alertmanagers": [{"scheme": scheme,
            "path_prefix": path, "static_configs": [{"targets": [address]}]}]});
    }
    Ok(config)
}

/// `http://host:port/path` → ("http", "host:port", "/path").
fn split_url(url: &str) -> Result<(String, String, String)> {
    let bad = || PrometheusError::BadTarget(url.to_string());
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let (address, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if address.is_empty() || !matches!(scheme, "http" | "https") {
        return Err(bad());
    }
    Ok((scheme.to_string(), address.to_string(), path.to_string()))
}

fn sample(metric: &Value, value: &Value) -> Option<Sample> {
    let labels = match metric {
        Value::Null => BTreeMap::new(),
        m => m
            .as_object()?
            .iter()
            .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect::<Option<_>>()?,
    };
    let value = value.get(1)?.as_str()?.parse().ok()?;
    Some(Sample { labels, value })
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> PrometheusError + '_ {
    move |source| PrometheusError::Io {
        what: what.to_string(),
        source,
    }
}

/// `$CHRONOSHARD_PROMETHEUS`, else `prometheus` on PATH.
pub fn find() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("CHRONOSHARD_PROMETHEUS") {
        return Ok(PathBuf::from(p));
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file())
        .ok_or(PrometheusError::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_of_one_job_share_a_scrape_config_and_an_alertmanager_url_splits() {
        let options = PrometheusOptions {
            targets: vec![
                Target::new("nodes", "http://127.0.0.1:1/metrics"),
                Target::new("nodes", "http://127.0.0.1:2/metrics"),
                Target::new("cp", "http://127.0.0.1:3/metrics"),
            ],
            rule_files: vec![PathBuf::from("/r.yml")],
            alertmanager: Some("http://127.0.0.1:9093".into()),
        };
        let c = config_json(&options).unwrap();
        let jobs = c["scrape_configs"].as_array().unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[1]["job_name"], "nodes");
        assert_eq!(
            jobs[1]["static_configs"][0]["targets"],
            json!(["127.0.0.1:1", "127.0.0.1:2"])
        );
        assert_eq!(c["rule_files"], json!(["/r.yml"]));
        let am = &c["alerting"]["alertmanagers"][0];
        assert_eq!(am["static_configs"][0]["targets"][0], "127.0.0.1:9093");
        assert_eq!(am["path_prefix"], "/");
        assert!(split_url("127.0.0.1:1/metrics").is_err());
    }
}
