//! One delivery, start to ack: read the ticket, decide from the journal (and, for a
//! redelivery, the shard) whether to run it, run the handler with progress acks and its time
//! limit, journal and report the outcome, then acknowledge the delivery. A message that is not a
//! ticket is dead-lettered through its shard when its headers say which ticket it was, else
//! terminated; it never stops the worker.

use std::time::Duration;

use async_nats::jetstream::{AckKind, Message};
use chronoshard_telemetry::{metrics, traces};
use chronoshard_wire::{names, ResultKind, Ticket, TicketResult, PROTOCOL_VERSION};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use super::{
    delivery::{Claim, Delivery},
    redelivery::{self, Redelivered},
    Ctx,
};
use crate::{
    executor::Outcome,
    handler::{time_limit, Job, Registered},
    journal::Seen,
};

/// How long a handler told to stop (timeout, drain) may take to return before it is abandoned.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a delivery of an attempt another worker seems to be running still is handed back.
const ALIVE_BACKOFF: Duration = Duration::from_secs(5);
/// How long a final result is tried before the delivery is handed back.
const DELIVER_PATIENCE: Duration = Duration::from_secs(120);
/// A ticket whose job type this worker has no handler for goes back this long, this many
/// times (another worker of the queue may have one), before it fails permanently.
const NO_HANDLER_BACKOFF: Duration = Duration::from_secs(5);
const NO_HANDLER_DELIVERIES: i64 = 5;

/// What to do with a delivery.
enum Plan {
    Run,
    /// Send this outcome without running (journalled earlier, or judged from the shard).
    Report(Outcome),
    /// Acknowledge without running: the attempt is over.
    Skip,
    /// Give the delivery back for a while.
    HandBack(Duration),
}

/// Handles one delivery. Returns when the delivery is acknowledged, handed back, or (when the
/// attempt already runs here) passed to the task running it.
pub(super) async fn run_one(ctx: &Ctx, reg: &Registered, msg: Message) {
    let mut ticket = match read_ticket(&msg) {
        Ok(t) => t,
        Err(reason) => return malformed(ctx, msg, reason).await,
    };
    let span =
        tracing::info_span!("ticket", ticket_id = %ticket.ticket_id, attempt = ticket.attempt);
    let attempt = attempt_span(ctx, &ticket, &msg);
    let traced = attempt.clone();
    async {
        let msg = std::sync::Arc::new(msg);
        let Some(claim) = ctx.running.claim(&ticket, &msg) else {
            info!("delivered again while running here: the running task answers it");
            traces::end_attempt(&attempt, "running_here", None);
            let _ = msg.ack_with(AckKind::Progress).await;
            return;
        };
        drop(msg);
        let delivery = &claim.delivery;
        let mut unreported_start = None;
        let outcome = match plan(ctx, reg, &mut ticket, delivery).await {
            Plan::Run => {
                if let Err(e) = ctx.journal.start(&ticket) {
                    // Running a ticket the journal cannot record would break the promise not
                    // to run it twice; hand it back instead.
                    warn!(error = %e, "ticket journal unusable; delivery handed back");
                    traces::end_attempt(&attempt, "handed_back", Some("journal unusable"));
                    let _ = delivery
                        .current()
                        .ack_with(AckKind::Nak(Some(Duration::from_secs(5))))
                        .await;
                    return;
                }
                match execute(ctx, reg, &ticket, &claim, &attempt).await {
                    Some(ran) => {
                        unreported_start = ran.unreported_start;
                        ran.outcome
                    }
                    None => {
                        traces::end_attempt(&attempt, "released", None);
                        return release(ctx, &ticket, delivery).await;
                    }
                }
            }
            Plan::Report(o) => o,
            Plan::Skip => {
                traces::end_attempt(&attempt, "skipped", None);
                let _ = delivery.current().ack().await;
                return;
            }
            Plan::HandBack(after) => {
                traces::end_attempt(&attempt, "handed_back", None);
                let _ = delivery.current().ack_with(AckKind::Nak(Some(after))).await;
                return;
            }
        };
        let ended = if outcome.ok { "succeeded" } else { "failed" };
        traces::end_attempt(&attempt, ended, outcome.error.as_deref());
        if let Err(e) = ctx.journal.finish(&ticket, &outcome) {
            warn!(error = %e, "outcome not journalled");
        }
        if deliver(ctx, &ticket, &outcome, unreported_start, delivery).await {
            acknowledge(ctx, &ticket, delivery);
        }
    }
    .instrument(traced)
    .instrument(span)
    .await
}

/// The attempt's span (a no-op unless traces are exported), a child of the `publish` span the
/// message's `traceparent` names.
fn attempt_span(ctx: &Ctx, ticket: &Ticket, msg: &Message) -> tracing::Span {
    if !traces::exporting() {
        return tracing::Span::none();
    }
    let parent = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(names::TRACEPARENT))
        .map(|v| v.as_str());
    let delivered = msg.info().map_or(1, |i| i.delivered);
    traces::attempt_span(&ticket.into(), ctx.reporter.worker_id(), delivered, parent)
}

/// Decides from the journal, and for a redelivery the journal does not know from the shard.
async fn plan(ctx: &Ctx, reg: &Registered, ticket: &mut Ticket, delivery: &Delivery) -> Plan {
    let seen = ctx.journal.seen(ticket);
    if seen == Seen::New {
        if let Err(why) = reg.pick(ticket) {
            // Workers of a queue share its consumer; one being upgraded may lack a handler
            // that the others have.
            if delivery.delivered() < NO_HANDLER_DELIVERIES {
                info!(%why, "no handler here: handed back");
                return Plan::HandBack(NO_HANDLER_BACKOFF);
            }
            return Plan::Report(Outcome {
                permanent: true,
                ..Outcome::failed(why)
            });
        }
    }
    match seen {
        Seen::Interrupted => {
            not_run_again(ctx, "interrupted");
            Plan::Report(Outcome::failed(format!(
                "interrupted: worker {} stopped while running this attempt; it does not run \
                 an attempt twice",
                ctx.reporter.worker_id()
            )))
        }
        Seen::Finished(o) => {
            not_run_again(ctx, "finished");
            Plan::Report(o)
        }
        Seen::New if delivery.delivered() > 1 => {
            match redelivery::ask(&ctx.client, ticket, ctx.ack_wait).await {
                Redelivered::Run { checkpoint } => {
                    if checkpoint.is_some() {
                        ticket.checkpoint = checkpoint;
                    }
                    Plan::Run
                }
                Redelivered::Over => {
                    info!("delivery of an attempt that is over: not run");
                    Plan::Skip
                }
                Redelivered::Alive => {
                    info!("another worker seems to run this attempt still: handed back");
                    Plan::HandBack(ALIVE_BACKOFF)
                }
                Redelivered::Orphaned { worker } => {
                    not_run_again(ctx, "orphaned");
                    Plan::Report(Outcome::failed(format!(
                        "lost: worker {worker} stopped while running this attempt (delivered \
                         again to {})",
                        ctx.reporter.worker_id()
                    )))
                }
            }
        }
        Seen::New => Plan::Run,
    }
}

/// The worker stops and the handler was stopped unfinished: the shard is told the attempt is not
/// running any more, and the delivery goes back to JetStream for another worker. The NAK waits a
/// second so the shard has applied the release when the next worker asks about the delivery.
async fn release(ctx: &Ctx, ticket: &Ticket, delivery: &Delivery) {
    let _ = ctx.journal.release(ticket);
    let msg = delivery.current();
    let mut r = ctx.reporter.result(ticket, ResultKind::Released);
    r.delivery = msg.info().ok().map(|i| i.delivered as u64);
    if let Err(e) = ctx.reporter.store(&r).await {
        warn!(error = %e, "release not reported; the next worker will report this attempt lost");
    }
    let _ = msg
        .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
        .await;
}

/// Stores the final result, retrying with a growing pause while keeping the delivery alive.
/// Gives up (false) after `DELIVER_PATIENCE`, or `STOP_GRACE` after the drain grace ran out:
/// the journal keeps the outcome, so whoever gets the delivery again here sends it instead of
/// running the work, and a restart sends it too.
async fn deliver(
    ctx: &Ctx,
    ticket: &Ticket,
    outcome: &Outcome,
    unreported_start: Option<chrono::DateTime<chrono::Utc>>,
    delivery: &Delivery,
) -> bool {
    let mut r = ctx
        .reporter
        .final_report(ticket.ticket_id, ticket.attempt, ticket.shard, outcome);
    r.started_at = unreported_start;
    let give_up = tokio::time::sleep(DELIVER_PATIENCE);
    tokio::pin!(give_up);
    // After the drain grace: a little longer, then stop.
    let stopping = async {
        ctx.hard_stop.cancelled().await;
        tokio::time::sleep(STOP_GRACE).await;
    };
    tokio::pin!(stopping);
    let mut pause = Duration::from_millis(200);
    let mut beat = tokio::time::interval(ctx.beat);
    beat.reset();
    loop {
        let (report, wait) = (&r, pause);
        let attempt = async move {
            if let Err(e) = ctx.reporter.store(report).await {
                warn!(error = %e, "result not stored yet; trying again");
                tokio::time::sleep(wait).await;
                return false;
            }
            true
        };
        tokio::pin!(attempt);
        let stored = loop {
            tokio::select! {
                ok = &mut attempt => break ok,
                _ = beat.tick() => { let _ = delivery.current().ack_with(AckKind::Progress).await; }
                _ = &mut give_up => {
                    warn!("result not stored for {DELIVER_PATIENCE:?}: delivery handed back");
                    let _ = delivery.current().ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                    return false;
                }
                _ = &mut stopping => return false,
            }
        };
        if stored {
            return true;
        }
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// Acknowledges the delivery of a reported attempt; once the server confirmed the ack, the
/// journal forgets the attempt (`acked`). An ack that may be lost leaves the outcome journalled,
/// so a redelivery here sends it again rather than running the work.
fn acknowledge(ctx: &Ctx, ticket: &Ticket, delivery: &Delivery) {
    ctx.acked
        .ack(ticket.ticket_id, ticket.attempt, delivery.current());
}

fn not_run_again(ctx: &Ctx, seen: &str) {
    info!(
        seen,
        "delivery of an attempt this worker will not run again"
    );
    metrics::NOT_RUN_AGAIN_TOTAL
        .with_label_values(&[ctx.queue.as_str(), seen])
        .inc();
}

fn read_ticket(msg: &Message) -> Result<Ticket, String> {
    let t: Ticket = serde_json::from_slice(&msg.payload).map_err(|e| e.to_string())?;
    if t.v > PROTOCOL_VERSION {
        return Err(format!(
            "protocol version {} is newer than this worker's {PROTOCOL_VERSION}",
            t.v
        ));
    }
    Ok(t)
}

/// An execution's end.
struct Ran {
    outcome: Outcome,
    /// When it started, if that was not reported on its own: the final result carries it.
    unreported_start: Option<chrono::DateTime<chrono::Utc>>,
}

/// Runs the handler: reports `started` once it has run for the start-report delay, acks
/// progress (and reports it) every beat, stops it at its time limit. `None` when the worker's
/// drain grace ran out first and the handler did not finish within the stop grace.
async fn execute(
    ctx: &Ctx,
    reg: &Registered,
    ticket: &Ticket,
    claim: &Claim,
    attempt: &tracing::Span,
) -> Option<Ran> {
    let delivery = &claim.delivery;
    let handler = match reg.pick(ticket) {
        Ok(h) => h,
        // `plan` checked; a handler cannot disappear in between.
        Err(why) => {
            return Some(Ran {
                outcome: Outcome::failed(why),
                unreported_start: None,
            })
        }
    };
    let started = chrono::Utc::now();
    let late = (started - ticket.scheduled_at)
        .num_microseconds()
        .unwrap_or(0)
        .max(0) as f64
        / 1e6;
    metrics::START_LATENESS_SECONDS
        .with_label_values(&[&ctx.queue])
        .observe(late);
    // Built only when sent: most executions end before the delay. It goes before any progress
    // report, and before the handler runs when there is no delay. Not awaited: the final result
    // follows on the same connection and subject, so it cannot overtake it.
    let mut start_unreported = true;
    let report_start = |unreported: &mut bool| {
        let send = std::mem::take(unreported);
        async move {
            if send {
                let mut r = TicketResult::new(
                    ticket,
                    ResultKind::Started,
                    ctx.reporter.worker_id(),
                    started,
                );
                r.delivery = Some(delivery.delivered() as u64);
                let _ = ctx.reporter.send(&r).await;
            }
        }
    };
    if ctx.start_report_delay.is_zero() {
        report_start(&mut start_unreported).await;
    }
    let start_delay = tokio::time::sleep(ctx.start_report_delay);
    tokio::pin!(start_delay);

    // The claim's token: a shard's cancel (overlap `replace`) fires it too.
    let cancel = claim.cancelled.clone();
    let job = Job::new(ticket.clone(), cancel.clone(), ctx.reporter.clone());
    // Its own task (the call too, so a handler that panics before returning its future is
    // caught as well): a panic is a failed attempt, not a dead worker.
    // In the attempt's span, so an executor's call names it as its parent.
    let mut task = tokio::spawn(async move { handler.call(job).await }.instrument(attempt.clone()));
    let limit = tokio::time::sleep(time_limit(ticket));
    tokio::pin!(limit);
    let mut beat = tokio::time::interval(ctx.beat);
    beat.reset();
    let timer = std::time::Instant::now();
    let outcome = loop {
        tokio::select! {
            done = &mut task => break joined(done),
            _ = &mut limit => {
                let timed_out = Outcome::failed(format!("timed out after {} ms", ticket.timeout_ms));
                break stop(&mut task, &cancel, timed_out).await;
            }
            _ = cancel.cancelled() => {
                let replaced = Outcome::failed("cancelled: replaced by a newer occurrence");
                break stop(&mut task, &cancel, replaced).await;
            }
            _ = ctx.hard_stop.cancelled() => {
                // Unfinished: released for another worker, unless it finished well meanwhile.
                let own = stop(&mut task, &cancel, Outcome::failed("stopped")).await;
                if own.ok {
                    break own;
                }
                return None;
            }
            _ = &mut start_delay, if start_unreported => report_start(&mut start_unreported).await,
            _ = beat.tick() => {
                report_start(&mut start_unreported).await;
                let _ = delivery.current().ack_with(AckKind::Progress).await;
                // Not awaited: a lost progress report only shortens the watchdog's patience.
                let _ = ctx.reporter.send(&ctx.reporter.progress(ticket)).await;
            }
        }
    };
    metrics::EXECUTION_SECONDS
        .with_label_values(&[&ctx.queue])
        .observe(timer.elapsed().as_secs_f64());
    metrics::EXECUTIONS_TOTAL
        .with_label_values(&[
            ctx.queue.as_str(),
            if outcome.ok { "succeeded" } else { "failed" },
        ])
        .inc();
    Some(Ran {
        outcome,
        unreported_start: start_unreported.then_some(started),
    })
}

/// Tells the handler to stop and waits up to `STOP_GRACE` for it; `instead` is the outcome
/// unless it finished well meanwhile.
async fn stop(
    task: &mut tokio::task::JoinHandle<Outcome>,
    cancel: &CancellationToken,
    instead: Outcome,
) -> Outcome {
    cancel.cancel();
    let stopped = tokio::time::timeout(STOP_GRACE, &mut *task).await;
    task.abort();
    match stopped {
        // Finished as it was told to stop: that outcome counts.
        Ok(Ok(own)) if own.ok => own,
        // An executor that stopped itself on the token may say more (its output).
        Ok(Ok(own)) => Outcome {
            output: own.output,
            ..instead
        },
        _ => instead,
    }
}

fn joined(done: Result<Outcome, tokio::task::JoinError>) -> Outcome {
    match done {
        Ok(o) => o,
        Err(e) if e.is_panic() => {
            let p = e.into_panic();
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text payload".into());
            Outcome::failed(format!("handler panicked: {what}"))
        }
        Err(e) => Outcome::failed(format!("handler stopped: {e}")),
    }
}

/// A message that is not a readable ticket. Retrying it cannot help, so when its headers name
/// the ticket, attempt and shard it is failed permanently (the shard dead-letters it with the
/// reason); otherwise nothing can record it and it is terminated. Counted either way.
async fn malformed(ctx: &Ctx, msg: Message, reason: String) {
    let header = |name: &str| {
        msg.headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    };
    let named = (|| {
        Some((
            header(names::HDR_TICKET_ID)?.parse().ok()?,
            header(names::HDR_ATTEMPT)?.parse().ok()?,
            header(names::HDR_SHARD)?.parse().ok()?,
        ))
    })();
    let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
    let error = format!("malformed ticket: {reason}");
    if let Some((ticket_id, attempt, shard)) = named {
        let mut r = TicketResult::about(
            ticket_id,
            attempt,
            shard,
            ResultKind::Failed,
            ctx.reporter.worker_id(),
            chrono::Utc::now(),
        );
        r.error = Some(error);
        r.permanent = true;
        match ctx.reporter.store_retrying(&r).await {
            Ok(()) => {
                warn!(%ticket_id, attempt, shard, seq, %reason, "malformed ticket dead-lettered");
                metrics::MALFORMED_TICKETS_TOTAL
                    .with_label_values(&[ctx.queue.as_str(), "dead_lettered"])
                    .inc();
                let _ = msg.ack_with(AckKind::Term).await;
            }
            Err(e) => {
                warn!(error = %e, "malformed ticket: result not stored; delivery handed back");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
            }
        }
        return;
    }
    warn!(subject = %msg.subject, seq, %reason, "malformed message terminated: no ticket headers");
    metrics::MALFORMED_TICKETS_TOTAL
        .with_label_values(&[ctx.queue.as_str(), "terminated"])
        .inc();
    let _ = msg.ack_with(AckKind::Term).await;
}
