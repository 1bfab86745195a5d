//! Tickets written ahead of their time, held until it comes: the shard fires an occurrence a
//! short lead before it is due (so the database write is off the critical path), and the
//! dispatcher publishes it at its scheduled millisecond from here. Pure: no clock, no I/O.

use std::{
    cmp::{Ordering, Reverse},
    collections::BinaryHeap,
};

/// Items ordered by their due time, first come first served within one millisecond.
pub(crate) struct OnTime<T> {
    heap: BinaryHeap<Reverse<Held<T>>>,
    next_seq: u64,
}

struct Held<T> {
    at: i64,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Held<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<T> Eq for Held<T> {}
impl<T> PartialOrd for Held<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Held<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl<T> Default for OnTime<T> {
    fn default() -> Self {
        OnTime {
            heap: BinaryHeap::new(),
            next_seq: 0,
        }
    }
}

impl<T> OnTime<T> {
    pub fn hold(&mut self, at: i64, item: T) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Reverse(Held { at, seq, item }));
    }

    /// The earliest due time held.
    pub fn next_at(&self) -> Option<i64> {
        self.heap.peek().map(|Reverse(h)| h.at)
    }

    /// Takes the next item due at or before `now`.
    pub fn pop_due(&mut self, now: i64) -> Option<T> {
        if self.next_at()? > now {
            return None;
        }
        self.heap.pop().map(|Reverse(h)| h.item)
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Everything held comes out once, never before its time, by time and then in the order
        /// it was held.
        #[test]
        fn items_come_out_once_in_time_order(ats in prop::collection::vec(0i64..50, 0..200), step in 1i64..10) {
            let mut held = OnTime::default();
            for (i, at) in ats.iter().enumerate() {
                held.hold(*at, (*at, i));
            }
            let mut out = Vec::new();
            let mut now = 0;
            while held.next_at().is_some() {
                while let Some((at, i)) = held.pop_due(now) {
                    prop_assert!(at <= now, "released early");
                    out.push((at, i));
                }
                prop_assert!(held.next_at().is_none_or(|at| at > now));
                now += step;
            }
            let mut want: Vec<(i64, usize)> = ats.iter().copied().zip(0..).collect();
            want.sort();
            prop_assert_eq!(out, want);
        }

    }
}
