//! What a strategy decides over and what it answers, exactly as both cross the plugin boundary in
//! JSON. Plain data with serde derives and a few read-only helpers; no I/O, no clock.
//!
//! Compatibility within one ABI version: the host may add optional fields, so nothing here
//! rejects unknown fields; removing or renaming a field bumps [`crate::ABI_VERSION`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Shard → owning node id.
pub type Assignment = BTreeMap<u32, String>;

/// One call's input: the cluster as the control plane sees it, the assignment in force, and the
/// strategy's own configuration (from the cluster settings).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Input {
    /// Every shard of the cluster, each to be assigned exactly once.
    pub shards: Vec<Shard>,
    /// Every live node, draining ones included (a strategy must not give them shards).
    pub nodes: Vec<Node>,
    /// The assignment in force; may name nodes that are gone.
    #[serde(default)]
    pub previous: Assignment,
    /// The strategy's configuration as stored in the cluster settings (`null` when none).
    #[serde(default)]
    pub config: serde_json::Value,
}

/// A shard and how heavy it is compared with the others.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// Shard number, unique in the cluster.
    pub id: u32,
    /// Relative cost of the shard (jobs, fire rate); 1 when unknown.
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

/// A live node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Node id, unique in the cluster.
    pub id: String,
    /// Most shards this node may own; `None` means no limit.
    #[serde(default)]
    pub capacity: Option<u32>,
    /// Load the node reported in its last heartbeat.
    #[serde(default)]
    pub load: Load,
    /// Failure domain (availability zone, rack), when known.
    #[serde(default)]
    pub zone: Option<String>,
    /// Free-form labels the operator gave the node.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// A draining node keeps running what it has but must receive no shard.
    #[serde(default)]
    pub draining: bool,
}

/// A node's reported load; all zero when the node reported none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// Tickets dispatched and not yet resolved.
    #[serde(default)]
    pub in_flight: u64,
    /// Occurrences held in the node's time wheels.
    #[serde(default)]
    pub wheel_size: u64,
    /// Share of one machine's CPU the node uses, 0.0 to 1.0 (more on several cores).
    #[serde(default)]
    pub cpu_share: f64,
    /// Shards the node has open and serving. Added within ABI version 1: a host that does not
    /// send it leaves it 0.
    #[serde(default)]
    pub open_shards: u64,
}

/// A successful answer: the new assignment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// Shard → node, every shard of the input exactly once.
    pub assignment: Assignment,
}

impl Node {
    /// The node's capacity as a count, `usize::MAX` when unlimited.
    pub fn max_shards(&self) -> usize {
        self.capacity.map_or(usize::MAX, |c| c as usize)
    }
}

impl Input {
    /// Nodes that may receive shards: not draining, sorted by id, each id once.
    ///
    /// Sorting makes every strategy independent of the order the host listed nodes in, which
    /// differs between control-plane replicas that must nevertheless agree.
    pub fn eligible_nodes(&self) -> Vec<&Node> {
        let mut nodes: Vec<&Node> = self.nodes.iter().filter(|n| !n.draining).collect();
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        nodes.dedup_by(|a, b| a.id == b.id);
        nodes
    }

    /// Shard ids sorted, each once.
    pub fn shard_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.shards.iter().map(|s| s.id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Weight of each shard id (the first entry wins if the host repeated an id).
    pub fn weights(&self) -> BTreeMap<u32, u32> {
        let mut weights = BTreeMap::new();
        for shard in &self.shards {
            weights.entry(shard.id).or_insert(shard.weight);
        }
        weights
    }

    /// Fails, with the message every strategy gives, when `eligible` cannot hold every shard.
    pub fn ensure_room(&self, eligible: &[&Node]) -> Result<(), String> {
        let shards = self.shard_ids().len();
        if shards == 0 {
            return Ok(());
        }
        if eligible.is_empty() {
            return Err(format!("{shards} shards and no node that accepts shards"));
        }
        let room = eligible
            .iter()
            .fold(0usize, |sum, n| sum.saturating_add(n.max_shards()));
        if room < shards {
            return Err(format!(
                "{shards} shards but room for {room} on {} accepting nodes",
                eligible.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_fields_take_their_defaults() {
        let input: Input =
            serde_json::from_str(r#"{"shards":[{"id":3}],"nodes":[{"id":"a"}]}"#).unwrap();
        assert_eq!(input.shards[0].weight, 1);
        assert_eq!(input.nodes[0].capacity, None);
        assert!(!input.nodes[0].draining);
        assert!(input.previous.is_empty());
        assert!(input.config.is_null());
    }

    #[test]
    fn assignment_keys_travel_as_strings_and_come_back_as_numbers() {
        let out = Output {
            assignment: Assignment::from([(7, "a".to_string())]),
        };
        let json = serde_json::to_string(&out).unwrap();
        assert_eq!(json, r#"{"assignment":{"7":"a"}}"#);
        assert_eq!(serde_json::from_str::<Output>(&json).unwrap(), out);
    }

    #[test]
    fn eligible_nodes_are_sorted_deduplicated_and_exclude_draining() {
        let node = |id: &str, draining| Node {
            id: id.into(),
            draining,
            ..Node::default()
        };
        let input = Input {
            nodes: vec![
                node("c", false),
                node("a", false),
                node("b", true),
                node("a", false),
            ],
            ..Input::default()
        };
        let ids: Vec<&str> = input
            .eligible_nodes()
            .iter()
            .map(|n| n.id.as_str())
            .collect();
        assert_eq!(ids, ["a", "c"]);
    }

    #[test]
    fn room_counts_capacities_and_unlimited_nodes() {
        let node = |id: &str, capacity| Node {
            id: id.into(),
            capacity,
            ..Node::default()
        };
        let mut input = Input {
            shards: (0..5).map(|id| Shard { id, weight: 1 }).collect(),
            nodes: vec![node("a", Some(2)), node("b", Some(2))],
            ..Input::default()
        };
        let err = input.ensure_room(&input.eligible_nodes()).unwrap_err();
        assert!(err.contains("room for 4"), "{err}");
        input.nodes.push(node("c", None));
        assert_eq!(input.ensure_room(&input.eligible_nodes()), Ok(()));
        assert!(input.ensure_room(&[]).is_err());
    }
}
