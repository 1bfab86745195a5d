//! The platform under test and the processes this run manages: either a platform already running
//! (`--url`, `--token`, `--nats`) or one started here from the `chronoshard` binary
//! (`chronoshard dev`, plus separate `chronoshard shard-node` processes that the `fault` scenario
//! can kill and the `grow` scenario adds to), and the no-op worker processes. It starts, kills (SIGKILL) and stops processes; it
//! does not measure anything.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{bail, Context};
use chronoshard_wire::rpc::Sharding;
use nix::{sys::signal::Signal, unistd::Pid};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    process::{Child, Command},
};

use crate::probe::{noop::NoopWorkerArgs, procs::Watched};

/// How to start a platform.
#[derive(Clone, Debug)]
pub struct SpawnOptions {
    /// The `chronoshard` binary.
    pub chronoshard: PathBuf,
    /// Everything of this run goes under here (data dirs, logs).
    pub dir: PathBuf,
    /// Shard nodes inside `chronoshard dev`.
    pub dev_nodes: usize,
    /// Shard nodes as their own `chronoshard shard-node` processes (killable).
    pub node_processes: usize,
    /// `chronoshard dev`'s own workers (they execute `http` targets).
    pub dev_workers: usize,
    pub shards: u32,
    pub sharding: Sharding,
}

/// A managed child process.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    pub child: Child,
    /// What it was started with, to start it again after a kill.
    cmd: Vec<String>,
    log: PathBuf,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }
}

#[derive(Debug)]
pub struct Platform {
    pub url: String,
    pub token: String,
    pub nats_url: String,
    pub nats_version: String,
    /// `chronoshard --version` of the binary this run started (it names the commit); empty for
    /// a platform given with `--url`.
    pub chronoshard_version: String,
    pub spawned: bool,
    pub shard_nodes: usize,
    dev: Option<Proc>,
    pub nodes: Vec<Proc>,
    pub workers: Vec<Proc>,
    pub watched: Watched,
    dir: PathBuf,
    /// The `chronoshard` binary and the dev platform's data directory, to start more shard
    /// nodes (a platform this run started only).
    node_from: Option<(PathBuf, PathBuf)>,
}

impl Platform {
    /// A platform someone else runs. Only the workers this run starts are its own.
    pub fn external(url: &str, token: &str, nats_url: &str, dir: &Path) -> Platform {
        Platform {
            url: url.trim_end_matches('/').to_string(),
            token: token.to_string(),
            nats_url: nats_url.to_string(),
            nats_version: String::new(),
            chronoshard_version: String::new(),
            spawned: false,
            shard_nodes: 0,
            dev: None,
            nodes: Vec::new(),
            workers: Vec::new(),
            watched: Watched::default(),
            dir: dir.to_path_buf(),
            node_from: None,
        }
    }

    /// Starts `chronoshard dev` (and the node processes) and waits until it is ready.
    pub async fn spawn(opts: &SpawnOptions) -> anyhow::Result<Platform> {
        std::fs::create_dir_all(&opts.dir)?;
        let data = opts.dir.join("platform");
        let cmd = vec![
            "dev".to_string(),
            "--data".into(),
            data.display().to_string(),
            "--http".into(),
            "127.0.0.1:0".into(),
            "--shard-nodes".into(),
            opts.dev_nodes.to_string(),
            "--workers".into(),
            opts.dev_workers.to_string(),
            "--shards".into(),
            opts.shards.to_string(),
            "--sharding".into(),
            opts.sharding.to_string(),
            "--token".into(),
            "loadtest-admin".into(),
        ];
        let (dev, lines) = start(
            &opts.chronoshard,
            "chronoshard dev",
            cmd,
            &opts.dir.join("dev.log"),
            "press Ctrl-C to stop",
            Duration::from_secs(90),
        )
        .await?;
        let field = |key: &str| {
            lines
                .iter()
                .find_map(|l| l.trim().strip_prefix(key).map(|v| v.trim().to_string()))
                .with_context(|| format!("`chronoshard dev` did not print `{key}`"))
        };
        let url = field("url:")?;
        let token = field("token:")?;
        // `nats:   nats://127.0.0.1:4222 (nats-server 2.15.1)`
        let nats = field("nats:")?;
        let (nats_url, version) = nats.split_once(' ').unwrap_or((&nats, ""));
        let mut platform = Platform {
            url,
            token,
            nats_url: nats_url.to_string(),
            nats_version: version
                .trim_matches(|c| c == '(' || c == ')')
                .trim_start_matches("nats-server ")
                .to_string(),
            chronoshard_version: binary_version(&opts.chronoshard).await,
            spawned: true,
            shard_nodes: opts.dev_nodes + opts.node_processes,
            dev: None,
            nodes: Vec::new(),
            workers: Vec::new(),
            watched: Watched::default(),
            dir: opts.dir.clone(),
            node_from: Some((opts.chronoshard.clone(), data.clone())),
        };
        platform.watch("chronoshard dev", dev.pid());
        for (name, pid) in crate::probe::procs::children(dev.pid()) {
            platform.watch(&name, pid);
        }
        platform.dev = Some(dev);
        if let Err(e) = platform.start_nodes(opts, &data).await {
            // Stopped, not dropped: a SIGKILLed `chronoshard dev` would leave its nats-server.
            platform.stop().await;
            return Err(e);
        }
        Ok(platform)
    }

    async fn start_nodes(&mut self, opts: &SpawnOptions, data: &Path) -> anyhow::Result<()> {
        for _ in 0..opts.node_processes {
            self.start_node(&opts.chronoshard, data).await?;
        }
        Ok(())
    }

    /// Starts one more `chronoshard shard-node` process (`lt-node-<n>`) on the platform's NATS
    /// and data, and waits until it is ready; the leader then gives it shards. Its name.
    async fn start_node(&mut self, chronoshard: &Path, data: &Path) -> anyhow::Result<String> {
        let id = format!("lt-node-{}", self.nodes.len() + 1);
        let cmd = vec![
            "shard-node".to_string(),
            "--nats".into(),
            self.nats_url.clone(),
            "--node-id".into(),
            id.clone(),
            "--data".into(),
            data.display().to_string(),
        ];
        let (node, _) = start(
            chronoshard,
            &id,
            cmd,
            &self.dir.join(format!("{id}.log")),
            "is ready",
            Duration::from_secs(30),
        )
        .await?;
        self.watch(&id, node.pid());
        self.nodes.push(node);
        Ok(id)
    }

    /// Starts one more shard node process on a platform this run started (`grow`): a node
    /// joining a running cluster. Its name.
    pub async fn add_node(&mut self) -> anyhow::Result<String> {
        let (chronoshard, data) = self
            .node_from
            .clone()
            .context("only a platform this run started can be given another shard node")?;
        let id = self.start_node(&chronoshard, &data).await?;
        self.shard_nodes += 1;
        Ok(id)
    }

    fn watch(&self, name: &str, pid: u32) {
        if let Ok(mut w) = self.watched.lock() {
            w.push((name.to_string(), pid));
        }
    }

    /// Starts a no-op worker process (this binary's `noop-worker` command) and waits until it
    /// consumes.
    pub async fn start_worker(&mut self, args: &NoopWorkerArgs) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("cannot find this program's own path")?;
        let cmd = vec![
            "noop-worker".to_string(),
            "--nats".into(),
            args.nats.clone(),
            "--id".into(),
            args.id.clone(),
            "--queue".into(),
            args.queue.clone(),
            "--data".into(),
            args.data.display().to_string(),
            "--log".into(),
            args.log.display().to_string(),
            "--concurrency".into(),
            args.concurrency.to_string(),
            "--ack-wait".into(),
            args.ack_wait.to_string(),
            "--work".into(),
            args.work.to_string(),
        ];
        let log = self.dir.join(format!("{}.log", args.id));
        let (proc, _) = start(&exe, &args.id, cmd, &log, "ready", Duration::from_secs(30)).await?;
        self.watch(&args.id, proc.pid());
        self.workers.push(proc);
        Ok(())
    }

    /// SIGKILLs worker `i` and starts it again with the same id and journal; returns the killed
    /// process's `<id>/<pid>` (how its starts are labelled) and when it was killed (µs).
    pub async fn kill_and_restart_worker(&mut self, i: usize) -> anyhow::Result<(String, i64)> {
        let old = self.workers.get_mut(i).context("no such worker")?;
        let label = format!("{}/{}", old.name, old.pid());
        old.child.kill().await?;
        let killed_us = crate::progress::now_us();
        let exe = std::env::current_exe()?;
        let (proc, _) = start(
            &exe,
            &old.name,
            old.cmd.clone(),
            &old.log,
            "ready",
            Duration::from_secs(30),
        )
        .await?;
        self.watch(&proc.name, proc.pid());
        self.workers[i] = proc;
        Ok((label, killed_us))
    }

    /// SIGKILLs shard node process `i` (not restarted: its shards must move to the others).
    pub async fn kill_node(&mut self, i: usize) -> anyhow::Result<String> {
        let node = self
            .nodes
            .get_mut(i)
            .context("no shard node process to kill")?;
        node.child.kill().await?;
        Ok(node.name.clone())
    }

    /// Stops every process this run started: workers first (they drain), then nodes, then dev.
    pub async fn stop(mut self) {
        let mut all: Vec<Proc> = self.workers.drain(..).collect();
        all.append(&mut self.nodes);
        all.extend(self.dev.take());
        for mut p in all {
            terminate(&mut p.child, Duration::from_secs(30)).await;
        }
    }
}

/// SIGTERM, then SIGKILL if it has not exited within `grace`.
async fn terminate(child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

/// What a process wrote to `path` from byte `from` on, as one line for an error message: its
/// first non-blank line, and for a Rust panic ("thread 'main' panicked at file:line:col:") the
/// message on the next one too. Reads at most 64 KiB; keeps at most 400 characters.
fn stderr_gist(path: &Path, from: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).ok()?;
    file.seek(SeekFrom::Start(from)).ok()?;
    let mut bytes = Vec::new();
    file.take(64 * 1024).read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next()?;
    let gist = match lines.next() {
        Some(message) if first.contains(" panicked at ") => format!("{first} {message}"),
        _ => first.to_string(),
    };
    Some(gist.chars().take(400).collect())
}

/// Starts `program cmd…` with stdout and stderr copied to `log`, and waits (up to `timeout`) for
/// a stdout line containing `ready` (no wait when empty). Returns the process and the stdout
/// lines read until then.
async fn start(
    program: &Path,
    name: &str,
    cmd: Vec<String>,
    log: &Path,
    ready: &str,
    timeout: Duration,
) -> anyhow::Result<(Proc, Vec<String>)> {
    // Appended to, so a process started again (a killed worker) keeps its predecessor's logs.
    let append = |path: &Path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    };
    let err_log = log.with_extension("stderr.log");
    let err = append(&err_log)?;
    // Where this start's own stderr begins in a log that may hold a predecessor's.
    let err_from = err.metadata().map(|m| m.len()).unwrap_or(0);
    let mut child = Command::new(program)
        .args(&cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {} ({name})", program.display()))?;
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut out = tokio::fs::File::from_std(append(log)?);
    let mut seen = Vec::new();
    if !ready.is_empty() {
        let wait = async {
            while let Some(line) = lines.next_line().await? {
                out.write_all(format!("{line}\n").as_bytes()).await?;
                let done = line.contains(ready);
                seen.push(line);
                if done {
                    return Ok(true);
                }
            }
            Ok::<bool, std::io::Error>(false)
        };
        let why = match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(true)) => None,
            Ok(Ok(false)) | Ok(Err(_)) => Some("exited before it was ready".to_string()),
            Err(_) => Some(format!("not ready after {timeout:?}")),
        };
        if let Some(why) = why {
            // A clean stop, so that a child of its own (dev's nats-server) goes with it.
            terminate(&mut child, Duration::from_secs(10)).await;
            // What it said on its way out is usually the reason (no nats-server, a port in use).
            let said = stderr_gist(&err_log, err_from)
                .map(|l| format!(" (stderr: {l})"))
                .unwrap_or_default();
            bail!(
                "{name} {why}{said}; see {} and its .stderr.log",
                log.display()
            );
        }
    }
    // Keep draining its output (it logs to stdout) so it never blocks on a full pipe: bytes as
    // they come, and if the log cannot be written, into nothing.
    let mut rest = lines.into_inner();
    tokio::spawn(async move {
        if tokio::io::copy(&mut rest, &mut out).await.is_err() {
            let _ = tokio::io::copy(&mut rest, &mut tokio::io::sink()).await;
        }
    });
    Ok((
        Proc {
            name: name.to_string(),
            child,
            cmd,
            log: log.to_path_buf(),
        },
        seen,
    ))
}

/// What `program --version` prints, or why it printed nothing.
async fn binary_version(program: &Path) -> String {
    match Command::new(program).arg("--version").output().await {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        Ok(o) => format!("unknown (`--version` exited with {})", o.status),
        Err(e) => format!("unknown (`--version` did not run: {e})"),
    }
}

/// The `chronoshard` binary: the given path, else the one built next to this program, else the
/// one on `PATH`.
pub fn find_chronoshard(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("chronoshard")))
        .filter(|p| p.is_file());
    if let Some(p) = sibling {
        return Ok(p);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("chronoshard"))
            .find(|p| p.is_file())
    });
    on_path.context(
        "no `chronoshard` binary found next to this program or on PATH: build it with \
         `cargo build --release -p chronoshard`, or pass --chronoshard PATH",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `sh -c script` as process "p" logging to `log`, and returns the error of a start
    /// that must fail.
    async fn dies(script: &str, log: &Path) -> String {
        let Err(err) = start(
            Path::new("sh"),
            "p",
            vec!["-c".into(), script.into()],
            log,
            "is ready",
            Duration::from_secs(30),
        )
        .await
        else {
            panic!("a process that exited was taken as ready");
        };
        err.to_string()
    }

    /// A process that dies before it is ready is reported with what it wrote to stderr, not only
    /// with where its logs are; an earlier start's stderr in the same (appended) log is not, and
    /// a panic's message (on the line after "panicked at") comes with it.
    #[tokio::test]
    async fn a_process_that_dies_early_is_reported_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("p.log");
        std::fs::write(
            log.with_extension("stderr.log"),
            "Error: from an earlier start\n",
        )
        .unwrap();
        let cases = [
            (
                "echo starting; echo >&2; echo 'Error: no nats-server found on PATH' >&2; \
                 echo 'Stack backtrace:' >&2; exit 1",
                "p exited before it was ready (stderr: Error: no nats-server found on PATH); see ",
                "earlier start",
            ),
            (
                "echo \"thread 'main' panicked at cli/src/main.rs:1:2:\" >&2; \
                 echo 'address already in use' >&2; exit 101",
                "p exited before it was ready (stderr: thread 'main' panicked at \
                 cli/src/main.rs:1:2: address already in use); see ",
                "nats-server",
            ),
        ];
        for (script, said, not_said) in cases {
            let msg = dies(script, &log).await;
            assert!(msg.starts_with(said), "{msg}");
            assert!(!msg.contains(not_said), "{msg}");
        }
    }
}
