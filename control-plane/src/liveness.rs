//! Which nodes are alive, as the control plane decides it for shard assignment: from the changes
//! of the node registry as they arrive (a KV watch), each node live until `HEARTBEAT_TTL` after
//! the last heartbeat seen here. Pure: the caller feeds it changes and the time.
//!
//! Why not list the registry on each pass: a listing (the keys, then each value) can miss a key
//! that is being rewritten meanwhile, and every heartbeat rewrites one. Under load a pass missed
//! a healthy node now and then, and the node lost its shards for nothing.

use std::{collections::HashMap, time::Duration};

use tokio::time::Instant;

/// What the watch reported for a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Heartbeat,
    /// Removed from the registry (a clean stop).
    Left,
}

#[derive(Debug)]
pub struct Liveness {
    ttl: Duration,
    watching_since: Instant,
    last_seen: HashMap<String, Instant>,
}

impl Liveness {
    /// `ttl`: how long a node counts as alive after its last heartbeat.
    pub fn new(ttl: Duration, now: Instant) -> Liveness {
        Liveness {
            ttl,
            watching_since: now,
            last_seen: HashMap::new(),
        }
    }

    pub fn saw(&mut self, node: &str, change: Change, now: Instant) {
        match change {
            Change::Heartbeat => {
                self.last_seen.insert(node.to_string(), now);
            }
            Change::Left => {
                self.last_seen.remove(node);
            }
        }
    }

    /// Whether every live node has been seen: after watching for `every` twice, each node that
    /// heartbeats every `every` has shown up (in the watch's history or since). Before that, a
    /// node not seen yet is not known to be dead.
    pub fn complete(&self, every: Duration, now: Instant) -> bool {
        now.duration_since(self.watching_since) >= every * 2
    }

    /// Nodes whose last heartbeat is younger than the TTL, sorted.
    pub fn live(&mut self, now: Instant) -> Vec<String> {
        let ttl = self.ttl;
        self.last_seen
            .retain(|_, seen| now.duration_since(*seen) < ttl);
        let mut nodes: Vec<String> = self.last_seen.keys().cloned().collect();
        nodes.sort();
        nodes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(6);
    const EVERY: Duration = Duration::from_secs(1);

    #[test]
    fn a_node_is_live_until_the_ttl_after_its_last_heartbeat() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TTL, t0);
        l.saw("a", Change::Heartbeat, t0);
        l.saw("b", Change::Heartbeat, t0);
        l.saw("a", Change::Heartbeat, t0 + Duration::from_secs(5));
        assert_eq!(l.live(t0 + Duration::from_millis(5_999)), ["a", "b"]);
        assert_eq!(l.live(t0 + Duration::from_secs(6)), ["a"]);
        assert_eq!(l.live(t0 + Duration::from_secs(11)), Vec::<String>::new());
        // a heartbeat after expiry brings it back
        l.saw("b", Change::Heartbeat, t0 + Duration::from_secs(12));
        assert_eq!(l.live(t0 + Duration::from_secs(12)), ["b"]);
    }

    #[test]
    fn a_node_that_left_is_gone_at_once() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TTL, t0);
        l.saw("a", Change::Heartbeat, t0);
        l.saw("a", Change::Left, t0 + Duration::from_millis(10));
        assert!(l.live(t0 + Duration::from_millis(10)).is_empty());
        // leaving twice, or a node never seen leaving, changes nothing
        l.saw("a", Change::Left, t0 + Duration::from_millis(20));
        l.saw("z", Change::Left, t0 + Duration::from_millis(20));
        assert!(l.live(t0 + Duration::from_millis(20)).is_empty());
    }

    #[test]
    fn the_view_is_complete_after_two_heartbeat_periods_of_watching() {
        let t0 = Instant::now();
        let l = Liveness::new(TTL, t0);
        assert!(!l.complete(EVERY, t0));
        assert!(!l.complete(EVERY, t0 + Duration::from_millis(1_999)));
        assert!(l.complete(EVERY, t0 + Duration::from_secs(2)));
    }
}
