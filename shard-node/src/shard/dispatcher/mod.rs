//! Publishing written tickets to JetStream: the outbox's sending half. Tickets arrive after their
//! rows are committed; a ticket written ahead of its time (the shard fires `fire_lead` early) is
//! held until its scheduled millisecond (`on_time.rs`); publishes are pipelined with at most
//! `publish_window` acks outstanding; acks are recorded in batches by a write that runs beside
//! the publishing, never in its way; refused or timed-out publishes are retried with the same
//! `Nats-Msg-Id` so JetStream drops a copy it already has.
//!
//! When JetStream refuses or slows down, memory stays bounded and the shard loop never waits: once
//! the hand-over channel is full the loop stops handing tickets over (`overflow`) and they stay in
//! the outbox only; the dispatcher reads them back from there, oldest first, as the window frees.
//! So firing and API writes go on during a JetStream outage, nothing is lost, and the backlog
//! (`chronoshard_dispatch_backlog`) counts the outbox rows not yet acknowledged.
//!
//! Tickets that were written but never acknowledged (a crash, a publish lost with the connection)
//! are found again by scanning the outbox at start and periodically; tickets JetStream acknowledged
//! and then lost are put back into the outbox by the lost-ticket sweep (`sweep.rs`), which rings
//! the `OutboxBell`.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

mod on_time;

use super::fair::{tenant_tag, FairQueue};
use on_time::OnTime;

use async_nats::jetstream::{context::PublishAckFuture, message::PublishMessage};
use bytes::Bytes;
use chronoshard_telemetry::{metrics, traces};
use chronoshard_wire::{names, Ticket};
use futures::{stream::FuturesUnordered, FutureExt, StreamExt};
use tokio::{
    sync::mpsc::{self, error::TrySendError},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};
use uuid::Uuid;

use super::{
    store::{Acked, Outgoing, Store, StoreError},
    ShardContext,
};

/// Written tickets older than this with no ack are published again by the periodic outbox scan.
const RESCAN_AGE_MS: i64 = 30_000;
const RESCAN_EVERY: Duration = Duration::from_secs(10);
const RETRY_AFTER: Duration = Duration::from_millis(500);
const FLUSH_EVERY: Duration = Duration::from_millis(20);
/// Acks are recorded at most this often, unless `MARK_AT_ONCE` of them wait: each record is a
/// write transaction, and at an everyday rate a transaction per flush recorded a handful.
const MARK_EVERY: Duration = Duration::from_millis(100);
const MARK_AT_ONCE: usize = 256;
/// How often the outbox is counted for the backlog metric while tickets wait there only.
const COUNT_OUTBOX_EVERY: Duration = Duration::from_secs(1);

pub(crate) struct Handle {
    tx: Option<mpsc::Sender<Vec<Outgoing>>>,
    withdrawn: Withdrawn,
    clock: crate::clock::SharedClock,
    /// Set when a hand-over found the channel full: until the dispatcher has read the outbox
    /// back, committed tickets are left there instead of handed over.
    overflow: Arc<AtomicBool>,
    task: Option<JoinHandle<()>>,
}

impl Handle {
    /// Hands committed tickets over for publishing. Never waits: when the pipeline is full they
    /// stay in the outbox, where the dispatcher finds them.
    pub fn publish(&self, tickets: Vec<Ticket>) {
        if tickets.is_empty() || self.overflow.load(Ordering::SeqCst) {
            return;
        }
        if let Some(tx) = &self.tx {
            match tx.try_send(tickets.into_iter().map(Outgoing::from).collect()) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => self.overflow.store(true, Ordering::SeqCst),
                // The shard is stopping: the rows stay in the outbox for the next owner.
                Err(TrySendError::Closed(_)) => {}
            }
        }
    }

    /// Takes back tickets written ahead of their time (ticket id, scheduled time) that are not
    /// due yet, so they are never published; returns those it took back. Never waits for the
    /// dispatcher. A ticket not due yet cannot have been published wherever it is (held, in the
    /// hand-over channel, or in the outbox only), and the dispatcher releases a held ticket only
    /// once due, deciding under the same lock on the same clock.
    pub fn withdraw(&self, tickets: &[(Uuid, i64)]) -> Vec<Uuid> {
        if tickets.is_empty() {
            return Vec::new();
        }
        let mut w = self.withdrawn.lock();
        let now = self.clock.now_ms();
        tickets
            .iter()
            .filter(|(_, at)| *at > now)
            .map(|(id, at)| {
                w.insert(*id, *at);
                *id
            })
            .collect()
    }

    /// Undoes a withdrawal whose database write failed: the tickets are published after all
    /// (late, by the outbox scan, if their time passed meanwhile).
    pub fn restore(&self, tickets: &[Uuid]) {
        let mut w = self.withdrawn.lock();
        for t in tickets {
            w.remove(t);
        }
    }

    /// What another task rings after putting tickets back into the outbox.
    pub fn bell(&self) -> OutboxBell {
        OutboxBell(self.overflow.clone())
    }

    /// Stops accepting tickets and waits for the dispatcher to record what was acknowledged.
    pub async fn closed(&mut self) {
        self.tx.take();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// Withdrawn tickets with their due times, shared by the shard loop (which withdraws) and the
/// dispatcher (which drops them instead of publishing).
#[derive(Clone, Default)]
struct Withdrawn(Arc<std::sync::Mutex<HashMap<Uuid, i64>>>);

impl Withdrawn {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, i64>> {
        // The map holds plain data: one left by a panicking holder is still consistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How long a withdrawn ticket is remembered after its due time: longer than it can take to come
/// out of the hand-over channel or an outbox read.
const TOMBSTONE_MS: i64 = 600_000;

/// Tells the dispatcher that tickets wait in the outbox only: it reads them back within a flush
/// interval.
#[derive(Clone)]
pub(crate) struct OutboxBell(Arc<AtomicBool>);

impl OutboxBell {
    pub fn ring(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

pub(crate) fn start(store: Store, ctx: ShardContext, stop: CancellationToken) -> Handle {
    let (tx, rx) = mpsc::channel(64);
    let withdrawn = Withdrawn::default();
    let overflow = Arc::new(AtomicBool::new(false));
    let span = tracing::info_span!("dispatcher", shard_id = ctx.shard);
    let dispatcher = Dispatcher::new(store, ctx.clone(), overflow.clone(), withdrawn.clone());
    let task = tokio::spawn(
        async move {
            let shard = ctx.shard;
            if let Err(e) = dispatcher.run(rx, stop.clone()).await {
                warn!(shard, error = %e, "dispatcher stopped; stopping shard");
                stop.cancel();
            }
        }
        .instrument(span),
    );
    Handle {
        tx: Some(tx),
        withdrawn,
        clock: ctx.clock.clone(),
        overflow,
        task: Some(task),
    }
}

/// Acks a recording write took, and how it went.
type Marked = (Vec<Acked>, Result<(), StoreError>);

/// A publish awaiting its ack: the stream sequence it was stored under and how late (s) the
/// ticket was handed to the NATS client, or why it failed.
type Inflight = std::pin::Pin<
    Box<dyn std::future::Future<Output = (Outgoing, Result<(u64, f64), String>)> + Send>,
>;

struct Dispatcher {
    store: Store,
    ctx: ShardContext,
    shard_label: String,
    /// Tickets waiting for a place in the publish window: highest priority first, tenants taking
    /// turns within a priority.
    queue: FairQueue<u32, Outgoing>,
    retry: VecDeque<(tokio::time::Instant, Outgoing)>,
    /// Tickets written ahead of their time, until it comes.
    held: OnTime<Outgoing>,
    /// Tickets held, queued, in flight, or acknowledged and not yet recorded as such: an outbox
    /// read must not queue them again.
    pending: HashSet<(Uuid, u32)>,
    acked: Vec<Acked>,
    /// Withdrawn tickets: dropped wherever they show up.
    withdrawn: Withdrawn,
    /// The write recording acks, running beside the publishing.
    marking: Option<JoinHandle<Marked>>,
    /// The tickets of that write, should its task fail.
    marking_keys: Vec<(Uuid, u32)>,
    /// Consecutive failed publishes: the retry backoff grows with it.
    failures: u32,
    overflow: Arc<AtomicBool>,
    /// Outbox rows not acknowledged, as last counted while overflowing (0 otherwise).
    outbox_backlog: usize,
}

impl Dispatcher {
    fn new(
        store: Store,
        ctx: ShardContext,
        overflow: Arc<AtomicBool>,
        withdrawn: Withdrawn,
    ) -> Self {
        Dispatcher {
            overflow,
            outbox_backlog: 0,
            store,
            shard_label: ctx.shard.to_string(),
            ctx,
            queue: FairQueue::default(),
            retry: VecDeque::new(),
            held: OnTime::default(),
            withdrawn,
            pending: HashSet::new(),
            acked: Vec::new(),
            marking: None,
            marking_keys: Vec::new(),
            failures: 0,
        }
    }

    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Vec<Outgoing>>,
        stop: CancellationToken,
    ) -> Result<(), StoreError> {
        let mut inflight: FuturesUnordered<Inflight> = FuturesUnordered::new();
        let now = self.ctx.clock.now_ms();
        let recovered = self
            .store
            .unpublished(now + 1, now + self.ahead_ms(), 100_000)
            .await?;
        if !recovered.is_empty() {
            info!(
                count = recovered.len(),
                "publishing tickets written but never acknowledged"
            );
        }
        self.enqueue(recovered);
        let mut flush = tokio::time::interval(FLUSH_EVERY);
        // An idle shard skips its flushes; when there is something again, the first one comes
        // at once and the next ones every `FLUSH_EVERY`, never as a burst catching up.
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut rescan = tokio::time::interval(RESCAN_EVERY);
        rescan.reset();
        let mut count_outbox = tokio::time::Instant::now();
        let mut marked_at = tokio::time::Instant::now();
        let mut open = true;
        loop {
            // Read each turn: the window is a live setting.
            let window = self.ctx.config().publish_window.max(1);
            self.release_due();
            while inflight.len() < window {
                let Some(t) = self.queue.pop() else {
                    break;
                };
                let fut = self.send(t).await;
                inflight.push(fut);
            }
            self.report_backlog(inflight.len());
            // To the microsecond: the time left in the current millisecond counts (see
            // `Clock::until`), and the alarm does not round the wake-up up to a millisecond.
            let release = self
                .held
                .next_at()
                .map(|at| std::time::Instant::now() + self.ctx.clock.until(at));
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                _ = sleep_until_some(release), if release.is_some() => {}
                Some((t, res)) = inflight.next(), if !inflight.is_empty() => self.on_ack(t, res),
                marked = join_some(&mut self.marking), if self.marking.is_some() => {
                    self.marking = None;
                    self.on_marked(marked)?;
                }
                batch = rx.recv(), if open && self.waiting() < window * 4 => match batch {
                    Some(b) => self.enqueue(b),
                    None => open = false,
                },
                _ = std::future::ready(()), if self.overflow.load(Ordering::SeqCst) && self.waiting() < window => {
                    self.read_outbox(window * 2).await?;
                }
                _ = flush.tick(), if self.has_flush_work(open) => {
                    if self.acked.len() >= MARK_AT_ONCE || marked_at.elapsed() >= MARK_EVERY || !open {
                        marked_at = tokio::time::Instant::now();
                        self.start_marking();
                    }
                    let now = self.ctx.clock.now_ms();
                    self.withdrawn.lock().retain(|_, at| *at > now - TOMBSTONE_MS);
                    if count_outbox.elapsed() >= COUNT_OUTBOX_EVERY {
                        count_outbox = tokio::time::Instant::now();
                        self.count_outbox().await?;
                    }
                    let now = tokio::time::Instant::now();
                    while self.retry.front().is_some_and(|(at, _)| *at <= now) {
                        let (_, t) = self.retry.pop_front().expect("front exists");
                        self.push(t);
                    }
                    if !open && self.waiting() == 0 && inflight.is_empty() {
                        break;
                    }
                }
                _ = rescan.tick() => {
                    let now = self.ctx.clock.now_ms();
                    let old = self.store.unpublished(now - RESCAN_AGE_MS, now, 10_000).await;
                    if let Some(old) = tolerate(old)? {
                        self.enqueue(old);
                    }
                }

            }
        }
        // Record acks that arrive within a moment; unacknowledged tickets stay in the outbox.
        // (With nothing in flight there is nothing to wait for: the shard's stop, and so a
        // node's clean stop, used to take these 2 s every time.)
        let deadline = tokio::time::sleep(Duration::from_secs(2));
        tokio::pin!(deadline);
        while !inflight.is_empty() {
            tokio::select! {
                Some((t, res)) = inflight.next() => self.on_ack(t, res),
                _ = &mut deadline => break,
            }
        }
        self.report_backlog(0);
        if let Some(marking) = self.marking.take() {
            if let Ok((done, Err(_))) = marking.await {
                self.acked.extend(done);
            }
        }
        let now = self.ctx.clock.now_ms();
        match self.store.mark_published(&self.acked, now).await {
            Err(StoreError::Fenced { .. }) | Ok(()) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// How far ahead of now the shard writes tickets: outbox reads take those too, to hold them.
    fn ahead_ms(&self) -> i64 {
        2 * self.ctx.config().fire_lead.as_millis() as i64
    }

    /// Tickets held here and not in flight.
    fn waiting(&self) -> usize {
        self.queue.len() + self.retry.len() + self.held.len()
    }

    /// Takes back, oldest first, what the shard loop left in the outbox while the hand-over
    /// channel was full. The flag is cleared before reading, so a ticket left there after the
    /// read started is either in this read or handed over through the channel.
    async fn read_outbox(&mut self, limit: usize) -> Result<(), StoreError> {
        self.overflow.store(false, Ordering::SeqCst);
        // Acks not yet recorded read as unpublished: a page of them would be read again and again
        // (they are pending, so never queued twice). Record them first; while tickets wait in the
        // outbox only, the wait costs no lateness.
        self.start_marking();
        if let Some(marking) = self.marking.take() {
            let marked = marking.await;
            self.on_marked(marked)?;
        }
        let now = self.ctx.clock.now_ms();
        let read = self
            .store
            .unpublished(now + 1, now + self.ahead_ms(), limit as u32)
            .await;
        let rows = match tolerate(read)? {
            Some(rows) => rows,
            // The periodic rescan picks them up once the database answers again.
            None => return Ok(()),
        };
        if rows.len() == limit {
            self.overflow.store(true, Ordering::SeqCst);
        } else {
            self.outbox_backlog = 0;
        }
        self.enqueue(rows);
        Ok(())
    }

    /// While tickets wait in the outbox only, the backlog is what the outbox holds.
    async fn count_outbox(&mut self) -> Result<(), StoreError> {
        if self.overflow.load(Ordering::SeqCst) {
            let now = self.ctx.clock.now_ms();
            if let Some(n) = tolerate(self.store.unpublished_count(now).await)? {
                self.outbox_backlog = n as usize;
            }
        }
        Ok(())
    }

    fn enqueue(&mut self, tickets: Vec<Outgoing>) {
        let now = self.ctx.clock.now_ms();
        let withdrawn = self.withdrawn.clone();
        let withdrawn = withdrawn.lock();
        for o in tickets {
            if withdrawn.contains_key(&o.ticket.ticket_id) {
                continue;
            }
            if self.pending.insert((o.ticket.ticket_id, o.ticket.attempt)) {
                let at = o.ticket.scheduled_at.timestamp_millis();
                if at > now {
                    self.held.hold(at, o);
                } else {
                    self.push(o);
                }
            }
        }
    }

    /// Moves held tickets that are due into the queue, dropping withdrawn ones. The time is read
    /// under the withdrawal lock: a ticket is either withdrawn before it is due or released,
    /// never both (`Handle::withdraw`).
    fn release_due(&mut self) {
        let withdrawn = self.withdrawn.clone();
        let withdrawn = withdrawn.lock();
        let now = self.ctx.clock.now_ms();
        let mut due = Vec::new();
        while let Some(o) = self.held.pop_due(now) {
            if withdrawn.contains_key(&o.ticket.ticket_id) {
                self.pending.remove(&(o.ticket.ticket_id, o.ticket.attempt));
            } else {
                due.push(o);
            }
        }
        drop(withdrawn);
        for o in due {
            self.push(o);
        }
    }

    fn push(&mut self, o: Outgoing) {
        self.queue
            .push(o.ticket.priority, tenant_tag(&o.ticket.tenant), o);
    }

    async fn send(&self, o: Outgoing) -> Inflight {
        let t = &o.ticket;
        let subject = names::dispatch_subject(&t.queue);
        let span = traces::PublishSpan::start(&t.into(), &subject);
        let body = Bytes::from(serde_json::to_vec(t).expect("ticket serialises"));
        let mut msg = PublishMessage::build()
            .payload(body)
            .message_id(msg_id(&o))
            .header(names::HDR_TICKET_ID, t.ticket_id.to_string().as_str())
            .header(names::HDR_ATTEMPT, t.attempt.to_string().as_str())
            .header(names::HDR_SHARD, t.shard.to_string().as_str());
        if let Some(parent) = span.traceparent() {
            msg = msg.header(names::TRACEPARENT, parent.as_str());
        }
        match self.ctx.cluster.js.send_publish(subject, msg).await {
            Ok(ack) => {
                // Observed with the ack, so that a publish tried again counts once, when it
                // finally went through, like the lateness at the ack.
                let sent = self.lateness_s(t);
                async move {
                    let acked = wait_ack(ack).await;
                    span.end(acked.as_ref().copied().map_err(String::as_str));
                    (o, acked.map(|seq| (seq, sent)))
                }
                .boxed()
            }
            Err(e) => {
                let e = e.to_string();
                span.end(Err(&e));
                async move { (o, Err(e)) }.boxed()
            }
        }
    }

    /// Seconds from the ticket's due time to now, to the microsecond: whole milliseconds would
    /// put a ticket 1.9 ms late in the 1 ms bucket.
    fn lateness_s(&self, t: &Ticket) -> f64 {
        (self.ctx.clock.now_us() - t.scheduled_at.timestamp_micros()).max(0) as f64 / 1e6
    }

    fn on_ack(&mut self, o: Outgoing, res: Result<(u64, f64), String>) {
        let t = &o.ticket;
        match res {
            Ok((seq, sent_late)) => {
                self.failures = 0;
                metrics::FIRE_SEND_LATENESS_SECONDS
                    .with_label_values(&[&self.shard_label])
                    .observe(sent_late);
                let late = self.lateness_s(t);
                metrics::FIRE_LATENESS_SECONDS
                    .with_label_values(&[&self.shard_label])
                    .observe(late);
                metrics::PUBLISH_SECONDS_HISTOGRAM
                    .with_label_values(&[&self.shard_label])
                    .observe((late - sent_late).max(0.0));
                metrics::TICKETS_PUBLISHED_TOTAL
                    .with_label_values(&[&self.shard_label])
                    .inc();
                self.acked.push(Acked {
                    ticket: t.ticket_id,
                    attempt: t.attempt,
                    seq,
                });
            }
            Err(e) => {
                metrics::PUBLISH_ERRORS_TOTAL
                    .with_label_values(&[&self.shard_label])
                    .inc();
                self.failures += 1;
                // One line per doubling of the failure streak, not one per ticket.
                if self.failures.is_power_of_two() {
                    warn!(ticket_id = %t.ticket_id, failures = self.failures, error = %e, "ticket publish failed; retrying with backoff");
                }
                // At most 2 s: a stream whose leader NATS re-elects (a server died) takes
                // tickets again within seconds, and a longer pause would only add to lateness.
                let backoff = RETRY_AFTER * 2u32.pow(self.failures.ilog2().min(2));
                self.retry
                    .push_back((tokio::time::Instant::now() + backoff, o));
            }
        }
    }

    /// Starts recording the acks gathered so far, unless a write is under way: the publishing
    /// goes on meanwhile (the write waits for the shard's connection behind its fire writes).
    /// Whether a flush has anything to do: acks to record, withdrawals to forget, backlog to
    /// count, retries to requeue, or a closed channel to notice. Nothing, when the shard is idle:
    /// then the dispatcher sleeps until a ticket, an ack or its rescan wakes it.
    fn has_flush_work(&self, open: bool) -> bool {
        !open
            || !self.acked.is_empty()
            || !self.retry.is_empty()
            || self.overflow.load(Ordering::SeqCst)
            || !self.withdrawn.lock().is_empty()
    }

    fn start_marking(&mut self) {
        if self.marking.is_some() || self.acked.is_empty() {
            return;
        }
        let acked = std::mem::take(&mut self.acked);
        self.marking_keys = acked.iter().map(|a| (a.ticket, a.attempt)).collect();
        let store = self.store.clone();
        let now = self.ctx.clock.now_ms();
        self.marking = Some(tokio::spawn(async move {
            let res = store.mark_published(&acked, now).await;
            (acked, res)
        }));
    }

    /// Recorded acks leave `pending`; unrecorded ones are tried again with the next batch.
    fn on_marked(
        &mut self,
        marked: Result<Marked, tokio::task::JoinError>,
    ) -> Result<(), StoreError> {
        let (acked, res) = match marked {
            Ok(m) => m,
            // Its acks stay unrecorded: the outbox scans publish those tickets again, and
            // JetStream drops the copies (same message ids, within the duplicate window).
            Err(e) => {
                warn!(error = %e, "ack recording task failed");
                for key in std::mem::take(&mut self.marking_keys) {
                    self.pending.remove(&key);
                }
                return Ok(());
            }
        };
        match tolerate(res)? {
            Some(()) => {
                for a in acked {
                    self.pending.remove(&(a.ticket, a.attempt));
                }
            }
            None => self.acked.extend(acked),
        }
        Ok(())
    }

    fn report_backlog(&self, inflight: usize) {
        let backlog = (self.waiting() + inflight).max(self.outbox_backlog);
        metrics::DISPATCH_BACKLOG_GAUGE
            .with_label_values(&[&self.shard_label])
            .set(backlog as i64);
    }
}

/// Store errors other than fencing are logged and survived: the outbox keeps the tickets, and the
/// next flush or scan tries again. Fencing stops the dispatcher (another node owns the shard).
fn tolerate<T>(r: Result<T, StoreError>) -> Result<Option<T>, StoreError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e @ StoreError::Fenced { .. }) => Err(e),
        Err(e) => {
            warn!(error = %e, "dispatcher store access failed; will retry");
            Ok(None)
        }
    }
}

async fn sleep_until_some(at: Option<std::time::Instant>) {
    if let Some(at) = at {
        crate::alarm::sleep_until(at).await;
    }
}

async fn join_some<T>(task: &mut Option<JoinHandle<T>>) -> Result<T, tokio::task::JoinError> {
    match task {
        Some(t) => t.await,
        None => std::future::pending().await,
    }
}

/// A duplicate's ack names the sequence of the copy the stream already holds.
async fn wait_ack(ack: PublishAckFuture) -> Result<u64, String> {
    ack.await.map(|a| a.sequence).map_err(|e| e.to_string())
}

/// Whether a message the dispatch stream holds is this attempt's ticket, by the headers the
/// dispatcher set on it: a recreated stream numbers from 1 again, so a sequence alone does not
/// say.
pub(crate) fn carries(headers: &async_nats::HeaderMap, ticket: Uuid, attempt: u32) -> bool {
    let header = |name| headers.get(name).map(|v| v.as_str().to_string());
    header(names::HDR_TICKET_ID) == Some(ticket.to_string())
        && header(names::HDR_ATTEMPT) == Some(attempt.to_string())
}

/// JetStream drops a publish whose id it has seen within its duplicate window: a retried publish
/// keeps the id, a resend of a lost ticket gets a new one (the window may still hold the old).
fn msg_id(o: &Outgoing) -> String {
    match o.resends {
        0 => format!("{}:{}", o.ticket.ticket_id, o.ticket.attempt),
        n => format!("{}:{}:resend-{n}", o.ticket.ticket_id, o.ticket.attempt),
    }
}
