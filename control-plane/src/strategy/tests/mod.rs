//! The host's tests against real libraries. The test plugins, the zone-affinity example and two
//! built-ins as files are built once per test binary (`cargo build` into `target/test-plugins`,
//! beside the workspace's own target dir so the two builds never wait on each other's lock) and
//! copied into temporary plugin directories.

mod faults;
mod loading;
mod suite;

use std::{
    env::consts::{DLL_PREFIX, DLL_SUFFIX},
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Duration,
};

use tempfile::TempDir;

use super::{plugin_file_name, Options, Registry};

/// What the tests load, with the cargo feature that makes each a plugin where it needs one.
/// Round-robin is built without it on purpose: a library that exports nothing.
const CRATES: [(&str, Option<&str>); 6] = [
    ("chronoshard-test-plugin-faulty", None),
    ("chronoshard-test-plugin-raw", None),
    ("chronoshard-test-plugin-future-abi", None),
    ("chronoshard-plugin-zone-affinity", None),
    ("chronoshard-strategy-balanced", Some("plugin")),
    ("chronoshard-strategy-round-robin", None),
];

/// A deadline no healthy call comes near, for tests that are not about deadlines.
pub(crate) const GENEROUS: Duration = Duration::from_secs(30);

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the control plane sits in the workspace")
}

/// Builds [`CRATES`] on first use; the directory holding the libraries.
fn built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let target = workspace_root().join("target").join("test-plugins");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut command = Command::new(cargo);
        command
            .current_dir(workspace_root())
            .args(["build", "--locked", "--quiet", "--target-dir"])
            .arg(&target);
        for (krate, feature) in CRATES {
            command.args(["-p", krate]);
            if let Some(feature) = feature {
                command.args(["--features", &format!("{krate}/{feature}")]);
            }
        }
        let status = command.status().expect("cargo could not be run");
        assert!(
            status.success(),
            "building the test plugins failed: {status}"
        );
        target.join("debug")
    })
}

/// The library file cargo made for `krate`.
pub(crate) fn library(krate: &str) -> PathBuf {
    let file = format!("{DLL_PREFIX}{}{DLL_SUFFIX}", krate.replace('-', "_"));
    built().join(file)
}

/// A temporary plugin directory holding each `(crate, name)` as `<name>.so`.
pub(crate) fn plugin_dir(plugins: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (krate, name) in plugins {
        let to = dir.path().join(plugin_file_name(name));
        fs::copy(library(krate), &to).unwrap_or_else(|e| panic!("copy {krate} to {to:?}: {e}"));
    }
    dir
}

/// A registry loading from `dir`, with `deadline`.
pub(crate) fn registry(dir: &TempDir, deadline: Duration) -> Registry {
    Registry::new(Options {
        plugin_dir: Some(dir.path().to_path_buf()),
        deadline,
    })
}
