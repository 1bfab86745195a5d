//! Core-NATS subscribers on the platform's subjects: every ticket published on the dispatch
//! stream and every result a worker sends, stamped with the time this process received them.
//! A core subscription sees a message as soon as nats-server accepted the publish, which is the
//! closest outside view of "the shard published the ticket".

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
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
    pub tenant: String,
    pub scheduled_us: i64,
    pub attempt: u32,
    pub at_us: i64,
}

/// A `succeeded` result seen on the results stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    pub ticket_id: Uuid,
    pub attempt: u32,
    pub at_us: i64,
}

#[derive(Deserialize)]
struct TicketHead {
    ticket_id: Uuid,
    job_id: Uuid,
    tenant: String,
    scheduled_at: DateTime<Utc>,
    attempt: u32,
    #[serde(default)]
    payload: serde_json::Value,
}

#[derive(Deserialize)]
struct ResultHead {
    ticket_id: Uuid,
    attempt: u32,
    kind: String,
    /// Set on a final result whose attempt's start was not reported on its own.
    #[serde(default)]
    started_at: Option<serde::de::IgnoredAny>,
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
/// each attempt.
#[derive(Debug, Default)]
pub struct Watched {
    pub fired: Vec<Fired>,
    pub completed: Vec<Completed>,
}

/// Occurrences (job, scheduled µs) as they get their first ticket published and their first
/// success, for the runner to tick off what is owed while the run goes on.
#[derive(Debug, Default)]
pub struct Feed {
    pub fired: Mutex<Vec<(Uuid, i64)>>,
    pub done: Mutex<Vec<(Uuid, i64)>>,
}

impl Feed {
    fn push(list: &Mutex<Vec<(Uuid, i64)>>, o: (Uuid, i64)) {
        if let Ok(mut v) = list.lock() {
            v.push(o);
        }
    }

    /// Takes what arrived since the last call.
    pub fn take(list: &Mutex<Vec<(Uuid, i64)>>) -> Vec<(Uuid, i64)> {
        list.lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

/// Results kept for tickets not seen yet; beyond this many (results of other runs on a shared
/// platform), the oldest set is dropped.
const EARLY_MAX: usize = 100_000;

/// How long the watcher keeps reading after `stop` once nothing more arrives.
const QUIET: Duration = Duration::from_millis(300);

#[derive(Default)]
struct State {
    seen: Watched,
    /// Ticket → its occurrence.
    ours: HashMap<Uuid, (Uuid, i64)>,
    fired_occ: HashSet<(Uuid, i64)>,
    done_occ: HashSet<(Uuid, i64)>,
    done: HashSet<(Uuid, u32)>,
    early: HashMap<Uuid, Vec<(ResultHead, i64)>>,
}

impl State {
    fn ticket(&mut self, t: TicketHead, at_us: i64, counters: &Counters, feed: &Feed) {
        let occ = (t.job_id, us_of(t.scheduled_at));
        Counters::add(&counters.fired, 1);
        self.ours.insert(t.ticket_id, occ);
        if self.fired_occ.insert(occ) {
            Feed::push(&feed.fired, occ);
        }
        self.seen.fired.push(Fired {
            ticket_id: t.ticket_id,
            job_id: t.job_id,
            tenant: t.tenant,
            scheduled_us: occ.1,
            attempt: t.attempt,
            at_us,
        });
        for (r, at_us) in self.early.remove(&t.ticket_id).unwrap_or_default() {
            self.result(r, at_us, counters, feed);
        }
    }

    fn result(&mut self, r: ResultHead, at_us: i64, counters: &Counters, feed: &Feed) {
        let Some(&occ) = self.ours.get(&r.ticket_id) else {
            if self.early.len() >= EARLY_MAX {
                self.early.clear();
            }
            self.early.entry(r.ticket_id).or_default().push((r, at_us));
            return;
        };
        // A worker reports a short execution's start inside its final result.
        if r.kind == "started" || r.started_at.is_some() {
            Counters::add(&counters.started, 1);
        }
        match r.kind.as_str() {
            "succeeded" if self.done.insert((r.ticket_id, r.attempt)) => {
                Counters::add(&counters.completed, 1);
                if self.done_occ.insert(occ) {
                    Feed::push(&feed.done, occ);
                }
                self.seen.completed.push(Completed {
                    ticket_id: r.ticket_id,
                    attempt: r.attempt,
                    at_us,
                });
            }
            _ => {}
        }
    }
}

/// Records, until `stop`, every ticket published whose payload carries `"loadtest": run`, and
/// the first `succeeded` result of each attempt (and counts starts, reported alone or in a final
/// result, for the progress line).
///
/// One thread only takes messages off the subscriptions and stamps them, on a runtime and a
/// NATS connection of its own (`url`); a task of the caller's runtime parses them. Parsing every
/// ticket and result costs far more than taking one off a queue: done in the same task, at high
/// rates the messages waited in the subscription's queue, and stamped in the caller's runtime
/// they waited behind the load test's own tasks (its HTTP client creating 5,000 jobs/s); either
/// wait counted as the platform's lateness.
///
/// Both subscriptions share one connection and the dispatch one is read first, so a result
/// nearly always finds its ticket known; one that does not (seen once on a loaded machine) is
/// kept aside until its ticket shows up rather than dropped. After `stop` it reads on until
/// nothing arrives for a moment, so what nats-server already sent is not lost.
pub async fn watch(
    url: &str,
    dropped: &Dropped,
    run: String,
    counters: Arc<Counters>,
    feed: Arc<Feed>,
    stop: CancellationToken,
) -> anyhow::Result<JoinHandle<Watched>> {
    let (stamped, mut to_parse) = tokio::sync::mpsc::unbounded_channel();
    let (ready, subscribed) = tokio::sync::oneshot::channel();
    let (url, dropped) = (url.to_string(), dropped.clone());
    std::thread::Builder::new()
        .name("loadtest-watch".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match runtime {
                Ok(rt) => rt.block_on(stamp(url, dropped, stamped, ready, stop)),
                Err(e) => {
                    let _ = ready.send(Err(e.into()));
                }
            }
        })?;
    subscribed
        .await
        .map_err(|_| anyhow::anyhow!("the watcher thread ended before it subscribed"))??;
    Ok(tokio::spawn(async move {
        let mut st = State::default();
        while let Some((seen, payload, at_us)) = to_parse.recv().await {
            match seen {
                Seen::Ticket => {
                    let Ok(t) = serde_json::from_slice::<TicketHead>(&payload) else {
                        continue;
                    };
                    if t.payload.get("loadtest").and_then(|v| v.as_str()) == Some(run.as_str()) {
                        st.ticket(t, at_us, &counters, &feed);
                    }
                }
                Seen::Result => {
                    if let Ok(r) = serde_json::from_slice::<ResultHead>(&payload) {
                        st.result(r, at_us, &counters, &feed);
                    }
                }
            }
        }
        st.seen
    }))
}

/// The watcher thread: subscribes (and says so on `ready`), then stamps each message as it
/// arrives until `stop` and a quiet moment.
async fn stamp(
    url: String,
    dropped: Dropped,
    stamped: tokio::sync::mpsc::UnboundedSender<(Seen, bytes::Bytes, i64)>,
    ready: tokio::sync::oneshot::Sender<anyhow::Result<()>>,
    stop: CancellationToken,
) {
    let subscribed = async {
        let client = connect(&url, "loadtest-watch", &dropped).await?;
        let tickets = client
            .subscribe(chronoshard_wire::names::DISPATCH_SUBJECTS)
            .await?;
        let results = client
            .subscribe(chronoshard_wire::names::RESULT_SUBJECTS)
            .await?;
        client.flush().await?;
        anyhow::Ok((client, tickets, results))
    };
    let (_client, mut tickets, mut results) = match subscribed.await {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let mut stopping = false;
    loop {
        let quiet = tokio::time::sleep(QUIET);
        tokio::select! {
            biased;
            _ = stop.cancelled(), if !stopping => stopping = true,
            Some(msg) = tickets.next() => {
                let _ = stamped.send((Seen::Ticket, msg.payload, now_us()));
            }
            Some(msg) = results.next() => {
                let _ = stamped.send((Seen::Result, msg.payload, now_us()));
            }
            _ = quiet, if stopping => break,
            else => break,
        }
    }
}

/// Which subscription a message came from.
enum Seen {
    Ticket,
    Result,
}

/// Messages stored in the results stream and not yet acknowledged by a shard: 0 once every
/// result sent so far has been recorded (the stream has work-queue retention).
pub async fn results_unrecorded(js: &async_nats::jetstream::Context) -> anyhow::Result<u64> {
    let mut stream = js
        .get_stream(chronoshard_wire::names::RESULT_STREAM)
        .await?;
    Ok(stream.info().await?.state.messages)
}

/// Tickets of `queue` not yet delivered or not yet acknowledged by a worker (0 when the queue's
/// consumer does not exist).
pub async fn queue_unfinished(
    js: &async_nats::jetstream::Context,
    queue: &str,
) -> anyhow::Result<u64> {
    let stream = js
        .get_stream(chronoshard_wire::names::DISPATCH_STREAM)
        .await?;
    let name = chronoshard_wire::names::worker_consumer(queue);
    let Ok(mut consumer) = stream
        .get_consumer::<async_nats::jetstream::consumer::pull::Config>(&name)
        .await
    else {
        return Ok(0);
    };
    let info = consumer.info().await?;
    Ok(info.num_pending + info.num_ack_pending as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watcher that cannot subscribe fails the run at once instead of watching nothing.
    #[tokio::test]
    async fn a_watcher_without_a_server_is_an_error() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("nats://{}", closed.local_addr().unwrap());
        drop(closed);
        let watched = watch(
            &url,
            &Dropped::default(),
            "run".into(),
            Arc::new(Counters::default()),
            Arc::new(Feed::default()),
            CancellationToken::new(),
        )
        .await;
        assert!(watched.is_err());
    }
}
