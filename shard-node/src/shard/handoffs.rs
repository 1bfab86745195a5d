//! Jobs changing shard in a `time_window` cluster that grew. When a newer layout places a job's
//! next occurrence (within the horizon) on another shard, the agenda marks the job to leave and
//! keeps it in the wheel; `Firer::hand_off` takes the marked jobs off this shard (the store keeps
//! each until its target confirms), and the sender here delivers them to their targets as
//! `ImportJobs` requests, each target on its own and again until it confirms. `Firer::import` is
//! the target's side.
//!
//! The job's row is the one token: the shard holding it fires it. A job with a run in progress
//! leaves when the run ends, and an occurrence due before it has left fires here, so no
//! occurrence has two shards and none waits on a hand-off; only an unreachable target delays the
//! jobs already on their way to it, which then catch up there by their policy.
//!
//! Owns delivering hand-offs. It must not decide which jobs leave (the agenda does, from the
//! placement) and it writes nothing but the store's confirmations.

use std::time::Duration;

use chronoshard_telemetry::metrics;
use chronoshard_wire::{
    growth::MovePage,
    names,
    rpc::{RpcError, RpcErrorCode, ShardReply, ShardRequest},
};
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

use super::{
    agenda::Agenda,
    fire::Firer,
    machine,
    store::{HandOff, Store, StoreError},
    ShardContext, ShardError,
};

/// Most jobs taken off the shard in one turn of the loop (one transaction).
const JOBS_PER_TURN: usize = 256;
/// Most bytes of job rows one `ImportJobs` request carries (NATS takes 1 MB; a job's payload
/// may be up to 256 KiB, so a request holds at least one job whatever its size).
const BYTES_PER_REQUEST: usize = 256 * 1024;
/// How long a target may take to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// The longest pause between two sends of what a target has not confirmed.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Where the loop puts the jobs that left; the sender delivers them.
pub(super) type Outbox = mpsc::UnboundedSender<Vec<HandOff>>;

/// Starts the sender: it first sends what a previous owner of the shard left unconfirmed, then
/// what the loop hands it. Each round sends to every target at once, each target's requests in
/// order until one fails; what a target did not confirm goes again next round, after a pause
/// that grows while nothing is confirmed and ends early when new jobs arrive.
pub(super) fn start(
    store: Store,
    ctx: ShardContext,
    stop: CancellationToken,
) -> (Outbox, JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<HandOff>>();
    let task = tokio::spawn(async move {
        let label = ctx.shard.to_string();
        let mut backoff = Duration::from_millis(20);
        let mut pending = loop {
            match store.unacked_handoffs(i64::MAX).await {
                Ok(left) => {
                    if !left.is_empty() {
                        info!(jobs = left.len(), "sending hand-offs a previous owner left");
                        metrics::JOB_HANDOFFS_TOTAL
                            .with_label_values(&[&label, "resent"])
                            .inc_by(left.len() as u64);
                    }
                    break left;
                }
                Err(StoreError::Fenced { .. }) => return,
                Err(e) => warn!(error = %e, "reading unconfirmed hand-offs failed; retrying"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        };
        backoff = Duration::from_millis(20);
        loop {
            if pending.is_empty() {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    b = rx.recv() => match b {
                        Some(b) => pending = b,
                        None => return,
                    },
                }
            }
            while let Ok(more) = rx.try_recv() {
                pending.extend(more);
            }
            let before = pending.len();
            pending = match deliver(&store, &ctx, pending).await {
                Ok(rest) => rest,
                // Fenced: the next owner sends them.
                Err(()) => return,
            };
            if pending.is_empty() {
                backoff = Duration::from_millis(20);
                continue;
            }
            metrics::JOB_HANDOFFS_TOTAL
                .with_label_values(&[&label, "resent"])
                .inc_by(pending.len() as u64);
            backoff = match pending.len() < before {
                true => Duration::from_millis(20),
                false => (backoff * 2).min(MAX_BACKOFF),
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
                b = rx.recv() => match b {
                    Some(b) => pending.extend(b),
                    None => return,
                },
            }
        }
    });
    (tx, task)
}

/// Sends `handoffs` to their targets, all targets at once, each target's in requests of at most
/// `BYTES_PER_REQUEST` until one fails, and records what the targets confirmed. Returns what is
/// still to send; `Err` once the store is fenced.
async fn deliver(
    store: &Store,
    ctx: &ShardContext,
    handoffs: Vec<HandOff>,
) -> Result<Vec<HandOff>, ()> {
    let mut by_target: std::collections::BTreeMap<u32, Vec<HandOff>> = Default::default();
    for h in handoffs {
        by_target.entry(h.target).or_default().push(h);
    }
    let rounds = by_target
        .into_iter()
        .map(|(target, jobs)| deliver_to(store, ctx, target, jobs));
    let mut rest = Vec::new();
    for r in futures::future::join_all(rounds).await {
        rest.extend(r?);
    }
    Ok(rest)
}

/// One target's part of `deliver`.
async fn deliver_to(
    store: &Store,
    ctx: &ShardContext,
    target: u32,
    jobs: Vec<HandOff>,
) -> Result<Vec<HandOff>, ()> {
    let version = ctx.cluster_config.borrow().version;
    let label = ctx.shard.to_string();
    let mut rest = Vec::new();
    let mut failed = false;
    for chunk in chunks(jobs) {
        if failed {
            rest.extend(chunk);
            continue;
        }
        let pages: Vec<MovePage> = chunk.iter().flat_map(|h| h.pages.clone()).collect();
        let req = ShardRequest::ImportJobs { version, pages };
        let (held, stale) = match call(ctx, target, &req).await {
            Ok(answer) => answer,
            Err(why) => {
                warn!(target, jobs = chunk.len(), %why, "handing jobs off failed; sending again");
                failed = true;
                rest.extend(chunk);
                continue;
            }
        };
        let (done, refused): (Vec<HandOff>, Vec<HandOff>) =
            (chunk.into_iter()).partition(|h| held.contains(&h.job) || stale.contains(&h.job));
        let acks: Vec<(Uuid, i64)> = done.iter().map(|h| (h.job, h.seq)).collect();
        match store.ack_handoffs(&acks).await {
            Ok(()) => {}
            Err(StoreError::Fenced { .. }) => return Err(()),
            Err(e) => {
                warn!(error = %e, "recording confirmed hand-offs failed; sending again");
                failed = true;
                rest.extend(done);
                rest.extend(refused);
                continue;
            }
        }
        metrics::JOB_HANDOFFS_TOTAL
            .with_label_values(&[&label, "confirmed"])
            .inc_by(acks.len() as u64);
        info!(
            target,
            jobs = held.len(),
            stale = stale.len(),
            "jobs handed off"
        );
        if !refused.is_empty() {
            let ids: Vec<Uuid> = refused.iter().map(|h| h.job).collect();
            warn!(target, jobs = ?ids, "the target did not take these jobs; sending again");
            rest.extend(refused);
        }
    }
    Ok(rest)
}

/// `jobs` in groups of at most `BYTES_PER_REQUEST` of rows (at least one job each).
fn chunks(jobs: Vec<HandOff>) -> Vec<Vec<HandOff>> {
    let mut out: Vec<Vec<HandOff>> = Vec::new();
    let mut bytes = 0;
    for h in jobs {
        let size = serde_json::to_vec(&h.pages).map_or(0, |b| b.len());
        match out.last_mut() {
            Some(last) if bytes + size <= BYTES_PER_REQUEST => {
                bytes += size;
                last.push(h);
            }
            _ => {
                bytes = size;
                out.push(vec![h]);
            }
        }
    }
    out
}

/// One `ImportJobs` to the owner of `target`: in this process when it runs here, else over
/// NATS. Returns the jobs it holds and the stale copies it dropped.
async fn call(
    ctx: &ShardContext,
    target: u32,
    req: &ShardRequest,
) -> Result<(Vec<Uuid>, Vec<Uuid>), String> {
    let reply = match ctx.local.get(target) {
        Some(calls) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            calls
                .send((req.clone(), tx))
                .await
                .map_err(|_| format!("shard {target} stopped here"))?;
            match tokio::time::timeout(ANSWER_WITHIN, rx).await {
                Ok(Ok(Some(reply))) => reply,
                _ => return Err(format!("shard {target} did not answer")),
            }
        }
        None => {
            let body = serde_json::to_vec(req).expect("request serialises");
            let msg = tokio::time::timeout(
                ANSWER_WITHIN,
                (ctx.cluster.client).request(names::shard_rpc_subject(target), body.into()),
            )
            .await
            .map_err(|_| format!("shard {target} did not answer within {ANSWER_WITHIN:?}"))?
            .map_err(|e| format!("shard {target}: {e}"))?;
            serde_json::from_slice(&msg.payload)
                .map_err(|e| format!("bad reply from shard {target}: {e}"))?
        }
    };
    match reply {
        ShardReply::Imported { held, stale } => Ok((held, stale)),
        other => Err(format!("shard {target} answered {other:?}")),
    }
}

impl Firer {
    /// Takes up to `JOBS_PER_TURN` of the jobs the agenda collected off this shard and gives
    /// them to the sender; jobs with a run in progress stay collected (and in the wheel).
    pub async fn hand_off(&self, agenda: &mut Agenda, now: i64) -> Result<(), ShardError> {
        let asked = agenda.leaving(JOBS_PER_TURN);
        let left = match self.store.hand_off(&asked, now).await {
            Ok(left) => left,
            Err(e) => {
                agenda.handed_off([], now);
                return Err(e.into());
            }
        };
        agenda.stay(left.dropped);
        let handed = left.handed;
        agenda.handed_off(handed.iter().map(|h| h.job), now);
        if handed.is_empty() {
            return Ok(());
        }
        metrics::JOB_HANDOFFS_TOTAL
            .with_label_values(&[&self.metrics.label, "left"])
            .inc_by(handed.len() as u64);
        // A closed sender: the shard is stopping, and its next owner sends them.
        let _ = self.handoffs.send(handed);
        Ok(())
    }

    /// Takes in jobs another shard handed here, and tracks them (or hands them on, when a newer
    /// layout places them elsewhere again). Refused (`Moving`, sent again) until this shard has
    /// read the cluster config the sender placed them by.
    pub async fn import(
        &self,
        agenda: &mut Agenda,
        version: u64,
        pages: Vec<MovePage>,
    ) -> Result<ShardReply, ShardError> {
        let known = agenda.placed_version();
        if known < version {
            return Ok(ShardReply::Error(RpcError::new(
                RpcErrorCode::Moving,
                format!("this shard has not read cluster config {version} yet (it has {known})"),
            )));
        }
        let (taken, inserted) = self.store.import_jobs(pages).await?;
        let rows = self.store.get_jobs(&taken.held).await?;
        for row in rows.values() {
            agenda.follow(row, machine::wheel_of(row), self.lead());
        }
        metrics::JOB_HANDOFFS_TOTAL
            .with_label_values(&[&self.metrics.label, "arrived"])
            .inc_by(inserted);
        Ok(ShardReply::Imported {
            held: taken.held,
            stale: taken.stale,
        })
    }
}
