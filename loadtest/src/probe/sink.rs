//! The HTTP sink: the target of `--target http` jobs. It answers 200 at once and writes down
//! which ticket arrived when, from the executor headers (docs/protocol.md).

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use axum::{extract::State, http::HeaderMap, routing::post, Router};
use chrono::{DateTime, Utc};
use chronoshard_wire::names;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Start;
use crate::progress::{now_us, us_of};

#[derive(Clone)]
struct Sink {
    starts: Arc<Mutex<Vec<Start>>>,
    unparsed: Arc<AtomicU64>,
}

/// A running sink; `url` is what jobs target.
pub struct HttpSink {
    pub url: String,
    starts: Arc<Mutex<Vec<Start>>>,
    unparsed: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl HttpSink {
    pub async fn start(shutdown: CancellationToken) -> anyhow::Result<HttpSink> {
        let starts = Arc::new(Mutex::new(Vec::new()));
        let unparsed = Arc::new(AtomicU64::new(0));
        let app = Router::new()
            .route("/{*path}", post(record))
            .with_state(Sink {
                starts: starts.clone(),
                unparsed: unparsed.clone(),
            });
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let url = format!("http://{}/run", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
        });
        Ok(HttpSink {
            url,
            starts,
            unparsed,
            task,
        })
    }

    /// Requests without the executor headers a start needs (they cannot be counted).
    pub fn unparsed(&self) -> u64 {
        self.unparsed.load(Ordering::Relaxed)
    }

    /// Everything recorded so far.
    pub fn starts(&self) -> Vec<Start> {
        self.starts.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits (at most 10 s) for the server to finish; the shutdown token passed to `start` must
    /// have been cancelled.
    pub async fn stop(self) {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), self.task).await;
    }
}

async fn record(State(sink): State<Sink>, headers: HeaderMap) -> &'static str {
    let at_us = now_us();
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let start = (|| {
        Some(Start {
            ticket_id: get(names::HTTP_IDEMPOTENCY_KEY)?.parse().ok()?,
            job_id: get(names::HTTP_JOB_ID)?.parse().ok()?,
            scheduled_us: us_of(
                get(names::HTTP_SCHEDULED_AT)?
                    .parse::<DateTime<Utc>>()
                    .ok()?,
            ),
            attempt: get(names::HTTP_ATTEMPT)?.parse().ok()?,
            at_us,
            by: "sink".into(),
        })
    })();
    match start {
        Some(s) => {
            if let Ok(mut v) = sink.starts.lock() {
                v.push(s);
            }
        }
        None => {
            sink.unparsed.fetch_add(1, Ordering::Relaxed);
        }
    }
    "ok"
}
