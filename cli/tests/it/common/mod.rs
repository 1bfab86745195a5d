//! Starting a dev platform for a test and talking to its API.
#![allow(dead_code, unused_imports)]

use std::{path::Path, time::Duration};

use chronoshard::dev::{DevOptions, Platform};
use serde_json::Value;

pub use chronoshard_test_util::{wait_for, HttpSink};

pub mod cluster;
pub mod process;
pub mod worker;

/// A platform on a free port with its data in `dir`: 2 shard nodes, 8 shards, 1 worker.
pub async fn platform(dir: &Path) -> Platform {
    platform_with(dir, |_| {}).await
}

/// Like `platform`, with options changed by `adjust` first.
pub async fn platform_with(dir: &Path, adjust: impl FnOnce(&mut DevOptions)) -> Platform {
    let mut opts = DevOptions::new(dir);
    opts.http = ([127, 0, 0, 1], 0).into();
    opts.token = Some("test-token".into());
    adjust(&mut opts);
    Platform::start(opts).await.expect("platform starts")
}

/// A dev platform stopped for 6 s and started again on the same data: what a catch-up test
/// judges. An occurrence up to 2 s late fires whatever the policy, so only those due in
/// (`down_at`, `late_before`) are surely late whenever a shard opens.
#[derive(Clone, Copy)]
pub struct Downtime {
    pub down_at: chrono::DateTime<chrono::Utc>,
    pub late_before: chrono::DateTime<chrono::Utc>,
    pub up_at: chrono::DateTime<chrono::Utc>,
}

impl Downtime {
    /// Stops `p`, waits out the downtime and starts the platform again.
    pub async fn of(p: Platform, dir: &Path) -> (Platform, Downtime) {
        p.stop().await.unwrap();
        let down_at = chrono::Utc::now();
        wait_for(
            "six occurrences to fall due during the downtime",
            LONG,
            || async {
                (chrono::Utc::now() - down_at > chrono::Duration::seconds(6)).then_some(())
            },
        )
        .await
        .unwrap();
        let late_before = chrono::Utc::now() - chrono::Duration::seconds(2);
        let platform = platform(dir).await;
        let up_at = chrono::Utc::now();
        let down = Downtime {
            down_at,
            late_before,
            up_at,
        };
        (platform, down)
    }

    /// Whether an occurrence due at `t` was surely late.
    pub fn late(&self, t: &chrono::DateTime<chrono::Utc>) -> bool {
        *t > self.down_at && *t < self.late_before
    }
}

/// A tiny REST client with the admin token.
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
    pub token: String,
}

impl Api {
    pub fn new(p: &Platform) -> Api {
        Api::at(&p.url, &p.token)
    }

    /// A client of the API at `base` (`http://host:port`).
    pub fn at(base: &str, token: &str) -> Api {
        Api {
            base: base.to_string(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap(),
            token: token.to_string(),
        }
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&str>,
    ) -> (u16, String, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{}", self.base, path))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let resp = req.send().await.expect("request sent");
        let status = resp.status().as_u16();
        let ctype = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let text = resp.text().await.unwrap();
        (
            status,
            ctype,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let (s, _, v) = self.send(reqwest::Method::GET, path, None).await;
        (s, v)
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (s, _, v) = self
            .send(reqwest::Method::POST, path, Some(&body.to_string()))
            .await;
        (s, v)
    }

    /// Creates a job and returns its id.
    pub async fn create(&self, body: &Value) -> String {
        let (status, job) = self.post("/v1/jobs", body).await;
        assert_eq!(status, 201, "create failed: {job}");
        job["id"].as_str().unwrap().to_string()
    }

    /// Waits until the job's newest run has succeeded and returns it.
    pub async fn newest_run_succeeded(&self, job: &str) -> Value {
        wait_for(
            &format!("the newest run of {job} to succeed"),
            LONG,
            || async {
                self.past_runs(job)
                    .await
                    .first()
                    .filter(|r| r["status"] == "succeeded")
                    .cloned()
            },
        )
        .await
        .unwrap()
    }

    /// Waits (up to 90 s) for a run of the job with this status and returns its first ticket, as
    /// `GET /v1/tickets/{id}` shows it.
    pub async fn ticket_of_run(&self, job: &str, status: &str) -> Value {
        let run = wait_for(
            &format!("a {status} run of {job}"),
            Duration::from_secs(90),
            || async {
                self.past_runs(job)
                    .await
                    .into_iter()
                    .find(|r| r["status"] == status)
            },
        )
        .await
        .unwrap();
        let id = run["ticket_ids"][0].as_str().unwrap();
        let (code, t) = self.get(&format!("/v1/tickets/{id}")).await;
        assert_eq!(code, 200, "{t}");
        t
    }

    /// The sum of a metric over all its label sets, as `/metrics` shows it now.
    pub async fn metric_sum(&self, name: &str) -> f64 {
        self.metric_sum_with(name, "").await
    }

    /// The sum of a metric over the label sets that contain `label` (such as `reason="ended"`).
    pub async fn metric_sum_with(&self, name: &str, label: &str) -> f64 {
        let (_, _, text) = self.send(reqwest::Method::GET, "/metrics", None).await;
        let (labelled, bare) = (format!("{name}{{"), format!("{name} "));
        text.as_str()
            .unwrap()
            .lines()
            .filter(|l| (l.starts_with(&labelled) || l.starts_with(&bare)) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Changes the settings and waits until the platform's two shard nodes run them.
    pub async fn set_settings(&self, body: Value) {
        let (status, _, s) = self
            .send(
                reqwest::Method::PUT,
                "/v1/settings",
                Some(&body.to_string()),
            )
            .await;
        assert_eq!(status, 200, "{s}");
        let version = s["version"].clone();
        wait_for("the nodes to run the new settings", LONG, || async {
            let (_, nodes) = self.get("/v1/nodes").await;
            let nodes = nodes["nodes"].as_array()?.clone();
            (nodes.len() == 2 && nodes.iter().all(|n| n["settings_version"] == version))
                .then_some(())
        })
        .await
        .unwrap();
    }

    /// Runs of a job that are not merely `scheduled`.
    pub async fn past_runs(&self, job: &str) -> Vec<Value> {
        let (status, page) = self.get(&format!("/v1/jobs/{job}/runs?limit=500")).await;
        assert_eq!(status, 200, "{page}");
        page["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["status"] != "scheduled")
            .cloned()
            .collect()
    }
}

pub const LONG: Duration = Duration::from_secs(30);
