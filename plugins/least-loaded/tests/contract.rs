//! The contract suite every strategy passes, and this strategy's movement.

use chronoshard_plugin_api::testsuite::Suite;
use chronoshard_strategy_least_loaded::STRATEGY;

chronoshard_plugin_api::strategy_test_suite!(STRATEGY);

#[test]
fn a_join_moves_nothing_and_a_leave_moves_only_the_leavers_shards() {
    let movement = Suite::through_abi(&STRATEGY, Default::default()).movement(240);
    assert_eq!(movement.join_ratio(), 0.0, "{movement:?}");
    // Nothing ever left the first node, so the leavers had nothing to hand over.
    assert!(
        movement.leaves.iter().all(|s| s.moved == s.ideal),
        "{movement:?}"
    );
}
