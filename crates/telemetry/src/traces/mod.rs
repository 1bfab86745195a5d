//! OpenTelemetry traces: whether and where they are exported (the standard `OTEL_*` variables),
//! the exporting tracer, and every span the platform emits (`spans`), tied to ticket and job ids
//! (`ids`).
//!
//! Export is off unless `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is
//! set; then spans go over OTLP/HTTP (protobuf, or JSON with `OTEL_EXPORTER_OTLP_PROTOCOL=
//! http/json`) from the SDK's batch thread. While off, every span function returns at once and
//! nothing is allocated. This module owns span names and attributes (documented in
//! docs/operations.md "Traces"); it must not decide when a component does its work.

mod ids;
mod spans;

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::{trace::SdkTracerProvider, Resource};

pub use ids::{fire_context, job_context, parse_traceparent, trace_id, traceparent};
pub use spans::{
    attempt_span, current_traceparent, end_attempt, job_created, record_fire, request_span,
    respond, result_applied, PublishSpan, ResultAttrs, TicketAttrs,
};

/// The variables read, as the OpenTelemetry specification names them.
pub const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
pub const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
pub const TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
pub const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
pub const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";

/// The target of every span this module makes: the OpenTelemetry layer takes these spans only,
/// and the log output leaves them out.
pub(crate) const TARGET: &str = module_path!();

/// Which process exports: its default `service.name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    ControlPlane,
    ShardNode,
    Worker,
    /// `chronoshard dev`: every part in one process, so one service.
    Dev,
}

impl Role {
    pub fn service_name(self) -> &'static str {
        match self {
            Role::ControlPlane => "chronoshard-control-plane",
            Role::ShardNode => "chronoshard-shard-node",
            Role::Worker => "chronoshard-worker",
            Role::Dev => "chronoshard-dev",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    #[error(
        "{var}={value:?}: traces are exported over OTLP/HTTP only; use http/protobuf or http/json"
    )]
    Protocol { var: &'static str, value: String },
    #[error("cannot set up the OTLP trace exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("traces were set up twice in one process")]
    Twice,
}

/// What the variables ask for: no export (`None`), or export under this service name with this
/// protocol. The endpoint itself, headers and timeout are read by the exporter from the same
/// variables.
#[derive(Clone, Debug, PartialEq)]
pub struct Export {
    pub service_name: String,
    pub protocol: Protocol,
}

impl Export {
    /// Reads the variables through `var` (the environment, or a map in tests).
    pub fn from_vars(
        var: impl Fn(&str) -> Option<String>,
        role: Role,
    ) -> Result<Option<Export>, TracesError> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if set(SDK_DISABLED).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if set(TRACES_ENDPOINT).is_none() && set(ENDPOINT).is_none() {
            return Ok(None);
        }
        let (name, value) = match (set(TRACES_PROTOCOL), set(PROTOCOL)) {
            (Some(v), _) => (TRACES_PROTOCOL, v),
            (None, Some(v)) => (PROTOCOL, v),
            (None, None) => (PROTOCOL, "http/protobuf".to_string()),
        };
        let protocol = match value.trim() {
            "http/protobuf" => Protocol::HttpBinary,
            "http/json" => Protocol::HttpJson,
            _ => return Err(TracesError::Protocol { var: name, value }),
        };
        Ok(Some(Export {
            service_name: set(SERVICE_NAME).unwrap_or_else(|| role.service_name().to_string()),
            protocol,
        }))
    }
}

/// The exporting tracer, once `start` made one: its presence is what "exporting" means.
static TRACER: OnceLock<opentelemetry_sdk::trace::SdkTracer> = OnceLock::new();

pub(crate) fn tracer() -> Option<&'static opentelemetry_sdk::trace::SdkTracer> {
    TRACER.get()
}

/// Whether spans are exported: when not, every span function here is a no-op.
pub fn exporting() -> bool {
    TRACER.get().is_some()
}

/// The exporting provider; `shutdown` (or dropping it) sends the spans still buffered.
#[derive(Debug)]
pub struct Traces {
    provider: Option<SdkTracerProvider>,
}

impl Traces {
    /// No export: nothing to flush.
    pub fn off() -> Traces {
        Traces { provider: None }
    }

    /// Sends what is buffered and stops the export thread (bounded by the exporter's timeout,
    /// `OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s by default). Export errors are not the process's
    /// failure: the spans are lost, and it says so on stderr.
    pub fn shutdown(mut self) {
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.shutdown() {
                eprintln!("traces: the last spans were not exported: {e}");
            }
        }
    }
}

/// Starts exporting as `export` says and returns the tracer for the tracing layer.
pub(crate) fn start(
    export: &Export,
) -> Result<(Traces, opentelemetry_sdk::trace::SdkTracer), TracesError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(export.protocol)
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name(export.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("chronoshard");
    TRACER.set(tracer.clone()).map_err(|_| TracesError::Twice)?;
    Ok((
        Traces {
            provider: Some(provider),
        },
        tracer,
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn read(vars: &[(&str, &str)], role: Role) -> Result<Option<Export>, TracesError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Export::from_vars(|k| vars.get(k).cloned(), role)
    }

    #[test]
    fn without_an_endpoint_nothing_is_exported() {
        assert_eq!(read(&[], Role::Worker).unwrap(), None);
        assert_eq!(
            read(
                &[(SERVICE_NAME, "x"), (PROTOCOL, "http/json")],
                Role::Worker
            )
            .unwrap(),
            None
        );
        assert_eq!(read(&[(ENDPOINT, " ")], Role::Worker).unwrap(), None);
    }

    #[test]
    fn an_endpoint_turns_export_on_under_the_roles_name() {
        let e = read(&[(ENDPOINT, "http://c:4318")], Role::ShardNode)
            .unwrap()
            .unwrap();
        assert_eq!(e.service_name, "chronoshard-shard-node");
        assert_eq!(e.protocol, Protocol::HttpBinary);
        let e = read(
            &[
                (TRACES_ENDPOINT, "http://c:4318/v1/traces"),
                (SERVICE_NAME, "mine"),
                (PROTOCOL, "http/json"),
            ],
            Role::ControlPlane,
        )
        .unwrap()
        .unwrap();
        assert_eq!(e.service_name, "mine");
        assert_eq!(e.protocol, Protocol::HttpJson);
    }

    #[test]
    fn the_traces_protocol_beats_the_general_one() {
        let e = read(
            &[
                (ENDPOINT, "http://c:4318"),
                (PROTOCOL, "grpc"),
                (TRACES_PROTOCOL, "http/json"),
            ],
            Role::Dev,
        )
        .unwrap()
        .unwrap();
        assert_eq!(e.protocol, Protocol::HttpJson);
    }

    #[test]
    fn grpc_is_refused_by_name() {
        let err = read(
            &[(ENDPOINT, "http://c:4317"), (PROTOCOL, "grpc")],
            Role::Worker,
        )
        .unwrap_err();
        assert!(
            matches!(&err, TracesError::Protocol { var: PROTOCOL, value } if value == "grpc"),
            "{err}"
        );
    }

    #[test]
    fn the_sdk_can_be_disabled() {
        let vars = [(ENDPOINT, "http://c:4318"), (SDK_DISABLED, "TRUE")];
        assert_eq!(read(&vars, Role::Worker).unwrap(), None);
        let vars = [(ENDPOINT, "http://c:4318"), (SDK_DISABLED, "false")];
        assert!(read(&vars, Role::Worker).unwrap().is_some());
    }
}
