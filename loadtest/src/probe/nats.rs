//! Core-NATS subscribers on the platform's subjects: every ticket published on the dispatch
//! stream and every result a worker sends, stamped with the time this process received them.
//! A core subscription sees a message as soon as nats-server accepted the publish, which is the
//! closest outside view of "the shard published the ticket".

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::Deserialize;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::progress::{now_us, us_of, Counters};

/// A ticket seen on the dispatch stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fired {
    pub ticket_id: Uuid,
    pub job_id: Uuid,
    pub scheduled_us: i64,
    pub attempt: u32,
    pub at_us: i64,
}

/// A `succeeded` result seen on the results stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    pub ticket_id: Uuid,
    pub at_us: i64,
}

#[derive(Deserialize)]
struct TicketHead {
    ticket_id: Uuid,
    job_id: Uuid,
    scheduled_at: DateTime<Utc>,
    attempt: u32,
    #[serde(default)]
    payload: serde_json::Value,
}

#[derive(Deserialize)]
struct ResultHead {
    ticket_id: Uuid,
    kind: String,
}

/// Messages a subscriber dropped because it fell behind (nats-server's "slow consumer"): a
/// non-zero count makes the run's figures incomplete, and the report says so.
#[derive(Clone, Debug, Default)]
pub struct Dropped(pub Arc<AtomicU64>);

impl Dropped {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Connects a subscriber's own client, with a deep buffer and slow-consumer counting.
pub async fn connect(
    url: &str,
    name: &str,
    dropped: &Dropped,
) -> anyhow::Result<async_nats::Client> {
    let count = dropped.0.clone();
    Ok(async_nats::ConnectOptions::new()
        .name(name)
        .subscription_capacity(1 << 20)
        .event_callback(move |e| {
            let count = count.clone();
            async move {
                if let async_nats::Event::SlowConsumer(_) = e {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .connect(url)
        .await?)
}

/// What the watcher saw: this run's tickets as published, and the first `succeeded` result of
/// each of them.
#[derive(Debug, Default)]
pub struct Watched {
    pub fired: Vec<Fired>,
    pub completed: Vec<Completed>,
}

/// Records, until `stop`, every ticket published whose payload carries `"loadtest": run`, and
/// the first `succeeded` result of each (and counts `started` ones for the progress line).
///
/// Both subscriptions share one connection and the dispatch one is read first, so a result
/// nearly always finds its ticket known; one that does not (seen once on a loaded machine) is
/// kept aside until its ticket shows up rather than dropped.
pub async fn watch(
    client: async_nats::Client,
    run: String,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> anyhow::Result<JoinHandle<Watched>> {
    let mut tickets = client
        .subscribe(chronoshard_wire::names::DISPATCH_SUBJECTS)
        .await?;
    let mut results = client
        .subscribe(chronoshard_wire::names::RESULT_SUBJECTS)
        .await?;
    client.flush().await?;
    Ok(tokio::spawn(async move {
        let mut seen = Watched::default();
        let mut ours = HashSet::new();
        let mut done = HashSet::new();
        let mut early: HashMap<Uuid, Vec<(String, i64)>> = HashMap::new();
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                Some(msg) = tickets.next() => {
                    let at_us = now_us();
                    let Ok(t) = serde_json::from_slice::<TicketHead>(&msg.payload) else {
                        continue;
                    };
                    if t.payload.get("loadtest").and_then(|v| v.as_str()) != Some(run.as_str()) {
                        continue;
                    }
                    Counters::add(&counters.fired, 1);
                    ours.insert(t.ticket_id);
                    seen.fired.push(Fired {
                        ticket_id: t.ticket_id,
                        job_id: t.job_id,
                        scheduled_us: us_of(t.scheduled_at),
                        attempt: t.attempt,
                        at_us,
                    });
                    for (kind, at_us) in early.remove(&t.ticket_id).unwrap_or_default() {
                        result(&mut seen, &mut done, &counters, t.ticket_id, &kind, at_us);
                    }
                }
                Some(msg) = results.next() => {
                    let at_us = now_us();
                    let Ok(r) = serde_json::from_slice::<ResultHead>(&msg.payload) else {
                        continue;
                    };
                    if ours.contains(&r.ticket_id) {
                        result(&mut seen, &mut done, &counters, r.ticket_id, &r.kind, at_us);
                    } else {
                        early.entry(r.ticket_id).or_default().push((r.kind, at_us));
                    }
                }
                else => break,
            }
        }
        seen
    }))
}

fn result(
    seen: &mut Watched,
    done: &mut HashSet<Uuid>,
    counters: &Counters,
    ticket_id: Uuid,
    kind: &str,
    at_us: i64,
) {
    match kind {
        "started" => Counters::add(&counters.started, 1),
        "succeeded" if done.insert(ticket_id) => {
            Counters::add(&counters.completed, 1);
            seen.completed.push(Completed { ticket_id, at_us });
        }
        _ => {}
    }
}

/// Messages stored in the results stream and not yet acknowledged by a shard: 0 once every
/// result sent so far has been recorded (the stream has work-queue retention).
pub async fn results_unrecorded(js: &async_nats::jetstream::Context) -> anyhow::Result<u64> {
    let mut stream = js
        .get_stream(chronoshard_wire::names::RESULT_STREAM)
        .await?;
    Ok(stream.info().await?.state.messages)
}
