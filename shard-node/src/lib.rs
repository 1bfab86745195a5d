//! The shard node: owns the shards the control plane assigns to it. For each shard it opens the
//! shard database under the assignment's epoch, keeps the near-term occurrences in a time wheel,
//! fires them into tickets written before they are published to JetStream, and applies worker
//! results.
//!
//! - `alarm`: wake-ups at a precise instant (tokio's timer rounds up to milliseconds).
//! - `node`: following the shard map, starting and stopping shards, heartbeats.
//! - `shard`: one shard's event loop; `shard::store` its database, `shard::plan` the catch-up
//!   rules, and the dispatcher, result consumer and request handler beside them.
//!
//! It talks to other processes only through NATS and never decides who owns a shard.

mod alarm;
pub mod clock;
pub mod node;
pub mod shard;

pub use chronoshard_cluster::Connections;
pub use node::{Handle, Options, ShardNode};
pub use shard::{store::Databases, ShardConfig};
