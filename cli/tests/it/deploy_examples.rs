//! The deployment files of examples/deploy/ (docs/operations.md) are what the programs accept:
//! each chronoshard file is read by its role without an error (every key a setting, every value
//! one it takes), and each nats-server file passes nats-server's own configuration check.

use std::path::{Path, PathBuf};

use crate::common::process::command;

fn files(ext: &str, dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/deploy")
        .join(dir);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

#[test]
fn every_chronoshard_config_file_is_read_by_its_role() {
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "t\n").unwrap();
    let all = files("toml", "");
    assert!(all.len() >= 8, "{all:?}");
    for file in all {
        let name = file.file_name().unwrap().to_str().unwrap();
        let role = ["control-plane", "shard-node", "worker"]
            .into_iter()
            .find(|r| name.starts_with(r))
            .unwrap_or_else(|| panic!("{name}: which role?"));
        let mut cmd = command(&[role, "--config", file.to_str().unwrap(), "--dump-config"]);
        if role == "control-plane" {
            // The file names the token file of the machine it is for.
            cmd.arg("--token-file").arg(token.path());
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dumped: toml::Table = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
        let written: toml::Table =
            toml::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        for (k, v) in &written {
            if k != "token_file" {
                let got = dumped
                    .get(k)
                    .unwrap_or_else(|| panic!("{name}: {k} not in effect"));
                assert!(same(got, v), "{name}: {k} is {got}, the file says {v}");
            }
        }
    }
}

/// Equal values, durations by their length (`1500ms` is `1s500ms`).
fn same(a: &toml::Value, b: &toml::Value) -> bool {
    let dur = |v: &toml::Value| v.as_str()?.parse::<chronoshard_wire::Dur>().ok();
    a == b || (dur(a).is_some() && dur(a) == dur(b))
}

#[test]
fn every_nats_server_file_passes_the_servers_check() {
    let binary = chronoshard_natsd::find().expect("nats-server 2.10+");
    let all = files("conf", "nats");
    assert_eq!(all.len(), 3, "{all:?}");
    for file in all {
        let out = std::process::Command::new(&binary.path)
            .arg("-t")
            .arg("-c")
            .arg(&file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("is valid"),
            "{file:?}: {text}"
        );
    }
}
