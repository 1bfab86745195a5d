//! `/v1/dlq`: tickets whose attempts ran out, across shards, and their replay.

use axum::{extract::State, http::StatusCode, response::IntoResponse, Json};
use chronoshard_wire::{
    rpc::{ShardReply, ShardRequest},
    DeadLetter, TicketView,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::routing::Route;

use super::{
    auth::Caller,
    body::{Params, PathId},
    error::ApiError,
    jobs::{find_ticket, limit, tenant_or_all},
    AppState,
};

/// A page of dead letters, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeadLetterPage {
    pub items: Vec<DeadLetter>,
    /// Pass as `cursor` to get older dead letters; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DlqQuery {
    /// Only this tenant's dead letters.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub tenant: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(
        pattern = "^-?[0-9]{1,19}_[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub cursor: Option<String>,
    /// 1–500, default 50.
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// The cursor is the last item's `(dead_at ms, ticket id)`: stable while new letters arrive.
fn parse_cursor(c: &str) -> Result<(i64, Uuid), ApiError> {
    let bad = || ApiError::field("cursor", "not a cursor from a previous page");
    let (at, id) = c.split_once('_').ok_or_else(bad)?;
    Ok((
        at.parse().map_err(|_| bad())?,
        Uuid::parse_str(id).map_err(|_| bad())?,
    ))
}

fn cursor_of(d: &DeadLetter) -> String {
    format!("{}_{}", d.dead_at.timestamp_millis(), d.ticket_id)
}

/// Dead letters: tickets whose last allowed attempt failed, newest first.
#[utoipa::path(get, path = "/v1/dlq", tag = "dlq", params(DlqQuery),
    responses((status = 200, body = DeadLetterPage)),
    security(("bearer" = [])))]
pub async fn list_dead_letters(
    State(state): State<AppState>,
    caller: Caller,
    Params(q): Params<DlqQuery>,
) -> Result<Json<DeadLetterPage>, ApiError> {
    let limit = limit(q.limit)?;
    let tenant = caller.scope(q.tenant.as_deref())?;
    let before = q.cursor.as_deref().map(parse_cursor).transpose()?;
    let req = ShardRequest::ListDeadLetters {
        tenant: tenant.map(str::to_string),
        before,
        limit,
    };
    let replies = tenant_or_all(&state, tenant, &req).await?;
    let mut items = Vec::new();
    for reply in replies {
        match reply? {
            // While a tenant moves both shards may list it: the one it is placed on answers.
            ShardReply::DeadLetters { items: more } => items.extend(
                more.into_iter()
                    .filter(|d| state.router.holds(d.shard, d.ticket_id)),
            ),
            other => {
                return Err(ApiError::Internal(format!(
                    "unexpected shard reply {other:?}"
                )))
            }
        }
    }
    // Each shard gave its newest `limit`; the newest `limit` of them all is this page.
    items.sort_by_key(|d| std::cmp::Reverse((d.dead_at, d.ticket_id)));
    items.truncate(limit as usize);
    let next_cursor = (items.len() == limit as usize)
        .then(|| items.last().map(cursor_of))
        .flatten();
    Ok(Json(DeadLetterPage { items, next_cursor }))
}

/// Replay a dead letter: its next attempt is published now, with the job's retry budget afresh.
#[utoipa::path(post, path = "/v1/dlq/{ticket_id}/replay", tag = "dlq", params(("ticket_id" = Uuid, Path)),
    responses((status = 202, body = TicketView)),
    security(("bearer" = [])))]
pub async fn replay(
    State(state): State<AppState>,
    caller: Caller,
    PathId(ticket_id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let ticket = find_ticket(&state, ticket_id).await?;
    caller.sees(&ticket.tenant, "ticket")?;
    match state
        .router
        .call(
            match state.router.shard_for_id(ticket_id) {
                Some(_) => Route::Id(ticket_id),
                None => Route::Shard(ticket.shard),
            },
            &ShardRequest::ReplayTicket { ticket_id },
        )
        .await?
    {
        ShardReply::Ticket { ticket } => Ok((StatusCode::ACCEPTED, Json(ticket))),
        other => Err(ApiError::Internal(format!(
            "unexpected shard reply {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_bad_ones_are_a_400() {
        let d = DeadLetter {
            ticket_id: Uuid::now_v7(),
            job_id: Uuid::now_v7(),
            tenant: "t".into(),
            shard: 0,
            scheduled_at: chrono::Utc::now(),
            item: 0,
            queue: "q".into(),
            attempts: 3,
            error: None,
            dead_at: chronoshard_wire::from_millis(1_700_000_000_123),
        };
        assert_eq!(
            parse_cursor(&cursor_of(&d)).unwrap(),
            (1_700_000_000_123, d.ticket_id)
        );
        for bad in ["", "x", "1_y", "a_0190a0a0-0000-7000-8000-000000000000"] {
            assert!(
                matches!(parse_cursor(bad), Err(ApiError::InvalidField { ref field, .. }) if field == "cursor"),
                "{bad}"
            );
        }
    }
}
