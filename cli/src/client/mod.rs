//! The client verbs of `chronoshard` (`jobs`, `runs`, `tickets`, `dlq`, `preview`, `shards`,
//! `nodes`, `workers`, `tokens`, `workflows`): calls of the REST API for operators and scripts.
//!
//! This module owns the settings every verb shares (where the API is, the token, the output
//! format: [`ApiArgs`]), the client's error type and the one mapping from an error to the
//! process's exit code ([`ClientError::exit_code`]). The parts:
//! - `profile`: the profiles file and resolving flag > variable > profile > default;
//! - `http`: the HTTP client (bearer token, problem documents);
//! - `commands`: the verbs, one function each;
//! - `jobs`: the body of `jobs create` from a JSON or TOML file and flags;
//! - `workflows`: the `workflows` verbs;
//! - `output`: tables for people, the API's JSON as-is for scripts.
//!
//! A new resource (e.g. `tokens list|create|revoke`) is a variant of [`ClientCommand`], a
//! subcommand enum and one function per verb in `commands`, and a table in `output`.

mod commands;
mod http;
mod jobs;
mod output;
mod profile;
mod workflows;

use std::path::PathBuf;

pub use commands::ClientCommand;
pub use http::{Client, Problem};
pub use output::Format;
pub use profile::{Connection, DEFAULT_URL};

/// Exit codes of the client verbs. Scripts may rely on them (docs/cli.md lists them).
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// Anything not listed below (a 500, an answer that is not what the API sends).
    pub const FAILURE: u8 = 1;
    /// Bad usage or input: rejected by the command line, or by the API (400, 413, 422).
    pub const USAGE: u8 = 2;
    /// Not found (404).
    pub const NOT_FOUND: u8 = 3;
    /// Conflict with the resource's state (409), e.g. pausing a deleted job.
    pub const CONFLICT: u8 = 4;
    /// No or a wrong token (401), or not allowed (403).
    pub const AUTH: u8 = 5;
    /// Worth retrying as it is: 429, 502, 503, 504, the API unreachable or too slow.
    pub const RETRYABLE: u8 = 6;
}

/// Where the API is, how to authenticate and how to print: shared by every client verb, and
/// accepted before or after the verb (`chronoshard jobs --url U list`, `chronoshard jobs list
/// --url U`).
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Connection and output")]
pub struct ApiArgs {
    /// Base URL of the REST API [default: the profile's `url`, else http://127.0.0.1:8080].
    #[arg(long, env = "CHRONOSHARD_URL", global = true, value_name = "URL")]
    pub url: Option<String>,
    /// Bearer token of the API [default: the profile's `token`].
    #[arg(
        long,
        env = "CHRONOSHARD_TOKEN",
        global = true,
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// Profile to read from the profiles file.
    #[arg(
        long,
        env = "CHRONOSHARD_PROFILE",
        global = true,
        default_value = "default",
        value_name = "NAME"
    )]
    pub profile: String,
    /// Profiles file [default: $XDG_CONFIG_HOME/chronoshard/profiles.toml, else
    /// ~/.config/chronoshard/profiles.toml].
    #[arg(long, env = "CHRONOSHARD_PROFILES", global = true, value_name = "FILE")]
    pub profiles: Option<PathBuf>,
    /// Output: `table` for people, `json` for the API's JSON as-is (pretty-printed).
    #[arg(
        short,
        long,
        env = "CHRONOSHARD_OUTPUT",
        global = true,
        value_enum,
        default_value_t = Format::Table
    )]
    pub output: Format,
    /// How long one API call may take before it counts as failed (retryable, exit code 6).
    #[arg(
        long,
        env = "CHRONOSHARD_REQUEST_TIMEOUT",
        global = true,
        default_value = "30s",
        value_name = "DURATION"
    )]
    pub request_timeout: chronoshard_wire::Dur,
}

/// Why a client verb failed. Each variant has one exit code ([`ClientError::exit_code`]).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The command line or a file it names is unusable (before any call).
    #[error("{0}")]
    Usage(String),
    /// The API answered with an error status.
    #[error("{}", http::describe(*status, problem.as_deref(), body))]
    Api {
        status: u16,
        /// The problem document, when the body is one (boxed: errors stay small).
        problem: Option<Box<Problem>>,
        /// The body as received (shown when it is not a problem document).
        body: String,
    },
    /// The API could not be reached, or did not answer in time.
    #[error("cannot reach {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The call failed otherwise (the request could not be sent, the answer could not be read
    /// or is not what the API sends).
    #[error("{0}")]
    Transport(String),
    /// Writing the output failed.
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
}

impl ClientError {
    /// The one mapping from a failure to the process's exit code (the `exit` constants).
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Usage(_) => exit::USAGE,
            ClientError::Api { status, .. } => match status {
                400 | 413 | 422 => exit::USAGE,
                404 => exit::NOT_FOUND,
                409 => exit::CONFLICT,
                401 | 403 => exit::AUTH,
                429 | 502 | 503 | 504 => exit::RETRYABLE,
                _ => exit::FAILURE,
            },
            ClientError::Unreachable { .. } => exit::RETRYABLE,
            ClientError::Transport(_) | ClientError::Output(_) => exit::FAILURE,
        }
    }
}

impl ApiArgs {
    /// The connection these settings, the environment and the profiles file give.
    pub fn connection(&self) -> Result<Connection, ClientError> {
        profile::resolve(self)
    }

    /// A client of the API these settings name.
    pub fn client(&self) -> Result<Client, ClientError> {
        Client::new(self.connection()?, self.request_timeout.0)
    }
}

/// Runs a client verb; prints what it got (stdout) or one line saying what failed (stderr) and
/// returns the process's exit code.
pub async fn run(command: ClientCommand) -> u8 {
    match commands::run(command).await {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("error: {}", one_line(&e.to_string()));
            e.exit_code()
        }
    }
}

/// `text` on one line: line breaks become spaces.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16) -> ClientError {
        ClientError::Api {
            status,
            problem: None,
            body: String::new(),
        }
    }

    #[test]
    fn each_failure_has_its_exit_code() {
        let cases = [
            (ClientError::Usage("x".into()), 2),
            (api(400), 2),
            (api(413), 2),
            (api(422), 2),
            (api(404), 3),
            (api(409), 4),
            (api(401), 5),
            (api(403), 5),
            (api(429), 6),
            (api(502), 6),
            (api(503), 6),
            (api(504), 6),
            (api(500), 1),
            (api(418), 1),
            (
                ClientError::Unreachable {
                    url: "u".into(),
                    reason: "r".into(),
                },
                6,
            ),
            (ClientError::Transport("x".into()), 1),
            (
                ClientError::Output(std::io::ErrorKind::BrokenPipe.into()),
                1,
            ),
        ];
        for (error, code) in cases {
            assert_eq!(error.exit_code(), code, "{error:?}");
        }
    }

    #[test]
    fn messages_are_one_line() {
        assert_eq!(one_line("a\n  b\r\nc "), "a b c");
    }
}
