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

    /// (status, code, title) — the single table of the API's error answers.
    pub fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            ApiError::InvalidJson(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_json",
                "Request body is not valid JSON",
            ),
            ApiError::InvalidField { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_field",
                "A field is invalid",
            ),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", "Forbidden"),
            ApiError::NotFound(_) | ApiError::Missing(_) => {
                (StatusCode::NOT_FOUND, "not_found", "Not found")
            }
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict", "Conflict"),
            ApiError::IdempotencyKeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "Idempotency-Key reused",
            ),
            ApiError::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
            ),
            ApiError::PluginUnusable(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "plugin_unusable",
                "The plugin file cannot be used",
            ),
            ApiError::StrategyDisabled(_) => (
                StatusCode::CONFLICT,
                "strategy_disabled",
                "The strategy is disabled",
            ),
            ApiError::StrategyFailed(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "strategy_failed",
                "The strategy failed",
            ),
            ApiError::TooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                "Content too large",
            ),
            ApiError::UriTooLong(_) => (StatusCode::URI_TOO_LONG, "uri_too_long", "URI too long"),
            ApiError::RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "Too many creates",
            ),
            ApiError::QuotaExceeded(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "quota_exceeded",
                "Job quota reached",
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
            ),
        }
    }

    /// Seconds a client should wait before asking again (`Retry-After`), where that is known.
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            ApiError::RateLimited { retry_after_ms, .. } => {
                Some(retry_after_ms.div_ceil(1000).max(1))
            }
            ApiError::QuotaExceeded(_) => Some(QUOTA_RETRY_AFTER_S),
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

impl From<RpcError> for ApiError {
    fn from(e: RpcError) -> ApiError {
        match e.code {
            RpcErrorCode::NotFound => ApiError::NotFound(if e.message.starts_with("ticket") {
                "ticket"
            } else {
                "job"
            }),
            RpcErrorCode::Validation => ApiError::InvalidField {
                field: e.field.unwrap_or_default(),
                detail: e.message,
            },
            RpcErrorCode::Conflict => ApiError::Conflict(e.message),
            RpcErrorCode::IdempotencyKeyReused => ApiError::IdempotencyKeyReused,
            RpcErrorCode::Fenced | RpcErrorCode::NotOwner => ApiError::Unavailable(e.message),
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
