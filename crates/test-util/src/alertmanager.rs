//! An Alertmanager started for a test: the `prometheus-alertmanager` binary (Debian's name; also
//! `alertmanager`) with the given config file, its state in a temp dir, listening on a free
//! loopback port, with clustering off (no gossip port, no peers). Killed on drop; it never uses
//! or touches an Alertmanager the machine already runs.
//!
//! Binary: `$CHRONOSHARD_ALERTMANAGER`, else `prometheus-alertmanager` or `alertmanager` on PATH
//! (`ensure_prometheus_tools` in scripts/lib.sh installs it and sets the variable).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum AlertmanagerError {
    #[error(
        "the alertmanager binary was not found: install Debian's `prometheus-alertmanager` \
         package (scripts/lib.sh ensure_prometheus_tools does) or set CHRONOSHARD_ALERTMANAGER"
    )]
    NotFound,
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("alertmanager did not become ready within {0:?}; its log ends with:\n{1}")]
    NotReady(Duration, String),
    #[error("asking alertmanager for its alerts: {0}")]
    Http(#[from] reqwest::Error),
}

type Result<T> = std::result::Result<T, AlertmanagerError>;

pub struct Alertmanager {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    child: tokio::process::Child,
    dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl Alertmanager {
    /// Starts it with `config` and waits until it is ready.
    pub async fn start(config: &Path) -> Result<Alertmanager> {
        let binary = find()?;
        let dir = tempfile::tempdir().map_err(io("creating a temp dir"))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(io("finding a free port"))?
            .port();
        let log = std::fs::File::create(dir.path().join("alertmanager.log"))
            .map_err(io("creating the log file"))?;
        let child = tokio::process::Command::new(&binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            // Empty: no cluster listener, so nothing else is bound and no peer is looked for.
            .arg("--cluster.listen-address=")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(io("starting alertmanager"))?;
        let am = Alertmanager {
            url: format!("http://127.0.0.1:{port}"),
            child,
            dir,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
        };
        let ready = format!("{}/-/ready", am.url);
        let timeout = Duration::from_secs(30);
        crate::wait_for("alertmanager to be ready", timeout, || async {
            let resp = am.http.get(&ready).send().await.ok()?;
            resp.status().is_success().then_some(())
        })
        .await
        .map_err(|_| AlertmanagerError::NotReady(timeout, am.log_tail()))?;
        Ok(am)
    }

    /// Every alert it holds, active, silenced or inhibited (`GET /api/v2/alerts`): each with its
    /// `labels` and a `status` whose `inhibitedBy` lists the alerts that hold it back.
    pub async fn alerts(&self) -> Result<Vec<Value>> {
        let url = format!("{}/api/v2/alerts", self.url);
        Ok(self.http.get(url).send().await?.json().await?)
    }

    /// The last lines it logged, for a failure message.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("alertmanager.log"));
        let log = log.unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> AlertmanagerError + '_ {
    move |source| AlertmanagerError::Io {
        what: what.to_string(),
        source,
    }
}

/// `$CHRONOSHARD_ALERTMANAGER`, else `prometheus-alertmanager` or `alertmanager` on PATH.
fn find() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("CHRONOSHARD_ALERTMANAGER") {
        return Ok(PathBuf::from(p));
    }
    let dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    ["prometheus-alertmanager", "alertmanager"]
        .iter()
        .flat_map(|name| dirs.iter().map(move |d| d.join(name)))
        .find(|p| p.is_file())
        .ok_or(AlertmanagerError::NotFound)
}
