//! One wheel slot (or the overdue list): its entries, stored by value in fixed-size chunks, and
//! the bookkeeping of its live entries and their minimum deadline. Knows nothing about levels
//! or time; which entries are cancelled is the caller's set, passed in.
//!
//! # Why chunks of entries, by value
//!
//! At 1 M entries the wheel's cost is memory traffic: every entry is touched on insert, on each
//! cascade and on firing. Stored by value in per-slot chunks, each of those touches is
//! sequential: insert and cascade append to the tail chunk of one of a few dozen slots (all in
//! cache), and cascading or firing a slot reads its chunks front to back, which the hardware
//! prefetcher streams. An earlier layout (one slab of entries threaded into intrusive lists)
//! made every touch a dependent cache miss at a scattered address: 190–260 ns per insert+expire
//! at 1 M entries on the 2-core VM, against 100 ns wanted.
//!
//! Chunks rather than one growable `Vec` per slot: a slot that once held many entries would
//! keep that capacity forever, and 700 slots of spare capacity can double the memory. Drained
//! chunks go back to a [`Pool`] shared by all slots, so a wheel holds at most one partly filled
//! chunk per non-empty slot beyond its entries.
//!
//! # Cancelled entries
//!
//! A cancel cannot find its entry cheaply (entries move on every cascade), so it only adds the
//! entry's sequence number to the wheel's cancelled set and counts it here as `dead`. Dead
//! entries are dropped when their slot is cascaded, fired, compacted ([`Slot::compact`]) or
//! cleared; only a slot with `dead > 0` pays a set lookup per entry. The set itself is the
//! wheel's, and so is the decision when to compact.
//!
//! # Minimum
//!
//! `min`/`min_count` track the smallest deadline among the slot's *live* entries and how many
//! live entries have it. Appends keep them exact. Cancelling the last live entry at the minimum
//! leaves `min_count == 0` on a slot that still has live entries: *stale*, `min` is then a
//! strict lower bound until `compact`.

use crate::wheel::SeqSet;

/// Entries per chunk: large enough that reading a slot streams, small enough that one partly
/// filled chunk per slot is little memory (2 KB for a 32-byte entry).
pub(crate) const CHUNK: usize = 64;

/// One pending timer, as stored.
pub(crate) struct Entry<T> {
    pub(crate) deadline: u64,
    /// The insertion's number in its wheel: the identity a cancel names.
    pub(crate) seq: u64,
    pub(crate) item: T,
}

/// A chunk: a `Vec` that never grows past [`CHUNK`] entries.
pub(crate) type Chunk<T> = Vec<Entry<T>>;

/// Empty chunks for reuse, most recently freed (likeliest in cache) last.
pub(crate) struct Pool<T> {
    free: Vec<Chunk<T>>,
}

impl<T> Pool<T> {
    /// A pool with room for `entries` entries already allocated.
    pub(crate) fn with_capacity(entries: usize) -> Self {
        Pool {
            free: (0..entries.div_ceil(CHUNK))
                .map(|_| Vec::with_capacity(CHUNK))
                .collect(),
        }
    }

    #[inline]
    fn get(&mut self) -> Chunk<T> {
        self.free.pop().unwrap_or_else(|| Vec::with_capacity(CHUNK))
    }

    #[inline]
    pub(crate) fn put(&mut self, chunk: Chunk<T>) {
        debug_assert!(chunk.is_empty());
        self.free.push(chunk);
    }

    /// Heap bytes the pool holds: its spare chunks and its own list.
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        self.free.capacity() * std::mem::size_of::<Chunk<T>>()
            + self.free.iter().map(chunk_bytes).sum::<usize>()
    }
}

#[cfg(test)]
fn chunk_bytes<T>(chunk: &Chunk<T>) -> usize {
    chunk.capacity() * std::mem::size_of::<Entry<T>>()
}

pub(crate) struct Slot<T> {
    /// Entries in append order; every chunk but the last is full, none is empty.
    pub(crate) chunks: Vec<Chunk<T>>,
    /// Entries not cancelled. A slot with no live entries holds no entries at all.
    live: u32,
    /// Cancelled entries still stored (their `seq` is in the wheel's cancelled set).
    dead: u32,
    min_count: u32,
    min: u64,
}

impl<T> Slot<T> {
    pub(crate) const fn new() -> Self {
        Slot {
            chunks: Vec::new(),
            live: 0,
            dead: 0,
            min_count: 0,
            min: 0,
        }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Number of live entries.
    #[inline]
    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    /// Number of cancelled entries still stored.
    #[inline]
    pub(crate) fn dead(&self) -> u32 {
        self.dead
    }

    /// The exact minimum live deadline, or `None` when empty or stale.
    #[inline]
    pub(crate) fn min(&self) -> Option<u64> {
        (self.min_count > 0).then_some(self.min)
    }

    /// True when it has live entries but a stale minimum.
    #[inline]
    pub(crate) fn is_stale(&self) -> bool {
        self.live > 0 && self.min_count == 0
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

    /// Heap bytes the slot holds: its chunks and its chunk list.
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Chunk<T>>()
            + self.chunks.iter().map(chunk_bytes).sum::<usize>()
    }

    /// Appends a live entry.
    #[inline]
    pub(crate) fn push(&mut self, pool: &mut Pool<T>, entry: Entry<T>) {
        let deadline = entry.deadline;
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push(entry),
            _ => {
                let mut chunk = pool.get();
                chunk.push(entry);
                self.chunks.push(chunk);
            }
        }
        if self.live == 0 || deadline < self.min {
            self.min = deadline;
            self.min_count = 1;
        } else if deadline == self.min {
            // Also right when stale: no live entry is at a stale minimum, so this is the only one.
            self.min_count += 1;
        }
        // A stale slot with `deadline > min` stays stale: the true minimum is still unknown.
        self.live += 1;
    }

    /// Counts one of the slot's live entries, due at `deadline`, as cancelled. The caller has
    /// put it in the cancelled set, and must [`clear`](Self::clear) the slot if this was
    /// its last live entry.
    #[inline]
    pub(crate) fn mark_dead(&mut self, deadline: u64) {
        debug_assert!(self.live > 0);
        self.live -= 1;
        self.dead += 1;
        if deadline == self.min && self.min_count > 0 {
            self.min_count -= 1;
        }
    }

    /// Empties the slot. Returns its chunks (the outer `Vec` is the slot's own: hand it back
    /// through [`restore`](Self::restore) once drained) and how many of the entries are dead.
    #[inline]
    pub(crate) fn take(&mut self) -> (Vec<Chunk<T>>, u32) {
        let dead = self.dead;
        self.live = 0;
        self.dead = 0;
        self.min_count = 0;
        (std::mem::take(&mut self.chunks), dead)
    }

    /// Gives back the chunk list `take` returned, drained, so its allocation is reused. Only
    /// valid while nothing was pushed in between.
    #[inline]
    pub(crate) fn restore(&mut self, chunks: Vec<Chunk<T>>) {
        debug_assert!(chunks.is_empty() && self.chunks.is_empty());
        self.chunks = chunks;
    }

    /// Drops every entry of a slot whose entries are all dead.
    pub(crate) fn clear(&mut self, pool: &mut Pool<T>) {
        debug_assert_eq!(self.live, 0);
        let (mut chunks, _) = self.take();
        for mut chunk in chunks.drain(..) {
            chunk.clear();
            pool.put(chunk);
        }
        self.restore(chunks);
    }

    /// Rewrites the slot without its dead entries, which makes the minimum exact again:
    /// O(entries in the slot).
    #[cold]
    pub(crate) fn compact(&mut self, pool: &mut Pool<T>, cancelled: &SeqSet) {
        let (mut chunks, _) = self.take();
        for mut chunk in chunks.drain(..) {
            for entry in chunk.drain(..) {
                if !cancelled.contains(&entry.seq) {
                    self.push(pool, entry);
                }
            }
            pool.put(chunk);
        }
        // The rewritten entries are in new chunks; the emptied list is dropped.
    }
}
