//! Every metric of chronoshard, registered once in the process-wide Prometheus registry.
//! Names are constants so code, docs/metrics.md and the dashboards agree.

use std::sync::LazyLock;

use prometheus::{
    register_gauge_vec, register_histogram, register_histogram_vec, register_int_counter_vec,
    register_int_gauge, register_int_gauge_vec, Encoder, GaugeVec, Histogram, HistogramVec,
    IntCounterVec, IntGauge, IntGaugeVec, TextEncoder,
};

pub const JOBS_CREATED: &str = "chronoshard_jobs_created_total";
pub const FIRES: &str = "chronoshard_fires_total";
pub const FIRE_LATENESS: &str = "chronoshard_fire_lateness_seconds";
pub const FIRE_SEND_LATENESS: &str = "chronoshard_fire_send_lateness_seconds";
pub const TICKETS_PUBLISHED: &str = "chronoshard_tickets_published_total";
pub const PUBLISH_ERRORS: &str = "chronoshard_publish_errors_total";
pub const DISPATCH_BACKLOG: &str = "chronoshard_dispatch_backlog";
pub const RESULTS_APPLIED: &str = "chronoshard_results_applied_total";
pub const RESULT_PULLS_RENEWED: &str = "chronoshard_result_pulls_renewed_total";
pub const NATS_EVENTS: &str = "chronoshard_nats_client_events_total";
pub const OCCURRENCES_NOT_FIRED: &str = "chronoshard_occurrences_not_fired_total";
pub const WHEEL_ENTRIES: &str = "chronoshard_wheel_entries";
pub const ATTEMPTS_OPEN: &str = "chronoshard_attempts_open";
pub const NODE_CPU: &str = "chronoshard_node_cpu_cores";
pub const HTTP_REQUESTS: &str = "chronoshard_http_requests_total";
pub const HTTP_DURATION: &str = "chronoshard_http_request_duration_seconds";
pub const EXECUTIONS: &str = "chronoshard_worker_executions_total";
pub const EXECUTION_DURATION: &str = "chronoshard_worker_execution_seconds";
pub const START_LATENESS: &str = "chronoshard_start_lateness_seconds";
pub const MALFORMED_TICKETS: &str = "chronoshard_worker_malformed_tickets_total";
pub const NOT_RUN_AGAIN: &str = "chronoshard_worker_not_run_again_total";
pub const RETRIES: &str = "chronoshard_retries_total";
pub const DEAD_LETTERS: &str = "chronoshard_dead_letters_total";
pub const ATTEMPTS_LOST: &str = "chronoshard_attempts_lost_total";
pub const TICKETS_RESENT: &str = "chronoshard_tickets_resent_total";
pub const RUNS_REPLACED: &str = "chronoshard_runs_replaced_total";
pub const CONTROL_PLANE_LEADER_NAME: &str = "chronoshard_control_plane_leader";
pub const CLOCK_OFFSET: &str = "chronoshard_clock_offset_seconds";
pub const SHARD_MOVES: &str = "chronoshard_shard_moves_total";
pub const SHARDS_OPEN: &str = "chronoshard_shards_open";
pub const STRATEGY_ERRORS: &str = "chronoshard_strategy_errors_total";
pub const SHARDS_UNOWNED: &str = "chronoshard_shards_unowned";
pub const TICKETS_UNSERVED: &str = "chronoshard_tickets_unserved";
pub const PUBLISH_SECONDS: &str = "chronoshard_publish_seconds";
pub const DB_SECONDS: &str = "chronoshard_db_seconds";
pub const DB_CONNECTIONS: &str = "chronoshard_db_connections";
pub const NODE_HEARTBEAT_AGE: &str = "chronoshard_node_heartbeat_age_seconds";
pub const TENANT_MOVES: &str = "chronoshard_tenant_moves_total";
pub const JOB_HANDOFFS: &str = "chronoshard_job_handoffs_total";
pub const WORKFLOW_STEPS: &str = "chronoshard_workflow_steps_total";
pub const WORKFLOW_RUNS: &str = "chronoshard_workflow_runs_total";
pub const TENANT_MOVE_SECONDS: &str = "chronoshard_tenant_move_seconds";
pub const GROWTH_SHARDS_PENDING: &str = "chronoshard_growth_shards_pending";

const LATENESS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    60.0,
];

/// Jobs created, by shard.
pub static JOBS_CREATED_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(JOBS_CREATED, "jobs created", &["shard"]).expect("metric")
});
/// Occurrences fired (ticket written), by shard.
pub static FIRES_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(FIRES, "occurrences fired", &["shard"]).expect("metric")
});
/// Scheduled time → ticket published to JetStream (its ack handled by the shard).
pub static FIRE_LATENESS_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        FIRE_LATENESS,
        "scheduled time to ticket published",
        &["shard"],
        LATENESS_BUCKETS.to_vec()
    )
    .expect("metric")
});
/// Scheduled time → ticket handed to the NATS client, before JetStream's ack: the shard's own
/// part of the fire lateness, which `FIRE_LATENESS_SECONDS` adds JetStream's round trip to.
/// Observed with the ack, so both count each ticket acknowledged once.
pub static FIRE_SEND_LATENESS_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        FIRE_SEND_LATENESS,
        "scheduled time to ticket handed to the NATS client",
        &["shard"],
        LATENESS_BUCKETS.to_vec()
    )
    .expect("metric")
});
/// Ticket handed to the NATS client → JetStream's ack handled: the publish's own time, without
/// the wait before it.
pub static PUBLISH_SECONDS_HISTOGRAM: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        PUBLISH_SECONDS,
        "ticket handed to the NATS client to JetStream's ack handled",
        &["shard"],
        LATENESS_BUCKETS.to_vec()
    )
    .expect("metric")
});
/// Time of a shard's main database operations (each one transaction or query batch), by kind.
pub static DB_SECONDS_HISTOGRAM: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        DB_SECONDS,
        "time of a shard's database operations, by kind",
        &["shard", "op"],
        LATENESS_BUCKETS.to_vec()
    )
    .expect("metric")
});
/// A shard's database connections, in use or idle, sampled every second.
pub static DB_CONNECTIONS_GAUGE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        DB_CONNECTIONS,
        "a shard's database connections, by state (used, idle)",
        &["shard", "state"]
    )
    .expect("metric")
});
pub static TICKETS_PUBLISHED_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        TICKETS_PUBLISHED,
        "tickets acknowledged by JetStream",
        &["shard"]
    )
    .expect("metric")
});
pub static PUBLISH_ERRORS_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        PUBLISH_ERRORS,
        "ticket publishes refused or timed out (retried)",
        &["shard"]
    )
    .expect("metric")
});
/// Tickets written to the shard database but not yet acknowledged by JetStream.
pub static DISPATCH_BACKLOG_GAUGE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        DISPATCH_BACKLOG,
        "tickets written but not yet published",
        &["shard"]
    )
    .expect("metric")
});
pub static RESULTS_APPLIED_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        RESULTS_APPLIED,
        "worker results applied, by kind",
        &["shard", "kind"]
    )
    .expect("metric")
});
/// Result pulls given up as lost and made anew, by shard and why.
pub static RESULT_PULLS_RENEWED_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        RESULT_PULLS_RENEWED,
        "result pulls given up as lost and made anew",
        &["shard", "reason"]
    )
    .expect("metric")
});
/// What the NATS client reported about a connection (disconnects, reconnects, slow consumers).
pub static NATS_EVENTS_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        NATS_EVENTS,
        "events the NATS client reported about a connection",
        &["connection", "event"]
    )
    .expect("metric")
});
/// Occurrences recorded as missed or skipped, by reason.
pub static OCCURRENCES_NOT_FIRED_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        OCCURRENCES_NOT_FIRED,
        "occurrences recorded as missed or skipped",
        &["shard", "status", "reason"]
    )
    .expect("metric")
});
pub static WHEEL_ENTRIES_GAUGE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        WHEEL_ENTRIES,
        "occurrences held in the time wheel",
        &["shard"]
    )
    .expect("metric")
});
/// Ticket attempts a shard has written and not seen finish, counted every second: the
/// `in_flight` load a node reports to the assignment strategy.
pub static ATTEMPTS_OPEN_GAUGE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        ATTEMPTS_OPEN,
        "ticket attempts written and not finished (unpublished, queued or running)",
        &["shard"]
    )
    .expect("metric")
});
/// CPU a shard node's process used between its two latest heartbeats, in cores.
pub static NODE_CPU_GAUGE: LazyLock<GaugeVec> = LazyLock::new(|| {
    register_gauge_vec!(
        NODE_CPU,
        "CPU the node's process used between its two latest heartbeats, in cores",
        &["node"]
    )
    .expect("metric")
});
pub static HTTP_REQUESTS_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        HTTP_REQUESTS,
        "REST requests",
        &["method", "route", "status"]
    )
    .expect("metric")
});
pub static HTTP_DURATION_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        HTTP_DURATION,
        "REST request duration",
        &["method", "route"],
        LATENESS_BUCKETS.to_vec()
    )
    .expect("metric")
});
pub static EXECUTIONS_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        EXECUTIONS,
        "attempts executed by workers",
        &["queue", "outcome"]
    )
    .expect("metric")
});
pub static EXECUTION_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        EXECUTION_DURATION,
        "executor run time",
        &["queue"],
        LATENESS_BUCKETS.to_vec()
    )
    .expect("metric")
});
/// Scheduled time → executor start, measured by the worker.
pub static START_LATENESS_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        START_LATENESS,
        "scheduled time to executor start",
        &["queue"],
        LATENESS_BUCKETS.to_vec()
    )
    .expect("metric")
});

/// Dispatch messages a worker could not read, by queue and by what it did with them.
pub static MALFORMED_TICKETS_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        MALFORMED_TICKETS,
        "dispatch messages a worker could not read",
        &["queue", "action"]
    )
    .expect("metric")
});
/// Deliveries a worker's journal kept it from running again, by queue and by what it had seen.
pub static NOT_RUN_AGAIN_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        NOT_RUN_AGAIN,
        "deliveries of attempts this worker had started before, not run again",
        &["queue", "seen"]
    )
    .expect("metric")
});

/// Failed attempts followed by another attempt (after the retry backoff).
pub static RETRIES_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(RETRIES, "retry attempts scheduled", &["shard"]).expect("metric")
});
/// Tickets whose attempts ran out: they are in the dead-letter list.
pub static DEAD_LETTERS_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        DEAD_LETTERS,
        "tickets dead-lettered after their last attempt failed",
        &["shard"]
    )
    .expect("metric")
});
/// Started attempts the timeout watchdog declared lost (no result, no progress).
pub static ATTEMPTS_LOST_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        ATTEMPTS_LOST,
        "attempts failed by the timeout watchdog",
        &["shard"]
    )
    .expect("metric")
});
/// Published tickets the dispatch stream lost before any worker started them, sent again.
pub static TICKETS_RESENT_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        TICKETS_RESENT,
        "tickets sent again by the lost-ticket sweep",
        &["shard"]
    )
    .expect("metric")
});
/// Active runs ended by a newer occurrence of a job with `overlap: replace`.
pub static RUNS_REPLACED_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(RUNS_REPLACED, "runs ended by overlap replace", &["shard"])
        .expect("metric")
});

/// 1 on the control-plane replica that holds the leader lease now, 0 on the others.
pub static CONTROL_PLANE_LEADER: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        CONTROL_PLANE_LEADER_NAME,
        "1 while this control-plane replica leads",
        &["replica"]
    )
    .expect("metric")
});
/// A shard node's clock minus the NATS server's, as the node last measured it.
pub static CLOCK_OFFSET_SECONDS: LazyLock<GaugeVec> = LazyLock::new(|| {
    register_gauge_vec!(
        CLOCK_OFFSET,
        "this node's clock minus the NATS server's",
        &["node"]
    )
    .expect("metric")
});
/// Shard owner changes the leader wrote, by why the shard moved.
pub static SHARD_MOVES_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        SHARD_MOVES,
        "shard owner changes written by the leader",
        &["reason"]
    )
    .expect("metric")
});
/// Shards whose owner in the shard map is not a live node (or that have none), by that owner
/// (`none`), as the leader saw them at its last assignment pass; each live node shows 0. Only
/// the leader has series.
pub static SHARDS_UNOWNED_GAUGE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        SHARDS_UNOWNED,
        "shards with no live owner at the leader's last assignment pass, by their last owner",
        &["node"]
    )
    .expect("metric")
});
/// Tenant moves of a growth (shards added), by outcome: `done`, or `retried` when a step failed
/// and the move was taken up again. Only the leader moves tenants.
pub static TENANT_MOVES_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        TENANT_MOVES,
        "tenant moves to added shards, by outcome",
        &["result"]
    )
    .expect("metric")
});
/// Jobs handed from one shard to another in a `time_window` cluster that grew, by shard and
/// step: `left` (taken off the source), `resent` (sent again after a failed or unconfirmed
/// send), `confirmed` (the target holds it or dropped a stale copy), `arrived` (inserted by the
/// target).
pub static JOB_HANDOFFS_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        JOB_HANDOFFS,
        "jobs handed between shards at a layout's edge, by shard and step",
        &["shard", "step"]
    )
    .expect("metric")
});
/// Workflow steps a run's advance acted on, by shard and what it did: `released` (dispatched once
/// every step it waits for succeeded), `skipped` (a step it depends on failed for good, or the
/// run failed fast), `cancelled` (stopped in progress by `fail_fast`).
pub static WORKFLOW_STEPS_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        WORKFLOW_STEPS,
        "workflow steps released, skipped or cancelled, by shard and state",
        &["shard", "state"]
    )
    .expect("metric")
});
/// Workflow runs that ended, by shard and final state (`succeeded`, `dead`, `failed`,
/// `cancelled`).
pub static WORKFLOW_RUNS_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        WORKFLOW_RUNS,
        "workflow runs ended, by shard and state",
        &["shard", "state"]
    )
    .expect("metric")
});
/// How long a tenant move kept its tenants frozen (no fires, writes waiting): from the freeze on
/// the old shard to the switch of the API to the new one.
pub static TENANT_MOVE_SECONDS_HISTOGRAM: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        TENANT_MOVE_SECONDS,
        "seconds a moving tenant was frozen",
        vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
    )
    .expect("metric")
});
/// Old shards that still have tenants to hand to added shards (0 when no shards are being
/// added). Only the leader has a series.
pub static GROWTH_SHARDS_PENDING_GAUGE: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        GROWTH_SHARDS_PENDING,
        "old shards whose leaving tenants have not all moved to added shards"
    )
    .expect("metric")
});
/// Seconds since the leader last heard each node's heartbeat (nodes that left cleanly are
/// dropped; a silent one is shown for 10 minutes). Only the leader has series.
pub static NODE_HEARTBEAT_AGE_GAUGE: LazyLock<GaugeVec> = LazyLock::new(|| {
    register_gauge_vec!(
        NODE_HEARTBEAT_AGE,
        "seconds since the leader last heard the node's heartbeat",
        &["node"]
    )
    .expect("metric")
});
/// Open ticket attempts of a shard whose queue no live worker serves: they wait until one does.
pub static TICKETS_UNSERVED_GAUGE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        TICKETS_UNSERVED,
        "open ticket attempts on a queue no live worker serves",
        &["shard"]
    )
    .expect("metric")
});
/// Shards open on a node.
pub static SHARDS_OPEN_GAUGE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(SHARDS_OPEN, "shards open on this node", &["node"]).expect("metric")
});
/// Assignment passes of the leader in which the active strategy gave no usable answer and the
/// built-in fallback stood in, by strategy and by kind of failure (a fixed set of reasons, never
/// the plugin's message, so the label set stays bounded).
pub static STRATEGY_ERRORS_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        STRATEGY_ERRORS,
        "assignment passes in which the strategy failed and the fallback stood in",
        &["strategy", "reason"]
    )
    .expect("metric")
});

/// The Prometheus text exposition of every registered metric.
pub fn render() -> String {
    let mut buf = Vec::new();
    let _ = TextEncoder::new().encode(&prometheus::gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}
