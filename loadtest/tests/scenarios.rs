//! The `chronoshard-loadtest` binary end to end, each run starting its own platform from the
//! `chronoshard` binary (small sizes: these check that the tool measures and judges correctly;
//! the figures themselves come from the runs in BENCHMARKS.md).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

/// The `chronoshard` binary of this build (built here when this package is tested alone and it
/// is missing). Testing this package alone does not rebuild a `chronoshard` that exists: after
/// changing the platform, build it first (`cargo build -p chronoshard`). Building it here every
/// time was tried: the test process's environment differs from a shell's, and cargo rebuilt the
/// platform's crates on every alternation.
fn chronoshard() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_chronoshard-loadtest"));
    let path = exe.with_file_name("chronoshard");
    if !path.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "chronoshard", "--bin", "chronoshard"])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building chronoshard failed");
    }
    path
}

struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    report: Option<Value>,
    dir: Option<PathBuf>,
}

fn loadtest(out: &Path, args: &[&str]) -> Outcome {
    let bin = chronoshard();
    let o = Command::new(env!("CARGO_BIN_EXE_chronoshard-loadtest"))
        .args(args)
        .arg("--out")
        .arg(out)
        .arg("--chronoshard")
        .arg(&bin)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("chronoshard-loadtest runs");
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    let dir = std::fs::read_dir(out)
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.path());
    let report = dir
        .as_ref()
        .and_then(|d| std::fs::read_to_string(d.join("report.json")).ok())
        .map(|s| serde_json::from_str(&s).expect("report.json is JSON"));
    Outcome {
        code: o.status.code(),
        stdout,
        stderr,
        report,
        dir,
    }
}

fn ok(o: &Outcome) -> &Value {
    assert_eq!(
        o.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        o.stdout,
        o.stderr
    );
    o.report.as_ref().expect("a report.json")
}

fn assert_nothing_lost(r: &Value, expected: u64) {
    let c = &r["correctness"];
    assert_eq!(c["expected"], expected, "{c}");
    assert_eq!(c["executed"], expected, "{c}");
    assert_eq!(c["missed"], 0, "{c}");
    assert_eq!(c["reported_not_fired"], 0, "{c}");
    assert_eq!(c["occurrences_with_two_tickets"], 0, "{c}");
    assert_eq!(
        c["tickets_executed_twice"], c["executed_twice_after_worker_death"],
        "{c}"
    );
}

#[test]
fn spread_measures_every_phase_and_writes_both_reports() {
    let out = tempfile::tempdir().unwrap();
    let o = loadtest(
        out.path(),
        &[
            "spread",
            "--jobs",
            "300",
            "--window",
            "2s",
            "--create-rate",
            "600",
        ],
    );
    let r = ok(&o);
    // The report names the binary it measured, commit included.
    let version = r["platform"]["chronoshard_version"]
        .as_str()
        .unwrap_or_default();
    assert!(
        version.starts_with("chronoshard ") && version.ends_with(')'),
        "{version:?}"
    );
    assert_nothing_lost(r, 300);
    assert_eq!(r["scenario"], "spread");
    // What a wake-up costs here, measured before the platform started.
    let wake = &r["machine"]["wake"];
    let cpus = chronoshard_loadtest::machine::first_two_cpus().len();
    let measured: &[&str] = if cpus >= 2 {
        &["same_core", "cross_core"]
    } else {
        &["same_core"]
    };
    for part in measured {
        for figure in ["cpu_us", "wall_us"] {
            let v = wake[part][figure].as_f64();
            assert!(v.is_some_and(|v| v > 0.0), "{part}.{figure} in {wake}");
        }
    }
    assert_eq!(r["create"]["created"], 300);
    assert_eq!(r["fire"]["count"], 300);
    assert_eq!(r["start"]["count"], 300);
    assert_eq!(r["end_to_end"]["completed"], 300);
    // Every process that lived through the firing has its CPU per job, the platform's above 0.
    let per_job: Vec<(&str, f64)> = r["end_to_end"]["cpu_us_per_job"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["us"].as_f64().unwrap()))
        .collect();
    for p in ["chronoshard dev", "nats-server", "chronoshard-loadtest"] {
        assert!(per_job.iter().any(|(n, _)| *n == p), "{p} in {per_job:?}");
    }
    assert!(
        per_job
            .iter()
            .any(|(n, us)| *n == "chronoshard dev" && *us > 0.0),
        "{per_job:?}"
    );
    let fire = &r["fire"]["lateness_ms"];
    assert!(fire["p50"].as_f64().unwrap() <= fire["p99"].as_f64().unwrap());
    // Not `start >= fire`: the two are stamped by different observers (the watcher can see a
    // ticket after the worker started it when the watcher lags), so only each one's own order.
    let start = &r["start"]["lateness_ms"];
    assert!(start["p50"].as_f64().unwrap() <= start["p99"].as_f64().unwrap());
    let names: Vec<&str> = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for want in ["chronoshard dev", "nats-server", "chronoshard-loadtest"] {
        assert!(names.contains(&want), "{names:?}");
    }
    let buckets = r["timeline"]["buckets"].as_array().unwrap();
    let fired: u64 = buckets.iter().map(|b| b["fired"].as_u64().unwrap()).sum();
    assert_eq!(fired, 300);
    // The platform's own histograms over the run: every ticket published (the dev process holds
    // all the shards), every create, each with its shares at the bucket bounds.
    let server = r["server"].as_array().unwrap();
    let metric = |m: &str| {
        server
            .iter()
            .find(|v| v["metric"].as_str().unwrap().starts_with(m))
            .unwrap_or_else(|| panic!("no {m} in {server:?}"))
    };
    let fire_view = metric("chronoshard_fire_lateness_seconds");
    assert_eq!(fire_view["count"], 300, "{fire_view}");
    let send_view = metric("chronoshard_fire_send_lateness_seconds");
    assert_eq!(send_view["count"], 300, "{send_view}");
    let create_view = metric("chronoshard_http_request_duration_seconds{method=\"POST\"");
    assert_eq!(create_view["count"], 300, "{create_view}");
    for view in [fire_view, send_view, create_view] {
        let shares: Vec<f64> = view["within"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b[1].as_f64().unwrap())
            .collect();
        assert!(shares.windows(2).all(|w| w[0] <= w[1]), "{view}");
        assert!(
            shares[0] >= 0.0 && shares[shares.len() - 1] <= 1.0,
            "{view}"
        );
    }
    assert!(
        o.stdout.contains("  server   fire lateness"),
        "{}",
        o.stdout
    );
    let html = std::fs::read_to_string(o.dir.unwrap().join("report.html")).unwrap();
    assert!(html.contains("<svg") && !html.contains("<script src"));
    assert!(
        o.stdout.contains(
            "missed occurrences: 0 (0 never executed, 0 reported missed or skipped) (target 0) met"
        ),
        "{}",
        o.stdout
    );
}

#[test]
fn cron_fleet_owes_every_second_of_the_window() {
    let out = tempfile::tempdir().unwrap();
    let o = loadtest(
        out.path(),
        &[
            "cron-fleet",
            "--jobs",
            "20",
            "--window",
            "3s",
            "--tenants",
            "4",
        ],
    );
    let r = ok(&o);
    assert_nothing_lost(r, 60);
    assert!(r["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["what"] == "cron jobs deleted (0 owed occurrences had no ticket yet)"));
}

#[test]
fn burst_and_tenants_against_an_http_sink() {
    let out = tempfile::tempdir().unwrap();
    let o = loadtest(
        out.path(),
        &[
            "burst",
            "--jobs",
            "200",
            "--target",
            "http",
            "--tenants",
            "8",
        ],
    );
    let r = ok(&o);
    assert_nothing_lost(r, 200);
    assert_eq!(r["start"]["count"], 200);
    let out = tempfile::tempdir().unwrap();
    let o = loadtest(
        out.path(),
        &[
            "tenants",
            "--jobs",
            "200",
            "--tenants",
            "20",
            "--window",
            "1s",
        ],
    );
    let r = ok(&o);
    assert_nothing_lost(r, 200);
    let f = &r["fairness"];
    let counts = (f["big"]["count"].as_u64(), f["others"]["count"].as_u64());
    assert_eq!(counts, (Some(100), Some(100)), "{f}");
}

/// `--sharding time_window` starts a platform in that mode (its banner says so) and one
/// tenant's burst runs there as anywhere.
#[test]
fn a_burst_of_one_tenant_on_a_time_window_platform() {
    let out = tempfile::tempdir().unwrap();
    let o = loadtest(
        out.path(),
        &[
            "burst",
            "--jobs",
            "200",
            "--tenants",
            "1",
            "--sharding",
            "time_window",
        ],
    );
    let r = ok(&o);
    assert_nothing_lost(r, 200);
    assert_eq!(r["params"]["sharding"], "time_window");
    assert!(o.stdout.contains(", time_window sharding"), "{}", o.stdout);
    let dev = std::fs::read_to_string(o.dir.as_ref().unwrap().join("dev.log")).unwrap();
    assert!(dev.contains("shards: 8 (time_window sharding)"), "{dev}");
}

#[test]
fn fault_kills_a_node_and_a_worker_and_loses_nothing() {
    let out = tempfile::tempdir().unwrap();
    let o = loadtest(
        out.path(),
        &[
            "fault",
            "--jobs",
            "1200",
            "--window",
            "12s",
            "--create-rate",
            "600",
            "--worker-ack-wait",
            "4s",
            "--work",
            "200ms",
        ],
    );
    let r = ok(&o);
    assert_nothing_lost(r, 1200);
    // At 100 jobs/s lasting 200 ms each, about 20 are running when the worker is killed: each
    // is started again (attempt 2 after `interrupted`), and the check excuses exactly those.
    let c = &r["correctness"];
    assert!(
        c["executed_twice_after_worker_death"].as_u64().unwrap() >= 1,
        "{c}"
    );
    let events: Vec<&str> = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["what"].as_str().unwrap())
        .collect();
    assert!(
        events.iter().any(|e| e.starts_with("killed shard node")),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e.starts_with("killed worker")),
        "{events:?}"
    );
}

/// Shards added while jobs fire, and a node joining: nothing lost or doubled, the growth
/// recorded, and every fire and start in exactly one of the three phases.
#[test]
fn grow_adds_shards_and_a_node_and_loses_nothing() {
    let out = tempfile::tempdir().unwrap();
    let o = loadtest(
        out.path(),
        &[
            "grow",
            "--jobs",
            "2000",
            "--window",
            "8s",
            "--tenants",
            "20",
        ],
    );
    let r = ok(&o);
    assert_nothing_lost(r, 2000);
    assert_eq!(r["params"]["shards"], 4);
    let g = &r["growth"];
    assert_eq!(
        (&g["shards_from"], &g["shards_added"], &g["shards_after"]),
        (&4.into(), &4.into(), &8.into()),
        "{g}"
    );
    let (started, ended) = (g["started_s"].as_f64().unwrap(), g["ended_s"].as_f64());
    assert!(ended.is_some_and(|e| e > started), "{g}");
    assert!(g["duration_s"].as_f64().is_some_and(|d| d > 0.0), "{g}");
    assert!(
        g["node_joined_s"].as_f64().is_some_and(|t| t > started),
        "{g}"
    );
    // 20 tenants over 4 → 8 shards: some of them move.
    assert!(g["tenants_moved"].as_u64().unwrap() >= 1, "{g}");
    let phases = g["phases"].as_array().unwrap();
    let names: Vec<&str> = phases.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["before", "during", "after"]);
    for what in ["fire", "start"] {
        let total: u64 = phases
            .iter()
            .map(|p| p[what]["count"].as_u64().unwrap())
            .sum();
        assert_eq!(total, 2000, "{what} in {g}");
    }
    // At 30% of the window the growth begins: fires before it, at a rate.
    assert!(phases[0]["fire"]["count"].as_u64().unwrap() > 0, "{g}");
    assert!(phases[0]["fire"]["per_s"].as_f64().unwrap() > 0.0, "{g}");
    assert!(
        o.stdout.contains("  growth   4 + 4 → 8 shards"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("  during   "), "{}", o.stdout);
    let html = std::fs::read_to_string(o.dir.as_ref().unwrap().join("report.html")).unwrap();
    assert!(html.contains("<h2>Adding shards</h2>"));
}

#[test]
fn raw_measures_the_ceiling_on_its_own_nats_server() {
    let out = tempfile::tempdir().unwrap();
    let o = loadtest(out.path(), &["raw", "--count", "3000"]);
    let r = ok(&o);
    assert_eq!(r["raw"]["count"], 3000);
    assert!(r["raw"]["per_s"].as_f64().unwrap() > 0.0);
    // What a round trip cost: this tool and the nats-server it started.
    let cpu: Vec<&str> = r["raw"]["cpu_us_per_round_trip"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cpu, ["chronoshard-loadtest", "nats-server"]);
}

/// `grow --sharding time_window` is refused before anything starts: such a cluster moves jobs
/// only from a window after the run's.
#[test]
fn grow_on_a_time_window_platform_is_refused_at_once() {
    let out = tempfile::tempdir().unwrap();
    let o = loadtest(out.path(), &["grow", "--sharding", "time_window"]);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(o.stderr.contains("use --sharding tenant"), "{}", o.stderr);
    assert!(o.report.is_none());
}

#[test]
fn an_unreachable_platform_is_a_clear_error() {
    let out = tempfile::tempdir().unwrap();
    let o = loadtest(
        out.path(),
        &[
            "spread",
            "--url",
            "http://127.0.0.1:9",
            "--token",
            "t",
            "--nats",
            "nats://127.0.0.1:9",
        ],
    );
    assert_ne!(o.code, Some(0));
    assert!(o.stderr.contains("platform is ready"), "{}", o.stderr);
}

/// A SIGTERM to the tool mid-run (a CI timeout, `kill`) stops the platform and the workers it
/// started before it exits: none of them outlives it. (The default action of the signal would
/// end the tool alone and leave them running.)
#[test]
fn a_signal_stops_every_process_the_run_started() {
    use std::{
        io::{BufRead, BufReader},
        process::Stdio,
        time::{Duration, Instant},
    };

    let out = tempfile::tempdir().unwrap();
    let _cleanup = StopLeftovers(out.path().to_path_buf());
    let bin = chronoshard();
    let mut child = Command::new(env!("CARGO_BIN_EXE_chronoshard-loadtest"))
        .args(["spread", "--jobs", "3000", "--window", "60s"])
        .args(["--create-rate", "100", "--out"])
        .arg(out.path())
        .arg("--chronoshard")
        .arg(&bin)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chronoshard-loadtest runs");
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // By the create phase the platform, its nats-server and the no-op worker all run.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    while !seen
        .last()
        .is_some_and(|l: &String| l.contains("creating jobs"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(e) => panic!("no create phase ({e}): {seen:#?}"),
        }
    }
    let running = processes_naming(out.path());
    assert!(
        running.len() >= 4,
        "the tool, dev, nats-server and a worker: {running:#?}"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "still running 90 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "an interrupted run is not a success");
    // The reader ends with the pipe, once the tool has exited.
    let said: Vec<String> = lines.iter().collect();
    assert!(
        said.iter().any(|l| l.contains("interrupted by SIGTERM")),
        "{said:#?}"
    );
    let left = processes_naming(out.path());
    assert!(
        left.is_empty(),
        "still running after the tool exited: {left:#?}"
    );
}

/// Pids and command lines of the live processes that name `dir` (every process a run starts is
/// given a path inside its output directory).
fn processes_naming(dir: &Path) -> Vec<(i32, String)> {
    let needle = dir.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_string_lossy().parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&cmd).replace('\0', " ")))
        })
        .filter(|(_, c)| c.contains(&needle))
        .collect()
}

/// Stops whatever still names the directory when the test ends, so a failing run leaves no
/// platform behind on the machine.
struct StopLeftovers(PathBuf);

impl Drop for StopLeftovers {
    fn drop(&mut self) {
        for (pid, _) in processes_naming(&self.0) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
}
