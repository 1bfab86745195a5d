//! The HTTP executor: one request per attempt with the headers of DESIGN.md §6; a 2xx answer is
//! success.

use std::time::Duration;

use chronoshard_wire::{names, rfc3339, TargetSpec, Ticket};

use super::Outcome;

/// Sends the ticket's request. `client` is shared so connections are reused across tickets.
pub async fn execute(client: &reqwest::Client, ticket: &Ticket) -> Outcome {
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
    let mut req = client
        .request(method, url)
        .timeout(Duration::from_millis(ticket.timeout_ms.max(1)))
        .header(names::HTTP_IDEMPOTENCY_KEY, ticket.ticket_id.to_string())
        .header(names::HTTP_JOB_ID, ticket.job_id.to_string())
        .header(names::HTTP_SCHEDULED_AT, rfc3339(ticket.scheduled_at))
        .header(names::HTTP_ATTEMPT, ticket.attempt.to_string())
        .header(names::HTTP_TRACEPARENT, ticket.traceparent());
    for (k, v) in headers {
        req = req.header(k, v);
    }
    if !ticket.payload.is_null() {
        req = req.json(&ticket.payload);
    }
    match req.send().await {
        Ok(resp) if resp.status().is_success() => Outcome {
            ok: true,
            error: None,
            http_status: Some(resp.status().as_u16()),
        },
        Ok(resp) => {
            let status = resp.status();
            Outcome {
                ok: false,
                error: Some(format!("target answered {status}")),
                http_status: Some(status.as_u16()),
            }
        }
        Err(e) if e.is_timeout() => {
            Outcome::failed(format!("timed out after {} ms", ticket.timeout_ms))
        }
        Err(e) => Outcome::failed(format!("request failed: {e}")),
    }
}
