//! Names the commit the binary was built from in `chronoshard --version`, so that a bug report
//! or a benchmark figure says which code it is about. Outside a git checkout (a source tarball,
//! no git installed) the version says "unknown commit".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    let commit =
        git(&["rev-parse", "--short=7", "HEAD"]).unwrap_or_else(|| "unknown commit".into());
    println!("cargo:rustc-env=CHRONOSHARD_COMMIT={commit}");
    // Rebuilt when HEAD moves: HEAD itself, the branch it points to, and packed refs (paths
    // through `--git-path`, which also finds them from a worktree). Only existing files are
    // named: Cargo reruns the script on every build for a path that does not exist.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    // Without any rerun-if-changed line Cargo would rerun the script on every change in the
    // package; with only git's files named, edits to the sources do not rerun it.
    println!("cargo:rerun-if-changed=build.rs");
}
