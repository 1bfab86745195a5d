//! Trace and span ids that follow from ticket and job ids, and the W3C `traceparent` text form.
//! Pure: no tracer, no I/O.
//!
//! A ticket's trace id is the ticket id's 16 bytes, so its trace is found from the ticket id
//! alone. Its `fire` span has a span id derived from the ticket id, so any process (the
//! dispatcher after a restart, a worker that got no header) can name it as a parent without
//! having seen it. A job's anchor span is derived from the job id the same way.

use std::collections::HashMap;

use opentelemetry::{
    propagation::TextMapPropagator,
    trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState},
    Context,
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use uuid::Uuid;

const TRACEPARENT: &str = "traceparent";

/// What a derived span id stands for: ids of different kinds never coincide.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Kind {
    Fire = 1,
    Job = 2,
}

/// The trace id of a ticket's (or a job's) trace: its id's 16 bytes.
pub fn trace_id(id: Uuid) -> TraceId {
    TraceId::from_bytes(*id.as_bytes())
}

/// FNV-1a over the id and the kind: stable across builds and platforms (unlike std's hasher),
/// never 0 (an invalid span id).
fn derived_span_id(id: Uuid, kind: Kind) -> SpanId {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.as_bytes().iter().chain(std::iter::once(&(kind as u8))) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    SpanId::from_bytes(h.max(1).to_be_bytes())
}

fn sampled(trace: TraceId, span: SpanId) -> SpanContext {
    SpanContext::new(
        trace,
        span,
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    )
}

/// The `fire` span of a ticket: the root of its trace.
pub fn fire_context(ticket: Uuid) -> SpanContext {
    sampled(trace_id(ticket), derived_span_id(ticket, Kind::Fire))
}

/// The `job` span of a job: the root of the job's own trace, which the create request and every
/// ticket's `fire` span link to.
pub fn job_context(job: Uuid) -> SpanContext {
    sampled(trace_id(job), derived_span_id(job, Kind::Job))
}

/// The W3C `traceparent` naming `cx` as the parent; `None` for an invalid context.
pub fn traceparent(cx: &SpanContext) -> Option<String> {
    if !cx.is_valid() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(
        &Context::new().with_remote_span_context(cx.clone()),
        &mut carrier,
    );
    carrier.remove(TRACEPARENT)
}

/// The span a W3C `traceparent` names; `None` when it is not one.
pub fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let carrier = HashMap::from([(TRACEPARENT.to_string(), text.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(sc)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICKET: &str = "01a2266c-5a5d-7450-be09-07c3cb7dfd3c";

    #[test]
    fn a_tickets_trace_id_is_its_id_without_dashes() {
        let id: Uuid = TICKET.parse().unwrap();
        assert_eq!(trace_id(id).to_string(), "01a2266c5a5d7450be0907c3cb7dfd3c");
        assert_eq!(fire_context(id).trace_id(), trace_id(id));
    }

    #[test]
    fn derived_span_ids_are_stable_and_differ_by_kind() {
        let id: Uuid = TICKET.parse().unwrap();
        assert_eq!(fire_context(id), fire_context(id));
        assert_ne!(fire_context(id).span_id(), job_context(id).span_id());
        let other: Uuid = "01a2266c-5a5d-7450-be09-07c3cb7dfd3d".parse().unwrap();
        assert_ne!(fire_context(id).span_id(), fire_context(other).span_id());
    }

    #[test]
    fn traceparent_round_trips() {
        let cx = fire_context(TICKET.parse().unwrap());
        let text = traceparent(&cx).unwrap();
        assert_eq!(
            text,
            format!("00-01a2266c5a5d7450be0907c3cb7dfd3c-{}-01", cx.span_id())
        );
        let back = parse_traceparent(&text).unwrap();
        assert_eq!(
            (back.trace_id(), back.span_id()),
            (cx.trace_id(), cx.span_id())
        );
    }

    #[test]
    fn what_is_not_a_traceparent_names_no_parent() {
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-0000000000000001-01",
            "00-01a2266c5a5d7450be0907c3cb7dfd3c-0000000000000000-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
        assert!(traceparent(&SpanContext::empty_context()).is_none());
    }
}
