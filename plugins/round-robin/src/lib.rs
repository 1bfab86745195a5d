//! The built-in `round-robin` strategy: shards in id order are dealt to the accepting nodes in id
//! order, one each in turn, a node at capacity being skipped. The previous assignment is not
//! looked at, so the answer depends only on the shards and the nodes; the price is movement: a
//! node joining or leaving shifts most shards (see the movement table in docs/plugins.md).
//!
//! No settings (config `null` or `{}`).

use chronoshard_plugin_api::{export_strategy, serde::Deserialize, Assignment, Input, Strategy};

/// No settings; unknown fields are refused so a typo is not silently ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(crate = "chronoshard_plugin_api::serde", deny_unknown_fields)]
pub struct Config {}

/// See the crate documentation.
#[derive(Debug)]
pub struct RoundRobin;

impl Strategy for RoundRobin {
    const NAME: &'static str = "round-robin";
    type Config = Config;

    fn assign(input: &Input, _config: &Config) -> Result<Assignment, String> {
        let nodes = input.eligible_nodes();
        input.ensure_room(&nodes)?;
        let mut held = vec![0usize; nodes.len()];
        let mut turn = 0;
        let mut out = Assignment::new();
        for shard in input.shard_ids() {
            // There is room somewhere (checked above), so one lap finds it.
            let i = (0..nodes.len())
                .map(|k| (turn + k) % nodes.len())
                .find(|&i| held[i] < nodes[i].max_shards())
                .ok_or("no node left with room")?;
            held[i] += 1;
            turn = i + 1;
            out.insert(shard, nodes[i].id.clone());
        }
        Ok(out)
    }
}

export_strategy!(RoundRobin);

#[cfg(test)]
mod tests {
    use chronoshard_plugin_api::testsuite::scenario;

    use super::*;

    #[test]
    fn shards_are_dealt_in_turn_skipping_full_nodes() {
        let mut input = scenario(7, 3, &Default::default());
        input.nodes[1].capacity = Some(1);
        let a = RoundRobin::assign(&input, &Config {}).unwrap();
        let owners: Vec<&str> = a.values().map(|n| &n[5..]).collect();
        assert_eq!(owners, ["00", "01", "02", "00", "02", "00", "02"]);
    }
}
