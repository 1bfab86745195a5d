//! Which nodes are alive, as the control plane decides it for shard assignment: from the changes
//! of the node registry as they arrive (a KV watch), each node live until the heartbeat TTL after
//! the last heartbeat seen here, by this process's monotonic clock (never by comparing clocks).
//! Pure: the caller feeds it changes, the settings and the time.
//!
//! Why not list the registry on each pass: a listing can miss a key that is being rewritten
//! meanwhile, and every heartbeat rewrites one. Under load a pass missed a healthy node now and
//! then, and the node lost its shards for nothing.
//!
//! When nothing at all is heard for a whole TTL, the registry itself is what failed (NATS is
//! electing a new stream leader, or this process lost its connection), not every node at once:
//! the view is then `Unknown` and nothing moves; the first heartbeat after such a silence gives
//! every known node a fresh TTL, so the node that happens to be heard first does not get every
//! shard.

use std::{collections::HashMap, time::Duration};

use chronoshard_wire::rpc::NodeInfo;
use tokio::time::Instant;

/// How long a node that stopped heartbeating is remembered (for the grace after a silence).
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// A node as last heard from.
#[derive(Clone, Debug)]
pub struct Heard {
    pub info: NodeInfo,
    pub at: Instant,
}

/// What is known about the nodes now.
#[derive(Debug, PartialEq)]
pub enum View {
    /// Watching too briefly, or nothing heard for a whole TTL: do not act on it.
    Unknown,
    /// The live nodes, by id.
    Live(Vec<NodeInfo>),
}

#[derive(Debug)]
pub struct Liveness {
    watching_since: Instant,
    last_event: Option<Instant>,
    nodes: HashMap<String, Heard>,
}

impl Liveness {
    pub fn new(now: Instant) -> Liveness {
        Liveness {
            watching_since: now,
            last_event: None,
            nodes: HashMap::new(),
        }
    }

    /// A heartbeat; `ttl` is the heartbeat TTL in force.
    pub fn heartbeat(&mut self, info: NodeInfo, ttl: Duration, now: Instant) {
        if self
            .last_event
            .is_some_and(|t| now.duration_since(t) >= ttl)
        {
            // The registry was silent: nobody's silence counts against them.
            for heard in self.nodes.values_mut() {
                heard.at = heard.at.max(now);
            }
        }
        self.last_event = Some(now);
        self.nodes
            .insert(info.node_id.clone(), Heard { info, at: now });
    }

    /// A node left the registry (a clean stop): gone at once.
    pub fn left(&mut self, node: &str, now: Instant) {
        self.last_event = Some(now);
        self.nodes.remove(node);
    }

    /// The live nodes, sorted by id: those heard within `ttl`. Until a whole TTL of watching
    /// has passed the view is unknown: a node not heard yet is not known to be dead, and a dead
    /// node's last heartbeat, replayed by the watch's history, has not expired yet.
    pub fn view(&mut self, ttl: Duration, now: Instant) -> View {
        self.nodes
            .retain(|_, h| now.duration_since(h.at) < FORGET_AFTER);
        if now.duration_since(self.watching_since) < ttl {
            return View::Unknown;
        }
        match self.last_event {
            Some(t) if now.duration_since(t) >= ttl && !self.nodes.is_empty() => {
                return View::Unknown
            }
            _ => {}
        }
        let mut live: Vec<NodeInfo> = self
            .nodes
            .values()
            .filter(|h| now.duration_since(h.at) < ttl)
            .map(|h| h.info.clone())
            .collect();
        live.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        View::Live(live)
    }

    /// How long ago each remembered node was last heard.
    pub fn ages(&self, now: Instant) -> impl Iterator<Item = (&str, Duration)> {
        self.nodes
            .iter()
            .map(move |(id, h)| (id.as_str(), now.saturating_duration_since(h.at)))
    }

    /// When the next live node's TTL runs out after `now` (to look again then), if any.
    pub fn next_expiry(&self, ttl: Duration, now: Instant) -> Option<Instant> {
        self.nodes
            .values()
            .map(|h| h.at + ttl)
            .filter(|t| *t > now)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_millis(1_500);

    fn info(id: &str) -> NodeInfo {
        NodeInfo {
            node_id: id.into(),
            started_at: chrono::Utc::now(),
            heartbeat_at: chrono::Utc::now(),
            shards: vec![],
            settings_version: 1,
            clock_offset_ms: None,
            zone: None,
            labels: Default::default(),
            wheel_size: 0,
            in_flight: 0,
            cpu_share: 0.0,
            max_shards: None,
        }
    }

    fn ids(v: View) -> Vec<String> {
        match v {
            View::Live(n) => n.into_iter().map(|n| n.node_id).collect(),
            View::Unknown => panic!("unknown"),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_node_is_live_until_the_ttl_after_its_last_heartbeat() {
        let start = Instant::now();
        let t0 = start + TTL; // watching for a TTL already
        let mut l = Liveness::new(start);
        l.heartbeat(info("a"), TTL, t0);
        l.heartbeat(info("b"), TTL, t0);
        for t in (500..=1_400).step_by(450) {
            l.heartbeat(info("a"), TTL, t0 + ms(t));
        }
        assert_eq!(ids(l.view(TTL, t0 + ms(1_499))), ["a", "b"]);
        assert_eq!(ids(l.view(TTL, t0 + ms(1_500))), ["a"]);
        assert_eq!(
            l.next_expiry(TTL, t0 + ms(1_500)),
            Some(t0 + ms(1_400) + TTL)
        );
        // A heartbeat after expiry brings it back.
        l.heartbeat(info("b"), TTL, t0 + ms(1_600));
        assert_eq!(ids(l.view(TTL, t0 + ms(1_600))), ["a", "b"]);
        // A longer TTL (the settings changed) keeps it longer.
        assert_eq!(ids(l.view(ms(5_000), t0 + ms(3_500))), ["a", "b"]);
    }

    #[test]
    fn a_node_that_left_is_gone_at_once() {
        let start = Instant::now();
        let t0 = start + TTL; // watching for a TTL already
        let mut l = Liveness::new(start);
        l.heartbeat(info("a"), TTL, t0);
        l.heartbeat(info("b"), TTL, t0);
        l.left("a", t0 + ms(1_000));
        assert_eq!(ids(l.view(TTL, t0 + ms(1_000))), ["b"]);
        l.left("z", t0 + ms(1_000));
        assert_eq!(ids(l.view(TTL, t0 + ms(1_000))), ["b"]);
    }

    #[test]
    fn the_view_is_unknown_until_a_ttl_of_watching() {
        let t0 = Instant::now();
        let mut l = Liveness::new(t0);
        // Replayed from the history: a node that died just before this replica started.
        l.heartbeat(info("dead"), TTL, t0);
        l.heartbeat(info("a"), TTL, t0);
        l.heartbeat(info("a"), TTL, t0 + ms(1_000));
        assert_eq!(l.view(TTL, t0 + ms(1_499)), View::Unknown);
        assert_eq!(ids(l.view(TTL, t0 + TTL)), ["a"]);
    }

    #[test]
    fn a_silent_registry_is_unknown_and_the_first_heartbeat_after_it_refreshes_everyone() {
        let t0 = Instant::now();
        let mut l = Liveness::new(t0);
        for n in ["a", "b", "c"] {
            l.heartbeat(info(n), TTL, t0);
        }
        // Nobody heard for a whole TTL: NATS, not three nodes at once.
        assert_eq!(l.view(TTL, t0 + TTL), View::Unknown);
        // b is heard first after the silence: a and c get a fresh TTL too...
        let back = t0 + ms(4_000);
        l.heartbeat(info("b"), TTL, back);
        assert_eq!(ids(l.view(TTL, back)), ["a", "b", "c"]);
        // ...and lose it if they stay silent.
        l.heartbeat(info("b"), TTL, back + ms(1_000));
        assert_eq!(ids(l.view(TTL, back + TTL)), ["b"]);
    }

    #[test]
    fn one_silent_node_among_heard_ones_is_lost() {
        let start = Instant::now();
        let t0 = start + TTL; // watching for a TTL already
        let mut l = Liveness::new(start);
        l.heartbeat(info("a"), TTL, t0);
        l.heartbeat(info("b"), TTL, t0);
        let mut t = t0;
        while t < t0 + ms(3_000) {
            t += ms(500);
            l.heartbeat(info("b"), TTL, t);
        }
        assert_eq!(ids(l.view(TTL, t)), ["b"]);
    }
}
