//! Unit tests of the wheel, with a white-box invariant checker (placement, list links, bitmaps,
//! exact minimum of the earliest slot) run after every step of the randomized tests.

use super::*;
use crate::slab::{Cell, Entry, Link};
use crate::slot::lane;
use proptest::prelude::*;

const NOW: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
const YEAR_MS: u64 = 365 * 24 * 3600 * 1000;

impl<T> TimerWheel<T> {
    /// Walks every list and checks it against the placement rule and the bookkeeping.
    fn check_invariants(&self) {
        let mut seen = 0usize;
        let mut check_slot = |loc: Loc, s: &Slot| {
            let (mut min, mut count, mut in_slot) = (u64::MAX, 0u32, 0usize);
            for (ln, &head) in s.heads.iter().enumerate() {
                let (mut prev, mut cur) = (NIL, head);
                while cur != NIL {
                    let Link {
                        deadline: d,
                        next,
                        prev: p,
                    } = self.slab.link(cur);
                    assert_eq!(p, prev, "prev link");
                    assert_eq!(self.locate(d), loc, "entry {cur} deadline {d} misplaced");
                    assert_eq!(lane(d), ln, "entry {cur} in the wrong lane");
                    match d.cmp(&min) {
                        std::cmp::Ordering::Less => (min, count) = (d, 1),
                        std::cmp::Ordering::Equal => count += 1,
                        std::cmp::Ordering::Greater => {}
                    }
                    in_slot += 1;
                    prev = cur;
                    cur = next;
                }
                assert_eq!(s.tail(ln), prev, "tail");
            }
            assert_eq!(s.len(), in_slot, "slot len");
            seen += in_slot;
            if in_slot > 0 {
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
    }
}

fn drain<T>(w: &mut TimerWheel<T>, now: u64) -> Vec<(u64, T)> {
    let mut out = Vec::new();
    w.advance(now, &mut out);
    out
}

#[test]
fn entry_is_48_bytes_for_u128_and_40_for_u64_pair() {
    use std::mem::size_of;
    assert_eq!(size_of::<Link>(), 16);
    assert_eq!(size_of::<Cell<u128>>(), 32);
    assert_eq!(size_of::<Entry<u128>>(), 48);
    assert_eq!(size_of::<Entry<(u64, u64)>>(), 40);
    assert_eq!(size_of::<Slot>(), 80, "8 lanes");
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
    assert_eq!(w.cancel(b), Some('b'));
    assert_eq!(w.cancel(b), None, "double cancel");
    assert_eq!(w.cancel(c), Some('c'), "cancel overdue");
    assert_eq!(w.len(), 1);
    w.check_invariants();
    assert_eq!(drain(&mut w, NOW + 100), vec![(NOW + 10, 'a')]);
    assert_eq!(w.cancel(a), None, "cancel after firing");
    assert!(w.is_empty());
}

#[test]
fn stale_keys_stay_dead_when_cells_are_reused() {
    let mut w = TimerWheel::new(NOW);
    let old = w.insert(NOW + 5, 1);
    assert_eq!(w.cancel(old), Some(1));
    let fired = w.insert(NOW + 1, 2);
    assert_eq!(drain(&mut w, NOW + 1), vec![(NOW + 1, 2)]);
    // The first cell was reused by `fired`; both cells are free now and get reused again.
    let n1 = w.insert(NOW + 50, 3);
    let n2 = w.insert(NOW + 60, 4);
    assert_eq!(w.slab.cells(), 2, "both freed cells were reused");
    assert_ne!(n1, old);
    assert_ne!(n1, fired);
    assert_eq!(w.cancel(old), None);
    assert_eq!(w.cancel(fired), None);
    assert_eq!(w.len(), 2);
    assert_eq!(w.cancel(n2), Some(4));
    assert_eq!(w.cancel(n1), Some(3));
    // A key from another wheel (index out of range) is rejected, not a panic.
    let other = TimerWheel::new(NOW).insert(NOW, ()).idx();
    assert_eq!(other, 0);
    assert_eq!(w.cancel(TimerKey::new(12345, 0)), None);
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
        w.cancel(*k).unwrap();
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
    assert_eq!(w.cancel(k1), Some(1)); // leaves that coarse slot stale
    w.check_invariants();
    assert_eq!(w.cancel(near), Some(0)); // now the stale slot is the earliest
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
