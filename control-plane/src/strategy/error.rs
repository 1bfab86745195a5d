//! The strategy module's one error type. Callers match on its variants: loading errors are the
//! operator's to fix (400/404/409-like), call errors mean "keep the assignment in force".

use std::{io, path::PathBuf, time::Duration};

use super::Violation;

/// Everything that can go wrong loading or calling a strategy.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No plugin directory is configured, so nothing can be loaded from a file.
    #[error("no plugin directory is configured; only built-in strategies are available")]
    NoPluginDir,
    /// The plugin name is not a plain name (a path, `..`, a character outside the allowed set).
    #[error("plugin name {name:?} refused: {reason}")]
    BadName { name: String, reason: &'static str },
    /// The plugin directory or a file in it could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// No file for that name in the plugin directory.
    #[error("plugin {name:?} not found: no file {}", path.display())]
    NotFound { name: String, path: PathBuf },
    /// The name resolves (through a symlink) to a file outside the plugin directory.
    #[error("plugin {name:?} resolves to {}, outside the plugin directory", target.display())]
    OutsideDir { name: String, target: PathBuf },
    /// The file is not a loadable library.
    #[error("plugin {name:?} could not be loaded: {source}")]
    Open {
        name: String,
        #[source]
        source: libloading::Error,
    },
    /// The library loads but is not a chronoshard strategy plugin.
    #[error("plugin {name:?} is not a strategy plugin: {reason}")]
    NotAPlugin { name: String, reason: String },
    /// The plugin was built for another plugin ABI version.
    #[error(
        "plugin {name:?} speaks plugin ABI version {found}; this control plane speaks {expected}"
    )]
    AbiMismatch {
        name: String,
        found: u32,
        expected: u32,
    },
    /// A built-in strategy already has that name.
    #[error("{name:?} is a built-in strategy; a plugin cannot take its name")]
    BuiltinName { name: String },
    /// No strategy of that name is registered.
    #[error("no strategy named {name:?}; load it from the plugin directory first")]
    Unknown { name: String },
    /// The strategy was disabled after a call missed its deadline.
    #[error("strategy {name:?} is disabled: a call missed its deadline (a restart re-enables it)")]
    Disabled { name: String },
    /// The call missed its deadline; the strategy is disabled from now on.
    #[error("strategy {name:?} did not answer within {deadline:?} and is now disabled")]
    Timeout { name: String, deadline: Duration },
    /// The strategy panicked (caught at the plugin boundary).
    #[error("strategy {name:?} panicked: {message}")]
    Panicked { name: String, message: String },
    /// The strategy refused the config.
    #[error("strategy {name:?} refused its config: {message}")]
    BadConfig { name: String, message: String },
    /// The strategy returned an error (for instance, not enough room for every shard).
    #[error("strategy {name:?} found no assignment: {message}")]
    Failed { name: String, message: String },
    /// The strategy could not read the input the host sent (host and plugin disagree on the schema).
    #[error("strategy {name:?} could not read its input: {message}")]
    InputRefused { name: String, message: String },
    /// The input is unusable before any strategy sees it (a node or shard listed twice).
    #[error("strategy input refused: {reason}")]
    InvalidInput { reason: String },
    /// The strategy broke the ABI: a null or oversized reply, an unknown status, bytes that are
    /// not the expected JSON.
    #[error("strategy {name:?} gave an unreadable reply: {reason}")]
    BadReply { name: String, reason: String },
    /// The strategy answered an assignment that breaks the rules.
    #[error("strategy {name:?} returned an invalid assignment: {violation}")]
    InvalidAssignment { name: String, violation: Violation },
    /// No thread could be started for the call.
    #[error("cannot start a thread for strategy {name:?}: {source}")]
    Spawn {
        name: String,
        #[source]
        source: io::Error,
    },
    /// The thread running the call ended without an answer (a bug on the host's side of it).
    #[error("the call to strategy {name:?} ended without an answer")]
    Lost { name: String },
}

impl Error {
    /// A short, fixed name for the kind of failure: the `reason` label of
    /// `chronoshard_strategy_errors_total` and of the last error `GET /v1/plugins` shows, so
    /// the label set stays bounded whatever a plugin writes in its messages.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::NoPluginDir
            | Error::BadName { .. }
            | Error::Unreadable { .. }
            | Error::NotFound { .. }
            | Error::OutsideDir { .. }
            | Error::Open { .. }
            | Error::NotAPlugin { .. }
            | Error::AbiMismatch { .. }
            | Error::BuiltinName { .. } => "load",
            Error::Unknown { .. } => "not_loaded",
            Error::Disabled { .. } => "disabled",
            Error::Timeout { .. } => "timeout",
            Error::Panicked { .. } => "panicked",
            Error::BadConfig { .. } => "bad_config",
            Error::Failed { .. } => "failed",
            Error::InputRefused { .. } | Error::InvalidInput { .. } => "input",
            Error::BadReply { .. } => "bad_reply",
            Error::InvalidAssignment { .. } => "invalid_assignment",
            Error::Spawn { .. } | Error::Lost { .. } => "host",
        }
    }
}
