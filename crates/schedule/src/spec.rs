//! The bridge from the wire's job spec to an evaluable `Schedule`: compiling a `ScheduleSpec`,
//! and checking a whole `JobSpec` with its schedule. Every refusal names the field at fault.
//! Pure, like the rest of the crate: the creation instant is passed in.

use chrono::{DateTime, Utc};
use chronoshard_wire::{from_millis, job::FieldError, JobSpec, ScheduleKind, ScheduleSpec};

use crate::{Cron, Error as E, Schedule};

/// Builds the evaluable schedule. `created_at` anchors `delay` and the default `start_at`.
/// Instants are truncated to whole milliseconds, the platform's resolution, so that a stored
/// occurrence (milliseconds) and the schedule always agree.
pub fn compile(spec: &ScheduleSpec, created_at: DateTime<Utc>) -> Result<Schedule, FieldError> {
    let ms = |t: DateTime<Utc>| from_millis(t.timestamp_millis());
    let created_at = ms(created_at);
    Ok(match spec.kind()? {
        ScheduleKind::Cron => {
            let expr = spec.cron.as_deref().unwrap_or_default();
            let tz = spec.timezone.as_deref().unwrap_or("UTC");
            Schedule::Cron(Cron::parse(expr, tz).map_err(|e| match e {
                E::UnknownTimeZone(_) => FieldError::new("schedule.timezone", e.to_string()),
                _ => FieldError::new("schedule.cron", e.to_string()),
            })?)
        }
        ScheduleKind::Every => {
            let every = spec.every.unwrap_or_default();
            Schedule::every(
                every.0,
                ms(spec.start_at.unwrap_or(created_at)),
                spec.end_at.map(ms),
            )
            .map_err(|e| FieldError::new("schedule.every", e.to_string()))?
        }
        ScheduleKind::At => Schedule::At(ms(spec.at.unwrap_or(created_at))),
        ScheduleKind::Delay => {
            let delay = chrono::Duration::milliseconds(spec.delay.unwrap_or_default().as_millis());
            Schedule::At(created_at + delay)
        }
    })
}

/// Checks every field of a job spec and compiles its schedule (`created_at` anchors `delay` and
/// the default `start_at`), so callers need not compile twice.
pub fn check_job(spec: &JobSpec, created_at: DateTime<Utc>) -> Result<Schedule, FieldError> {
    spec.validate()?;
    compile(&spec.schedule, created_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_names_the_field() {
        let s = ScheduleSpec {
            cron: Some("61 * * * *".into()),
            ..Default::default()
        };
        assert_eq!(compile(&s, Utc::now()).unwrap_err().field, "schedule.cron");
        let s = ScheduleSpec {
            cron: Some("* * * * *".into()),
            timezone: Some("Mars/Olympus".into()),
            ..Default::default()
        };
        assert_eq!(
            compile(&s, Utc::now()).unwrap_err().field,
            "schedule.timezone"
        );
    }

    #[test]
    fn instants_are_truncated_to_milliseconds() {
        let t: DateTime<Utc> = "2026-11-29T08:34:45.082719350Z".parse().unwrap();
        let s = ScheduleSpec {
            at: Some(t),
            ..Default::default()
        };
        let at = compile(&s, t).unwrap();
        assert_eq!(
            at,
            Schedule::At("2026-11-29T08:34:45.082Z".parse().unwrap())
        );
        assert_eq!(
            at.next_after("2026-11-29T08:34:45.082Z".parse().unwrap()),
            None
        );
    }

    #[test]
    fn delay_is_at_creation_plus_delay() {
        let now = from_millis(Utc::now().timestamp_millis());
        let s = ScheduleSpec {
            delay: Some("10m".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(
            compile(&s, now).unwrap(),
            Schedule::At(now + chrono::Duration::minutes(10))
        );
    }
}
