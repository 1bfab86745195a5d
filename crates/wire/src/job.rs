//! The job as clients write it (`JobSpec`, `JobPatch`) and read it (`Job`), and the one place that
//! checks a spec's fields, so that every 400 names the field at fault. Compiling its schedule is
//! `chronoshard_schedule::spec`'s: this crate holds data and the contract's field rules only.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::Dur;

/// A request to create a job (`POST /v1/jobs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Tenant the job belongs to: 1–64 characters of `A-Z a-z 0-9 _ -`.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub tenant: String,
    /// Human name, 1–200 characters; not unique.
    #[schema(min_length = 1, max_length = 200, pattern = "\\S")]
    pub name: String,
    pub schedule: ScheduleSpec,
    pub target: TargetSpec,
    /// Any JSON; sent to the executor as the request body (http) or the ticket payload.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    #[serde(default)]
    pub retry: RetrySpec,
    /// Per-attempt execution timeout (default 30s).
    #[serde(default = "default_timeout")]
    pub timeout: Dur,
    #[serde(default)]
    pub overlap: Overlap,
    #[serde(default)]
    pub catchup: CatchupSpec,
    /// 0 (lowest) to 9 (highest), default 5.
    #[serde(default = "default_priority")]
    #[schema(minimum = 0, maximum = 9)]
    pub priority: u8,
    /// Number of items one occurrence is split into (1–1000, default 1).
    #[serde(default = "default_items")]
    #[schema(minimum = 1, maximum = 1000)]
    pub shard_items: u32,
    /// Set on the job a shard keeps for a workflow (its steps are the occurrence's items); never
    /// part of a job's API: `POST /v1/jobs` refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub workflow: Option<crate::workflow::WorkflowDef>,
}

pub(crate) fn default_timeout() -> Dur {
    Dur(std::time::Duration::from_secs(30))
}
pub(crate) fn default_priority() -> u8 {
    5
}
fn default_items() -> u32 {
    1
}

/// When a job fires: exactly one of `cron` (with optional `timezone`), `every` (with optional
/// `start_at`, `end_at`), `at`, or `delay`. Its OpenAPI schema says so (`schedule_schema`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// 5 fields (minute hour day-of-month month day-of-week) or 6 with leading seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// IANA time zone of a cron schedule, default `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<Dur>,
    /// First fire of an `every` schedule; default: the job's creation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<DateTime<Utc>>,
    /// An `every` schedule fires only strictly before this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<DateTime<Utc>>,
    /// One-shot at this instant (RFC 3339); in the past means due at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<DateTime<Utc>>,
    /// One-shot at creation time plus this duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<Dur>,
}

/// The four kinds a `ScheduleSpec` can be, once checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleKind {
    Cron,
    Every,
    At,
    Delay,
}

/// What executes an occurrence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TargetSpec {
    /// An HTTP request made by a chronoshard worker.
    #[schema(title = "HttpTarget")]
    Http {
        url: String,
        #[serde(default = "default_method")]
        method: String,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        #[schema(value_type = HttpHeaders)]
        headers: BTreeMap<String, String>,
    },
    /// A command run by a worker that has shell execution enabled.
    #[schema(title = "ShellTarget")]
    Shell {
        command: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        args: Vec<String>,
    },
    /// Any executor consuming the named queue (see docs/protocol.md). `job_type` names the kind
    /// of work when one queue serves several (an SDK worker routes on it to its handler).
    #[schema(title = "QueueTarget")]
    Queue {
        queue: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job_type: Option<String>,
    },
}

/// Extra request headers of an HTTP target, name → value. A named schema, so that client
/// generators make one model of it however many schemas hold a target.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct HttpHeaders(BTreeMap<String, String>);

fn default_method() -> String {
    "POST".to_string()
}

impl TargetSpec {
    /// The dispatch queue a ticket for this target is published on.
    pub fn queue(&self) -> &str {
        match self {
            TargetSpec::Http { .. } => "http",
            TargetSpec::Shell { .. } => "shell",
            TargetSpec::Queue { queue, .. } => queue,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts in all, including the first (1–100, default 1: no retry).
    #[schema(minimum = 1, maximum = 100)]
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    #[serde(default)]
    pub backoff: Backoff,
    #[serde(default = "default_initial")]
    pub initial: Dur,
    #[serde(default = "default_max_backoff")]
    pub max: Dur,
}

fn default_attempts() -> u32 {
    1
}
fn default_initial() -> Dur {
    Dur(std::time::Duration::from_secs(1))
}
fn default_max_backoff() -> Dur {
    Dur(std::time::Duration::from_secs(300))
}

impl Default for RetrySpec {
    fn default() -> Self {
        RetrySpec {
            max_attempts: default_attempts(),
            backoff: Backoff::default(),
            initial: default_initial(),
            max: default_max_backoff(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Backoff {
    Fixed,
    Exponential,
    #[default]
    ExponentialJitter,
}

/// What happens when an occurrence is due while the previous one still runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    #[default]
    Allow,
    Forbid,
    Replace,
    BufferOne,
}

/// What happens to occurrences that fell due while the shard could not fire them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CatchupSpec {
    #[serde(default)]
    pub policy: CatchupPolicy,
    /// How far back a late occurrence may still be fired (default 1h).
    #[serde(default = "default_window")]
    pub window: Dur,
}

fn default_window() -> Dur {
    Dur(std::time::Duration::from_secs(3600))
}

impl Default for CatchupSpec {
    fn default() -> Self {
        CatchupSpec {
            policy: CatchupPolicy::default(),
            window: default_window(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CatchupPolicy {
    /// Late occurrences are recorded as skipped; the schedule resumes with the next future one.
    Skip,
    /// Only the most recent late occurrence within the window fires; older ones are recorded as missed.
    #[default]
    Latest,
    /// Every late occurrence within the window fires, oldest first.
    All,
}

/// Lifecycle of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Active,
    Paused,
    /// The schedule has no further occurrences (a one-shot that fired, an `every` past `end_at`).
    Completed,
    Deleted,
}

impl JobState {
    pub fn as_str(&self) -> &'static str {
        match self {
            JobState::Active => "active",
            JobState::Paused => "paused",
            JobState::Completed => "completed",
            JobState::Deleted => "deleted",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        Some(match s {
            "active" => JobState::Active,
            "paused" => JobState::Paused,
            "completed" => JobState::Completed,
            "deleted" => JobState::Deleted,
            _ => return None,
        })
    }
}

/// A job as the API returns it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Job {
    pub id: Uuid,
    #[serde(flatten)]
    pub spec: JobSpec,
    pub state: JobState,
    /// Shard that owns the job.
    pub shard: u32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The next (up to 5) times the job will fire, UTC.
    pub next_fire_times: Vec<DateTime<Utc>>,
    /// What stands in the way of the job's runs (no live worker serves its queue); shown when
    /// the job is created or read, never stored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<crate::warning::Warning>,
}

/// `PATCH /v1/jobs/{id}`: the fields to change; the tenant cannot change.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 200, pattern = "\\S")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<TargetSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub payload: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Dur>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<Overlap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catchup: Option<CatchupSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 9)]
    pub priority: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1000)]
    pub shard_items: Option<u32>,
    /// A workflow's new steps (`PATCH /v1/workflows/{id}`); never part of a job's API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub workflow: Option<crate::workflow::WorkflowDef>,
}

impl JobPatch {
    /// The spec after this patch.
    pub fn apply(&self, spec: &JobSpec) -> JobSpec {
        let mut s = spec.clone();
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = &self.$f { s.$f = v.clone(); } )* };
        }
        set!(
            name,
            schedule,
            target,
            payload,
            retry,
            timeout,
            overlap,
            catchup,
            priority,
            shard_items
        );
        if let Some(w) = &self.workflow {
            s.shard_items = w.steps.len() as u32;
            s.workflow = Some(w.clone());
        }
        s
    }
}

/// A spec field that is wrong, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// Dotted path of the field, e.g. `schedule.cron`.
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Tenant ids and queue names end up in NATS subjects and KV keys: keep them to a safe alphabet
/// (`.` would split a subject token, so it is refused too).
/// Largest `payload` of a job, as JSON: it travels in every ticket, and a ticket is one NATS
/// message (1 MiB by default).
pub const MAX_PAYLOAD_BYTES: usize = 256 << 10;

/// The length of `v` as compact JSON, counted without building the text.
pub fn json_len(v: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    serde_json::to_writer(&mut c, v).expect("a JSON value serialises");
    c.0
}

/// Most headers an HTTP target may carry.
pub const MAX_HEADERS: usize = 32;

/// Headers a worker sets itself on every call, or that the HTTP client owns: a target may not
/// set them (sent twice, they would contradict the platform's).
const RESERVED_HEADERS: [&str; 9] = [
    "idempotency-key",
    "traceparent",
    "tracestate",
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "upgrade",
];

/// An HTTP target's headers: at most `MAX_HEADERS`, names HTTP tokens of up to 128 characters and
/// none the platform sets (`RESERVED_HEADERS`, `X-Chronoshard-*`), values up to 4096 visible
/// characters. Refused at create, so no attempt fails on them later.
fn check_headers(at: &str, headers: &BTreeMap<String, String>) -> Result<(), FieldError> {
    let field = format!("{at}.headers");
    let field = field.as_str();
    if headers.len() > MAX_HEADERS {
        return Err(FieldError::new(
            field,
            format!("at most {MAX_HEADERS} headers"),
        ));
    }
    for (name, value) in headers {
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || name.len() > 128 || !name.chars().all(token) {
            return Err(FieldError::new(
                field,
                format!("{name:?} is not a header name (1-128 of A-Z a-z 0-9 ! # $ % & ' * + - . ^ _ ` | ~)"),
            ));
        }
        let lower = name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("x-chronoshard-") {
            return Err(FieldError::new(
                field,
                format!("{name} is set by the platform on every call"),
            ));
        }
        let visible = |c: char| c == ' ' || c == '\t' || (c.is_ascii_graphic());
        if value.len() > 4096 || !value.chars().all(visible) {
            return Err(FieldError::new(
                field,
                format!("the value of {name} must be up to 4096 visible ASCII characters"),
            ));
        }
    }
    Ok(())
}

pub fn check_token(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    let ok = !value.is_empty()
        && value.len() <= max
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!("must be 1-{max} characters of A-Z a-z 0-9 _ -"),
        ))
    }
}

impl ScheduleSpec {
    /// Which kind this spec is, or why it is none or several.
    pub fn kind(&self) -> Result<ScheduleKind, FieldError> {
        let kinds: Vec<ScheduleKind> = [
            (self.cron.is_some(), ScheduleKind::Cron),
            (self.every.is_some(), ScheduleKind::Every),
            (self.at.is_some(), ScheduleKind::At),
            (self.delay.is_some(), ScheduleKind::Delay),
        ]
        .into_iter()
        .filter_map(|(set, k)| set.then_some(k))
        .collect();
        let kind = match kinds.as_slice() {
            [k] => *k,
            [] => {
                return Err(FieldError::new(
                    "schedule",
                    "one of cron, every, at, delay is required",
                ))
            }
            _ => {
                return Err(FieldError::new(
                    "schedule",
                    "only one of cron, every, at, delay may be given",
                ))
            }
        };
        let stray = |name: &str, set: bool, allowed: bool| {
            if set && !allowed {
                Err(FieldError::new(
                    format!("schedule.{name}"),
                    "not allowed with this schedule kind",
                ))
            } else {
                Ok(())
            }
        };
        stray(
            "timezone",
            self.timezone.is_some(),
            kind == ScheduleKind::Cron,
        )?;
        stray(
            "start_at",
            self.start_at.is_some(),
            kind == ScheduleKind::Every,
        )?;
        stray("end_at", self.end_at.is_some(), kind == ScheduleKind::Every)?;
        Ok(kind)
    }
}

impl JobSpec {
    /// The retry policy of the occurrence item `item`: a workflow's step's own, else the job's.
    pub fn retry_of(&self, item: u32) -> &RetrySpec {
        self.workflow
            .as_ref()
            .and_then(|w| w.steps.get(item as usize))
            .map_or(&self.retry, |s| &s.retry)
    }

    /// Checks every field but what only compiling the schedule tells (a cron expression's
    /// syntax, a time zone's name, an interval's size): `chronoshard_schedule::spec::check_job`
    /// does both.
    pub fn validate(&self) -> Result<(), FieldError> {
        check_token("tenant", &self.tenant, 64)?;
        if self.name.trim().is_empty() || self.name.len() > 200 {
            return Err(FieldError::new("name", "must be 1-200 characters"));
        }
        self.schedule.kind()?;
        check_target("target", &self.target)?;
        check_retry("retry", &self.retry)?;
        check_timeout("timeout", self.timeout)?;
        if self.priority > 9 {
            return Err(FieldError::new("priority", "must be 0-9"));
        }
        if !(1..=1000).contains(&self.shard_items) {
            return Err(FieldError::new("shard_items", "must be 1-1000"));
        }
        if let Some(w) = &self.workflow {
            w.validate()?;
            if self.shard_items as usize != w.steps.len() {
                return Err(FieldError::new(
                    "shard_items",
                    "a workflow's items are its steps: change them with PATCH /v1/workflows/{id}",
                ));
            }
        }
        Ok(())
    }
}

/// Checks a target's fields; `at` is the target's path (`target`, `steps[2].target`).
pub(crate) fn check_target(at: &str, target: &TargetSpec) -> Result<(), FieldError> {
    match target {
        TargetSpec::Http {
            url,
            method,
            headers,
        } => {
            check_headers(at, headers)?;
            let ok = url.starts_with("http://") || url.starts_with("https://");
            if !ok || url.len() > 2048 {
                return Err(FieldError::new(
                    format!("{at}.url"),
                    "must be an http:// or https:// URL",
                ));
            }
            const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];
            if !METHODS.contains(&method.as_str()) {
                return Err(FieldError::new(
                    format!("{at}.method"),
                    "must be one of GET, POST, PUT, PATCH, DELETE",
                ));
            }
        }
        TargetSpec::Shell { command, .. } if command.trim().is_empty() => {
            return Err(FieldError::new(
                format!("{at}.command"),
                "must not be empty",
            ));
        }
        TargetSpec::Shell { .. } => {}
        TargetSpec::Queue { queue, .. } if queue == "http" || queue == "shell" => {
            return Err(FieldError::new(
                format!("{at}.queue"),
                "http and shell are the built-in executors' queues: use an http or shell target",
            ));
        }
        TargetSpec::Queue { queue, job_type } => {
            check_token(&format!("{at}.queue"), queue, 64)?;
            if let Some(t) = job_type {
                check_token(&format!("{at}.job_type"), t, 64)?;
            }
        }
    }
    Ok(())
}

/// Checks a retry policy; `at` is its path.
pub(crate) fn check_retry(at: &str, retry: &RetrySpec) -> Result<(), FieldError> {
    if !(1..=100).contains(&retry.max_attempts) {
        return Err(FieldError::new(
            format!("{at}.max_attempts"),
            "must be 1-100",
        ));
    }
    if retry.initial > retry.max {
        return Err(FieldError::new(
            format!("{at}.initial"),
            format!("must not exceed {at}.max"),
        ));
    }
    Ok(())
}

/// Checks a per-attempt timeout; `at` is its path.
pub(crate) fn check_timeout(at: &str, timeout: Dur) -> Result<(), FieldError> {
    if timeout.0.is_zero() {
        return Err(FieldError::new(at, "must be greater than 0"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> Result<JobSpec, serde_json::Error> {
        serde_json::from_value(json)
    }

    #[test]
    fn contract_example_round_trips() {
        let j = serde_json::json!({ "tenant": "acme", "name": "nightly-report",
          "schedule": {"cron": "0 30 2 * * *", "timezone": "Europe/Berlin"},
          "target": {"type": "http", "url": "https://reports.acme.internal/run", "method": "POST"},
          "payload": {"report": "daily"},
          "retry": {"max_attempts": 5, "backoff": "exponential_jitter", "initial": "1s", "max": "5m"},
          "timeout": "30s", "overlap": "forbid", "catchup": {"policy": "latest", "window": "1h"},
          "priority": 5, "shard_items": 1 });
        let s = spec(j.clone()).unwrap();
        s.validate().unwrap();
        assert_eq!(serde_json::to_value(&s).unwrap(), j);
    }

    #[test]
    fn the_built_in_executors_queues_are_not_queue_targets() {
        for queue in ["http", "shell"] {
            let s = spec(serde_json::json!({"tenant": "a", "name": "n",
                "schedule": {"at": "2026-01-01T00:00:00Z"},
                "target": {"type": "queue", "queue": queue}}))
            .unwrap();
            let e = s.validate().unwrap_err();
            assert_eq!(e.field, "target.queue", "{e:?}");
        }
    }

    #[test]
    fn an_http_targets_headers_are_checked_and_the_platforms_own_refused() {
        let with = |headers: serde_json::Value| {
            spec(serde_json::json!({"tenant": "a", "name": "n",
                "schedule": {"at": "2026-01-01T00:00:00Z"},
                "target": {"type": "http", "url": "https://x.test/", "headers": headers}}))
            .unwrap()
            .validate()
        };
        with(serde_json::json!({"X-Api-Key": "k 1", "Accept": "application/json"})).unwrap();
        let too_many: serde_json::Map<_, _> = (0..=MAX_HEADERS)
            .map(|i| (format!("X-H{i}"), serde_json::json!("v")))
            .collect();
        for bad in [
            serde_json::json!({"Idempotency-Key": "mine"}),
            serde_json::json!({"x-chronoshard-attempt": "9"}),
            serde_json::json!({"TraceParent": "00-1-2-01"}),
            serde_json::json!({"Content-Length": "5"}),
            serde_json::json!({"Bad Name": "v"}),
            serde_json::json!({"": "v"}),
            serde_json::json!({"X-Ok": "line\r\nX-Injected: 1"}),
            serde_json::json!({"X-Ok": "x".repeat(4097)}),
            serde_json::Value::Object(too_many),
        ] {
            let e = with(bad.clone()).unwrap_err();
            assert_eq!(e.field, "target.headers", "{bad}: {e:?}");
        }
    }

    #[test]
    fn a_queue_targets_job_type_is_a_token() {
        let with = |job_type: &str| {
            spec(serde_json::json!({"tenant": "a", "name": "n",
                "schedule": {"at": "2026-01-01T00:00:00Z"},
                "target": {"type": "queue", "queue": "q", "job_type": job_type}}))
            .unwrap()
        };
        with("send-email").validate().unwrap();
        let e = with("send email").validate().unwrap_err();
        assert_eq!(e.field, "target.job_type", "{e:?}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = spec(serde_json::json!({"tenant": "a", "name": "n", "schedule": {"at": "2026-01-01T00:00:00Z"},
            "target": {"type": "queue", "queue": "q"}, "colour": "red"}))
        .unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
        let e = spec(serde_json::json!({"tenant": "a", "name": "n", "schedule": {"at": "2026-01-01T00:00:00Z", "tz": "x"},
            "target": {"type": "queue", "queue": "q"}}))
        .unwrap_err();
        assert!(e.to_string().contains("tz"), "{e}");
    }

    #[test]
    fn schedule_kind_must_be_exactly_one() {
        let s = ScheduleSpec {
            cron: Some("* * * * *".into()),
            every: Some("1s".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(s.kind().unwrap_err().field, "schedule");
        assert_eq!(
            ScheduleSpec::default().kind().unwrap_err().field,
            "schedule"
        );
        let s = ScheduleSpec {
            at: Some(Utc::now()),
            timezone: Some("UTC".into()),
            ..Default::default()
        };
        assert_eq!(s.kind().unwrap_err().field, "schedule.timezone");
    }

    #[test]
    fn patch_changes_only_given_fields() {
        let s = spec(
            serde_json::json!({"tenant": "a", "name": "n", "schedule": {"every": "1s"},
            "target": {"type": "queue", "queue": "q"}}),
        )
        .unwrap();
        let p = JobPatch {
            name: Some("m".into()),
            priority: Some(7),
            ..Default::default()
        };
        let t = p.apply(&s);
        assert_eq!(
            (t.name.as_str(), t.priority, &t.tenant),
            ("m", 7, &s.tenant)
        );
        assert_eq!(t.schedule, s.schedule);
    }
}
