//! `GET /metrics` on an address of its own, for processes without an HTTP API (a shard node or a
//! worker run alone): the same text exposition the control plane serves beside its API.

use std::net::SocketAddr;

use axum::{http::header, routing::get, Router};
use tokio_util::sync::CancellationToken;

/// Prometheus' text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// Binds `addr` and serves `/metrics` there until `stop`; the bound address (port 0 picks one).
pub async fn serve_metrics(
    addr: SocketAddr,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new().route(
        "/metrics",
        get(|| async {
            (
                [(header::CONTENT_TYPE, CONTENT_TYPE)],
                crate::metrics::render(),
            )
        }),
    );
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the metrics endpoint failed");
        }
    });
    Ok(bound)
}
