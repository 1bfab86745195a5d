//! Executors: what turns a ticket into an outcome. Each returns an `Outcome` and never panics
//! the worker; a failure of the target is a failed outcome, not an error of the worker.

pub mod http;

/// How one attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub ok: bool,
    pub error: Option<String>,
    pub http_status: Option<u16>,
}

impl Outcome {
    pub fn failed(error: impl Into<String>) -> Outcome {
        Outcome {
            ok: false,
            error: Some(error.into()),
            http_status: None,
        }
    }
}
