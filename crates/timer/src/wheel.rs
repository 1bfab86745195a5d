//! The hierarchical timing wheel: placement, occupancy bitmaps, cascading, cancellation, and the
//! public `TimerWheel` / `TimerKey` API. How a slot stores its entries lives in [`crate::slot`].
//!
//! # Placement
//!
//! A deadline `d` later than the wheel's time `now` goes to the level of the highest 6-bit digit
//! in which `d` and `now` differ, in the slot numbered by `d`'s digit at that level. Level `k`
//! slots therefore span `64^k` ms, and 11 levels cover all 64 bits of a `u64`, so no deadline is
//! ever clamped and there is no overflow list. Deadlines `<= now` go to a separate *overdue* list.
//!
//! This placement gives three facts the rest relies on:
//! * every entry at level `k` is later than every entry at levels `< k`, and within a level,
//!   slots are in deadline order with no wrap-around (all occupied slots share `now`'s higher
//!   digits and have a larger digit than `now` at that level). The earliest occupied slot is
//!   thus the lowest set bit of the lowest non-empty level: two `trailing_zeros`.
//! * an entry stays correctly placed while `now` moves forward, as long as `now` has not
//!   reached the start of its slot; `advance` processes (fires or cascades) every slot whose
//!   start it passes, so the invariant "each entry sits where a fresh insert would put it" holds
//!   between calls. `cancel` uses that to find an entry's slot from the deadline in its key.
//! * all entries with the same deadline are always in the same slot. Slots are FIFO and a
//!   cascade reads its slot in order and appends, so same-deadline entries keep insertion order.
//!
//! # Cancelling
//!
//! A key carries its entry's deadline and sequence number. `cancel` finds the slot from the
//! deadline, records the sequence number in the cancelled set and counts the entry dead in its
//! slot; the entry itself is dropped when its slot is next cascaded, fired or left with no live
//! entry, or when the slot is compacted: when its minimum goes stale while it is the earliest
//! slot, or when its dead entries outnumber its live ones (so a slot never stores more than
//! about twice its live entries, and each compaction is paid for by the cancels before it).
//!
//! Whether a key is still pending is decided from the key: it names this wheel, is not in the
//! cancelled set, and has not fired (its deadline is still ahead, or it was inserted as overdue
//! after the last `advance`). A cancelled key's record is kept until the first `advance` that
//! reaches its deadline, after which the deadline alone says it is not pending; a min-heap of
//! the recorded deadlines says when to forget them (a `BTreeSet` ordered by deadline did both,
//! at 2-3 times the cost per cancel). The records therefore take memory in proportion to the
//! cancels whose deadline is still ahead: bounded by the cancel rate times the horizon in a
//! shard, but unbounded for a caller that keeps cancelling far-future entries.
//!
//! # Exact `next_deadline`
//!
//! Each slot records the minimum deadline of its live entries and how many have it. Inserts and
//! cascades keep that exact; cancelling the last entry at the minimum leaves it *stale* (a lower
//! bound). A stale slot is compacted only when it becomes the earliest slot, so that
//! `next_deadline` is always exact and O(1). The cost: cancelling, in deadline order, entries that
//! sit in the earliest coarse slot, or in the overdue list (whose entries have many deadlines),
//! compacts that slot each time (O(entries in the slot)). Random-order cancels compact with
//! probability ~1/len, i.e. O(1) expected.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::slot::{Chunk, Entry, Pool, Slot};

/// Number of levels: 6 bits each, 11 x 6 = 66 >= 64, so every `u64` deadline has a level.
const LEVELS: usize = 11;
const SLOT_BITS: u32 = 6;
const SLOTS: usize = 1 << SLOT_BITS;

struct Level<T> {
    /// Bit `i` set iff `slots[i]` is non-empty.
    occupied: u64,
    slots: [Slot<T>; SLOTS],
}

/// Which list an entry is in, derived from its deadline and the wheel's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loc {
    Overdue,
    Wheel { level: usize, slot: usize },
}

/// Handle to a pending entry, returned by [`TimerWheel::insert`] and accepted by
/// [`TimerWheel::cancel`]. It names one insertion into one wheel: once that entry has fired or
/// been cancelled the key is dead for good, and a key from another wheel is never live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerKey {
    deadline: u64,
    seq: u64,
    wheel: u64,
}

/// Wheel identities, so that a key is only ever live in the wheel that issued it.
static NEXT_WHEEL_ID: AtomicU64 = AtomicU64::new(0);

/// A hierarchical timing wheel with 1 ms resolution holding items of type `T` until their
/// deadline. Pure: time only moves when the caller passes it to [`advance`](Self::advance).
pub struct TimerWheel<T> {
    /// Boxed: 11 levels x 64 slots x 48 bytes = ~34 KB, too much to copy on every move.
    levels: Box<[Level<T>; LEVELS]>,
    /// Bit `k` set iff `levels[k].occupied != 0`.
    occupied_levels: u16,
    /// Entries inserted with a deadline `<= now`, due on the next `advance`.
    overdue: Slot<T>,
    pool: Pool<T>,
    /// Sequence numbers of the cancelled entries whose deadline no `advance` has reached yet.
    cancelled: SeqSet,
    /// The same entries as `(deadline, seq)`, earliest deadline first: when to forget them.
    forget: BinaryHeap<Reverse<(u64, u64)>>,
    now: u64,
    /// Live entries.
    len: usize,
    /// Sequence number of the next insert.
    next_seq: u64,
    /// `next_seq` when the overdue list was last drained: an entry with a deadline `<= now` is
    /// still pending exactly when its `seq` is at least this.
    drained_seq: u64,
    id: u64,
}

impl<T> fmt::Debug for TimerWheel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimerWheel")
            .field("now", &self.now)
            .field("len", &self.len)
            .field("next_deadline", &self.next_deadline())
            .finish_non_exhaustive()
    }
}

/// A set of sequence numbers. They are distinct integers chosen by the wheel, not by an
/// adversary, so one multiplication hashes them well; SipHash made a cancel 235 ns
/// (`benches/wheel.rs`, 1 M cancels pending).
pub(crate) type SeqSet = HashSet<u64, BuildHasherDefault<SeqHasher>>;

#[derive(Default)]
pub(crate) struct SeqHasher(u64);

impl Hasher for SeqHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing takes its result from the high bits of the product, which depend
        // on all of `n`; the low bits depend only on the low bits of `n` (every 64th seq would
        // share a bucket). hashbrown takes the bucket from the low bits and a control byte from
        // the top ones, so the halves are swapped. Cancelling 1 M entries, with compaction off:
        // 104 ns each with the bare product (dense seqs map one to one, strided ones collide),
        // 137 ns swapped, 173 ns with the halves folded by xor.
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(32);
    }
}

/// Level at which a deadline `d > now` is placed.
#[inline]
fn level_for(now: u64, d: u64) -> usize {
    debug_assert!(d > now);
    ((63 - (d ^ now).leading_zeros()) / SLOT_BITS) as usize
}

#[inline]
fn slot_for(d: u64, level: usize) -> usize {
    ((d >> (SLOT_BITS as usize * level)) & (SLOTS as u64 - 1)) as usize
}

impl<T> TimerWheel<T> {
    /// An empty wheel whose current time is `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self::with_capacity(now_ms, 0)
    }

    /// An empty wheel with storage for `cap` entries allocated up front. Storage is reused,
    /// never returned, so a wheel keeps the memory of its high-water mark.
    pub fn with_capacity(now_ms: u64, cap: usize) -> Self {
        TimerWheel {
            levels: Box::new(std::array::from_fn(|_| Level {
                occupied: 0,
                slots: std::array::from_fn(|_| Slot::new()),
            })),
            occupied_levels: 0,
            overdue: Slot::new(),
            pool: Pool::with_capacity(cap),
            cancelled: SeqSet::default(),
            forget: BinaryHeap::new(),
            now: now_ms,
            len: 0,
            next_seq: 0,
            drained_seq: 0,
            id: NEXT_WHEEL_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The wheel's current time: the latest `now_ms` passed to `new` or `advance`.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Number of pending entries.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `item` due at `deadline_ms`. A deadline `<=` [`now`](Self::now) is already due: it is
    /// returned by the next `advance`, whatever time that call passes. O(1).
    pub fn insert(&mut self, deadline_ms: u64, item: T) -> TimerKey {
        let seq = self.next_seq;
        self.next_seq += 1;
        let loc = self.locate(deadline_ms);
        self.push(
            loc,
            Entry {
                deadline: deadline_ms,
                seq,
                item,
            },
        );
        self.len += 1;
        TimerKey {
            deadline: deadline_ms,
            seq,
            wheel: self.id,
        }
    }

    /// Cancels the entry named by `key`: it will not fire. Returns whether it was pending, i.e.
    /// `false` if it already fired, was already cancelled, or came from another wheel. O(1),
    /// except for the compaction described in the crate docs.
    pub fn cancel(&mut self, key: TimerKey) -> bool {
        if !self.is_live(key) {
            return false;
        }
        self.cancelled.insert(key.seq);
        self.forget.push(Reverse((key.deadline, key.seq)));
        self.len -= 1;
        let loc = self.locate(key.deadline);
        let s = match loc {
            Loc::Overdue => &mut self.overdue,
            Loc::Wheel { level, slot } => &mut self.levels[level].slots[slot],
        };
        s.mark_dead(key.deadline);
        if s.is_empty() {
            s.clear(&mut self.pool);
            if let Loc::Wheel { level, slot } = loc {
                self.unmark(level, slot);
            }
        } else if s.dead() > s.live() {
            s.compact(&mut self.pool, &self.cancelled);
        }
        self.repair_earliest();
        true
    }

    /// Moves the wheel's time to `now_ms` and appends every entry with a deadline `<= now_ms` to
    /// `out` as `(deadline_ms, item)`, in non-decreasing deadline order, ties in insertion order.
    ///
    /// Time never goes backwards: a `now_ms` earlier than [`now`](Self::now) leaves the time as
    /// it is and only returns what is already due (entries inserted with past deadlines).
    /// Cost: O(entries fired + entries cascaded + occupied slots passed), plus forgetting the
    /// records of cancels it passed and compacting a stale earliest slot; empty stretches of
    /// time are skipped through the bitmaps, so one call can jump years.
    pub fn advance(&mut self, now_ms: u64, out: &mut Vec<(u64, T)>) {
        self.drained_seq = self.next_seq;
        if !self.overdue.is_empty() {
            self.drain_overdue(out);
        }
        while let Some((level, slot)) = self.earliest() {
            let start = self.slot_start(level, slot);
            if start > now_ms {
                break;
            }
            // Moving `now` to the slot start before re-placing its entries is what makes them
            // land in lower levels (they now share every digit from `level` up with `now`).
            self.now = start;
            self.unmark(level, slot);
            let (chunks, dead) = self.levels[level].slots[slot].take();
            let chunks = self.cascade(chunks, dead, start, out);
            self.levels[level].slots[slot].restore(chunks);
        }
        if now_ms > self.now {
            self.now = now_ms;
        }
        // Everything due by now has fired or been dropped: the deadline alone now says these
        // keys are not pending.
        while let Some(&Reverse((deadline, seq))) = self.forget.peek() {
            if deadline > self.now {
                break;
            }
            self.forget.pop();
            self.cancelled.remove(&seq);
        }
        self.repair_earliest();
    }

    /// The earliest pending deadline, exactly, or `None` when the wheel is empty. O(1).
    ///
    /// It can be `<=` [`now`](Self::now) when entries were inserted with past deadlines: those
    /// are due and the next `advance` returns them, so a caller should not sleep at all then.
    pub fn next_deadline(&self) -> Option<u64> {
        // `repair_earliest` keeps both candidates exact, hence the `expect`s.
        if !self.overdue.is_empty() {
            return Some(self.overdue.min().expect("overdue minimum left stale"));
        }
        let (level, slot) = self.earliest()?;
        Some(
            self.levels[level].slots[slot]
                .min()
                .expect("earliest slot left stale"),
        )
    }

    // ---- internals ----

    /// Whether `key` names an entry of this wheel that is still pending (see the module docs).
    fn is_live(&self, key: TimerKey) -> bool {
        key.wheel == self.id
            && key.seq < self.next_seq
            && (key.deadline > self.now || key.seq >= self.drained_seq)
            && !self.cancelled.contains(&key.seq)
    }

    #[inline]
    fn locate(&self, deadline: u64) -> Loc {
        if deadline <= self.now {
            Loc::Overdue
        } else {
            let level = level_for(self.now, deadline);
            Loc::Wheel {
                level,
                slot: slot_for(deadline, level),
            }
        }
    }

    /// Lowest occupied `(level, slot)`: the slot holding the earliest wheel entries.
    #[inline]
    fn earliest(&self) -> Option<(usize, usize)> {
        if self.occupied_levels == 0 {
            return None;
        }
        let level = self.occupied_levels.trailing_zeros() as usize;
        let slot = self.levels[level].occupied.trailing_zeros() as usize;
        Some((level, slot))
    }

    /// First millisecond covered by `(level, slot)`, given the current time.
    #[inline]
    fn slot_start(&self, level: usize, slot: usize) -> u64 {
        let low = SLOT_BITS as usize * level;
        let high = low + SLOT_BITS as usize;
        // Digits above `level` come from `now`; for the top level there are none (shift >= 64).
        let prefix = if high >= 64 {
            0
        } else {
            (self.now >> high) << high
        };
        prefix | ((slot as u64) << low)
    }

    /// Appends a live entry to the list at `loc`, keeping the occupancy bitmaps up to date.
    #[inline]
    fn push(&mut self, loc: Loc, entry: Entry<T>) {
        if let Loc::Wheel { level, slot } = loc {
            self.levels[level].occupied |= 1 << slot;
            self.occupied_levels |= 1 << level;
        }
        let s = match loc {
            Loc::Overdue => &mut self.overdue,
            Loc::Wheel { level, slot } => &mut self.levels[level].slots[slot],
        };
        s.push(&mut self.pool, entry);
    }

    /// Clears the occupancy bits of a slot that was just emptied.
    #[inline]
    fn unmark(&mut self, level: usize, slot: usize) {
        let lv = &mut self.levels[level];
        lv.occupied &= !(1 << slot);
        if lv.occupied == 0 {
            self.occupied_levels &= !(1 << level);
        }
    }

    /// Re-places every entry of a taken slot relative to `now == start`: entries due at `start`
    /// fire now (they are the earliest pending: a level-0 slot holds nothing else), the rest move
    /// to lower levels. Dead entries are dropped; only a slot that has some (`dead > 0`) pays
    /// the set lookup. Returns the drained chunk list for reuse.
    fn cascade(
        &mut self,
        mut chunks: Vec<Chunk<T>>,
        dead: u32,
        start: u64,
        out: &mut Vec<(u64, T)>,
    ) -> Vec<Chunk<T>> {
        debug_assert_eq!(self.now, start);
        self.drain_live(&mut chunks, dead, |w, entry| {
            if entry.deadline == start {
                out.push((entry.deadline, entry.item));
                w.len -= 1;
            } else {
                let level = level_for(start, entry.deadline);
                let slot = slot_for(entry.deadline, level);
                w.push(Loc::Wheel { level, slot }, entry);
            }
        });
        chunks
    }

    /// Empties taken chunks into `each`, skipping the `dead` entries among them (only then is
    /// the cancelled set consulted), and returns the chunks to the pool.
    #[inline]
    fn drain_live(
        &mut self,
        chunks: &mut Vec<Chunk<T>>,
        mut dead: u32,
        mut each: impl FnMut(&mut Self, Entry<T>),
    ) {
        for mut chunk in chunks.drain(..) {
            for entry in chunk.drain(..) {
                if dead > 0 && self.cancelled.contains(&entry.seq) {
                    dead -= 1;
                    continue;
                }
                each(self, entry);
            }
            self.pool.put(chunk);
        }
    }

    /// Fires the overdue list. Its deadlines are all `<=` every wheel deadline but were
    /// inserted in any order, so the appended run is stably sorted (equal deadlines keep their
    /// insertion order).
    fn drain_overdue(&mut self, out: &mut Vec<(u64, T)>) {
        let first = out.len();
        let (mut chunks, dead) = self.overdue.take();
        self.drain_live(&mut chunks, dead, |w, entry| {
            out.push((entry.deadline, entry.item));
            w.len -= 1;
        });
        self.overdue.restore(chunks);
        let fired = &mut out[first..];
        if !fired.is_sorted_by_key(|e| e.0) {
            fired.sort_by_key(|e| e.0);
        }
    }

    /// Restores "the overdue list and the earliest wheel slot have an exact minimum", which
    /// `next_deadline` relies on. Called at the end of every mutation that can break it.
    #[inline]
    fn repair_earliest(&mut self) {
        if self.overdue.is_stale() {
            self.overdue.compact(&mut self.pool, &self.cancelled);
        }
        if let Some((level, slot)) = self.earliest() {
            let s = &mut self.levels[level].slots[slot];
            if s.is_stale() {
                s.compact(&mut self.pool, &self.cancelled);
            }
        }
    }
}

#[cfg(test)]
mod tests;
