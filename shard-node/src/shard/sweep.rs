//! The lost-ticket sweep. A JetStream ack means the dispatch stream stored a ticket, not that a
//! worker will ever run it: the stream can lose it (an ack is not an fsync, a stream can be
//! recreated) and a worker can terminate it without reporting. Workers acknowledge a delivery
//! only after its final result is stored, and report `started` before running it, so an attempt
//! that is neither started nor finished and whose message the stream no longer holds was lost.
//!
//! The sweep looks at attempts published longer than `resend_after` ago and never started, asks
//! the stream for the message under the sequence its publish was stored at, and when it is gone
//! twice, `grace` apart, and every result stored for the shard by the time it was first seen gone
//! has been applied (a worker stores its final result before it acknowledges the ticket, so a
//! result of that attempt would be among them; the results stream is a work queue, so "applied"
//! is "no longer in it"), puts the attempt back into the outbox: the dispatcher publishes it again under the
//! same ticket id and attempt. An attempt lost `MAX_RESENDS` times is failed as `lost:` through
//! the results stream, so the retry policy and the dead-letter list take over instead of a loop.
//!
//! It owns no state but its suspicions; it must not publish tickets itself (the dispatcher does)
//! or touch attempts that started (the watchdog's).

use std::collections::HashMap;

use async_nats::jetstream::{
    self,
    message::PublishMessage,
    stream::{RawMessageErrorKind, Stream},
};
use bytes::Bytes;
use chronoshard_telemetry::metrics;
use chronoshard_wire::{from_millis, names, ResultKind, TicketResult};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};
use uuid::Uuid;

use super::{
    dispatcher::OutboxBell,
    store::{Store, StoreError, Unstarted},
    ShardContext,
};

/// Sends of one attempt after the first before it is given up as lost.
pub const MAX_RESENDS: u32 = 3;
/// Attempts checked per pass: each is one request to the stream.
const PER_PASS: u32 = 256;

#[derive(Clone, Copy)]
enum Edge {
    First,
    Last,
}

/// Whether the dispatch stream holds an attempt's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    Held,
    Gone,
    /// The stream did not answer, or the attempt has no recorded sequence.
    Unknown,
}

/// What the sweep does with an unstarted attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing (held, unknown, or gone for less than the grace period).
    Wait,
    /// First seen gone now: look again after the grace period.
    Suspect,
    /// Gone twice, `grace` apart: publish it again.
    Resend,
    /// Gone again after `MAX_RESENDS` resends: fail the attempt as lost.
    GiveUp,
}

/// The decision for one attempt, given when it was first seen gone (if it was).
pub fn judge(
    presence: Presence,
    gone_since: Option<i64>,
    resends: u32,
    now: i64,
    grace: i64,
) -> Action {
    match (presence, gone_since) {
        (Presence::Held | Presence::Unknown, _) => Action::Wait,
        (Presence::Gone, None) => Action::Suspect,
        (Presence::Gone, Some(since)) if now - since < grace => Action::Wait,
        (Presence::Gone, Some(_)) if resends >= MAX_RESENDS => Action::GiveUp,
        (Presence::Gone, Some(_)) => Action::Resend,
    }
}

pub(crate) fn start(
    store: Store,
    ctx: ShardContext,
    bell: OutboxBell,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let span = tracing::info_span!("sweep", shard_id = ctx.shard);
    tokio::spawn(
        async move {
            let mut sweep = Sweep::new(store, ctx, bell);
            let mut tick = tokio::time::interval(sweep.grace_period());
            // Not at once: a new owner's results consumer has yet to catch up.
            tick.reset();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match sweep.pass().await {
                    Ok(()) => {}
                    Err(e @ StoreError::Fenced { .. }) => {
                        warn!(error = %e, "sweep fenced; stopping shard");
                        stop.cancel();
                        return;
                    }
                    Err(e) => warn!(error = %e, "lost-ticket sweep failed; next pass retries"),
                }
            }
        }
        .instrument(span),
    )
}

struct Suspect {
    attempt: Unstarted,
    since: i64,
    results_mark: u64,
}

struct Sweep {
    store: Store,
    ctx: ShardContext,
    bell: OutboxBell,
    stream: Option<Stream<()>>,
    /// Attempts seen gone: when first seen so, and the last results-stream sequence of the
    /// shard's results then. Looked at again every pass, wherever the cursor is, until they are
    /// resent, held, started or finished.
    suspects: HashMap<(Uuid, u32), Suspect>,
    /// Where the next pass continues: attempts waiting for a worker must not hide later ones.
    cursor: Option<(i64, Uuid)>,
    resends: prometheus::IntCounter,
}

impl Sweep {
    fn new(store: Store, ctx: ShardContext, bell: OutboxBell) -> Sweep {
        let resends = metrics::TICKETS_RESENT_TOTAL.with_label_values(&[&ctx.shard.to_string()]);
        Sweep {
            store,
            ctx,
            bell,
            stream: None,
            suspects: HashMap::new(),
            cursor: None,
            resends,
        }
    }

    /// A quarter of `resend_after`: how often the sweep looks, and how long a gone attempt must
    /// stay gone before it is sent again.
    fn grace_period(&self) -> std::time::Duration {
        (self.ctx.config().resend_after / 4).max(std::time::Duration::from_millis(50))
    }

    async fn pass(&mut self) -> Result<(), StoreError> {
        let now = self.ctx.clock.now_ms();
        let grace = self.grace_period().as_millis() as i64;
        let before = now - self.ctx.config().resend_after.as_millis() as i64;
        let batch = self.store.unstarted(self.cursor, before, PER_PASS).await?;
        self.cursor = if batch.len() == PER_PASS as usize {
            batch.last().map(|u| (u.published_at, u.ticket))
        } else {
            None
        };
        let mut todo: Vec<Unstarted> = self.suspects.values().map(|s| s.attempt.clone()).collect();
        todo.extend(
            batch
                .into_iter()
                .filter(|u| !self.suspects.contains_key(&(u.ticket, u.attempt))),
        );
        // Asked once per pass, and only when something is to be resent or given up.
        let mut oldest_result = None;
        let mut rang = false;
        for u in todo {
            let key = (u.ticket, u.attempt);
            let presence = self.presence(&u).await;
            let since = self.suspects.get(&key).map(|s| s.since);
            match judge(presence, since, u.resends, now, grace) {
                Action::Wait if presence != Presence::Gone => {
                    self.suspects.remove(&key);
                }
                Action::Wait => {}
                Action::Suspect => {
                    // Asked after the ticket was seen gone: a result stored before is at or
                    // below this mark.
                    if let Ok(mark) = self.result_seq(Edge::Last).await {
                        self.suspects.insert(
                            key,
                            Suspect {
                                attempt: u,
                                since: now,
                                results_mark: mark.unwrap_or(0),
                            },
                        );
                    }
                }
                action @ (Action::Resend | Action::GiveUp) => {
                    if oldest_result.is_none() {
                        oldest_result = Some(self.result_seq(Edge::First).await);
                    }
                    let mark = self.suspects.get(&key).map_or(0, |s| s.results_mark);
                    let applied = match oldest_result {
                        Some(Ok(None)) => true,
                        Some(Ok(Some(oldest))) => oldest > mark,
                        _ => false,
                    };
                    if !applied {
                        // A result of this attempt may still be on its way: look again next pass.
                        continue;
                    }
                    let suspect = self.suspects.remove(&key);
                    if action == Action::Resend {
                        if self.store.resend(&u).await?.is_some() {
                            info!(ticket_id = %u.ticket, attempt = u.attempt, resends = u.resends + 1,
                                "ticket left the dispatch stream without being started; sending it again");
                            self.resends.inc();
                            rang = true;
                        }
                    } else if self.still_unstarted(&u).await? && !self.give_up(&u, now).await {
                        if let Some(s) = suspect {
                            self.suspects.insert(key, s);
                        }
                    }
                }
            }
        }
        if rang {
            self.bell.ring();
        }
        Ok(())
    }

    /// The sequence of the shard's first (oldest) or last result still in the results stream
    /// (None: none is, every stored result was applied); Err when the stream did not answer.
    async fn result_seq(&self, edge: Edge) -> Result<Option<u64>, ()> {
        let js = &self.ctx.cluster.js;
        let stream = js
            .get_stream_no_info(names::RESULT_STREAM)
            .await
            .map_err(|_| ())?;
        let subject = names::result_subject(self.ctx.shard);
        let found = match edge {
            Edge::First => stream.get_first_raw_message_by_subject(&subject, 1).await,
            Edge::Last => stream.get_last_raw_message_by_subject(&subject).await,
        };
        match found {
            Ok(m) => Ok(Some(m.sequence)),
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(_) => Err(()),
        }
    }

    /// Whether the attempt is still as the sweep read it: published then, not started, no result.
    async fn still_unstarted(&self, u: &Unstarted) -> Result<bool, StoreError> {
        Ok(self
            .store
            .open_attempt(u.ticket, u.attempt)
            .await?
            .is_some_and(|a| a.started_at.is_none() && a.published_at == Some(u.published_at)))
    }

    async fn presence(&mut self, u: &Unstarted) -> Presence {
        let Some(seq) = u.seq else {
            return Presence::Unknown;
        };
        if self.stream.is_none() {
            match self
                .ctx
                .cluster
                .js
                .get_stream_no_info(names::DISPATCH_STREAM)
                .await
            {
                Ok(s) => self.stream = Some(s),
                Err(_) => return Presence::Unknown,
            }
        }
        let stream = self.stream.as_ref().expect("set above");
        match stream.get_raw_message(seq).await {
            Ok(m) if super::dispatcher::carries(&m.headers, u.ticket, u.attempt) => Presence::Held,
            // The sequence holds another ticket (a recreated stream).
            Ok(_) => Presence::Gone,
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Presence::Gone,
            Err(_) => Presence::Unknown,
        }
    }

    /// Fails the attempt as lost the way a worker would report a failure, so the results path
    /// applies it once and the retry policy decides what follows. False if it could not be sent.
    async fn give_up(&self, u: &Unstarted, now: i64) -> bool {
        let reason = format!(
            "lost: the ticket left the dispatch stream {} times without being started",
            u.resends + 1
        );
        let mut result = TicketResult::about(
            u.ticket,
            u.attempt,
            self.ctx.shard,
            ResultKind::Failed,
            "sweep",
            from_millis(now),
        );
        result.error = Some(reason.clone());
        let msg = PublishMessage::build()
            .payload(Bytes::from(
                serde_json::to_vec(&result).expect("result serialises"),
            ))
            .message_id(result.dedup_id());
        let sent = publish_result(&self.ctx.cluster.js, self.ctx.shard, msg).await;
        match &sent {
            Ok(()) => warn!(ticket_id = %u.ticket, attempt = u.attempt, %reason, "attempt lost"),
            Err(e) => {
                warn!(ticket_id = %u.ticket, error = %e, "could not fail a lost attempt; next pass retries")
            }
        }
        sent.is_ok()
    }
}

async fn publish_result(
    js: &jetstream::Context,
    shard: u32,
    msg: PublishMessage,
) -> Result<(), String> {
    js.send_publish(names::result_subject(shard), msg)
        .await
        .map_err(|e| e.to_string())?
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: i64 = 1_000;

    #[test]
    fn held_or_unknown_attempts_are_left_alone() {
        for since in [None, Some(0)] {
            assert_eq!(judge(Presence::Held, since, 0, 10_000, GRACE), Action::Wait);
            assert_eq!(
                judge(Presence::Unknown, since, 0, 10_000, GRACE),
                Action::Wait
            );
        }
    }

    #[test]
    fn a_gone_attempt_is_resent_only_when_seen_gone_again_after_the_grace() {
        assert_eq!(
            judge(Presence::Gone, None, 0, 5_000, GRACE),
            Action::Suspect
        );
        assert_eq!(
            judge(Presence::Gone, Some(5_000), 0, 5_999, GRACE),
            Action::Wait
        );
        assert_eq!(
            judge(Presence::Gone, Some(5_000), 0, 6_000, GRACE),
            Action::Resend
        );
        assert_eq!(
            judge(Presence::Gone, Some(5_000), MAX_RESENDS - 1, 6_000, GRACE),
            Action::Resend
        );
    }

    #[test]
    fn an_attempt_lost_too_often_is_given_up() {
        assert_eq!(
            judge(Presence::Gone, Some(0), MAX_RESENDS, GRACE, GRACE),
            Action::GiveUp
        );
        assert_eq!(
            judge(Presence::Gone, None, MAX_RESENDS, GRACE, GRACE),
            Action::Suspect
        );
    }
}
