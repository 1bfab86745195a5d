//! The contract suite every strategy passes, and this strategy's movement.

use chronoshard_plugin_api::{serde_json::json, testsuite::Suite};
use chronoshard_strategy_consistent_hash::STRATEGY;

chronoshard_plugin_api::strategy_test_suite!(STRATEGY, json!({"vnodes": 64}));

#[test]
fn about_one_nth_of_the_shards_move_when_an_nth_node_joins() {
    let movement = Suite::through_abi(&STRATEGY, json!({"vnodes": 128})).movement(960);
    // The newcomer takes the arcs its points cover, which average 1/N of the ring; with 128
    // points per node each step stays within a third of that.
    for step in &movement.joins {
        let ratio = step.moved as f64 / step.ideal as f64;
        assert!((0.67..=1.33).contains(&ratio), "{step:?} in {movement:?}");
    }
    // A leaver's shards move and nothing else.
    assert_eq!(movement.leave_ratio(), 1.0, "{movement:?}");
}
