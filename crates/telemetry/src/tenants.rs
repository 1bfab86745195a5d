//! Metrics labelled by tenant, and the bound that keeps that label's values few.
//!
//! Tenants are named by API callers, so a `tenant` label could take any number of values. Each
//! process gives its own label to the first `limit` tenants it counts (the cluster setting
//! `metrics_tenants`) and counts every later one under [`OTHER`]; a tenant keeps its label for
//! the life of the process once it has one. This module owns that admission only; what is counted
//! is decided where the event happens.

use std::{
    borrow::Cow,
    collections::HashSet,
    sync::{LazyLock, Mutex},
};

use prometheus::{register_int_counter_vec, IntCounterVec};

pub const TENANT_FIRES: &str = "chronoshard_tenant_fires_total";
pub const TENANT_FAILURES: &str = "chronoshard_tenant_attempts_failed_total";
pub const TENANT_DEAD_LETTERS: &str = "chronoshard_tenant_dead_letters_total";

/// The label value of every tenant beyond the bound. Tenant names are made of `A-Z a-z 0-9 _ -`
/// only, so it never stands for a real tenant.
pub const OTHER: &str = "(other)";

/// Occurrences fired (ticket written), by shard and tenant.
pub static TENANT_FIRES_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        TENANT_FIRES,
        "occurrences fired, by tenant",
        &["shard", "tenant"]
    )
    .expect("metric")
});
/// Failed attempts of a tenant's tickets (each retry's failure counts), by shard and tenant.
pub static TENANT_FAILURES_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        TENANT_FAILURES,
        "failed attempts, by tenant",
        &["shard", "tenant"]
    )
    .expect("metric")
});
/// Tickets dead-lettered, by shard and tenant.
pub static TENANT_DEAD_LETTERS_TOTAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        TENANT_DEAD_LETTERS,
        "tickets dead-lettered, by tenant",
        &["shard", "tenant"]
    )
    .expect("metric")
});

static LABELLED: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Default::default);

/// The `tenant` label value for `tenant`: its own name while fewer than `limit` tenants have one
/// in this process (or it has one already), else [`OTHER`].
pub fn tenant_label(tenant: &str, limit: u32) -> Cow<'_, str> {
    let mut labelled = LABELLED.lock().unwrap_or_else(|e| e.into_inner());
    admit(&mut labelled, tenant, limit)
}

fn admit<'a>(labelled: &mut HashSet<String>, tenant: &'a str, limit: u32) -> Cow<'a, str> {
    if labelled.contains(tenant) {
        return Cow::Borrowed(tenant);
    }
    if labelled.len() < limit as usize {
        labelled.insert(tenant.to_string());
        return Cow::Borrowed(tenant);
    }
    Cow::Borrowed(OTHER)
}

/// Adds `n` to `counter` for `shard` and `tenant`, under the tenant's bounded label.
pub fn count(counter: &IntCounterVec, shard: &str, tenant: &str, limit: u32, n: u64) {
    if n == 0 {
        return;
    }
    let label = tenant_label(tenant, limit);
    counter.with_label_values(&[shard, &label]).inc_by(n);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_tenants_keep_their_names_and_later_ones_share_one_label() {
        let mut labelled = HashSet::new();
        assert_eq!(admit(&mut labelled, "a", 2), "a");
        assert_eq!(admit(&mut labelled, "b", 2), "b");
        assert_eq!(admit(&mut labelled, "c", 2), OTHER);
        // A tenant that has a label keeps it, even after the bound is lowered.
        assert_eq!(admit(&mut labelled, "a", 0), "a");
        assert_eq!(admit(&mut labelled, "c", 3), "c");
        assert_eq!(labelled.len(), 3);
    }

    #[test]
    fn a_bound_of_zero_labels_every_tenant_other() {
        let mut labelled = HashSet::new();
        assert_eq!(admit(&mut labelled, "a", 0), OTHER);
        assert!(labelled.is_empty());
    }
}
