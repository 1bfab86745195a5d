//! A workflow as clients write it (`WorkflowSpec`, `WorkflowPatch`) and read it (`Workflow`,
//! `WorkflowRun`), and the one place that checks its steps: names, `after` edges, cycles, size.
//!
//! A shard keeps a workflow as a job whose occurrences are the workflow's runs and whose items are
//! its steps (`JobSpec::workflow` holds the steps): schedule, catch-up, overlap, pause, trigger,
//! fencing and one ticket per item then hold for workflows as they hold for jobs. This module
//! converts between the two forms and holds no rule of how a run advances (the shard's).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::{
    job::{check_retry, check_target, check_timeout, check_token, default_priority, FieldError},
    AttemptView, CatchupSpec, Dur, JobSpec, JobState, Overlap, RetrySpec, RunStatus, ScheduleSpec,
    TargetSpec,
};

/// Most steps in one workflow: every run writes a ticket per step in one transaction.
pub const MAX_STEPS: usize = 100;
/// Most bytes of a step's output handed to the steps after it (the rest is cut off).
pub const MAX_STEP_OUTPUT_BYTES: usize = 16 << 10;
/// The payload key under which a step receives the outputs of the steps it waits for.
pub const UPSTREAM_KEY: &str = "upstream";

/// A request to create a workflow (`POST /v1/workflows`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowSpec {
    /// Tenant the workflow belongs to: 1–64 characters of `A-Z a-z 0-9 _ -`.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub tenant: String,
    /// Human name, 1–200 characters; not unique.
    #[schema(min_length = 1, max_length = 200, pattern = "\\S")]
    pub name: String,
    /// When runs start: the same four kinds as a job's schedule.
    pub schedule: ScheduleSpec,
    /// 1–100 steps; a step runs once every step in its `after` has succeeded.
    pub steps: Vec<StepSpec>,
    /// When a step fails for good, cancel the steps still running in other branches instead of
    /// letting them finish.
    #[serde(default)]
    pub fail_fast: bool,
    /// What happens when a run is due while the previous run still runs.
    #[serde(default)]
    pub overlap: Overlap,
    #[serde(default)]
    pub catchup: CatchupSpec,
    /// 0 (lowest) to 9 (highest), default 5: the priority of every step's ticket.
    #[serde(default = "default_priority")]
    #[schema(minimum = 0, maximum = 9)]
    pub priority: u8,
}

/// One step of a workflow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    /// Unique within the workflow: 1–64 characters of `A-Z a-z 0-9 _ -`.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub name: String,
    pub target: TargetSpec,
    /// A JSON object (or absent). A step with `after` receives it with an `upstream` field added:
    /// the output of each step it waits for, by step name.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    #[serde(default)]
    pub retry: RetrySpec,
    /// Per-attempt execution timeout (default 30s).
    #[serde(default = "crate::job::default_timeout")]
    pub timeout: Dur,
    /// The steps that must succeed before this one runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
}

/// What a shard keeps of a workflow besides what it shares with a job: its steps, in the order
/// given (a step's index is its ticket's item), and `fail_fast`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowDef {
    pub steps: Vec<StepSpec>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_fast: bool,
}

impl WorkflowDef {
    /// Checks the steps: their count, names, targets, retries, timeouts, payloads and edges,
    /// and that the edges make no cycle. Every error names the step (`steps[2].after`).
    pub fn validate(&self) -> Result<(), FieldError> {
        if self.steps.is_empty() || self.steps.len() > MAX_STEPS {
            return Err(FieldError::new(
                "steps",
                format!("must hold 1-{MAX_STEPS} steps"),
            ));
        }
        let mut index = HashMap::new();
        for (i, step) in self.steps.iter().enumerate() {
            let at = format!("steps[{i}]");
            check_token(&format!("{at}.name"), &step.name, 64)?;
            if index.insert(step.name.as_str(), i).is_some() {
                return Err(FieldError::new(
                    format!("{at}.name"),
                    format!("duplicate step name \"{}\"", step.name),
                ));
            }
            check_target(&format!("{at}.target"), &step.target)?;
            check_retry(&format!("{at}.retry"), &step.retry)?;
            check_timeout(&format!("{at}.timeout"), step.timeout)?;
            check_payload(&at, step)?;
        }
        for (i, step) in self.steps.iter().enumerate() {
            for (k, name) in step.after.iter().enumerate() {
                let field = format!("steps[{i}].after");
                if !index.contains_key(name.as_str()) {
                    return Err(FieldError::new(field, format!("unknown step \"{name}\"")));
                }
                if name == &step.name {
                    return Err(FieldError::new(
                        field,
                        format!("step \"{name}\" cannot wait for itself"),
                    ));
                }
                if step.after[..k].contains(name) {
                    return Err(FieldError::new(field, format!("lists \"{name}\" twice")));
                }
            }
        }
        if let Some(cycle) = self.cycle() {
            // The last step of the path waits for the one before it: that `after` entry
            // closes the cycle.
            let (before, last) = (cycle[cycle.len() - 2], cycle[cycle.len() - 1]);
            let path: Vec<&str> = cycle.iter().map(|&i| self.steps[i].name.as_str()).collect();
            return Err(FieldError::new(
                format!("steps[{last}].after"),
                format!(
                    "the edge \"{}\" after \"{}\" closes the cycle {}",
                    self.steps[last].name,
                    self.steps[before].name,
                    path.join(" → "),
                ),
            ));
        }
        Ok(())
    }

    /// For each step, the indices of the steps it waits for. Names not found are left out
    /// (`validate` refuses them).
    pub fn predecessors(&self) -> Vec<Vec<usize>> {
        let index: HashMap<&str, usize> = self
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_str(), i))
            .collect();
        self.steps
            .iter()
            .map(|s| {
                s.after
                    .iter()
                    .filter_map(|n| index.get(n.as_str()).copied())
                    .collect()
            })
            .collect()
    }

    /// A cycle of `after` edges, if any: step indices where each waits for the one before it,
    /// the first repeated at the end.
    fn cycle(&self) -> Option<Vec<usize>> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            Open,
            Done,
        }
        let preds = self.predecessors();
        // Edges from a step to the steps waiting for it, so a cycle reads in run order.
        let mut next = vec![Vec::new(); preds.len()];
        for (i, ps) in preds.iter().enumerate() {
            for &p in ps {
                next[p].push(i);
            }
        }
        let mut mark = vec![Mark::New; next.len()];
        for root in 0..next.len() {
            if mark[root] != Mark::New {
                continue;
            }
            // Depth-first without recursion: a path of (step, next edge to follow).
            let mut path = vec![(root, 0usize)];
            mark[root] = Mark::Open;
            while let Some(&mut (at, ref mut edge)) = path.last_mut() {
                if let Some(&to) = next[at].get(*edge) {
                    *edge += 1;
                    match mark[to] {
                        Mark::Open => {
                            let from = path.iter().position(|&(s, _)| s == to).unwrap_or(0);
                            let mut cycle: Vec<usize> =
                                path[from..].iter().map(|&(s, _)| s).collect();
                            cycle.push(to);
                            return Some(cycle);
                        }
                        Mark::New => {
                            mark[to] = Mark::Open;
                            path.push((to, 0));
                        }
                        Mark::Done => {}
                    }
                } else {
                    mark[at] = Mark::Done;
                    path.pop();
                }
            }
        }
        None
    }
}

fn check_payload(at: &str, step: &StepSpec) -> Result<(), FieldError> {
    match &step.payload {
        serde_json::Value::Null => Ok(()),
        serde_json::Value::Object(o) if !step.after.is_empty() && o.contains_key(UPSTREAM_KEY) => {
            Err(FieldError::new(
                format!("{at}.payload.{UPSTREAM_KEY}"),
                "is where a step receives the outputs of the steps it waits for",
            ))
        }
        serde_json::Value::Object(_) => Ok(()),
        _ => Err(FieldError::new(
            format!("{at}.payload"),
            "must be a JSON object (the outputs of the steps before it are added to it)",
        )),
    }
}

impl WorkflowSpec {
    /// The job a shard keeps for this workflow. Its own target, payload, retry and timeout are
    /// never used (each step has its own); the target is the first step's so the job stays a
    /// valid one.
    pub fn into_job(self) -> JobSpec {
        JobSpec {
            tenant: self.tenant,
            name: self.name,
            schedule: self.schedule,
            target: self
                .steps
                .first()
                .map(|s| s.target.clone())
                .unwrap_or(TargetSpec::Queue {
                    queue: "workflow".into(),
                    job_type: None,
                }),
            payload: serde_json::Value::Null,
            retry: RetrySpec::default(),
            timeout: crate::job::default_timeout(),
            overlap: self.overlap,
            catchup: self.catchup,
            priority: self.priority,
            shard_items: self.steps.len().max(1) as u32,
            workflow: Some(WorkflowDef {
                steps: self.steps,
                fail_fast: self.fail_fast,
            }),
        }
    }

    /// The workflow a shard's job stands for; `None` for a plain job.
    pub fn of_job(spec: &JobSpec) -> Option<WorkflowSpec> {
        let w = spec.workflow.as_ref()?;
        Some(WorkflowSpec {
            tenant: spec.tenant.clone(),
            name: spec.name.clone(),
            schedule: spec.schedule.clone(),
            steps: w.steps.clone(),
            fail_fast: w.fail_fast,
            overlap: spec.overlap,
            catchup: spec.catchup.clone(),
            priority: spec.priority,
        })
    }
}

/// `PATCH /v1/workflows/{id}`: the fields to change; the tenant cannot change. New steps apply
/// to runs that start after the change.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 200, pattern = "\\S")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<StepSpec>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_fast: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<Overlap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catchup: Option<CatchupSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 9)]
    pub priority: Option<u8>,
}

impl WorkflowPatch {
    /// The job patch that makes this change to `current`, the workflow's job as stored.
    pub fn to_job_patch(&self, current: &WorkflowDef) -> crate::JobPatch {
        let workflow = (self.steps.is_some() || self.fail_fast.is_some()).then(|| WorkflowDef {
            steps: self.steps.clone().unwrap_or_else(|| current.steps.clone()),
            fail_fast: self.fail_fast.unwrap_or(current.fail_fast),
        });
        crate::JobPatch {
            name: self.name.clone(),
            schedule: self.schedule.clone(),
            overlap: self.overlap,
            catchup: self.catchup.clone(),
            priority: self.priority,
            target: workflow
                .as_ref()
                .and_then(|w| w.steps.first())
                .map(|s| s.target.clone()),
            workflow,
            ..Default::default()
        }
    }
}

/// A workflow as the API returns it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Workflow {
    pub id: Uuid,
    #[serde(flatten)]
    pub spec: WorkflowSpec,
    pub state: JobState,
    /// Shard that owns the workflow and its runs.
    pub shard: u32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The next (up to 5) times a run starts, UTC.
    pub next_fire_times: Vec<DateTime<Utc>>,
}

impl Workflow {
    /// The workflow a shard's job stands for; `None` for a plain job.
    pub fn of_job(job: &crate::Job) -> Option<Workflow> {
        Some(Workflow {
            id: job.id,
            spec: WorkflowSpec::of_job(&job.spec)?,
            state: job.state,
            shard: job.shard,
            created_at: job.created_at,
            updated_at: job.updated_at,
            next_fire_times: job.next_fire_times.clone(),
        })
    }
}

/// One run of a workflow (`GET /v1/workflow-runs/{run_id}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkflowRun {
    /// The run's id: the ticket id of its first step, so it leads to the workflow's shard.
    /// Absent for an occurrence that never started (recorded `skipped` or `missed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<Uuid>,
    pub workflow_id: Uuid,
    pub scheduled_at: DateTime<Utc>,
    /// `succeeded` once every step has; `dead` once a step failed for good and nothing runs
    /// any more; `cancelled` when overlap `replace` replaced it; otherwise in progress.
    pub status: RunStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A range of consecutive missed or skipped occurrences recorded as one: the last one's
    /// time and how many there were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_end: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    pub updated_at: DateTime<Utc>,
    /// Every step, in the workflow's order; none for an occurrence that never started.
    pub steps: Vec<StepRun>,
}

/// One step of a workflow run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StepRun {
    pub name: String,
    /// `waiting` until every step it waits for has succeeded; `skipped` when one of them failed
    /// for good (`reason` says which) or the run failed fast.
    pub status: RunStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub ticket_id: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    pub attempts: Vec<AttemptView>,
}

/// The outputs handed to a step, by the name of the step that produced each: what a step
/// printed or answered, as JSON when it parses as JSON, else as a string.
pub fn upstream_value(outputs: BTreeMap<String, Option<String>>) -> serde_json::Value {
    let map = outputs
        .into_iter()
        .map(|(name, out)| {
            let v = match out {
                None => serde_json::Value::Null,
                Some(s) => serde_json::from_str(&s).unwrap_or(serde_json::Value::String(s)),
            };
            (name, v)
        })
        .collect();
    serde_json::Value::Object(map)
}

#[cfg(test)]
mod tests;
