//! `chronoshard worker`'s settings: a TOML file under environment variables under flags, unknown
//! keys refused, and `--dump-config` printing what is in effect as such a file.

use std::process::{Command, Output};

fn worker(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_chronoshard"));
    cmd.arg("worker").args(args);
    // Only what the test sets: the machine's own CHRONOSHARD_* variables stay out.
    for (k, _) in std::env::vars() {
        if k.starts_with("CHRONOSHARD_") {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    cmd.envs(env.iter().copied()).output().unwrap()
}

fn dumped(out: &Output) -> toml::Table {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap()
}

#[test]
fn the_file_sets_defaults_that_variables_and_flags_override() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("worker.toml");
    std::fs::write(
        &file,
        "id = \"w-file\"\nconcurrency = 8\ndrain_grace = \"30s\"\nstart_report_delay = \"0s\"\nshell = true\n\
         shell_allow = [\"echo\", \"sh\"]\nhttp_allow = [\"10.0.0.0/8\"]\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();

    let t = dumped(&worker(&["--config", path, "--dump-config"], &[]));
    assert_eq!(t["id"].as_str(), Some("w-file"));
    assert_eq!(t["concurrency"].as_integer(), Some(8));
    assert_eq!(t["drain_grace"].as_str(), Some("30s"));
    assert_eq!(t["start_report_delay"].as_str(), Some("0s"));
    assert_eq!(t["shell"].as_bool(), Some(true));
    assert_eq!(t["shell_allow"], toml::Value::from(vec!["echo", "sh"]));
    assert_eq!(t["http_allow"], toml::Value::from(vec!["10.0.0.0/8"]));
    // Not in the file: the built-in default.
    assert_eq!(t["nats"].as_str(), Some("nats://127.0.0.1:4222"));
    let t0 = dumped(&worker(&["--id", "w", "--dump-config"], &[]));
    assert_eq!(t0["start_report_delay"].as_str(), Some("100ms"));

    let env = [
        ("CHRONOSHARD_WORKER_CONCURRENCY", "9"),
        ("CHRONOSHARD_CONFIG", path),
    ];
    let t = dumped(&worker(&["--dump-config"], &env));
    assert_eq!(t["concurrency"].as_integer(), Some(9), "variable over file");
    assert_eq!(
        t["id"].as_str(),
        Some("w-file"),
        "file named by the variable"
    );
    let t = dumped(&worker(&["--concurrency", "10", "--dump-config"], &env));
    assert_eq!(
        t["concurrency"].as_integer(),
        Some(10),
        "flag over variable"
    );

    // What --dump-config prints is itself a valid config file giving the same settings.
    let again = dir.path().join("again.toml");
    std::fs::write(&again, toml::to_string(&t).unwrap()).unwrap();
    let t2 = dumped(&worker(
        &["--config", again.to_str().unwrap(), "--dump-config"],
        &[],
    ));
    assert_eq!(t2, t);
}

#[test]
fn bad_settings_are_refused_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("idd = \"x\"\n", "unknown field `idd`"),
        ("id = \"w\"\nconcurrency = \"many\"\n", "expected u32"),
        ("id = \"w\"\ndrain_grace = \"soon\"\n", "drain_grace"),
        (
            "id = \"w\"\nstart_report_delay = \"-1s\"\n",
            "start_report_delay",
        ),
        ("id = \"w\"\nconcurrency = 0\n", "concurrency"),
    ];
    for (text, says) in cases {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, text).unwrap();
        let out = worker(&["--config", file.to_str().unwrap(), "--dump-config"], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text} was accepted");
        assert!(err.contains(says), "{text}: {err}");
    }
    let out = worker(
        &["--config", "/nonexistent/worker.toml", "--dump-config"],
        &[],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the config file"));
    let out = worker(&["--dump-config"], &[]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--id"),
        "the id is required"
    );
}
