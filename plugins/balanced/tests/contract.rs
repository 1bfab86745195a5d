//! The contract suite every strategy passes, and this strategy's movement.

use chronoshard_plugin_api::testsuite::Suite;
use chronoshard_strategy_balanced::STRATEGY;

chronoshard_plugin_api::strategy_test_suite!(STRATEGY);

#[test]
fn movement_is_the_least_possible() {
    let movement = Suite::through_abi(&STRATEGY, Default::default()).movement(240);
    // Even shares need exactly the newcomer's share to move, and the leaver's shards.
    assert!(movement.join_ratio() <= 1.05, "{movement:?}");
    assert!(movement.leave_ratio() <= 1.05, "{movement:?}");
}
