//! The placement of a `time_window` cluster: which shard an occurrence of a job belongs to.

use chronoshard_wire::rpc::Windows;

use crate::Ring;

/// A `time_window` cluster's layouts, ready to answer. Cheap to clone.
#[derive(Clone, Debug)]
pub struct WindowPlacement {
    window_ms: i64,
    /// (first window, ring), oldest first.
    layouts: Vec<(i64, Ring)>,
}

impl WindowPlacement {
    pub fn new(windows: &Windows) -> WindowPlacement {
        let mut layouts: Vec<(i64, Ring)> = Vec::with_capacity(windows.layouts.len());
        for l in &windows.layouts {
            // Layouts of one size share a ring (a growth's layouts differ; a config may not).
            let ring = match layouts.iter().find(|(_, r)| r.shards() == l.shards) {
                Some((_, r)) => r.clone(),
                None => Ring::new(l.shards),
            };
            layouts.push((l.from_window, ring));
        }
        layouts.sort_by_key(|(from, _)| *from);
        WindowPlacement {
            window_ms: i64::from(windows.window_secs.max(1)) * 1_000,
            layouts,
        }
    }

    /// The window an instant (ms since the Unix epoch) falls in.
    pub fn window_of(&self, at_ms: i64) -> i64 {
        at_ms.div_euclid(self.window_ms)
    }

    /// When a window starts, ms since the Unix epoch.
    pub fn window_start(&self, window: i64) -> i64 {
        window.saturating_mul(self.window_ms)
    }

    /// The layout of `window`: the newest starting at or before it (the oldest for a window
    /// before every layout).
    fn layout_for(&self, window: i64) -> &(i64, Ring) {
        let newer = self.layouts.partition_point(|(from, _)| *from <= window);
        &self.layouts[newer.saturating_sub(1)]
    }

    /// The shard an occurrence due at `at_ms` of the job with routing key `key` belongs to.
    pub fn shard_of(&self, key: u16, at_ms: i64) -> u32 {
        self.place(key, at_ms).0
    }

    /// The shard an occurrence due at `at_ms` of the job with routing key `key` belongs to, and
    /// the first window of the layout that places it there.
    pub fn place(&self, key: u16, at_ms: i64) -> (u32, i64) {
        let (from, ring) = self.layout_for(self.window_of(at_ms));
        (ring.shard_of(key), *from)
    }

    /// The first window of the newest layout.
    pub fn newest_layout(&self) -> i64 {
        self.layouts.last().map_or(0, |(from, _)| *from)
    }

    /// The shard the newest layout gives a job with routing key `key`.
    pub fn newest_shard(&self, key: u16) -> u32 {
        self.layouts
            .last()
            .map_or(0, |(_, ring)| ring.shard_of(key))
    }

    /// Every shard a job with routing key `key` may be on, newest layout first, each once.
    pub fn candidates(&self, key: u16) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.layouts.len());
        for (_, ring) in self.layouts.iter().rev() {
            let shard = ring.shard_of(key);
            if !out.contains(&shard) {
                out.push(shard);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use chronoshard_wire::rpc::Layout;
    use proptest::prelude::*;

    use super::*;

    fn windows(layouts: &[(i64, u32)]) -> Windows {
        Windows {
            window_secs: 60,
            layouts: layouts
                .iter()
                .map(|&(from_window, shards)| Layout {
                    from_window,
                    shards,
                })
                .collect(),
        }
    }

    #[test]
    fn one_tenants_jobs_spread_over_every_shard() {
        let p = WindowPlacement::new(&windows(&[(0, 8)]));
        let mut per_shard = [0usize; 8];
        for _ in 0..2_000 {
            let key = chronoshard_wire::ids::job_key("acme", None);
            per_shard[p.shard_of(key, 1_700_000_000_000) as usize] += 1;
        }
        // 250 each on average; a shard below 150 or above 350 would mean no spread
        assert!(
            per_shard.iter().all(|n| (150..=350).contains(n)),
            "{per_shard:?}"
        );
    }

    #[test]
    fn windows_are_cut_from_the_epoch() {
        let p = WindowPlacement::new(&windows(&[(0, 4)]));
        assert_eq!(p.window_of(0), 0);
        assert_eq!(p.window_of(59_999), 0);
        assert_eq!(p.window_of(60_000), 1);
        assert_eq!(p.window_of(-1), -1);
        assert_eq!(p.window_start(3), 180_000);
    }

    proptest! {
        /// A layout added for later windows changes nothing before its first window, places every
        /// occurrence from it on by its own ring, and adds the key's new shard to its candidates.
        #[test]
        fn a_new_layout_changes_only_the_windows_it_lays_out(
            first in 1u32..20,
            added in 1u32..12,
            from in 1i64..10_000,
            keys in prop::collection::vec(any::<u16>(), 1..50),
            instants in prop::collection::vec(0i64..20_000 * 60_000, 1..20),
        ) {
            let before = WindowPlacement::new(&windows(&[(0, first)]));
            let after = WindowPlacement::new(&windows(&[(0, first), (from, first + added)]));
            let grown = Ring::new(first + added);
            for &key in &keys {
                let candidates = after.candidates(key);
                prop_assert!(candidates.len() <= 2);
                prop_assert_eq!(candidates[0], grown.shard_of(key));
                prop_assert_eq!(after.newest_shard(key), grown.shard_of(key));
                for &at in &instants {
                    let shard = after.shard_of(key, at);
                    prop_assert!(candidates.contains(&shard));
                    if after.window_of(at) < from {
                        prop_assert_eq!(shard, before.shard_of(key, at));
                        prop_assert!(shard < first);
                    } else {
                        prop_assert_eq!(shard, grown.shard_of(key));
                        // consistent hashing: a key that changes shard goes to an added one
                        let old = before.shard_of(key, at);
                        prop_assert!(shard == old || shard >= first);
                    }
                }
            }
        }
    }
}
