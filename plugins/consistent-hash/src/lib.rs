//! The built-in `consistent-hash` strategy: each accepting node stands at `vnodes` points of a
//! hash ring (the `hashring` crate, SipHash with zero keys), and a shard goes to the first point
//! at or after its own hash whose node has room. When a node joins, the only shards that move are
//! those whose points it now owns, about 1/N of them; when one leaves, only its shards move. The
//! previous assignment is not looked at: placement follows from the node ids alone, so replicas
//! agree without coordination.
//!
//! Config: `{"vnodes": 128}` (1 to 4096). More points spread the shards more evenly and cost
//! memory and time per call.

use std::{
    collections::BTreeMap,
    hash::{Hash, Hasher},
};

use chronoshard_plugin_api::{export_strategy, serde::Deserialize, Assignment, Input, Strategy};
use hashring::HashRing;

/// Points per node when the config does not say.
pub const DEFAULT_VNODES: u32 = 128;
/// Most points per node a config may ask for.
pub const MAX_VNODES: u32 = 4096;

/// The strategy's settings.
#[derive(Clone, Debug, Deserialize)]
#[serde(crate = "chronoshard_plugin_api::serde", deny_unknown_fields, default)]
pub struct Config {
    /// Points on the ring per node.
    pub vnodes: u32,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            vnodes: DEFAULT_VNODES,
        }
    }
}

impl Config {
    /// Checks the ranges.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_VNODES).contains(&self.vnodes) {
            return Err(format!(
                "vnodes must be 1 to {MAX_VNODES}, not {}",
                self.vnodes
            ));
        }
        Ok(())
    }
}

/// See the crate documentation.
#[derive(Debug)]
pub struct ConsistentHash;

impl Strategy for ConsistentHash {
    const NAME: &'static str = "consistent-hash";
    type Config = Config;

    fn check_config(config: &Config) -> Result<(), String> {
        config.check()
    }

    fn assign(input: &Input, config: &Config) -> Result<Assignment, String> {
        ring_assign(input, config.vnodes)
    }
}

export_strategy!(ConsistentHash);

/// A point of a node on the ring. Hashed from its bytes, little-endian, so a point lands at
/// the same place on every machine.
#[derive(Clone, Debug)]
struct Point<'a> {
    node: &'a str,
    replica: u32,
}

impl Hash for Point<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.node.as_bytes());
        state.write_u8(0xff);
        state.write(&self.replica.to_le_bytes());
    }
}

/// A shard's key on the ring.
struct ShardKey(u32);

impl Hash for ShardKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.0.to_le_bytes());
    }
}

/// Places every shard on the ring of the accepting nodes, `vnodes` points each, skipping nodes
/// at capacity (in shard order, so the answer is deterministic). Also the first level of the
/// `two-level` strategy.
pub fn ring_assign(input: &Input, vnodes: u32) -> Result<Assignment, String> {
    let nodes = input.eligible_nodes();
    input.ensure_room(&nodes)?;
    let mut out = Assignment::new();
    if nodes.is_empty() {
        return Ok(out);
    }
    let mut ring = HashRing::new();
    ring.batch_add(
        nodes
            .iter()
            .flat_map(|n| {
                (0..vnodes).map(|replica| Point {
                    node: &n.id,
                    replica,
                })
            })
            .collect(),
    );
    let mut room: BTreeMap<&str, usize> = nodes
        .iter()
        .map(|n| (n.id.as_str(), n.max_shards()))
        .collect();
    for shard in input.shard_ids() {
        let key = ShardKey(shard);
        let has_room = |node: &str| room.get(node).is_some_and(|r| *r > 0);
        let owner = match ring.get(&key) {
            Some(point) if has_room(point.node) => Some(point.node),
            // The owner is full: walk on along the ring to the next node with room.
            _ => ring
                .get_with_replicas(&key, ring.len())
                .and_then(|points| points.into_iter().map(|p| p.node).find(|n| has_room(n))),
        };
        let owner = owner.ok_or("no node left with room")?;
        if let Some(r) = room.get_mut(owner) {
            *r -= 1;
        }
        out.insert(shard, owner.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use chronoshard_plugin_api::testsuite::scenario;
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn vnodes_out_of_range_are_refused() {
        assert!(Config { vnodes: 0 }.check().is_err());
        assert!(Config {
            vnodes: MAX_VNODES + 1
        }
        .check()
        .is_err());
        assert!(Config::default().check().is_ok());
    }

    #[test]
    fn placement_does_not_depend_on_the_machine() {
        // Pinned: the same eight shards land on the same nodes on every platform and release.
        let input = scenario(8, 4, &Default::default());
        let a = ring_assign(&input, DEFAULT_VNODES).unwrap();
        let owners: Vec<&str> = a.values().map(String::as_str).collect();
        assert_eq!(owners, PINNED);
    }

    const PINNED: [&str; 8] = [
        "node-03", "node-03", "node-02", "node-00", "node-00", "node-02", "node-00", "node-01",
    ];

    proptest! {
        #[test]
        fn a_joining_node_only_takes_shards(shards in 1u32..200, nodes in 1usize..9, vnodes in 1u32..64) {
            let mut input = scenario(shards, nodes + 1, &Default::default());
            let newcomer = input.nodes.pop().unwrap().id;
            let before = ring_assign(&input, vnodes).unwrap();
            input.nodes.push(scenario(0, nodes + 1, &Default::default()).nodes.pop().unwrap());
            let after = ring_assign(&input, vnodes).unwrap();
            for (shard, owner) in &after {
                prop_assert!(*owner == before[shard] || *owner == newcomer,
                    "shard {} moved from {} to {}, not to the newcomer", shard, before[shard], owner);
            }
        }
    }
}
