//! Which file a plugin name stands for. Plugins are loaded by name, never by path: a name is
//! checked as text first (no `/`, no `..`, a short set of characters), then resolved inside the
//! configured directory with symlinks followed, and refused if it ends up outside. Touches the
//! file system only to resolve; opening the library is `library.rs`'s job.

use std::{
    io,
    path::{Path, PathBuf},
};

use super::Error;

/// Longest plugin name accepted.
pub const MAX_NAME_LEN: usize = 64;

/// Accepts a plugin name made of ASCII letters, digits, `_`, `-` and `.` (not first, never
/// `..`), at most [`MAX_NAME_LEN`] long. No file system access.
pub fn check_name(name: &str) -> Result<(), Error> {
    let refuse = |reason| {
        Err(Error::BadName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return refuse("empty");
    }
    if name.len() > MAX_NAME_LEN {
        return refuse("longer than 64 characters");
    }
    if name.contains(['/', '\\']) {
        return refuse("a path, not a name");
    }
    if name.contains("..") {
        return refuse("contains '..'");
    }
    if name.starts_with('.') {
        return refuse("starts with '.'");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return refuse("only ASCII letters, digits, '_', '-' and '.' are allowed");
    }
    Ok(())
}

/// The file a plugin name stands for: `<name>.so` on Linux (the platform's library suffix).
pub fn file_name(name: &str) -> String {
    format!("{name}{}", std::env::consts::DLL_SUFFIX)
}

/// The real path of plugin `name` in `dir`, symlinks resolved, refused when it leaves `dir` or
/// is not a regular file.
pub fn resolve(dir: &Path, name: &str) -> Result<PathBuf, Error> {
    check_name(name)?;
    let unreadable = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Unreadable { path, source }
    };
    let dir = dir.canonicalize().map_err(unreadable(dir))?;
    let candidate = dir.join(file_name(name));
    let target = match candidate.canonicalize() {
        Ok(target) => target,
        // A dangling symlink lands here too.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::NotFound {
                name: name.to_string(),
                path: candidate,
            })
        }
        Err(e) => return Err(unreadable(&candidate)(e)),
    };
    // Component-wise: `/plugins-other` does not start with `/plugins`.
    if !target.starts_with(&dir) {
        return Err(Error::OutsideDir {
            name: name.to_string(),
            target,
        });
    }
    if !target.is_file() {
        return Err(Error::NotFound {
            name: name.to_string(),
            path: target,
        });
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass_and_paths_do_not() {
        for good in ["zone-affinity", "two_level", "v1.2", "A9"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "", "../evil", "a/b", "..", "a..b", ".hidden", "a\\b", "sp ace", "é", "x\0",
        ] {
            assert!(
                matches!(check_name(bad), Err(Error::BadName { .. })),
                "{bad:?}"
            );
        }
        assert!(check_name(&"a".repeat(MAX_NAME_LEN)).is_ok());
        assert!(check_name(&"a".repeat(MAX_NAME_LEN + 1)).is_err());
    }
}
