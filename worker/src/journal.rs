//! The ticket journal: a worker's local record of what it started, finished and reported, kept
//! in an append-only file of JSON lines so it survives the worker's crash (`kill -9`).
//!
//! A ticket attempt is journalled `started` right before its handler runs, `finished` (with its
//! outcome) before the result is sent, and `reported` once the result is stored and the server
//! confirmed the delivery's ack (`agent::acked`), which forgets it: a later delivery of a
//! reported attempt is recognised by the shard as over (see `agent::redelivery`), so the
//! journal only holds attempts in flight. After a restart it answers,
//! for a delivery of an attempt it holds: do not run it again (started, never finished: the
//! worker died during it), or send the stored result (finished). It owns only this file; it
//! never talks to NATS and decides nothing about retries. Lines are written to the OS at once but
//! not fsynced: the journal survives a process crash, not a power cut. `reported` lines are the
//! exception: they only let the journal forget, so they go with the next line written (or when
//! the journal closes), which saves a write per ticket; a crash that loses them makes the
//! restarted worker send those results again, and the shard applies a result once.

use std::{
    collections::HashMap,
    fs::{File, OpenOptions},
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use chrono::Utc;
use chronoshard_wire::Ticket;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::executor::Outcome;

/// How long an attempt started and never finished is remembered.
const KEEP_INTERRUPTED_MS: i64 = 24 * 60 * 60 * 1000;

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("ticket journal {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("ticket journal {0} is in use by another worker (same worker id and data dir?)")]
    Locked(PathBuf),
}

/// What the journal knows about an attempt when it is delivered.
#[derive(Clone, Debug, PartialEq)]
pub enum Seen {
    /// Not in flight here: run it (after `Journal::start`).
    New,
    /// Started earlier and never finished: this worker died while running it.
    Interrupted,
    /// Finished earlier with this outcome (reported or not): send it, do not run again.
    Finished(Outcome),
}

/// An attempt finished whose result was not stored yet when the worker stopped.
#[derive(Clone, Debug, PartialEq)]
pub struct Unreported {
    pub ticket_id: Uuid,
    pub attempt: u32,
    pub shard: u32,
    pub outcome: Outcome,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum State {
    Started,
    Finished,
    Reported,
    /// Given back unfinished by a stopping worker (its handler stopped on the token): a
    /// delivery of it later may run it again.
    Released,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Record {
    ticket_id: Uuid,
    attempt: u32,
    shard: u32,
    state: State,
    at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    outcome: Option<Stored>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Stored {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    http_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output: Option<String>,
    #[serde(default)]
    permanent: bool,
}

impl From<&Outcome> for Stored {
    fn from(o: &Outcome) -> Stored {
        Stored {
            ok: o.ok,
            error: o.error.clone(),
            http_status: o.http_status,
            output: o.output.clone(),
            permanent: o.permanent,
        }
    }
}

impl From<Stored> for Outcome {
    fn from(s: Stored) -> Outcome {
        Outcome {
            ok: s.ok,
            error: s.error,
            http_status: s.http_status,
            output: s.output,
            permanent: s.permanent,
        }
    }
}

/// The journal of one worker. Cloning shares it.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").finish_non_exhaustive()
    }
}

struct Inner {
    path: PathBuf,
    file: File,
    entries: HashMap<(Uuid, u32), Record>,
    /// Lines in the file; when far more than the entries, the file is rewritten.
    lines: usize,
    /// The last write failed part-way: the next line starts on a line of its own.
    cut: bool,
    /// `reported` lines not written yet (see the module doc).
    deferred: Vec<u8>,
    _lock: Flock<File>,
}

/// The most bytes of `reported` lines held back before they are written on their own.
const DEFERRED_MAX: usize = 64 * 1024;

impl Journal {
    /// Opens (or creates) the journal at `path`, holding a lock beside it so two workers cannot
    /// share one, and rewrites it without what it no longer needs to remember.
    pub fn open(path: &Path) -> Result<Journal, JournalError> {
        let io = |source| JournalError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let lock_path = path.with_extension("lock");
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io)?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock)
            .map_err(|_| JournalError::Locked(path.to_path_buf()))?;
        let mut entries = HashMap::new();
        if let Ok(f) = File::open(path) {
            for line in BufReader::new(f).lines() {
                let line = line.map_err(io)?;
                // A line cut by a crash mid-write is the last one; what it said never happened.
                let Ok(r) = serde_json::from_str::<Record>(&line) else {
                    continue;
                };
                let key = (r.ticket_id, r.attempt);
                match r.state {
                    State::Released | State::Reported => {
                        entries.remove(&key);
                    }
                    State::Started | State::Finished => {
                        entries.insert(key, r);
                    }
                }
            }
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        let mut inner = Inner {
            path: path.to_path_buf(),
            file,
            entries,
            lines: 0,
            cut: false,
            deferred: Vec::new(),
            _lock: lock,
        };
        inner.compact(Utc::now().timestamp_millis())?;
        Ok(Journal {
            inner: Arc::new(Mutex::new(inner)),
        })
    }

    /// What the journal holds about the attempt.
    pub fn seen(&self, t: &Ticket) -> Seen {
        self.seen_attempt(t.ticket_id, t.attempt)
    }

    /// `seen` by the attempt's key.
    pub fn seen_attempt(&self, ticket_id: Uuid, attempt: u32) -> Seen {
        let inner = self.inner.lock().expect("journal lock");
        match inner.entries.get(&(ticket_id, attempt)) {
            None => Seen::New,
            Some(Record {
                state: State::Finished,
                outcome: Some(o),
                ..
            }) => Seen::Finished(o.clone().into()),
            Some(_) => Seen::Interrupted,
        }
    }

    /// The attempt's handler starts now.
    pub fn start(&self, t: &Ticket) -> Result<(), JournalError> {
        let r = record(t.ticket_id, t.attempt, t.shard, State::Started, None);
        self.inner.lock().expect("journal lock").append(r)
    }

    /// `seen`, and a new attempt journalled as started at once.
    pub fn begin(&self, t: &Ticket) -> Result<Seen, JournalError> {
        let seen = self.seen(t);
        if seen == Seen::New {
            self.start(t)?;
        }
        Ok(seen)
    }

    /// The attempt ended with `outcome`; journalled before the result is sent.
    pub fn finish(&self, t: &Ticket, outcome: &Outcome) -> Result<(), JournalError> {
        let r = record(
            t.ticket_id,
            t.attempt,
            t.shard,
            State::Finished,
            Some(outcome.into()),
        );
        self.inner.lock().expect("journal lock").append(r)
    }

    /// The attempt's result was stored by JetStream: nothing more to remember about it.
    pub fn reported(&self, ticket_id: Uuid, attempt: u32) -> Result<(), JournalError> {
        let mut inner = self.inner.lock().expect("journal lock");
        let Some(shard) = inner.entries.get(&(ticket_id, attempt)).map(|r| r.shard) else {
            return Ok(());
        };
        inner.append(record(ticket_id, attempt, shard, State::Reported, None))
    }

    /// The attempt was stopped unfinished and handed back to JetStream: forget it, so a later
    /// delivery of it runs again.
    pub fn release(&self, t: &Ticket) -> Result<(), JournalError> {
        let r = record(t.ticket_id, t.attempt, t.shard, State::Released, None);
        self.inner.lock().expect("journal lock").append(r)
    }

    /// Attempts finished whose results were never stored (the worker stopped in between).
    pub fn unreported(&self) -> Vec<Unreported> {
        let inner = self.inner.lock().expect("journal lock");
        let mut out: Vec<_> = inner
            .entries
            .values()
            .filter(|r| r.state == State::Finished)
            .filter_map(|r| {
                Some(Unreported {
                    ticket_id: r.ticket_id,
                    attempt: r.attempt,
                    shard: r.shard,
                    outcome: r.outcome.clone()?.into(),
                })
            })
            .collect();
        out.sort_by_key(|u| (u.ticket_id, u.attempt));
        out
    }
}

fn record(
    ticket_id: Uuid,
    attempt: u32,
    shard: u32,
    state: State,
    outcome: Option<Stored>,
) -> Record {
    Record {
        ticket_id,
        attempt,
        shard,
        state,
        at_ms: Utc::now().timestamp_millis(),
        outcome,
    }
}

impl Inner {
    fn io(&self) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
        |source| JournalError::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn append(&mut self, r: Record) -> Result<(), JournalError> {
        if r.state == State::Reported && self.deferred.len() < DEFERRED_MAX {
            serde_json::to_writer(&mut self.deferred, &r).expect("journal record serialises");
            self.deferred.push(b'\n');
        } else {
            let deferred = usize::from(self.cut);
            let mut out = self.take_pending(256);
            let line = out.len();
            serde_json::to_writer(&mut out, &r).expect("journal record serialises");
            out.push(b'\n');
            // One write: a crash leaves at most the last line cut, which `open` skips.
            if let Err(e) = self.file.write_all(&out) {
                self.cut = true;
                self.deferred = out[deferred..line].to_vec();
                return Err(self.io()(e));
            }
            self.cut = false;
        }
        if matches!(r.state, State::Released | State::Reported) {
            self.entries.remove(&(r.ticket_id, r.attempt));
        } else {
            self.entries.insert((r.ticket_id, r.attempt), r);
        }
        self.lines += 1;
        if self.lines > 2 * self.entries.len() + 10_000 {
            self.compact(Utc::now().timestamp_millis())?;
        }
        Ok(())
    }

    /// What the next write starts with, taken: after a write that failed part-way the file
    /// ends in a cut line, so a newline first keeps the next one whole (`open` skips the cut
    /// one); then the held-back `reported` lines. `room` is for what the caller adds.
    fn take_pending(&mut self, room: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + self.deferred.len() + room);
        if self.cut {
            out.push(b'\n');
        }
        out.append(&mut self.deferred);
        out
    }

    /// Forgets what no delivery can ask about any more and rewrites the file with the rest
    /// (to a temporary file renamed over it, so a crash leaves the old or the new one).
    fn compact(&mut self, now_ms: i64) -> Result<(), JournalError> {
        self.entries.retain(|_, r| match r.state {
            State::Started => now_ms - r.at_ms < KEEP_INTERRUPTED_MS,
            State::Finished => true,
            State::Reported | State::Released => false,
        });
        let tmp = self.path.with_extension("tmp");
        let mut out = Vec::new();
        for r in self.entries.values() {
            serde_json::to_writer(&mut out, r).expect("journal record serialises");
            out.push(b'\n');
        }
        std::fs::write(&tmp, &out).map_err(self.io())?;
        std::fs::rename(&tmp, &self.path).map_err(self.io())?;
        self.file = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(self.io())?;
        self.lines = self.entries.len();
        self.cut = false;
        // What they said is in the entries now.
        self.deferred.clear();
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.deferred.is_empty() {
            return;
        }
        let out = self.take_pending(0);
        // Nothing to report to: a lost `reported` line only makes a result be sent again.
        let _ = self.file.write_all(&out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(attempt: u32) -> Ticket {
        crate::test_ticket(attempt)
    }

    #[test]
    fn a_reopened_journal_knows_what_ran_and_what_was_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.journal");
        let (a, b, c) = (ticket(1), ticket(1), ticket(2));
        let failed = Outcome::failed("boom");
        {
            let j = Journal::open(&path).unwrap();
            assert_eq!(j.begin(&a).unwrap(), Seen::New);
            assert_eq!(j.begin(&b).unwrap(), Seen::New);
            assert_eq!(j.begin(&c).unwrap(), Seen::New);
            j.finish(&b, &Outcome::succeeded()).unwrap();
            j.finish(&c, &failed).unwrap();
            j.reported(c.ticket_id, c.attempt).unwrap();
            // The same delivery again in the same life: not run twice.
            assert_eq!(j.begin(&a).unwrap(), Seen::Interrupted);
        }
        let j = Journal::open(&path).unwrap();
        assert_eq!(
            j.begin(&a).unwrap(),
            Seen::Interrupted,
            "died while running"
        );
        assert_eq!(
            j.begin(&b).unwrap(),
            Seen::Finished(Outcome::succeeded()),
            "finished, result never stored"
        );
        assert_eq!(j.seen(&c), Seen::New, "reported: forgotten");
        let un = j.unreported();
        assert_eq!(un.len(), 1);
        assert_eq!(
            (un[0].ticket_id, un[0].attempt, un[0].shard),
            (b.ticket_id, 1, 3)
        );
        // Another attempt of a known ticket is new.
        let mut next = b.clone();
        next.attempt = 2;
        assert_eq!(j.begin(&next).unwrap(), Seen::New);
    }

    #[test]
    fn reported_lines_ride_with_the_next_write_and_a_lost_one_only_resends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.journal");
        let lines = || std::fs::read_to_string(&path).unwrap().lines().count();
        let (a, b, c) = (ticket(1), ticket(1), ticket(1));
        let j = Journal::open(&path).unwrap();
        j.begin(&a).unwrap();
        j.finish(&a, &Outcome::succeeded()).unwrap();
        j.reported(a.ticket_id, 1).unwrap();
        assert_eq!(lines(), 2, "held back");
        assert_eq!(j.seen(&a), Seen::New, "forgotten at once all the same");
        j.begin(&b).unwrap();
        assert_eq!(lines(), 4, "written with the next line");
        j.finish(&b, &Outcome::succeeded()).unwrap();
        j.reported(b.ticket_id, 1).unwrap();
        drop(j);
        assert_eq!(lines(), 6, "written when the journal closes");
        let j = Journal::open(&path).unwrap();
        assert!(j.unreported().is_empty());
        // A crash loses what was held back: the result is sent again after the restart.
        j.begin(&c).unwrap();
        j.finish(&c, &Outcome::succeeded()).unwrap();
        j.reported(c.ticket_id, 1).unwrap();
        j.inner.lock().unwrap().deferred.clear();
        drop(j);
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.seen(&c), Seen::Finished(Outcome::succeeded()));
        assert_eq!(j.unreported().len(), 1);
    }

    #[test]
    fn a_line_cut_by_a_crash_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.journal");
        let a = ticket(1);
        {
            let j = Journal::open(&path).unwrap();
            j.begin(&a).unwrap();
        }
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"ticket_id":"01a2266c-5a5d-7450-be09"#)
            .unwrap();
        drop(f);
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.begin(&a).unwrap(), Seen::Interrupted);
        assert_eq!(j.begin(&ticket(1)).unwrap(), Seen::New);
    }

    #[test]
    fn two_workers_cannot_share_a_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.journal");
        let _first = Journal::open(&path).unwrap();
        let err = Journal::open(&path).unwrap_err();
        assert!(matches!(err, JournalError::Locked(_)), "{err}");
        assert!(err.to_string().contains("in use by another worker"));
    }

    #[test]
    fn compaction_keeps_only_attempts_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.journal");
        let (done, stale, pending, running) = (ticket(1), ticket(1), ticket(1), ticket(1));
        let j = Journal::open(&path).unwrap();
        for t in [&done, &stale, &pending, &running] {
            j.begin(t).unwrap();
        }
        for t in [&done, &pending] {
            j.finish(t, &Outcome::succeeded()).unwrap();
        }
        j.reported(done.ticket_id, 1).unwrap();
        {
            let mut inner = j.inner.lock().unwrap();
            let now = Utc::now().timestamp_millis();
            let old = now - KEEP_INTERRUPTED_MS - 1;
            inner.entries.get_mut(&(stale.ticket_id, 1)).unwrap().at_ms = old;
            inner.compact(now).unwrap();
            assert_eq!(inner.lines, 2);
        }
        drop(j);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.seen(&done), Seen::New, "reported: forgotten");
        assert_eq!(
            j.seen(&stale),
            Seen::New,
            "interrupted a day ago: forgotten"
        );
        assert_eq!(j.seen(&running), Seen::Interrupted);
        assert_eq!(j.seen(&pending), Seen::Finished(Outcome::succeeded()));
        assert_eq!(j.unreported().len(), 1);
        assert_eq!(j.unreported()[0].ticket_id, pending.ticket_id);
    }

    #[test]
    fn a_line_after_a_failed_write_starts_on_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.journal");
        let (a, b) = (ticket(1), ticket(1));
        let j = Journal::open(&path).unwrap();
        j.begin(&a).unwrap();
        {
            // What a write cut by a full disk leaves, and the flag it sets.
            let mut inner = j.inner.lock().unwrap();
            inner.file.write_all(br#"{"ticket_id":"01a2"#).unwrap();
            inner.cut = true;
        }
        j.begin(&b).unwrap();
        drop(j);
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.seen(&a), Seen::Interrupted);
        assert_eq!(
            j.seen(&b),
            Seen::Interrupted,
            "the line after the cut one survives"
        );
    }
}
