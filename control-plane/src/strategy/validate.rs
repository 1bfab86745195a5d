//! Checks on both sides of a strategy call: the input before a strategy sees it, and every
//! assignment a strategy returns before anything uses it (every shard exactly once, only live
//! nodes that are not draining, capacity respected). Pure: no I/O, no plugin calls.
//!
//! The reply is parsed here rather than with serde_json's map type because a JSON object may
//! repeat a key and a map would keep the last one silently: a shard listed twice must be an error.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use chronoshard_plugin_api::{Assignment, Input};
use serde::{
    de::{MapAccess, Visitor},
    Deserialize, Deserializer,
};

/// What is wrong with an assignment a strategy returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// A shard of the input is not assigned.
    Missing { shard: u32 },
    /// A shard is assigned more than once.
    Duplicate { shard: u32 },
    /// A shard that is not in the input is assigned.
    UnknownShard { shard: u32 },
    /// A shard is on a node that is not in the input.
    UnknownNode { shard: u32, node: String },
    /// A shard is on a draining node.
    Draining { shard: u32, node: String },
    /// A node holds more shards than its capacity.
    OverCapacity {
        node: String,
        held: usize,
        capacity: u32,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Missing { shard } => write!(f, "shard {shard} is not assigned"),
            Violation::Duplicate { shard } => write!(f, "shard {shard} is assigned twice"),
            Violation::UnknownShard { shard } => write!(f, "shard {shard} does not exist"),
            Violation::UnknownNode { shard, node } => {
                write!(f, "shard {shard} is on {node:?}, which is not a live node")
            }
            Violation::Draining { shard, node } => {
                write!(f, "shard {shard} is on {node:?}, which is draining")
            }
            Violation::OverCapacity {
                node,
                held,
                capacity,
            } => write!(
                f,
                "{node:?} holds {held} shards, over its capacity {capacity}"
            ),
        }
    }
}

/// Refuses an input that lists a node or a shard twice: strategies may not agree on which entry
/// counts, and the checks below would be ambiguous.
pub fn check_input(input: &Input) -> Result<(), String> {
    let mut nodes = BTreeSet::new();
    if let Some(node) = input.nodes.iter().find(|n| !nodes.insert(n.id.as_str())) {
        return Err(format!("node {:?} is listed twice", node.id));
    }
    let mut shards = BTreeSet::new();
    if let Some(shard) = input.shards.iter().find(|s| !shards.insert(s.id)) {
        return Err(format!("shard {} is listed twice", shard.id));
    }
    Ok(())
}

/// `(shard, node)` pairs in the order the reply lists them, repeats included.
struct Pairs(Vec<(u32, String)>);

impl<'de> Deserialize<'de> for Pairs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Pairs, D::Error> {
        struct PairsVisitor;

        impl<'de> Visitor<'de> for PairsVisitor {
            type Value = Pairs;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object mapping shard ids to node ids")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pairs, A::Error> {
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(pair) = map.next_entry::<u32, String>()? {
                    pairs.push(pair);
                }
                Ok(Pairs(pairs))
            }
        }

        deserializer.deserialize_map(PairsVisitor)
    }
}

#[derive(Deserialize)]
struct Reply {
    assignment: Pairs,
}

/// Parses a strategy's `Output` JSON, keeping repeated shards so [`check`] can refuse them.
pub fn parse_output(body: &[u8]) -> Result<Vec<(u32, String)>, serde_json::Error> {
    serde_json::from_slice::<Reply>(body).map(|r| r.assignment.0)
}

/// The assignment, if `pairs` put every shard of `input` exactly once on a live, non-draining
/// node within its capacity; otherwise the first violation found (repeats and unknown shards in
/// reply order, then missing shards, nodes and capacities in id order).
pub fn check(input: &Input, pairs: Vec<(u32, String)>) -> Result<Assignment, Violation> {
    let shards: BTreeSet<u32> = input.shards.iter().map(|s| s.id).collect();
    let mut assignment = Assignment::new();
    for (shard, node) in pairs {
        if !shards.contains(&shard) {
            return Err(Violation::UnknownShard { shard });
        }
        if assignment.insert(shard, node).is_some() {
            return Err(Violation::Duplicate { shard });
        }
    }
    if let Some(&shard) = shards.iter().find(|s| !assignment.contains_key(s)) {
        return Err(Violation::Missing { shard });
    }
    let nodes: BTreeMap<&str, _> = input.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    let mut held: BTreeMap<&str, usize> = BTreeMap::new();
    for (&shard, node) in &assignment {
        match nodes.get(node.as_str()) {
            None => {
                let node = node.clone();
                return Err(Violation::UnknownNode { shard, node });
            }
            Some(n) if n.draining => {
                let node = node.clone();
                return Err(Violation::Draining { shard, node });
            }
            Some(_) => *held.entry(node).or_default() += 1,
        }
    }
    for (node, held) in held {
        let capacity = nodes[node].capacity;
        if let Some(capacity) = capacity.filter(|c| held > *c as usize) {
            let node = node.to_string();
            return Err(Violation::OverCapacity {
                node,
                held,
                capacity,
            });
        }
    }
    Ok(assignment)
}

#[cfg(test)]
mod tests {
    use chronoshard_plugin_api::testsuite::{arb_cluster, check_answer};
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;

    fn pairs(a: &Assignment) -> Vec<(u32, String)> {
        a.iter().map(|(s, n)| (*s, n.clone())).collect()
    }

    /// A valid assignment for `input` when there is room: each shard on the accepting node with
    /// the fewest shards that still has room.
    fn valid(input: &Input) -> Option<Assignment> {
        let nodes = input.eligible_nodes();
        input.ensure_room(&nodes).ok()?;
        let mut held = vec![0usize; nodes.len()];
        let mut out = Assignment::new();
        for shard in input.shard_ids() {
            let i = (0..nodes.len())
                .filter(|&i| held[i] < nodes[i].max_shards())
                .min_by_key(|&i| held[i])?;
            held[i] += 1;
            out.insert(shard, nodes[i].id.clone());
        }
        Some(out)
    }

    #[test]
    fn a_repeated_shard_in_the_json_is_caught() {
        let body = br#"{"assignment":{"1":"a","2":"a","1":"b"}}"#;
        let pairs = parse_output(body).unwrap();
        assert_eq!(pairs.len(), 3);
        let mut input = chronoshard_plugin_api::testsuite::scenario(3, 1, &Value::Null);
        input.nodes[0].id = "a".into();
        assert_eq!(check(&input, pairs), Err(Violation::Duplicate { shard: 1 }));
    }

    #[test]
    fn replies_of_the_wrong_shape_do_not_parse() {
        for body in [
            &b"[]"[..],
            b"{}",
            br#"{"assignment":{"x":"a"}}"#,
            br#"{"assignment":{"1":2}}"#,
        ] {
            assert!(
                parse_output(body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn an_input_with_a_repeated_node_or_shard_is_refused() {
        let mut input = chronoshard_plugin_api::testsuite::scenario(2, 2, &Value::Null);
        assert_eq!(check_input(&input), Ok(()));
        input.nodes[1].id = input.nodes[0].id.clone();
        assert!(check_input(&input).unwrap_err().contains("listed twice"));
    }

    proptest! {
        /// The host's check agrees with the suite's on answers that are right, and finds each
        /// kind of wrong answer.
        #[test]
        fn valid_assignments_pass_and_each_violation_is_named(input in arb_cluster(Value::Null)) {
            let Some(good) = valid(&input) else { return Ok(()) };
            prop_assert_eq!(check_answer(&input, &Ok(good.clone())), Ok(()));
            prop_assert_eq!(check(&input, pairs(&good)), Ok(good.clone()));
            let Some((&first, owner)) = good.iter().next() else { return Ok(()) };

            let mut missing = good.clone();
            missing.remove(&first);
            prop_assert_eq!(check(&input, pairs(&missing)), Err(Violation::Missing { shard: first }));

            let mut repeated = pairs(&good);
            repeated.push((first, owner.clone()));
            prop_assert_eq!(check(&input, repeated), Err(Violation::Duplicate { shard: first }));

            let mut extra = pairs(&good);
            extra.push((u32::MAX, owner.clone()));
            prop_assert_eq!(check(&input, extra), Err(Violation::UnknownShard { shard: u32::MAX }));

            let mut stray = good.clone();
            stray.insert(first, "gone".into());
            let node = "gone".to_string();
            prop_assert_eq!(check(&input, pairs(&stray)), Err(Violation::UnknownNode { shard: first, node }));

            if let Some(drainer) = input.nodes.iter().find(|n| n.draining) {
                let mut drained = good.clone();
                drained.insert(first, drainer.id.clone());
                let node = drainer.id.clone();
                prop_assert_eq!(check(&input, pairs(&drained)), Err(Violation::Draining { shard: first, node }));
            }

            let all_on_owner: Assignment = good.keys().map(|s| (*s, owner.clone())).collect();
            let capacity = input.nodes.iter().find(|n| n.id == *owner).and_then(|n| n.capacity);
            match capacity {
                Some(c) if good.len() > c as usize => {
                    let over = check(&input, pairs(&all_on_owner));
                    let is_over_capacity = matches!(over, Err(Violation::OverCapacity { .. }));
                    prop_assert!(is_over_capacity, "{:?}", over);
                }
                _ => prop_assert_eq!(check(&input, pairs(&all_on_owner)), Ok(all_on_owner.clone())),
            }
        }
    }
}
