//! `GET /v1/schedule/preview`: the next fire times of a schedule, evaluated exactly as shards do.

use axum::Json;
use chrono::{DateTime, Utc};
use chronoshard_wire::{Dur, ScheduleSpec};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{body::Params, error::ApiError};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PreviewQuery {
    /// Cron expression (5 or 6 fields).
    #[param(min_length = 1)]
    pub cron: Option<String>,
    /// IANA time zone of `cron`, default UTC.
    pub timezone: Option<String>,
    /// Interval such as `30s`.
    #[param(pattern = "^([0-9]+(ms|s|m|h|d))+$")]
    pub every: Option<String>,
    /// Anchor of `every`; default: `after`.
    pub start_at: Option<DateTime<Utc>>,
    /// `every` fires only strictly before this instant.
    pub end_at: Option<DateTime<Utc>>,
    /// Fire times strictly after this instant (RFC 3339); default now.
    pub after: Option<DateTime<Utc>>,
    /// 1–1000, default 10.
    #[param(minimum = 1, maximum = 1000)]
    pub count: Option<u32>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Preview {
    /// UTC, RFC 3339, strictly increasing.
    pub fire_times: Vec<DateTime<Utc>>,
}

/// Preview the next fire times of a cron or interval schedule.
#[utoipa::path(get, path = "/v1/schedule/preview", tag = "schedule", params(PreviewQuery),
    responses((status = 200, body = Preview)),
    security(("bearer" = [])))]
pub async fn preview(Params(q): Params<PreviewQuery>) -> Result<Json<Preview>, ApiError> {
    let count = match q.count.unwrap_or(10) {
        c @ 1..=1000 => c as usize,
        _ => return Err(ApiError::field("count", "must be 1-1000")),
    };
    let after = q.after.unwrap_or_else(Utc::now);
    let every = q
        .every
        .as_deref()
        .map(|e| {
            e.parse::<Dur>()
                .map_err(|err| ApiError::field("every", err.to_string()))
        })
        .transpose()?;
    let spec = ScheduleSpec {
        cron: q.cron,
        timezone: q.timezone,
        every,
        start_at: if every.is_some() {
            Some(q.start_at.unwrap_or(after))
        } else {
            q.start_at
        },
        end_at: q.end_at,
        ..Default::default()
    };
    if spec.cron.is_none() && spec.every.is_none() {
        return Err(ApiError::field("cron", "one of cron or every is required"));
    }
    // Field names in errors are the query parameter names.
    let schedule = chronoshard_schedule::spec::compile(&spec, after)
        .map_err(|e| ApiError::field(e.field.trim_start_matches("schedule."), e.message))?;
    Ok(Json(Preview {
        fire_times: schedule.preview(after, count),
    }))
}
