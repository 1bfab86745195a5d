//! Where tenants and jobs live: a pure function of the cluster config, the same in every control
//! plane replica. No I/O.
//!
//! Tenants map to shards by consistent hashing (`hashring`, SipHash with fixed keys, 256 points
//! per shard), so adding shards later moves only the tenants that remap. In a cluster with
//! `JobIds::TenantKey` a tenant's place on the ring is its 16-bit routing key, and every job id
//! minted here ends with its tenant's key: the shard of a job follows from its id, with no index
//! to keep. Clusters created before that (`JobIds::Indexed`) keep hashing the tenant's name and
//! find a job's tenant in the job index.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use chronoshard_wire::{ids, rpc::JobIds};
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

/// A tenant's routing key: the top 16 bits of the SipHash of its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RoutingKey(u16);

impl RoutingKey {
    fn of_tenant(tenant: &str) -> RoutingKey {
        // SipHash-2-4 of the name's bytes alone, not through `Hash for str` (whose framing is
        // std's to change): job ids keep these bits for as long as the job exists.
        let mut h = hashring::DefaultHashBuilder.build_hasher();
        h.write(tenant.as_bytes());
        RoutingKey((h.finish() >> 48) as u16)
    }

    /// The key of a job id minted by `mint_job_id`, or of a ticket id of such a job.
    fn of_id(id: Uuid) -> RoutingKey {
        RoutingKey(ids::routing_key(id))
    }
}

impl Hash for RoutingKey {
    // Bytes in a fixed order, so that the ring is the same on every platform.
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.0.to_le_bytes());
    }
}

/// A new job id for `tenant`: it ends with the tenant's routing key (`chronoshard_wire::ids`).
pub fn mint_job_id(tenant: &str) -> Uuid {
    ids::mint(RoutingKey::of_tenant(tenant).0)
}

/// The shard of every tenant and job of one cluster.
#[derive(Clone)]
pub struct Placement {
    ring: Arc<HashRing<Point>>,
    shard_count: u32,
    job_ids: JobIds,
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field("shard_count", &self.shard_count)
            .field("job_ids", &self.job_ids)
            .finish()
    }
}

impl Placement {
    pub fn new(shard_count: u32, job_ids: JobIds) -> Placement {
        let mut ring = HashRing::new();
        ring.batch_add(
            (0..shard_count)
                .flat_map(|s| (0..POINTS_PER_SHARD).map(move |r| Point(s, r)))
                .collect(),
        );
        Placement {
            ring: Arc::new(ring),
            shard_count,
            job_ids,
        }
    }

    pub fn shard_count(&self) -> u32 {
        self.shard_count
    }

    pub fn job_ids(&self) -> JobIds {
        self.job_ids
    }

    pub fn shard_for_tenant(&self, tenant: &str) -> u32 {
        let point = match self.job_ids {
            JobIds::Indexed => self.ring.get(&tenant),
            JobIds::TenantKey => self.ring.get(&RoutingKey::of_tenant(tenant)),
        };
        point.map(|p| p.0).unwrap_or(0)
    }

    /// The shard of a job or a ticket, from its id alone: `None` in a cluster with
    /// `JobIds::Indexed`, where the job index knows a job's and every shard is asked for a
    /// ticket. Any id maps to some shard; one never minted reads as not found there.
    pub fn shard_for_id(&self, id: Uuid) -> Option<u32> {
        match self.job_ids {
            JobIds::Indexed => None,
            JobIds::TenantKey => self.ring.get(&RoutingKey::of_id(id)).map(|p| p.0),
        }
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
        assert_eq!(RoutingKey::of_tenant("acme"), RoutingKey(42535));
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
