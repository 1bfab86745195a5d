//! The body of `chronoshard jobs create`: a job as `POST /v1/jobs` takes it (the `JobSpec` of
//! openapi/openapi.json), from a JSON or TOML file, from flags, or from both (the file first,
//! then each flag given replaces what the file says).
//!
//! Nothing is checked here that the API checks (durations, cron expressions, ranges): the API's
//! answer names the field at fault, and the client stays in step with it. What this module
//! decides is how flags map to fields:
//! - one of `--cron` (with `--tz`), `--every` (with `--start-at`, `--end-at`), `--at`, `--delay`
//!   replaces the whole `schedule`; `--tz`, `--start-at` and `--end-at` alone change the
//!   file's schedule;
//! - one of `--target-url` (an `http` target, with `--method`, `--header`), `--queue` (with
//!   `--job-type`), `--command` (a `shell` target, with `--arg`) replaces the whole `target`;
//! - `--max-attempts`, `--backoff`, `--retry-initial`, `--retry-max` set fields of `retry`;
//!   `--catchup` and `--catchup-window` of `catchup`; the others are top-level fields.

use std::io::Read;

use clap::ArgGroup;
use serde_json::{json, Map, Value};

use super::ClientError;

/// The flags of `jobs create`.
#[derive(clap::Args, Debug, Clone, Default)]
#[command(group(ArgGroup::new("schedule_kind").args(["cron", "every", "at", "delay"])))]
#[command(group(ArgGroup::new("target_kind").args(["target_url", "queue", "command"])))]
pub struct CreateArgs {
    /// A job body, JSON or TOML (`-` reads stdin; a `.toml` file, or text not starting with
    /// `{`, is TOML). Flags override its fields.
    #[arg(long, short, value_name = "FILE")]
    pub file: Option<String>,
    /// Repeating a create with the same key returns the first job (`Idempotency-Key`).
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Tenant of the job.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Name of the job.
    #[arg(long)]
    pub name: Option<String>,

    /// Cron expression: 5 fields, or 6 with leading seconds.
    #[arg(long, value_name = "EXPR", help_heading = "Schedule (one of)")]
    pub cron: Option<String>,
    /// IANA time zone of the cron expression (default UTC).
    #[arg(
        long,
        value_name = "ZONE",
        visible_alias = "timezone",
        help_heading = "Schedule (one of)"
    )]
    pub tz: Option<String>,
    /// Interval, such as `30s` or `1h30m`.
    #[arg(long, value_name = "DURATION", help_heading = "Schedule (one of)")]
    pub every: Option<String>,
    /// First fire of `--every` (RFC 3339; default: when the job is created).
    #[arg(long, value_name = "RFC3339", help_heading = "Schedule (one of)")]
    pub start_at: Option<String>,
    /// `--every` fires only before this instant (RFC 3339).
    #[arg(long, value_name = "RFC3339", help_heading = "Schedule (one of)")]
    pub end_at: Option<String>,
    /// Once, at this instant (RFC 3339).
    #[arg(long, value_name = "RFC3339", help_heading = "Schedule (one of)")]
    pub at: Option<String>,
    /// Once, this long after the job is created.
    #[arg(long, value_name = "DURATION", help_heading = "Schedule (one of)")]
    pub delay: Option<String>,

    /// An HTTP target: the URL a worker calls (`--url` is the API's).
    #[arg(long, value_name = "URL", help_heading = "Target (one of)")]
    pub target_url: Option<String>,
    /// Method of the HTTP target (default POST).
    #[arg(long, requires = "target_url", help_heading = "Target (one of)")]
    pub method: Option<String>,
    /// A header of the HTTP target (repeatable).
    #[arg(
        long = "header",
        value_name = "NAME:VALUE",
        requires = "target_url",
        help_heading = "Target (one of)"
    )]
    pub headers: Vec<String>,
    /// A queue target: any executor consuming this queue.
    #[arg(long, value_name = "NAME", help_heading = "Target (one of)")]
    pub queue: Option<String>,
    /// Kind of work on the queue, for workers that route on it.
    #[arg(long, requires = "queue", help_heading = "Target (one of)")]
    pub job_type: Option<String>,
    /// A shell target: the command a shell-enabled worker runs.
    #[arg(long, value_name = "COMMAND", help_heading = "Target (one of)")]
    pub command: Option<String>,
    /// An argument of the command (repeatable, in order).
    #[arg(
        long = "arg",
        value_name = "ARG",
        requires = "command",
        allow_hyphen_values = true,
        help_heading = "Target (one of)"
    )]
    pub args: Vec<String>,

    /// Payload: any JSON, sent to the target.
    #[arg(long, value_name = "JSON", help_heading = "Execution")]
    pub payload: Option<String>,
    /// Attempts in all, the first included (default 1: no retry).
    #[arg(long, value_name = "N", help_heading = "Execution")]
    pub max_attempts: Option<u32>,
    /// Backoff between attempts.
    #[arg(long, value_parser = ["fixed", "exponential", "exponential_jitter"], help_heading = "Execution")]
    pub backoff: Option<String>,
    /// First backoff (default 1s).
    #[arg(long, value_name = "DURATION", help_heading = "Execution")]
    pub retry_initial: Option<String>,
    /// Longest backoff (default 300s).
    #[arg(long, value_name = "DURATION", help_heading = "Execution")]
    pub retry_max: Option<String>,
    /// Timeout of one attempt (default 30s).
    #[arg(long, value_name = "DURATION", help_heading = "Execution")]
    pub timeout: Option<String>,
    /// When an occurrence is due while the previous one runs.
    #[arg(long, value_parser = ["allow", "forbid", "replace", "buffer_one"], help_heading = "Execution")]
    pub overlap: Option<String>,
    /// What happens to occurrences missed while the shard could not fire.
    #[arg(long, value_parser = ["skip", "latest", "all"], help_heading = "Execution")]
    pub catchup: Option<String>,
    /// How late a missed occurrence may still fire (default 1h).
    #[arg(long, value_name = "DURATION", help_heading = "Execution")]
    pub catchup_window: Option<String>,
    /// 0 (lowest) to 9 (highest), default 5.
    #[arg(long, help_heading = "Execution")]
    pub priority: Option<u8>,
    /// Items one occurrence is split into (default 1).
    #[arg(long, value_name = "N", help_heading = "Execution")]
    pub shard_items: Option<u32>,
}

impl CreateArgs {
    /// The request body: the file (if any), then the flags.
    pub fn body(&self) -> Result<Value, ClientError> {
        let base = match self.file.as_deref() {
            None => Value::Object(Map::new()),
            Some(file) => read_body(file)?,
        };
        self.apply(base)
    }

    /// `body` with the flags given set on it.
    fn apply(&self, mut body: Value) -> Result<Value, ClientError> {
        let top = body.as_object_mut().ok_or_else(|| {
            ClientError::Usage("a job body is a JSON object (a TOML table)".into())
        })?;
        set(top, "tenant", &self.tenant);
        set(top, "name", &self.name);
        if let Some(schedule) = self.schedule() {
            top.insert("schedule".into(), schedule);
        }
        let schedule = member(top, "schedule")?;
        set(schedule, "timezone", &self.tz);
        set(schedule, "start_at", &self.start_at);
        set(schedule, "end_at", &self.end_at);
        if let Some(target) = self.target()? {
            top.insert("target".into(), target);
        }
        if let Some(p) = &self.payload {
            let payload = serde_json::from_str(p)
                .map_err(|e| ClientError::Usage(format!("--payload is not JSON: {e}")))?;
            top.insert("payload".into(), payload);
        }
        let retry = member(top, "retry")?;
        set(retry, "max_attempts", &self.max_attempts);
        set(retry, "backoff", &self.backoff);
        set(retry, "initial", &self.retry_initial);
        set(retry, "max", &self.retry_max);
        let catchup = member(top, "catchup")?;
        set(catchup, "policy", &self.catchup);
        set(catchup, "window", &self.catchup_window);
        set(top, "timeout", &self.timeout);
        set(top, "overlap", &self.overlap);
        set(top, "priority", &self.priority);
        set(top, "shard_items", &self.shard_items);
        // An object the flags opened and left empty is not sent (the API's defaults apply).
        for key in ["schedule", "retry", "catchup"] {
            if top.get(key).is_some_and(|v| v == &json!({})) {
                top.remove(key);
            }
        }
        Ok(body)
    }

    /// The schedule the flags name, if they name a kind.
    fn schedule(&self) -> Option<Value> {
        let (kind, value) = [
            ("cron", &self.cron),
            ("every", &self.every),
            ("at", &self.at),
            ("delay", &self.delay),
        ]
        .into_iter()
        .find_map(|(k, v)| v.as_ref().map(|v| (k, v)))?;
        Some(json!({ kind: value }))
    }

    /// The target the flags name, if they name one.
    fn target(&self) -> Result<Option<Value>, ClientError> {
        if let Some(url) = &self.target_url {
            let mut t = json!({"type": "http", "url": url});
            if let Some(m) = &self.method {
                t["method"] = json!(m);
            }
            if !self.headers.is_empty() {
                let mut headers = Map::new();
                for h in &self.headers {
                    let (name, value) = h.split_once(':').ok_or_else(|| {
                        ClientError::Usage(format!("--header {h:?}: expected NAME:VALUE"))
                    })?;
                    headers.insert(name.trim().into(), json!(value.trim()));
                }
                t["headers"] = Value::Object(headers);
            }
            return Ok(Some(t));
        }
        if let Some(queue) = &self.queue {
            let mut t = json!({"type": "queue", "queue": queue});
            if let Some(kind) = &self.job_type {
                t["job_type"] = json!(kind);
            }
            return Ok(Some(t));
        }
        Ok(self.command.as_ref().map(|command| {
            let mut t = json!({"type": "shell", "command": command});
            if !self.args.is_empty() {
                t["args"] = json!(self.args);
            }
            t
        }))
    }
}

/// Sets `key` when the flag was given.
fn set<T: serde::Serialize>(obj: &mut Map<String, Value>, key: &str, value: &Option<T>) {
    if let Some(v) = value {
        obj.insert(key.into(), json!(v));
    }
}

/// The object at `key`, created empty when absent; anything else there is a usage error.
fn member<'a>(
    obj: &'a mut Map<String, Value>,
    key: &str,
) -> Result<&'a mut Map<String, Value>, ClientError> {
    obj.entry(key)
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| ClientError::Usage(format!("`{key}` of the job body is not an object")))
}

/// A request body from the file `file` (`-`: stdin), JSON or TOML (`parse_body`).
pub fn read_body(file: &str) -> Result<Value, ClientError> {
    if file == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| ClientError::Usage(format!("cannot read stdin: {e}")))?;
        return parse_body("stdin", &text);
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| ClientError::Usage(format!("cannot read {file}: {e}")))?;
    parse_body(file, &text)
}

/// A job body from a file's text: TOML when the file is `.toml` or the text does not start with
/// `{`, else JSON. TOML becomes the same JSON (dates and times as RFC 3339 strings).
pub fn parse_body(name: &str, text: &str) -> Result<Value, ClientError> {
    let toml = name.ends_with(".toml") || !text.trim_start().starts_with('{');
    if toml {
        let table: toml::Table = toml::from_str(text)
            .map_err(|e| ClientError::Usage(format!("{name}: not a JSON or TOML job body: {e}")))?;
        Ok(toml_to_json(toml::Value::Table(table)))
    } else {
        serde_json::from_str(text)
            .map_err(|e| ClientError::Usage(format!("{name}: not a JSON job body: {e}")))
    }
}

fn toml_to_json(v: toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => json!(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.into_iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => {
            Value::Object(t.into_iter().map(|(k, v)| (k, toml_to_json(v))).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        create: CreateArgs,
    }

    fn flags(args: &[&str]) -> CreateArgs {
        Cmd::try_parse_from(std::iter::once("create").chain(args.iter().copied()))
            .unwrap()
            .create
    }

    #[test]
    fn flags_make_a_whole_body() {
        let body = flags(&[
            "--tenant",
            "acme",
            "--name",
            "n",
            "--cron",
            "0 3 * * *",
            "--tz",
            "Europe/Berlin",
            "--target-url",
            "http://x/y",
            "--method",
            "GET",
            "--header",
            "X-A: 1",
            "--payload",
            "{\"k\":1}",
            "--max-attempts",
            "3",
            "--backoff",
            "fixed",
            "--timeout",
            "5s",
            "--overlap",
            "forbid",
            "--catchup",
            "skip",
            "--priority",
            "7",
        ])
        .apply(json!({}))
        .unwrap();
        assert_eq!(
            body,
            json!({"tenant": "acme", "name": "n",
                "schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
                "target": {"type": "http", "url": "http://x/y", "method": "GET", "headers": {"X-A": "1"}},
                "payload": {"k": 1}, "retry": {"max_attempts": 3, "backoff": "fixed"},
                "catchup": {"policy": "skip"}, "timeout": "5s", "overlap": "forbid", "priority": 7})
        );
    }

    #[test]
    fn flags_override_the_file_and_a_schedule_kind_replaces_the_schedule() {
        let file = json!({"tenant": "a", "name": "n", "schedule": {"cron": "* * * * *"},
            "target": {"type": "queue", "queue": "q"}, "retry": {"max_attempts": 2}});
        let body = flags(&[
            "--name",
            "m",
            "--every",
            "30s",
            "--command",
            "echo",
            "--arg",
            "-n",
        ])
        .apply(file.clone())
        .unwrap();
        assert_eq!(body["name"], "m");
        assert_eq!(body["schedule"], json!({"every": "30s"}));
        assert_eq!(
            body["target"],
            json!({"type": "shell", "command": "echo", "args": ["-n"]})
        );
        assert_eq!(body["retry"], json!({"max_attempts": 2}));
        let body = flags(&["--tz", "Asia/Tokyo"]).apply(file).unwrap();
        assert_eq!(
            body["schedule"],
            json!({"cron": "* * * * *", "timezone": "Asia/Tokyo"})
        );
    }

    #[test]
    fn two_schedule_kinds_or_targets_are_refused_by_the_command_line() {
        let parse = |args: &[&str]| {
            Cmd::try_parse_from(std::iter::once("create").chain(args.iter().copied())).is_ok()
        };
        assert!(!parse(&["--cron", "* * * * *", "--every", "1s"]));
        assert!(!parse(&["--queue", "q", "--target-url", "http://x"]));
        assert!(!parse(&["--method", "GET"]));
    }

    #[test]
    fn toml_and_json_files_give_the_same_body() {
        let toml = r#"
tenant = "acme"
name = "nightly"
priority = 3
payload = { list = [1, 2.5, true] }
[schedule]
at = 2026-01-01T00:00:00Z
[target]
type = "queue"
queue = "reports"
"#;
        let json = r#"{"tenant": "acme", "name": "nightly", "priority": 3,
            "payload": {"list": [1, 2.5, true]},
            "schedule": {"at": "2026-01-01T00:00:00Z"},
            "target": {"type": "queue", "queue": "reports"}}"#;
        assert_eq!(
            parse_body("job.toml", toml).unwrap(),
            parse_body("job.json", json).unwrap()
        );
        assert_eq!(
            parse_body("-", toml).unwrap(),
            parse_body("-", json).unwrap()
        );
        assert!(matches!(
            parse_body("job.json", "{ nope"),
            Err(ClientError::Usage(_))
        ));
        assert!(matches!(
            flags(&["--tenant", "a"]).apply(json!([1])),
            Err(ClientError::Usage(_))
        ));
    }
}
