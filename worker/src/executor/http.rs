//! The HTTP executor: one request per attempt with the executor headers (docs/protocol.md); a 2xx answer is
//! success. [`HttpExecutor`] sends through the SSRF guard of [`super::ssrf`]; a refused target is
//! a failed outcome whose error starts with `refused:`.

use std::time::Duration;

use chronoshard_telemetry::traces;
use chronoshard_wire::{names, rfc3339, TargetSpec, Ticket};
use tokio_util::sync::CancellationToken;

use super::{
    ssrf::{self, SsrfGuard},
    Outcome,
};

/// The guarded HTTP executor: a client built by [`ssrf::client_builder`] and the guard that checks
/// IP-literal targets, which never reach the client's resolver. Cheap to clone; clones share
/// connections.
#[derive(Clone, Debug)]
pub struct HttpExecutor {
    client: reqwest::Client,
    guard: SsrfGuard,
}

impl HttpExecutor {
    pub fn new(guard: SsrfGuard, user_agent: &str) -> Result<HttpExecutor, reqwest::Error> {
        let client = ssrf::client_builder(&guard)
            .user_agent(user_agent)
            .build()?;
        Ok(HttpExecutor { client, guard })
    }

    pub fn guard(&self) -> &SsrfGuard {
        &self.guard
    }

    /// Sends the ticket's request unless the guard refuses its target. A cancel drops the call
    /// at once (the connection is closed, so the target sees it aborted).
    pub async fn execute(&self, ticket: &Ticket, cancel: &CancellationToken) -> Outcome {
        tokio::select! {
            o = send(&self.client, &self.guard, ticket) => o,
            () = cancel.cancelled() => Outcome::failed("cancelled: the call was aborted"),
        }
    }
}

/// Most bytes of a successful answer's body kept as the attempt's output (a workflow step's
/// output reaches the steps after it).
const OUTPUT_LIMIT: usize = 64 * 1024;

/// The first `OUTPUT_LIMIT` bytes of a body (lossy UTF-8); none when it is empty or cannot be read.
async fn body_of(mut resp: reqwest::Response) -> Option<String> {
    let mut buf = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        let room = OUTPUT_LIMIT - buf.len();
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if buf.len() == OUTPUT_LIMIT {
            break;
        }
    }
    (!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).into_owned())
}

async fn send(client: &reqwest::Client, guard: &SsrfGuard, ticket: &Ticket) -> Outcome {
    let TargetSpec::Http {
        url,
        method,
        headers,
    } = &ticket.target
    else {
        return Outcome::failed(format!(
            "the http executor cannot run a {:?} target",
            ticket.target
        ));
    };
    let method = match reqwest::Method::from_bytes(method.as_bytes()) {
        Ok(m) => m,
        Err(_) => return Outcome::failed(format!("invalid method {method:?}")),
    };
    let url = match reqwest::Url::parse(url) {
        Ok(u) => u,
        Err(e) => return Outcome::failed(format!("invalid url {url:?}: {e}")),
    };
    if let Err(refused) = guard.check_url_host(&url) {
        return Outcome::failed(refused.to_string());
    }
    let mut req = client
        .request(method, url)
        .timeout(Duration::from_millis(ticket.timeout_ms.max(1)))
        .header(names::HTTP_IDEMPOTENCY_KEY, ticket.ticket_id.to_string())
        .header(names::HTTP_JOB_ID, ticket.job_id.to_string())
        .header(names::HTTP_SCHEDULED_AT, rfc3339(ticket.scheduled_at))
        .header(names::HTTP_ATTEMPT, ticket.attempt.to_string())
        .header(
            names::TRACEPARENT,
            traces::current_traceparent().unwrap_or_else(|| ticket.traceparent()),
        );
    for (k, v) in headers {
        req = req.header(k, v);
    }
    if !ticket.payload.is_null() {
        req = req.json(&ticket.payload);
    }
    match req.send().await {
        Ok(resp) if resp.status().is_success() => Outcome {
            http_status: Some(resp.status().as_u16()),
            output: body_of(resp).await,
            ..Outcome::succeeded()
        },
        Ok(resp) => {
            let status = resp.status();
            Outcome {
                http_status: Some(status.as_u16()),
                ..Outcome::failed(format!("target answered {status}"))
            }
        }
        Err(e) => {
            if let Some(refused) = ssrf::find_refused(&e) {
                return Outcome::failed(refused.to_string());
            }
            if e.is_timeout() {
                return Outcome::failed(format!("timed out after {} ms", ticket.timeout_ms));
            }
            Outcome::failed(format!("request failed: {}", error_chain(&e)))
        }
    }
}

/// `e` and its causes, `: `-separated (reqwest's own message leaves out why, e.g. which redirect
/// limit or which connect error).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(cause) = cur {
        let msg = cause.to_string();
        if !out.contains(&msg) {
            out.push_str(": ");
            out.push_str(&msg);
        }
        cur = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use std::{
        net::SocketAddr,
        sync::{Arc, Mutex},
    };

    use chronoshard_test_util::HttpSink;
    use chronoshard_wire::trace_id_of;
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpListener,
    };
    use uuid::Uuid;

    use super::*;

    /// From JSON, so fields the wire crate adds with a default need no change here.
    fn ticket(url: &str) -> Ticket {
        let ticket_id = Uuid::now_v7();
        serde_json::from_value(serde_json::json!({
            "v": chronoshard_wire::PROTOCOL_VERSION,
            "ticket_id": ticket_id,
            "job_id": Uuid::now_v7(),
            "tenant": "default",
            "shard": 0,
            "epoch": 1,
            "scheduled_at": chrono::Utc::now(),
            "attempt": 1,
            "item": 0,
            "items": 1,
            "queue": "http",
            "target": { "type": "http", "url": url, "method": "POST" },
            "timeout_ms": 5_000,
            "trace_id": trace_id_of(ticket_id),
        }))
        .expect("ticket")
    }

    fn executor(guard: SsrfGuard) -> HttpExecutor {
        HttpExecutor::new(guard, "chronoshard-worker/test").expect("client")
    }

    fn allowing(entries: &[&str]) -> SsrfGuard {
        let entries: Vec<String> = entries.iter().map(|s| s.to_string()).collect();
        SsrfGuard::new(&entries).expect("allow list")
    }

    fn error(outcome: &Outcome) -> &str {
        assert!(!outcome.ok, "{outcome:?}");
        outcome.error.as_deref().unwrap_or_default()
    }

    /// A bare HTTP/1.1 server on `ip`: answers every request with `location` as a 302, or with
    /// 200 when there is none, and records each request line.
    struct Raw {
        addr: SocketAddr,
        hits: Arc<Mutex<Vec<String>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Raw {
        async fn start(ip: &str, location: Option<String>) -> Raw {
            let answer = match &location {
                Some(to) => format!(
                    "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n\
                     Connection: close\r\n\r\n"
                ),
                None => ok_with(""),
            };
            Raw::answering(ip, answer).await
        }

        /// Answers every request with `answer`, a whole HTTP/1.1 response.
        async fn answering(ip: &str, answer: String) -> Raw {
            let listener = TcpListener::bind((ip, 0)).await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let hits = Arc::new(Mutex::new(Vec::new()));
            let seen = hits.clone();
            let task = tokio::spawn(async move {
                while let Ok((mut conn, _)) = listener.accept().await {
                    let seen = seen.clone();
                    let answer = answer.clone();
                    tokio::spawn(async move {
                        let mut head = Vec::new();
                        let mut buf = [0u8; 1024];
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match conn.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        let head = String::from_utf8_lossy(&head);
                        let line = head.lines().next().unwrap_or_default().to_string();
                        seen.lock().expect("lock").push(line);
                        let _ = conn.write_all(answer.as_bytes()).await;
                        let _ = conn.shutdown().await;
                    });
                }
            });
            Raw { addr, hits, task }
        }

        fn hits(&self) -> Vec<String> {
            self.hits.lock().expect("lock").clone()
        }
    }

    /// A 200 answer with `body`.
    fn ok_with(body: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn a_successful_answers_body_is_the_output_cut_to_the_limit() {
        let http = executor(SsrfGuard::default().allow_loopback());
        let small = Raw::answering("127.0.0.1", ok_with("{\"rows\": 3}")).await;
        let out = http
            .execute(
                &ticket(&format!("http://{}/", small.addr)),
                &CancellationToken::new(),
            )
            .await;
        assert!(out.ok, "{out:?}");
        assert_eq!(out.output.as_deref(), Some("{\"rows\": 3}"));
        let big = Raw::answering("127.0.0.1", ok_with(&"x".repeat(OUTPUT_LIMIT + 10))).await;
        let out = http
            .execute(
                &ticket(&format!("http://{}/", big.addr)),
                &CancellationToken::new(),
            )
            .await;
        assert_eq!(out.output.map(|o| o.len()), Some(OUTPUT_LIMIT));
        let empty = Raw::answering("127.0.0.1", ok_with("")).await;
        let out = http
            .execute(
                &ticket(&format!("http://{}/", empty.addr)),
                &CancellationToken::new(),
            )
            .await;
        assert!(out.ok && out.output.is_none(), "{out:?}");
    }

    impl Drop for Raw {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    #[test]
    fn literal_hosts_are_read_after_url_normalisation() {
        let g = SsrfGuard::default();
        for url in [
            "http://127.0.0.1/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://127.1:8080/",
            "http://017700000001/",
            "http://127.0.0.1./",
            "http://[::1]/",
            "http://[::ffff:7f00:1]/",
            "https://[0:0:0:0:0:ffff:127.0.0.1]/",
        ] {
            let url = reqwest::Url::parse(url).expect(url);
            let refused = g.check_url_host(&url).expect_err(url.as_str());
            assert_eq!(refused.category, ssrf::Category::Loopback, "{url}");
        }
        let named = reqwest::Url::parse("http://localhost/").unwrap();
        assert_eq!(g.check_url_host(&named), Ok(()), "names are the resolver's");
    }

    #[tokio::test]
    async fn loopback_literal_is_refused_before_sending() {
        let sink = HttpSink::start().await.expect("sink");
        let port = sink.addr.port();
        let http = executor(SsrfGuard::default());
        let out = http
            .execute(&ticket(&sink.url("/hook")), &CancellationToken::new())
            .await;
        assert_eq!(
            error(&out),
            "refused: 127.0.0.1 is loopback and not allow-listed"
        );
        for url in [
            format!("http://2130706433:{port}/"),
            format!("http://0x7f.1:{port}/"),
            format!("http://[::ffff:127.0.0.1]:{port}/"),
        ] {
            let out = http.execute(&ticket(&url), &CancellationToken::new()).await;
            assert!(error(&out).starts_with("refused: "), "{url}: {out:?}");
        }
        let out = http
            .execute(
                &ticket("http://169.254.169.254/latest/meta-data/"),
                &CancellationToken::new(),
            )
            .await;
        assert_eq!(
            error(&out),
            "refused: 169.254.169.254 is link-local (metadata) and not allow-listed"
        );
        assert!(sink.requests().is_empty(), "{:?}", sink.requests());
    }

    #[tokio::test]
    async fn dev_guard_allows_loopback_with_the_usual_headers() {
        let sink = HttpSink::start().await.expect("sink");
        let http = executor(SsrfGuard::default().allow_loopback());
        let t = ticket(&sink.url("/hook"));
        let out = http.execute(&t, &CancellationToken::new()).await;
        assert!(out.ok, "{out:?}");
        assert_eq!(out.http_status, Some(200));
        let requests = sink.requests();
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].path, "/hook");
        let key = requests[0]
            .headers
            .get("idempotency-key")
            .map(String::as_str);
        assert_eq!(key, Some(t.ticket_id.to_string().as_str()));
    }

    #[tokio::test]
    async fn host_name_is_checked_at_resolution() {
        let sink = HttpSink::start().await.expect("sink");
        let url = format!("http://localhost:{}/", sink.addr.port());
        let out = executor(SsrfGuard::default())
            .execute(&ticket(&url), &CancellationToken::new())
            .await;
        let err = error(&out);
        assert!(err.starts_with("refused: localhost resolves to "), "{err}");
        assert!(
            err.ends_with("which is loopback and not allow-listed"),
            "{err}"
        );
        assert!(sink.requests().is_empty());

        // A host-name entry trusts the name's DNS.
        let out = executor(allowing(&["LocalHost"]))
            .execute(&ticket(&url), &CancellationToken::new())
            .await;
        assert!(out.ok, "{out:?}");
        assert_eq!(sink.requests().len(), 1);
    }

    #[tokio::test]
    async fn redirect_to_a_refused_literal_is_not_followed() {
        // 127.0.0.2 is loopback too, and routable on Linux: the control below reaches it.
        let target = Raw::start("127.0.0.2", None).await;
        let to = format!("http://127.0.0.2:{}/inner", target.addr.port());
        let front = Raw::start("127.0.0.1", Some(to)).await;
        let url = format!("http://127.0.0.1:{}/", front.addr.port());

        let out = executor(allowing(&["127.0.0.1/32"]))
            .execute(&ticket(&url), &CancellationToken::new())
            .await;
        assert_eq!(
            error(&out),
            "refused: 127.0.0.2 is loopback and not allow-listed"
        );
        assert_eq!(front.hits().len(), 1);
        assert!(target.hits().is_empty(), "{:?}", target.hits());

        let out = executor(allowing(&["127.0.0.0/8"]))
            .execute(&ticket(&url), &CancellationToken::new())
            .await;
        assert!(out.ok, "{out:?}");
        // A 302 turns the POST into a GET, as browsers do.
        assert_eq!(target.hits(), vec!["GET /inner HTTP/1.1".to_string()]);
    }

    #[tokio::test]
    async fn redirect_hops_are_limited() {
        let looping = Raw::start("127.0.0.1", Some("/again".into())).await;
        let url = format!("http://127.0.0.1:{}/", looping.addr.port());
        let out = executor(allowing(&["127.0.0.1"]))
            .execute(&ticket(&url), &CancellationToken::new())
            .await;
        let err = error(&out);
        assert!(err.starts_with("request failed: "), "{err}");
        assert!(err.contains("too many redirects (more than 5)"), "{err}");
        assert_eq!(looping.hits().len(), 1 + ssrf::MAX_REDIRECTS);
    }
}
