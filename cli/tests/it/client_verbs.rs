//! The client verbs of the built `chronoshard` binary, run as a separate process against a
//! platform started in this process: what they print (tables, JSON as the API sends it), their
//! exit codes, problem documents as one line on stderr, and where the URL and token come from
//! (flags, variables, the profiles file).

use std::{path::Path, time::Duration};

use crate::common::*;
use chronoshard::dev::Platform;
use serde_json::{json, Value};

/// What one run of the binary did.
#[derive(Debug)]
pub(crate) struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    /// Exit 0, or fail showing what it printed.
    pub fn ok(self) -> Out {
        assert_eq!(self.code, 0, "{self:?}");
        self
    }

    /// Failed with `code` and said why in one line on stderr, starting with `prefix`.
    pub fn failed(self, code: i32, prefix: &str) -> Out {
        assert_eq!(self.code, code, "{self:?}");
        assert_eq!(self.stderr.lines().count(), 1, "one line: {self:?}");
        assert!(self.stderr.starts_with(prefix), "{self:?}");
        assert!(self.stdout.is_empty(), "{self:?}");
        self
    }
}

/// Runs `chronoshard ARGS` with only `env` of the `CHRONOSHARD_*` variables, and a home whose
/// profiles file is `home/chronoshard/profiles.toml` (if written).
async fn run_in(home: &Path, env: &[(&str, &str)], args: &[&str], stdin: Option<&str>) -> Out {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_chronoshard"));
    for (k, _) in std::env::vars() {
        if k.starts_with("CHRONOSHARD_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HOME", home)
        .env("XDG_CONFIG_HOME", home)
        .envs(env.iter().copied())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("the binary starts");
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .await
        .unwrap();
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the binary exits within 60 s")
        .unwrap();
    Out {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// A runner with the platform's URL and token as flags.
pub(crate) struct Cli<'a> {
    p: &'a Platform,
    home: tempfile::TempDir,
}

impl Cli<'_> {
    pub fn new(p: &Platform) -> Cli<'_> {
        Cli {
            p,
            home: tempfile::tempdir().unwrap(),
        }
    }

    pub async fn run(&self, args: &[&str]) -> Out {
        self.run_stdin(args, None).await
    }

    async fn run_stdin(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let mut all = args.to_vec();
        all.extend(["--url", &self.p.url, "--token", &self.p.token]);
        run_in(self.home.path(), &[], &all, stdin).await
    }

    /// `ARGS -o json`, which must succeed; its JSON.
    pub async fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        self.run(&all).await.ok().json()
    }
}

pub(crate) const UNKNOWN: &str = "0190a0a0-0000-7000-8000-000000000000";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_are_created_listed_read_paused_resumed_triggered_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let cli = Cli::new(&p);
    let sink = HttpSink::start().await.unwrap();
    let id = create_by_flags(&cli, &sink.url("/hit")).await;
    create_from_files(&cli).await;
    list_in_pages(&cli).await;
    runs_and_tickets(&cli, &id).await;
    pause_resume_trigger_delete(&cli, &id).await;
    refusals(&cli).await;
    // the refused creates made nothing; the deleted job is no longer listed
    let left = cli.json(&["jobs", "list"]).await;
    let names: Vec<&str> = left["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["renamed", "from-toml"]);
    p.stop().await.unwrap();
}

/// A job with an HTTP target from flags only, created twice with one idempotency key; its id.
async fn create_by_flags(cli: &Cli<'_>, target: &str) -> String {
    let create = [
        "jobs",
        "create",
        "--tenant",
        "acme",
        "--name",
        "by-flags",
        "--every",
        "1s",
        "--target-url",
        target,
        "--method",
        "GET",
        "--header",
        "X-Test: 1",
        "--max-attempts",
        "2",
        "--priority",
        "7",
        "--idempotency-key",
        "k-1",
    ];
    let by_flags = cli.json(&create).await;
    assert_eq!(by_flags["schedule"]["every"], "1s", "{by_flags}");
    assert_eq!(
        by_flags["target"],
        json!({"type": "http", "url": target, "method": "GET", "headers": {"X-Test": "1"}})
    );
    assert_eq!(
        (
            by_flags["retry"]["max_attempts"].as_u64(),
            by_flags["priority"].as_u64()
        ),
        (Some(2), Some(7))
    );
    let id = by_flags["id"].as_str().unwrap().to_string();
    // the same idempotency key: the same job, said on stderr in a table
    let again = cli.run(&create).await.ok();
    assert!(again.stdout.contains(&id), "{again:?}");
    assert!(again.stderr.contains("idempotency key"), "{again:?}");
    id
}

/// A job from a JSON file with a flag overriding it, one from a TOML file on stdin.
async fn create_from_files(cli: &Cli<'_>) {
    let file = cli.home.path().join("job.json");
    std::fs::write(
        &file,
        json!({"tenant": "acme", "name": "from-json", "schedule": {"cron": "0 3 * * *",
            "timezone": "Europe/Berlin"}, "target": {"type": "queue", "queue": "reports"}})
        .to_string(),
    )
    .unwrap();
    let from_json = cli
        .json(&[
            "jobs",
            "create",
            "--file",
            file.to_str().unwrap(),
            "--name",
            "renamed",
        ])
        .await;
    assert_eq!(
        (
            from_json["name"].as_str(),
            from_json["schedule"]["timezone"].as_str()
        ),
        (Some("renamed"), Some("Europe/Berlin"))
    );
    let toml = "tenant = \"other\"\nname = \"from-toml\"\npayload = { n = 1 }\n\
        [schedule]\nat = 2099-01-01T00:00:00Z\n[target]\ntype = \"queue\"\nqueue = \"q\"\n";
    let out = cli
        .run_stdin(&["jobs", "create", "-f", "-", "-o", "json"], Some(toml))
        .await
        .ok();
    let from_toml = out.json();
    assert_eq!(from_toml["schedule"]["at"], "2099-01-01T00:00:00Z");
    assert_eq!(from_toml["payload"], json!({"n": 1}));
}

/// The three jobs as a table, as JSON, of one tenant, and in pages.
async fn list_in_pages(cli: &Cli<'_>) {
    let table = cli.run(&["jobs", "list"]).await.ok();
    let header = table.stdout.lines().next().unwrap();
    assert!(
        header.starts_with("ID") && header.contains("NEXT FIRE"),
        "{table:?}"
    );
    for name in ["by-flags", "renamed", "from-toml"] {
        assert!(table.stdout.contains(name), "{table:?}");
    }
    assert_eq!(table.stdout.lines().count(), 4, "{table:?}");
    let all = cli.json(&["jobs", "list"]).await;
    assert_eq!(all["jobs"].as_array().unwrap().len(), 3, "{all}");
    let other = cli.json(&["jobs", "list", "--tenant", "other"]).await;
    assert_eq!(other["jobs"].as_array().unwrap().len(), 1, "{other}");
    assert_eq!(other["jobs"][0]["name"], "from-toml");
    let first = cli.run(&["jobs", "list", "--limit", "2"]).await.ok();
    let cursor = first
        .stderr
        .trim()
        .strip_prefix("more: add --cursor ")
        .unwrap();
    let rest = cli
        .json(&["jobs", "list", "--limit", "2", "--cursor", cursor])
        .await;
    assert_eq!(rest["jobs"].as_array().unwrap().len(), 1, "{rest}");
    assert!(rest.get("next_cursor").is_none(), "{rest}");
}

/// The job that fires every second: itself, its runs, a ticket.
async fn runs_and_tickets(cli: &Cli<'_>, id: &str) {
    let got = cli.run(&["jobs", "get", id]).await.ok();
    assert!(
        got.stdout.contains("name:") && got.stdout.contains("by-flags"),
        "{got:?}"
    );
    assert_eq!(cli.json(&["jobs", "get", id]).await["id"], id);
    let run = wait_for("a succeeded run", LONG, || async {
        let page = cli.json(&["runs", id]).await;
        page["runs"]
            .as_array()?
            .iter()
            .find(|r| r["status"] == "succeeded")
            .cloned()
    })
    .await
    .unwrap();
    let runs = cli.run(&["runs", id, "--limit", "1"]).await.ok();
    assert!(runs.stdout.starts_with("SCHEDULED"), "{runs:?}");
    assert!(runs.stderr.starts_with("more: add --before "), "{runs:?}");
    let ticket_id = run["ticket_ids"][0].as_str().unwrap();
    let ticket = cli.json(&["tickets", "get", ticket_id]).await;
    assert_eq!(ticket["job_id"], id);
    assert_eq!(ticket["attempts"][0]["http_status"], 200, "{ticket}");
    let shown = cli.run(&["tickets", "get", ticket_id]).await.ok();
    assert!(
        shown.stdout.contains("ATTEMPT") && shown.stdout.contains("worker-"),
        "{shown:?}"
    );
}

/// Pause (twice: the second changes nothing), resume, trigger, delete; a deleted job is a
/// conflict for every change.
async fn pause_resume_trigger_delete(cli: &Cli<'_>, id: &str) {
    assert_eq!(cli.json(&["jobs", "pause", id]).await["state"], "paused");
    assert_eq!(cli.json(&["jobs", "pause", id]).await["state"], "paused");
    let resumed = cli.run(&["jobs", "resume", id]).await.ok();
    assert!(resumed.stdout.contains("active"), "{resumed:?}");
    let triggered = cli.json(&["jobs", "trigger", id]).await;
    assert_eq!(triggered["job_id"], id, "{triggered}");
    let deleted = cli.run(&["jobs", "delete", id]).await.ok();
    assert_eq!(deleted.stdout, format!("deleted job {id}\n"));
    assert_eq!(cli.json(&["jobs", "get", id]).await["state"], "deleted");
    cli.run(&["jobs", "delete", id, "-o", "json"])
        .await
        .failed(4, "error: 409 conflict: job is deleted");
    cli.run(&["jobs", "resume", id])
        .await
        .failed(4, "error: 409 conflict: job is deleted");
}

/// Not found, and bad input refused by the API and by the command line.
async fn refusals(cli: &Cli<'_>) {
    cli.run(&["jobs", "get", UNKNOWN])
        .await
        .failed(3, "error: 404 not_found: job not found");
    cli.run(&["runs", UNKNOWN]).await.failed(3, "error: 404");
    cli.run(&["tickets", "get", UNKNOWN])
        .await
        .failed(3, "error: 404 not_found: ticket not found");
    cli.run(&[
        "jobs",
        "create",
        "--tenant",
        "acme",
        "--name",
        "bad",
        "--cron",
        "0 25 * * *",
        "--queue",
        "q",
    ])
    .await
    .failed(
        2,
        "error: 400 invalid_field: schedule.cron: invalid cron expression",
    );
    cli.run(&[
        "jobs",
        "create",
        "--name",
        "no-tenant",
        "--delay",
        "1s",
        "--queue",
        "q",
    ])
    .await
    .failed(2, "error: 400 invalid_field: tenant");
    cli.run(&["jobs", "list", "--limit", "0"])
        .await
        .failed(2, "error: 400 invalid_field: limit: must be 1-500");
    cli.run(&["jobs", "create", "--payload", "{nope", "--queue", "q"])
        .await
        .failed(2, "error: --payload is not JSON");
    let usage = cli
        .run(&["jobs", "create", "--cron", "* * * * *", "--every", "1s"])
        .await;
    assert_eq!(usage.code, 2, "{usage:?}");
    assert!(usage.stderr.contains("cannot be used with"), "{usage:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letters_preview_and_the_cluster_views() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let cli = Cli::new(&p);
    dead_letters_listed_and_replayed(&cli).await;
    preview(&cli).await;
    cluster_views(&cli).await;
    tokens(&cli).await;
    p.stop().await.unwrap();
}

/// A tenant token made, listed, used and revoked with the verbs.
async fn tokens(cli: &Cli<'_>) {
    let made = cli
        .json(&["tokens", "create", "--tenant", "acme", "--name", "acme ci"])
        .await;
    let token = made["token"].as_str().unwrap().to_string();
    let id = made["id"].as_str().unwrap().to_string();
    assert_eq!(made["tenant"], "acme", "{made}");
    let usage = cli.run(&["tokens", "create"]).await;
    assert_eq!(usage.code, 2, "{usage:?}");
    assert!(usage.stderr.contains("--tenant"), "{usage:?}");
    cli.run(&["tokens", "create", "--tenant", "a b"])
        .await
        .failed(2, "error: 400 invalid_field");
    let table = cli.run(&["tokens", "list"]).await.ok();
    assert!(
        table.stdout.starts_with("ID") && table.stdout.contains("acme ci"),
        "{table:?}"
    );
    assert!(!table.stdout.contains(&token), "never the token: {table:?}");

    // As acme: its jobs, and no cluster view.
    let as_acme = Cli {
        p: cli.p,
        home: tempfile::tempdir().unwrap(),
    };
    let as_acme = |args: &'static [&'static str]| {
        let (url, token, home) = (
            cli.p.url.clone(),
            token.clone(),
            as_acme.home.path().to_path_buf(),
        );
        async move {
            let mut all = args.to_vec();
            all.extend(["--url", &url, "--token", &token]);
            run_in(&home, &[], &all, None).await
        }
    };
    let listed = as_acme(&["jobs", "list", "-o", "json"]).await.ok().json();
    assert!(
        listed["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["tenant"] == "acme"),
        "{listed}"
    );
    as_acme(&["nodes"]).await.failed(5, "error: 403 forbidden");

    let revoked = cli.run(&["tokens", "revoke", &id]).await.ok();
    assert_eq!(revoked.stdout, format!("revoked token {id}\n"));
    as_acme(&["jobs", "list"])
        .await
        .failed(5, "error: 401 unauthorized");
    cli.run(&["tokens", "revoke", &id])
        .await
        .failed(3, "error: 404 not_found");
}

/// A job whose only attempt fails is a dead letter; replayed against the fixed target, it
/// succeeds.
async fn dead_letters_listed_and_replayed(cli: &Cli<'_>) {
    let sink = HttpSink::start().await.unwrap();
    sink.respond_with(500);
    let job = cli
        .json(&[
            "jobs",
            "create",
            "--tenant",
            "acme",
            "--name",
            "failing",
            "--delay",
            "0s",
            "--target-url",
            &sink.url("/fail"),
            "--max-attempts",
            "1",
        ])
        .await;
    let job_id = job["id"].as_str().unwrap();
    let letter = wait_for("the dead letter", LONG, || async {
        let page = cli.json(&["dlq", "list", "--tenant", "acme"]).await;
        page["items"].as_array()?.first().cloned()
    })
    .await
    .unwrap();
    assert_eq!(letter["job_id"], job_id, "{letter}");
    let ticket_id = letter["ticket_id"].as_str().unwrap();
    let table = cli.run(&["dlq", "list"]).await.ok();
    assert!(table.stdout.starts_with("TICKET"), "{table:?}");
    assert!(
        table.stdout.contains(ticket_id) && table.stdout.contains("500"),
        "{table:?}"
    );
    let none = cli.json(&["dlq", "list", "--tenant", "other"]).await;
    assert_eq!(none["items"], json!([]));

    // replayed against a fixed target: it succeeds, and a second replay is a conflict
    sink.respond_with(200);
    let replayed = cli.run(&["dlq", "replay", ticket_id]).await.ok();
    assert!(replayed.stdout.contains(ticket_id), "{replayed:?}");
    wait_for("the replay to succeed", LONG, || async {
        let t = cli.json(&["tickets", "get", ticket_id]).await;
        (t["status"] == "succeeded").then_some(())
    })
    .await
    .unwrap();
    cli.run(&["dlq", "replay", ticket_id])
        .await
        .failed(4, "error: 409 conflict:");
    cli.run(&["dlq", "replay", UNKNOWN])
        .await
        .failed(3, "error: 404 not_found:");
    cli.run(&["dlq", "list", "--cursor", "nonsense"])
        .await
        .failed(2, "error: 400 invalid_field: cursor:");
}

/// The spring-forward gap in Berlin, as README's tour shows it; an interval; a bad expression.
async fn preview(cli: &Cli<'_>) {
    let preview = [
        "preview",
        "--cron",
        "0 30 2 * * *",
        "--tz",
        "Europe/Berlin",
        "--after",
        "2026-03-28T00:00:00Z",
        "--count",
        "3",
    ];
    assert_eq!(
        cli.json(&preview).await,
        json!({"fire_times": ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]})
    );
    let table = cli.run(&preview).await.ok();
    assert_eq!(
        table.stdout,
        "FIRE TIME\n2026-03-28T01:30:00Z\n2026-03-29T01:00:00Z\n2026-03-30T00:30:00Z\n"
    );
    let every = cli
        .json(&[
            "preview",
            "--every",
            "90s",
            "--start-at",
            "2026-01-01T00:00:00Z",
            "--after",
            "2026-01-01T00:00:00Z",
            "--count",
            "2",
        ])
        .await;
    assert_eq!(every["fire_times"][1], "2026-01-01T00:03:00Z", "{every}");
    cli.run(&["preview", "--cron", "0 25 * * *"])
        .await
        .failed(2, "error: 400 invalid_field: cron:");
}

/// 8 shards on 2 nodes, one worker.
async fn cluster_views(cli: &Cli<'_>) {
    let shards = cli.json(&["shards"]).await;
    assert_eq!(shards["shards"].as_array().unwrap().len(), 8, "{shards}");
    let table = cli.run(&["shards"]).await.ok();
    assert!(
        table.stdout.starts_with("SHARD") && table.stdout.lines().count() == 9,
        "{table:?}"
    );
    let nodes = cli.json(&["nodes"]).await;
    assert_eq!(nodes["nodes"].as_array().unwrap().len(), 2, "{nodes}");
    let table = cli.run(&["nodes"]).await.ok();
    assert!(
        table.stdout.starts_with("NODE") && table.stdout.contains("live"),
        "{table:?}"
    );
    let workers = wait_for("the worker's heartbeat", LONG, || async {
        let w = cli.json(&["workers"]).await;
        (!w["workers"].as_array()?.is_empty()).then_some(w)
    })
    .await
    .unwrap();
    assert_eq!(workers["workers"][0]["worker_id"], "worker-1", "{workers}");
    let table = cli.run(&["workers"]).await.ok();
    assert!(
        table.stdout.starts_with("WORKER") && table.stdout.contains("worker-1"),
        "{table:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn url_and_token_come_from_flags_variables_or_a_profile_in_that_order() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    // an address where nothing listens
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let dead = dead.as_str();
    variables_and_profiles(home, &p, dead).await;
    flags_beat_variables_and_tokens_stay_secret(home, &p, dead).await;
    p.stop().await.unwrap();
}

/// Variables alone; the profiles file, its profiles named by flag or variable; variables beat it.
async fn variables_and_profiles(home: &Path, p: &Platform, dead: &str) {
    let (url, token) = (p.url.as_str(), p.token.as_str());
    let shards = ["shards", "-o", "json"];
    // variables alone
    let out = run_in(
        home,
        &[("CHRONOSHARD_URL", url), ("CHRONOSHARD_TOKEN", token)],
        &shards,
        None,
    )
    .await
    .ok();
    assert_eq!(out.json()["shard_count"], 8);

    // the default profile of $XDG_CONFIG_HOME/chronoshard/profiles.toml
    std::fs::create_dir_all(home.join("chronoshard")).unwrap();
    std::fs::write(
        home.join("chronoshard/profiles.toml"),
        format!(
            "[default]\nurl = \"{url}\"\ntoken = \"{token}\"\n\n\
             [dead]\nurl = \"{dead}\"\ntoken = \"{token}\"\n\n\
             [wrong]\nurl = \"{url}\"\ntoken = \"wrong-secret\"\n"
        ),
    )
    .unwrap();
    run_in(home, &[], &shards, None).await.ok();
    // without XDG_CONFIG_HOME: ~/.config/chronoshard/profiles.toml
    let dot_config = home.join(".config/chronoshard");
    std::fs::create_dir_all(&dot_config).unwrap();
    std::fs::write(
        dot_config.join("profiles.toml"),
        format!("[default]\nurl = \"{dead}\"\n"),
    )
    .unwrap();
    run_in(home, &[("XDG_CONFIG_HOME", "")], &shards, None)
        .await
        .failed(6, &format!("error: cannot reach {dead}: "));
    // a named profile, by flag and by variable
    run_in(home, &[], &["shards", "--profile", "dead"], None)
        .await
        .failed(6, &format!("error: cannot reach {dead}: "));
    let out = run_in(home, &[("CHRONOSHARD_PROFILE", "wrong")], &shards, None)
        .await
        .failed(
            5,
            "error: 401 unauthorized: a valid bearer token is required",
        );
    assert!(!out.stderr.contains("wrong-secret"), "{out:?}");
    run_in(home, &[], &["shards", "--profile", "nope"], None)
        .await
        .failed(2, "error: profile \"nope\" is not in ");

    // a variable beats the profile, a flag beats the variable
    run_in(
        home,
        &[("CHRONOSHARD_PROFILE", "dead"), ("CHRONOSHARD_URL", url)],
        &shards,
        None,
    )
    .await
    .ok();
}

/// A flag beats its variable (and the profile); the token is never shown; other files.
async fn flags_beat_variables_and_tokens_stay_secret(home: &Path, p: &Platform, dead: &str) {
    let (url, token) = (p.url.as_str(), p.token.as_str());
    let out = run_in(
        home,
        &[("CHRONOSHARD_URL", dead)],
        &["shards", "--url", url],
        None,
    )
    .await
    .ok();
    assert!(out.stdout.starts_with("SHARD"), "{out:?}");
    // a wrong token given as a flag beats the right one in a variable; it is never printed
    let out = run_in(
        home,
        &[("CHRONOSHARD_TOKEN", token)],
        &["nodes", "--token", "flag-secret"],
        None,
    )
    .await
    .failed(5, "error: 401 unauthorized:");
    assert!(!out.stderr.contains("flag-secret"), "{out:?}");

    // --profiles names another file
    let other = home.join("other.toml");
    std::fs::write(&other, format!("[default]\nurl = \"{dead}\"\n")).unwrap();
    run_in(
        home,
        &[],
        &["workers", "--profiles", other.to_str().unwrap()],
        None,
    )
    .await
    .failed(6, "error: cannot reach");
    run_in(
        home,
        &[],
        &["workers", "--profiles", "/nonexistent/profiles.toml"],
        None,
    )
    .await
    .failed(2, "error: cannot read the profiles file");
    // a server that takes the connection and never answers
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = format!("http://{}", silent.local_addr().unwrap());
    let args = ["shards", "--url", &silent, "--request-timeout", "300ms"];
    run_in(home, &[], &args, None).await.failed(
        6,
        &format!("error: cannot reach {silent}: no answer in time"),
    );
    run_in(home, &[], &["shards", "--url", "not a url"], None)
        .await
        .failed(2, "error: --url");

    // the help shows the variables, never a token's value
    let help = run_in(
        home,
        &[("CHRONOSHARD_TOKEN", "env-secret")],
        &["jobs", "list", "--help"],
        None,
    )
    .await
    .ok();
    assert!(help.stdout.contains("CHRONOSHARD_TOKEN"), "{help:?}");
    assert!(!help.stdout.contains("env-secret"), "{help:?}");
    // nor do the roles that read the same variable
    for role in ["dev", "control-plane"] {
        let help = run_in(
            home,
            &[("CHRONOSHARD_TOKEN", "env-secret")],
            &[role, "--help"],
            None,
        )
        .await
        .ok();
        assert!(help.stdout.contains("CHRONOSHARD_TOKEN"), "{help:?}");
        assert!(!help.stdout.contains("env-secret"), "{role}: {help:?}");
    }
}
