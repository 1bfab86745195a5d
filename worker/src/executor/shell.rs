//! The shell executor: runs the command of a `TargetSpec::Shell` ticket as a child process of the
//! worker and turns how it ended into an `Outcome`.
//!
//! It owns the whole life of that child: the enable switch and the allowlist, starting the
//! command, its resource limits (CPU time, address space, open files), the wall-clock timeout and
//! cancellation, the payload on stdin and the capture of stdout and stderr.
//!
//! It must not: start anything when shell jobs are disabled or the command is not allowlisted;
//! hand the job's command or arguments to a shell parser (they are argv, so `; rm -rf /` is just
//! an argument); let a process of the attempt outlive it (each run is its own process group,
//! killed as a whole when the attempt ends, however it ends); keep more output than the limit or
//! let a chatty child block on a full pipe; panic the worker.
//!
//! Rules:
//! - Allowlist: the command string must equal an entry exactly. A bare name (`echo`) is then
//!   looked up in the worker's `PATH` (absolute directories only); a path (`/bin/echo`, anything
//!   with a `/`) is used as written. So `echo` allows `echo` only, never `/bin/echo` or
//!   `/tmp/x/echo`, and `/bin/echo` allows only that path.
//! - Limits are applied without `unsafe` by starting `/bin/sh -c 'ulimit …; exec "$0" "$@"'`
//!   with the resolved command as `$0` and the job's arguments as `$@`: the fixed script is ours,
//!   the job's strings are only ever positional parameters, and `exec` replaces the shell, so the
//!   command itself runs under the limits and is the process group's leader. Both soft and hard
//!   limits are set, so the command cannot raise them again. The CPU soft limit sends `SIGXCPU`;
//!   the hard limit, one second later, `SIGKILL` (for a child that catches `SIGXCPU`). A limit of
//!   0 leaves that limit as the worker's own. A limit above the worker's own hard limit is
//!   lowered to it (raising it would fail, and the child could not exceed it anyway).
//! - A memory-limit failure is whatever the program makes of a failed allocation: a non-zero
//!   exit (Python: `MemoryError`, status 1), or a signal (dash: `SIGSEGV`; C++/Rust: `SIGABRT`);
//!   the outcome reports exactly that, it does not guess at the cause.
//! - Output: stdout then stderr, at most `output_limit` bytes of them kept in all (a stream that
//!   fits in half keeps all of it, the other gets the rest), as UTF-8 (invalid bytes replaced by
//!   U+FFFD, never cut inside a character); a cut stream is followed by a line
//!   `…[truncated N bytes]`, and that marker is not counted in the limit.
//! - The child inherits the worker's environment plus the `CHRONOSHARD_*` variables of the
//!   ticket; its stdin is the payload as JSON, or empty when the payload is null.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use chronoshard_wire::{rfc3339, TargetSpec, Ticket};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{ChildStdin, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Outcome;

/// The shell that applies the limits and then `exec`s the command.
const SHELL: &str = "/bin/sh";

/// How long the output pipes may stay open after the attempt has ended and its process group was
/// killed. Only a process that left the group (`setsid`) can still hold them; it is not waited for.
const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// What the shell executor may run, and with which limits.
#[derive(Clone, Debug)]
pub struct ShellOptions {
    /// Shell jobs are refused unless this is set.
    pub enabled: bool,
    /// Commands that may run, matched exactly against the command as the job writes it.
    pub allow: Vec<String>,
    /// CPU time (RLIMIT_CPU); 0 leaves the worker's own limit.
    pub cpu_seconds: u64,
    /// Address space (RLIMIT_AS), rounded down to KiB; 0 leaves the worker's own limit.
    pub memory_bytes: u64,
    /// Open file descriptors (RLIMIT_NOFILE); 0 leaves the worker's own limit.
    pub open_files: u64,
    /// Bytes of stdout and stderr kept in all.
    pub output_limit: usize,
}

impl Default for ShellOptions {
    fn default() -> Self {
        ShellOptions {
            enabled: false,
            allow: Vec::new(),
            cpu_seconds: 60,
            memory_bytes: 512 * 1024 * 1024,
            open_files: 256,
            output_limit: 64 * 1024,
        }
    }
}

/// Runs the ticket's command once. Never panics: a refusal, a command that cannot start, a
/// non-zero exit, a timeout or a cancellation is a failed outcome.
pub async fn execute(opts: &ShellOptions, ticket: &Ticket, cancel: &CancellationToken) -> Outcome {
    let TargetSpec::Shell { command, args } = &ticket.target else {
        return Outcome::failed(format!(
            "the shell executor cannot run a {:?} target",
            ticket.target
        ));
    };
    if !opts.enabled {
        return Outcome::failed("shell jobs are disabled on this worker");
    }
    if !is_allowed(&opts.allow, command) {
        return Outcome::failed(format!(
            "command {command:?} is not on this worker's shell allowlist"
        ));
    }
    let program = match resolve(command) {
        Ok(p) => p,
        Err(e) => return Outcome::failed(format!("cannot start {command}: {e}")),
    };
    if cancel.is_cancelled() {
        return Outcome::failed("cancelled");
    }
    let payload = if ticket.payload.is_null() {
        None
    } else {
        match serde_json::to_vec(&ticket.payload) {
            Ok(bytes) => Some(bytes),
            Err(e) => return Outcome::failed(format!("cannot encode the payload: {e}")),
        }
    };

    let mut cmd = Command::new(SHELL);
    cmd.arg("-c")
        .arg(wrapper_script(opts, &worker_limits()))
        .arg(&program)
        .args(args)
        .env("CHRONOSHARD_TICKET_ID", ticket.ticket_id.to_string())
        .env("CHRONOSHARD_JOB_ID", ticket.job_id.to_string())
        .env("CHRONOSHARD_ATTEMPT", ticket.attempt.to_string())
        .env("CHRONOSHARD_SCHEDULED_AT", rfc3339(ticket.scheduled_at))
        .env("CHRONOSHARD_ITEM", ticket.item.to_string())
        .env("CHRONOSHARD_ITEMS", ticket.items.to_string())
        .stdin(if payload.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so the attempt's descendants can be killed with it.
        .process_group(0)
        .kill_on_drop(true);

    // `None`: a timeout too far away to represent, i.e. none.
    let deadline = Instant::now().checked_add(Duration::from_millis(ticket.timeout_ms));
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Outcome::failed(format!("cannot start {command}: {e}")),
    };
    // Declared after `child`, so a dropped future kills the group before the leader is reaped.
    let mut group = Group(
        child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw),
    );

    let mut out = Capture::new(opts.output_limit);
    let mut err = Capture::new(opts.output_limit);
    let (stdout, stderr, stdin) = (child.stdout.take(), child.stderr.take(), child.stdin.take());
    let end = {
        // The pipes are served for the whole run, concurrently with waiting for the exit: a child
        // that fills a pipe nobody reads would block forever.
        let mut io = std::pin::pin!(async {
            tokio::join!(out.fill(stdout), err.fill(stderr), feed(stdin, payload));
        });
        let mut io_done = false;
        let mut expiry = std::pin::pin!(async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        });
        let end = loop {
            tokio::select! {
                // An exit that coincides with the deadline or a cancel is reported as the exit.
                biased;
                status = child.wait() => break End::Exited(status),
                () = cancel.cancelled() => break End::Cancelled,
                () = &mut expiry => break End::TimedOut,
                () = &mut io, if !io_done => io_done = true,
            }
        };
        // Whatever ended the attempt, nothing it started may outlive it: background processes
        // of a command that exited are killed too, and the pipes they hold close.
        group.kill();
        let end = match end {
            End::Exited(status) => End::Exited(status),
            // Killed above; reap it so no zombie is left.
            other => {
                let _ = child.wait().await;
                other
            }
        };
        if !io_done && tokio::time::timeout(DRAIN_GRACE, &mut io).await.is_err() {
            tracing::warn!(
                ticket_id = %ticket.ticket_id,
                "output of a shell job still open after its process group was killed; not waiting for it"
            );
        }
        end
    };

    let mut outcome = match end {
        End::Exited(Ok(status)) => match exit_error(status) {
            None => Outcome::succeeded(),
            Some(e) => Outcome::failed(e),
        },
        End::Exited(Err(e)) => Outcome::failed(format!("cannot wait for {command}: {e}")),
        End::TimedOut => Outcome::failed(format!("timed out after {} ms", ticket.timeout_ms)),
        End::Cancelled => Outcome::failed("cancelled"),
    };
    outcome.output = render(&out, &err, opts.output_limit);
    outcome
}

/// How the wait for the child ended.
enum End {
    Exited(std::io::Result<ExitStatus>),
    TimedOut,
    Cancelled,
}

/// The attempt's process group (its id is the leader's pid). Killed once, explicitly when the
/// attempt ends, or on drop if the attempt's future is dropped first.
struct Group(Option<Pid>);

impl Group {
    fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // ESRCH just means every member is already gone.
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

fn is_allowed(allow: &[String], command: &str) -> bool {
    !command.is_empty() && allow.iter().any(|a| a == command)
}

/// The executable a command names, as an absolute path (so `exec` neither searches `PATH` again
/// nor mistakes it for an option): a bare name is searched in the absolute directories of the
/// worker's `PATH` (an empty or relative entry would mean the current directory); a path is taken
/// as written.
fn resolve(command: &str) -> Result<PathBuf, String> {
    if command.contains('/') {
        let path = Path::new(command);
        check_executable(path)?;
        return std::path::absolute(path).map_err(|e| e.to_string());
    }
    let search =
        std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    std::env::split_paths(&search)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(command))
        .find(|p| check_executable(p).is_ok())
        .ok_or_else(|| "not found in PATH".to_string())
}

fn check_executable(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err("not executable".into());
    }
    Ok(())
}

/// The worker's own hard limits (`None`: unlimited or unknown): the child inherits them and may
/// only lower them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct HardLimits {
    cpu_seconds: Option<u64>,
    address_space_bytes: Option<u64>,
    open_files: Option<u64>,
}

fn worker_limits() -> HardLimits {
    // Read from /proc since std has no getrlimit and this crate uses no unsafe; if it cannot be
    // read, the requested limits are used as they are.
    std::fs::read_to_string("/proc/self/limits")
        .map(|text| parse_limits(&text))
        .unwrap_or_default()
}

/// Parses `/proc/<pid>/limits`: a name, then the soft limit, the hard limit and the unit.
fn parse_limits(text: &str) -> HardLimits {
    let hard = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?;
            rest.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
    };
    HardLimits {
        cpu_seconds: hard("Max cpu time"),
        address_space_bytes: hard("Max address space"),
        open_files: hard("Max open files"),
    }
}

/// The fixed script `sh -c` runs: set the limits, then become the command. Only numbers are
/// interpolated; the command and its arguments arrive as `$0` and `$@`.
fn wrapper_script(opts: &ShellOptions, worker: &HardLimits) -> String {
    let cap = |want: u64, have: Option<u64>| have.map_or(want, |h| want.min(h));
    let mut script = String::new();
    // The soft limit first: a hard limit below the current soft one is refused.
    if opts.cpu_seconds > 0 {
        let soft = cap(opts.cpu_seconds, worker.cpu_seconds);
        let hard = cap(opts.cpu_seconds.saturating_add(1), worker.cpu_seconds);
        script.push_str(&format!("ulimit -St {soft} && ulimit -Ht {hard} && "));
    }
    if opts.memory_bytes > 0 {
        let bytes = cap(opts.memory_bytes, worker.address_space_bytes);
        let kib = (bytes / 1024).max(1);
        script.push_str(&format!("ulimit -Sv {kib} && ulimit -Hv {kib} && "));
    }
    if opts.open_files > 0 {
        let n = cap(opts.open_files, worker.open_files);
        script.push_str(&format!("ulimit -Sn {n} && ulimit -Hn {n} && "));
    }
    script.push_str("exec \"$0\" \"$@\"");
    script
}

/// Writes the payload and closes stdin, so a child reading to the end sees the end.
async fn feed(stdin: Option<ChildStdin>, payload: Option<Vec<u8>>) {
    if let (Some(mut pipe), Some(payload)) = (stdin, payload) {
        // A child that exits without reading its stdin breaks the pipe: its business, not ours.
        let _ = pipe.write_all(&payload).await;
        let _ = pipe.shutdown().await;
    }
}

/// One output stream: the first bytes, up to a cap, and how many there were in all.
struct Capture {
    kept: Vec<u8>,
    total: u64,
    cap: usize,
}

impl Capture {
    fn new(limit: usize) -> Capture {
        Capture {
            kept: Vec::new(),
            total: 0,
            // Up to 4 bytes more than can be kept, so a character that starts within the limit is
            // always captured whole and is not mistaken for invalid UTF-8.
            cap: limit.saturating_add(4),
        }
    }

    /// Reads the stream to its end, keeping the first `cap` bytes and discarding the rest, so the
    /// child never blocks on a full pipe.
    async fn fill(&mut self, pipe: Option<impl AsyncRead + Unpin>) {
        let Some(mut pipe) = pipe else { return };
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => {
                    self.total += n as u64;
                    let room = self.cap - self.kept.len();
                    self.kept.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

/// Stdout then stderr, at most `limit` bytes of them in all (markers aside); `None` when the
/// command printed nothing.
fn render(out: &Capture, err: &Capture, limit: usize) -> Option<String> {
    let out_len = decode_prefix(&out.kept, limit).0.len();
    let err_len = decode_prefix(&err.kept, limit).0.len();
    let (out_budget, err_budget) = split_budget(out_len, err_len, limit);
    let mut text = String::new();
    append(&mut text, out, out_budget);
    append(&mut text, err, err_budget);
    (!text.is_empty()).then_some(text)
}

/// Shares `limit` between two streams wanting `a` and `b` bytes: a stream that fits in its half
/// keeps everything, so a flood on stdout cannot hide a short error on stderr.
fn split_budget(a: usize, b: usize, limit: usize) -> (usize, usize) {
    if a.saturating_add(b) <= limit {
        return (a, b);
    }
    let half = limit / 2;
    if a <= half {
        (a, limit - a)
    } else if b <= limit - half {
        (limit - b, b)
    } else {
        (half, limit - half)
    }
}

fn append(text: &mut String, stream: &Capture, budget: usize) {
    let (kept, covered) = decode_prefix(&stream.kept, budget);
    let dropped = stream.total - covered as u64;
    if !kept.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&kept);
    }
    if dropped > 0 {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("…[truncated {dropped} bytes]\n"));
    }
}

/// Decodes the start of `raw` as UTF-8 into at most `budget` bytes, each invalid sequence replaced
/// by U+FFFD and no character cut; returns the text and how many bytes of `raw` it stands for.
fn decode_prefix(raw: &[u8], budget: usize) -> (String, usize) {
    let mut text = String::new();
    let mut covered = 0;
    for chunk in raw.utf8_chunks() {
        let valid = chunk.valid();
        if text.len() + valid.len() > budget {
            let mut end = budget - text.len();
            while !valid.is_char_boundary(end) {
                end -= 1;
            }
            text.push_str(&valid[..end]);
            return (text, covered + end);
        }
        text.push_str(valid);
        covered += valid.len();
        if chunk.invalid().is_empty() {
            continue;
        }
        if text.len() + char::REPLACEMENT_CHARACTER.len_utf8() > budget {
            return (text, covered);
        }
        text.push(char::REPLACEMENT_CHARACTER);
        covered += chunk.invalid().len();
    }
    (text, covered)
}

/// `None` for a successful exit, otherwise what happened, as plainly as the status says it.
fn exit_error(status: ExitStatus) -> Option<String> {
    if status.success() {
        return None;
    }
    if let Some(code) = status.code() {
        return Some(format!("exited with status {code}"));
    }
    let Some(raw) = status.signal() else {
        return Some(format!("ended with {status}"));
    };
    let (name, why) = match Signal::try_from(raw) {
        Ok(Signal::SIGXCPU) => ("SIGXCPU".to_string(), " (CPU time limit)"),
        Ok(sig) => (sig.as_str().to_string(), ""),
        Err(_) => (format!("signal {raw}"), ""),
    };
    let core = if status.core_dumped() {
        " (core dumped)"
    } else {
        ""
    };
    Some(format!("killed by {name}{why}{core}"))
}

#[cfg(test)]
mod tests;
