//! A warning an answer carries beside its data: the request did what it asked, but something
//! the caller should know stands in the way of the result (no live worker serves the job's
//! queue, so its tickets wait). Warnings are computed when the answer is made; they are never
//! stored.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Something the caller should know about a job or run the answer shows; the request itself
/// succeeded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Warning {
    pub code: WarningCode,
    /// What stands in the way and what to do about it, for a person.
    pub message: String,
}

/// What a warning is about; matched by clients, so codes are only ever added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WarningCode {
    /// No live worker serves the job's queue: its tickets wait, queued, until one does.
    QueueUnserved,
}

impl Warning {
    /// The warning for a job or run whose `queue` no live worker serves.
    pub fn queue_unserved(queue: &str) -> Warning {
        let remedy = match queue {
            "http" => "start `chronoshard worker`".to_string(),
            "shell" => "start `chronoshard worker --shell`".to_string(),
            _ => format!("start a worker that consumes the queue {queue:?}"),
        };
        Warning {
            code: WarningCode::QueueUnserved,
            message: format!(
                "no live worker serves the queue {queue:?}: its tickets wait, queued, until one \
                 does ({remedy})"
            ),
        }
    }
}
