//! Jobs changing shard in a `time_window` cluster that grew. When a newer layout places a job's
//! next occurrence on another shard, the agenda collects the job instead of tracking it;
//! `Firer::hand_off` takes the collected jobs off this shard (the store keeps each until its
//! target confirms), and the sender here delivers them to their targets as `ImportJobs`
//! requests, again and again until each target confirms. `Firer::import` is the target's side.
//!
//! The occurrences are split by the layouts: this shard fires a job's occurrences up to the
//! layout's edge, the target those after it, so no occurrence has two shards. A job with a run
//! in progress waits for it to end; an occurrence due before its job arrived fires late, by the
//! target's catch-up policy, never not at all.
//!
//! Owns delivering hand-offs. It must not decide which jobs leave (the agenda does, from the
//! placement) and it writes nothing but the store's confirmations.

use std::time::Duration;

use chronoshard_telemetry::metrics;
use chronoshard_wire::{
    growth::MovePage,
    names,
    rpc::{ShardReply, ShardRequest},
};
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    agenda::Agenda,
    fire::Firer,
    machine,
    store::{HandOff, Store},
    ShardContext, ShardError,
};

/// Most jobs one `ImportJobs` request carries (a job's row is well under 1 KB; NATS takes 1 MB).
const JOBS_PER_REQUEST: usize = 256;
/// How long a target may take to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// The longest pause between two sends of what a target has not confirmed.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Where the loop puts the jobs that left; the sender delivers them.
pub(super) type Outbox = mpsc::UnboundedSender<Vec<HandOff>>;

/// Starts the sender: it first sends what a previous owner of the shard left unconfirmed, then
/// what the loop hands it, until `stop`.
pub(super) fn start(
    store: Store,
    ctx: ShardContext,
    stop: CancellationToken,
) -> (Outbox, JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<HandOff>>();
    let task = tokio::spawn(async move {
        let label = ctx.shard.to_string();
        match store.unacked_handoffs(i64::MAX).await {
            Ok(left) if !left.is_empty() => {
                info!(jobs = left.len(), "sending hand-offs a previous owner left");
                metrics::JOB_HANDOFFS_TOTAL
                    .with_label_values(&[&label, "resent"])
                    .inc_by(left.len() as u64);
                deliver(&store, &ctx, left, &stop).await;
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "reading unconfirmed hand-offs failed"),
        }
        loop {
            let batch = tokio::select! {
                _ = stop.cancelled() => return,
                b = rx.recv() => match b {
                    Some(b) => b,
                    None => return,
                },
            };
            deliver(&store, &ctx, batch, &stop).await;
        }
    });
    (tx, task)
}

/// Sends `handoffs` to their targets, a target's jobs of one layout together, until each is
/// confirmed (recorded in the store) or the shard stops.
async fn deliver(
    store: &Store,
    ctx: &ShardContext,
    handoffs: Vec<HandOff>,
    stop: &CancellationToken,
) {
    let mut groups: std::collections::BTreeMap<(u32, i64), Vec<HandOff>> = Default::default();
    for h in handoffs {
        groups.entry((h.target, h.layout)).or_default().push(h);
    }
    let label = ctx.shard.to_string();
    for ((target, layout), jobs) in groups {
        for chunk in jobs.chunks(JOBS_PER_REQUEST) {
            let ids: Vec<_> = chunk.iter().map(|h| h.job).collect();
            let pages: Vec<MovePage> = chunk.iter().flat_map(|h| h.pages.clone()).collect();
            let req = ShardRequest::ImportJobs { layout, pages };
            let mut backoff = Duration::from_millis(20);
            loop {
                match call(ctx, target, &req).await {
                    Ok(()) => match store.ack_handoffs(&ids).await {
                        Ok(()) => {
                            metrics::JOB_HANDOFFS_TOTAL
                                .with_label_values(&[&label, "confirmed"])
                                .inc_by(ids.len() as u64);
                            debug!(target, jobs = ids.len(), "jobs handed off");
                            break;
                        }
                        // A fenced store: the next owner sends them again.
                        Err(e) => {
                            warn!(error = %e, "recording confirmed hand-offs failed");
                            return;
                        }
                    },
                    Err(why) => {
                        warn!(target, jobs = ids.len(), %why, "handing jobs off failed; sending again");
                        metrics::JOB_HANDOFFS_TOTAL
                            .with_label_values(&[&label, "resent"])
                            .inc_by(ids.len() as u64);
                    }
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// One request to the owner of `target`: in this process when it runs here, else over NATS.
async fn call(ctx: &ShardContext, target: u32, req: &ShardRequest) -> Result<(), String> {
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
        ShardReply::MoveStep { .. } => Ok(()),
        other => Err(format!("shard {target} answered {other:?}")),
    }
}

impl Firer {
    /// Takes the jobs the agenda collected off this shard and gives them to the sender; jobs
    /// with a run in progress stay collected.
    pub async fn hand_off(&self, agenda: &mut Agenda, now: i64) -> Result<(), ShardError> {
        let handed = self.store.hand_off(&agenda.leaving(), now).await?;
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
    /// layout places them elsewhere again).
    pub async fn import(
        &self,
        agenda: &mut Agenda,
        layout: i64,
        pages: Vec<MovePage>,
    ) -> Result<ShardReply, ShardError> {
        let imported = self.store.import_jobs(layout, pages).await?;
        agenda.paused_are(self.store.paused_tenants().await?);
        let rows = self.store.get_jobs(&imported.jobs).await?;
        for row in rows.values() {
            agenda.follow(row, machine::wheel_of(row), self.lead());
        }
        metrics::JOB_HANDOFFS_TOTAL
            .with_label_values(&[&self.metrics.label, "arrived"])
            .inc_by(rows.len() as u64);
        Ok(ShardReply::MoveStep {
            rows: imported.rows,
        })
    }
}
