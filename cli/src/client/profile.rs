//! The profiles file and where a verb's connection comes from.
//!
//! The file is TOML, one table per profile, each with an optional `url` and `token`:
//!
//! ```toml
//! [default]
//! url = "http://127.0.0.1:8080"
//! token = "..."
//!
//! [staging]
//! url = "https://chronoshard.staging.example:8443"
//! token = "..."
//! ```
//!
//! Each setting comes from the first of: its flag, its variable (both handled by clap), the
//! selected profile, the default (`http://127.0.0.1:8080`, no token). The file is read only when
//! a setting is still missing after the flag and the variable; then a profile other than
//! `default` that is not there, a `--profiles` file that does not exist, and a file that does not
//! parse are errors.

use std::{collections::BTreeMap, fmt, path::PathBuf};

use serde::Deserialize;

use super::{ApiArgs, ClientError};

/// Where the API is when nothing says otherwise: what `chronoshard dev` serves by default.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";

/// The profile that is used when none is named.
const DEFAULT_PROFILE: &str = "default";

/// One profile of the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Profile {
    url: Option<String>,
    token: Option<String>,
}

/// Where the API is and the token to present.
#[derive(Clone)]
pub struct Connection {
    /// Base URL, without a trailing `/`.
    pub url: String,
    pub token: Option<String>,
}

impl fmt::Debug for Connection {
    /// Never shows the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

/// The connection of `args`: flag or variable, else the profile, else the default.
pub fn resolve(args: &ApiArgs) -> Result<Connection, ClientError> {
    let profile = if args.url.is_some() && args.token.is_some() {
        Profile::default()
    } else {
        load(args)?
    };
    let url = args
        .url
        .clone()
        .or(profile.url)
        .unwrap_or_else(|| DEFAULT_URL.to_string());
    Ok(Connection {
        url: url.trim_end_matches('/').to_string(),
        token: args.token.clone().or(profile.token),
    })
}

/// `$XDG_CONFIG_HOME/chronoshard/profiles.toml`, else `$HOME/.config/chronoshard/profiles.toml`.
pub fn default_path() -> Option<PathBuf> {
    let absolute = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    absolute("XDG_CONFIG_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".config")))
        .map(|dir| dir.join("chronoshard").join("profiles.toml"))
}

/// The selected profile from the file; an empty one when there is no file and none was asked for.
fn load(args: &ApiArgs) -> Result<Profile, ClientError> {
    let named = args.profile != DEFAULT_PROFILE;
    let Some(path) = args.profiles.clone().or_else(default_path) else {
        return if named {
            Err(ClientError::Usage(format!(
                "profile {:?}: no profiles file (set HOME, XDG_CONFIG_HOME or --profiles)",
                args.profile
            )))
        } else {
            Ok(Profile::default())
        };
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !named && args.profiles.is_none() => {
            return Ok(Profile::default())
        }
        Err(e) => {
            return Err(ClientError::Usage(format!(
                "cannot read the profiles file {}: {e}",
                path.display()
            )))
        }
    };
    let mut profiles: BTreeMap<String, Profile> = toml::from_str(&text).map_err(|e| {
        ClientError::Usage(format!(
            "{}: not a profiles file: {}",
            path.display(),
            e.message()
        ))
    })?;
    match profiles.remove(&args.profile) {
        Some(p) => Ok(p),
        None if named => Err(ClientError::Usage(format!(
            "profile {:?} is not in {}",
            args.profile,
            path.display()
        ))),
        None => Ok(Profile::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(file: &std::path::Path, profile: &str) -> ApiArgs {
        ApiArgs {
            url: None,
            token: None,
            profile: profile.into(),
            profiles: Some(file.to_path_buf()),
            output: super::super::Format::Table,
            request_timeout: "30s".parse().unwrap(),
        }
    }

    #[test]
    fn flags_beat_the_profile_which_beats_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.toml");
        std::fs::write(
            &file,
            "[default]\nurl = \"http://d:1/\"\ntoken = \"dt\"\n[other]\ntoken = \"ot\"\n",
        )
        .unwrap();
        let c = resolve(&args(&file, "default")).unwrap();
        assert_eq!(
            (c.url.as_str(), c.token.as_deref()),
            ("http://d:1", Some("dt"))
        );
        let c = resolve(&args(&file, "other")).unwrap();
        assert_eq!(
            (c.url.as_str(), c.token.as_deref()),
            (DEFAULT_URL, Some("ot"))
        );
        let mut a = args(&file, "other");
        a.url = Some("http://flag:2".into());
        let c = resolve(&a).unwrap();
        assert_eq!(
            (c.url.as_str(), c.token.as_deref()),
            ("http://flag:2", Some("ot"))
        );
        assert!(!format!("{c:?}").contains("ot\""), "{c:?}");
    }

    #[test]
    fn a_missing_profile_or_file_is_a_usage_error_unless_nothing_was_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.toml");
        std::fs::write(&file, "[default]\nurl = \"http://d:1\"\n").unwrap();
        let err = resolve(&args(&file, "nope")).unwrap_err();
        assert!(
            matches!(err, ClientError::Usage(ref m) if m.contains("\"nope\"")),
            "{err}"
        );
        let missing = dir.path().join("missing.toml");
        assert!(matches!(
            resolve(&args(&missing, "default")),
            Err(ClientError::Usage(_))
        ));
        std::fs::write(&file, "[default]\nuri = \"x\"\n").unwrap();
        let err = resolve(&args(&file, "default")).unwrap_err();
        assert!(
            matches!(err, ClientError::Usage(ref m) if m.contains("uri")),
            "{err}"
        );
    }
}
