//! Where tenants and jobs live: a pure function of the cluster config, the same in every control
//! plane replica. No I/O.
//!
//! Tenants map to shards by consistent hashing (`hashring`, SipHash with fixed keys, 256 points
//! per shard), so adding shards later moves only the tenants that remap. In a cluster with
//! `JobIds::TenantKey` a tenant's place on the ring is its 16-bit routing key, and every job id
//! minted here ends with its tenant's key: the shard of a job follows from its id, with no index
//! to keep. Clusters created before that (`JobIds::Indexed`) keep hashing the tenant's name and
//! find a job's tenant in the job index.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use chronoshard_wire::{
    ids,
    rpc::{ClusterConfig, JobIds, KeyTarget},
};
use hashring::HashRing;
use uuid::Uuid;

const POINTS_PER_SHARD: u32 = 256;

/// A point on the ring: (shard, replica).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Point(u32, u32);

impl Hash for Point {
    // Little-endian bytes, so every control plane builds the same ring whatever its CPU; on a
    // little-endian one these are the bytes the derived `Hash` wrote (the pinned mapping holds).
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.0.to_le_bytes());
        state.write(&self.1.to_le_bytes());
    }
}

/// A tenant's routing key (`ids::tenant_key`), as it is placed on the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RoutingKey(u16);

impl Hash for RoutingKey {
    // Bytes in a fixed order, so that the ring is the same on every platform.
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.0.to_le_bytes());
    }
}

/// A new job id for `tenant`: it ends with the tenant's routing key (`chronoshard_wire::ids`).
pub fn mint_job_id(tenant: &str) -> Uuid {
    ids::mint(ids::tenant_key(tenant))
}

/// The consistent-hash ring of `n` shards.
#[derive(Clone)]
struct Ring(Arc<HashRing<Point>>);

impl Ring {
    fn new(shard_count: u32) -> Ring {
        let mut ring = HashRing::new();
        ring.batch_add(
            (0..shard_count)
                .flat_map(|s| (0..POINTS_PER_SHARD).map(move |r| Point(s, r)))
                .collect(),
        );
        Ring(Arc::new(ring))
    }

    fn key(&self, key: u16) -> u32 {
        self.0.get(&RoutingKey(key)).map(|p| p.0).unwrap_or(0)
    }
}

/// While shards are being added: the ring before, and which tenants moved already.
#[derive(Clone)]
struct Growing {
    before: Ring,
    from: u32,
    sealed: Vec<u32>,
    /// Sorted.
    moved: Vec<u16>,
}

/// The shard of every tenant and job of one cluster, as its config says now.
#[derive(Clone)]
pub struct Placement {
    ring: Ring,
    shard_count: u32,
    job_ids: JobIds,
    growing: Option<Arc<Growing>>,
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field("shard_count", &self.shard_count)
            .field("job_ids", &self.job_ids)
            .field("growing_from", &self.growing.as_ref().map(|g| g.from))
            .finish()
    }
}

impl Placement {
    /// The placement of a cluster that does not grow (tests, and the rings of a growth).
    pub fn new(shard_count: u32, job_ids: JobIds) -> Placement {
        Placement {
            ring: Ring::new(shard_count),
            shard_count,
            job_ids,
            growing: None,
        }
    }

    /// The placement `config` describes, shards being added included.
    pub fn of(config: &ClusterConfig) -> Placement {
        let mut p = Placement::new(config.shard_count, config.job_ids);
        p.growing = config.growth.as_ref().map(|g| {
            let mut moved = g.moved.clone();
            moved.sort_unstable();
            Arc::new(Growing {
                before: Ring::new(g.from),
                from: g.from,
                sealed: g.sealed.clone(),
                moved,
            })
        });
        p
    }

    pub fn shard_count(&self) -> u32 {
        self.shard_count
    }

    pub fn job_ids(&self) -> JobIds {
        self.job_ids
    }

    /// The shard of a routing key now: its new shard once its tenants moved there (or no
    /// tenant of it ever lived on its old one), else its old shard.
    pub fn shard_for_key(&self, key: u16) -> u32 {
        let new = self.ring.key(key);
        let Some(g) = &self.growing else {
            return new;
        };
        let old = g.before.key(key);
        if old == new || g.sealed.contains(&old) || g.moved.binary_search(&key).is_ok() {
            new
        } else {
            old
        }
    }

    pub fn shard_for_tenant(&self, tenant: &str) -> u32 {
        match self.job_ids {
            JobIds::Indexed => self.ring.0.get(&tenant).map(|p| p.0).unwrap_or(0),
            JobIds::TenantKey => self.shard_for_key(ids::tenant_key(tenant)),
        }
    }

    /// The shard of a job or a ticket, from its id alone: `None` in a cluster with
    /// `JobIds::Indexed`, where the job index knows a job's and every shard is asked for a
    /// ticket. Any id maps to some shard; one never minted reads as not found there.
    pub fn shard_for_id(&self, id: Uuid) -> Option<u32> {
        match self.job_ids {
            JobIds::Indexed => None,
            JobIds::TenantKey => Some(self.shard_for_key(ids::routing_key(id))),
        }
    }

    /// Every routing key that leaves `source` in the growth under way, with the shard it goes
    /// to (none when nothing grows).
    pub fn leaving(&self, source: u32) -> Vec<KeyTarget> {
        let Some(g) = &self.growing else {
            return Vec::new();
        };
        (0..=u16::MAX)
            .filter_map(|key| {
                let (old, new) = (g.before.key(key), self.ring.key(key));
                (old == source && new != old).then_some(KeyTarget { key, target: new })
            })
            .collect()
    }

    /// The shard `key` lived on before the growth under way (its shard now when nothing grows).
    pub fn old_shard_for_key(&self, key: u16) -> u32 {
        match &self.growing {
            Some(g) => g.before.key(key),
            None => self.ring.key(key),
        }
    }

    /// The shard `key` goes to (or stays on) in the growth under way.
    pub fn new_shard_for_key(&self, key: u16) -> u32 {
        self.ring.key(key)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn spread_and_growth(job_ids: JobIds) {
        let (p8, p9) = (Placement::new(8, job_ids), Placement::new(9, job_ids));
        let mut per_shard = [0usize; 8];
        let mut moved = 0;
        for t in (0..4000).map(|i| format!("tenant-{i}")) {
            let a = p8.shard_for_tenant(&t);
            per_shard[a as usize] += 1;
            let b = p9.shard_for_tenant(&t);
            if a != b {
                assert_eq!(b, 8, "a tenant moved between old shards");
                moved += 1;
            }
        }
        // each shard within ±30% of the mean, and about 1/9 of tenants move to the new shard
        assert!(
            per_shard.iter().all(|n| (300..=700).contains(n)),
            "{job_ids:?}: {per_shard:?}"
        );
        assert!((250..=750).contains(&moved), "{job_ids:?}: {moved}");
    }

    #[test]
    fn tenants_spread_over_shards_and_growth_moves_few() {
        spread_and_growth(JobIds::Indexed);
        spread_and_growth(JobIds::TenantKey);
    }

    #[test]
    fn the_mapping_is_stable_across_processes() {
        // Pinned: a change here would move tenants between shards on upgrade.
        let shards = |job_ids| {
            let p = Placement::new(8, job_ids);
            ["acme", "globex", "initech", "umbrella"].map(|t| p.shard_for_tenant(t))
        };
        assert_eq!(shards(JobIds::Indexed), [3, 0, 0, 4]);
        assert_eq!(shards(JobIds::TenantKey), [3, 2, 1, 6]);
        // SipHash-2-4 with zero keys over b"acme", top 16 bits (checked against another implementation).
        assert_eq!(ids::tenant_key("acme"), 42535);
    }

    #[test]
    fn an_indexed_cluster_finds_no_shard_in_an_id() {
        let p = Placement::new(8, JobIds::Indexed);
        assert_eq!(p.shard_for_id(mint_job_id("acme")), None);
    }

    proptest! {
        #[test]
        fn a_minted_id_and_its_tickets_lead_to_the_tenants_shard(
            tenants in prop::collection::vec("[A-Za-z0-9_-]{1,64}", 1..20),
            shards in 1u32..70,
        ) {
            let p = Placement::new(shards, JobIds::TenantKey);
            for t in &tenants {
                let job = mint_job_id(t);
                let ticket = ids::mint(ids::routing_key(job));
                prop_assert_eq!(p.shard_for_id(job), Some(p.shard_for_tenant(t)));
                prop_assert_eq!(p.shard_for_id(ticket), Some(p.shard_for_tenant(t)));
            }
        }
    }
}
