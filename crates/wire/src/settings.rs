//! The cluster's live settings: one versioned entry in KV that every control plane and shard node
//! watches and applies without a restart (`GET`/`PUT /v1/settings`). A new cluster takes them
//! from the flags of the control plane that creates it; after that only the API changes them.
//!
//! This module holds the data and its validation rules (each rule names the field it refuses);
//! who applies a setting, and how, is the component's business.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Dur;

const fn ms(n: u64) -> Dur {
    Dur(Duration::from_millis(n))
}

/// Settings applied cluster-wide while everything runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// How often shard nodes put their heartbeat.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.heartbeat_every))]
    #[schema(value_type = String, example = "500ms")]
    pub heartbeat_every: Dur,
    /// A node whose last heartbeat is older than this is lost: its shards move to other nodes.
    /// At least twice `heartbeat_every`.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.heartbeat_ttl))]
    #[schema(value_type = String, example = "1500ms")]
    pub heartbeat_ttl: Dur,
    /// The control-plane leader's lease: renewed every third of it; a leader that cannot renew
    /// stops acting before it can have expired elsewhere, and a killed leader is replaced within it.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.leader_lease_ttl))]
    #[schema(value_type = String, example = "3s")]
    pub leader_lease_ttl: Dur,
    /// Occurrences due within this long are held in a shard's memory; later ones stay in its
    /// database.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.horizon))]
    #[schema(value_type = String, example = "5m")]
    pub horizon: Dur,
    /// How often each shard moves occurrences entering the horizon from its database into memory.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.load_every))]
    #[schema(value_type = String, example = "1s")]
    pub load_every: Dur,
    /// Tickets each shard may have awaiting a JetStream ack at once.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.publish_window))]
    pub publish_window: u32,
    /// Occurrences of `overlap: allow` jobs are fired this long before they are due and published
    /// at their due time (0s: fired at the due time).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.fire_lead))]
    #[schema(value_type = String, example = "200ms")]
    pub fire_lead: Dur,
    /// A published ticket no worker has started after this long is looked for in the dispatch
    /// stream, and sent again if the stream lost it.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.resend_after))]
    #[schema(value_type = String, example = "1m")]
    pub resend_after: Dur,
    /// Shards the leader moves between live nodes at once (joining nodes, drains, clock
    /// offsets); the shards of a lost node are reassigned at once, whatever this says.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.max_moves))]
    pub max_moves: u32,
    /// Whether the leader moves shards onto nodes that join (a node that joins takes its share);
    /// when off, only unowned shards are assigned.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.rebalance,
        action = clap::ArgAction::Set))]
    pub rebalance: bool,
    /// A node whose clock is off by more than this (against the NATS server's) takes no shards.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.max_clock_offset))]
    #[schema(value_type = String, example = "500ms")]
    pub max_clock_offset: Dur,
    /// Job creates each tenant may make per second, on average (0: no limit). Beyond it a
    /// create is refused with 429 and `Retry-After`.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.tenant_create_rate))]
    #[serde(default = "defaults::tenant_create_rate")]
    pub tenant_create_rate: u32,
    /// Creates a tenant may make at once above its rate (the bucket's size).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.tenant_create_burst))]
    #[serde(default = "defaults::tenant_create_burst")]
    pub tenant_create_burst: u32,
    /// Jobs that can still fire (active or paused) each tenant may have (0: no limit). A create
    /// beyond it is refused with 429.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.tenant_max_jobs))]
    #[serde(default = "defaults::tenant_max_jobs")]
    pub tenant_max_jobs: u64,
    /// Tenants each process counts under their own name in the `chronoshard_tenant_*` metrics
    /// (0-10000); later ones are counted as `(other)`, so the label stays bounded. A tenant
    /// keeps its label until the process restarts, so lowering this affects new tenants only.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = Settings::DEFAULT.metrics_tenants))]
    #[serde(default = "defaults::metrics_tenants")]
    pub metrics_tenants: u32,
}

/// Values of settings added after the first release, for entries written before them.
mod defaults {
    use super::Settings;

    pub fn tenant_create_rate() -> u32 {
        Settings::DEFAULT.tenant_create_rate
    }

    pub fn tenant_create_burst() -> u32 {
        Settings::DEFAULT.tenant_create_burst
    }

    pub fn tenant_max_jobs() -> u64 {
        Settings::DEFAULT.tenant_max_jobs
    }

    pub fn metrics_tenants() -> u32 {
        Settings::DEFAULT.metrics_tenants
    }
}

impl Settings {
    /// What a new cluster gets unless its first control plane is told otherwise.
    pub const DEFAULT: Settings = Settings {
        heartbeat_every: ms(500),
        heartbeat_ttl: ms(1_500),
        leader_lease_ttl: ms(3_000),
        horizon: ms(300_000),
        load_every: ms(1_000),
        publish_window: 1024,
        fire_lead: ms(200),
        resend_after: ms(60_000),
        max_moves: 4,
        rebalance: true,
        max_clock_offset: ms(500),
        tenant_create_rate: 0,
        tenant_create_burst: 100,
        tenant_max_jobs: 0,
        metrics_tenants: 100,
    };

    /// Checks every rule; the error names the first field that breaks one.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let s = self;
        let err = |field: &'static str, rule: &'static str| Err(SettingsError { field, rule });
        if !(ms(50)..=ms(60_000)).contains(&s.heartbeat_every) {
            return err("heartbeat_every", "must be between 50ms and 1m");
        }
        if s.heartbeat_ttl.0 < 2 * s.heartbeat_every.0 || s.heartbeat_ttl > ms(600_000) {
            return err(
                "heartbeat_ttl",
                "must be at least twice heartbeat_every and at most 10m",
            );
        }
        if !(ms(300)..=ms(300_000)).contains(&s.leader_lease_ttl) {
            return err("leader_lease_ttl", "must be between 300ms and 5m");
        }
        if s.load_every.0.is_zero() || s.load_every > ms(3_600_000) {
            return err("load_every", "must be longer than 0s and at most 1h");
        }
        if s.horizon < s.load_every || s.horizon <= s.fire_lead {
            return err(
                "horizon",
                "must be at least load_every and longer than fire_lead",
            );
        }
        if s.horizon > ms(7 * 86_400_000) {
            return err("horizon", "must be at most 7d");
        }
        if !(1..=1_000_000).contains(&s.publish_window) {
            return err("publish_window", "must be between 1 and 1000000");
        }
        if s.resend_after.0.is_zero() {
            return err("resend_after", "must be longer than 0s");
        }
        if s.max_moves == 0 {
            return err("max_moves", "must be at least 1");
        }
        if s.max_clock_offset < ms(1) {
            return err("max_clock_offset", "must be at least 1ms");
        }
        if !(1..=1_000_000).contains(&s.tenant_create_burst) {
            return err("tenant_create_burst", "must be between 1 and 1000000");
        }
        if s.metrics_tenants > 10_000 {
            return err("metrics_tenants", "must be between 0 and 10000");
        }
        Ok(())
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings::DEFAULT
    }
}

/// A setting that breaks a rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} {rule}")]
pub struct SettingsError {
    pub field: &'static str,
    pub rule: &'static str,
}

/// The settings entry as it is kept in KV: the settings and their version, which goes up by one
/// with every change (nodes report the version they run).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VersionedSettings {
    pub version: u64,
    pub settings: Settings,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_round_trip() {
        Settings::DEFAULT.validate().unwrap();
        let json = serde_json::to_value(Settings::DEFAULT).unwrap();
        assert_eq!(json["heartbeat_ttl"], "1s500ms");
        let back: Settings = serde_json::from_value(json).unwrap();
        assert_eq!(back, Settings::DEFAULT);
    }

    #[test]
    fn each_rule_names_its_field() {
        type Change = fn(&mut Settings);
        let cases: [(Change, &str); 12] = [
            (|s| s.heartbeat_every = ms(10), "heartbeat_every"),
            (|s| s.heartbeat_ttl = ms(900), "heartbeat_ttl"),
            (|s| s.leader_lease_ttl = ms(100), "leader_lease_ttl"),
            (|s| s.load_every = ms(0), "load_every"),
            (|s| s.horizon = ms(500), "horizon"),
            (|s| s.fire_lead = s.horizon, "horizon"),
            (|s| s.publish_window = 0, "publish_window"),
            (|s| s.resend_after = ms(0), "resend_after"),
            (|s| s.max_moves = 0, "max_moves"),
            (|s| s.max_clock_offset = ms(0), "max_clock_offset"),
            (|s| s.tenant_create_burst = 0, "tenant_create_burst"),
            (|s| s.metrics_tenants = 10_001, "metrics_tenants"),
        ];
        for (change, field) in cases {
            let mut s = Settings::DEFAULT;
            change(&mut s);
            assert_eq!(s.validate().unwrap_err().field, field, "{s:?}");
        }
    }

    #[test]
    fn an_entry_written_before_the_tenant_settings_reads_with_their_defaults() {
        let mut json = serde_json::to_value(Settings::DEFAULT).unwrap();
        let fields = json.as_object_mut().unwrap();
        for added in [
            "tenant_create_rate",
            "tenant_create_burst",
            "tenant_max_jobs",
            "metrics_tenants",
        ] {
            fields.remove(added).unwrap();
        }
        let read: Settings = serde_json::from_value(json).unwrap();
        assert_eq!(read, Settings::DEFAULT);
        assert_eq!((read.tenant_create_rate, read.tenant_max_jobs), (0, 0));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let mut json = serde_json::to_value(Settings::DEFAULT).unwrap();
        json["heartbeat_tll"] = "2s".into();
        let err = serde_json::from_value::<Settings>(json).unwrap_err();
        assert!(err.to_string().contains("heartbeat_tll"), "{err}");
    }
}
