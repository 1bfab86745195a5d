//! A job's state machine: what creating a job or a write request does to it, as a pure function
//! of the job, the request and the shard's clock. It owns the rules of the job states (active,
//! paused, completed, deleted) and of the next occurrence. It must not touch the store, the wheel
//! or the network: the shard loop reads the job, asks `apply`, then writes the new job and carries
//! out the effects it returns. Firing (and so `trigger`) is the fire path's, not this module's.

use chronoshard_schedule::{
    spec::{check_job, compile},
    Schedule,
};
use chronoshard_wire::{from_millis, job::FieldError, to_millis, JobPatch, JobSpec, JobState};
use uuid::Uuid;

use super::store::JobRow;

/// A write request about one existing job.
#[derive(Clone, Copy, Debug)]
pub enum Request<'a> {
    Patch(&'a JobPatch),
    /// `fired_ahead`: a ticket of the job was written ahead of its time and is not due yet, so a
    /// one-shot completed by that early fire can still be paused.
    Pause {
        fired_ahead: bool,
    },
    Resume,
    Delete,
}

/// Why a request leaves the job as it is. The refusals of a state name what was asked about,
/// so a caller of the workflow routes reads "workflow".
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Refused {
    #[error("{0} is deleted")]
    Deleted(What),
    #[error("{}: {}", .0.field, .0.message)]
    Invalid(FieldError),
    #[error("only an active {0} can be paused")]
    NotActive(What),
    #[error("only a paused {0} can be resumed")]
    NotPaused(What),
    /// The stored spec no longer compiles (it did when it was written).
    #[error("stored schedule does not compile: {0}")]
    Corrupt(String),
}

/// What a job row stands for, as a refusal names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    Job,
    Workflow,
}

impl What {
    pub fn of(job: &JobRow) -> What {
        match job.spec.workflow {
            Some(_) => What::Workflow,
            None => What::Job,
        }
    }
}

impl std::fmt::Display for What {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            What::Job => "job",
            What::Workflow => "workflow",
        })
    }
}

/// What the wheel does with the job after the write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wheel {
    /// Hold its next occurrence, due at this instant.
    Track(i64),
    /// Hold nothing of it.
    Untrack,
}

/// What the shard does besides writing the new job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Effects {
    /// Take back its tickets written ahead of their time and not due yet (pause, delete).
    pub withdraw: bool,
    pub wheel: Wheel,
}

/// A new job, created at `now`: active at its first occurrence, or completed when it has none.
pub fn create(id: Uuid, spec: JobSpec, now: i64) -> Result<JobRow, FieldError> {
    let schedule = check_job(&spec, from_millis(now))?;
    let mut row = JobRow {
        id,
        tenant: spec.tenant.clone(),
        spec,
        state: JobState::Active,
        created_at: now,
        updated_at: now,
        anchor_at: now,
        next_fire_at: None,
        buffered_at: None,
    };
    start_at(&mut row, &schedule, now);
    Ok(row)
}

/// Whether the job still takes requests (this module's and a trigger): a deleted one takes none.
pub fn live(job: &JobRow) -> Result<(), Refused> {
    match job.state {
        JobState::Deleted => Err(Refused::Deleted(What::of(job))),
        _ => Ok(()),
    }
}

/// The job after `req` at `now`, and what the shard does about it.
pub fn apply(job: &JobRow, req: Request<'_>, now: i64) -> Result<(JobRow, Effects), Refused> {
    live(job)?;
    let mut job = job.clone();
    match req {
        Request::Patch(patch) => {
            let spec = patch.apply(&job.spec);
            let schedule_changed = spec.schedule != job.spec.schedule;
            if schedule_changed {
                job.anchor_at = now;
            }
            job.spec = spec;
            let schedule =
                check_job(&job.spec, from_millis(job.anchor_at)).map_err(Refused::Invalid)?;
            // Occurrences already ticketed run as they are; only future ones are recomputed.
            if schedule_changed && job.state != JobState::Paused {
                start_at(&mut job, &schedule, now);
            }
        }
        Request::Delete => {
            job.state = JobState::Deleted;
            job.next_fire_at = None;
        }
        Request::Pause { fired_ahead } => match job.state {
            JobState::Active => pause(&mut job),
            // A one-shot fired ahead of its time is completed already, but a pause before its
            // time still holds for it.
            JobState::Completed if fired_ahead => pause(&mut job),
            JobState::Paused => {}
            _ => return Err(Refused::NotActive(What::of(&job))),
        },
        Request::Resume => match job.state {
            JobState::Paused => {
                // No catch-up for the paused time: start from the first occurrence after now.
                let schedule = schedule_of(&job).map_err(|e| Refused::Corrupt(e.to_string()))?;
                start_at(&mut job, &schedule, now);
            }
            JobState::Active => {}
            _ => return Err(Refused::NotPaused(What::of(&job))),
        },
    }
    job.updated_at = now;
    let effects = Effects {
        withdraw: matches!(req, Request::Pause { .. } | Request::Delete),
        wheel: wheel_of(&job),
    };
    Ok((job, effects))
}

/// The job after its tenant was resumed at `now`, when its next occurrence passed during the
/// pause: it goes on from its first occurrence after now (no catch-up for the paused time, as a
/// resumed job). `None`: nothing to change (or a stored schedule that no longer compiles, which
/// is left as it is).
pub fn tenant_resumed(job: &JobRow, now: i64) -> Option<JobRow> {
    if job.state != JobState::Active || job.next_fire_at.is_none_or(|at| at >= now) {
        return None;
    }
    let schedule = schedule_of(job).ok()?;
    let mut job = job.clone();
    start_at(&mut job, &schedule, now);
    Some(job)
}

/// The evaluable schedule of a stored job, anchored when its schedule was set.
pub fn schedule_of(job: &JobRow) -> Result<Schedule, FieldError> {
    compile(&job.spec.schedule, from_millis(job.anchor_at))
}

/// What the wheel holds of a job as stored.
pub fn wheel_of(job: &JobRow) -> Wheel {
    match job.next_fire_at {
        Some(at) if job.state == JobState::Active => Wheel::Track(at),
        _ => Wheel::Untrack,
    }
}

fn pause(job: &mut JobRow) {
    job.state = JobState::Paused;
    job.next_fire_at = None;
}

/// Sets the job going from `now`: active at the schedule's first occurrence, or completed.
fn start_at(job: &mut JobRow, schedule: &Schedule, now: i64) {
    job.next_fire_at = first_occurrence(schedule, now);
    job.state = if job.next_fire_at.is_some() {
        JobState::Active
    } else {
        JobState::Completed
    };
}

/// The first occurrence of a schedule that starts now: a one-shot in the past is due at once,
/// recurring schedules start with their first occurrence at or after `now`.
pub fn first_occurrence(schedule: &Schedule, now: i64) -> Option<i64> {
    match schedule {
        Schedule::At(t) => Some(to_millis(*t)),
        _ => schedule.next_after(from_millis(now - 1)).map(to_millis),
    }
}

#[cfg(test)]
mod tests;
