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
//! * `TimerKey`s are never reused: cancelling an entry that fired or was cancelled, or with a
//!   key from another wheel, returns `false`. `cancel` does not hand the item back: the entry
//!   is dropped when its slot is next processed (at once if it was the slot's last live one).
//!
//! # Cost
//!
//! Insert and firing an entry are O(1); cancel is O(1) but for a heap push of the cancelled key
//! (O(log cancels pending), O(1) on average). An entry is additionally moved (cascaded) at most
//! once per level it descends through: up to 3 moves for a 5-minute horizon (level 3 spans 64^3
//! ms = 4.4 min). One caveat: cancelling, in deadline order, the earliest entries of a coarse
//! (level >= 1) slot makes each cancel compact that slot to keep `next_deadline` exact.
//!
//! At 1 M entries a wheel is bound by memory traffic, not by its bookkeeping. Entries are
//! stored by value in per-slot chunks, so that insert, cascade and firing read and write
//! sequentially (see the docs of `slot.rs` and `benches/wheel.rs`).
//!
//! # Memory: bytes per entry
//!
//! A pending entry is stored once, by value: `size_of` is **32 bytes for `T = u128`** and for
//! `T = (u64, u64)` (deadline, sequence number, item; checked at compile time below and in
//! tests). Beyond that a wheel holds at most one partly filled chunk (64 entries) per non-empty
//! slot, and keeps the chunks of its high-water mark for reuse:
//! `a_million_entries_cost_under_40_bytes_each_all_told` measures 33 bytes per entry,
//! everything included. Cancels cost more: a cancelled entry stays stored until its slot is
//! next processed or compacted (a slot is compacted once its dead entries outnumber its live
//! ones, so it stores at most about twice its live entries), and its key is remembered (about
//! 32 bytes in a hash set and a heap) until an `advance` reaches its deadline. The fixed part is ~34 KB of slot heads per wheel.

mod slot;
mod wheel;

pub use wheel::{TimerKey, TimerWheel};

/// Bytes one pending entry with payload `T` costs in a wheel (spare capacity and the free stack
/// aside), so a user of the wheel can check its own payload against a budget at compile time.
pub const fn entry_bytes<T>() -> usize {
    std::mem::size_of::<slot::Entry<T>>()
}

/// Bytes one pending entry costs for a 16-byte payload: the acceptance target is under 64.
const _: () = assert!(entry_bytes::<u128>() == 32);
const _: () = assert!(entry_bytes::<(u64, u64)>() == 32);
