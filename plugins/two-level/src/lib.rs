//! The built-in `two-level` strategy: consistent hashing first, for locality and little movement
//! (the `consistent-hash` ring), then a correction for the imbalance a ring leaves: while a node
//! holds more than `factor` times the mean shard weight per node, one of its shards moves to the
//! least-loaded node that would stay below it (scored as in `least-loaded`: shard weight it holds
//! plus its reported load).
//!
//! The shard moved is the heaviest that does not overshoot the donor's excess over the mean (the
//! lightest when all do). Every move lowers the sum of squared node weights, so the correction
//! ends. Like the ring, the answer depends only on the shards, the nodes and their loads, not on
//! the previous assignment.
//!
//! Config: `{"vnodes": 128, "factor": 1.25, "load": {"in_flight": 1.0, "wheel_size": 1.0,
//! "cpu_share": 1.0}}`; `factor` is at least 1.0, `load` as in `least-loaded`.

use std::collections::BTreeMap;

use chronoshard_plugin_api::{
    export_strategy, serde::Deserialize, Assignment, Input, Node, Strategy,
};
use chronoshard_strategy_consistent_hash::{self as consistent_hash, ring_assign};
use chronoshard_strategy_least_loaded::{self as least_loaded, measured_scores};

/// The strategy's settings.
#[derive(Clone, Debug, Deserialize)]
#[serde(crate = "chronoshard_plugin_api::serde", deny_unknown_fields, default)]
pub struct Config {
    /// Points on the ring per node.
    pub vnodes: u32,
    /// How far above the mean shard weight per node a node may be before shards leave it.
    pub factor: f64,
    /// Weights of the reported loads when choosing where a shard goes.
    pub load: least_loaded::Config,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            vnodes: consistent_hash::DEFAULT_VNODES,
            factor: 1.25,
            load: least_loaded::Config::default(),
        }
    }
}

/// See the crate documentation.
#[derive(Debug)]
pub struct TwoLevel;

impl Strategy for TwoLevel {
    const NAME: &'static str = "two-level";
    type Config = Config;

    fn check_config(config: &Config) -> Result<(), String> {
        consistent_hash::Config {
            vnodes: config.vnodes,
        }
        .check()?;
        if !config.factor.is_finite() || config.factor < 1.0 {
            return Err(format!("factor must be 1.0 or more, not {}", config.factor));
        }
        config.load.check().map_err(|e| format!("load: {e}"))
    }

    fn assign(input: &Input, config: &Config) -> Result<Assignment, String> {
        let mut assignment = ring_assign(input, config.vnodes)?;
        correct(input, &mut assignment, config);
        Ok(assignment)
    }
}

export_strategy!(TwoLevel);

/// The shards each node holds and what they weigh, during the correction.
struct Holdings<'a> {
    nodes: Vec<&'a Node>,
    shards: Vec<Vec<(u32, u32)>>,
    weight: Vec<u64>,
}

impl Holdings<'_> {
    /// The most overloaded node above `limit` that is not `stuck` (the first on a tie).
    fn donor(&self, limit: f64, stuck: &[bool]) -> Option<usize> {
        (0..self.nodes.len())
            .filter(|&i| !stuck[i] && self.weight[i] as f64 > limit)
            .max_by(|&a, &b| self.weight[a].cmp(&self.weight[b]).then(b.cmp(&a)))
    }

    /// The shard to move off `donor`: the heaviest within its excess over `mean`, else the
    /// lightest (shards of weight 0 never help).
    fn pick(&self, donor: usize, mean: f64) -> Option<(u32, u32)> {
        let excess = self.weight[donor] as f64 - mean;
        let movable = self.shards[donor].iter().filter(|(_, w)| *w > 0);
        let within = movable
            .clone()
            .filter(|(_, w)| f64::from(*w) <= excess)
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
        within
            .or_else(|| movable.min_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0))))
            .copied()
    }
}

/// Moves shards off nodes above `factor` times the mean until none is, or none can improve.
fn correct(input: &Input, assignment: &mut Assignment, config: &Config) {
    let nodes = input.eligible_nodes();
    if nodes.len() < 2 {
        return;
    }
    let index: BTreeMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.id.as_str(), i))
        .collect();
    let weights = input.weights();
    let mut holdings = Holdings {
        shards: vec![Vec::new(); nodes.len()],
        weight: vec![0; nodes.len()],
        nodes,
    };
    for (shard, node) in assignment.iter() {
        let (i, w) = (index[node.as_str()], weights[shard]);
        holdings.shards[i].push((*shard, w));
        holdings.weight[i] += u64::from(w);
    }
    let n = holdings.nodes.len();
    let mean = holdings.weight.iter().sum::<u64>() as f64 / n as f64;
    let limit = config.factor * mean;
    let measured = measured_scores(&holdings.nodes, &config.load);
    let mut stuck = vec![false; n];
    // Each move lowers the sum of squared weights, so this bound is never reached; it is there so
    // that a mistake here costs a slow answer, not a hung call.
    for _ in 0..=assignment.len() * n {
        let Some(donor) = holdings.donor(limit, &stuck) else {
            break;
        };
        let Some((shard, w)) = holdings.pick(donor, mean) else {
            stuck[donor] = true;
            continue;
        };
        let score = |j: usize| holdings.weight[j] as f64 / mean.max(1.0) + measured[j];
        let receiver = (0..n)
            .filter(|&j| {
                j != donor
                    && holdings.shards[j].len() < holdings.nodes[j].max_shards()
                    && holdings.weight[j] + u64::from(w) < holdings.weight[donor]
            })
            .min_by(|&a, &b| score(a).total_cmp(&score(b)));
        let Some(receiver) = receiver else {
            stuck[donor] = true;
            continue;
        };
        holdings.shards[donor].retain(|(s, _)| *s != shard);
        holdings.weight[donor] -= u64::from(w);
        holdings.shards[receiver].push((shard, w));
        holdings.weight[receiver] += u64::from(w);
        assignment.insert(shard, holdings.nodes[receiver].id.clone());
    }
}

#[cfg(test)]
mod tests {
    use chronoshard_plugin_api::{testsuite::scenario, Shard};

    use super::*;

    #[test]
    fn no_node_stays_above_the_factor_when_moves_can_help() {
        // One very heavy shard hashed next to light ones: the ring alone overloads its node.
        let mut input = scenario(40, 4, &Default::default());
        input.shards = (0..40)
            .map(|id| Shard {
                id,
                weight: 1 + id % 7,
            })
            .collect();
        let config = Config {
            factor: 1.1,
            ..Config::default()
        };
        let ring = ring_assign(&input, config.vnodes).unwrap();
        let corrected = TwoLevel::assign(&input, &config).unwrap();
        let load = |a: &Assignment, node: &str| -> u32 {
            a.iter()
                .filter(|(_, n)| *n == node)
                .map(|(s, _)| 1 + s % 7)
                .sum()
        };
        let mean = (0..40).map(|s| 1 + s % 7).sum::<u32>() as f64 / 4.0;
        let worst = |a: &Assignment| {
            input
                .nodes
                .iter()
                .map(|n| load(a, &n.id))
                .max()
                .unwrap_or(0) as f64
        };
        assert!(
            worst(&ring) > 1.1 * mean,
            "the ring alone is balanced enough to test nothing"
        );
        assert!(worst(&corrected) <= 1.1 * mean + 6.0, "{corrected:?}");
        assert!(worst(&corrected) < worst(&ring));
    }

    #[test]
    fn a_factor_below_one_is_refused() {
        let config = Config {
            factor: 0.9,
            ..Config::default()
        };
        assert!(TwoLevel::check_config(&config).is_err());
        assert!(TwoLevel::check_config(&Config::default()).is_ok());
    }
}
