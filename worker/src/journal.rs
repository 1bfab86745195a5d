//! The ticket journal: a worker's local record of what it started, finished and reported, kept
//! in an append-only file of JSON lines so it survives the worker's crash (`kill -9`).
//!
//! A ticket attempt is journalled `started` before its handler runs, `finished` (with its
//! outcome) before the result is sent, and `reported` once JetStream stored the result. After a
//! restart the journal answers, for a delivery of an attempt seen before: run it (never seen),
//! do not run it again (started, never finished: the worker died during it), or send the stored
//! result (finished). It owns only this file; it never talks to NATS and decides nothing about
//! retries. Lines are written to the OS at once but not fsynced: the journal survives a process
//! crash, not a power cut (a machine that loses its disk loses its journal anyway).

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

/// How long a reported attempt is remembered: longer than any redelivery of its message can
/// take (ack_wait after a crash between the report and the ack).
const KEEP_REPORTED_MS: i64 = 60 * 60 * 1000;
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
    /// Never seen: it is now journalled as started, run it.
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
    _lock: Flock<File>,
}

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
                match (entries.get(&key), r.state) {
                    (_, State::Released) => {
                        entries.remove(&key);
                    }
                    // A `reported` line carries no outcome: keep the one `finished` recorded.
                    (
                        Some(Record {
                            outcome: Some(o), ..
                        }),
                        State::Reported,
                    ) => {
                        let outcome = Some(o.clone());
                        entries.insert(key, Record { outcome, ..r });
                    }
                    _ => {
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
            _lock: lock,
        };
        inner.compact(Utc::now().timestamp_millis())?;
        Ok(Journal {
            inner: Arc::new(Mutex::new(inner)),
        })
    }

    /// Looks the attempt up; a new one is journalled as started before this returns.
    pub fn begin(&self, t: &Ticket) -> Result<Seen, JournalError> {
        let mut inner = self.inner.lock().expect("journal lock");
        match inner.entries.get(&(t.ticket_id, t.attempt)) {
            Some(Record {
                state: State::Started,
                ..
            }) => Ok(Seen::Interrupted),
            Some(Record {
                outcome: Some(o), ..
            }) => Ok(Seen::Finished(o.clone().into())),
            Some(_) => Ok(Seen::Interrupted),
            None => {
                inner.append(record(
                    t.ticket_id,
                    t.attempt,
                    t.shard,
                    State::Started,
                    None,
                ))?;
                Ok(Seen::New)
            }
        }
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

    /// The attempt's result was stored by JetStream.
    pub fn reported(&self, ticket_id: Uuid, attempt: u32) -> Result<(), JournalError> {
        let mut inner = self.inner.lock().expect("journal lock");
        let Some(known) = inner.entries.get(&(ticket_id, attempt)) else {
            return Ok(());
        };
        let mut r = record(ticket_id, attempt, known.shard, State::Reported, None);
        r.outcome = known.outcome.clone();
        inner.append(r)
    }

    /// The attempt was stopped unfinished and handed back to JetStream: forget it, so a later
    /// delivery of it runs again (from the checkpoint its handler saved, if any).
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
        let mut line = serde_json::to_vec(&r).expect("journal record serialises");
        line.push(b'\n');
        // One write per line: a crash leaves at most the last line cut, which `open` skips.
        self.file.write_all(&line).map_err(self.io())?;
        if r.state == State::Released {
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

    /// Forgets what no delivery can ask about any more and rewrites the file with the rest
    /// (to a temporary file renamed over it, so a crash leaves the old or the new one).
    fn compact(&mut self, now_ms: i64) -> Result<(), JournalError> {
        self.entries.retain(|_, r| match r.state {
            State::Reported => now_ms - r.at_ms < KEEP_REPORTED_MS,
            State::Started => now_ms - r.at_ms < KEEP_INTERRUPTED_MS,
            State::Finished => true,
            State::Released => false,
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
        Ok(())
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
        assert_eq!(j.begin(&c).unwrap(), Seen::Finished(failed), "reported");
        let un = j.unreported();
        assert_eq!(un.len(), 1);
        assert_eq!(
            (un[0].ticket_id, un[0].attempt, un[0].shard),
            (b.ticket_id, 1, 3)
        );
        // Another attempt of a known ticket is new.
        let mut next = c.clone();
        next.attempt = 3;
        assert_eq!(j.begin(&next).unwrap(), Seen::New);
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
    fn compaction_forgets_old_reported_attempts_and_keeps_unreported_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.journal");
        let (old, fresh, pending) = (ticket(1), ticket(1), ticket(1));
        let j = Journal::open(&path).unwrap();
        for t in [&old, &fresh, &pending] {
            j.begin(t).unwrap();
            j.finish(t, &Outcome::succeeded()).unwrap();
        }
        j.reported(old.ticket_id, 1).unwrap();
        j.reported(fresh.ticket_id, 1).unwrap();
        {
            let mut inner = j.inner.lock().unwrap();
            let now = Utc::now().timestamp_millis();
            inner.entries.get_mut(&(old.ticket_id, 1)).unwrap().at_ms = now - KEEP_REPORTED_MS - 1;
            inner.compact(now).unwrap();
            assert_eq!(inner.lines, 2);
        }
        drop(j);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.begin(&old).unwrap(), Seen::New, "forgotten");
        assert_eq!(
            j.begin(&fresh).unwrap(),
            Seen::Finished(Outcome::succeeded())
        );
        assert_eq!(j.unreported().len(), 1);
        assert_eq!(j.unreported()[0].ticket_id, pending.ticket_id);
    }
}
