//! The safe side of a plugin: the [`Strategy`] trait a plugin implements, and the JSON handling
//! around it that the C entry points in [`crate::abi`] run. Nothing here touches raw pointers;
//! catching panics is the entry points' job.

use serde::{de::DeserializeOwned, Deserialize};
use serde_json::Value;

use crate::{abi::Status, Assignment, Input, Output};

/// An assignment strategy: a pure function from the cluster, the assignment in force and the
/// strategy's configuration to a new assignment.
///
/// # Contract
/// - Pure and deterministic: the same input gives the same output on every control-plane replica,
///   whatever the order of `input.nodes` and `input.shards`. No I/O, no clock, no randomness.
/// - Every shard of the input appears exactly once in the output, on a node of the input that is
///   not draining, and no node gets more shards than its `capacity`. When that is impossible,
///   return an error: the host keeps the assignment in force.
/// - Stable: called again with its own output as `previous` and nothing else changed, it returns
///   that output unchanged.
/// - Quick: the host gives each call a deadline (a second by default) and disables a strategy that
///   misses it.
pub trait Strategy {
    /// The name the strategy is listed under when it is built in.
    const NAME: &'static str;

    /// The strategy's settings, read from the `config` JSON of the cluster settings; `null`
    /// stands for `Config::default()`.
    type Config: DeserializeOwned + Default;

    /// Checks a parsed config further than its type does (ranges, combinations). The host calls
    /// this before activating a config, and every `assign` checks again.
    fn check_config(config: &Self::Config) -> Result<(), String> {
        let _ = config;
        Ok(())
    }

    /// Computes the new assignment, or says why there is none.
    fn assign(input: &Input, config: &Self::Config) -> Result<Assignment, String>;
}

/// Why a call produced no answer: the status the entry point returns, and a message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) status: Status,
    pub(crate) message: String,
}

impl Failure {
    fn new(status: Status, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }
}

/// Parses and checks a strategy's config; `null` is the default config.
pub fn parse_config<S: Strategy>(value: &Value) -> Result<S::Config, String> {
    let config = if value.is_null() {
        S::Config::default()
    } else {
        S::Config::deserialize(value).map_err(|e| e.to_string())?
    };
    S::check_config(&config)?;
    Ok(config)
}

/// `assign` from JSON bytes to JSON bytes: the body of the C entry point.
pub(crate) fn run_assign<S: Strategy>(input: &[u8]) -> Result<Vec<u8>, Failure> {
    let input: Input = serde_json::from_slice(input)
        .map_err(|e| Failure::new(Status::BadInput, format!("input: {e}")))?;
    let config = parse_config::<S>(&input.config)
        .map_err(|e| Failure::new(Status::BadConfig, format!("config: {e}")))?;
    let assignment = S::assign(&input, &config).map_err(|e| Failure::new(Status::Rejected, e))?;
    serde_json::to_vec(&Output { assignment })
        .map_err(|e| Failure::new(Status::Rejected, format!("output: {e}")))
}

/// `validate_config` from JSON bytes: the body of the C entry point. The body of a success is
/// empty.
pub(crate) fn run_validate<S: Strategy>(config: &[u8]) -> Result<Vec<u8>, Failure> {
    let value: Value = serde_json::from_slice(config)
        .map_err(|e| Failure::new(Status::BadInput, format!("config is not JSON: {e}")))?;
    parse_config::<S>(&value).map_err(|e| Failure::new(Status::BadConfig, e))?;
    Ok(Vec::new())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Config {
        #[serde(default)]
        node: Option<String>,
    }

    /// Puts every shard on the configured node.
    struct AllOnOne;

    impl Strategy for AllOnOne {
        const NAME: &'static str = "all-on-one";
        type Config = Config;

        fn check_config(config: &Config) -> Result<(), String> {
            match &config.node {
                Some(node) if node.is_empty() => Err("node must not be empty".into()),
                _ => Ok(()),
            }
        }

        fn assign(input: &Input, config: &Config) -> Result<Assignment, String> {
            let node = config.node.clone().ok_or("no node configured")?;
            Ok(input
                .shard_ids()
                .into_iter()
                .map(|s| (s, node.clone()))
                .collect())
        }
    }

    #[test]
    fn config_null_is_the_default_and_checks_run_after_parsing() {
        assert!(parse_config::<AllOnOne>(&Value::Null).is_ok());
        assert!(parse_config::<AllOnOne>(&json!({"node": ""})).is_err());
        assert!(parse_config::<AllOnOne>(&json!({"nod": "a"})).is_err());
        assert_eq!(run_validate::<AllOnOne>(br#"{"node":"a"}"#), Ok(Vec::new()));
        assert_eq!(
            run_validate::<AllOnOne>(b"{").unwrap_err().status,
            Status::BadInput
        );
    }

    #[test]
    fn each_kind_of_failure_has_its_status() {
        let input = |config: Value| {
            serde_json::to_vec(&json!({"shards": [{"id": 1}], "nodes": [], "config": config}))
                .unwrap()
        };
        let ok = run_assign::<AllOnOne>(&input(json!({"node": "a"}))).unwrap();
        assert_eq!(ok, br#"{"assignment":{"1":"a"}}"#);
        let status = |bytes: &[u8]| run_assign::<AllOnOne>(bytes).unwrap_err().status;
        assert_eq!(status(b"[1, 2"), Status::BadInput);
        assert_eq!(status(&input(json!({"node": 3}))), Status::BadConfig);
        assert_eq!(status(&input(Value::Null)), Status::Rejected);
    }
}
