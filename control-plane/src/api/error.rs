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
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{0}")]
    Conflict(String),
    #[error("this Idempotency-Key was used for a different request")]
    IdempotencyKeyReused,
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

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
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found", "Not found"),
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
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
            ),
        }
    }

    pub fn problem(&self) -> Problem {
        let (status, code, title) = self.parts();
        let field = match self {
            ApiError::InvalidField { field, .. } => Some(field.clone()),
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
        (
            status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            body,
        )
            .into_response()
    }
}
