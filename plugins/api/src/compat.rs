//! The model the control plane's assignment loop used before strategies became plugins:
//! `Problem {shards, nodes}` and `balanced`. Kept so that loop builds unchanged until it calls the
//! strategy host; `balanced` now runs [`crate::balance::spread`], the algorithm of the built-in
//! `balanced` strategy, with unlimited capacities (the tests below hold it to the original code).

use crate::{
    balance::{spread, Slot},
    Assignment,
};
use serde::{Deserialize, Serialize};

/// What the original `balanced` decided over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// Every shard of the cluster.
    pub shards: Vec<u32>,
    /// Nodes alive now and accepting shards (draining nodes are left out).
    pub nodes: Vec<String>,
}

/// Balanced within one shard per node, moving as few shards as possible.
///
/// A shard stays with its previous owner while that node is alive and holds no more than its fair
/// share (`ceil(shards / nodes)`); the rest go, in shard order, to the node with the fewest shards
/// (ties broken by node id, so every control plane replica computes the same answer).
pub fn balanced(problem: &Problem, previous: &Assignment) -> Assignment {
    let slots: Vec<Slot> = problem
        .nodes
        .iter()
        .map(|node| Slot {
            node,
            capacity: usize::MAX,
        })
        .collect();
    // Unlimited capacities always have room, and no nodes means nothing can be placed.
    spread(&problem.shards, &slots, previous).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use std::collections::BTreeMap;

    use super::*;

    /// The original implementation, verbatim, as the reference `balanced` must keep matching.
    fn original(problem: &Problem, previous: &Assignment) -> Assignment {
        let mut out = Assignment::new();
        if problem.nodes.is_empty() {
            return out;
        }
        let mut nodes = problem.nodes.clone();
        nodes.sort();
        nodes.dedup();
        let fair = problem.shards.len().div_ceil(nodes.len());
        let floor = problem.shards.len() / nodes.len();
        let mut extra = problem.shards.len() % nodes.len();
        let mut load: BTreeMap<&str, usize> = nodes.iter().map(|n| (n.as_str(), 0)).collect();
        let mut unplaced = Vec::new();
        let mut shards = problem.shards.clone();
        shards.sort_unstable();
        shards.dedup();
        for &shard in &shards {
            let keep = previous
                .get(&shard)
                .and_then(|owner| load.get_key_value(owner.as_str()).map(|(k, v)| (*k, *v)));
            match keep {
                Some((owner, n)) if n < floor || (n < fair && extra > 0) => {
                    if n >= floor {
                        extra -= 1;
                    }
                    load.insert(owner, n + 1);
                    out.insert(shard, owner.to_string());
                }
                _ => unplaced.push(shard),
            }
        }
        for shard in unplaced {
            let (node, n) = load
                .iter()
                .min_by_key(|(id, n)| (**n, **id))
                .map(|(k, v)| (*k, *v))
                .expect("nodes not empty");
            load.insert(node, n + 1);
            out.insert(shard, node.to_string());
        }
        out
    }

    fn problem(shards: u32, nodes: &[&str]) -> Problem {
        Problem {
            shards: (0..shards).collect(),
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn eight_shards_two_nodes() {
        let a = balanced(&problem(8, &["node-1", "node-2"]), &Assignment::new());
        assert_eq!(a.values().filter(|n| *n == "node-1").count(), 4);
        assert_eq!(a.len(), 8);
    }

    #[test]
    fn a_lost_node_moves_only_its_shards() {
        let p = problem(8, &["a", "b", "c"]);
        let before = balanced(&p, &Assignment::new());
        let after = balanced(&problem(8, &["a", "b"]), &before);
        for (shard, owner) in &before {
            if owner != "c" {
                assert_eq!(&after[shard], owner, "shard {shard} moved needlessly");
            }
        }
    }

    proptest! {
        #[test]
        fn balanced_total_stable(shards in 0u32..64, nodes in proptest::collection::btree_set("[a-e]", 1..5),
                                 prev_nodes in proptest::collection::btree_set("[a-g]", 1..6)) {
            let nodes: Vec<String> = nodes.into_iter().collect();
            let prev = balanced(&Problem { shards: (0..shards).collect(), nodes: prev_nodes.into_iter().collect() }, &Assignment::new());
            let p = Problem { shards: (0..shards).collect(), nodes: nodes.clone() };
            let a = balanced(&p, &prev);
            // every shard placed, on a live node
            prop_assert_eq!(a.len() as u32, shards);
            prop_assert!(a.values().all(|n| nodes.contains(n)));
            // balanced within one
            let counts: Vec<usize> = nodes.iter().map(|n| a.values().filter(|o| *o == n).count()).collect();
            prop_assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
            // a second pass changes nothing
            prop_assert_eq!(balanced(&p, &a), a);
        }

        #[test]
        // Distinct shard ids: the original counted a repeated id twice when sizing shares, which the
        // control plane never relied on (it passes `0..shard_count`).
        fn balanced_matches_the_original(shards in proptest::collection::btree_set(0u32..96, 0..64),
                                         nodes in proptest::collection::vec("[a-f]", 0..6),
                                         owners in proptest::collection::vec("[a-h]", 96)) {
            let shards: Vec<u32> = shards.into_iter().collect();
            let p = Problem { shards: shards.clone(), nodes };
            // Random previous owners, several of them not alive, and the output of a pass.
            let previous: Assignment = shards.iter().map(|&s| (s, owners[s as usize].clone())).collect();
            prop_assert_eq!(balanced(&p, &previous), original(&p, &previous));
            let settled = original(&p, &Assignment::new());
            prop_assert_eq!(balanced(&p, &settled), original(&p, &settled));
        }
    }
}
