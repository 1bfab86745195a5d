//! Workflow runs on a shard: a workflow is a job whose items are its steps (`JobSpec::workflow`).
//! Its run starts like any occurrence, with one ticket per step: the steps that wait for none
//! dispatched, the others written `waiting` (`step_ticket`). When a step ends, and when the shard
//! opens, `advance` reads the run, asks the pure `dag::advance` what follows and has the store
//! write it in one transaction; then it publishes what was released. The rules of how a run
//! advances are `dag`'s; this module only carries them between the store and the dispatcher.

pub mod dag;

use std::collections::BTreeMap;

use chronoshard_wire::{
    workflow::{upstream_value, UPSTREAM_KEY},
    RunStatus, Ticket, WorkflowDef,
};
use tracing::debug;
use uuid::Uuid;

use super::{
    cancel,
    fire::Firer,
    store::{run_status, StepRow},
    ShardError,
};

/// The ticket of step `ticket.item` of a workflow's run: the step's target, payload and
/// timeout, and waiting (`attempt` 0, see `store::bulk::is_waiting`) when the step waits for
/// others.
pub fn step_ticket(mut ticket: Ticket, w: &WorkflowDef) -> Ticket {
    let Some(step) = w.steps.get(ticket.item as usize) else {
        return ticket;
    };
    ticket.queue = step.target.queue().to_string();
    ticket.target = step.target.clone();
    ticket.payload = step.payload.clone();
    ticket.timeout_ms = step.timeout.as_millis() as u64;
    if !step.after.is_empty() {
        ticket.attempt = 0;
    }
    ticket
}

/// Why a step the definition no longer has is skipped (its steps changed after the run began).
const NOT_IN_WORKFLOW: &str = "the step is no longer in the workflow";

/// What one advance writes: steps to dispatch (as their first attempt), to skip and to cancel,
/// and the steps' statuses once it is written.
struct Plan {
    release: Vec<Ticket>,
    skip: Vec<(Uuid, String)>,
    stop: Vec<Uuid>,
    after: Vec<RunStatus>,
}

impl Plan {
    /// `dag::advance` over the run's steps, by item: a step of the definition the run has no
    /// ticket for (the steps changed since the run began) counts as skipped, and a waiting
    /// ticket of a step the definition no longer has is skipped.
    fn of(def: &WorkflowDef, steps: &[StepRow], epoch: u64) -> Plan {
        let n = def.steps.len();
        let mut by_item: Vec<Option<&StepRow>> = vec![None; n];
        let mut plan = Plan {
            release: Vec::new(),
            skip: Vec::new(),
            stop: Vec::new(),
            after: vec![RunStatus::Skipped; n],
        };
        let mut output = vec![None; n];
        for s in steps {
            match by_item.get_mut(s.ticket.item as usize) {
                Some(slot) => {
                    *slot = Some(s);
                    plan.after[s.ticket.item as usize] = s.status;
                    output[s.ticket.item as usize] = s.output.clone();
                }
                None if s.status == RunStatus::Waiting => {
                    plan.skip.push((s.ticket.ticket_id, NOT_IN_WORKFLOW.into()));
                }
                None => {}
            }
        }
        for a in dag::advance(def, &plan.after, &output) {
            let (item, next) = match &a {
                dag::Action::Release { item, .. } => (*item, RunStatus::Dispatched),
                dag::Action::Skip { item, .. } => (*item, RunStatus::Skipped),
                dag::Action::Cancel { item } => (*item, RunStatus::Cancelled),
            };
            let Some(step) = by_item[item] else { continue };
            plan.after[item] = next;
            match a {
                dag::Action::Release { upstream, .. } => {
                    plan.release
                        .push(released(step.ticket.clone(), upstream, epoch))
                }
                dag::Action::Skip { reason, .. } => plan.skip.push((step.ticket.ticket_id, reason)),
                dag::Action::Cancel { .. } => plan.stop.push(step.ticket.ticket_id),
            }
        }
        plan
    }

    fn is_empty(&self) -> bool {
        self.release.is_empty() && self.skip.is_empty() && self.stop.is_empty()
    }
}

/// A waiting step's ticket as its first attempt: written by the owner that dispatches it, with
/// the outputs of the steps it waited for in its payload.
fn released(mut t: Ticket, upstream: BTreeMap<String, Option<String>>, epoch: u64) -> Ticket {
    t.attempt = 1;
    t.epoch = epoch;
    let mut payload = match t.payload {
        serde_json::Value::Object(o) => o,
        _ => serde_json::Map::new(),
    };
    payload.insert(UPSTREAM_KEY.into(), upstream_value(upstream));
    t.payload = serde_json::Value::Object(payload);
    t
}

/// Carries a run of workflow `job` at `at` forward: dispatches the steps whose upstream steps all
/// succeeded (with their outputs in the payload), skips those that can no longer run, and with
/// `fail_fast` cancels the steps in progress once one failed. Once the run has ended, a
/// `buffer_one` workflow's buffered run may start. Safe to call any number of times.
pub(super) async fn advance(firer: &Firer, job: Uuid, at: i64, now: i64) -> Result<(), ShardError> {
    let Some(row) = firer.store.get_job(job).await? else {
        return Ok(());
    };
    let Some(def) = &row.spec.workflow else {
        return Ok(());
    };
    let steps = firer.store.run_steps(job, at).await?;
    if steps.is_empty() {
        return Ok(());
    }
    let plan = Plan::of(def, &steps, firer.ctx.epoch);
    let ended = plan.after.iter().all(RunStatus::is_final);
    if !plan.is_empty() {
        let done = (firer.store)
            .advance_steps(plan.release, &plan.skip, &plan.stop, now)
            .await?;
        debug!(
            job_id = %job,
            released = done.released.len(),
            skipped = done.skipped,
            cancelled = done.cancelled.len(),
            "workflow run advanced"
        );
        firer.metrics.workflow_steps(&done);
        for c in done.cancelled {
            let cluster = &firer.ctx.cluster;
            cancel::stop(cluster.client.clone(), cluster.js.clone(), c);
        }
        firer.dispatcher.publish(done.released);
    }
    if ended {
        firer.metrics.workflow_run_ended(run_status(&plan.after));
        if row.buffered_at.is_some() {
            firer.release_buffered(job, now).await?;
        }
    }
    Ok(())
}
