//! Test fixtures with real components: a nats-server with JetStream on a free port and a temp
//! store (killed on drop), a PostgreSQL server of its own (`postgres`), a Prometheus scraping
//! what a test names (`prometheus`), an Alertmanager (`alertmanager`), an HTTP sink that
//! records what executors send, and waiting for a condition with a deadline instead of sleeping.
//!
//! Fixtures start their own servers; they never use or touch services the machine already runs.

use std::{
    collections::HashMap,
    future::Future,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{extract::State, http::StatusCode, routing::any, Router};

pub mod alertmanager;
mod nats_cluster;
mod postgres;
pub mod prometheus;
pub use alertmanager::Alertmanager;
pub use nats_cluster::NatsCluster;
pub use postgres::Postgres;
pub use prometheus::{Prometheus, PrometheusOptions};

/// A nats-server with JetStream, started for one test.
#[derive(Debug)]
pub struct Nats {
    pub server: chronoshard_natsd::Server,
    _dir: tempfile::TempDir,
}

impl Nats {
    /// Starts nats-server (2.10+, see `chronoshard_natsd::find`) on a free port with a temp store.
    pub async fn start() -> anyhow::Result<Nats> {
        let dir = tempfile::tempdir()?;
        let binary = chronoshard_natsd::find()?;
        let server = chronoshard_natsd::Server::start(
            binary,
            &chronoshard_natsd::Options::in_dir(dir.path()),
        )
        .await?;
        Ok(Nats { server, _dir: dir })
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub async fn client(&self) -> anyhow::Result<async_nats::Client> {
        Ok(async_nats::connect(self.url()).await?)
    }
}

/// One request the sink received.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// Header names lower-cased.
    pub headers: HashMap<String, String>,
    pub body: bytes::Bytes,
    pub received_at: std::time::SystemTime,
}

#[derive(Clone, Default)]
struct SinkState {
    requests: Arc<Mutex<Vec<Recorded>>>,
    status: Arc<Mutex<u16>>,
    delay: Arc<Mutex<Duration>>,
    /// Requests whose caller went away before the answer (the connection closed).
    aborted: Arc<Mutex<Vec<Recorded>>>,
}

/// An HTTP server on 127.0.0.1:0 that records every request and answers with a set status.
pub struct HttpSink {
    pub addr: SocketAddr,
    state: SinkState,
    task: tokio::task::JoinHandle<()>,
}

impl HttpSink {
    pub async fn start() -> anyhow::Result<HttpSink> {
        let state = SinkState {
            requests: Default::default(),
            status: Arc::new(Mutex::new(200)),
            delay: Default::default(),
            aborted: Default::default(),
        };
        let app = Router::new()
            .fallback(any(record))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(HttpSink { addr, state, task })
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The status code answered from now on.
    pub fn respond_with(&self, status: u16) {
        *self.state.status.lock().expect("lock") = status;
    }

    /// How long each answer waits from now on, as a slow target's would.
    pub fn respond_after(&self, delay: Duration) {
        *self.state.delay.lock().expect("lock") = delay;
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().expect("lock").clone()
    }

    /// The requests whose caller closed the connection while the sink was still answering.
    pub fn aborted(&self) -> Vec<Recorded> {
        self.state.aborted.lock().expect("lock").clone()
    }
}

/// Records a request as aborted when its handler is dropped unfinished: the server drops it
/// when the caller closes the connection.
struct Answering {
    state: SinkState,
    request: Option<Recorded>,
}

impl Drop for Answering {
    fn drop(&mut self) {
        if let Some(r) = self.request.take() {
            self.state.aborted.lock().expect("lock").push(r);
        }
    }
}

impl Drop for HttpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn record(State(state): State<SinkState>, req: axum::extract::Request) -> StatusCode {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let headers = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_lowercase(),
                v.to_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let recorded = Recorded {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        headers,
        body,
        received_at: std::time::SystemTime::now(),
    };
    state.requests.lock().expect("lock").push(recorded.clone());
    let status = *state.status.lock().expect("lock");
    let delay = *state.delay.lock().expect("lock");
    let mut answering = Answering {
        state: state.clone(),
        request: Some(recorded),
    };
    // The target's own slowness, which the test asked for; nothing waits on it.
    tokio::time::sleep(delay).await;
    answering.request = None;
    StatusCode::from_u16(status).unwrap_or(StatusCode::OK)
}

/// Polls `check` until it returns `Some`, or fails after `timeout` with `what` and the last state.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        // A poll interval, not synchronisation: the condition above decides.
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
