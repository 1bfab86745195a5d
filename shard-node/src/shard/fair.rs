//! Order of dispatch when more is due than can go out at once (an hourly report storm): higher
//! priority first, and within one priority the tenants take turns, so a tenant with 100,000 due
//! occurrences does not hold back one with ten. Each tenant's own items keep their order. Pure.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    hash::{DefaultHasher, Hash, Hasher},
};

/// A short tag for a tenant, the key its turns are taken by; two tenants sharing a tag share a
/// turn. A tag instead of the name keeps the wheel entry small and the dispatch path free of
/// string copies.
pub fn tenant_tag(tenant: &str) -> u32 {
    let mut h = DefaultHasher::new();
    tenant.hash(&mut h);
    h.finish() as u32
}

/// A queue that pops the highest priority first and rotates over tenants (`K`) within a priority.
#[derive(Debug)]
pub struct FairQueue<K, T> {
    /// Priority → its tenants' queues; iterated from the highest priority.
    levels: BTreeMap<std::cmp::Reverse<u8>, Level<K, T>>,
    len: usize,
}

#[derive(Debug)]
struct Level<K, T> {
    /// Tenants with items waiting, in turn order.
    turn: VecDeque<K>,
    items: HashMap<K, VecDeque<T>>,
}

impl<K, T> Default for FairQueue<K, T> {
    fn default() -> Self {
        FairQueue {
            levels: BTreeMap::new(),
            len: 0,
        }
    }
}

impl<K: Hash + Eq + Clone, T> FairQueue<K, T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn push(&mut self, priority: u8, tenant: K, item: T) {
        let level = self
            .levels
            .entry(std::cmp::Reverse(priority))
            .or_insert_with(|| Level {
                turn: VecDeque::new(),
                items: HashMap::new(),
            });
        match level.items.get_mut(&tenant) {
            Some(q) => q.push_back(item),
            None => {
                level.turn.push_back(tenant.clone());
                level.items.insert(tenant, VecDeque::from([item]));
            }
        }
        self.len += 1;
    }

    /// The next item: from the highest priority with items, the tenant whose turn it is.
    pub fn pop(&mut self) -> Option<T> {
        let mut entry = self.levels.first_entry()?;
        let level = entry.get_mut();
        let tenant = level
            .turn
            .pop_front()
            .expect("a level with items has a turn");
        let q = level
            .items
            .get_mut(&tenant)
            .expect("a tenant in turn has items");
        let item = q.pop_front().expect("a tenant queue is never left empty");
        if q.is_empty() {
            level.items.remove(&tenant);
        } else {
            level.turn.push_back(tenant);
        }
        if level.turn.is_empty() {
            entry.remove();
        }
        self.len -= 1;
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reorders a batch the same way a `FairQueue` would pop it.
    pub fn fair_order<K: Hash + Eq + Clone, T>(
        items: Vec<T>,
        key: impl Fn(&T) -> (u8, K),
    ) -> Vec<T> {
        let mut q = FairQueue::default();
        for item in items {
            let (priority, tenant) = key(&item);
            q.push(priority, tenant, item);
        }
        std::iter::from_fn(|| q.pop()).collect()
    }

    #[test]
    fn a_large_tenant_does_not_hold_back_a_small_one() {
        let mut items: Vec<(u8, &str, u32)> = (0..1000).map(|i| (5, "big", i)).collect();
        items.extend((0..3).map(|i| (5, "small", i)));
        let order = fair_order(items, |(p, t, _)| (*p, *t));
        let small: Vec<usize> = order
            .iter()
            .enumerate()
            .filter(|(_, (_, t, _))| *t == "small")
            .map(|(i, _)| i)
            .collect();
        assert_eq!(small, [1, 3, 5]);
    }

    proptest! {
        #[test]
        fn priority_first_turns_within_a_priority_order_within_a_tenant(
            items in proptest::collection::vec((0u8..4, 0u8..5), 0..300)
        ) {
            let tagged: Vec<(u8, u8, usize)> = items.iter().enumerate().map(|(i, (p, t))| (*p, *t, i)).collect();
            let out = fair_order(tagged.clone(), |(p, t, _)| (*p, *t));
            prop_assert_eq!(out.len(), tagged.len());
            // priorities never rise
            prop_assert!(out.windows(2).all(|w| w[0].0 >= w[1].0));
            for p in 0..4u8 {
                let level: Vec<_> = out.iter().filter(|x| x.0 == p).collect();
                // a tenant's items keep their order
                for t in 0..5u8 {
                    let idx: Vec<usize> = level.iter().filter(|x| x.1 == t).map(|x| x.2).collect();
                    prop_assert!(idx.windows(2).all(|w| w[0] < w[1]));
                }
                // in any prefix, two tenants that both still had items differ by at most one
                let total = |t: u8| level.iter().filter(|x| x.1 == t).count();
                let mut seen = [0usize; 5];
                for x in &level {
                    seen[x.1 as usize] += 1;
                    for a in 0..5u8 {
                        for b in 0..5u8 {
                            let (sa, sb) = (seen[a as usize], seen[b as usize]);
                            if sa < total(a) && sb < total(b) {
                                prop_assert!(sa.abs_diff(sb) <= 1);
                            }
                        }
                    }
                }
            }
        }
    }
}
