//! The HTTP side of the client verbs: one `Client` per command, which builds each URL from path
//! segments (each one percent-encoded, so an id can never step into another route), presents
//! the bearer token, and turns every answer into the JSON it carries or a [`ClientError`].

use std::time::Duration;

use reqwest::{Method, Url};
use serde_json::Value;

pub use chronoshard_control_plane::api::Problem;

use super::{ClientError, Connection};

/// A client of one API.
#[derive(Debug)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
}

/// A successful answer: its status and its JSON body (`null` when it has none, as a 204).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Client {
    /// A client of `conn` whose calls each give up after `timeout`.
    pub fn new(conn: Connection, timeout: Duration) -> Result<Client, ClientError> {
        let base = Url::parse(&conn.url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .ok_or_else(|| {
                ClientError::Usage(format!(
                    "--url {:?} is not an http:// or https:// URL",
                    shown(&conn.url)
                ))
            })?;
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .user_agent(concat!("chronoshard-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ClientError::Transport(format!("cannot set up the HTTP client: {e}")))?;
        Ok(Client {
            http,
            base,
            token: conn.token,
        })
    }

    /// `GET` of `segments` (e.g. `["v1", "jobs", id]`) with the query parameters that are set.
    pub async fn get(
        &self,
        segments: &[&str],
        query: &[(&str, Option<String>)],
    ) -> Result<Value, ClientError> {
        Ok(self
            .call(Method::GET, segments, query, None, None)
            .await?
            .body)
    }

    /// `POST` without a body.
    pub async fn post(&self, segments: &[&str]) -> Result<Reply, ClientError> {
        self.call(Method::POST, segments, &[], None, None).await
    }

    /// One call. `idempotency_key` goes in the `Idempotency-Key` header.
    pub async fn call(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, Option<String>)],
        body: Option<&Value>,
        idempotency_key: Option<&str>,
    ) -> Result<Reply, ClientError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|_| ClientError::Usage(format!("--url {} cannot have a path", self.shown())))?
            .pop_if_empty()
            .extend(segments);
        {
            let set: Vec<_> = query
                .iter()
                .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
                .collect();
            if !set.is_empty() {
                url.query_pairs_mut().extend_pairs(set);
            }
        }
        let mut req = self.http.request(method, url);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        if let Some(key) = idempotency_key {
            req = req.header("idempotency-key", key);
        }
        let resp = req.send().await.map_err(|e| self.failed(e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| self.failed(e))?;
        if !(200..300).contains(&status) {
            return Err(ClientError::Api {
                status,
                problem: serde_json::from_str(&text).ok(),
                body: text,
            });
        }
        let body = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).map_err(|e| {
                ClientError::Transport(format!(
                    "{} answered {status} with a body that is not JSON: {e}",
                    self.shown()
                ))
            })?
        };
        Ok(Reply { status, body })
    }

    /// The error of a call that got no answer: unreachable (connect, timeout, the connection
    /// dropped) or otherwise failed.
    fn failed(&self, e: reqwest::Error) -> ClientError {
        let reason = root_cause(&e);
        if e.is_connect() || e.is_timeout() || e.is_request() {
            let reason = if e.is_timeout() {
                format!("no answer in time ({reason})")
            } else {
                reason
            };
            ClientError::Unreachable {
                url: self.shown(),
                reason,
            }
        } else if e.is_builder() {
            ClientError::Usage(format!("cannot build the request: {reason}"))
        } else {
            ClientError::Transport(format!("calling {} failed: {reason}", self.shown()))
        }
    }

    /// The base URL as it may be shown: without a user or password.
    fn shown(&self) -> String {
        shown(self.base.as_str())
    }
}

/// A URL without its user and password (which may be secrets).
fn shown(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.as_str().trim_end_matches('/').to_string()
        }
        Err(_) => url.to_string(),
    }
}

/// The innermost cause of an error (such as `Connection refused (os error 111)`).
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// One line for an error answer: `404 not_found: job not found`, with the field an input error
/// is about; a body that is not a problem document is shown cut short.
pub fn describe(status: u16, problem: Option<&Problem>, body: &str) -> String {
    match problem {
        Some(p) => match &p.field {
            Some(f) if !p.detail.starts_with(&format!("{f}:")) => {
                format!("{status} {}: {f}: {}", p.code, p.detail)
            }
            _ => format!("{status} {}: {}", p.code, p.detail),
        },
        None => {
            let reason = reqwest::StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("error");
            let body: String = body.trim().chars().take(200).collect();
            if body.is_empty() {
                format!("{status} {reason}")
            } else {
                format!("{status} {reason}: {body}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(detail: &str, field: Option<&str>) -> Problem {
        Problem {
            kind: "urn:chronoshard:problem:invalid_field".into(),
            title: "A field is invalid".into(),
            status: 400,
            detail: detail.into(),
            code: "invalid_field".into(),
            field: field.map(String::from),
        }
    }

    #[test]
    fn describes_problems_with_their_field_once() {
        let p = problem("schedule.cron: bad", Some("schedule.cron"));
        assert_eq!(
            describe(400, Some(&p), ""),
            "400 invalid_field: schedule.cron: bad"
        );
        let p = problem("bad", Some("limit"));
        assert_eq!(describe(400, Some(&p), ""), "400 invalid_field: limit: bad");
        assert_eq!(describe(502, None, "<html>"), "502 Bad Gateway: <html>");
        assert_eq!(describe(503, None, ""), "503 Service Unavailable");
    }

    #[test]
    fn urls_are_shown_without_credentials() {
        assert_eq!(shown("http://u:secret@h:1/x/"), "http://h:1/x");
    }
}
