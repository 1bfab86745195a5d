//! The one mapping from errors to HTTP: every failure of the REST API is an `ApiError`, answered as
//! RFC 9457 `application/problem+json` with a stable `code`. The OpenAPI document describes the
//! same `Problem` shape, so clients can rely on it.

use axum::{
    http::{header, StatusCode},
    response::{IntoResponse, Response},
};
use chronoshard_wire::rpc::{RpcError, RpcErrorCode};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An RFC 9457 problem document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// `urn:chronoshard:problem:<code>`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Stable, machine-readable error code.
    pub code: String,
    /// For input errors: the dotted path of the offending field (e.g. `schedule.cron`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// One row of the error table: an answer's status, stable code and title, and which operations
/// can give it. The OpenAPI document's error responses are made from these rows (`spec`), so a
/// route's annotation lists only its successes.
#[derive(Debug)]
pub struct Kind {
    pub status: StatusCode,
    pub code: &'static str,
    pub title: &'static str,
    /// For the OpenAPI document: when this answer can come.
    pub when: &'static str,
    pub applies: Applies,
}

/// Which operations can give an error.
#[derive(Debug)]
pub enum Applies {
    /// Every `/v1` operation.
    EveryV1,
    /// Every operation that reads a body, a query or a path parameter.
    WithInput,
    /// Every operation that reads a body.
    WithBody,
    /// Every operation with a path parameter, or a `tenant` filter a tenant token may not use.
    WithIdOrTenant,
    /// Every operation a tenant token may not use, and these.
    AdminOnlyAnd(&'static [&'static str]),
    /// These operations (by operation id).
    Only(&'static [&'static str]),
}

/// The rows of the error table, one constant per code.
pub mod kinds {
    use super::{Applies::*, Kind, StatusCode};

    pub const INVALID_JSON: Kind = Kind {
        status: StatusCode::BAD_REQUEST,
        code: "invalid_json",
        title: "Request body is not valid JSON",
        when: "the body is not JSON",
        applies: WithBody,
    };
    pub const INVALID_FIELD: Kind = Kind {
        status: StatusCode::BAD_REQUEST,
        code: "invalid_field",
        title: "A field is invalid",
        when: "a field or parameter is missing, unknown, of the wrong type or invalid; `field` names it",
        applies: WithInput,
    };
    pub const UNAUTHORIZED: Kind = Kind {
        status: StatusCode::UNAUTHORIZED,
        code: "unauthorized",
        title: "Unauthorized",
        when: "no, a wrong, a revoked or an expired bearer token",
        applies: EveryV1,
    };
    pub const FORBIDDEN: Kind = Kind {
        status: StatusCode::FORBIDDEN,
        code: "forbidden",
        title: "Forbidden",
        when:
            "a tenant token on an admin endpoint, or creating a job or workflow of another tenant",
        applies: AdminOnlyAnd(&["create_job", "create_workflow"]),
    };
    pub const NOT_FOUND: Kind = Kind {
        status: StatusCode::NOT_FOUND,
        code: "not_found",
        title: "Not found",
        when: "no such resource (to a tenant token: also another tenant's)",
        applies: WithIdOrTenant,
    };
    pub const CONFLICT: Kind = Kind {
        status: StatusCode::CONFLICT,
        code: "conflict",
        title: "Conflict",
        when: "the change does not fit the current state",
        applies: Only(&[
            "patch_job",
            "delete_job",
            "pause_job",
            "resume_job",
            "trigger_job",
            "patch_workflow",
            "delete_workflow",
            "pause_workflow",
            "resume_workflow",
            "trigger_workflow",
            "retry_workflow_run",
            "replay",
            "trigger_tenant",
            "put_settings",
            "load_plugin",
            "put_strategy",
            "add_shards",
        ]),
    };
    pub const IDEMPOTENCY_KEY_REUSED: Kind = Kind {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        code: "idempotency_key_reused",
        title: "Idempotency-Key reused",
        when: "the tenant used this Idempotency-Key for a different job or workflow",
        applies: Only(&["create_job", "create_workflow"]),
    };
    pub const UNAVAILABLE: Kind = Kind {
        status: StatusCode::SERVICE_UNAVAILABLE,
        code: "unavailable",
        title: "Service unavailable",
        when: "a shard's owner or the cluster state could not be reached; retry",
        applies: EveryV1,
    };
    pub const PLUGIN_UNUSABLE: Kind = Kind {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        code: "plugin_unusable",
        title: "The plugin file cannot be used",
        when: "the file is not a usable strategy plugin",
        applies: Only(&["load_plugin"]),
    };
    pub const STRATEGY_DISABLED: Kind = Kind {
        status: StatusCode::CONFLICT,
        code: "strategy_disabled",
        title: "The strategy is disabled",
        when: "the strategy missed a deadline and was disabled",
        applies: Only(&["put_strategy"]),
    };
    pub const STRATEGY_FAILED: Kind = Kind {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        code: "strategy_failed",
        title: "The strategy failed",
        when: "the strategy fails on the cluster as it is",
        applies: Only(&["put_strategy"]),
    };
    pub const TOO_LARGE: Kind = Kind {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        code: "too_large",
        title: "Content too large",
        when: "the body, or a job's payload, is larger than the API takes",
        applies: WithBody,
    };
    pub const URI_TOO_LONG: Kind = Kind {
        status: StatusCode::URI_TOO_LONG,
        code: "uri_too_long",
        title: "URI too long",
        when: "the request URL is longer than 8 KiB",
        applies: EveryV1,
    };
    pub const RATE_LIMITED: Kind = Kind {
        status: StatusCode::TOO_MANY_REQUESTS,
        code: "rate_limited",
        title: "Too many creates",
        when: "the tenant creates faster than its rate; `Retry-After` says when one fits",
        applies: Only(&["create_job", "create_workflow"]),
    };
    pub const QUOTA_EXCEEDED: Kind = Kind {
        status: StatusCode::TOO_MANY_REQUESTS,
        code: "quota_exceeded",
        title: "Job quota reached",
        when: "the tenant has as many jobs as its quota allows (a workflow counts as one)",
        applies: Only(&["create_job", "create_workflow"]),
    };
    pub const INTERNAL: Kind = Kind {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        code: "internal",
        title: "Internal error",
        when: "a bug or a broken shard database",
        applies: EveryV1,
    };

    /// Every row, in status order.
    pub const ALL: &[&Kind] = &[
        &INVALID_JSON,
        &INVALID_FIELD,
        &UNAUTHORIZED,
        &FORBIDDEN,
        &NOT_FOUND,
        &CONFLICT,
        &STRATEGY_DISABLED,
        &TOO_LARGE,
        &URI_TOO_LONG,
        &IDEMPOTENCY_KEY_REUSED,
        &PLUGIN_UNUSABLE,
        &STRATEGY_FAILED,
        &RATE_LIMITED,
        &QUOTA_EXCEEDED,
        &INTERNAL,
        &UNAVAILABLE,
    ];
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidJson(String),
    #[error("{detail}")]
    InvalidField { field: String, detail: String },
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// The token is valid but does not reach this endpoint or tenant.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0} not found")]
    NotFound(&'static str),
    /// Not found, with a detail that says what was looked for where.
    #[error("{0}")]
    Missing(String),
    #[error("{0}")]
    Conflict(String),
    #[error("this Idempotency-Key was used for a different request")]
    IdempotencyKeyReused,
    #[error("{0}")]
    Unavailable(String),
    /// A plugin file that cannot be used (outside the plugin directory, not a library, not a
    /// strategy plugin, another ABI version).
    #[error("{0}")]
    PluginUnusable(String),
    /// A strategy disabled after it missed a deadline.
    #[error("{0}")]
    StrategyDisabled(String),
    /// A strategy that failed when called (panicked, refused, answered garbage).
    #[error("{0}")]
    StrategyFailed(String),
    /// A body, or a field in it, larger than the API takes.
    #[error("{detail}")]
    TooLarge {
        field: Option<String>,
        detail: String,
    },
    /// A request target (path and query) longer than the API takes.
    #[error("the request URL is longer than {0} bytes")]
    UriTooLong(usize),
    /// The tenant creates faster than its rate allows; retry after this long.
    #[error("{detail}")]
    RateLimited { detail: String, retry_after_ms: u64 },
    /// The tenant has as many jobs as its quota allows.
    #[error("{0}")]
    QuotaExceeded(String),
    #[error("{0}")]
    Internal(String),
}

/// What a client is told to wait after a refused create over the job quota: jobs complete and
/// get deleted meanwhile, and nothing says when, so a minute.
const QUOTA_RETRY_AFTER_S: u64 = 60;

impl ApiError {
    pub fn field(field: impl Into<String>, detail: impl Into<String>) -> ApiError {
        ApiError::InvalidField {
            field: field.into(),
            detail: detail.into(),
        }
    }

    /// The kind of answer this error is: its row of the error table.
    pub fn kind(&self) -> &'static Kind {
        use kinds::*;
        match self {
            ApiError::InvalidJson(_) => &INVALID_JSON,
            ApiError::InvalidField { .. } => &INVALID_FIELD,
            ApiError::Unauthorized => &UNAUTHORIZED,
            ApiError::Forbidden(_) => &FORBIDDEN,
            ApiError::NotFound(_) | ApiError::Missing(_) => &NOT_FOUND,
            ApiError::Conflict(_) => &CONFLICT,
            ApiError::IdempotencyKeyReused => &IDEMPOTENCY_KEY_REUSED,
            ApiError::Unavailable(_) => &UNAVAILABLE,
            ApiError::PluginUnusable(_) => &PLUGIN_UNUSABLE,
            ApiError::StrategyDisabled(_) => &STRATEGY_DISABLED,
            ApiError::StrategyFailed(_) => &STRATEGY_FAILED,
            ApiError::TooLarge { .. } => &TOO_LARGE,
            ApiError::UriTooLong(_) => &URI_TOO_LONG,
            ApiError::RateLimited { .. } => &RATE_LIMITED,
            ApiError::QuotaExceeded(_) => &QUOTA_EXCEEDED,
            ApiError::Internal(_) => &INTERNAL,
        }
    }

    /// (status, code, title) of this error.
    pub fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        let k = self.kind();
        (k.status, k.code, k.title)
    }

    /// Seconds a client should wait before asking again (`Retry-After`), where that is known.
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            ApiError::RateLimited { retry_after_ms, .. } => {
                Some(retry_after_ms.div_ceil(1000).max(1))
            }
            ApiError::QuotaExceeded(_) => Some(QUOTA_RETRY_AFTER_S),
            // A shard without an owner for a moment, a tenant moving: soon served again.
            ApiError::Unavailable(_) => Some(1),
            _ => None,
        }
    }

    pub fn problem(&self) -> Problem {
        let (status, code, title) = self.parts();
        let field = match self {
            ApiError::InvalidField { field, .. } => Some(field.clone()),
            ApiError::TooLarge { field, .. } => field.clone(),
            _ => None,
        };
        let detail = match &field {
            Some(f) => format!("{f}: {self}"),
            None => self.to_string(),
        };
        Problem {
            kind: format!("urn:chronoshard:problem:{code}"),
            title: title.to_string(),
            status: status.as_u16(),
            detail,
            code: code.to_string(),
            field,
        }
    }
}

impl From<crate::routing::CallError> for ApiError {
    fn from(e: crate::routing::CallError) -> ApiError {
        use crate::routing::CallError as E;
        match e {
            E::Shard(e) => e.into(),
            E::Unavailable {
                why,
                maybe_applied: true,
            } => ApiError::Unavailable(format!(
                "{why}; the change may or may not have been applied"
            )),
            E::Unavailable { why, .. } => ApiError::Unavailable(why),
            e @ E::BadReply { .. } => ApiError::Internal(e.to_string()),
        }
    }
}

impl From<RpcError> for ApiError {
    fn from(e: RpcError) -> ApiError {
        match e.code {
            // The shard's message says what it looked for ("ticket … not found").
            RpcErrorCode::NotFound => ApiError::Missing(e.message),
            RpcErrorCode::Validation => ApiError::InvalidField {
                field: e.field.unwrap_or_default(),
                detail: e.message,
            },
            RpcErrorCode::Conflict => ApiError::Conflict(e.message),
            RpcErrorCode::IdempotencyKeyReused => ApiError::IdempotencyKeyReused,
            RpcErrorCode::Fenced
            | RpcErrorCode::NotOwner
            | RpcErrorCode::Moving
            | RpcErrorCode::Moved => ApiError::Unavailable(e.message),
            RpcErrorCode::Internal => ApiError::Internal(e.message),
            RpcErrorCode::RateLimited => ApiError::RateLimited {
                detail: e.message,
                retry_after_ms: e.retry_after_ms.unwrap_or(1000),
            },
            RpcErrorCode::QuotaExceeded => ApiError::QuotaExceeded(e.message),
        }
    }
}

impl From<crate::strategy::Error> for ApiError {
    /// The one mapping of the strategy host's errors to the API's answers.
    fn from(e: crate::strategy::Error) -> ApiError {
        use crate::strategy::Error as E;
        let detail = e.to_string();
        match e {
            E::BadName { .. } => ApiError::field("name", detail),
            E::BadConfig { message, .. } => ApiError::field("config", message),
            E::NotFound { .. } | E::Unknown { .. } => ApiError::Missing(detail),
            E::NoPluginDir | E::BuiltinName { .. } => ApiError::Conflict(detail),
            E::Disabled { .. } | E::Timeout { .. } => ApiError::StrategyDisabled(detail),
            E::Unreadable { .. }
            | E::OutsideDir { .. }
            | E::Open { .. }
            | E::NotAPlugin { .. }
            | E::AbiMismatch { .. } => ApiError::PluginUnusable(detail),
            E::Panicked { .. }
            | E::Failed { .. }
            | E::InputRefused { .. }
            | E::InvalidInput { .. }
            | E::BadReply { .. }
            | E::InvalidAssignment { .. } => ApiError::StrategyFailed(detail),
            E::Spawn { .. } | E::Lost { .. } => ApiError::Internal(detail),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        if problem.status == 500 {
            tracing::warn!(code = %problem.code, detail = %problem.detail, "request failed");
        }
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&problem).expect("problem serialises");
        let mut resp = (
            status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            body,
        )
            .into_response();
        if let Some(seconds) = self.retry_after_s() {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use std::{io, path::PathBuf, time::Duration};

    use super::*;
    use crate::strategy::{Error as E, Violation};

    /// Every error of the strategy host has its answer: the operator's mistakes are 4xx with a
    /// stable code, a refused config names `config` and carries the strategy's own message.
    #[test]
    fn each_strategy_error_has_its_status_and_code() {
        let name = || "p".to_string();
        let cases: Vec<(E, u16, &str)> = vec![
            (E::NoPluginDir, 409, "conflict"),
            (
                E::BadName {
                    name: name(),
                    reason: "a path, not a name",
                },
                400,
                "invalid_field",
            ),
            (
                E::Unreadable {
                    path: PathBuf::from("/x"),
                    source: io::ErrorKind::PermissionDenied.into(),
                },
                422,
                "plugin_unusable",
            ),
            (
                E::NotFound {
                    name: name(),
                    path: PathBuf::from("/x/p.so"),
                },
                404,
                "not_found",
            ),
            (
                E::OutsideDir {
                    name: name(),
                    target: PathBuf::from("/etc/p.so"),
                },
                422,
                "plugin_unusable",
            ),
            (
                E::Open {
                    name: name(),
                    source: libloading::Error::DlOpenUnknown,
                },
                422,
                "plugin_unusable",
            ),
            (
                E::NotAPlugin {
                    name: name(),
                    reason: "no symbol".into(),
                },
                422,
                "plugin_unusable",
            ),
            (
                E::AbiMismatch {
                    name: name(),
                    found: 2,
                    expected: 1,
                },
                422,
                "plugin_unusable",
            ),
            (E::BuiltinName { name: name() }, 409, "conflict"),
            (E::Unknown { name: name() }, 404, "not_found"),
            (E::Disabled { name: name() }, 409, "strategy_disabled"),
            (
                E::Timeout {
                    name: name(),
                    deadline: Duration::from_secs(1),
                },
                409,
                "strategy_disabled",
            ),
            (
                E::Panicked {
                    name: name(),
                    message: "boom".into(),
                },
                422,
                "strategy_failed",
            ),
            (
                E::Failed {
                    name: name(),
                    message: "no room".into(),
                },
                422,
                "strategy_failed",
            ),
            (
                E::InputRefused {
                    name: name(),
                    message: "x".into(),
                },
                422,
                "strategy_failed",
            ),
            (
                E::InvalidInput { reason: "x".into() },
                422,
                "strategy_failed",
            ),
            (
                E::BadReply {
                    name: name(),
                    reason: "x".into(),
                },
                422,
                "strategy_failed",
            ),
            (
                E::InvalidAssignment {
                    name: name(),
                    violation: Violation::Missing { shard: 1 },
                },
                422,
                "strategy_failed",
            ),
            (E::Lost { name: name() }, 500, "internal"),
        ];
        for (error, status, code) in cases {
            let shown = format!("{error:?}");
            let problem = ApiError::from(error).problem();
            assert_eq!(
                (problem.status, problem.code.as_str()),
                (status, code),
                "{shown}"
            );
        }
        let refused = E::BadConfig {
            name: name(),
            message: "zone_label must not be empty".into(),
        };
        let problem = ApiError::from(refused).problem();
        assert_eq!(
            (problem.status, problem.field.as_deref()),
            (400, Some("config"))
        );
        assert_eq!(problem.detail, "config: zone_label must not be empty");
        let path = ApiError::from(E::BadName {
            name: "../x".into(),
            reason: "contains '..'",
        });
        assert_eq!(path.problem().field.as_deref(), Some("name"));
    }
}
