//! Logging and metrics setup shared by every chronoshard process.
//!
//! `metrics` owns every metric name (prefixed `chronoshard_`, documented in docs/metrics.md, used
//! as-is by the Grafana dashboards); `serve` exposes them on an address of their own. This crate
//! only registers and exposes metrics; it must not decide what a component measures.

pub mod metrics;
mod serve;
pub mod tenants;

pub use serve::{serve_metrics, CONTENT_TYPE};

use tracing_subscriber::{fmt, EnvFilter};

/// Installs the global tracing subscriber: `RUST_LOG` filter (default `info`), plain or JSON lines.
/// Calling it twice is harmless (the second call keeps the first subscriber).
pub fn init_logging(json: bool) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,async_nats=warn"));
    let builder = fmt().with_env_filter(filter).with_target(true);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
