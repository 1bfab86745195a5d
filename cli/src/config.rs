//! Configuration files of the production roles: `--config FILE` (TOML, or `CHRONOSHARD_CONFIG`)
//! holds the same settings as the flags, named as the flags with `_` for `-`. Precedence is
//! defaults < file < environment < flags: the file's values become the flags' defaults before
//! the command line is parsed, so clap's own order (flag, then variable, then default) does the
//! rest. Unknown keys and wrong types are errors naming the key.
//!
//! It owns reading the file; what a role does with its settings is the role's.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use anyhow::Context;
use serde::de::DeserializeOwned;

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

/// Reads a role's settings file.
pub fn load<T: DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
}

/// One setting of a file as a flag default: its value, or `None` when the file leaves it out.
pub fn one(v: &Option<impl ToString>) -> Option<Vec<String>> {
    v.as_ref().map(|v| vec![v.to_string()])
}

/// A path setting as a flag default.
pub fn path(v: &Option<PathBuf>) -> Option<Vec<String>> {
    v.as_ref().map(|d| vec![d.display().to_string()])
}

/// The settings a file gives, as (arg id → values) for [`with_defaults`].
pub fn given(
    settings: impl IntoIterator<Item = (&'static str, Option<Vec<String>>)>,
) -> Vec<(&'static str, Vec<String>)> {
    settings
        .into_iter()
        .filter_map(|(id, v)| Some((id, v?)))
        .collect()
}

/// Makes `values` (arg id → its values from the file) the defaults of `cmd`'s args.
pub fn with_defaults(
    mut cmd: clap::Command,
    values: Vec<(&'static str, Vec<String>)>,
) -> clap::Command {
    for (id, vals) in values {
        cmd = cmd.mut_arg(id, |a| {
            // A setting the file gives is no longer missing.
            a.required(false).default_values(vals)
        });
    }
    cmd
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
}
