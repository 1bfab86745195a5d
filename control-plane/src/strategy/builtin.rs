//! The strategies linked into the control plane. Each is the same crate that builds as a plugin
//! `.so`, used here through its `STRATEGY` vtable static, so built-ins and loaded plugins run
//! through one calling path.

use chronoshard_plugin_api::abi::StrategyVTable;

/// The strategy a cluster uses until an operator activates another (the cluster state's
/// default, so both name the same one).
pub use chronoshard_wire::strategy::DEFAULT_STRATEGY;

/// Every built-in strategy.
pub fn builtins() -> [&'static StrategyVTable; 5] {
    [
        &chronoshard_strategy_balanced::STRATEGY,
        &chronoshard_strategy_consistent_hash::STRATEGY,
        &chronoshard_strategy_least_loaded::STRATEGY,
        &chronoshard_strategy_round_robin::STRATEGY,
        &chronoshard_strategy_two_level::STRATEGY,
    ]
}
