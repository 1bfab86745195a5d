//! The hierarchical timing wheel: slot lists, occupancy bitmaps, cascading, and the public
//! `TimerWheel` / `TimerKey` API. Entry storage lives in [`crate::slab`].
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
//!   between calls. `cancel` uses that to find an entry's slot from its deadline alone.
//! * all entries with the same deadline are always in the same slot, and in the same lane of it
//!   (see [`crate::slot`]). Lanes are FIFO, and cascading walks each lane in order and appends,
//!   so same-deadline entries keep insertion order.
//!
//! # Exact `next_deadline`
//!
//! Each slot records the minimum deadline of its entries and how many entries have it. Inserts
//! and cascades keep that exact; cancelling the last entry at the minimum leaves it *stale* (a
//! lower bound). A stale slot is rescanned only when it becomes the earliest slot, so that
//! `next_deadline` is always exact and O(1). The cost: cancelling, in deadline order, entries that
//! sit in the earliest coarse slot rescans that slot each time (O(entries in the slot)).
//! Random-order cancels rescan with probability ~1/len, i.e. O(1) expected.

use std::fmt;

use crate::slab::{Slab, NIL};
use crate::slot::{Slot, LANES};

/// Number of levels: 6 bits each, 11 x 6 = 66 >= 64, so every `u64` deadline has a level.
const LEVELS: usize = 11;
const SLOT_BITS: u32 = 6;
const SLOTS: usize = 1 << SLOT_BITS;

#[derive(Clone, Copy)]
struct Level {
    /// Bit `i` set iff `slots[i]` is non-empty.
    occupied: u64,
    slots: [Slot; SLOTS],
}

const EMPTY_LEVEL: Level = Level {
    occupied: 0,
    slots: [Slot::EMPTY; SLOTS],
};

/// Which list an entry is in, derived from its deadline and the wheel's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loc {
    Overdue,
    Wheel { level: usize, slot: usize },
}

/// Handle to a pending entry, returned by [`TimerWheel::insert`] and accepted by
/// [`TimerWheel::cancel`]. It names one insertion: once that entry has fired or been cancelled
/// the key is dead for good, even when its storage is reused (a per-cell generation counter, see
/// the crate docs for its one theoretical limit). Keys are only meaningful for the wheel that
/// issued them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerKey(u64);

impl TimerKey {
    fn new(idx: u32, gen: u32) -> Self {
        TimerKey((u64::from(gen) << 32) | u64::from(idx))
    }

    fn idx(self) -> u32 {
        self.0 as u32
    }

    fn gen(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// A hierarchical timing wheel with 1 ms resolution holding items of type `T` until their
/// deadline. Pure: time only moves when the caller passes it to [`advance`](Self::advance).
pub struct TimerWheel<T> {
    slab: Slab<T>,
    /// Boxed: 11 levels x 64 slots x 80 bytes = ~56 KB, too much to copy on every move.
    levels: Box<[Level; LEVELS]>,
    /// Bit `k` set iff `levels[k].occupied != 0`.
    occupied_levels: u16,
    /// Entries inserted with a deadline `<= now`, due on the next `advance`.
    overdue: Slot,
    now: u64,
    len: usize,
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

    /// An empty wheel with room for `cap` entries before its storage has to grow. Storage grows
    /// by doubling and never shrinks, so sizing it up front is what keeps memory at one entry
    /// size per timer.
    pub fn with_capacity(now_ms: u64, cap: usize) -> Self {
        TimerWheel {
            slab: Slab::with_capacity(cap),
            levels: Box::new([EMPTY_LEVEL; LEVELS]),
            occupied_levels: 0,
            overdue: Slot::EMPTY,
            now: now_ms,
            len: 0,
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
    ///
    /// # Panics
    /// If the wheel would hold `u32::MAX` entries.
    pub fn insert(&mut self, deadline_ms: u64, item: T) -> TimerKey {
        let (idx, gen) = self.slab.alloc(deadline_ms, item);
        let loc = self.locate(deadline_ms);
        self.link_tail(loc, idx, deadline_ms);
        self.len += 1;
        TimerKey::new(idx, gen)
    }

    /// Removes the entry named by `key` and returns its item, or `None` if it already fired,
    /// was already cancelled, or never came from this wheel. O(1), except for the rescan
    /// described in the crate docs.
    pub fn cancel(&mut self, key: TimerKey) -> Option<T> {
        let idx = key.idx();
        let deadline = self.slab.live_deadline(idx, key.gen())?;
        let loc = self.locate(deadline);
        self.unlink(loc, idx, deadline);
        let (_, item) = self.slab.free(idx);
        self.len -= 1;
        self.repair_earliest();
        Some(item)
    }

    /// Moves the wheel's time to `now_ms` and appends every entry with a deadline `<= now_ms` to
    /// `out` as `(deadline_ms, item)`, in non-decreasing deadline order, ties in insertion order.
    ///
    /// Time never goes backwards: a `now_ms` earlier than [`now`](Self::now) leaves the time as
    /// it is and only returns what is already due (entries inserted with past deadlines).
    /// Cost: O(entries fired + entries cascaded + occupied slots passed); empty stretches of
    /// time are skipped through the bitmaps, so one call can jump years.
    pub fn advance(&mut self, now_ms: u64, out: &mut Vec<(u64, T)>) {
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
            let heads = self.take_slot(level, slot);
            if level == 0 {
                self.fire_lanes(heads, out);
            } else {
                self.cascade_lanes(level, heads, start, out);
            }
        }
        if now_ms > self.now {
            self.now = now_ms;
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

    /// Appends `idx` to the list at `loc`, keeping the occupancy bitmaps up to date.
    #[inline]
    fn link_tail(&mut self, loc: Loc, idx: u32, deadline: u64) {
        if let Loc::Wheel { level, slot } = loc {
            self.levels[level].occupied |= 1 << slot;
            self.occupied_levels |= 1 << level;
        }
        let s = match loc {
            Loc::Overdue => &mut self.overdue,
            Loc::Wheel { level, slot } => &mut self.levels[level].slots[slot],
        };
        s.push_back(&mut self.slab, idx, deadline);
    }

    /// Removes `idx` from the list at `loc`, keeping the bitmaps up to date (the slot minimum
    /// may be left stale; see `repair_earliest`).
    fn unlink(&mut self, loc: Loc, idx: u32, deadline: u64) {
        let s = match loc {
            Loc::Overdue => &mut self.overdue,
            Loc::Wheel { level, slot } => &mut self.levels[level].slots[slot],
        };
        s.unlink(&mut self.slab, idx, deadline);
        if let Loc::Wheel { level, slot } = loc {
            let lv = &mut self.levels[level];
            if lv.slots[slot].is_empty() {
                lv.occupied &= !(1 << slot);
                if lv.occupied == 0 {
                    self.occupied_levels &= !(1 << level);
                }
            }
        }
    }

    /// Empties `(level, slot)` and returns the heads of its lanes.
    #[inline]
    fn take_slot(&mut self, level: usize, slot: usize) -> [u32; LANES] {
        let lv = &mut self.levels[level];
        lv.occupied &= !(1 << slot);
        if lv.occupied == 0 {
            self.occupied_levels &= !(1 << level);
        }
        lv.slots[slot].take()
    }

    /// Frees every entry of detached lanes into `out`, lane after lane, each in list order.
    fn fire_lanes(&mut self, heads: [u32; LANES], out: &mut Vec<(u64, T)>) {
        for mut cur in heads {
            while cur != NIL {
                let next = self.slab.link(cur).next;
                out.push(self.slab.free(cur));
                self.len -= 1;
                cur = next;
            }
        }
    }

    /// Re-places every entry of a detached level >= 1 slot relative to `now == start`; entries
    /// due exactly at `start` fire now (they are the earliest pending, and all in one lane, in
    /// order).
    ///
    /// Two phases per batch, for memory-level parallelism: first a tight loop that only chases
    /// `next` across the lanes, round-robin, recording the indices; its loads are independent
    /// across lanes and its body is tiny, so the CPU keeps `LANES` cache misses in flight. Then
    /// the recorded entries, now in cache, are re-placed in the same order. Processing order is
    /// "round-robin over lanes, each lane in list order", which is all the tie order needs.
    fn cascade_lanes(
        &mut self,
        level: usize,
        heads: [u32; LANES],
        start: u64,
        out: &mut Vec<(u64, T)>,
    ) {
        debug_assert_eq!(self.now, start);
        const ROUNDS: usize = 32;
        let mut batch = [NIL; ROUNDS * LANES];
        let mut cursors = heads;
        let mut live = cursors.iter().filter(|&&c| c != NIL).count();
        // A level-1 slot holds the next 64 ms; its entries fire one ms (a handful of entries) per
        // `advance`, too few at a time to overlap their cache misses. Loading each entry's cell
        // here, in the gather loop where `LANES` misses overlap, makes that firing hit cache.
        // The load is an invariant check, so it is not optimised away.
        let warm_cells = level == 1;
        while live > 0 {
            let mut n = 0;
            for _ in 0..ROUNDS {
                for cursor in &mut cursors {
                    if *cursor != NIL {
                        if warm_cells {
                            assert!(self.slab.is_occupied(*cursor), "linked entry is vacant");
                        }
                        batch[n] = *cursor;
                        n += 1;
                        *cursor = self.slab.link(*cursor).next;
                        live -= usize::from(*cursor == NIL);
                    }
                }
                if live == 0 {
                    break;
                }
            }
            for &cur in &batch[..n] {
                let deadline = self.slab.link(cur).deadline;
                if deadline == start {
                    out.push(self.slab.free(cur));
                    self.len -= 1;
                } else {
                    let level = level_for(start, deadline);
                    let loc = Loc::Wheel {
                        level,
                        slot: slot_for(deadline, level),
                    };
                    self.link_tail(loc, cur, deadline);
                }
            }
        }
    }

    /// Fires the overdue list. Its deadlines are all `<=` every wheel deadline but come out
    /// lane by lane, so the appended run is stably sorted (equal deadlines share a lane, so
    /// their insertion order survives).
    fn drain_overdue(&mut self, out: &mut Vec<(u64, T)>) {
        let start = out.len();
        let heads = self.overdue.take();
        self.fire_lanes(heads, out);
        let fired = &mut out[start..];
        if !fired.is_sorted_by_key(|e| e.0) {
            fired.sort_by_key(|e| e.0);
        }
    }

    /// Restores "the overdue list and the earliest wheel slot have an exact minimum", which
    /// `next_deadline` relies on. Called at the end of every mutation that can break it.
    #[inline]
    fn repair_earliest(&mut self) {
        if self.overdue.is_stale() {
            self.overdue.rescan(&self.slab);
        }
        if let Some((level, slot)) = self.earliest() {
            let s = &mut self.levels[level].slots[slot];
            if s.is_stale() {
                s.rescan(&self.slab);
            }
        }
    }
}

#[cfg(test)]
mod tests;
