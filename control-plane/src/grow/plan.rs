//! The pure part of adding shards: how the cluster config changes at each step of a growth, and
//! which tenants of an old shard move together. No I/O, no clock: callers pass `now`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use chronoshard_wire::{
    growth::{Growth, MovePhase, TenantMove, RECENT_MOVES},
    ids,
    rpc::{ClusterConfig, JobIds, KeyTarget, Layout, TenantJobs},
};

/// The most shards a cluster may have.
pub const MAX_SHARDS: u32 = 1024;

/// Why shards cannot be added now.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrowError {
    #[error("add must be between 1 and {max} (the cluster has {has} of at most {MAX_SHARDS} shards)", max = MAX_SHARDS - has)]
    Count { has: u32 },
    #[error("shards are being added already ({from} to {to}); add more once that is done")]
    Busy { from: u32, to: u32 },
    #[error("this cluster was created before job ids carried their tenant's routing key; its tenants cannot move")]
    IndexedIds,
}

/// The config with `add` shards more. In a `tenant` cluster the tenants are still on the old
/// shards. In a `time_window` cluster a layout over all the shards is added from the first window
/// that starts after `horizon` and one more window from `now`: no shard has loaded an occurrence
/// of it yet, and every shard has a window's time to read the new config first.
pub fn begin(
    config: &ClusterConfig,
    add: u32,
    now: DateTime<Utc>,
    horizon: std::time::Duration,
) -> Result<ClusterConfig, GrowError> {
    let has = config.shard_count;
    if add == 0 || has + add > MAX_SHARDS {
        return Err(GrowError::Count { has });
    }
    if let Some(g) = &config.growth {
        return Err(GrowError::Busy {
            from: g.from,
            to: config.shard_count,
        });
    }
    if config.job_ids == JobIds::Indexed {
        return Err(GrowError::IndexedIds);
    }
    let mut next = config.clone();
    if let Some(w) = next.windows.as_mut() {
        // Never before a layout already written (the horizon may have been lowered since).
        let after_last = w.layouts.last().map_or(0, |l| l.from_window + 1);
        // No shard has loaded an occurrence of that window, and every shard has a window's
        // time to read the new config first.
        let window_ms = i64::from(w.window_secs.max(1)) * 1_000;
        let clear = now.timestamp_millis() + horizon.as_millis() as i64 + window_ms;
        w.layouts.push(Layout {
            from_window: first_window_after(w, clear).max(after_last),
            shards: has + add,
        });
    }
    next.version += 1;
    next.created_with = Some(config.initial_shard_count());
    next.shard_count = has + add;
    next.growth = Some(Growth {
        from: has,
        started_at: now,
        sealed: Vec::new(),
        moved: Vec::new(),
        moving: None,
        tenants_moved: 0,
        recent: Vec::new(),
    });
    Ok(next)
}

/// The first window that starts after `at` (ms since the Unix epoch).
pub fn first_window_after(windows: &chronoshard_wire::rpc::Windows, at: i64) -> i64 {
    at.div_euclid(i64::from(windows.window_secs.max(1)) * 1_000) + 1
}

/// The tenants of `listed` that leave with one of the `leaving` keys, grouped by key, keys
/// already moved left out.
pub fn groups(
    listed: &[TenantJobs],
    leaving: &[KeyTarget],
    moved: &[u16],
) -> BTreeMap<u16, (u32, Vec<String>)> {
    let targets: BTreeMap<u16, u32> = leaving.iter().map(|k| (k.key, k.target)).collect();
    let mut out: BTreeMap<u16, (u32, Vec<String>)> = BTreeMap::new();
    for t in listed {
        let key = ids::tenant_key(&t.tenant);
        if moved.contains(&key) {
            continue;
        }
        if let Some(target) = targets.get(&key) {
            out.entry(key)
                .or_insert_with(|| (*target, Vec::new()))
                .1
                .push(t.tenant.clone());
        }
    }
    out
}

/// A config step of a growth: what changes, applied to the config read last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A move starts: its tenants are frozen on the old shard.
    Freeze(TenantMove),
    /// The new shard holds the rows: the API switches to it.
    Committed { key: u16, rows: u64 },
    /// The old shard deleted its copy.
    Done { now: DateTime<Utc> },
    /// Every leaving key of an old shard lives on its new shard.
    Seal { source: u32, keys: Vec<u16> },
    /// A `time_window` cluster's added shards hold what they need (its tenants' pauses): the
    /// growth is over, and the new layout comes into force; jobs change shard at its edge. Its
    /// first window moves to `earliest` if it starts before (readying the shards took longer
    /// than the margin `begin` left, and shards may have placed that window's occurrences).
    Laid { earliest: i64 },
}

/// The config after `step`; None when no growth is under way (nothing to change).
pub fn apply(config: &ClusterConfig, step: Step) -> Option<ClusterConfig> {
    let mut next = config.clone();
    let g = next.growth.as_mut()?;
    match step {
        Step::Freeze(m) => g.moving = Some(m),
        Step::Committed { key, rows } => {
            if let Err(i) = g.moved.binary_search(&key) {
                g.moved.insert(i, key);
            }
            if let Some(m) = g.moving.as_mut().filter(|m| m.key == key) {
                m.phase = MovePhase::Committed;
                m.rows = rows;
            }
        }
        Step::Done { now } => {
            if let Some(mut m) = g.moving.take() {
                m.phase = MovePhase::Done;
                m.finished_at = Some(now);
                g.tenants_moved += m.tenants.len() as u64;
                g.recent.push(m);
                let over = g.recent.len().saturating_sub(RECENT_MOVES);
                g.recent.drain(..over);
            }
        }
        Step::Laid { earliest } => {
            next.growth = None;
            if let Some(newest) = next.windows.as_mut().and_then(|w| w.layouts.last_mut()) {
                newest.from_window = newest.from_window.max(earliest);
            }
        }
        Step::Seal { source, keys } => {
            if !g.sealed.contains(&source) {
                g.sealed.push(source);
                g.sealed.sort_unstable();
            }
            g.moved.retain(|k| !keys.contains(k));
            if g.sealed.len() as u32 == g.from {
                next.growth = None;
            }
        }
    }
    next.version += 1;
    Some(next)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::routing::Placement;

    use chronoshard_wire::rpc::Sharding;

    fn config(shards: u32) -> ClusterConfig {
        ClusterConfig::new(shards, Sharding::Tenant)
    }

    fn begin(c: &ClusterConfig, add: u32, now: DateTime<Utc>) -> Result<ClusterConfig, GrowError> {
        super::begin(c, add, now, std::time::Duration::from_secs(5))
    }

    /// A `time_window` cluster grows by a layout for windows that start after the horizon and
    /// one more window, and keeps the layouts before it.
    #[test]
    fn a_time_window_cluster_grows_by_a_later_layout() {
        let now = DateTime::from_timestamp_millis(600_000 + 59_000).unwrap();
        let c = ClusterConfig::new(4, Sharding::TimeWindow);
        let next = super::begin(&c, 4, now, std::time::Duration::from_secs(30)).unwrap();
        let w = next.windows.as_ref().unwrap();
        // 659 s + 30 s + 60 s = 749 s, in window 12; the layout starts with window 13 (780 s)
        assert_eq!(
            w.layouts,
            vec![
                Layout {
                    from_window: 0,
                    shards: 4
                },
                Layout {
                    from_window: 13,
                    shards: 8
                }
            ]
        );
        assert_eq!(
            (next.shard_count, next.growth.as_ref().map(|g| g.from)),
            (8, Some(4))
        );
        assert_eq!(
            begin(&next, 1, now),
            Err(GrowError::Busy { from: 4, to: 8 })
        );
        // While the added shards are readied, jobs are placed by the layouts before it.
        assert_eq!(next.windows_in_force(), c.windows);
        let laid = apply(&next, Step::Laid { earliest: 0 }).unwrap();
        assert!(laid.growth.is_none());
        assert_eq!(laid.windows, next.windows);
        assert_eq!(laid.windows_in_force(), next.windows);
        assert_eq!(laid.version, next.version + 1);
        // A later growth with a shorter horizon still starts after the last layout.
        let again = super::begin(&laid, 2, now, std::time::Duration::ZERO).unwrap();
        let layouts = &again.windows.as_ref().unwrap().layouts;
        assert_eq!(
            layouts[2],
            Layout {
                from_window: 14,
                shards: 10
            }
        );
        // Readied too late for that window: the layout starts later.
        let late = apply(&again, Step::Laid { earliest: 20 }).unwrap();
        assert_eq!(late.windows.unwrap().layouts[2].from_window, 20);
    }

    #[test]
    fn bad_adds_are_refused_with_their_reason() {
        let now = Utc::now();
        assert_eq!(begin(&config(8), 0, now), Err(GrowError::Count { has: 8 }));
        assert_eq!(
            begin(&config(8), MAX_SHARDS, now),
            Err(GrowError::Count { has: 8 })
        );
        let growing = begin(&config(8), 4, now).unwrap();
        assert_eq!(
            begin(&growing, 1, now),
            Err(GrowError::Busy { from: 8, to: 12 })
        );
        let mut old = config(8);
        old.job_ids = JobIds::Indexed;
        assert_eq!(begin(&old, 1, now), Err(GrowError::IndexedIds));
        assert_eq!(
            begin(&config(8), 4, now).map(|c| (c.shard_count, c.created_with)),
            Ok((12, Some(8)))
        );
    }

    proptest! {
        // Each case builds rings and scans all 65,536 keys per old shard: few cases suffice.
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// Through every step of a growth, each routing key is placed on its old shard until
        /// its move commits (or its old shard is sealed), then on its new one; keys that do
        /// not leave never change place; once every old shard is sealed the growth is over and
        /// the placement is that of the new count.
        #[test]
        fn a_key_changes_place_once_and_only_when_its_move_commits(
            from in 1u32..12,
            add in 1u32..6,
            probe in prop::collection::vec(any::<u16>(), 50),
        ) {
            let now = Utc::now();
            let mut c = begin(&config(from), add, now).unwrap();
            let before = Placement::new(from, JobIds::TenantKey);
            let after = Placement::new(from + add, JobIds::TenantKey);
            let placed = |c: &ClusterConfig, k: u16| Placement::of(c).shard_for_key(k);
            let p = Placement::of(&c);
            for &k in &probe {
                prop_assert_eq!(p.shard_for_key(k), before.shard_for_key(k));
            }
            for source in 0..from {
                let leaving = Placement::of(&c).leaving(source);
                for kt in leaving.iter().filter(|kt| probe.contains(&kt.key)).take(3) {
                    let m = TenantMove { key: kt.key, tenants: vec![], source, target: kt.target,
                        phase: MovePhase::Frozen, started_at: now, finished_at: None, rows: 0 };
                    c = apply(&c, Step::Freeze(m)).unwrap();
                    prop_assert_eq!(placed(&c, kt.key), source);
                    c = apply(&c, Step::Committed { key: kt.key, rows: 1 }).unwrap();
                    prop_assert_eq!(placed(&c, kt.key), kt.target);
                    c = apply(&c, Step::Done { now }).unwrap();
                }
                let keys = leaving.iter().map(|k| k.key).collect();
                c = apply(&c, Step::Seal { source, keys }).unwrap();
                let p = Placement::of(&c);
                for &k in &probe {
                    let expect = if before.shard_for_key(k) <= source {
                        after.shard_for_key(k)
                    } else {
                        before.shard_for_key(k)
                    };
                    prop_assert_eq!(p.shard_for_key(k), expect);
                }
            }
            prop_assert!(c.growth.is_none());
            prop_assert_eq!(c.shard_count, from + add);
            let p = Placement::of(&c);
            for &k in &probe {
                prop_assert_eq!(p.shard_for_key(k), after.shard_for_key(k));
            }
        }
    }
}
