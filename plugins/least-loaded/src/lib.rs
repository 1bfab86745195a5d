//! The built-in `least-loaded` strategy: a shard that needs a home (a new shard, or one whose
//! owner is gone, draining or over capacity) goes to the node with the least load; every other
//! shard stays where it is. So it never moves a placed shard to even things out: a joining node
//! receives only shards that need a home (the `two-level` strategy corrects imbalance).
//!
//! A node's load is what it reported, scaled so that an average node weighs 1: the mean over the
//! accepting nodes of `in_flight`, `wheel_size` and `cpu_share`, each divided by its cluster mean
//! and weighted by the config; plus the weight of the shards this call gives it, divided by the
//! mean weight per node. Shards are placed heaviest first, so the big ones spread out.
//!
//! Config: `{"in_flight": 1.0, "wheel_size": 1.0, "cpu_share": 1.0}`, the weights of the three
//! reported loads (finite, not negative; all 0 places by shard weight alone).

use std::collections::BTreeMap;

use chronoshard_plugin_api::{
    export_strategy, serde::Deserialize, Assignment, Input, Node, Strategy,
};

/// Weights of the reported loads in a node's score.
#[derive(Clone, Debug, Deserialize)]
#[serde(crate = "chronoshard_plugin_api::serde", deny_unknown_fields, default)]
pub struct Config {
    /// Weight of tickets in flight.
    pub in_flight: f64,
    /// Weight of the occurrences in the node's wheels.
    pub wheel_size: f64,
    /// Weight of CPU use.
    pub cpu_share: f64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            in_flight: 1.0,
            wheel_size: 1.0,
            cpu_share: 1.0,
        }
    }
}

impl Config {
    /// Checks that every weight is finite and not negative.
    pub fn check(&self) -> Result<(), String> {
        for (name, w) in [
            ("in_flight", self.in_flight),
            ("wheel_size", self.wheel_size),
            ("cpu_share", self.cpu_share),
        ] {
            if !w.is_finite() || w < 0.0 {
                return Err(format!(
                    "{name} must be a finite weight of 0 or more, not {w}"
                ));
            }
        }
        Ok(())
    }
}

/// See the crate documentation.
#[derive(Debug)]
pub struct LeastLoaded;

impl Strategy for LeastLoaded {
    const NAME: &'static str = "least-loaded";
    type Config = Config;

    fn check_config(config: &Config) -> Result<(), String> {
        config.check()
    }

    fn assign(input: &Input, config: &Config) -> Result<Assignment, String> {
        let nodes = input.eligible_nodes();
        input.ensure_room(&nodes)?;
        let index: BTreeMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.as_str(), i))
            .collect();
        let weights = input.weights();
        let mut held = vec![0usize; nodes.len()];
        let mut out = Assignment::new();
        let mut homeless = Vec::new();
        for (&shard, &weight) in &weights {
            match input
                .previous
                .get(&shard)
                .and_then(|o| index.get(o.as_str()))
            {
                Some(&i) if held[i] < nodes[i].max_shards() => {
                    held[i] += 1;
                    out.insert(shard, nodes[i].id.clone());
                }
                _ => homeless.push((shard, weight)),
            }
        }
        // Heaviest first, then by id: the order is part of the answer, so it must be fixed.
        homeless.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut scores = measured_scores(&nodes, config);
        let total: u64 = weights.values().map(|w| u64::from(*w)).sum();
        let per_node = (total as f64 / nodes.len().max(1) as f64).max(1.0);
        for (shard, weight) in homeless {
            let i = least_loaded(&scores, &held, &nodes).ok_or("no node left with room")?;
            held[i] += 1;
            scores[i] += f64::from(weight) / per_node;
            out.insert(shard, nodes[i].id.clone());
        }
        Ok(out)
    }
}

export_strategy!(LeastLoaded);

/// The index of the node with room and the lowest score; the first such (lowest id) on a tie.
pub fn least_loaded(scores: &[f64], held: &[usize], nodes: &[&Node]) -> Option<usize> {
    (0..nodes.len())
        .filter(|&i| held[i] < nodes[i].max_shards())
        .min_by(|&a, &b| scores[a].total_cmp(&scores[b]))
}

/// A reported load's weight, and how to read it off a node.
type Metric = (f64, fn(&Node) -> f64);

/// Each node's reported load, scaled so that an average node scores 1 (0 when nothing is
/// reported or every weight is 0).
pub fn measured_scores(nodes: &[&Node], config: &Config) -> Vec<f64> {
    let metrics: [Metric; 3] = [
        (config.in_flight, |n| n.load.in_flight as f64),
        (config.wheel_size, |n| n.load.wheel_size as f64),
        (config.cpu_share, |n| n.load.cpu_share),
    ];
    let total_weight: f64 = metrics.iter().map(|(w, _)| w).sum();
    let mut scores = vec![0.0; nodes.len()];
    if nodes.is_empty() || total_weight <= 0.0 {
        return scores;
    }
    for (weight, metric) in metrics {
        let mean = nodes.iter().map(|n| metric(n)).sum::<f64>() / nodes.len() as f64;
        // A metric nobody reports (or a negative CPU share from a confused node) weighs nothing.
        if weight == 0.0 || !(mean.is_finite() && mean > 0.0) {
            continue;
        }
        for (score, node) in scores.iter_mut().zip(nodes) {
            *score += weight * metric(node).max(0.0) / mean / total_weight;
        }
    }
    scores
}

#[cfg(test)]
mod tests {
    use chronoshard_plugin_api::{testsuite::scenario, Load};

    use super::*;

    #[test]
    fn homeless_shards_go_to_the_least_loaded_nodes_and_placed_ones_stay() {
        let mut input = scenario(6, 3, &Default::default());
        input.nodes[0].load = Load {
            in_flight: 900,
            wheel_size: 9000,
            cpu_share: 0.9,
            ..Load::default()
        };
        input.nodes[1].load = Load {
            in_flight: 100,
            wheel_size: 1000,
            cpu_share: 0.1,
            ..Load::default()
        };
        input.nodes[2].load = Load {
            in_flight: 500,
            wheel_size: 5000,
            cpu_share: 0.5,
            ..Load::default()
        };
        input.previous = Assignment::from([(0, "node-00".to_string())]);
        let a = LeastLoaded::assign(&input, &Config::default()).unwrap();
        assert_eq!(a[&0], "node-00", "a placed shard stays");
        let on = |node: &str| a.values().filter(|n| *n == node).count();
        assert!(on("node-01") > on("node-02"), "{a:?}");
        assert_eq!(on("node-00"), 1, "{a:?}");
    }

    #[test]
    fn weights_must_be_finite_and_not_negative() {
        let bad = Config {
            cpu_share: -1.0,
            ..Config::default()
        };
        assert!(bad.check().is_err());
        let nan = Config {
            in_flight: f64::NAN,
            ..Config::default()
        };
        assert!(nan.check().is_err());
    }
}
