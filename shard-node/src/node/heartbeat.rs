//! The node's heartbeat: its entry in the registry every `heartbeat_every` of the live settings,
//! with the shards open at that moment, its load (the occurrences in their wheels, the attempts
//! they have in flight, the CPU the process used since the last beat), its shard limit, zone
//! and labels, the settings version it runs and its clock offset, which it measures against the
//! NATS server here (`offset`). Its own task: nothing the node loop waits for can delay it.

use std::{collections::BTreeMap, time::Duration};

use chronoshard_cluster::Cluster;
use chronoshard_telemetry::metrics;
use chronoshard_wire::rpc::NodeInfo;
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{
    cpu::{process_cpu, CpuMeter},
    offset::{OffsetEstimate, Sample},
};
use crate::{clock::SharedClock, shard::SettingsRx};

/// Heartbeats between two clock probes (the first probe comes before the first heartbeat).
const PROBE_EVERY: u64 = 10;

pub(super) struct Heartbeat {
    pub membership: Cluster,
    pub node_id: String,
    pub zone: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub max_shards: Option<u32>,
    pub clock: SharedClock,
    pub open: watch::Receiver<Vec<u32>>,
    pub settings: SettingsRx,
}

impl Heartbeat {
    /// Puts the entry until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let started_at = self.wall_now();
        let mut estimate = OffsetEstimate::default();
        let mut beats = 0u64;
        let mut next = Instant::now();
        let mut skewed = false;
        let mut cpu = CpuMeter::default();
        let cpu_gauge = metrics::NODE_CPU_GAUGE.with_label_values(&[&self.node_id]);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
            }
            let due = next;
            let (version, settings) = {
                let s = self.settings.borrow();
                (s.version, s.settings)
            };
            let every = settings.heartbeat_every.0;
            next += every;
            if next < Instant::now() {
                next = Instant::now() + every; // late: do not make up the missed ones
            }
            if beats.is_multiple_of(PROBE_EVERY) {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = self.probe(&mut estimate) => {}
                }
            }
            beats += 1;
            let offset = estimate.offset_ms();
            let shards = self.open.borrow().clone();
            let cores = process_cpu().and_then(|used| cpu.sample(Instant::now().into_std(), used));
            if let Some(c) = cores {
                cpu_gauge.set(c);
            }
            let info = NodeInfo {
                node_id: self.node_id.clone(),
                started_at,
                heartbeat_at: self.wall_now(),
                wheel_size: per_shard(&metrics::WHEEL_ENTRIES_GAUGE, &shards),
                in_flight: per_shard(&metrics::ATTEMPTS_OPEN_GAUGE, &shards),
                cpu_share: cores.unwrap_or(0.0),
                max_shards: self.max_shards,
                shards,
                settings_version: version,
                clock_offset_ms: offset,
                zone: self.zone.clone(),
                labels: self.labels.clone(),
            };
            let woke = due.elapsed();
            let put = tokio::select! {
                _ = stop.cancelled() => return,
                put = self.membership.heartbeat_node(&info) => put,
            };
            if let Err(e) = put {
                warn!(error = %e, "heartbeat failed");
            }
            metrics::SHARDS_OPEN_GAUGE
                .with_label_values(&[&self.node_id])
                .set(info.shards.len() as i64);
            // A late heartbeat is the first sign of a node about to lose its shards: say how
            // late, and whether this process (waking up) or NATS (storing it) was slow.
            let took = due.elapsed().saturating_sub(woke);
            if woke + took > every {
                warn!(
                    wake_ms = woke.as_millis() as u64,
                    put_ms = took.as_millis() as u64,
                    ttl_ms = settings.heartbeat_ttl.0.as_millis() as u64,
                    "heartbeat late"
                );
            }
            let bound = settings.max_clock_offset.0.as_secs_f64() * 1000.0;
            let off = offset.is_some_and(|o| o.abs() > bound);
            if off != skewed {
                skewed = off;
                if off {
                    warn!(
                        offset_ms = offset.unwrap_or_default(),
                        bound = %settings.max_clock_offset,
                        "clock offset beyond the bound: this node takes no shards until its clock is fixed"
                    );
                } else {
                    info!(
                        offset_ms = offset.unwrap_or_default(),
                        "clock offset within the bound again"
                    );
                }
            }
        }
    }

    /// Wall time by the node's clock.
    fn wall_now(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp_micros(self.clock.now_us()).unwrap_or_default()
    }

    /// One clock probe: a write whose server stamp is read back.
    async fn probe(&self, estimate: &mut OffsetEstimate) {
        let sent_us = self.clock.now_us();
        let written = tokio::time::timeout(
            Duration::from_secs(2),
            self.membership.clock_probe(&self.node_id),
        )
        .await;
        let answered_us = self.clock.now_us();
        let revision = match written {
            Ok(Ok(rev)) => rev,
            Ok(Err(e)) => return warn!(error = %e, "clock probe failed"),
            Err(_) => return warn!("clock probe unanswered"),
        };
        match self.membership.probe_time(&self.node_id, revision).await {
            Ok(Some(stamp)) => {
                estimate.add(Sample {
                    sent_us,
                    answered_us,
                    server_us: stamp.timestamp_micros(),
                });
                if let Some(ms) = estimate.offset_ms() {
                    metrics::CLOCK_OFFSET_SECONDS
                        .with_label_values(&[&self.node_id])
                        .set(ms / 1000.0);
                }
            }
            Ok(None) => {}
            Err(e) => warn!(error = %e, "clock probe unreadable"),
        }
    }
}

/// The sum over `shards` of a per-shard gauge the shards keep themselves (and zero when they
/// close): the wheel sizes, the attempts in flight. Reading them back costs a lookup per open
/// shard and needs no channel from every shard to the heartbeat.
fn per_shard(gauge: &prometheus::IntGaugeVec, shards: &[u32]) -> u64 {
    shards
        .iter()
        .map(|s| gauge.with_label_values(&[&s.to_string()]).get().max(0) as u64)
        .sum()
}
