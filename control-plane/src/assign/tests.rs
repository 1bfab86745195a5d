//! The plan: what the strategy is asked, what moves now and why (with the built-in `balanced`
//! as the strategy), and the fallback when the strategy gives no answer, over random clusters.

use std::collections::{BTreeMap, HashSet};

use chronoshard_plugin_api::{Assignment, Strategy as _};
use chronoshard_strategy_balanced::{Balanced, Config};
use chronoshard_wire::{rpc::NodeInfo, settings::Settings, Dur};
use proptest::prelude::*;
use serde_json::{json, Value};

use super::plan::{fallback, plan, strategy_input, Input, Move, Reason};

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
        in_flight: 0,
        cpu_share: 0.0,
        max_shards: None,
    }
}

fn owners(pairs: &[(u32, &str)]) -> BTreeMap<u32, String> {
    pairs.iter().map(|(s, n)| (*s, n.to_string())).collect()
}

/// What `balanced` answers for `input` (nothing when nothing may be assigned).
fn balanced(input: &Input) -> Assignment {
    strategy_input(input, &Value::Null)
        .map(|asked| Balanced::assign(&asked, &Config {}).unwrap())
        .unwrap_or_default()
}

fn run(
    shards: u32,
    owners: &BTreeMap<u32, String>,
    live: &[NodeInfo],
    draining: &[&str],
    settings: &Settings,
) -> Vec<Move> {
    let draining: HashSet<String> = draining.iter().map(|s| s.to_string()).collect();
    let input = Input {
        shard_count: shards,
        owners,
        live,
        draining: &draining,
        settings,
        min_nodes: 1,
    };
    plan(&input, &balanced(&input))
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
    let waiting = Input {
        shard_count: 4,
        owners: &empty,
        live: &two[..1],
        draining: &HashSet::new(),
        settings: &Settings::DEFAULT,
        min_nodes: 2,
    };
    assert_eq!(strategy_input(&waiting, &Value::Null), None);
    // Even an answer is not acted on.
    let all_on_a: Assignment = (0..4).map(|s| (s, "a".to_string())).collect();
    assert!(plan(&waiting, &all_on_a).is_empty());
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
            // The fallback, from the same state, keeps every shard whose owner takes shards and
            // places every other one on a node that does.
            let draining_set: HashSet<String> = draining.iter().map(|d| d.to_string()).collect();
            let input = Input { shard_count: shards, owners: &o, live: &live, draining: &draining_set, settings: &s, min_nodes: 1 };
            let stand_in = fallback(&input);
            if !eligible.is_empty() {
                prop_assert_eq!(stand_in.len() as u32, shards);
                for (shard, to) in &stand_in {
                    // Eligible nodes are live ones.
                    match o.get(shard).filter(|w| eligible.contains(w.as_str())) {
                        Some(w) => prop_assert_eq!(to, w),
                        None => prop_assert!(eligible.contains(to.as_str()), "{}", to),
                    }
                }
            }
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

#[test]
fn the_strategy_is_asked_with_every_node_and_those_taking_no_shards_marked_draining() {
    let mut a = node("a", &[0, 1], None);
    a.zone = Some("z1".into());
    a.labels = BTreeMap::from([("db_zone".to_string(), "z1".to_string())]);
    a.wheel_size = 42;
    a.in_flight = 7;
    a.cpu_share = 0.25;
    a.max_shards = Some(3);
    let live = [a, node("b", &[], Some(900.0)), node("c", &[2], None)];
    let o = owners(&[(0, "a"), (1, "a"), (2, "c"), (3, "gone")]);
    let draining: HashSet<String> = ["c".to_string()].into();
    let input = Input {
        shard_count: 4,
        owners: &o,
        live: &live,
        draining: &draining,
        settings: &Settings::DEFAULT,
        min_nodes: 1,
    };
    let config = json!({"strict": true});
    let asked = strategy_input(&input, &config).unwrap();
    assert_eq!(asked.config, config);
    assert_eq!(asked.previous, o);
    assert!(asked
        .shards
        .iter()
        .map(|s| (s.id, s.weight))
        .eq((0..4).map(|id| (id, 1))));
    let by_id: BTreeMap<&str, _> = asked.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    assert_eq!(by_id.len(), 3);
    let a = by_id["a"];
    assert_eq!(
        (a.zone.as_deref(), a.labels["db_zone"].as_str()),
        (Some("z1"), "z1")
    );
    assert_eq!(
        (a.load.open_shards, a.load.wheel_size, a.load.in_flight),
        (2, 42, 7)
    );
    assert_eq!(
        (a.load.cpu_share, a.capacity, a.draining),
        (0.25, Some(3), false)
    );
    assert_eq!(by_id["c"].capacity, None);
    // b's clock is off by 900 ms, c drains: neither may be given a shard.
    assert!(by_id["b"].draining && by_id["c"].draining);
}

#[test]
fn the_fallback_keeps_what_has_a_live_owner_and_gives_the_rest_to_the_emptiest_nodes() {
    let live = [
        node("a", &[0, 1, 2], None),
        node("b", &[], None),
        node("c", &[3], None),
    ];
    // 4 and 5 are on a lost node, 6 has none, 3 is on a draining node.
    let o = owners(&[(0, "a"), (1, "a"), (2, "a"), (3, "c"), (4, "x"), (5, "x")]);
    let draining: HashSet<String> = ["c".to_string()].into();
    let input = Input {
        shard_count: 7,
        owners: &o,
        live: &live,
        draining: &draining,
        settings: &Settings::DEFAULT,
        min_nodes: 1,
    };
    let desired = fallback(&input);
    // a keeps its three, however uneven; b, the emptiest, takes the homeless ones until it
    // holds as many as a.
    let on = |n: &str| held_by(&desired, n);
    assert_eq!(on("b"), [3, 4, 5]);
    // Then a and b hold three each: the last one goes to the lower id.
    assert_eq!(on("a"), [0, 1, 2, 6]);
    // Nothing moves for balance; lost shards at once, the drained one within the budget.
    let moves = plan(&input, &desired);
    let reasons: Vec<(u32, Reason)> = moves.iter().map(|m| (m.shard, m.reason)).collect();
    assert_eq!(
        reasons,
        [
            (3, Reason::Drain),
            (4, Reason::Failover),
            (5, Reason::Failover),
            (6, Reason::Initial)
        ]
    );
    // With no node taking shards, the map stays as it is.
    let all_draining: HashSet<String> = ["a", "b", "c"].map(String::from).into();
    let stuck = Input {
        draining: &all_draining,
        ..input
    };
    assert_eq!(fallback(&stuck), o);
}

/// A node's `max_shards` holds in the fallback too: a lost node's shards that no live node has
/// room for stay with it, unowned, rather than overfill a node.
#[test]
fn the_fallback_never_fills_a_node_past_its_limit() {
    let mut a = node("a", &[0, 1], None);
    a.max_shards = Some(3);
    let live = [a, node("b", &[2], None)];
    let mut full_b = live.clone();
    full_b[1].max_shards = Some(1);
    // 3, 4 and 5 are on the lost node x.
    let o = owners(&[(0, "a"), (1, "a"), (2, "b"), (3, "x"), (4, "x"), (5, "x")]);
    let draining = HashSet::new();
    let input = Input {
        shard_count: 6,
        owners: &o,
        live: &full_b,
        draining: &draining,
        settings: &Settings::DEFAULT,
        min_nodes: 1,
    };
    let desired = fallback(&input);
    let on = |n: &str| held_by(&desired, n);
    assert_eq!(
        (on("a"), on("b"), on("x")),
        (vec![0, 1, 3], vec![2], vec![4, 5])
    );
    let moves = plan(&input, &desired);
    let moved: Vec<(u32, &str)> = moves.iter().map(|m| (m.shard, m.to.as_str())).collect();
    assert_eq!(moved, [(3, "a")]);
    // With room on b, every lost shard finds a home.
    let free = Input {
        live: &live[..],
        ..input
    };
    assert!(fallback(&free).values().all(|o| o != "x"));
}

/// The shards `desired` gives to `node`, in order.
fn held_by(desired: &Assignment, node: &str) -> Vec<u32> {
    desired
        .iter()
        .filter(|(_, o)| *o == node)
        .map(|(s, _)| *s)
        .collect()
}
