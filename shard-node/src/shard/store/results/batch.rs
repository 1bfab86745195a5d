//! One batch of results applied to an in-memory copy of the rows it touches, one result after the
//! other in the batch's order, with the rules of the module docs (`super`): the same outcome,
//! follow-ups and counts as applying each result with its own statements, in a handful of
//! statements for the whole batch. Two reports of one attempt in a batch (`started` and
//! `succeeded`) end as one write of its row, and each occurrence's run is written once with its
//! last status.
//!
//! Each rule tests the attempt's state as the results before it in the batch left it, which is
//! what makes a duplicate, a late `started` or a result for an unknown ticket change nothing.

use std::collections::{HashMap, HashSet};

use chronoshard_wire::{JobSpec, ResultKind, RunStatus, TicketResult};
use uuid::Uuid;

use super::{
    next_attempt,
    rows::{self, AttemptRow, FailureRow, Occurrence, RunRow, TicketRow},
    ticket_json, Applied, FollowUp, DEFAULT_TIMEOUT_MS,
};
use crate::shard::{
    retry,
    store::{
        parse_uuid,
        sql::Sql,
        views::{run_status, status_of, ticket_from_json},
        Result, Store, StoreError, Tx,
    },
};

/// Applies `results` in `tx` (which holds the shard's write lock) and writes what changed, one
/// statement at a time.
pub(super) async fn apply(tx: &mut Tx, results: &[TicketResult], now: i64) -> Result<Applied> {
    let (ids, failing) = wanted(results);
    let fetched = rows::read(tx, &rows::reads(&ids, &failing)).await?;
    let b = Batch::applied(fetched, results, now)?;
    let changed = b.changed();
    rows::write(tx, &changed.writes(), now).await?;
    Ok(b.out)
}

/// `apply` on SQLite in two trips to the connection's thread: the opening (write lock, epoch
/// check) with every read, then every write with the commit (`one_trip`).
pub(super) async fn apply_in_two_trips(
    store: &Store,
    results: &[TicketResult],
    now: i64,
) -> Result<Applied> {
    let (ids, failing) = wanted(results);
    let reads = rows::reads(&ids, &failing);
    let mut trip = store.trip();
    for r in &reads {
        r.push(&mut trip);
    }
    let (open, found) = store.open_trip(trip, reads.len()).await?;
    let mut fetched = rows::Fetched::default();
    for (r, row) in reads.iter().zip(&found) {
        r.parse(row, &mut fetched)?;
    }
    let b = Batch::applied(fetched, results, now)?;
    let changed = b.changed();
    let writes = changed.writes();
    let mut sql = Sql::sqlite();
    for w in &writes {
        w.push(&mut sql, now);
    }
    open.commit(sql).await?;
    Ok(b.out)
}

/// The tickets a batch reads, and those of them with a failure in it, each once.
fn wanted(results: &[TicketResult]) -> (Vec<String>, Vec<String>) {
    let mut ids: Vec<String> = Vec::new();
    let mut seen = HashSet::new();
    let mut failing: Vec<String> = Vec::new();
    let mut failing_seen = HashSet::new();
    for r in results {
        if seen.insert(r.ticket_id) {
            ids.push(r.ticket_id.to_string());
        }
        if r.kind == ResultKind::Failed && failing_seen.insert(r.ticket_id) {
            failing.push(r.ticket_id.to_string());
        }
    }
    (ids, failing)
}

/// The rows a batch changed, in the order it changed them, as its writes take them.
struct Changed<'a> {
    inserted: Vec<rows::AttemptWrite<'a>>,
    updated: Vec<rows::AttemptWrite<'a>>,
    tickets: Vec<(Uuid, &'a TicketRow)>,
    runs: Vec<(&'a Occurrence, &'a RunRow)>,
}

impl Changed<'_> {
    fn writes(&self) -> Vec<rows::Write<'_>> {
        rows::writes(&self.inserted, &self.updated, &self.tickets, &self.runs)
    }
}

struct Batch {
    now: i64,
    tickets: HashMap<Uuid, TicketRow>,
    attempts: HashMap<(Uuid, i64), AttemptRow>,
    failures: HashMap<Uuid, FailureRow>,
    /// The item tickets of each occurrence read.
    items: HashMap<Occurrence, Vec<Uuid>>,
    runs: HashMap<Occurrence, RunRow>,
    /// What changed, in the order it first changed (writes are in this order).
    ticket_order: Vec<Uuid>,
    attempt_order: Vec<(Uuid, i64)>,
    run_order: Vec<Occurrence>,
    /// Workflow runs a step of which ended in this batch (one follow-up each).
    steps_ended: HashSet<Occurrence>,
    out: Applied,
}

impl Batch {
    /// `results` applied one after the other to the rows read.
    fn applied(fetched: rows::Fetched, results: &[TicketResult], now: i64) -> Result<Batch> {
        let mut b = Batch {
            now,
            tickets: fetched.tickets,
            attempts: fetched.attempts,
            failures: fetched.failures,
            items: HashMap::new(),
            runs: HashMap::new(),
            ticket_order: Vec::new(),
            attempt_order: Vec::new(),
            run_order: Vec::new(),
            steps_ended: HashSet::new(),
            out: Applied::default(),
        };
        for (id, t) in &b.tickets {
            b.items
                .entry((t.job_id.clone(), t.scheduled_at))
                .or_default()
                .push(*id);
        }
        for r in results {
            b.apply_one(r)?;
        }
        Ok(b)
    }

    fn apply_one(&mut self, r: &TicketResult) -> Result<()> {
        let key = (r.ticket_id, r.attempt as i64);
        let now = self.now;
        let at = r.at.timestamp_millis();
        match r.kind {
            // The watchdog compares these times with the shard's clock, so they are the shard's
            // (the time the report is applied), not the worker's, which may be off.
            ResultKind::Progress => {
                self.save_checkpoint(r);
                if let Some(a) = self.open_attempt(key) {
                    a.heartbeat_at = Some(now);
                }
                Ok(())
            }
            ResultKind::Started => {
                if let Some(a) = self.open_attempt(key) {
                    // A second start of an open attempt is its redelivery to another worker
                    // after the first one died: the watchdog's clock starts again with it.
                    a.started_at = Some(now);
                    a.worker = Some(r.worker.clone());
                    a.status = RunStatus::Running.as_str().into();
                    a.heartbeat_at = None;
                    self.out.changed += 1;
                    let timeout = self.tickets.get(&r.ticket_id).and_then(|t| t.timeout_ms);
                    self.out.follow_ups.push(FollowUp::Started {
                        ticket: r.ticket_id,
                        attempt: r.attempt,
                        started_at: now,
                        timeout_ms: timeout.unwrap_or(DEFAULT_TIMEOUT_MS),
                    });
                    self.follow_attempt(key)?;
                    self.sync_run(r.ticket_id, None)?;
                } else if let Some(a) = self.attempt(key, |a| a.started_at.is_none()) {
                    // A start reported after the end (reports of one attempt can cross) is
                    // still worth recording; it changes no status.
                    a.started_at = Some(at);
                    a.worker.get_or_insert_with(|| r.worker.clone());
                }
                Ok(())
            }
            ResultKind::Released => {
                // Only the worker the attempt is recorded with can hand it back: a late release
                // must not erase the start of the worker that took the delivery over.
                let mine = |a: &AttemptRow| {
                    a.finished_at.is_none() && a.worker.as_deref() == Some(r.worker.as_str())
                };
                if let Some(a) = self.attempt(key, mine) {
                    a.started_at = None;
                    a.worker = None;
                    a.heartbeat_at = None;
                    a.status = RunStatus::Dispatched.as_str().into();
                    self.out.changed += 1;
                    self.follow_attempt(key)?;
                    self.sync_run(r.ticket_id, None)?;
                }
                Ok(())
            }
            ResultKind::Succeeded | ResultKind::Failed => {
                self.save_checkpoint(r);
                let Some(a) = self.open_attempt(key) else {
                    return Ok(());
                };
                a.finished_at = Some(at);
                if a.started_at.is_none() {
                    // A short execution is reported by its final result alone, which carries
                    // its start (the worker's clock, like `finished_at`).
                    a.started_at = r.started_at.map(|s| s.timestamp_millis());
                }
                a.status = r.kind.as_str().into();
                a.worker = Some(r.worker.clone());
                a.error = r.error.clone();
                a.http_status = r.http_status.map(i64::from);
                a.output = r.output.clone();
                a.published_at.get_or_insert(now);
                self.out.changed += 1;
                self.out.finished.insert((r.ticket_id, r.attempt));
                if r.kind == ResultKind::Failed {
                    self.after_failure(r)?;
                } else {
                    self.follow_attempt(key)?;
                }
                if let Some(job) = self.sync_run(r.ticket_id, r.error.as_deref())? {
                    self.out.follow_ups.push(FollowUp::RunEnded { job });
                }
                Ok(())
            }
        }
    }

    /// The attempt if `cond` holds for it, marked as changed.
    fn attempt(
        &mut self,
        key: (Uuid, i64),
        cond: impl FnOnce(&AttemptRow) -> bool,
    ) -> Option<&mut AttemptRow> {
        let a = self.attempts.get_mut(&key).filter(|a| cond(a))?;
        if !a.dirty {
            a.dirty = true;
            self.attempt_order.push(key);
        }
        Some(a)
    }

    /// The attempt if it has no final result yet, marked as changed.
    fn open_attempt(&mut self, key: (Uuid, i64)) -> Option<&mut AttemptRow> {
        self.attempt(key, |a| a.finished_at.is_none())
    }

    /// The ticket, marked as changed.
    fn ticket_mut(&mut self, id: Uuid) -> Option<&mut TicketRow> {
        let t = self.tickets.get_mut(&id)?;
        if !t.dirty {
            t.dirty = true;
            self.ticket_order.push(id);
        }
        Some(t)
    }

    /// Keeps a report's checkpoint for the ticket's next attempt: only the current attempt's,
    /// and only while it is open.
    fn save_checkpoint(&mut self, r: &TicketResult) {
        let Some(checkpoint) = &r.checkpoint else {
            return;
        };
        let Some(t) = self.tickets.get(&r.ticket_id) else {
            return;
        };
        let current = (r.ticket_id, t.attempt);
        let open = |a: &AttemptRow| a.finished_at.is_none();
        if t.attempt != r.attempt as i64 || !self.attempts.get(&current).is_some_and(open) {
            return;
        }
        if let Some(t) = self.ticket_mut(r.ticket_id) {
            t.checkpoint = Some(checkpoint.to_string());
        }
    }

    /// The ticket takes its current attempt's status, if `key` is its current attempt.
    fn follow_attempt(&mut self, key: (Uuid, i64)) -> Result<()> {
        let current = |t: &TicketRow| t.attempt == key.1;
        if !self.tickets.get(&key.0).is_some_and(current) {
            return Ok(());
        }
        let status = self
            .attempts
            .get(&key)
            .map(|a| a.status.clone())
            .ok_or_else(|| {
                StoreError::Corrupt(format!("ticket {} has no attempt {}", key.0, key.1))
            })?;
        if let Some(t) = self.ticket_mut(key.0) {
            t.status = status;
            t.touched = true;
        }
        Ok(())
    }

    /// A failed current attempt: the next one if the retry policy allows, else the ticket is a
    /// dead letter. A failure of an attempt that is no longer current (replaced, or lost and
    /// retried already) changes only that attempt. Tickets of a deleted job are not retried.
    fn after_failure(&mut self, r: &TicketResult) -> Result<()> {
        let (Some(t), Some(f)) = (
            self.tickets.get(&r.ticket_id),
            self.failures.get(&r.ticket_id),
        ) else {
            return Ok(());
        };
        let current = t.attempt;
        if current != r.attempt as i64 {
            return Ok(());
        }
        let spec: Option<JobSpec> = f
            .spec
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("job spec: {e}")))?;
        let made = (current - f.attempt_base).max(1) as u32;
        let now = self.now;
        match (spec, f.state.as_deref()) {
            (Some(spec), Some(state)) if state != "deleted" => {
                self.out.failed_tenants.push(spec.tenant.clone());
                let body = t.body.as_deref().unwrap_or(&f.body);
                // A workflow step's own policy: its item says which step it is.
                let policy = match &spec.workflow {
                    Some(_) => spec.retry_of(ticket_from_json(body)?.item),
                    None => &spec.retry,
                };
                if !r.permanent && retry::allows_another(policy, made) {
                    let delay =
                        retry::delay(policy, made, retry::jitter_of(r.ticket_id, r.attempt));
                    let at = now + delay.as_millis() as i64;
                    let checkpoint = t.checkpoint.as_deref().or(f.checkpoint.as_deref());
                    let next = next_attempt(body, checkpoint, r.attempt + 1)?;
                    let key = (r.ticket_id, next.attempt as i64);
                    // Like `INSERT … ON CONFLICT DO NOTHING`: an attempt of that number
                    // written before stays as it is.
                    if let std::collections::hash_map::Entry::Vacant(e) = self.attempts.entry(key) {
                        e.insert(AttemptRow {
                            status: RunStatus::Retrying.as_str().into(),
                            inserted: Some(Some(at)),
                            dirty: true,
                            ..Default::default()
                        });
                        self.attempt_order.push(key);
                    }
                    let body = ticket_json(&next)?;
                    if let Some(t) = self.ticket_mut(r.ticket_id) {
                        t.attempt = next.attempt as i64;
                        t.status = RunStatus::Retrying.as_str().into();
                        t.body = Some(body);
                        t.touched = true;
                    }
                    self.out.follow_ups.push(FollowUp::Retry {
                        ticket: r.ticket_id,
                        attempt: next.attempt,
                        at,
                    });
                } else {
                    if let Some(t) = self.ticket_mut(r.ticket_id) {
                        t.status = RunStatus::Dead.as_str().into();
                        t.dead_at = Some(now);
                        t.touched = true;
                    }
                    self.out.dead += 1;
                    self.out.dead_tenants.push(spec.tenant.clone());
                }
                Ok(())
            }
            _ => self.follow_attempt((r.ticket_id, r.attempt as i64)),
        }
    }

    /// Sets the status (and attempt count) of the run the ticket belongs to from all its item
    /// tickets. Returns the job when the run has ended.
    fn sync_run(&mut self, ticket: Uuid, error: Option<&str>) -> Result<Option<Uuid>> {
        let Some(t) = self.tickets.get(&ticket) else {
            return Ok(None);
        };
        let occurrence = (t.job_id.clone(), t.scheduled_at);
        if t.workflow
            && status_of(&t.status)?.is_final()
            && self.steps_ended.insert(occurrence.clone())
        {
            self.out.follow_ups.push(FollowUp::StepEnded {
                job: parse_uuid(&t.job_id)?,
                at: t.scheduled_at,
            });
        }
        let mut statuses = Vec::new();
        let mut attempts = 0i64;
        for id in self.items.get(&occurrence).into_iter().flatten() {
            let item = &self.tickets[id];
            statuses.push(status_of(&item.status)?);
            attempts = attempts.max(item.attempt);
        }
        let status = run_status(&statuses);
        let failed = matches!(status, RunStatus::Failed | RunStatus::Dead);
        let buffered = t.buffered;
        // the reason as the results before this one left it
        let before = match self.runs.get(&occurrence) {
            Some(run) => run.reason.clone(),
            None => t.run_reason.clone(),
        };
        let reason = if failed {
            error.map(str::to_string).or(before)
        } else {
            None
        };
        let row = RunRow {
            status: status.as_str(),
            attempts,
            reason,
        };
        if self.runs.insert(occurrence.clone(), row).is_none() {
            self.run_order.push(occurrence.clone());
        }
        if !status.is_final() {
            return Ok(None);
        }
        let job = parse_uuid(&occurrence.0)?;
        if buffered {
            self.out.buffered.insert(job);
        }
        Ok(Some(job))
    }

    fn changed(&self) -> Changed<'_> {
        let (mut inserted, mut updated) = (Vec::new(), Vec::new());
        for key in &self.attempt_order {
            let a = &self.attempts[key];
            if a.inserted.is_some() {
                inserted.push((*key, a));
            } else {
                updated.push((*key, a));
            }
        }
        Changed {
            inserted,
            updated,
            tickets: self
                .ticket_order
                .iter()
                .map(|id| (*id, &self.tickets[id]))
                .collect(),
            runs: self.run_order.iter().map(|o| (o, &self.runs[o])).collect(),
        }
    }
}
