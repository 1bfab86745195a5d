//! The plan: what moves now, and why, over random clusters.

use std::collections::{BTreeMap, HashSet};

use chronoshard_wire::{rpc::NodeInfo, settings::Settings, Dur};
use proptest::prelude::*;

use super::plan::{plan, Input, Move, Reason};

fn node(id: &str, open: &[u32], offset_ms: Option<f64>) -> NodeInfo {
    NodeInfo {
        node_id: id.into(),
        started_at: chrono::Utc::now(),
        heartbeat_at: chrono::Utc::now(),
        shards: open.to_vec(),
        settings_version: 1,
        clock_offset_ms: offset_ms,
        zone: None,
        labels: Default::default(),
        wheel_size: 0,
    }
}

fn owners(pairs: &[(u32, &str)]) -> BTreeMap<u32, String> {
    pairs.iter().map(|(s, n)| (*s, n.to_string())).collect()
}

fn run(
    shards: u32,
    owners: &BTreeMap<u32, String>,
    live: &[NodeInfo],
    draining: &[&str],
    settings: &Settings,
) -> Vec<Move> {
    let draining: HashSet<String> = draining.iter().map(|s| s.to_string()).collect();
    plan(&Input {
        shard_count: shards,
        owners,
        live,
        draining: &draining,
        settings,
        min_nodes: 1,
    })
}

/// The map after the moves.
fn apply(owners: &BTreeMap<u32, String>, moves: &[Move]) -> BTreeMap<u32, String> {
    let mut o = owners.clone();
    for m in moves {
        o.insert(m.shard, m.to.clone());
    }
    o
}

#[test]
fn a_lost_nodes_shards_move_at_once_whatever_the_budget() {
    let s = Settings {
        max_moves: 1,
        ..Settings::DEFAULT
    };
    let o = owners(&[(0, "a"), (1, "b"), (2, "a"), (3, "b")]);
    let live = [node("a", &[0, 2], None)];
    let moves = run(4, &o, &live, &[], &s);
    assert_eq!(moves.len(), 2);
    assert!(moves
        .iter()
        .all(|m| m.reason == Reason::Failover && m.to == "a" && m.from.as_deref() == Some("b")));
}

#[test]
fn a_draining_node_gives_its_shards_away_within_the_budget_and_takes_none() {
    let s = Settings {
        max_moves: 2,
        ..Settings::DEFAULT
    };
    let o = owners(&[(0, "a"), (1, "a"), (2, "a"), (3, "b")]);
    let live = [node("a", &[0, 1, 2], None), node("b", &[3], None)];
    let moves = run(4, &o, &live, &["a"], &s);
    assert_eq!(moves.len(), 2, "{moves:?}");
    assert!(moves
        .iter()
        .all(|m| m.reason == Reason::Drain && m.to == "b"));
    // Those two are in flight until b's heartbeat lists them: no budget left.
    let o2 = apply(&o, &moves);
    assert!(run(4, &o2, &live, &["a"], &s).is_empty());
    // b opened them: the last one moves.
    let live = [node("a", &[2], None), node("b", &[0, 1, 3], None)];
    let moves = run(4, &o2, &live, &["a"], &s);
    assert_eq!(moves.len(), 1);
    assert_eq!((moves[0].shard, moves[0].reason), (2, Reason::Drain));
}

#[test]
fn a_node_whose_clock_is_off_takes_no_shards_and_gives_its_own_away() {
    let s = Settings::DEFAULT; // bound 500 ms
    let o = owners(&[(0, "a"), (1, "b")]);
    let live = [node("a", &[0], Some(-812.0)), node("b", &[1], Some(3.0))];
    let moves = run(2, &o, &live, &[], &s);
    assert_eq!(
        moves,
        [Move {
            shard: 0,
            from: Some("a".into()),
            to: "b".into(),
            reason: Reason::Clock
        }]
    );
    // Within the bound it is fine.
    let live = [node("a", &[0], Some(499.0)), node("b", &[1], None)];
    assert!(run(2, &o, &live, &[], &s).is_empty());
}

#[test]
fn a_joining_node_takes_its_share_only_when_rebalancing_is_on() {
    let o = owners(&[(0, "a"), (1, "a"), (2, "a"), (3, "a")]);
    let live = [node("a", &[0, 1, 2, 3], None), node("b", &[], None)];
    let on = run(4, &o, &live, &[], &Settings::DEFAULT);
    assert_eq!(on.len(), 2);
    assert!(on
        .iter()
        .all(|m| m.reason == Reason::Rebalance && m.to == "b"));
    let off = Settings {
        rebalance: false,
        ..Settings::DEFAULT
    };
    assert!(run(4, &o, &live, &[], &off).is_empty());
}

#[test]
fn nothing_moves_without_an_eligible_node_and_a_new_map_waits_for_min_nodes() {
    let o = owners(&[(0, "a")]);
    assert!(run(1, &o, &[], &[], &Settings::DEFAULT).is_empty());
    let live = [node("a", &[0], None)];
    assert!(run(1, &o, &live, &["a"], &Settings::DEFAULT).is_empty());
    let empty = BTreeMap::new();
    let two = [node("a", &[], None), node("b", &[], None)];
    let moves = plan(&Input {
        shard_count: 4,
        owners: &empty,
        live: &two[..1],
        draining: &HashSet::new(),
        settings: &Settings::DEFAULT,
        min_nodes: 2,
    });
    assert!(moves.is_empty());
    let moves = run(4, &empty, &two, &[], &Settings::DEFAULT);
    assert!(moves.iter().all(|m| m.reason == Reason::Initial));
    assert_eq!(moves.len(), 4);
}

/// A random cluster: shard count, nodes (id, live, draining), each shard's owner (an index into
/// the nodes, or none) and the move budget.
type RandomCluster = (u32, Vec<(String, bool, bool)>, Vec<Option<usize>>, u32);

fn cluster() -> impl Strategy<Value = RandomCluster> {
    (1u32..40, 1usize..6, 1u32..6).prop_flat_map(|(shards, nodes, max_moves)| {
        (
            Just(shards),
            // Each node: id, live, draining.
            proptest::collection::vec((any::<bool>(), any::<bool>()), nodes).prop_map(|v| {
                v.into_iter()
                    .enumerate()
                    .map(|(i, (live, drain))| (format!("n{i}"), live, drain))
                    .collect()
            }),
            proptest::collection::vec(proptest::option::of(0..nodes), shards as usize),
            Just(max_moves),
        )
    })
}

proptest! {
    /// Repeated passes, each node opening what it got before the next, end with every shard on
    /// an eligible node; no pass moves more live-owned shards than the budget; a lost owner's
    /// shards never wait.
    #[test]
    fn passes_converge_within_the_budget((shards, nodes, owned, max_moves) in cluster()) {
        let s = Settings { max_moves, max_clock_offset: Dur(std::time::Duration::from_millis(500)), ..Settings::DEFAULT };
        let mut o: BTreeMap<u32, String> = owned
            .iter()
            .enumerate()
            .filter_map(|(shard, n)| n.map(|n| (shard as u32, nodes[n].0.clone())))
            .collect();
        let draining: Vec<&str> = nodes.iter().filter(|n| n.2).map(|n| n.0.as_str()).collect();
        let eligible: HashSet<&str> = nodes.iter().filter(|n| n.1 && !n.2).map(|n| n.0.as_str()).collect();
        for _ in 0..(shards + 2) {
            // Every live node has opened what the map gives it.
            let live: Vec<NodeInfo> = nodes
                .iter()
                .filter(|n| n.1)
                .map(|n| {
                    let open: Vec<u32> = o.iter().filter(|(_, w)| **w == n.0).map(|(s, _)| *s).collect();
                    node(&n.0, &open, None)
                })
                .collect();
            let moves = run(shards, &o, &live, &draining, &s);
            let limited = moves.iter().filter(|m| matches!(m.reason, Reason::Drain | Reason::Clock | Reason::Rebalance)).count();
            prop_assert!(limited <= max_moves as usize, "{:?}", moves);
            for m in &moves {
                let owner_live = m.from.as_ref().is_some_and(|f| live.iter().any(|n| &n.node_id == f));
                prop_assert_eq!(owner_live, !matches!(m.reason, Reason::Initial | Reason::Failover));
                prop_assert!(eligible.contains(m.to.as_str()), "{:?}", m);
            }
            o = apply(&o, &moves);
            if moves.is_empty() {
                break;
            }
        }
        if !eligible.is_empty() {
            prop_assert_eq!(o.len() as u32, shards);
            prop_assert!(o.values().all(|n| eligible.contains(n.as_str())), "{:?}", o);
        }
    }
}
