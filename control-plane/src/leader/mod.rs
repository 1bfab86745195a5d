//! The leader lease among control-plane replicas. Every replica runs `run`, which takes the lease
//! when it is free or expired and renews it while it holds it (`elector` has the rules); the
//! `Leadership` it publishes says whether this replica may act as the leader *now*. Only the
//! leader assigns shards (`assign`); every replica serves the whole API.
//!
//! Correctness does not rest on the lease alone: each shard-map write is a compare-and-swap that
//! raises the shard's epoch, so even a leader that acted late could not make two owners of one
//! epoch. The lease keeps the deciding in one place; the epochs keep the shards safe.

pub mod elector;
#[cfg(test)]
mod tests;

use std::time::Duration;

use chronoshard_cluster::{Cluster, Error as ClusterError, LeaseWatch};
use chronoshard_telemetry::metrics;
use chronoshard_wire::{rpc::LeaderLease, settings::VersionedSettings};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use elector::{Action, Elector};

/// What this replica knows about leadership.
#[derive(Clone, Debug, Default)]
pub struct Leadership {
    /// The term of the lease this replica holds.
    pub term: u64,
    /// Until when this replica may act as the leader (None: it is not the leader).
    pub leading_until: Option<Instant>,
    /// The leader by this replica's count when this was published, with its term.
    pub leader: Option<(String, u64)>,
}

impl Leadership {
    /// Whether this replica may act as the leader at this instant.
    pub fn is_leading(&self) -> bool {
        self.leading_until.is_some_and(|u| Instant::now() < u)
    }
}

/// Pause after a lease write that failed without an answer, before the next try.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// Runs the election until `shutdown`; then gives the lease up if this replica holds it, so
/// another replica takes over at once instead of after the TTL.
pub async fn run(
    cluster: Cluster,
    id: String,
    settings: watch::Receiver<VersionedSettings>,
    tx: watch::Sender<Leadership>,
    shutdown: CancellationToken,
) {
    let mut elector = Elector::new(id.clone());
    let mut watch: Option<LeaseWatch> = None;
    let mut hold_off: Option<Instant> = None;
    loop {
        if watch.is_none() {
            watch = open(&cluster, &mut elector).await;
        }
        publish(&tx, &id, &elector);
        let now = Instant::now();
        let action = match (elector.next(now), hold_off) {
            (Action::Write { .. }, Some(until)) if now < until => Action::WaitUntil(until),
            (a, _) => a,
        };
        if let Action::Write { term, revision } = action {
            let ttl = settings.borrow().settings.leader_lease_ttl.0;
            hold_off = write(&cluster, &id, &mut elector, term, revision, ttl).await;
            continue;
        }
        let mut wake = match action {
            Action::WaitUntil(t) => t,
            _ => now + Duration::from_millis(500),
        };
        if let Some(until) = elector.leading_until(now) {
            wake = wake.min(until); // to publish the end of leadership on time
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            change = next(&mut watch) => match change {
                Some(Ok(entry)) => elector.saw(Some(entry), Instant::now()),
                Some(Err(e)) => warn!(error = %e, "leader lease watch error"),
                None => watch = None,
            },
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
    if let Some((term, revision)) = elector.held() {
        match cluster.release_lease(revision).await {
            Ok(()) => info!(term, "leader lease released"),
            Err(e) => warn!(error = %e, "cannot release the leader lease; it expires by itself"),
        }
    }
    elector.released();
    publish(&tx, &id, &elector);
}

/// Opens the lease watch and reads the key (a watch shows nothing for a key never written).
async fn open(cluster: &Cluster, elector: &mut Elector) -> Option<LeaseWatch> {
    let w = match cluster.watch_lease().await {
        Ok(w) => w,
        Err(e) => {
            warn!(error = %e, "cannot watch the leader lease; retrying");
            tokio::time::sleep(Duration::from_millis(500)).await;
            return None;
        }
    };
    match cluster.lease().await {
        Ok(entry) => elector.saw(entry, Instant::now()),
        Err(e) => warn!(error = %e, "cannot read the leader lease"),
    }
    Some(w)
}

/// Takes or renews the lease; returns until when not to try again after a failure.
async fn write(
    cluster: &Cluster,
    id: &str,
    elector: &mut Elector,
    term: u64,
    revision: Option<u64>,
    ttl: Duration,
) -> Option<Instant> {
    let lease = LeaderLease {
        holder: id.to_string(),
        term,
        ttl_ms: ttl.as_millis() as u64,
        renewed_at: chrono::Utc::now(),
    };
    let was_leading = elector.held().is_some();
    elector.sending(term, ttl, Instant::now());
    // An answer later than a sixth of the TTL is of no use: the lease may be gone by then.
    match tokio::time::timeout(ttl / 6, cluster.write_lease(&lease, revision)).await {
        Ok(Ok(rev)) => {
            elector.wrote(rev);
            if !was_leading {
                info!(term, "leading: took the leader lease");
            }
            None
        }
        Ok(Err(ClusterError::Conflict { .. })) => {
            elector.conflict();
            match cluster.lease().await {
                Ok(entry) => elector.saw(entry, Instant::now()),
                Err(e) => warn!(error = %e, "cannot read the leader lease"),
            }
            if was_leading && elector.held().is_none() {
                warn!(term, "lost the leader lease to another replica");
            }
            None
        }
        Ok(Err(e)) => {
            elector.unanswered();
            warn!(error = %e, term, "leader lease write failed");
            Some(Instant::now() + RETRY_AFTER)
        }
        Err(_) => {
            elector.unanswered();
            warn!(term, "leader lease write unanswered");
            Some(Instant::now() + RETRY_AFTER)
        }
    }
}

fn publish(tx: &watch::Sender<Leadership>, id: &str, elector: &Elector) {
    let leading_until = elector.leading_until(Instant::now());
    let term = elector.held().map_or(0, |(t, _)| t);
    let leader = elector.leader(Instant::now());
    let was = tx.borrow().leading_until.is_some();
    if was && leading_until.is_none() && elector.held().is_some() {
        warn!(
            term,
            "not leading: the leader lease was not renewed in time"
        );
    }
    metrics::CONTROL_PLANE_LEADER
        .with_label_values(&[id])
        .set(leading_until.is_some() as i64);
    if leading_until.is_none() {
        // Only the leader counts unowned shards; a former leader's count would be stale.
        metrics::SHARDS_UNOWNED_GAUGE.reset();
        metrics::NODE_HEARTBEAT_AGE_GAUGE.reset();
    }
    tx.send_if_modified(|l| {
        let changed = l.leading_until != leading_until || l.term != term || l.leader != leader;
        *l = Leadership {
            term,
            leading_until,
            leader,
        };
        changed
    });
}

async fn next(
    watch: &mut Option<LeaseWatch>,
) -> Option<Result<chronoshard_cluster::LeaseEntry, ClusterError>> {
    match watch {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}
