//! Entry storage for the wheel: entries addressed by `u32` index, a LIFO free list, and a
//! per-entry generation counter.
//!
//! The slab owns the items and the intrusive `next`/`prev` links; it knows nothing about slots or
//! levels. Keeping every entry in contiguous `Vec`s (instead of a `Vec` per wheel slot) keeps
//! memory at one entry per pending timer plus the `Vec`s' spare capacity, and makes moving an
//! entry between slots a matter of rewriting two `u32`s.
//!
//! Layout: structure of arrays. Walking a slot list (cascading, firing) is a chain of dependent
//! loads, one per entry, at scattered addresses; at 1 M entries that chain is the wheel's whole
//! cost. So what the walk reads, the deadline and the links, lives alone in a 16-byte [`Link`]
//! (16 MB for 1 M entries: fits a server L3, where 48-byte mixed entries did not), and the
//! generation and item live in a separate [`Cell`] that only insert, cancel and firing touch
//! (firing's item load is independent of the chain, so the CPU overlaps it).
//!
//! Bytes per entry = `size_of::<Link>() + size_of::<Cell<T>>()`: 16 + 32 = 48 for `T = u128`
//! (tag and generation, padding to the item's 16-byte alignment, the item), 16 + 24 = 40 for
//! `T = (u64, u64)`. `Cell` is an enum rather than `Option<T>` beside a generation so the vacant
//! case costs no extra word.

/// Index meaning "no entry" in links and list heads. The slab therefore holds at most
/// `u32::MAX` entries (indices `0..u32::MAX`).
pub(crate) const NIL: u32 = u32::MAX;

/// The part of an entry a list walk reads.
#[derive(Clone, Copy)]
pub(crate) struct Link {
    pub(crate) deadline: u64,
    /// Next entry in the same slot list (insertion order), or `NIL`. For a vacant entry: the
    /// next vacant entry in the free list.
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

/// Bytes one pending entry costs (the slab's `Vec`s' spare capacity aside).
pub(crate) const fn entry_bytes<T>() -> usize {
    std::mem::size_of::<Link>() + std::mem::size_of::<Cell<T>>()
}

pub(crate) struct Slab<T> {
    links: Vec<Link>,
    cells: Vec<Cell<T>>,
    free_head: u32,
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
            links: Vec::with_capacity(cap),
            cells: Vec::with_capacity(cap),
            free_head: NIL,
        }
    }

    /// Stores an item; returns its index and generation. Its links are left for the caller to
    /// set (`set_links`).
    #[inline]
    pub(crate) fn alloc(&mut self, deadline: u64, item: T) -> (u32, u32) {
        if self.free_head != NIL {
            let idx = self.free_head;
            let link = &mut self.links[idx as usize];
            self.free_head = link.next;
            link.deadline = deadline;
            let cell = &mut self.cells[idx as usize];
            let gen = match *cell {
                Cell::Vacant { gen } => gen,
                Cell::Occupied { .. } => vacant(idx),
            };
            *cell = Cell::Occupied { gen, item };
            (idx, gen)
        } else {
            let idx = self.links.len();
            assert!(
                idx < NIL as usize,
                "TimerWheel holds at most u32::MAX - 1 entries"
            );
            self.links.push(Link {
                deadline,
                next: NIL,
                prev: NIL,
            });
            self.cells.push(Cell::Occupied { gen: 0, item });
            (idx as u32, 0)
        }
    }

    /// Vacates an occupied entry, returning its deadline and item. The caller must have
    /// unlinked it, or be discarding the whole list it is in.
    #[inline]
    pub(crate) fn free(&mut self, idx: u32) -> (u64, T) {
        let cell = &mut self.cells[idx as usize];
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
        let link = &mut self.links[idx as usize];
        link.next = self.free_head;
        self.free_head = idx;
        match old {
            Cell::Occupied { item, .. } => (link.deadline, item),
            Cell::Vacant { .. } => vacant(idx),
        }
    }

    /// Deadline of the entry at `idx` if it is occupied under generation `gen`: the liveness
    /// check behind `cancel`.
    #[inline]
    pub(crate) fn live_deadline(&self, idx: u32, gen: u32) -> Option<u64> {
        match self.cells.get(idx as usize)? {
            Cell::Occupied { gen: g, .. } if *g == gen => Some(self.links[idx as usize].deadline),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn link(&self, idx: u32) -> Link {
        self.links[idx as usize]
    }

    #[inline]
    pub(crate) fn set_links(&mut self, idx: u32, prev: u32, next: u32) {
        let link = &mut self.links[idx as usize];
        link.prev = prev;
        link.next = next;
    }

    #[inline]
    pub(crate) fn set_next(&mut self, idx: u32, next: u32) {
        self.links[idx as usize].next = next;
    }

    #[inline]
    pub(crate) fn set_prev(&mut self, idx: u32, prev: u32) {
        self.links[idx as usize].prev = prev;
    }

    /// Number of cells ever allocated (occupied or vacant): the slab's high-water mark.
    #[cfg(test)]
    pub(crate) fn cells(&self) -> usize {
        self.links.len()
    }
}
