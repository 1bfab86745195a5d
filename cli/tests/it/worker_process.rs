//! The `chronoshard worker` process as an operator runs it, against a dev platform's NATS: a
//! `kill -9` mid-run and a restart on the same journal (the attempt is not run twice), a SIGTERM
//! drain (in-flight work finishes and reports, unfinished work goes to another worker, exit 0),
//! the SSRF guard and the shell limits, and a replaced execution's process group killed.

use std::{
    path::Path,
    process::{Child, Command},
    time::Duration,
};

use crate::common::*;
use chronoshard::dev::Platform;
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use serde_json::{json, Value};

struct WorkerProcess {
    child: Child,
    /// Where its standard output goes (the metrics URL it prints, with `--metrics`).
    out: std::path::PathBuf,
}

impl WorkerProcess {
    fn start(p: &Platform, data: &Path, id: &str, extra: &[&str]) -> WorkerProcess {
        let log = std::fs::File::create(data.join(format!("{id}.log"))).unwrap();
        let out = data.join(format!("{id}.out"));
        let child = Command::new(env!("CARGO_BIN_EXE_chronoshard"))
            .args(["worker", "--nats", &p.nats_url, "--id", id, "--data"])
            .arg(data)
            .args(extra)
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        WorkerProcess { child, out }
    }

    /// The text of its `/metrics` (started with `--metrics 127.0.0.1:0`).
    async fn metrics(&self) -> String {
        let url = wait_for("the worker to print its metrics URL", LONG, || async {
            let out = std::fs::read_to_string(&self.out).ok()?;
            let at = out.find("http://")?;
            Some(out[at..].split_whitespace().next()?.to_string())
        })
        .await
        .unwrap();
        reqwest::get(&url).await.unwrap().text().await.unwrap()
    }

    fn signal(&self, s: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), s).unwrap();
    }

    /// Waits for the process to exit and returns its exit code.
    async fn exited(&mut self, within: Duration) -> Option<i32> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the worker process did not exit within {within:?}"
            );
            // Polling a child's exit status with a deadline, as `wait_for` does.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn shell_job(name: &str, script: &str, extra: Value) -> Value {
    let mut job = json!({"tenant": "ops", "name": name, "schedule": {"delay": "0s"},
        "target": {"type": "shell", "command": "sh", "args": ["-c", script]},
        "timeout": "120s", "retry": {"max_attempts": 2, "backoff": "fixed", "initial": "100ms"}});
    for (k, v) in extra.as_object().unwrap() {
        job[k] = v.clone();
    }
    job
}

async fn file_text(path: &Path, what: &str) -> String {
    wait_for(what, LONG, || async {
        std::fs::read_to_string(path)
            .ok()
            .filter(|t| t.ends_with('\n'))
    })
    .await
    .unwrap()
}

fn path_str(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

const SHELL: [&str; 3] = ["--shell", "--shell-allow", "sh"];

/// A platform with no workers of its own, and worker `w-a` (data under `dir/w`) killed with
/// `kill -9` while it runs attempt 1 of a shell job whose every execution appends its attempt
/// number to `dir/runs` (the command it left behind is ended too).
async fn killed_mid_run(dir: &Path) -> (Platform, Api, String) {
    let p = platform_with(dir, |o| o.workers = 0).await;
    let api = Api::new(&p);
    let data = dir.join("w");
    std::fs::create_dir_all(&data).unwrap();
    let (runs, pid) = (dir.join("runs"), dir.join("pid"));
    let mut a = WorkerProcess::start(&p, &data, "w-a", &SHELL);
    let script = format!(
        "echo $CHRONOSHARD_ATTEMPT >> {runs}; if [ $CHRONOSHARD_ATTEMPT = 1 ]; then echo $$ > {pid}; exec sleep 600; fi",
        runs = path_str(&runs),
        pid = path_str(&pid),
    );
    let job = api.create(&shell_job("long", &script, json!({}))).await;
    assert_eq!(file_text(&runs, "attempt 1 to start").await, "1\n");
    // Killed once the shard knows the attempt started (the worker reports a start after the
    // execution ran for its start-report delay): before that, another worker would simply run
    // the attempt.
    api.ticket_of_run(&job, "running").await;
    a.signal(Signal::SIGKILL);
    a.exited(LONG).await;
    let sleeper: i32 = file_text(&pid, "the pid").await.trim().parse().unwrap();
    let _ = kill(Pid::from_raw(sleeper), Signal::SIGKILL);
    (p, api, job)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_mid_run_does_not_run_the_attempt_again_after_its_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (p, api, job) = killed_mid_run(dir.path()).await;
    // Restarted on the same journal, it gets the delivery again after the ack wait (30 s): it
    // reports the attempt interrupted instead of running it, and the retry runs.
    let mut flags = SHELL.to_vec();
    flags.extend(["--metrics", "127.0.0.1:0"]);
    let worker = WorkerProcess::start(&p, &dir.path().join("w"), "w-a", &flags);
    let t = api.ticket_of_run(&job, "succeeded").await;
    let attempts = t["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{t}");
    assert!(
        attempts[0]["error"]
            .as_str()
            .unwrap()
            .starts_with("interrupted: worker w-a stopped while running this attempt"),
        "{t}"
    );
    assert_eq!(attempts[1]["status"], "succeeded", "{t}");
    assert_eq!(attempts[1]["worker"], "w-a", "{t}");
    let runs = std::fs::read_to_string(dir.path().join("runs")).unwrap();
    assert_eq!(runs, "1\n2\n", "each attempt ran once");
    let metrics = worker.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("chronoshard_worker_not_run_again_total")
                && l.contains(r#"seen="interrupted""#)
                && l.ends_with(" 1")),
        "{metrics}"
    );
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_worker_takes_over_from_one_killed_mid_run_and_the_run_shows_both_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let (p, api, job) = killed_mid_run(dir.path()).await;
    // w-b starts after w-a took the ticket, so only a redelivery can bring it to w-b. After the
    // ack wait (30 s) it does; the shard says w-a started the attempt and never finished it, so
    // w-b reports it lost instead of running it, and the retry runs on w-b.
    let _b = WorkerProcess::start(&p, &dir.path().join("w"), "w-b", &SHELL);
    let t = api.ticket_of_run(&job, "succeeded").await;
    let attempts = t["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{t}");
    assert_eq!(
        attempts[0]["error"],
        "lost: worker w-a stopped while running this attempt (delivered again to w-b)",
        "{t}"
    );
    assert_eq!(attempts[1]["status"], "succeeded", "{t}");
    assert_eq!(attempts[1]["worker"], "w-b", "{t}");
    let (_, runs_page) = api.get(&format!("/v1/jobs/{job}/runs")).await;
    assert_eq!(runs_page["runs"][0]["attempts"], 2, "{runs_page}");
    let runs = std::fs::read_to_string(dir.path().join("runs")).unwrap();
    assert_eq!(runs, "1\n2\n", "each attempt ran once");
    p.stop().await.unwrap();
}

/// Overlap `replace`: the shard tells the worker to stop the replaced execution, and the worker
/// kills its process group.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replaced_shell_execution_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let data = dir.path().join("w");
    std::fs::create_dir_all(&data).unwrap();
    let _worker = WorkerProcess::start(&p, &data, "w-r", &SHELL);
    let pids = dir.path().join("pids");
    let script = format!("echo $$ >> {}; exec sleep 600", path_str(&pids));
    let extra = json!({"schedule": {"every": "3s"}, "overlap": "replace"});
    let job = api.create(&shell_job("replaced", &script, extra)).await;
    // The second execution starts while the first still sleeps.
    let first: i32 = wait_for("a second execution", LONG, || async {
        let text = std::fs::read_to_string(&pids).ok()?;
        let lines: Vec<&str> = text.lines().collect();
        (lines.len() >= 2).then(|| lines[0].parse().unwrap())
    })
    .await
    .unwrap();
    // The first one's process is gone long before its ten minutes.
    wait_for("the replaced execution to be killed", LONG, || async {
        kill(Pid::from_raw(first), None).is_err().then_some(())
    })
    .await
    .unwrap();
    let (status, body) = api.post(&format!("/v1/jobs/{job}/pause"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    crate::overlap::first_run_cancelled(&api, &job, "w-r").await;
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_a_worker_finished_work_reports_and_unfinished_work_moves_on() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let data = dir.path().join("w");
    std::fs::create_dir_all(&data).unwrap();
    let go = dir.path().join("go");
    let began = dir.path().join("began");

    // Within the grace: the running command finishes after the SIGTERM and its result counts.
    let mut a = WorkerProcess::start(
        &p,
        &data,
        "w-drain",
        &[&SHELL[..], &["--drain-grace", "60s"]].concat(),
    );
    let script = format!(
        "echo x > {began}; while [ ! -e {go} ]; do sleep 0.05; done; echo finished",
        began = path_str(&began),
        go = path_str(&go),
    );
    let job = api
        .create(&shell_job("finishing", &script, json!({})))
        .await;
    file_text(&began, "the command to begin").await;
    a.signal(Signal::SIGTERM);
    std::fs::write(&go, "").unwrap();
    assert_eq!(a.exited(LONG).await, Some(0));
    let t = api.ticket_of_run(&job, "succeeded").await;
    assert_eq!(t["attempts"][0]["output"], "finished\n", "{t}");
    let cluster =
        chronoshard_cluster::Cluster::connect(async_nats::connect(&p.nats_url).await.unwrap())
            .await
            .unwrap();
    let live = cluster.live_workers().await.unwrap();
    assert!(
        live.iter().all(|w| w.worker_id != "w-drain"),
        "a drained worker leaves the registry: {live:?}"
    );

    // Past the grace: the command is stopped, the delivery goes back, another worker runs it.
    let marker = dir.path().join("marker");
    let mut b = WorkerProcess::start(
        &p,
        &data,
        "w-short",
        &[&SHELL[..], &["--drain-grace", "1s"]].concat(),
    );
    let script = format!(
        "if [ -e {m} ]; then echo second; exit 0; fi; echo x > {m}; exec sleep 600",
        m = path_str(&marker)
    );
    let job = api
        .create(&shell_job("unfinished", &script, json!({})))
        .await;
    file_text(&marker, "the command to begin").await;
    b.signal(Signal::SIGTERM);
    assert_eq!(b.exited(LONG).await, Some(0));
    let _c = WorkerProcess::start(&p, &data, "w-next", &SHELL);
    let t = api.ticket_of_run(&job, "succeeded").await;
    let attempts = t["attempts"].as_array().unwrap();
    assert_eq!(
        attempts.len(),
        1,
        "the same attempt, run by another worker: {t}"
    );
    assert_eq!(attempts[0]["worker"], "w-next", "{t}");
    assert_eq!(attempts[0]["output"], "second\n", "{t}");
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_refuses_private_targets_and_kills_commands_past_their_limits() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let sink = HttpSink::start().await.unwrap();
    let data = dir.path().join("w");
    std::fs::create_dir_all(&data).unwrap();
    let _w = WorkerProcess::start(
        &p,
        &data,
        "w-guard",
        &["--shell", "--shell-allow", "sh", "--shell-cpu-seconds", "1"],
    );

    let ssrf = api
        .create(
            &json!({"tenant": "ops", "name": "ssrf", "schedule": {"delay": "0s"},
            "target": {"type": "http", "url": sink.url("/internal"), "method": "POST"},
            "retry": {"max_attempts": 1}}),
        )
        .await;
    let t = api.ticket_of_run(&ssrf, "dead").await;
    let error = t["attempts"][0]["error"].as_str().unwrap();
    assert!(error.starts_with("refused: 127.0.0.1"), "{t}");
    assert!(sink.requests().is_empty(), "the sink was not called");

    let busy = api
        .create(&shell_job(
            "busy",
            "echo spinning; while :; do :; done",
            json!({"retry": {"max_attempts": 1}}),
        ))
        .await;
    let t = api.ticket_of_run(&busy, "dead").await;
    assert_eq!(
        t["attempts"][0]["error"], "killed by SIGXCPU (CPU time limit)",
        "{t}"
    );
    assert_eq!(t["attempts"][0]["output"], "spinning\n", "{t}");
    p.stop().await.unwrap();
}

/// A worker run alone serves its own metrics with `--metrics`: its executions show there. An
/// address it cannot listen on stops it at once with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_serves_its_metrics_at_its_metrics_address() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| o.workers = 0).await;
    let api = Api::new(&p);
    let data = dir.path().join("w");
    let data = data.to_str().unwrap();
    let worker = process::Process::start(
        "w-m",
        &[
            &[
                "worker",
                "--nats",
                &p.nats_url,
                "--id",
                "w-m",
                "--data",
                data,
            ],
            &SHELL[..],
            &["--metrics", "127.0.0.1:0"],
        ]
        .concat(),
    );
    let metrics = worker.metrics_url().await;
    let job = api
        .create(&shell_job("metered", "echo metered", json!({})))
        .await;
    api.ticket_of_run(&job, "succeeded").await;
    wait_for("the execution in the worker's metrics", LONG, || async {
        let text = reqwest::get(&metrics).await.ok()?.text().await.ok()?;
        text.lines()
            .any(|l| {
                l.starts_with("chronoshard_worker_executions_total{")
                    && l.contains("queue=\"shell\"")
                    && l.ends_with(" 1")
            })
            .then_some(())
    })
    .await
    .unwrap();

    // The same address again: taken.
    let taken = metrics
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_chronoshard"))
        .args([
            "worker",
            "--nats",
            &p.nats_url,
            "--id",
            "w-n",
            "--data",
            data,
        ])
        .args(["--metrics", &taken])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&format!("--metrics {taken}: cannot listen there")),
        "{said}"
    );
    p.stop().await.unwrap();
}
