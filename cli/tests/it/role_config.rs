//! The production roles' settings (`worker`, `shard-node`, `control-plane`): a TOML file under
//! environment variables under flags, every setting with a variable of its own, unknown keys and
//! bad values refused with the key named, and `--dump-config` printing what is in effect as a
//! file that reads back to the same settings.

use std::process::{Command, Output};

fn worker(args: &[&str], env: &[(&str, &str)]) -> Output {
    role("worker", args, env)
}

fn role(name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_chronoshard"));
    cmd.arg(name).args(args);
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
        (
            "id = \"w\"\nconcurrency = \"many\"\n",
            "`concurrency`: invalid value 'many'",
        ),
        ("id = \"w\"\nshell = 3\n", "`shell`: must be true or false"),
        ("id = \"w\"\nnats = { a = 1 }\n", "`nats` must be a string"),
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

/// Every setting in `--help` says which variable sets it.
#[test]
fn every_setting_of_every_role_has_a_variable() {
    for name in ["worker", "shard-node", "control-plane"] {
        let out = role(name, &["--help"], &[]);
        let help = String::from_utf8_lossy(&out.stdout).to_string();
        let mut flags = 0;
        for block in help.split("\n      --").skip(1) {
            let flag = block.split([' ', '\n']).next().unwrap();
            if ["help", "version", "dump-config"].contains(&flag) {
                continue;
            }
            flags += 1;
            let var = format!("CHRONOSHARD_{}", flag.to_uppercase().replace('-', "_"));
            let named_otherwise = block.contains("[env: CHRONOSHARD_");
            assert!(named_otherwise, "{name} --{flag} has no variable:\n{block}");
            if !["id", "data", "concurrency", "rate"].contains(&flag) || name != "worker" {
                assert!(
                    block.contains(&var),
                    "{name} --{flag}: {var} expected:\n{block}"
                );
            }
        }
        assert!(flags >= 4, "{name}: {help}");
    }
}

#[test]
fn shard_node_settings_come_from_the_file_variables_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.toml");
    std::fs::write(&file, "node_id = \"n-file\"\ndata = \"/srv/cs\"\n").unwrap();
    let path = file.to_str().unwrap();
    let t = dumped(&role(
        "shard-node",
        &["--config", path, "--dump-config"],
        &[],
    ));
    assert_eq!(t["node_id"].as_str(), Some("n-file"));
    assert_eq!(t["data"].as_str(), Some("/srv/cs"));
    assert_eq!(t["nats"].as_str(), Some("nats://127.0.0.1:4222"));
    assert!(t.get("postgres").is_none());
    let env = [
        ("CHRONOSHARD_CONFIG", path),
        ("CHRONOSHARD_NODE_ID", "n-env"),
    ];
    let t = dumped(&role("shard-node", &["--dump-config"], &env));
    assert_eq!(t["node_id"].as_str(), Some("n-env"), "variable over file");
    let t = dumped(&role(
        "shard-node",
        &["--node-id", "n-flag", "--dump-config"],
        &env,
    ));
    assert_eq!(t["node_id"].as_str(), Some("n-flag"), "flag over variable");
    // What the shard does with its time is a cluster setting now, not the node's.
    let out = role(
        "shard-node",
        &["--node-id", "n", "--data", "d", "--horizon", "1m"],
        &[],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--horizon"));
}

#[test]
fn shard_node_bad_settings_are_refused_with_the_setting_named() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("nodeid = \"x\"\n", "unknown field `nodeid`"),
        (
            "node_id = \"n.1\"\ndata = \"d\"\n",
            "--node-id \"n.1\": must be 1-64 characters",
        ),
        ("node_id = \"n\"\n", "give --data DIR"),
        (
            "node_id = \"n\"\ndata = \"d\"\npostgres = \"postgres://db/cs\"\n",
            "--data and --postgres both given",
        ),
        (
            "node_id = \"n\"\npostgres = \"mysql://db/cs\"\n",
            "--postgres must be a postgres:// URL",
        ),
    ];
    for (text, says) in cases {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, text).unwrap();
        let out = role(
            "shard-node",
            &["--config", file.to_str().unwrap(), "--dump-config"],
            &[],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text} was accepted");
        assert!(err.contains(says), "{text}: {err}");
    }
    let out = role("shard-node", &["--node-id", "a b", "--data", "d"], &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--node-id \"a b\""));
    let out = role("shard-node", &["--data", "d", "--dump-config"], &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--node-id"));
}

/// A node's zone and labels, for the assignment strategy: from the file, a variable (labels
/// separated by commas) or repeated flags; dumped as they were read; a malformed or repeated
/// label is refused by name.
#[test]
fn shard_node_zone_and_labels_come_from_every_source_and_bad_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.toml");
    std::fs::write(
        &file,
        "node_id = \"n\"\ndata = \"d\"\nzone = \"z-1\"\nlabel = [\"db_zone=z-1\", \"rack=r7\"]\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let t = dumped(&role(
        "shard-node",
        &["--config", path, "--dump-config"],
        &[],
    ));
    assert_eq!(t["zone"].as_str(), Some("z-1"));
    let labels: Vec<&str> = t["label"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(labels, ["db_zone=z-1", "rack=r7"]);
    let env = [
        ("CHRONOSHARD_CONFIG", path),
        ("CHRONOSHARD_LABEL", "db_zone=z-2,rack=r1"),
    ];
    let t = dumped(&role("shard-node", &["--dump-config"], &env));
    assert_eq!(t["label"].as_array().unwrap().len(), 2);
    assert_eq!(
        t["label"][0].as_str(),
        Some("db_zone=z-2"),
        "variable over file"
    );
    let flags = ["--label", "db_zone=z-3", "--label", "a=b", "--dump-config"];
    let t = dumped(&role("shard-node", &flags, &env));
    assert_eq!(
        t["label"][0].as_str(),
        Some("db_zone=z-3"),
        "flag over variable"
    );
    // Without any, neither is dumped.
    let t = dumped(&role(
        "shard-node",
        &["--node-id", "n", "--data", "d", "--dump-config"],
        &[],
    ));
    assert!(t.get("zone").is_none() && t.get("label").is_none(), "{t}");

    let base = ["--node-id", "n", "--data", "d", "--dump-config"];
    for (extra, says) in [
        (
            &["--label", "db_zone"][..],
            "--label \"db_zone\": must be KEY=VALUE",
        ),
        (
            &["--label", "a b=c"],
            "--label \"a b=c\": the key must be 1-64",
        ),
        (&["--label", "k="], "--label \"k=\": the value must be 1-64"),
        (
            &["--label", "k=1", "--label", "k=2"],
            "--label k: given twice",
        ),
        (&["--zone", "eu/1"], "--zone \"eu/1\": must be 1-64"),
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let out = role("shard-node", &args, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} was accepted");
        assert!(err.contains(says), "{extra:?}: {err}");
    }
}

#[test]
fn control_plane_settings_and_the_clusters_initial_live_settings_come_from_one_place() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cp.toml");
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    std::fs::write(
        &file,
        format!(
            "id = \"cp-1\"\ntoken_file = {:?}\nshards = 16\nsharding = \"tenant\"\nreplicas = 3\n\
             heartbeat_ttl = \"2s\"\nmax_moves = 2\nrebalance = false\nplugin_dir = \"/srv/plugins\"\n",
            token.to_str().unwrap()
        ),
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let t = dumped(&role(
        "control-plane",
        &["--config", path, "--dump-config"],
        &[],
    ));
    assert_eq!(t["id"].as_str(), Some("cp-1"));
    assert_eq!(t["shards"].as_integer(), Some(16));
    assert_eq!(t["replicas"].as_integer(), Some(3));
    assert_eq!(t["heartbeat_ttl"].as_str(), Some("2s"));
    assert_eq!(t["max_moves"].as_integer(), Some(2));
    assert_eq!(t["rebalance"].as_bool(), Some(false));
    assert_eq!(t["plugin_dir"].as_str(), Some("/srv/plugins"));
    // Not given: the live settings' defaults.
    let d = chronoshard_wire::settings::Settings::DEFAULT;
    assert_eq!(
        t["heartbeat_every"].as_str(),
        Some(d.heartbeat_every.to_string().as_str())
    );
    assert_eq!(t["horizon"].as_str(), Some(d.horizon.to_string().as_str()));
    assert!(t.get("token").is_none(), "the token is never printed");
    let env = [
        ("CHRONOSHARD_CONFIG", path),
        ("CHRONOSHARD_HEARTBEAT_TTL", "3s"),
    ];
    let t = dumped(&role("control-plane", &["--dump-config"], &env));
    assert_eq!(
        t["heartbeat_ttl"].as_str(),
        Some("3s"),
        "variable over file"
    );
    let t = dumped(&role(
        "control-plane",
        &["--heartbeat-ttl", "4s", "--dump-config"],
        &env,
    ));
    assert_eq!(
        t["heartbeat_ttl"].as_str(),
        Some("4s"),
        "flag over variable"
    );
    let again = dir.path().join("again.toml");
    std::fs::write(&again, toml::to_string(&t).unwrap()).unwrap();
    let t2 = dumped(&role(
        "control-plane",
        &["--config", again.to_str().unwrap(), "--dump-config"],
        &[],
    ));
    assert_eq!(t2, t);

    let cases: [(&[&str], &str); 6] = [
        (&["--id", "cp"], "the admin token is missing"),
        (
            &["--id", "cp", "--token", "x", "--token-file", "f"],
            "both given",
        ),
        (&["--id", "c p", "--token", "x"], "--id \"c p\""),
        (
            &["--id", "cp", "--token", "x", "--heartbeat-ttl", "600ms"],
            "--heartbeat-ttl: must be at least twice",
        ),
        (
            &["--id", "cp", "--token", "x", "--replicas", "7"],
            "--replicas",
        ),
        (
            &["--id", "cp", "--token", "x", "--sharding", "zone"],
            "--sharding",
        ),
    ];
    for (args, says) in cases {
        let mut a = args.to_vec();
        a.push("--dump-config");
        let out = role("control-plane", &a, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
