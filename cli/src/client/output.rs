//! What the client verbs print on stdout: the API's JSON as it came, pretty-printed
//! (`--output json`), or for people a table or a list of fields (`--output table`, the default)
//! with a sensible subset of the fields. Tables are rendered from the JSON, so a field the API
//! adds later shows in `json` at once and never breaks a table.

use std::io::Write;

use serde_json::Value;

use super::ClientError;

/// How a verb prints what it got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns (lists) or one field a line (single resources).
    Table,
    /// The API's JSON body as-is, pretty-printed.
    Json,
}

/// Prints `value` as JSON, or as `table` renders it.
pub fn print(
    format: Format,
    value: &Value,
    table: fn(&Value) -> String,
) -> Result<(), ClientError> {
    let text = match format {
        Format::Json => {
            let mut s = serde_json::to_string_pretty(value).expect("JSON values serialise");
            s.push('\n');
            s
        }
        Format::Table => table(value),
    };
    write(&text)
}

/// Writes `text` to stdout. A reader that went away (`| head`) is not an error.
pub fn write(text: &str) -> Result<(), ClientError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Tells, on stderr (so a table on stdout stays a table), how to get the next page.
pub fn next_page_hint(format: Format, page: &Value, key: &str, flag: &str) {
    if format == Format::Table {
        if let Some(next) = page[key].as_str() {
            eprintln!("more: add {flag} {next}");
        }
    }
}

/// Columns aligned by their widest cell, two spaces apart.
#[derive(Debug)]
pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&'static str]) -> Table {
        Table {
            header: header.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let header: Vec<String> = self.header.iter().map(|h| h.to_string()).collect();
        let all: Vec<&Vec<String>> = std::iter::once(&header).chain(&self.rows).collect();
        let widths: Vec<usize> = (0..header.len())
            .map(|i| {
                all.iter()
                    .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in all {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `name: value` lines, the values aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| format!("{:<width$}  {v}\n", format!("{k}:")))
        .collect()
}

/// A JSON value as a cell: strings bare, arrays comma-separated, absent as `-`.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "-".into(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// Free text cut to `max` characters, on one line.
pub fn cut(v: &Value, max: usize) -> String {
    let text = cell(v).split_whitespace().collect::<Vec<_>>().join(" ");
    if text.chars().count() > max {
        format!("{}…", text.chars().take(max - 1).collect::<String>())
    } else {
        text
    }
}

/// Seconds as `0.4s`.
fn seconds(v: &Value) -> String {
    v.as_f64().map_or_else(|| cell(v), |s| format!("{s:.1}s"))
}

/// A job's schedule in a few words: `cron 0 3 * * * Europe/Berlin`, `every 30s`, `at T`, `delay 1m`.
pub fn schedule(s: &Value) -> String {
    if let Some(cron) = s["cron"].as_str() {
        let tz = s["timezone"].as_str().unwrap_or("UTC");
        return format!("cron {cron} {tz}");
    }
    if let Some(every) = s["every"].as_str() {
        let mut text = format!("every {every}");
        if let Some(start) = s["start_at"].as_str() {
            text.push_str(&format!(" from {start}"));
        }
        if let Some(end) = s["end_at"].as_str() {
            text.push_str(&format!(" until {end}"));
        }
        return text;
    }
    match (s["at"].as_str(), s["delay"].as_str()) {
        (Some(at), _) => format!("at {at}"),
        (_, Some(delay)) => format!("delay {delay}"),
        _ => cell(s),
    }
}

/// A job's target in a few words: `http POST URL`, `queue NAME`, `shell CMD ARGS`.
pub fn target(t: &Value) -> String {
    match t["type"].as_str() {
        Some("http") => format!("http {} {}", cell(&t["method"]), cell(&t["url"])),
        Some("queue") => match t["job_type"].as_str() {
            Some(kind) => format!("queue {} ({kind})", cell(&t["queue"])),
            None => format!("queue {}", cell(&t["queue"])),
        },
        Some("shell") => {
            let mut parts = vec![cell(&t["command"])];
            parts.extend(t["args"].as_array().into_iter().flatten().map(cell));
            format!("shell {}", parts.join(" "))
        }
        _ => cell(t),
    }
}

/// A job's retry policy: `none (1 attempt)` or `up to 3 attempts, exponential backoff 1s..5m`.
fn retry(r: &Value) -> String {
    match r["max_attempts"].as_u64() {
        Some(1) => "none (1 attempt)".into(),
        _ => format!(
            "up to {} attempts, {} backoff {}..{}",
            cell(&r["max_attempts"]),
            cell(&r["backoff"]),
            cell(&r["initial"]),
            cell(&r["max"])
        ),
    }
}

/// An array as `a, b, c` (for a field line, where there is room).
fn list(v: &Value) -> String {
    match v.as_array() {
        Some(a) if !a.is_empty() => a.iter().map(cell).collect::<Vec<_>>().join(", "),
        _ => cell(v),
    }
}

/// `GET /v1/jobs`: a page of jobs.
pub fn jobs(page: &Value) -> String {
    let mut t = Table::new(&[
        "ID",
        "TENANT",
        "NAME",
        "STATE",
        "SCHEDULE",
        "TARGET",
        "NEXT FIRE",
    ]);
    for j in page["jobs"].as_array().into_iter().flatten() {
        t.row(vec![
            cell(&j["id"]),
            cell(&j["tenant"]),
            cut(&j["name"], 40),
            cell(&j["state"]),
            schedule(&j["schedule"]),
            cut(&Value::String(target(&j["target"])), 60),
            cell(&j["next_fire_times"][0]),
        ]);
    }
    t.render()
}

/// One job, a field a line.
pub fn job(j: &Value) -> String {
    let r = &j["retry"];
    let mut pairs = vec![
        ("id", cell(&j["id"])),
        ("tenant", cell(&j["tenant"])),
        ("name", cell(&j["name"])),
        ("state", cell(&j["state"])),
        ("shard", cell(&j["shard"])),
        ("schedule", schedule(&j["schedule"])),
        ("target", target(&j["target"])),
        ("retry", retry(r)),
        ("timeout", cell(&j["timeout"])),
        ("overlap", cell(&j["overlap"])),
        (
            "catchup",
            format!(
                "{} within {}",
                cell(&j["catchup"]["policy"]),
                cell(&j["catchup"]["window"])
            ),
        ),
        ("priority", cell(&j["priority"])),
    ];
    if !j["payload"].is_null() {
        pairs.push(("payload", j["payload"].to_string()));
    }
    pairs.extend([
        ("created", cell(&j["created_at"])),
        ("updated", cell(&j["updated_at"])),
        ("next fires", list(&j["next_fire_times"])),
    ]);
    fields(&pairs)
}

/// One run (what `trigger` answers).
pub fn run(r: &Value) -> String {
    fields(&[
        ("job", cell(&r["job_id"])),
        ("scheduled", cell(&r["scheduled_at"])),
        ("status", cell(&r["status"])),
        ("attempts", cell(&r["attempts"])),
        ("tickets", list(&r["ticket_ids"])),
    ])
}

/// `GET /v1/jobs/{id}/runs`: a page of runs, newest first.
pub fn runs(page: &Value) -> String {
    let mut t = Table::new(&["SCHEDULED", "STATUS", "ATTEMPTS", "TICKETS", "REASON"]);
    for r in page["runs"].as_array().into_iter().flatten() {
        let mut reason = cut(&r["reason"], 60);
        if let (Some(n), Some(end)) = (r["count"].as_u64(), r["range_end"].as_str()) {
            reason = format!("{reason} ({n} until {end})");
        }
        t.row(vec![
            cell(&r["scheduled_at"]),
            cell(&r["status"]),
            cell(&r["attempts"]),
            cell(&r["ticket_ids"]),
            reason,
        ]);
    }
    t.render()
}

/// `GET /v1/workflows`: a page of workflows.
pub fn workflows(page: &Value) -> String {
    let mut t = Table::new(&[
        "ID", "TENANT", "NAME", "STATE", "SCHEDULE", "STEPS", "NEXT RUN",
    ]);
    for w in page["workflows"].as_array().into_iter().flatten() {
        t.row(vec![
            cell(&w["id"]),
            cell(&w["tenant"]),
            cut(&w["name"], 40),
            cell(&w["state"]),
            schedule(&w["schedule"]),
            w["steps"].as_array().map_or(0, Vec::len).to_string(),
            cell(&w["next_fire_times"][0]),
        ]);
    }
    t.render()
}

/// One workflow, a field a line, then its steps.
pub fn workflow(w: &Value) -> String {
    let mut out = fields(&[
        ("id", cell(&w["id"])),
        ("tenant", cell(&w["tenant"])),
        ("name", cell(&w["name"])),
        ("state", cell(&w["state"])),
        ("shard", cell(&w["shard"])),
        ("schedule", schedule(&w["schedule"])),
        ("fail fast", cell(&w["fail_fast"])),
        ("overlap", cell(&w["overlap"])),
        ("priority", cell(&w["priority"])),
        ("next runs", list(&w["next_fire_times"])),
    ]);
    let mut t = Table::new(&["STEP", "AFTER", "TARGET", "RETRY", "TIMEOUT"]);
    for s in w["steps"].as_array().into_iter().flatten() {
        t.row(vec![
            cell(&s["name"]),
            cell(&s["after"]),
            cut(&Value::String(target(&s["target"])), 60),
            retry(&s["retry"]),
            cell(&s["timeout"]),
        ]);
    }
    out.push('\n');
    out.push_str(&t.render());
    out
}

/// How many of a run's steps are in each state: `5 succeeded, 2 waiting`.
fn step_counts(run: &Value) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for s in run["steps"].as_array().into_iter().flatten() {
        let status = cell(&s["status"]);
        match counts.iter_mut().find(|(k, _)| *k == status) {
            Some((_, n)) => *n += 1,
            None => counts.push((status, 1)),
        }
    }
    let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    parts.join(", ")
}

/// `GET /v1/workflows/{id}/runs`: a page of runs, newest first.
pub fn workflow_runs(page: &Value) -> String {
    let mut t = Table::new(&["RUN", "SCHEDULED", "STATUS", "STEPS"]);
    for r in page["runs"].as_array().into_iter().flatten() {
        t.row(vec![
            cell(&r["run_id"]),
            cell(&r["scheduled_at"]),
            cell(&r["status"]),
            step_counts(r),
        ]);
    }
    t.render()
}

/// One workflow run: its fields, then a line per step.
pub fn workflow_run(r: &Value) -> String {
    let mut out = fields(&[
        ("run", cell(&r["run_id"])),
        ("workflow", cell(&r["workflow_id"])),
        ("scheduled", cell(&r["scheduled_at"])),
        ("status", cell(&r["status"])),
        ("steps", step_counts(r)),
    ]);
    let mut t = Table::new(&[
        "STEP", "STATUS", "ATTEMPTS", "TICKET", "STARTED", "FINISHED", "REASON",
    ]);
    for s in r["steps"].as_array().into_iter().flatten() {
        let last_error = s["attempts"]
            .as_array()
            .and_then(|a| a.last())
            .map_or(Value::Null, |a| a["error"].clone());
        let reason = if s["reason"].is_null() {
            last_error
        } else {
            s["reason"].clone()
        };
        t.row(vec![
            cell(&s["name"]),
            cell(&s["status"]),
            s["attempts"].as_array().map_or(0, Vec::len).to_string(),
            cell(&s["ticket_id"]),
            cell(&s["started_at"]),
            cell(&s["finished_at"]),
            cut(&reason, 60),
        ]);
    }
    out.push('\n');
    out.push_str(&t.render());
    out
}

/// One ticket and its attempts.
pub fn ticket(v: &Value) -> String {
    let mut out = fields(&[
        ("ticket", cell(&v["ticket_id"])),
        ("job", cell(&v["job_id"])),
        ("tenant", cell(&v["tenant"])),
        (
            "shard",
            format!("{} (epoch {})", cell(&v["shard"]), cell(&v["epoch"])),
        ),
        ("queue", cell(&v["queue"])),
        ("item", cell(&v["item"])),
        ("scheduled", cell(&v["scheduled_at"])),
        ("status", cell(&v["status"])),
        ("trace id", cell(&v["trace_id"])),
    ]);
    let mut t = Table::new(&[
        "ATTEMPT", "STATUS", "WORKER", "HTTP", "STARTED", "FINISHED", "ERROR",
    ]);
    for a in v["attempts"].as_array().into_iter().flatten() {
        t.row(vec![
            cell(&a["attempt"]),
            cell(&a["status"]),
            cell(&a["worker"]),
            cell(&a["http_status"]),
            cell(&a["started_at"]),
            cell(&a["finished_at"]),
            cut(&a["error"], 60),
        ]);
    }
    out.push('\n');
    out.push_str(&t.render());
    out
}

/// `GET /v1/dlq`: a page of dead letters, newest first.
pub fn dead_letters(page: &Value) -> String {
    let mut t = Table::new(&[
        "TICKET", "JOB", "TENANT", "QUEUE", "ATTEMPTS", "DEAD AT", "ERROR",
    ]);
    for d in page["items"].as_array().into_iter().flatten() {
        t.row(vec![
            cell(&d["ticket_id"]),
            cell(&d["job_id"]),
            cell(&d["tenant"]),
            cell(&d["queue"]),
            cell(&d["attempts"]),
            cell(&d["dead_at"]),
            cut(&d["error"], 60),
        ]);
    }
    t.render()
}

/// `GET /v1/schedule/preview`: the fire times.
pub fn preview(v: &Value) -> String {
    let mut t = Table::new(&["FIRE TIME"]);
    for f in v["fire_times"].as_array().into_iter().flatten() {
        t.row(vec![cell(f)]);
    }
    t.render()
}

/// `GET /v1/shards`: the shard map.
pub fn shards(v: &Value) -> String {
    let mut t = Table::new(&["SHARD", "OWNER", "EPOCH"]);
    for s in v["shards"].as_array().into_iter().flatten() {
        t.row(vec![
            cell(&s["shard"]),
            cell(&s["owner"]),
            cell(&s["epoch"]),
        ]);
    }
    let mut out = t.render();
    if let Some(g) = v.get("growth") {
        let from = g["from"].as_u64().unwrap_or(0);
        let sealed = g["sealed"].as_array().map_or(0, |a| a.len());
        out.push_str(&format!(
            "adding shards: {from} -> {}; {sealed} of {from} old shards done, {} tenants moved\n",
            cell(&v["shard_count"]),
            cell(&g["tenants_moved"]),
        ));
        if let Some(m) = g.get("moving") {
            out.push_str(&format!(
                "moving: {} from shard {} to {} ({})\n",
                m["tenants"].as_array().map_or(String::new(), |t| t
                    .iter()
                    .filter_map(|t| t.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")),
                cell(&m["source"]),
                cell(&m["target"]),
                cell(&m["phase"]),
            ));
        }
    }
    out
}

/// `GET /v1/nodes`: the shard nodes.
pub fn nodes(v: &Value) -> String {
    let mut t = Table::new(&[
        "NODE",
        "STATUS",
        "SHARDS",
        "ZONE",
        "IN FLIGHT",
        "CPU",
        "HEARTBEAT",
        "REASON",
    ]);
    for n in v["nodes"].as_array().into_iter().flatten() {
        t.row(vec![
            cell(&n["node_id"]),
            cell(&n["status"]),
            cell(&n["shards"]),
            cell(&n["zone"]),
            cell(&n["in_flight"]),
            n["cpu_cores"]
                .as_f64()
                .map_or_else(|| cell(&n["cpu_cores"]), |c| format!("{c:.2}")),
            seconds(&n["heartbeat_age_s"]),
            cut(&n["reason"], 60),
        ]);
    }
    t.render()
}

/// `GET /v1/workers`: the live workers.
pub fn workers(v: &Value) -> String {
    let mut t = Table::new(&["WORKER", "QUEUES", "IN FLIGHT", "HEARTBEAT"]);
    for w in v["workers"].as_array().into_iter().flatten() {
        t.row(vec![
            cell(&w["worker_id"]),
            cell(&w["queues"]),
            cell(&w["in_flight"]),
            seconds(&w["heartbeat_age_s"]),
        ]);
    }
    t.render()
}

/// `GET /v1/tokens`: ids, tenants, names and times; the API never sends a secret.
pub fn tokens(v: &Value) -> String {
    let mut t = Table::new(&["ID", "TENANT", "NAME", "CREATED", "EXPIRES"]);
    for k in v["tokens"].as_array().into_iter().flatten() {
        let tenant = if k["admin"] == true {
            "(admin)".to_string()
        } else {
            cell(&k["tenant"])
        };
        t.row(vec![
            cell(&k["id"]),
            tenant,
            cell(&k["name"]),
            cell(&k["created_at"]),
            cell(&k["expires_at"]),
        ]);
    }
    t.render()
}

/// `POST /v1/tokens`: the token on its own line first (what a script keeps), then its record.
pub fn created_token(v: &Value) -> String {
    let listed = tokens(&serde_json::json!({ "tokens": [v] }));
    format!(
        "{}\n\nshown this once: keep it now\n{listed}",
        cell(&v["token"])
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn tables_align_columns_and_show_absent_values_as_a_dash() {
        let mut t = Table::new(&["A", "LONGER", "C"]);
        t.row(vec!["wide cell".into(), "x".into(), "-".into()]);
        assert_eq!(t.render(), "A          LONGER  C\nwide cell  x       -\n");
        assert_eq!(cell(&Value::Null), "-");
        assert_eq!(cell(&json!(["a", "b"])), "a,b");
        assert_eq!(cut(&json!("abcdef"), 4), "abc…");
    }

    #[test]
    fn schedules_and_targets_read_in_a_few_words() {
        assert_eq!(
            schedule(&json!({"cron": "0 3 * * *", "timezone": "Europe/Berlin"})),
            "cron 0 3 * * * Europe/Berlin"
        );
        assert_eq!(schedule(&json!({"every": "30s"})), "every 30s");
        assert_eq!(schedule(&json!({"delay": "1m"})), "delay 1m");
        assert_eq!(
            target(&json!({"type": "http", "method": "GET", "url": "http://x"})),
            "http GET http://x"
        );
        assert_eq!(
            target(&json!({"type": "shell", "command": "echo", "args": ["a", "b"]})),
            "shell echo a b"
        );
        assert_eq!(target(&json!({"type": "queue", "queue": "q"})), "queue q");
    }
}
