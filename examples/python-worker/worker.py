#!/usr/bin/env python3
"""A chronoshard worker in Python, written from docs/protocol.md alone.

    python3 worker.py --nats nats://127.0.0.1:4222 --queue py [--worker-id ID] [--concurrency N]

It takes tickets from the queue named by a job target `{"type": "queue", "queue": "py"}`, runs a
demo handler on each, and reports back. Section names in the comments ("Taking tickets",
"Reporting", ...) are the headings of docs/protocol.md (executor protocol, version 1).

Demo handler, driven by the job's payload:
  {"sleep_ms": N}            sleep N ms (progress reports are sent while it runs)
  {"fail": "msg"}            fail the attempt with error "msg" (after sleeping, if both are given);
                             with "permanent": true as well, a permanent failure (no retry)
  {"checkpoint_demo": true}  the first attempt records checkpoint {"step": 1} and fails with
                             "interrupted at step 1"; the next one resumes from it and succeeds
  anything else              succeed
The ticket's `timeout_ms` is enforced: a run longer than that is reported `failed` ("timed out").
"""

import argparse
import asyncio
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping, Optional

import nats
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig

log = logging.getLogger("py-worker")

# --- "Streams and subjects" ------------------------------------------------------------------
DISPATCH_STREAM = "CHRONOSHARD_DISPATCH"
RESULTS_STREAM = "CHRONOSHARD_RESULTS"
PROTOCOL_VERSION = 1


def dispatch_subject(queue: str) -> str:
    return f"chronoshard.dispatch.{queue}"


def results_subject(shard: int) -> str:
    return f"chronoshard.results.{shard}"


def shard_rpc_subject(shard: int) -> str:  # "Redeliveries": where a shard answers questions
    return f"chronoshard.shard.{shard}.rpc"


# Headers of a dispatch message ("Taking tickets"): the same values as the body's, so that a
# message whose body cannot be read can still be reported on ("Delivery semantics").
HDR_TICKET_ID = "Chronoshard-Ticket-Id"
HDR_ATTEMPT = "Chronoshard-Attempt"
HDR_SHARD = "Chronoshard-Shard"


# --- "Taking tickets": the shared durable pull consumer ----------------------------------------
DEFAULT_ACK_WAIT_S = 30.0
DEFAULT_MAX_ACK_PENDING = 10000
STREAM_NOT_FOUND = 10059  # JetStream API error code


async def ensure_consumer(js, queue: str):
    """Return the info of `worker-<queue>`, creating it if missing (all workers of a queue share
    it). Waits while the dispatch stream does not exist yet (the platform creates it)."""
    name = f"worker-{queue}"
    while True:
        try:
            info = await js.consumer_info(DISPATCH_STREAM, name)
            if info.config.filter_subject != dispatch_subject(queue):
                log.warning("consumer %s filters %r, not %r", name,
                            info.config.filter_subject, dispatch_subject(queue))
            return info
        except nats.js.errors.NotFoundError as e:
            if e.err_code == STREAM_NOT_FOUND:
                log.info("stream %s does not exist yet; waiting for the platform", DISPATCH_STREAM)
                await asyncio.sleep(2)
                continue
        try:
            config = ConsumerConfig(
                name=name, durable_name=name, filter_subject=dispatch_subject(queue),
                ack_policy=AckPolicy.EXPLICIT, ack_wait=DEFAULT_ACK_WAIT_S,
                max_ack_pending=DEFAULT_MAX_ACK_PENDING)
            info = await js.add_consumer(DISPATCH_STREAM, config=config)
            log.info("created consumer %s on %s", name, DISPATCH_STREAM)
            return info
        except nats.js.errors.APIError as e:  # lost a creation race, or the stream vanished
            log.info("creating consumer %s: %s; retrying", name, e)
            await asyncio.sleep(1)


# --- "Taking tickets": the dispatch message body ------------------------------------------------
class Malformed(Exception):
    """The body cannot be used (not JSON, a required field missing or of the wrong type, or a `v`
    newer than this worker knows): it is reported and terminated ("Delivery semantics")."""


@dataclass
class AttemptRef:
    """What a report needs to name an attempt ("Reporting")."""
    ticket_id: str        # idempotency key: the same for every attempt of an occurrence item
    attempt: int          # counts from 1
    shard: int            # results go to chronoshard.results.<shard>


@dataclass
class Ticket(AttemptRef):
    job_id: Optional[str]
    payload: Any          # absent when the job has none
    timeout_ms: Optional[int]
    checkpoint: Any       # "Checkpoints": what an earlier attempt recorded; None on a first attempt
    raw: dict             # the whole body; unknown fields are ignored


def parse_ticket(data: bytes) -> Ticket:
    try:
        body = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Malformed(f"not JSON: {e}") from e
    if not isinstance(body, dict):
        raise Malformed("body is not a JSON object")
    v = body.get("v")
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise Malformed(f"no valid protocol version `v`: {v!r}")
    if v > PROTOCOL_VERSION:  # "or whose `v` is newer than the worker knows"
        raise Malformed(f"protocol version {v} is newer than this worker's ({PROTOCOL_VERSION})")

    def field(name, kind, required=True):
        value = body.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise Malformed(f"field {name!r} missing or not {kind.__name__}: {value!r}")
        return value

    return Ticket(ticket_id=field("ticket_id", str), attempt=field("attempt", int),
                  shard=field("shard", int), job_id=field("job_id", str, required=False),
                  payload=body.get("payload"),
                  timeout_ms=field("timeout_ms", int, required=False),
                  checkpoint=body.get("checkpoint"), raw=body)


def attempt_from_headers(headers: Optional[Mapping[str, str]]) -> Optional[AttemptRef]:
    """The attempt a dispatch message's headers name, or None when they cannot be read."""
    by_name = {k.lower(): v for k, v in (headers or {}).items()}
    try:
        ticket_id = by_name[HDR_TICKET_ID.lower()].strip()
        attempt = int(by_name[HDR_ATTEMPT.lower()].strip())
        shard = int(by_name[HDR_SHARD.lower()].strip())
    except (KeyError, ValueError, AttributeError):
        return None
    if not ticket_id or attempt < 1 or shard < 0:
        return None
    return AttemptRef(ticket_id=ticket_id, attempt=attempt, shard=shard)


# --- The demo handler ---------------------------------------------------------------------------
class HandlerFailed(Exception):
    """The attempt failed; the retry policy decides what comes next."""


class PermanentFailure(HandlerFailed):
    """Retrying cannot help: reported with `permanent: true`, so the ticket is a dead letter at
    once ("Reporting")."""


class Job:
    """What a handler sees of a ticket, and how it records a checkpoint."""

    def __init__(self, ticket: Ticket, reporter: "Reporter", msg):
        self.ticket = ticket
        self.payload = ticket.payload
        self.checkpoint = ticket.checkpoint  # None on a first attempt ("Checkpoints")
        self._reporter = reporter
        self._msg = msg

    async def save_checkpoint(self, checkpoint: Any) -> None:
        """See "Checkpoints": a `progress` report with a `checkpoint`, stored once JetStream acked
        it. This waits for that ack (and raises if it never comes, failing the attempt)."""
        if not await self._reporter.report_until_stored(self.ticket, "progress", self._msg,
                                                        tries=3, checkpoint=checkpoint):
            raise HandlerFailed("checkpoint not stored: the results stream did not acknowledge it")


async def handle(job: Job) -> Optional[str]:
    """Return to succeed (a returned text becomes the attempt's `output`); raise to fail (the
    exception's text becomes the report's `error`; PermanentFailure to not be retried)."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    if payload.get("checkpoint_demo") is True:
        return await checkpoint_demo(job)
    sleep_ms = payload.get("sleep_ms")
    if isinstance(sleep_ms, (int, float)) and not isinstance(sleep_ms, bool) and sleep_ms > 0:
        await asyncio.sleep(sleep_ms / 1000)
    if "fail" in payload:
        failure = PermanentFailure if payload.get("permanent") is True else HandlerFailed
        raise failure(str(payload["fail"]))
    return None


async def checkpoint_demo(job: Job) -> str:
    """A job of two steps. The first attempt does step 1, records it and is "interrupted"; the
    next attempt finds the checkpoint in its ticket and goes on from there."""
    done = job.checkpoint.get("step", 0) if isinstance(job.checkpoint, dict) else 0
    if done < 1:
        await job.save_checkpoint({"step": 1})
        raise HandlerFailed("interrupted at step 1")
    line = f"resumed at step {done + 1} from checkpoint {json.dumps(job.checkpoint)}"
    log.info("%s#%d %s", job.ticket.ticket_id, job.ticket.attempt, line)
    return line + "\n"


MAX_ERROR = 2048         # characters of an exception's text sent as `error`
MAX_OUTPUT = 64 * 1024   # characters of a handler's text sent as `output` (the shell's default)


@dataclass
class Outcome:
    error: Optional[str] = None   # None: succeeded
    permanent: bool = False
    output: Optional[str] = None


async def run_with_timeout(job: Job) -> Outcome:
    """Run the handler under the ticket's `timeout_ms`, where a shard's cancel can stop it
    ("Questions about an attempt")."""
    ms = job.ticket.timeout_ms
    timeout = ms / 1000 if ms and ms > 0 else None
    key = (job.ticket.ticket_id, job.ticket.attempt)
    task = asyncio.ensure_future(handle(job))
    RUNNING[key] = task
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    finally:
        RUNNING.pop(key, None)
    if not done:  # "Report `failed` with an error starting `timed out` when `timeout_ms` passes"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return Outcome(error=f"timed out after {ms} ms")
    if task.cancelled():  # the shard cancelled it: its run was replaced (overlap `replace`)
        return Outcome(error="cancelled: replaced by a newer occurrence")
    exc = task.exception()
    if exc is None:
        output = task.result()
        return Outcome(output=output[:MAX_OUTPUT] if isinstance(output, str) else None)
    # "Reporting": keep `error` short (it is shown in run lists).
    return Outcome(error=(str(exc) or type(exc).__name__)[:MAX_ERROR],
                   permanent=isinstance(exc, PermanentFailure))


# --- "Questions about an attempt": the watchdog's probe and overlap `replace`'s cancel ----------
RUNNING: dict = {}  # (ticket_id, attempt) -> the task running its handler


def attempts_subject(worker_id: str) -> str:
    return f"chronoshard.workers.{worker_id}.attempts"


async def answer_attempt_requests(nc, worker_id: str):
    """Answer `probe` with whether the attempt runs here; on `cancel` stop its handler first.
    (This worker reports an attempt before it forgets it, so it never answers `finished`.)"""
    async def on_request(msg):
        try:
            req = json.loads(msg.data)
            key = (str(req["ticket_id"]), int(req["attempt"]))
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable attempt request ignored")
            return
        task = RUNNING.get(key)
        if req.get("op") == "cancel" and task is not None:
            log.info("%s#%d cancelled by its shard: %s", key[0], key[1], req.get("reason"))
            task.cancel()
        state = "running" if task is not None else "unknown"
        await msg.respond(json.dumps({"worker_id": worker_id, "state": state}).encode())

    return await nc.subscribe(attempts_subject(worker_id), cb=on_request)


# --- "Reporting" -------------------------------------------------------------------------------
def rfc3339(unix_ms: int) -> str:
    """A report's `at`: RFC 3339 UTC with milliseconds."""
    at = datetime.fromtimestamp(unix_ms / 1000, timezone.utc)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Reporter:
    def __init__(self, nc, js, worker_id: str):
        self.nc = nc
        self.js = js
        self.worker_id = worker_id
        self.last_progress_ms = 0

    async def report(self, ref: AttemptRef, kind: str, **extra) -> None:
        """Publish one report and wait for JetStream's ack (raises if it does not come)."""
        at_ms = int(time.time() * 1000)
        if kind == "progress":
            # "Checkpoints": each progress report needs a later `at` than the one before, or its
            # Nats-Msg-Id repeats and JetStream drops it (and a checkpoint with it).
            at_ms = max(at_ms, self.last_progress_ms + 1)
            self.last_progress_ms = at_ms
        body = {"v": PROTOCOL_VERSION, "ticket_id": ref.ticket_id, "attempt": ref.attempt,
                "shard": ref.shard, "kind": kind, "worker": self.worker_id, "at": rfc3339(at_ms)}
        body.update({k: v for k, v in extra.items() if v is not None})
        # Nats-Msg-Id: <ticket_id>:<attempt>:<Kind>, and for the repeating kinds a suffix: the
        # delivery count for `started` and `released`, `at` in Unix ms for `progress`.
        msg_id = f"{ref.ticket_id}:{ref.attempt}:{kind.capitalize()}"
        if kind in ("started", "released"):
            msg_id += f":{extra['delivery']}"
        elif kind == "progress":
            msg_id += f":{at_ms}"
        await self.js.publish(results_subject(ref.shard), json.dumps(body).encode(),
                              headers={"Nats-Msg-Id": msg_id}, stream=RESULTS_STREAM, timeout=5)

    async def report_until_stored(self, ref: AttemptRef, kind: str, msg, tries=8, **extra) -> bool:
        """Retry a report until JetStream acks it, keeping the delivery alive meanwhile."""
        delay = 0.5
        for n in range(1, tries + 1):
            try:
                await self.report(ref, kind, **extra)
                return True
            except Exception as e:  # timeouts, no responders, disconnections
                log.warning("%s %s report not stored (try %d/%d): %r",
                            ref.ticket_id, kind, n, tries, e)
                try:
                    await msg.in_progress()
                except Exception:
                    pass
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5)
        return False


# --- One ticket, start to finish: "Reporting" + "Delivery semantics" ----------------------------
async def keep_alive(msg, ticket: Ticket, reporter: Reporter, interval: float) -> None:
    """Every `interval` (ack_wait / 3, at most 20 s): a progress ack (+WPI) and a `progress`
    report (a sign of life for the shard's watchdog, see "Timeouts and lost attempts")."""
    while True:
        await asyncio.sleep(interval)
        try:
            await msg.in_progress()
            await reporter.report(ticket, "progress")
        except Exception as e:  # best effort: the next beat tries again
            log.warning("%s progress not sent: %r", ticket.ticket_id, e)


async def reject_malformed(msg, reporter: Reporter, problem: Malformed) -> None:
    """See "Delivery semantics": a message whose body cannot be used is reported `failed` with
    `permanent: true` and an error starting `malformed ticket:` when its headers name the attempt
    (the shard dead-letters the ticket; a replay sends it again), then terminated (+TERM). Without
    those headers nothing can record it: it is only terminated and logged."""
    msg_id = msg.headers.get("Nats-Msg-Id") if msg.headers else None
    ref = attempt_from_headers(msg.headers)
    if ref is None:
        log.error("terminating a malformed dispatch message that names no ticket (%s): %s",
                  msg_id, problem)
        await msg.term()
        return
    tag = f"{ref.ticket_id}#{ref.attempt}"
    error = f"malformed ticket: {problem}"
    if not await reporter.report_until_stored(ref, "failed", msg, error=error, permanent=True):
        log.error("%s malformed, and its report was never stored; NAK to report it again", tag)
        await msg.nak()
        return
    await msg.term()
    log.error("%s %s; reported failed (permanent) and terminated", tag, error)


async def already_handled(msg, ticket: Ticket, reporter: Reporter, delivery: int,
                          ack_wait_s: float) -> bool:
    """See "Redeliveries (recommended)": a delivery that is not the first may be of an attempt
    that is over, or that a worker started and died running. Ask the shard that owns the ticket.
    True when this delivery was dealt with (acked, maybe after reporting it `lost:`): do not run.
    """
    if delivery <= 1:
        return False
    request = json.dumps({"op": "get_ticket", "ticket_id": ticket.ticket_id}).encode()
    try:
        answer = json.loads((await reporter.nc.request(
            shard_rpc_subject(ticket.shard), request, timeout=2)).data)
        attempts = answer["ticket"]["attempts"] if answer.get("reply") == "ticket" else None
    except Exception as e:  # no answer within 2 s, or not the answer we know: run it
        log.info("%s#%d redelivered, shard not asked (%r); running it",
                 ticket.ticket_id, ticket.attempt, e)
        return False
    if not isinstance(attempts, list):
        return False
    tag = f"{ticket.ticket_id}#{ticket.attempt}"
    this = next((a for a in attempts if isinstance(a, dict)
                 and a.get("attempt") == ticket.attempt), {})
    later = any(isinstance(a, dict) and isinstance(a.get("attempt"), int)
                and a["attempt"] > ticket.attempt for a in attempts)
    if this.get("finished_at") or later:
        log.info("%s redelivered (delivery %d) but already over; ack without running", tag,
                 delivery)
    elif this.get("started_at") and this.get("worker") and seen_lately(this, ack_wait_s / 2):
        log.info("%s redelivered, but %s showed life lately: handed back for 5 s", tag,
                 this["worker"])
        await msg.nak(delay=5)
        return True
    elif this.get("started_at") and this.get("worker"):
        error = f"lost: worker {this['worker']} stopped while running this attempt"
        if not await reporter.report_until_stored(ticket, "failed", msg, error=error):
            log.error("%s lost, and its report was never stored; NAK to report it again", tag)
            await msg.nak()
            return True
        log.info("%s redelivered (delivery %d): %s; reported failed", tag, delivery, error)
    else:
        return False  # never started (or released): run it
    try:
        await msg.ack_sync(timeout=5)
    except Exception as e:  # it comes back, and the shard gives the same answer
        log.warning("%s ack not confirmed: %r", tag, e)
    return True


def seen_lately(attempt: dict, within_s: float) -> bool:
    """The attempt's last sign of life (`started_at` or `progress_at`, the shard's clock) is
    less than `within_s` old."""
    times = []
    for field in ("started_at", "progress_at"):
        try:
            times.append(datetime.fromisoformat(attempt[field].replace("Z", "+00:00")))
        except (KeyError, AttributeError, ValueError):
            pass
    return bool(times) and (datetime.now(timezone.utc) - max(times)).total_seconds() < within_s


async def process(msg, reporter: Reporter, beat_s: float, ack_wait_s: float) -> None:
    try:
        ticket = parse_ticket(msg.data)
    except Malformed as e:
        await reject_malformed(msg, reporter, e)
        return
    delivery = msg.metadata.num_delivered
    tag = f"{ticket.ticket_id}#{ticket.attempt}"
    if await already_handled(msg, ticket, reporter, delivery, ack_wait_s):
        return

    # 1. `started` before running, with the delivery count ("Tickets lost before they start").
    if not await reporter.report_until_stored(ticket, "started", msg, tries=3, delivery=delivery):
        await msg.nak()  # not started: let another worker (or a later try) have it
        return
    log.info("%s started (delivery %d, job %s%s)", tag, delivery, ticket.job_id,
             f", checkpoint {json.dumps(ticket.checkpoint)}" if ticket.checkpoint is not None
             else "")

    # 2. Run, with progress ack + progress report every ack_wait/3.
    beat = asyncio.ensure_future(keep_alive(msg, ticket, reporter, beat_s))
    try:
        outcome = await run_with_timeout(Job(ticket, reporter, msg))
    except asyncio.CancelledError:  # shutdown grace period ran out (see main)
        await release(msg, ticket, reporter, delivery)
        raise
    finally:
        beat.cancel()
        await asyncio.gather(beat, return_exceptions=True)

    # 3. Final result; ack the dispatch message only once JetStream acked the result
    #    ("Delivery semantics"). If it is never stored, NAK: the ticket comes back and is reported
    #    again ("Reporting").
    error = outcome.error
    kind = "succeeded" if error is None else "failed"
    if not await reporter.report_until_stored(ticket, kind, msg, error=error,
                                              permanent=outcome.permanent or None,
                                              output=outcome.output):
        log.error("%s %s report never stored; NAK so it is reported again", tag, kind)
        await msg.nak()
        return
    try:
        await msg.ack_sync(timeout=5)
    except Exception as e:
        log.warning("%s ack not confirmed (%r); a redelivery would be a duplicate", tag, e)
    log.info("%s %s%s%s", tag, kind, f": {error}" if error else "",
             " (permanent)" if outcome.permanent else "")


async def release(msg, ticket: Ticket, reporter: Reporter, delivery: int) -> None:
    """See "Reporting", kind `released`: an attempt stopped unfinished (the drain's grace ran out)
    counts as not started again, so the next worker runs it. Report it (waiting for the ack),
    then NAK with a delay of a second, so the shard has applied the report by then."""
    tag = f"{ticket.ticket_id}#{ticket.attempt}"
    try:
        await reporter.report(ticket, "released", delivery=delivery)
        log.warning("%s stopped unfinished at shutdown: released, NAK so another worker runs it",
                    tag)
    except Exception as e:  # NAK anyway: the next worker then finds it started by us, "lost:"
        log.warning("%s stopped unfinished at shutdown; release not stored (%r); NAK", tag, e)
    try:
        await msg.nak(delay=1)
    except Exception as e:  # it comes back after ack_wait anyway
        log.warning("%s NAK failed: %r", tag, e)


async def process_logged(msg, reporter: Reporter, beat_s: float, ack_wait_s: float) -> None:
    try:
        await process(msg, reporter, beat_s, ack_wait_s)
    except asyncio.CancelledError:
        raise
    except Exception:  # a bug or a lost connection: the delivery comes back after ack_wait
        log.exception("ticket processing failed")


# --- Clean stop: "A worker stopping cleanly should NAK messages it fetched but did not start" -----
async def nak_unstarted(msg) -> None:
    log.info("stopping: NAK %s", msg.headers.get("Nats-Msg-Id") if msg.headers else "?")
    try:
        await msg.nak()
    except Exception as e:  # it comes back after ack_wait anyway
        log.warning("NAK failed: %r", e)


async def nak_late_deliveries(psub) -> None:
    """A ticket the server sent just as a fetch timed out sits in the subscription unseen;
    without this it would stay with us until ack_wait. fetch(1) takes it from the local queue."""
    await asyncio.sleep(0.2)
    while psub.pending_msgs > 0:
        try:
            msgs = await psub.fetch(1, timeout=0.5)
        except Exception:  # only status messages were left
            break
        for msg in msgs:
            await nak_unstarted(msg)


# --- Main loop: fetch only what can be started; clean stop on SIGTERM/SIGINT --------------------
async def main(args) -> int:
    nc = await nats.connect(args.nats, name=f"chronoshard-py-worker {args.worker_id}",
                            max_reconnect_attempts=-1)
    js = nc.jetstream()
    info = await ensure_consumer(js, args.queue)
    ack_wait = info.config.ack_wait or DEFAULT_ACK_WAIT_S
    psub = await js.pull_subscribe_bind(durable=info.name, stream=DISPATCH_STREAM)
    reporter = Reporter(nc, js, args.worker_id)
    questions = await answer_attempt_requests(nc, args.worker_id)
    # "Reporting": progress every ack_wait / 3 (the consumer's actual ack_wait), and never less
    # often than every 20 s (the watchdog looks for a sign of life in the last 60 s).
    beat_s = min(ack_wait / 3, 20.0)
    log.info("worker %s on queue %r (consumer %s, ack_wait %.0fs, concurrency %d)",
             args.worker_id, args.queue, info.name, ack_wait, args.concurrency)

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)

    inflight: set = set()
    while not stopping.is_set():
        free = args.concurrency - len(inflight)
        if free <= 0:  # wait for a slot (or the stop signal) before asking for more
            stop_wait = asyncio.ensure_future(stopping.wait())
            await asyncio.wait(inflight | {stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            stop_wait.cancel()
            continue
        try:
            # A short wait, so that a stop signal is seen within a second (a fetch in flight is
            # not cancelled: what it brought would sit unacked until ack_wait).
            msgs = await psub.fetch(batch=free, timeout=1)
        except asyncio.TimeoutError:  # nothing to do (nats-py's TimeoutError is a subclass)
            continue
        except Exception as e:  # disconnected, etc.: nats-py reconnects on its own
            log.warning("fetch failed: %r", e)
            await asyncio.sleep(1)
            continue
        for msg in msgs:
            if stopping.is_set():  # fetched but not started: give it back at once
                await nak_unstarted(msg)
                continue
            task = asyncio.ensure_future(process_logged(msg, reporter, beat_s, ack_wait))
            inflight.add(task)
            task.add_done_callback(inflight.discard)

    await nak_late_deliveries(psub)
    log.info("stopping: waiting up to %ss for %d running ticket(s)", args.grace, len(inflight))
    if inflight:
        _, pending = await asyncio.wait(set(inflight), timeout=args.grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    await psub.unsubscribe()
    await questions.unsubscribe()
    await nc.drain()
    log.info("stopped")
    return 0


ID_PATTERN = r"[A-Za-z0-9_-]{1,64}"  # queue names and worker ids


def default_worker_id() -> str:
    """py-<host>-<pid>, with what a worker id may not hold (dots, say) made dashes."""
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())
    pid = f"-{os.getpid()}"
    return f"py-{host}"[:64 - len(pid)] + pid


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS server URL")
    p.add_argument("--queue", required=True, help="queue of the job targets to serve")
    p.add_argument("--worker-id", default=default_worker_id(),
                   help="the `worker` field of reports (1-64 characters of A-Z a-z 0-9 _ -)")
    p.add_argument("--concurrency", type=int, default=4, help="tickets run at once")
    p.add_argument("--grace", type=float, default=25.0,
                   help="seconds to let running tickets finish after SIGTERM/SIGINT")
    args = p.parse_args(argv)
    if not re.fullmatch(ID_PATTERN, args.queue):  # "Taking tickets": what a queue name may be
        p.error("--queue must be 1-64 characters of A-Z a-z 0-9 _ -")
    if not re.fullmatch(ID_PATTERN, args.worker_id):  # "Reporting": what a `worker` may be
        p.error("--worker-id must be 1-64 characters of A-Z a-z 0-9 _ -")
    if args.concurrency < 1:
        p.error("--concurrency must be at least 1")
    return args


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    sys.exit(asyncio.run(main(parse_args())))
