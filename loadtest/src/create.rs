//! Creating a scenario's jobs through `POST /v1/jobs`, open loop: request `i` is due at
//! `start + i / rate` whether or not earlier ones have been answered, and its latency is counted
//! from that intended time. A server that slows down therefore shows up as latency (and as a
//! warning that the creator fell behind), not as a quietly lower request rate ("coordinated
//! omission"). Each create carries an `Idempotency-Key` (the job's name), and one that failed
//! transiently is repeated up to five times: the platform then answers with the job the first
//! try created, if it did, so no job exists that the run does not know of.

use std::{sync::Arc, time::Duration};

use serde_json::Value;
use tokio::{sync::Semaphore, time::Instant};
use uuid::Uuid;

use crate::{
    api::Api,
    progress::{now_us, Counters},
    report::CreateStats,
    stats::Samples,
};

/// How many error messages a report keeps.
const KEEP_ERRORS: usize = 10;
/// Tries of one create that failed transiently (a node lost its shards, a timeout).
const CREATE_TRIES: u32 = 5;

#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// Requests per second; 0 = as fast as `concurrency` allows (closed loop).
    pub rate_per_s: f64,
    /// Most requests in flight at once.
    pub concurrency: usize,
}

#[derive(Debug, Default)]
pub struct Created {
    /// The job id of each spec, in order; `None` where the create failed.
    pub ids: Vec<Option<Uuid>>,
    /// When each successful create was answered (µs since the epoch), for the timeline.
    pub answered_us: Vec<i64>,
    pub stats: CreateStats,
    /// The largest delay between a request's intended send time and its actual send, in ms:
    /// above a few ms the creator itself (or `concurrency`) limited the rate.
    pub max_send_delay_ms: f64,
}

struct Outcome {
    index: usize,
    result: Result<Uuid, String>,
    latency_us: i64,
    answered_us: i64,
    send_delay_us: i64,
    retried: bool,
}

/// Sends every spec, returns when each has an answer (or failed).
pub async fn create_all(
    api: &Api,
    specs: Vec<Value>,
    opts: &CreateOptions,
    counters: &Arc<Counters>,
) -> Created {
    let n = specs.len();
    let permits = Arc::new(Semaphore::new(opts.concurrency.max(1)));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Outcome>();
    let start = Instant::now();
    let started_us = now_us();
    let spacing = (opts.rate_per_s > 0.0).then(|| Duration::from_secs_f64(1.0 / opts.rate_per_s));
    for (index, spec) in specs.into_iter().enumerate() {
        let scheduled = spacing.map(|s| start + s.mul_f64(index as f64));
        if let Some(at) = scheduled {
            tokio::time::sleep_until(at).await;
        }
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        // Open loop: from the schedule, so waiting for a free slot counts. Closed loop: from the
        // moment a slot is free, so only the request itself counts.
        let intended = scheduled.unwrap_or_else(Instant::now);
        let (api, tx, counters) = (api.clone(), tx.clone(), counters.clone());
        tokio::spawn(async move {
            let send_delay_us = intended.elapsed().as_micros() as i64;
            let key = spec["name"].as_str().unwrap_or_default().to_string();
            let mut tries = 0;
            let result = loop {
                tries += 1;
                match api.create_job(&spec, &key).await {
                    Err(e) if e.is_transient() && tries < CREATE_TRIES => {
                        // A pause before the next try, not a wait for a condition.
                        tokio::time::sleep(Duration::from_millis(200 * tries as u64)).await;
                    }
                    r => break r.map_err(|e| e.to_string()),
                }
            };
            let latency_us = intended.elapsed().as_micros() as i64;
            drop(permit);
            match &result {
                Ok(_) => Counters::add(&counters.created, 1),
                Err(_) => Counters::add(&counters.create_failed, 1),
            }
            let _ = tx.send(Outcome {
                index,
                result,
                latency_us,
                answered_us: now_us(),
                send_delay_us,
                retried: tries > 1,
            });
        });
    }
    drop(tx);
    let mut created = Created {
        ids: vec![None; n],
        ..Default::default()
    };
    let mut latency = Samples::new();
    let mut last_us = started_us;
    let mut max_delay = 0;
    while let Some(o) = rx.recv().await {
        latency.push(o.latency_us);
        created.stats.retried += o.retried as u64;
        max_delay = max_delay.max(o.send_delay_us);
        last_us = last_us.max(o.answered_us);
        match o.result {
            Ok(id) => {
                created.ids[o.index] = Some(id);
                created.answered_us.push(o.answered_us);
                created.stats.created += 1;
            }
            Err(e) => {
                created.stats.failed += 1;
                if created.stats.errors.len() < KEEP_ERRORS {
                    created.stats.errors.push(e);
                }
            }
        }
    }
    let secs = (last_us - started_us).max(1) as f64 / 1e6;
    created.stats.requested = n as u64;
    created.stats.target_per_s = opts.rate_per_s;
    created.stats.achieved_per_s = created.stats.created as f64 / secs;
    created.stats.latency_ms = latency.percentiles();
    created.max_send_delay_ms = max_delay as f64 / 1000.0;
    created
}
