use super::*;

use chronoshard_test_util::wait_for;
use chronoshard_wire::{trace_id_of, PROTOCOL_VERSION};
use uuid::Uuid;

/// Built from its JSON form, so fields added to `Ticket` with a default need no change here.
fn ticket(command: &str, args: &[&str]) -> Ticket {
    let ticket_id = Uuid::now_v7();
    serde_json::from_value(serde_json::json!({
        "v": PROTOCOL_VERSION,
        "ticket_id": ticket_id,
        "job_id": Uuid::now_v7(),
        "tenant": "default",
        "shard": 0,
        "epoch": 1,
        "scheduled_at": "2030-01-02T03:04:05Z",
        "attempt": 2,
        "item": 3,
        "items": 7,
        "queue": "default",
        "target": {"type": "shell", "command": command, "args": args},
        "timeout_ms": 60_000,
        "trace_id": trace_id_of(ticket_id),
    }))
    .expect("a valid ticket")
}

fn allowing(commands: &[&str]) -> ShellOptions {
    ShellOptions {
        enabled: true,
        allow: commands.iter().map(|c| c.to_string()).collect(),
        ..ShellOptions::default()
    }
}

async fn run(opts: &ShellOptions, ticket: &Ticket) -> Outcome {
    execute(opts, ticket, &CancellationToken::new()).await
}

/// Dead: no /proc entry, or a zombie nobody reaps (PID 1 of a container may not).
fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

async fn assert_gone(pid: u32) {
    wait_for(
        &format!("process {pid} to be gone"),
        Duration::from_secs(10),
        || async move { is_gone(pid).then_some(()) },
    )
    .await
    .expect("the process group was killed");
}

/// A script that starts a background `sleep`, publishes its pid in `$1` (atomically), then
/// waits for it.
const SLEEPER: &str = "sleep 300 & echo $! > \"$1.tmp\" && mv \"$1.tmp\" \"$1\"; wait";

#[tokio::test]
async fn refuses_when_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let opts = ShellOptions {
        enabled: false,
        ..allowing(&["touch"])
    };
    let outcome = run(&opts, &ticket("touch", &[marker.to_str().unwrap()])).await;
    assert!(!outcome.ok);
    assert_eq!(
        outcome.error.as_deref(),
        Some("shell jobs are disabled on this worker")
    );
    assert!(!marker.exists(), "nothing may be started");
    assert!(!ShellOptions::default().enabled);
}

#[tokio::test]
async fn refuses_commands_not_on_the_allowlist() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let m = marker.to_str().unwrap();
    // A bare name allows that name only, not a path ending in it.
    let opts = allowing(&["echo", "touch"]);
    for command in [
        "/bin/echo",
        "/tmp/x/echo",
        "ECHO",
        " echo",
        "/usr/bin/touch",
    ] {
        let outcome = run(&opts, &ticket(command, &[m])).await;
        assert!(!outcome.ok, "{command} must be refused");
        assert_eq!(
            outcome.error,
            Some(format!(
                "command {command:?} is not on this worker's shell allowlist"
            ))
        );
    }
    assert!(!marker.exists(), "nothing may be started");
    assert!(run(&opts, &ticket("echo", &["hi"])).await.ok);
    // And a path allows that path only, not the bare name.
    let opts = allowing(&["/bin/echo"]);
    assert!(!run(&opts, &ticket("echo", &["hi"])).await.ok);
    let outcome = run(&opts, &ticket("/bin/echo", &["hi"])).await;
    assert!(outcome.ok, "{outcome:?}");
    assert_eq!(outcome.output.as_deref(), Some("hi\n"));
    // An empty allowlist allows nothing.
    assert!(!run(&allowing(&[]), &ticket("echo", &[])).await.ok);
}

#[tokio::test]
async fn refuses_a_target_that_is_not_shell() {
    let mut t = ticket("echo", &[]);
    t.target = TargetSpec::Http {
        url: "http://127.0.0.1:1/".into(),
        method: "POST".into(),
        headers: Default::default(),
    };
    let outcome = run(&allowing(&["echo"]), &t).await;
    assert!(!outcome.ok);
    assert!(outcome
        .error
        .unwrap()
        .starts_with("the shell executor cannot run"));
}

#[tokio::test]
async fn passes_the_ticket_in_the_environment_and_the_payload_on_stdin() {
    let mut t = ticket(
        "sh",
        &[
            "-c",
            "echo \"$CHRONOSHARD_TICKET_ID $CHRONOSHARD_JOB_ID\"; \
             echo \"$CHRONOSHARD_ATTEMPT $CHRONOSHARD_SCHEDULED_AT $CHRONOSHARD_ITEM/$CHRONOSHARD_ITEMS\"; \
             cat",
        ],
    );
    t.payload = serde_json::json!({"region": "eu", "n": 1});
    let outcome = run(&allowing(&["sh"]), &t).await;
    assert!(outcome.ok, "{outcome:?}");
    assert_eq!(
        outcome.output.unwrap(),
        format!(
            "{} {}\n2 2030-01-02T03:04:05Z 3/7\n{{\"n\":1,\"region\":\"eu\"}}",
            t.ticket_id, t.job_id
        )
    );
}

#[tokio::test]
async fn a_null_payload_is_an_empty_stdin() {
    let outcome = run(&allowing(&["cat"]), &ticket("cat", &[])).await;
    assert!(outcome.ok, "{outcome:?}");
    assert_eq!(outcome.output, None);
}

#[tokio::test]
async fn arguments_are_not_interpreted_by_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("pwned");
    let m = marker.to_str().unwrap();
    let args = [
        format!("; touch {m}"),
        format!("$(touch {m})"),
        format!("`touch {m}`"),
        "$HOME".to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let outcome = run(&allowing(&["echo"]), &ticket("echo", &args)).await;
    assert!(outcome.ok, "{outcome:?}");
    assert_eq!(outcome.output.unwrap(), format!("{}\n", args.join(" ")));
    assert!(!marker.exists());
}

#[tokio::test]
async fn a_non_zero_exit_fails_with_its_status_and_output() {
    let t = ticket("sh", &["-c", "echo partial; echo oops >&2; exit 3"]);
    let outcome = run(&allowing(&["sh"]), &t).await;
    assert!(!outcome.ok);
    assert_eq!(outcome.error.as_deref(), Some("exited with status 3"));
    assert_eq!(outcome.output.as_deref(), Some("partial\noops\n"));
}

#[tokio::test]
async fn a_missing_command_cannot_start() {
    let opts = allowing(&[
        "chronoshard-no-such-command",
        "/nonexistent/bin/tool",
        "/etc",
    ]);
    let outcome = run(&opts, &ticket("chronoshard-no-such-command", &[])).await;
    assert_eq!(
        outcome.error.as_deref(),
        Some("cannot start chronoshard-no-such-command: not found in PATH")
    );
    let outcome = run(&opts, &ticket("/nonexistent/bin/tool", &[])).await;
    assert!(!outcome.ok);
    assert!(
        outcome
            .error
            .as_deref()
            .unwrap()
            .starts_with("cannot start /nonexistent/bin/tool: No such file"),
        "{outcome:?}"
    );
    let outcome = run(&opts, &ticket("/etc", &[])).await;
    assert_eq!(
        outcome.error.as_deref(),
        Some("cannot start /etc: not a regular file")
    );
}

#[tokio::test]
async fn output_is_cut_at_the_limit_while_the_child_keeps_writing() {
    // 10 MB, far more than a pipe buffer: the child would block if the rest were not read.
    let t = ticket(
        "sh",
        &[
            "-c",
            "head -c 10000000 /dev/zero | tr '\\0' a; echo done >&2",
        ],
    );
    let opts = ShellOptions {
        output_limit: 1000,
        ..allowing(&["sh"])
    };
    let outcome = run(&opts, &t).await;
    assert!(outcome.ok, "{outcome:?}");
    // stderr fits in its half and is kept whole; stdout gets the rest.
    assert_eq!(
        outcome.output.unwrap(),
        format!("{}\n…[truncated 9999005 bytes]\ndone\n", "a".repeat(995))
    );
}

#[test]
fn cutting_keeps_whole_characters_and_counts_bytes() {
    // "é" is 2 bytes: a budget of 5 keeps two of them, not two and a half.
    assert_eq!(decode_prefix("ééé".as_bytes(), 5), ("éé".to_string(), 4));
    // Invalid bytes become U+FFFD, which still counts against the budget.
    assert_eq!(
        decode_prefix(b"ab\xffcd", 10),
        ("ab\u{FFFD}cd".to_string(), 5)
    );
    assert_eq!(decode_prefix(b"ab\xffcd", 4), ("ab".to_string(), 2));
    let mut out = Capture::new(3);
    out.kept = "ééé".as_bytes().to_vec();
    out.total = 6;
    let err = Capture::new(3);
    assert_eq!(render(&out, &err, 3).unwrap(), "é\n…[truncated 4 bytes]\n");
    assert_eq!(split_budget(10, 10, 100), (10, 10));
    assert_eq!(split_budget(1000, 10, 100), (90, 10));
    assert_eq!(split_budget(10, 1000, 100), (10, 90));
    assert_eq!(split_budget(1000, 1000, 101), (50, 51));
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let mut t = ticket("sh", &["-c", SLEEPER, "sh", pid_file.to_str().unwrap()]);
    t.timeout_ms = 2000;
    let outcome = run(&allowing(&["sh"]), &t).await;
    assert!(!outcome.ok);
    assert_eq!(outcome.error.as_deref(), Some("timed out after 2000 ms"));
    let grandchild: u32 = std::fs::read_to_string(&pid_file)
        .expect("the script wrote its background pid before the timeout")
        .trim()
        .parse()
        .unwrap();
    assert_gone(grandchild).await;
}

#[tokio::test]
async fn cancelling_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let t = ticket("sh", &["-c", SLEEPER, "sh", pid_file.to_str().unwrap()]);
    let opts = allowing(&["sh"]);
    let cancel = CancellationToken::new();
    let canceller = async {
        let pid: u32 = wait_for("the pid file", Duration::from_secs(30), || async {
            std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
        })
        .await
        .expect("the script started");
        cancel.cancel();
        pid
    };
    let (outcome, grandchild) = tokio::join!(execute(&opts, &t, &cancel), canceller);
    assert!(!outcome.ok);
    assert_eq!(outcome.error.as_deref(), Some("cancelled"));
    assert_gone(grandchild).await;
}

#[tokio::test]
async fn background_processes_do_not_outlive_a_command_that_exited() {
    let t = ticket("sh", &["-c", "sleep 300 & echo $!"]);
    let outcome = run(&allowing(&["sh"]), &t).await;
    assert!(outcome.ok, "{outcome:?}");
    let grandchild: u32 = outcome.output.unwrap().trim().parse().unwrap();
    assert_gone(grandchild).await;
}

#[tokio::test]
async fn the_cpu_limit_kills_a_busy_loop() {
    let t = ticket("sh", &["-c", "while :; do :; done"]);
    let opts = ShellOptions {
        cpu_seconds: 1,
        ..allowing(&["sh"])
    };
    let outcome = run(&opts, &t).await;
    assert!(!outcome.ok);
    let error = outcome.error.unwrap();
    assert!(
        error.starts_with("killed by SIGXCPU (CPU time limit)")
            || error.starts_with("killed by SIGKILL"),
        "{error}"
    );
}

#[tokio::test]
async fn limits_are_applied_and_cannot_be_raised() {
    let t = ticket(
        "sh",
        &[
            "-c",
            "ulimit -St; ulimit -Ht; ulimit -Sv; ulimit -Hv; ulimit -Sn; ulimit -Hn; \
             ulimit -Sn 1000 2>/dev/null || echo refused",
        ],
    );
    let opts = ShellOptions {
        cpu_seconds: 7,
        memory_bytes: 256 * 1024 * 1024,
        open_files: 100,
        ..allowing(&["sh"])
    };
    let outcome = run(&opts, &t).await;
    assert!(outcome.ok, "{outcome:?}");
    let output = outcome.output.unwrap();
    assert!(
        output.starts_with("7\n8\n262144\n262144\n100\n100\n"),
        "{output}"
    );
    assert!(output.ends_with("refused\n"), "{output}");
}

#[tokio::test]
async fn a_memory_limit_failure_is_reported_as_it_happened() {
    // dash keeps a command substitution's output in memory: 200 MB under a 64 MiB address
    // space fails to allocate (dash then dies of SIGSEGV; other programs exit non-zero).
    let t = ticket(
        "sh",
        &[
            "-c",
            "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}",
        ],
    );
    let opts = ShellOptions {
        memory_bytes: 64 * 1024 * 1024,
        ..allowing(&["sh"])
    };
    let outcome = run(&opts, &t).await;
    assert!(!outcome.ok, "{outcome:?}");
    let error = outcome.error.unwrap();
    assert!(
        error.starts_with("killed by SIG") || error.starts_with("exited with status"),
        "{error}"
    );
}

#[test]
fn the_wrapper_sets_soft_then_hard_within_the_workers_limits() {
    let limits = parse_limits(
        "Limit                     Soft Limit           Hard Limit           Units     \n\
         Max cpu time              unlimited            unlimited            seconds   \n\
         Max open files            1024                 4096                 files     \n\
         Max address space         unlimited            268435456            bytes     \n",
    );
    assert_eq!(
        limits,
        HardLimits {
            cpu_seconds: None,
            address_space_bytes: Some(268435456),
            open_files: Some(4096),
        }
    );
    let opts = ShellOptions {
        open_files: 10_000,
        ..ShellOptions::default()
    };
    assert_eq!(
        wrapper_script(&opts, &limits),
        "ulimit -St 60 && ulimit -Ht 61 && ulimit -Sv 262144 && ulimit -Hv 262144 && \
         ulimit -Sn 4096 && ulimit -Hn 4096 && exec \"$0\" \"$@\""
    );
    let none = ShellOptions {
        cpu_seconds: 0,
        memory_bytes: 0,
        open_files: 0,
        ..ShellOptions::default()
    };
    assert_eq!(
        wrapper_script(&none, &HardLimits::default()),
        "exec \"$0\" \"$@\""
    );
}

#[test]
fn signals_are_named() {
    assert_eq!(exit_error(ExitStatus::from_raw(0)), None);
    assert_eq!(
        exit_error(ExitStatus::from_raw(3 << 8)).as_deref(),
        Some("exited with status 3")
    );
    assert_eq!(
        exit_error(ExitStatus::from_raw(Signal::SIGXCPU as i32)).as_deref(),
        Some("killed by SIGXCPU (CPU time limit)")
    );
    assert_eq!(
        exit_error(ExitStatus::from_raw(Signal::SIGKILL as i32)).as_deref(),
        Some("killed by SIGKILL")
    );
}
