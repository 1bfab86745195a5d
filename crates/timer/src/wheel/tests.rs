//! Unit tests of the wheel, with a white-box invariant checker (placement, order and counts
//! within slots, bitmaps, exact minimum of the earliest slot, cancel records) run after every
//! step of the randomized tests.

use super::*;
use crate::slot::CHUNK;
use proptest::prelude::*;

const NOW: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
const YEAR_MS: u64 = 365 * 24 * 3600 * 1000;

impl<T> TimerWheel<T> {
    /// Walks every slot and checks it against the placement rule and the bookkeeping.
    fn check_invariants(&self) {
        let (mut seen, mut dead_seen) = (0usize, 0usize);
        let mut check_slot = |loc: Loc, s: &Slot<T>| {
            let (mut min, mut count, mut live, mut dead) = (u64::MAX, 0u32, 0u32, 0u32);
            let mut last_seq = None;
            for (i, chunk) in s.chunks.iter().enumerate() {
                assert!(!chunk.is_empty(), "empty chunk kept in a slot");
                assert!(
                    chunk.len() <= CHUNK && chunk.capacity() >= CHUNK,
                    "chunk size"
                );
                if i + 1 < s.chunks.len() {
                    assert_eq!(
                        chunk.len(),
                        CHUNK,
                        "only the last chunk may be partly filled"
                    );
                }
                for e in chunk {
                    let d = e.deadline;
                    assert_eq!(
                        self.locate(d),
                        loc,
                        "entry {} deadline {d} misplaced",
                        e.seq
                    );
                    assert!(e.seq < self.next_seq, "sequence number never issued");
                    assert!(last_seq < Some(e.seq), "a slot is in insertion order");
                    last_seq = Some(e.seq);
                    if self.cancelled.contains(&e.seq) {
                        dead += 1;
                        continue;
                    }
                    live += 1;
                    match d.cmp(&min) {
                        std::cmp::Ordering::Less => (min, count) = (d, 1),
                        std::cmp::Ordering::Equal => count += 1,
                        std::cmp::Ordering::Greater => {}
                    }
                }
            }
            assert_eq!(
                (s.live(), s.dead()),
                (live, dead),
                "slot live and dead counts"
            );
            assert!(
                dead <= live,
                "a slot with more dead than live entries is compacted"
            );
            assert!(
                live > 0 || s.chunks.is_empty(),
                "a slot with no live entry is cleared"
            );
            seen += live as usize;
            dead_seen += dead as usize;
            if live > 0 {
                match s.min() {
                    Some(m) => assert_eq!((m, s.min_count()), (min, count), "slot min"),
                    None => assert!(s.raw_min() < min, "stale min must be a strict lower bound"),
                }
            }
        };
        check_slot(Loc::Overdue, &self.overdue);
        assert!(!self.overdue.is_stale(), "overdue min stale");
        for (level, lv) in self.levels.iter().enumerate() {
            for (slot, s) in lv.slots.iter().enumerate() {
                assert_eq!(lv.occupied >> slot & 1 == 1, !s.is_empty(), "bitmap");
                check_slot(Loc::Wheel { level, slot }, s);
            }
            assert_eq!(self.occupied_levels >> level & 1 == 1, lv.occupied != 0);
        }
        if let Some((level, slot)) = self.earliest() {
            assert!(!self.levels[level].slots[slot].is_stale(), "earliest stale");
        }
        assert_eq!(seen, self.len, "len");
        // Every stored dead entry is remembered, and only cancels still ahead are.
        assert!(dead_seen <= self.cancelled.len());
        assert_eq!(
            self.cancelled.len(),
            self.forget.len(),
            "set and heap agree"
        );
        for &Reverse((deadline, seq)) in self.forget.iter() {
            assert!(self.cancelled.contains(&seq));
            assert!(
                deadline > self.now || seq >= self.drained_seq,
                "a cancel whose deadline passed is still remembered"
            );
        }
    }
}

fn drain<T>(w: &mut TimerWheel<T>, now: u64) -> Vec<(u64, T)> {
    let mut out = Vec::new();
    w.advance(now, &mut out);
    out
}

#[test]
fn entry_is_32_bytes_for_u128_and_u64_pair() {
    use crate::slot::Entry;
    use std::mem::size_of;
    assert_eq!(size_of::<Entry<u128>>(), 32);
    assert_eq!(size_of::<Entry<(u64, u64)>>(), 32);
    assert_eq!(size_of::<Slot<u128>>(), 48);
}

/// Everything a 1 M-entry wheel allocates, slack and spare chunks included, divided by its
/// entries: the figure behind "bytes per entry" in BENCHMARKS.md, at a fresh fill and after
/// half of it has fired and been replaced (the free chunks are then reused, not added).
#[test]
fn a_million_entries_cost_under_40_bytes_each_all_told() {
    fn heap_bytes<T>(w: &TimerWheel<T>) -> usize {
        let slots = w.levels.iter().flat_map(|lv| lv.slots.iter());
        std::mem::size_of::<[Level<T>; LEVELS]>()
            + w.pool.heap_bytes()
            + w.overdue.heap_bytes()
            + slots.map(Slot::heap_bytes).sum::<usize>()
    }
    const N: u64 = 1_000_000;
    const HORIZON: u64 = 300_000;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        1 + rng % HORIZON
    };
    let mut w = TimerWheel::<u128>::new(NOW);
    for i in 0..N {
        w.insert(NOW + next(), u128::from(i));
    }
    let fresh = heap_bytes(&w) as f64 / N as f64;
    let mut out = Vec::new();
    w.advance(NOW + HORIZON / 2, &mut out);
    for i in 0..out.len() as u64 {
        w.insert(w.now() + next(), u128::from(i));
    }
    assert_eq!(w.len() as u64, N);
    let refilled = heap_bytes(&w) as f64 / N as f64;
    eprintln!("bytes per entry: {fresh:.1} fresh, {refilled:.1} after refilling half");
    assert!(fresh < 40.0 && refilled < 40.0, "{fresh} / {refilled}");
}

#[test]
fn empty_wheel() {
    let mut w = TimerWheel::<u32>::new(NOW);
    assert!(w.is_empty());
    assert_eq!(w.next_deadline(), None);
    assert!(drain(&mut w, NOW + YEAR_MS).is_empty());
    assert_eq!(w.now(), NOW + YEAR_MS);
}

#[test]
fn fires_in_deadline_order() {
    let mut w = TimerWheel::new(NOW);
    for (i, d) in [500u64, 3, 70_000, 64, 63, 65, 4096, 1, 299_999]
        .iter()
        .enumerate()
    {
        w.insert(NOW + d, i);
    }
    w.check_invariants();
    let got: Vec<u64> = drain(&mut w, NOW + 300_000)
        .iter()
        .map(|e| e.0 - NOW)
        .collect();
    assert_eq!(got, vec![1, 3, 63, 64, 65, 500, 4096, 70_000, 299_999]);
    assert!(w.is_empty());
    w.check_invariants();
}

#[test]
fn same_ms_ties_keep_insertion_order_across_cascades() {
    let mut w = TimerWheel::new(NOW);
    let d = NOW + 200_000;
    w.insert(d, 0);
    w.insert(d + 1, 100);
    w.insert(d, 1);
    // Advance close to d so the earlier entries cascade down; then add more ties directly.
    assert!(drain(&mut w, d - 5000).is_empty());
    w.insert(d, 2);
    assert!(drain(&mut w, d - 3).is_empty());
    w.insert(d, 3);
    w.check_invariants();
    let got = drain(&mut w, d + 1);
    assert_eq!(got, vec![(d, 0), (d, 1), (d, 2), (d, 3), (d + 1, 100)]);
}

#[test]
fn past_deadlines_fire_first_on_next_advance_sorted() {
    let mut w = TimerWheel::new(NOW);
    w.insert(NOW + 2, "future");
    w.insert(NOW - 10, "past10a");
    w.insert(NOW, "now");
    w.insert(NOW - 1000, "past1000");
    w.insert(NOW - 10, "past10b");
    w.check_invariants();
    assert_eq!(w.next_deadline(), Some(NOW - 1000));
    // Even an advance that does not move time returns what is already due.
    let got = drain(&mut w, NOW - 5000);
    assert_eq!(
        got,
        vec![
            (NOW - 1000, "past1000"),
            (NOW - 10, "past10a"),
            (NOW - 10, "past10b"),
            (NOW, "now"),
        ]
    );
    assert_eq!(w.now(), NOW);
    assert_eq!(w.next_deadline(), Some(NOW + 2));
    assert_eq!(drain(&mut w, NOW + 2), vec![(NOW + 2, "future")]);
}

#[test]
fn far_future_deadlines() {
    let mut w = TimerWheel::new(NOW);
    let far = [
        NOW + 10 * YEAR_MS,
        NOW + YEAR_MS,
        u64::MAX,
        u64::MAX - 1,
        NOW + (1 << 36) + 7,
        1 << 63,
    ];
    for (i, d) in far.iter().enumerate() {
        w.insert(*d, i);
    }
    w.check_invariants();
    assert_eq!(w.next_deadline(), Some(NOW + YEAR_MS));
    let mut expected: Vec<(u64, usize)> = far.iter().copied().zip(0..).collect();
    expected.sort();
    // One year at a time, then one last jump to the end of time.
    let mut got = Vec::new();
    let mut t = NOW;
    while t < NOW + 20 * YEAR_MS {
        t += YEAR_MS;
        w.advance(t, &mut got);
        w.check_invariants();
    }
    assert_eq!(got.len(), 3, "1 y, 2^36 ms (~2.2 y) and 10 y");
    w.advance(u64::MAX, &mut got);
    assert_eq!(got, expected);
    assert!(w.is_empty());
    // At the end of time everything inserted is overdue.
    w.insert(u64::MAX, 9);
    w.check_invariants();
    assert_eq!(drain(&mut w, u64::MAX), vec![(u64::MAX, 9)]);
}

#[test]
fn cancel_before_and_after_firing() {
    let mut w = TimerWheel::new(NOW);
    let a = w.insert(NOW + 10, 'a');
    let b = w.insert(NOW + 20, 'b');
    let c = w.insert(NOW - 1, 'c');
    assert!(w.cancel(b));
    assert!(!w.cancel(b), "double cancel");
    assert!(w.cancel(c), "cancel overdue");
    assert!(!w.cancel(c), "double cancel of an overdue entry");
    assert_eq!(w.len(), 1);
    w.check_invariants();
    assert_eq!(drain(&mut w, NOW + 100), vec![(NOW + 10, 'a')]);
    assert!(!w.cancel(a), "cancel after firing");
    assert!(
        !w.cancel(b),
        "cancel after the deadline of a cancelled entry"
    );
    assert!(w.is_empty());
    w.check_invariants();
}

#[test]
fn keys_stay_dead_and_belong_to_their_wheel() {
    let mut w = TimerWheel::new(NOW);
    let old = w.insert(NOW + 5, 1);
    assert!(w.cancel(old));
    // The slot was cleared when its only entry was cancelled: the key is still dead.
    assert!(w.levels.iter().all(|lv| lv.occupied == 0));
    assert!(!w.cancel(old));
    let fired = w.insert(NOW + 1, 2);
    assert_eq!(drain(&mut w, NOW + 1), vec![(NOW + 1, 2)]);
    let overdue = w.insert(NOW, 3);
    assert_eq!(drain(&mut w, NOW), vec![(NOW, 3)]);
    let n1 = w.insert(NOW + 50, 4);
    assert!(!w.cancel(old));
    assert!(!w.cancel(fired));
    assert!(
        !w.cancel(overdue),
        "an overdue entry drained by advance has fired"
    );
    assert_eq!(w.len(), 1);
    // A key from another wheel, even one naming the same sequence number and deadline, is
    // not live here.
    let mut other = TimerWheel::new(NOW);
    for i in 0..3 {
        other.insert(NOW + 1000, i);
    }
    let foreign = other.insert(NOW + 50, 9);
    assert_eq!((foreign.seq, foreign.deadline), (n1.seq, n1.deadline));
    assert!(!w.cancel(foreign));
    assert_eq!(w.len(), 1);
    assert!(w.cancel(n1));
    w.check_invariants();
}

/// Cancel-and-insert churn into one slot far ahead (no cascade, no stale minimum to force a
/// compaction) must not pile up dead entries; the records go once time passes the deadline.
#[test]
fn cancel_churn_keeps_a_slot_bounded_and_records_are_forgotten() {
    let mut w = TimerWheel::new(NOW);
    let far = NOW + YEAR_MS;
    w.insert(far, 0u64);
    for i in 1..10_000u64 {
        let k = w.insert(far + 1, i);
        assert!(w.cancel(k));
    }
    w.check_invariants();
    let stored: usize = w
        .levels
        .iter()
        .flat_map(|lv| lv.slots.iter())
        .map(|s| s.chunks.iter().map(Vec::len).sum::<usize>())
        .sum();
    assert!(stored <= 2, "{stored} entries stored for 1 live");
    assert_eq!(w.cancelled.len(), 9_999, "records wait for the deadline");
    assert_eq!(drain(&mut w, far + 1), vec![(far, 0)]);
    assert!(w.cancelled.is_empty() && w.forget.is_empty());
    w.check_invariants();
}

#[test]
fn next_deadline_is_exact_through_cancels_and_cascades() {
    let mut w = TimerWheel::new(NOW);
    // Many entries in one coarse slot; cancel them in deadline order (the rescan path).
    let keys: Vec<_> = (0..200u64)
        .map(|i| (NOW + 100_000 + i * 7, w.insert(NOW + 100_000 + i * 7, i)))
        .collect();
    w.insert(NOW + 250_000, 999);
    for (d, k) in &keys[..150] {
        assert_eq!(w.next_deadline(), Some(*d));
        assert!(w.cancel(*k));
        w.check_invariants();
    }
    assert_eq!(w.next_deadline(), Some(keys[150].0));
    // Walk time up to just before each deadline: never early, never late.
    let mut out = Vec::new();
    while let Some(next) = w.next_deadline() {
        w.advance(next - 1, &mut out);
        assert!(out.is_empty(), "fired before next_deadline");
        assert_eq!(w.next_deadline(), Some(next));
        w.advance(next, &mut out);
        assert!(!out.is_empty() && out.iter().all(|e| e.0 == next));
        out.clear();
        w.check_invariants();
    }
    assert!(w.is_empty());
}

#[test]
fn stale_min_of_non_earliest_slot_is_repaired_when_it_becomes_earliest() {
    let mut w = TimerWheel::new(NOW);
    let near = w.insert(NOW + 10, 0u64);
    let k1 = w.insert(NOW + 200_000, 1);
    w.insert(NOW + 200_100, 2);
    assert!(w.cancel(k1)); // leaves that coarse slot stale
    w.check_invariants();
    assert!(w.cancel(near)); // now the stale slot is the earliest
    w.check_invariants();
    assert_eq!(w.next_deadline(), Some(NOW + 200_100));
}

#[test]
fn big_jumps_equal_one_ms_steps() {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut a = TimerWheel::new(NOW);
    let mut b = TimerWheel::new(NOW);
    for i in 0..5000u64 {
        let d = NOW + next() % 70_000;
        a.insert(d, i);
        b.insert(d, i);
    }
    let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
    for t in NOW..=NOW + 70_000 {
        a.advance(t, &mut out_a);
    }
    b.advance(NOW + 12_345, &mut out_b);
    b.advance(NOW + 70_000, &mut out_b);
    assert_eq!(out_a.len(), 5000);
    assert_eq!(out_a, out_b);
    assert!(out_a.windows(2).all(|w| w[0].0 <= w[1].0));
    a.check_invariants();
    b.check_invariants();
}

#[derive(Debug, Clone)]
enum Op {
    Insert(i64),
    Cancel(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (-100i64..200).prop_map(Op::Insert),
        3 => (0i64..300_000).prop_map(Op::Insert),
        1 => (0i64..i64::MAX).prop_map(Op::Insert),
        2 => any::<usize>().prop_map(Op::Cancel),
        2 => (0u64..300).prop_map(Op::Advance),
        1 => (0u64..100_000).prop_map(Op::Advance),
    ]
}

proptest! {
    /// White-box companion of tests/model.rs: the structural invariants hold after every step.
    #[test]
    fn invariants_hold_under_random_ops(ops in prop::collection::vec(op(), 1..300)) {
        let mut w = TimerWheel::new(NOW);
        let mut keys = Vec::new();
        let mut out = Vec::new();
        for op in ops {
            match op {
                Op::Insert(delta) => {
                    keys.push(w.insert(w.now().saturating_add_signed(delta), ()));
                }
                Op::Cancel(i) if !keys.is_empty() => {
                    let k = keys[i % keys.len()];
                    w.cancel(k);
                }
                Op::Cancel(_) => {}
                Op::Advance(dt) => w.advance(w.now() + dt, &mut out),
            }
            w.check_invariants();
        }
    }
}
