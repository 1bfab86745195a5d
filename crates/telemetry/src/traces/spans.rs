//! Every span the platform emits, with its name, kind, parent and attributes (the list in
//! docs/operations.md "Traces"). Each function returns at once, allocating nothing, when traces
//! are not exported.
//!
//! The shard's spans (`fire`, `publish`, `result`) and the job's anchor span are made with the
//! OpenTelemetry API, because their trace and span ids are chosen (ids.rs) or their start and
//! end are moments rather than scopes. The API request and the worker's attempt are `tracing`
//! spans exported by tracing-opentelemetry, so the work inside them (the HTTP executor's call)
//! finds its parent as the current span.

use std::time::SystemTime;

use opentelemetry::{
    trace::{Link, Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _},
    Context, KeyValue,
};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use uuid::Uuid;

use super::{
    exporting,
    ids::{fire_context, job_context, parse_traceparent, trace_id, traceparent},
    tracer, TARGET,
};

/// What identifies a ticket's attempt in its spans.
#[derive(Clone, Copy, Debug)]
pub struct TicketAttrs<'a> {
    pub ticket_id: Uuid,
    pub job_id: Uuid,
    pub tenant: &'a str,
    pub shard: u32,
    pub attempt: u32,
    pub queue: &'a str,
}

impl<'a> From<&'a chronoshard_wire::Ticket> for TicketAttrs<'a> {
    fn from(t: &'a chronoshard_wire::Ticket) -> Self {
        TicketAttrs {
            ticket_id: t.ticket_id,
            job_id: t.job_id,
            tenant: &t.tenant,
            shard: t.shard,
            attempt: t.attempt,
            queue: &t.queue,
        }
    }
}

impl TicketAttrs<'_> {
    fn attributes(&self) -> Vec<KeyValue> {
        vec![
            KeyValue::new("chronoshard.ticket.id", self.ticket_id.to_string()),
            KeyValue::new("chronoshard.job.id", self.job_id.to_string()),
            KeyValue::new("chronoshard.tenant", self.tenant.to_string()),
            KeyValue::new("chronoshard.shard", i64::from(self.shard)),
            KeyValue::new("chronoshard.attempt", i64::from(self.attempt)),
            KeyValue::new("chronoshard.queue", self.queue.to_string()),
        ]
    }
}

/// The parent a `traceparent` header names, if it belongs to the ticket's trace; else the
/// ticket's `fire` span (a worker or a result without the header, or with a foreign one).
fn parent_in_ticket(ticket: Uuid, header: Option<&str>) -> SpanContext {
    header
        .and_then(parse_traceparent)
        .filter(|sc| sc.trace_id() == trace_id(ticket))
        .unwrap_or_else(|| fire_context(ticket))
}

fn remote(sc: SpanContext) -> Context {
    Context::new().with_remote_span_context(sc)
}

/// `fire`: the shard wrote the ticket (its run, ticket and attempt rows) from `start` to now.
/// The root of the ticket's trace, linked to the job's span.
pub fn record_fire(t: &TicketAttrs, scheduled_at_ms: i64, start: SystemTime) {
    let Some(tracer) = tracer() else {
        return;
    };
    let mut attributes = t.attributes();
    attributes.push(KeyValue::new(
        "chronoshard.scheduled_at_unix_ms",
        scheduled_at_ms,
    ));
    let links = vec![Link::with_context(job_context(t.job_id))];
    record_root(
        tracer,
        "fire",
        &fire_context(t.ticket_id),
        start,
        attributes,
        links,
    );
}

/// A finished root span (from `start` to now) with the ids of `cx`.
fn record_root(
    tracer: &opentelemetry_sdk::trace::SdkTracer,
    name: &'static str,
    cx: &SpanContext,
    start: SystemTime,
    attributes: Vec<KeyValue>,
    links: Vec<Link>,
) {
    tracer
        .span_builder(name)
        .with_kind(SpanKind::Internal)
        .with_trace_id(cx.trace_id())
        .with_span_id(cx.span_id())
        .with_start_time(start)
        .with_attributes(attributes)
        .with_links(links)
        .start_with_context(tracer, &Context::new())
        .end();
}

/// `publish`: one publish of an attempt to JetStream, from handing it to the NATS client to
/// JetStream's ack (or the failure). A child of the ticket's `fire` span.
pub struct PublishSpan(Option<opentelemetry_sdk::trace::Span>);

impl PublishSpan {
    pub fn start(t: &TicketAttrs, subject: &str) -> PublishSpan {
        let Some(tracer) = tracer() else {
            return PublishSpan(None);
        };
        let mut attributes = t.attributes();
        attributes.push(KeyValue::new("messaging.system", "nats"));
        attributes.push(KeyValue::new(
            "messaging.destination.name",
            subject.to_string(),
        ));
        let span = tracer
            .span_builder("publish")
            .with_kind(SpanKind::Producer)
            .with_attributes(attributes)
            .start_with_context(tracer, &remote(fire_context(t.ticket_id)));
        PublishSpan(Some(span))
    }

    /// The `traceparent` header of the message: the worker's attempt span is its child.
    pub fn traceparent(&self) -> Option<String> {
        self.0.as_ref().and_then(|s| traceparent(s.span_context()))
    }

    /// Ends it with JetStream's answer: the stream sequence, or why the publish failed.
    pub fn end(self, acked: Result<u64, &str>) {
        let Some(mut span) = self.0 else {
            return;
        };
        match acked {
            Ok(seq) => span.set_attribute(KeyValue::new("chronoshard.stream_sequence", seq as i64)),
            Err(e) => span.set_status(Status::error(e.to_string())),
        }
        span.end();
    }
}

/// What a worker's result says, for its `result` span.
#[derive(Clone, Copy, Debug)]
pub struct ResultAttrs<'a> {
    pub ticket_id: Uuid,
    pub attempt: u32,
    pub shard: u32,
    pub kind: &'a str,
    pub worker: &'a str,
    pub error: Option<&'a str>,
}

impl<'a> From<&'a chronoshard_wire::TicketResult> for ResultAttrs<'a> {
    fn from(r: &'a chronoshard_wire::TicketResult) -> Self {
        ResultAttrs {
            ticket_id: r.ticket_id,
            attempt: r.attempt,
            shard: r.shard,
            kind: r.kind.as_str(),
            worker: &r.worker,
            error: r.error.as_deref(),
        }
    }
}

/// `result`: the shard applied a worker's report (`started`, `progress`, `succeeded`, `failed`,
/// `released`) in a transaction from `start` to now. A child of the attempt span the report's
/// `traceparent` header names, or of the ticket's `fire` span without one.
pub fn result_applied(r: &ResultAttrs, header: Option<&str>, start: SystemTime) {
    let Some(tracer) = tracer() else {
        return;
    };
    let mut attributes = vec![
        KeyValue::new("chronoshard.ticket.id", r.ticket_id.to_string()),
        KeyValue::new("chronoshard.attempt", i64::from(r.attempt)),
        KeyValue::new("chronoshard.shard", i64::from(r.shard)),
        KeyValue::new("chronoshard.result.kind", r.kind.to_string()),
        KeyValue::new("chronoshard.worker", r.worker.to_string()),
    ];
    let mut status = Status::Unset;
    if let Some(e) = r.error {
        attributes.push(KeyValue::new("chronoshard.result.error", e.to_string()));
        status = Status::error(e.to_string());
    }
    tracer
        .span_builder("result")
        .with_kind(SpanKind::Consumer)
        .with_start_time(start)
        .with_attributes(attributes)
        .with_status(status)
        .start_with_context(tracer, &remote(parent_in_ticket(r.ticket_id, header)))
        .end();
}

/// `attempt`: a worker handling one delivery of an attempt, from taking it to its result
/// stored. A child of the `publish` span the message's `traceparent` header names (or of the
/// ticket's `fire` span without one). Enter it around the work: the HTTP executor's call and
/// the reports sent within carry it as their parent.
pub fn attempt_span(
    t: &TicketAttrs,
    worker: &str,
    delivered: i64,
    header: Option<&str>,
) -> tracing::Span {
    if !exporting() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "attempt",
        otel.kind = "consumer",
        chronoshard.ticket.id = %t.ticket_id,
        chronoshard.job.id = %t.job_id,
        chronoshard.tenant = t.tenant,
        chronoshard.shard = t.shard,
        chronoshard.attempt = t.attempt,
        chronoshard.queue = t.queue,
        chronoshard.worker = worker,
        chronoshard.delivery = delivered,
    );
    let _ = span.set_parent(remote(parent_in_ticket(t.ticket_id, header)));
    span
}

/// Ends an attempt span's story: `outcome` is `succeeded`, `failed`, or what the worker did
/// instead of running it (`handed_back`, `skipped`, `released`).
pub fn end_attempt(span: &tracing::Span, outcome: &str, error: Option<&str>) {
    if span.is_none() {
        return;
    }
    span.set_attribute("chronoshard.outcome", outcome.to_string());
    if let Some(e) = error {
        span.set_status(Status::error(e.to_string()));
    }
}

/// The `traceparent` naming the current span (the attempt span in a worker), when exported.
pub fn current_traceparent() -> Option<String> {
    if !exporting() {
        return None;
    }
    traceparent(tracing::Span::current().context().span().span_context())
}

/// An API request (`POST /v1/jobs` ...): a server span named by method and route template, a
/// child of the caller's span when the request carries a `traceparent`.
pub fn request_span(method: &str, route: &str, header: Option<&str>) -> tracing::Span {
    if !exporting() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        http.request.method = method,
        http.route = route,
    );
    if let Some(sc) = header.and_then(parse_traceparent) {
        let _ = span.set_parent(remote(sc));
    }
    span
}

/// Records the response status on a request span; a 5xx is an error.
pub fn respond(span: &tracing::Span, status: u16) {
    if span.is_none() {
        return;
    }
    span.set_attribute("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.set_status(Status::error(format!("answered {status}")));
    }
}

/// A job was created by the current request: the request span gets the job id and a link to
/// the job's span, and the job's span (the root of a trace whose id is the job id, which every
/// ticket's `fire` span links to) is emitted with a link back to the request.
pub fn job_created(job_id: Uuid, tenant: &str, shard: u32, start: SystemTime) {
    let Some(tracer) = tracer() else {
        return;
    };
    let request = tracing::Span::current();
    let job = job_context(job_id);
    request.set_attribute("chronoshard.job.id", job_id.to_string());
    request.add_link(job.clone());
    let request_cx = request.context().span().span_context().clone();
    let links = if request_cx.is_valid() {
        vec![Link::with_context(request_cx)]
    } else {
        Vec::new()
    };
    let attributes = vec![
        KeyValue::new("chronoshard.job.id", job_id.to_string()),
        KeyValue::new("chronoshard.tenant", tenant.to_string()),
        KeyValue::new("chronoshard.shard", i64::from(shard)),
    ];
    record_root(tracer, "job", &job, start, attributes, links);
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICKET: &str = "01a2266c-5a5d-7450-be09-07c3cb7dfd3c";

    #[test]
    fn a_result_names_its_attempt_as_parent() {
        let ticket: Uuid = TICKET.parse().unwrap();
        let header = "00-01a2266c5a5d7450be0907c3cb7dfd3c-00f067aa0ba902b7-01";
        let parent = parent_in_ticket(ticket, Some(header));
        assert_eq!(parent.span_id().to_string(), "00f067aa0ba902b7");
    }

    #[test]
    fn without_a_header_of_its_trace_the_parent_is_the_fire_span() {
        let ticket: Uuid = TICKET.parse().unwrap();
        let foreign = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        for header in [None, Some("nonsense"), Some(foreign)] {
            assert_eq!(
                parent_in_ticket(ticket, header),
                fire_context(ticket),
                "{header:?}"
            );
        }
    }

    #[test]
    fn without_export_no_span_is_made() {
        // No test in this crate starts an exporter.
        let t = TicketAttrs {
            ticket_id: TICKET.parse().unwrap(),
            job_id: TICKET.parse().unwrap(),
            tenant: "t",
            shard: 0,
            attempt: 1,
            queue: "http",
        };
        assert!(attempt_span(&t, "w", 1, None).is_none());
        assert!(request_span("GET", "/", None).is_none());
        assert!(PublishSpan::start(&t, "s").traceparent().is_none());
        assert!(current_traceparent().is_none());
    }
}
