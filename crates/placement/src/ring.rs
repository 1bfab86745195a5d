//! The consistent-hash ring of a cluster's shards.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use hashring::HashRing;

const POINTS_PER_SHARD: u32 = 256;

/// A point on the ring: (shard, replica).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Point(u32, u32);

impl Hash for Point {
    // Little-endian bytes, so every process builds the same ring whatever its CPU; on a
    // little-endian one these are the bytes the derived `Hash` wrote (the pinned mapping holds).
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.0.to_le_bytes());
        state.write(&self.1.to_le_bytes());
    }
}

/// A routing key, as it is placed on the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RoutingKey(u16);

impl Hash for RoutingKey {
    // Bytes in a fixed order, so that the ring is the same on every platform.
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.0.to_le_bytes());
    }
}

/// The consistent-hash ring of `n` shards. Cheap to clone.
#[derive(Clone)]
pub struct Ring {
    ring: Arc<HashRing<Point>>,
    shards: u32,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("shards", &self.shards)
            .finish()
    }
}

impl Ring {
    pub fn new(shards: u32) -> Ring {
        let mut ring = HashRing::new();
        ring.batch_add(
            (0..shards)
                .flat_map(|s| (0..POINTS_PER_SHARD).map(move |r| Point(s, r)))
                .collect(),
        );
        Ring {
            ring: Arc::new(ring),
            shards,
        }
    }

    /// How many shards the ring spreads over.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The shard of a routing key.
    pub fn shard_of(&self, key: u16) -> u32 {
        self.ring.get(&RoutingKey(key)).map(|p| p.0).unwrap_or(0)
    }

    /// The shard of a tenant in a cluster whose ids carry no routing key (placed by its name).
    pub fn shard_of_name(&self, tenant: &str) -> u32 {
        self.ring.get(&tenant).map(|p| p.0).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_over_the_shards_and_growth_moves_only_to_added_shards() {
        let (r8, r9) = (Ring::new(8), Ring::new(9));
        let mut per_shard = [0usize; 8];
        let mut moved = 0;
        for key in 0..=u16::MAX {
            let a = r8.shard_of(key);
            per_shard[a as usize] += 1;
            let b = r9.shard_of(key);
            if a != b {
                assert_eq!(b, 8, "key {key} moved between old shards");
                moved += 1;
            }
        }
        // each shard within ±30% of the mean, and about 1/9 of the keys move to the new shard
        let mean = 65_536 / 8;
        assert!(
            per_shard
                .iter()
                .all(|n| n * 10 >= mean * 7 && n * 10 <= mean * 13),
            "{per_shard:?}"
        );
        assert!((65_536 / 18..=65_536 * 2 / 9).contains(&moved), "{moved}");
    }

    #[test]
    fn the_mapping_is_stable_across_processes() {
        // Pinned: a change here would move tenants between shards on upgrade.
        let r = Ring::new(8);
        let names = ["acme", "globex", "initech", "umbrella"];
        assert_eq!(names.map(|t| r.shard_of_name(t)), [3, 0, 0, 4]);
        let keys = names.map(chronoshard_wire::ids::tenant_key);
        assert_eq!(keys.map(|k| r.shard_of(k)), [3, 2, 1, 6]);
        // SipHash-2-4 with zero keys over b"acme", top 16 bits (checked against another implementation).
        assert_eq!(keys[0], 42535);
    }
}
