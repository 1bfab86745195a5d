//! What the leader changes in the shard map, given what it knows: a pure function of the map, the
//! live nodes, the drains and the settings, so replicas that know the same compute the same.
//!
//! The strategy (`strategy`, the built-in `balanced` today) says where each shard should be;
//! this module decides which of those changes to make now:
//! - a shard with no live owner (never assigned, or its owner lost) moves at once, whatever the
//!   limits: nobody fires it meanwhile;
//! - a shard whose owner is live moves only within `max_moves` moves in flight (a move is in
//!   flight until its new owner's heartbeat lists the shard open), drains and clock problems
//!   before balancing, and moves for balance only when `rebalance` is on.
//!
//! Every change raises the shard's epoch by one: the fencing token that shuts the old owner out.

use std::collections::{BTreeMap, HashSet};

use chronoshard_plugin_api::{balanced, Assignment, Problem};
use chronoshard_wire::{rpc::NodeInfo, settings::Settings};

/// Why a shard moves; also the `reason` label of `chronoshard_shard_moves_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// It had no owner yet.
    Initial,
    /// Its owner is not live (killed, frozen, cut off).
    Failover,
    /// Its owner is draining.
    Drain,
    /// Its owner's clock is off by more than the settings allow.
    Clock,
    /// For balance (a node joined, or came back).
    Rebalance,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::Initial => "initial",
            Reason::Failover => "failover",
            Reason::Drain => "drain",
            Reason::Clock => "clock",
            Reason::Rebalance => "rebalance",
        }
    }

    /// Whether the move waits for the budget of moves in flight.
    fn limited(self) -> bool {
        !matches!(self, Reason::Initial | Reason::Failover)
    }
}

/// One change of the shard map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub shard: u32,
    pub from: Option<String>,
    pub to: String,
    pub reason: Reason,
}

/// What the plan is computed from.
#[derive(Debug)]
pub struct Input<'a> {
    pub shard_count: u32,
    /// Shard → owner now.
    pub owners: &'a BTreeMap<u32, String>,
    /// Live nodes with their last heartbeat.
    pub live: &'a [NodeInfo],
    pub draining: &'a HashSet<String>,
    pub settings: &'a Settings,
    /// While the map is empty, wait for this many live nodes (so a cluster that starts several
    /// nodes at once does not move every shard twice).
    pub min_nodes: usize,
}

/// Why a live node takes no shards, if it takes none.
pub fn excluded(
    node: &NodeInfo,
    draining: &HashSet<String>,
    settings: &Settings,
) -> Option<Reason> {
    if draining.contains(&node.node_id) {
        return Some(Reason::Drain);
    }
    let bound = settings.max_clock_offset.0.as_secs_f64() * 1000.0;
    if node.clock_offset_ms.is_some_and(|o| o.abs() > bound) {
        return Some(Reason::Clock);
    }
    None
}

/// The strategy: where every shard should be. The one function a strategy plugin replaces.
pub fn strategy(problem: &Problem, previous: &Assignment) -> Assignment {
    balanced(problem, previous)
}

/// The moves to make now, in shard order.
pub fn plan(input: &Input) -> Vec<Move> {
    let eligible: Vec<String> = input
        .live
        .iter()
        .filter(|n| excluded(n, input.draining, input.settings).is_none())
        .map(|n| n.node_id.clone())
        .collect();
    if eligible.is_empty() || (input.owners.is_empty() && input.live.len() < input.min_nodes) {
        return Vec::new();
    }
    let problem = Problem {
        shards: (0..input.shard_count).collect(),
        nodes: eligible,
    };
    let desired = strategy(&problem, input.owners);
    let live: BTreeMap<&str, &NodeInfo> =
        input.live.iter().map(|n| (n.node_id.as_str(), n)).collect();
    let in_flight = input
        .owners
        .iter()
        .filter(|(shard, owner)| {
            live.get(owner.as_str())
                .is_some_and(|n| !n.shards.contains(shard))
        })
        .count();
    let mut budget = (input.settings.max_moves as usize).saturating_sub(in_flight);
    let mut moves: Vec<Move> = desired
        .into_iter()
        .filter_map(|(shard, to)| {
            let from = input.owners.get(&shard);
            if from == Some(&to) {
                return None;
            }
            let reason = match from.and_then(|f| live.get(f.as_str())) {
                None if from.is_none() => Reason::Initial,
                None => Reason::Failover,
                Some(node) => {
                    excluded(node, input.draining, input.settings).unwrap_or(Reason::Rebalance)
                }
            };
            Some(Move {
                shard,
                from: from.cloned(),
                to,
                reason,
            })
        })
        .filter(|m| m.reason != Reason::Rebalance || input.settings.rebalance)
        .collect();
    // Drains and clock problems take the budget before balance does.
    moves.sort_by_key(|m| (m.reason, m.shard));
    moves.retain(|m| {
        if !m.reason.limited() {
            return true;
        }
        if budget == 0 {
            return false;
        }
        budget -= 1;
        true
    });
    moves.sort_by_key(|m| m.shard);
    moves
}
