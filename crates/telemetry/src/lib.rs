//! Logging, metrics and traces setup shared by every chronoshard process.
//!
//! `metrics` owns every metric name (prefixed `chronoshard_`, documented in docs/metrics.md, used
//! as-is by the Grafana dashboards); `serve` exposes them on an address of their own; `traces`
//! owns every span and the OTLP export. This crate only registers and exposes what components
//! record; it must not decide what a component measures.

pub mod metrics;
mod serve;
pub mod tenants;
pub mod traces;

pub use serve::{serve_metrics, CONTENT_TYPE};

use tracing_subscriber::{
    filter::{filter_fn, FilterExt},
    fmt,
    layer::SubscriberExt,
    util::SubscriberInitExt,
    EnvFilter, Layer,
};

/// Installs the global tracing subscriber: `RUST_LOG` filter (default `info`), plain or JSON lines.
/// Calling it twice is harmless (the second call keeps the first subscriber).
pub fn init_logging(json: bool) {
    let _ = subscriber(json, None).try_init();
}

/// Installs logging as `init_logging` does and, when the `OTEL_*` variables ask for it
/// (`traces::Export`), the export of spans under `role`'s service name. Shut the returned
/// `Traces` down at the end so the last spans are sent.
pub fn init(json: bool, role: traces::Role) -> Result<traces::Traces, traces::TracesError> {
    let export = traces::Export::from_vars(|name| std::env::var(name).ok(), role)?;
    let Some(export) = export else {
        init_logging(json);
        return Ok(traces::Traces::off());
    };
    let (traces, tracer) = traces::start(&export)?;
    let _ = subscriber(json, Some(tracer)).try_init();
    Ok(traces)
}

/// Log lines through `RUST_LOG`'s filter, never the trace module's spans (a log line keeps its
/// shape whether traces are exported or not); with a tracer, those spans, and the platform's
/// info-and-above events inside them as span events, to OpenTelemetry.
fn subscriber(
    json: bool,
    tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
) -> impl tracing::Subscriber + Send + Sync {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,async_nats=warn"));
    let not_trace_spans = filter_fn(|m| !(m.is_span() && m.target() == traces::TARGET));
    let fmt = fmt::layer().with_target(true);
    let fmt = if json {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    let otel = tracer.map(|t| {
        tracing_opentelemetry::layer()
            .with_tracer(t)
            .with_filter(filter_fn(|m| {
                if m.is_span() {
                    m.target() == traces::TARGET
                } else {
                    *m.level() <= tracing::Level::INFO && m.target().starts_with("chronoshard")
                }
            }))
    });
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter.and(not_trace_spans)))
        .with(otel)
}
