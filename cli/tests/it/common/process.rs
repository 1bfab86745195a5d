//! `chronoshard` run as a separate process, as operators run it: its output lines collected as
//! they come, signals sent for real (SIGKILL, SIGSTOP, SIGTERM), killed on drop (its last lines
//! printed when the test failed).

use std::{
    io::{BufRead, BufReader, Read},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use serde_json::Value;

use super::{wait_for, LONG};

/// `chronoshard` with only the environment the test gives it (the machine's `CHRONOSHARD_*`,
/// `OTEL_*`, `RUST_LOG` and backtrace settings stay out).
pub fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_chronoshard"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("CHRONOSHARD_") || k.starts_with("OTEL_") {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    cmd
}

/// A `chronoshard` child process logging JSON lines.
pub struct Process {
    pub name: String,
    child: Child,
    out: Arc<Mutex<Vec<String>>>,
}

impl Process {
    /// Starts `chronoshard ARGS` as `name` (for messages).
    pub fn start(name: &str, args: &[&str]) -> Process {
        Process::start_with(name, args, &[])
    }

    pub fn start_with(name: &str, args: &[&str], env: &[(&str, &str)]) -> Process {
        let mut child = command(args)
            .env("CHRONOSHARD_LOG_JSON", "1")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = Arc::new(Mutex::new(Vec::new()));
        collect(child.stdout.take().unwrap(), out.clone());
        collect(child.stderr.take().unwrap(), out.clone());
        Process {
            name: name.to_string(),
            child,
            out,
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.out.lock().unwrap().clone()
    }

    /// Waits until a line contains `text`.
    pub async fn printed(&self, text: &str) {
        wait_for(
            &format!("{} to print {text:?}", self.name),
            LONG,
            || async { self.lines().iter().any(|l| l.contains(text)).then_some(()) },
        )
        .await
        .unwrap();
    }

    /// The `http://…/metrics` URL the process printed (`--metrics`), once it has.
    pub async fn metrics_url(&self) -> String {
        wait_for(
            &format!("{} to print its metrics URL", self.name),
            LONG,
            || async {
                self.lines().iter().find_map(|l| {
                    let at = l.find("http://")?;
                    let url = l[at..].split_whitespace().next()?;
                    url.ends_with("/metrics").then(|| url.to_string())
                })
            },
        )
        .await
        .unwrap()
    }

    /// Log records (JSON lines) whose message is `message`.
    pub fn records(&self, message: &str) -> Vec<Value> {
        self.lines()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["fields"]["message"] == message)
            .collect()
    }

    pub fn logged(&self, message: &str) -> usize {
        self.records(message).len()
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    pub fn signal(&self, s: Signal) {
        kill(self.pid(), s).unwrap();
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits for the process to exit and returns its exit code (None: ended by a signal).
    pub async fn exited(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {within:?}",
                self.name
            );
            // Polling a child's exit status with a deadline, as `wait_for` does.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL, and waits until it is gone.
    pub async fn kill9(&mut self) {
        self.signal(Signal::SIGKILL);
        assert_eq!(
            self.exited(LONG).await,
            None,
            "{} ended by SIGKILL",
            self.name
        );
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = kill(self.pid(), Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let lines = self.lines();
            eprintln!("--- last output of {} ---", self.name);
            for l in &lines[lines.len().saturating_sub(60)..] {
                eprintln!("{l}");
            }
        }
    }
}

fn collect(from: impl Read + Send + 'static, into: Arc<Mutex<Vec<String>>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            into.lock().unwrap().push(line);
        }
    });
}
