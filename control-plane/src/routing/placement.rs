//! Where tenants and jobs live: a pure function of the cluster config, the same in every control
//! plane replica. No I/O.
//!
//! In a `tenant` cluster tenants map to shards by consistent hashing
//! (`chronoshard_placement::Ring`), so adding shards later moves only the tenants that remap. In
//! a cluster with `JobIds::TenantKey` a tenant's place on the ring is its 16-bit routing key, and
//! every job id minted here ends with its tenant's key: the shard of a job follows from its id,
//! with no index to keep. Clusters created before that (`JobIds::Indexed`) keep hashing the
//! tenant's name and find a job's tenant in the job index.
//!
//! In a `time_window` cluster a job id ends with the job's own key instead
//! (`chronoshard_wire::ids::job_key`), so one tenant's jobs spread over every shard, and the
//! shard of a job follows from its id and the layouts (`chronoshard_placement::WindowPlacement`).
//! A tenant has no shard there: what concerns a whole tenant goes to every shard.

use std::sync::Arc;

use chronoshard_placement::{Ring, WindowPlacement};
use chronoshard_wire::{
    ids,
    rpc::{ClusterConfig, JobIds, KeyTarget},
};
use uuid::Uuid;

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
    /// A `time_window` cluster's layouts.
    windows: Option<WindowPlacement>,
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
            windows: None,
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
        p.windows = config.windows_in_force().as_ref().map(WindowPlacement::new);
        p
    }

    /// Whether a tenant's jobs spread over the shards (`time_window`), so that what concerns a
    /// whole tenant goes to every shard.
    pub fn spreads_tenants(&self) -> bool {
        self.windows.is_some()
    }

    /// A new job id for `tenant`, ending with the routing key it is placed by: the tenant's, or
    /// in a `time_window` cluster the job's own (`ids::job_key`, from the create's idempotency
    /// key when it has one, so that a create sent again reaches the shard that knows the key).
    pub fn mint_job_id(&self, tenant: &str, idempotency_key: Option<&str>) -> Uuid {
        match self.windows {
            Some(_) => ids::mint(ids::job_key(tenant, idempotency_key)),
            None => ids::mint(ids::tenant_key(tenant)),
        }
    }

    /// A new job id for `tenant` whose create at `now_ms` goes to none of the shards `tried`,
    /// or None when every shard was tried: a create of a `time_window` cluster refused for its
    /// tenant's quota part goes to another shard with it. The first such key from a random one
    /// on.
    pub fn mint_job_id_avoiding(&self, tenant: &str, tried: &[u32], now_ms: i64) -> Option<Uuid> {
        let start = ids::job_key(tenant, None);
        (0..=u16::MAX)
            .map(|i| ids::mint(start.wrapping_add(i)))
            .find(|id| !tried.contains(&self.shard_for_new_job(*id, now_ms)))
    }

    /// The shard a create of job `id` at `now_ms` goes to: in a `time_window` cluster the one
    /// the layout of the current window gives the job's key (a layout added by a growth takes
    /// creates from its first window on, as it takes the jobs already there), else the shard
    /// of the id.
    pub fn shard_for_new_job(&self, id: Uuid, now_ms: i64) -> u32 {
        match &self.windows {
            Some(w) => w.shard_of(ids::routing_key(id), now_ms),
            None => self.shard_for_id(id).unwrap_or(0),
        }
    }

    /// The shards that may hold job or ticket `id`, in the order to ask them: its shard, or in
    /// a `time_window` cluster that grew every shard its key has in some layout, oldest layout
    /// first. A job moves from an older layout's shard to a newer one's and the older one
    /// answers `Moving` until the newer holds it, so asking in this order never misses a job
    /// on its way.
    pub fn shards_for_id(&self, id: Uuid) -> Vec<u32> {
        match &self.windows {
            Some(w) => {
                let mut shards = w.candidates(ids::routing_key(id));
                shards.reverse();
                shards
            }
            None => vec![self.shard_for_id(id).unwrap_or(0)],
        }
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
        if let Some(w) = &self.windows {
            // Where a job of this key ends up (`shards_for_id` lists every shard it may be on).
            return w.newest_shard(key);
        }
        let new = self.ring.shard_of(key);
        let Some(g) = &self.growing else {
            return new;
        };
        let old = g.before.shard_of(key);
        if old == new || g.sealed.contains(&old) || g.moved.binary_search(&key).is_ok() {
            new
        } else {
            old
        }
    }

    /// The shard of a tenant's jobs. Not asked in a `time_window` cluster (`spreads_tenants`),
    /// where a tenant has no shard of its own.
    pub fn shard_for_tenant(&self, tenant: &str) -> u32 {
        match self.job_ids {
            JobIds::Indexed => self.ring.shard_of_name(tenant),
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

    /// Whether `shard` holds the job or ticket `id` now (always true in a cluster whose ids
    /// carry no routing key, and in a `time_window` cluster, where a job is in one shard's
    /// table at a time): during a tenant move both shards may hold a copy, and only this one's
    /// is the tenant's.
    pub fn holds(&self, shard: u32, id: Uuid) -> bool {
        self.windows.is_some() || self.shard_for_id(id).is_none_or(|s| s == shard)
    }

    /// Every routing key that leaves `source` in the growth under way, with the shard it goes
    /// to (none when nothing grows).
    pub fn leaving(&self, source: u32) -> Vec<KeyTarget> {
        let Some(g) = &self.growing else {
            return Vec::new();
        };
        (0..=u16::MAX)
            .filter_map(|key| {
                let (old, new) = (g.before.shard_of(key), self.ring.shard_of(key));
                (old == source && new != old).then_some(KeyTarget { key, target: new })
            })
            .collect()
    }

    /// The shard `key` lived on before the growth under way (its shard now when nothing grows).
    pub fn old_shard_for_key(&self, key: u16) -> u32 {
        match &self.growing {
            Some(g) => g.before.shard_of(key),
            None => self.ring.shard_of(key),
        }
    }

    /// The shard `key` goes to (or stays on) in the growth under way.
    pub fn new_shard_for_key(&self, key: u16) -> u32 {
        self.ring.shard_of(key)
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
    fn an_indexed_cluster_finds_no_shard_in_an_id() {
        let p = Placement::new(8, JobIds::Indexed);
        assert_eq!(p.shard_for_id(p.mint_job_id("acme", None)), None);
    }

    #[test]
    fn a_time_window_cluster_spreads_a_tenant_and_keeps_a_keyed_create_on_one_shard() {
        use chronoshard_wire::rpc::Sharding;
        let p = Placement::of(&ClusterConfig::new(8, Sharding::TimeWindow));
        assert!(p.spreads_tenants());
        assert!(!Placement::of(&ClusterConfig::new(8, Sharding::Tenant)).spreads_tenants());
        let shards: std::collections::HashSet<u32> = (0..200)
            .filter_map(|_| p.shard_for_id(p.mint_job_id("acme", None)))
            .collect();
        assert_eq!(shards.len(), 8, "one tenant's jobs reach every shard");
        let keyed = |_| p.shard_for_id(p.mint_job_id("acme", Some("order-7")));
        let first = keyed(0);
        assert!((1..20).map(keyed).all(|s| s == first));
        let job = p.mint_job_id("acme", None);
        let ticket = ids::mint(ids::routing_key(job));
        assert_eq!(p.shard_for_id(ticket), p.shard_for_id(job));
        // A create refused on some shards finds each of the others, then none.
        let mut tried = vec![2, 5];
        while let Some(id) = p.mint_job_id_avoiding("acme", &tried, 0) {
            let shard = p.shard_for_new_job(id, 0);
            assert!(!tried.contains(&shard), "{shard} again");
            tried.push(shard);
        }
        tried.sort();
        assert_eq!(tried, (0..8).collect::<Vec<u32>>());
    }

    /// After a growth of a `time_window` cluster, creates go by the layout of the present
    /// window, and a job is looked for on every shard its key had, oldest layout first.
    #[test]
    fn a_grown_time_window_cluster_creates_by_the_present_layout_and_looks_everywhere() {
        use chronoshard_wire::rpc::{Layout, Sharding};
        let mut c = ClusterConfig::new(4, Sharding::TimeWindow);
        c.shard_count = 8;
        (c.windows.as_mut().unwrap().layouts).push(Layout {
            from_window: 100,
            shards: 8,
        });
        let p = Placement::of(&c);
        let (before, after) = (99 * 60_000, 100 * 60_000);
        let (old, new) = (
            Placement::new(4, JobIds::TenantKey),
            Placement::new(8, JobIds::TenantKey),
        );
        let mut moving = 0;
        for _ in 0..500 {
            let id = p.mint_job_id("acme", None);
            let key = ids::routing_key(id);
            assert_eq!(p.shard_for_new_job(id, before), old.shard_for_key(key));
            assert_eq!(p.shard_for_new_job(id, after), new.shard_for_key(key));
            let shards = p.shards_for_id(id);
            if old.shard_for_key(key) == new.shard_for_key(key) {
                assert_eq!(shards, vec![old.shard_for_key(key)]);
            } else {
                moving += 1;
                assert_eq!(shards, vec![old.shard_for_key(key), new.shard_for_key(key)]);
            }
            // lists need no filter: a job is in one shard's table at a time
            assert!(p.holds(0, id));
        }
        assert!(
            (150..350).contains(&moving),
            "about half the keys move: {moving}"
        );
    }

    proptest! {
        #[test]
        fn a_minted_id_and_its_tickets_lead_to_the_tenants_shard(
            tenants in prop::collection::vec("[A-Za-z0-9_-]{1,64}", 1..20),
            shards in 1u32..70,
        ) {
            let p = Placement::new(shards, JobIds::TenantKey);
            for t in &tenants {
                let job = p.mint_job_id(t, None);
                let ticket = ids::mint(ids::routing_key(job));
                prop_assert_eq!(p.shard_for_id(job), Some(p.shard_for_tenant(t)));
                prop_assert_eq!(p.shard_for_id(ticket), Some(p.shard_for_tenant(t)));
            }
        }
    }
}
