//! The `raw` measurement: this machine's bare JetStream ceiling for the scheduler's data path,
//! with no scheduler in between. A publisher sends ticket-like messages to a work stream; a
//! worker-like pull consumer turns each into a result on a results stream and then acks the
//! ticket; a second pull consumer takes the results and records each round trip.
//!
//! This module owns its two streams (`LOADTEST_RAW_<run_id>_WORK` / `_DONE`, configured like the
//! platform's dispatch and result streams in `crates/cluster`): it creates them per run and
//! deletes them at the end, also after an error (best effort). Each stage has its own NATS
//! connection, as separate processes would. Latency counts from each ticket's *intended* publish
//! time (open loop), so a publisher held back by a full ack window shows up as latency rather
//! than as fewer samples (no coordinated omission). Every sequence number must make exactly one
//! round trip: a missing or doubled one fails the run instead of quietly skewing the figures.

use std::{
    future::{Future, IntoFuture},
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    sync::mpsc::{RecvTimeoutError, Sender},
    sync::Arc,
    time::{Duration, Instant},
};

use async_nats::jetstream::{
    self,
    consumer::{pull, AckPolicy, PullConsumer},
    context::{Context, GetStreamErrorKind, PublishError},
    message::PublishMessage,
    publish::PublishAck,
    stream::{Config, DiscardPolicy, RetentionPolicy, StorageType},
    ErrorCode,
};
use chrono::{DateTime, Utc};
use futures::{stream::FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use uuid::Uuid;

use crate::{report::RawStats, stats::Samples};

/// Messages one pull request asks for, like the worker's fetches (`MAX_FETCH`). The client asks
/// for the next batch when half of one is consumed, so no consumer idles on a pull round trip.
/// (Measured: 64 costs ~20% more CPU per job; 1024 is no better than 256.)
const BATCH: usize = 256;
/// Unacknowledged deliveries a consumer may hold, as the worker's consumer allows.
const MAX_ACK_PENDING: i64 = 10_000;

#[derive(Clone, Debug)]
pub struct RawOptions {
    pub nats_url: String,
    /// Names this run's streams and subjects: `[A-Za-z0-9_-]`.
    pub run_id: String,
    pub count: u64,
    /// Open-loop publish rate; 0 = as fast as the ack window allows (the throughput ceiling).
    pub rate_per_s: f64,
    /// Most publish acks awaited at once (per publisher).
    pub window: usize,
    /// How long to wait for the last result before giving up; also bounds connecting and each
    /// JetStream API call.
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RawError {
    #[error("invalid raw options: {0}")]
    Options(&'static str),
    #[error("{what}: {source}")]
    Nats {
        what: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{what}: nothing within {after:?}")]
    Timeout { what: &'static str, after: Duration },
    #[error("undecodable or foreign {0} message: {1}")]
    Payload(&'static str, String),
    /// Not every ticket made exactly one round trip within the timeout; the log says which
    /// sequence numbers were doubled and how.
    #[error(
        "{received} of {count} results received, {doubled} doubled (a result seen twice, a \
         ticket delivered twice or a publish de-duplicated)"
    )]
    NotExactlyOnce {
        count: u64,
        received: u64,
        doubled: u64,
    },
    #[error("raw pacer thread: {0}")]
    Pacer(std::io::Error),
    #[error("raw task: {0}")]
    Task(#[from] tokio::task::JoinError),
}

type Result<T, E = RawError> = std::result::Result<T, E>;

fn nats<E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    what: &'static str,
) -> impl FnOnce(E) -> RawError {
    move |e| RawError::Nats {
        what,
        source: e.into(),
    }
}

async fn within<T>(
    what: &'static str,
    after: Duration,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    let timed_out = |_| RawError::Timeout { what, after };
    tokio::time::timeout(after, fut).await.map_err(timed_out)?
}

/// The work stream's name for a run.
pub fn work_stream(run_id: &str) -> String {
    format!("LOADTEST_RAW_{run_id}_WORK")
}

/// The results stream's name for a run.
pub fn done_stream(run_id: &str) -> String {
    format!("LOADTEST_RAW_{run_id}_DONE")
}

/// Measures one raw run. Connection and API failures, a missing or doubled result, and a
/// result that does not arrive within `timeout` of the last publish are errors.
pub async fn run(opts: &RawOptions) -> Result<RawStats, RawError> {
    let id_ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if opts.run_id.is_empty() || !opts.run_id.chars().all(id_ok) {
        return Err(RawError::Options("run_id must be non-empty [A-Za-z0-9_-]"));
    }
    if opts.count == 0 || opts.window == 0 || opts.timeout.is_zero() {
        return Err(RawError::Options(
            "count, window and timeout must be positive",
        ));
    }
    if !(opts.rate_per_s.is_finite() && opts.rate_per_s >= 0.0) {
        return Err(RawError::Options(
            "rate_per_s must be finite and not negative",
        ));
    }
    // The publisher's connection also creates and deletes the streams.
    let js = context(connect(opts, "connect publisher").await?, opts);
    let outcome = measure(opts, &js).await;
    let deleted = delete_streams(&js, opts).await;
    if let (Err(_), Err(e)) = (&outcome, &deleted) {
        tracing::warn!(error = %e, run_id = %opts.run_id, "raw streams may be left behind");
    }
    // A failed measurement's own error says more than the cleanup's.
    let stats = outcome?;
    deleted.map(|()| stats)
}

async fn connect(opts: &RawOptions, what: &'static str) -> Result<async_nats::Client> {
    // The outer bound also covers a server that accepts the connection but never speaks NATS.
    within(what, opts.timeout, async {
        async_nats::ConnectOptions::new()
            .name(format!("chronoshard-loadtest-raw-{}", opts.run_id))
            .connection_timeout(opts.timeout)
            .connect(opts.nats_url.as_str())
            .await
            .map_err(nats(what))
    })
    .await
}

fn context(client: async_nats::Client, opts: &RawOptions) -> Context {
    // Our own windows bound the outstanding acks; the context's limit sits above them so it is
    // never the one that bites (which would hide where the waiting happens).
    jetstream::ContextBuilder::new()
        .timeout(opts.timeout)
        .max_ack_inflight(opts.window.saturating_mul(2))
        .build(client)
}

/// What every stage of a run shares: the options, the clock's zero and the running tallies
/// (kept apart from the stages' results so a timeout can still report them).
struct Run {
    opts: RawOptions,
    t0: Instant,
    received: AtomicU64,
    doubled: AtomicU64,
}

impl Run {
    /// Now, in µs after the run's start.
    fn now_us(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    fn verdict(&self) -> Result<()> {
        let (count, received) = (self.opts.count, self.received.load(Relaxed));
        let doubled = self.doubled.load(Relaxed);
        match received == count && doubled == 0 {
            true => Ok(()),
            false => Err(RawError::NotExactlyOnce {
                count,
                received,
                doubled,
            }),
        }
    }

    fn note_doubled(&self, what: &str, seq: u64) {
        tracing::warn!(run_id = %self.opts.run_id, seq, "raw: {what}");
        self.doubled.fetch_add(1, Relaxed);
    }

    /// A publish ack: an error fails the run, a de-duplicated publish is counted.
    fn settle(&self, ack: Result<PublishAck, PublishError>, what: &'static str) -> Result<()> {
        let ack = ack.map_err(nats(what))?;
        if ack.duplicate {
            self.note_doubled("publish de-duplicated (stream sequence)", ack.sequence);
        }
        Ok(())
    }
}

/// Marks `seq` seen; false if it already was.
fn first_time(seen: &mut [bool], seq: u64, what: &'static str) -> Result<bool> {
    let out_of_range = || RawError::Payload(what, format!("seq {seq} out of range"));
    let s = seen.get_mut(seq as usize).ok_or_else(out_of_range)?;
    Ok(!std::mem::replace(s, true))
}

async fn measure(opts: &RawOptions, js: &Context) -> Result<RawStats> {
    let (t, id) = (opts.timeout, &opts.run_id);
    let subjects = [
        format!("loadtest.raw.{id}.work"),
        format!("loadtest.raw.{id}.done"),
    ];
    // As crates/cluster configures the dispatch and result streams: only the dispatch stream
    // is bounded and refuses publishes when full.
    let work = Config {
        name: work_stream(id),
        subjects: vec![subjects[0].clone()],
        discard: DiscardPolicy::New,
        max_bytes: 1 << 30,
        ..Config::default()
    };
    let done = Config {
        name: done_stream(id),
        subjects: vec![subjects[1].clone()],
        ..Config::default()
    };
    for config in [work, done] {
        let config = Config {
            retention: RetentionPolicy::WorkQueue,
            storage: StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..config
        };
        let consumer = pull::Config {
            durable_name: Some("raw".into()),
            ack_policy: AckPolicy::Explicit,
            max_ack_pending: MAX_ACK_PENDING,
            ..Default::default()
        };
        within("create stream and consumer", t, async {
            let stream = js
                .create_stream(config)
                .await
                .map_err(nats("create stream"))?;
            let created = stream.create_consumer(consumer).await;
            created.map_err(nats("create consumer")).map(drop)
        })
        .await?;
    }
    let worker_js = context(connect(opts, "connect worker").await?, opts);
    let results_js = context(connect(opts, "connect results consumer").await?, opts);
    let tickets = messages(&worker_js, &work_stream(id), t).await?;
    let results = messages(&results_js, &done_stream(id), t).await?;

    let run = Arc::new(Run {
        opts: opts.clone(),
        t0: Instant::now(),
        received: AtomicU64::new(0),
        doubled: AtomicU64::new(0),
    });
    let [work_subject, done_subject] = subjects;
    let mut collecting = Stage(tokio::spawn(collect(run.clone(), results)));
    let mut serving = Stage(tokio::spawn(serve(
        run.clone(),
        tickets,
        worker_js,
        done_subject,
    )));
    let publishing = publish(&run, js, work_subject);
    let finishing = futures::future::try_join(async { (&mut collecting.0).await? }, async {
        (&mut serving.0).await?
    });
    // Armed when the last publish is acknowledged; any stage failing ends the run at once.
    let deadline = tokio::time::sleep(t);
    tokio::pin!(publishing, finishing, deadline);
    let (mut first_us, mut finished) = (None, None);
    while first_us.is_none() || finished.is_none() {
        tokio::select! {
            r = &mut publishing, if first_us.is_none() => {
                first_us = Some(r?);
                deadline.as_mut().reset(tokio::time::Instant::now() + t);
            }
            r = &mut finishing, if finished.is_none() => finished = Some(r?),
            () = &mut deadline, if first_us.is_some() => {
                run.verdict()?;
                return Err(RawError::Timeout { what: "worker acking its last tickets", after: t });
            }
        }
    }
    run.verdict()?;
    let ((mut samples, last_us), ()) = finished.unwrap_or_default();
    let window_s = last_us.saturating_sub(first_us.unwrap_or(0)) as f64 / 1e6;
    Ok(RawStats {
        count: opts.count,
        target_per_s: opts.rate_per_s,
        per_s: opts.count as f64 / window_s.max(1e-6),
        round_trip_ms: samples.percentiles(),
        cpu_us_per_round_trip: Vec::new(),
    })
}

/// A spawned stage, aborted when dropped so an early return leaves nothing running.
struct Stage<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Stage<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A pipelined pull on `stream`'s consumer over `js`'s own connection.
async fn messages(js: &Context, stream: &str, t: Duration) -> Result<pull::Stream> {
    within("start pull consumer", t, async {
        let stream = js.get_stream(stream).await.map_err(nats("get stream"))?;
        let consumer: PullConsumer = stream
            .get_consumer("raw")
            .await
            .map_err(nats("get consumer"))?;
        let msgs = consumer
            .stream()
            .max_messages_per_batch(BATCH)
            .messages()
            .await;
        msgs.map_err(nats("pull"))
    })
    .await
}

async fn delete_streams(js: &Context, opts: &RawOptions) -> Result<()> {
    let delete = |name: String| {
        within("delete stream", opts.timeout, async move {
            let Err(e) = js.delete_stream(&name).await else {
                return Ok(());
            };
            match e.kind() {
                // Never created (an earlier step failed): nothing to clean up.
                GetStreamErrorKind::JetStream(j)
                    if j.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                {
                    Ok(())
                }
                _ => Err(nats("delete stream")(e)),
            }
        })
    };
    let (a, b) = tokio::join!(
        delete(work_stream(&opts.run_id)),
        delete(done_stream(&opts.run_id))
    );
    a.and(b)
}

/// A ticket of the size and shape the platform dispatches, plus what the measurement needs.
#[derive(Serialize, Deserialize)]
struct Ticket {
    v: u32,
    seq: u64,
    /// When this ticket was meant to be published, µs after the run's start.
    intended_us: u64,
    ticket_id: Uuid,
    job_id: Uuid,
    tenant: String,
    shard: u32,
    epoch: u64,
    scheduled_at: DateTime<Utc>,
    attempt: u32,
    queue: String,
    target: serde_json::Value,
    timeout_ms: u64,
    priority: u8,
    trace_id: String,
}

fn ticket(seq: u64, intended_us: u64) -> Ticket {
    let ticket_id = Uuid::now_v7();
    Ticket {
        v: 1,
        seq,
        intended_us,
        ticket_id,
        job_id: Uuid::from_u64_pair(0x10ad, seq % 1000),
        tenant: "loadtest".into(),
        shard: (seq % 64) as u32,
        epoch: 1,
        scheduled_at: Utc::now(),
        attempt: 1,
        queue: "raw".into(),
        target: serde_json::json!({"kind": "queue", "queue": "raw"}),
        timeout_ms: 30_000,
        priority: 5,
        trace_id: ticket_id.simple().to_string(),
    }
}

/// A result as a worker reports it; the results consumer reads only `seq` and `intended_us`.
#[derive(Serialize, Deserialize)]
struct Outcome {
    seq: u64,
    intended_us: u64,
    ticket_id: Uuid,
    attempt: u32,
    status: String,
    finished_at: DateTime<Utc>,
}

fn json<T: Serialize>(v: &T) -> bytes::Bytes {
    // Plain structs of strings and numbers: serializing them cannot fail.
    serde_json::to_vec(v).map(Into::into).unwrap_or_default()
}

fn decode<'a, T: Deserialize<'a>>(what: &'static str, b: &'a [u8]) -> Result<T> {
    serde_json::from_slice(b).map_err(|e| RawError::Payload(what, e.to_string()))
}

/// Publishes every ticket with at most `window` acks outstanding; returns the first publish's
/// time (µs after `t0`).
async fn publish(run: &Run, js: &Context, subject: String) -> Result<u64> {
    let (opts, paced) = (&run.opts, run.opts.rate_per_s > 0.0);
    let mut due = paced
        .then(|| pacer(opts.rate_per_s, opts.count, run.t0))
        .transpose()?;
    let (mut acks, mut first_us) = (FuturesUnordered::new(), None);
    for seq in 0..opts.count {
        // Settle acks while waiting for room in the window and for this ticket's turn.
        loop {
            if acks.len() >= opts.window {
                if let Some(ack) = acks.next().await {
                    run.settle(ack, "publish ticket")?;
                }
                continue;
            }
            let Some((due, _)) = due.as_mut() else { break };
            if *due.borrow_and_update() > seq {
                break;
            }
            tokio::select! {
                r = due.changed() => r.map_err(nats("pacer stopped"))?,
                Some(ack) = acks.next() => run.settle(ack, "publish ticket")?,
            }
        }
        let now_us = run.now_us();
        first_us.get_or_insert(now_us);
        let intended_us = match paced {
            true => (seq as f64 / opts.rate_per_s * 1e6) as u64,
            false => now_us,
        };
        let t = ticket(seq, intended_us);
        let msg = PublishMessage::build().payload(json(&t));
        let msg = msg.message_id(t.ticket_id.to_string());
        let ack = js.send_publish(subject.clone(), msg).await;
        acks.push(ack.map_err(nats("publish ticket"))?.into_future());
    }
    while let Some(ack) = acks.next().await {
        run.settle(ack, "publish ticket")?;
    }
    Ok(first_us.unwrap_or(0))
}

/// Tells the publisher how many tickets are due, until the returned sender is dropped. A thread
/// rather than a tokio timer: tokio rounds sleeps up to its 1 ms tick, which
/// would add up to a millisecond of the generator's own lateness to every round trip; a thread's
/// timed wait is within ~0.1 ms.
fn pacer(rate: f64, count: u64, t0: Instant) -> Result<(watch::Receiver<u64>, Sender<()>)> {
    let (tx, due) = watch::channel(0);
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let pace = move || loop {
        // Ticket `seq` is due at t0 + seq/rate: `n` tickets are due now.
        let n = ((t0.elapsed().as_secs_f64() * rate).floor() as u64 + 1).min(count);
        tx.send_if_modified(|d| std::mem::replace(d, n) != n);
        let next = t0 + Duration::from_secs_f64(n as f64 / rate);
        let wait = next.saturating_duration_since(Instant::now());
        if n == count || stopped.recv_timeout(wait) != Err(RecvTimeoutError::Timeout) {
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("raw-pacer".into())
        .spawn(pace);
    spawned.map_err(RawError::Pacer)?;
    Ok((due, stop))
}

/// The worker: takes tickets, publishes each one's result, and acks the ticket once the result
/// is stored (as the platform's worker does). Result acks are pipelined up to `window`.
async fn serve(run: Arc<Run>, mut msgs: pull::Stream, js: Context, to: String) -> Result<()> {
    let opts = &run.opts;
    let (mut seen, mut pending) = (vec![false; opts.count as usize], FuturesUnordered::new());
    let mut acked = 0;
    while acked < opts.count {
        tokio::select! {
            m = msgs.next(), if pending.len() < opts.window => {
                let msg = m.ok_or("pull ended").map_err(nats("pull tickets"))?;
                let msg = msg.map_err(nats("pull tickets"))?;
                let t: Ticket = decode("ticket", &msg.payload)?;
                if !first_time(&mut seen, t.seq, "ticket")? {
                    run.note_doubled("ticket delivered twice", t.seq);
                }
                let o = Outcome {
                    seq: t.seq,
                    intended_us: t.intended_us,
                    ticket_id: t.ticket_id,
                    attempt: t.attempt,
                    status: "succeeded".into(),
                    finished_at: Utc::now(),
                };
                let m = PublishMessage::build().payload(json(&o));
                let m = m.message_id(format!("{}.result", t.ticket_id));
                let ack = js.send_publish(to.clone(), m).await.map_err(nats("publish result"))?;
                pending.push(async move { (ack.await, msg) });
            }
            Some((ack, msg)) = pending.next() => {
                run.settle(ack, "publish result")?;
                msg.ack().await.map_err(nats("ack ticket"))?;
                acked += 1;
            }
        }
    }
    Ok(())
}

/// The results consumer: records each result's round trip; returns the samples and when the
/// last result arrived (µs after `t0`).
async fn collect(run: Arc<Run>, mut msgs: pull::Stream) -> Result<(Samples, u64)> {
    #[derive(Deserialize)]
    struct Seen {
        seq: u64,
        intended_us: u64,
    }
    let (mut seen, mut samples) = (vec![false; run.opts.count as usize], Samples::new());
    let (mut received, mut last_us) = (0, 0);
    while received < run.opts.count {
        let msg = msgs
            .next()
            .await
            .ok_or("pull ended")
            .map_err(nats("pull results"))?;
        let msg = msg.map_err(nats("pull results"))?;
        let at_us = run.now_us();
        let r: Seen = decode("result", &msg.payload)?;
        msg.ack().await.map_err(nats("ack result"))?;
        if !first_time(&mut seen, r.seq, "result")? {
            run.note_doubled("result seen twice", r.seq);
            continue;
        }
        received += 1;
        run.received.store(received, Relaxed);
        samples.push(at_us as i64 - r.intended_us as i64);
        last_us = at_us;
    }
    Ok((samples, last_us))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_ticket_is_about_400_bytes() {
        let n = super::json(&super::ticket(123_456, 7_890_123)).len();
        assert!((350..=450).contains(&n), "{n} bytes");
    }
}
