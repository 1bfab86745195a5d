//! The cluster's active assignment strategy: one versioned entry in KV, next to the live
//! settings, that every control-plane replica follows (`PUT /v1/strategy` changes it). Which
//! strategies exist and whether a config suits one is the control plane's strategy host's
//! business; this module holds only the data.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The strategy a cluster uses until an operator activates another.
pub const DEFAULT_STRATEGY: &str = "balanced";

/// The active strategy entry as it is kept in KV: the strategy's name, its config (the JSON the
/// strategy reads, passed to it on every call) and a version that goes up by one with every
/// change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VersionedStrategy {
    /// Goes up by one with every change (0: none read yet).
    pub version: u64,
    /// The strategy's name: a built-in, or a plugin loaded from the plugin directory.
    pub name: String,
    /// The strategy's own config (`null`: the strategy's defaults).
    #[schema(value_type = Object)]
    pub config: serde_json::Value,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

impl VersionedStrategy {
    /// `balanced` with an empty config at `version`: what a new cluster starts with (version 1),
    /// and what a replica assumes until it has read the entry (version 0).
    pub fn default_at(version: u64) -> VersionedStrategy {
        VersionedStrategy {
            version,
            name: DEFAULT_STRATEGY.to_string(),
            config: serde_json::json!({}),
            updated_at: chrono::Utc::now(),
        }
    }
}
