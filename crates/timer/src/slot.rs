//! One wheel slot (or the overdue list): `LANES` intrusive FIFO lists threaded through the slab,
//! plus the bookkeeping of the slot's minimum deadline. Knows nothing about levels or time.
//!
//! # Why lanes
//!
//! Walking a linked list is a chain of dependent loads: the next index is only known once the
//! current entry has arrived from memory. With 1 M entries scattered over 48 MB that is one
//! cache (and, in a VM, TLB) miss per entry, strictly one after another: 200-370 ns each on the
//! 2-core VM this was tuned on, and the wheel's whole cost. A slot therefore holds `LANES` (8)
//! independent lists, and cascading walks them interleaved so the CPU keeps 8 misses in flight
//! (measured 1.07 us -> ~0.3 us per insert+expire at 1 M entries, together with the other
//! changes noted in `slab` and `wheel`; 16 lanes measured no better).
//!
//! The lane is a hash of the deadline, not a round-robin choice: all entries with the same
//! deadline share a lane, so FIFO order within a lane is all that tie-breaking (insertion order
//! among equal deadlines) needs, wherever the entries move.
//!
//! # Minimum
//!
//! `min`/`min_count` track the smallest deadline in the slot and how many entries have it.
//! Appends keep them exact. Unlinking the last entry at the minimum leaves `min_count == 0` on a
//! non-empty slot: *stale*, `min` is then a strict lower bound until `rescan`.

use crate::slab::{Link, Slab, NIL};

const LANE_BITS: u32 = 3;
pub(crate) const LANES: usize = 1 << LANE_BITS;

/// Lane of a deadline: Fibonacci hashing, so that deadlines on round numbers (whole seconds,
/// whole minutes) still spread over the lanes.
#[inline]
pub(crate) fn lane(deadline: u64) -> usize {
    (deadline.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - LANE_BITS)) as usize
}

#[derive(Clone, Copy)]
pub(crate) struct Slot {
    pub(crate) heads: [u32; LANES],
    tails: [u32; LANES],
    len: u32,
    min_count: u32,
    min: u64,
}

impl Slot {
    pub(crate) const EMPTY: Slot = Slot {
        heads: [NIL; LANES],
        tails: [NIL; LANES],
        len: 0,
        min_count: 0,
        min: 0,
    };

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of entries in the slot.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    /// The exact minimum deadline, or `None` when empty or stale.
    #[inline]
    pub(crate) fn min(&self) -> Option<u64> {
        (self.min_count > 0).then_some(self.min)
    }

    /// True when non-empty with a stale minimum.
    #[inline]
    pub(crate) fn is_stale(&self) -> bool {
        self.len > 0 && self.min_count == 0
    }

    /// The stale lower bound, for invariant checks.
    #[cfg(test)]
    pub(crate) fn raw_min(&self) -> u64 {
        self.min
    }

    #[cfg(test)]
    pub(crate) fn min_count(&self) -> u32 {
        self.min_count
    }

    #[cfg(test)]
    pub(crate) fn tail(&self, lane: usize) -> u32 {
        self.tails[lane]
    }

    /// Appends entry `idx` (whose links may hold garbage) to its lane.
    #[inline]
    pub(crate) fn push_back<T>(&mut self, slab: &mut Slab<T>, idx: u32, deadline: u64) {
        let lane = lane(deadline);
        let tail = self.tails[lane];
        self.tails[lane] = idx;
        if tail == NIL {
            self.heads[lane] = idx;
        } else {
            slab.set_next(tail, idx);
        }
        slab.set_links(idx, tail, NIL);
        if self.len == 0 || deadline < self.min {
            self.min = deadline;
            self.min_count = 1;
        } else if deadline == self.min {
            // Also right when stale: no entry is at a stale minimum, so this one is the only one.
            self.min_count += 1;
        }
        // A stale slot with `deadline > min` stays stale: the true minimum is still unknown.
        self.len += 1;
    }

    /// Removes entry `idx`, which must be in this slot with this `deadline`.
    #[inline]
    pub(crate) fn unlink<T>(&mut self, slab: &mut Slab<T>, idx: u32, deadline: u64) {
        let lane = lane(deadline);
        let Link { prev, next, .. } = slab.link(idx);
        if prev == NIL {
            self.heads[lane] = next;
        } else {
            slab.set_next(prev, next);
        }
        if next == NIL {
            self.tails[lane] = prev;
        } else {
            slab.set_prev(next, prev);
        }
        self.len -= 1;
        if self.len == 0 {
            *self = Slot::EMPTY;
        } else if deadline == self.min && self.min_count > 0 {
            self.min_count -= 1;
        }
    }

    /// Empties the slot, returning the heads of its (now detached) lanes.
    #[inline]
    pub(crate) fn take(&mut self) -> [u32; LANES] {
        std::mem::replace(self, Slot::EMPTY).heads
    }

    /// Makes a stale minimum exact again by walking every lane: O(entries in the slot).
    #[cold]
    pub(crate) fn rescan<T>(&mut self, slab: &Slab<T>) {
        let (mut min, mut count) = (u64::MAX, 0u32);
        for &head in &self.heads {
            let mut cur = head;
            while cur != NIL {
                let Link { deadline, next, .. } = slab.link(cur);
                if deadline < min {
                    min = deadline;
                    count = 1;
                } else if deadline == min {
                    count += 1;
                }
                cur = next;
            }
        }
        self.min = min;
        self.min_count = count;
    }
}
