//! Entry storage for the wheel: one `Vec` of entries addressed by `u32` index, a free list, and
//! a per-entry generation counter. The slab owns the items and the intrusive `next`/`prev` links
//! of the slot lists; it knows nothing about slots or levels.
//!
//! Keeping every entry in one contiguous `Vec` (instead of a `Vec` per wheel slot) keeps memory
//! at one entry per pending timer plus spare capacity, and moving an entry between slots is a
//! matter of rewriting two `u32`s.
//!
//! # Layout and bytes per entry
//!
//! An [`Entry`] is a [`Link`] (deadline, next, prev: 16 bytes, all a list walk reads) followed
//! by a [`Cell`] (generation and item). `size_of::<Entry<T>>()` is **48 bytes for `T = u128`**
//! (16 + tag and generation, padding to the item's 16-byte alignment, the item) and 40 bytes for
//! `T = (u64, u64)`. `Cell` is an enum rather than `Option<T>` beside a generation, so the vacant
//! case costs no extra word (`Option<u128>` alone is 32 bytes: `u128` has no niche).
//!
//! Link and cell share one entry rather than living in two arrays: a split would shrink what
//! cascading walks, but insert and firing would then touch two scattered cache lines instead of
//! one, and on the 2-core VM this was tuned on the split measured slower.
//!
//! # Free list
//!
//! A `Vec<u32>` stack of vacant indices rather than a list threaded through the vacant entries:
//! entries are freed in firing order, i.e. scattered in memory, and popping an intrusive free
//! list must load each freed entry to learn the next one, a serial cache miss per insert
//! (measured: ~200 ns per insert at 1 M entries). The stack costs 4 bytes per vacant entry.

/// Index meaning "no entry" in links and list heads. The slab therefore holds at most
/// `u32::MAX` entries (indices `0..u32::MAX`).
pub(crate) const NIL: u32 = u32::MAX;

/// The part of an entry a list walk reads (and, for deadline, what `cancel` needs).
#[derive(Clone, Copy)]
pub(crate) struct Link {
    pub(crate) deadline: u64,
    /// Next entry in the same slot list (insertion order), or `NIL`.
    pub(crate) next: u32,
    /// Previous entry in the same slot list, or `NIL`.
    pub(crate) prev: u32,
}

/// The part of an entry only insert, cancel and firing touch.
pub(crate) enum Cell<T> {
    /// `gen` is the generation this occupancy was handed out under; part of the `TimerKey`.
    Occupied { gen: u32, item: T },
    /// `gen` is the generation the next occupant will get. Bumped on every free, so a key of an
    /// earlier occupant never matches again (until it wraps after 2^32 reuses of this cell).
    Vacant { gen: u32 },
}

/// Bytes one pending entry costs (spare capacity and the free stack aside).
pub(crate) const fn entry_bytes<T>() -> usize {
    std::mem::size_of::<Entry<T>>()
}

/// One slab entry.
pub(crate) struct Entry<T> {
    link: Link,
    cell: Cell<T>,
}

pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    /// Indices of vacant cells, most recently freed last.
    free: Vec<u32>,
}

/// Panic for the broken-invariant case of freeing a vacant cell. Kept out of line so the hot
/// paths stay small.
#[cold]
#[inline(never)]
fn vacant(idx: u32) -> ! {
    panic!("timer wheel invariant broken: entry {idx} is linked but vacant")
}

impl<T> Slab<T> {
    pub(crate) fn with_capacity(cap: usize) -> Self {
        Slab {
            entries: Vec::with_capacity(cap),
            free: Vec::new(),
        }
    }

    /// Stores an item; returns its index and generation. Its links are left for the caller to
    /// set (`set_links`).
    #[inline]
    pub(crate) fn alloc(&mut self, deadline: u64, item: T) -> (u32, u32) {
        if let Some(idx) = self.free.pop() {
            self.entries[idx as usize].link.deadline = deadline;
            let cell = &mut self.entries[idx as usize].cell;
            let gen = match *cell {
                Cell::Vacant { gen } => gen,
                Cell::Occupied { .. } => vacant(idx),
            };
            *cell = Cell::Occupied { gen, item };
            (idx, gen)
        } else {
            let idx = self.entries.len();
            assert!(
                idx < NIL as usize,
                "TimerWheel holds at most u32::MAX - 1 entries"
            );
            self.entries.push(Entry {
                link: Link {
                    deadline,
                    next: NIL,
                    prev: NIL,
                },
                cell: Cell::Occupied { gen: 0, item },
            });
            (idx as u32, 0)
        }
    }

    /// Vacates an occupied entry, returning its deadline and item. The caller must have
    /// unlinked it, or be discarding the whole list it is in.
    #[inline]
    pub(crate) fn free(&mut self, idx: u32) -> (u64, T) {
        let cell = &mut self.entries[idx as usize].cell;
        let gen = match *cell {
            Cell::Occupied { gen, .. } => gen,
            Cell::Vacant { .. } => vacant(idx),
        };
        let old = std::mem::replace(
            cell,
            Cell::Vacant {
                gen: gen.wrapping_add(1),
            },
        );
        self.free.push(idx);
        match old {
            Cell::Occupied { item, .. } => (self.entries[idx as usize].link.deadline, item),
            Cell::Vacant { .. } => vacant(idx),
        }
    }

    /// Deadline of the entry at `idx` if it is occupied under generation `gen`: the liveness
    /// check behind `cancel`.
    #[inline]
    pub(crate) fn live_deadline(&self, idx: u32, gen: u32) -> Option<u64> {
        match self.entries.get(idx as usize).map(|e| &e.cell)? {
            Cell::Occupied { gen: g, .. } if *g == gen => {
                Some(self.entries[idx as usize].link.deadline)
            }
            _ => None,
        }
    }

    /// Whether the entry at `idx` is occupied. Loads its cell: see `cascade_lanes` for why a
    /// caller wants exactly that.
    #[inline]
    pub(crate) fn is_occupied(&self, idx: u32) -> bool {
        matches!(self.entries[idx as usize].cell, Cell::Occupied { .. })
    }

    #[inline]
    pub(crate) fn link(&self, idx: u32) -> Link {
        self.entries[idx as usize].link
    }

    #[inline]
    pub(crate) fn set_links(&mut self, idx: u32, prev: u32, next: u32) {
        let link = &mut self.entries[idx as usize].link;
        link.prev = prev;
        link.next = next;
    }

    #[inline]
    pub(crate) fn set_next(&mut self, idx: u32, next: u32) {
        self.entries[idx as usize].link.next = next;
    }

    #[inline]
    pub(crate) fn set_prev(&mut self, idx: u32, prev: u32) {
        self.entries[idx as usize].link.prev = prev;
    }

    /// Number of cells ever allocated (occupied or vacant): the slab's high-water mark.
    #[cfg(test)]
    pub(crate) fn cells(&self) -> usize {
        self.entries.len()
    }
}
