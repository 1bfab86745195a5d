//! `chronoshard-timer`: the per-shard hierarchical timing wheel, pure and clock-injected.
//!
//! A shard node loads the occurrences due within its horizon (5 minutes by default) into a
//! [`TimerWheel`], sleeps until [`TimerWheel::next_deadline`], then calls
//! [`TimerWheel::advance`] with the current time and fires what comes out. The wheel does no
//! I/O, spawns nothing and never reads a clock: time is a plain `u64` of milliseconds since the
//! Unix epoch handed in by the caller, which makes it deterministic to test.
//!
//! # Semantics a caller must know
//!
//! * Resolution is 1 ms. Any `u64` deadline works (11 levels of 64 slots cover all 64 bits), so
//!   a deadline years away is held exactly, not clamped; keeping far-future work out of the wheel
//!   is the shard's policy, not a limit of this crate.
//! * `advance(now, out)` appends every entry with `deadline <= now` as `(deadline, item)`, in
//!   non-decreasing deadline order with ties in insertion order. Entries inserted with a deadline
//!   `<=` the wheel's time are due on the next `advance`, and come out first, with their own
//!   (past) deadline. Time never goes backwards: an earlier `now` is treated as the current time.
//! * `next_deadline()` is **exact**: the smallest pending deadline, in O(1). It may be `<=
//!   now()` when past-deadline entries are waiting; sleep until it, and don't sleep at all when it
//!   is not in the future.
//! * `TimerKey`s are never reused for a different insertion: cancelling an entry that fired or
//!   was cancelled returns `None` even if its storage cell now holds another entry. The guard is
//!   a 32-bit generation per cell, so in theory a key held across 2^32 reuses of the same cell
//!   could match again; at one reuse per microsecond that is over an hour of reuses of one cell
//!   while the stale key is kept, which the shard node never does.
//!
//! # Cost
//!
//! Insert, cancel and firing an entry are O(1); an entry is additionally moved (cascaded) at
//! most once per level it descends through: up to 3 moves for a 5-minute horizon (level 3 spans
//! 64^3 ms = 4.4 min). One caveat: cancelling, in deadline order, the earliest entries of a
//! coarse (level >= 1) slot makes each cancel rescan that slot to keep `next_deadline` exact.
//!
//! At 1 M entries the wheel is memory-bound, not compute-bound: each entry is touched at a
//! scattered address on insert, on each cascade and on firing, and a cache miss costs far more
//! than the bookkeeping. The layout choices (one slab, lanes walked interleaved, a free-index
//! stack) are about overlapping those misses; `benches/wheel.rs` measures it.
//!
//! # Memory: bytes per entry
//!
//! Every pending entry is one slab entry: `size_of` is **48 bytes for `T = u128`** and 40 bytes
//! for `T = (u64, u64)` (checked at compile time below and in tests). The slab `Vec` grows by
//! doubling and never shrinks, so an unsized wheel can hold up to twice that per entry at its
//! high-water mark; [`TimerWheel::with_capacity`] avoids that. A stack of free indices adds 4
//! bytes per vacant entry. The fixed part is ~56 KB of slot heads and bitmaps per wheel.

mod slab;
mod slot;
mod wheel;

pub use wheel::{TimerKey, TimerWheel};

/// Bytes one pending entry with payload `T` costs in a wheel (spare capacity and the free stack
/// aside), so a user of the wheel can check its own payload against a budget at compile time.
pub const fn entry_bytes<T>() -> usize {
    slab::entry_bytes::<T>()
}

/// Bytes one pending entry costs for a 16-byte payload: the acceptance target is under 64.
const _: () = assert!(slab::entry_bytes::<u128>() == 48);
const _: () = assert!(slab::entry_bytes::<(u64, u64)>() == 40);
