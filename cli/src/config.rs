//! Settings of the production roles, each defined once: a role's settings are one clap `Args`
//! struct that also derives `Serialize`. From that one definition come
//! - the flags (`--node-id`) and `--help`;
//! - the environment variables: `CHRONOSHARD_` and the setting's name in capitals
//!   (`CHRONOSHARD_NODE_ID`), unless the struct names another one for a setting;
//! - the keys of the TOML file that `--config FILE` (or `CHRONOSHARD_CONFIG`) names: the
//!   setting's name (`node_id = "n-1"`); unknown keys and bad values are errors naming the key;
//! - `--dump-config`, which prints the settings in effect as such a file.
//!
//! Precedence is defaults < file < environment < flags: the file's values become the flags'
//! defaults before the command line is parsed, so clap's own order (flag, then variable, then
//! default) does the rest. This module owns reading the file and wiring the names; what a role
//! does with its settings is the role's.

use std::{
    ffi::{OsStr, OsString},
    path::{Path, PathBuf},
};

use anyhow::Context;

/// The flags of every role that are about the command line, not settings.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConfigFlags {
    /// A TOML file with these settings (keys as the flags, `_` for `-`); flags and variables
    /// override it.
    #[arg(long, env = "CHRONOSHARD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print the settings in effect as a TOML config file and exit.
    #[arg(long)]
    pub dump_config: bool,
}

/// Args that are about the command line itself, not settings.
const NOT_SETTINGS: &[&str] = &["help", "version", "config", "dump_config"];

/// The `--config` path given to `subcommand`, from the arguments or `CHRONOSHARD_CONFIG`.
/// Read before clap parses, because the file changes what clap is told the defaults are.
pub fn path_for(subcommand: &str, args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter().skip(1).skip_while(|a| *a != subcommand);
    it.next()?;
    let mut prev_was_flag = false;
    for a in it {
        let a = a.to_string_lossy();
        if prev_was_flag {
            return Some(PathBuf::from(a.as_ref()));
        }
        if let Some(v) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(v));
        }
        prev_was_flag = a == "--config";
    }
    std::env::var_os("CHRONOSHARD_CONFIG").map(PathBuf::from)
}

/// Gives every setting of `cmd` that has no variable of its own `CHRONOSHARD_<NAME>`.
pub fn with_env(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| {
        let id = a.get_id().as_str();
        if a.get_env().is_some() || a.get_long().is_none() || NOT_SETTINGS.contains(&id) {
            return a;
        }
        let name = format!("CHRONOSHARD_{}", id.to_uppercase());
        a.env(name)
    })
}

/// Makes the settings of the file at `path` the defaults of `cmd`'s args, after checking every
/// key names a setting and every value is one the setting takes.
pub fn with_file(cmd: clap::Command, path: &Path) -> anyhow::Result<clap::Command> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("config file {}", path.display()))?;
    let mut defaults = Vec::new();
    for (key, value) in table {
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_id().as_str() == key && !NOT_SETTINGS.contains(&key.as_str()))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "config file {}: unknown field `{key}`, expected one of {}",
                    path.display(),
                    settings(&cmd).join(", ")
                )
            })?;
        let values = strings(&value).ok_or_else(|| {
            anyhow::anyhow!(
                "config file {}: `{key}` must be a string, number, boolean or a list of them",
                path.display()
            )
        })?;
        check(arg, &values)
            .map_err(|e| anyhow::anyhow!("config file {}: `{key}`: {e}", path.display()))?;
        defaults.push((key, values));
    }
    let mut cmd = cmd;
    for (id, values) in defaults {
        // A setting the file gives is no longer missing.
        cmd = cmd.mut_arg(id, |a| a.required(false).default_values(values));
    }
    Ok(cmd)
}

/// Whether `arg` takes these values: each goes through the arg's own parser, as on the command
/// line (a flag without a value, such as `--shell`, takes `true` or `false`).
fn check(arg: &clap::Arg, values: &[String]) -> Result<(), String> {
    let Some(long) = arg.get_long() else {
        return Ok(());
    };
    if !arg.get_action().takes_values() {
        return match values {
            [v] if v == "true" || v == "false" => Ok(()),
            _ => Err("must be true or false".into()),
        };
    }
    let probe = clap::Command::new("config").no_binary_name(true).arg(
        arg.clone()
            .required(false)
            .default_values(Vec::<String>::new()),
    );
    for v in values {
        let flag = format!("--{long}={v}");
        probe
            .clone()
            .try_get_matches_from([OsStr::new(&flag)])
            .map_err(|e| {
                let e = e.to_string();
                let first = e.lines().next().unwrap_or_default();
                first.trim_start_matches("error: ").trim().to_string()
            })?;
    }
    Ok(())
}

/// The names of `cmd`'s settings, sorted.
fn settings(cmd: &clap::Command) -> Vec<String> {
    let mut v: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .filter(|id| !NOT_SETTINGS.contains(&id.as_str()))
        .collect();
    v.sort();
    v
}

/// A TOML value as the strings a flag would be given.
fn strings(v: &toml::Value) -> Option<Vec<String>> {
    Some(match v {
        toml::Value::String(s) => vec![s.clone()],
        toml::Value::Integer(i) => vec![i.to_string()],
        toml::Value::Float(f) => vec![f.to_string()],
        toml::Value::Boolean(b) => vec![b.to_string()],
        toml::Value::Array(items) => items
            .iter()
            .map(|i| match i {
                toml::Value::Array(_) => None, // a list of lists is no flag's value
                i => strings(i).map(|mut s| s.remove(0)),
            })
            .collect::<Option<Vec<_>>>()?,
        toml::Value::Datetime(_) | toml::Value::Table(_) => return None,
    })
}

/// The settings in effect as a TOML file (`--dump-config`).
pub fn dump(settings: &impl serde::Serialize) -> anyhow::Result<String> {
    Ok(toml::to_string(settings)?)
}

/// Starts the `--metrics` endpoint of a role that has no HTTP API of its own, if asked for; the
/// address it listens on.
pub async fn serve_metrics(
    addr: Option<std::net::SocketAddr>,
    stop: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<Option<std::net::SocketAddr>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let bound = chronoshard_telemetry::serve_metrics(addr, stop.clone())
        .await
        .map_err(|e| anyhow::anyhow!("--metrics {addr}: cannot listen there: {e}"))?;
    Ok(Some(bound))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_config_flag_is_found_after_its_subcommand_only() {
        let found = |a: &[&str]| path_for("worker", &args(a));
        assert_eq!(
            found(&["cs", "worker", "--id", "w", "--config", "a.toml"]),
            Some(PathBuf::from("a.toml"))
        );
        assert_eq!(
            found(&["cs", "worker", "--config=b.toml"]),
            Some(PathBuf::from("b.toml"))
        );
        // Another subcommand's arguments are not the worker's.
        if std::env::var_os("CHRONOSHARD_CONFIG").is_none() {
            assert_eq!(found(&["cs", "dev", "--config", "c.toml"]), None);
            assert_eq!(found(&["cs", "worker", "--id", "w"]), None);
        }
    }

    #[test]
    fn toml_values_become_flag_values_and_tables_do_not() {
        let v: toml::Table = toml::from_str(
            "a = \"x\"\nb = 3\nc = true\nd = [\"p\", \"q\"]\ne = 1.5\nf = { g = 1 }\nh = [[1]]\n",
        )
        .unwrap();
        assert_eq!(strings(&v["a"]), Some(vec!["x".into()]));
        assert_eq!(strings(&v["b"]), Some(vec!["3".into()]));
        assert_eq!(strings(&v["c"]), Some(vec!["true".into()]));
        assert_eq!(strings(&v["d"]), Some(vec!["p".into(), "q".into()]));
        assert_eq!(strings(&v["e"]), Some(vec!["1.5".into()]));
        assert_eq!(strings(&v["f"]), None);
        assert_eq!(strings(&v["h"]), None);
    }

    #[test]
    fn every_setting_gets_a_variable_unless_it_names_its_own() {
        #[derive(clap::Parser)]
        struct Role {
            #[arg(long)]
            node_id: String,
            #[arg(long, env = "CHRONOSHARD_OTHER")]
            data: Option<String>,
            #[arg(long)]
            config: Option<String>,
        }
        let cmd = with_env(<Role as clap::CommandFactory>::command());
        let env = |id: &str| {
            cmd.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned())
        };
        assert_eq!(env("node_id").as_deref(), Some("CHRONOSHARD_NODE_ID"));
        assert_eq!(env("data").as_deref(), Some("CHRONOSHARD_OTHER"));
        assert_eq!(env("config"), None);
    }
}
