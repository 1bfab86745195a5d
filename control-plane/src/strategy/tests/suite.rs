//! The contract suite through the whole host (thread, deadline, JSON, checks) for every built-in,
//! a built-in loaded from its `.so` and the zone-affinity example; and the movement table of
//! docs/plugins.md, which this measures and the docs must match.

use std::{collections::BTreeMap, fmt::Write, fs, sync::Arc};

use chronoshard_plugin_api::testsuite::{Movement, Suite};
use serde_json::{json, Value};
use tokio::runtime::Runtime;

use super::{plugin_dir, registry, workspace_root, GENEROUS};
use crate::strategy::Registry;

/// The plugins these tests load, beside the built-ins.
const FILES: [(&str, &str); 2] = [
    ("chronoshard-strategy-balanced", "balanced-file"),
    ("chronoshard-plugin-zone-affinity", "zone-affinity"),
];

/// The example's config in the suite: shards in zones z0–z3, where the suite's nodes are in
/// z0–z2 only.
fn zone_config() -> Value {
    let zones: BTreeMap<String, String> = (0..240)
        .map(|s| (s.to_string(), format!("z{}", s % 4)))
        .collect();
    json!({ "shard_zones": zones })
}

/// A registry with [`FILES`] loaded, and a runtime to call it from synchronous suite code.
fn host() -> (tempfile::TempDir, Registry, Arc<Runtime>) {
    let dir = plugin_dir(&FILES);
    let registry = registry(&dir, GENEROUS);
    let runtime = Arc::new(Runtime::new().expect("runtime"));
    for (_, name) in FILES {
        runtime.block_on(registry.load(name)).expect("load");
    }
    (dir, registry, runtime)
}

fn through_host(
    registry: &Registry,
    runtime: &Arc<Runtime>,
    name: &str,
    config: Value,
) -> Suite<'static> {
    let (registry, runtime, strategy) = (registry.clone(), runtime.clone(), name.to_string());
    let call = move |input: &chronoshard_plugin_api::Input| {
        let answer = runtime.block_on(registry.assign(&strategy, input.clone()));
        answer.map_err(|e| e.to_string())
    };
    Suite::new(name, Box::new(call), config)
}

fn contract(name: &str, config: Value) {
    let (_dir, registry, runtime) = host();
    let suite = through_host(&registry, &runtime, name, config).with_cases(32);
    suite.coverage();
    suite.capacity();
    suite.draining();
    suite.determinism();
    suite.stability();
    suite.edge_cases();
}

#[test]
fn contract_balanced() {
    contract("balanced", Value::Null);
}

#[test]
fn contract_balanced_from_its_file() {
    contract("balanced-file", Value::Null);
}

#[test]
fn contract_consistent_hash() {
    contract("consistent-hash", json!({"vnodes": 64}));
}

#[test]
fn contract_least_loaded() {
    contract("least-loaded", Value::Null);
}

#[test]
fn contract_round_robin() {
    contract("round-robin", Value::Null);
}

#[test]
fn contract_two_level() {
    contract("two-level", Value::Null);
}

#[test]
fn contract_zone_affinity_example() {
    contract("zone-affinity", zone_config());
}

/// Shards in the movement scenario.
const SHARDS: u32 = 240;
/// The joins shown in the table, by node count after the join.
const SHOWN: [usize; 4] = [2, 3, 5, 10];

fn cell(moved: usize) -> String {
    format!("{moved} ({:.1}%)", 100.0 * moved as f64 / SHARDS as f64)
}

fn row(name: &str, movement: &Movement) -> String {
    let mut row = format!("| {name} |");
    for nodes in SHOWN {
        let step = movement
            .joins
            .iter()
            .find(|s| s.nodes == nodes)
            .expect("step");
        let _ = write!(row, " {} |", cell(step.moved));
    }
    let leave_ideal: usize = movement.leaves.iter().map(|s| s.ideal).sum();
    let leaves = if leave_ideal == 0 {
        "– (nothing to hand over)".to_string()
    } else {
        format!("{:.2}×", movement.leave_ratio())
    };
    let _ = write!(row, " {:.2}× | {leaves} |", movement.join_ratio());
    row
}

#[test]
fn the_movement_table_in_the_docs_is_what_is_measured() {
    let (_dir, registry, runtime) = host();
    let subjects = [
        ("balanced", Value::Null),
        ("consistent-hash", Value::Null),
        ("least-loaded", Value::Null),
        ("round-robin", Value::Null),
        ("two-level", Value::Null),
        ("zone-affinity", zone_config()),
    ];
    let mut table = String::from(
        "| strategy | 1 → 2 nodes | 2 → 3 | 4 → 5 | 9 → 10 | all joins ÷ least possible | all leaves ÷ least possible |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let ideal: Vec<String> = SHOWN.iter().map(|n| cell(SHARDS as usize / n)).collect();
    let _ = writeln!(
        table,
        "| least possible (1/N) | {} | 1.00× | 1.00× |",
        ideal.join(" | ")
    );
    for (name, config) in subjects {
        let movement = through_host(&registry, &runtime, name, config).movement(SHARDS);
        let _ = writeln!(table, "{}", row(name, &movement));
    }
    println!("{table}");
    let docs = fs::read_to_string(workspace_root().join("docs").join("plugins.md"))
        .expect("docs/plugins.md");
    assert!(
        docs.contains(&table),
        "docs/plugins.md does not hold the measured movement table; the measurement is:\n{table}"
    );
}
