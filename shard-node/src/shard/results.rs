//! Consuming the shard's worker results from JetStream and applying them to the store in batches.
//! A message is acknowledged only after its batch is committed, so a crash re-delivers it; the
//! store ignores a result it already has, so re-delivery changes nothing. What the applied results
//! call for (retry timers, watchdog checks, buffered releases) goes to the shard loop. A pull that
//! goes silent (no result, no idle heartbeat) or ends is given up and opened again, the consumer
//! with it; what it had brought and was not applied goes back first.

use std::{sync::Arc, time::Duration};

use async_nats::jetstream::{
    consumer::pull::{self, MessagesError, MessagesErrorKind},
    AckKind, Message,
};
use chronoshard_telemetry::{metrics, traces};
use chronoshard_wire::{growth::KeyMove, ids, names, ResultKind, TicketResult};
use futures::{FutureExt, StreamExt};
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use super::{
    moves::Leaving,
    store::{Store, StoreError},
    Command, ShardContext, ShardError,
};

const BATCH: usize = 256;
/// A batch smaller than this waits up to `LINGER` for more results (`top_up`).
const LINGER_BELOW: usize = 32;
const LINGER: Duration = Duration::from_millis(20);
/// How long one pull request for results lasts, and how often the server sends an idle heartbeat
/// on it while it has nothing to deliver. The client keeps count of what it asked for and what
/// came, and pulls again only when its count says so; once (rarely, under a burst) that count
/// said a pull was open that the server no longer held, and the shard applied no result for the
/// 35 s the client waits before it pulls anyway (BENCHMARKS.md). With a heartbeat the client
/// notices within two periods (4 s), and `run` then pulls anew. Two periods leave about 2 s for
/// the process or the server to stall before a healthy pull is taken for lost: such a false
/// renewal costs a few requests, and results still on their way to the old pull wait out the
/// ack wait.
const PULL_EXPIRES: Duration = Duration::from_secs(5);
const PULL_HEARTBEAT: Duration = Duration::from_secs(2);
/// Pause before opening a pull again after opening one failed, or after a pull was lost this
/// soon after it opened (a consumer that ends every pull at once must not make this a busy loop).
const REOPEN_AFTER: Duration = Duration::from_secs(1);
/// Longest wait for the result consumer and its pull to open. When the NATS server that led the
/// consumer dies, a request to it is not answered (the context's 10 s timeout would apply) while
/// the other replicas elect a new leader in a few seconds: asking again sooner applies results
/// sooner.
const OPEN_WITHIN: Duration = Duration::from_secs(3);

type Batches = futures::stream::ReadyChunks<pull::Stream>;

pub(crate) async fn start(
    store: Store,
    ctx: ShardContext,
    leaving: Arc<Leaving>,
    commands: mpsc::Sender<Command>,
    stop: CancellationToken,
) -> Result<JoinHandle<()>, ShardError> {
    // The first pull is opened here, so a shard whose results cannot be consumed does not open.
    let batches = open(&ctx).await?;
    let span = tracing::info_span!("results", shard_id = ctx.shard);
    Ok(tokio::spawn(
        run(store, ctx, leaving, commands, stop, batches).instrument(span),
    ))
}

/// The shard's result consumer and a pull on it, in batches.
async fn open(ctx: &ShardContext) -> Result<Batches, ShardError> {
    let shard = ctx.shard;
    let err = |what: &'static str| {
        move |e: Box<dyn std::error::Error + Send + Sync>| ShardError::Nats {
            shard,
            what,
            reason: e.to_string(),
        }
    };
    let stream = ctx
        .cluster
        .js
        .get_stream(names::RESULT_STREAM)
        .await
        .map_err(|e| err("result stream")(e.into()))?;
    let consumer = stream
        .get_or_create_consumer(
            &names::result_consumer(shard),
            pull::Config {
                durable_name: Some(names::result_consumer(shard)),
                filter_subject: names::result_subject(shard),
                ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: 10_000,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| err("result consumer")(e.into()))?;
    let messages = consumer
        .stream()
        .expires(PULL_EXPIRES)
        .heartbeat(PULL_HEARTBEAT)
        .messages()
        .await
        .map_err(|e| err("result messages")(e.into()))?;
    Ok(messages.ready_chunks(BATCH))
}

/// Why a pull is given up and made anew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lost {
    /// Neither a result nor an idle heartbeat for two heartbeat periods.
    Heartbeat,
    /// The pull stream ended (its consumer was deleted, say).
    Ended,
}

impl Lost {
    fn as_str(self) -> &'static str {
        match self {
            Lost::Heartbeat => "heartbeat",
            Lost::Ended => "ended",
        }
    }

    /// Whether an error of the pull stream means the pull is lost (the others pass: the
    /// stream goes on after them).
    fn from_error(e: &MessagesError) -> Option<Lost> {
        (e.kind() == MessagesErrorKind::MissingHeartbeat).then_some(Lost::Heartbeat)
    }
}

/// How applying the results of one pull ended.
enum Ended {
    /// The shard stops (or was fenced, which stops it): what was pulled and not applied goes
    /// back.
    Stopped,
    Lost(Lost),
}

/// Applies results until the shard stops, pulling anew whenever a pull is lost.
async fn run(
    store: Store,
    ctx: ShardContext,
    leaving: Arc<Leaving>,
    commands: mpsc::Sender<Command>,
    stop: CancellationToken,
    mut batches: Batches,
) {
    let label = ctx.shard.to_string();
    loop {
        let opened = tokio::time::Instant::now();
        let lost = match consume(
            &store,
            &ctx,
            &leaving,
            &commands,
            &stop,
            &label,
            &mut batches,
        )
        .await
        {
            Ended::Stopped => {
                let handed = hand_back(batches).await;
                if handed > 0 {
                    info!(results = handed, "results handed back to the next owner");
                }
                return;
            }
            Ended::Lost(lost) => lost,
        };
        let handed = hand_back(batches).await;
        warn!(
            reason = lost.as_str(),
            handed_back = handed,
            "result pull lost; pulling anew"
        );
        metrics::RESULT_PULLS_RENEWED_TOTAL
            .with_label_values(&[&label, lost.as_str()])
            .inc();
        let mut pause = (opened.elapsed() < REOPEN_AFTER).then_some(REOPEN_AFTER);
        batches = loop {
            if let Some(pause) = pause {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
            // A shard that stops must not wait for a server that does not answer.
            let opened = tokio::select! {
                _ = stop.cancelled() => return,
                opened = tokio::time::timeout(OPEN_WITHIN, open(&ctx)) => opened,
            };
            match opened {
                Ok(Ok(b)) => break b,
                Ok(Err(e)) => {
                    warn!(error = %e, "opening the result pull failed; trying again");
                    pause = Some(REOPEN_AFTER);
                }
                Err(_) => {
                    warn!(within = ?OPEN_WITHIN, "opening the result pull got no answer; trying again");
                    pause = Some(REOPEN_AFTER);
                }
            }
        };
    }
}

/// Applies what one pull brings, batch by batch, until the pull is lost or the shard stops.
/// A message is acknowledged only after its batch is committed.
async fn consume(
    store: &Store,
    ctx: &ShardContext,
    leaving: &Leaving,
    commands: &mpsc::Sender<Command>,
    stop: &CancellationToken,
    label: &str,
    batches: &mut Batches,
) -> Ended {
    loop {
        let batch = tokio::select! {
            _ = stop.cancelled() => return Ended::Stopped,
            b = batches.next() => match b {
                Some(b) => b,
                None => return Ended::Lost(Lost::Ended),
            },
        };
        let batch = top_up(batches, batch, stop).await;
        let mut msgs = Vec::with_capacity(batch.len());
        let mut results = Vec::with_capacity(batch.len());
        // The results around an error in a batch are still applied.
        let mut lost = None;
        for m in batch {
            let m = match m {
                // Something came after the error: the pull lives.
                Ok(m) => {
                    lost = None;
                    m
                }
                Err(e) => {
                    lost = lost.or(Lost::from_error(&e));
                    warn!(error = %e, "result stream error");
                    continue;
                }
            };
            match serde_json::from_slice::<TicketResult>(&m.payload) {
                Ok(r) => {
                    results.push(r);
                    msgs.push(m);
                }
                Err(e) => {
                    // Nothing can ever apply it: terminate it so it is not redelivered.
                    warn!(error = %e, "malformed result message dropped");
                    let _ = m.ack_with(AckKind::Term).await;
                }
            }
        }
        // Shared while the batch is applied: a freeze waits for it, and once frozen, a key's
        // results wait.
        let held = leaving.gate.read().await;
        let (results, msgs) = divert(leaving, ctx, results, msgs).await;
        if !results.is_empty() {
            let start = std::time::SystemTime::now();
            match store.apply_results(&results, ctx.clock.now_ms()).await {
                Ok(mut applied) => {
                    drop(held);
                    count_applied(label, &results);
                    trace_applied(&results, &msgs, start);
                    for m in msgs {
                        let _ = m.ack().await;
                    }
                    // Most starts end in the same batch and most ended runs have nothing
                    // buffered: the shard loop need not read each to find that out.
                    applied.drop_idle_follow_ups();
                    // A shard closing drops this; the next owner re-arms from the store.
                    if !applied.follow_ups.is_empty() || applied.dead > 0 {
                        let _ = commands.send(Command::Applied(applied)).await;
                    }
                }
                Err(e) => {
                    for m in msgs {
                        let _ = m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                    }
                    if matches!(e, StoreError::Fenced { .. }) {
                        warn!(error = %e, "results: shard fenced");
                        stop.cancel();
                        return Ended::Stopped;
                    }
                    warn!(error = %e, "applying results failed; they will be redelivered");
                }
            }
        }
        if let Some(lost) = lost {
            return Ended::Lost(lost);
        }
    }
}

/// Takes out of a batch the results of tenants leaving this shard: those of a frozen key wait
/// (redelivered after a second), those of a gone key are sent on to its new shard, under a
/// message id of their own so the stream does not take them for copies of themselves.
async fn divert(
    leaving: &Leaving,
    ctx: &ShardContext,
    results: Vec<TicketResult>,
    msgs: Vec<Message>,
) -> (Vec<TicketResult>, Vec<Message>) {
    if leaving.is_empty() {
        return (results, msgs);
    }
    let (mut keep_r, mut keep_m) = (Vec::new(), Vec::new());
    for (r, m) in results.into_iter().zip(msgs) {
        match leaving.get(ids::routing_key(r.ticket_id)) {
            None => {
                keep_r.push(r);
                keep_m.push(m);
            }
            Some((_, KeyMove::Frozen)) => {
                let _ = m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
            }
            Some((target, KeyMove::Gone)) => {
                let mut msg = async_nats::jetstream::message::PublishMessage::build()
                    .payload(m.payload.clone())
                    .message_id(format!("{}>{target}", r.dedup_id()));
                if let Some(parent) = m.headers.as_ref().and_then(|h| h.get(names::TRACEPARENT)) {
                    msg = msg.header(names::TRACEPARENT, parent.as_str());
                }
                let sent = match ctx
                    .cluster
                    .js
                    .send_publish(names::result_subject(target), msg)
                    .await
                {
                    Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match sent {
                    Ok(()) => {
                        let _ = m.ack().await;
                    }
                    Err(e) => {
                        warn!(error = %e, target, "could not send a result on to the tenant's new shard");
                        let _ = m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                    }
                }
            }
        }
    }
    (keep_r, keep_m)
}

/// Tops up a small batch with what arrives within `LINGER`, until it is no longer small (it may
/// so exceed `BATCH`) or the shard stops. At a
/// steady rate results come a few at a time, and applying one costs about as much as applying
/// ten: a transaction (two trips to the shard's SQLite thread, a commit writing its pages to the
/// WAL) and a wake-up of each thread on the way. Measured at 5,000 results/s: a shard applied
/// about three results per transaction without this, seven with it (BENCHMARKS.md). Results are
/// recorded up to `LINGER` later; nothing waits on them that fast.
async fn top_up<S, T>(batches: &mut S, mut batch: Vec<T>, stop: &CancellationToken) -> Vec<T>
where
    S: futures::Stream<Item = Vec<T>> + Unpin,
{
    let until = tokio::time::Instant::now() + LINGER;
    while batch.len() < LINGER_BELOW {
        tokio::select! {
            _ = stop.cancelled() => break,
            more = tokio::time::timeout_at(until, batches.next()) => match more {
                Ok(Some(more)) => batch.extend(more),
                _ => break,
            },
        }
    }
    batch
}

/// Gives back the results pulled but not applied when the shard stops (it moved, or the node
/// stops): left unacknowledged they would reach the next owner only after the ack wait (30 s).
/// Returns how many. Results still on their way from the server are not caught: they wait.
async fn hand_back<S, M>(mut batches: S) -> usize
where
    S: futures::Stream<Item = Vec<Result<async_nats::jetstream::Message, M>>> + Unpin,
{
    let mut buffered = Vec::new();
    while let Some(Some(batch)) = batches.next().now_or_never() {
        buffered.extend(batch.into_iter().flatten());
    }
    // Unsubscribe first: the server redelivers a NAKed message to any open pull request, and
    // this one's would still be open, with nobody reading it.
    drop(batches);
    for m in &buffered {
        let _ = m.ack_with(AckKind::Nak(None)).await;
    }
    buffered.len()
}

/// The `result` span of each result applied since `start`, a child of the attempt its message's
/// `traceparent` names, when traces are exported.
fn trace_applied(results: &[TicketResult], msgs: &[Message], start: std::time::SystemTime) {
    if !traces::exporting() {
        return;
    }
    for (r, m) in results.iter().zip(msgs) {
        let parent = m
            .headers
            .as_ref()
            .and_then(|h| h.get(names::TRACEPARENT))
            .map(|v| v.as_str());
        traces::result_applied(&r.into(), parent, start);
    }
}

/// Counts applied results by kind: one counter update per kind and batch.
fn count_applied(label: &str, results: &[TicketResult]) {
    let mut counts: Vec<(ResultKind, u64)> = Vec::new();
    for r in results {
        match counts.iter_mut().find(|(k, _)| *k == r.kind) {
            Some((_, n)) => *n += 1,
            None => counts.push((r.kind, 1)),
        }
    }
    for (kind, n) in counts {
        metrics::RESULTS_APPLIED_TOTAL
            .with_label_values(&[label, kind.as_str()])
            .inc_by(n);
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashSet, time::Duration};

    use async_nats::jetstream::{self, consumer::pull, stream};
    use futures::{channel::mpsc, StreamExt};

    use tokio_util::sync::CancellationToken;

    use super::{hand_back, top_up, Lost, BATCH, LINGER, LINGER_BELOW};

    /// Only a missed heartbeat gives a pull up; the stream goes on after any other error.
    #[test]
    fn only_a_missed_heartbeat_loses_the_pull() {
        use async_nats::jetstream::consumer::pull::{MessagesError, MessagesErrorKind};
        assert_eq!(
            Lost::from_error(&MessagesError::new(MessagesErrorKind::MissingHeartbeat)),
            Some(Lost::Heartbeat)
        );
        for kind in [
            MessagesErrorKind::Pull,
            MessagesErrorKind::NoResponders,
            MessagesErrorKind::Other,
        ] {
            assert_eq!(
                Lost::from_error(&MessagesError::new(kind)),
                None,
                "{kind:?}"
            );
        }
    }

    /// A shard that stops with results pulled but not applied gives them back: the next pull
    /// gets them at once, not after the 30 s ack wait.
    #[tokio::test]
    async fn results_pulled_by_a_stopping_shard_go_back_at_once() {
        let nats = chronoshard_test_util::Nats::start().await.unwrap();
        let js = jetstream::new(nats.client().await.unwrap());
        let results = js
            .create_stream(stream::Config {
                name: "R".into(),
                subjects: vec!["r".into()],
                ..Default::default()
            })
            .await
            .unwrap();
        for i in 0..20 {
            js.publish("r", i.to_string().into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        let config = pull::Config {
            durable_name: Some("c".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            ..Default::default()
        };
        let consumer = results.create_consumer(config).await.unwrap();
        let mut batches = consumer
            .messages()
            .await
            .unwrap()
            .ready_chunks(256)
            .peekable();
        let buffered = std::pin::Pin::new(&mut batches).peek();
        tokio::time::timeout(Duration::from_secs(10), buffered)
            .await
            .expect("a batch is delivered within 10 s")
            .unwrap();
        let handed = hand_back(batches).await;
        assert!(handed >= 1, "a batch was buffered");

        let again = results.get_consumer::<pull::Config>("c").await.unwrap();
        let mut seen = HashSet::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while seen.len() < handed && tokio::time::Instant::now() < deadline {
            let mut batch = again
                .fetch()
                .max_messages(20)
                .expires(Duration::from_millis(500))
                .messages()
                .await
                .unwrap();
            while let Some(Ok(m)) = batch.next().await {
                seen.insert(m.payload.clone());
                m.ack().await.unwrap();
            }
        }
        assert!(
            seen.len() >= handed,
            "{handed} results handed back, {} pulled again within 5 s",
            seen.len()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_batch_waits_a_moment_for_more() {
        let (tx, rx) = mpsc::unbounded::<u32>();
        let mut batches = rx.ready_chunks(BATCH);
        tx.unbounded_send(1).unwrap();
        let first = batches.next().await.unwrap();
        let late = tokio::spawn(async move {
            tokio::time::sleep(LINGER / 2).await;
            tx.unbounded_send(2).unwrap();
            tokio::time::sleep(LINGER).await;
            tx.unbounded_send(3).unwrap();
            tx
        });
        let start = tokio::time::Instant::now();
        let batch = top_up(&mut batches, first, &CancellationToken::new()).await;
        assert_eq!(batch, vec![1, 2]);
        assert_eq!(start.elapsed(), LINGER, "waited out the linger");
        let _tx = late.await.unwrap();
        assert_eq!(batches.next().await.unwrap(), vec![3], "the next batch");
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_batch_goes_at_once() {
        let (tx, rx) = mpsc::unbounded::<u32>();
        let mut batches = rx.ready_chunks(BATCH);
        for i in 0..LINGER_BELOW as u32 {
            tx.unbounded_send(i).unwrap();
        }
        let first = batches.next().await.unwrap();
        let start = tokio::time::Instant::now();
        let batch = top_up(&mut batches, first, &CancellationToken::new()).await;
        assert_eq!(batch.len(), LINGER_BELOW);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    /// A burst that begins with one result goes as soon as the rest has come.
    #[tokio::test(start_paused = true)]
    async fn a_batch_that_grew_large_stops_waiting() {
        let (tx, rx) = mpsc::unbounded::<u32>();
        let mut batches = rx.ready_chunks(BATCH);
        tx.unbounded_send(0).unwrap();
        let first = batches.next().await.unwrap();
        for i in 1..LINGER_BELOW as u32 {
            tx.unbounded_send(i).unwrap();
        }
        let start = tokio::time::Instant::now();
        let batch = top_up(&mut batches, first, &CancellationToken::new()).await;
        assert_eq!(batch.len(), LINGER_BELOW);
        assert_eq!(start.elapsed(), Duration::ZERO, "no wait once large");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopping_shard_does_not_wait() {
        let (_tx, rx) = mpsc::unbounded::<u32>();
        let mut batches = rx.ready_chunks(BATCH);
        let stop = CancellationToken::new();
        stop.cancel();
        let start = tokio::time::Instant::now();
        assert_eq!(top_up(&mut batches, vec![7], &stop).await, vec![7]);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
