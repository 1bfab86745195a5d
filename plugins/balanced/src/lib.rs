//! The built-in `balanced` strategy: every accepting node gets an even share of the shards, as
//! even as capacities allow, and a shard stays with its owner while that owner is alive, not
//! draining and within its share. The algorithm is the SDK's [`spread`]; this crate only feeds
//! it the accepting nodes. Shard weights and node load are not looked at: shares are counts.
//!
//! It is the control plane's default strategy. It has no settings (config `null` or `{}`).

use chronoshard_plugin_api::{
    balance::{spread, Slot},
    export_strategy,
    serde::Deserialize,
    Assignment, Input, Strategy,
};

/// No settings; unknown fields are refused so a typo is not silently ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(crate = "chronoshard_plugin_api::serde", deny_unknown_fields)]
pub struct Config {}

/// See the crate documentation.
#[derive(Debug)]
pub struct Balanced;

impl Strategy for Balanced {
    const NAME: &'static str = "balanced";
    type Config = Config;

    fn assign(input: &Input, _config: &Config) -> Result<Assignment, String> {
        let nodes = input.eligible_nodes();
        input.ensure_room(&nodes)?;
        let slots: Vec<Slot> = nodes
            .iter()
            .map(|n| Slot {
                node: &n.id,
                capacity: n.max_shards(),
            })
            .collect();
        spread(&input.shard_ids(), &slots, &input.previous)
    }
}

export_strategy!(Balanced);

#[cfg(test)]
mod tests {
    use chronoshard_plugin_api::testsuite::scenario;

    use super::*;

    #[test]
    fn a_draining_node_hands_its_shards_to_the_others_within_capacity() {
        let mut input = scenario(9, 3, &Default::default());
        let before = Balanced::assign(&input, &Config {}).unwrap();
        input.nodes[0].draining = true;
        input.nodes[1].capacity = Some(4);
        input.previous = before.clone();
        let after = Balanced::assign(&input, &Config {}).unwrap();
        let on = |node: &str| after.values().filter(|n| *n == node).count();
        assert_eq!((on("node-00"), on("node-01"), on("node-02")), (0, 4, 5));
        // What node-02 had stays there.
        for (shard, owner) in &before {
            if owner == "node-02" {
                assert_eq!(after[shard], "node-02");
            }
        }
    }
}
