//! Who leads, as a pure state machine: fed with what the lease key holds and the time, it says
//! when to write the lease and whether this replica may act as the leader now. No I/O, no clock
//! of its own (`leader::run` does both).
//!
//! The rules, with `ttl` the lease's time to live:
//! - the holder renews every `ttl / 3`, by compare-and-swap on the revision it wrote last;
//! - a replica that sees the lease key unchanged for a whole `ttl` (by its own monotonic clock,
//!   counted from the moment it first saw that revision) takes it by compare-and-swap on that
//!   revision, so of several candidates exactly one wins;
//! - the holder acts only until `valid_for(ttl)` after it *sent* its last successful write.
//!   Every other replica saw that revision after it was sent, so none can take the lease before
//!   the holder has stopped acting, whatever the network delays (clock rates are assumed to agree
//!   within a few percent, which the margin covers). Two missed renewals still leave the holder
//!   time to step down.
//!
//! Nobody compares wall clocks: the `renewed_at` in the lease is for people.

use std::time::Duration;

use chronoshard_cluster::LeaseEntry;
use tokio::time::Instant;

/// What `Elector::next` wants done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Write the lease with this term, if the key is still at `revision` (None: absent).
    Write { term: u64, revision: Option<u64> },
    /// Nothing to do before this instant (unless the key changes).
    WaitUntil(Instant),
    /// Nothing to do until the key has been read.
    Idle,
}

#[derive(Clone, Debug)]
struct Seen {
    entry: Option<LeaseEntry>,
    /// When this replica first saw this revision.
    at: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Held {
    term: u64,
    revision: u64,
    ttl: Duration,
    /// When the write that made (or last renewed) the lease was sent.
    sent: Instant,
}

/// A write sent and not answered yet.
#[derive(Clone, Copy, Debug)]
struct Sending {
    term: u64,
    ttl: Duration,
    sent: Instant,
}

/// One replica's view of the lease.
#[derive(Debug)]
pub struct Elector {
    id: String,
    seen: Option<Seen>,
    held: Option<Held>,
    sending: Option<Sending>,
    /// The earliest write whose answer never came: it may have landed (the watch will say).
    unconfirmed: Option<Sending>,
    /// The highest term seen, so a lease taken after a release still counts up.
    last_term: u64,
}

impl Elector {
    pub fn new(id: impl Into<String>) -> Elector {
        Elector {
            id: id.into(),
            seen: None,
            held: None,
            sending: None,
            unconfirmed: None,
            last_term: 0,
        }
    }

    /// The lease key as read or watched: `None` when it is absent.
    pub fn saw(&mut self, entry: Option<LeaseEntry>, now: Instant) {
        let revision = entry.as_ref().map(|e| e.revision);
        let seen_revision = self
            .seen
            .as_ref()
            .and_then(|s| s.entry.as_ref())
            .map(|e| e.revision);
        if self.seen.is_some() && revision.is_some() && seen_revision >= revision {
            return; // not news: the timer keeps counting from the first sight
        }
        let lease = entry.as_ref().and_then(|e| e.lease.as_ref());
        if let Some(l) = lease {
            self.last_term = self.last_term.max(l.term);
        }
        let mine = lease.is_some_and(|l| l.holder == self.id);
        let term = lease.map_or(0, |l| l.term);
        // The writes of ours not credited yet that may have made this revision: the earliest
        // sending time among them counts (the lease cannot be older than that).
        let candidate = [self.sending, self.unconfirmed]
            .into_iter()
            .flatten()
            .filter(|s| mine && s.term == term)
            .min_by_key(|s| s.sent);
        match (revision, self.held) {
            (Some(rev), Some(h)) if mine && h.term == term && rev <= h.revision => {}
            (Some(rev), _) if candidate.is_some() => {
                let c = candidate.expect("checked");
                self.held = Some(Held {
                    term,
                    revision: rev,
                    ttl: c.ttl,
                    sent: c.sent,
                });
                self.sending = None;
                self.unconfirmed = None;
            }
            (Some(rev), Some(h)) if mine && h.term == term => {
                self.held = Some(Held { revision: rev, ..h });
            }
            _ => {
                // Someone else's lease, none, or one of an earlier life of this replica: whatever
                // this replica held is lost.
                self.held = None;
                self.unconfirmed = None;
            }
        }
        self.seen = Some(Seen { entry, at: now });
    }

    /// A write with `term` and `ttl` is being sent now.
    pub fn sending(&mut self, term: u64, ttl: Duration, now: Instant) {
        self.sending = Some(Sending {
            term,
            ttl,
            sent: now,
        });
    }

    /// The write being sent succeeded and made `revision`.
    pub fn wrote(&mut self, revision: u64) {
        let Some(s) = self.sending.take() else {
            return;
        };
        self.last_term = self.last_term.max(s.term);
        if self.held.is_none_or(|h| h.revision < revision) {
            self.held = Some(Held {
                term: s.term,
                revision,
                ttl: s.ttl,
                sent: s.sent,
            });
            self.unconfirmed = None;
        }
    }

    /// The write being sent lost its compare-and-swap: the key is not at the revision it
    /// expected. That may be an unanswered write of this replica's that landed, so the caller
    /// reads the key and `saw` decides; meanwhile a held lease stays held (its validity does not
    /// grow).
    pub fn conflict(&mut self) {
        self.sending = None;
    }

    /// The write being sent failed without an answer: it may or may not have landed (the watch
    /// or the next read will tell).
    pub fn unanswered(&mut self) {
        if let Some(s) = self.sending.take() {
            self.unconfirmed =
                Some(
                    self.unconfirmed
                        .map_or(s, |u| if u.sent <= s.sent { u } else { s }),
                );
        }
    }

    /// Gave the lease up (a clean stop).
    pub fn released(&mut self) {
        self.held = None;
        self.sending = None;
        self.unconfirmed = None;
    }

    /// The term and revision of the lease this replica holds, if it holds one (valid or not).
    pub fn held(&self) -> Option<(u64, u64)> {
        self.held.map(|h| (h.term, h.revision))
    }

    /// Until when this replica may act as the leader, if it may now.
    pub fn leading_until(&self, now: Instant) -> Option<Instant> {
        let h = self.held?;
        let until = h.sent + valid_for(h.ttl);
        (now < until).then_some(until)
    }

    /// The replica that leads by this replica's count, with its term: this one while its lease
    /// is valid, else the holder of a lease not yet expired since it was seen.
    pub fn leader(&self, now: Instant) -> Option<(String, u64)> {
        if let Some(h) = self.held {
            if self.leading_until(now).is_some() {
                return Some((self.id.clone(), h.term));
            }
        }
        let seen = self.seen.as_ref()?;
        let lease = seen.entry.as_ref()?.lease.as_ref()?;
        let alive = now < seen.at + Duration::from_millis(lease.ttl_ms);
        (alive && lease.holder != self.id).then(|| (lease.holder.clone(), lease.term))
    }

    /// What to do now.
    pub fn next(&self, now: Instant) -> Action {
        if let Some(h) = self.held {
            let renew_at = h.sent + h.ttl / 3;
            return if now >= renew_at {
                Action::Write {
                    term: h.term,
                    revision: Some(h.revision),
                }
            } else {
                Action::WaitUntil(renew_at)
            };
        }
        let Some(seen) = &self.seen else {
            return Action::Idle;
        };
        let take = |revision| Action::Write {
            term: self.last_term + 1,
            revision,
        };
        match &seen.entry {
            None | Some(LeaseEntry { lease: None, .. }) => take(None),
            // A lease this replica's earlier life held counts as another's: that process may
            // still be acting until it expires.
            Some(LeaseEntry {
                lease: Some(l),
                revision,
            }) => {
                let expires = seen.at + Duration::from_millis(l.ttl_ms);
                if now >= expires {
                    take(Some(*revision))
                } else {
                    Action::WaitUntil(expires)
                }
            }
        }
    }
}

/// How long after sending a write its holder may act: 5/6 of the TTL, two renewal periods and a
/// margin of a sixth for the write's own round trip and for clock rates.
pub fn valid_for(ttl: Duration) -> Duration {
    ttl * 5 / 6
}
