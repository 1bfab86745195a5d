//! How a workflow run advances, as a pure function of its steps' states: which waiting steps are
//! dispatched (every step they wait for succeeded), which are skipped (one of them will never
//! succeed) and, with `fail_fast`, which steps still in progress are cancelled. No I/O: the shard
//! reads the run, asks `advance`, and writes what it returns (`super::advance_run`).

use std::collections::BTreeMap;

use chronoshard_wire::{workflow::MAX_STEP_OUTPUT_BYTES, RunStatus, WorkflowDef};

/// What the shard does to one step of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Dispatch the waiting step `item`: every step it waits for succeeded. `upstream` holds
    /// their outputs by step name, each cut to `MAX_STEP_OUTPUT_BYTES`.
    Release {
        item: usize,
        upstream: BTreeMap<String, Option<String>>,
    },
    /// Record the waiting step `item` as skipped, for `reason`.
    Skip { item: usize, reason: String },
    /// Stop the step `item`, still in progress, because another step failed (`fail_fast`).
    Cancel { item: usize },
}

/// A step that ended without success, so the steps after it cannot run.
fn failed(s: RunStatus) -> bool {
    matches!(
        s,
        RunStatus::Failed
            | RunStatus::Dead
            | RunStatus::Cancelled
            | RunStatus::Skipped
            | RunStatus::Missed
    )
}

/// A step that failed of itself (not skipped for another's failure).
fn failed_itself(s: RunStatus) -> bool {
    failed(s) && s != RunStatus::Skipped
}

fn in_progress(s: RunStatus) -> bool {
    matches!(
        s,
        RunStatus::Dispatched | RunStatus::Running | RunStatus::Retrying
    )
}

/// The next actions for a run whose steps (by item) have `status` and `output`. Applying them
/// and asking again returns nothing new: a step is released or skipped only while it waits.
pub fn advance(def: &WorkflowDef, status: &[RunStatus], output: &[Option<String>]) -> Vec<Action> {
    let preds = def.predecessors();
    let n = def.steps.len().min(status.len());
    let mut now: Vec<RunStatus> = status[..n].to_vec();
    let mut out = Vec::new();
    let first_failure = (0..n).find(|&i| failed_itself(now[i]));
    if let (true, Some(f)) = (def.fail_fast, first_failure) {
        let reason = format!("the run failed fast: step \"{}\" failed", def.steps[f].name);
        for (i, s) in now.iter_mut().enumerate() {
            if *s == RunStatus::Waiting {
                *s = RunStatus::Skipped;
                out.push(Action::Skip {
                    item: i,
                    reason: reason.clone(),
                });
            } else if in_progress(*s) {
                out.push(Action::Cancel { item: i });
            }
        }
        return out;
    }
    // Skips spread down the graph: go round until nothing changes (at most one round per step).
    loop {
        let mut changed = false;
        for i in 0..n {
            if now[i] != RunStatus::Waiting {
                continue;
            }
            let ps = &preds[i];
            if let Some(&p) = ps.iter().find(|&&p| p < n && failed(now[p])) {
                let culprit = culprit(&preds, &now, p);
                now[i] = RunStatus::Skipped;
                out.push(Action::Skip {
                    item: i,
                    reason: format!(
                        "upstream step \"{}\" ended {}",
                        def.steps[culprit].name,
                        now[culprit].as_str()
                    ),
                });
                changed = true;
            } else if ps.iter().all(|&p| p < n && now[p] == RunStatus::Succeeded) {
                // Dispatched from now on: a step released in this round is not waiting.
                now[i] = RunStatus::Dispatched;
                let upstream = ps
                    .iter()
                    .map(|&p| (def.steps[p].name.clone(), output[p].as_deref().map(cut)))
                    .collect();
                out.push(Action::Release { item: i, upstream });
                changed = true;
            }
        }
        if !changed {
            return out;
        }
    }
}

/// The step whose own failure made step `p` fail or be skipped: `p` itself, or the first such
/// step found up the graph from it.
fn culprit(preds: &[Vec<usize>], now: &[RunStatus], p: usize) -> usize {
    let mut seen = vec![false; now.len()];
    let mut stack = vec![p];
    while let Some(i) = stack.pop() {
        if failed_itself(now[i]) {
            return i;
        }
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        stack.extend(
            preds[i]
                .iter()
                .filter(|&&q| q < now.len() && failed(now[q])),
        );
    }
    p
}

/// An output cut to `MAX_STEP_OUTPUT_BYTES`, at a character boundary.
fn cut(s: &str) -> String {
    if s.len() <= MAX_STEP_OUTPUT_BYTES {
        return s.to_string();
    }
    let mut end = MAX_STEP_OUTPUT_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests;
