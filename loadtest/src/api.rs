//! The platform's REST API as the load test uses it: create and delete jobs, read runs, nodes
//! and metrics, add shards and follow their growth.
//! Only the public contract (the REST API, openapi/openapi.json); no knowledge of shards or databases.

use std::time::Duration;

use chronoshard_wire::RunView;
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

impl ApiError {
    /// Worth repeating: no answer, or the server said it could not tell (5xx).
    pub fn is_transient(&self) -> bool {
        match self {
            ApiError::Http { .. } => true,
            ApiError::Status { status, .. } => *status >= 500,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{what}: {source}")]
    Http {
        what: String,
        source: reqwest::Error,
    },
    #[error("{what}: HTTP {status}: {body}")]
    Status {
        what: String,
        status: u16,
        body: String,
    },
}

/// A REST client with the admin token; cheap to clone (one connection pool).
#[derive(Clone, Debug)]
pub struct Api {
    base: String,
    token: String,
    http: reqwest::Client,
}

#[derive(Debug, Deserialize)]
struct Created {
    id: Uuid,
}

#[derive(Debug, Deserialize)]
struct RunPage {
    runs: Vec<RunView>,
    next_before: Option<chrono::DateTime<chrono::Utc>>,
}

impl Api {
    pub fn new(base: &str, token: &str) -> Api {
        Api {
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(1024)
                .timeout(Duration::from_secs(30))
                .build()
                .expect("a reqwest client with default TLS settings builds"),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    async fn send(
        &self,
        what: impl Fn() -> String,
        req: reqwest::RequestBuilder,
    ) -> Result<String, ApiError> {
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|source| ApiError::Http {
                what: what(),
                source,
            })?;
        let status = resp.status().as_u16();
        let body = resp.text().await.map_err(|source| ApiError::Http {
            what: what(),
            source,
        })?;
        if !(200..300).contains(&status) {
            return Err(ApiError::Status {
                what: what(),
                status,
                body,
            });
        }
        Ok(body)
    }

    /// `POST /v1/jobs` under an `Idempotency-Key`, so that repeating it after a timeout or a 503
    /// ("may or may not have been applied") returns the job the first try created; the job's id.
    pub async fn create_job(&self, spec: &Value, key: &str) -> Result<Uuid, ApiError> {
        let req = self
            .http
            .post(format!("{}/v1/jobs", self.base))
            .header("Idempotency-Key", key)
            .json(spec);
        let body = self.send(|| "create job".into(), req).await?;
        let created: Created = serde_json::from_str(&body).map_err(|e| ApiError::Status {
            what: format!("create job: unexpected answer ({e})"),
            status: 201,
            body,
        })?;
        Ok(created.id)
    }

    pub async fn delete_job(&self, id: Uuid) -> Result<(), ApiError> {
        let req = self.http.delete(format!("{}/v1/jobs/{id}", self.base));
        self.send(|| format!("delete job {id}"), req).await?;
        Ok(())
    }

    /// Every run of a job, all pages.
    pub async fn runs(&self, id: Uuid) -> Result<Vec<RunView>, ApiError> {
        let mut all = Vec::new();
        let mut before: Option<String> = None;
        loop {
            let mut url = format!("{}/v1/jobs/{id}/runs?limit=500", self.base);
            if let Some(b) = &before {
                url.push_str(&format!("&before={b}"));
            }
            let body = self
                .send(|| format!("runs of job {id}"), self.http.get(url))
                .await?;
            let page: RunPage = serde_json::from_str(&body).map_err(|e| ApiError::Status {
                what: format!("runs of job {id}: unexpected answer ({e})"),
                status: 200,
                body,
            })?;
            let progressed = !page.runs.is_empty();
            all.extend(page.runs);
            match page.next_before.filter(|_| progressed) {
                Some(b) => {
                    before = Some(b.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
                    // `+` must not become a space in the query string.
                    before = before.map(|b| b.replace('+', "%2B"));
                }
                None => return Ok(all),
            }
        }
    }

    /// `GET /v1/nodes` as JSON.
    pub async fn nodes(&self) -> Result<Value, ApiError> {
        let body = self
            .send(
                || "list nodes".into(),
                self.http.get(format!("{}/v1/nodes", self.base)),
            )
            .await?;
        serde_json::from_str(&body).map_err(|e| ApiError::Status {
            what: format!("list nodes: unexpected answer ({e})"),
            status: 200,
            body,
        })
    }

    /// `GET /v1/shards`: the shard map, with `growth` while shards are being added.
    pub async fn shards(&self) -> Result<Value, ApiError> {
        let req = self.http.get(format!("{}/v1/shards", self.base));
        let body = self.send(|| "read the shard map".into(), req).await?;
        serde_json::from_str(&body).map_err(|e| ApiError::Status {
            what: format!("read the shard map: unexpected answer ({e})"),
            status: 200,
            body,
        })
    }

    /// `POST /v1/shards {"add": n}`: adds shards while jobs fire; the shard map it answers
    /// with (202).
    pub async fn add_shards(&self, n: u32) -> Result<Value, ApiError> {
        let req = self
            .http
            .post(format!("{}/v1/shards", self.base))
            .json(&serde_json::json!({ "add": n }));
        let body = self.send(|| format!("add {n} shards"), req).await?;
        serde_json::from_str(&body).map_err(|e| ApiError::Status {
            what: format!("add {n} shards: unexpected answer ({e})"),
            status: 202,
            body,
        })
    }

    /// `GET /metrics`: the Prometheus text of the process behind the API.
    pub async fn metrics(&self) -> Result<String, ApiError> {
        let req = self.http.get(format!("{}/metrics", self.base));
        self.send(|| "read /metrics".into(), req).await
    }

    /// `GET /readyz` answered 200.
    pub async fn ready(&self) -> bool {
        matches!(
            self.http.get(format!("{}/readyz", self.base)).send().await,
            Ok(r) if r.status().is_success()
        )
    }
}
