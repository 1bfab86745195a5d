use super::*;
use proptest::prelude::*;

const S: i64 = 1_000;
/// 2026-01-01T00:00:00Z.
const T0: i64 = 1_767_225_600_000;

fn spec(schedule: serde_json::Value) -> JobSpec {
    serde_json::from_value(serde_json::json!({"tenant": "acme", "name": "j",
        "schedule": schedule, "target": {"type": "queue", "queue": "q"}}))
    .unwrap()
}

fn every(secs: u64) -> JobSpec {
    spec(serde_json::json!({"every": format!("{secs}s")}))
}

fn one_shot(at: i64) -> JobSpec {
    spec(serde_json::json!({"at": from_millis(at)}))
}

fn patch(schedule: Option<JobSpec>, name: Option<&str>) -> JobPatch {
    JobPatch {
        schedule: schedule.map(|s| s.schedule),
        name: name.map(str::to_string),
        ..Default::default()
    }
}

#[test]
fn a_new_job_is_active_at_its_first_occurrence_or_completed() {
    let job = create(Uuid::nil(), every(10), T0).unwrap();
    assert_eq!((job.state, job.next_fire_at), (JobState::Active, Some(T0)));
    assert_eq!(wheel_of(&job), Wheel::Track(T0));
    // a one-shot in the past is due at once
    let late = create(Uuid::nil(), one_shot(T0 - 5 * S), T0).unwrap();
    assert_eq!(late.next_fire_at, Some(T0 - 5 * S));
    let ended = spec(
        serde_json::json!({"every": "10s", "start_at": from_millis(T0 - 100 * S),
        "end_at": from_millis(T0 - 50 * S)}),
    );
    let job = create(Uuid::nil(), ended, T0).unwrap();
    assert_eq!((job.state, job.next_fire_at), (JobState::Completed, None));
    let bad = spec(serde_json::json!({"cron": "61 * * * *"}));
    assert_eq!(
        create(Uuid::nil(), bad, T0).unwrap_err().field,
        "schedule.cron"
    );
}

#[test]
fn pause_and_resume_skip_the_paused_time() {
    let job = create(Uuid::nil(), every(10), T0).unwrap();
    let (paused, fx) = apply(&job, Request::Pause { fired_ahead: false }, T0 + S).unwrap();
    assert_eq!(
        (paused.state, paused.next_fire_at),
        (JobState::Paused, None)
    );
    assert_eq!(
        fx,
        Effects {
            withdraw: true,
            wheel: Wheel::Untrack
        }
    );
    // resumed 35 s later: the next occurrence after now, none of the paused time
    let (resumed, fx) = apply(&paused, Request::Resume, T0 + 35 * S).unwrap();
    assert_eq!(resumed.next_fire_at, Some(T0 + 40 * S));
    assert_eq!(fx.wheel, Wheel::Track(T0 + 40 * S));
    assert!(!fx.withdraw);
    assert_eq!(resumed.updated_at, T0 + 35 * S);
    // resuming an active job, or pausing a paused one, changes nothing but the time
    let (again, _) = apply(&resumed, Request::Resume, T0 + 36 * S).unwrap();
    assert_eq!(again.next_fire_at, resumed.next_fire_at);
}

#[test]
fn a_completed_one_shot_can_be_paused_only_while_fired_ahead() {
    let mut job = create(Uuid::nil(), one_shot(T0 + S), T0).unwrap();
    job.state = JobState::Completed;
    job.next_fire_at = None;
    let ahead = Request::Pause { fired_ahead: true };
    assert_eq!(apply(&job, ahead, T0).unwrap().0.state, JobState::Paused);
    let after = Request::Pause { fired_ahead: false };
    assert_eq!(
        apply(&job, after, T0).unwrap_err(),
        Refused::NotActive(What::Job)
    );
    assert_eq!(
        apply(&job, Request::Resume, T0).unwrap_err(),
        Refused::NotPaused(What::Job)
    );
}

#[test]
fn a_patched_schedule_starts_again_from_now_and_other_fields_keep_it() {
    let job = create(Uuid::nil(), every(10), T0).unwrap();
    let (renamed, _) = apply(&job, Request::Patch(&patch(None, Some("k"))), T0 + 3 * S).unwrap();
    assert_eq!(
        (renamed.spec.name.as_str(), renamed.next_fire_at),
        ("k", Some(T0))
    );
    assert_eq!(renamed.anchor_at, T0);
    let (moved, fx) = apply(
        &job,
        Request::Patch(&patch(Some(every(60)), None)),
        T0 + 3 * S,
    )
    .unwrap();
    assert_eq!(moved.anchor_at, T0 + 3 * S);
    assert_eq!(moved.next_fire_at, Some(T0 + 3 * S));
    assert_eq!(fx.wheel, Wheel::Track(T0 + 3 * S));
    // a paused job keeps no next occurrence when its schedule changes
    let (paused, _) = apply(&job, Request::Pause { fired_ahead: false }, T0).unwrap();
    let (still, _) = apply(
        &paused,
        Request::Patch(&patch(Some(every(60)), None)),
        T0 + S,
    )
    .unwrap();
    assert_eq!((still.state, still.next_fire_at), (JobState::Paused, None));
    let bad = JobPatch {
        priority: Some(10),
        ..Default::default()
    };
    assert!(matches!(
        apply(&job, Request::Patch(&bad), T0),
        Err(Refused::Invalid(fe)) if fe.field == "priority"
    ));
}

#[test]
fn a_tenant_resume_moves_only_jobs_whose_occurrence_passed() {
    let job = create(Uuid::nil(), every(10), T0).unwrap();
    assert_eq!(tenant_resumed(&job, T0), None, "not passed yet");
    let moved = tenant_resumed(&job, T0 + 25 * S).unwrap();
    assert_eq!(moved.next_fire_at, Some(T0 + 30 * S));
    let shot = create(Uuid::nil(), one_shot(T0), T0).unwrap();
    let moved = tenant_resumed(&shot, T0 + S).unwrap();
    assert_eq!(
        (moved.state, moved.next_fire_at),
        (JobState::Active, Some(T0)),
        "a one-shot passed during the pause still fires"
    );
}

fn any_request() -> impl Strategy<Value = (u8, bool, u64)> {
    (0u8..5, any::<bool>(), 1u64..120)
}

proptest! {
    /// Whatever requests come, in any order: the state and the next occurrence agree, the
    /// wheel follows them, a deleted job stays deleted, and a job going on never goes back in
    /// time.
    #[test]
    fn every_sequence_of_requests_keeps_the_invariants(
        period in 1u64..300,
        steps in proptest::collection::vec((any_request(), 0i64..100_000), 1..40),
    ) {
        let mut now = T0;
        let mut job = create(Uuid::nil(), every(period), now).unwrap();
        for ((kind, fired_ahead, secs), advance) in steps {
            now += advance;
            let p = patch(Some(every(secs)), None);
            let req = match kind {
                0 => Request::Pause { fired_ahead },
                1 => Request::Resume,
                2 => Request::Patch(&p),
                3 => Request::Delete,
                _ => Request::Patch(&JobPatch::default()),
            };
            let before = job.clone();
            match apply(&job, req, now) {
                Ok((next, fx)) => {
                    prop_assert!(before.state != JobState::Deleted);
                    prop_assert_eq!(next.updated_at, now);
                    prop_assert_eq!(fx.wheel, wheel_of(&next));
                    prop_assert_eq!(fx.withdraw, matches!(req, Request::Pause { .. } | Request::Delete));
                    match next.state {
                        JobState::Active => prop_assert!(next.next_fire_at.is_some()),
                        _ => prop_assert_eq!(next.next_fire_at, None),
                    }
                    if next.state == JobState::Active && next.next_fire_at != before.next_fire_at {
                        prop_assert!(next.next_fire_at.unwrap() >= now);
                    }
                    job = next;
                }
                Err(Refused::Deleted(What::Job)) => prop_assert_eq!(before.state, JobState::Deleted),
                Err(other) => prop_assert!(
                    matches!(other, Refused::NotActive(What::Job) | Refused::NotPaused(What::Job)),
                    "{other:?}"
                ),
            }
        }
    }
}

#[test]
fn a_workflows_refusals_name_a_workflow() {
    let wf: chronoshard_wire::workflow::WorkflowSpec = serde_json::from_value(serde_json::json!({
        "tenant": "acme", "name": "w", "schedule": {"every": "1h"},
        "steps": [{"name": "a", "target": {"type": "queue", "queue": "q"}}]}))
    .unwrap();
    let job = create(Uuid::nil(), wf.into_job(), T0).unwrap();
    let mut ended = job.clone();
    ended.state = JobState::Completed;
    let refused = apply(&ended, Request::Resume, T0).unwrap_err();
    assert_eq!(refused, Refused::NotPaused(What::Workflow));
    assert_eq!(refused.to_string(), "only a paused workflow can be resumed");
    let pause = Request::Pause { fired_ahead: false };
    let refused = apply(&ended, pause, T0).unwrap_err();
    assert_eq!(refused.to_string(), "only an active workflow can be paused");
    let (deleted, _) = apply(&job, Request::Delete, T0).unwrap();
    let refused = apply(&deleted, Request::Resume, T0).unwrap_err();
    assert_eq!(refused.to_string(), "workflow is deleted");
    // A job's say "job".
    let job = create(Uuid::nil(), every(10), T0).unwrap();
    let (deleted, _) = apply(&job, Request::Delete, T0).unwrap();
    let refused = apply(&deleted, Request::Delete, T0).unwrap_err();
    assert_eq!(refused.to_string(), "job is deleted");
}
