//! Spreading shards over nodes as evenly as their capacities allow while moving as few shards as
//! possible: the algorithm of the built-in `balanced` strategy, offered to every plugin as a
//! building block (the zone-affinity example balances inside each zone with it). Pure: no I/O.

use crate::Assignment;

/// The room one node offers to a call of [`spread`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot<'a> {
    /// Node id.
    pub node: &'a str,
    /// Most shards this call may put on the node (`usize::MAX` for no limit).
    pub capacity: usize,
}

/// One node's share while spreading: it holds at least `low` shards and at most `high`.
struct Bin<'a> {
    node: &'a str,
    count: usize,
    low: usize,
    high: usize,
}

/// Assigns every shard of `shards` to a node of `slots`, as evenly as capacities allow.
///
/// Each node's share is found by water-filling: a level `L` such that every node gets
/// `min(capacity, L - 1)` shards and a few get one more, up to `min(capacity, L)`. A shard stays
/// with its previous owner while that owner is in `slots` and under its share; the rest go, in
/// shard order, to the node with the fewest shards (ties broken by node id, so every control-plane
/// replica computes the same answer). Running it again on its own output changes nothing.
///
/// With unlimited capacities this is the control plane's original `balanced` algorithm.
/// Fails when the slots together cannot hold every shard.
pub fn spread(
    shards: &[u32],
    slots: &[Slot<'_>],
    previous: &Assignment,
) -> Result<Assignment, String> {
    let mut shards = shards.to_vec();
    shards.sort_unstable();
    shards.dedup();
    let mut out = Assignment::new();
    if shards.is_empty() {
        return Ok(out);
    }
    let mut slots = slots.to_vec();
    slots.sort_by(|a, b| a.node.cmp(b.node));
    slots.dedup_by(|a, b| a.node == b.node);
    let room = slots
        .iter()
        .fold(0usize, |sum, s| sum.saturating_add(s.capacity));
    if room < shards.len() {
        return Err(format!(
            "{} shards but room for {room} on {} nodes",
            shards.len(),
            slots.len()
        ));
    }
    let level = water_level(&slots, shards.len());
    let mut bins: Vec<Bin> = slots
        .iter()
        .map(|s| Bin {
            node: s.node,
            count: 0,
            low: s.capacity.min(level - 1),
            high: s.capacity.min(level),
        })
        .collect();
    // The shares above `low` that may still be handed out; `level` is the smallest that fits, so
    // this is at least one and at most the number of nodes that can take one more.
    let mut extra = shards.len() - bins.iter().map(|b| b.low).sum::<usize>();
    let mut unplaced = Vec::new();
    for &shard in &shards {
        let owner = previous
            .get(&shard)
            .and_then(|owner| bins.binary_search_by(|b| b.node.cmp(owner)).ok());
        match owner {
            Some(i) if bins[i].count < bins[i].low => bins[i].count += 1,
            Some(i) if bins[i].count < bins[i].high && extra > 0 => {
                extra -= 1;
                bins[i].count += 1;
            }
            _ => {
                unplaced.push(shard);
                continue;
            }
        }
        out.insert(shard, previous[&shard].clone());
    }
    for shard in unplaced {
        // `min_by_key` keeps the first of equal counts, and bins are sorted by node id.
        let below_low = bins
            .iter_mut()
            .filter(|b| b.count < b.low)
            .min_by_key(|b| b.count);
        let bin = match below_low {
            Some(bin) => bin,
            None if extra > 0 => {
                extra -= 1;
                bins.iter_mut()
                    .filter(|b| b.count < b.high)
                    .min_by_key(|b| b.count)
                    .ok_or("no node left with room (a bug in spread)")?
            }
            None => return Err("no share left to hand out (a bug in spread)".into()),
        };
        bin.count += 1;
        out.insert(shard, bin.node.to_string());
    }
    Ok(out)
}

/// The smallest level `L >= 1` at which `sum(min(capacity, L)) >= shards`. The caller has checked
/// that the capacities add up to at least `shards`, so `L <= shards`.
fn water_level(slots: &[Slot<'_>], shards: usize) -> usize {
    let fits = |level: usize| {
        slots
            .iter()
            .fold(0usize, |sum, s| sum.saturating_add(s.capacity.min(level)))
            >= shards
    };
    let (mut lo, mut hi) = (1, shards.max(1));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn counts(a: &Assignment) -> BTreeMap<&str, usize> {
        let mut counts = BTreeMap::new();
        for node in a.values() {
            *counts.entry(node.as_str()).or_default() += 1;
        }
        counts
    }

    #[test]
    fn capacities_shape_the_shares() {
        let slots = [
            Slot {
                node: "a",
                capacity: 1,
            },
            Slot {
                node: "b",
                capacity: usize::MAX,
            },
            Slot {
                node: "c",
                capacity: 3,
            },
        ];
        let a = spread(&(0..10).collect::<Vec<_>>(), &slots, &Assignment::new()).unwrap();
        assert_eq!(counts(&a), BTreeMap::from([("a", 1), ("b", 6), ("c", 3)]));
    }

    #[test]
    fn too_little_room_is_an_error() {
        let slots = [Slot {
            node: "a",
            capacity: 2,
        }];
        let err = spread(&[1, 2, 3], &slots, &Assignment::new()).unwrap_err();
        assert!(err.contains("room for 2"), "{err}");
    }

    proptest! {
        #[test]
        fn shares_are_even_within_capacity_and_a_second_pass_keeps_everything(
            shards in 0u32..80,
            caps in proptest::collection::vec(prop_oneof![Just(usize::MAX), 0usize..30], 1..6),
            prev in proptest::collection::vec(0usize..8, 80),
        ) {
            let names: Vec<String> = (0..caps.len()).map(|i| format!("n{i}")).collect();
            let slots: Vec<Slot> = names.iter().zip(&caps)
                .map(|(node, &capacity)| Slot { node, capacity }).collect();
            let ids: Vec<u32> = (0..shards).collect();
            // Previous owners, some of them nodes that are not in `slots`.
            let previous: Assignment = ids.iter()
                .map(|&s| (s, format!("n{}", prev[s as usize]))).collect();
            let room: usize = caps.iter().fold(0usize, |sum, c| sum.saturating_add(*c));
            let Ok(a) = spread(&ids, &slots, &previous) else {
                prop_assert!(room < ids.len());
                return Ok(());
            };
            prop_assert_eq!(a.len(), ids.len());
            let counts = counts(&a);
            for slot in &slots {
                prop_assert!(counts.get(slot.node).copied().unwrap_or(0) <= slot.capacity);
            }
            // Even: a node under capacity holds at least the most-loaded node's count minus one.
            let max = counts.values().copied().max().unwrap_or(0);
            for slot in &slots {
                let held = counts.get(slot.node).copied().unwrap_or(0);
                prop_assert!(held >= slot.capacity.min(max.saturating_sub(1)));
            }
            prop_assert_eq!(spread(&ids, &slots, &a).unwrap(), a);
        }
    }
}
