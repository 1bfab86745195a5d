//! The contract every strategy passes, built-in or not: coverage, capacity, draining,
//! determinism, stability, the edge cases, and a movement measurement. It calls a strategy
//! through a closure, usually [`Suite::through_abi`] (the C ABI and JSON, in process) and, in the
//! control plane's tests, through the plugin host. Property tests run over random clusters.
//!
//! [`crate::strategy_test_suite!`] turns it into `#[test]` functions in a strategy's crate.

use std::collections::BTreeMap;

use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestError, TestRunner},
};
use serde_json::Value;

use crate::{abi::Status, Assignment, Input, Load, Node, Output, Shard};

/// A strategy as the suite calls it.
pub type Call<'a> = dyn Fn(&Input) -> Result<Assignment, String> + 'a;

/// One strategy under test, with the config it runs with.
pub struct Suite<'a> {
    name: String,
    call: Box<Call<'a>>,
    config: Value,
    cases: u32,
}

/// How many shards moved at one membership change of [`Suite::movement`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Nodes after the change.
    pub nodes: usize,
    /// Shards whose owner changed.
    pub moved: usize,
    /// The least that had to move: the new node's fair share on a join, the leaver's shards on a
    /// leave.
    pub ideal: usize,
}

/// Shard movement while nodes join one by one, then leave one by one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Movement {
    /// Shards in the scenario.
    pub shards: usize,
    /// From 1 to 10 nodes.
    pub joins: Vec<Step>,
    /// From 10 back to 1.
    pub leaves: Vec<Step>,
}

impl Movement {
    /// Shards moved over all joins, as a multiple of the least that had to move (1.0 is ideal).
    pub fn join_ratio(&self) -> f64 {
        ratio(&self.joins)
    }

    /// The same over all leaves.
    pub fn leave_ratio(&self) -> f64 {
        ratio(&self.leaves)
    }
}

fn ratio(steps: &[Step]) -> f64 {
    let moved: usize = steps.iter().map(|s| s.moved).sum();
    let ideal: usize = steps.iter().map(|s| s.ideal).sum();
    moved as f64 / ideal.max(1) as f64
}

impl<'a> Suite<'a> {
    /// A suite over any way of calling a strategy; `config` goes into every input.
    pub fn new(name: impl Into<String>, call: Box<Call<'a>>, config: Value) -> Suite<'a> {
        Suite {
            name: name.into(),
            call,
            config,
            cases: 64,
        }
    }

    /// A suite calling `vtable` in process: input to JSON, the C entry point, JSON back.
    pub fn through_abi(vtable: &'a crate::abi::StrategyVTable, config: Value) -> Suite<'a> {
        let call = move |input: &Input| -> Result<Assignment, String> {
            let json = serde_json::to_vec(input).map_err(|e| e.to_string())?;
            let reply = vtable.assign(&json).map_err(|e| format!("ABI: {e}"))?;
            match reply.status {
                Status::Ok => serde_json::from_slice::<Output>(&reply.body)
                    .map(|o| o.assignment)
                    .map_err(|e| format!("output is not JSON: {e}")),
                status => Err(format!("{status:?}: {}", reply.text())),
            }
        };
        Suite::new(vtable.name(), Box::new(call), config)
    }

    /// Property-test cases per property (64 unless changed).
    pub fn with_cases(mut self, cases: u32) -> Suite<'a> {
        self.cases = cases;
        self
    }

    fn call(&self, input: &Input) -> Result<Assignment, String> {
        (self.call)(input)
    }

    fn run(
        &self,
        property: &str,
        inputs: impl Strategy<Value = Input>,
        test: impl Fn(Input) -> Result<(), String>,
    ) {
        // PROPTEST_CASES, when set, wins (proptest's own `Config::default` reads it).
        let cases = match std::env::var_os("PROPTEST_CASES") {
            Some(_) => Config::default().cases,
            None => self.cases,
        };
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&inputs, |input| test(input).map_err(TestCaseError::fail));
        match result {
            Ok(()) => {}
            Err(TestError::Fail(why, input)) => panic!(
                "strategy {}: {property}: {why}\nsmallest failing input: {}",
                self.name,
                serde_json::to_string(&input).unwrap_or_default()
            ),
            Err(e) => panic!("strategy {}: {property}: {e}", self.name),
        }
    }

    /// Every shard exactly once on an accepting node when there is room, an error when not.
    pub fn coverage(&self) {
        self.run("coverage", arb_cluster(self.config.clone()), |input| {
            check_answer(&input, &self.call(&input))
        });
    }

    /// Capacity respected on clusters with barely enough room, or barely too little.
    pub fn capacity(&self) {
        self.run(
            "capacity",
            arb_tight_cluster(self.config.clone()),
            |input| check_answer(&input, &self.call(&input)),
        );
    }

    /// A node that starts draining loses all its shards, and gets none.
    pub fn draining(&self) {
        self.run("draining", arb_cluster(self.config.clone()), |mut input| {
            input.nodes.iter_mut().for_each(|n| n.draining = false);
            let Ok(before) = self.call(&input) else {
                return Ok(());
            };
            let drained = input.nodes[0].id.clone();
            input.nodes[0].draining = true;
            input.previous = before;
            let after = self.call(&input);
            check_answer(&input, &after)?;
            match after.iter().flatten().find(|(_, node)| **node == drained) {
                Some((shard, _)) => Err(format!("shard {shard} left on draining {drained}")),
                None => Ok(()),
            }
        });
    }

    /// The same input gives the same answer, whatever the order of nodes and shards in it, as
    /// control-plane replicas must agree.
    pub fn determinism(&self) {
        self.run("determinism", arb_cluster(self.config.clone()), |input| {
            let first = self.call(&input);
            let again = self.call(&input);
            let mut shuffled = input.clone();
            shuffled.nodes.reverse();
            shuffled.shards.reverse();
            let rotate = shuffled.nodes.len() / 2;
            shuffled.nodes.rotate_left(rotate);
            let reordered = self.call(&shuffled);
            if first != again {
                return Err(format!("two calls differ: {first:?} then {again:?}"));
            }
            // Errors may word things differently; answers must be the same.
            if first.is_ok() != reordered.is_ok() || (first.is_ok() && first != reordered) {
                return Err(format!("reordered input: {first:?} became {reordered:?}"));
            }
            Ok(())
        });
    }

    /// Given its own answer as the previous assignment and nothing else changed, a strategy
    /// changes nothing.
    pub fn stability(&self) {
        self.run(
            "stability",
            arb_cluster(self.config.clone()),
            |mut input| {
                let Ok(first) = self.call(&input) else {
                    return Ok(());
                };
                input.previous = first.clone();
                match self.call(&input) {
                    Ok(second) if second == first => Ok(()),
                    Ok(second) => {
                        let moved: Vec<_> = first
                            .iter()
                            .filter(|(s, n)| second.get(s) != Some(n))
                            .collect();
                        Err(format!("second pass moved {moved:?}"))
                    }
                    Err(e) => Err(format!("second pass failed: {e}")),
                }
            },
        );
    }

    /// No shards and no nodes is an empty answer; shards and no accepting node is an error.
    pub fn edge_cases(&self) {
        let empty = Input {
            config: self.config.clone(),
            ..Input::default()
        };
        assert_eq!(
            self.call(&empty),
            Ok(Assignment::new()),
            "{}: empty cluster",
            self.name
        );
        let mut stranded = scenario(4, 2, &self.config);
        stranded.nodes.iter_mut().for_each(|n| n.draining = true);
        assert!(
            self.call(&stranded).is_err(),
            "{}: every node draining",
            self.name
        );
        stranded.nodes.clear();
        assert!(self.call(&stranded).is_err(), "{}: no nodes", self.name);
        let mut one = scenario(8, 1, &self.config);
        one.nodes[0].capacity = Some(8);
        let all = self
            .call(&one)
            .unwrap_or_else(|e| panic!("{}: one node: {e}", self.name));
        assert!(all.values().all(|n| *n == one.nodes[0].id) && all.len() == 8);
    }

    /// Moves while 10 nodes join one by one, each call fed the previous answer, then leave in
    /// reverse order. Nodes have no capacity limit and no load; shards weigh 1.
    pub fn movement(&self, shards: u32) -> Movement {
        let mut input = scenario(shards, 1, &self.config);
        let all = scenario(shards, 10, &self.config).nodes;
        let mut current = self.settle(&input);
        let mut joins = Vec::new();
        for node in &all[1..] {
            input.nodes.push(node.clone());
            input.previous = current.clone();
            let next = self.settle(&input);
            let n = input.nodes.len();
            joins.push(Step {
                nodes: n,
                moved: moved(&current, &next),
                ideal: shards as usize / n,
            });
            current = next;
        }
        let mut leaves = Vec::new();
        while input.nodes.len() > 1 {
            let gone = input.nodes.pop().map(|n| n.id).unwrap_or_default();
            input.previous = current.clone();
            let next = self.settle(&input);
            leaves.push(Step {
                nodes: input.nodes.len(),
                moved: moved(&current, &next),
                ideal: current.values().filter(|n| **n == gone).count(),
            });
            current = next;
        }
        Movement {
            shards: shards as usize,
            joins,
            leaves,
        }
    }

    fn settle(&self, input: &Input) -> Assignment {
        let answer = self.call(input);
        if let Err(why) = check_answer(input, &answer) {
            panic!("strategy {}: movement scenario: {why}", self.name);
        }
        answer.unwrap_or_default()
    }
}

fn moved(before: &Assignment, after: &Assignment) -> usize {
    after
        .iter()
        .filter(|(s, n)| before.get(s) != Some(n))
        .count()
}

/// Whether `answer` is right for `input`: an assignment that puts every shard exactly once on an
/// accepting node within its capacity when the accepting nodes have room, an error otherwise.
pub fn check_answer(input: &Input, answer: &Result<Assignment, String>) -> Result<(), String> {
    let eligible = input.eligible_nodes();
    let assignment = match (input.ensure_room(&eligible), answer) {
        (Err(_), Err(_)) => return Ok(()),
        (Err(why), Ok(a)) => return Err(format!("answered {a:?} although impossible: {why}")),
        (Ok(()), Err(e)) => return Err(format!("refused a feasible input: {e}")),
        (Ok(()), Ok(a)) => a,
    };
    let shards = input.shard_ids();
    if let Some(missing) = shards.iter().find(|s| !assignment.contains_key(s)) {
        return Err(format!("shard {missing} not assigned"));
    }
    if let Some(extra) = assignment.keys().find(|s| shards.binary_search(s).is_err()) {
        return Err(format!("shard {extra} is not in the input"));
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (shard, node) in assignment {
        match input.nodes.iter().find(|n| n.id == *node) {
            None => return Err(format!("shard {shard} on unknown node {node}")),
            Some(n) if n.draining => return Err(format!("shard {shard} on draining node {node}")),
            Some(_) => *counts.entry(node).or_default() += 1,
        }
    }
    for node in eligible {
        let held = counts.get(node.id.as_str()).copied().unwrap_or(0);
        if held > node.max_shards() {
            return Err(format!(
                "node {} holds {held} shards, capacity {:?}",
                node.id, node.capacity
            ));
        }
    }
    Ok(())
}

/// `shards` shards of weight 1 on `nodes` unlimited nodes named `node-00`…, in zones `z0`–`z2`.
pub fn scenario(shards: u32, nodes: usize, config: &Value) -> Input {
    Input {
        shards: (0..shards).map(|id| Shard { id, weight: 1 }).collect(),
        nodes: (0..nodes)
            .map(|i| Node {
                id: format!("node-{i:02}"),
                zone: Some(format!("z{}", i % 3)),
                ..Node::default()
            })
            .collect(),
        previous: Assignment::new(),
        config: config.clone(),
    }
}

fn arb_node(index: usize) -> impl Strategy<Value = Node> {
    let capacity = prop_oneof![3 => Just(None), 2 => (0u32..16).prop_map(Some)];
    let load =
        (0u64..500, 0u64..5_000, 0.0f64..1.0).prop_map(|(in_flight, wheel_size, cpu_share)| Load {
            in_flight,
            wheel_size,
            cpu_share,
            open_shards: 0,
        });
    let zone = prop::sample::select(vec!["z0", "z1", "z2"]);
    // Most nodes carry a `db_zone` label equal to their zone, some a different one, some none.
    let db_zone = prop::option::of(prop::sample::select(vec!["z0", "z1", "z2"]));
    (capacity, load, zone, db_zone, prop::bool::weighted(0.2)).prop_map(
        move |(capacity, load, zone, db_zone, draining)| Node {
            id: format!("node-{index}"),
            capacity,
            load,
            zone: Some(zone.to_string()),
            labels: db_zone
                .map(|z| BTreeMap::from([("db_zone".to_string(), z.to_string())]))
                .unwrap_or_default(),
            draining,
        },
    )
}

/// Random clusters: up to 48 shards of weight 1–8, 1 to 7 nodes with random capacity, load,
/// zone, labels and draining flag, and a previous assignment naming live and gone nodes.
pub fn arb_cluster(config: Value) -> impl Strategy<Value = Input> {
    (1usize..8)
        .prop_flat_map(|n| (0..n).map(arb_node).collect::<Vec<_>>())
        .prop_flat_map(move |nodes| {
            let owners = prop::option::of(0..nodes.len() + 2);
            let shards = prop::collection::vec((1u32..9, owners), 0..48);
            (Just(nodes), shards, Just(config.clone()))
        })
        .prop_map(|(nodes, shards, config)| {
            let mut input = Input {
                config,
                ..Input::default()
            };
            for (id, (weight, owner)) in shards.into_iter().enumerate() {
                input.shards.push(Shard {
                    id: id as u32,
                    weight,
                });
                let owner =
                    owner.map(|i| nodes.get(i).map_or(format!("gone-{i}"), |n| n.id.clone()));
                if let Some(owner) = owner {
                    input.previous.insert(id as u32, owner);
                }
            }
            input.nodes = nodes;
            input
        })
}

/// Random clusters where every node has a capacity and the shards number their sum minus 3 to
/// plus 2: just enough room, or just too little.
pub fn arb_tight_cluster(config: Value) -> impl Strategy<Value = Input> {
    (arb_cluster(config), -3i64..3).prop_map(|(mut input, slack)| {
        let mut room = 0i64;
        for (i, node) in input.nodes.iter_mut().enumerate() {
            let capacity = node.capacity.unwrap_or(i as u32 % 5 + 1);
            node.capacity = Some(capacity);
            if !node.draining {
                room += i64::from(capacity);
            }
        }
        let count = (room + slack).max(0) as u32;
        input.shards = (0..count)
            .map(|id| Shard {
                id,
                weight: 1 + id % 3,
            })
            .collect();
        input.previous.retain(|s, _| *s < count);
        input
    })
}

/// Defines the suite's `#[test]` functions for a strategy vtable, with an optional config:
/// `strategy_test_suite!(crate::STRATEGY)` or `strategy_test_suite!(STRATEGY, json!({...}))`.
#[macro_export]
macro_rules! strategy_test_suite {
    ($vtable:expr) => {
        $crate::strategy_test_suite!($vtable, $crate::serde_json::Value::Null);
    };
    ($vtable:expr, $config:expr) => {
        fn contract_suite() -> $crate::testsuite::Suite<'static> {
            $crate::testsuite::Suite::through_abi(&$vtable, $config)
        }

        #[test]
        fn contract_coverage() {
            contract_suite().coverage();
        }

        #[test]
        fn contract_capacity() {
            contract_suite().capacity();
        }

        #[test]
        fn contract_draining() {
            contract_suite().draining();
        }

        #[test]
        fn contract_determinism() {
            contract_suite().determinism();
        }

        #[test]
        fn contract_stability() {
            contract_suite().stability();
        }

        #[test]
        fn contract_edge_cases() {
            contract_suite().edge_cases();
        }
    };
}
