//! What the leader changes in the shard map, given what it knows: pure functions of the map, the
//! live nodes, the drains, the settings and the strategy's answer, so replicas that know the
//! same compute the same. Calling the strategy is not done here (it runs in the strategy host,
//! under a deadline): `strategy_input` says what it is asked, `fallback` stands in when it gives
//! no answer, and `plan` turns either answer into moves.
//!
//! The strategy says where each shard should be; this module decides which of those changes to
//! make now:
//! - a shard with no live owner (never assigned, or its owner lost) moves at once, whatever the
//!   limits: nobody fires it meanwhile;
//! - a shard whose owner is live moves only within `max_moves` moves in flight (a move is in
//!   flight until its new owner's heartbeat lists the shard open), drains and clock problems
//!   before balancing, and moves for balance only when `rebalance` is on.
//!
//! Every change raises the shard's epoch by one: the fencing token that shuts the old owner out.

use std::collections::{BTreeMap, HashSet};

use chronoshard_plugin_api::{Assignment, Load, Node, Shard};
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

/// Whether shards may be assigned now: some live node takes shards, and a new map has the
/// live nodes it waits for.
fn may_assign(input: &Input) -> bool {
    let eligible = input
        .live
        .iter()
        .any(|n| excluded(n, input.draining, input.settings).is_none());
    eligible && !(input.owners.is_empty() && input.live.len() < input.min_nodes)
}

/// What the strategy is asked, or None when nothing may be assigned now. Every shard (weight
/// 1), every live node with what its heartbeat says (capacity, zone, labels, and its load:
/// attempts in flight, wheel size, CPU, open shards),
/// nodes that take no shards (draining, or their clock is off) marked `draining` so no strategy
/// can use them, the map in force as `previous`, and the strategy's config.
pub fn strategy_input(
    input: &Input,
    config: &serde_json::Value,
) -> Option<chronoshard_plugin_api::Input> {
    if !may_assign(input) {
        return None;
    }
    let nodes = input
        .live
        .iter()
        .map(|n| Node {
            id: n.node_id.clone(),
            capacity: n.max_shards,
            load: Load {
                in_flight: n.in_flight,
                wheel_size: n.wheel_size,
                cpu_share: n.cpu_share,
                open_shards: n.shards.len() as u64,
            },
            zone: n.zone.clone(),
            labels: n.labels.clone(),
            draining: excluded(n, input.draining, input.settings).is_some(),
        })
        .collect();
    Some(chronoshard_plugin_api::Input {
        shards: (0..input.shard_count)
            .map(|id| Shard { id, weight: 1 })
            .collect(),
        nodes,
        previous: input.owners.clone(),
        config: config.clone(),
    })
}

/// Where every shard should be when the strategy gave no answer: a shard whose owner is live
/// and takes shards stays there; every other one (no owner, its owner lost, draining or off
/// the clock) goes, in shard order, to the node that takes shards, has room under its
/// `max_shards` and holds the fewest (ties by id), the placing step of the built-in `balanced`.
/// A shard no node has room for stays with its owner, unowned while that owner is lost: a node's
/// limit is never exceeded. Failover never waits for a strategy, and nothing moves for balance
/// until the strategy answers again.
pub fn fallback(input: &Input) -> Assignment {
    let limits: BTreeMap<&str, usize> = input
        .live
        .iter()
        .map(|n| {
            (
                n.node_id.as_str(),
                n.max_shards.map_or(usize::MAX, |m| m as usize),
            )
        })
        .collect();
    let mut held: BTreeMap<&str, usize> = input
        .live
        .iter()
        .filter(|n| excluded(n, input.draining, input.settings).is_none())
        .map(|n| (n.node_id.as_str(), 0))
        .collect();
    let mut out = Assignment::new();
    let mut homeless = Vec::new();
    for shard in 0..input.shard_count {
        match input.owners.get(&shard) {
            Some(owner) if held.contains_key(owner.as_str()) => {
                *held.entry(owner.as_str()).or_default() += 1;
                out.insert(shard, owner.clone());
            }
            _ => homeless.push(shard),
        }
    }
    for shard in homeless {
        // The first of the fewest with room: the map iterates in id order.
        let mut fewest: Option<(&str, usize)> = None;
        for (&node, &n) in &held {
            if n < limits[node] && fewest.is_none_or(|(_, least)| n < least) {
                fewest = Some((node, n));
            }
        }
        match fewest {
            Some((node, _)) => {
                *held.entry(node).or_default() += 1;
                out.insert(shard, node.to_string());
            }
            // No node with room takes shards: the shard stays where it is (`plan` moves
            // nothing for it).
            None => {
                if let Some(owner) = input.owners.get(&shard) {
                    out.insert(shard, owner.clone());
                }
            }
        }
    }
    out
}

/// The moves to make now towards `desired` (the strategy's answer, or `fallback`), in shard
/// order.
pub fn plan(input: &Input, desired: &Assignment) -> Vec<Move> {
    if !may_assign(input) {
        return Vec::new();
    }
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
        .iter()
        .filter_map(|(&shard, to)| {
            let from = input.owners.get(&shard);
            if from == Some(to) {
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
                to: to.clone(),
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
