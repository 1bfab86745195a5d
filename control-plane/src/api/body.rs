//! Extracting request bodies, query strings and path ids so that every refusal is a problem
//! document naming the field at fault: JSON syntax errors are `invalid_json`; wrong types, missing
//! and unknown fields are `invalid_field` with a dotted path.

use axum::{
    body::Bytes,
    extract::{FromRequest, FromRequestParts, Request},
    http::{request::Parts, StatusCode},
};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::error::ApiError;

/// Like `axum::Json`, but with the API's problem documents.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

/// Largest request body accepted.
pub const MAX_BODY: usize = 1 << 20;

/// Longest request target (path and query) accepted.
pub const MAX_URI: usize = 8 << 10;

/// A job's `payload` larger than `chronoshard_wire::job::MAX_PAYLOAD_BYTES` as JSON is a 413
/// naming the field (`field` is `payload` in a create and a patch alike).
pub fn check_payload(payload: &serde_json::Value) -> Result<(), ApiError> {
    let max = chronoshard_wire::job::MAX_PAYLOAD_BYTES;
    match chronoshard_wire::job::json_len(payload) {
        n if n > max => Err(ApiError::TooLarge {
            field: Some("payload".into()),
            detail: format!("payload: {n} bytes as JSON, more than {max}"),
        }),
        _ => Ok(()),
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::TooLarge {
                    field: None,
                    detail: format!("the request body is larger than {MAX_BODY} bytes"),
                }
            } else {
                ApiError::InvalidJson(format!("could not read the request body: {e}"))
            }
        })?;
        parse(&bytes).map(JsonBody)
    }
}

/// Like `axum::extract::Query`, with problem documents.
#[derive(Debug)]
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        serde_urlencoded::from_str(query).map(Params).map_err(|e| {
            let msg = e.to_string();
            // serde_urlencoded gives no path; it names unknown and missing fields in the message.
            let named = ["unknown field `", "missing field `"]
                .iter()
                .find_map(|p| msg.strip_prefix(p).and_then(|rest| rest.split('`').next()));
            let field = named.unwrap_or("query").to_string();
            ApiError::field(field, msg)
        })
    }
}

/// The single id in a path such as `/v1/jobs/{id}`, as a UUID.
#[derive(Debug)]
pub struct PathId(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let axum::extract::Path(raw) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|e| ApiError::field("id", e.body_text()))?;
        Uuid::parse_str(&raw)
            .map(PathId)
            .map_err(|_| ApiError::NotFound("resource"))
    }
}

/// The tenant in a path such as `/v1/tenants/{tenant}`, checked like a job's `tenant` field.
#[derive(Debug)]
pub struct PathTenant(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathTenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let axum::extract::Path(raw) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|e| ApiError::field("tenant", e.body_text()))?;
        chronoshard_wire::job::check_token("tenant", &raw, 64)
            .map_err(|e| ApiError::field(e.field, e.message))?;
        Ok(PathTenant(raw))
    }
}

/// Parses a body, mapping serde's errors to the API's.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Syntax
            | serde_json::error::Category::Eof
            | serde_json::error::Category::Io => {
                ApiError::InvalidJson(format!("invalid JSON: {inner}"))
            }
            serde_json::error::Category::Data => {
                let msg = inner.to_string();
                let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
                ApiError::field(field_of(&path, &msg), msg)
            }
        }
    })
}

/// The dotted path of the field an error is about. serde_path_to_error's path ends at the field
/// for wrong values and unknown fields, but at the parent for a missing field, which serde names
/// only in the message.
fn field_of(path: &str, msg: &str) -> String {
    let parent = if path == "." { "" } else { path };
    let missing = msg
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next());
    match missing {
        Some(name) if parent.is_empty() => name.to_string(),
        Some(name) => format!("{parent}.{name}"),
        None if parent.is_empty() => "body".to_string(),
        None => parent.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use chronoshard_wire::JobSpec;

    use super::*;

    fn field(body: &str) -> (String, String) {
        match parse::<JobSpec>(body.as_bytes()).unwrap_err() {
            ApiError::InvalidField { field, detail } => (field, detail),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn names_unknown_missing_and_mistyped_fields() {
        let base = r#""tenant":"a","name":"n","target":{"type":"queue","queue":"q"}"#;
        assert_eq!(
            field(&format!(
                r#"{{{base},"schedule":{{"at":"2026-01-01T00:00:00Z"}},"colour":1}}"#
            ))
            .0,
            "colour"
        );
        assert_eq!(
            field(&format!(
                r#"{{{base},"schedule":{{"cron":"* * * * *","zone":"x"}}}}"#
            ))
            .0,
            "schedule.zone"
        );
        assert_eq!(field(&format!(r#"{{{base}}}"#)).0, "schedule");
        assert_eq!(
            field(&format!(r#"{{{base},"schedule":{{"every":"soon"}}}}"#)).0,
            "schedule.every"
        );
        assert_eq!(
            field(&format!(
                r#"{{{base},"schedule":{{"at":"2026-01-01T00:00:00Z"}},"priority":"high"}}"#
            ))
            .0,
            "priority"
        );
    }

    #[test]
    fn syntax_errors_are_invalid_json() {
        assert!(matches!(
            parse::<JobSpec>(b"{\"tenant\": "),
            Err(ApiError::InvalidJson(_))
        ));
        assert!(matches!(
            parse::<JobSpec>(b"not json"),
            Err(ApiError::InvalidJson(_))
        ));
    }
}
