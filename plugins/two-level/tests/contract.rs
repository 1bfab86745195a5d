//! The contract suite every strategy passes, and this strategy's movement.

use chronoshard_plugin_api::testsuite::Suite;
use chronoshard_strategy_two_level::STRATEGY;

chronoshard_plugin_api::strategy_test_suite!(STRATEGY);

#[test]
fn movement_stays_near_the_least_possible() {
    let movement = Suite::through_abi(&STRATEGY, Default::default()).movement(240);
    // The ring moves about the newcomer's share; the correction adds a little on top.
    assert!(movement.join_ratio() <= 1.6, "{movement:?}");
    assert!(movement.leave_ratio() <= 1.6, "{movement:?}");
}
